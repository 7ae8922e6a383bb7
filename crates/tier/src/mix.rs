//! A fixed-seed 64-bit mixer for the tier's digest terms: deterministic
//! across processes and platforms (no `std` hasher, whose seed may vary).

pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hash of a tagged tuple of words.
pub(crate) fn term(tag: u64, words: &[u64]) -> u64 {
    words
        .iter()
        .fold(mix(tag), |h, &w| mix(h ^ w).wrapping_mul(0x100_0000_01b3))
}
