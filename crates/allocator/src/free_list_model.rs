//! Model test of `FreeList`: random operation sequences replayed against
//! a plainly written free list (a `BTreeMap` of free extents by start,
//! first fit by a walk in address order, coalescing on free); every
//! placement and the free extents after every step must be the same.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::FreeList;
use crate::extent::Extent;
use crate::placement::ExtentVec;

/// Free extents by start, fully coalesced.
#[derive(Default)]
struct Reference {
    free: BTreeMap<u64, u64>,
}

impl Reference {
    fn free_pages(&self) -> u64 {
        self.free.values().sum()
    }

    fn take(&mut self, start: u64, len: u64) {
        let (&at, &have) = self.free.range(..=start).next_back().expect("free");
        assert!(at + have >= start + len);
        self.free.remove(&at);
        if start > at {
            self.free.insert(at, start - at);
        }
        if at + have > start + len {
            self.free.insert(start + len, at + have - start - len);
        }
    }

    fn first_fit(&mut self, len: u64) -> Option<Extent> {
        let (&start, _) = self.free.iter().find(|(_, &l)| l >= len)?;
        self.take(start, len);
        Some(Extent::new(start, len))
    }

    fn prefix(&mut self, len: u64) -> Vec<Extent> {
        let mut out = Vec::new();
        let mut missing = len;
        while missing > 0 {
            let (&start, &have) = self.free.iter().next().expect("counted");
            let take = have.min(missing);
            self.take(start, take);
            out.push(Extent::new(start, take));
            missing -= take;
        }
        out
    }

    fn batch(&mut self, len: u64) -> Vec<Extent> {
        match self.first_fit(len) {
            Some(extent) => vec![extent],
            None => self.prefix(len),
        }
    }

    fn give_back(&mut self, extent: Extent) {
        let (mut start, mut len) = (extent.start, extent.len);
        if let Some((&at, &have)) = self.free.range(..start).next_back() {
            if at + have == start {
                self.free.remove(&at);
                (start, len) = (at, len + have);
            }
        }
        if let Some(after) = self.free.remove(&(start + len)) {
            len += after;
        }
        self.free.insert(start, len);
    }

    fn extents(&self) -> Vec<Extent> {
        self.free.iter().map(|(&s, &l)| Extent::new(s, l)).collect()
    }
}

#[derive(Clone, Debug)]
enum Op {
    FirstFit(u64),
    Prefix(u64),
    Batch(u64),
    /// Give back used page number `n % used` (a single page).
    GiveBackPage(usize),
    /// Give back the run of used pages from used page `n % used`, at most `len` long.
    GiveBack(usize, u64),
}

fn op(max: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1..max).prop_map(Op::FirstFit),
        1 => (1..max).prop_map(Op::Prefix),
        2 => (1..max).prop_map(Op::Batch),
        4 => any::<usize>().prop_map(Op::GiveBackPage),
        2 => (any::<usize>(), 1..max).prop_map(|(n, l)| Op::GiveBack(n, l)),
    ]
}

fn replay(capacity: u64, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut list = FreeList::new(capacity);
    let mut model = Reference::default();
    model.free.insert(0, capacity);
    for op in ops {
        let free = model.free_pages();
        match *op {
            Op::FirstFit(len) => {
                prop_assert_eq!(list.take_first_fit(len), model.first_fit(len));
            }
            Op::Prefix(len) | Op::Batch(len) if len > free => {}
            Op::Prefix(len) => {
                let mut taken = ExtentVec::default();
                list.take_prefix(len, &mut taken);
                let expected = model.prefix(len);
                prop_assert_eq!(taken.as_slice(), expected.as_slice());
            }
            Op::Batch(len) => {
                let mut taken = Vec::new();
                list.take_batch(len, |e| taken.push(e));
                prop_assert_eq!(taken, model.batch(len));
            }
            Op::GiveBackPage(_) | Op::GiveBack(..) if free == capacity => {}
            Op::GiveBackPage(n) => {
                let used = used_pages(&model, capacity);
                let page = used[n % used.len()];
                list.give_back(Extent::new(page, 1));
                model.give_back(Extent::new(page, 1));
            }
            Op::GiveBack(n, len) => {
                let used = used_pages(&model, capacity);
                let start = used[n % used.len()];
                let run = used[n % used.len()..]
                    .iter()
                    .zip(start..)
                    .take_while(|(&p, q)| p == *q)
                    .count() as u64;
                let extent = Extent::new(start, run.min(len));
                list.give_back(extent);
                model.give_back(extent);
            }
        }
        prop_assert_eq!(list.extents(), model.extents());
        prop_assert_eq!(list.free_pages(), model.free_pages());
        prop_assert_eq!(list.extent_count(), model.free.len());
        prop_assert_eq!(
            list.largest(),
            model.free.values().max().copied().unwrap_or(0)
        );
        list.check_structure().map_err(TestCaseError::fail)?;
    }
    Ok(())
}

/// The used pages of the model, in address order.
fn used_pages(model: &Reference, capacity: u64) -> Vec<u64> {
    let mut used = Vec::new();
    let mut next = 0;
    for (&start, &len) in &model.free {
        used.extend(next..start);
        next = start + len;
    }
    used.extend(next..capacity);
    used
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// A small pool: few free extents, the flat array.
    #[test]
    fn places_as_the_reference_does(ops in prop::collection::vec(op(20), 1..300)) {
        replay(200, &ops)?;
    }

    /// Single-page frees scatter a pool taken almost whole: past 32 free
    /// extents the list moves into the tree, and back as batches fill them.
    #[test]
    fn places_as_the_reference_does_in_the_tree(ops in prop::collection::vec(op(6), 100..400)) {
        let mut all = vec![Op::Prefix(600)];
        all.extend(ops);
        replay(640, &all)?;
    }
}
