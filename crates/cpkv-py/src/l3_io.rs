//! The L3 store's batch I/O (`cpkv.tier.l3.L3Store.put` and `read_many`):
//! one native call per batch, without the GIL, in which the CPU work runs
//! beside the disk instead of between its requests.
//!
//! Writing, this thread builds the batch's records chunk by chunk in the
//! caller's aligned scratch (each payload copied and checksummed in one
//! pass) while a second thread writes the chunks already built. Reading, a
//! second thread reads chunk i+1 while this one checks chunk i and copies
//! its payloads out. The syscalls are the store's: positioned writes and
//! reads on its own descriptors (O_DIRECT or not, as it opened them).

use std::fs::File;
use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::thread;

use cpkv_tier::l3::{decode_record_into, encode_record_into, Expected, HEADER_BYTES};
use numpy::{PyReadonlyArray1, PyReadwriteArray1};
use pyo3::prelude::*;

use crate::convert::{int_vector, invalid, uint};
use crate::shared::unshared;

/// Bytes per chunk handed between the two threads: O_DIRECT writes and
/// reads of 1 MiB ran as fast as 4 MiB ones on the disk measured, and a
/// small first chunk starts the disk early.
const CHUNK_BYTES: usize = 1 << 20;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(l3_write_records, m)?)?;
    m.add_function(wrap_pyfunction!(l3_read_records, m)?)?;
    Ok(())
}

/// One run of records that are consecutive on disk: `records[start..stop]`
/// of the batch at `offset` of `files[file]`.
struct Run {
    file: usize,
    offset: u64,
    start: usize,
    stop: usize,
}

/// The runs `(fd, offset, start, stop)` checked to tile `0..records` in
/// order, each fd duplicated once (while the caller holds the GIL, so a
/// descriptor closed by another thread during the call cannot be reused
/// under it).
fn runs_and_files(
    runs: Vec<(RawFd, u64, usize, usize)>,
    records: usize,
    slot_bytes: usize,
) -> PyResult<(Vec<Run>, Vec<File>)> {
    let mut files: Vec<(RawFd, File)> = Vec::new();
    let mut out = Vec::with_capacity(runs.len());
    let mut next = 0usize;
    for (fd, offset, start, stop) in runs {
        if start != next || stop <= start || stop > records {
            return Err(invalid(format!(
                "run [{start}, {stop}) does not continue the runs at {next} of {records} records"
            )));
        }
        let bytes = (stop - start) as u64 * slot_bytes as u64;
        if offset
            .checked_add(bytes)
            .is_none_or(|end| end > i64::MAX as u64)
        {
            return Err(invalid(format!(
                "run at offset {offset} of {bytes} bytes is past the largest file offset"
            )));
        }
        if fd < 0 {
            return Err(invalid(format!("fd {fd} is not a file descriptor")));
        }
        let file = match files.iter().position(|(raw, _)| *raw == fd) {
            Some(i) => i,
            None => {
                // SAFETY: the store keeps `fd` open while it calls this
                // function and holds the GIL until the duplicate exists; an
                // fd that is not open makes `dup` fail with EBADF.
                #[allow(unsafe_code)]
                let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
                files.push((fd, File::from(borrowed.try_clone_to_owned()?)));
                files.len() - 1
            }
        };
        out.push(Run {
            file,
            offset,
            start,
            stop,
        });
        next = stop;
    }
    if next != records {
        return Err(invalid(format!(
            "the runs cover {next} of {records} records"
        )));
    }
    Ok((out, files.into_iter().map(|(_, f)| f).collect()))
}

/// `(run's file, file offset, first record, records)` of every chunk, in
/// order: each run cut into chunks of about `CHUNK_BYTES` (one record at
/// least).
fn chunks(runs: &[Run], slot_bytes: usize) -> Vec<(usize, u64, usize, usize)> {
    let per_chunk = (CHUNK_BYTES / slot_bytes).max(1);
    let mut out = Vec::new();
    for run in runs {
        let mut first = run.start;
        while first < run.stop {
            let count = per_chunk.min(run.stop - first);
            let offset = run.offset + ((first - run.start) * slot_bytes) as u64;
            out.push((run.file, offset, first, count));
            first += count;
        }
    }
    out
}

fn scratch_for(scratch: &mut [u8], records: usize, slot_bytes: usize) -> PyResult<&mut [u8]> {
    let need = records.saturating_mul(slot_bytes);
    if scratch.len() < need {
        return Err(invalid(format!(
            "scratch holds {} bytes, {records} records of {slot_bytes} bytes need {need}",
            scratch.len()
        )));
    }
    Ok(&mut scratch[..need])
}

fn slot_size(slot_bytes: &Bound<'_, PyAny>) -> PyResult<usize> {
    let slot = uint(slot_bytes, "slot_bytes")?;
    if slot < HEADER_BYTES as u64 || slot > (1u64 << 31) {
        return Err(invalid(format!(
            "slot_bytes {slot} is not in {HEADER_BYTES}..={}",
            1u64 << 31
        )));
    }
    Ok(slot as usize)
}

/// Builds the records of `payloads[j]` for `keys[j]` at `sequences[j]`
/// (`slot_bytes` each, back to back in `scratch`: O_DIRECT needs it
/// aligned) and writes `records[start..stop]` at `offset` of `fd` for each
/// run `(fd, offset, start, stop)`; the runs tile the batch in order.
/// Returns once every write is done (not synced: the store's flush does
/// that). A failed or short write raises `OSError`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn l3_write_records(
    py: Python<'_>,
    runs: Vec<(RawFd, u64, usize, usize)>,
    mut scratch: PyReadwriteArray1<'_, u8>,
    slot_bytes: &Bound<'_, PyAny>,
    namespace: &Bound<'_, PyAny>,
    keys: &Bound<'_, PyAny>,
    sequences: &Bound<'_, PyAny>,
    payloads: Vec<PyReadonlyArray1<'_, u8>>,
) -> PyResult<()> {
    let slot_bytes = slot_size(slot_bytes)?;
    let namespace = uint(namespace, "namespace")?;
    let (keys, sequences) = (
        int_vector(keys, "keys")?,
        int_vector(sequences, "sequences")?,
    );
    let n = payloads.len();
    if keys.len() != n || sequences.len() != n {
        return Err(invalid(format!(
            "keys, sequences and payloads differ in length: {}, {}, {n}",
            keys.len(),
            sequences.len()
        )));
    }
    let mut sources = Vec::with_capacity(n);
    for (j, payload) in payloads.iter().enumerate() {
        let bytes = payload
            .as_slice()
            .map_err(|_| invalid(format!("payload {j} is not a contiguous uint8 array")))?;
        if HEADER_BYTES + bytes.len() > slot_bytes {
            return Err(invalid(format!(
                "payload {j} has {} bytes, a record of {slot_bytes} bytes holds {}",
                bytes.len(),
                slot_bytes - HEADER_BYTES
            )));
        }
        sources.push(bytes);
    }
    let (runs, files) = runs_and_files(runs, n, slot_bytes)?;
    let buf = scratch
        .as_slice_mut()
        .map_err(|_| invalid("scratch must be a contiguous uint8 array".into()))?;
    let buf = scratch_for(buf, n, slot_bytes)?;
    let chunks = chunks(&runs, slot_bytes);
    let result = unshared(py, move || {
        thread::scope(|s| {
            let (to_writer, written) = mpsc::channel::<(&File, u64, &[u8])>();
            let writer = s.spawn(move || -> io::Result<()> {
                for (file, offset, bytes) in written {
                    let done = file.write_at(bytes, offset)?;
                    if done != bytes.len() {
                        return Err(io::Error::new(
                            io::ErrorKind::WriteZero,
                            format!("short L3 write: {done} of {} bytes", bytes.len()),
                        ));
                    }
                }
                Ok(())
            });
            let mut rest = buf;
            for (file, offset, first, count) in chunks {
                let (chunk, tail) = std::mem::take(&mut rest).split_at_mut(count * slot_bytes);
                rest = tail;
                for (k, record) in chunk.chunks_exact_mut(slot_bytes).enumerate() {
                    let j = first + k;
                    encode_record_into(record, namespace, keys[j], sequences[j], sources[j]);
                }
                if to_writer.send((&files[file], offset, chunk)).is_err() {
                    break; // the writer stopped on an error, which join returns
                }
            }
            drop(to_writer);
            writer
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    })?;
    result.map_err(PyErr::from)
}

/// Reads `records[start..stop]` from `offset` of `fd` for each run `(fd,
/// offset, start, stop)` (the runs tile the batch in order) into `scratch`,
/// checks record j against `keys[j]`, `sequences[j]` and `length` and
/// copies its payload into row `rows[j]` of `out` (rows of `length`
/// bytes). Per record `None` when served, else the reason's name; a
/// rejected record's row gets none of its bytes (zeros where the checksum
/// failed after the copy). A failed read raises `OSError`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn l3_read_records(
    py: Python<'_>,
    runs: Vec<(RawFd, u64, usize, usize)>,
    mut scratch: PyReadwriteArray1<'_, u8>,
    slot_bytes: &Bound<'_, PyAny>,
    namespace: &Bound<'_, PyAny>,
    keys: &Bound<'_, PyAny>,
    sequences: &Bound<'_, PyAny>,
    length: &Bound<'_, PyAny>,
    mut out: PyReadwriteArray1<'_, u8>,
    rows: &Bound<'_, PyAny>,
) -> PyResult<Vec<Option<&'static str>>> {
    let slot_bytes = slot_size(slot_bytes)?;
    let namespace = uint(namespace, "namespace")?;
    let (keys, sequences, rows) = (
        int_vector(keys, "keys")?,
        int_vector(sequences, "sequences")?,
        int_vector(rows, "rows")?,
    );
    let n = keys.len();
    if sequences.len() != n || rows.len() != n {
        return Err(invalid(format!(
            "keys, sequences and rows differ in length: {n}, {}, {}",
            sequences.len(),
            rows.len()
        )));
    }
    let length = uint(length, "length")?;
    if HEADER_BYTES as u64 + length > slot_bytes as u64 {
        return Err(invalid(format!(
            "length {length} does not fit a record of {slot_bytes} bytes"
        )));
    }
    let length = length as usize;
    let dst = out
        .as_slice_mut()
        .map_err(|_| invalid("out must be a contiguous uint8 array".into()))?;
    let out_rows = dst.len().checked_div(length).unwrap_or(usize::MAX); // empty rows fit anywhere
    if let Some(row) = rows.iter().find(|r| **r >= out_rows as u64) {
        return Err(invalid(format!(
            "row {row} is outside out ({} bytes, {out_rows} rows of {length})",
            dst.len()
        )));
    }
    let (runs, files) = runs_and_files(runs, n, slot_bytes)?;
    let buf = scratch
        .as_slice_mut()
        .map_err(|_| invalid("scratch must be a contiguous uint8 array".into()))?;
    let buf = scratch_for(buf, n, slot_bytes)?;
    let chunks = chunks(&runs, slot_bytes);
    let result = unshared(py, move || {
        thread::scope(|s| {
            let (to_checker, read) = mpsc::channel::<io::Result<(usize, usize, &[u8])>>();
            s.spawn(move || {
                let mut rest = buf;
                for (file, offset, first, count) in chunks {
                    let (chunk, tail) = std::mem::take(&mut rest).split_at_mut(count * slot_bytes);
                    rest = tail;
                    let got = read_full(&files[file], chunk, offset);
                    let failed = got.is_err();
                    let sent = to_checker.send(got.map(|got| (first, count, &chunk[..got])));
                    if failed || sent.is_err() {
                        break;
                    }
                }
            });
            let mut reasons = vec![None; n];
            for message in read {
                let (first, count, bytes) = message?;
                for j in first..first + count {
                    // A chunk cut short by the end of the file leaves its
                    // last records short or empty: each is then truncated.
                    let lo = ((j - first) * slot_bytes).min(bytes.len());
                    let hi = (lo + slot_bytes).min(bytes.len());
                    let expected = Expected {
                        namespace,
                        key: keys[j],
                        sequence: sequences[j],
                        length: length as u64,
                    };
                    let row = rows[j] as usize * length;
                    reasons[j] =
                        decode_record_into(&bytes[lo..hi], &expected, &mut dst[row..row + length])
                            .err()
                            .map(|r| r.name());
                }
            }
            Ok(reasons)
        })
    })?;
    result.map_err(|err: io::Error| PyErr::from(err))
}

/// Reads into all of `buf` from `offset`, fewer bytes only at the end of
/// the file.
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(got)
}
