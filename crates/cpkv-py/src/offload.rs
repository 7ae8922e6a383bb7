//! Python wrapper of `cpkv_tier::OffloadIndex`: one call per engine call.
//!
//! Keys stay the engine's `bytes` objects: they are read in place, keys to
//! store come back as the very objects offered (indexes into the call), and
//! only evicted keys are built anew. A request's key positions are read from
//! the engine's own dict, in Rust. `lookup` returns one of three objects
//! given at construction (the engine's enum members), so the adapter can
//! expose it as its own method with no Python frame in between.
//! (SGLang's synchronous calls are `SglangIndex`'s, over the same core.)

use cpkv_tier::{
    key_hex, KeyState, OffloadIndex as Core, StorePlan, TierError, MAX_KEYS_PER_CALL,
    MAX_OFFLOAD_ROWS,
};
use numpy::{PyArray1, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::convert::{
    count, describe, flag, int_vector, invalid, is_numpy_text, ordered_iter, uint, uint_named,
    wrong_type, PolicyArg,
};
use crate::errors::{tier_error, DivergenceError, UnknownKeyError};
use crate::shared::{unshared, Shared};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<OffloadIndex>()?;
    Ok(())
}

/// The most KV cache groups an index is built for.
const MAX_GROUPS: usize = 1 << 16;

#[pyclass(frozen, module = "cpkv._cpkv")]
pub(crate) struct OffloadIndex {
    core: Shared<Core>,
    /// What `lookup` returns for a miss, a readable key, a pending store.
    results: [Py<PyAny>; 3],
}

/// How a call takes its key collection.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    /// In the caller's order, which decides rows, paths and answers: a
    /// list, tuple or other ordered iterable, never a set, mapping or
    /// mapping view (their order differs between processes).
    Kept,
    /// Any collection: a completion, whose effect does not depend on the
    /// keys' order (vLLM completes Python sets).
    Any,
}

/// The items of a call's key collection: a list, tuple or other iterable
/// by `order` (never one `str` or `bytes`, nor a numpy text array), of at
/// most `MAX_KEYS_PER_CALL`; `kind` says what the keys must be.
fn key_items<'py>(
    keys: &Bound<'py, PyAny>,
    kind: &str,
    order: Order,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let too_many = |n: usize| invalid(format!("keys: {n} is more than {MAX_KEYS_PER_CALL} keys"));
    if let Ok(list) = keys.cast::<PyList>() {
        if list.len() > MAX_KEYS_PER_CALL {
            return Err(too_many(list.len()));
        }
        return Ok(list.iter().collect());
    }
    if let Ok(tuple) = keys.cast::<PyTuple>() {
        if tuple.len() > MAX_KEYS_PER_CALL {
            return Err(too_many(tuple.len()));
        }
        return Ok(tuple.iter().collect());
    }
    if let Ok(array) = keys.cast::<PyUntypedArray>() {
        let dtype = array.dtype();
        if matches!(dtype.kind(), b'S' | b'U') {
            return Err(wrong_type(format!(
                "keys: a numpy array of dtype {} drops each key's trailing NUL bytes, so a key \
                 would be read as another; pass a list of {kind}",
                dtype.str()?
            )));
        }
    }
    let not_keys = || {
        format!(
            "keys must be an ordered collection (a list or tuple) of {kind} keys, got {}",
            describe(keys)
        )
    };
    let items = match order {
        Order::Kept => ordered_iter(keys, not_keys)?,
        Order::Any => {
            if keys.is_instance_of::<PyBytes>() || keys.is_instance_of::<PyString>() {
                return Err(wrong_type(not_keys()));
            }
            keys.try_iter().map_err(|_| wrong_type(not_keys()))?
        }
    };
    let mut out = Vec::new();
    for (i, item) in items.enumerate() {
        if i >= MAX_KEYS_PER_CALL {
            return Err(invalid(format!("keys: more than {MAX_KEYS_PER_CALL} keys")));
        }
        out.push(item?);
    }
    Ok(out)
}

/// A numpy `bytes_`/`str_` key, refused naming why; `what` names it.
fn numpy_text_key(item: &Bound<'_, PyAny>, what: &dyn Fn() -> String) -> PyErr {
    wrong_type(format!(
        "{} is a numpy {} scalar, which has lost the key's trailing NUL bytes; pass bytes or str",
        what(),
        item.get_type()
            .name()
            .map_or_else(|_| "text".to_owned(), |n| n.to_string())
    ))
}

/// One `bytes` key: `bytes` or a subclass, never numpy's (see
/// `numpy_text_key`).
fn bytes_key<'py>(
    item: Bound<'py, PyAny>,
    what: &dyn Fn() -> String,
) -> PyResult<Bound<'py, PyBytes>> {
    if !item.is_exact_instance_of::<PyBytes>() && is_numpy_text(&item) {
        return Err(numpy_text_key(&item, what));
    }
    item.cast_into::<PyBytes>().map_err(|e| {
        wrong_type(format!(
            "{} must be bytes, got {}",
            what(),
            describe(&e.into_inner())
        ))
    })
}

/// The `bytes` keys of a call, each at least the four bytes that name its
/// group (checked here for the calls the core does not check).
fn key_objects<'py>(keys: &Bound<'py, PyAny>, order: Order) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let objects = key_items(keys, "bytes", order)?
        .into_iter()
        .enumerate()
        .map(|(i, item)| bytes_key(item, &|| format!("keys[{i}]")))
        .collect::<PyResult<Vec<_>>>()?;
    Core::check_keys(&slices(&objects)).map_err(tier_error)?;
    Ok(objects)
}

fn slices<'a>(keys: &'a [Bound<'_, PyBytes>]) -> Vec<&'a [u8]> {
    keys.iter().map(|k| k.as_bytes()).collect()
}

/// Each key's end position from the request's `{key: end}` dict (`None`: no
/// positions known).
fn positions(
    keys: &[Bound<'_, PyBytes>],
    dict: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<Option<u64>>> {
    let Some(dict) = dict.filter(|d| !d.is_none()) else {
        return Ok(vec![None; keys.len()]);
    };
    let dict = dict.cast::<PyDict>().map_err(|_| {
        wrong_type(format!(
            "positions must be a dict of key -> end token, got {}",
            describe(dict)
        ))
    })?;
    keys.iter()
        .map(|k| match dict.get_item(k)? {
            None => Ok(None),
            // The one integer rule: a wrong type or a value out of range, named.
            Some(v) => {
                uint_named(&v, &|| format!("positions[{}]", key_hex(k.as_bytes()))).map(Some)
            }
        })
        .collect()
}

fn request_id(request: &Bound<'_, PyAny>) -> PyResult<String> {
    match request.cast::<PyString>() {
        Ok(text) => text.to_str().map(str::to_owned).map_err(|_| {
            invalid(format!(
                "request is a str that is not valid UTF-8: {}",
                describe(request)
            ))
        }),
        Err(_) => Err(wrong_type(format!(
            "request must be a str, got {}",
            describe(request)
        ))),
    }
}

fn bytes_list<'py>(py: Python<'py>, keys: &[Box<[u8]>]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, keys.iter().map(|k| PyBytes::new(py, k)))
}

fn rows_array(py: Python<'_>, rows: Vec<u32>) -> Bound<'_, PyArray1<i32>> {
    // Rows are below MAX_OFFLOAD_ROWS < 2**31.
    PyArray1::from_vec(py, rows.into_iter().map(|r| r as i32).collect())
}

/// `complete_store`'s flags by the one flag rule, named in errors (an
/// explicit `None` is refused, not read as the default).
struct Success(bool);
struct Report(bool);

impl<'a, 'py> FromPyObject<'a, 'py> for Success {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        flag(&obj, "success").map(Self)
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Report {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        flag(&obj, "report").map(Self)
    }
}

/// `lookup`'s three answers: `None` (the default ones) or a tuple of three
/// objects.
fn lookup_results(results: Option<&Bound<'_, PyAny>>) -> PyResult<Option<[Py<PyAny>; 3]>> {
    let Some(results) = results.filter(|r| !r.is_none()) else {
        return Ok(None);
    };
    let tuple = results.cast::<PyTuple>().map_err(|_| {
        wrong_type(format!(
            "results must be None or a tuple (miss, readable, in flight), got {}",
            describe(results)
        ))
    })?;
    if tuple.len() != 3 {
        return Err(invalid(format!(
            "results must hold 3 objects (miss, readable, in flight), got {}",
            describe(results)
        )));
    }
    let item = |i: usize| tuple.get_item(i).map(Bound::unbind);
    Ok(Some([item(0)?, item(1)?, item(2)?]))
}

/// The key of a one-key call: `bytes` (never numpy's), at least the four
/// bytes that name its group.
fn single_key<'a>(key: &'a Bound<'_, PyAny>) -> PyResult<&'a [u8]> {
    let bytes = match key.cast::<PyBytes>() {
        Ok(b) if b.is_exact_instance_of::<PyBytes>() || !is_numpy_text(key) => b.as_bytes(),
        Ok(_) => return Err(numpy_text_key(key, &|| "key".to_owned())),
        Err(_) => {
            return Err(wrong_type(format!(
                "key must be bytes, got {}",
                describe(key)
            )))
        }
    };
    Core::check_keys(&[bytes]).map_err(tier_error)?;
    Ok(bytes)
}

/// A store plan's placement call (`prepare_store` or `prepare_store_fitting`).
type PlanStore =
    fn(&mut Core, &str, &[&[u8]], &[Option<u64>]) -> Result<Option<StorePlan>, TierError>;

impl OffloadIndex {
    /// A placement call's Python result: `None`, or `(keys to store, rows,
    /// evicted keys, the row each evicted key held)`.
    fn plan_store<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        request: &Bound<'py, PyAny>,
        positions: Option<&Bound<'py, PyAny>>,
        place: PlanStore,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let objects = key_objects(keys, Order::Kept)?;
        let request = request_id(request)?;
        let ends = self::positions(&objects, positions)?;
        let keys = slices(&objects);
        let plan = self
            .core
            .with(py, |c| place(c, &request, &keys, &ends))?
            .map_err(tier_error)?;
        let Some(plan) = plan else { return Ok(None) };
        let store = PyList::new(py, plan.store.iter().map(|&i| &objects[i]))?;
        let evicted = bytes_list(py, &plan.evicted)?;
        let rows = rows_array(py, plan.rows);
        let evicted_rows = rows_array(py, plan.evicted_rows);
        Ok(Some(PyTuple::new(
            py,
            [
                store.into_any(),
                rows.into_any(),
                evicted.into_any(),
                evicted_rows.into_any(),
            ],
        )?))
    }
}

#[pymethods]
impl OffloadIndex {
    /// The most rows (the `capacity`) an index takes: rows are int32.
    #[classattr]
    const MAX_ROWS: u64 = MAX_OFFLOAD_ROWS;

    #[new]
    /// `results`: what `lookup` answers (miss, readable, in flight); by default `False`, `True`,
    /// `None`, for an engine that does not look keys up one by one (SGLang's `store`/`locate`).
    #[pyo3(signature = (capacity, policy, tokens_per_chunk, results = None))]
    fn new(
        py: Python<'_>,
        capacity: &Bound<'_, PyAny>,
        policy: PolicyArg,
        tokens_per_chunk: &Bound<'_, PyAny>,
        results: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let results = lookup_results(results)?;
        let capacity = uint(capacity, "capacity")?;
        if capacity == 0 || capacity > MAX_OFFLOAD_ROWS {
            return Err(invalid(format!(
                "capacity must be in [1, {MAX_OFFLOAD_ROWS}], got {capacity}"
            )));
        }
        let tokens = int_vector(tokens_per_chunk, "tokens_per_chunk")?;
        if tokens.len() > MAX_GROUPS {
            return Err(invalid(format!(
                "tokens_per_chunk: {} groups is more than {MAX_GROUPS}",
                tokens.len()
            )));
        }
        let core = unshared(py, || Core::new(capacity, policy.0, tokens))?.map_err(tier_error)?;
        let results = match results {
            Some(given) => given,
            None => {
                let flag = |b: bool| PyBool::new(py, b).to_owned().into_any().unbind();
                [flag(false), flag(true), py.None()]
            }
        };
        Ok(Self {
            core: Shared::new(core),
            results,
        })
    }

    /// `results[0]` (miss), `[1]` (readable) or `[2]` (store in flight).
    #[pyo3(signature = (key, req_context = None))]
    fn lookup(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        req_context: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let _ = req_context;
        let key = single_key(key)?;
        let state = self.core.with(py, |c| c.lookup(key))?;
        let i = match state {
            KeyState::Miss => 0,
            KeyState::Ready => 1,
            KeyState::Pending => 2,
        };
        Ok(self.results[i].clone_ref(py))
    }

    /// Pins the (readable) keys until `complete_load`; their rows (int32).
    #[pyo3(signature = (keys, request, positions = None))]
    fn prepare_load<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        request: &Bound<'py, PyAny>,
        positions: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let objects = key_objects(keys, Order::Kept)?;
        let request = request_id(request)?;
        let ends = self::positions(&objects, positions)?;
        let keys = slices(&objects);
        let rows = self
            .core
            .with(py, |c| c.prepare_load(&request, &keys, &ends))?
            .map_err(tier_error)?;
        Ok(rows_array(py, rows))
    }

    fn complete_load(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        request: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let objects = key_objects(keys, Order::Any)?;
        let request = request_id(request)?;
        let keys = slices(&objects);
        self.core.with(py, |c| c.complete_load(&request, &keys))
    }

    #[pyo3(signature = (keys, request, positions = None))]
    fn touch(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        request: &Bound<'_, PyAny>,
        positions: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let objects = key_objects(keys, Order::Kept)?;
        let request = request_id(request)?;
        let ends = self::positions(&objects, positions)?;
        let keys = slices(&objects);
        self.core
            .with(py, |c| c.touch(&request, &keys, &ends))?
            .map_err(tier_error)
    }

    /// `None` when the offered keys do not all fit (after evicting what may
    /// go; nothing changed), else `(keys to store (the offered objects),
    /// their rows (int32), evicted keys, the row each evicted key held
    /// (int32))`. An evicted key's bytes are still in its row when this
    /// returns, and that row may be among the plan's own rows: a lower tier
    /// copies it out before the plan's stores are written.
    #[pyo3(signature = (keys, request, positions = None))]
    fn prepare_store<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        request: &Bound<'py, PyAny>,
        positions: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        self.plan_store(py, keys, request, positions, Core::prepare_store)
    }

    /// `prepare_store`, placing the new keys that fit from the head of the
    /// offer (what `store` does); `None` when none fits.
    #[pyo3(signature = (keys, request, positions = None))]
    fn prepare_store_fitting<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        request: &Bound<'py, PyAny>,
        positions: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        self.plan_store(py, keys, request, positions, Core::prepare_store_fitting)
    }

    /// Completes stores; with `report`, returns the keys whose store
    /// completed (the offered objects): readable now, or, failed, removed.
    /// Else None.
    #[pyo3(
        signature = (keys, success = Success(true), report = Report(false)),
        text_signature = "(self, /, keys, success=True, report=False)"
    )]
    fn complete_store<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        success: Success,
        report: Report,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        let (success, report) = (success.0, report.0);
        let objects = key_objects(keys, Order::Any)?;
        let keys = slices(&objects);
        let stored = self
            .core
            .with(py, |c| c.complete_store(&keys, success))?
            .map_err(tier_error)?;
        if !report {
            return Ok(None);
        }
        Ok(Some(PyList::new(py, stored.iter().map(|&i| &objects[i]))?))
    }

    fn request_finished(&self, py: Python<'_>, request: &Bound<'_, PyAny>) -> PyResult<()> {
        let request = request_id(request)?;
        self.core.with(py, |c| c.request_finished(&request))
    }

    /// Evicts at least `num` unpinned keys (fewer when fewer are unpinned).
    fn evict<'py>(&self, py: Python<'py>, num: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        let num = count(num, "num")? as u64;
        let keys = self
            .core
            .detached(py, |c| c.evict(num))?
            .map_err(tier_error)?;
        bytes_list(py, &keys)
    }

    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        self.core.with(py, |c| c.reset())?.map_err(tier_error)
    }

    fn digest(&self, py: Python<'_>) -> PyResult<u64> {
        self.core.with(py, |c| c.digest())
    }

    fn resident_keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let keys = self.core.detached(py, |c| c.resident_keys())?;
        bytes_list(py, &keys)
    }

    fn pinned_keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let keys = self.core.detached(py, |c| c.pinned_keys())?;
        bytes_list(py, &keys)
    }

    /// The key's slab row; KeyError when it is not on the host.
    fn row_of(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<u32> {
        let k = single_key(key)?;
        self.core.with(py, |c| c.row_of(k))?.ok_or_else(|| {
            UnknownKeyError::new_err(format!("key {} is not on the host", key_hex(k)))
        })
    }

    /// The key before it on its path, when on the host (else None).
    fn parent_of<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let k = single_key(key)?;
        Ok(self
            .core
            .with(py, |c| c.parent_of(k))?
            .map(|p| PyBytes::new(py, &p)))
    }

    fn is_storing(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let k = single_key(key)?;
        self.core.with(py, |c| c.is_storing(k))
    }

    #[getter]
    fn num_pins(&self, py: Python<'_>) -> PyResult<usize> {
        self.core.with(py, |c| c.num_pins())
    }

    #[getter]
    fn capacity(&self, py: Python<'_>) -> PyResult<u64> {
        self.core.with(py, |c| c.capacity())
    }

    #[getter]
    fn policy(&self, py: Python<'_>) -> PyResult<&'static str> {
        self.core.with(py, |c| c.policy().name())
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.core.with(py, |c| c.len())
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.core.with(py, |c| c.stats())?;
        let d = PyDict::new(py);
        d.set_item("capacity", s.capacity)?;
        d.set_item("resident", s.resident)?;
        d.set_item("ready", s.ready)?;
        d.set_item("pinned", s.pins)?;
        d.set_item("evicted", s.evicted)?;
        Ok(d)
    }

    /// Audit; a `DivergenceError` names the first disagreement.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.core
            .detached(py, |c| c.check())?
            .map_err(DivergenceError::new_err)
    }
}
