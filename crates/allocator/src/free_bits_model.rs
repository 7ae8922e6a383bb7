//! Model test of `FreeBits`: random operation sequences replayed against
//! a plainly written free list (a `BTreeMap` of free extents by start,
//! first fit by a walk in address order, coalescing on free); every
//! placement and the free extents after every step must be the same.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::FreeBits;
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
    BatchBits(u64),
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
        3 => (1..max).prop_map(Op::BatchBits),
        4 => any::<usize>().prop_map(Op::GiveBackPage),
        2 => (any::<usize>(), 1..max).prop_map(|(n, l)| Op::GiveBack(n, l)),
    ]
}

/// The pages of `extents`, in order.
fn pages(extents: &[Extent]) -> Vec<u64> {
    extents.iter().flat_map(|e| e.start..e.end()).collect()
}

fn replay(capacity: u64, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut bits = FreeBits::new(capacity);
    let mut model = Reference::default();
    model.free.insert(0, capacity);
    for op in ops {
        let free = model.free_pages();
        match *op {
            Op::FirstFit(len) => {
                prop_assert_eq!(bits.take_first_fit(len), model.first_fit(len));
            }
            Op::Prefix(len) | Op::Batch(len) | Op::BatchBits(len) if len > free => {}
            Op::Prefix(len) => {
                let mut taken = ExtentVec::default();
                bits.take_prefix(len, &mut taken);
                let expected = model.prefix(len);
                prop_assert_eq!(taken.as_slice(), expected.as_slice());
            }
            Op::Batch(len) => {
                let mut taken = Vec::new();
                bits.take_batch(len, |e| taken.push(e));
                prop_assert_eq!(taken, model.batch(len));
            }
            Op::BatchBits(len) => {
                let mut taken = Vec::new();
                bits.take_batch_bits(len, |w, mut word| {
                    while word != 0 {
                        taken.push(w as u64 * 64 + u64::from(word.trailing_zeros()));
                        word &= word - 1;
                    }
                });
                prop_assert_eq!(taken, pages(&model.batch(len)));
            }
            Op::GiveBackPage(_) | Op::GiveBack(..) if free == capacity => {}
            Op::GiveBackPage(n) => {
                let used = used_pages(&model, capacity);
                let page = used[n % used.len()];
                bits.give_back_page(page);
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
                bits.give_back(extent);
                model.give_back(extent);
            }
        }
        prop_assert_eq!(bits.extents(), model.extents());
        prop_assert_eq!(bits.free_pages(), model.free_pages());
        prop_assert_eq!(bits.extent_count(), model.free.len());
        prop_assert_eq!(
            bits.largest(),
            model.free.values().max().copied().unwrap_or(0)
        );
        bits.check_structure().map_err(TestCaseError::fail)?;
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

    /// A pool of a few words, its last one partial: runs cross words and
    /// reach the capacity.
    #[test]
    fn bits_place_as_the_free_list_does(ops in prop::collection::vec(op(20), 1..300)) {
        replay(200, &ops)?;
    }

    /// Batches longer than a word, a pool of whole words.
    #[test]
    fn long_batches_place_as_the_free_list_does(ops in prop::collection::vec(op(150), 1..200)) {
        replay(640, &ops)?;
    }
}
