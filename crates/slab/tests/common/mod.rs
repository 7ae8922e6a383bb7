//! Memory the tests own, seen as the `Region`s the protocol works on.

#![allow(dead_code, unsafe_code)]

use cpkv_slab::Region;

/// Zeroed, 8-byte aligned bytes that live as long as the value.
pub struct Memory(Vec<u64>);

impl Memory {
    pub fn zeroed(bytes: usize) -> Self {
        Memory(vec![0; bytes.div_ceil(8).max(1)])
    }

    pub fn with(bytes: &[u8]) -> Self {
        let mut m = Self::zeroed(bytes.len());
        m.bytes_mut()[..bytes.len()].copy_from_slice(bytes);
        m
    }

    /// The first `bytes` bytes as a region (valid while `self` lives and is
    /// not moved: the tests keep every `Memory` for the whole test).
    pub fn region(&mut self, bytes: usize) -> Region {
        assert!(bytes <= self.0.len() * 8);
        // SAFETY: inside this vector, which outlives the test's use of it.
        unsafe { Region::new(self.0.as_mut_ptr() as usize, bytes) }.unwrap()
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: a u64 vector's memory as bytes.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast::<u8>(), self.0.len() * 8) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`.
        unsafe {
            std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u8>(), self.0.len() * 8)
        }
    }

    pub fn words(&self) -> &[u64] {
        &self.0
    }
}

/// A slab of `rows` rows of entries of `sizes` bytes: data, stamps, tags.
pub struct Slab {
    pub data: Memory,
    pub stamps: Memory,
    pub tags: Memory,
    pub rows: usize,
    pub page_bytes: usize,
}

impl Slab {
    pub fn new(sizes: &[u64], rows: usize) -> Self {
        let page_bytes = sizes.iter().sum::<u64>() as usize;
        Slab {
            data: Memory::zeroed(rows * page_bytes),
            stamps: Memory::zeroed(rows * 8),
            tags: Memory::zeroed(rows * 8),
            rows,
            page_bytes,
        }
    }

    pub fn regions(&mut self) -> (Region, Region, Region) {
        let (rows, page_bytes) = (self.rows, self.page_bytes);
        (
            self.data.region(rows * page_bytes),
            self.stamps.region(rows * 8),
            self.tags.region(rows * 8),
        )
    }
}
