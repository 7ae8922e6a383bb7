//! The versioned binary snapshot, and the canonical serialisation behind
//! `canonical_digest()`.
//!
//! Layout (little endian):
//! ```text
//! magic "CPKVALOC" | version u32 | body length u64 | SHA-256(body) [32] | body
//! body  = state | counters (reserves, misses, releases, splits, commits: u64 each)
//!         | held, only when some page is held (version 2)
//! state = payload count u32, per payload (name length u32, UTF-8 name, capacity u64)
//!         per payload: free extent count u64, (start u64, len u64) in address order
//!         object count u64, per object in ascending key order:
//!           key u64, committed u8, num_pages u64, payload count u32,
//!           per payload in construction order: payload id u32, extent count u32,
//!             (start u64, len u64) in position order
//! held  = per payload: held run count u64, (start u64, len u64) per maximal
//!         run of held pages in address order
//! ```
//! `state`, followed by `held` when some page is held, is canonical (sorted,
//! fully coalesced), so its SHA-256 is the canonical digest: an allocator
//! that holds no page keeps the digest version 1 gave it. Version 2 added
//! `held` (`reserve_held`); version 1 snapshots still restore. Restore checks everything before building anything:
//! header, checksum, then that the extents tile every pool exactly.

use cpkv_wire::{Reader, WireError, Writer};
use sha2::{Digest, Sha256};

use crate::allocator::{check_partition, PageAllocator};
use crate::error::{AllocError, Result};
use crate::extent::Extent;
use crate::free_list::FreeList;
use crate::held::HeldPages;
use crate::object_map::{sorted, Object, ObjectMap};
use crate::payload::Payloads;
use crate::placement::Placement;
use crate::stats::Counters;

const MAGIC: &[u8; 8] = b"CPKVALOC";
pub const SNAPSHOT_VERSION: u32 = 2;
const HEADER_LEN: usize = 8 + 4 + 8 + 32;

impl PageAllocator {
    /// SHA-256 of the canonical serialisation of the state, for audits.
    pub fn canonical_digest(&self) -> [u8; 32] {
        let mut state = Writer::default();
        write_state(self, &mut state);
        write_held(self, &mut state);
        Sha256::digest(state.bytes()).into()
    }

    /// The whole allocator (state and counters) as versioned bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut body = Writer::default();
        write_state(self, &mut body);
        let c = &self.counters;
        for value in [c.reserves, c.misses, c.releases, c.splits, c.commits] {
            body.u64(value);
        }
        write_held(self, &mut body);
        seal(body.bytes())
    }

    /// Rebuilds an allocator from `snapshot()` bytes; truncated, corrupted or
    /// inconsistent bytes give `CorruptSnapshot` (never a panic).
    pub fn restore(data: &[u8]) -> Result<Self> {
        if data.len() < HEADER_LEN {
            return Err(AllocError::corrupt(format!(
                "{} bytes is shorter than the {HEADER_LEN}-byte header",
                data.len()
            )));
        }
        let mut header = Reader::new(&data[..HEADER_LEN]);
        if header.bytes(8)? != MAGIC {
            return Err(AllocError::corrupt(
                "bad magic (not a cpkv allocator snapshot)",
            ));
        }
        let version = header.u32()?;
        if !(1..=SNAPSHOT_VERSION).contains(&version) {
            return Err(AllocError::corrupt(format!(
                "unsupported version {version} (this build reads 1 to {SNAPSHOT_VERSION})"
            )));
        }
        let body_len = header.u64()?;
        let checksum = header.bytes(32)?;
        let body = &data[HEADER_LEN..];
        if body.len() as u64 != body_len {
            return Err(AllocError::corrupt(format!(
                "body is {} bytes, header says {body_len}",
                body.len()
            )));
        }
        if Sha256::digest(body).as_slice() != checksum {
            return Err(AllocError::corrupt("checksum mismatch"));
        }
        read_body(&mut Reader::new(body), version)
    }
}

/// The header (magic, version, length, checksum) followed by `body`.
fn seal(body: &[u8]) -> Vec<u8> {
    let mut out = Writer::default();
    out.raw(MAGIC);
    out.u32(SNAPSHOT_VERSION);
    out.u64(body.len() as u64);
    out.raw(&Sha256::digest(body));
    out.raw(body);
    out.into_bytes()
}

fn put_extent(out: &mut Writer, extent: Extent) {
    out.u64(extent.start);
    out.u64(extent.len);
}

fn write_state(alloc: &PageAllocator, out: &mut Writer) {
    let payloads = &alloc.payloads;
    out.u32(payloads.len() as u32);
    for (id, name) in payloads.names().iter().enumerate() {
        out.str(name);
        out.u64(payloads.capacity(id));
    }
    for free in &alloc.free {
        let extents = free.extents();
        out.u64(extents.len() as u64);
        extents.into_iter().for_each(|e| put_extent(out, e));
    }
    out.u64(alloc.objects.len() as u64);
    for (key, object) in sorted(&alloc.objects) {
        out.u64(key);
        out.u8(u8::from(object.committed));
        out.u64(object.placement.num_pages());
        out.u32(object.placement.parts().count() as u32);
        for (payload, extents) in object.placement.parts() {
            out.u32(payload as u32);
            out.u32(extents.len() as u32);
            extents.iter().for_each(|&e| put_extent(out, e));
        }
    }
}

/// The held pages, when any is held (else nothing: see the layout).
fn write_held(alloc: &PageAllocator, out: &mut Writer) {
    if alloc.held.iter().all(|h| h.count() == 0) {
        return;
    }
    for held in &alloc.held {
        let extents = held.extents();
        out.u64(extents.len() as u64);
        extents.into_iter().for_each(|e| put_extent(out, e));
    }
}

fn read_body(r: &mut Reader<'_>, version: u32) -> Result<PageAllocator> {
    let payload_count = r.len_u32(4 + 8)?;
    let mut pools = Vec::with_capacity(payload_count);
    for _ in 0..payload_count {
        let name = r.str()?;
        pools.push((name.to_owned(), r.u64()?));
    }
    let payloads =
        Payloads::new(&pools).map_err(|e| AllocError::corrupt(format!("payloads: {e}")))?;

    let mut free = Vec::with_capacity(payload_count);
    for id in 0..payload_count {
        let name = payloads.name(id);
        let capacity = payloads.capacity(id);
        let count = r.len(16)?;
        let mut list = FreeList::empty();
        let mut previous_end = None;
        for _ in 0..count {
            let extent = read_extent(r, capacity)?;
            // Fully coalesced: a gap of at least one page between free extents.
            if previous_end.is_some_and(|end| extent.start <= end) {
                return Err(AllocError::corrupt(format!(
                    "payload {name:?}: free extent at {} overlaps, touches or precedes its neighbour",
                    extent.start
                )));
            }
            previous_end = Some(extent.end());
            list.insert(extent);
        }
        free.push(list);
    }

    let object_count = r.len(8 + 1 + 8 + 4 + 4 + 4 + 16)?;
    let mut objects = ObjectMap::default();
    let mut used: Vec<Vec<Extent>> = vec![Vec::new(); payload_count];
    let mut previous_key = None;
    for _ in 0..object_count {
        let key = r.u64()?;
        if previous_key.is_some_and(|p| key <= p) {
            return Err(AllocError::corrupt(format!("key {key} is out of order")));
        }
        previous_key = Some(key);
        let committed = match r.u8()? {
            0 => false,
            1 => true,
            other => {
                return Err(AllocError::corrupt(format!(
                    "key {key}: committed flag {other}"
                )))
            }
        };
        let num_pages = r.u64()?;
        if num_pages == 0 {
            return Err(AllocError::corrupt(format!("key {key} has zero pages")));
        }
        let part_count = r.u32()? as usize;
        if part_count == 0 || part_count > payload_count {
            return Err(AllocError::corrupt(format!(
                "key {key} lists {part_count} payloads"
            )));
        }
        let mut placement = Placement::new(num_pages);
        let mut previous = None;
        for _ in 0..part_count {
            let payload = r.u32()? as usize;
            if payload >= payload_count || previous.is_some_and(|p| p >= payload) {
                return Err(AllocError::corrupt(format!(
                    "key {key}: payload id {payload} out of order or unknown"
                )));
            }
            let extent_count = r.len_u32(16)?;
            let mut extents = Vec::with_capacity(extent_count);
            let mut pages = Some(0u64);
            for _ in 0..extent_count {
                let extent = read_extent(r, payloads.capacity(payload))?;
                pages = pages.and_then(|p| p.checked_add(extent.len));
                extents.push(extent);
            }
            if pages != Some(num_pages) {
                return Err(AllocError::corrupt(format!(
                    "key {key}: payload {:?} holds {pages:?} pages, object has {num_pages}",
                    payloads.name(payload)
                )));
            }
            used[payload].extend_from_slice(&extents);
            placement.push_part(payload, |out| out.extend_from_slice(&extents));
            previous = Some(payload);
        }
        let mut object = Object::new(key, placement);
        object.committed = committed;
        objects.insert(key, object);
    }
    let counters = Counters {
        reserves: r.u64()?,
        misses: r.u64()?,
        releases: r.u64()?,
        splits: r.u64()?,
        commits: r.u64()?,
    };
    let mut held = vec![HeldPages::default(); payload_count];
    if version >= 2 && r.remaining() != 0 {
        for (id, pages) in held.iter_mut().enumerate() {
            let name = payloads.name(id);
            let count = r.len(16)?;
            let mut previous_end = None;
            for _ in 0..count {
                let extent = read_extent(r, payloads.capacity(id))?;
                // Maximal runs: a gap of at least one page between them.
                if previous_end.is_some_and(|end| extent.start <= end) {
                    return Err(AllocError::corrupt(format!(
                        "payload {name:?}: held run at {} overlaps, touches or precedes its neighbour",
                        extent.start
                    )));
                }
                previous_end = Some(extent.end());
                pages.insert_extent(extent);
                used[id].push(extent);
            }
        }
        if held.iter().all(|h| h.count() == 0) {
            return Err(AllocError::corrupt("a held section that holds no page"));
        }
    }
    for (id, pages) in used.iter_mut().enumerate() {
        check_partition(&free[id].extents(), pages, payloads.capacity(id))
            .map_err(|e| AllocError::corrupt(format!("payload {:?}: {e}", payloads.name(id))))?;
    }
    if r.remaining() != 0 {
        return Err(AllocError::corrupt(format!(
            "{} trailing bytes",
            r.remaining()
        )));
    }
    Ok(PageAllocator::from_parts(
        payloads, free, objects, held, counters,
    ))
}

/// A non-empty extent inside `[0, capacity)`.
fn read_extent(r: &mut Reader<'_>, capacity: u64) -> Result<Extent> {
    let (start, len) = (r.u64()?, r.u64()?);
    match start.checked_add(len) {
        Some(end) if len > 0 && end <= capacity => Ok(Extent::new(start, len)),
        _ => Err(AllocError::corrupt(format!(
            "extent ({start}, {len}) is empty or outside capacity {capacity}"
        ))),
    }
}

/// Running out of bytes, or a count that cannot fit them, is a `CorruptSnapshot`.
impl From<WireError> for AllocError {
    fn from(e: WireError) -> Self {
        AllocError::corrupt(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PageAllocator {
        let mut a = PageAllocator::new(&[("kv", 64), ("index", 32)]).unwrap();
        let all = a.payloads().all();
        for key in 0..6 {
            a.reserve(key, 3 + key, all).unwrap();
        }
        a.mark_committed(2).unwrap();
        a.release(1).unwrap();
        a.release(4).unwrap();
        a
    }

    #[test]
    fn round_trip_keeps_digests() {
        let a = sample();
        let b = PageAllocator::restore(&a.snapshot()).unwrap();
        assert_eq!(a.digest(), b.digest());
        assert_eq!(a.canonical_digest(), b.canonical_digest());
        assert_eq!(a.stats(), b.stats());
        b.verify().unwrap();
    }

    #[test]
    fn every_truncation_is_rejected() {
        let data = sample().snapshot();
        for cut in 0..data.len() {
            assert!(matches!(
                PageAllocator::restore(&data[..cut]),
                Err(AllocError::CorruptSnapshot { .. })
            ));
        }
    }

    #[test]
    fn structurally_bad_bodies_are_rejected_despite_a_valid_checksum() {
        let data = sample().snapshot();
        let body = &data[HEADER_LEN..];
        // Every single-byte change to the body, re-sealed: restore either
        // rejects it or yields a self-consistent allocator; never panics.
        for i in 0..body.len() {
            for delta in [1u8, 0x80] {
                let mut bad = body.to_vec();
                bad[i] = bad[i].wrapping_add(delta);
                if let Ok(restored) = PageAllocator::restore(&seal(&bad)) {
                    restored.verify().unwrap();
                }
            }
        }
        // A used page claimed free as well: the partition check catches it.
        let mut a = PageAllocator::new(&[("kv", 8)]).unwrap();
        a.reserve(1, 4, a.payloads().all()).unwrap();
        let body = a.snapshot()[HEADER_LEN..].to_vec();
        let free_at = 4 + 4 + 2 + 8 + 8; // count, name len, "kv", capacity, free count
        let mut bad = body.clone();
        bad[free_at..free_at + 8].copy_from_slice(&2u64.to_le_bytes());
        bad[free_at + 8..free_at + 16].copy_from_slice(&6u64.to_le_bytes());
        let err = PageAllocator::restore(&seal(&bad)).unwrap_err();
        assert!(err.to_string().contains("two extents"), "{err}");
    }

    #[test]
    fn bad_header_fields_are_named() {
        let mut data = sample().snapshot();
        data[8] = 9;
        let err = PageAllocator::restore(&data).unwrap_err();
        assert!(err.to_string().contains("version 9"), "{err}");
        let mut data = sample().snapshot();
        let last = data.len() - 1;
        data[last] ^= 1;
        let err = PageAllocator::restore(&data).unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
    }
}
