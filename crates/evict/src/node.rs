//! One node of the radix tree: a run of whole pages and its residency.

use crate::child_key::ChildTable;
use crate::clock::Stamp;
use crate::evictable::PolicyKey;
use crate::ids::{HostKey, NodeId, PageId, Tier, Token};

/// A node's children by the tokens of their first page: looked up, counted
/// and checked, never iterated in a decision (its order is the table's).
pub(crate) type Children = ChildTable;

#[derive(Debug, Clone)]
pub struct Node {
    pub(crate) id: NodeId,
    /// `None` only for namespace roots.
    pub(crate) parent: Option<NodeId>,
    /// Whole pages of tokens (empty for roots).
    pub(crate) tokens: Vec<Token>,
    /// Children keyed by the tokens of their first page.
    pub(crate) children: Children,
    /// `child_word` of this node's first page: its key in its parent's
    /// children, kept so that a split moves it under the new upper node
    /// without reading a token again (0 for roots).
    pub(crate) child_word: u64,
    /// Device page ids, one per page, when the node is on device.
    pub(crate) device: Option<Vec<PageId>>,
    /// Host object key, when the node has a host copy.
    pub(crate) host: Option<HostKey>,
    /// Children that are on device; a device node is a device leaf when 0.
    pub(crate) device_children: usize,
    /// Pages from the namespace root to this node's first page.
    pub(crate) depth: usize,
    pub(crate) created: Stamp,
    pub(crate) last_access: Stamp,
    pub(crate) hits: u64,
    /// Locks on the paths through this node (its own and its descendants').
    pub(crate) locks: u64,
    /// `lock` calls on this very node not yet undone by `unlock`.
    pub(crate) pins: u64,
    /// `Policy::Ghost`'s priority (`Policy::priority`), fixed at the last
    /// access; 0 while a queue policy keeps state.
    pub(crate) priority: u64,
    /// A queue policy's state for the node (`queue_shared::Slot`, packed); 0 while
    /// no queue policy keeps state.
    pub(crate) queue_slot: u64,
    // Bookkeeping (not replicated state of its own): the cached hash of
    // `tokens`, this node's current digest term and its index entry.
    pub(crate) tokens_hash: u64,
    pub(crate) digest_term: u64,
    pub(crate) indexed: Option<(Tier, PolicyKey)>,
}

impl Node {
    pub(crate) fn pages(&self, page_size: usize) -> usize {
        self.tokens.len() / page_size
    }

    pub fn id(&self) -> NodeId {
        self.id
    }
    pub fn parent(&self) -> Option<NodeId> {
        self.parent
    }
    pub fn tokens(&self) -> &[Token] {
        &self.tokens
    }
    pub fn device_pages(&self) -> Option<&[PageId]> {
        self.device.as_deref()
    }
    pub fn host_key(&self) -> Option<HostKey> {
        self.host
    }
    pub fn depth(&self) -> usize {
        self.depth
    }
    pub fn created(&self) -> Stamp {
        self.created
    }
    pub fn last_access(&self) -> Stamp {
        self.last_access
    }
    pub fn hits(&self) -> u64 {
        self.hits
    }
    pub fn locks(&self) -> u64 {
        self.locks
    }
    pub fn pins(&self) -> u64 {
        self.pins
    }
    pub fn priority(&self) -> u64 {
        self.priority
    }
    pub fn queue_slot(&self) -> u64 {
        self.queue_slot
    }
    /// The one word digests and snapshots carry for the node's place in its
    /// policy's order: at most one of priority and queue slot is in use,
    /// the other is 0.
    pub(crate) fn order_word(&self) -> u64 {
        self.priority | self.queue_slot
    }
    pub fn is_root(&self) -> bool {
        self.parent.is_none()
    }
    pub fn on_device(&self) -> bool {
        self.device.is_some()
    }
    pub fn on_host(&self) -> bool {
        self.host.is_some()
    }
}
