//! The incremental, order-independent state digest.
//!
//! The state is a set of elements (the configuration, every object extent at
//! its position, every committed key). The digest is the wrapping sum of a
//! strong 64-bit hash of each element, so it does not depend on the order
//! operations built the state, is updated in O(1) per element an operation
//! adds or removes, and is read in O(1). Equal states give equal digests in
//! every process; reserve then release adds and removes the same elements,
//! restoring the digest exactly.
//!
//! Free extents are not elements: in a valid state they are exactly the
//! complement of the object extents in each pool (`verify` checks that), so
//! hashing them would double the work of every call and add no information.
//! `canonical_digest` still covers them, as it covers everything.

use crate::extent::Extent;
use crate::payload::{PayloadId, Payloads};

use cpkv_hash::{hash_words, Hasher64};

const TAG_CONFIG: u64 = 0xc0f1_6000;
const TAG_OBJECT_EXTENT: u64 = 0x0b1e_0002;
const TAG_COMMITTED: u64 = 0xc033_0003;
const TAG_HELD: u64 = 0x4e1d_0004;

/// The hasher every object extent element starts from (built at compile time).
const OBJECT_EXTENT: Hasher64 = Hasher64::new(TAG_OBJECT_EXTENT);

/// Element hash of the configuration (payload names and capacities, in order).
pub fn config_element(payloads: &Payloads) -> u64 {
    let mut words = vec![payloads.len() as u64];
    for (id, name) in payloads.names().iter().enumerate() {
        words.push(name.len() as u64);
        for chunk in name.as_bytes().chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            words.push(u64::from_le_bytes(word));
        }
        words.push(payloads.capacity(id));
    }
    hash_words(TAG_CONFIG, &words)
}

/// The part of every extent element of object `key` that depends on the key
/// alone: computed once per object, not once per extent.
#[inline]
pub fn object_seed(key: u64) -> Hasher64 {
    OBJECT_EXTENT.word(key)
}

/// Element hash of an extent of the object seeded by `seed` that holds
/// object positions `position .. position + extent.len` in `payload`.
///
/// Two words carry the four fields without loss: positions and starts are
/// below `MAX_CAPACITY` = 2**32, lengths are in `1..=2**32`, payload ids
/// below 64, so each pair packs into one word injectively. (A corrupt
/// snapshot may break these bounds; restore refuses it before its digest
/// counts.)
#[inline]
pub fn object_extent_element(
    seed: Hasher64,
    payload: PayloadId,
    position: u64,
    extent: Extent,
) -> u64 {
    seed.word(position | extent.start << 32)
        .word((extent.len - 1) | (payload as u64) << 32)
        .finish()
}

/// The hasher every held page element starts from.
const HELD: Hasher64 = Hasher64::new(TAG_HELD);

/// Element hash of "page `page` of `payload` is held" (`reserve_held`).
/// Pages are below `MAX_CAPACITY` = 2**32 and payload ids below 64, so
/// the pair packs into one word injectively.
#[inline]
pub fn held_element(payload: PayloadId, page: u64) -> u64 {
    HELD.word(page | (payload as u64) << 32).finish()
}

/// Element hash of "object `key` is committed".
pub fn committed_element(key: u64) -> u64 {
    hash_words(TAG_COMMITTED, &[key])
}

/// The running multiset sum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateDigest(u64);

impl StateDigest {
    pub fn value(self) -> u64 {
        self.0
    }

    pub fn add(&mut self, element: u64) {
        self.0 = self.0.wrapping_add(element);
    }

    pub fn remove(&mut self, element: u64) {
        self.0 = self.0.wrapping_sub(element);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_independent_and_invertible() {
        let elements = [
            object_extent_element(object_seed(9), 1, 4, Extent::new(0, 4)),
            object_extent_element(object_seed(7), 0, 0, Extent::new(4, 2)),
            committed_element(7),
        ];
        let mut forward = StateDigest::default();
        elements.iter().for_each(|&e| forward.add(e));
        let mut backward = StateDigest::default();
        elements.iter().rev().for_each(|&e| backward.add(e));
        assert_eq!(forward, backward);
        elements.iter().for_each(|&e| forward.remove(e));
        assert_eq!(forward.value(), 0);
    }

    #[test]
    fn fields_are_not_interchangeable() {
        let element = |key, payload, position, start, len| {
            object_extent_element(object_seed(key), payload, position, Extent::new(start, len))
        };
        let base = element(1, 0, 0, 5, 1);
        for other in [
            element(2, 0, 0, 5, 1),
            element(1, 1, 0, 5, 1),
            element(1, 0, 1, 5, 1),
            element(1, 0, 0, 6, 1),
            element(1, 0, 0, 5, 2),
            // Fields swapped between the packed halves.
            element(1, 0, 5, 0, 1),
            element(1, 1, 0, 5, 1 << 32),
        ] {
            assert_ne!(base, other);
        }
        assert_ne!(committed_element(3), committed_element(4));
    }
}
