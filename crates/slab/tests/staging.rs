//! The L3 read-staging area's claims against a model of each entry's word
//! (sequence, state): several ranks take, wait on, publish and abandon
//! records; every outcome is the one the model predicts, a served page is
//! always the record's own payload, and a claim taken over can no longer
//! publish.

mod common;

use std::time::Duration;

use common::Memory;
use cpkv_slab::staging::unpack;
use cpkv_slab::{Outcome, StagingArea, Want};
use cpkv_tier::l3::{record_bytes, seal_record, HEADER_BYTES};
use proptest::prelude::*;

const PAGE: u64 = 40;
const ENTRIES: u64 = 2;
const NAMESPACE: u64 = 9;

fn payload(sequence: u64) -> Vec<u8> {
    (0..PAGE).map(|i| (sequence * 7 + i) as u8).collect()
}

/// The record of (slot, sequence) as it lies on disk; the key is the sequence.
fn record(sequence: u64) -> Vec<u8> {
    let mut out = vec![0u8; record_bytes(PAGE) as usize];
    out[..PAGE as usize].copy_from_slice(&payload(sequence));
    seal_record(&mut out, NAMESPACE, sequence, sequence, PAGE as usize);
    out
}

#[derive(Clone, Debug)]
enum Op {
    /// A rank asks for record `sequence` of slot `slot`.
    Take(u64, u64),
    /// The rank holding claim `i` (of those handed out) publishes it, good or failed.
    Publish(usize, bool),
    /// The rank holding claim `i` gives it up.
    Abandon(usize),
    /// A rank that saw the word of slot's entry waits on it with no time left: it takes the claim over.
    TakeOver(u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..4u64, 1..5u64).prop_map(|(s, q)| Op::Take(s, q)),
        (0..8usize, prop::bool::weighted(0.8)).prop_map(|(i, ok)| Op::Publish(i, ok)),
        (0..8usize).prop_map(Op::Abandon),
        (0..4u64, 1..5u64).prop_map(|(s, q)| Op::TakeOver(s, q)),
    ]
}

/// The model of one entry: (sequence, state: 0 empty, 1 reading, 2 ready, 3 failed, the live claim word).
#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    sequence: u64,
    state: u64,
    claim: Option<u64>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn claims_follow_the_model(ops in prop::collection::vec(op(), 1..40)) {
        let mut data = Memory::zeroed((ENTRIES * (PAGE + HEADER_BYTES as u64)) as usize);
        let mut words = Memory::zeroed((ENTRIES * 16) as usize);
        let area = StagingArea::new(
            data.region((ENTRIES * (PAGE + HEADER_BYTES as u64)) as usize),
            words.region((ENTRIES * 16) as usize),
            PAGE,
            NAMESPACE,
        )
        .unwrap();
        let mut model = [Entry::default(); ENTRIES as usize];
        let mut claims: Vec<(u64, u64)> = Vec::new(); // (slot, claim word) handed out
        let mut out = vec![0u8; PAGE as usize];
        for op in ops {
            match op {
                Op::Take(slot, sequence) => {
                    let want = Want { key: sequence, slot, sequence };
                    let found = area.take(&[want], &mut out, &mut || Ok(())).unwrap()[0];
                    let e = &mut model[(slot % ENTRIES) as usize];
                    let expected = if e.sequence == sequence {
                        match e.state {
                            2 => Outcome::Served,
                            3 => Outcome::Failed,
                            1 => Outcome::Wait,
                            _ => Outcome::Claimed,
                        }
                    } else if e.state == 1 {
                        Outcome::Busy
                    } else {
                        Outcome::Claimed
                    };
                    prop_assert_eq!(found.outcome, expected);
                    match expected {
                        Outcome::Served => prop_assert_eq!(&out, &payload(sequence)),
                        Outcome::Failed => prop_assert_eq!(found.reason, Some("checksum")),
                        Outcome::Claimed => {
                            prop_assert_eq!(unpack(found.word).0, sequence);
                            *e = Entry { sequence, state: 1, claim: Some(found.word) };
                            claims.push((slot, found.word));
                        }
                        _ => {}
                    }
                }
                Op::TakeOver(slot, sequence) => {
                    let e = &mut model[(slot % ENTRIES) as usize];
                    if e.state != 1 || e.sequence != sequence {
                        continue; // only a record being read is waited for
                    }
                    let seen = e.claim.unwrap();
                    let want = Want { key: sequence, slot, sequence };
                    let waited = area.wait(&[want], &[seen], &mut out, Duration::ZERO, &mut || Ok(())).unwrap();
                    let (found, taken) = waited[0];
                    prop_assert!(taken && found.outcome == Outcome::Claimed);
                    prop_assert_ne!(found.word, seen);
                    e.claim = Some(found.word);
                    claims.push((slot, found.word));
                }
                Op::Publish(i, good) => {
                    let Some(&(slot, claim)) = claims.get(i) else { continue };
                    let sequence = unpack(claim).0;
                    let bytes = record(sequence);
                    let reason = (!good).then_some(8); // "checksum"
                    let published = area.publish(&[slot], &[claim], &bytes, &[0], &[reason]).unwrap()[0];
                    let e = &mut model[(slot % ENTRIES) as usize];
                    let live = e.claim == Some(claim);
                    prop_assert_eq!(published, live);
                    if live {
                        *e = Entry { sequence, state: if good { 2 } else { 3 }, claim: None };
                    }
                }
                Op::Abandon(i) => {
                    let Some(&(slot, claim)) = claims.get(i) else { continue };
                    area.abandon(&[slot], &[claim]).unwrap();
                    let e = &mut model[(slot % ENTRIES) as usize];
                    if e.claim == Some(claim) {
                        *e = Entry { sequence: e.sequence, state: 0, claim: None };
                    }
                }
            }
            for (k, e) in model.iter().enumerate() {
                let (sequence, _, state) = area.entry_state(k as u64);
                prop_assert_eq!((sequence, state), (e.sequence, e.state), "entry {}", k);
            }
        }
    }
}

#[test]
fn a_copy_reused_under_the_reader_is_not_served() {
    let mut data = Memory::zeroed(PAGE as usize + HEADER_BYTES);
    let mut words = Memory::zeroed(16);
    let area = StagingArea::new(
        data.region(PAGE as usize + HEADER_BYTES),
        words.region(16),
        PAGE,
        NAMESPACE,
    )
    .unwrap();
    let mut out = vec![0u8; PAGE as usize];
    let want = |sequence| Want {
        key: sequence,
        slot: 0,
        sequence,
    };
    let claim = area.take(&[want(1)], &mut out, &mut || Ok(())).unwrap()[0].word;
    area.publish(&[0], &[claim], &record(1), &[0], &[None])
        .unwrap();
    // Another rank claims the entry for record 2 between the copy and the re-check.
    let mut reuse = || {
        let other = area
            .take(&[want(2)], &mut vec![0u8; PAGE as usize], &mut || Ok(()))
            .map_err(|e| e.to_string())?;
        assert_eq!(other[0].outcome, Outcome::Claimed);
        Ok(())
    };
    let found = area.take(&[want(1)], &mut out, &mut reuse).unwrap()[0];
    assert_eq!(found.outcome, Outcome::Reused);
    assert_ne!(out, payload(1));
}

#[test]
fn bytes_that_fail_the_record_check_are_torn() {
    let mut data = Memory::zeroed(PAGE as usize + HEADER_BYTES);
    let mut words = Memory::zeroed(16);
    let area = StagingArea::new(
        data.region(PAGE as usize + HEADER_BYTES),
        words.region(16),
        PAGE,
        NAMESPACE,
    )
    .unwrap();
    let mut out = vec![0u8; PAGE as usize];
    let want = Want {
        key: 3,
        slot: 0,
        sequence: 3,
    };
    let claim = area.take(&[want], &mut out, &mut || Ok(())).unwrap()[0].word;
    let mut bad = record(3);
    bad[5] ^= 1; // a claimant paused past its timeout writes under the readers
    area.publish(&[0], &[claim], &bad, &[0], &[None]).unwrap();
    assert_eq!(
        area.take(&[want], &mut out, &mut || Ok(())).unwrap()[0].outcome,
        Outcome::Torn
    );
    let past = Want {
        key: 1,
        slot: 0,
        sequence: cpkv_slab::MAX_STAGED_SEQUENCE + 1,
    };
    assert_eq!(
        area.take(&[past], &mut out, &mut || Ok(())).unwrap()[0].outcome,
        Outcome::Bypass
    );
}
