//! `Region`: a range of memory another owner keeps mapped for as long as the
//! region is used (a CPU tensor's storage, a shared-memory slab the node's
//! processes map together), and the views the protocol takes of it.
//!
//! The one place raw addresses become slices and atomics. Shared memory may
//! be written by another process while a view of it is read: the seqlock
//! (`seqlock`, `staging`) re-checks the words after every such copy and
//! discards it, so a racing copy is a miss, never bytes taken for a page.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicI64, AtomicU64};

/// `bytes` bytes at `address`, mapped while the owner holds them.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    address: usize,
    bytes: usize,
}

impl Region {
    /// The range `[address, address + bytes)`; an error if it overflows the
    /// address space or is longer than `isize::MAX`.
    ///
    /// # Safety
    /// The range must stay mapped, readable and writable, for as long as the
    /// region (or any copy of it) is used.
    pub unsafe fn new(address: usize, bytes: usize) -> Result<Self, String> {
        if bytes > isize::MAX as usize || address.checked_add(bytes).is_none() {
            return Err(format!(
                "{bytes} bytes at {address:#x} overflow the address space"
            ));
        }
        Ok(Self { address, bytes })
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    pub fn address(&self) -> usize {
        self.address
    }

    /// Whether the two share a byte.
    pub fn overlaps(&self, other: &Region) -> bool {
        self.overlaps_range(other.address, other.bytes)
    }

    /// Whether `slice` shares a byte with this region.
    pub fn overlaps_slice(&self, slice: &[u8]) -> bool {
        self.overlaps_range(slice.as_ptr() as usize, slice.len())
    }

    fn overlaps_range(&self, address: usize, bytes: usize) -> bool {
        self.bytes > 0
            && bytes > 0
            && self.address < address + bytes
            && address < self.address + self.bytes
    }

    /// Whether `[at, at + bytes)` lies inside the region.
    pub fn holds(&self, at: u64, bytes: u64) -> bool {
        at.checked_add(bytes)
            .is_some_and(|end| end <= self.bytes as u64)
    }

    /// The address of byte `at` (`at <= len`, checked by the caller).
    pub(crate) fn address_of(&self, at: u64) -> usize {
        self.address + at as usize
    }

    fn outside(&self, at: u64, bytes: u64) -> String {
        format!(
            "{bytes} bytes at {at} are outside a {}-byte buffer",
            self.bytes
        )
    }

    /// `[at, at + bytes)`, read-only.
    pub(crate) fn slice(&self, at: u64, bytes: u64) -> Result<&[u8], String> {
        if !self.holds(at, bytes) {
            return Err(self.outside(at, bytes));
        }
        if bytes == 0 {
            return Ok(&[]);
        }
        // SAFETY: inside the region (checked above), which its owner keeps
        // mapped while it is used (`new`'s contract).
        Ok(unsafe { std::slice::from_raw_parts(self.address_of(at) as *const u8, bytes as usize) })
    }

    /// `[at, at + bytes)`, to write into. The caller copies into it and lets
    /// it go before it takes another view of the same bytes; the protocol's
    /// writers own their rows (one writer per row), and a host pool is never
    /// the slab (checked where a pool is built).
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn slice_mut(&self, at: u64, bytes: u64) -> Result<&mut [u8], String> {
        if !self.holds(at, bytes) {
            return Err(self.outside(at, bytes));
        }
        if bytes == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as in `slice`; the range is written only through this view
        // while it lives (see above).
        Ok(unsafe {
            std::slice::from_raw_parts_mut(self.address_of(at) as *mut u8, bytes as usize)
        })
    }

    /// The aligned int64 at byte `at` as an atomic (`at + 8 <= len`, `at`
    /// and the region's address 8-byte aligned: checked by the caller).
    pub(crate) fn atomic_i64(&self, at: u64) -> &AtomicI64 {
        assert!(self.holds(at, 8) && self.address_of(at).is_multiple_of(8));
        // SAFETY: inside the region and aligned (asserted), mapped while it is
        // used; every process accesses the word atomically.
        unsafe { &*(self.address_of(at) as *const AtomicI64) }
    }

    /// `atomic_i64`, unsigned.
    pub(crate) fn atomic_u64(&self, at: u64) -> &AtomicU64 {
        assert!(self.holds(at, 8) && self.address_of(at).is_multiple_of(8));
        // SAFETY: as in `atomic_i64`.
        unsafe { &*(self.address_of(at) as *const AtomicU64) }
    }
}

/// Starts fetching the cache line at `address` into every cache level: a
/// hint, with no effect on what any code reads.
#[inline]
pub(crate) fn prefetch(address: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing a program sees and never faults,
    // whatever the address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(address as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// One copy of `src` into `dst` (equal lengths) through `cpkv-copy`'s kernel:
/// a one-row run table.
pub(crate) fn copy_piece(dst: &mut [u8], src: &[u8]) -> Result<(), String> {
    if src.is_empty() && dst.is_empty() {
        return Ok(());
    }
    if dst.len() != src.len() {
        return Err(format!(
            "a copy of {} bytes into {} bytes",
            src.len(),
            dst.len()
        ));
    }
    let run = cpkv_copy::Run::contiguous(0, 0, 0, 1);
    cpkv_copy::copy_runs(dst, &[src], dst.len(), &[run]).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_outside_the_region_are_refused() {
        let mut memory = vec![0u8; 16];
        // SAFETY: `memory` outlives the region.
        let region = unsafe { Region::new(memory.as_mut_ptr() as usize, 16) }.unwrap();
        assert!(region.slice(8, 8).is_ok());
        assert!(region.slice(9, 8).is_err());
        assert!(region.slice_mut(u64::MAX, 2).is_err());
        assert!(region.slice(16, 0).unwrap().is_empty());
    }

    #[test]
    fn overlap_is_sharing_a_byte() {
        // SAFETY: never read (overlap is arithmetic).
        let (a, b, c) = unsafe {
            (
                Region::new(100, 10).unwrap(),
                Region::new(109, 1).unwrap(),
                Region::new(110, 5).unwrap(),
            )
        };
        assert!(a.overlaps(&b) && b.overlaps(&a));
        assert!(!a.overlaps(&c) && !c.overlaps(&a));
        // SAFETY: as above.
        assert!(!a.overlaps(&unsafe { Region::new(105, 0) }.unwrap()));
        assert!(unsafe { Region::new(usize::MAX, 2) }.is_err());
    }
}
