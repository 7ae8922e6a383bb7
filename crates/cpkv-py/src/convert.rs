//! Python arguments into exact Rust values, and page lists back into numpy.
//!
//! Shared by every wrapper, so the same kind of argument is refused the same
//! way (an `InvalidArgumentError` naming it) whichever class it is passed to.

use cpkv_evict::Namespace;
use numpy::{
    PyArray1, PyArrayDescrMethods, PyReadonlyArray1, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString};

use crate::errors::cpkv_error;
use pyo3::types::{PyByteArray, PyBytes};

pub(crate) fn invalid(message: String) -> PyErr {
    cpkv_error("InvalidArgumentError", message)
}

/// A 1-D sequence of integers in [0, 2**64): a numpy integer array (read
/// in place when it is already int64/uint64) or a list/tuple of ints (numpy
/// integer scalars included); floats, bools, nesting and negatives are refused.
pub(crate) fn int_vector(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u64>> {
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        return int_array(obj, array, what);
    }
    if obj.is_instance_of::<PyString>() || !(obj.hasattr("__len__")? && obj.hasattr("__iter__")?) {
        let type_name = obj.get_type().name()?;
        return Err(invalid(format!(
            "{what} must be a 1-D integer sequence, got {type_name}"
        )));
    }
    let mut values = Vec::with_capacity(obj.len()?);
    for (i, item) in obj.try_iter()?.enumerate() {
        // The element's name is formatted only for an error message.
        values.push(uint_named(&item?, &|| format!("{what}[{i}]"))?);
    }
    Ok(values)
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
    match array.dtype().kind() {
        b'u' => {
            let a: PyReadonlyArray1<'_, u64> = match obj.extract() {
                Ok(a) => a,
                Err(_) => obj.call_method1("astype", ("uint64",))?.extract()?,
            };
            Ok(a.as_array().to_vec())
        }
        b'i' => {
            let a: PyReadonlyArray1<'_, i64> = match obj.extract() {
                Ok(a) => a,
                Err(_) => obj.call_method1("astype", ("int64",))?.extract()?,
            };
            a.as_array()
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    u64::try_from(v)
                        .map_err(|_| invalid(format!("{what}[{i}] = {v} is out of range")))
                })
                .collect()
        }
        _ => {
            let dtype = array.dtype().str()?.to_string();
            Err(invalid(format!(
                "{what} must be integers, got dtype {dtype}"
            )))
        }
    }
}

/// An int in [0, 2**64): a Python int or a numpy integer scalar (anything
/// with `__index__`), never a bool (numpy's included) or a float.
pub(crate) fn uint(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    uint_named(obj, &|| what.to_owned())
}

/// `uint` with the argument's name built only when there is an error to name it in.
fn uint_named(obj: &Bound<'_, PyAny>, name: &dyn Fn() -> String) -> PyResult<u64> {
    // The hot path: an exact int in range (bools are a subclass, not exact).
    if obj.is_exact_instance_of::<PyInt>() {
        if let Some(value) = exact_int_u64(obj) {
            return Ok(value);
        }
    }
    let what = name();
    let type_name = obj.get_type().name()?;
    let is_bool = obj.is_instance_of::<PyBool>() || type_name == "bool_" || type_name == "bool";
    let int_like = obj.is_instance_of::<PyInt>() || obj.hasattr("__index__")?;
    if is_bool || !int_like {
        return Err(invalid(format!("{what} must be an int, got {type_name}")));
    }
    let value: i128 = match obj.extract() {
        Ok(v) => v,
        // Beyond i128 (or an `__index__` that fails): name the value.
        Err(err)
            if err.is_instance_of::<pyo3::exceptions::PyOverflowError>(obj.py())
                || err.is_instance_of::<pyo3::exceptions::PyTypeError>(obj.py()) =>
        {
            return Err(invalid(format!(
                "{what} = {obj} is out of range [0, 2**64)"
            )));
        }
        Err(err) => return Err(err),
    };
    u64::try_from(value)
        .map_err(|_| invalid(format!("{what} = {value} is out of range [0, 2**64)")))
}

/// An exact `int` in [0, 2**64), read with one C call; `None` (no error
/// left set) otherwise. Where C's `unsigned long` has 64 bits it is read with
/// `PyLong_AsUnsignedLong`, which walks the digits in place; `extract::<u64>`
/// goes through `PyLong_AsUnsignedLongLong`, whose multi-digit path builds a
/// byte array (keys are usually hashes, so multi-digit).
fn exact_int_u64(obj: &Bound<'_, PyAny>) -> Option<u64> {
    if std::mem::size_of::<std::os::raw::c_ulong>() != 8 {
        return obj.extract::<u64>().ok();
    }
    // SAFETY: `obj` is a live exact int and we hold the GIL (the `Bound`).
    let value = unsafe { pyo3::ffi::PyLong_AsUnsignedLong(obj.as_ptr()) };
    if value == std::os::raw::c_ulong::MAX && PyErr::take(obj.py()).is_some() {
        return None;
    }
    // `c_ulong` is `u64` here, `u32` on Windows: the conversion is the identity only here.
    #[allow(clippy::useless_conversion)]
    Some(u64::from(value))
}

/// `uint`'s rule as a yes/no, for callers with their own message.
pub(crate) fn strict_u64(obj: &Bound<'_, PyAny>) -> Result<u64, ()> {
    uint(obj, "").map_err(|_| ())
}

pub(crate) fn namespace(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Namespace> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Namespace::Default);
    };
    if obj.is_instance_of::<PyString>() {
        return Ok(Namespace::Name(obj.extract()?));
    }
    if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>() {
        if let Ok(id) = obj.extract::<u64>() {
            return Ok(Namespace::Id(id));
        }
    }
    Err(invalid(format!(
        "namespace must be None, a str or a non-negative int, got {obj}"
    )))
}

/// Snapshot bytes (`bytes` or `bytearray`); anything else is a
/// `SnapshotError` naming its type.
pub(crate) fn snapshot_bytes(data: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = data.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if data.is_instance_of::<PyByteArray>() {
        return data.extract();
    }
    Err(cpkv_error(
        "SnapshotError",
        format!(
            "snapshot data must be bytes, got {}",
            data.get_type().name()?
        ),
    ))
}

pub(crate) fn pages_array(py: Python<'_>, pages: &[u64]) -> Py<PyArray1<i64>> {
    // Page ids came in as non-negative int64 values, so they fit.
    PyArray1::from_vec(py, pages.iter().map(|p| *p as i64).collect()).unbind()
}
