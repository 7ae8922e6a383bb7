//! Python wrapper of `cpkv_evict::PrefixTree`.
//!
//! Arguments are validated here into exact Rust types (1-D integer tokens
//! and pages, non-negative counts and ids) before the core sees them, so a
//! rejected call raises a typed `cpkv.errors` class and changes nothing.

use cpkv_evict::{Event, NodeId, Policy, PrefixTree as Core};
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::convert::{int_vector, invalid, namespace, pages_array};
use crate::errors::{cpkv_error, evict_error};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PrefixTree>()?;
    m.add_class::<MatchResult>()?;
    m.add_class::<InsertResult>()?;
    m.add_class::<DeviceVictim>()?;
    m.add_class::<HostVictim>()?;
    m.add_class::<TreeEvent>()?;
    Ok(())
}

fn count(value: i64, what: &str) -> PyResult<usize> {
    usize::try_from(value).map_err(|_| invalid(format!("{what} must be non-negative, got {value}")))
}

fn node_id(value: i64) -> PyResult<NodeId> {
    u64::try_from(value).map(NodeId).map_err(|_| {
        cpkv_error(
            "UnknownNodeError",
            format!("unknown node {value} (negative id)"),
        )
    })
}

/// What `PrefixTree.match` found.
#[pyclass(frozen, module = "cpkv._cpkv")]
pub(crate) struct MatchResult {
    #[pyo3(get)]
    length: usize,
    #[pyo3(get)]
    device_pages: Py<PyArray1<i64>>,
    #[pyo3(get)]
    host_length: usize,
    #[pyo3(get)]
    node: u64,
    #[pyo3(get)]
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
#[pyclass(frozen, module = "cpkv._cpkv")]
pub(crate) struct InsertResult {
    #[pyo3(get)]
    node: u64,
    #[pyo3(get)]
    cached: usize,
}

#[pymethods]
impl InsertResult {
    fn __repr__(&self) -> String {
        format!("InsertResult(node={}, cached={})", self.node, self.cached)
    }
}

/// A node whose device pages `evict` freed.
#[pyclass(frozen, module = "cpkv._cpkv")]
pub(crate) struct DeviceVictim {
    #[pyo3(get)]
    node: u64,
    #[pyo3(get)]
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
#[pyclass(frozen, module = "cpkv._cpkv")]
pub(crate) struct HostVictim {
    #[pyo3(get)]
    node: u64,
    #[pyo3(get)]
    object_key: u64,
    #[pyo3(get)]
    num_pages: usize,
    #[pyo3(get)]
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
#[pyclass(frozen, module = "cpkv._cpkv")]
pub(crate) struct TreeEvent {
    #[pyo3(get)]
    kind: &'static str,
    #[pyo3(get)]
    tier: &'static str,
    #[pyo3(get)]
    node: u64,
    #[pyo3(get)]
    start: usize,
    #[pyo3(get)]
    num_pages: usize,
    /// Device page ids (empty for host events).
    #[pyo3(get)]
    pages: Py<PyArray1<i64>>,
    /// The host object key (None for device events).
    #[pyo3(get)]
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
#[pyclass(module = "cpkv._cpkv")]
pub(crate) struct PrefixTree {
    core: Core,
}

#[pymethods]
impl PrefixTree {
    #[new]
    #[pyo3(signature = (page_size, policy = "lru"))]
    fn new(page_size: i64, policy: &str) -> PyResult<Self> {
        let page_size = count(page_size, "page_size")?;
        if page_size == 0 {
            return Err(invalid("page_size must be at least 1".into()));
        }
        let policy: Policy = policy.parse().map_err(evict_error)?;
        Ok(Self {
            core: Core::new(page_size, policy).map_err(evict_error)?,
        })
    }

    #[classattr]
    #[allow(non_snake_case)]
    fn POLICIES(py: Python<'_>) -> PyResult<Py<PyTuple>> {
        Ok(PyTuple::new(py, Policy::NAMES)?.unbind())
    }

    #[pyo3(name = "match", signature = (tokens, namespace = None))]
    fn match_prefix(
        &mut self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<MatchResult> {
        let tokens = int_vector(tokens, "tokens")?;
        let namespace = self::namespace(namespace)?;
        let m = self.core.match_prefix(&tokens, &namespace);
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
        &mut self,
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
            .insert(&tokens, &pages, &namespace)
            .map_err(evict_error)?;
        Ok(InsertResult {
            node: r.node.0,
            cached: r.cached,
        })
    }

    fn lock(&mut self, node: i64) -> PyResult<()> {
        self.core.lock(node_id(node)?).map_err(evict_error)
    }

    fn unlock(&mut self, node: i64) -> PyResult<()> {
        self.core.unlock(node_id(node)?).map_err(evict_error)
    }

    /// Frees at least `num_pages` device pages (fewer if not enough are
    /// evictable); returns the victims in eviction order.
    fn evict(&mut self, py: Python<'_>, num_pages: i64) -> PyResult<Vec<DeviceVictim>> {
        let num_pages = count(num_pages, "num_pages")?;
        Ok(self
            .core
            .evict(num_pages)
            .into_iter()
            .map(|v| DeviceVictim {
                node: v.node.0,
                pages: pages_array(py, &v.pages),
            })
            .collect())
    }

    /// Drops host-only leaves until at least `num_pages` host pages are gone.
    fn evict_host(&mut self, num_pages: i64) -> PyResult<Vec<HostVictim>> {
        let num_pages = count(num_pages, "num_pages")?;
        Ok(self
            .core
            .evict_host(num_pages)
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
    fn set_host(&mut self, node: i64, object_key: i64) -> PyResult<()> {
        let key = u64::try_from(object_key)
            .map_err(|_| invalid(format!("object_key must be non-negative, got {object_key}")))?;
        self.core.set_host(node_id(node)?, key).map_err(evict_error)
    }

    /// Re-attaches device `pages` to host-only `node` after a load-back.
    fn attach_device(&mut self, node: i64, pages: &Bound<'_, PyAny>) -> PyResult<()> {
        let pages = int_vector(pages, "pages")?;
        check_page_ids(&pages)?;
        self.core
            .attach_device(node_id(node)?, &pages)
            .map_err(evict_error)
    }

    /// Order-independent digest of the replicated state (an unsigned 64-bit int).
    fn digest(&self) -> u64 {
        self.core.digest()
    }

    fn take_events(&mut self, py: Python<'_>) -> Vec<TreeEvent> {
        self.core
            .take_events()
            .into_iter()
            .map(|e| TreeEvent::new(py, e))
            .collect()
    }

    /// Raises AssertionError if an invariant or the incremental index/digest
    /// is wrong. O(n): for tests.
    fn check_invariants(&self) -> PyResult<()> {
        self.core
            .check_invariants()
            .map_err(pyo3::exceptions::PyAssertionError::new_err)
    }

    /// Device-evictable node ids in eviction order (O(n): for tests and tools).
    fn eviction_order(&self) -> Vec<u64> {
        self.core
            .eviction_order(cpkv_evict::Tier::Device)
            .into_iter()
            .map(|n| n.0)
            .collect()
    }

    fn __len__(&self) -> usize {
        self.core.len()
    }

    #[getter]
    fn page_size(&self) -> usize {
        self.core.page_size()
    }
    #[getter]
    fn policy(&self) -> &'static str {
        self.core.policy().name()
    }
    #[getter]
    fn clock(&self) -> u64 {
        self.core.clock()
    }
    #[getter]
    fn device_pages(&self) -> usize {
        self.core.device_pages()
    }
    #[getter]
    fn host_pages(&self) -> usize {
        self.core.host_pages()
    }
    #[getter]
    fn evictable_device(&self) -> usize {
        self.core.evictable(cpkv_evict::Tier::Device)
    }
    #[getter]
    fn evictable_host(&self) -> usize {
        self.core.evictable(cpkv_evict::Tier::Host)
    }

    fn __repr__(&self) -> String {
        format!(
            "PrefixTree(page_size={}, policy={:?}, nodes={}, device_pages={}, host_pages={}, clock={})",
            self.core.page_size(),
            self.core.policy().name(),
            self.core.len(),
            self.core.device_pages(),
            self.core.host_pages(),
            self.core.clock()
        )
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
