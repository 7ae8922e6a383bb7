//! `HostRows` (the host tier's row placement) replayed against a plain
//! model: a table of which key owns each row, placing a batch first fit
//! (the lowest run of free rows that holds it whole, else the lowest free
//! rows). After every operation: the rows match the model's, no row is
//! owned twice, free + used = capacity, the allocator's own audit passes;
//! and two replays of the same operations end with the same digest.

use std::collections::BTreeMap;

use cpkv_tier::HostRows;
use proptest::prelude::*;

const CAPACITY: usize = 48;

#[derive(Debug, Clone)]
enum Op {
    /// The main job: one object of `n` rows.
    Group(u64),
    /// An engine store call: `n` rows held by number, in one reservation.
    Each(u64),
    /// Frees the live object or held row at this index (mod the live count).
    Release(usize),
    /// Frees up to `count` live objects and held rows from this index, the
    /// objects in one call and the rows in another.
    ReleaseMany(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..=12).prop_map(Op::Group),
        (1u64..=12).prop_map(Op::Each),
        any::<usize>().prop_map(Op::Release),
        (any::<usize>(), 1usize..=4).prop_map(|(i, n)| Op::ReleaseMany(i, n)),
    ]
}

/// The rows' owners, row by row.
struct Model {
    owner: Vec<Option<u64>>,
}

impl Model {
    fn free(&self) -> usize {
        self.owner.iter().filter(|o| o.is_none()).count()
    }

    /// First fit for `n` rows: `None` when fewer are free.
    fn place(&self, n: usize) -> Option<Vec<usize>> {
        if self.free() < n {
            return None;
        }
        let whole = (0..=CAPACITY - n).find(|&s| self.owner[s..s + n].iter().all(Option::is_none));
        Some(match whole {
            Some(start) => (start..start + n).collect(),
            None => (0..CAPACITY)
                .filter(|&r| self.owner[r].is_none())
                .take(n)
                .collect(),
        })
    }

    fn release(&mut self, key: u64) {
        for owner in &mut self.owner {
            if *owner == Some(key) {
                *owner = None;
            }
        }
    }
}

/// Replays `ops`, checking each against the model; returns the digest
/// after every operation.
fn replay(ops: &[Op]) -> Result<Vec<u64>, TestCaseError> {
    let mut rows = HostRows::new(CAPACITY as u64).unwrap();
    let mut model = Model {
        owner: vec![None; CAPACITY],
    };
    // Live keys in the order they were placed, with their rows and whether
    // the row is held by number (an engine block) rather than an object's.
    let mut live: BTreeMap<u64, (Vec<usize>, bool)> = BTreeMap::new();
    let mut next_key = 1u64;
    let mut digests = Vec::new();
    for op in ops {
        match *op {
            Op::Group(n) => {
                let expect = model.place(n as usize);
                let got = rows.reserve(next_key, n).unwrap();
                let got: Option<Vec<usize>> = got.map(|r| r.iter().map(|&r| r as usize).collect());
                prop_assert_eq!(&got, &expect);
                if let Some(placed) = got {
                    for &r in &placed {
                        prop_assert_eq!(model.owner[r], None, "row {} owned twice", r);
                        model.owner[r] = Some(next_key);
                    }
                    live.insert(next_key, (placed, false));
                    next_key += 1;
                }
            }
            Op::Each(n) => {
                let keys: Vec<u64> = (next_key..next_key + n).collect();
                let expect = model.place(n as usize);
                let got: Option<Vec<usize>> = rows
                    .reserve_rows(n)
                    .unwrap()
                    .map(|r| r.iter().map(|&r| r as usize).collect());
                prop_assert_eq!(&got, &expect);
                if let Some(placed) = got {
                    for (&key, &r) in keys.iter().zip(&placed) {
                        prop_assert_eq!(model.owner[r], None, "row {} owned twice", r);
                        model.owner[r] = Some(key);
                        live.insert(key, (vec![r], true));
                    }
                    next_key += n;
                }
            }
            Op::Release(i) => {
                if live.is_empty() {
                    prop_assert!(rows.release(next_key).is_err(), "no such object");
                    continue;
                }
                let key = *live.keys().nth(i % live.len()).unwrap();
                match &live[&key] {
                    (placed, true) => {
                        prop_assert!(rows.release(key).is_err(), "a held row is no object");
                        rows.release_row(placed[0] as u64).unwrap();
                        prop_assert!(rows.release_row(placed[0] as u64).is_err());
                    }
                    (_, false) => rows.release(key).unwrap(),
                }
                model.release(key);
                live.remove(&key);
            }
            Op::ReleaseMany(i, count) => {
                let keys: Vec<u64> = live
                    .keys()
                    .cycle()
                    .skip(i % live.len().max(1))
                    .take(count.min(live.len()))
                    .copied()
                    .collect();
                let objects: Vec<u64> = keys.iter().copied().filter(|k| !live[k].1).collect();
                let held: Vec<u64> = keys
                    .iter()
                    .filter(|k| live[k].1)
                    .map(|k| live[k].0[0] as u64)
                    .collect();
                // A batch naming a key or a row twice is refused whole.
                let before = rows.digest();
                if let Some(&first) = objects.first() {
                    let repeated = [objects.as_slice(), &[first]].concat();
                    prop_assert!(rows.release_many(&repeated).is_err());
                }
                if let Some(&first) = held.first() {
                    let repeated = [held.as_slice(), &[first]].concat();
                    prop_assert!(rows.release_rows(&repeated).is_err());
                }
                prop_assert_eq!(rows.digest(), before);
                rows.release_many(&objects).unwrap();
                rows.release_rows(&held).unwrap();
                for key in keys {
                    model.release(key);
                    live.remove(&key);
                }
            }
        }
        let used = CAPACITY - model.free();
        prop_assert_eq!(rows.free() as usize, model.free());
        prop_assert_eq!(rows.free() + rows.used(), CAPACITY as u64);
        prop_assert_eq!(rows.used() as usize, used);
        prop_assert_eq!(live.values().map(|(r, _)| r.len()).sum::<usize>(), used);
        rows.check().map_err(TestCaseError::fail)?;
        digests.push(rows.digest());
    }
    Ok(digests)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn host_rows_place_first_fit_and_replay_to_the_same_digest(
        ops in proptest::collection::vec(op(), 1..120)
    ) {
        let first = replay(&ops)?;
        let second = replay(&ops)?;
        prop_assert_eq!(first, second);
    }
}
