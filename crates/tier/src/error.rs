//! The one error type of the tier. Every variant names the offending value;
//! a call that returns an error has changed nothing.

use std::fmt;

use cpkv_evict::{EvictError, NodeId, PageId};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TierError {
    /// A configuration value out of range.
    Config { field: &'static str, reason: String },
    /// A plain argument out of range (a rank, a row table's length).
    Argument { name: &'static str, reason: String },
    /// A device page id outside `0..device_pages`.
    PageOutOfRange { page: PageId, capacity: u64 },
    /// A device page passed to a call that needs it held by the caller
    /// (allocated, not free and not adopted by the tree).
    PageNotHeld { page: PageId, why: &'static str },
    /// The same device page twice in one call.
    RepeatedPage { page: PageId },
    /// A load plan asked for a node that is not locked by a lookup.
    NotLocked(NodeId),
    /// A commit frontier beyond the last issued backup ticket.
    FutureTicket { frontier: u64, issued: u64 },
    /// An offload key the call cannot take (`OffloadIndex`), named in hex.
    BadKey { key: String, reason: &'static str },
    /// The offload index and its prefix tree disagree (an internal fault,
    /// or a 64-bit key hash collision).
    Divergence(String),
    /// The prefix tree refused the call.
    Tree(EvictError),
}

impl fmt::Display for TierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config { field, reason } => write!(f, "config {field}: {reason}"),
            Self::Argument { name, reason } => write!(f, "{name} {reason}"),
            Self::PageOutOfRange { page, capacity } => {
                write!(
                    f,
                    "device page {page} is outside the pool of {capacity} pages"
                )
            }
            Self::PageNotHeld { page, why } => write!(f, "device page {page} {why}"),
            Self::RepeatedPage { page } => write!(f, "device page {page} is given twice"),
            Self::NotLocked(node) => write!(
                f,
                "node {node} is not locked (load only what a lookup locked)"
            ),
            Self::FutureTicket { frontier, issued } => write!(
                f,
                "commit frontier {frontier} is beyond the last issued backup ticket {issued}"
            ),
            Self::BadKey { key, reason } => write!(f, "key {key} {reason}"),
            Self::Divergence(what) => write!(f, "offload index and prefix tree disagree: {what}"),
            Self::Tree(err) => write!(f, "{err}"),
        }
    }
}

impl std::error::Error for TierError {}

impl From<EvictError> for TierError {
    fn from(err: EvictError) -> Self {
        Self::Tree(err)
    }
}

pub type Result<T, E = TierError> = std::result::Result<T, E>;
