//! Python wrapper of `cpkv_allocator::PageAllocator`.
//!
//! Safe to share between Python threads by the binding's one rule (`shared`):
//! arguments are converted by the one conversion rule (`convert`) before the
//! lock is taken, and Python objects are built after it is released, so no
//! Python code ever runs under the lock.
//! `reserve_batch` is the lean batched form: key and page arrays in, one
//! `PlacementBatch` out, which builds a `Placement` only when one is asked for.

use std::sync::Arc;

use cpkv_allocator::{PageAllocator, PayloadId, PayloadSet, Payloads, Placement};
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::convert::{
    describe, int_vector, invalid, ordered_items, signed, snapshot_bytes, uint, wrong_type,
};
use crate::errors::{alloc_error, CpkvError, UnknownPayloadError};
use crate::shared::{unshared, Shared};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPageAllocator>()?;
    m.add_class::<PyPlacement>()?;
    m.add_class::<PyPlacementBatch>()?;
    Ok(())
}

/// An object key: an int in `[0, 2**64)` by the binding's rule.
fn key_arg(key: &Bound<'_, PyAny>) -> PyResult<u64> {
    uint(key, "key")
}

/// A page count for `key`: an int of at least 1.
fn pages_arg(key: u64, num_pages: &Bound<'_, PyAny>) -> PyResult<u64> {
    match uint(num_pages, "num_pages")? {
        0 => Err(invalid(format!(
            "key {key}: num_pages must be an int of at least 1, got 0"
        ))),
        n => Ok(n),
    }
}

fn payload_name(name: &Bound<'_, PyAny>) -> PyResult<String> {
    name.extract::<String>().map_err(|_| {
        UnknownPayloadError::new_err(format!("payload names are str, got {}", describe(name)))
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
        return Err(wrong_type(format!(
            "payloads must be a list of payload names, got {}",
            describe(names)
        )));
    }
    let list: Vec<String> = names
        .try_iter()
        .map_err(|_| {
            wrong_type(format!(
                "payloads must be a list of payload names, got {}",
                describe(names)
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
            UnknownPayloadError::new_err(format!(
                "key {} has no pages in payload {:?}",
                self.key,
                self.payloads.name(id)
            ))
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
    inner: Shared<PageAllocator>,
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
            inner: Shared::new(alloc),
            payloads,
            interned,
        }
    }

    /// The payloads `names` selects (`None`: all), literal names by identity.
    fn payload_set(&self, names: Option<&Bound<'_, PyAny>>) -> PyResult<PayloadSet> {
        payload_set(&self.payloads, &self.interned, names)
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
    fn new(py: Python<'_>, pools: &Bound<'_, PyAny>) -> PyResult<Self> {
        let items = pools.call_method0("items").map_err(|_| {
            wrong_type(format!(
                "pools must be a mapping of payload name -> capacity, got {}",
                describe(pools)
            ))
        })?;
        let mut parsed = Vec::new();
        for item in items.try_iter()? {
            let (name, capacity): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item?.extract()?;
            let name = payload_name(&name)?;
            // Checked against MAX_CAPACITY, the one limit, by the core.
            let capacity = uint(&capacity, &format!("payload {name:?}: capacity"))?;
            parsed.push((name, capacity));
        }
        unshared(py, || PageAllocator::new(&parsed))?
            .map(|alloc| Self::wrap(py, alloc))
            .map_err(alloc_error)
    }

    /// Reserves `num_pages` pages for `key` in each payload (default: all);
    /// `None` on a capacity miss (nothing changes).
    #[pyo3(signature = (key, num_pages, payloads = None))]
    fn reserve(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        num_pages: &Bound<'_, PyAny>,
        payloads: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<PyPlacement>> {
        let key = key_arg(key)?;
        let num_pages = pages_arg(key, num_pages)?;
        let set = self.payload_set(payloads)?;
        let placed = self
            .inner
            .with(py, |a| a.reserve(key, num_pages, set).map(|p| p.cloned()))?
            .map_err(alloc_error)?;
        Ok(placed.map(|p| self.placement_of(key, p)))
    }

    /// Reserves each `(key, num_pages)` in order, all or nothing per item.
    /// The whole batch is validated first; an invalid item (bad count, live
    /// or repeated key) rejects the batch and nothing is reserved.
    #[pyo3(signature = (requests, payloads = None))]
    fn reserve_many(
        &self,
        py: Python<'_>,
        requests: &Bound<'_, PyAny>,
        payloads: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<Option<PyPlacement>>> {
        // Ordered iterables only: the order decides the placements.
        let items = ordered_items(requests, || {
            format!(
                "requests must be an ordered sequence of (key, num_pages) pairs, got {}",
                describe(requests)
            )
        })?;
        let mut parsed = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let (key, num_pages): (Bound<'_, PyAny>, Bound<'_, PyAny>) =
                item.extract().map_err(|_| {
                    wrong_type(format!(
                        "requests[{i}] must be a (key, num_pages) pair, got {}",
                        describe(item)
                    ))
                })?;
            let key = key_arg(&key)?;
            parsed.push((key, pages_arg(key, &num_pages)?));
        }
        let set = self.payload_set(payloads)?;
        let placements = self
            .inner
            .with(py, |a| a.reserve_many(&parsed, set))?
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
        let keys = int_vector(keys, "keys")?;
        let pages = int_vector(num_pages, "num_pages")?;
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
        // A batch can be long: it runs without the GIL.
        let placements = self
            .inner
            .detached(py, |a| {
                let mut placements = Vec::with_capacity(requests.len());
                a.reserve_each(&requests, set, |_, placement| {
                    placements.push(placement.cloned())
                })
                .map(|()| placements)
            })?
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
    fn release(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<()> {
        let key = key_arg(key)?;
        self.inner
            .with(py, |a| a.release(key))?
            .map_err(alloc_error)
    }

    /// Releases every key; a batch with an unknown or repeated key releases nothing.
    /// `keys`: a sequence of ints or a 1-D numpy integer array.
    fn release_many(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<()> {
        let keys = int_vector(keys, "keys")?;
        self.inner
            .detached(py, |a| a.release_many(&keys))?
            .map_err(alloc_error)
    }

    /// Marks `key` committed; idempotent.
    fn mark_committed(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<()> {
        let key = key_arg(key)?;
        self.inner
            .with(py, |a| a.mark_committed(key))?
            .map_err(alloc_error)
    }

    /// Splits committed `key` at position `at` into `left_key` `[0, at)` and
    /// `right_key` `[at, num_pages)` over the same pages; both stay committed.
    fn split(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        at: &Bound<'_, PyAny>,
        left_key: &Bound<'_, PyAny>,
        right_key: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let key = key_arg(key)?;
        let at = uint(at, &format!("key {key}: split position"))?;
        let (left, right) = (uint(left_key, "left_key")?, uint(right_key, "right_key")?);
        self.inner
            .with(py, |a| a.split(key, at, left, right))?
            .map_err(alloc_error)
    }

    fn placement(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<PyPlacement> {
        let key = key_arg(key)?;
        let placement = self
            .inner
            .with(py, |a| a.placement(key).cloned())?
            .map_err(alloc_error)?;
        Ok(self.placement_of(key, placement))
    }

    fn is_committed(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let key = key_arg(key)?;
        self.inner
            .with(py, |a| a.is_committed(key))?
            .map_err(alloc_error)
    }

    /// Membership never raises for a key of another type: it is not in.
    fn __contains__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        match uint(key, "key") {
            Ok(k) => self.inner.with(py, |a| a.contains(k)),
            Err(_) => Ok(false),
        }
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |a| a.len())
    }

    /// Live keys, ascending.
    fn keys(&self, py: Python<'_>) -> PyResult<Vec<u64>> {
        self.inner.with(py, |a| a.keys())
    }

    /// Payload names in construction order.
    #[getter]
    fn payloads(&self) -> Vec<String> {
        self.payloads.names().to_vec()
    }

    fn capacity(&self, payload: &Bound<'_, PyAny>) -> PyResult<u64> {
        Ok(self.payloads.capacity(payload_id(&self.payloads, payload)?))
    }

    fn free_pages(&self, py: Python<'_>, payload: &Bound<'_, PyAny>) -> PyResult<u64> {
        let id = payload_id(&self.payloads, payload)?;
        self.inner.with(py, |a| a.free_pages(id))
    }

    fn largest_free_extent(&self, py: Python<'_>, payload: &Bound<'_, PyAny>) -> PyResult<u64> {
        let id = payload_id(&self.payloads, payload)?;
        self.inner.with(py, |a| a.largest_free_extent(id))
    }

    /// Free extents `[(start, length), ...]` in address order.
    fn free_extents(
        &self,
        py: Python<'_>,
        payload: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<(u64, u64)>> {
        let id = payload_id(&self.payloads, payload)?;
        let extents = self.inner.detached(py, |a| a.free_extents(id))?;
        Ok(extents.into_iter().map(|e| (e.start, e.len)).collect())
    }

    /// Counters (reserves, misses, releases, splits, commits), live objects,
    /// and per payload: capacity, used, free, free_extents, largest_free_extent.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.inner.with(py, |a| a.stats())?;
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
    fn digest(&self, py: Python<'_>) -> PyResult<u64> {
        self.inner.with(py, |a| a.digest())
    }

    /// SHA-256 (32 bytes) of the canonical serialisation of the state.
    fn canonical_digest<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let digest = self.inner.detached(py, |a| a.canonical_digest())?;
        Ok(PyBytes::new(py, &digest))
    }

    /// Versioned binary snapshot of the state and counters.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let data = self.inner.detached(py, |a| a.snapshot())?;
        Ok(PyBytes::new(py, &data))
    }

    /// Rebuilds an allocator from `snapshot()` bytes; bad bytes raise
    /// `SnapshotError`.
    #[staticmethod]
    fn restore(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Self> {
        let bytes = snapshot_bytes(data)?;
        unshared(py, || PageAllocator::restore(&bytes))?
            .map(|alloc| Self::wrap(py, alloc))
            .map_err(alloc_error)
    }

    /// Recomputes every invariant and the digest from scratch (an audit;
    /// O(state)); raises `CpkvError` naming what is wrong.
    fn verify(&self, py: Python<'_>) -> PyResult<()> {
        self.inner
            .detached(py, |a| a.verify())?
            .map_err(CpkvError::new_err)
    }

    /// Raises `InternalError` the way a bug inside the core would (a panic),
    /// so tests can check the poison rule; the allocator is unusable afterwards.
    fn _panic_for_tests(&self, py: Python<'_>) -> PyResult<()> {
        self.inner
            .with(py, |_| panic!("cpkv: panic requested by a test"))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let pools: Vec<String> = (0..self.payloads.len())
            .map(|id| {
                format!(
                    "{:?}: {}",
                    self.payloads.name(id),
                    self.payloads.capacity(id)
                )
            })
            .collect();
        let objects = self.inner.with(py, |a| a.len())?;
        Ok(format!(
            "PageAllocator({{{}}}, objects={objects})",
            pools.join(", ")
        ))
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
    /// An index of another type is an `ArgumentTypeError`; one past either
    /// end an `IndexError`, which also ends iteration.
    fn __getitem__(&self, index: &Bound<'_, PyAny>) -> PyResult<Option<PyPlacement>> {
        let len = self.placements.len() as i128;
        let position = signed(index, "batch index")?;
        let at = position
            .map(|i| if i < 0 { i + len } else { i })
            .filter(|at| (0..len).contains(at));
        let Some(at) = at else {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "batch index {} out of range for {len} items",
                describe(index)
            )));
        };
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
