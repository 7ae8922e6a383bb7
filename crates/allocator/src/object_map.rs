//! The live objects by key: a hash map for O(1) lookup on every call.
//!
//! Its iteration order is never read by anything that must agree across
//! ranks: everything that walks all objects (snapshot, canonical digest,
//! `keys()`, `verify()`) goes through `sorted`, and the incremental digest
//! is an order-independent sum. The hasher is fixed (no per-process random
//! seed), so even the layout is the same in every process.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::placement::Placement;

/// A live object: its placement and whether its contents are committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Object {
    pub(crate) placement: Placement,
    pub(crate) committed: bool,
    /// `placement.digest_share(key)`, kept so a release subtracts it
    /// without hashing again (`verify` recomputes it).
    pub(crate) digest_share: u64,
}

impl Object {
    /// A new, uncommitted object `key` over `placement`.
    pub(crate) fn new(key: u64, placement: Placement) -> Self {
        Object {
            digest_share: placement.digest_share(key),
            placement,
            committed: false,
        }
    }
}

pub(crate) type ObjectMap = HashMap<u64, Object, BuildHasherDefault<KeyHasher>>;

/// The objects in ascending key order.
pub(crate) fn sorted(objects: &ObjectMap) -> Vec<(u64, &Object)> {
    let mut out: Vec<(u64, &Object)> = objects.iter().map(|(&k, o)| (k, o)).collect();
    out.sort_unstable_by_key(|&(k, _)| k);
    out
}

/// Hashes a u64 key with one folded 128-bit multiply: keys are often
/// sequential or strided, and the fold spreads them over every bit the table
/// reads (low bits for the bucket, high bits for the control tag).
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed; this keeps the trait complete.
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, key: u64) {
        let product = u128::from(key ^ self.0 ^ 0xa076_1d64_78bd_642f) * 0xe703_7ed1_a0b4_28db;
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_walks_keys_in_order() {
        let mut map = ObjectMap::default();
        for key in [9u64, 3, u64::MAX, 0, 7] {
            map.insert(key, Object::new(key, Placement::new(1)));
        }
        let keys: Vec<u64> = sorted(&map).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, vec![0, 3, 7, 9, u64::MAX]);
    }
}
