//! The node-shared L3 read-staging area, so that the node's ranks read an L3
//! record from disk once, not once each.
//!
//! Shared memory of the node: `entries` entries of one record each
//! (`page_bytes + HEADER_BYTES`: the record's payload and header, without its
//! padding, so a reader checks the CRC32C of what it copied) and per entry
//! two 64-bit words: the *state word* and the failure reason. A record (slot,
//! sequence) goes to entry `slot % entries`.
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
//! - [`StagingArea::take`]: per record, a ready entry of it is copied out,
//!   the word re-checked after the copy (seqlock: a claim in between means
//!   the copy is not used, `Reused`), and the copy checked like a disk read
//!   (magic, key, sequence, namespace, length, CRC32C); a failed entry of it
//!   gives the claimant's reason; an entry being read by another rank for it
//!   is `Wait`; an entry being read for another record is `Busy` (read it
//!   yourself, no claim); anything else is claimed (`Claimed`): this rank
//!   reads the record and [`StagingArea::publish`]es it.
//! - [`StagingArea::wait`]: polls the `Wait` entries until their word moves,
//!   then decides as `take` does; a word that has not moved for the timeout
//!   (its claimant is dead or stuck) is taken over (`Claimed`, flagged), so
//!   no rank waits on a dead one for longer than that.
//! - A claimant paused past the timeout may still write into an entry another
//!   rank took over; the readers' record check (CRC32C over header and
//!   payload) turns such a copy into `Torn` (read it yourself), never a page.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cpkv_tier::l3::{
    decode_parts, header_at, record_bytes, Expected, HEADER_BYTES, MAX_PAYLOAD_BYTES,
};

use crate::region::{copy_piece, Region};

const EMPTY: u64 = 0;
const READING: u64 = 1;
const READY: u64 = 2;
const FAILED: u64 = 3;
const STATE_BITS: u32 = 2;
const VERSION_BITS: u32 = 18;
const SEQUENCE_SHIFT: u32 = STATE_BITS + VERSION_BITS;
/// The largest sequence a state word can name; a record past it bypasses
/// the staging area (read from disk by each rank, counted).
pub const MAX_STAGED_SEQUENCE: u64 = (1 << (64 - SEQUENCE_SHIFT)) - 1;
/// The most entries a staging area may have.
pub const MAX_STAGING_ENTRIES: u64 = 1 << 24;

/// The reasons a record fails its check (`RecordReject::name`), stored by
/// index in an entry's reason word.
pub const REASONS: [&str; 9] = [
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

/// Why a call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StagingError {
    /// A bad argument: nothing changed.
    Refused(String),
    /// A copy or the caller's hook failed partway.
    Failed(String),
}

impl std::fmt::Display for StagingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StagingError::Refused(e) | StagingError::Failed(e) => f.write_str(e),
        }
    }
}

type Refused = StagingError;

fn refused(e: String) -> StagingError {
    StagingError::Refused(e)
}

fn failed(e: String) -> StagingError {
    StagingError::Failed(e)
}

/// What `take` and `wait` found for a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Outcome {
    /// Copied from the entry, checked, in `out`.
    Served = 0,
    /// The claimant's check failed: a miss, reason given.
    Failed = 1,
    /// This rank holds the claim: read the record, then publish.
    Claimed = 2,
    /// Another rank is reading it: wait.
    Wait = 3,
    /// The entry is being read for another record: read it yourself.
    Busy = 4,
    /// The entry was claimed again during the copy: read it yourself.
    Reused = 5,
    /// The copy failed its check with the word unchanged: read it yourself.
    Torn = 6,
    /// The sequence is past what a word can name: read it yourself.
    Bypass = 7,
}

/// One record a call is about: its key, slot and sequence.
#[derive(Clone, Copy, Debug)]
pub struct Want {
    pub key: u64,
    pub slot: u64,
    pub sequence: u64,
}

/// What deciding about one record gave: the outcome, the state word seen or
/// claimed, a failure's reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    pub outcome: Outcome,
    pub word: u64,
    pub reason: Option<&'static str>,
}

impl Found {
    fn plain(outcome: Outcome, word: u64) -> Self {
        Found {
            outcome,
            word,
            reason: None,
        }
    }
}

fn pack(sequence: u64, version: u64, state: u64) -> u64 {
    (sequence << SEQUENCE_SHIFT) | ((version & ((1 << VERSION_BITS) - 1)) << STATE_BITS) | state
}

/// (sequence, version, state) of a state word (states: 0 empty, 1 reading,
/// 2 ready, 3 failed).
pub fn unpack(word: u64) -> (u64, u64, u64) {
    (
        word >> SEQUENCE_SHIFT,
        (word >> STATE_BITS) & ((1 << VERSION_BITS) - 1),
        word & ((1 << STATE_BITS) - 1),
    )
}

/// The reason word of a reject reason's name.
pub fn reason_code(name: &str) -> Result<u64, Refused> {
    REASONS
        .iter()
        .position(|known| *known == name)
        .map(|c| c as u64)
        .ok_or_else(|| refused(format!("reason {name:?} is not one of {REASONS:?}")))
}

/// Checks that `claims` are one claim word per slot of `slots`.
pub fn check_claims(slots: &[u64], claims: &[u64]) -> Result<(), Refused> {
    if slots.len() != claims.len() {
        return Err(refused(format!(
            "{} slots for {} claims",
            slots.len(),
            claims.len()
        )));
    }
    match claims.iter().find(|&&c| unpack(c).2 != READING) {
        Some(claim) => Err(refused(format!("word {claim:#x} is not a claim"))),
        None => Ok(()),
    }
}

/// One staging area over its shared memory.
#[derive(Clone, Copy, Debug)]
pub struct StagingArea {
    entries: u64,
    entry_bytes: u64,
    page_bytes: u64,
    namespace: u64,
    data: Region,
    words: Region,
}

impl StagingArea {
    /// `data`: `entries * (page_bytes + HEADER_BYTES)` bytes; `words`:
    /// `entries` pairs of aligned int64, apart from the data; `namespace`:
    /// the store's namespace id (a staged copy is checked as a disk read is).
    pub fn new(
        data: Region,
        words: Region,
        page_bytes: u64,
        namespace: u64,
    ) -> Result<Self, String> {
        if page_bytes == 0 || page_bytes > MAX_PAYLOAD_BYTES {
            return Err(format!(
                "page_bytes must be in 1..={MAX_PAYLOAD_BYTES}, got {page_bytes}"
            ));
        }
        let entry_bytes = HEADER_BYTES as u64 + page_bytes;
        let entries = words.len() as u64 / 16;
        if entries == 0
            || entries > MAX_STAGING_ENTRIES
            || words.len() as u64 != entries * 16
            || data.len() as u64 != entries * entry_bytes
            || !words.address().is_multiple_of(8)
            || data.overlaps(&words)
        {
            return Err(format!(
                "staging data ({} bytes) and words ({} bytes) are not 1 to {MAX_STAGING_ENTRIES} entries of \
                 {entry_bytes} bytes and two aligned, separate int64 each",
                data.len(),
                words.len()
            ));
        }
        Ok(Self {
            entries,
            entry_bytes,
            page_bytes,
            namespace,
            data,
            words,
        })
    }

    pub fn entries(&self) -> u64 {
        self.entries
    }

    pub fn entry_bytes(&self) -> u64 {
        self.entry_bytes
    }

    /// Whether `slice` shares memory with the area.
    pub fn overlaps(&self, slice: &[u8]) -> bool {
        self.data.overlaps_slice(slice) || self.words.overlaps_slice(slice)
    }

    fn word(&self, slot: u64) -> &AtomicU64 {
        self.words.atomic_u64((slot % self.entries) * 16)
    }

    fn reason(&self, slot: u64) -> &AtomicU64 {
        self.words.atomic_u64((slot % self.entries) * 16 + 8)
    }

    /// (sequence, version, state) of the entry of `slot`.
    pub fn entry_state(&self, slot: u64) -> (u64, u64, u64) {
        unpack(self.word(slot).load(Ordering::Acquire))
    }

    /// `out` as `n` rows of `page_bytes`, apart from the area.
    fn check_out(&self, out: &[u8], n: usize) -> Result<(), Refused> {
        if out.len() as u64 != n as u64 * self.page_bytes {
            return Err(refused(format!(
                "out holds {} bytes, {n} pages of {} bytes were expected",
                out.len(),
                self.page_bytes
            )));
        }
        if self.overlaps(out) {
            return Err(refused(
                "out overlaps the staging area's shared memory".to_string(),
            ));
        }
        Ok(())
    }

    /// Decides about one record (see the module docs); `after_copy` runs
    /// between a copy and its re-check (a test hook).
    fn decide(
        &self,
        want: Want,
        scratch: &mut [u8],
        out: &mut [u8],
        after_copy: &mut dyn FnMut() -> Result<(), String>,
    ) -> Result<Found, String> {
        if want.sequence == 0 || want.sequence > MAX_STAGED_SEQUENCE {
            return Ok(Found::plain(Outcome::Bypass, 0));
        }
        let cell = self.word(want.slot);
        loop {
            let word = cell.load(Ordering::Acquire);
            let (sequence, version, state) = unpack(word);
            if sequence == want.sequence {
                match state {
                    READY => {
                        let at = (want.slot % self.entries) * self.entry_bytes;
                        copy_piece(scratch, self.data.slice(at, self.entry_bytes)?)?;
                        after_copy()?;
                        fence(Ordering::Acquire);
                        if cell.load(Ordering::Acquire) != word {
                            return Ok(Found::plain(Outcome::Reused, word));
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
                                Found::plain(Outcome::Served, word)
                            }
                            Err(_) => Found::plain(Outcome::Torn, word),
                        });
                    }
                    FAILED => {
                        let code = self.reason(want.slot).load(Ordering::Acquire);
                        if cell.load(Ordering::Acquire) != word {
                            return Ok(Found::plain(Outcome::Reused, word));
                        }
                        return Ok(Found {
                            outcome: Outcome::Failed,
                            word,
                            reason: Some(REASONS.get(code as usize).copied().unwrap_or("checksum")),
                        });
                    }
                    READING => return Ok(Found::plain(Outcome::Wait, word)),
                    _ => {} // empty (a claim given up): claim it
                }
            } else if state == READING {
                return Ok(Found::plain(Outcome::Busy, word));
            }
            let claim = pack(want.sequence, version + 1, READING);
            if cell
                .compare_exchange(word, claim, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                // The claim is visible before any byte of the entry changes.
                fence(Ordering::SeqCst);
                return Ok(Found::plain(Outcome::Claimed, claim));
            }
        }
    }

    /// Decides about each record; a served page lands in `out`'s row `i`
    /// (`out`: `wants.len()` rows of `page_bytes`).
    pub fn take(
        &self,
        wants: &[Want],
        out: &mut [u8],
        after_copy: &mut dyn FnMut() -> Result<(), String>,
    ) -> Result<Vec<Found>, StagingError> {
        self.check_out(out, wants.len())?;
        let mut scratch = vec![0u8; self.entry_bytes as usize];
        wants
            .iter()
            .zip(out.chunks_exact_mut(self.page_bytes as usize))
            .map(|(want, row)| {
                self.decide(*want, &mut scratch, row, after_copy)
                    .map_err(failed)
            })
            .collect()
    }

    /// Waits for records `take` answered `Wait` (`seen[i]`: the word it saw),
    /// each until its word moves (then decided as `take` does; a new claim of
    /// the same record is waited for afresh) or stays the same for `timeout`:
    /// then this rank takes the claim over (`Claimed`, and `true` beside it).
    /// Polls with a backoff of 20 us up to 1 ms.
    pub fn wait(
        &self,
        wants: &[Want],
        seen: &[u64],
        out: &mut [u8],
        timeout: Duration,
        after_copy: &mut dyn FnMut() -> Result<(), String>,
    ) -> Result<Vec<(Found, bool)>, StagingError> {
        if seen.len() != wants.len() {
            return Err(refused(format!(
                "{} words for {} records",
                seen.len(),
                wants.len()
            )));
        }
        self.check_out(out, wants.len())?;
        let n = wants.len();
        let mut seen = seen.to_vec();
        let mut scratch = vec![0u8; self.entry_bytes as usize];
        let mut done: Vec<Option<(Found, bool)>> = vec![None; n];
        let mut deadline = vec![Instant::now() + timeout; n];
        let mut rows: Vec<&mut [u8]> = out.chunks_exact_mut(self.page_bytes as usize).collect();
        let mut pause = Duration::from_micros(20);
        while done.iter().any(Option::is_none) {
            for i in 0..n {
                if done[i].is_some() {
                    continue;
                }
                let cell = self.word(wants[i].slot);
                let word = cell.load(Ordering::Acquire);
                if word != seen[i] {
                    let f = self
                        .decide(wants[i], &mut scratch, rows[i], after_copy)
                        .map_err(failed)?;
                    if f.outcome == Outcome::Wait {
                        seen[i] = f.word; // another claim of it: wait for that one afresh
                        deadline[i] = Instant::now() + timeout;
                    } else {
                        done[i] = Some((f, false));
                    }
                } else if Instant::now() >= deadline[i] {
                    let (sequence, version, _) = unpack(word);
                    let claim = pack(sequence, version + 1, READING);
                    if cell
                        .compare_exchange(word, claim, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        fence(Ordering::SeqCst);
                        done[i] = Some((Found::plain(Outcome::Claimed, claim), true));
                    }
                }
            }
            if done.iter().any(Option::is_none) {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
            }
        }
        Ok(done.into_iter().flatten().collect())
    }

    /// Publishes the records this rank claimed (`claims[i]`: the claim's
    /// word, for `slots[i]`): a good one (`reasons[i]` None) is copied from
    /// `records` (whole records as they lie on disk, record `i` at
    /// `offsets[i]`) into its entry (its payload, then its header) and marked
    /// ready; a failed one marked failed with its reason code. Per record
    /// whether it was published (false: the claim was taken over meanwhile).
    pub fn publish(
        &self,
        slots: &[u64],
        claims: &[u64],
        records: &[u8],
        offsets: &[u64],
        reasons: &[Option<u64>],
    ) -> Result<Vec<bool>, StagingError> {
        check_claims(slots, claims)?;
        if slots.len() != offsets.len() || slots.len() != reasons.len() {
            return Err(refused(format!(
                "slots, offsets and reasons differ in length: {}, {}, {}",
                slots.len(),
                offsets.len(),
                reasons.len()
            )));
        }
        let record = record_bytes(self.page_bytes);
        if let Some(&at) = offsets.iter().find(|&&at| {
            at.checked_add(record)
                .is_none_or(|end| end > records.len() as u64)
        }) {
            return Err(refused(format!(
                "a record at offset {at} of {record} bytes does not fit in records ({} bytes)",
                records.len()
            )));
        }
        if self.overlaps(records) {
            return Err(refused(
                "records overlap the staging area's shared memory".to_string(),
            ));
        }
        let header = header_at(self.page_bytes);
        let mut published = Vec::with_capacity(slots.len());
        for i in 0..slots.len() {
            let cell = self.word(slots[i]);
            let (sequence, version, _) = unpack(claims[i]);
            if cell.load(Ordering::Acquire) != claims[i] {
                published.push(false);
                continue;
            }
            let state = match reasons[i] {
                None => {
                    let at = (slots[i] % self.entries) * self.entry_bytes;
                    let (payload, head) = (offsets[i] as usize, (offsets[i] + header) as usize);
                    self.data
                        .slice_mut(at, self.page_bytes)
                        .and_then(|entry| {
                            copy_piece(entry, &records[payload..payload + self.page_bytes as usize])
                        })
                        .map_err(failed)?;
                    self.data
                        .slice_mut(at + self.page_bytes, HEADER_BYTES as u64)
                        .and_then(|entry| copy_piece(entry, &records[head..head + HEADER_BYTES]))
                        .map_err(failed)?;
                    READY
                }
                Some(code) => {
                    self.reason(slots[i]).store(code, Ordering::Release);
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
    }

    /// Gives up claims this rank cannot complete (its disk read raised): the
    /// entries go back to empty, so no rank waits for them.
    pub fn abandon(&self, slots: &[u64], claims: &[u64]) -> Result<(), Refused> {
        check_claims(slots, claims)?;
        for (slot, claim) in slots.iter().zip(claims) {
            let (sequence, version, _) = unpack(*claim);
            let _ = self.word(*slot).compare_exchange(
                *claim,
                pack(sequence, version, EMPTY),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        Ok(())
    }
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
