//! The one place where core errors become Python exceptions.
//!
//! The hierarchy itself lives in `cpkv/errors.py` (Python allows the multiple
//! inheritance it needs: `UnknownKeyError` is both a `CpkvError` and a
//! `KeyError`). Each class the binding raises is a Rust type here
//! (`import_exception!`), its class object imported once, when the module is
//! initialised (`import_classes`), so a call site names a type, never a string,
//! and a missing class fails the import rather than a later call. Each core
//! error type has one conversion: `alloc_error`, `evict_error`, `l3_error`,
//! `tier_error`; the slab protocol's (`cpkv_slab`) errors are broken
//! invariants, raised as `InternalError`, and a refused copy table
//! (`cpkv_copy`) is a `CopyTableError`.

use pyo3::exceptions::{PyException, PyImportError};
use pyo3::import_exception;
use pyo3::prelude::*;
use pyo3::types::PyType;

/// One Rust type per class, and `import_classes`, from one list.
macro_rules! cpkv_errors {
    ($($class:ident),+ $(,)?) => {
        $(import_exception!(cpkv.errors, $class);)+

        /// Imports every class once, at module initialisation: a class missing
        /// from `cpkv.errors` (or not an exception) fails `import cpkv._cpkv`
        /// with an `ImportError`; afterwards each is cached in its type.
        pub(crate) fn import_classes(py: Python<'_>) -> PyResult<()> {
            let module = py.import("cpkv.errors")?;
            $(
                // Checked here first: the type's own lookup would panic.
                let found = module.getattr(stringify!($class)).ok();
                let class = found.and_then(|c| c.cast_into::<PyType>().ok());
                if !class.is_some_and(|c| c.is_subclass_of::<PyException>().unwrap_or(false)) {
                    return Err(PyImportError::new_err(concat!(
                        "cpkv.errors.", stringify!($class), " is missing or not an exception class"
                    )));
                }
                py.get_type::<$class>();
            )+
            Ok(())
        }
    };
}

cpkv_errors!(
    CpkvError,
    UnknownKeyError,
    DuplicateKeyError,
    UnknownNodeError,
    InvalidArgumentError,
    ArgumentTypeError,
    UnknownPayloadError,
    NotCommittedError,
    SnapshotError,
    UnknownPolicyError,
    LockError,
    CopyTableError,
    DivergenceError,
    InternalError,
);

/// `cpkv_allocator::AllocError` as its `cpkv.errors` class.
pub(crate) fn alloc_error(err: cpkv_allocator::AllocError) -> PyErr {
    use cpkv_allocator::AllocError as E;
    let message = err.to_string();
    match &err {
        E::UnknownKey { .. } | E::NotHeld { .. } => UnknownKeyError::new_err(message),
        E::DuplicateKey { .. } | E::RepeatedKeyInBatch { .. } | E::RepeatedPageInBatch { .. } => {
            DuplicateKeyError::new_err(message)
        }
        E::UnknownPayload { .. } | E::EmptyPayloadName | E::RepeatedPayload { .. } => {
            UnknownPayloadError::new_err(message)
        }
        E::NoPayloads
        | E::TooManyPayloads { .. }
        | E::InvalidCapacity { .. }
        | E::InvalidPages { .. }
        | E::InvalidSplit { .. }
        | E::SameSplitKeys { .. } => InvalidArgumentError::new_err(message),
        E::NotCommitted { .. } => NotCommittedError::new_err(message),
        E::CorruptSnapshot { .. } => SnapshotError::new_err(message),
    }
}

/// `cpkv_evict::EvictError` as its `cpkv.errors` class.
pub(crate) fn evict_error(err: cpkv_evict::EvictError) -> PyErr {
    use cpkv_evict::EvictError as E;
    let message = err.to_string();
    match &err {
        E::UnknownNode(_) => UnknownNodeError::new_err(message),
        E::UnknownPolicy(_) => UnknownPolicyError::new_err(message),
        E::LockUnderflow(_) => LockError::new_err(message),
        E::HostKeyInUse(_) => DuplicateKeyError::new_err(message),
        E::InvalidTokens(_)
        | E::PageCountMismatch { .. }
        | E::InvalidTier { .. }
        | E::PageInUse(_)
        | E::RootNode(_)
        | E::InvalidSampling(_) => InvalidArgumentError::new_err(message),
        E::CorruptSnapshot(_) => SnapshotError::new_err(message),
    }
}

/// `cpkv_tier::l3::L3Error` as its `cpkv.errors` class.
pub(crate) fn l3_error(err: cpkv_tier::l3::L3Error) -> PyErr {
    use cpkv_tier::l3::L3Error as E;
    match err {
        E::RepeatedKey { .. } => DuplicateKeyError::new_err(err.to_string()),
        E::Argument { .. } | E::BatchTooLarge { .. } | E::Batch { .. } => {
            InvalidArgumentError::new_err(err.to_string())
        }
    }
}

/// `cpkv_tier::TierError` as its `cpkv.errors` class (a wrapped tree
/// error as that error's own class).
pub(crate) fn tier_error(err: cpkv_tier::TierError) -> PyErr {
    use cpkv_tier::TierError as E;
    match err {
        E::Tree(e) => evict_error(e),
        E::NotLocked(_) => LockError::new_err(err.to_string()),
        E::Divergence(_) => DivergenceError::new_err(err.to_string()),
        E::Config { .. }
        | E::Argument { .. }
        | E::PageOutOfRange { .. }
        | E::PageNotHeld { .. }
        | E::RepeatedPage { .. }
        | E::FutureTicket { .. }
        | E::BadKey { .. } => InvalidArgumentError::new_err(err.to_string()),
    }
}
