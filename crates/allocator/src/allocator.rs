//! `PageAllocator`: deterministic first-fit over one pool per payload.
//!
//! Every decision reads only the allocator's own state and the call's
//! arguments (no clock, no randomness, no hash-map iteration), so every rank
//! replaying the same operations computes the same placements; `digest()`
//! makes that checkable. Every call validates fully before it changes
//! anything, so a call that returns an error leaves state and digest as they
//! were.

use std::collections::hash_map::Entry;

use crate::digest::{committed_element, config_element, held_element, StateDigest};
use crate::error::{AllocError, Result};
use crate::extent::Extent;
use crate::free_list::FreeList;
use crate::held::HeldPages;
use crate::object_map::{sorted, Object, ObjectMap};
use crate::payload::{PayloadId, PayloadSet, Payloads};
use crate::placement::{ExtentVec, Placement};
use crate::stats::{Counters, PayloadStats, Stats};

#[derive(Clone, Debug)]
pub struct PageAllocator {
    pub(crate) payloads: Payloads,
    /// One per payload, indexed by `PayloadId`.
    pub(crate) free: Vec<FreeList>,
    pub(crate) objects: ObjectMap,
    /// One per payload: the pages `reserve_held` handed out, by number.
    pub(crate) held: Vec<HeldPages>,
    /// Configuration, object extents, committed keys and held pages (see
    /// `digest`).
    pub(crate) digest: StateDigest,
    pub(crate) counters: Counters,
}

impl PageAllocator {
    /// One pool per `(payload name, capacity in pages)`, in this order.
    pub fn new<S: AsRef<str>>(pools: &[(S, u64)]) -> Result<Self> {
        let payloads = Payloads::new(pools)?;
        let free = (0..payloads.len())
            .map(|id| FreeList::new(payloads.capacity(id)))
            .collect();
        let held = vec![HeldPages::default(); payloads.len()];
        Ok(Self::from_parts(
            payloads,
            free,
            ObjectMap::default(),
            held,
            Counters::default(),
        ))
    }

    /// Assembles an allocator from validated parts (restore) and computes the
    /// digest from scratch.
    pub(crate) fn from_parts(
        payloads: Payloads,
        free: Vec<FreeList>,
        objects: ObjectMap,
        held: Vec<HeldPages>,
        counters: Counters,
    ) -> Self {
        let digest = base_digest(&payloads, &objects, &held);
        PageAllocator {
            payloads,
            free,
            objects,
            held,
            digest,
            counters,
        }
    }

    pub fn payloads(&self) -> &Payloads {
        &self.payloads
    }

    /// The payload set named by `names` (`None`: all payloads).
    pub fn select<S: AsRef<str>>(&self, names: Option<&[S]>) -> Result<PayloadSet> {
        self.payloads.select(names)
    }

    /// Reserves `num_pages` pages for `key` in every payload of `payloads`.
    ///
    /// First-fit per payload: the lowest-addressed free extent that holds all
    /// pages, else the lowest-addressed extents in address order until the
    /// request is met; pages always come from the start of an extent. All or
    /// nothing: `Ok(None)` (a counted miss, state unchanged) if any payload
    /// has fewer than `num_pages` free pages.
    pub fn reserve(
        &mut self,
        key: u64,
        num_pages: u64,
        payloads: PayloadSet,
    ) -> Result<Option<&Placement>> {
        self.check_payloads(payloads)?;
        self.check_new(key, num_pages)?;
        Ok(self.reserve_checked(key, num_pages, payloads))
    }

    /// `reserve` into the one payload `payload` (the host tier's call):
    /// the same placement, digest and errors, with one probe of the object
    /// map.
    pub fn reserve_one(
        &mut self,
        key: u64,
        num_pages: u64,
        payload: PayloadId,
    ) -> Result<Option<&Placement>> {
        self.check_payload(payload)?;
        if num_pages == 0 {
            return Err(AllocError::InvalidPages { key, num_pages });
        }
        let Entry::Vacant(slot) = self.objects.entry(key) else {
            return Err(AllocError::DuplicateKey { key });
        };
        let free = &mut self.free[payload];
        if free.free_pages() < num_pages {
            self.counters.misses += 1;
            return Ok(None);
        }
        let mut placement = Placement::new(num_pages);
        placement.push_part(payload, |out| free.take_batch(num_pages, |e| out.push(e)));
        let object = slot.insert(Object::new(key, placement));
        self.digest.add(object.digest_share);
        self.counters.reserves += 1;
        Ok(Some(&object.placement))
    }

    /// Reserves each `(key, num_pages)` in order, all or nothing per item;
    /// returns each item's placement (`None`: a miss). The whole batch is validated
    /// first (page counts, keys not live and not repeated in the batch): if
    /// any item is invalid the call fails and nothing is reserved.
    pub fn reserve_many(
        &mut self,
        requests: &[(u64, u64)],
        payloads: PayloadSet,
    ) -> Result<Vec<Option<Placement>>> {
        let mut placements = Vec::with_capacity(requests.len());
        self.reserve_each(requests, payloads, |_, placement| {
            placements.push(placement.cloned())
        })?;
        Ok(placements)
    }

    /// `reserve_many` that hands each item's placement (`None`: a miss) to
    /// `each` as it is made, in order, instead of collecting copies.
    pub fn reserve_each(
        &mut self,
        requests: &[(u64, u64)],
        payloads: PayloadSet,
        mut each: impl FnMut(u64, Option<&Placement>),
    ) -> Result<()> {
        self.check_payloads(payloads)?;
        for &(key, num_pages) in requests {
            self.check_new(key, num_pages)?;
        }
        check_distinct(requests.iter().map(|&(key, _)| key))?;
        for &(key, num_pages) in requests {
            each(key, self.reserve_checked(key, num_pages, payloads));
        }
        Ok(())
    }

    /// Reserves one page of `payload` for each of `keys` (one-page objects,
    /// freed one by one) in one reservation: the `keys.len()` pages are
    /// placed as `reserve` places one object of that many pages (the
    /// lowest-addressed extent that holds them all, else the lowest free
    /// pages), and handed to the keys in address order; appends the pages
    /// to `pages`. All or nothing: `Ok(false)` (a counted miss, state
    /// unchanged) when fewer pages are free. A rejected call (payload
    /// unknown, a key live or repeated) reserves nothing.
    pub fn reserve_pages(
        &mut self,
        keys: &[u64],
        payload: PayloadId,
        pages: &mut Vec<u64>,
    ) -> Result<bool> {
        if payload >= self.payloads.len() {
            return Err(AllocError::UnknownPayload {
                name: format!("#{payload}"),
            });
        }
        let wanted = keys.len() as u64;
        if self.free[payload].free_pages() < wanted {
            for &key in keys {
                self.check_new(key, 1)?;
            }
            check_distinct(keys.iter().copied())?;
            self.counters.misses += 1;
            return Ok(false);
        }
        if wanted == 0 {
            return Ok(true);
        }
        let free = &mut self.free[payload];
        let mut taken = ExtentVec::default();
        match free.take_first_fit(wanted) {
            Some(extent) => taken.push(extent),
            None => free.take_prefix(wanted, &mut taken),
        }
        // The keys are checked as they are inserted (one probe each, this
        // is the engines' hot call); a bad one undoes the batch.
        self.objects.reserve(keys.len());
        pages.reserve(keys.len());
        let first = pages.len();
        let taken_pages = taken.as_slice().iter().flat_map(|e| e.start..e.end());
        for (i, (&key, page)) in keys.iter().zip(taken_pages).enumerate() {
            let Entry::Vacant(slot) = self.objects.entry(key) else {
                let err = if keys[..i].contains(&key) {
                    AllocError::RepeatedKeyInBatch { key }
                } else {
                    AllocError::DuplicateKey { key }
                };
                for placed in &keys[..i] {
                    let object = self.objects.remove(placed).expect("placed above");
                    self.digest.remove(object.digest_share);
                }
                for &extent in taken.as_slice() {
                    self.free[payload].give_back(extent);
                }
                pages.truncate(first);
                return Err(err);
            };
            let mut placement = Placement::new(1);
            placement.push_part(payload, |out| out.push(Extent::new(page, 1)));
            let object = slot.insert(Object::new(key, placement));
            self.digest.add(object.digest_share);
            pages.push(page);
        }
        self.counters.reserves += wanted;
        Ok(true)
    }

    /// Reserves `n` pages of `payload` held by page number: no object, no
    /// key; each is freed on its own with `release_held`. The batch is
    /// placed as `reserve` places one object of `n` pages (the front of the
    /// lowest-addressed extent that holds them all, else the lowest free
    /// pages); appends the pages to `pages` in address order. All or
    /// nothing: `Ok(false)` (a counted miss, state unchanged) when fewer
    /// than `n` are free. Counts one reserve per page.
    pub fn reserve_held(
        &mut self,
        payload: PayloadId,
        n: u64,
        pages: &mut Vec<u64>,
    ) -> Result<bool> {
        self.check_payload(payload)?;
        let free = &mut self.free[payload];
        if free.free_pages() < n {
            self.counters.misses += 1;
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
        let held = &mut self.held[payload];
        let digest = &mut self.digest;
        pages.reserve(n as usize);
        free.take_batch(n, |extent| {
            held.insert_extent(extent);
            for page in extent.start..extent.end() {
                digest.add(held_element(payload, page));
                pages.push(page);
            }
        });
        self.counters.reserves += n;
        Ok(true)
    }

    /// Frees held page `page` of `payload`, coalescing it with its free
    /// neighbours; `NotHeld` (nothing changed) if it is not held.
    pub fn release_held(&mut self, payload: PayloadId, page: u64) -> Result<()> {
        self.check_payload(payload)?;
        if !self.held[payload].remove(page) {
            return Err(AllocError::NotHeld { payload, page });
        }
        self.digest.remove(held_element(payload, page));
        self.free[payload].give_back(Extent::new(page, 1));
        self.counters.releases += 1;
        Ok(())
    }

    /// Frees every held page of `pages`; validated first (all held, none
    /// repeated), so a rejected batch frees nothing.
    pub fn release_held_many(&mut self, payload: PayloadId, pages: &[u64]) -> Result<()> {
        self.check_payload(payload)?;
        let held = &mut self.held[payload];
        for (i, &page) in pages.iter().enumerate() {
            if !held.remove(page) {
                let err = if pages[..i].contains(&page) {
                    AllocError::RepeatedPageInBatch { payload, page }
                } else {
                    AllocError::NotHeld { payload, page }
                };
                pages[..i].iter().for_each(|&p| held.restore(p));
                return Err(err);
            }
        }
        let free = &mut self.free[payload];
        for &page in pages {
            self.digest.remove(held_element(payload, page));
            free.give_back(Extent::new(page, 1));
        }
        self.counters.releases += pages.len() as u64;
        Ok(())
    }

    /// Whether page `page` of `payload` is held (`reserve_held`).
    pub fn is_held(&self, payload: PayloadId, page: u64) -> bool {
        self.held.get(payload).is_some_and(|h| h.contains(page))
    }

    /// How many pages of `payload` are held.
    pub fn held_pages(&self, payload: PayloadId) -> u64 {
        self.held.get(payload).map_or(0, HeldPages::count)
    }

    /// The held pages of `payload` as maximal runs, in address order.
    pub fn held_extents(&self, payload: PayloadId) -> Vec<Extent> {
        self.held
            .get(payload)
            .map_or_else(Vec::new, HeldPages::extents)
    }

    /// Frees every page of `key`, coalescing with free neighbours.
    pub fn release(&mut self, key: u64) -> Result<()> {
        let object = self
            .objects
            .remove(&key)
            .ok_or(AllocError::UnknownKey { key })?;
        self.forget(key, object);
        Ok(())
    }

    /// Releases every key; validated first (all live, none repeated), so a
    /// rejected batch releases nothing.
    pub fn release_many(&mut self, keys: &[u64]) -> Result<()> {
        // Taking the objects out validates the batch in the same pass: a key
        // that is missing is unknown or repeated. Free lists and digest are
        // touched only once every key was found.
        let mut taken = Vec::with_capacity(keys.len());
        for &key in keys {
            let Some(object) = self.objects.remove(&key) else {
                for (key, object) in taken {
                    self.objects.insert(key, object);
                }
                return Err(self.release_many_error(keys));
            };
            taken.push((key, object));
        }
        for (key, object) in taken {
            self.forget(key, object);
        }
        Ok(())
    }

    /// The error of a rejected `release_many`: the first unknown key, else
    /// the first repeated one.
    fn release_many_error(&self, keys: &[u64]) -> AllocError {
        let checked = keys
            .iter()
            .try_for_each(|&key| self.object(key).map(|_| ()))
            .and_then(|()| check_distinct(keys.iter().copied()));
        checked.expect_err("a key of the batch was missing")
    }

    /// Marks `key` committed (its pages hold valid data); idempotent.
    pub fn mark_committed(&mut self, key: u64) -> Result<()> {
        let object = self
            .objects
            .get_mut(&key)
            .ok_or(AllocError::UnknownKey { key })?;
        if !object.committed {
            object.committed = true;
            self.digest.add(committed_element(key));
            self.counters.commits += 1;
        }
        Ok(())
    }

    /// Splits committed object `key` at position `at` into `left_key`
    /// (positions `[0, at)`) and `right_key` (`[at, num_pages)`, renumbered
    /// from 0) over the same physical pages; both stay committed and `key`
    /// is gone. `left_key` and `right_key` must be distinct and not live.
    pub fn split(&mut self, key: u64, at: u64, left_key: u64, right_key: u64) -> Result<()> {
        let object = self.object(key)?;
        if !object.committed {
            return Err(AllocError::NotCommitted { key });
        }
        let num_pages = object.placement.num_pages();
        if at == 0 || at >= num_pages {
            return Err(AllocError::InvalidSplit { key, at, num_pages });
        }
        if left_key == right_key {
            return Err(AllocError::SameSplitKeys {
                key,
                target: left_key,
            });
        }
        for target in [left_key, right_key] {
            if self.objects.contains_key(&target) {
                return Err(AllocError::DuplicateKey { key: target });
            }
        }
        let object = self.objects.remove(&key).expect("checked above");
        self.digest.remove(object.digest_share);
        self.digest.remove(committed_element(key));
        let (left, right) = object.placement.split_at(at);
        for (half_key, placement) in [(left_key, left), (right_key, right)] {
            let mut half = Object::new(half_key, placement);
            half.committed = true;
            self.digest.add(half.digest_share);
            self.digest.add(committed_element(half_key));
            self.objects.insert(half_key, half);
        }
        self.counters.splits += 1;
        Ok(())
    }

    pub fn placement(&self, key: u64) -> Result<&Placement> {
        Ok(&self.object(key)?.placement)
    }

    pub fn is_committed(&self, key: u64) -> Result<bool> {
        Ok(self.object(key)?.committed)
    }

    pub fn contains(&self, key: u64) -> bool {
        self.objects.contains_key(&key)
    }

    /// Number of live objects.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Live keys in ascending order.
    pub fn keys(&self) -> Vec<u64> {
        let mut keys: Vec<u64> = self.objects.keys().copied().collect();
        keys.sort_unstable();
        keys
    }

    pub fn free_pages(&self, payload: PayloadId) -> u64 {
        self.free[payload].free_pages()
    }

    pub fn largest_free_extent(&self, payload: PayloadId) -> u64 {
        self.free[payload].largest()
    }

    /// The free extents of `payload` in address order.
    pub fn free_extents(&self, payload: PayloadId) -> Vec<Extent> {
        self.free[payload].extents()
    }

    pub fn stats(&self) -> Stats {
        Stats {
            counters: self.counters,
            objects: self.objects.len(),
            payloads: self
                .free
                .iter()
                .enumerate()
                .map(|(id, free)| PayloadStats {
                    capacity: self.payloads.capacity(id),
                    used: self.payloads.capacity(id) - free.free_pages(),
                    free: free.free_pages(),
                    free_extents: free.extent_count(),
                    largest_free_extent: free.largest(),
                })
                .collect(),
        }
    }

    /// The order-independent digest of the whole state, in O(1): the
    /// configuration, every object extent at its position and every
    /// committed key (free extents are their complement, see `digest.rs`).
    pub fn digest(&self) -> u64 {
        self.digest.value()
    }

    /// Recomputes every invariant and the digest from scratch: free lists
    /// well formed and fully coalesced, free extents, object extents and
    /// held pages partitioning each pool exactly, placements consistent.
    /// Returns what is wrong.
    pub fn verify(&self) -> Result<(), String> {
        let mut used: Vec<Vec<Extent>> = vec![Vec::new(); self.payloads.len()];
        for (key, object) in sorted(&self.objects) {
            let placement = &object.placement;
            let mut previous = None;
            if placement.parts().next().is_none() {
                return Err(format!("key {key} has no payloads"));
            }
            for (payload, extents) in placement.parts() {
                if previous.is_some_and(|p| p >= payload) || payload >= self.payloads.len() {
                    return Err(format!("key {key}: payloads out of order"));
                }
                previous = Some(payload);
                let pages: u64 = extents.iter().map(|e| e.len).sum();
                if pages != placement.num_pages() || extents.iter().any(|e| e.len == 0) {
                    return Err(format!("key {key}: extents do not add up to num_pages"));
                }
                used[payload].extend_from_slice(extents);
            }
        }
        for (id, held) in self.held.iter().enumerate() {
            let extents = held.extents();
            if extents.iter().map(|e| e.len).sum::<u64>() != held.count() {
                return Err(format!("payload #{id}: held page count is stale"));
            }
            used[id].extend_from_slice(&extents);
        }
        for (id, free) in self.free.iter().enumerate() {
            let name = self.payloads.name(id);
            free.check_structure()
                .map_err(|e| format!("payload {name:?}: {e}"))?;
            let extents = free.extents();
            if extents.windows(2).any(|w| w[0].end() >= w[1].start) {
                return Err(format!(
                    "payload {name:?}: free extents not fully coalesced"
                ));
            }
            check_partition(&extents, &mut used[id], self.payloads.capacity(id))
                .map_err(|e| format!("payload {name:?}: {e}"))?;
        }
        for (key, object) in sorted(&self.objects) {
            if object.digest_share != object.placement.digest_share(key) {
                return Err(format!(
                    "key {key}: kept digest share differs from a recomputation"
                ));
            }
        }
        let expect = base_digest(&self.payloads, &self.objects, &self.held);
        if expect.value() != self.digest() {
            return Err("incremental digest differs from a recomputation".into());
        }
        Ok(())
    }

    fn object(&self, key: u64) -> Result<&Object> {
        self.objects.get(&key).ok_or(AllocError::UnknownKey { key })
    }

    fn check_payloads(&self, payloads: PayloadSet) -> Result<()> {
        if payloads == PayloadSet::EMPTY {
            return Err(AllocError::NoPayloads);
        }
        if let Some(id) = payloads.iter().find(|&id| id >= self.payloads.len()) {
            return Err(AllocError::UnknownPayload {
                name: format!("#{id}"),
            });
        }
        Ok(())
    }

    fn check_payload(&self, payload: PayloadId) -> Result<()> {
        if payload >= self.payloads.len() {
            return Err(AllocError::UnknownPayload {
                name: format!("#{payload}"),
            });
        }
        Ok(())
    }

    fn check_new(&self, key: u64, num_pages: u64) -> Result<()> {
        if num_pages == 0 {
            return Err(AllocError::InvalidPages { key, num_pages });
        }
        if self.objects.contains_key(&key) {
            return Err(AllocError::DuplicateKey { key });
        }
        Ok(())
    }

    /// Reserves a validated request; `None` (a miss) if any payload lacks room.
    fn reserve_checked(
        &mut self,
        key: u64,
        num_pages: u64,
        payloads: PayloadSet,
    ) -> Option<&Placement> {
        if payloads
            .iter()
            .any(|id| self.free[id].free_pages() < num_pages)
        {
            self.counters.misses += 1;
            return None;
        }
        let mut placement = Placement::new(num_pages);
        for payload in payloads.iter() {
            let free = &mut self.free[payload];
            placement.push_part(payload, |out| match free.take_first_fit(num_pages) {
                Some(taken) => out.push(taken),
                None => free.take_prefix(num_pages, out),
            });
        }
        let object = Object::new(key, placement);
        self.digest.add(object.digest_share);
        self.counters.reserves += 1;
        let Entry::Vacant(slot) = self.objects.entry(key) else {
            unreachable!("check_new found key {key} not live");
        };
        Some(&slot.insert(object).placement)
    }

    fn forget(&mut self, key: u64, object: Object) {
        self.digest.remove(object.digest_share);
        if object.committed {
            self.digest.remove(committed_element(key));
        }
        for (payload, extents) in object.placement.parts() {
            for &extent in extents {
                self.free[payload].give_back(extent);
            }
        }
        self.counters.releases += 1;
    }
}

/// The digest of configuration, object extents, committed keys and held
/// pages (free extents are their complement).
fn base_digest(payloads: &Payloads, objects: &ObjectMap, held: &[HeldPages]) -> StateDigest {
    let mut digest = StateDigest::default();
    digest.add(config_element(payloads));
    for (&key, object) in objects {
        digest.add(object.placement.digest_share(key));
        if object.committed {
            digest.add(committed_element(key));
        }
    }
    for (payload, held) in held.iter().enumerate() {
        held.pages()
            .for_each(|page| digest.add(held_element(payload, page)));
    }
    digest
}

fn check_distinct(keys: impl Iterator<Item = u64>) -> Result<()> {
    let mut sorted: Vec<u64> = keys.collect();
    sorted.sort_unstable();
    match sorted.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(AllocError::RepeatedKeyInBatch { key: w[0] }),
        None => Ok(()),
    }
}

/// Free extents plus used extents must tile `[0, capacity)` exactly.
pub(crate) fn check_partition(
    free: &[Extent],
    used: &mut Vec<Extent>,
    capacity: u64,
) -> Result<(), String> {
    used.extend_from_slice(free);
    used.sort_unstable();
    let mut next = 0u64;
    for extent in used.iter() {
        if extent.start != next {
            return Err(if extent.start < next {
                format!("page {} is in two extents", extent.start)
            } else {
                format!("pages {next}..{} are neither free nor used", extent.start)
            });
        }
        next = extent
            .start
            .checked_add(extent.len)
            .ok_or_else(|| format!("extent at {} overflows", extent.start))?;
    }
    if next != capacity {
        return Err(format!(
            "extents cover {next} pages, capacity is {capacity}"
        ));
    }
    Ok(())
}
