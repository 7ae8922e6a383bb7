//! The node-shared slab's byte protocol, in pure Rust: what the engines'
//! host pools and the slab's shared memory hold, and how bytes move between
//! them so that a reader never takes torn or foreign bytes for a page.
//!
//! - [`region`]: `Region`, memory another owner keeps mapped (a CPU tensor,
//!   a shared-memory slab), and the checked views the protocol takes of it.
//! - [`seqlock`]: the row seqlock: a row's stamp (its page's handle,
//!   `-handle` while its bytes change) and key tag, the fences between
//!   copies and stamps, and the key tag itself.
//! - [`layout`]: where a page's entries lie, in a host pool (`Entry`,
//!   `HostPages`) and in the slab (`PageLayout`: entry-major rows).
//! - [`rows`]: the run copy between host pages and slab rows (through
//!   `cpkv-copy`'s run tables and kernels), and the seqlock's write, read and
//!   spill sequences over it.
//! - [`staging`]: the L3 read-staging area, so that a node's ranks read an
//!   L3 record from disk once (a state word per entry, claims by CAS).
//!
//! Every copy checks its ranges against the buffers before a byte moves;
//! every shared word is accessed atomically (other processes of the node
//! access it too). Errors are strings naming the pool and the offending
//! row, page or entry; the binding (`cpkv-py`) maps them to Python's.

pub mod layout;
pub mod region;
pub mod rows;
pub mod seqlock;
pub mod staging;

pub use layout::{Entry, HostPages, Outside, PageLayout, PoolMemory};
pub use region::Region;
pub use rows::{Direction, ReadOutcome};
pub use seqlock::{copies_done, key_tag, RowStamps, RowWrite};
pub use staging::{
    Found, Outcome, StagingArea, StagingError, Want, MAX_STAGED_SEQUENCE, MAX_STAGING_ENTRIES,
    REASONS,
};
