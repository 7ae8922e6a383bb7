//! Python wrapper of `cpkv_allocator::PageAllocator`.
//!
//! One `Mutex` guards the core allocator, so the object is safe to share
//! between Python threads. Arguments are converted (and rejected with a cpkv
//! error naming the value) before the lock is taken, and Python objects are
//! built after it is released, so no Python code ever runs under the lock.
//! `reserve_batch` is the lean batched form: key and page arrays in, one
//! `PlacementBatch` out, which builds a `Placement` only when one is asked for.

use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use cpkv_allocator::{PageAllocator, PayloadId, PayloadSet, Payloads, Placement};
use numpy::{PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::convert::{invalid, strict_u64};
use crate::errors::{alloc_error, cpkv_error};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPageAllocator>()?;
    m.add_class::<PyPlacement>()?;
    m.add_class::<PyPlacementBatch>()?;
    Ok(())
}

fn repr(value: &Bound<'_, PyAny>) -> String {
    value
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "<unprintable>".into())
}

/// An object key: any Python int in `[0, 2**64)`.
fn key_arg(key: &Bound<'_, PyAny>) -> PyResult<u64> {
    strict_u64(key).map_err(|_| invalid(format!("key {} must be an int in [0, 2**64)", repr(key))))
}

/// A page count for `key`: an int of at least 1.
fn pages_arg(key: u64, num_pages: &Bound<'_, PyAny>) -> PyResult<u64> {
    match strict_u64(num_pages) {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(invalid(format!(
            "key {key}: num_pages must be an int of at least 1, got {}",
            repr(num_pages)
        ))),
    }
}

/// A 1-D numpy integer array or an iterable of ints, each in `[0, 2**64)`;
/// `what` names the argument in errors. numpy `uint64`/`int64` arrays are
/// read in place, without a Python object per element.
fn u64_vector(values: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u64>> {
    if let Ok(array) = values.cast::<PyArray1<u64>>() {
        // A contiguous array is copied out in one go, without taking a
        // borrow (numpy's borrow tracking costs more than the copy).
        return Ok(array
            .to_vec()
            .unwrap_or_else(|_| array.readonly().as_array().to_vec()));
    }
    if let Ok(array) = values.cast::<PyArray1<i64>>() {
        let signed = array
            .to_vec()
            .unwrap_or_else(|_| array.readonly().as_array().to_vec());
        return signed
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                u64::try_from(v)
                    .map_err(|_| invalid(format!("{what}[{i}] = {v} must be an int in [0, 2**64)")))
            })
            .collect();
    }
    if let Ok(array) = values.cast::<PyUntypedArray>() {
        let kind = array.dtype().kind();
        if array.ndim() != 1 || !matches!(kind, b'i' | b'u') {
            return Err(invalid(format!(
                "{what} must be a 1-D integer array, got {} dimension(s) of dtype {}",
                array.ndim(),
                array.dtype().str()?
            )));
        }
        let wide =
            values.call_method1("astype", (if kind == b'u' { "uint64" } else { "int64" },))?;
        return u64_vector(&wide, what);
    }
    if values.is_instance_of::<PyString>() {
        return Err(invalid(format!(
            "{what} must be ints, got the str {}",
            repr(values)
        )));
    }
    values
        .try_iter()
        .map_err(|_| {
            invalid(format!(
                "{what} must be an iterable of ints, got {}",
                repr(values)
            ))
        })?
        .enumerate()
        .map(|(i, item)| {
            let item = item?;
            strict_u64(&item).map_err(|_| {
                invalid(format!(
                    "{what}[{i}] = {} must be an int in [0, 2**64)",
                    repr(&item)
                ))
            })
        })
        .collect()
}

fn payload_name(name: &Bound<'_, PyAny>) -> PyResult<String> {
    name.extract::<String>().map_err(|_| {
        cpkv_error(
            "UnknownPayloadError",
            format!("payload names are str, got {}", repr(name)),
        )
    })
}

fn payload_id(payloads: &Payloads, name: &Bound<'_, PyAny>) -> PyResult<PayloadId> {
    payloads.id(&payload_name(name)?).map_err(alloc_error)
}

/// `Payloads::select` over Python str items, without copying the names.
fn names_in_place<'py>(
    payloads: &Payloads,
    interned: &[Py<PyString>],
    items: impl ExactSizeIterator<Item = Bound<'py, PyAny>>,
) -> PyResult<PayloadSet> {
    use cpkv_allocator::AllocError;
    if items.len() == 0 {
        return Err(alloc_error(AllocError::NoPayloads));
    }
    let mut set = PayloadSet::EMPTY;
    for item in items {
        // A name written as a literal is the interned string itself: found
        // by identity, without reading its text.
        let id = match interned.iter().position(|name| item.is(name)) {
            Some(id) => id,
            None => {
                let Ok(text) = item.cast::<PyString>() else {
                    return Err(payload_name(&item).expect_err("a non-str item is refused"));
                };
                payloads.id(text.to_str()?).map_err(alloc_error)?
            }
        };
        if set.contains(id) {
            return Err(alloc_error(AllocError::RepeatedPayload {
                name: payloads.name(id).into(),
            }));
        }
        set = set.with(id);
    }
    Ok(set)
}

/// A list of payload names, or `None` for all of them.
fn payload_set(
    payloads: &Payloads,
    interned: &[Py<PyString>],
    names: Option<&Bound<'_, PyAny>>,
) -> PyResult<PayloadSet> {
    let Some(names) = names.filter(|n| !n.is_none()) else {
        return Ok(payloads.all());
    };
    // The hot path (a list or tuple of str) resolves each name in place,
    // borrowing its UTF-8 text: no String per name and no Vec per call.
    if let Ok(list) = names.cast::<PyList>() {
        return names_in_place(payloads, interned, list.iter());
    }
    if let Ok(tuple) = names.cast::<PyTuple>() {
        return names_in_place(payloads, interned, tuple.iter());
    }
    if names.is_instance_of::<PyString>() {
        return Err(invalid(format!(
            "payloads must be a list of payload names, got the str {}",
            repr(names)
        )));
    }
    let list: Vec<String> = names
        .try_iter()
        .map_err(|_| {
            invalid(format!(
                "payloads must be a list of payload names, got {}",
                repr(names)
            ))
        })?
        .map(|item| payload_name(&item?))
        .collect::<PyResult<_>>()?;
    payloads.select(Some(&list)).map_err(alloc_error)
}

/// Where one object's pages live: per payload, its extents in position order.
#[pyclass(name = "Placement", module = "cpkv._cpkv", frozen)]
pub(crate) struct PyPlacement {
    key: u64,
    placement: Placement,
    payloads: Arc<Payloads>,
}

impl PyPlacement {
    fn extents_of(&self, payload: &Bound<'_, PyAny>) -> PyResult<&[cpkv_allocator::Extent]> {
        let id = payload_id(&self.payloads, payload)?;
        self.placement.extents(id).ok_or_else(|| {
            cpkv_error(
                "UnknownPayloadError",
                format!(
                    "key {} has no pages in payload {:?}",
                    self.key,
                    self.payloads.name(id)
                ),
            )
        })
    }
}

#[pymethods]
impl PyPlacement {
    #[getter]
    fn key(&self) -> u64 {
        self.key
    }

    #[getter]
    fn num_pages(&self) -> u64 {
        self.placement.num_pages()
    }

    /// The payloads this object has pages in, in construction order.
    #[getter]
    fn payloads(&self) -> Vec<String> {
        self.placement
            .payloads()
            .map(|id| self.payloads.name(id).to_owned())
            .collect()
    }

    /// `[(start, length), ...]` in object-position order.
    fn extents(&self, payload: &Bound<'_, PyAny>) -> PyResult<Vec<(u64, u64)>> {
        Ok(self
            .extents_of(payload)?
            .iter()
            .map(|e| (e.start, e.len))
            .collect())
    }

    /// int64 array: object position -> physical page.
    fn pages<'py>(
        &self,
        py: Python<'py>,
        payload: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let extents = self.extents_of(payload)?;
        // Pages are below MAX_CAPACITY = i64::MAX, so the casts are exact.
        let pages: Vec<i64> = extents
            .iter()
            .flat_map(|e| e.start as i64..e.end() as i64)
            .collect();
        Ok(PyArray1::from_vec(py, pages))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<PyPlacement>().is_ok_and(|o| {
            let o = o.get();
            o.key == self.key
                && o.placement == self.placement
                && o.payloads.names() == self.payloads.names()
        })
    }

    fn __repr__(&self) -> String {
        let parts: Vec<String> = self
            .placement
            .parts()
            .map(|(payload, extents)| {
                let extents: Vec<String> = extents
                    .iter()
                    .map(|e| format!("({}, {})", e.start, e.len))
                    .collect();
                format!("{}=[{}]", self.payloads.name(payload), extents.join(", "))
            })
            .collect();
        format!(
            "Placement(key={}, num_pages={}, {})",
            self.key,
            self.placement.num_pages(),
            parts.join(", ")
        )
    }
}

/// Deterministic first-fit page allocator over one pool per payload.
#[pyclass(name = "PageAllocator", module = "cpkv._cpkv", frozen)]
pub(crate) struct PyPageAllocator {
    inner: Mutex<PageAllocator>,
    /// Immutable after construction; read without the lock.
    payloads: Arc<Payloads>,
    /// The payload names as interned Python strings, by id.
    interned: Vec<Py<PyString>>,
}

impl PyPageAllocator {
    fn wrap(py: Python<'_>, alloc: PageAllocator) -> Self {
        let payloads = Arc::new(alloc.payloads().clone());
        let interned = payloads
            .names()
            .iter()
            .map(|name| PyString::intern(py, name).unbind())
            .collect();
        PyPageAllocator {
            inner: Mutex::new(alloc),
            payloads,
            interned,
        }
    }

    /// The core, for a caller holding the GIL: taken at once when free;
    /// otherwise waited for with the GIL released (another thread may be in a
    /// long call without it), so no thread ever waits here holding the GIL.
    fn lock(&self) -> MutexGuard<'_, PageAllocator> {
        loop {
            match self.inner.try_lock() {
                Ok(guard) => return guard,
                // Core calls validate before mutating and never panic on bad
                // input, so a poisoned lock means a bug; surfacing it beats hiding it.
                Err(TryLockError::Poisoned(_)) => panic!("allocator lock poisoned by a panic"),
                Err(TryLockError::WouldBlock) => Python::attach(|py| {
                    py.detach(|| drop(self.locked_without_gil()));
                }),
            }
        }
    }

    /// The payloads `names` selects (`None`: all), literal names by identity.
    fn payload_set(&self, names: Option<&Bound<'_, PyAny>>) -> PyResult<PayloadSet> {
        payload_set(&self.payloads, &self.interned, names)
    }

    /// The core, for a caller that released the GIL.
    fn locked_without_gil(&self) -> MutexGuard<'_, PageAllocator> {
        self.inner
            .lock()
            .expect("allocator lock poisoned by a panic")
    }

    fn placement_of(&self, key: u64, placement: Placement) -> PyPlacement {
        PyPlacement {
            key,
            placement,
            payloads: Arc::clone(&self.payloads),
        }
    }
}

#[pymethods]
impl PyPageAllocator {
    /// `PageAllocator({"kv": 65536, "index": 65536})`: payload name ->
    /// capacity in pages, in the mapping's order.
    #[new]
    fn new(pools: &Bound<'_, PyAny>) -> PyResult<Self> {
        let items = pools.call_method0("items").map_err(|_| {
            invalid(format!(
                "pools must be a mapping of payload name -> capacity, got {}",
                repr(pools)
            ))
        })?;
        let mut parsed = Vec::new();
        for item in items.try_iter()? {
            let (name, capacity): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item?.extract()?;
            let name = payload_name(&name)?;
            let capacity = strict_u64(&capacity).map_err(|_| {
                invalid(format!(
                    "payload {name:?}: capacity must be an int in 1..={}, got {}",
                    cpkv_allocator::MAX_CAPACITY,
                    repr(&capacity)
                ))
            })?;
            parsed.push((name, capacity));
        }
        PageAllocator::new(&parsed)
            .map(|alloc| Self::wrap(pools.py(), alloc))
            .map_err(alloc_error)
    }

    /// Reserves `num_pages` pages for `key` in each payload (default: all);
    /// `None` on a capacity miss (nothing changes).
    #[pyo3(signature = (key, num_pages, payloads = None))]
    fn reserve(
        &self,
        key: &Bound<'_, PyAny>,
        num_pages: &Bound<'_, PyAny>,
        payloads: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<PyPlacement>> {
        let key = key_arg(key)?;
        let num_pages = pages_arg(key, num_pages)?;
        let set = self.payload_set(payloads)?;
        let placed = self
            .lock()
            .reserve(key, num_pages, set)
            .map_err(alloc_error)?
            .cloned();
        Ok(placed.map(|p| self.placement_of(key, p)))
    }

    /// Reserves each `(key, num_pages)` in order, all or nothing per item.
    /// The whole batch is validated first; an invalid item (bad count, live
    /// or repeated key) rejects the batch and nothing is reserved.
    #[pyo3(signature = (requests, payloads = None))]
    fn reserve_many(
        &self,
        requests: &Bound<'_, PyAny>,
        payloads: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<Option<PyPlacement>>> {
        let mut parsed = Vec::new();
        for item in requests.try_iter().map_err(|_| {
            invalid(format!(
                "requests must be an iterable of (key, num_pages), got {}",
                repr(requests)
            ))
        })? {
            let item = item?;
            let (key, num_pages): (Bound<'_, PyAny>, Bound<'_, PyAny>) =
                item.extract().map_err(|_| {
                    invalid(format!(
                        "request {} must be a (key, num_pages) pair",
                        repr(&item)
                    ))
                })?;
            let key = key_arg(&key)?;
            parsed.push((key, pages_arg(key, &num_pages)?));
        }
        let set = self.payload_set(payloads)?;
        let placements = self
            .lock()
            .reserve_many(&parsed, set)
            .map_err(alloc_error)?;
        Ok(parsed
            .iter()
            .zip(placements)
            .map(|(&(key, _), p)| p.map(|p| self.placement_of(key, p)))
            .collect())
    }

    /// The lean batched reserve: `keys[i]` gets `num_pages[i]` pages (numpy
    /// integer arrays or sequences of ints of one length), with
    /// `reserve_many`'s semantics (in order, all or nothing per item, the
    /// whole batch validated first). Returns a `PlacementBatch`.
    #[pyo3(signature = (keys, num_pages, payloads = None))]
    fn reserve_batch(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        num_pages: &Bound<'_, PyAny>,
        payloads: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyPlacementBatch> {
        let keys = u64_vector(keys, "keys")?;
        let pages = u64_vector(num_pages, "num_pages")?;
        if keys.len() != pages.len() {
            return Err(invalid(format!(
                "keys and num_pages differ in length: {} and {}",
                keys.len(),
                pages.len()
            )));
        }
        if let Some(i) = pages.iter().position(|&n| n == 0) {
            return Err(invalid(format!(
                "key {}: num_pages must be an int of at least 1, got 0",
                keys[i]
            )));
        }
        let requests: Vec<(u64, u64)> = keys.iter().copied().zip(pages).collect();
        let set = self.payload_set(payloads)?;
        let mut placements = Vec::with_capacity(requests.len());
        // A batch can be long: it runs without the GIL.
        py.detach(|| {
            self.locked_without_gil()
                .reserve_each(&requests, set, |_, placement| {
                    placements.push(placement.cloned())
                })
        })
        .map_err(alloc_error)?;
        Ok(PyPlacementBatch {
            keys,
            placements,
            payloads: Arc::clone(&self.payloads),
        })
    }

    /// Does nothing, taking `reserve`'s arguments: `bench allocator` times
    /// two of these as the floor of a reserve+release cycle (the cost of
    /// entering the extension at all).
    #[pyo3(signature = (key, num_pages = None, payloads = None))]
    fn _noop(
        &self,
        key: &Bound<'_, PyAny>,
        num_pages: Option<&Bound<'_, PyAny>>,
        payloads: Option<&Bound<'_, PyAny>>,
    ) {
        let _ = (key, num_pages, payloads);
    }

    /// Frees every page of `key`, coalescing with free neighbours.
    fn release(&self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        let key = key_arg(key)?;
        self.lock().release(key).map_err(alloc_error)
    }

    /// Releases every key; a batch with an unknown or repeated key releases nothing.
    /// `keys`: an iterable of ints or a 1-D numpy integer array.
    fn release_many(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<()> {
        let keys = u64_vector(keys, "keys")?;
        py.detach(|| self.locked_without_gil().release_many(&keys))
            .map_err(alloc_error)
    }

    /// Marks `key` committed; idempotent.
    fn mark_committed(&self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        let key = key_arg(key)?;
        self.lock().mark_committed(key).map_err(alloc_error)
    }

    /// Splits committed `key` at position `at` into `left_key` `[0, at)` and
    /// `right_key` `[at, num_pages)` over the same pages; both stay committed.
    fn split(
        &self,
        key: &Bound<'_, PyAny>,
        at: &Bound<'_, PyAny>,
        left_key: &Bound<'_, PyAny>,
        right_key: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let key = key_arg(key)?;
        let at = strict_u64(at).map_err(|_| {
            invalid(format!(
                "key {key}: split position {} must be an int with 0 < at < num_pages",
                repr(at)
            ))
        })?;
        let (left, right) = (key_arg(left_key)?, key_arg(right_key)?);
        self.lock().split(key, at, left, right).map_err(alloc_error)
    }

    fn placement(&self, key: &Bound<'_, PyAny>) -> PyResult<PyPlacement> {
        let key = key_arg(key)?;
        let placement = self.lock().placement(key).map_err(alloc_error)?.clone();
        Ok(self.placement_of(key, placement))
    }

    fn is_committed(&self, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let key = key_arg(key)?;
        self.lock().is_committed(key).map_err(alloc_error)
    }

    fn __contains__(&self, key: &Bound<'_, PyAny>) -> bool {
        strict_u64(key).is_ok_and(|k| self.lock().contains(k))
    }

    fn __len__(&self) -> usize {
        self.lock().len()
    }

    /// Live keys, ascending.
    fn keys(&self) -> Vec<u64> {
        self.lock().keys()
    }

    /// Payload names in construction order.
    #[getter]
    fn payloads(&self) -> Vec<String> {
        self.payloads.names().to_vec()
    }

    fn capacity(&self, payload: &Bound<'_, PyAny>) -> PyResult<u64> {
        Ok(self.payloads.capacity(payload_id(&self.payloads, payload)?))
    }

    fn free_pages(&self, payload: &Bound<'_, PyAny>) -> PyResult<u64> {
        let id = payload_id(&self.payloads, payload)?;
        Ok(self.lock().free_pages(id))
    }

    fn largest_free_extent(&self, payload: &Bound<'_, PyAny>) -> PyResult<u64> {
        let id = payload_id(&self.payloads, payload)?;
        Ok(self.lock().largest_free_extent(id))
    }

    /// Free extents `[(start, length), ...]` in address order.
    fn free_extents(&self, payload: &Bound<'_, PyAny>) -> PyResult<Vec<(u64, u64)>> {
        let id = payload_id(&self.payloads, payload)?;
        let extents = self.lock().free_extents(id);
        Ok(extents.into_iter().map(|e| (e.start, e.len)).collect())
    }

    /// Counters (reserves, misses, releases, splits, commits), live objects,
    /// and per payload: capacity, used, free, free_extents, largest_free_extent.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.lock().stats();
        let out = PyDict::new(py);
        let c = stats.counters;
        for (name, value) in [
            ("reserves", c.reserves),
            ("misses", c.misses),
            ("releases", c.releases),
            ("splits", c.splits),
            ("commits", c.commits),
        ] {
            out.set_item(name, value)?;
        }
        out.set_item("objects", stats.objects)?;
        let per_payload = PyDict::new(py);
        for (id, p) in stats.payloads.iter().enumerate() {
            let d = PyDict::new(py);
            d.set_item("capacity", p.capacity)?;
            d.set_item("used", p.used)?;
            d.set_item("free", p.free)?;
            d.set_item("free_extents", p.free_extents)?;
            d.set_item("largest_free_extent", p.largest_free_extent)?;
            per_payload.set_item(self.payloads.name(id), d)?;
        }
        out.set_item("payloads", per_payload)?;
        Ok(out)
    }

    /// Order-independent 64-bit digest of the whole state; O(1) to read.
    fn digest(&self) -> u64 {
        self.lock().digest()
    }

    /// SHA-256 (32 bytes) of the canonical serialisation of the state.
    fn canonical_digest<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let digest = py.detach(|| self.locked_without_gil().canonical_digest());
        PyBytes::new(py, &digest)
    }

    /// Versioned binary snapshot of the state and counters.
    fn snapshot<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let data = py.detach(|| self.locked_without_gil().snapshot());
        PyBytes::new(py, &data)
    }

    /// Rebuilds an allocator from `snapshot()` bytes; bad bytes raise
    /// `SnapshotError`.
    #[staticmethod]
    fn restore(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Self> {
        let bytes: Vec<u8> = if let Ok(b) = data.cast::<PyBytes>() {
            b.as_bytes().to_vec()
        } else if data.is_instance_of::<PyByteArray>() {
            data.extract()?
        } else {
            return Err(cpkv_error(
                "SnapshotError",
                format!(
                    "snapshot data must be bytes, got {}",
                    data.get_type().name()?
                ),
            ));
        };
        py.detach(|| PageAllocator::restore(&bytes))
            .map(|alloc| Self::wrap(py, alloc))
            .map_err(alloc_error)
    }

    /// Recomputes every invariant and the digest from scratch (an audit;
    /// O(state)); raises `CpkvError` naming what is wrong.
    fn verify(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.locked_without_gil().verify())
            .map_err(|e| cpkv_error("CpkvError", e))
    }

    fn __repr__(&self) -> String {
        let pools: Vec<String> = (0..self.payloads.len())
            .map(|id| {
                format!(
                    "{:?}: {}",
                    self.payloads.name(id),
                    self.payloads.capacity(id)
                )
            })
            .collect();
        format!(
            "PageAllocator({{{}}}, objects={})",
            pools.join(", "),
            self.lock().len()
        )
    }
}

/// The result of `PageAllocator.reserve_batch`: per item, in request order,
/// its placement or `None` (a miss). Holds the placements themselves (not a
/// view of the allocator), so later calls never change it; a `Placement`
/// object is built only when an item is read.
#[pyclass(name = "PlacementBatch", module = "cpkv._cpkv", frozen, sequence)]
pub(crate) struct PyPlacementBatch {
    keys: Vec<u64>,
    placements: Vec<Option<Placement>>,
    payloads: Arc<Payloads>,
}

#[pymethods]
impl PyPlacementBatch {
    fn __len__(&self) -> usize {
        self.placements.len()
    }

    /// Item `index` (negative counts from the end): a `Placement` or `None`.
    fn __getitem__(&self, index: isize) -> PyResult<Option<PyPlacement>> {
        let len = self.placements.len() as isize;
        let at = if index < 0 { index + len } else { index };
        if !(0..len).contains(&at) {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "batch index {index} out of range for {len} items"
            )));
        }
        let at = at as usize;
        Ok(self.placements[at].clone().map(|placement| PyPlacement {
            key: self.keys[at],
            placement,
            payloads: Arc::clone(&self.payloads),
        }))
    }

    /// uint64 array of the requested keys, in request order.
    #[getter]
    fn keys<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u64>> {
        PyArray1::from_slice(py, &self.keys)
    }

    /// bool array: which items were placed (False: a capacity miss).
    #[getter]
    fn hits<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<bool>> {
        PyArray1::from_iter(py, self.placements.iter().map(Option::is_some))
    }

    /// int64 array: each item's first physical page in `payload`, -1 for a
    /// miss or an item with no pages there.
    fn first_pages<'py>(
        &self,
        py: Python<'py>,
        payload: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let id = payload_id(&self.payloads, payload)?;
        // Pages are below MAX_CAPACITY = i64::MAX, so the casts are exact.
        Ok(PyArray1::from_iter(
            py,
            self.placements.iter().map(|p| {
                p.as_ref()
                    .and_then(|p| p.extents(id))
                    .map_or(-1, |extents| extents[0].start as i64)
            }),
        ))
    }

    fn __repr__(&self) -> String {
        let hits = self.placements.iter().filter(|p| p.is_some()).count();
        format!(
            "PlacementBatch(items={}, hits={hits})",
            self.placements.len()
        )
    }
}
