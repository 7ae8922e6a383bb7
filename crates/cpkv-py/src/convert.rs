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

pub(crate) fn invalid(message: String) -> PyErr {
    cpkv_error("InvalidArgumentError", message)
}

/// A 1-D sequence of non-negative integers (numpy integer array or a
/// list/tuple of ints); floats, bools, nesting and negatives are refused.
pub(crate) fn int_vector(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u64>> {
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        if array.ndim() != 1 {
            return Err(invalid(format!(
                "{what} must be 1-D, got {} dimensions",
                array.ndim()
            )));
        }
        let kind = array.dtype().kind();
        let values: Vec<i128> = match kind {
            b'i' => {
                let a: PyReadonlyArray1<'_, i64> =
                    obj.call_method1("astype", ("int64",))?.extract()?;
                a.as_array().iter().map(|v| i128::from(*v)).collect()
            }
            b'u' => {
                let a: PyReadonlyArray1<'_, u64> =
                    obj.call_method1("astype", ("uint64",))?.extract()?;
                a.as_array().iter().map(|v| i128::from(*v)).collect()
            }
            _ => {
                let dtype = array.dtype().str()?.to_string();
                return Err(invalid(format!(
                    "{what} must be integers, got dtype {dtype}"
                )));
            }
        };
        return non_negative(values, what);
    }
    if obj.is_instance_of::<PyString>() || !(obj.hasattr("__len__")? && obj.hasattr("__iter__")?) {
        let type_name = obj.get_type().name()?;
        return Err(invalid(format!(
            "{what} must be a 1-D integer sequence, got {type_name}"
        )));
    }
    let mut values = Vec::with_capacity(obj.len()?);
    for (i, item) in obj.try_iter()?.enumerate() {
        let item = item?;
        // Python ints and numpy integer scalars (anything with __index__),
        // but not bools (numpy's included) even though they convert.
        let type_name = item.get_type().name()?.to_string();
        let value =
            match item.is_instance_of::<PyBool>() || type_name == "bool" || type_name == "bool_" {
                true => None,
                false => item.extract::<i128>().ok(),
            };
        let Some(value) = value else {
            return Err(invalid(format!(
                "{what}[{i}] must be an int, got {type_name}"
            )));
        };
        values.push(value);
    }
    non_negative(values, what)
}

fn non_negative(values: Vec<i128>, what: &str) -> PyResult<Vec<u64>> {
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            u64::try_from(v).map_err(|_| invalid(format!("{what}[{i}] = {v} is out of range")))
        })
        .collect()
}

/// A non-negative int that fits in u64 (bools and floats refused).
pub(crate) fn uint(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<PyInt>() {
        let type_name = obj.get_type().name()?;
        return Err(invalid(format!("{what} must be an int, got {type_name}")));
    }
    let value: i128 = obj
        .extract()
        .map_err(|_| invalid(format!("{what} = {obj} is out of range")))?;
    u64::try_from(value).map_err(|_| invalid(format!("{what} = {value} is out of range")))
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

pub(crate) fn pages_array(py: Python<'_>, pages: &[u64]) -> Py<PyArray1<i64>> {
    // Page ids came in as non-negative int64 values, so they fit.
    PyArray1::from_vec(py, pages.iter().map(|p| *p as i64).collect()).unbind()
}
