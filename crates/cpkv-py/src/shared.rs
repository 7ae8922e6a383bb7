//! One core object shared by Python threads.
//!
//! Each wrapper keeps its core behind a `Mutex`. A call takes the lock while
//! holding the GIL only when the lock is free; when another thread holds it
//! (that thread may be running a long call without the GIL), the caller
//! releases the GIL before it waits, so no thread ever waits on a cpkv lock
//! while holding the GIL and every Python thread keeps running. Calls that can
//! run long (many victims, batches, snapshots) run without the GIL throughout.

use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

use pyo3::prelude::*;

pub(crate) struct Shared<T>(Mutex<T>);

impl<T: Send> Shared<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(Mutex::new(value))
    }

    /// The lock, waited for without the GIL. A panic cannot poison it in
    /// practice (core calls validate and do not panic); if one did, the state
    /// it left is still the best there is, and the digest will tell.
    fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the core: with the GIL if the lock is free, else waiting
    /// for the lock (and running `f`) without it.
    pub(crate) fn with<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut T) -> R + Send) -> R {
        match self.0.try_lock() {
            Ok(mut guard) => f(&mut guard),
            Err(TryLockError::Poisoned(poisoned)) => f(&mut poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => py.detach(|| f(&mut self.lock())),
        }
    }

    /// Runs `f` on the core without the GIL (for calls that can run long).
    pub(crate) fn detached<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut T) -> R + Send,
    ) -> R {
        py.detach(|| f(&mut self.lock()))
    }
}
