//! Records by the batch: one call seals or checks every record of a read or
//! a write, each argument checked against the buffers first (a refused call
//! writes nothing). Three shapes a batch lies in:
//! - whole records back to back (`slot_bytes` or `record_bytes(length)` each:
//!   payload, zero padding, header), as a read of consecutive slots or a
//!   staged write has them;
//! - split: payloads in rows of a destination, tails (padding, header) apart,
//!   as a read straight into the host slab has them;
//! - packed: payload then header, no padding (the cluster tier's objects).
//!
//! A check answers per record `None` when served, else the first mismatch.

use super::error::L3Error;
use super::log::{decode_log, LogHeader};
use super::record::{
    decode_parts, decode_record, encode_header, record_bytes, seal_record, seal_tail, Expected,
    RecordReject, HEADER_BYTES, MAX_PAYLOAD_BYTES,
};
use super::{L3Index, L3Recovery};

fn refused(reason: String) -> L3Error {
    L3Error::Batch { reason }
}

/// The records of one batch: record `j` is `keys[j]` at `sequences[j]`,
/// `length` payload bytes, under `namespace`.
#[derive(Debug, Clone, Copy)]
pub struct RecordBatch<'a> {
    pub namespace: u64,
    pub keys: &'a [u64],
    pub sequences: &'a [u64],
    pub length: u64,
}

impl RecordBatch<'_> {
    fn len(&self) -> usize {
        self.keys.len()
    }

    fn expected(&self, j: usize) -> Expected {
        Expected {
            namespace: self.namespace,
            key: self.keys[j],
            sequence: self.sequences[j],
            length: self.length,
        }
    }

    /// The payload length, checked against the limit; and keys and
    /// sequences of one length.
    fn checked(&self) -> Result<usize, L3Error> {
        if self.length > MAX_PAYLOAD_BYTES {
            return Err(refused(format!(
                "length {} is over the limit of {MAX_PAYLOAD_BYTES} bytes",
                self.length
            )));
        }
        if self.sequences.len() != self.keys.len() {
            return Err(refused(format!(
                "keys and sequences differ in length: {}, {}",
                self.keys.len(),
                self.sequences.len()
            )));
        }
        Ok(self.length as usize)
    }

    /// Bytes a record holds past its payload (padding, then the header).
    fn tail_bytes(&self) -> usize {
        (record_bytes(self.length) - self.length) as usize
    }
}

/// `buffer` (called `what`) as `n` pieces of `each` bytes, exactly.
fn pieces(what: &str, bytes: usize, n: usize, each: usize, kind: &str) -> Result<(), L3Error> {
    if bytes != n * each {
        return Err(refused(format!(
            "{what} holds {bytes} bytes, {n} {kind} of {each} need {}",
            n * each
        )));
    }
    Ok(())
}

/// `rows` (one per record) inside a destination of `bytes` bytes, rows of
/// `length` bytes.
fn rows_inside(rows: &[u64], length: usize, bytes: usize) -> Result<(), L3Error> {
    let outside = |r: u64| {
        usize::try_from(r).map_or(true, |r| r.saturating_add(1).saturating_mul(length) > bytes)
    };
    match rows.iter().find(|r| outside(**r)) {
        Some(row) => Err(refused(format!("row {row} is outside out ({bytes} bytes)"))),
        None => Ok(()),
    }
}

fn payloads_of(batch: &RecordBatch<'_>, payloads: &[&[u8]]) -> Result<(), L3Error> {
    if let Some((j, p)) = payloads
        .iter()
        .enumerate()
        .find(|(_, p)| p.len() as u64 != batch.length)
    {
        return Err(refused(format!(
            "payload {j} has {} bytes, the records hold {}",
            p.len(),
            batch.length
        )));
    }
    if payloads.len() != batch.len() {
        return Err(refused(format!(
            "payloads, keys and sequences differ in length: {}, {}, {}",
            payloads.len(),
            batch.keys.len(),
            batch.sequences.len()
        )));
    }
    Ok(())
}

/// A sealing call's arguments checked: the batch, a payload per record of
/// `length` bytes, and `buffer` (`what`) as one piece of `each(batch)` bytes
/// per record. The payload length.
fn sealable(
    batch: &RecordBatch<'_>,
    payloads: &[&[u8]],
    buffer: usize,
    what: &str,
    each: fn(&RecordBatch<'_>) -> usize,
) -> Result<usize, L3Error> {
    let length = batch.checked()?;
    payloads_of(batch, payloads)?;
    pieces(what, buffer, batch.len(), each(batch), what)?;
    Ok(length)
}

/// Builds whole records back to back in `records` (`record_bytes(length)`
/// each): payload `j` copied to record `j`'s start, then sealed.
pub fn seal_records(
    records: &mut [u8],
    batch: &RecordBatch<'_>,
    payloads: &[&[u8]],
) -> Result<(), L3Error> {
    let whole = |b: &RecordBatch<'_>| record_bytes(b.length) as usize;
    let length = sealable(batch, payloads, records.len(), "records", whole)?;
    for (j, record) in records.chunks_exact_mut(whole(batch)).enumerate() {
        record[..length].copy_from_slice(payloads[j]);
        seal_record(
            record,
            batch.namespace,
            batch.keys[j],
            batch.sequences[j],
            length,
        );
    }
    Ok(())
}

/// Seals the tails of records whose payloads are written from their own
/// memory: tail `j` of `tails` (`record_bytes(length) - length` bytes) for
/// `payloads[j]`.
pub fn seal_tails(
    tails: &mut [u8],
    batch: &RecordBatch<'_>,
    payloads: &[&[u8]],
) -> Result<(), L3Error> {
    sealable(
        batch,
        payloads,
        tails.len(),
        "tails",
        |b: &RecordBatch<'_>| b.tail_bytes(),
    )?;
    for (j, tail) in tails.chunks_exact_mut(batch.tail_bytes()).enumerate() {
        seal_tail(
            tail,
            batch.namespace,
            batch.keys[j],
            batch.sequences[j],
            payloads[j],
        );
    }
    Ok(())
}

/// Checks records read back to back into `records` (`slot_bytes` each; the
/// last ones may be short) and copies each good payload into row `rows[j]`
/// of `out` (rows of `length` bytes).
pub fn check_into(
    records: &[u8],
    slot_bytes: usize,
    batch: &RecordBatch<'_>,
    out: &mut [u8],
    rows: &[u64],
) -> Result<Vec<Option<RecordReject>>, L3Error> {
    if batch.length > MAX_PAYLOAD_BYTES || record_bytes(batch.length) > slot_bytes as u64 {
        return Err(refused(format!(
            "length {} does not fit a record buffer of {slot_bytes} bytes (at most {MAX_PAYLOAD_BYTES})",
            batch.length
        )));
    }
    let length = batch.checked()?;
    if rows.len() != batch.len() {
        return Err(refused(format!(
            "keys, sequences and rows differ in length: {}, {}, {}",
            batch.keys.len(),
            batch.sequences.len(),
            rows.len()
        )));
    }
    rows_inside(rows, length, out.len())?;
    let mut reasons = Vec::with_capacity(batch.len());
    for (j, &row) in rows.iter().enumerate() {
        let lo = (j * slot_bytes).min(records.len());
        let hi = (lo + slot_bytes).min(records.len());
        match decode_record(&records[lo..hi], &batch.expected(j)) {
            Ok(payload) => {
                let at = row as usize * length;
                out[at..at + length]
                    .copy_from_slice(&records[lo + payload.start..lo + payload.end]);
                reasons.push(None);
            }
            Err(reject) => reasons.push(Some(reject)),
        }
    }
    Ok(reasons)
}

/// Checks records read split: payload `j` in row `rows[j]` of `out` (rows
/// of `length` bytes), its tail in `tails`; `whole[j]` says the read reached
/// the record's end (else `Truncated`).
pub fn check_split(
    tails: &[u8],
    out: &[u8],
    rows: &[u64],
    whole: &[bool],
    batch: &RecordBatch<'_>,
) -> Result<Vec<Option<RecordReject>>, L3Error> {
    let length = batch.checked()?;
    let (n, tail_bytes) = (batch.len(), batch.tail_bytes());
    if rows.len() != n || whole.len() != n {
        return Err(refused(format!(
            "keys, sequences, rows and whole differ in length: {n}, {}, {}, {}",
            batch.sequences.len(),
            rows.len(),
            whole.len()
        )));
    }
    pieces("tails", tails.len(), n, tail_bytes, "tails")?;
    rows_inside(rows, length, out.len())?;
    Ok((0..n)
        .map(|j| {
            if !whole[j] {
                return Some(RecordReject::Truncated {
                    have: 0,
                    need: record_bytes(batch.length),
                });
            }
            let tail = &tails[j * tail_bytes..(j + 1) * tail_bytes];
            let at = rows[j] as usize * length;
            decode_parts(
                &tail[tail_bytes - HEADER_BYTES..],
                &out[at..at + length],
                &batch.expected(j),
            )
            .err()
        })
        .collect())
}

/// A packed batch over `bytes` bytes checked: (payload length, bytes per
/// record).
fn packed(batch: &RecordBatch<'_>, bytes: usize) -> Result<(usize, usize), L3Error> {
    let length = batch.checked()?;
    let each = length + HEADER_BYTES;
    pieces("records", bytes, batch.len(), each, "packed records")?;
    Ok((length, each))
}

/// Seals packed records in place: record `j` of `records` (`length +
/// HEADER_BYTES` bytes each) holds its payload at its start; its header is
/// written right after it.
pub fn seal_packed(records: &mut [u8], batch: &RecordBatch<'_>) -> Result<(), L3Error> {
    let (length, each) = packed(batch, records.len())?;
    for (j, record) in records.chunks_exact_mut(each).enumerate() {
        let (payload, header) = record.split_at_mut(length);
        header.copy_from_slice(&encode_header(
            batch.namespace,
            batch.keys[j],
            batch.sequences[j],
            payload,
        ));
    }
    Ok(())
}

/// Checks packed records (`length + HEADER_BYTES` bytes each).
pub fn check_packed(
    records: &[u8],
    batch: &RecordBatch<'_>,
) -> Result<Vec<Option<RecordReject>>, L3Error> {
    let (length, each) = packed(batch, records.len())?;
    Ok(records
        .chunks_exact(each)
        .enumerate()
        .map(|(j, record)| {
            decode_parts(&record[length..], &record[..length], &batch.expected(j)).err()
        })
        .collect())
}

/// An index rebuilt from the logs of every rank of a node.
#[derive(Debug)]
pub struct LogRecovery {
    pub index: L3Index,
    pub report: L3Recovery,
    /// Per log, the length of its valid prefix (0: ignored).
    pub valid: Vec<usize>,
    /// Non-empty logs ignored (header missing, corrupt, or for another
    /// namespace or shape).
    pub foreign_logs: u64,
}

/// Rebuilds an index from the logs' bytes without reading page data; a log
/// whose header is not `want` is ignored.
pub fn recover_logs(
    ranks_on_node: u64,
    logs: &[Vec<u8>],
    want: &LogHeader,
) -> Result<LogRecovery, L3Error> {
    let mut entries = Vec::new();
    let mut valid = Vec::with_capacity(logs.len());
    let mut foreign_logs = 0u64;
    for log in logs {
        match decode_log(log) {
            Some((header, found, length)) if header == *want => {
                entries.extend(found);
                valid.push(length);
            }
            _ => {
                foreign_logs += u64::from(!log.is_empty());
                valid.push(0);
            }
        }
    }
    let (index, report) = L3Index::recover(want.slots, ranks_on_node, entries)?;
    Ok(LogRecovery {
        index,
        report,
        valid,
        foreign_logs,
    })
}
