//! `L3Staging`: the Python side of `cpkv_slab::StagingArea`, the node-shared
//! L3 read-staging area (the protocol, its states and claims, is documented
//! there). The calls run without the GIL unless a test hook is set.

use std::sync::{PoisonError, RwLock, RwLockReadGuard, TryLockError};
use std::time::Duration;

use cpkv_slab::staging::{reason_code, Found};
use cpkv_slab::{
    Outcome, StagingArea, StagingError, Want, MAX_STAGED_SEQUENCE, MAX_STAGING_ENTRIES,
};
use numpy::{PyArrayMethods, PyReadwriteArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::hook::TestHook;
use super::pool::tensor_region;
use crate::convert::{describe, int_vector, invalid, uint, wrong_type};
use crate::errors::InternalError;
use crate::shared::unshared;

#[pyclass(frozen, name = "L3Staging", module = "cpkv._cpkv")]
pub(crate) struct L3Staging {
    entries: u64,
    entry_bytes: u64,
    page_bytes: u64,
    _owners: Vec<Py<PyAny>>,
    area: RwLock<Option<StagingArea>>,
    copy_hook: TestHook,
}

/// Per record: its outcome (the class constants), the word seen or claimed,
/// a failure's reason. (Codes as u32: a `Vec<u8>` would reach Python as bytes.)
type Decided = (Vec<u32>, Vec<u64>, Vec<Option<&'static str>>);
/// `Decided`, and per record whether this rank took a dead or stuck claim over.
type Waited = (Vec<u32>, Vec<u64>, Vec<Option<&'static str>>, Vec<bool>);

fn decided<'a>(found: impl IntoIterator<Item = &'a Found>) -> Decided {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for f in found {
        out.0.push(f.outcome as u32);
        out.1.push(f.word);
        out.2.push(f.reason);
    }
    out
}

fn staging_error(e: StagingError) -> PyErr {
    match e {
        StagingError::Refused(e) => invalid(e),
        StagingError::Failed(e) => InternalError::new_err(format!("L3 staging: {e}")),
    }
}

impl L3Staging {
    fn open(&self, py: Python<'_>) -> PyResult<RwLockReadGuard<'_, Option<StagingArea>>> {
        let guard = loop {
            match self.area.try_read() {
                Ok(g) => break g,
                Err(TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(TryLockError::WouldBlock) => py.detach(|| drop(self.area.read())),
            }
        };
        if guard.is_none() {
            return Err(invalid("the L3 staging area is closed".to_string()));
        }
        Ok(guard)
    }

    fn wants(
        keys: &Bound<'_, PyAny>,
        slots: &Bound<'_, PyAny>,
        sequences: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<Want>> {
        let (keys, slots, sequences) = (
            int_vector(keys, "keys")?,
            int_vector(slots, "slots")?,
            int_vector(sequences, "sequences")?,
        );
        if keys.len() != slots.len() || keys.len() != sequences.len() {
            return Err(invalid(format!(
                "keys, slots and sequences differ in length: {}, {}, {}",
                keys.len(),
                slots.len(),
                sequences.len()
            )));
        }
        Ok((0..keys.len())
            .map(|i| Want {
                key: keys[i],
                slot: slots[i],
                sequence: sequences[i],
            })
            .collect())
    }

    /// `out` as the rows of the call's pages (`[n, page_bytes]`, C-contiguous).
    fn out_rows<'a>(
        &self,
        out: &'a mut PyReadwriteArray2<'_, u8>,
        pages: usize,
    ) -> PyResult<&'a mut [u8]> {
        let shape = out.shape().to_vec();
        if shape != [pages, self.page_bytes as usize] {
            return Err(invalid(format!(
                "out has shape {shape:?}, {pages} pages of {} bytes were expected",
                self.page_bytes
            )));
        }
        out.as_slice_mut()
            .map_err(|_| invalid("out must be a C-contiguous uint8 array".to_string()))
    }

    /// Runs `work` without the GIL, or with it and the hook between copies and
    /// re-checks when a test set one.
    fn run<R: Send>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&mut dyn FnMut() -> Result<(), String>) -> Result<R, StagingError> + Send,
    ) -> PyResult<R> {
        let done = match self.copy_hook.get(py) {
            None => py.detach(|| work(&mut || Ok(()))),
            Some(hook) => work(&mut || {
                hook.call0(py)
                    .map(drop)
                    .map_err(|e| format!("the copy hook raised: {e}"))
            }),
        };
        done.map_err(staging_error)
    }
}

#[pymethods]
impl L3Staging {
    /// `data`: the area's uint8 `[entries, page_bytes + L3_HEADER_BYTES]`
    /// (shared memory); `words`: its int64 `[entries, 2]` (state word, reason);
    /// `namespace`: the store's namespace id (a staged copy is checked as a
    /// disk read is).
    #[new]
    fn new(
        data: &Bound<'_, PyAny>,
        words: &Bound<'_, PyAny>,
        page_bytes: &Bound<'_, PyAny>,
        namespace: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let page_bytes = uint(page_bytes, "page_bytes")?;
        let namespace = uint(namespace, "namespace")?;
        let area = StagingArea::new(
            tensor_region(data, "staging data")?,
            tensor_region(words, "staging words")?,
            page_bytes,
            namespace,
        )
        .map_err(invalid)?;
        Ok(Self {
            entries: area.entries(),
            entry_bytes: area.entry_bytes(),
            page_bytes,
            _owners: vec![data.clone().unbind(), words.clone().unbind()],
            area: RwLock::new(Some(area)),
            copy_hook: TestHook::default(),
        })
    }

    /// Per record `(keys[i], slots[i], sequences[i])`: the outcome code (the
    /// class's constants), the state word seen or claimed, and a failure's
    /// reason; a served page is in `out[i]` (uint8 `[n, page_bytes]`).
    fn take(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        slots: &Bound<'_, PyAny>,
        sequences: &Bound<'_, PyAny>,
        mut out: PyReadwriteArray2<'_, u8>,
    ) -> PyResult<Decided> {
        let wants = Self::wants(keys, slots, sequences)?;
        let guard = self.open(py)?;
        let area = guard.as_ref().expect("open");
        let rows = self.out_rows(&mut out, wants.len())?;
        self.run(py, |after_copy| {
            area.take(&wants, rows, after_copy)
                .map(|found| decided(&found))
        })
    }

    /// Waits for records `take` answered `WAIT` (`words[i]`: the word it saw),
    /// each until its word moves (then decided as `take` does; a new claim of
    /// the same record is waited for afresh) or stays the same for
    /// `timeout_s`: then this rank takes the claim over (`CLAIMED`; the fourth
    /// list says which). Polls with a backoff of 20 us up to 1 ms.
    #[allow(clippy::too_many_arguments)]
    fn wait(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        slots: &Bound<'_, PyAny>,
        sequences: &Bound<'_, PyAny>,
        words: &Bound<'_, PyAny>,
        mut out: PyReadwriteArray2<'_, u8>,
        timeout_s: f64,
    ) -> PyResult<Waited> {
        if !(0.0..=604_800.0).contains(&timeout_s) {
            return Err(invalid(format!(
                "timeout_s must be a number of seconds in [0, 604800], got {timeout_s}"
            )));
        }
        let wants = Self::wants(keys, slots, sequences)?;
        let seen = int_vector(words, "words")?;
        if seen.len() != wants.len() {
            return Err(invalid(format!(
                "{} words for {} records",
                seen.len(),
                wants.len()
            )));
        }
        let guard = self.open(py)?;
        let area = guard.as_ref().expect("open");
        let rows = self.out_rows(&mut out, wants.len())?;
        let timeout = Duration::from_secs_f64(timeout_s);
        self.run(py, move |after_copy| {
            let waited = area.wait(&wants, &seen, rows, timeout, after_copy)?;
            let (codes, words, reasons) = decided(waited.iter().map(|(f, _)| f));
            Ok((
                codes,
                words,
                reasons,
                waited.iter().map(|&(_, t)| t).collect(),
            ))
        })
    }

    /// Publishes the records this rank claimed (`claims[i]`: the claim's
    /// word): a good one (`reasons[i]` None) is copied from `records` (uint8,
    /// 1-d; whole records as they lie on disk, record `i` at `offsets[i]`)
    /// into its entry (its payload, then its header) and marked ready; a
    /// failed one marked failed with its reason. Per record whether it was
    /// published (False: the claim was taken over meanwhile).
    fn publish(
        &self,
        py: Python<'_>,
        slots: &Bound<'_, PyAny>,
        claims: &Bound<'_, PyAny>,
        records: &Bound<'_, PyAny>,
        offsets: &Bound<'_, PyAny>,
        reasons: Vec<Option<String>>,
    ) -> PyResult<Vec<bool>> {
        let (slots, claims) = (int_vector(slots, "slots")?, int_vector(claims, "claims")?);
        let offsets = int_vector(offsets, "offsets")?;
        let codes = reasons
            .iter()
            .map(|r| r.as_deref().map(reason_code).transpose())
            .collect::<Result<Vec<_>, _>>()
            .map_err(staging_error)?;
        let array = records.cast::<numpy::PyArray1<u8>>().map_err(|_| {
            wrong_type(format!(
                "records must be a 1-d uint8 array, got {}",
                describe(records)
            ))
        })?;
        let readonly = array.readonly();
        let bytes = readonly
            .as_slice()
            .map_err(|_| invalid("records must be contiguous".to_string()))?;
        let guard = self.open(py)?;
        let area = guard.as_ref().expect("open");
        unshared(py, || {
            area.publish(&slots, &claims, bytes, &offsets, &codes)
        })?
        .map_err(staging_error)
    }

    /// Gives up claims this rank cannot complete (its disk read raised): the
    /// entries go back to empty, so no rank waits for them.
    fn abandon(
        &self,
        py: Python<'_>,
        slots: &Bound<'_, PyAny>,
        claims: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (slots, claims) = (int_vector(slots, "slots")?, int_vector(claims, "claims")?);
        let guard = self.open(py)?;
        guard
            .as_ref()
            .expect("open")
            .abandon(&slots, &claims)
            .map_err(staging_error)
    }

    /// (sequence, version, state) of the entry of `slot` (tests; the states:
    /// 0 empty, 1 reading, 2 ready, 3 failed).
    fn entry_state(&self, py: Python<'_>, slot: u64) -> PyResult<(u64, u64, u64)> {
        let guard = self.open(py)?;
        Ok(guard.as_ref().expect("open").entry_state(slot))
    }

    /// A callable run between a copy out of an entry and the re-check of its
    /// word (tests: another rank reusing the entry under a reader); `None`
    /// removes it. With a hook set, the calls hold the GIL.
    fn set_copy_hook(&self, hook: &Bound<'_, PyAny>) -> PyResult<()> {
        self.copy_hook.set(hook)
    }

    /// Waits for every call in flight, then refuses every later call (the
    /// memory may be unmapped after this returns).
    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            *self.area.write().unwrap_or_else(PoisonError::into_inner) = None;
        });
    }

    #[getter]
    fn entries(&self) -> u64 {
        self.entries
    }

    #[getter]
    fn entry_bytes(&self) -> u64 {
        self.entry_bytes
    }

    #[classattr]
    const SERVED: u8 = Outcome::Served as u8;
    #[classattr]
    const FAILED: u8 = Outcome::Failed as u8;
    #[classattr]
    const CLAIMED: u8 = Outcome::Claimed as u8;
    #[classattr]
    const WAIT: u8 = Outcome::Wait as u8;
    #[classattr]
    const BUSY: u8 = Outcome::Busy as u8;
    #[classattr]
    const REUSED: u8 = Outcome::Reused as u8;
    #[classattr]
    const TORN: u8 = Outcome::Torn as u8;
    #[classattr]
    const BYPASS: u8 = Outcome::Bypass as u8;
    #[classattr]
    const MAX_ENTRIES: u64 = MAX_STAGING_ENTRIES;
    #[classattr]
    const MAX_SEQUENCE: u64 = MAX_STAGED_SEQUENCE;
}
