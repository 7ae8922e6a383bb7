//! `SglangPool`: one SGLang host pool and its slab region, as the SGLang
//! backend's batch calls see them.
//!
//! Where a page's bytes are in the pool: for the pool classes the backend
//! models (`cpkv.integrations.sglang.layout`), computed from the pool's layout
//! here, per page, from its first host index (each entry at `offset +
//! (first / divisor) * stride` in one of the pool's CPU buffers, `bytes`
//! long); for any other class, from SGLang's own `get_page_buffer_meta`
//! (called once per batch). Every entry of every page is checked to lie inside
//! its buffer before anything is stored or copied, and each copy checks its two
//! ranges again right where it copies ([`copy_checked`]), against the buffer
//! lengths given here.
//!
//! The slab side: `rows` rows of `page_bytes` (one page each), stored entry
//! by entry: entry `j` of every row, then entry `j + 1` of every row (so the
//! entries of consecutive rows lie back to back, as they do in a host buffer,
//! and a batch copies in runs rather than page pieces); and per row a stamp
//! and a key tag (int64, shared memory: other
//! processes of the node read and write them, so every access is atomic).
//! A row's writer stamps it `-handle`, copies, sets the tag, then stamps it
//! `handle`; a reader checks stamp and tag before and after it copies (a
//! seqlock), so a row overwritten under it is a miss, never torn bytes.

use std::ptr;
use std::sync::atomic::{fence, AtomicI64, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, TryLockError};

use numpy::{
    PyArray1, PyArray2, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyList;

use super::hook::TestHook;
use crate::convert::{describe, invalid, wrong_type};
use crate::errors::InternalError;

/// One live CPU buffer: where it is and how long (its owner is held by the
/// pool, so the memory stays valid while the pool is open).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Region {
    address: usize,
    bytes: usize,
}

impl Region {
    /// A CPU, contiguous torch tensor's bytes.
    pub(crate) fn of_tensor(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Self> {
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
            .filter(|&b| b <= isize::MAX as usize && address.checked_add(b).is_some())
            .ok_or_else(|| invalid(format!("{what}: {numel} elements of {item} bytes overflow")))?;
        Ok(Self { address, bytes })
    }

    /// A byte slice this process owns (a call's scratch or output).
    pub(crate) fn of_slice(bytes: &[u8]) -> Self {
        Self {
            address: bytes.as_ptr() as usize,
            bytes: bytes.len(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes
    }

    pub(crate) fn address(&self) -> usize {
        self.address
    }

    pub(crate) fn overlaps(&self, other: &Region) -> bool {
        self.bytes > 0
            && other.bytes > 0
            && self.address < other.address + other.bytes
            && other.address < self.address + self.bytes
    }

    /// Whether `[at, at + bytes)` lies inside this buffer.
    fn holds(&self, at: u64, bytes: u64) -> bool {
        at.checked_add(bytes)
            .is_some_and(|end| end <= self.bytes as u64)
    }
}

/// Copies `bytes` bytes from `src` at `src_at` to `dst` at `dst_at`, both
/// ranges checked against their buffers right here; a range outside its buffer
/// is an error and nothing is copied.
#[allow(unsafe_code)] // the one raw copy of the SGLang backend, on ranges checked here
pub(crate) fn copy_checked(
    dst: Region,
    dst_at: u64,
    src: Region,
    src_at: u64,
    bytes: u64,
) -> Result<(), String> {
    if !dst.holds(dst_at, bytes) || !src.holds(src_at, bytes) {
        return Err(format!(
            "a copy of {bytes} bytes from {src_at} of a {}-byte buffer to {dst_at} of a {}-byte buffer \
             is outside a buffer",
            src.bytes, dst.bytes
        ));
    }
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: both ranges lie inside live buffers (checked just above; their
    // owners are held by the pool, and the slab stays mapped while the pool's
    // read lock is held), and a host buffer never overlaps the slab (checked
    // when the pool was built). The slab's bytes may be written by another
    // process at the same time: the seqlock (stamps) makes such a copy a miss.
    unsafe {
        ptr::copy_nonoverlapping(
            (src.address + src_at as usize) as *const u8,
            (dst.address + dst_at as usize) as *mut u8,
            bytes as usize,
        );
    }
    Ok(())
}

/// Where one entry of a page lies in the host pool, by the pool's layout.
#[derive(Clone, Copy, Debug)]
struct Entry {
    buffer: usize,
    offset: u64,
    stride: u64,
    divisor: u64,
    bytes: u64,
}

/// How a page's entries are found in the host pool.
enum HostMap {
    /// Computed from the pool's layout (the classes the backend models).
    Layout(Vec<Entry>),
    /// From SGLang's `get_page_buffer_meta` (any other class).
    Meta(Py<PyAny>),
}

/// Bytes of one copy: from `host_at` of host buffer `buffer` to or from
/// `slab_at` of the slab.
struct Run {
    buffer: usize,
    host_at: u64,
    slab_at: u64,
    bytes: u64,
}

impl Run {
    /// Whether `next` starts where this run ends, on both sides.
    fn continued_by(&self, next: &Run) -> bool {
        next.buffer == self.buffer
            && Some(next.host_at) == self.host_at.checked_add(self.bytes)
            && Some(next.slab_at) == self.slab_at.checked_add(self.bytes)
    }
}

/// Every page's entries in the host pool, page after page: (buffer, byte
/// offset) each.
pub(crate) struct HostPages {
    entries: usize,
    at: Vec<(usize, u64)>,
}

impl HostPages {
    fn page(&self, page: usize) -> &[(usize, u64)] {
        &self.at[page * self.entries..(page + 1) * self.entries]
    }
}

/// The memory a pool copies between, while it is open.
pub(crate) struct Buffers {
    host: Vec<Region>,
    data: Region,
    stamps: Region,
    tags: Region,
    rows: u64,
}

impl Buffers {
    /// The stamp and tag of a row (`row < rows`, checked).
    #[allow(unsafe_code)] // an aligned int64 of the slab's shared memory as an atomic
    fn cells(&self, row: u64) -> Result<(&AtomicI64, &AtomicI64), String> {
        if row >= self.rows {
            return Err(format!(
                "slab row {row} is outside the slab's {} rows",
                self.rows
            ));
        }
        let at = row as usize * 8;
        // SAFETY: `row < rows` and both regions hold `rows` int64s, 8-byte
        // aligned (checked when the pool was built), mapped while the pool's
        // read lock is held; other processes access them atomically too.
        unsafe {
            Ok((
                &*((self.stamps.address + at) as *const AtomicI64),
                &*((self.tags.address + at) as *const AtomicI64),
            ))
        }
    }

    /// Starts fetching the stamp and tag of each row (rows outside the slab
    /// are skipped: `holds` refuses them), so a batch's misses overlap
    /// before its rows are checked one by one; a hint, it reads nothing.
    pub(crate) fn prefetch_rows(&self, rows: impl IntoIterator<Item = u64>) {
        for row in rows.into_iter().filter(|&row| row < self.rows) {
            let at = row as usize * 8;
            prefetch(self.stamps.address + at);
            prefetch(self.tags.address + at);
        }
    }

    /// Whether `row` holds the page stamped `handle` with key tag `tag` now.
    pub(crate) fn holds(&self, row: u64, handle: i64, tag: i64) -> Result<bool, String> {
        let (stamp, key) = self.cells(row)?;
        Ok(stamp.load(Ordering::Acquire) == handle && key.load(Ordering::Acquire) == tag)
    }

    /// Whether `row` holds a fully written page (any handle) of key tag `tag`.
    pub(crate) fn carries(&self, row: u64, tag: i64) -> Result<bool, String> {
        let (stamp, key) = self.cells(row)?;
        Ok(stamp.load(Ordering::Acquire) > 0 && key.load(Ordering::Acquire) == tag)
    }

    /// Marks `row` invalid while its bytes change.
    pub(crate) fn invalidate(&self, row: u64, handle: i64) -> Result<(), String> {
        self.cells(row)?.0.store(-handle, Ordering::Release);
        Ok(())
    }

    /// Publishes `row` as the page of `handle` with key tag `tag`.
    pub(crate) fn publish(&self, row: u64, handle: i64, tag: i64) -> Result<(), String> {
        let (stamp, key) = self.cells(row)?;
        key.store(tag, Ordering::Release);
        stamp.store(handle, Ordering::Release);
        Ok(())
    }
}

/// Starts fetching the cache line at `address` into every cache level: a
/// hint, with no effect on what any code reads.
#[inline]
fn prefetch(address: usize) {
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    // SAFETY: a prefetch reads nothing a program sees and never faults,
    // whatever the address (here one inside the slab's stamps or tags).
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(address as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// Orders every byte copied before it against every stamp stored after it (a
/// full fence: it orders streaming stores a `memcpy` may use, too).
pub(crate) fn copies_done() {
    fence(Ordering::SeqCst);
}

#[pyclass(frozen, name = "SglangPool", module = "cpkv._cpkv")]
pub(crate) struct SglangPool {
    name: String,
    page_size: u64,
    pool_tokens: u64,
    page_bytes: u64,
    /// Each entry's size, and its offset in a slab row.
    sizes: Vec<u64>,
    /// Where entry `j` of every row starts in the slab's data: row `r`'s
    /// entry `j` is at `entry_bases[j] + r * sizes[j]`.
    entry_bases: Vec<u64>,
    /// Where entry `j` starts in a page laid out whole (an L3 record's
    /// payload): the sizes of the entries before it.
    page_offsets: Vec<u64>,
    map: HostMap,
    /// Held so the buffers stay valid while the pool is open.
    _owners: Vec<Py<PyAny>>,
    buffers: RwLock<Option<Buffers>>,
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
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn page_bytes(&self) -> u64 {
        self.page_bytes
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
        let name = &self.name;
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
        let buffers = guard.as_ref().expect("open");
        let outside = |page: usize, entry: usize, at: String| {
            invalid(format!(
                "pool '{name}': page {page} (host index {}) entry {entry} at {at} is outside the pool's buffers",
                firsts[page]
            ))
        };
        match &self.map {
            HostMap::Layout(entries) => {
                let mut at = Vec::with_capacity(firsts.len() * entries.len());
                for (page, &first) in firsts.iter().enumerate() {
                    for (j, e) in entries.iter().enumerate() {
                        let unit = (first.max(0) as u64) / e.divisor;
                        match unit
                            .checked_mul(e.stride)
                            .and_then(|o| o.checked_add(e.offset))
                        {
                            Some(offset) if buffers.host[e.buffer].holds(offset, e.bytes) => {
                                at.push((e.buffer, offset));
                            }
                            _ => {
                                return Err(outside(
                                    page,
                                    j,
                                    format!(
                                        "buffer {} + {unit} * {} + {} bytes",
                                        e.buffer, e.stride, e.bytes
                                    ),
                                ))
                            }
                        }
                    }
                }
                Ok(HostPages {
                    entries: entries.len(),
                    at,
                })
            }
            HostMap::Meta(meta) => {
                let sizes = &self.sizes;
                let per = sizes.len();
                if pages == 0 {
                    return Ok(HostPages {
                        entries: per,
                        at: Vec::new(),
                    });
                }
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
                let mut at = Vec::with_capacity(ptrs.len());
                for (k, (&ptr, &len)) in ptrs.iter().zip(&lens).enumerate() {
                    let (page, j) = (k / per, k % per);
                    let found = buffers.host.iter().enumerate().find_map(|(b, r)| {
                        let offset = ptr.checked_sub(r.address as u64)?;
                        (len == sizes[j] && r.holds(offset, len)).then_some((b, offset))
                    });
                    at.push(
                        found.ok_or_else(|| outside(page, j, format!("{ptr:#x} + {len} bytes")))?,
                    );
                }
                Ok(HostPages { entries: per, at })
            }
        }
    }

    /// The pool's buffers while it is open (a read lock: `close` waits for
    /// every copy in flight); waited for without the GIL.
    pub(crate) fn open(&self, py: Python<'_>) -> PyResult<RwLockReadGuard<'_, Option<Buffers>>> {
        let guard = loop {
            match self.buffers.try_read() {
                Ok(g) => break g,
                Err(TryLockError::Poisoned(p)) => break p.into_inner(),
                // `close` holds it: wait for it without the GIL, then try again.
                Err(TryLockError::WouldBlock) => py.detach(|| {
                    drop(self.buffers.read());
                }),
            }
        };
        if guard.is_none() {
            return Err(invalid(format!("pool '{}' is closed", self.name)));
        }
        Ok(guard)
    }

    /// Copies pages between the host pool and the slab: `(page, row)` each,
    /// page `page` of `pages` to or from slab row `row`. Entries that lie back
    /// to back in both the host buffer and the slab (an entry of consecutive
    /// pages placed in consecutive rows) go as one copy: at 4 KB pages the
    /// per-copy work, not the bytes, is the cost.
    pub(crate) fn copy_pages(
        &self,
        buffers: &Buffers,
        pages: &HostPages,
        which: impl IntoIterator<Item = (usize, u64)>,
        to_slab: bool,
    ) -> Result<(), String> {
        let copy = |run: &Run| {
            let host = buffers.host[run.buffer];
            if to_slab {
                copy_checked(buffers.data, run.slab_at, host, run.host_at, run.bytes)
            } else {
                copy_checked(host, run.host_at, buffers.data, run.slab_at, run.bytes)
            }
        };
        // Entry by entry, page after page: entry `j` of consecutive rows lies
        // back to back in the slab (entry-major rows), and in SGLang's host
        // buffers for consecutive pages, so a batch is a few long copies.
        let which: Vec<(usize, u64)> = which.into_iter().collect();
        let mut run: Option<Run> = None;
        for j in 0..pages.entries {
            for &(page, row) in &which {
                let (buffer, host_at) = pages.page(page)[j];
                let next = Run {
                    buffer,
                    host_at,
                    slab_at: self.slab_at(row, j)?,
                    bytes: self.sizes[j],
                };
                match &mut run {
                    Some(r) if r.continued_by(&next) => r.bytes += next.bytes,
                    _ => {
                        if let Some(done) = run.replace(next) {
                            copy(&done)?;
                        }
                    }
                }
            }
        }
        run.as_ref().map_or(Ok(()), copy)
    }

    /// Where entry `j` of slab row `row` starts in the slab's data.
    fn slab_at(&self, row: u64, j: usize) -> Result<u64, String> {
        row.checked_mul(self.sizes[j])
            .and_then(|at| at.checked_add(self.entry_bases[j]))
            .ok_or_else(|| format!("slab row {row} overflows"))
    }

    /// Copies slab `row` into `out` (`page_bytes` long, its entries in
    /// order, as an L3 record holds a page): a victim's bytes leaving the
    /// slab for L3, before its row is written again.
    pub(crate) fn copy_row_out(
        &self,
        buffers: &Buffers,
        row: u64,
        out: &mut [u8],
    ) -> Result<(), String> {
        let dst = Region {
            address: out.as_mut_ptr() as usize,
            bytes: out.len(),
        };
        for j in 0..self.sizes.len() {
            let at = self.slab_at(row, j)?;
            copy_checked(dst, self.page_offsets[j], buffers.data, at, self.sizes[j])?;
        }
        Ok(())
    }

    /// Copies one page laid out as L3 holds it (`src`, `page_bytes` long,
    /// its entries in order) into its host pages, entry by entry.
    fn copy_page_from(
        &self,
        buffers: &Buffers,
        pages: &HostPages,
        page: usize,
        src: Region,
    ) -> Result<(), String> {
        for (j, &(buffer, host_at)) in pages.page(page).iter().enumerate() {
            copy_checked(
                buffers.host[buffer],
                host_at,
                src,
                self.page_offsets[j],
                self.sizes[j],
            )?;
        }
        Ok(())
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
        .map(|(j, r)| {
            let [buffer, offset, stride, divisor, bytes] = [r[0], r[1], r[2], r[3], r[4]];
            if buffer < 0 || buffer as usize >= buffers || offset < 0 || stride < 0 || divisor < 1 || bytes < 1 {
                return Err(invalid(format!(
                    "entry {j}: (buffer {buffer}, offset {offset}, stride {stride}, divisor {divisor}, bytes {bytes}) \
                     is not an entry of {buffers} buffers"
                )));
            }
            Ok(Entry {
                buffer: buffer as usize,
                offset: offset as u64,
                stride: stride as u64,
                divisor: divisor as u64,
                bytes: bytes as u64,
            })
        })
        .collect()
}

#[pymethods]
impl SglangPool {
    /// `host_buffers`: the pool's CPU buffers (torch tensors); `entries`: the
    /// layout table (int64 `[E, 5]`: buffer, offset, stride, divisor, bytes),
    /// or `None` and `meta` (SGLang's `get_page_buffer_meta`) with
    /// `entry_sizes`; `data`: the slab's `rows * page_bytes` uint8 bytes
    /// (entry by entry, see the module docs);
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
            .map(|(i, b)| Region::of_tensor(&b, &format!("pool '{name}': host buffer {i}")))
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
        if sizes.is_empty() || sizes.contains(&0) {
            return Err(invalid(format!(
                "pool '{name}': entry sizes must be >= 1 and at least one, got {sizes:?}"
            )));
        }
        let mut page_offsets = Vec::with_capacity(sizes.len());
        let mut page_bytes = 0u64;
        for &s in &sizes {
            page_offsets.push(page_bytes);
            page_bytes = page_bytes
                .checked_add(s)
                .ok_or_else(|| invalid(format!("pool '{name}': a page's size overflows")))?;
        }
        let data_region = Region::of_tensor(data, &format!("pool '{name}': slab data"))?;
        let stamp_region = Region::of_tensor(stamps, &format!("pool '{name}': slab stamps"))?;
        let tag_region = Region::of_tensor(tags, &format!("pool '{name}': slab tags"))?;
        let rows = (data_region.bytes as u64) / page_bytes;
        if data_region.bytes as u64 != rows * page_bytes
            || stamp_region.bytes as u64 != rows * 8
            || tag_region.bytes as u64 != rows * 8
            || stamp_region.address % 8 != 0
            || tag_region.address % 8 != 0
        {
            return Err(invalid(format!(
                "pool '{name}': the slab's data ({} bytes), stamps ({} bytes) and tags ({} bytes) are not \
                 {rows} rows of {page_bytes} bytes and two aligned int64 each",
                data_region.bytes, stamp_region.bytes, tag_region.bytes
            )));
        }
        // Bounded by the data's bytes (checked above): no overflow.
        let entry_bases = sizes
            .iter()
            .scan(0u64, |at, &s| {
                let base = *at;
                *at += rows * s;
                Some(base)
            })
            .collect();
        for (i, h) in host.iter().enumerate() {
            for (what, r) in [
                ("data", &data_region),
                ("stamps", &stamp_region),
                ("tags", &tag_region),
            ] {
                if h.overlaps(r) {
                    return Err(invalid(format!(
                        "pool '{name}': host buffer {i} overlaps the slab's {what}"
                    )));
                }
            }
        }
        let mut owners: Vec<Py<PyAny>> = host_buffers.iter().map(Bound::unbind).collect();
        owners.extend([data, stamps, tags].map(|t| t.clone().unbind()));
        Ok(Self {
            name,
            page_size,
            pool_tokens,
            page_bytes,
            sizes,
            entry_bases,
            page_offsets,
            map,
            _owners: owners,
            buffers: RwLock::new(Some(Buffers {
                host,
                data: data_region,
                stamps: stamp_region,
                tags: tag_region,
                rows,
            })),
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
        let shape = data.shape();
        if shape[0] != positions.len() || shape[1] as u64 != self.page_bytes {
            return Err(invalid(format!(
                "data has shape {shape:?}, {} pages of {} bytes were expected",
                positions.len(),
                self.page_bytes
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
        let buffers = guard.as_ref().expect("open");
        let readonly = data.readonly();
        let bytes = readonly
            .as_slice()
            .map_err(|e| invalid(format!("data: {e}")))?;
        let page_bytes = self.page_bytes as usize;
        for (j, &position) in positions.iter().enumerate() {
            let row = &bytes[j * page_bytes..(j + 1) * page_bytes];
            let src = Region {
                address: row.as_ptr() as usize,
                bytes: row.len(),
            };
            self.copy_page_from(buffers, &found, position, src)
                .map_err(|e| InternalError::new_err(format!("pool '{}': {e}", self.name)))?;
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
        let buffers = guard.as_ref().expect("open");
        let flat: Vec<i64> = found
            .at
            .iter()
            .map(|&(b, at)| (buffers.host[b].address as u64 + at) as i64)
            .collect();
        PyArray1::from_vec(py, flat).reshape([pages, self.sizes.len()])
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
            *self.buffers.write().unwrap_or_else(PoisonError::into_inner) = None;
        });
    }

    #[getter(page_bytes)]
    fn page_bytes_py(&self) -> u64 {
        self.page_bytes
    }

    /// Each entry's size in bytes.
    #[getter]
    fn entry_sizes(&self) -> Vec<u64> {
        self.sizes.clone()
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
            self.name,
            self.sizes.len(),
            self.page_bytes,
            self.mode()
        )
    }
}
