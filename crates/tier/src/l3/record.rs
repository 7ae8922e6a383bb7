//! The L3 record: one page on disk, self-describing and checksummed.
//!
//! Layout (little-endian), a whole number of 4 KiB blocks so a record is
//! whole O_DIRECT blocks and a torn write tears at a block edge. The payload
//! comes first, at the record's (block-aligned) start, so a page whose size
//! is a whole number of blocks moves between its own memory and the disk with
//! no copy; the header is the record's last `HEADER_BYTES` bytes (a trailer):
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | len | payload |
//! | len | pad | zeros, up to the trailer |
//! | T + 0 | 8 | magic `RECORD_MAGIC` |
//! | T + 8 | 4 | format version |
//! | T + 12 | 4 | reserved, zero |
//! | T + 16 | 8 | namespace id |
//! | T + 24 | 8 | key |
//! | T + 32 | 8 | sequence (the index's, unique per placement) |
//! | T + 40 | 8 | payload length |
//! | T + 48 | 4 | CRC32C of the header (this field read as zero) and the payload |
//! | T + 52 | 12 | reserved, zero |
//!
//! with `T = record_bytes(len) - HEADER_BYTES` (`header_at`).
//!
//! The decoder is told what the index expects (namespace, key, sequence,
//! length) and serves the payload only when every field and the checksum
//! agree; any other outcome is a `RecordReject` naming the first mismatch.

use std::fmt;
use std::ops::Range;

/// "CPKVL3R" and a format byte, little-endian.
pub const RECORD_MAGIC: u64 = u64::from_le_bytes(*b"CPKVL3R\x02");
/// The record format; a record of any other version is never served
/// (version 1 put the header before the payload).
pub const FORMAT_VERSION: u32 = 2;
/// Header bytes, at the record's end.
pub const HEADER_BYTES: usize = 64;
/// Where the key sits in a header (a scan that looks for a key's record
/// reads it there; only the full check decides).
pub const KEY_AT: usize = 24;
/// Records start and end on this boundary (the O_DIRECT block).
pub const RECORD_ALIGN: usize = 4096;
/// The largest payload a record holds (1 GiB): a length field beyond it is
/// corrupt before anything is compared.
pub const MAX_PAYLOAD_BYTES: u64 = 1 << 30;

const CRC_AT: usize = 48;

/// Bytes one record of `payload` bytes takes on disk (payload, zero
/// padding, header; a multiple of `RECORD_ALIGN`).
pub const fn record_bytes(payload: u64) -> u64 {
    let raw = payload + HEADER_BYTES as u64;
    raw.div_ceil(RECORD_ALIGN as u64) * RECORD_ALIGN as u64
}

/// Where the header of a record of `payload` bytes starts.
pub const fn header_at(payload: u64) -> u64 {
    record_bytes(payload) - HEADER_BYTES as u64
}

/// What the index says the record in a slot must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub namespace: u64,
    pub key: u64,
    pub sequence: u64,
    pub length: u64,
}

/// Why a record was not served; each is a counted miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordReject {
    /// Fewer bytes than the header, or than the header's length says.
    Truncated { have: u64, need: u64 },
    /// Not a cpkv L3 record (never written, or overwritten by something else).
    BadMagic,
    /// Written by another record format.
    Version { found: u32 },
    /// A reserved field is not zero.
    Reserved,
    /// Written under another namespace (model, dtype, layout, geometry).
    ForeignNamespace { found: u64 },
    /// The slot holds another key (reused, or a write that never finished).
    WrongKey { found: u64 },
    /// The slot holds this key from another placement (stale or newer).
    StaleSequence { found: u64 },
    /// The length field disagrees with the index (or exceeds the limit).
    Length { found: u64 },
    /// Header or payload bytes changed after the write (bit flip, torn write).
    Checksum { found: u32, computed: u32 },
}

impl RecordReject {
    /// A short stable name for counters.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Truncated { .. } => "truncated",
            Self::BadMagic => "bad_magic",
            Self::Version { .. } => "version",
            Self::Reserved => "reserved",
            Self::ForeignNamespace { .. } => "foreign_namespace",
            Self::WrongKey { .. } => "wrong_key",
            Self::StaleSequence { .. } => "stale_sequence",
            Self::Length { .. } => "length",
            Self::Checksum { .. } => "checksum",
        }
    }
}

impl fmt::Display for RecordReject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { have, need } => {
                write!(f, "truncated record: {have} bytes, {need} needed")
            }
            Self::BadMagic => write!(f, "not an L3 record (bad magic)"),
            Self::Version { found } => write!(
                f,
                "record format version {found}, expected {FORMAT_VERSION}"
            ),
            Self::Reserved => write!(f, "a reserved header field is not zero"),
            Self::ForeignNamespace { found } => {
                write!(f, "record of foreign namespace {found:#018x}")
            }
            Self::WrongKey { found } => write!(f, "slot holds key {found:#018x}"),
            Self::StaleSequence { found } => write!(f, "slot holds sequence {found} of this key"),
            Self::Length { found } => write!(f, "record length {found} differs from the index"),
            Self::Checksum { found, computed } => {
                write!(f, "CRC32C {found:#010x} stored, {computed:#010x} computed")
            }
        }
    }
}

fn put_u64(buf: &mut [u8], at: usize, value: u64) {
    buf[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

fn get_u64(buf: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(word)
}

fn get_u32(buf: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(word)
}

/// CRC32C of a header (its CRC field read as zero) and payload.
fn checksum(header: &[u8], payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&header[..CRC_AT]);
    let crc = crc32c::crc32c_append(crc, &[0u8; 4]);
    let crc = crc32c::crc32c_append(crc, &header[CRC_AT + 4..HEADER_BYTES]);
    crc32c::crc32c_append(crc, payload)
}

/// The header of a record holding `payload` for `key` at `sequence`.
pub fn encode_header(
    namespace: u64,
    key: u64,
    sequence: u64,
    payload: &[u8],
) -> [u8; HEADER_BYTES] {
    let mut header = [0u8; HEADER_BYTES];
    put_u64(&mut header, 0, RECORD_MAGIC);
    header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    put_u64(&mut header, 16, namespace);
    put_u64(&mut header, KEY_AT, key);
    put_u64(&mut header, 32, sequence);
    put_u64(&mut header, 40, payload.len() as u64);
    let crc = checksum(&header, payload);
    header[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    header
}

/// The payload's byte range inside `record` (a whole record as it lies on
/// disk) when it is exactly what `expected` describes, else the first
/// mismatch.
pub fn decode_record(record: &[u8], expected: &Expected) -> Result<Range<usize>, RecordReject> {
    if expected.length > MAX_PAYLOAD_BYTES {
        return Err(RecordReject::Length {
            found: expected.length,
        });
    }
    let need = record_bytes(expected.length);
    if (record.len() as u64) < need {
        return Err(RecordReject::Truncated {
            have: record.len() as u64,
            need,
        });
    }
    let length = expected.length as usize;
    let at = header_at(expected.length) as usize;
    decode_parts(&record[at..at + HEADER_BYTES], &record[..length], expected)?;
    Ok(0..length)
}

/// Checks a record given as its header and its payload, wherever each lies
/// (a payload read straight into its destination, a header read into
/// scratch; a staged copy holding the two back to back). `payload` must be
/// `expected.length` bytes. Cheap checks first; the checksum last, so a
/// stale or foreign slot costs no CRC pass.
pub fn decode_parts(
    header: &[u8],
    payload: &[u8],
    expected: &Expected,
) -> Result<(), RecordReject> {
    if header.len() < HEADER_BYTES || (payload.len() as u64) < expected.length {
        return Err(RecordReject::Truncated {
            have: (header.len() + payload.len()) as u64,
            need: HEADER_BYTES as u64 + expected.length,
        });
    }
    let header = &header[..HEADER_BYTES];
    if get_u64(header, 0) != RECORD_MAGIC {
        return Err(RecordReject::BadMagic);
    }
    let version = get_u32(header, 8);
    if version != FORMAT_VERSION {
        return Err(RecordReject::Version { found: version });
    }
    if get_u32(header, 12) != 0 || header[52..].iter().any(|b| *b != 0) {
        return Err(RecordReject::Reserved);
    }
    let namespace = get_u64(header, 16);
    if namespace != expected.namespace {
        return Err(RecordReject::ForeignNamespace { found: namespace });
    }
    let key = get_u64(header, KEY_AT);
    if key != expected.key {
        return Err(RecordReject::WrongKey { found: key });
    }
    let sequence = get_u64(header, 32);
    if sequence != expected.sequence {
        return Err(RecordReject::StaleSequence { found: sequence });
    }
    let length = get_u64(header, 40);
    if length != expected.length || length > MAX_PAYLOAD_BYTES {
        return Err(RecordReject::Length { found: length });
    }
    let found = get_u32(header, CRC_AT);
    let computed = checksum(header, &payload[..length as usize]);
    if found != computed {
        return Err(RecordReject::Checksum { found, computed });
    }
    Ok(())
}

/// Seals the record in `record` (a whole record: payload at its start,
/// `record_bytes(length)` long or more): zeroes the padding and writes the
/// header, checksum included.
pub fn seal_record(record: &mut [u8], namespace: u64, key: u64, sequence: u64, length: usize) {
    let at = header_at(length as u64) as usize;
    let (payload, rest) = record.split_at_mut(length);
    rest[..at - length].fill(0);
    let header = encode_header(namespace, key, sequence, payload);
    rest[at - length..at - length + HEADER_BYTES].copy_from_slice(&header);
}

/// Seals the tail of a record whose payload lies elsewhere (written from its
/// own memory): `tail` is the record past the payload (`record_bytes(len) -
/// len` bytes: padding, then the header).
pub fn seal_tail(tail: &mut [u8], namespace: u64, key: u64, sequence: u64, payload: &[u8]) {
    let pad = tail.len() - HEADER_BYTES;
    tail[..pad].fill(0);
    tail[pad..].copy_from_slice(&encode_header(namespace, key, sequence, payload));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(expected: &Expected, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![0xa5u8; record_bytes(payload.len() as u64) as usize];
        out[..payload.len()].copy_from_slice(payload);
        seal_record(
            &mut out,
            expected.namespace,
            expected.key,
            expected.sequence,
            payload.len(),
        );
        out
    }

    fn expected_for(ns: u64, key: u64, seq: u64, len: usize) -> Expected {
        Expected {
            namespace: ns,
            key,
            sequence: seq,
            length: len as u64,
        }
    }

    /// Index `i` of the bytes a record's check covers (payload, then header)
    /// as an offset into the record.
    fn covered(len: usize, i: usize) -> usize {
        if i < len {
            i
        } else {
            header_at(len as u64) as usize + (i - len)
        }
    }

    #[test]
    fn sizes_are_whole_blocks() {
        assert_eq!(record_bytes(0), 4096);
        assert_eq!(record_bytes(4032), 4096);
        assert_eq!(record_bytes(4033), 8192);
        assert_eq!(record_bytes(65536), 69632);
        assert_eq!(header_at(65536), 69632 - 64);
    }

    #[test]
    fn each_field_mismatch_has_its_reason() {
        let e = expected_for(7, 11, 3, 100);
        let rec = record(&e, &[5u8; 100]);
        assert_eq!(decode_record(&rec, &e), Ok(0..100));
        assert!(rec[100..4032].iter().all(|b| *b == 0), "padding is zeroed");
        let other = |f: fn(&mut Expected)| {
            let mut x = e;
            f(&mut x);
            decode_record(&rec, &x).unwrap_err().name()
        };
        assert_eq!(other(|x| x.namespace = 8), "foreign_namespace");
        assert_eq!(other(|x| x.key = 12), "wrong_key");
        assert_eq!(other(|x| x.sequence = 4), "stale_sequence");
        assert_eq!(other(|x| x.length = 99), "length");
        assert_eq!(other(|x| x.length = MAX_PAYLOAD_BYTES + 1), "length");
        assert_eq!(
            decode_record(&rec[..4095], &e).unwrap_err().name(),
            "truncated"
        );
        assert_eq!(
            decode_record(&rec[..40], &e).unwrap_err().name(),
            "truncated"
        );
        assert_eq!(
            decode_record(&[0u8; 4096], &e).unwrap_err().name(),
            "bad_magic"
        );
        let mut bad = rec.clone();
        bad[4032 + 8] = 1;
        assert_eq!(decode_record(&bad, &e).unwrap_err().name(), "version");
        let mut bad = rec.clone();
        bad[4032 + 60] = 1;
        assert_eq!(decode_record(&bad, &e).unwrap_err().name(), "reserved");
        let mut bad = rec;
        bad[50] ^= 0x10;
        assert_eq!(decode_record(&bad, &e).unwrap_err().name(), "checksum");
    }

    #[test]
    fn a_payload_on_its_own_and_a_sealed_tail_make_the_same_record() {
        let payload: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
        let e = expected_for(1, 2, 3, payload.len());
        let whole = record(&e, &payload);
        let mut tail = vec![0xffu8; whole.len() - payload.len()];
        seal_tail(&mut tail, 1, 2, 3, &payload);
        assert_eq!(&whole[payload.len()..], &tail[..]);
        let at = tail.len() - HEADER_BYTES;
        assert_eq!(decode_parts(&tail[at..], &payload, &e), Ok(()));
        assert_eq!(
            decode_parts(&tail[at..], &payload[..100], &e)
                .unwrap_err()
                .name(),
            "truncated"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// A valid record round-trips its payload.
        #[test]
        fn valid_records_round_trip(ns: u64, key: u64, seq: u64, payload in proptest::collection::vec(any::<u8>(), 0..9000)) {
            let e = expected_for(ns, key, seq, payload.len());
            let rec = record(&e, &payload);
            let range = decode_record(&rec, &e).unwrap();
            prop_assert_eq!(&rec[range], &payload[..]);
        }

        /// Any single bit flip inside header or payload is rejected.
        #[test]
        fn bit_flips_never_decode(ns: u64, key: u64, seq: u64,
                                  payload in proptest::collection::vec(any::<u8>(), 1..6000),
                                  at: prop::sample::Index, bit in 0u8..8) {
            let e = expected_for(ns, key, seq, payload.len());
            let mut rec = record(&e, &payload);
            let i = covered(payload.len(), at.index(HEADER_BYTES + payload.len()));
            rec[i] ^= 1 << bit;
            prop_assert!(decode_record(&rec, &e).is_err());
        }

        /// A record cut anywhere before its end is rejected.
        #[test]
        fn truncation_never_decodes(payload in proptest::collection::vec(any::<u8>(), 1..6000), at: prop::sample::Index) {
            let e = expected_for(1, 2, 3, payload.len());
            let rec = record(&e, &payload);
            let cut = at.index(rec.len());
            prop_assert!(decode_record(&rec[..cut], &e).is_err());
        }

        /// A torn write (the record's first k 4 KiB blocks new, the rest
        /// from an older record of another key or sequence) is rejected.
        #[test]
        fn torn_writes_never_decode(old in proptest::collection::vec(any::<u8>(), 4100..12000),
                                    new in proptest::collection::vec(any::<u8>(), 4100..12000),
                                    blocks in 1usize..3, same_key: bool) {
            let e_old = expected_for(1, 2, 3, old.len());
            let e_new = expected_for(1, if same_key { 2 } else { 9 }, 4, new.len());
            let mut rec_old = record(&e_old, &old);
            let rec_new = record(&e_new, &new);
            rec_old.resize(rec_new.len().max(rec_old.len()), 0);
            let cut = (blocks * RECORD_ALIGN).min(rec_new.len() - 1);
            let mut torn = rec_old.clone();
            torn[..cut].copy_from_slice(&rec_new[..cut]);
            // Served only if the checked bytes happen to equal the new record's.
            let at = header_at(new.len() as u64) as usize;
            if torn[..new.len()] != rec_new[..new.len()] || torn[at..at + HEADER_BYTES] != rec_new[at..at + HEADER_BYTES] {
                prop_assert!(decode_record(&torn, &e_new).is_err());
            }
            // The new payload under the old header is never the old record either.
            prop_assert!(decode_record(&torn, &e_old).is_err());
        }

        /// Random bytes are never a valid record for any expectation.
        #[test]
        fn random_bytes_never_decode(bytes in proptest::collection::vec(any::<u8>(), 0..5000), ns: u64, key: u64, seq: u64, len in 0u64..5000) {
            let e = Expected { namespace: ns, key, sequence: seq, length: len };
            prop_assert!(decode_record(&bytes, &e).is_err());
        }
    }
}
