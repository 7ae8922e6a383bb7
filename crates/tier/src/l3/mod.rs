//! The durable third tier (L3): what leaves the host slab for a node-local
//! disk, where it goes, what is evicted under the byte cap, and how a record
//! on disk proves what it is.
//!
//! Decisions only, like the rest of this crate: `L3Index` is a pure function
//! of the replicated call sequence (placements, lookups, drops), so every
//! rank of every node reaches the same index with no collective and one
//! digest shows it. The bytes (data files, the index log, fsync order,
//! O_DIRECT) live in Python (`cpkv.tier.l3`) around it.
//!
//! - `record`: the self-describing 4 KiB-aligned record (payload first, then
//!   a header of magic, format version, namespace, key, sequence, length and
//!   CRC32C) and a decoder that names the reason for every mismatch.
//! - `namespace`: what must match for a page to be served (format version,
//!   model, dtype, KV layout, page size, CP/TP geometry), as one id.
//! - `log`: the index log's 32-byte checksummed entries and the file header;
//!   recovery rebuilds the index from them without reading page data.
//! - `batch`: a read's or a write's records sealed or checked in one call,
//!   every argument checked first; an index rebuilt from a node's logs.
//! - `index`: key -> (slot, sequence), lowest-free-slot placement in the
//!   preallocated data files, LRU eviction by a logical clock under the
//!   slot cap, the writer rank of each page, the digest.

mod batch;
mod error;
mod index;
mod log;
mod namespace;
mod record;

pub use batch::{
    check_into, check_packed, check_split, recover_logs, seal_packed, seal_records, seal_tails,
    LogRecovery, RecordBatch,
};
pub use error::L3Error;
pub use index::{writer_rank, L3Index, L3Placement, L3Recovery, MAX_L3_SLOTS};
pub use log::{
    decode_log, encode_log_entry, encode_log_header, LogEntry, LogHeader, LOG_ENTRY_BYTES,
    LOG_HEADER_BYTES, LOG_MAGIC,
};
pub use namespace::L3Namespace;
pub use record::{
    decode_parts, decode_record, encode_header, header_at, record_bytes, seal_record, seal_tail,
    Expected, RecordReject, FORMAT_VERSION, HEADER_BYTES, KEY_AT, MAX_PAYLOAD_BYTES, RECORD_ALIGN,
    RECORD_MAGIC,
};
