//! The one concurrency rule of every binding class: one core object shared
//! by Python threads behind one lock, never waited on while holding the GIL,
//! and one poison rule.
//!
//! A call takes the lock while holding the GIL only when the lock is free;
//! when another thread holds it (that thread may be in a long call without
//! the GIL), the caller releases the GIL before it waits, so every Python
//! thread keeps running. Calls that can run long (many victims, batches,
//! snapshots) run without the GIL throughout. Python objects are built by
//! the caller after the lock is released, so no Python code runs under it.
//!
//! Classes whose state never changes after construction (results,
//! `Placement`, `RowSources`) hold no lock: they are read-only.
//!
//! Poison rule: a core call that panics is a bug in cpkv. The panic does not
//! cross into Python as `PanicException`: the call raises `InternalError`,
//! and because the core may have been left half-changed (its digest no
//! longer trustworthy), the object refuses every later call with
//! `InternalError` too. Rebuild it (from a peer's snapshot where there is one).

use std::panic::{self, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard, TryLockError};

use pyo3::prelude::*;

use crate::errors::InternalError;

pub(crate) struct Shared<T>(Mutex<T>);

fn poisoned() -> PyErr {
    InternalError::new_err(
        "this object is unusable: an earlier call failed inside cpkv (a bug) and may have \
         left it half-changed; build a new one",
    )
}

/// `after` says what the panic left behind.
fn panicked(payload: &(dyn std::any::Any + Send), after: &str) -> PyErr {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into());
    InternalError::new_err(format!(
        "a call failed inside cpkv (a bug): {what}; {after}"
    ))
}

/// Runs `f`, work on no shared core (building one from arguments or bytes,
/// a row copy), without the GIL, turning a panic into `InternalError` as the
/// poison rule does.
pub(crate) fn unshared<R: Send>(py: Python<'_>, f: impl FnOnce() -> R + Send) -> PyResult<R> {
    py.detach(|| panic::catch_unwind(AssertUnwindSafe(f)))
        .map_err(|payload| panicked(payload.as_ref(), "no shared object was touched"))
}

impl<T: Send> Shared<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(Mutex::new(value))
    }

    /// Runs `f` on the locked core, turning a panic into `InternalError`;
    /// the guard is dropped while unwinding, which poisons the lock.
    fn run<'a, R>(
        lock: impl FnOnce() -> Option<MutexGuard<'a, T>>,
        f: impl FnOnce(&mut T) -> R,
    ) -> PyResult<R>
    where
        T: 'a,
    {
        match panic::catch_unwind(AssertUnwindSafe(|| lock().map(|mut core| f(&mut core)))) {
            Ok(Some(value)) => Ok(value),
            Ok(None) => Err(poisoned()),
            Err(payload) => Err(panicked(
                payload.as_ref(),
                "this object refuses every further call",
            )),
        }
    }

    /// The lock, waited for by a thread that does not hold the GIL; `None`
    /// when poisoned.
    fn wait(&self) -> Option<MutexGuard<'_, T>> {
        self.0.lock().ok()
    }

    /// Runs `f` on the core: with the GIL if the lock is free, else waiting
    /// for the lock (and running `f`) without it.
    pub(crate) fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut T) -> R + Send,
    ) -> PyResult<R> {
        match self.0.try_lock() {
            Ok(guard) => Self::run(|| Some(guard), f),
            Err(TryLockError::Poisoned(_)) => Err(poisoned()),
            Err(TryLockError::WouldBlock) => py.detach(|| Self::run(|| self.wait(), f)),
        }
    }

    /// Runs `f` on the core without the GIL (for calls that can run long).
    pub(crate) fn detached<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut T) -> R + Send,
    ) -> PyResult<R> {
        py.detach(|| Self::run(|| self.wait(), f))
    }
}
