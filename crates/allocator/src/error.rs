//! The one error type of the allocator. Every variant names the offending key,
//! payload or value; a call that returns an error has changed nothing.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllocError {
    /// The key is not live.
    UnknownKey { key: u64 },
    /// The key is already live (reserve, or a split target).
    DuplicateKey { key: u64 },
    /// The same key appears twice in one batch.
    RepeatedKeyInBatch { key: u64 },
    /// A payload name the allocator was not built with.
    UnknownPayload { name: String },
    /// A payload name that is the empty string.
    EmptyPayloadName,
    /// A payload name given twice (constructor or payload list).
    RepeatedPayload { name: String },
    /// An empty payload list (constructor or reserve).
    NoPayloads,
    /// More payload kinds than a payload set can hold.
    TooManyPayloads { count: usize, max: usize },
    /// A pool capacity of zero or beyond what an int64 page number can address.
    InvalidCapacity { payload: String, capacity: u64 },
    /// A page count of zero.
    InvalidPages { key: u64, num_pages: u64 },
    /// A split position outside `0 < at < num_pages`.
    InvalidSplit { key: u64, at: u64, num_pages: u64 },
    /// A split whose left and right keys are the same.
    SameSplitKeys { key: u64, target: u64 },
    /// A split of an object that was never committed.
    NotCommitted { key: u64 },
    /// A page released with `release_held` that is not held.
    NotHeld { payload: usize, page: u64 },
    /// The same page appears twice in one `release_held_many`.
    RepeatedPageInBatch { payload: usize, page: u64 },
    /// Snapshot bytes that are truncated, corrupted or of an unknown version.
    CorruptSnapshot { reason: String },
}

impl AllocError {
    pub(crate) fn corrupt(reason: impl Into<String>) -> Self {
        AllocError::CorruptSnapshot {
            reason: reason.into(),
        }
    }
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::UnknownKey { key } => write!(f, "key {key} is not allocated"),
            AllocError::DuplicateKey { key } => write!(f, "key {key} is already allocated"),
            AllocError::RepeatedKeyInBatch { key } => {
                write!(f, "key {key} appears more than once in the batch")
            }
            AllocError::UnknownPayload { name } => write!(f, "unknown payload {name:?}"),
            AllocError::EmptyPayloadName => write!(f, "payload names must not be empty"),
            AllocError::RepeatedPayload { name } => write!(f, "payload {name:?} is given twice"),
            AllocError::NoPayloads => write!(f, "at least one payload is required"),
            AllocError::TooManyPayloads { count, max } => {
                write!(f, "{count} payloads given, at most {max} are supported")
            }
            AllocError::InvalidCapacity { payload, capacity } => write!(
                f,
                "payload {payload:?} has capacity {capacity}; it must be in 1..={}",
                crate::MAX_CAPACITY
            ),
            AllocError::InvalidPages { key, num_pages } => write!(
                f,
                "key {key}: num_pages must be at least 1, got {num_pages}"
            ),
            AllocError::InvalidSplit { key, at, num_pages } => write!(
                f,
                "key {key}: split position {at} must satisfy 0 < at < {num_pages}"
            ),
            AllocError::SameSplitKeys { key, target } => write!(
                f,
                "key {key}: left and right keys must differ, both are {target}"
            ),
            AllocError::NotCommitted { key } => {
                write!(
                    f,
                    "key {key} is not committed; only committed objects can be split"
                )
            }
            AllocError::NotHeld { payload, page } => {
                write!(f, "page {page} of payload #{payload} is not held")
            }
            AllocError::RepeatedPageInBatch { payload, page } => write!(
                f,
                "page {page} of payload #{payload} appears more than once in the batch"
            ),
            AllocError::CorruptSnapshot { reason } => write!(f, "corrupt snapshot: {reason}"),
        }
    }
}

impl std::error::Error for AllocError {}

pub type Result<T, E = AllocError> = std::result::Result<T, E>;
