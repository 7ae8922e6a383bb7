//! `L3Staging`: the node-shared L3 read-staging area, so that the node's
//! ranks read an L3 record from disk once, not once each.
//!
//! Shared memory of the node (a `HostSlab` the node's ranks create together):
//! `entries` entries of one record each (`page_bytes + HEADER_BYTES`: the
//! record's payload and header, without its padding, so a reader checks the
//! CRC32C of what it copied) and per entry two 64-bit words: the *state word* and the
//! failure reason. A record (slot, sequence) goes to entry `slot % entries`.
//!
//! The state word packs (sequence: 44 bits, version: 18 bits, state: 2
//! bits). The L3 index gives every placement a new sequence and never reuses
//! one while the store is open, so the sequence names the record (its slot
//! and key); the version grows with every claim, so a word read twice
//! unchanged means no claim came in between. States: empty, reading (a rank
//! claimed the entry and is reading the record from disk), ready (the entry
//! holds the checked record), failed (the record failed its check; the
//! reason word says why). Every transition is a compare-and-swap on the word.
//!
//! - `take`: per record, a ready entry of it is copied out, the word
//!   re-checked after the copy (seqlock: a claim in between means the copy
//!   is not used, `REUSED`), and the copy checked like a disk read (magic,
//!   key, sequence, namespace, length, CRC32C); a failed entry of it gives
//!   the claimant's reason; an entry being read by another rank for it is
//!   `WAIT`; an entry being read for another record is `BUSY` (read it
//!   yourself, no claim); anything else is claimed (`CLAIMED`): this rank
//!   reads the record and `publish`es it.
//! - `wait`: polls the `WAIT` entries until their word moves, then decides as
//!   `take` does; a word that has not moved for `timeout_s` (its claimant is
//!   dead or stuck) is taken over (`CLAIMED`, flagged), so no rank waits on a
//!   dead one for longer than that, and the ranks after it find the entry
//!   published.
//! - A claimant paused past the timeout may still write into an entry another
//!   rank took over; the readers' record check (CRC32C over header and
//!   payload) turns such a copy into `TORN` (read it yourself), never a page.
//!
//! Every copy goes through `copy_checked` (both ranges checked where it
//! copies); the calls run without the GIL unless a test hook is set.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, TryLockError};
use std::time::{Duration, Instant};

use cpkv_tier::l3::{decode_parts, header_at, record_bytes, Expected, HEADER_BYTES};
use numpy::{PyArrayMethods, PyReadwriteArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::hook::TestHook;
use super::pool::{copy_checked, Region};
use crate::convert::{describe, int_vector, invalid, uint, wrong_type};
use crate::errors::InternalError;

const EMPTY: u64 = 0;
const READING: u64 = 1;
const READY: u64 = 2;
const FAILED: u64 = 3;
const STATE_BITS: u32 = 2;
const VERSION_BITS: u32 = 18;
const SEQUENCE_SHIFT: u32 = STATE_BITS + VERSION_BITS;
/// The largest sequence a state word can name; a record past it bypasses
/// the staging area (read from disk by each rank, counted).
pub(crate) const MAX_STAGED_SEQUENCE: u64 = (1 << (64 - SEQUENCE_SHIFT)) - 1;
/// The most entries a staging area may have.
pub(crate) const MAX_STAGING_ENTRIES: u64 = 1 << 24;

/// What `take` and `wait` found for a record.
const SERVED: u8 = 0; // copied from the entry, checked, in `out`
const FAILED_THERE: u8 = 1; // the claimant's check failed: a miss, reason given
const CLAIMED: u8 = 2; // this rank holds the claim: read the record, then publish
const WAIT: u8 = 3; // another rank is reading it: wait
const BUSY: u8 = 4; // the entry is being read for another record: read it yourself
const REUSED: u8 = 5; // the entry was claimed again during the copy: read it yourself
const TORN: u8 = 6; // the copy failed its check with the word unchanged: read it yourself
const BYPASS: u8 = 7; // the sequence is past what a word can name: read it yourself

/// The reasons a record fails its check (`RecordReject::name`), stored by
/// index in an entry's reason word.
const REASONS: [&str; 9] = [
    "truncated",
    "bad_magic",
    "version",
    "reserved",
    "foreign_namespace",
    "wrong_key",
    "stale_sequence",
    "length",
    "checksum",
];

fn pack(sequence: u64, version: u64, state: u64) -> u64 {
    (sequence << SEQUENCE_SHIFT) | ((version & ((1 << VERSION_BITS) - 1)) << STATE_BITS) | state
}

fn unpack(word: u64) -> (u64, u64, u64) {
    (
        word >> SEQUENCE_SHIFT,
        (word >> STATE_BITS) & ((1 << VERSION_BITS) - 1),
        word & ((1 << STATE_BITS) - 1),
    )
}

/// The shared memory while the area is open.
struct Memory {
    data: Region,
    words: Region,
}

impl Memory {
    #[allow(unsafe_code)] // an aligned u64 of the area's shared memory as an atomic
    fn cell(&self, entry: u64, which: usize) -> &AtomicU64 {
        let at = entry as usize * 16 + which * 8;
        assert!(
            at + 8 <= self.words.len(),
            "entry {entry} outside the words"
        );
        // SAFETY: inside the words region (asserted), 8-byte aligned (the
        // region's address is checked at construction), mapped while the
        // area's read lock is held; every process accesses it atomically.
        unsafe { &*((self.words.address() + at) as *const AtomicU64) }
    }

    fn word(&self, entry: u64) -> &AtomicU64 {
        self.cell(entry, 0)
    }

    fn reason(&self, entry: u64) -> &AtomicU64 {
        self.cell(entry, 1)
    }
}

/// One record a call is about.
#[derive(Clone, Copy)]
struct Want {
    key: u64,
    entry: u64,
    sequence: u64,
}

/// What deciding about one record gave.
struct Found {
    code: u8,
    word: u64,
    reason: Option<&'static str>,
}

#[pyclass(frozen, name = "L3Staging", module = "cpkv._cpkv")]
pub(crate) struct L3Staging {
    entries: u64,
    entry_bytes: u64,
    page_bytes: u64,
    namespace: u64,
    _owners: Vec<Py<PyAny>>,
    memory: RwLock<Option<Memory>>,
    copy_hook: TestHook,
}

impl L3Staging {
    fn open(&self, py: Python<'_>) -> PyResult<RwLockReadGuard<'_, Option<Memory>>> {
        let guard = loop {
            match self.memory.try_read() {
                Ok(g) => break g,
                Err(TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(TryLockError::WouldBlock) => py.detach(|| drop(self.memory.read())),
            }
        };
        if guard.is_none() {
            return Err(invalid("the L3 staging area is closed".to_string()));
        }
        Ok(guard)
    }

    /// The slots of the records this rank claimed and the claims' words, one
    /// each, every word a claim.
    fn claims(
        slots: &Bound<'_, PyAny>,
        claims: &Bound<'_, PyAny>,
    ) -> PyResult<(Vec<u64>, Vec<u64>)> {
        let (slots, claims) = (int_vector(slots, "slots")?, int_vector(claims, "claims")?);
        if slots.len() != claims.len() {
            return Err(invalid(format!(
                "{} slots for {} claims",
                slots.len(),
                claims.len()
            )));
        }
        if let Some(&claim) = claims.iter().find(|&&c| unpack(c).2 != READING) {
            return Err(invalid(format!("word {claim:#x} is not a claim")));
        }
        Ok((slots, claims))
    }

    fn wants(
        &self,
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
        Ok(keys
            .iter()
            .zip(&slots)
            .zip(&sequences)
            .map(|((&key, &slot), &sequence)| Want {
                key,
                entry: slot % self.entries,
                sequence,
            })
            .collect())
    }

    /// `out` as the rows of the call's pages (`[n, page_bytes]`, C-contiguous,
    /// not overlapping the shared memory).
    fn out_rows<'a>(
        &self,
        out: &'a mut PyReadwriteArray2<'_, u8>,
        pages: usize,
        memory: &Memory,
    ) -> PyResult<&'a mut [u8]> {
        let shape = out.shape().to_vec();
        if shape != [pages, self.page_bytes as usize] {
            return Err(invalid(format!(
                "out has shape {shape:?}, {pages} pages of {} bytes were expected",
                self.page_bytes
            )));
        }
        let rows = out
            .as_slice_mut()
            .map_err(|_| invalid("out must be a C-contiguous uint8 array".to_string()))?;
        let region = Region::of_slice(rows);
        if region.overlaps(&memory.data) || region.overlaps(&memory.words) {
            return Err(invalid(
                "out overlaps the staging area's shared memory".to_string(),
            ));
        }
        Ok(rows)
    }

    fn hook(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.copy_hook.get(py)
    }

    /// Decides about one record (see the module docs); `after_copy` runs
    /// between a copy and its re-check (the test hook).
    fn decide(
        &self,
        memory: &Memory,
        want: Want,
        scratch: &mut [u8],
        out: &mut [u8],
        after_copy: &mut dyn FnMut() -> Result<(), String>,
    ) -> Result<Found, String> {
        let found = |code, word| Found {
            code,
            word,
            reason: None,
        };
        if want.sequence == 0 || want.sequence > MAX_STAGED_SEQUENCE {
            return Ok(found(BYPASS, 0));
        }
        let cell = memory.word(want.entry);
        loop {
            let word = cell.load(Ordering::Acquire);
            let (sequence, version, state) = unpack(word);
            if sequence == want.sequence {
                match state {
                    READY => {
                        let at = want.entry * self.entry_bytes;
                        copy_checked(
                            Region::of_slice(scratch),
                            0,
                            memory.data,
                            at,
                            self.entry_bytes,
                        )?;
                        after_copy()?;
                        fence(Ordering::Acquire);
                        if cell.load(Ordering::Acquire) != word {
                            return Ok(found(REUSED, word));
                        }
                        let expected = Expected {
                            namespace: self.namespace,
                            key: want.key,
                            sequence: want.sequence,
                            length: self.page_bytes,
                        };
                        let (payload, header) = scratch.split_at(self.page_bytes as usize);
                        return Ok(match decode_parts(header, payload, &expected) {
                            Ok(()) => {
                                out.copy_from_slice(payload);
                                found(SERVED, word)
                            }
                            Err(_) => found(TORN, word),
                        });
                    }
                    FAILED => {
                        let code = memory.reason(want.entry).load(Ordering::Acquire);
                        if cell.load(Ordering::Acquire) != word {
                            return Ok(found(REUSED, word));
                        }
                        return Ok(Found {
                            code: FAILED_THERE,
                            word,
                            reason: Some(REASONS.get(code as usize).copied().unwrap_or("checksum")),
                        });
                    }
                    READING => return Ok(found(WAIT, word)),
                    _ => {} // empty (a claim given up): claim it
                }
            } else if state == READING {
                return Ok(found(BUSY, word));
            }
            let claim = pack(want.sequence, version + 1, READING);
            if cell
                .compare_exchange(word, claim, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                // The claim is visible before any byte of the entry changes.
                fence(Ordering::SeqCst);
                return Ok(found(CLAIMED, claim));
            }
        }
    }

    /// Runs `work` without the GIL, or with it and the hook between copies and
    /// re-checks when a test set one.
    fn run<R: Send>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&mut dyn FnMut() -> Result<(), String>) -> Result<R, String> + Send,
    ) -> PyResult<R> {
        let done = match self.hook(py) {
            None => py.detach(|| work(&mut || Ok(()))),
            Some(hook) => work(&mut || {
                hook.call0(py)
                    .map(drop)
                    .map_err(|e| format!("the copy hook raised: {e}"))
            }),
        };
        done.map_err(|e| InternalError::new_err(format!("L3 staging: {e}")))
    }
}

/// Per record: its outcome (the class constants), the word seen or claimed,
/// a failure's reason. (Codes as u32: a `Vec<u8>` would reach Python as bytes.)
type Decided = (Vec<u32>, Vec<u64>, Vec<Option<&'static str>>);
/// `Decided`, and per record whether this rank took a dead or stuck claim over.
type Waited = (Vec<u32>, Vec<u64>, Vec<Option<&'static str>>, Vec<bool>);

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
        if page_bytes == 0 || page_bytes > cpkv_tier::l3::MAX_PAYLOAD_BYTES {
            return Err(invalid(format!(
                "page_bytes must be in 1..={}, got {page_bytes}",
                cpkv_tier::l3::MAX_PAYLOAD_BYTES
            )));
        }
        let data_region = Region::of_tensor(data, "staging data")?;
        let word_region = Region::of_tensor(words, "staging words")?;
        let entry_bytes = HEADER_BYTES as u64 + page_bytes;
        let entries = word_region.len() as u64 / 16;
        if entries == 0
            || entries > MAX_STAGING_ENTRIES
            || word_region.len() as u64 != entries * 16
            || data_region.len() as u64 != entries * entry_bytes
            || word_region.address() % 8 != 0
            || data_region.overlaps(&word_region)
        {
            return Err(invalid(format!(
                "staging data ({} bytes) and words ({} bytes) are not 1 to {MAX_STAGING_ENTRIES} entries of \
                 {entry_bytes} bytes and two aligned, separate int64 each",
                data_region.len(),
                word_region.len()
            )));
        }
        Ok(Self {
            entries,
            entry_bytes,
            page_bytes,
            namespace,
            _owners: vec![data.clone().unbind(), words.clone().unbind()],
            memory: RwLock::new(Some(Memory {
                data: data_region,
                words: word_region,
            })),
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
        let wants = self.wants(keys, slots, sequences)?;
        let guard = self.open(py)?;
        let memory = guard.as_ref().expect("open");
        let rows = self.out_rows(&mut out, wants.len(), memory)?;
        let (entry_bytes, page_bytes) = (self.entry_bytes as usize, self.page_bytes as usize);
        self.run(py, |after_copy| {
            let mut scratch = vec![0u8; entry_bytes];
            let mut decided = (Vec::new(), Vec::new(), Vec::new());
            for (want, row) in wants.iter().zip(rows.chunks_exact_mut(page_bytes)) {
                let f = self.decide(memory, *want, &mut scratch, row, after_copy)?;
                decided.0.push(u32::from(f.code));
                decided.1.push(f.word);
                decided.2.push(f.reason);
            }
            Ok(decided)
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
        let wants = self.wants(keys, slots, sequences)?;
        let mut seen = int_vector(words, "words")?;
        if seen.len() != wants.len() {
            return Err(invalid(format!(
                "{} words for {} records",
                seen.len(),
                wants.len()
            )));
        }
        let guard = self.open(py)?;
        let memory = guard.as_ref().expect("open");
        let rows = self.out_rows(&mut out, wants.len(), memory)?;
        let (entry_bytes, page_bytes) = (self.entry_bytes as usize, self.page_bytes as usize);
        let timeout = Duration::from_secs_f64(timeout_s);
        self.run(py, move |after_copy| {
            let n = wants.len();
            let mut scratch = vec![0u8; entry_bytes];
            let mut done: Vec<Option<Found>> = (0..n).map(|_| None).collect();
            let mut taken = vec![false; n];
            let mut deadline = vec![Instant::now() + timeout; n];
            let mut rows: Vec<&mut [u8]> = rows.chunks_exact_mut(page_bytes).collect();
            let mut pause = Duration::from_micros(20);
            while done.iter().any(Option::is_none) {
                for i in 0..n {
                    if done[i].is_some() {
                        continue;
                    }
                    let cell = memory.word(wants[i].entry);
                    let word = cell.load(Ordering::Acquire);
                    if word != seen[i] {
                        let f = self.decide(memory, wants[i], &mut scratch, rows[i], after_copy)?;
                        if f.code == WAIT {
                            seen[i] = f.word; // another claim of it: wait for that one afresh
                            deadline[i] = Instant::now() + timeout;
                        } else {
                            done[i] = Some(f);
                        }
                    } else if Instant::now() >= deadline[i] {
                        let (sequence, version, _) = unpack(word);
                        let claim = pack(sequence, version + 1, READING);
                        if cell
                            .compare_exchange(word, claim, Ordering::AcqRel, Ordering::Acquire)
                            .is_ok()
                        {
                            fence(Ordering::SeqCst);
                            taken[i] = true;
                            done[i] = Some(Found {
                                code: CLAIMED,
                                word: claim,
                                reason: None,
                            });
                        }
                    }
                }
                if done.iter().any(Option::is_none) {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(1));
                }
            }
            let mut decided = (Vec::new(), Vec::new(), Vec::new(), taken);
            for f in done.into_iter().flatten() {
                decided.0.push(u32::from(f.code));
                decided.1.push(f.word);
                decided.2.push(f.reason);
            }
            Ok(decided)
        })
    }

    /// Publishes the records this rank claimed (`claims[i]`: the claim's
    /// word): a good one (`reasons[i]` None) is copied from `records` (uint8,
    /// 1-d; whole records as they lie on disk, record `i` at `offsets[i]`)
    /// into its entry (its payload, then its header) and marked ready; a failed one marked failed with its
    /// reason. Per record whether it was published (False: the claim was
    /// taken over meanwhile).
    fn publish(
        &self,
        py: Python<'_>,
        slots: &Bound<'_, PyAny>,
        claims: &Bound<'_, PyAny>,
        records: &Bound<'_, PyAny>,
        offsets: &Bound<'_, PyAny>,
        reasons: Vec<Option<String>>,
    ) -> PyResult<Vec<bool>> {
        let (slots, claims) = Self::claims(slots, claims)?;
        let offsets = int_vector(offsets, "offsets")?;
        if slots.len() != offsets.len() || slots.len() != reasons.len() {
            return Err(invalid(format!(
                "slots, offsets and reasons differ in length: {}, {}, {}",
                slots.len(),
                offsets.len(),
                reasons.len()
            )));
        }
        let codes = reasons
            .iter()
            .map(|r| match r {
                None => Ok(None),
                Some(name) => REASONS
                    .iter()
                    .position(|known| known == name)
                    .map(|c| Some(c as u64))
                    .ok_or_else(|| invalid(format!("reason {name:?} is not one of {REASONS:?}"))),
            })
            .collect::<PyResult<Vec<_>>>()?;
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
        let record = record_bytes(self.page_bytes);
        if let Some(&at) = offsets.iter().find(|&&at| {
            at.checked_add(record)
                .is_none_or(|end| end > bytes.len() as u64)
        }) {
            return Err(invalid(format!(
                "a record at offset {at} of {record} bytes does not fit in records ({} bytes)",
                bytes.len()
            )));
        }
        let src = Region::of_slice(bytes);
        let guard = self.open(py)?;
        let memory = guard.as_ref().expect("open");
        let entries = self.entries;
        let (entry_bytes, page_bytes) = (self.entry_bytes, self.page_bytes);
        let header = header_at(page_bytes);
        unshared_result(py, move || {
            let mut published = Vec::with_capacity(slots.len());
            for i in 0..slots.len() {
                let entry = slots[i] % entries;
                let cell = memory.word(entry);
                let (sequence, version, _) = unpack(claims[i]);
                if cell.load(Ordering::Acquire) != claims[i] {
                    published.push(false);
                    continue;
                }
                let state = match codes[i] {
                    None => {
                        let at = entry * entry_bytes;
                        copy_checked(memory.data, at, src, offsets[i], page_bytes)?;
                        copy_checked(
                            memory.data,
                            at + page_bytes,
                            src,
                            offsets[i] + header,
                            HEADER_BYTES as u64,
                        )?;
                        READY
                    }
                    Some(code) => {
                        memory.reason(entry).store(code, Ordering::Release);
                        FAILED
                    }
                };
                // Every byte of the entry is written before the word says so.
                fence(Ordering::SeqCst);
                published.push(
                    cell.compare_exchange(
                        claims[i],
                        pack(sequence, version, state),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok(),
                );
            }
            Ok(published)
        })
    }

    /// Gives up claims this rank cannot complete (its disk read raised): the
    /// entries go back to empty, so no rank waits for them.
    fn abandon(
        &self,
        py: Python<'_>,
        slots: &Bound<'_, PyAny>,
        claims: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (slots, claims) = Self::claims(slots, claims)?;
        let guard = self.open(py)?;
        let memory = guard.as_ref().expect("open");
        for (slot, claim) in slots.iter().zip(&claims) {
            let (sequence, version, _) = unpack(*claim);
            let _ = memory.word(slot % self.entries).compare_exchange(
                *claim,
                pack(sequence, version, EMPTY),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        Ok(())
    }

    /// (sequence, version, state) of the entry of `slot` (tests; the states:
    /// 0 empty, 1 reading, 2 ready, 3 failed).
    fn entry_state(&self, py: Python<'_>, slot: u64) -> PyResult<(u64, u64, u64)> {
        let guard = self.open(py)?;
        let memory = guard.as_ref().expect("open");
        Ok(unpack(
            memory.word(slot % self.entries).load(Ordering::Acquire),
        ))
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
            *self.memory.write().unwrap_or_else(PoisonError::into_inner) = None;
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
    const SERVED: u8 = SERVED;
    #[classattr]
    const FAILED: u8 = FAILED_THERE;
    #[classattr]
    const CLAIMED: u8 = CLAIMED;
    #[classattr]
    const WAIT: u8 = WAIT;
    #[classattr]
    const BUSY: u8 = BUSY;
    #[classattr]
    const REUSED: u8 = REUSED;
    #[classattr]
    const TORN: u8 = TORN;
    #[classattr]
    const BYPASS: u8 = BYPASS;
    #[classattr]
    const MAX_ENTRIES: u64 = MAX_STAGING_ENTRIES;
    #[classattr]
    const MAX_SEQUENCE: u64 = MAX_STAGED_SEQUENCE;
}

/// Runs `f` without the GIL; its error string becomes `InternalError`.
fn unshared_result<R: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> Result<R, String> + Send,
) -> PyResult<R> {
    py.detach(f)
        .map_err(|e| InternalError::new_err(format!("L3 staging: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpkv_tier::l3::RecordReject;

    #[test]
    fn words_pack_and_unpack() {
        for (s, v, st) in [
            (1, 0, READING),
            (MAX_STAGED_SEQUENCE, (1 << VERSION_BITS) - 1, FAILED),
            (7, 5, READY),
        ] {
            assert_eq!(unpack(pack(s, v, st)), (s, v, st));
        }
        // The version wraps inside its bits, never into the sequence.
        assert_eq!(unpack(pack(3, 1 << VERSION_BITS, READY)), (3, 0, READY));
    }

    #[test]
    fn every_reject_reason_has_a_code() {
        let rejects = [
            RecordReject::Truncated { have: 0, need: 1 },
            RecordReject::BadMagic,
            RecordReject::Version { found: 0 },
            RecordReject::Reserved,
            RecordReject::ForeignNamespace { found: 0 },
            RecordReject::WrongKey { found: 0 },
            RecordReject::StaleSequence { found: 0 },
            RecordReject::Length { found: 0 },
            RecordReject::Checksum {
                found: 0,
                computed: 1,
            },
        ];
        for r in rejects {
            assert!(REASONS.contains(&r.name()), "{}", r.name());
        }
    }
}
