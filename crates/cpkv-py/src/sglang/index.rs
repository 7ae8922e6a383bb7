//! `SglangIndex`: the SGLang backend's replicated index (`cpkv_tier::
//! OffloadIndex`, through its public methods) and its batch calls, each one
//! native call per SGLang call: checks and index work here, key tags,
//! stamps and copies by `cpkv_slab`'s seqlock sequences.
//!
//! - `store_pages` (`batch_set`): every page's host range checked first (a
//!   refused call changes nothing), one index store, then the pages this rank
//!   writes (its rows, not already there) marked invalid, copied without the
//!   GIL, and published (tag, then stamp).
//! - `read_pages` (`batch_get`): host ranges checked, keys located, each row
//!   read only while it carries the handle and key tag this rank's index
//!   expects, and checked again after the copy: a row overwritten under the
//!   reader, or one whose tag differs (a rank whose index diverged), is a miss,
//!   never wrong bytes.
//! - `held` / `present` (`batch_exists`): the same row check, no copy.
//!
//! Keys are SGLang's strings (a `str` is its UTF-8 bytes then group 0's four
//! bytes, as `OffloadIndex` reads it) or `bytes`. A key's tag is
//! `cpkv_slab::key_tag` of those bytes, the same in every process.

use std::sync::atomic::{AtomicU64, Ordering};

use cpkv_slab::rows::{copy_victims, unwritten};
use cpkv_slab::{key_tag, PageLayout, PoolMemory, RowWrite};
use cpkv_tier::{
    push_text_key, Evicted, OffloadIndex as Core, Placed, GROUP_BYTES, MAX_KEYS_PER_CALL,
};
use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use super::pool::SglangPool;
use crate::convert::{describe, invalid, is_numpy_text, ordered_iter, uint, wrong_type, PolicyArg};
use crate::errors::{tier_error, DivergenceError, InternalError};
use crate::shared::{unshared, Shared};

/// Rows of `columns` int64 values as a 2-D array.
fn table(py: Python<'_>, flat: Vec<i64>, columns: usize) -> PyResult<Bound<'_, PyArray2<i64>>> {
    let n = flat.len() / columns;
    PyArray1::from_vec(py, flat).reshape([n, columns])
}

/// (row, serial) as int64: rows are below 2**31, serials count from 1 and
/// never reach 2**63.
fn placed_words(p: Placed) -> [i64; 2] {
    [i64::from(p.row), p.serial as i64]
}

/// A call's keys, packed in one buffer.
struct Keys {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Keys {
    fn of(keys: &Bound<'_, PyAny>) -> PyResult<Self> {
        let not_keys = || {
            format!(
                "keys must be an ordered collection (a list or tuple) of str or bytes keys, got {}",
                describe(keys)
            )
        };
        let mut out = Keys {
            bytes: Vec::new(),
            ends: Vec::new(),
        };
        if let Ok(list) = keys.cast::<PyList>() {
            out.reserve(list.len())?;
            for (i, item) in list.iter().enumerate() {
                out.push(&item, i)?;
            }
        } else if let Ok(tuple) = keys.cast::<PyTuple>() {
            out.reserve(tuple.len())?;
            for (i, item) in tuple.iter().enumerate() {
                out.push(&item, i)?;
            }
        } else {
            for (i, item) in ordered_iter(keys, not_keys)?.enumerate() {
                if i >= MAX_KEYS_PER_CALL {
                    return Err(invalid(format!("keys: more than {MAX_KEYS_PER_CALL} keys")));
                }
                out.push(&item?, i)?;
            }
        }
        Core::check_keys(&out.slices()).map_err(tier_error)?;
        Ok(out)
    }

    fn reserve(&mut self, n: usize) -> PyResult<()> {
        if n > MAX_KEYS_PER_CALL {
            return Err(invalid(format!(
                "keys: {n} is more than {MAX_KEYS_PER_CALL} keys"
            )));
        }
        self.ends.reserve(n);
        self.bytes.reserve(n * (64 + GROUP_BYTES));
        Ok(())
    }

    /// One key: a `str` as its UTF-8 bytes then group 0's four bytes;
    /// `bytes` as they are; numpy's text scalars refused (they drop trailing
    /// NUL bytes).
    fn push(&mut self, item: &Bound<'_, PyAny>, i: usize) -> PyResult<()> {
        if let Ok(text) = item.cast::<PyString>() {
            if !item.is_exact_instance_of::<PyString>() && is_numpy_text(item) {
                return Err(wrong_type(format!(
                    "keys[{i}] is a numpy str_ scalar, which has lost the key's trailing NUL bytes; pass str"
                )));
            }
            let text = text.to_str().map_err(|_| {
                invalid(format!(
                    "keys[{i}] is a str that is not valid UTF-8: {}",
                    describe(item)
                ))
            })?;
            push_text_key(&mut self.bytes, text);
        } else if let Ok(b) = item.cast::<PyBytes>() {
            if !item.is_exact_instance_of::<PyBytes>() && is_numpy_text(item) {
                return Err(wrong_type(format!(
                    "keys[{i}] is a numpy bytes_ scalar, which has lost the key's trailing NUL bytes; pass bytes"
                )));
            }
            self.bytes.extend_from_slice(b.as_bytes());
        } else {
            return Err(wrong_type(format!(
                "keys[{i}] must be str or bytes, got {}",
                describe(item)
            )));
        }
        self.ends.push(self.bytes.len());
        Ok(())
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }

    fn slices(&self) -> Vec<&[u8]> {
        (0..self.len()).map(|i| self.get(i)).collect()
    }

    fn tag(&self, i: usize) -> i64 {
        key_tag(self.get(i))
    }
}

/// A single key (the prefix).
fn one_key(key: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let mut keys = Keys {
        bytes: Vec::new(),
        ends: Vec::new(),
    };
    keys.push(key, 0)
        .map_err(|e| wrong_type(format!("prefix: {}", e.value(key.py()))))?;
    Core::check_keys(&keys.slices()).map_err(tier_error)?;
    Ok(keys.bytes)
}

fn internal(message: String) -> PyErr {
    InternalError::new_err(message)
}

/// A store's placements, and its victims with the row each held.
type Stored = (Vec<Option<Placed>>, Vec<Evicted>);

/// What a spilling store hands the L3 tier: every victim's key and row, in
/// eviction order (the same on every rank), whether this rank copied its
/// page out of every spilled pool, and per pool (in the order given) those
/// pages.
type Spilled<'py> = (
    Bound<'py, PyList>,
    Vec<u32>,
    Vec<bool>,
    Vec<Bound<'py, PyArray2<u8>>>,
);

/// A pool whose victims leave the slab, and its memory while it is open.
type SpillSide<'a> = (&'a PageLayout, &'a PoolMemory);

#[pyclass(frozen, name = "SglangIndex", module = "cpkv._cpkv")]
pub(crate) struct SglangIndex {
    core: Shared<Core>,
    /// Store calls so far (the backend's digest-check cadence).
    stores: AtomicU64,
}

impl SglangIndex {
    fn store_core(
        &self,
        py: Python<'_>,
        keys: &Keys,
        prefix: Option<&[u8]>,
    ) -> PyResult<Vec<Option<Placed>>> {
        Ok(self.store_evicting(py, keys, prefix)?.0)
    }

    /// One index store and the keys it evicted, each with its row.
    fn store_evicting(
        &self,
        py: Python<'_>,
        keys: &Keys,
        prefix: Option<&[u8]>,
    ) -> PyResult<Stored> {
        let refs = keys.slices();
        let stored = self
            .core
            .with(py, |c| c.store_evicting(&refs, prefix))?
            .map_err(tier_error)?;
        self.stores.fetch_add(1, Ordering::Relaxed);
        Ok(stored)
    }

    /// (position, placement) of each readable key, in key order (the core
    /// finds a batch's keys in passes, their cache misses overlapping).
    fn locate_core(&self, py: Python<'_>, keys: &Keys) -> PyResult<Vec<(usize, Placed)>> {
        let refs = keys.slices();
        let found = self.core.with(py, |c| c.locate_many(&refs))?;
        Ok(found
            .into_iter()
            .enumerate()
            .filter_map(|(i, p)| p.map(|p| (i, p)))
            .collect())
    }

    /// Whether each key's page is in the pool's slab now.
    fn held_keys(
        &self,
        py: Python<'_>,
        keys: &Keys,
        pool: &SglangPool,
        stop_at_miss: bool,
    ) -> PyResult<Vec<bool>> {
        let found = self.locate_core(py, keys)?;
        let guard = pool.open(py)?;
        let stamps = guard.as_ref().expect("open").stamps();
        stamps.prefetch_rows(found.iter().map(|(_, p)| u64::from(p.row)));
        let mut held = vec![false; keys.len()];
        for (i, p) in found {
            if stop_at_miss && i > 0 && !held[i - 1] {
                break;
            }
            held[i] = stamps
                .holds(u64::from(p.row), p.serial as i64, keys.tag(i))
                .map_err(internal)?;
        }
        Ok(held)
    }
}

impl SglangIndex {
    /// The victims as a spill out of every pool of `sides` (see
    /// `cpkv_slab::rows::copy_victims`: a page leaves for L3 whole, every
    /// pool's bytes, or not at all; the pools share the index, so a row has
    /// one writer in all of them).
    fn spill_victims<'py>(
        py: Python<'py>,
        sides: &[SpillSide<'_>],
        evicted: &[(Box<[u8]>, u32)],
        node_size: u64,
        local_rank: u64,
    ) -> PyResult<Spilled<'py>> {
        let rows: Vec<u32> = evicted.iter().map(|&(_, row)| row).collect();
        let mut data: Vec<Vec<u8>> = sides
            .iter()
            .map(|(layout, _)| vec![0u8; evicted.len() * layout.page_bytes() as usize])
            .collect();
        let copied = unshared(py, || {
            let tags: Vec<i64> = evicted.iter().map(|(key, _)| key_tag(key)).collect();
            let rows: Vec<u64> = rows.iter().map(|&r| u64::from(r)).collect();
            copy_victims(sides, &rows, &tags, node_size, local_rank, &mut data)
        })?
        .map_err(internal)?;
        let keys = PyList::new(py, evicted.iter().map(|(k, _)| PyBytes::new(py, k)))?;
        let pages = sides
            .iter()
            .zip(data)
            .map(|((layout, _), d)| {
                PyArray1::from_vec(py, d).reshape([evicted.len(), layout.page_bytes() as usize])
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok((keys, rows, copied, pages))
    }

    /// The pools a spill copies from, each given once.
    fn spill_pools<'a, 'py>(spill: &'a [Bound<'py, SglangPool>]) -> PyResult<Vec<&'a SglangPool>> {
        if spill.is_empty() {
            return Err(invalid(
                "spill: name at least one pool whose victims leave the slab".to_string(),
            ));
        }
        let pools: Vec<&SglangPool> = spill.iter().map(Bound::get).collect();
        for (i, p) in pools.iter().enumerate() {
            if pools[..i].iter().any(|q| std::ptr::eq(*q, *p)) {
                return Err(invalid(format!(
                    "spill: pool '{}' is given twice",
                    p.name()
                )));
            }
        }
        Ok(pools)
    }
}

#[pymethods]
impl SglangIndex {
    /// The most rows an index takes (rows are int32).
    #[classattr]
    const MAX_ROWS: u64 = cpkv_tier::MAX_OFFLOAD_ROWS;

    #[new]
    fn new(py: Python<'_>, rows: &Bound<'_, PyAny>, policy: PolicyArg) -> PyResult<Self> {
        let rows = uint(rows, "rows")?;
        // One token per position: a store numbers its pages 1, 2, ... after its prefix's 0.
        let core = unshared(py, || Core::new(rows, policy.0, vec![1]))?.map_err(tier_error)?;
        Ok(Self {
            core: Shared::new(core),
            stores: AtomicU64::new(0),
        })
    }

    /// One store call, no bytes: int64 `[n, 2]`, each key's (row, handle),
    /// (-1, 0) where refused.
    #[pyo3(signature = (keys, prefix = None))]
    fn store<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        prefix: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray2<i64>>> {
        let keys = Keys::of(keys)?;
        let prefix = prefix.filter(|p| !p.is_none()).map(one_key).transpose()?;
        let placed = self.store_core(py, &keys, prefix.as_deref())?;
        let flat = placed
            .into_iter()
            .flat_map(|p| p.map_or([-1, 0], placed_words))
            .collect();
        table(py, flat, 2)
    }

    /// One SGLang store call with its bytes (see the module docs): each key
    /// placed (list of bool), the pages this rank copied, and with `spill`
    /// (the pools whose victims leave the slab: every pool sharing this
    /// index) the victims (`Spilled`: keys, rows, copied, pages per pool),
    /// else `None`. `node_size`, `local_rank`: this rank writes the rows `row
    /// % node_size == local_rank` of every pool, and so is the only rank that
    /// overwrites them: it copies each victim of its rows out of every pool
    /// (while the rows still carry the victim's key tag) before any byte of
    /// the call is written. The other pools' rows are overwritten by this
    /// rank's later stores of the same keys, so this is their last chance.
    #[pyo3(signature = (keys, prefix, pool, host_indices, node_size, local_rank, spill = None))]
    #[allow(clippy::too_many_arguments)] // SGLang's call and where this rank writes
    fn store_pages<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        prefix: Option<&Bound<'py, PyAny>>,
        pool: &Bound<'py, SglangPool>,
        host_indices: &Bound<'py, PyAny>,
        node_size: u64,
        local_rank: u64,
        spill: Option<Vec<Bound<'py, SglangPool>>>,
    ) -> PyResult<(Bound<'py, PyList>, usize, Option<Spilled<'py>>)> {
        if node_size == 0 || local_rank >= node_size {
            return Err(invalid(format!(
                "local_rank {local_rank} is not a rank of a node of {node_size}"
            )));
        }
        let keys = Keys::of(keys)?;
        let prefix = prefix.filter(|p| !p.is_none()).map(one_key).transpose()?;
        let pool = pool.get();
        let spill_pools = spill.as_deref().map(Self::spill_pools).transpose()?;
        // Checked before the index stores anything: a refused call changes nothing.
        let pages = pool.host_pages(py, host_indices, keys.len())?;
        let (placed, evicted) = self.store_evicting(py, &keys, prefix.as_deref())?;
        let stored = PyList::new(py, placed.iter().map(Option::is_some))?;
        let guard = pool.open(py)?;
        let memory = guard.as_ref().expect("open");
        let spilled = match spill_pools {
            Some(pools) => {
                // The stored pool's memory is open already (its read lock is not taken twice).
                let others = pools
                    .iter()
                    .map(|p| {
                        if std::ptr::eq(*p, pool) {
                            Ok(None)
                        } else {
                            p.open(py).map(Some)
                        }
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                let sides: Vec<SpillSide<'_>> = pools
                    .iter()
                    .zip(&others)
                    .map(|(p, g)| {
                        (
                            p.layout(),
                            g.as_ref().map_or(memory, |g| g.as_ref().expect("open")),
                        )
                    })
                    .collect();
                Some(Self::spill_victims(
                    py, &sides, &evicted, node_size, local_rank,
                )?)
            }
            None => None,
        };
        // This rank's rows, less those written already (a page stored again).
        let mine = placed.iter().enumerate().filter_map(|(position, p)| {
            let p = p.as_ref()?;
            let row = u64::from(p.row);
            (row % node_size == local_rank).then(|| {
                let (handle, tag) = (p.serial as i64, keys.tag(position));
                (position, RowWrite { row, handle, tag })
            })
        });
        let stamps = memory.stamps();
        let (positions, writes): (Vec<usize>, Vec<RowWrite>) = unwritten(stamps, mine.collect())
            .map_err(internal)?
            .into_iter()
            .unzip();
        if writes.is_empty() {
            return Ok((stored, 0, spilled));
        }
        stamps.begin_writes(&writes).map_err(internal)?;
        pool.run_write_hook(py)?;
        let layout = pool.layout();
        unshared(py, || {
            layout.write_pages(memory, &pages, &positions, &writes)
        })?
        .map_err(internal)?;
        Ok((stored, writes.len(), spilled))
    }

    /// Every resident key's page as a spill (`Spilled`, in placement order,
    /// the same on every rank) out of `pools` (every pool sharing this
    /// index), for a clean stop that leaves the whole slab in L3. Changes
    /// nothing.
    fn spill_resident<'py>(
        &self,
        py: Python<'py>,
        pools: Vec<Bound<'py, SglangPool>>,
        node_size: u64,
        local_rank: u64,
    ) -> PyResult<Spilled<'py>> {
        if node_size == 0 || local_rank >= node_size {
            return Err(invalid(format!(
                "local_rank {local_rank} is not a rank of a node of {node_size}"
            )));
        }
        let resident: Vec<(Box<[u8]>, u32)> = self.core.with(py, |c| {
            c.resident_keys()
                .into_iter()
                .filter_map(|k| c.locate(&k).map(|p| (k, p.row)))
                .collect()
        })?;
        let pools = Self::spill_pools(&pools)?;
        let guards = pools
            .iter()
            .map(|p| p.open(py))
            .collect::<PyResult<Vec<_>>>()?;
        let sides: Vec<SpillSide<'_>> = pools
            .iter()
            .zip(&guards)
            .map(|(p, g)| (p.layout(), g.as_ref().expect("open")))
            .collect();
        Self::spill_victims(py, &sides, &resident, node_size, local_rank)
    }

    /// One SGLang read call (see the module docs): each key's page read into
    /// the host pool (list of bool), pages read, and reads refused because
    /// the row changed under the copy.
    fn read_pages<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        pool: &Bound<'py, SglangPool>,
        host_indices: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyList>, usize, usize)> {
        let keys = Keys::of(keys)?;
        let pool = pool.get();
        let pages = pool.host_pages(py, host_indices, keys.len())?;
        let found = self.locate_core(py, &keys)?;
        let guard = pool.open(py)?;
        let memory = guard.as_ref().expect("open");
        let layout = pool.layout();
        let (served, copied) = unshared(py, || {
            let found: Vec<(usize, u64, i64)> = found
                .iter()
                .map(|&(i, p)| (i, u64::from(p.row), p.serial as i64))
                .collect();
            layout.read_pages(memory, &pages, &found, |i| keys.tag(i))
        })?
        .map_err(internal)?;
        let mut ok = vec![false; keys.len()];
        for i in served {
            ok[i] = true;
        }
        let good = ok.iter().filter(|&&b| b).count();
        Ok((PyList::new(py, ok)?, good, copied - good))
    }

    /// Whether each key's page is in the pool's slab now (list of bool).
    fn held<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        pool: &Bound<'py, SglangPool>,
    ) -> PyResult<Bound<'py, PyList>> {
        let keys = Keys::of(keys)?;
        let held = self.held_keys(py, &keys, pool.get(), false)?;
        PyList::new(py, held)
    }

    /// The length of the leading run of keys whose page is in the pool's slab.
    fn present(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        pool: &Bound<'_, SglangPool>,
    ) -> PyResult<usize> {
        let keys = Keys::of(keys)?;
        let held = self.held_keys(py, &keys, pool.get(), true)?;
        Ok(held.iter().take_while(|&&h| h).count())
    }

    /// int64 `[m, 3]`: (index into `keys`, row, handle) of each readable
    /// key, in key order; changes nothing.
    fn locate<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray2<i64>>> {
        let keys = Keys::of(keys)?;
        let found = self.locate_core(py, &keys)?;
        let flat = found
            .into_iter()
            .flat_map(|(i, p)| {
                let [row, serial] = placed_words(p);
                [i as i64, row, serial]
            })
            .collect();
        table(py, flat, 3)
    }

    /// int64 `[m, 2]`: (row, handle) of every readable key, in the order
    /// they were placed.
    fn readable<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<i64>>> {
        let placed = self.core.detached(py, |c| c.readable())?;
        table(py, placed.into_iter().flat_map(placed_words).collect(), 2)
    }

    /// int64 tag of each key (what a written row carries next to its stamp).
    #[staticmethod]
    fn key_tags<'py>(
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let keys = Keys::of(keys)?;
        Ok(PyArray1::from_vec(
            py,
            (0..keys.len()).map(|i| keys.tag(i)).collect(),
        ))
    }

    /// Drops every key; handles keep counting.
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        self.core.with(py, |c| c.reset())?.map_err(tier_error)
    }

    fn digest(&self, py: Python<'_>) -> PyResult<u64> {
        self.core.with(py, |c| c.digest())
    }

    /// Audit; a `DivergenceError` names the first disagreement.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.core
            .detached(py, |c| c.check())?
            .map_err(DivergenceError::new_err)
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.core.with(py, |c| c.len())
    }

    #[getter]
    fn stores(&self) -> u64 {
        self.stores.load(Ordering::Relaxed)
    }

    #[getter]
    fn policy(&self, py: Python<'_>) -> PyResult<&'static str> {
        self.core.with(py, |c| c.policy().name())
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.core.with(py, |c| c.stats())?;
        let d = PyDict::new(py);
        d.set_item("capacity", s.capacity)?;
        d.set_item("resident", s.resident)?;
        d.set_item("ready", s.ready)?;
        d.set_item("evicted", s.evicted)?;
        Ok(d)
    }
}
