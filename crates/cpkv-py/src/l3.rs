//! Python wrappers of the L3 tier's decisions (`cpkv_tier::l3`): the index,
//! the record seal/check over numpy byte buffers, the log codec and the
//! namespace id. The files themselves are `cpkv.tier.l3` (Python).

use cpkv_tier::l3::{
    check_into, check_packed, check_split, decode_record, encode_log_entry, encode_log_header,
    record_bytes, recover_logs, seal_packed, seal_record, seal_records, seal_tails, writer_rank,
    Expected, L3Error, L3Index as Core, L3Namespace, LogEntry, LogHeader, LogRecovery, RecordBatch,
    RecordReject, HEADER_BYTES, KEY_AT, LOG_ENTRY_BYTES, LOG_HEADER_BYTES, MAX_L3_SLOTS,
    MAX_PAYLOAD_BYTES, RECORD_ALIGN, RECORD_MAGIC,
};
use numpy::{PyReadonlyArray1, PyReadwriteArray1};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::convert::{int_vector, invalid, uint};
use crate::errors::{l3_error, InternalError};
use crate::shared::{unshared, Shared};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<L3Index>()?;
    m.add_function(wrap_pyfunction!(l3_seal, m)?)?;
    m.add_function(wrap_pyfunction!(l3_check, m)?)?;
    m.add_function(wrap_pyfunction!(l3_check_into, m)?)?;
    m.add_function(wrap_pyfunction!(l3_seal_records, m)?)?;
    m.add_function(wrap_pyfunction!(l3_seal_tails, m)?)?;
    m.add_function(wrap_pyfunction!(l3_check_split, m)?)?;
    m.add_function(wrap_pyfunction!(l3_seal_packed, m)?)?;
    m.add_function(wrap_pyfunction!(l3_check_packed, m)?)?;
    m.add_function(wrap_pyfunction!(l3_record_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(l3_namespace_id, m)?)?;
    m.add_function(wrap_pyfunction!(l3_log_header, m)?)?;
    m.add_function(wrap_pyfunction!(l3_log_entries, m)?)?;
    m.add("L3_RECORD_ALIGN", RECORD_ALIGN)?;
    m.add("L3_HEADER_BYTES", HEADER_BYTES)?;
    m.add("L3_RECORD_KEY_AT", KEY_AT)?;
    m.add("L3_RECORD_MAGIC", RECORD_MAGIC)?;
    m.add("L3_LOG_HEADER_BYTES", LOG_HEADER_BYTES)?;
    m.add("L3_LOG_ENTRY_BYTES", LOG_ENTRY_BYTES)?;
    m.add("L3_MAX_SLOTS", MAX_L3_SLOTS)?;
    m.add("L3_MAX_PAYLOAD_BYTES", MAX_PAYLOAD_BYTES)?;
    Ok(())
}

fn payload_length(length: u64, record: usize) -> PyResult<usize> {
    if length > MAX_PAYLOAD_BYTES || record_bytes(length) > record as u64 {
        return Err(invalid(format!(
            "length {length} does not fit a record buffer of {record} bytes (at most {MAX_PAYLOAD_BYTES})"
        )));
    }
    Ok(length as usize)
}

/// Seals the record in `record` (payload already at `record[:length]`):
/// zeroes its padding and writes its header, checksum included.
#[pyfunction]
fn l3_seal(
    py: Python<'_>,
    mut record: PyReadwriteArray1<'_, u8>,
    namespace: &Bound<'_, PyAny>,
    key: &Bound<'_, PyAny>,
    sequence: &Bound<'_, PyAny>,
    length: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let (namespace, key, sequence) = (
        uint(namespace, "namespace")?,
        uint(key, "key")?,
        uint(sequence, "sequence")?,
    );
    let buf = record
        .as_slice_mut()
        .map_err(|_| invalid("record must be a contiguous uint8 array".into()))?;
    let length = payload_length(uint(length, "length")?, buf.len())?;
    unshared(py, || seal_record(buf, namespace, key, sequence, length))
}

/// `None` when `record` is the expected record, else the reason's name
/// (`truncated`, `bad_magic`, `version`, `reserved`, `foreign_namespace`,
/// `wrong_key`, `stale_sequence`, `length`, `checksum`).
#[pyfunction]
fn l3_check(
    py: Python<'_>,
    record: PyReadonlyArray1<'_, u8>,
    namespace: &Bound<'_, PyAny>,
    key: &Bound<'_, PyAny>,
    sequence: &Bound<'_, PyAny>,
    length: &Bound<'_, PyAny>,
) -> PyResult<Option<&'static str>> {
    let expected = Expected {
        namespace: uint(namespace, "namespace")?,
        key: uint(key, "key")?,
        sequence: uint(sequence, "sequence")?,
        length: uint(length, "length")?,
    };
    let buf = record
        .as_slice()
        .map_err(|_| invalid("record must be a contiguous uint8 array".into()))?;
    unshared(py, || decode_record(buf, &expected).err().map(|r| r.name()))
}

/// A batch's namespace, keys, sequences and length by the binding's int
/// rule, owned; `batch` lends them as the core's `RecordBatch`.
struct BatchArgs {
    namespace: u64,
    keys: Vec<u64>,
    sequences: Vec<u64>,
    length: u64,
}

impl BatchArgs {
    fn parse(
        namespace: &Bound<'_, PyAny>,
        keys: &Bound<'_, PyAny>,
        sequences: &Bound<'_, PyAny>,
        length: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        Ok(Self {
            namespace: uint(namespace, "namespace")?,
            keys: int_vector(keys, "keys")?,
            sequences: int_vector(sequences, "sequences")?,
            length: uint(length, "length")?,
        })
    }

    fn batch(&self) -> RecordBatch<'_> {
        RecordBatch {
            namespace: self.namespace,
            keys: &self.keys,
            sequences: &self.sequences,
            length: self.length,
        }
    }
}

/// A contiguous uint8 array's bytes; `what` names it in the error.
fn contiguous<'a>(array: &'a PyReadonlyArray1<'_, u8>, what: &str) -> PyResult<&'a [u8]> {
    array
        .as_slice()
        .map_err(|_| invalid(format!("{what} must be a contiguous uint8 array")))
}

fn contiguous_mut<'a>(
    array: &'a mut PyReadwriteArray1<'_, u8>,
    what: &str,
) -> PyResult<&'a mut [u8]> {
    array
        .as_slice_mut()
        .map_err(|_| invalid(format!("{what} must be a contiguous uint8 array")))
}

/// Payloads of a batch, each contiguous.
fn payload_slices<'a>(payloads: &'a [PyReadonlyArray1<'_, u8>]) -> PyResult<Vec<&'a [u8]>> {
    payloads
        .iter()
        .enumerate()
        .map(|(j, p)| {
            p.as_slice()
                .map_err(|_| invalid(format!("payload {j} is not contiguous")))
        })
        .collect()
}

/// Per record `None` or its reason's name.
fn names(reasons: Vec<Option<RecordReject>>) -> Vec<Option<&'static str>> {
    reasons.into_iter().map(|r| r.map(|r| r.name())).collect()
}

/// Checks the records read back to back into `records` (`slot_bytes` each;
/// the last ones may be short) against `keys[j]`, `sequences[j]` and copies
/// each good payload into row `rows[j]` of `out` (rows of `length` bytes).
/// Per record `None` when served, else the reason's name. One call per read,
/// without the GIL (`cpkv_tier::l3::check_into`).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn l3_check_into(
    py: Python<'_>,
    records: PyReadonlyArray1<'_, u8>,
    slot_bytes: &Bound<'_, PyAny>,
    namespace: &Bound<'_, PyAny>,
    keys: &Bound<'_, PyAny>,
    sequences: &Bound<'_, PyAny>,
    length: &Bound<'_, PyAny>,
    mut out: PyReadwriteArray1<'_, u8>,
    rows: &Bound<'_, PyAny>,
) -> PyResult<Vec<Option<&'static str>>> {
    let slot_bytes = uint(slot_bytes, "slot_bytes")? as usize;
    let args = BatchArgs::parse(namespace, keys, sequences, length)?;
    let rows = int_vector(rows, "rows")?;
    let src = contiguous(&records, "records")?;
    let dst = contiguous_mut(&mut out, "out")?;
    let batch = args.batch();
    let reasons = unshared(py, || check_into(src, slot_bytes, &batch, dst, &rows))?;
    Ok(names(reasons.map_err(l3_error)?))
}

/// `seal_records` or `seal_tails`.
type Seal = fn(&mut [u8], &RecordBatch<'_>, &[&[u8]]) -> Result<(), L3Error>;

/// A sealing call: its arguments by the binding's rules, then `seal` over
/// `out` (called `what`) without the GIL.
#[allow(clippy::too_many_arguments)]
fn seal_batch(
    py: Python<'_>,
    mut out: PyReadwriteArray1<'_, u8>,
    what: &str,
    payloads: Vec<PyReadonlyArray1<'_, u8>>,
    namespace: &Bound<'_, PyAny>,
    keys: &Bound<'_, PyAny>,
    sequences: &Bound<'_, PyAny>,
    length: &Bound<'_, PyAny>,
    seal: Seal,
) -> PyResult<()> {
    let args = BatchArgs::parse(namespace, keys, sequences, length)?;
    let payloads = payload_slices(&payloads)?;
    let dst = contiguous_mut(&mut out, what)?;
    let batch = args.batch();
    unshared(py, || seal(dst, &batch, &payloads))?.map_err(l3_error)
}

/// Builds whole records back to back in `records` (`record_bytes(length)`
/// bytes each): payload `j` copied to record `j`'s start, then sealed for
/// `keys[j]`, `sequences[j]`. One call per batch, without the GIL.
#[pyfunction]
fn l3_seal_records(
    py: Python<'_>,
    records: PyReadwriteArray1<'_, u8>,
    payloads: Vec<PyReadonlyArray1<'_, u8>>,
    namespace: &Bound<'_, PyAny>,
    keys: &Bound<'_, PyAny>,
    sequences: &Bound<'_, PyAny>,
    length: &Bound<'_, PyAny>,
) -> PyResult<()> {
    seal_batch(
        py,
        records,
        "records",
        payloads,
        namespace,
        keys,
        sequences,
        length,
        seal_records,
    )
}

/// The tails (`record_bytes(length) - length` bytes each: padding, then the
/// header) of records whose payloads are written from their own memory:
/// tail `j` of `tails` is sealed for `payloads[j]` (uint8, `length` bytes),
/// `keys[j]`, `sequences[j]`. One call per batch, without the GIL.
#[pyfunction]
fn l3_seal_tails(
    py: Python<'_>,
    tails: PyReadwriteArray1<'_, u8>,
    payloads: Vec<PyReadonlyArray1<'_, u8>>,
    namespace: &Bound<'_, PyAny>,
    keys: &Bound<'_, PyAny>,
    sequences: &Bound<'_, PyAny>,
    length: &Bound<'_, PyAny>,
) -> PyResult<()> {
    seal_batch(
        py, tails, "tails", payloads, namespace, keys, sequences, length, seal_tails,
    )
}

/// Checks records read split: payload `j` straight into row `rows[j]` of
/// `out` (rows of `length` bytes), its tail (padding, header) into `tails`
/// (`record_bytes(length) - length` bytes each). `whole[j]` says the read
/// reached the record's end (else `truncated`). Per record `None` when the
/// payload in its row is the record's, else the reason's name (the row then
/// holds whatever was read). One call per read, without the GIL.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn l3_check_split(
    py: Python<'_>,
    tails: PyReadonlyArray1<'_, u8>,
    out: PyReadonlyArray1<'_, u8>,
    rows: &Bound<'_, PyAny>,
    whole: Vec<bool>,
    namespace: &Bound<'_, PyAny>,
    keys: &Bound<'_, PyAny>,
    sequences: &Bound<'_, PyAny>,
    length: &Bound<'_, PyAny>,
) -> PyResult<Vec<Option<&'static str>>> {
    let args = BatchArgs::parse(namespace, keys, sequences, length)?;
    let rows = int_vector(rows, "rows")?;
    let (tails, src) = (contiguous(&tails, "tails")?, contiguous(&out, "out")?);
    let batch = args.batch();
    let reasons = unshared(py, || check_split(tails, src, &rows, &whole, &batch))?;
    Ok(names(reasons.map_err(l3_error)?))
}

/// Seals packed records in place: record `j` of `records` (`length +
/// L3_HEADER_BYTES` bytes each, an L3 record without its zero padding: the
/// cluster tier's objects) holds its payload at its start; its trailer is
/// written right after it for `keys[j]`, `sequences[j]`. One call per
/// batch, without the GIL.
#[pyfunction]
fn l3_seal_packed(
    py: Python<'_>,
    mut records: PyReadwriteArray1<'_, u8>,
    namespace: &Bound<'_, PyAny>,
    keys: &Bound<'_, PyAny>,
    sequences: &Bound<'_, PyAny>,
    length: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let args = BatchArgs::parse(namespace, keys, sequences, length)?;
    let dst = contiguous_mut(&mut records, "records")?;
    let batch = args.batch();
    unshared(py, || seal_packed(dst, &batch))?.map_err(l3_error)
}

/// Checks packed records (`length + L3_HEADER_BYTES` bytes each, back to
/// back in `records`) against `keys[j]`, `sequences[j]`: per record `None`
/// when its payload is the record's, else the first mismatch's name. One
/// call per batch, without the GIL.
#[pyfunction]
fn l3_check_packed(
    py: Python<'_>,
    records: PyReadonlyArray1<'_, u8>,
    namespace: &Bound<'_, PyAny>,
    keys: &Bound<'_, PyAny>,
    sequences: &Bound<'_, PyAny>,
    length: &Bound<'_, PyAny>,
) -> PyResult<Vec<Option<&'static str>>> {
    let args = BatchArgs::parse(namespace, keys, sequences, length)?;
    let src = contiguous(&records, "records")?;
    let batch = args.batch();
    let reasons = unshared(py, || check_packed(src, &batch))?;
    Ok(names(reasons.map_err(l3_error)?))
}

/// Bytes a record of `payload` bytes takes on disk (whole 4 KiB blocks).
#[pyfunction]
fn l3_record_bytes(payload: &Bound<'_, PyAny>) -> PyResult<u64> {
    let payload = uint(payload, "payload")?;
    if payload > MAX_PAYLOAD_BYTES {
        return Err(invalid(format!(
            "payload {payload} is over the limit of {MAX_PAYLOAD_BYTES} bytes"
        )));
    }
    Ok(record_bytes(payload))
}

/// The id of a namespace: a page written under another id is never served.
#[pyfunction]
#[pyo3(signature = (*, model, dtype, kv_layout, page_size, cp_size, tp_size, page_bytes))]
fn l3_namespace_id(
    model: String,
    dtype: String,
    kv_layout: String,
    page_size: &Bound<'_, PyAny>,
    cp_size: &Bound<'_, PyAny>,
    tp_size: &Bound<'_, PyAny>,
    page_bytes: &Bound<'_, PyAny>,
) -> PyResult<u64> {
    Ok(L3Namespace {
        model,
        dtype,
        kv_layout,
        page_size: uint(page_size, "page_size")?,
        cp_size: uint(cp_size, "cp_size")?,
        tp_size: uint(tp_size, "tp_size")?,
        page_bytes: uint(page_bytes, "page_bytes")?,
    }
    .id())
}

#[pyfunction]
fn l3_log_header<'py>(
    py: Python<'py>,
    namespace: &Bound<'_, PyAny>,
    slot_bytes: &Bound<'_, PyAny>,
    slots: &Bound<'_, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let header = LogHeader {
        namespace: uint(namespace, "namespace")?,
        slot_bytes: uint(slot_bytes, "slot_bytes")?,
        slots: uint(slots, "slots")?,
    };
    Ok(PyBytes::new(py, &encode_log_header(&header)))
}

/// Log entries for placements `(key, sequence, slot, length)`.
#[pyfunction]
fn l3_log_entries<'py>(
    py: Python<'py>,
    entries: Vec<(u64, u64, u32, u32)>,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut out = Vec::with_capacity(entries.len() * LOG_ENTRY_BYTES);
    for (key, sequence, slot, length) in entries {
        out.extend_from_slice(&encode_log_entry(&LogEntry {
            key,
            sequence,
            slot,
            length,
        }));
    }
    Ok(PyBytes::new(py, &out))
}

#[pyclass(frozen, module = "cpkv._cpkv")]
pub(crate) struct L3Index {
    core: Shared<Core>,
}

#[pymethods]
impl L3Index {
    #[new]
    #[pyo3(signature = (slots, ranks_on_node=None))]
    fn new(slots: &Bound<'_, PyAny>, ranks_on_node: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let ranks = ranks_on_node.map_or(Ok(1), |r| uint(r, "ranks_on_node"))?;
        let core = Core::new(uint(slots, "slots")?, ranks).map_err(l3_error)?;
        Ok(Self {
            core: Shared::new(core),
        })
    }

    /// Rebuilds an index from the logs' bytes (every rank's log of a node)
    /// without reading page data. A log whose header is missing, corrupt or
    /// for another namespace or shape is ignored. Returns the index, a
    /// report dict, and per log the length of its valid prefix (0: ignored).
    #[staticmethod]
    #[pyo3(signature = (slots, ranks_on_node, logs, namespace, slot_bytes))]
    fn recover<'py>(
        py: Python<'py>,
        slots: &Bound<'_, PyAny>,
        ranks_on_node: &Bound<'_, PyAny>,
        logs: Vec<Vec<u8>>,
        namespace: &Bound<'_, PyAny>,
        slot_bytes: &Bound<'_, PyAny>,
    ) -> PyResult<(Self, Bound<'py, PyDict>, Vec<usize>)> {
        let ranks = uint(ranks_on_node, "ranks_on_node")?;
        let want = LogHeader {
            namespace: uint(namespace, "namespace")?,
            slot_bytes: uint(slot_bytes, "slot_bytes")?,
            slots: uint(slots, "slots")?,
        };
        let recovered = unshared(py, || recover_logs(ranks, &logs, &want))?.map_err(l3_error)?;
        let LogRecovery {
            index: core,
            report,
            valid,
            foreign_logs: foreign,
        } = recovered;
        let d = PyDict::new(py);
        d.set_item("entries", report.entries)?;
        d.set_item("kept", report.kept)?;
        d.set_item("superseded", report.superseded)?;
        d.set_item("out_of_range", report.out_of_range)?;
        d.set_item("foreign_logs", foreign)?;
        Ok((
            Self {
                core: Shared::new(core),
            },
            d,
            valid,
        ))
    }

    /// Places a batch of pages leaving the host slab; returns the new ones
    /// as `(key, slot, sequence, evicted_key_or_None, writer_rank)`.
    fn place<'py>(&self, py: Python<'py>, keys: &Bound<'_, PyAny>) -> PyResult<Bound<'py, PyList>> {
        let keys = int_vector(keys, "keys")?;
        let placed = self
            .core
            .detached(py, |c| c.place(&keys))?
            .map_err(l3_error)?;
        PyList::new(
            py,
            placed
                .iter()
                .map(|p| (p.key, p.slot, p.sequence, p.evicted, p.writer)),
        )
    }

    /// `(slot, sequence)` of `key`, counted as a use; `None` on a miss.
    fn lookup(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<(u32, u64)>> {
        let key = uint(key, "key")?;
        self.core.with(py, |c| c.lookup(key))
    }

    /// `(slot, sequence)` of `key` without counting a use.
    fn peek(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<(u32, u64)>> {
        let key = uint(key, "key")?;
        self.core.with(py, |c| c.peek(key))
    }

    /// Drops `key` (its record failed its check); returns the tombstone log
    /// entry's bytes to append, `None` when the key was absent.
    fn drop<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let key = uint(key, "key")?;
        let tombstone = self.core.with(py, |c| c.drop_key(key))?;
        Ok(tombstone.map(|t| PyBytes::new(py, &encode_log_entry(&t))))
    }

    /// Every `(key, slot, sequence)` in sequence order.
    fn entries(&self, py: Python<'_>) -> PyResult<Vec<(u64, u32, u64)>> {
        self.core.detached(py, |c| c.entries())
    }

    /// The rank of the node that writes and reads `key`'s record.
    fn writer(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<u32> {
        let key = uint(key, "key")?;
        self.core.with(py, |c| writer_rank(key, c.ranks_on_node()))
    }

    fn digest(&self, py: Python<'_>) -> PyResult<u64> {
        self.core.with(py, |c| c.digest())
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (len, slots, hits, misses, placed, evicted, dropped) = self.core.with(py, |c| {
            (
                c.len(),
                c.slots(),
                c.hits,
                c.misses,
                c.placed,
                c.evicted,
                c.dropped,
            )
        })?;
        let d = PyDict::new(py);
        d.set_item("pages", len)?;
        d.set_item("slots", slots)?;
        d.set_item("hits", hits)?;
        d.set_item("misses", misses)?;
        d.set_item("placed", placed)?;
        d.set_item("evicted", evicted)?;
        d.set_item("dropped", dropped)?;
        Ok(d)
    }

    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.core
            .detached(py, |c| c.check_invariants())?
            .map_err(InternalError::new_err)
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.core.with(py, |c| c.len())
    }
}
