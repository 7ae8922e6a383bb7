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
            let module = ERRORS_MODULE
                .get_or_try_init(py, || py.import("cpkv.errors").map(Bound::unbind))?;
            Ok(module.bind(py).getattr(class_name)?.cast_into::<PyType>()?)
        };
        match lookup() {
            Ok(class) => PyErr::from_type(class, message),
            Err(err) => err,
        }
    })
}

/// `cpkv_allocator::AllocError` as its `cpkv.errors` class.
pub(crate) fn alloc_error(err: cpkv_allocator::AllocError) -> PyErr {
    use cpkv_allocator::AllocError as E;
    let class = match &err {
        E::UnknownKey { .. } => "UnknownKeyError",
        E::DuplicateKey { .. } | E::RepeatedKeyInBatch { .. } => "DuplicateKeyError",
        E::UnknownPayload { .. } | E::EmptyPayloadName | E::RepeatedPayload { .. } => {
            "UnknownPayloadError"
        }
        E::NoPayloads
        | E::TooManyPayloads { .. }
        | E::InvalidCapacity { .. }
        | E::InvalidPages { .. }
        | E::InvalidSplit { .. }
        | E::SameSplitKeys { .. } => "InvalidArgumentError",
        E::NotCommitted { .. } => "NotCommittedError",
        E::CorruptSnapshot { .. } => "SnapshotError",
    };
    cpkv_error(class, err.to_string())
}

/// `cpkv_evict::EvictError` as its `cpkv.errors` class.
pub(crate) fn evict_error(err: cpkv_evict::EvictError) -> PyErr {
    use cpkv_evict::EvictError as E;
    let class = match &err {
        E::UnknownNode(_) => "UnknownNodeError",
        E::UnknownPolicy(_) => "UnknownPolicyError",
        E::LockUnderflow(_) => "LockError",
        E::HostKeyInUse(_) => "DuplicateKeyError",
        E::InvalidTokens(_)
        | E::PageCountMismatch { .. }
        | E::InvalidTier { .. }
        | E::PageInUse(_)
        | E::RootNode(_) => "InvalidArgumentError",
        E::CorruptSnapshot(_) => "SnapshotError",
    };
    cpkv_error(class, err.to_string())
}
