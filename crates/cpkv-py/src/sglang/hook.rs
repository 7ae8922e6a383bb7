//! A fault-injection hook: a Python callable a test sets on a native object,
//! which runs it at one point of its protocol (a writer killed mid-write, an
//! entry reused under a reader).

use std::sync::{Mutex, PoisonError};

use pyo3::prelude::*;

use crate::convert::{describe, wrong_type};

#[derive(Default)]
pub(crate) struct TestHook(Mutex<Option<Py<PyAny>>>);

impl TestHook {
    /// Sets the callable, or removes it with `None`.
    pub(crate) fn set(&self, hook: &Bound<'_, PyAny>) -> PyResult<()> {
        if !hook.is_none() && !hook.is_callable() {
            return Err(wrong_type(format!(
                "hook must be callable or None, got {}",
                describe(hook)
            )));
        }
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) =
            (!hook.is_none()).then(|| hook.clone().unbind());
        Ok(())
    }

    /// The callable, if one is set.
    pub(crate) fn get(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|h| h.clone_ref(py))
    }
}
