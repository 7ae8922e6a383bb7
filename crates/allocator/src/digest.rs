//! The incremental, order-independent state digest.
//!
//! The state is a set of elements (the configuration, every free extent, every
//! object extent at its position, every committed key). The digest is the
//! wrapping sum of a strong 64-bit hash of each element, so it does not depend
//! on the order operations built the state, is updated in O(1) per element an
//! operation adds or removes, and is read in O(1). Equal states give equal
//! digests in every process; reserve then release adds and removes the same
//! elements, restoring the digest exactly.

use crate::extent::Extent;
use crate::payload::{PayloadId, Payloads};

use cpkv_hash::hash_words;

const TAG_CONFIG: u64 = 0xc0f1_6000;
const TAG_FREE: u64 = 0xf4ee_0001;
const TAG_OBJECT_EXTENT: u64 = 0x0b1e_0002;
const TAG_COMMITTED: u64 = 0xc033_0003;

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

/// Element hash of a free extent of `payload`.
pub fn free_element(payload: PayloadId, extent: Extent) -> u64 {
    hash_words(TAG_FREE, &[payload as u64, extent.start, extent.len])
}

/// Element hash of an extent of object `key` that holds object positions
/// `position .. position + extent.len`.
pub fn object_extent_element(key: u64, payload: PayloadId, position: u64, extent: Extent) -> u64 {
    hash_words(
        TAG_OBJECT_EXTENT,
        &[key, payload as u64, position, extent.start, extent.len],
    )
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
            free_element(0, Extent::new(0, 4)),
            object_extent_element(7, 0, 0, Extent::new(4, 2)),
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
        assert_ne!(
            free_element(0, Extent::new(1, 2)),
            free_element(0, Extent::new(2, 1))
        );
        assert_ne!(
            object_extent_element(1, 0, 0, Extent::new(5, 1)),
            object_extent_element(2, 0, 0, Extent::new(5, 1))
        );
        assert_ne!(committed_element(3), committed_element(4));
    }
}
