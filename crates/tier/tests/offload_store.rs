//! `OffloadIndex::store` (one synchronous store: SGLang's `batch_set`)
//! against the engine calls it is made of, on a twin index, and against the
//! contract the SGLang backend relies on: random streams of stores that
//! continue chains, checked after every call.

use std::collections::BTreeSet;

use cpkv_tier::{KeyState, OffloadIndex, Placed, Policy};
use proptest::prelude::*;

/// The request `store` runs as (its documented equivalent).
const REQUEST: &str = "\0store";

/// Key of page `i` of a chain: the chain's prefix names it (like SGLang's
/// chained page hashes), then group 0's four bytes.
fn key(chain: &[u8], i: usize) -> Vec<u8> {
    let mut k: Vec<u8> = chain[..=i].to_vec();
    k.extend_from_slice(&0u32.to_be_bytes());
    k
}

#[derive(Debug, Clone)]
enum Op {
    /// Store pages `split..` of `chain`, continuing page `split - 1`.
    Store {
        chain: Vec<u8>,
        split: usize,
    },
    Reset,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        12 => (prop::collection::vec(0u8..4, 1..9), any::<usize>())
            .prop_map(|(chain, s)| { let split = s % chain.len(); Op::Store { chain, split } }),
        1 => Just(Op::Reset),
    ];
    prop::collection::vec(op, 1..100)
}

/// `store` spelled out as the engine calls it is documented to be.
fn composed(
    index: &mut OffloadIndex,
    keys: &[&[u8]],
    prefix: Option<&[u8]>,
) -> Vec<Option<Placed>> {
    let anchor = prefix.filter(|p| index.lookup(p) == KeyState::Ready);
    if let Some(p) = anchor {
        index.prepare_load(REQUEST, &[p], &[Some(0)]).unwrap();
    }
    let positions: Vec<Option<u64>> = (1..=keys.len() as u64).map(Some).collect();
    if let Some(plan) = index
        .prepare_store_fitting(REQUEST, keys, &positions)
        .unwrap()
    {
        let stored: Vec<&[u8]> = plan.store.iter().map(|&i| keys[i]).collect();
        index.complete_store(&stored, true).unwrap();
    }
    if let Some(p) = anchor {
        index.complete_load(REQUEST, &[p]);
    }
    index.request_finished(REQUEST);
    keys.iter().map(|k| index.locate(k)).collect()
}

/// The keys on `key`'s path, itself included.
fn path(index: &OffloadIndex, key: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![key.to_vec()];
    while let Some(parent) = index.parent_of(out.last().unwrap()) {
        out.push(parent.to_vec());
    }
    out
}

/// Runs `ops` through `store` and through its composition on a twin;
/// checks the contract after every call; returns the digests.
fn run(policy: Policy, capacity: u64, ops: &[Op]) -> Vec<u64> {
    let mut index = OffloadIndex::new(capacity, policy, vec![1]).unwrap();
    let mut twin = OffloadIndex::new(capacity, policy, vec![1]).unwrap();
    let mut last_serial = 0u64;
    let mut digests = Vec::new();
    let mut offered: BTreeSet<Vec<u8>> = BTreeSet::new();
    for op in ops {
        match op {
            Op::Store { chain, split } => {
                let keys: Vec<Vec<u8>> = (*split..chain.len()).map(|i| key(chain, i)).collect();
                offered.extend(keys.iter().cloned());
                let prefix = split.checked_sub(1).map(|i| key(chain, i));
                let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                let before: BTreeSet<Vec<u8>> =
                    index.resident_keys().iter().map(|k| k.to_vec()).collect();
                let mut protected: BTreeSet<Vec<u8>> = keys
                    .iter()
                    .filter(|k| before.contains(*k))
                    .cloned()
                    .collect();
                if let Some(p) = prefix.as_deref().filter(|p| before.contains(*p)) {
                    protected.extend(path(&index, p));
                }

                let rows_before: Vec<(Vec<u8>, u32)> = before
                    .iter()
                    .map(|k| (k.clone(), index.locate(k).unwrap().row))
                    .collect();
                let (got, evicted) = index.store_evicting(&refs, prefix.as_deref()).unwrap();
                let want = composed(&mut twin, &refs, prefix.as_deref());
                assert_eq!(got, want, "store is exactly its composition");
                assert_eq!(index.digest(), twin.digest());

                let after: BTreeSet<Vec<u8>> =
                    index.resident_keys().iter().map(|k| k.to_vec()).collect();
                // The evictions reported are exactly the keys that left, each
                // with the row it held before the call.
                let mut reported: Vec<(Vec<u8>, u32)> =
                    evicted.iter().map(|(k, r)| (k.to_vec(), *r)).collect();
                reported.sort();
                let mut left: Vec<(Vec<u8>, u32)> = rows_before
                    .into_iter()
                    .filter(|(k, _)| !after.contains(k))
                    .collect();
                left.sort();
                assert_eq!(reported, left, "evictions reported with their rows");
                for gone in before.difference(&after) {
                    assert!(!protected.contains(gone), "evicted the call's own path");
                }
                // Refused keys are new ones, a suffix of the call, and only
                // when every row is taken.
                let first_refused = got.iter().position(Option::is_none);
                if let Some(first) = first_refused {
                    assert!(got[first..]
                        .iter()
                        .zip(&keys[first..])
                        .all(|(p, k)| p.is_none() || before.contains(k)));
                    assert_eq!(index.len() as u64, capacity, "refused with a free row");
                }
                // New keys get fresh serials and continue their predecessor.
                let mut fresh: Vec<u64> = Vec::new();
                for (i, (k, p)) in keys.iter().zip(&got).enumerate() {
                    let Some(p) = p else { continue };
                    if before.contains(k) {
                        assert!(p.serial <= last_serial);
                        continue;
                    }
                    fresh.push(p.serial);
                    let previous = if i == 0 {
                        prefix.clone()
                    } else {
                        Some(keys[i - 1].clone())
                    };
                    let expect =
                        previous.filter(|q| after.contains(q) && (i > 0 || before.contains(q)));
                    assert_eq!(index.parent_of(k).map(|b| b.to_vec()), expect);
                }
                assert!(fresh.windows(2).all(|w| w[0] < w[1]));
                if let Some(&first) = fresh.first() {
                    assert!(first > last_serial, "a serial was reused");
                    last_serial = *fresh.last().unwrap();
                }
            }
            Op::Reset => {
                index.reset().unwrap();
                twin.reset().unwrap();
            }
        }
        // Nothing stays pinned; every resident key is readable, in one row.
        assert_eq!(index.num_pins(), 0);
        index.check().unwrap();
        let readable = index.readable();
        assert_eq!(readable.len(), index.len());
        let rows: BTreeSet<u32> = readable.iter().map(|p| p.row).collect();
        assert_eq!(rows.len(), readable.len());
        assert!(readable.windows(2).all(|w| w[0].serial < w[1].serial));
        // A batch lookup answers as one lookup per key: every key ever
        // offered (resident, evicted, refused), then every other one again.
        let probe: Vec<&[u8]> = offered
            .iter()
            .chain(offered.iter().step_by(2))
            .map(Vec::as_slice)
            .collect();
        let one_by_one: Vec<Option<Placed>> = probe.iter().map(|k| index.locate(k)).collect();
        assert_eq!(index.locate_many(&probe), one_by_one);
        digests.push(index.digest());
    }
    digests
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn store_is_its_composition_and_keeps_the_contract(
        ops in ops(), capacity in 1u64..14, which in 0usize..Policy::ALL.len()
    ) {
        let policy = Policy::ALL[which];
        let first = run(policy, capacity, &ops);
        prop_assert_eq!(first, run(policy, capacity, &ops));
    }
}

#[test]
fn serials_count_from_one_across_resets() {
    let mut index = OffloadIndex::new(4, Policy::Lru, vec![1]).unwrap();
    let keys: Vec<Vec<u8>> = (0..3).map(|i| key(&[1, 2, 3], i)).collect();
    let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let serials = |got: Vec<Option<Placed>>| {
        got.into_iter()
            .map(|p| p.unwrap().serial)
            .collect::<Vec<_>>()
    };
    assert_eq!(serials(index.store(&refs, None).unwrap()), vec![1, 2, 3]);
    assert_eq!(
        serials(index.store(&refs, None).unwrap()),
        vec![1, 2, 3],
        "resident keys keep theirs"
    );
    index.reset().unwrap();
    assert_eq!(index.locate(refs[0]), None);
    assert_eq!(serials(index.store(&refs, None).unwrap()), vec![4, 5, 6]);
}

#[test]
fn one_different_key_changes_the_digest() {
    let stream = |last: u8| {
        let mut index = OffloadIndex::new(3, Policy::Lru, vec![1]).unwrap();
        for chain in [[1u8, 2, 3], [1, 2, 4], [5, 6, last]] {
            let keys: Vec<Vec<u8>> = (0..3).map(|i| key(&chain, i)).collect();
            let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            index.store(&refs[1..], Some(refs[0])).unwrap();
        }
        index.digest()
    };
    assert_eq!(stream(7), stream(7));
    assert_ne!(stream(7), stream(8));
}

#[test]
fn a_short_key_is_refused_and_changes_nothing() {
    let mut index = OffloadIndex::new(4, Policy::Lru, vec![1]).unwrap();
    let good = key(&[1], 0);
    let before = index.digest();
    assert!(index.store(&[good.as_slice(), b"ab"], None).is_err());
    assert!(index.store(&[good.as_slice()], Some(b"ab")).is_err());
    assert_eq!((index.digest(), index.len()), (before, 0));
}
