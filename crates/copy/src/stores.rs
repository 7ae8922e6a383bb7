//! How the copy writes: through the cache, or around it with streaming
//! (non-temporal) stores.
//!
//! A gather larger than the last-level cache evicts its own output before
//! anyone reads it, and every ordinary store first reads the destination line
//! into the cache (read-for-ownership), which costs a third of the memory
//! traffic. Streaming stores skip both; a large `memcpy` does the same, which
//! is why a row-by-row gather of 4 KB rows fell to ~0.8 of one big copy out
//! of cache. In cache the output is read right after (by attention, or by the
//! next layer's copy), so small copies keep ordinary stores.

#![allow(unsafe_code)]

use std::sync::OnceLock;

/// How a copy writes its destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stores {
    /// Ordinary stores (`memcpy`): the output stays in cache.
    Cached,
    /// Non-temporal stores: the output goes to memory, bypassing the cache.
    Streaming,
}

/// Last-level cache size assumed where the platform does not say.
const DEFAULT_LLC_BYTES: usize = 32 << 20;

impl Stores {
    /// The choice for a copy of `bytes` bytes: streaming from 3/4 of the
    /// last-level cache up (where glibc's `memcpy` switches too), cached below.
    pub fn for_bytes(bytes: usize) -> Stores {
        if bytes >= streaming_threshold() {
            Stores::Streaming
        } else {
            Stores::Cached
        }
    }
}

/// 3/4 of the last-level cache, read once from sysfs (Linux); 24 MiB elsewhere.
pub fn streaming_threshold() -> usize {
    static THRESHOLD: OnceLock<usize> = OnceLock::new();
    *THRESHOLD.get_or_init(|| last_level_cache_bytes().unwrap_or(DEFAULT_LLC_BYTES) / 4 * 3)
}

/// The largest cache of cpu0 per `/sys/devices/system/cpu/cpu0/cache/index*/size`.
fn last_level_cache_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|entry| std::fs::read_to_string(entry.ok()?.path().join("size")).ok())
        .filter_map(|text| parse_cache_size(text.trim()))
        .max()
}

/// `"32768K"` -> 32 MiB; also `M` and plain bytes.
fn parse_cache_size(text: &str) -> Option<usize> {
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => text.split_at(at),
        None => (text, ""),
    };
    let value: usize = digits.parse().ok()?;
    match unit {
        "" => Some(value),
        "K" => value.checked_mul(1 << 10),
        "M" => value.checked_mul(1 << 20),
        _ => None,
    }
}

/// Copies `src` into `dst` (equal lengths) with `stores`. Streaming stores
/// are weakly ordered: call `fence` once after the last of them.
#[inline]
pub(crate) fn copy(dst: &mut [u8], src: &[u8], stores: Stores) {
    match stores {
        Stores::Cached => dst.copy_from_slice(src),
        Stores::Streaming => stream(dst, src),
    }
}

/// `copy` for one row of a strided run: cached rows go through the same
/// 64-byte block loop as streaming ones (`block_copy`); long contiguous
/// stretches keep `memcpy`.
#[inline]
pub(crate) fn copy_row(dst: &mut [u8], src: &[u8], stores: Stores) {
    match stores {
        Stores::Cached => block_copy::<false>(dst, src),
        Stores::Streaming => stream(dst, src),
    }
}

/// Orders every streaming store before what follows (a no-op after cached ones).
#[inline]
pub(crate) fn fence(stores: Stores) {
    #[cfg(target_arch = "x86_64")]
    if stores == Stores::Streaming {
        // SAFETY: SSE2 is part of the x86_64 baseline.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = stores;
}

/// 64-byte blocks of SSE2 loads and stores: streaming stores when
/// `STREAMING` (the path past the cache), ordinary ones otherwise (cached
/// rows, where this loop measured 4-8% faster than `memcpy` per 4 KB row).
#[cfg(target_arch = "x86_64")]
fn block_copy<const STREAMING: bool>(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128, _mm_stream_si128};
    assert_eq!(
        dst.len(),
        src.len(),
        "copy between slices of different lengths"
    );
    // Streaming stores need 16-byte aligned targets: ordinary stores up to
    // the first 16-byte boundary of `dst`, blocks after it, ordinary stores
    // for the tail.
    let head = if STREAMING {
        dst.as_ptr().align_offset(16).min(dst.len())
    } else {
        0
    };
    // The edges are usually empty (4 KB rows, aligned buffers): a `memcpy`
    // call of no bytes costs about as much as a 64-byte block.
    if head > 0 {
        dst[..head].copy_from_slice(&src[..head]);
    }
    let blocks = (dst.len() - head) / 64;
    let body = head + blocks * 64;
    // SAFETY: SSE2 is part of the x86_64 baseline. Every 16-byte load reads
    // inside `src[head..body]` (unaligned loads are allowed) and every store
    // writes inside `dst[head..body]` (a streaming one 16-byte aligned, since
    // `dst[head]` is); the two slices cannot overlap (`&mut` and `&`).
    unsafe {
        let (d, s) = (dst.as_mut_ptr().add(head), src.as_ptr().add(head));
        for block in 0..blocks {
            let (d, s) = (
                d.add(block * 64).cast::<__m128i>(),
                s.add(block * 64).cast::<__m128i>(),
            );
            let lanes = [
                _mm_loadu_si128(s),
                _mm_loadu_si128(s.add(1)),
                _mm_loadu_si128(s.add(2)),
                _mm_loadu_si128(s.add(3)),
            ];
            for (lane, value) in lanes.into_iter().enumerate() {
                if STREAMING {
                    _mm_stream_si128(d.add(lane), value);
                } else {
                    _mm_storeu_si128(d.add(lane), value);
                }
            }
        }
    }
    if body < dst.len() {
        dst[body..].copy_from_slice(&src[body..]);
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn block_copy<const STREAMING: bool>(dst: &mut [u8], src: &[u8]) {
    dst.copy_from_slice(src);
}

fn stream(dst: &mut [u8], src: &[u8]) {
    block_copy::<true>(dst, src);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_copies_move_every_byte_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..600u32).map(|i| (i * 7 + 3) as u8).collect();
        for stores in [Stores::Cached, Stores::Streaming] {
            for offset in 0..17 {
                for len in [0, 1, 15, 16, 63, 64, 65, 130, 511] {
                    let mut dst = vec![0u8; 600];
                    copy_row(
                        &mut dst[offset..offset + len],
                        &src[offset + 1..offset + 1 + len],
                        stores,
                    );
                    fence(stores);
                    assert_eq!(
                        &dst[offset..offset + len],
                        &src[offset + 1..offset + 1 + len],
                        "{stores:?} at offset {offset}, {len} bytes"
                    );
                    assert!(dst[..offset]
                        .iter()
                        .chain(&dst[offset + len..])
                        .all(|&b| b == 0));
                }
            }
        }
    }

    #[test]
    fn cache_sizes_parse_and_the_choice_follows_the_threshold() {
        assert_eq!(parse_cache_size("32768K"), Some(32 << 20));
        assert_eq!(parse_cache_size("8M"), Some(8 << 20));
        assert_eq!(parse_cache_size("1024"), Some(1024));
        assert_eq!(parse_cache_size("12Q"), None);
        assert_eq!(parse_cache_size(""), None);
        let threshold = streaming_threshold();
        assert!(threshold > 0);
        assert_eq!(Stores::for_bytes(threshold - 1), Stores::Cached);
        assert_eq!(Stores::for_bytes(threshold), Stores::Streaming);
    }
}
