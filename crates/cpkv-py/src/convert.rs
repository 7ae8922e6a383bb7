//! The one argument-conversion rule of the binding, used by every class, so
//! the same kind of argument is accepted or refused the same way wherever
//! it is passed:
//!
//! - an integer (id, key, count, size) is a Python `int`, a numpy integer
//!   scalar or any object with `__index__`, in `[0, 2**64)`; never a bool
//!   (numpy's included), a float, a str or bytes;
//! - a sequence of integers (tokens, pages, keys) is a 1-D numpy integer
//!   array or an ordered iterable of such integers (list, tuple, range, ...);
//!   never a str, bytes, bytearray, memoryview, mapping, set or mapping view
//!   (whose order is not the caller's). Its length is what iteration yields:
//!   `__len__` is never trusted to size a buffer;
//! - a flag is a Python `bool` or a numpy bool scalar, never an int or None.
//!
//! A value of the wrong type is an `ArgumentTypeError` (also `TypeError`),
//! one of the right type out of range an `InvalidArgumentError` (also
//! `ValueError`); both name the value, and both are raised before the core
//! is touched, so a refused call changes nothing.

use cpkv_evict::{Namespace, Policy};
use numpy::{
    PyArray1, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray1, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyInt, PyList, PyString, PyTuple};

use crate::errors::{ArgumentTypeError, InvalidArgumentError, SnapshotError};

/// An argument of the right type whose value cannot be accepted.
pub(crate) fn invalid(message: String) -> PyErr {
    InvalidArgumentError::new_err(message)
}

/// An argument of the wrong type.
pub(crate) fn wrong_type(message: String) -> PyErr {
    ArgumentTypeError::new_err(message)
}

/// A short description of a value for an error message: its repr (cut to a
/// line) and type; a long container is described by its type and length.
pub(crate) fn describe(obj: &Bound<'_, PyAny>) -> String {
    let type_name = obj
        .get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string());
    let sized = obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<PyByteArray>()
        || obj.is_instance_of::<PyList>()
        || obj.is_instance_of::<PyTuple>();
    if sized {
        if let Ok(n) = obj.len() {
            if n > 16 {
                return format!("a {type_name} of length {n}");
            }
        }
    }
    let mut text = obj
        .repr()
        .map_or_else(|_| format!("<unprintable {type_name}>"), |r| r.to_string());
    if text.chars().count() > 80 {
        text = text.chars().take(77).collect::<String>() + "...";
    }
    format!("{text} ({type_name})")
}

/// An int in [0, 2**64) by the rule above; `what` names it in errors.
pub(crate) fn uint(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    uint_named(obj, &|| what.to_owned())
}

/// `uint` with the argument's name built only when there is an error to name it in.
pub(crate) fn uint_named(obj: &Bound<'_, PyAny>, name: &dyn Fn() -> String) -> PyResult<u64> {
    // The hot path: an exact int in range (bools are a subclass, not exact).
    if obj.is_exact_instance_of::<PyInt>() {
        if let Some(value) = exact_int_u64(obj) {
            return Ok(value);
        }
    }
    let refuse = || {
        wrong_type(format!(
            "{} must be an int in [0, 2**64), got {}",
            name(),
            describe(obj)
        ))
    };
    let index = int_like(obj, refuse)?;
    match index.extract::<i128>().map(u64::try_from) {
        Ok(Ok(value)) => Ok(value),
        // Negative, or beyond i128: the value is named as it was given.
        _ => Err(invalid(format!(
            "{} = {} is out of range [0, 2**64)",
            name(),
            describe(obj)
        ))),
    }
}

/// A signed int by the rule above (a position that may count from the end);
/// `None` beyond i128, where no position lies.
pub(crate) fn signed(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<i128>> {
    let index = int_like(obj, || {
        wrong_type(format!("{what} must be an int, got {}", describe(obj)))
    })?;
    Ok(index.extract::<i128>().ok())
}

/// `obj` as a Python int by the rule above (`refuse` when it is not one).
fn int_like<'py>(
    obj: &Bound<'py, PyAny>,
    refuse: impl Fn() -> PyErr,
) -> PyResult<Bound<'py, PyAny>> {
    let type_name = obj.get_type().name()?;
    // numpy's bool scalar is `bool_` (numpy 1) or `bool` (numpy 2).
    if obj.is_instance_of::<PyBool>() || type_name == "bool_" || type_name == "bool" {
        return Err(refuse());
    }
    if obj.is_instance_of::<PyInt>() {
        return Ok(obj.clone());
    }
    if obj.hasattr(pyo3::intern!(obj.py(), "__index__"))? {
        if let Ok(index) = obj.call_method0(pyo3::intern!(obj.py(), "__index__")) {
            if index.is_instance_of::<PyInt>() {
                return Ok(index);
            }
        }
    }
    Err(refuse())
}

/// An exact `int` in [0, 2**64), read with one C call; `None` (no error
/// left set) otherwise. Where C's `unsigned long` has 64 bits it is read with
/// `PyLong_AsUnsignedLong`, which walks the digits in place; `extract::<u64>`
/// goes through `PyLong_AsUnsignedLongLong`, whose multi-digit path builds a
/// byte array (keys are usually hashes, so multi-digit).
#[allow(unsafe_code)]
fn exact_int_u64(obj: &Bound<'_, PyAny>) -> Option<u64> {
    if size_of::<std::os::raw::c_ulong>() != 8 {
        return obj.extract::<u64>().ok();
    }
    // SAFETY: `obj` is a live exact int (checked by the caller) and we hold
    // the GIL (the `Bound` proves it); the call only reads the object.
    let value = unsafe { pyo3::ffi::PyLong_AsUnsignedLong(obj.as_ptr()) };
    if value == std::os::raw::c_ulong::MAX && PyErr::take(obj.py()).is_some() {
        return None;
    }
    // `c_ulong` is `u64` here, `u32` on Windows: the conversion is the identity only here.
    #[allow(clippy::useless_conversion)]
    Some(u64::from(value))
}

/// A flag by the rule above; `what` names it in errors.
pub(crate) fn flag(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<bool> {
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(b.is_true());
    }
    // numpy's bool scalar (`bool_` in numpy 1, `bool` in numpy 2).
    let numpy_bool = obj
        .get_type()
        .module()
        .is_ok_and(|m| m.to_str().is_ok_and(|m| m == "numpy"))
        && obj
            .get_type()
            .name()
            .is_ok_and(|n| n.to_str().is_ok_and(|n| n == "bool_" || n == "bool"));
    if numpy_bool {
        return obj.is_truthy();
    }
    Err(wrong_type(format!(
        "{what} must be a bool (True or False), got {}",
        describe(obj)
    )))
}

/// Whether `obj` is a numpy `bytes_` or `str_` scalar: an item of an `S` or
/// `U` array, which has lost its trailing NUL bytes or characters.
pub(crate) fn is_numpy_text(obj: &Bound<'_, PyAny>) -> bool {
    let ty = obj.get_type();
    ty.module()
        .is_ok_and(|m| m.to_str().is_ok_and(|m| m == "numpy"))
        && ty
            .name()
            .is_ok_and(|n| n.to_str().is_ok_and(|n| n == "bytes_" || n == "str_"))
}

/// `uint` as a count in memory (`usize`); a count beyond the address space
/// asks for everything there is.
pub(crate) fn count(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    Ok(usize::try_from(uint(obj, what)?).unwrap_or(usize::MAX))
}

/// Types that iterate but are not ordered sequences of ints: text and bytes
/// (which iterate as characters or byte values), mappings, sets and mapping
/// views (`dict.keys()`, `.values()`, `.items()`).
fn unordered_types(py: Python<'_>) -> PyResult<&Bound<'_, PyTuple>> {
    static TYPES: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    TYPES
        .get_or_try_init(py, || {
            let abc = py.import("collections.abc")?;
            let builtins = py.import("builtins")?;
            let names = [
                builtins.getattr("str")?,
                builtins.getattr("bytes")?,
                builtins.getattr("bytearray")?,
                builtins.getattr("memoryview")?,
                abc.getattr("Mapping")?,
                abc.getattr("Set")?,
                abc.getattr("MappingView")?,
            ];
            Ok::<_, PyErr>(PyTuple::new(py, names)?.unbind())
        })
        .map(|t| t.bind(py))
}

/// A sequence of ints in [0, 2**64) by the rule above; `what` names it.
pub(crate) fn int_vector(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u64>> {
    let element = |i: usize, item: &Bound<'_, PyAny>| uint_named(item, &|| format!("{what}[{i}]"));
    // Lists and tuples report their true length: read in place.
    if let Ok(list) = obj.cast::<PyList>() {
        let mut values = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            values.push(element(i, &item)?);
        }
        return Ok(values);
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return tuple
            .iter()
            .enumerate()
            .map(|(i, item)| element(i, &item))
            .collect();
    }
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        if array.dtype().kind() != b'O' {
            return int_array(obj, array, what);
        }
    }
    let items = ordered_iter(obj, || {
        format!(
            "{what} must be a 1-D integer array or an ordered sequence of ints, got {}",
            describe(obj)
        )
    })?;
    // Grown as items arrive: no size hint (which may come from a lying
    // `__len__`) reserves anything.
    let mut values = Vec::new();
    for (i, item) in items.enumerate() {
        values.push(element(i, &item?)?);
    }
    Ok(values)
}

/// An iterator over an ordered iterable by the rule above; `refusal` is the
/// message of the `ArgumentTypeError` for anything else.
pub(crate) fn ordered_iter<'py>(
    obj: &Bound<'py, PyAny>,
    refusal: impl Fn() -> String,
) -> PyResult<Bound<'py, pyo3::types::PyIterator>> {
    if obj.is_instance(unordered_types(obj.py())?.as_any())? {
        return Err(wrong_type(refusal()));
    }
    obj.try_iter().map_err(|_| wrong_type(refusal()))
}

/// The items of an ordered iterable by the rule above (a list of requests,
/// say), read by iteration.
pub(crate) fn ordered_items<'py>(
    obj: &Bound<'py, PyAny>,
    refusal: impl Fn() -> String,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let mut items = Vec::new();
    for item in ordered_iter(obj, refusal)? {
        items.push(item?);
    }
    Ok(items)
}

fn int_array(
    obj: &Bound<'_, PyAny>,
    array: &Bound<'_, PyUntypedArray>,
    what: &str,
) -> PyResult<Vec<u64>> {
    if array.ndim() != 1 {
        return Err(invalid(format!(
            "{what} must be 1-D, got {} dimensions",
            array.ndim()
        )));
    }
    // int64/uint64 arrays are copied out in one go (a contiguous one without
    // taking a borrow, whose tracking costs more than the copy); narrower
    // ones are widened first.
    match array.dtype().kind() {
        b'u' => {
            if let Ok(a) = obj.cast::<PyArray1<u64>>() {
                return Ok(a
                    .to_vec()
                    .unwrap_or_else(|_| a.readonly().as_array().to_vec()));
            }
            let wide = obj.call_method1("astype", ("uint64",))?;
            let a: PyReadonlyArray1<'_, u64> = wide.extract()?;
            Ok(a.as_array().to_vec())
        }
        b'i' => {
            let signed = if let Ok(a) = obj.cast::<PyArray1<i64>>() {
                a.to_vec()
                    .unwrap_or_else(|_| a.readonly().as_array().to_vec())
            } else {
                let wide = obj.call_method1("astype", ("int64",))?;
                let a: PyReadonlyArray1<'_, i64> = wide.extract()?;
                a.as_array().to_vec()
            };
            signed
                .into_iter()
                .enumerate()
                .map(|(i, v)| {
                    u64::try_from(v).map_err(|_| {
                        invalid(format!("{what}[{i}] = {v} is out of range [0, 2**64)"))
                    })
                })
                .collect()
        }
        _ => {
            let dtype = array.dtype().str()?.to_string();
            Err(wrong_type(format!(
                "{what} must be integers, got an array of dtype {dtype}"
            )))
        }
    }
}

/// A namespace: `None` (the default one), a str, or an int by the rule above.
pub(crate) fn namespace(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Namespace> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Namespace::Default);
    };
    if let Ok(name) = obj.cast::<PyString>() {
        return Ok(Namespace::Name(name.to_str()?.to_owned()));
    }
    match uint(obj, "namespace") {
        Ok(id) => Ok(Namespace::Id(id)),
        Err(err) if err.is_instance_of::<pyo3::exceptions::PyTypeError>(obj.py()) => {
            Err(wrong_type(format!(
                "namespace must be None, a str or an int in [0, 2**64), got {}",
                describe(obj)
            )))
        }
        Err(err) => Err(err),
    }
}

/// An eviction policy by name: a str naming one of `Policy::NAMES`.
pub(crate) fn policy(obj: &Bound<'_, PyAny>) -> PyResult<Policy> {
    match obj.cast::<PyString>() {
        Ok(name) => name.to_str()?.parse().map_err(crate::errors::evict_error),
        Err(_) => Err(wrong_type(format!(
            "policy must be a str, one of {}, got {}",
            Policy::NAMES.join(", "),
            describe(obj)
        ))),
    }
}

/// A `policy` argument, extracted by `policy` (so `None` or a number is an
/// `ArgumentTypeError`, an unknown name an `UnknownPolicyError`).
pub(crate) struct PolicyArg(pub(crate) Policy);

impl PolicyArg {
    pub(crate) const DEFAULT: Self = Self(Policy::DEFAULT);
}

impl<'a, 'py> FromPyObject<'a, 'py> for PolicyArg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        policy(&obj).map(Self)
    }
}

/// Snapshot bytes (`bytes` or `bytearray`); anything else is a
/// `SnapshotError` naming its type.
pub(crate) fn snapshot_bytes(data: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = data.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(b) = data.cast::<PyByteArray>() {
        return Ok(b.to_vec());
    }
    Err(SnapshotError::new_err(format!(
        "snapshot data must be bytes, got {}",
        describe(data)
    )))
}

pub(crate) fn pages_array(py: Python<'_>, pages: &[u64]) -> Py<PyArray1<i64>> {
    // Page ids came in as non-negative int64 values, so they fit.
    PyArray1::from_vec(py, pages.iter().map(|p| *p as i64).collect()).unbind()
}
