//! `OffloadIndex` against a plain reference model: random engine call
//! sequences (requests over chained keys, loads and stores completing or
//! failing in any order, resets), checked after every call. An offer is
//! placed whole or refused changing nothing; a failed store's chunks leave
//! unless something placed since continues them.

use std::collections::{BTreeMap, BTreeSet};

use cpkv_tier::{KeyState, OffloadIndex, Policy};
use proptest::prelude::*;

const CHUNK: u64 = 16;

/// Key of chunk `i` of a chain: the chain's prefix names it (like vLLM's
/// chained hashes), then the group's four bytes.
fn key(chain: &[u8], i: usize) -> Vec<u8> {
    let mut k: Vec<u8> = chain[..=i].to_vec();
    k.extend_from_slice(&0u32.to_be_bytes());
    k
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Model {
    Pending,
    Ready,
    Failed,
}

#[derive(Debug, Clone)]
enum Op {
    Request(Vec<u8>),
    Complete { pick: usize, ok: bool },
    Reset,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        6 => prop::collection::vec(0u8..4, 1..7).prop_map(Op::Request),
        5 => (any::<usize>(), prop::bool::weighted(0.85)).prop_map(|(pick, ok)| Op::Complete { pick, ok }),
        1 => Just(Op::Reset),
    ];
    prop::collection::vec(op, 1..120)
}

enum Job {
    Load(String, Vec<Vec<u8>>),
    Store(Vec<Vec<u8>>),
}

/// Runs `ops`, checking the index against the model; returns the digests.
fn run(policy: Policy, capacity: u64, ops: &[Op]) -> Vec<u64> {
    let mut index = OffloadIndex::new(capacity, policy, vec![CHUNK]).unwrap();
    // Fed the same calls, each completion's keys in reverse order: the same
    // state (an engine may complete an unordered set).
    let mut twin = OffloadIndex::new(capacity, policy, vec![CHUNK]).unwrap();
    let mut model: BTreeMap<Vec<u8>, Model> = BTreeMap::new();
    let mut loads: BTreeMap<Vec<u8>, usize> = BTreeMap::new(); // key -> loads reading it
    let mut jobs: Vec<Job> = Vec::new();
    let mut digests = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Request(chain) => {
                let request = format!("r{step}");
                let keys: Vec<Vec<u8>> = (0..chain.len()).map(|i| key(chain, i)).collect();
                let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
                let ends: Vec<Option<u64>> =
                    (1..=keys.len() as u64).map(|i| Some(i * CHUNK)).collect();
                let hits = refs[..refs.len() - 1]
                    .iter()
                    .take_while(|k| index.lookup(k) == KeyState::Ready)
                    .count();
                if hits > 0 {
                    let rows = index
                        .prepare_load(&request, &refs[..hits], &ends[..hits])
                        .unwrap();
                    twin.prepare_load(&request, &refs[..hits], &ends[..hits])
                        .unwrap();
                    assert_eq!(rows.len(), hits);
                    for k in &keys[..hits] {
                        assert_eq!(model.get(k), Some(&Model::Ready));
                        *loads.entry(k.clone()).or_default() += 1;
                    }
                    jobs.push(Job::Load(request.clone(), keys[..hits].to_vec()));
                }
                let offered = &refs[hits..];
                let before: BTreeSet<Vec<u8>> = model.keys().cloned().collect();
                let protected: BTreeSet<Vec<u8>> = model
                    .iter()
                    .filter(|(k, s)| {
                        **s == Model::Pending || loads.get(*k).copied().unwrap_or(0) > 0
                    })
                    .map(|(k, _)| k.clone())
                    .chain(
                        offered
                            .iter()
                            .map(|k| k.to_vec())
                            .filter(|k| before.contains(k)),
                    )
                    .collect();
                let rows_before: BTreeMap<Vec<u8>, u32> = model
                    .keys()
                    .filter_map(|k| index.row_of(k).map(|r| (k.clone(), r)))
                    .collect();
                let digest_before = index.digest();
                let plan = index
                    .prepare_store(&request, offered, &ends[hits..])
                    .unwrap();
                twin.prepare_store(&request, offered, &ends[hits..])
                    .unwrap();
                let new_keys: BTreeSet<&[u8]> = offered
                    .iter()
                    .copied()
                    .filter(|k| !model.contains_key(*k))
                    .collect();
                let need = new_keys
                    .len()
                    .saturating_sub(capacity as usize - model.len());
                if let Some(plan) = plan {
                    // Eviction frees what the new keys need and no more (ghost
                    // cuts tails by its own rule), and every new key is placed.
                    assert!(
                        plan.evicted.len() <= need || policy == Policy::Ghost,
                        "evicted {} rows for {need}",
                        plan.evicted.len()
                    );
                    let placed = plan
                        .store
                        .iter()
                        .filter(|&&i| new_keys.contains(offered[i]))
                        .count();
                    assert_eq!(placed, new_keys.len(), "an offer is placed whole");
                    assert_eq!(plan.evicted_rows.len(), plan.evicted.len());
                    // Failed chunks leave silently (their removal was reported).
                    model.retain(|k, s| *s != Model::Failed || index.row_of(k).is_some());
                    for (k, row) in plan.evicted.iter().zip(&plan.evicted_rows) {
                        assert_eq!(
                            rows_before.get(&k.to_vec()),
                            Some(row),
                            "an evicted key is reported with the row it held"
                        );
                        assert!(
                            !protected.contains(&k.to_vec()),
                            "a pinned or offered key was evicted"
                        );
                        assert!(
                            model.remove(&k.to_vec()).is_some(),
                            "evicted a key not on the host"
                        );
                    }
                    let rows: BTreeSet<u32> = plan.rows.iter().copied().collect();
                    assert_eq!(rows.len(), plan.rows.len(), "one row per stored key");
                    let mut stored = Vec::new();
                    for &i in &plan.store {
                        let k = offered[i].to_vec();
                        let was = model.insert(k.clone(), Model::Pending);
                        assert!(
                            was.is_none() || was == Some(Model::Failed),
                            "only new or failed keys are written"
                        );
                        stored.push(k);
                    }
                    if !stored.is_empty() {
                        jobs.push(Job::Store(stored));
                    }
                } else {
                    assert!(need > 0, "None only when the new keys need eviction");
                    assert_eq!(index.digest(), digest_before, "a refusal changes nothing");
                }
                index.request_finished(&request);
                twin.request_finished(&request);
            }
            Op::Complete { pick, ok } => {
                if jobs.is_empty() {
                    continue;
                }
                match jobs.remove(pick % jobs.len()) {
                    Job::Load(request, keys) => {
                        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
                        index.complete_load(&request, &refs);
                        let reversed: Vec<&[u8]> = refs.iter().rev().copied().collect();
                        twin.complete_load(&request, &reversed);
                        for k in keys {
                            *loads.get_mut(&k).unwrap() -= 1;
                        }
                    }
                    Job::Store(keys) => {
                        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
                        let done = index.complete_store(&refs, *ok).unwrap();
                        let reversed: Vec<&[u8]> = refs.iter().rev().copied().collect();
                        twin.complete_store(&reversed, *ok).unwrap();
                        assert_eq!(done.len(), keys.len());
                        for k in keys.iter().cloned() {
                            if *ok {
                                model.insert(k, Model::Ready);
                            } else if index.row_of(&k).is_some() {
                                model.insert(k, Model::Failed);
                            } else {
                                model.remove(&k);
                            }
                        }
                        // Failed chunks before them left too, once nothing continued them.
                        model.retain(|k, s| *s != Model::Failed || index.row_of(k).is_some());
                        // A failed chunk stays only while a chunk continues it.
                        for k in &keys {
                            if model.get(k) == Some(&Model::Failed) {
                                let continued = model
                                    .keys()
                                    .any(|c| index.parent_of(c).is_some_and(|p| *p == **k));
                                assert!(continued, "a failed chunk nothing continues stayed");
                            }
                        }
                    }
                }
            }
            Op::Reset => {
                index.reset().unwrap();
                twin.reset().unwrap();
                model.clear();
                loads.clear();
                jobs.clear();
            }
        }
        // The index says what the model says, and keeps its shape.
        index.check().unwrap();
        assert!(index.len() as u64 <= capacity);
        assert_eq!(index.len(), model.len());
        for (k, s) in &model {
            let want = match s {
                Model::Pending => KeyState::Pending,
                Model::Ready => KeyState::Ready,
                Model::Failed => KeyState::Miss,
            };
            assert_eq!(index.lookup(k), want);
            if let Some(parent) = index.parent_of(k) {
                assert!(
                    model.contains_key(&parent.to_vec()),
                    "a resident key's prefix is resident"
                );
            }
        }
        assert_eq!(
            index.digest(),
            twin.digest(),
            "completion order changed the state"
        );
        digests.push(index.digest());
    }
    // Once every transfer completed nothing is pinned: everything can go.
    for job in jobs {
        match job {
            Job::Load(request, keys) => {
                let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
                index.complete_load(&request, &refs);
            }
            Job::Store(keys) => {
                let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
                index.complete_store(&refs, true).unwrap();
            }
        }
    }
    assert_eq!(index.num_pins(), 0);
    assert!(index.pinned_keys().is_empty());
    let failed = model.values().filter(|s| **s == Model::Failed).count();
    let all = index.len();
    assert_eq!(index.evict(capacity).unwrap().len(), all - failed);
    assert!(index.is_empty());
    index.check().unwrap();
    digests
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn matches_the_model_and_replays_identically(
        ops in ops(), capacity in 1u64..14, which in 0usize..Policy::ALL.len()
    ) {
        let policy = Policy::ALL[which];
        let first = run(policy, capacity, &ops);
        prop_assert_eq!(first, run(policy, capacity, &ops));
    }
}

#[test]
fn bad_calls_are_refused_and_change_nothing() {
    let mut index = OffloadIndex::new(4, Policy::Lru, vec![CHUNK]).unwrap();
    let short: &[u8] = b"ab";
    let before = index.digest();
    assert!(index.prepare_store("r", &[short], &[None]).is_err());
    assert!(index
        .prepare_store("r", &[b"abcdefgh".as_slice()], &[])
        .is_err());
    let absent = key(&[9], 0);
    assert!(index
        .prepare_load("r", &[absent.as_slice()], &[None])
        .is_err());
    assert_eq!(index.digest(), before);
    assert_eq!(index.len(), 0);
    assert!(OffloadIndex::new(0, Policy::Lru, vec![]).is_err());
    assert!(OffloadIndex::new(4, Policy::Lru, vec![0]).is_err());
}

#[test]
fn a_full_host_of_pinned_keys_refuses_new_ones() {
    let mut index = OffloadIndex::new(2, Policy::Lru, vec![CHUNK]).unwrap();
    let a: Vec<Vec<u8>> = (0..2).map(|i| key(&[1, 2], i)).collect();
    let refs: Vec<&[u8]> = a.iter().map(|k| k.as_slice()).collect();
    let plan = index
        .prepare_store("a", &refs, &[Some(16), Some(32)])
        .unwrap()
        .unwrap();
    assert_eq!(plan.store, vec![0, 1]);
    let b = key(&[3], 0);
    assert!(index
        .prepare_store("b", &[b.as_slice()], &[Some(16)])
        .unwrap()
        .is_none());
    index.complete_store(&refs, true).unwrap();
    let plan = index
        .prepare_store("b", &[b.as_slice()], &[Some(16)])
        .unwrap()
        .unwrap();
    // The chain is one tree node: it loses the one row the call needs, from
    // its tail; its head stays readable.
    assert_eq!(
        plan.evicted.iter().map(|k| k.to_vec()).collect::<Vec<_>>(),
        vec![a[1].clone()]
    );
    assert_eq!(index.lookup(&a[0]), KeyState::Ready);
}
