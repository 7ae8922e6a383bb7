//! The L3 decisions' one error type; every variant names the offending value
//! and a call that returns one has changed nothing.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum L3Error {
    /// A size or count out of range (slot size, capacity, ranks per node).
    Argument { name: &'static str, reason: String },
    /// A batch names the same key twice.
    RepeatedKey { key: u64 },
    /// A batch holds more new pages than the store has slots.
    BatchTooLarge { pages: u64, slots: u64 },
    /// A batch of records whose arguments do not fit together or their
    /// buffers (lengths, sizes, rows), the reason naming what.
    Batch { reason: String },
}

impl fmt::Display for L3Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Argument { name, reason } => write!(f, "{name} {reason}"),
            Self::Batch { reason } => f.write_str(reason),
            Self::RepeatedKey { key } => write!(f, "key {key:#018x} is given twice in one batch"),
            Self::BatchTooLarge { pages, slots } => write!(
                f,
                "a batch of {pages} new pages does not fit the store's {slots} slots"
            ),
        }
    }
}

impl std::error::Error for L3Error {}
