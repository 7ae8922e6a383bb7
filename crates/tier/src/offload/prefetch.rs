//! A software prefetch: starts fetching a value's cache lines and returns at
//! once, so a batch can start the misses of all its keys before it waits on
//! any (memory-level parallelism instead of one dependent miss per key).

/// Starts fetching the cache lines that hold the first and the last byte of
/// `value` (all of it, for a value of at most two lines) into every cache
/// level; a hint only, with no effect on what any code reads.
#[inline]
pub(super) fn prefetch<T: ?Sized>(value: &T) {
    let start = std::ptr::from_ref(value).cast::<u8>();
    let last = start.wrapping_add(size_of_val(value).saturating_sub(1));
    fetch(start);
    fetch(last);
}

#[inline]
fn fetch(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    // SAFETY: a prefetch is a hint: it reads nothing a program sees and never
    // faults, whatever the address (here one inside a live value).
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(at.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}
