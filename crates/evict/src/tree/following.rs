//! How a `Policy::Ghost` tree follows the layer above it that chooses its
//! ranking (its shadows, `shadow.rs`): the ranking it uses is the leader's,
//! and when the leader changes the tree re-keys its nodes or builds the new
//! leader's queue state from them.

use crate::clock::Stamp;
use crate::ids::{NodeId, Token};
use crate::namespace::Namespace;
use crate::policy::Policy;
use crate::queue_shared::Slot;
use crate::queues::QueueState;
use crate::ranking::Ranking;
use cpkv_wire::Writer;

use super::PrefixTree;

/// What a ghost tree follows: a layer above the tree (ghost's shadow
/// caches, `shadow.rs`) that watches every insert and names the ranking the
/// tree should use. The tree knows it only through this: the layer's state
/// is part of the tree's digest and snapshot, so the tree asks it for both.
pub(crate) trait RankingChooser: std::fmt::Debug + Send + Sync {
    /// Shows the layer an insert of whole-page `tokens` while the tree holds
    /// `held` device pages; true when the leading ranking changed.
    fn watch(&mut self, tokens: &[Token], namespace: &Namespace, held: usize) -> bool;
    /// The ranking the tree follows now.
    fn leader(&self) -> Ranking;
    /// The cache size, in pages, as the layer replays it.
    fn capacity(&self) -> usize;
    /// The target ARC has adapted to at that size (0 before it has one).
    fn arc_target(&self) -> u64;
    /// `tree`'s nodes in the order S3-FIFO, taking over, queues them, each
    /// with the queue and count the leader holds its content in.
    fn queue_order(&self, tree: &PrefixTree) -> Vec<(NodeId, Slot)>;
    fn digest(&self) -> u64;
    /// Every field, for the tree's snapshot.
    fn encode(&self, w: &mut Writer);
    /// (nodes, pages) the layer keeps (`PrefixTree::policy_memory`).
    fn memory(&self) -> (usize, usize);
    /// The layer's own invariants (`PrefixTree::check_invariants`).
    fn check(&self) -> Result<(), String>;
    fn boxed_clone(&self) -> Box<dyn RankingChooser>;
}

impl Clone for Box<dyn RankingChooser> {
    fn clone(&self) -> Self {
        self.boxed_clone()
    }
}

impl PrefixTree {
    /// The ranking `Policy::Ghost` uses now: a shadow's own, or the
    /// leader's (kept on the tree: every key reads it).
    pub(super) fn ranking(&self) -> Ranking {
        self.fixed_ranking.unwrap_or(self.leader)
    }

    /// Shows an insert to the chooser; follows its leader when it changed.
    pub(super) fn show_chooser(&mut self, tokens: &[Token], namespace: &Namespace) {
        if let Some(chooser) = self.chooser.as_mut() {
            let before = chooser.leader();
            if chooser.watch(tokens, namespace, self.live_pages.len()) {
                let (capacity, arc_target) = (chooser.capacity(), chooser.arc_target());
                self.leader = chooser.leader();
                self.follow(before, capacity, arc_target);
            }
        }
    }

    /// Moves the tree from ranking `before` to the chooser's new leader. A
    /// queue policy's state is built when it takes over and dropped again
    /// when a ranking leads. S3-FIFO queues each node as its shadow holds the
    /// same content, what the shadow let go first (`transplant`). ARC queues
    /// reused content in T2 and one-shot content in T1, each least recently
    /// used first, with its shadow's target `arc_target`: queued after its
    /// shadow too, docqa lost up to 0.03 of hit ratio at 1,255 blocks (not
    /// established why; likely the target, which ARC steers by ghost lists
    /// that cannot come along, the shadow's naming the shadow's nodes).
    /// The ghost priority is recomputed as of each node's last access.
    fn follow(&mut self, before: Ranking, capacity: usize, arc_target: u64) {
        let after = self.ranking();
        if before.queue_policy().is_none() && after.queue_policy().is_none() {
            return self.rekey();
        }
        // Off first: the old priorities leave no books behind.
        self.queues = QueueState::Off;
        if let Some(policy) = after.queue_policy() {
            let mut state = QueueState::new(policy);
            if policy == Policy::S3fifo {
                let chooser = self
                    .chooser
                    .as_ref()
                    .expect("a following tree has a chooser");
                for (id, held) in chooser.queue_order(self) {
                    let slot = state.adopted_as(held);
                    self.update(id, |n| (n.queue_slot, n.priority) = (slot, 0));
                }
            } else {
                for id in self.by_last_access() {
                    let slot = state.adopted(self.node_ref(id).hits);
                    self.update(id, |n| (n.queue_slot, n.priority) = (slot, 0));
                }
            }
            let pages = self.pages_per_queue();
            state.adopt_books(pages, capacity as u64, arc_target, self.ghost.remembered());
            self.queues = state;
        } else {
            let (floor, weights) = (self.floor, self.weights());
            for id in self.by_last_access() {
                self.update(id, |n| {
                    n.priority = Policy::Ghost.priority(n, n.last_access, floor, weights);
                    n.queue_slot = 0;
                });
            }
        }
    }

    /// Every node, least recently accessed first (ties by id).
    fn by_last_access(&self) -> Vec<NodeId> {
        let mut ids: Vec<(Stamp, NodeId)> = self.nodes().map(|n| (n.last_access, n.id)).collect();
        ids.sort_unstable();
        ids.into_iter().map(|(_, id)| id).collect()
    }

    /// Device pages per queue, counted from the nodes' queue states (only
    /// while a queue policy keeps state: otherwise priorities are no slots).
    pub(super) fn pages_per_queue(&self) -> [u64; 2] {
        let mut pages = [0u64; 2];
        for node in self.nodes().filter(|n| n.on_device()) {
            let queue = Slot::unpack(node.queue_slot).queue as usize;
            pages[queue] += node.pages(self.page_size) as u64;
        }
        pages
    }

    /// Re-keys every indexed node (the ranking changed).
    fn rekey(&mut self) {
        let ids: Vec<NodeId> = self
            .nodes()
            .filter(|n| n.indexed.is_some())
            .map(|n| n.id)
            .collect();
        for id in ids {
            self.update(id, |_| {});
        }
    }

    /// Turns a fresh tree into a shadow ranking by `ranking` (no shadows of its own).
    #[cfg(any(test, feature = "floor-measurements"))]
    pub(crate) fn make_shadow(&mut self, ranking: Ranking) {
        self.fixed_ranking = Some(ranking);
    }

    /// Puts a fresh ghost tree under the layer that chooses its ranking.
    pub(crate) fn follow_chooser(&mut self, chooser: Box<dyn RankingChooser>) {
        debug_assert!(self.policy == Policy::Ghost && self.is_empty());
        self.leader = chooser.leader();
        self.chooser = Some(chooser);
    }
}

/// The policy whose queue state a tree keeps: its own, or for a ghost tree
/// the queue policy its chooser's leader is (`Policy::Ghost`, none, while a
/// ranking leads).
pub(super) fn queue_owner(policy: Policy, chooser: Option<&dyn RankingChooser>) -> Policy {
    chooser
        .and_then(|c| c.leader().queue_policy())
        .unwrap_or(policy)
}
