//! Where an object's pages live: per payload, its extents in position order.

use crate::digest::object_extent_element;
use crate::extent::Extent;
use crate::payload::PayloadId;

/// The extents of one payload, in object-position order: object position
/// `i` lives at physical page `pages()[i]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PayloadExtents {
    pub payload: PayloadId,
    pub extents: Vec<Extent>,
}

/// An object's placement: the same number of pages in each of its payloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    num_pages: u64,
    /// One entry per payload, in payload construction order.
    parts: Vec<PayloadExtents>,
}

impl Placement {
    pub(crate) fn new(num_pages: u64, parts: Vec<PayloadExtents>) -> Self {
        debug_assert!(parts
            .iter()
            .all(|p| p.extents.iter().map(|e| e.len).sum::<u64>() == num_pages));
        Placement { num_pages, parts }
    }

    pub fn num_pages(&self) -> u64 {
        self.num_pages
    }

    /// Per payload, in construction order.
    pub fn parts(&self) -> &[PayloadExtents] {
        &self.parts
    }

    pub fn payloads(&self) -> impl Iterator<Item = PayloadId> + '_ {
        self.parts.iter().map(|p| p.payload)
    }

    /// The extents in `payload`, or `None` if the object has no pages there.
    pub fn extents(&self, payload: PayloadId) -> Option<&[Extent]> {
        self.parts
            .iter()
            .find(|p| p.payload == payload)
            .map(|p| p.extents.as_slice())
    }

    /// The physical page of every object position in `payload`.
    pub fn pages(&self, payload: PayloadId) -> Option<Vec<u64>> {
        let extents = self.extents(payload)?;
        Some(extents.iter().flat_map(|e| e.start..e.end()).collect())
    }

    /// The digest elements of this placement's extents under `key`.
    pub(crate) fn elements(&self, key: u64) -> impl Iterator<Item = u64> + '_ {
        self.parts.iter().flat_map(move |part| {
            let mut position = 0;
            part.extents.iter().map(move |&extent| {
                let element = object_extent_element(key, part.payload, position, extent);
                position += extent.len;
                element
            })
        })
    }

    /// Positions `[0, at)` and `[at, num_pages)` over the same physical pages.
    pub(crate) fn split_at(&self, at: u64) -> (Placement, Placement) {
        debug_assert!(0 < at && at < self.num_pages);
        let mut left = Vec::with_capacity(self.parts.len());
        let mut right = Vec::with_capacity(self.parts.len());
        for part in &self.parts {
            let (mut l, mut r) = (Vec::new(), Vec::new());
            let mut position = 0;
            for &extent in &part.extents {
                if position + extent.len <= at {
                    l.push(extent);
                } else if position >= at {
                    r.push(extent);
                } else {
                    let cut = at - position;
                    l.push(Extent::new(extent.start, cut));
                    r.push(Extent::new(extent.start + cut, extent.len - cut));
                }
                position += extent.len;
            }
            left.push(PayloadExtents {
                payload: part.payload,
                extents: l,
            });
            right.push(PayloadExtents {
                payload: part.payload,
                extents: r,
            });
        }
        (
            Placement::new(at, left),
            Placement::new(self.num_pages - at, right),
        )
    }
}
