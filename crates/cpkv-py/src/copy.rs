//! `copy_rows`, `RowSources` and `row_runs`: the native row copy (crate
//! `cpkv-copy`) over numpy arrays and CPU torch tensors; `run_table`, the
//! one way a run table becomes an array.
//!
//! Every buffer is checked (CPU, C-contiguous, aligned to its element size,
//! one row size and dtype for all, the destination writable and not
//! overlapping any source) and the whole run table is checked against the
//! buffers before the GIL is released and the first byte moves; a refused
//! call raises `CopyTableError` naming what is wrong and writes nothing.
//! `RowSources` checks a fixed source table once (a compose group's mapped
//! pools and stagings, a tier layer's pool) so the hot call checks only the
//! destination and the runs.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use cpkv_copy::{Run, Stores, RUN_COLUMNS};
use numpy::npyffi::flags::NPY_ARRAY_WRITEABLE;
use numpy::{
    PyArray1, PyArray2, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::convert::{invalid, uint};
use crate::errors::CopyTableError;
use crate::shared::unshared;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRowSources>()?;
    m.add_function(wrap_pyfunction!(copy_rows, m)?)?;
    m.add_function(wrap_pyfunction!(row_runs, m)?)?;
    m.add_function(wrap_pyfunction!(streaming_threshold, m)?)?;
    Ok(())
}

fn refused(message: String) -> PyErr {
    CopyTableError::new_err(message)
}

/// One checked buffer: where its bytes are and how they split into rows.
#[derive(Clone, Debug)]
struct Rows {
    address: usize,
    bytes: usize,
    rows: usize,
    row_bytes: usize,
    dtype: Dtype,
    writable: bool,
}

impl Rows {
    fn overlaps(&self, other: &Rows) -> bool {
        self.bytes > 0
            && other.bytes > 0
            && self.address < other.address + other.bytes
            && other.address < self.address + self.bytes
    }
}

/// A buffer's element type: numpy's kind and item size where numpy has the
/// type ("u1", "f2"; torch.int16 is "i2" too), else torch's own name
/// ("bfloat16"), so a numpy buffer and a torch buffer of one type compare
/// equal. Made and compared without allocating.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Dtype {
    Numpy(char, usize),
    Named(Arc<str>),
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dtype::Numpy(kind, size) => write!(f, "{kind}{size}"),
            Dtype::Named(name) => f.write_str(name),
        }
    }
}

impl Dtype {
    /// A torch dtype by its `str` ("torch.int16").
    fn of_torch_name(name: &str) -> Self {
        let name = name.trim_start_matches("torch.");
        let (kind, size) = match name {
            "uint8" => ('u', 1),
            "int8" => ('i', 1),
            "int16" => ('i', 2),
            "int32" => ('i', 4),
            "int64" => ('i', 8),
            "uint16" => ('u', 2),
            "uint32" => ('u', 4),
            "uint64" => ('u', 8),
            "float16" => ('f', 2),
            "float32" => ('f', 4),
            "float64" => ('f', 8),
            "bool" => ('b', 1),
            "complex64" => ('c', 8),
            "complex128" => ('c', 16),
            other => return Dtype::Named(other.into()),
        };
        Dtype::Numpy(kind, size)
    }
}

/// The `Dtype` and item size of a torch tensor's dtype object, remembered
/// by identity (torch's dtypes are a few singletons; each is held here, so
/// its address cannot be reused by another object). `tensor` gives the item
/// size the first time a dtype is seen.
fn torch_dtype(dtype: &Bound<'_, PyAny>, tensor: &Bound<'_, PyAny>) -> PyResult<(Dtype, usize)> {
    type Seen = Vec<(Py<PyAny>, Dtype, usize)>;
    static SEEN: Mutex<Seen> = Mutex::new(Vec::new());
    let known = |seen: &Seen| {
        seen.iter()
            .find(|(known, ..)| dtype.is(known))
            .map(|(_, code, size)| (code.clone(), *size))
    };
    let seen = || SEEN.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(found) = known(&seen()) {
        return Ok(found);
    }
    // Python runs outside the lock (it may switch threads).
    let code = Dtype::of_torch_name(dtype.str()?.to_str()?);
    let size: usize = tensor
        .call_method0(intern!(dtype.py(), "element_size"))?
        .extract()?;
    let mut seen = seen();
    if known(&seen).is_none() {
        seen.push((dtype.clone().unbind(), code.clone(), size));
    }
    Ok((code, size))
}

/// `(rows, elements per row)` of a shape, `None` for a scalar; the element
/// count saturates (`rows_of` refuses a shape whose bytes overflow).
fn split_shape(
    mut dims: impl Iterator<Item = PyResult<usize>>,
) -> PyResult<Option<(usize, usize)>> {
    let Some(rows) = dims.next().transpose()? else {
        return Ok(None);
    };
    let mut per_row = 1usize;
    for dim in dims {
        per_row = per_row.saturating_mul(dim?);
    }
    Ok(Some((rows, per_row)))
}

/// A numpy array or a CPU torch tensor as rows (`shape[0]` rows of
/// `prod(shape[1:]) * itemsize` bytes).
#[allow(unsafe_code)] // reads a live ndarray's header (data pointer, flags)
fn rows_of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Rows> {
    let py = obj.py();
    // `is_instance_of` first: a failed `cast` builds an error object, which
    // costs more than the rest of the call on the torch path.
    let numpy_array = obj
        .is_instance_of::<PyUntypedArray>()
        .then(|| obj.cast::<PyUntypedArray>().ok())
        .flatten();
    let (address, shape, itemsize, dtype, writable) = if let Some(array) = numpy_array {
        if !array.is_c_contiguous() {
            return Err(refused(format!(
                "{what} must be C-contiguous (a strided view cannot move as rows)"
            )));
        }
        // SAFETY: a live ndarray (we hold a reference); reading its header fields.
        let (data, flags) = unsafe {
            let raw = array.as_array_ptr();
            ((*raw).fields.data as usize, (*raw).fields.flags)
        };
        let dtype = array.dtype();
        (
            data,
            split_shape(array.shape().iter().map(|&d| Ok(d)))?,
            dtype.itemsize(),
            Dtype::Numpy(char::from(dtype.kind()), dtype.itemsize()),
            flags & NPY_ARRAY_WRITEABLE != 0,
        )
    } else if let (Ok(data_ptr), Ok(is_cpu)) = (
        obj.getattr(intern!(py, "data_ptr")),
        obj.getattr(intern!(py, "is_cpu")),
    ) {
        // A torch tensor. Names are interned, the item size comes with the
        // remembered dtype, and the shape is read once as the tuple it is
        // (`size(0)` alone parses its argument for longer than `shape` takes
        // whole): this path runs once per gather, and every Python call made
        // here is time taken from the copy.
        if !is_cpu.extract::<bool>()? {
            let device = obj.getattr(intern!(py, "device"))?.str()?.to_string();
            return Err(refused(format!(
                "{what} is on {device}: the native copy moves CPU memory (devices use the torch/Triton paths)"
            )));
        }
        if !obj
            .call_method0(intern!(py, "is_contiguous"))?
            .extract::<bool>()?
        {
            return Err(refused(format!(
                "{what} must be contiguous (a strided view cannot move as rows)"
            )));
        }
        let shape = obj.getattr(intern!(py, "shape"))?;
        let shape = shape
            .cast::<PyTuple>()
            .map_err(|_| refused(format!("{what} has a shape that is not a tuple of ints")))?;
        let (dtype, itemsize) = torch_dtype(&obj.getattr(intern!(py, "dtype"))?, obj)?;
        (
            data_ptr.call0()?.extract()?,
            split_shape(shape.iter().map(|d| d.extract::<usize>()))?,
            itemsize,
            dtype,
            true,
        )
    } else {
        return Err(refused(format!(
            "{what} must be a numpy array or a CPU torch tensor, got {}",
            obj.get_type().name()?
        )));
    };
    let Some((rows, per_row)) = shape else {
        return Err(refused(format!(
            "{what} must have at least one dimension (rows), got a scalar"
        )));
    };
    // Real arrays and tensors always fit; a tensor-like object's shape may not.
    let sizes = per_row
        .checked_mul(itemsize)
        .and_then(|row_bytes| Some((row_bytes, rows.checked_mul(row_bytes)?)))
        .filter(|&(_, bytes)| bytes <= isize::MAX as usize);
    let Some((row_bytes, bytes)) = sizes else {
        return Err(refused(format!(
            "{what} has a shape whose size in bytes overflows ({rows} rows of {per_row} elements of {itemsize} bytes)"
        )));
    };
    if itemsize > 1 && address % itemsize != 0 {
        return Err(refused(format!(
            "{what} starts at address {address:#x}, not aligned to its {itemsize}-byte elements"
        )));
    }
    Ok(Rows {
        address,
        bytes,
        rows,
        row_bytes,
        dtype,
        writable,
    })
}

/// A fixed table of source buffers, checked once: one row size and dtype.
#[pyclass(name = "RowSources", module = "cpkv._cpkv", frozen)]
pub(crate) struct PyRowSources {
    /// Held so the memory stays mapped while the table lives.
    _owners: Vec<Py<PyAny>>,
    rows: Vec<Rows>,
}

impl PyRowSources {
    fn build(buffers: &Bound<'_, PyAny>) -> PyResult<Self> {
        let items: Vec<Bound<'_, PyAny>> = if let Ok(list) = buffers.cast::<PyList>() {
            list.iter().collect()
        } else if let Ok(tuple) = buffers.cast::<PyTuple>() {
            tuple.iter().collect()
        } else {
            return Err(refused(format!(
                "sources must be a list or tuple of buffers, got {}",
                buffers.get_type().name()?
            )));
        };
        let rows = items
            .iter()
            .enumerate()
            .map(|(i, b)| rows_of(b, &format!("source {i}")))
            .collect::<PyResult<Vec<_>>>()?;
        if let Some(first) = rows.first() {
            for (i, r) in rows.iter().enumerate().skip(1) {
                if r.row_bytes != first.row_bytes || r.dtype != first.dtype {
                    return Err(refused(format!(
                        "source {i} has rows of {} bytes of {}, source 0 of {} bytes of {}",
                        r.row_bytes, r.dtype, first.row_bytes, first.dtype
                    )));
                }
            }
        }
        Ok(PyRowSources {
            _owners: items.into_iter().map(Bound::unbind).collect(),
            rows,
        })
    }
}

#[pymethods]
impl PyRowSources {
    #[new]
    fn new(buffers: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::build(buffers)
    }

    fn __len__(&self) -> usize {
        self.rows.len()
    }

    /// Rows in each source.
    #[getter]
    fn rows(&self) -> Vec<usize> {
        self.rows.iter().map(|r| r.rows).collect()
    }

    fn __repr__(&self) -> String {
        let row_bytes = self.rows.first().map_or(0, |r| r.row_bytes);
        format!(
            "RowSources(sources={}, row_bytes={row_bytes})",
            self.rows.len()
        )
    }
}

/// An int64 `[R, 6]` run table as runs; negative entries refused.
#[allow(unsafe_code)] // views a checked C-contiguous int64 array as a slice
fn runs_arg(runs: &Bound<'_, PyAny>) -> PyResult<Vec<Run>> {
    let Ok(array) = runs.cast::<PyUntypedArray>() else {
        return Err(refused(format!(
            "runs must be an int64 numpy array of shape [R, {RUN_COLUMNS}], got {}",
            runs.get_type().name()?
        )));
    };
    if array.cast::<PyArray2<i64>>().is_err() {
        return Err(refused(format!(
            "runs must be int64, got dtype {} with {} dimension(s)",
            array.dtype().str()?,
            array.ndim()
        )));
    }
    let (rows, columns) = (array.shape()[0], array.shape()[1]);
    if columns != RUN_COLUMNS {
        return Err(refused(format!(
            "runs must have {RUN_COLUMNS} columns (dst_row, dst_stride, count, source, src_row, src_stride), got {columns}"
        )));
    }
    if !array.is_c_contiguous() {
        return Err(refused("runs must be C-contiguous".into()));
    }
    let values: &[i64] = if rows == 0 {
        &[]
    } else {
        // SAFETY: a C-contiguous int64 array of rows * 6 elements (checked
        // above), alive while `runs` is; read before any Python code runs.
        unsafe {
            std::slice::from_raw_parts(
                (*array.as_array_ptr()).fields.data as *const i64,
                rows * RUN_COLUMNS,
            )
        }
    };
    cpkv_copy::runs_from_table(values).map_err(|e| refused(e.to_string()))
}

/// `out[dst_row + k * dst_stride] = sources[source][src_row + k * src_stride]`
/// for every run `(dst_row, dst_stride, count, source, src_row, src_stride)`
/// and `k < count`; the GIL is released while the bytes move.
///
/// `out`: a writable numpy array or CPU torch tensor (C-contiguous);
/// `sources`: a `RowSources` or a list of buffers, all with `out`'s row size
/// and dtype; `runs`: int64 `[R, 6]`; `stores`: `None` (streaming stores
/// from 3/4 of the last-level cache up, ordinary below), `"cached"` or
/// `"streaming"`. Raises `CopyTableError` (nothing written) on any bad
/// buffer or run, `InvalidArgumentError` on another `stores`.
// Raw buffer addresses become slices here, and only here: each one was
// checked to be a live, contiguous, CPU allocation of that many bytes, kept
// alive by a reference held for the whole call.
#[allow(unsafe_code)]
#[pyfunction]
#[pyo3(signature = (out, sources, runs, stores = None))]
fn copy_rows(
    py: Python<'_>,
    out: &Bound<'_, PyAny>,
    sources: &Bound<'_, PyAny>,
    runs: &Bound<'_, PyAny>,
    stores: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let stores = stores_arg(stores)?;
    let owned;
    let checked = sources
        .is_instance_of::<PyRowSources>()
        .then(|| sources.cast::<PyRowSources>().ok())
        .flatten();
    let table: &PyRowSources = match checked {
        Some(t) => t.get(),
        None => {
            owned = PyRowSources::build(sources)?;
            &owned
        }
    };
    let dst = rows_of(out, "out")?;
    if !dst.writable {
        return Err(refused("out is read-only".into()));
    }
    for (i, s) in table.rows.iter().enumerate() {
        if s.row_bytes != dst.row_bytes || s.dtype != dst.dtype {
            return Err(refused(format!(
                "source {i} has rows of {} bytes of {}, out has rows of {} bytes of {}",
                s.row_bytes, s.dtype, dst.row_bytes, dst.dtype
            )));
        }
        if s.overlaps(&dst) {
            return Err(refused(format!("source {i} overlaps out in memory")));
        }
    }
    let runs = runs_arg(runs)?;
    let source_rows: Vec<usize> = table.rows.iter().map(|r| r.rows).collect();
    // Checked here, before the GIL goes; the copy below does not check again.
    let checked = cpkv_copy::CheckedRuns::new(&runs, dst.row_bytes, dst.rows, source_rows, stores)
        .map_err(|e| refused(e.to_string()))?;
    if runs.is_empty() || dst.row_bytes == 0 {
        return Ok(());
    }
    let sources: Vec<(usize, usize)> = table.rows.iter().map(|r| (r.address, r.bytes)).collect();
    let (dst_address, dst_bytes) = (dst.address, dst.bytes);
    unshared(py, move || {
        // SAFETY: every range is a live allocation of that many bytes (checked
        // above, kept alive by `out`, `sources` and `table`, which outlive this
        // call); `out` overlaps no source, so the one mutable slice aliases
        // nothing. Empty buffers get an empty slice (their address may dangle).
        let slice = |(address, bytes): (usize, usize)| -> &[u8] {
            if bytes == 0 {
                &[]
            } else {
                unsafe { std::slice::from_raw_parts(address as *const u8, bytes) }
            }
        };
        let views: Vec<&[u8]> = sources.iter().map(|&s| slice(s)).collect();
        let dst: &mut [u8] = if dst_bytes == 0 {
            &mut []
        } else {
            unsafe { std::slice::from_raw_parts_mut(dst_address as *mut u8, dst_bytes) }
        };
        checked.copy(dst, &views)
    })?
    .map_err(|e| refused(e.to_string()))
}

/// `None` (chosen by size), `"cached"` or `"streaming"`.
fn stores_arg(stores: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Stores>> {
    let Some(stores) = stores.filter(|s| !s.is_none()) else {
        return Ok(None);
    };
    let text = stores
        .cast::<PyString>()
        .ok()
        .map(|t| t.to_str())
        .transpose()?;
    match text {
        Some("cached") => Ok(Some(Stores::Cached)),
        Some("streaming") => Ok(Some(Stores::Streaming)),
        _ => Err(invalid(format!(
            "stores must be None, 'cached' or 'streaming', got {}",
            stores.repr().map_or_else(|_| "?".into(), |r| r.to_string())
        ))),
    }
}

/// Bytes from which `copy_rows` streams past the cache when `stores` is None.
#[pyfunction]
fn streaming_threshold() -> usize {
    cpkv_copy::streaming_threshold()
}

/// The run table moving `src_rows[i]` (of source `source`) to `dst_rows[i]`:
/// int64 `[R, 6]`, each constant-step stretch one run. Both int64 arrays of
/// one length, entries >= 0.
#[pyfunction]
#[pyo3(signature = (dst_rows, src_rows, source = None))]
fn row_runs<'py>(
    py: Python<'py>,
    dst_rows: &Bound<'py, PyAny>,
    src_rows: &Bound<'py, PyAny>,
    source: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray2<i64>>> {
    let source = source.map_or(Ok(0), |s| uint(s, "source"))?;
    let read = |obj: &Bound<'py, PyAny>, what: &str| -> PyResult<Vec<u64>> {
        let Ok(array) = obj.cast::<PyArray1<i64>>() else {
            return Err(refused(format!("{what} must be a 1-D int64 numpy array")));
        };
        let values = array.readonly().as_array().to_vec();
        values
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                u64::try_from(v).map_err(|_| refused(format!("{what}[{i}] = {v} is negative")))
            })
            .collect()
    };
    let (dst, src) = (read(dst_rows, "dst_rows")?, read(src_rows, "src_rows")?);
    if dst.len() != src.len() {
        return Err(refused(format!(
            "dst_rows and src_rows differ in length: {} and {}",
            dst.len(),
            src.len()
        )));
    }
    run_table(py, &cpkv_copy::runs_from_rows(&dst, &src, source))
}

/// Runs as the int64 `[R, 6]` table `copy_rows` takes (every entry came in
/// as a non-negative int64 or is a count of them, so it fits).
pub(crate) fn run_table<'py>(py: Python<'py>, runs: &[Run]) -> PyResult<Bound<'py, PyArray2<i64>>> {
    PyArray1::from_vec(py, cpkv_copy::run_table(runs)).reshape([runs.len(), RUN_COLUMNS])
}
