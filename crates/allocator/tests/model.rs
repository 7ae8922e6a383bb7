//! Model-based property test: random operation sequences replayed against
//! `PageAllocator` and a page-owner-map model that is obviously right, with
//! every invariant checked after every step.

use std::collections::BTreeMap;

use cpkv_allocator::{AllocError, Extent, PageAllocator, PayloadSet};
use proptest::prelude::*;

/// Small pools: every path (misses, multi-extent reserves, splits) is hit often.
const SMALL: [(&str, u64); 2] = [("kv", 48), ("index", 40)];
/// Larger pools with small objects: hundreds of free extents, so the free
/// lists' trees grow several levels deep, split and rebalance.
const LARGE: [(&str, u64); 2] = [("kv", 1500), ("index", 1200)];

#[derive(Clone, Debug)]
enum Op {
    Reserve {
        key: u64,
        pages: u64,
        payloads: u8,
    },
    ReserveMany {
        items: Vec<(u64, u64)>,
        payloads: u8,
    },
    Release {
        key: u64,
    },
    ReleaseMany {
        keys: Vec<u64>,
    },
    Commit {
        key: u64,
    },
    Split {
        key: u64,
        at: u64,
        left: u64,
        right: u64,
    },
    /// `reserve_one` into payload `payload` (0 or 1).
    ReserveOne {
        key: u64,
        pages: u64,
        payload: usize,
    },
    ReserveHeld {
        payload: usize,
        pages: u64,
    },
    ReleaseHeld {
        payload: usize,
        page: u64,
    },
    ReleaseHeldMany {
        payload: usize,
        pages: Vec<u64>,
    },
    SnapshotRestore,
}

/// The model's owner of a held page (keys stay far below it).
const HELD: u64 = u64::MAX;

fn op(keys: u64, max_pages: u64) -> impl Strategy<Value = Op> {
    let key = 0..keys;
    prop_oneof![
        4 => (key.clone(), 0..max_pages, 0..4u8).prop_map(|(key, pages, payloads)| Op::Reserve { key, pages, payloads }),
        1 => (prop::collection::vec((0..keys, 0..max_pages), 0..5), 0..4u8)
            .prop_map(|(items, payloads)| Op::ReserveMany { items, payloads }),
        3 => key.clone().prop_map(|key| Op::Release { key }),
        1 => prop::collection::vec(0..keys, 0..4).prop_map(|keys| Op::ReleaseMany { keys }),
        2 => key.clone().prop_map(|key| Op::Commit { key }),
        2 => (key.clone(), 0..max_pages, 0..keys, 0..keys)
            .prop_map(|(key, at, left, right)| Op::Split { key, at, left, right }),
        2 => (key.clone(), 0..max_pages, 0..3usize).prop_map(|(key, pages, payload)| Op::ReserveOne { key, pages, payload }),
        3 => (0..3usize, 0..max_pages).prop_map(|(payload, pages)| Op::ReserveHeld { payload, pages }),
        3 => (0..3usize, 0..48u64).prop_map(|(payload, page)| Op::ReleaseHeld { payload, page }),
        1 => (0..3usize, prop::collection::vec(0..48u64, 0..5))
            .prop_map(|(payload, pages)| Op::ReleaseHeldMany { payload, pages }),
        1 => Just(Op::SnapshotRestore),
    ]
}

/// Held pages chosen among the lowest ones, so releases often hit them.
fn held_op(max_pages: u64, pages: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..2usize, 1..max_pages).prop_map(|(payload, pages)| Op::ReserveHeld { payload, pages }),
        3 => (0..2usize, 0..pages).prop_map(|(payload, page)| Op::ReleaseHeld { payload, page }),
        1 => (0..2usize, prop::collection::vec(0..pages, 0..12))
            .prop_map(|(payload, pages)| Op::ReleaseHeldMany { payload, pages }),
        1 => (0..700u64, 1..max_pages).prop_map(|(key, pages)| Op::ReserveOne { key, pages, payload: 0 }),
        1 => (0..700u64).prop_map(|key| Op::Release { key }),
    ]
}

/// Payload choice: 0 = all (`None`), 1 = "kv", 2 = "index", 3 = both named in reverse.
fn names(choice: u8) -> Option<Vec<&'static str>> {
    match choice {
        0 => None,
        1 => Some(vec!["kv"]),
        2 => Some(vec!["index"]),
        _ => Some(vec!["index", "kv"]),
    }
}

#[derive(Clone, Debug)]
struct ModelObject {
    /// Per payload id, the physical page of each object position.
    pages: BTreeMap<usize, Vec<u64>>,
    committed: bool,
}

/// Owner of every page, per payload; objects with their page lists.
#[derive(Clone, Debug)]
struct Model {
    capacities: &'static [(&'static str, u64)],
    owners: Vec<Vec<Option<u64>>>,
    objects: BTreeMap<u64, ModelObject>,
}

impl Model {
    fn new(capacities: &'static [(&'static str, u64)]) -> Self {
        Model {
            capacities,
            owners: capacities
                .iter()
                .map(|&(_, c)| vec![None; c as usize])
                .collect(),
            objects: BTreeMap::new(),
        }
    }

    /// Maximal runs of free pages, in address order.
    fn free_runs(&self, payload: usize) -> Vec<Extent> {
        let mut runs: Vec<Extent> = Vec::new();
        for (page, owner) in self.owners[payload].iter().enumerate() {
            if owner.is_some() {
                continue;
            }
            match runs.last_mut() {
                Some(run) if run.end() == page as u64 => run.len += 1,
                _ => runs.push(Extent::new(page as u64, 1)),
            }
        }
        runs
    }

    fn payload_ids(choice: u8) -> Vec<usize> {
        match choice {
            1 => vec![0],
            2 => vec![1],
            _ => vec![0, 1],
        }
    }

    fn check_new(&self, key: u64, pages: u64) -> Result<(), AllocError> {
        if pages == 0 {
            return Err(AllocError::InvalidPages {
                key,
                num_pages: pages,
            });
        }
        if self.objects.contains_key(&key) {
            return Err(AllocError::DuplicateKey { key });
        }
        Ok(())
    }

    fn reserve(&mut self, key: u64, pages: u64, choice: u8) -> bool {
        let ids = Self::payload_ids(choice);
        let fits = ids
            .iter()
            .all(|&id| self.free_runs(id).iter().map(|r| r.len).sum::<u64>() >= pages);
        if !fits {
            return false;
        }
        let mut placed = BTreeMap::new();
        for id in ids {
            placed.insert(id, self.take(id, pages, key));
        }
        self.objects.insert(
            key,
            ModelObject {
                pages: placed,
                committed: false,
            },
        );
        true
    }

    /// First fit of `pages` pages (no more than are free) in payload `id`,
    /// owned by `owner` from now on.
    fn take(&mut self, id: usize, pages: u64, owner: u64) -> Vec<u64> {
        let runs = self.free_runs(id);
        let chosen: Vec<u64> = match runs.iter().find(|r| r.len >= pages) {
            Some(run) => (run.start..run.start + pages).collect(),
            None => runs
                .iter()
                .flat_map(|r| r.start..r.end())
                .take(pages as usize)
                .collect(),
        };
        for &page in &chosen {
            self.owners[id][page as usize] = Some(owner);
        }
        chosen
    }

    fn free_count(&self, id: usize) -> u64 {
        self.owners[id].iter().filter(|o| o.is_none()).count() as u64
    }

    fn is_held(&self, id: usize, page: u64) -> bool {
        self.owners[id].get(page as usize) == Some(&Some(HELD))
    }

    fn release(&mut self, key: u64) {
        let object = self.objects.remove(&key).expect("live");
        for (id, pages) in object.pages {
            for page in pages {
                self.owners[id][page as usize] = None;
            }
        }
    }

    fn split(&mut self, key: u64, at: u64, left: u64, right: u64) -> Result<(), AllocError> {
        let object = self
            .objects
            .get(&key)
            .ok_or(AllocError::UnknownKey { key })?;
        if !object.committed {
            return Err(AllocError::NotCommitted { key });
        }
        let num_pages = object.pages.values().next().unwrap().len() as u64;
        if at == 0 || at >= num_pages {
            return Err(AllocError::InvalidSplit { key, at, num_pages });
        }
        if left == right {
            return Err(AllocError::SameSplitKeys { key, target: left });
        }
        for target in [left, right] {
            if self.objects.contains_key(&target) {
                return Err(AllocError::DuplicateKey { key: target });
            }
        }
        let object = self.objects.remove(&key).unwrap();
        let mut halves = [BTreeMap::new(), BTreeMap::new()];
        for (id, pages) in object.pages {
            for &page in &pages[..at as usize] {
                self.owners[id][page as usize] = Some(left);
            }
            for &page in &pages[at as usize..] {
                self.owners[id][page as usize] = Some(right);
            }
            halves[0].insert(id, pages[..at as usize].to_vec());
            halves[1].insert(id, pages[at as usize..].to_vec());
        }
        let [l, r] = halves;
        self.objects.insert(
            left,
            ModelObject {
                pages: l,
                committed: true,
            },
        );
        self.objects.insert(
            right,
            ModelObject {
                pages: r,
                committed: true,
            },
        );
        Ok(())
    }
}

fn first_repeat(keys: impl Iterator<Item = u64>) -> Option<u64> {
    let mut sorted: Vec<u64> = keys.collect();
    sorted.sort_unstable();
    sorted.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

fn select(alloc: &PageAllocator, choice: u8) -> PayloadSet {
    alloc.select(names(choice).as_deref()).unwrap()
}

/// Applies `op` to both; returns the model's expected error if it is rejected.
fn apply(alloc: &mut PageAllocator, model: &mut Model, op: &Op) -> Result<(), AllocError> {
    match op {
        &Op::Reserve {
            key,
            pages,
            payloads,
        } => {
            let expect = model.check_new(key, pages);
            let set = select(alloc, payloads);
            let got = alloc.reserve(key, pages, set).map(|p| p.is_some());
            match expect {
                Err(e) => {
                    assert_eq!(got, Err(e.clone()));
                    return Err(e);
                }
                Ok(()) => assert_eq!(got, Ok(model.reserve(key, pages, payloads))),
            }
        }
        Op::ReserveMany { items, payloads } => {
            let expect = items
                .iter()
                .try_for_each(|&(k, p)| model.check_new(k, p))
                .and_then(|()| match first_repeat(items.iter().map(|i| i.0)) {
                    Some(key) => Err(AllocError::RepeatedKeyInBatch { key }),
                    None => Ok(()),
                });
            let set = select(alloc, *payloads);
            let got = alloc
                .reserve_many(items, set)
                .map(|placed| placed.iter().map(Option::is_some).collect::<Vec<_>>());
            match expect {
                Err(e) => {
                    assert_eq!(got, Err(e.clone()));
                    return Err(e);
                }
                Ok(()) => {
                    let placed: Vec<bool> = items
                        .iter()
                        .map(|&(k, p)| model.reserve(k, p, *payloads))
                        .collect();
                    assert_eq!(got, Ok(placed));
                }
            }
        }
        &Op::Release { key } => {
            let got = alloc.release(key);
            if !model.objects.contains_key(&key) {
                let e = AllocError::UnknownKey { key };
                assert_eq!(got, Err(e.clone()));
                return Err(e);
            }
            assert_eq!(got, Ok(()));
            model.release(key);
        }
        Op::ReleaseMany { keys } => {
            let expect = match keys.iter().find(|k| !model.objects.contains_key(k)) {
                Some(&key) => Err(AllocError::UnknownKey { key }),
                None => match first_repeat(keys.iter().copied()) {
                    Some(key) => Err(AllocError::RepeatedKeyInBatch { key }),
                    None => Ok(()),
                },
            };
            let got = alloc.release_many(keys);
            assert_eq!(got, expect);
            expect.clone()?;
            keys.iter().for_each(|&k| model.release(k));
        }
        &Op::Commit { key } => {
            let got = alloc.mark_committed(key);
            match model.objects.get_mut(&key) {
                None => {
                    let e = AllocError::UnknownKey { key };
                    assert_eq!(got, Err(e.clone()));
                    return Err(e);
                }
                Some(object) => {
                    assert_eq!(got, Ok(()));
                    object.committed = true;
                }
            }
        }
        &Op::Split {
            key,
            at,
            left,
            right,
        } => {
            let expect = model.split(key, at, left, right);
            assert_eq!(alloc.split(key, at, left, right), expect);
            expect?;
        }
        &Op::ReserveOne {
            key,
            pages,
            payload,
        } => {
            let got = alloc
                .reserve_one(key, pages, payload)
                .map(|p| p.map(|p| p.pages(payload).unwrap()));
            if payload >= model.capacities.len() {
                let e = AllocError::UnknownPayload {
                    name: format!("#{payload}"),
                };
                assert_eq!(got, Err(e.clone()));
                return Err(e);
            }
            if let Err(e) = model.check_new(key, pages) {
                assert_eq!(got, Err(e.clone()));
                return Err(e);
            }
            if model.free_count(payload) < pages {
                assert_eq!(got, Ok(None));
            } else {
                let chosen = model.take(payload, pages, key);
                assert_eq!(got, Ok(Some(chosen.clone())));
                model.objects.insert(
                    key,
                    ModelObject {
                        pages: BTreeMap::from([(payload, chosen)]),
                        committed: false,
                    },
                );
            }
        }
        &Op::ReserveHeld { payload, pages } => {
            let mut got_pages = vec![7];
            let got = alloc.reserve_held(payload, pages, &mut got_pages);
            if payload >= model.capacities.len() {
                let e = AllocError::UnknownPayload {
                    name: format!("#{payload}"),
                };
                assert_eq!(got, Err(e.clone()));
                assert_eq!(got_pages, [7]);
                return Err(e);
            }
            if model.free_count(payload) < pages {
                assert_eq!(got, Ok(false));
                assert_eq!(got_pages, [7]);
            } else {
                assert_eq!(got, Ok(true));
                let mut expect = vec![7];
                expect.extend(model.take(payload, pages, HELD));
                assert_eq!(got_pages, expect);
            }
        }
        &Op::ReleaseHeld { payload, page } => {
            let got = alloc.release_held(payload, page);
            let expect = if payload >= model.capacities.len() {
                Err(AllocError::UnknownPayload {
                    name: format!("#{payload}"),
                })
            } else if !model.is_held(payload, page) {
                Err(AllocError::NotHeld { payload, page })
            } else {
                Ok(())
            };
            assert_eq!(got, expect);
            expect.clone()?;
            model.owners[payload][page as usize] = None;
        }
        Op::ReleaseHeldMany { payload, pages } => {
            let payload = *payload;
            let got = alloc.release_held_many(payload, pages);
            let expect = if payload >= model.capacities.len() {
                Err(AllocError::UnknownPayload {
                    name: format!("#{payload}"),
                })
            } else {
                // The first page that is not held, or held but already
                // named earlier in the batch.
                pages
                    .iter()
                    .enumerate()
                    .find_map(|(i, &page)| {
                        if pages[..i].contains(&page) && model.is_held(payload, page) {
                            Some(AllocError::RepeatedPageInBatch { payload, page })
                        } else if !model.is_held(payload, page) {
                            Some(AllocError::NotHeld { payload, page })
                        } else {
                            None
                        }
                    })
                    .map_or(Ok(()), Err)
            };
            assert_eq!(got, expect);
            expect.clone()?;
            for &page in pages {
                model.owners[payload][page as usize] = None;
            }
        }
        Op::SnapshotRestore => {
            let restored = PageAllocator::restore(&alloc.snapshot()).unwrap();
            assert_eq!(restored.digest(), alloc.digest());
            assert_eq!(restored.stats(), alloc.stats());
            *alloc = restored;
        }
    }
    Ok(())
}

/// Everything the model determines must match; the allocator's own audit
/// (coalescing, exact tiling, digest recomputed from scratch) must pass.
fn check_against_model(alloc: &PageAllocator, model: &Model) {
    alloc.verify().unwrap();
    assert_eq!(alloc.len(), model.objects.len());
    for (id, &(_, capacity)) in model.capacities.iter().enumerate() {
        let runs = model.free_runs(id);
        assert_eq!(alloc.free_extents(id), runs);
        let free: u64 = runs.iter().map(|r| r.len).sum();
        assert_eq!(alloc.free_pages(id), free);
        assert_eq!(
            alloc.largest_free_extent(id),
            runs.iter().map(|r| r.len).max().unwrap_or(0)
        );
        let used: u64 = alloc
            .keys()
            .into_iter()
            .filter_map(|k| {
                alloc
                    .placement(k)
                    .unwrap()
                    .extents(id)
                    .map(|_| alloc.placement(k).unwrap().num_pages())
            })
            .sum();
        let held: Vec<u64> = (0..capacity).filter(|&p| model.is_held(id, p)).collect();
        assert_eq!(alloc.held_pages(id), held.len() as u64);
        let held_extents: Vec<u64> = alloc
            .held_extents(id)
            .iter()
            .flat_map(|e| e.start..e.end())
            .collect();
        assert_eq!(held_extents, held);
        for page in 0..capacity {
            assert_eq!(alloc.is_held(id, page), model.is_held(id, page));
        }
        assert_eq!(free + used + held.len() as u64, capacity);
    }
    for (&key, object) in &model.objects {
        let placement = alloc.placement(key).unwrap();
        assert_eq!(alloc.is_committed(key), Ok(object.committed));
        let ids: Vec<usize> = placement.payloads().collect();
        assert_eq!(ids, object.pages.keys().copied().collect::<Vec<_>>());
        for (&id, pages) in &object.pages {
            assert_eq!(
                placement.pages(id).as_ref(),
                Some(pages),
                "key {key} payload {id}"
            );
        }
    }
}

fn run_against_model(
    capacities: &'static [(&'static str, u64)],
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let mut alloc = PageAllocator::new(capacities).unwrap();
    let mut model = Model::new(capacities);
    for op in ops {
        let (digest, canonical, stats) = (alloc.digest(), alloc.canonical_digest(), alloc.stats());
        if apply(&mut alloc, &mut model, op).is_err() {
            prop_assert_eq!(alloc.digest(), digest);
            prop_assert_eq!(alloc.canonical_digest(), canonical);
            prop_assert_eq!(alloc.stats(), stats);
        }
        check_against_model(&alloc, &model);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn allocator_matches_model(ops in prop::collection::vec(op(12, 20), 1..120)) {
        run_against_model(&SMALL, &ops)?;
    }

    /// Reserve then release restores state and both digests exactly,
    /// whatever state it starts from.
    #[test]
    fn reserve_release_restores(ops in prop::collection::vec(op(12, 20), 0..40), pages in 1..30u64, choice in 0..4u8) {
        let mut alloc = PageAllocator::new(&SMALL).unwrap();
        let mut model = Model::new(&SMALL);
        for op in &ops {
            let _ = apply(&mut alloc, &mut model, op);
        }
        let before = (alloc.digest(), alloc.canonical_digest(), alloc.free_extents(0), alloc.free_extents(1));
        let set = select(&alloc, choice);
        if alloc.reserve(1_000, pages, set).unwrap().is_some() {
            prop_assert_ne!(alloc.digest(), before.0);
            alloc.release(1_000).unwrap();
        }
        prop_assert_eq!((alloc.digest(), alloc.canonical_digest(), alloc.free_extents(0), alloc.free_extents(1)), before);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Mostly held pages, freed one by one in random order: free lists
    /// of many one-page extents, and snapshots holding held runs.
    #[test]
    fn held_pages_match_model_with_deep_free_lists(ops in prop::collection::vec(held_op(9, 1500), 200..1200), snapshot_every in 50..200usize) {
        let mut alloc = PageAllocator::new(&LARGE).unwrap();
        let mut model = Model::new(&LARGE);
        for (i, op) in ops.iter().enumerate() {
            let (digest, canonical, stats) = (alloc.digest(), alloc.canonical_digest(), alloc.stats());
            if apply(&mut alloc, &mut model, op).is_err() {
                prop_assert_eq!(alloc.digest(), digest);
                prop_assert_eq!(alloc.canonical_digest(), canonical);
                prop_assert_eq!(alloc.stats(), stats);
            }
            if i % snapshot_every == 0 {
                apply(&mut alloc, &mut model, &Op::SnapshotRestore).unwrap();
            }
            check_against_model(&alloc, &model);
        }
    }

    #[test]
    fn allocator_matches_model_with_deep_free_lists(ops in prop::collection::vec(op(700, 6), 200..1200)) {
        run_against_model(&LARGE, &ops)?;
    }
}
