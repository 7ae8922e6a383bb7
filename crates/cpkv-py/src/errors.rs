//! The one place where core errors become Python exceptions.
//!
//! The hierarchy itself lives in `cpkv/errors.py` (Python allows the multiple
//! inheritance it needs: `UnknownKeyError` is both a `CpkvError` and a
//! `KeyError`); this module looks the classes up once and raises them.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

static ERRORS_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// Builds an exception of the `cpkv.errors` class `class_name` with `message`.
pub(crate) fn cpkv_error(class_name: &str, message: String) -> PyErr {
    Python::attach(|py| {
        let lookup = || -> PyResult<Bound<'_, PyType>> {
            let module = ERRORS_MODULE.get_or_try_init(py, || {
                py.import("cpkv.errors").map(Bound::unbind)
            })?;
            Ok(module.bind(py).getattr(class_name)?.cast_into::<PyType>()?)
        };
        match lookup() {
            Ok(class) => PyErr::from_type(class, message),
            Err(err) => err,
        }
    })
}
