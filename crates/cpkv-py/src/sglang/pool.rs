//! `SglangPool`: one SGLang host pool and its slab region, as the SGLang
//! backend's batch calls see them: the Python side of `cpkv_slab`'s
//! `PageLayout` (the slab's rows, entry by entry) and `PoolMemory` (the pool's
//! CPU buffers, the slab's data, stamps and tags), and the conversion of a
//! call's host indices into `HostPages`.
//!
//! Where a page's bytes are in the pool: for the pool classes the backend
//! models (`cpkv.integrations.sglang.layout`), from the pool's layout table
//! (`cpkv_slab::Entry`); for any other class, from SGLang's own
//! `get_page_buffer_meta` (called once per batch). Every entry of every page
//! is checked to lie inside its buffer before anything is stored or copied.

use std::sync::{PoisonError, RwLock, RwLockReadGuard, TryLockError};

use cpkv_slab::{Entry, HostPages, PageLayout, PoolMemory, ReadOutcome, Region, RowWrite};
use numpy::{
    PyArray1, PyArray2, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyList;

use super::hook::TestHook;
use crate::convert::{describe, invalid, wrong_type};
use crate::errors::InternalError;
use crate::shared::unshared;

/// A CPU, contiguous torch tensor's bytes, as a region. The caller keeps the
/// tensor alive for as long as it uses the region (a pool or staging area
/// holds its tensors until it is closed; a call, its arguments).
#[allow(unsafe_code)] // the one place a tensor's address becomes a `Region`
pub(crate) fn tensor_region(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Region> {
    let py = obj.py();
    let not_tensor = || {
        wrong_type(format!(
            "{what} must be a CPU torch tensor, got {}",
            describe(obj)
        ))
    };
    let is_cpu: bool = obj
        .getattr(intern!(py, "is_cpu"))
        .map_err(|_| not_tensor())?
        .extract()
        .map_err(|_| not_tensor())?;
    if !is_cpu {
        return Err(invalid(format!("{what} is not in CPU memory")));
    }
    if !obj
        .call_method0(intern!(py, "is_contiguous"))?
        .extract::<bool>()?
    {
        return Err(invalid(format!("{what} must be contiguous")));
    }
    let numel: usize = obj.call_method0(intern!(py, "numel"))?.extract()?;
    let item: usize = obj.call_method0(intern!(py, "element_size"))?.extract()?;
    let address: usize = obj.call_method0(intern!(py, "data_ptr"))?.extract()?;
    let bytes = numel
        .checked_mul(item)
        .ok_or_else(|| invalid(format!("{what}: {numel} elements of {item} bytes overflow")))?;
    // SAFETY: a live CPU tensor's contiguous storage, kept alive by the
    // caller while the region is used (see above).
    unsafe { Region::new(address, bytes) }.map_err(|e| invalid(format!("{what}: {e}")))
}

/// How a page's entries are found in the host pool.
enum HostMap {
    /// Computed from the pool's layout (the classes the backend models).
    Layout(Vec<Entry>),
    /// From SGLang's `get_page_buffer_meta` (any other class).
    Meta(Py<PyAny>),
}

#[pyclass(frozen, name = "SglangPool", module = "cpkv._cpkv")]
pub(crate) struct SglangPool {
    page_size: u64,
    pool_tokens: u64,
    layout: PageLayout,
    map: HostMap,
    /// Held so the buffers stay valid while the pool is open.
    _owners: Vec<Py<PyAny>>,
    memory: RwLock<Option<PoolMemory>>,
    write_hook: TestHook,
}

/// The first host index of each page (`pages * page_size` indices, 1-D,
/// integers), as the pool's checks name them.
fn page_firsts(
    py: Python<'_>,
    name: &str,
    host_indices: &Bound<'_, PyAny>,
    pages: usize,
    page_size: u64,
) -> PyResult<Vec<i64>> {
    if host_indices.is_none() {
        return Err(invalid(format!(
            "pool '{name}': no host indices for {pages} pages"
        )));
    }
    let array = if host_indices.is_instance_of::<PyUntypedArray>() {
        host_indices.clone()
    } else if host_indices.hasattr(intern!(py, "numpy"))? {
        // A torch tensor (SGLang's): its CPU copy as numpy, no copy when on the CPU.
        let cpu = host_indices.call_method0(intern!(py, "cpu"))?;
        cpu.call_method0(intern!(py, "numpy")).map_err(|e| {
            invalid(format!(
                "pool '{name}': host indices {}: {e}",
                describe(host_indices)
            ))
        })?
    } else {
        py.import(intern!(py, "numpy"))?
            .call_method1(intern!(py, "asarray"), (host_indices,))
            .map_err(|_| {
                wrong_type(format!(
                    "pool '{name}': host indices must be a 1-d integer tensor, got {}",
                    describe(host_indices)
                ))
            })?
    };
    let untyped = array.cast::<PyUntypedArray>()?;
    let kind = untyped.dtype().kind();
    if untyped.ndim() != 1 || !matches!(kind, b'i' | b'u') {
        return Err(invalid(format!(
            "pool '{name}': host indices must be a 1-d integer tensor, got {} {:?}",
            untyped.dtype().str()?,
            untyped.shape()
        )));
    }
    let need = (pages as u64).saturating_mul(page_size);
    if untyped.len() as u64 != need {
        return Err(invalid(format!(
            "pool '{name}': {} host indices for {pages} pages of {page_size} tokens (need {need})",
            untyped.len()
        )));
    }
    let wide;
    let ints = match array.cast::<PyArray1<i64>>() {
        Ok(a) => a,
        Err(_) => {
            wide = array.call_method1(intern!(py, "astype"), ("int64",))?;
            wide.cast::<PyArray1<i64>>()?
        }
    };
    let view = ints.readonly();
    Ok(view
        .as_array()
        .iter()
        .step_by(page_size.max(1) as usize)
        .copied()
        .collect())
}

impl SglangPool {
    pub(crate) fn layout(&self) -> &PageLayout {
        &self.layout
    }

    pub(crate) fn name(&self) -> &str {
        self.layout.name()
    }

    /// Every page's entries in the host pool, each checked to lie inside its
    /// buffer: an `InvalidArgumentError` naming the page and its host index
    /// otherwise (nothing has changed then).
    pub(crate) fn host_pages(
        &self,
        py: Python<'_>,
        host_indices: &Bound<'_, PyAny>,
        pages: usize,
    ) -> PyResult<HostPages> {
        let name = self.name();
        let firsts = page_firsts(py, name, host_indices, pages, self.page_size)?;
        if self.pool_tokens > 0 {
            if let Some((page, &first)) = firsts
                .iter()
                .enumerate()
                .find(|&(_, &f)| f < 0 || f as u64 >= self.pool_tokens)
            {
                return Err(invalid(format!(
                    "pool '{name}': page {page} has host index {first}, outside the pool's [0, {})",
                    self.pool_tokens
                )));
            }
        }
        let guard = self.open(py)?;
        let host = guard.as_ref().expect("open").host();
        let found = match &self.map {
            HostMap::Layout(table) => HostPages::from_layout(table, host, &firsts),
            HostMap::Meta(_) if pages == 0 => Ok(HostPages::empty(self.layout.sizes().len())),
            HostMap::Meta(meta) => {
                let per = self.layout.sizes().len();
                let got = meta.bind(py).call1((host_indices,))?;
                let (ptrs, lens): (Vec<u64>, Vec<u64>) = got.extract().map_err(|_| {
                    InternalError::new_err(format!(
                        "pool '{name}': get_page_buffer_meta answered {}, not (pointers, sizes)",
                        describe(&got)
                    ))
                })?;
                if ptrs.len() != pages * per || lens.len() != ptrs.len() {
                    return Err(InternalError::new_err(format!(
                        "pool '{name}': get_page_buffer_meta gave {} pointers and {} sizes for {pages} pages of {per} entries",
                        ptrs.len(),
                        lens.len()
                    )));
                }
                HostPages::from_addresses(self.layout.sizes(), host, &ptrs, &lens)
            }
        };
        found.map_err(|o| {
            invalid(format!(
                "pool '{name}': page {} (host index {}) entry {} at {} is outside the pool's buffers",
                o.page, firsts[o.page], o.entry, o.at
            ))
        })
    }

    /// The pool's memory while it is open (a read lock: `close` waits for
    /// every copy in flight); waited for without the GIL.
    pub(crate) fn open(&self, py: Python<'_>) -> PyResult<RwLockReadGuard<'_, Option<PoolMemory>>> {
        let guard = loop {
            match self.memory.try_read() {
                Ok(g) => break g,
                Err(TryLockError::Poisoned(p)) => break p.into_inner(),
                // `close` holds it: wait for it without the GIL, then try again.
                Err(TryLockError::WouldBlock) => py.detach(|| {
                    drop(self.memory.read());
                }),
            }
        };
        if guard.is_none() {
            return Err(invalid(format!("pool '{}' is closed", self.name())));
        }
        Ok(guard)
    }

    /// Runs the write hook, if one is set (fault-injection tests): after a
    /// write's rows are marked invalid, before their bytes are copied.
    pub(crate) fn run_write_hook(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(hook) = self.write_hook.get(py) {
            hook.call0(py)?;
        }
        Ok(())
    }
}

/// An int64 `[E, 5]` layout table: (buffer, offset, stride, divisor, bytes)
/// per entry.
fn layout_entries(table: &Bound<'_, PyAny>, buffers: usize) -> PyResult<Vec<Entry>> {
    let array = table.cast::<PyArray2<i64>>().map_err(|_| {
        wrong_type(format!(
            "entries must be an int64 numpy array [E, 5] (buffer, offset, stride, divisor, bytes), got {}",
            describe(table)
        ))
    })?;
    let view = array.readonly();
    let view = view.as_array();
    if view.ncols() != 5 || view.nrows() == 0 {
        return Err(invalid(format!(
            "entries must have shape [E >= 1, 5], got {:?}",
            view.shape()
        )));
    }
    view.rows()
        .into_iter()
        .enumerate()
        .map(|(j, r)| Entry::checked(j, [r[0], r[1], r[2], r[3], r[4]], buffers).map_err(invalid))
        .collect()
}

fn internal(message: String) -> PyErr {
    InternalError::new_err(message)
}

#[pymethods]
impl SglangPool {
    /// `host_buffers`: the pool's CPU buffers (torch tensors); `entries`: the
    /// layout table (int64 `[E, 5]`: buffer, offset, stride, divisor, bytes),
    /// or `None` and `meta` (SGLang's `get_page_buffer_meta`) with
    /// `entry_sizes`; `data`: the slab's `rows * page_bytes` uint8 bytes
    /// (entry by entry, see `cpkv_slab::layout`);
    /// `stamps`, `tags`: its int64 `[rows]` (any shape of `rows` elements).
    #[new]
    #[pyo3(signature = (name, host_buffers, entries, meta, entry_sizes, page_size, pool_tokens, data, stamps, tags))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: String,
        host_buffers: &Bound<'_, PyList>,
        entries: &Bound<'_, PyAny>,
        meta: &Bound<'_, PyAny>,
        entry_sizes: Vec<u64>,
        page_size: u64,
        pool_tokens: u64,
        data: &Bound<'_, PyAny>,
        stamps: &Bound<'_, PyAny>,
        tags: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        if page_size == 0 {
            return Err(invalid(format!("pool '{name}': page_size must be >= 1")));
        }
        let host = host_buffers
            .iter()
            .enumerate()
            .map(|(i, b)| tensor_region(&b, &format!("pool '{name}': host buffer {i}")))
            .collect::<PyResult<Vec<_>>>()?;
        let (map, sizes) = if entries.is_none() {
            if !meta.is_callable() {
                return Err(wrong_type(format!(
                    "pool '{name}': without entries, meta must be the pool's get_page_buffer_meta, got {}",
                    describe(meta)
                )));
            }
            (HostMap::Meta(meta.clone().unbind()), entry_sizes)
        } else {
            let table = layout_entries(entries, host.len())?;
            let sizes = table.iter().map(|e| e.bytes).collect();
            (HostMap::Layout(table), sizes)
        };
        let [data_region, stamp_region, tag_region] =
            [(data, "data"), (stamps, "stamps"), (tags, "tags")]
                .map(|(t, what)| tensor_region(t, &format!("pool '{name}': slab {what}")));
        let (layout, memory) =
            PageLayout::open(&name, sizes, host, data_region?, stamp_region?, tag_region?)
                .map_err(invalid)?;
        let mut owners: Vec<Py<PyAny>> = host_buffers.iter().map(Bound::unbind).collect();
        owners.extend([data, stamps, tags].map(|t| t.clone().unbind()));
        Ok(Self {
            page_size,
            pool_tokens,
            layout,
            map,
            _owners: owners,
            memory: RwLock::new(Some(memory)),
            write_hook: TestHook::default(),
        })
    }

    /// Checks `host_indices` for `pages` pages (what every batch call checks
    /// first): raises `InvalidArgumentError` naming the page and its index.
    fn check(&self, py: Python<'_>, host_indices: &Bound<'_, PyAny>, pages: usize) -> PyResult<()> {
        self.host_pages(py, host_indices, pages).map(|_| ())
    }

    /// Writes pages laid out as slab rows into the host pool: `data` (uint8
    /// `[m, page_bytes]`, C-contiguous) row `j` into host page
    /// `positions[j]` of a call of `pages` pages at `host_indices` (checked
    /// first, as every batch call's: nothing is copied when a check fails).
    /// The L3 tier's reads land in SGLang's host pool through it.
    fn fill_host(
        &self,
        py: Python<'_>,
        host_indices: &Bound<'_, PyAny>,
        pages: usize,
        positions: Vec<usize>,
        data: &Bound<'_, PyArray2<u8>>,
    ) -> PyResult<()> {
        let page_bytes = self.layout.page_bytes();
        let shape = data.shape();
        if shape[0] != positions.len() || shape[1] as u64 != page_bytes {
            return Err(invalid(format!(
                "data has shape {shape:?}, {} pages of {page_bytes} bytes were expected",
                positions.len(),
            )));
        }
        if !data.is_c_contiguous() {
            return Err(invalid("data must be C-contiguous".to_string()));
        }
        if let Some(&p) = positions.iter().find(|&&p| p >= pages) {
            return Err(invalid(format!(
                "position {p} is not a page of a call of {pages} pages"
            )));
        }
        let found = self.host_pages(py, host_indices, pages)?;
        let guard = self.open(py)?;
        let memory = guard.as_ref().expect("open");
        let readonly = data.readonly();
        let bytes = readonly
            .as_slice()
            .map_err(|e| invalid(format!("data: {e}")))?;
        for (position, page) in positions
            .iter()
            .zip(bytes.chunks_exact(page_bytes as usize))
        {
            self.layout
                .copy_page_in(memory, &found, *position, page)
                .map_err(internal)?;
        }
        Ok(())
    }

    /// int64 `[pages, entries]`: the host address of each entry of each page,
    /// as `check` computes them (tests compare them with SGLang's own
    /// `get_page_buffer_meta`).
    fn addresses<'py>(
        &self,
        py: Python<'py>,
        host_indices: &Bound<'py, PyAny>,
        pages: usize,
    ) -> PyResult<Bound<'py, PyArray2<i64>>> {
        let found = self.host_pages(py, host_indices, pages)?;
        let guard = self.open(py)?;
        let host = guard.as_ref().expect("open").host();
        let flat: Vec<i64> = found
            .addresses(host)
            .into_iter()
            .map(|a| a as i64)
            .collect();
        PyArray1::from_vec(py, flat).reshape([pages, self.layout.sizes().len()])
    }

    /// The tensor call `get`: slab `row` into `out` (a CPU uint8 tensor of
    /// `page_bytes`, the page's entries in order) while it holds `handle` and
    /// `tag`, before and after the copy. "missing" (nothing copied), "torn"
    /// (the row changed under the copy) or "served".
    fn read_page(
        &self,
        py: Python<'_>,
        row: u64,
        handle: i64,
        tag: i64,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<&'static str> {
        let out = tensor_region(out, "out")?;
        let guard = self.open(py)?;
        let memory = guard.as_ref().expect("open");
        let outcome = unshared(py, || self.layout.read_page(memory, row, handle, tag, out))?
            .map_err(internal)?;
        Ok(match outcome {
            ReadOutcome::Missing => "missing",
            ReadOutcome::Torn => "torn",
            ReadOutcome::Served => "served",
        })
    }

    /// The tensor call `batch_set`'s rows this rank writes: `values[i]` (a CPU
    /// uint8 tensor of `page_bytes`) into `rows[i]` as the page of
    /// `handles[i]` and `tags[i]`, by the seqlock's sequence (every row marked
    /// invalid, a fence, the copies, a fence, every row published); rows that
    /// hold their page already are skipped; the write hook runs as in a batch
    /// write, after the rows are marked invalid. How many rows were written.
    fn write_values(
        &self,
        py: Python<'_>,
        rows: Vec<u64>,
        handles: Vec<i64>,
        tags: Vec<i64>,
        values: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        if rows.len() != handles.len() || rows.len() != tags.len() || rows.len() != values.len() {
            return Err(invalid(format!(
                "rows, handles, tags and values differ in length: {}, {}, {}, {}",
                rows.len(),
                handles.len(),
                tags.len(),
                values.len()
            )));
        }
        let values = values
            .iter()
            .enumerate()
            .map(|(i, v)| tensor_region(v, &format!("value {i}")))
            .collect::<PyResult<Vec<_>>>()?;
        let writes: Vec<RowWrite> = (0..rows.len())
            .map(|i| RowWrite {
                row: rows[i],
                handle: handles[i],
                tag: tags[i],
            })
            .collect();
        let guard = self.open(py)?;
        let memory = guard.as_ref().expect("open");
        let write = |hook: &mut dyn FnMut() -> Result<(), String>| {
            self.layout.write_values(memory, &writes, &values, hook)
        };
        match self.write_hook.get(py) {
            None => unshared(py, || write(&mut || Ok(())))?,
            Some(hook) => write(&mut || {
                hook.call0(py)
                    .map(drop)
                    .map_err(|e| format!("the write hook raised: {e}"))
            }),
        }
        .map_err(internal)
    }

    /// A callable run after a write has marked its rows invalid and before it
    /// copies their bytes (fault-injection tests: a writer killed mid-write);
    /// `None` removes it.
    fn set_write_hook(&self, hook: &Bound<'_, PyAny>) -> PyResult<()> {
        self.write_hook.set(hook)
    }

    /// Waits for every copy in flight, then refuses every later call (the
    /// slab may be unmapped after this returns).
    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            *self.memory.write().unwrap_or_else(PoisonError::into_inner) = None;
        });
    }

    #[getter]
    fn page_bytes(&self) -> u64 {
        self.layout.page_bytes()
    }

    /// Each entry's size in bytes.
    #[getter]
    fn entry_sizes(&self) -> Vec<u64> {
        self.layout.sizes().to_vec()
    }

    /// "layout" (computed from the pool's layout) or "meta" (SGLang's
    /// `get_page_buffer_meta` per batch).
    #[getter]
    fn mode(&self) -> &'static str {
        match self.map {
            HostMap::Layout(_) => "layout",
            HostMap::Meta(_) => "meta",
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "SglangPool(name='{}', entries={}, page_bytes={}, mode={})",
            self.name(),
            self.layout.sizes().len(),
            self.layout.page_bytes(),
            self.mode()
        )
    }
}
