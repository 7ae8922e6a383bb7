//! Python wrapper of `cpkv_evict::PrefixTree`.
//!
//! Arguments are validated here into exact Rust types (1-D integer tokens
//! and pages, non-negative counts and ids) before the core sees them, so a
//! rejected call raises a typed `cpkv.errors` class and changes nothing.

use cpkv_evict::{Event, NodeId, Policy, PrefixTree as Core, Sampling};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::convert::{
    count, int_vector, invalid, namespace, pages_array, snapshot_bytes, uint, PolicyArg,
};
use crate::errors::{evict_error, UnknownNodeError};
use crate::shared::{unshared, Shared};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PrefixTree>()?;
    m.add_class::<MatchResult>()?;
    m.add_class::<InsertResult>()?;
    m.add_class::<DeviceVictim>()?;
    m.add_class::<HostVictim>()?;
    m.add_class::<TreeEvent>()?;
    Ok(())
}

/// A node id: any int in [0, 2**64) (one that names no node is the core's
/// `UnknownNodeError`); a negative int names no node either.
fn node_id(value: &Bound<'_, PyAny>) -> PyResult<NodeId> {
    match uint(value, "node") {
        Ok(id) => Ok(NodeId(id)),
        Err(err) => match value.extract::<i128>() {
            Ok(negative) if negative < 0 => Err(UnknownNodeError::new_err(format!(
                "unknown node {negative} (negative id)"
            ))),
            _ => Err(err),
        },
    }
}

/// What `PrefixTree.match` found.
#[pyclass(frozen, get_all, module = "cpkv._cpkv")]
pub(crate) struct MatchResult {
    length: usize,
    device_pages: Py<PyArray1<i64>>,
    host_length: usize,
    node: u64,
    host_node: u64,
}

#[pymethods]
impl MatchResult {
    fn __repr__(&self) -> String {
        format!(
            "MatchResult(length={}, host_length={}, node={}, host_node={})",
            self.length, self.host_length, self.node, self.host_node
        )
    }
}

/// What `PrefixTree.insert` did.
#[pyclass(frozen, get_all, module = "cpkv._cpkv")]
pub(crate) struct InsertResult {
    node: u64,
    cached: usize,
}

#[pymethods]
impl InsertResult {
    fn __repr__(&self) -> String {
        format!("InsertResult(node={}, cached={})", self.node, self.cached)
    }
}

/// A node whose device pages `evict` freed.
#[pyclass(frozen, get_all, module = "cpkv._cpkv")]
pub(crate) struct DeviceVictim {
    node: u64,
    pages: Py<PyArray1<i64>>,
}

#[pymethods]
impl DeviceVictim {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "DeviceVictim(node={}, pages={})",
            self.node,
            self.pages.bind(py)
        )
    }
}

/// A host-only node `evict_host` dropped; release `object_key` when `released`.
#[pyclass(frozen, get_all, module = "cpkv._cpkv")]
pub(crate) struct HostVictim {
    node: u64,
    object_key: u64,
    num_pages: usize,
    released: bool,
}

#[pymethods]
impl HostVictim {
    fn __repr__(&self) -> String {
        format!(
            "HostVictim(node={}, object_key={}, num_pages={}, released={})",
            self.node, self.object_key, self.num_pages, self.released
        )
    }
}

/// A residency change: `kind` is "stored" or "removed", `tier` "device" or
/// "host"; pages `start .. start + num_pages` of the prefix ending at `node`.
#[pyclass(frozen, get_all, module = "cpkv._cpkv")]
pub(crate) struct TreeEvent {
    kind: &'static str,
    tier: &'static str,
    node: u64,
    start: usize,
    num_pages: usize,
    /// Device page ids (empty for host events).
    pages: Py<PyArray1<i64>>,
    /// The host object key (None for device events).
    object_key: Option<u64>,
}

#[pymethods]
impl TreeEvent {
    fn __repr__(&self) -> String {
        format!(
            "TreeEvent({} {} node={} start={} num_pages={} object_key={:?})",
            self.tier, self.kind, self.node, self.start, self.num_pages, self.object_key
        )
    }
}

impl TreeEvent {
    fn new(py: Python<'_>, event: Event) -> Self {
        let (kind, tier, node, start, pages, num_pages, object_key) = match event {
            Event::DeviceStored { node, start, pages } => {
                ("stored", "device", node, start, pages, 0, None)
            }
            Event::DeviceRemoved { node, start, pages } => {
                ("removed", "device", node, start, pages, 0, None)
            }
            Event::HostStored {
                node,
                start,
                num_pages,
                key,
            } => (
                "stored",
                "host",
                node,
                start,
                Vec::new(),
                num_pages,
                Some(key),
            ),
            Event::HostRemoved {
                node,
                start,
                num_pages,
                key,
            } => (
                "removed",
                "host",
                node,
                start,
                Vec::new(),
                num_pages,
                Some(key),
            ),
        };
        Self {
            kind,
            tier,
            node: node.0,
            start,
            num_pages: if object_key.is_some() {
                num_pages
            } else {
                pages.len()
            },
            pages: pages_array(py, &pages),
            object_key,
        }
    }
}

/// A replicated, page-granular prefix tree with deterministic eviction.
/// Safe to share between threads: one lock guards the core (see `shared`).
#[pyclass(frozen, module = "cpkv._cpkv")]
pub(crate) struct PrefixTree {
    core: Shared<Core>,
}

/// Calls that evict more than this many pages release the GIL; smaller ones
/// (an engine's usual few pages) keep it: releasing and retaking it costs
/// more than the eviction.
const EVICT_WITH_GIL_PAGES: usize = 1024;

impl PrefixTree {
    fn evict_core(
        &self,
        py: Python<'_>,
        num_pages: usize,
    ) -> PyResult<Vec<cpkv_evict::DeviceVictim>> {
        if num_pages <= EVICT_WITH_GIL_PAGES {
            self.core.with(py, |t| t.evict(num_pages))
        } else {
            self.core.detached(py, |t| t.evict(num_pages))
        }
    }
}

#[pymethods]
impl PrefixTree {
    #[new]
    #[pyo3(signature = (page_size, policy = PolicyArg::DEFAULT, event_limit = None),
        text_signature = "(page_size, policy='ghost', event_limit=None)")]
    fn new(
        py: Python<'_>,
        page_size: &Bound<'_, PyAny>,
        policy: PolicyArg,
        event_limit: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        // The core checks it against `MAX_PAGE_SIZE`, the one limit.
        let page_size = count(page_size, "page_size")?;
        let event_limit = event_limit_arg(event_limit)?;
        let mut core = unshared(py, || Core::new(page_size, policy.0))?.map_err(evict_error)?;
        core.set_event_limit(event_limit);
        Ok(Self {
            core: Shared::new(core),
        })
    }

    #[classattr]
    #[allow(non_snake_case)]
    fn POLICIES(py: Python<'_>) -> PyResult<Py<PyTuple>> {
        Ok(PyTuple::new(py, Policy::NAMES)?.unbind())
    }

    #[pyo3(name = "match", signature = (tokens, namespace = None))]
    fn match_prefix(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<MatchResult> {
        let tokens = int_vector(tokens, "tokens")?;
        let namespace = self::namespace(namespace)?;
        let m = self
            .core
            .with(py, |t| t.match_prefix(&tokens, &namespace))?;
        Ok(MatchResult {
            length: m.length,
            device_pages: pages_array(py, &m.device_pages),
            host_length: m.host_length,
            node: m.node.0,
            host_node: m.host_node.0,
        })
    }

    #[pyo3(signature = (tokens, pages, namespace = None))]
    fn insert(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        pages: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<InsertResult> {
        let tokens = int_vector(tokens, "tokens")?;
        let pages = int_vector(pages, "pages")?;
        check_page_ids(&pages)?;
        let namespace = self::namespace(namespace)?;
        let r = self
            .core
            .with(py, |t| t.insert(&tokens, &pages, &namespace))?
            .map_err(evict_error)?;
        Ok(InsertResult {
            node: r.node.0,
            cached: r.cached,
        })
    }

    fn lock(&self, py: Python<'_>, node: &Bound<'_, PyAny>) -> PyResult<()> {
        let node = node_id(node)?;
        self.core.with(py, |t| t.lock(node))?.map_err(evict_error)
    }

    fn unlock(&self, py: Python<'_>, node: &Bound<'_, PyAny>) -> PyResult<()> {
        let node = node_id(node)?;
        self.core.with(py, |t| t.unlock(node))?.map_err(evict_error)
    }

    /// Frees at least `num_pages` device pages (fewer if not enough are
    /// evictable); returns the victims in eviction order.
    fn evict(&self, py: Python<'_>, num_pages: &Bound<'_, PyAny>) -> PyResult<Vec<DeviceVictim>> {
        let num_pages = count(num_pages, "num_pages")?;
        Ok(self
            .evict_core(py, num_pages)?
            .into_iter()
            .map(|v| DeviceVictim {
                node: v.node.0,
                pages: pages_array(py, &v.pages),
            })
            .collect())
    }

    /// The same eviction as `evict`, its freed device pages as one int64
    /// array in eviction order: what an engine frees, with no object per
    /// victim.
    fn evict_pages<'py>(
        &self,
        py: Python<'py>,
        num_pages: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let num_pages = count(num_pages, "num_pages")?;
        let victims = self.evict_core(py, num_pages)?;
        // Page ids came in as non-negative int64 values, so they fit. They
        // go straight into an array numpy allocates at their total (no
        // vector in between): cheaper than handing numpy a vector, which
        // takes a Python object to own it.
        let total: usize = victims.iter().map(|v| v.pages.len()).sum();
        let array = PyArray1::<i64>::zeros(py, total, false);
        // SAFETY: the array was just made here, so nothing else views it.
        #[allow(unsafe_code)]
        let out = unsafe { array.as_slice_mut() }.expect("a new array is contiguous");
        for (slot, page) in out.iter_mut().zip(victims.iter().flat_map(|v| &v.pages)) {
            *slot = *page as i64;
        }
        Ok(array)
    }

    /// Drops host-only leaves until at least `num_pages` host pages are gone.
    fn evict_host(
        &self,
        py: Python<'_>,
        num_pages: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<HostVictim>> {
        let num_pages = count(num_pages, "num_pages")?;
        Ok(self
            .core
            .detached(py, |t| t.evict_host(num_pages))?
            .into_iter()
            .map(|v| HostVictim {
                node: v.node.0,
                object_key: v.object_key,
                num_pages: v.num_pages,
                released: v.released,
            })
            .collect())
    }

    /// Records that `node` was backed up to host object `object_key`.
    fn set_host(
        &self,
        py: Python<'_>,
        node: &Bound<'_, PyAny>,
        object_key: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (node, key) = (node_id(node)?, uint(object_key, "object_key")?);
        self.core
            .with(py, |t| t.set_host(node, key))?
            .map_err(evict_error)
    }

    /// Re-attaches device `pages` to host-only `node` after a load-back.
    fn attach_device(
        &self,
        py: Python<'_>,
        node: &Bound<'_, PyAny>,
        pages: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let node = node_id(node)?;
        let pages = int_vector(pages, "pages")?;
        check_page_ids(&pages)?;
        self.core
            .with(py, |t| t.attach_device(node, &pages))?
            .map_err(evict_error)
    }

    /// Order-independent digest of the replicated state (an unsigned 64-bit int).
    fn digest(&self, py: Python<'_>) -> PyResult<u64> {
        self.core.with(py, |t| t.digest())
    }

    /// SHA-256 (32 bytes) of the canonical encoding of the replicated state:
    /// equal exactly when two trees will make the same decisions.
    fn canonical_digest<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let digest = self.core.detached(py, |t| t.canonical_digest())?;
        Ok(PyBytes::new(py, &digest))
    }

    /// The replicated state as versioned, checksummed bytes (events excluded).
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let data = self.core.detached(py, |t| t.snapshot())?;
        Ok(PyBytes::new(py, &data))
    }

    /// Rebuilds a tree from `snapshot()` bytes (a rank rejoining from a
    /// peer's state); bad bytes raise `SnapshotError`.
    #[staticmethod]
    #[pyo3(signature = (data, event_limit = None))]
    fn restore(
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        event_limit: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let event_limit = event_limit_arg(event_limit)?;
        let bytes = snapshot_bytes(data)?;
        let mut core = unshared(py, || Core::restore(&bytes))?.map_err(evict_error)?;
        core.set_event_limit(event_limit);
        Ok(Self {
            core: Shared::new(core),
        })
    }

    /// A ghost tree whose candidates sample prefix roots at a rate of
    /// `1 / 2**rate_shift` with a floor of `floor` pages (`rate_shift=0,
    /// floor=0`: full-size replicas fed every request, the candidates before
    /// sampling). For tests and measurements comparing the sampled choice
    /// with the exact one; not a policy to serve with.
    #[staticmethod]
    fn _ghost_sampled(
        py: Python<'_>,
        page_size: &Bound<'_, PyAny>,
        rate_shift: &Bound<'_, PyAny>,
        floor: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let page_size = count(page_size, "page_size")?;
        let rate_shift = u32::try_from(uint(rate_shift, "rate_shift")?).unwrap_or(u32::MAX);
        let sampling = Sampling::new(rate_shift, uint(floor, "floor")?).map_err(evict_error)?;
        let core =
            unshared(py, || Core::ghost_sampled(page_size, sampling))?.map_err(evict_error)?;
        Ok(Self {
            core: Shared::new(core),
        })
    }

    /// Drains the residency events (at most `event_limit`; older ones were
    /// dropped and counted in `dropped_events`).
    fn take_events(&self, py: Python<'_>) -> PyResult<Vec<TreeEvent>> {
        Ok(self
            .core
            .with(py, |t| t.take_events())?
            .into_iter()
            .map(|e| TreeEvent::new(py, e))
            .collect())
    }

    /// Raises AssertionError if an invariant or the incremental index/digest
    /// is wrong. O(n): for tests.
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.core
            .detached(py, |t| t.check_invariants())?
            .map_err(pyo3::exceptions::PyAssertionError::new_err)
    }

    /// Raises `InternalError` the way a bug inside the core would (a panic),
    /// so tests can check the poison rule; the tree is unusable afterwards.
    fn _panic_for_tests(&self, py: Python<'_>) -> PyResult<()> {
        self.core
            .with(py, |_| panic!("cpkv: panic requested by a test"))
    }

    /// Device-evictable node ids in eviction order (O(n): for tests and tools).
    fn eviction_order(&self, py: Python<'_>) -> PyResult<Vec<u64>> {
        self.core.detached(py, |t| {
            t.eviction_order(cpkv_evict::Tier::Device)
                .into_iter()
                .map(|n| n.0)
                .collect()
        })
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.core.with(py, |t| t.len())
    }

    #[getter]
    fn page_size(&self, py: Python<'_>) -> PyResult<usize> {
        self.core.with(py, |t| t.page_size())
    }
    #[getter]
    fn policy(&self, py: Python<'_>) -> PyResult<&'static str> {
        self.core.with(py, |t| t.policy().name())
    }
    #[getter]
    fn clock(&self, py: Python<'_>) -> PyResult<u64> {
        self.core.with(py, |t| t.clock())
    }
    #[getter]
    fn device_pages(&self, py: Python<'_>) -> PyResult<usize> {
        self.core.with(py, |t| t.device_pages())
    }
    #[getter]
    fn host_pages(&self, py: Python<'_>) -> PyResult<usize> {
        self.core.with(py, |t| t.host_pages())
    }
    #[getter]
    fn evictable_device(&self, py: Python<'_>) -> PyResult<usize> {
        self.core
            .with(py, |t| t.evictable(cpkv_evict::Tier::Device))
    }
    #[getter]
    fn evictable_host(&self, py: Python<'_>) -> PyResult<usize> {
        self.core.with(py, |t| t.evictable(cpkv_evict::Tier::Host))
    }
    /// Node slots ever used: the tree's node storage follows this high-water
    /// mark of live nodes, not the number of nodes ever created.
    #[getter]
    fn node_slots(&self, py: Python<'_>) -> PyResult<usize> {
        self.core.with(py, |t| t.node_slots())
    }
    #[getter]
    fn namespaces(&self, py: Python<'_>) -> PyResult<usize> {
        self.core.with(py, |t| t.namespaces())
    }
    #[getter]
    fn event_limit(&self, py: Python<'_>) -> PyResult<usize> {
        self.core.with(py, |t| t.event_limit())
    }
    #[getter]
    fn dropped_events(&self, py: Python<'_>) -> PyResult<u64> {
        self.core.with(py, |t| t.dropped_events())
    }
    /// What the policy keeps beyond the live nodes: remembered pages of
    /// dropped content (ghost history, ghost lists) and, for `ghost`, the
    /// nodes and pages of its shadow trees.
    fn policy_memory<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = self.core.with(py, |t| t.policy_memory())?;
        let out = PyDict::new(py);
        out.set_item("remembered_pages", m.remembered_pages)?;
        out.set_item("shadow_nodes", m.shadow_nodes)?;
        out.set_item("shadow_pages", m.shadow_pages)?;
        Ok(out)
    }

    /// For `ghost`, the ranking it follows now (`priority`, `recency`,
    /// `segmented`, `arc` or `s3fifo`); `None` for the other policies.
    #[getter]
    fn following(&self, py: Python<'_>) -> PyResult<Option<&'static str>> {
        self.core.with(py, |t| t.following())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        self.core.with(py, |t| {
            format!(
                "PrefixTree(page_size={}, policy={:?}, nodes={}, device_pages={}, host_pages={}, clock={})",
                t.page_size(),
                t.policy().name(),
                t.len(),
                t.device_pages(),
                t.host_pages(),
                t.clock()
            )
        })
    }
}

/// `event_limit`: an int by the binding's rule; `None` for the default.
fn event_limit_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
    match obj.filter(|o| !o.is_none()) {
        Some(obj) => count(obj, "event_limit"),
        None => Ok(cpkv_evict::DEFAULT_EVENT_LIMIT),
    }
}

/// Page ids travel back to Python as int64, so they must fit one.
fn check_page_ids(pages: &[u64]) -> PyResult<()> {
    match pages.iter().position(|p| i64::try_from(*p).is_err()) {
        Some(i) => Err(invalid(format!(
            "pages[{i}] = {} does not fit int64",
            pages[i]
        ))),
        None => Ok(()),
    }
}
