//! Python wrapper of `cpkv_tier::TierCache`, the decisions behind
//! `cpkv.CacheController`.
//!
//! Arguments follow the binding's one conversion rule (`convert`), checked
//! before the core is touched. Safe to share between threads: one lock
//! guards the core (`shared`), and results become Python objects after it
//! is released.

use cpkv_tier::{
    Backup as CoreBackup, LoadPlan as CorePlan, NodeId, TierCache as Core, TierConfig, TierStats,
};
use numpy::{PyArray1, PyArray2};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::{
    int_vector, invalid, namespace as namespace_arg, pages_array, uint, PolicyArg,
};
use crate::copy::run_table;
use crate::errors::{tier_error, CpkvError};
use crate::shared::{unshared, Shared};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<TierCache>()?;
    m.add_class::<Lookup>()?;
    m.add_class::<LoadRun>()?;
    m.add_class::<Backup>()?;
    m.add_class::<InsertOutcome>()?;
    m.add_class::<OwnedRows>()?;
    m.add_function(wrap_pyfunction!(owned_rows, m)?)?;
    Ok(())
}

/// This rank's share of a batch of pages (`owned_rows`).
#[pyclass(frozen, get_all, module = "cpkv._cpkv")]
pub(crate) struct OwnedRows {
    mask: Py<PyArray1<bool>>,
    pool_rows: Py<PyArray1<i64>>,
    slab_rows: Py<PyArray1<i64>>,
    runs: Py<PyArray2<i64>>,
}

#[pymethods]
impl OwnedRows {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "OwnedRows(pages={}, owned={}, runs={})",
            self.mask.bind(py).len().unwrap_or(0),
            self.pool_rows.bind(py).len().unwrap_or(0),
            self.runs.bind(py).len().unwrap_or(0)
        )
    }
}

/// The rows `rank` of `cp_size` copies for `pages` (logical device pages)
/// whose host copies are `slab_rows` (`cpkv_tier::owned_rows`).
#[pyfunction]
fn owned_rows(
    py: Python<'_>,
    rank: &Bound<'_, PyAny>,
    cp_size: &Bound<'_, PyAny>,
    pages: &Bound<'_, PyAny>,
    slab_rows: &Bound<'_, PyAny>,
) -> PyResult<OwnedRows> {
    let (rank, cp_size) = (uint(rank, "rank")?, uint(cp_size, "cp_size")?);
    let (pages, slab_rows) = (
        int_vector(pages, "pages")?,
        int_vector(slab_rows, "slab_rows")?,
    );
    let owned = cpkv_tier::owned_rows(rank, cp_size, &pages, &slab_rows).map_err(tier_error)?;
    Ok(OwnedRows {
        mask: PyArray1::from_vec(py, owned.mask).unbind(),
        pool_rows: pages_array(py, &owned.pool_rows),
        slab_rows: pages_array(py, &owned.slab_rows),
        runs: run_table(py, &owned.runs)?.unbind(),
    })
}

fn node_arg(obj: &Bound<'_, PyAny>) -> PyResult<NodeId> {
    uint(obj, "node").map(NodeId)
}

/// What `TierCache.lookup` found; `node` is locked when `locked`.
#[pyclass(frozen, get_all, module = "cpkv._cpkv")]
pub(crate) struct Lookup {
    device_tokens: usize,
    host_tokens: usize,
    device_pages: Py<PyArray1<i64>>,
    device_node: u64,
    node: u64,
    locked: bool,
}

#[pymethods]
impl Lookup {
    fn __repr__(&self) -> String {
        format!(
            "Lookup(device_tokens={}, host_tokens={}, node={}, locked={})",
            self.device_tokens, self.host_tokens, self.node, self.locked
        )
    }
}

/// One host-only node of a load plan: slab row `host_pages[i]` goes to
/// device page `device_pages[i]`.
#[pyclass(frozen, get_all, module = "cpkv._cpkv")]
pub(crate) struct LoadRun {
    node: u64,
    device_pages: Py<PyArray1<i64>>,
    host_pages: Py<PyArray1<i64>>,
}

#[pymethods]
impl LoadRun {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "LoadRun(node={}, pages={})",
            self.node,
            self.device_pages.bind(py).len().unwrap_or(0)
        )
    }
}

fn load_runs(py: Python<'_>, plan: CorePlan) -> Vec<LoadRun> {
    plan.runs
        .into_iter()
        .map(|r| LoadRun {
            node: r.node.0,
            device_pages: pages_array(py, &r.device_pages),
            host_pages: pages_array(py, &r.host_pages),
        })
        .collect()
}

/// A write-through backup in flight.
#[pyclass(frozen, get_all, module = "cpkv._cpkv")]
pub(crate) struct Backup {
    ticket: u64,
    node: u64,
    device_pages: Py<PyArray1<i64>>,
    host_pages: Py<PyArray1<i64>>,
}

#[pymethods]
impl Backup {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Backup(ticket={}, node={}, pages={})",
            self.ticket,
            self.node,
            self.device_pages.bind(py).len().unwrap_or(0)
        )
    }
}

fn backup(py: Python<'_>, b: CoreBackup) -> Backup {
    Backup {
        ticket: b.ticket,
        node: b.node.0,
        device_pages: pages_array(py, &b.device_pages),
        host_pages: pages_array(py, &b.host_pages),
    }
}

/// What `TierCache.insert` did.
#[pyclass(frozen, get_all, module = "cpkv._cpkv")]
pub(crate) struct InsertOutcome {
    node: u64,
    cached_pages: usize,
    freed_pages: Py<PyArray1<i64>>,
    backups: Vec<Py<Backup>>,
    skipped_pages: usize,
}

#[pymethods]
impl InsertOutcome {
    fn __repr__(&self) -> String {
        format!(
            "InsertOutcome(node={}, cached_pages={}, backups={}, skipped_pages={})",
            self.node,
            self.cached_pages,
            self.backups.len(),
            self.skipped_pages
        )
    }
}

/// The two-tier cache's decisions (pure, replicated); see `cpkv.tier`.
#[pyclass(frozen, module = "cpkv._cpkv")]
pub(crate) struct TierCache {
    core: Shared<Core>,
    /// Immutable after construction; read without the lock.
    config: TierConfig,
}

/// What `stats` reads, copied out under the lock.
struct StatsSnapshot {
    counters: TierStats,
    free_device_pages: u64,
    held_device_pages: u64,
    cached_device_pages: u64,
    host_node_pages: u64,
    free_host_pages: u64,
    pending_backups: u64,
    tree_nodes: u64,
}

#[pymethods]
impl TierCache {
    #[new]
    #[pyo3(signature = (*, page_size, cp_size, device_pages, host_pages, policy = PolicyArg::DEFAULT, host_free_target = None),
        text_signature = "(*, page_size, cp_size, device_pages, host_pages, policy='ghost', host_free_target=None)")]
    fn new(
        py: Python<'_>,
        page_size: &Bound<'_, PyAny>,
        cp_size: &Bound<'_, PyAny>,
        device_pages: &Bound<'_, PyAny>,
        host_pages: &Bound<'_, PyAny>,
        policy: PolicyArg,
        host_free_target: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let PolicyArg(policy) = policy;
        let page_size = uint(page_size, "page_size")?;
        let config = TierConfig {
            page_size: usize::try_from(page_size)
                .map_err(|_| invalid(format!("page_size = {page_size} is out of range")))?,
            cp_size: uint(cp_size, "cp_size")?,
            device_pages: uint(device_pages, "device_pages")?,
            host_pages: uint(host_pages, "host_pages")?,
            policy,
            host_free_target: host_free_target
                .map(|o| uint(o, "host_free_target"))
                .transpose()?
                .unwrap_or(0),
        };
        // Validated (every size against its one limit) before anything is built.
        let core = unshared(py, || Core::new(config))?.map_err(tier_error)?;
        Ok(Self {
            core: Shared::new(core),
            config,
        })
    }

    /// Longest cached prefix in either tier; locks the matched path.
    #[pyo3(signature = (tokens, namespace = None))]
    fn lookup(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Lookup> {
        let tokens = int_vector(tokens, "tokens")?;
        let ns = namespace_arg(namespace)?;
        let l = self.core.with(py, |c| c.lookup(&tokens, &ns))?;
        Ok(Lookup {
            device_tokens: l.device_tokens,
            host_tokens: l.host_tokens,
            device_pages: pages_array(py, &l.device_pages),
            device_node: l.device_node.0,
            node: l.node.0,
            locked: l.locked,
        })
    }

    fn unlock(&self, py: Python<'_>, node: &Bound<'_, PyAny>) -> PyResult<()> {
        let node = node_arg(node)?;
        self.core.with(py, |c| c.unlock(node))?.map_err(tier_error)
    }

    /// `n` device pages held by the caller (evicting as needed), or None.
    fn allocate(
        &self,
        py: Python<'_>,
        n: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Py<PyArray1<i64>>>> {
        let n = uint(n, "n")?;
        let capacity = self.config.device_pages;
        if n > capacity {
            return Err(invalid(format!(
                "n = {n} exceeds the device pool of {capacity} pages"
            )));
        }
        let pages = self.core.detached(py, |c| c.allocate(n))?;
        Ok(pages.map(|p| pages_array(py, &p)))
    }

    fn free(&self, py: Python<'_>, pages: &Bound<'_, PyAny>) -> PyResult<()> {
        let pages = int_vector(pages, "pages")?;
        self.core.with(py, |c| c.free(&pages))?.map_err(tier_error)
    }

    fn evict_device(&self, py: Python<'_>, num_pages: &Bound<'_, PyAny>) -> PyResult<u64> {
        let n = uint(num_pages, "num_pages")?;
        self.core.detached(py, |c| c.evict_device(n))
    }

    fn evict_host(&self, py: Python<'_>, num_pages: &Bound<'_, PyAny>) -> PyResult<u64> {
        let n = uint(num_pages, "num_pages")?;
        self.core.detached(py, |c| c.evict_host(n))
    }

    /// The load-back of a locked lookup's host-only nodes, top-down.
    fn plan_load(&self, py: Python<'_>, node: &Bound<'_, PyAny>) -> PyResult<Vec<LoadRun>> {
        let node = node_arg(node)?;
        let plan = self
            .core
            .with(py, |c| c.plan_load(node))?
            .map_err(tier_error)?;
        Ok(load_runs(py, plan))
    }

    #[pyo3(signature = (tokens, pages, namespace = None))]
    fn insert(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        pages: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<InsertOutcome> {
        let tokens = int_vector(tokens, "tokens")?;
        let pages = int_vector(pages, "pages")?;
        let ns = namespace_arg(namespace)?;
        // Host eviction on a capacity miss can run long: without the GIL.
        let out = self
            .core
            .detached(py, |c| c.insert(&tokens, &pages, &ns))?
            .map_err(tier_error)?;
        let backups = out
            .backups
            .into_iter()
            .map(|b| Py::new(py, backup(py, b)))
            .collect::<PyResult<_>>()?;
        Ok(InsertOutcome {
            node: out.node.0,
            cached_pages: out.cached_pages,
            freed_pages: pages_array(py, &out.freed_pages),
            backups,
            skipped_pages: out.skipped_pages,
        })
    }

    /// Turns spills on: host eviction then queues the pages it releases
    /// (content keys and slab rows) for `take_spills`. Changes no decision.
    fn enable_spills(&self, py: Python<'_>) -> PyResult<()> {
        self.core.with(py, |c| c.enable_spills())
    }

    /// The pages host eviction released since the last call, oldest first:
    /// one `(keys uint64, rows int64)` pair per released host object.
    #[allow(clippy::type_complexity)]
    fn take_spills(&self, py: Python<'_>) -> PyResult<Vec<(Py<PyArray1<u64>>, Py<PyArray1<i64>>)>> {
        let spilled = self.core.with(py, |c| c.take_spills())?;
        Ok(spilled
            .into_iter()
            .map(|s| {
                let rows: Vec<u64> = s.rows.iter().map(|&r| u64::from(r)).collect();
                (
                    PyArray1::from_vec(py, s.keys).unbind(),
                    pages_array(py, &rows),
                )
            })
            .collect())
    }

    /// The content key of every whole page of `tokens` (chained over the
    /// path and the namespace): what a spilled page of that path is keyed by.
    #[pyo3(signature = (tokens, namespace = None))]
    fn page_keys(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyArray1<u64>>> {
        let tokens = int_vector(tokens, "tokens")?;
        let ns = namespace_arg(namespace)?;
        let keys = cpkv_tier::page_keys(&tokens, self.config.page_size, &ns);
        Ok(PyArray1::from_vec(py, keys).unbind())
    }

    /// Commits pending backups up to `frontier`: (committed, aborted) tickets.
    fn commit(
        &self,
        py: Python<'_>,
        frontier: &Bound<'_, PyAny>,
    ) -> PyResult<(Vec<u64>, Vec<u64>)> {
        let frontier = uint(frontier, "frontier")?;
        let out = self
            .core
            .with(py, |c| c.commit(frontier))?
            .map_err(tier_error)?;
        Ok((out.committed, out.aborted))
    }

    fn abort_pending(&self, py: Python<'_>) -> PyResult<Vec<u64>> {
        self.core.with(py, |c| c.abort_pending())
    }

    fn host_rows(&self, py: Python<'_>, node: &Bound<'_, PyAny>) -> PyResult<Py<PyArray1<i64>>> {
        let node = node_arg(node)?;
        let rows = self
            .core
            .with(py, |c| c.host_rows(node))?
            .map_err(tier_error)?;
        Ok(pages_array(py, &rows))
    }

    fn pending_tickets(&self, py: Python<'_>) -> PyResult<Vec<u64>> {
        self.core.with(py, |c| c.pending_tickets())
    }

    fn digest(&self, py: Python<'_>) -> PyResult<u64> {
        self.core.with(py, |c| c.digest())
    }

    fn digest_from_scratch(&self, py: Python<'_>) -> PyResult<u64> {
        self.core.detached(py, |c| c.digest_from_scratch())
    }

    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.core
            .detached(py, |c| c.check_invariants())?
            .map_err(CpkvError::new_err)
    }

    /// Raises `InternalError` the way a bug inside the core would (a panic),
    /// so tests can check the poison rule; the object is unusable afterwards.
    fn _panic_for_tests(&self, py: Python<'_>) -> PyResult<()> {
        self.core
            .with(py, |_| panic!("cpkv: panic requested by a test"))
    }

    /// Counters (replicated, not part of the digest).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.core.with(py, |c| StatsSnapshot {
            counters: c.stats(),
            free_device_pages: c.device().free_pages(),
            held_device_pages: c.device().held_pages(),
            cached_device_pages: c.tree().device_pages() as u64,
            host_node_pages: c.tree().host_pages() as u64,
            free_host_pages: c.free_host_pages(),
            pending_backups: c.pending_tickets().len() as u64,
            tree_nodes: c.tree().len() as u64,
        })?;
        let (c, d) = (s.counters, PyDict::new(py));
        for (name, value) in [
            ("lookups", c.lookups),
            ("lookup_tokens", c.lookup_tokens),
            ("device_hit_tokens", c.device_hit_tokens),
            ("host_hit_tokens", c.host_hit_tokens),
            ("allocations", c.allocations),
            ("allocation_misses", c.allocation_misses),
            ("device_victims", c.device_victims),
            ("device_evicted_pages", c.device_evicted_pages),
            ("demoted_to_host", c.demoted_to_host),
            ("host_victims", c.host_victims),
            ("host_evicted_pages", c.host_evicted_pages),
            ("loads", c.loads),
            ("load_misses", c.load_misses),
            ("loaded_pages", c.loaded_pages),
            ("backups_reserved", c.backups_reserved),
            ("backup_pages", c.backup_pages),
            ("backups_committed", c.backups_committed),
            ("backups_aborted", c.backups_aborted),
            ("backups_skipped", c.backups_skipped),
            ("skipped_pages", c.skipped_pages),
            ("admission_evictions", c.admission_evictions),
            ("commits", c.commits),
            ("free_device_pages", s.free_device_pages),
            ("held_device_pages", s.held_device_pages),
            ("cached_device_pages", s.cached_device_pages),
            ("host_node_pages", s.host_node_pages),
            ("free_host_pages", s.free_host_pages),
            ("pending_backups", s.pending_backups),
            ("tree_nodes", s.tree_nodes),
        ] {
            d.set_item(name, value)?;
        }
        Ok(d)
    }

    /// The prefix tree's logical clock.
    #[getter]
    fn clock(&self, py: Python<'_>) -> PyResult<u64> {
        self.core.with(py, |c| c.tree().clock())
    }
    #[getter]
    fn issued(&self, py: Python<'_>) -> PyResult<u64> {
        self.core.with(py, |c| c.issued())
    }
    #[getter]
    fn committed_through(&self, py: Python<'_>) -> PyResult<u64> {
        self.core.with(py, |c| c.committed_through())
    }
    #[getter]
    fn page_size(&self) -> usize {
        self.config.page_size
    }
    #[getter]
    fn cp_size(&self) -> u64 {
        self.config.cp_size
    }
    #[getter]
    fn device_pages(&self) -> u64 {
        self.config.device_pages
    }
    #[getter]
    fn host_pages(&self) -> u64 {
        self.config.host_pages
    }
    #[getter]
    fn policy(&self) -> &'static str {
        self.config.policy.name()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let c = &self.config;
        let digest = self.core.with(py, |core| core.digest())?;
        Ok(format!(
            "TierCache(page_size={}, cp_size={}, device_pages={}, host_pages={}, policy={:?}, digest={:#018x})",
            c.page_size,
            c.cp_size,
            c.device_pages,
            c.host_pages,
            c.policy.name(),
            digest
        ))
    }
}
