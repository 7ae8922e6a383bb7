//! Where an object's pages live: per payload, its extents in position order.

use crate::digest::{object_extent_element, object_seed};
use crate::extent::Extent;
use crate::payload::PayloadId;

/// An object's placement: the same number of pages in each of its payloads;
/// in each, object position `i` lives at physical page `pages()[i]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    num_pages: u64,
    /// Per payload in construction order: a header `(payload id, extent
    /// count)` followed by that many extents in position order.
    encoded: ExtentVec,
}

/// Entries kept in place before an `ExtentVec` moves to the heap: a header
/// and one extent for each of two payloads, the common placement.
const INLINE: usize = 4;

/// A vector of extents that holds up to `INLINE` in place, so the common
/// placement costs no allocation to make, copy or drop.
#[derive(Clone, Debug)]
pub(crate) enum ExtentVec {
    Inline { len: usize, items: [Extent; INLINE] },
    Heap(Vec<Extent>),
}

impl Default for ExtentVec {
    fn default() -> Self {
        ExtentVec::Inline {
            len: 0,
            items: [Extent::new(0, 0); INLINE],
        }
    }
}

impl PartialEq for ExtentVec {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for ExtentVec {}

impl ExtentVec {
    pub(crate) fn as_slice(&self) -> &[Extent] {
        match self {
            ExtentVec::Inline { len, items } => &items[..*len],
            ExtentVec::Heap(v) => v,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [Extent] {
        match self {
            ExtentVec::Inline { len, items } => &mut items[..*len],
            ExtentVec::Heap(v) => v,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub(crate) fn push(&mut self, extent: Extent) {
        match self {
            ExtentVec::Inline { len, items } if *len < INLINE => {
                items[*len] = extent;
                *len += 1;
            }
            ExtentVec::Inline { len, items } => {
                let mut heap = Vec::with_capacity(2 * INLINE);
                heap.extend_from_slice(&items[..*len]);
                heap.push(extent);
                *self = ExtentVec::Heap(heap);
            }
            ExtentVec::Heap(v) => v.push(extent),
        }
    }

    pub(crate) fn extend_from_slice(&mut self, extents: &[Extent]) {
        extents.iter().for_each(|&e| self.push(e));
    }
}

impl Placement {
    pub(crate) fn new(num_pages: u64) -> Self {
        Placement {
            num_pages,
            encoded: ExtentVec::default(),
        }
    }

    /// Appends the extents of `payload` (after those of lower payload ids),
    /// written by `fill`.
    pub(crate) fn push_part(&mut self, payload: PayloadId, fill: impl FnOnce(&mut ExtentVec)) {
        let header = self.encoded.len();
        self.encoded.push(Extent::new(payload as u64, 0));
        fill(&mut self.encoded);
        let count = (self.encoded.len() - header - 1) as u64;
        self.encoded.as_mut_slice()[header].len = count;
        debug_assert!(
            self.encoded.as_slice()[header + 1..]
                .iter()
                .map(|e| e.len)
                .sum::<u64>()
                == self.num_pages
        );
    }

    pub fn num_pages(&self) -> u64 {
        self.num_pages
    }

    /// `(payload, extents)` per payload, in construction order.
    pub fn parts(&self) -> impl Iterator<Item = (PayloadId, &[Extent])> + '_ {
        let mut rest = self.encoded.as_slice();
        std::iter::from_fn(move || {
            let (header, tail) = rest.split_first()?;
            let (extents, tail) = tail.split_at(header.len as usize);
            rest = tail;
            Some((header.start as PayloadId, extents))
        })
    }

    pub fn payloads(&self) -> impl Iterator<Item = PayloadId> + '_ {
        self.parts().map(|(payload, _)| payload)
    }

    /// The extents in `payload`, or `None` if the object has no pages there.
    pub fn extents(&self, payload: PayloadId) -> Option<&[Extent]> {
        self.parts()
            .find(|&(p, _)| p == payload)
            .map(|(_, extents)| extents)
    }

    /// The physical page of every object position in `payload`.
    pub fn pages(&self, payload: PayloadId) -> Option<Vec<u64>> {
        let extents = self.extents(payload)?;
        Some(extents.iter().flat_map(|e| e.start..e.end()).collect())
    }

    /// The sum of the digest elements of this placement's extents under
    /// `key`: what the object adds to the allocator's digest.
    pub(crate) fn digest_share(&self, key: u64) -> u64 {
        let seed = object_seed(key);
        let mut share = 0u64;
        for (payload, extents) in self.parts() {
            let mut position = 0;
            for &extent in extents {
                share = share.wrapping_add(object_extent_element(seed, payload, position, extent));
                position += extent.len;
            }
        }
        share
    }

    /// Positions `[0, at)` and `[at, num_pages)` over the same physical pages.
    pub(crate) fn split_at(&self, at: u64) -> (Placement, Placement) {
        debug_assert!(0 < at && at < self.num_pages);
        let mut left = Placement::new(at);
        let mut right = Placement::new(self.num_pages - at);
        for (payload, extents) in self.parts() {
            let mut cut = None;
            let mut position = 0;
            for (i, extent) in extents.iter().enumerate() {
                if position + extent.len > at {
                    cut = Some((i, at - position));
                    break;
                }
                position += extent.len;
            }
            let (i, offset) = cut.expect("0 < at < num_pages");
            let e = extents[i];
            left.push_part(payload, |out| {
                out.extend_from_slice(&extents[..i]);
                if offset > 0 {
                    out.push(Extent::new(e.start, offset));
                }
            });
            right.push_part(payload, |out| {
                out.push(Extent::new(e.start + offset, e.len - offset));
                out.extend_from_slice(&extents[i + 1..]);
            });
        }
        (left, right)
    }
}
