//! The index log: what recovery reads instead of the data.
//!
//! A log file is a 64-byte header (magic, format version, namespace id,
//! slot bytes, slot count, CRC32C) followed by 32-byte entries, one per page
//! written and made durable: key, sequence, slot, payload length, CRC32C of
//! the entry. An entry is appended only after its record's bytes are synced,
//! so an entry in the log names a record that is on disk (unless the disk
//! lies, which the record's own checksum catches at read time). A torn or
//! corrupt entry ends the log: recovery keeps the entries before it.

use super::record::FORMAT_VERSION;

/// "CPKVL3LG", little-endian.
pub const LOG_MAGIC: u64 = u64::from_le_bytes(*b"CPKVL3LG");
pub const LOG_HEADER_BYTES: usize = 64;
pub const LOG_ENTRY_BYTES: usize = 32;

/// What a log file was written for: a store opened with other values
/// ignores it (a namespace or shape change is a cold start, counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogHeader {
    pub namespace: u64,
    pub slot_bytes: u64,
    pub slots: u64,
}

/// One durable placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogEntry {
    pub key: u64,
    pub sequence: u64,
    pub slot: u32,
    pub length: u32,
}

impl LogEntry {
    /// The length that marks a tombstone: `key` left `slot` (dropped as
    /// corrupt), so recovery must not bring back the slot's older page.
    pub const TOMBSTONE: u32 = u32::MAX;

    pub fn tombstone(key: u64, slot: u32, sequence: u64) -> Self {
        Self {
            key,
            sequence,
            slot,
            length: Self::TOMBSTONE,
        }
    }

    pub fn is_tombstone(&self) -> bool {
        self.length == Self::TOMBSTONE
    }
}

pub fn encode_log_header(header: &LogHeader) -> [u8; LOG_HEADER_BYTES] {
    let mut out = [0u8; LOG_HEADER_BYTES];
    out[0..8].copy_from_slice(&LOG_MAGIC.to_le_bytes());
    out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    out[16..24].copy_from_slice(&header.namespace.to_le_bytes());
    out[24..32].copy_from_slice(&header.slot_bytes.to_le_bytes());
    out[32..40].copy_from_slice(&header.slots.to_le_bytes());
    let crc = crc32c::crc32c(&out[..60]);
    out[60..64].copy_from_slice(&crc.to_le_bytes());
    out
}

pub fn encode_log_entry(entry: &LogEntry) -> [u8; LOG_ENTRY_BYTES] {
    let mut out = [0u8; LOG_ENTRY_BYTES];
    out[0..8].copy_from_slice(&entry.key.to_le_bytes());
    out[8..16].copy_from_slice(&entry.sequence.to_le_bytes());
    out[16..20].copy_from_slice(&entry.slot.to_le_bytes());
    out[20..24].copy_from_slice(&entry.length.to_le_bytes());
    let crc = crc32c::crc32c(&out[..28]);
    out[28..32].copy_from_slice(&crc.to_le_bytes());
    out
}

fn word(buf: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(w)
}

fn half(buf: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(w)
}

/// A log file's header and its valid entries, and the byte length of the
/// valid prefix (where the next append goes; a torn tail is cut there).
/// `None` when the header is missing, corrupt or of another format.
pub fn decode_log(bytes: &[u8]) -> Option<(LogHeader, Vec<LogEntry>, usize)> {
    if bytes.len() < LOG_HEADER_BYTES
        || word(bytes, 0) != LOG_MAGIC
        || half(bytes, 8) != FORMAT_VERSION
        || half(bytes, 60) != crc32c::crc32c(&bytes[..60])
    {
        return None;
    }
    let header = LogHeader {
        namespace: word(bytes, 16),
        slot_bytes: word(bytes, 24),
        slots: word(bytes, 32),
    };
    let body = &bytes[LOG_HEADER_BYTES..];
    let mut entries = Vec::with_capacity(body.len() / LOG_ENTRY_BYTES);
    for chunk in body.chunks_exact(LOG_ENTRY_BYTES) {
        if half(chunk, 28) != crc32c::crc32c(&chunk[..28]) {
            break;
        }
        entries.push(LogEntry {
            key: word(chunk, 0),
            sequence: word(chunk, 8),
            slot: half(chunk, 16),
            length: half(chunk, 20),
        });
    }
    let valid = LOG_HEADER_BYTES + entries.len() * LOG_ENTRY_BYTES;
    Some((header, entries, valid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn log(entries: &[LogEntry]) -> Vec<u8> {
        let mut out = encode_log_header(&LogHeader {
            namespace: 5,
            slot_bytes: 8192,
            slots: 100,
        })
        .to_vec();
        for e in entries {
            out.extend_from_slice(&encode_log_entry(e));
        }
        out
    }

    proptest! {
        /// Entries round-trip; a cut or a flipped bit keeps exactly the
        /// entries before the damage.
        #[test]
        fn damage_keeps_the_prefix(keys in proptest::collection::vec(any::<u64>(), 1..40), at: prop::sample::Index, bit in 0u8..8, cut: bool) {
            let entries: Vec<LogEntry> = keys.iter().enumerate()
                .map(|(i, k)| LogEntry { key: *k, sequence: i as u64, slot: i as u32, length: 4000 }).collect();
            let mut bytes = log(&entries);
            let (_, got, valid) = decode_log(&bytes).unwrap();
            prop_assert_eq!(&got, &entries);
            prop_assert_eq!(valid, bytes.len());
            let i = LOG_HEADER_BYTES + at.index(bytes.len() - LOG_HEADER_BYTES);
            let damaged = (i - LOG_HEADER_BYTES) / LOG_ENTRY_BYTES;
            if cut { bytes.truncate(i); } else { bytes[i] ^= 1 << bit; }
            let (_, got, valid) = decode_log(&bytes).unwrap();
            prop_assert_eq!(&got[..], &entries[..damaged]);
            prop_assert_eq!(valid, LOG_HEADER_BYTES + damaged * LOG_ENTRY_BYTES);
        }

        #[test]
        fn damaged_headers_are_refused(at in 0usize..64, bit in 0u8..8) {
            let mut bytes = log(&[]);
            bytes[at] ^= 1 << bit;
            prop_assert!(decode_log(&bytes).is_none());
        }
    }
}
