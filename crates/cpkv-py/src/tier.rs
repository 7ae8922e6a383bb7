//! Python wrapper of `cpkv_tier::TierCache`, the decisions behind
//! `cpkv.CacheController`.
//!
//! Integers are taken as Python objects and checked here (no bools, no
//! floats, no negatives, no overflow) so a bad argument is always an
//! `InvalidArgumentError` naming it, and the core never sees it.

use cpkv_tier::{
    Backup as CoreBackup, LoadPlan as CorePlan, NodeId, Policy, TierCache as Core, TierConfig,
    TierError,
};
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::{int_vector, invalid, namespace as namespace_arg, pages_array, uint};
use crate::errors::{alloc_error, cpkv_error, evict_error};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<TierCache>()?;
    m.add_class::<Lookup>()?;
    m.add_class::<LoadRun>()?;
    m.add_class::<Backup>()?;
    m.add_class::<InsertOutcome>()?;
    Ok(())
}

pub(crate) fn tier_error(err: TierError) -> PyErr {
    let class = match &err {
        TierError::Tree(e) => return evict_error(e.clone()),
        TierError::Host(e) => return alloc_error(e.clone()),
        TierError::NotLocked(_) => "LockError",
        TierError::Divergence(_) => "DivergenceError",
        TierError::Config { .. }
        | TierError::PageOutOfRange { .. }
        | TierError::PageNotHeld { .. }
        | TierError::RepeatedPage { .. }
        | TierError::FutureTicket { .. }
        | TierError::BadKey { .. } => "InvalidArgumentError",
    };
    cpkv_error(class, err.to_string())
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
#[pyclass(module = "cpkv._cpkv")]
pub(crate) struct TierCache {
    core: Core,
}

#[pymethods]
impl TierCache {
    #[new]
    #[pyo3(signature = (*, page_size, cp_size, device_pages, host_pages, policy = cpkv_evict::Policy::DEFAULT_NAME, host_free_target = None))]
    fn new(
        page_size: &Bound<'_, PyAny>,
        cp_size: &Bound<'_, PyAny>,
        device_pages: &Bound<'_, PyAny>,
        host_pages: &Bound<'_, PyAny>,
        policy: &str,
        host_free_target: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let policy: Policy = policy.parse().map_err(evict_error)?;
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
        Ok(Self {
            core: Core::new(config).map_err(tier_error)?,
        })
    }

    /// Longest cached prefix in either tier; locks the matched path.
    #[pyo3(signature = (tokens, namespace = None))]
    fn lookup(
        &mut self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Lookup> {
        let tokens = int_vector(tokens, "tokens")?;
        let ns = namespace_arg(namespace)?;
        let l = self.core.lookup(&tokens, &ns);
        Ok(Lookup {
            device_tokens: l.device_tokens,
            host_tokens: l.host_tokens,
            device_pages: pages_array(py, &l.device_pages),
            device_node: l.device_node.0,
            node: l.node.0,
            locked: l.locked,
        })
    }

    fn unlock(&mut self, node: &Bound<'_, PyAny>) -> PyResult<()> {
        self.core.unlock(node_arg(node)?).map_err(tier_error)
    }

    /// `n` device pages held by the caller (evicting as needed), or None.
    fn allocate(
        &mut self,
        py: Python<'_>,
        n: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Py<PyArray1<i64>>>> {
        let n = uint(n, "n")?;
        if n > self.core.device().capacity() {
            return Err(invalid(format!(
                "n = {n} exceeds the device pool of {} pages",
                self.core.device().capacity()
            )));
        }
        Ok(self.core.allocate(n).map(|p| pages_array(py, &p)))
    }

    fn free(&mut self, pages: &Bound<'_, PyAny>) -> PyResult<()> {
        let pages = int_vector(pages, "pages")?;
        self.core.free(&pages).map_err(tier_error)
    }

    fn evict_device(&mut self, num_pages: &Bound<'_, PyAny>) -> PyResult<u64> {
        Ok(self.core.evict_device(uint(num_pages, "num_pages")?))
    }

    fn evict_host(&mut self, num_pages: &Bound<'_, PyAny>) -> PyResult<u64> {
        Ok(self.core.evict_host(uint(num_pages, "num_pages")?))
    }

    /// The load-back of a locked lookup's host-only nodes, top-down.
    fn plan_load(&mut self, py: Python<'_>, node: &Bound<'_, PyAny>) -> PyResult<Vec<LoadRun>> {
        let plan = self.core.plan_load(node_arg(node)?).map_err(tier_error)?;
        Ok(load_runs(py, plan))
    }

    #[pyo3(signature = (tokens, pages, namespace = None))]
    fn insert(
        &mut self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        pages: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<InsertOutcome> {
        let tokens = int_vector(tokens, "tokens")?;
        let pages = int_vector(pages, "pages")?;
        let ns = namespace_arg(namespace)?;
        let out = self.core.insert(&tokens, &pages, &ns).map_err(tier_error)?;
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

    /// Commits pending backups up to `frontier`: (committed, aborted) tickets.
    fn commit(&mut self, frontier: &Bound<'_, PyAny>) -> PyResult<(Vec<u64>, Vec<u64>)> {
        let out = self
            .core
            .commit(uint(frontier, "frontier")?)
            .map_err(tier_error)?;
        Ok((out.committed, out.aborted))
    }

    fn abort_pending(&mut self) -> Vec<u64> {
        self.core.abort_pending()
    }

    fn host_rows(&self, py: Python<'_>, node: &Bound<'_, PyAny>) -> PyResult<Py<PyArray1<i64>>> {
        let rows = self.core.host_rows(node_arg(node)?).map_err(tier_error)?;
        Ok(pages_array(py, &rows))
    }

    fn pending_tickets(&self) -> Vec<u64> {
        self.core.pending_tickets()
    }

    fn take_events(&mut self) -> usize {
        self.core.take_events()
    }

    fn digest(&self) -> u64 {
        self.core.digest()
    }

    fn digest_from_scratch(&self) -> u64 {
        self.core.digest_from_scratch()
    }

    fn check_invariants(&self) -> PyResult<()> {
        self.core
            .check_invariants()
            .map_err(|why| cpkv_error("CpkvError", why))
    }

    /// Counters (replicated, not part of the digest).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.core.stats();
        let d = PyDict::new(py);
        for (name, value) in [
            ("lookups", s.lookups),
            ("lookup_tokens", s.lookup_tokens),
            ("device_hit_tokens", s.device_hit_tokens),
            ("host_hit_tokens", s.host_hit_tokens),
            ("allocations", s.allocations),
            ("allocation_misses", s.allocation_misses),
            ("device_victims", s.device_victims),
            ("device_evicted_pages", s.device_evicted_pages),
            ("demoted_to_host", s.demoted_to_host),
            ("host_victims", s.host_victims),
            ("host_evicted_pages", s.host_evicted_pages),
            ("loads", s.loads),
            ("load_misses", s.load_misses),
            ("loaded_pages", s.loaded_pages),
            ("backups_reserved", s.backups_reserved),
            ("backup_pages", s.backup_pages),
            ("backups_committed", s.backups_committed),
            ("backups_aborted", s.backups_aborted),
            ("backups_skipped", s.backups_skipped),
            ("skipped_pages", s.skipped_pages),
            ("admission_evictions", s.admission_evictions),
            ("commits", s.commits),
            ("free_device_pages", self.core.device().free_pages()),
            ("held_device_pages", self.core.device().held_pages()),
            (
                "cached_device_pages",
                self.core.tree().device_pages() as u64,
            ),
            ("host_node_pages", self.core.tree().host_pages() as u64),
            ("free_host_pages", self.core.free_host_pages()),
            ("pending_backups", self.core.pending_tickets().len() as u64),
            ("tree_nodes", self.core.tree().len() as u64),
        ] {
            d.set_item(name, value)?;
        }
        Ok(d)
    }

    /// The prefix tree's logical clock.
    #[getter]
    fn clock(&self) -> u64 {
        self.core.tree().clock()
    }
    #[getter]
    fn issued(&self) -> u64 {
        self.core.issued()
    }
    #[getter]
    fn committed_through(&self) -> u64 {
        self.core.committed_through()
    }
    #[getter]
    fn page_size(&self) -> usize {
        self.core.config().page_size
    }
    #[getter]
    fn cp_size(&self) -> u64 {
        self.core.config().cp_size
    }
    #[getter]
    fn device_pages(&self) -> u64 {
        self.core.config().device_pages
    }
    #[getter]
    fn host_pages(&self) -> u64 {
        self.core.config().host_pages
    }
    #[getter]
    fn policy(&self) -> &'static str {
        self.core.config().policy.name()
    }

    fn __repr__(&self) -> String {
        let c = self.core.config();
        format!(
            "TierCache(page_size={}, cp_size={}, device_pages={}, host_pages={}, policy={:?}, digest={:#018x})",
            c.page_size,
            c.cp_size,
            c.device_pages,
            c.host_pages,
            c.policy.name(),
            self.core.digest()
        )
    }
}
