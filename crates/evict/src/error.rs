//! Every way a prefix-tree call can be refused. A refused call changes nothing.

use std::fmt;

use crate::ids::NodeId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictError {
    /// The node id was never allocated, or its node has left the tree.
    UnknownNode(NodeId),
    /// Tokens that are not usable (for example a `page_size` of zero).
    InvalidTokens(String),
    /// `pages.len()` does not equal the number of whole pages in the tokens.
    PageCountMismatch {
        pages: usize,
        whole_pages: usize,
        page_size: usize,
    },
    /// A policy name that does not exist.
    UnknownPolicy(String),
    /// `unlock` on a node (or an ancestor) whose lock count is already zero.
    LockUnderflow(NodeId),
    /// A tier operation that does not fit the node's residency (for example
    /// attaching device pages to a node already on device).
    InvalidTier { node: NodeId, reason: &'static str },
    /// A device page id that is already held by a node of the tree.
    PageInUse(u64),
    /// A host object key that is already recorded on another node.
    HostKeyInUse(u64),
    /// The root of a namespace cannot be locked, evicted or backed up.
    RootNode(NodeId),
    /// Snapshot bytes that are truncated, corrupted or inconsistent.
    CorruptSnapshot(String),
    /// Sampling parameters of ghost's candidates out of range (`Sampling::new`).
    InvalidSampling(String),
}

impl fmt::Display for EvictError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownNode(id) => write!(f, "unknown node {id} (never created, or evicted)"),
            Self::InvalidTokens(why) => write!(f, "invalid tokens: {why}"),
            Self::PageCountMismatch {
                pages,
                whole_pages,
                page_size,
            } => write!(
                f,
                "got {pages} page ids for {whole_pages} whole pages of {page_size} tokens"
            ),
            Self::UnknownPolicy(name) => write!(
                f,
                "unknown eviction policy {name:?} (known: {})",
                crate::Policy::NAMES.join(", ")
            ),
            Self::LockUnderflow(id) => write!(f, "unlock of node {id} below zero"),
            Self::InvalidTier { node, reason } => write!(f, "node {node}: {reason}"),
            Self::PageInUse(page) => write!(f, "device page {page} is already held by the tree"),
            Self::HostKeyInUse(key) => write!(f, "host object key {key} is already recorded"),
            Self::RootNode(id) => write!(f, "node {id} is a namespace root"),
            Self::CorruptSnapshot(why) => write!(f, "corrupt prefix tree snapshot: {why}"),
            Self::InvalidSampling(why) => write!(f, "invalid ghost sampling: {why}"),
        }
    }
}

impl std::error::Error for EvictError {}
