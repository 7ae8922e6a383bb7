//! Host segments: what a tree host key points at inside an allocator object.
//!
//! A backup reserves one allocator object for one node. If the node is split
//! while its backup is in flight, each piece gets its own tree host key (a
//! segment) at commit, all pointing into the same object; the object is
//! released when its last segment leaves the tree. A later split of a
//! committed node shares its segment (the tree counts those references), so
//! a node's rows are found from its depth relative to the segment's start.

use std::collections::BTreeMap;

use cpkv_hash::hash_words as term;

const SEGMENT: u64 = 0x5345;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// The allocator object holding the rows.
    pub object: u64,
    /// Page offset of the segment's first page inside the object.
    pub object_offset: u64,
    /// Depth (pages from the root) of the segment's first page.
    pub start_depth: u64,
}

#[derive(Debug, Clone, Default)]
pub struct Segments {
    by_key: BTreeMap<u64, Segment>,
    /// Live segments per object.
    object_refs: BTreeMap<u64, u64>,
    digest: u64,
}

impl Segments {
    pub fn get(&self, key: u64) -> Option<&Segment> {
        self.by_key.get(&key)
    }

    pub fn objects(&self) -> usize {
        self.object_refs.len()
    }

    pub fn digest(&self) -> u64 {
        self.digest
    }

    pub fn digest_from_scratch(&self) -> u64 {
        self.by_key
            .iter()
            .fold(0u64, |d, (&k, s)| d.wrapping_add(segment_term(k, s)))
    }

    pub fn insert(&mut self, key: u64, segment: Segment) {
        *self.object_refs.entry(segment.object).or_insert(0) += 1;
        self.digest = self.digest.wrapping_add(segment_term(key, &segment));
        let old = self.by_key.insert(key, segment);
        debug_assert!(old.is_none(), "segment key {key} reused");
    }

    /// Forgets segment `key`; returns its object when no segment refers to it
    /// any more (the caller releases it).
    pub fn remove(&mut self, key: u64) -> Option<u64> {
        let segment = self.by_key.remove(&key).expect("live segment");
        self.digest = self.digest.wrapping_sub(segment_term(key, &segment));
        let refs = self.object_refs.get_mut(&segment.object).expect("counted");
        *refs -= 1;
        if *refs == 0 {
            self.object_refs.remove(&segment.object);
            return Some(segment.object);
        }
        None
    }

    /// Objects with their live segment counts, in key order (for audits).
    pub fn object_refs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.object_refs.iter().map(|(&k, &n)| (k, n))
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, &Segment)> + '_ {
        self.by_key.iter().map(|(&k, s)| (k, s))
    }
}

fn segment_term(key: u64, s: &Segment) -> u64 {
    term(SEGMENT, &[key, s.object, s.object_offset, s.start_depth])
}
