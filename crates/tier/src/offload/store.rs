//! Writes: `prepare_store` places the offered keys that are not on the
//! host (evicting unpinned leaves in policy order) all together or none of
//! them, `complete_store` makes them readable (or, failed, takes them
//! back), and the synchronous `store` is those calls in a row, placing
//! what fits. Rows come from the host tier's one allocator; a victim's
//! rows go back to it together.

use std::collections::hash_map::Entry;

use cpkv_evict::Namespace;

use super::chunks::{chunk_term, Chunk, Placed, State};
use super::keys::{group_of, key_hex, token_of};
use super::{KeyState, Map, OffloadIndex, NO_SLOT, STORE_REQUEST};
use crate::error::{Result, TierError};

/// Where a new chunk's parent is: earlier in the same call, or resident.
#[derive(Debug, Clone, Copy)]
enum Parent {
    None,
    InCall(usize),
    Slot(u32),
}

/// A store call's keys, checked: each key's token, the first occurrence
/// of each key (its index, its slot when resident), in offer order, and
/// each key's first occurrence by index.
struct Offer {
    tokens: Vec<u64>,
    unique: Vec<(usize, Option<u32>)>,
    first: Vec<usize>,
}

/// What `place_offer` did: the plan (`None` when nothing could be placed),
/// each offered key's slot after it (`NO_SLOT` where none; a duplicate key
/// has its first occurrence's), and the slots the plan stores, in its
/// order. Carried through the call so no key is hashed or looked up again.
struct Placement {
    plan: Option<StorePlan>,
    slots: Vec<u32>,
    stored: Vec<u32>,
}

/// How `place_offer` places: all new keys or none (`prepare_store`), or
/// what fits from the head (`prepare_store_fitting`, and `store`, whose
/// request ends with the call, so it remembers none of its chunks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Whole,
    Fitting,
    Synchronous,
}

/// Evicted keys, in eviction order, and the row each held.
type Victims = (Vec<Box<[u8]>>, Vec<u32>);

/// A key a store evicted and the row it held.
pub type Evicted = (Box<[u8]>, u32);

/// What `prepare_store` decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct StorePlan {
    /// Indexes into the offered keys, in offer order: the chunks to write.
    pub store: Vec<usize>,
    /// Their rows, in the same order.
    pub rows: Vec<u32>,
    /// Keys evicted to make room, in eviction order.
    pub evicted: Vec<Box<[u8]>>,
    /// The row each evicted key held. Its bytes are still there when the
    /// plan is returned, but the row may be in `rows` too: a lower tier
    /// must copy it out before the plan's own stores are written.
    pub evicted_rows: Vec<u32>,
}

impl OffloadIndex {
    /// Places the offered keys that are not on the host (evicting in policy
    /// order to make room) and rewrites failed ones. All of them or none:
    /// `None`, changing nothing, when eviction cannot free a row for every
    /// new key (vLLM's `OffloadingManager` contract: its scheduler offers
    /// the request's chunks again after a `None`, never after a partial
    /// store). Resident offered keys, and the parents of new ones, stay.
    pub fn prepare_store(
        &mut self,
        request: &str,
        keys: &[&[u8]],
        positions: &[Option<u64>],
    ) -> Result<Option<StorePlan>> {
        self.plan_offer(request, keys, positions, Mode::Whole)
    }

    /// `prepare_store`, but placing the new keys that fit, from the head of
    /// the offer (after evicting all it can); `None` when none fits. What
    /// the synchronous `store` does.
    pub fn prepare_store_fitting(
        &mut self,
        request: &str,
        keys: &[&[u8]],
        positions: &[Option<u64>],
    ) -> Result<Option<StorePlan>> {
        self.plan_offer(request, keys, positions, Mode::Fitting)
    }

    /// A store plan for the offer, placed as `mode` says.
    fn plan_offer(
        &mut self,
        request: &str,
        keys: &[&[u8]],
        positions: &[Option<u64>],
        mode: Mode,
    ) -> Result<Option<StorePlan>> {
        Self::check_call(keys, positions)?;
        let offer = self.offer(keys)?;
        Ok(self
            .place_offer(request, keys, positions, offer, mode)?
            .plan)
    }

    /// The offered keys as `place_offer` takes them; reads only, and is
    /// where a store call is refused (before anything changes).
    fn offer(&self, keys: &[&[u8]]) -> Result<Offer> {
        // The first occurrence of each key, in offer order, its token and
        // its slot when resident (eviction below spares them: they are
        // locked). Two distinct keys with one token (odds of about 2^-64 a
        // pair) are refused before anything changes.
        let mut seen: Map<u64, usize> = Map::default();
        seen.reserve(keys.len());
        let mut unique: Vec<(usize, Option<u32>)> = Vec::with_capacity(keys.len());
        let mut tokens = vec![0; keys.len()];
        let mut firsts = Vec::with_capacity(keys.len());
        // Hashed first, probed after: the probes' misses overlap (see `batch`).
        let hashed: Vec<u64> = keys.iter().map(|k| token_of(k)).collect();
        for (i, (key, &token)) in keys.iter().zip(&hashed).enumerate() {
            match seen.entry(token) {
                Entry::Occupied(first) => {
                    let first = *first.get();
                    if keys[first] != *key {
                        return Err(Self::collision(key));
                    }
                    firsts.push(first);
                    continue;
                }
                Entry::Vacant(vacant) => {
                    vacant.insert(i);
                }
            }
            firsts.push(i);
            tokens[i] = token;
            // One probe tells resident, new, and another key's token apart.
            let slot = match self.by_token.get(&token) {
                Some(&s) if *self.chunk(s).key == **key => Some(s),
                Some(_) => return Err(Self::collision(key)),
                None => None,
            };
            unique.push((i, slot));
        }
        Ok(Offer {
            tokens,
            unique,
            first: firsts,
        })
    }

    /// `prepare_store` (or `store`, by `mode`) once its keys are checked.
    fn place_offer(
        &mut self,
        request: &str,
        keys: &[&[u8]],
        positions: &[Option<u64>],
        offer: Offer,
        mode: Mode,
    ) -> Result<Placement> {
        let Offer { tokens, unique, .. } = offer;
        // Each key's slot: resident ones now, new ones as they are placed.
        let mut slots = vec![NO_SLOT; keys.len()];
        for &(i, slot) in &unique {
            if let Some(s) = slot {
                slots[i] = s;
            }
        }
        let mut in_call: Map<(u32, u64), usize> = Map::default();
        in_call.reserve(unique.len()); // one allocation, not a rehash per doubling
        let mut parents = vec![Parent::None; keys.len()];
        let chain = self.requests.get(request);
        for &(i, _) in &unique {
            let Some(end) = positions[i] else { continue };
            let group = group_of(keys[i]);
            if let Some(&step) = self.tokens_per_chunk.get(group as usize) {
                if let Some(start) = end.checked_sub(step) {
                    parents[i] = match in_call.get(&(group, start)) {
                        Some(&j) => Parent::InCall(j),
                        None => match chain.and_then(|c| c.get(&(group, start))) {
                            Some(&(slot, serial)) if self.serial_at(slot) == Some(serial) => {
                                Parent::Slot(slot)
                            }
                            _ => Parent::None,
                        },
                    };
                }
            }
            in_call.insert((group, end), i);
        }
        let resident: Vec<u32> = unique.iter().filter_map(|&(_, slot)| slot).collect();
        let mut new: Vec<usize> = unique
            .iter()
            .filter(|(_, slot)| slot.is_none())
            .map(|&(i, _)| i)
            .collect();
        let mut guarded: Vec<u32> = new
            .iter()
            .filter_map(|&i| match parents[i] {
                Parent::Slot(s) => Some(s),
                Parent::InCall(j) => (slots[j] != NO_SLOT).then_some(slots[j]),
                Parent::None => None,
            })
            .collect();
        guarded.extend(resident.iter().copied());
        if mode == Mode::Whole && new.len() > self.free_rows() as usize {
            // Decided before the guard's locks stamp anything: a refusal
            // leaves the digest as it was.
            let short = new.len() - self.free_rows() as usize;
            if short > self.evictable_sparing(&guarded) {
                return Ok(Placement {
                    plan: None,
                    slots,
                    stored: Vec::new(),
                });
            }
        }
        let guard = self.lock(&guarded)?;

        let rewrite: Vec<u32> = resident
            .iter()
            .copied()
            .filter(|&s| {
                let c = self.chunk(s);
                c.state == State::Failed && c.store_pin.is_none()
            })
            .collect();
        let (evicted, evicted_rows) = self.make_room(new.len())?;
        let fits = new.len().min(self.free_rows() as usize);
        if !new.is_empty() && fits == 0 && rewrite.is_empty() {
            for node in guard {
                self.host.tree_mut().unlock(node)?;
            }
            return Ok(Placement {
                plan: None,
                slots,
                stored: Vec::new(),
            });
        }
        new.truncate(fits);
        let placed = self.place(keys, &tokens, &new, &parents, &mut slots);
        for node in guard {
            self.host.tree_mut().unlock(node)?;
        }
        placed?;
        for &s in &rewrite {
            self.set_state(s, State::Pending);
        }
        if !rewrite.is_empty() {
            let nodes = self.lock(&rewrite)?;
            let pin = self.host.pin(nodes, rewrite.len(), Vec::new());
            for &s in &rewrite {
                self.chunk_mut(s).store_pin = Some(pin);
            }
        }
        let mut plan = StorePlan {
            evicted,
            evicted_rows,
            ..StorePlan::default()
        };
        let mut take = vec![false; keys.len()];
        for &i in &new {
            take[i] = true;
        }
        self.epoch += 1;
        let epoch = self.epoch;
        for &s in &rewrite {
            self.chunk_mut(s).mark = epoch;
        }
        let mut stored = Vec::with_capacity(unique.len());
        let mut stored_positions = Vec::with_capacity(unique.len());
        for &(i, _) in &unique {
            let slot = slots[i];
            if slot == NO_SLOT {
                continue;
            }
            let c = self.chunk(slot);
            if take[i] || c.mark == epoch {
                plan.store.push(i);
                plan.rows.push(c.row);
                stored.push(slot);
                stored_positions.push(positions[i]);
            }
        }
        if mode != Mode::Synchronous {
            self.remember(request, &stored, &stored_positions);
        }
        Ok(Placement {
            plan: Some(plan),
            slots,
            stored,
        })
    }

    /// Marks stored keys readable, or, on failure, takes them back as vLLM
    /// does: a failed chunk leaves the host and its row is free at once,
    /// unless chunks placed since continue it or a lock still covers it
    /// (then it stays, unreadable, until an offer rewrites it or it is
    /// evicted, silently: it was never stored). Keys not in flight are
    /// ignored. Returns the indexes of the keys whose store completed: they
    /// became readable, or (failed) were removed.
    ///
    /// The result does not depend on the keys' order (vLLM completes a
    /// Python `set`): each key only changes its own chunk and pin, a pin's
    /// release stamps nothing, and failed chunks are taken back once every
    /// key is completed, each with the failed chunks before it.
    pub fn complete_store(&mut self, keys: &[&[u8]], success: bool) -> Result<Vec<usize>> {
        let mut done = Vec::new();
        let mut failed = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            if let Some(slot) = self.slot_of(key) {
                if self.complete_slot(slot, success) {
                    done.push(i);
                    failed.extend((!success).then_some(slot));
                }
            }
        }
        // Deepest first (then by serial: the order of the keys given never
        // shows), so a failed run leaves whole.
        failed
            .sort_unstable_by_key(|&s| (std::cmp::Reverse(self.depth_of(s)), self.chunk(s).serial));
        for slot in failed {
            self.take_back(slot)?;
        }
        Ok(done)
    }

    /// Takes failed chunk `slot` off the host, and then each failed chunk
    /// before it that this leaves at the end of its path; stops at the
    /// first that something continues or a lock covers.
    fn take_back(&mut self, mut slot: u32) -> Result<()> {
        while slot != NO_SLOT && self.slots[slot as usize].is_some() {
            let c = self.chunk(slot);
            if c.state != State::Failed || c.store_pin.is_some() {
                break;
            }
            let (parent, row) = (c.parent, c.row);
            let namespace = Namespace::Id(u64::from(c.group));
            let (tokens, _) = self.path(slot);
            let tree = self.host.tree_mut();
            let Some((node, true)) = tree.node_ending(&tokens, &namespace) else {
                break;
            };
            let Some(pages) = tree.drop_tail(node, 1) else {
                break;
            };
            if pages != [u64::from(row)] {
                return Err(TierError::Divergence(format!(
                    "failed chunk {} held row {row}, its tree page was {pages:?}",
                    key_hex(&self.chunk(slot).key)
                )));
            }
            self.forget(slot);
            self.host.rows_mut().release_row(u64::from(row))?;
            slot = parent;
        }
        Ok(())
    }

    /// Chunks on `slot`'s path, itself included.
    fn depth_of(&self, mut slot: u32) -> usize {
        let mut depth = 0;
        while slot != NO_SLOT {
            depth += 1;
            slot = self.chunk(slot).parent;
        }
        depth
    }

    /// Rows eviction could free with `guarded`'s paths locked too: pages no
    /// lock covers, less those the guard's locks would cover. Reads only.
    fn evictable_sparing(&mut self, guarded: &[u32]) -> usize {
        self.epoch += 1;
        let epoch = self.epoch;
        let mut paths = Vec::new();
        // Deepest last in the offer: walking from it covers the ones before.
        for &slot in guarded.iter().rev() {
            if self.chunk(slot).mark == epoch {
                continue;
            }
            let namespace = Namespace::Id(u64::from(self.chunk(slot).group));
            paths.push((self.path(slot).0, namespace));
            let mut at = slot;
            while at != NO_SLOT && self.chunk(at).mark != epoch {
                self.chunk_mut(at).mark = epoch;
                at = self.chunk(at).parent;
            }
        }
        let tree = self.host.tree();
        let refs: Vec<(&[u64], &Namespace)> =
            paths.iter().map(|(t, n)| (t.as_slice(), n)).collect();
        let locked = tree.locked_device_pages() + tree.pages_locking_adds(&refs);
        tree.device_pages().saturating_sub(locked)
    }

    /// Removes chunk `slot` from the index's tables (not from the tree, nor
    /// its row from the allocator); returns it.
    fn forget(&mut self, slot: u32) -> Chunk {
        let chunk = self.slots[slot as usize].take().expect("a live chunk");
        self.by_row[chunk.row as usize] = NO_SLOT;
        self.chunk_digest = self.chunk_digest.wrapping_sub(chunk_term(&chunk));
        self.by_token.remove(&chunk.token);
        self.free_slots.push(slot);
        chunk
    }

    /// `complete_store` of one resident chunk; whether it was in flight.
    fn complete_slot(&mut self, slot: u32, success: bool) -> bool {
        let Some(pin) = self.chunk_mut(slot).store_pin.take() else {
            return false;
        };
        self.set_state(slot, if success { State::Ready } else { State::Failed });
        self.host.part_done(pin);
        true
    }

    /// Evicts at least `num` unpinned chunks in policy order (fewer when
    /// fewer are unpinned); returns their keys in eviction order.
    pub fn evict(&mut self, num: u64) -> Result<Vec<Box<[u8]>>> {
        let target = self
            .free_rows()
            .saturating_add(num)
            .min(self.capacity() * 2);
        Ok(self.make_room(target as usize)?.0)
    }

    /// One synchronous store: `keys` continue `prefix` (the key before
    /// `keys[0]` in the sequence, when known) and each other, and are
    /// written when the call returns. Exactly `prepare_load` of a readable
    /// prefix (which pins the path the call continues and names it as the
    /// first key's parent), `prepare_store_fitting`, `complete_store` (success),
    /// `complete_load`, `request_finished`, as one request whose positions
    /// are the prefix's 0 and then one chunk per key. So resident keys are
    /// touched, new ones placed (evicting unpinned leaves in policy order,
    /// never the call's own keys or its prefix path), and what does not fit
    /// is refused from the end of the call. Returns each key's row and
    /// serial when readable, `None` when refused.
    pub fn store(&mut self, keys: &[&[u8]], prefix: Option<&[u8]>) -> Result<Vec<Option<Placed>>> {
        Ok(self.store_evicting(keys, prefix)?.0)
    }

    /// `store`, and the keys it evicted to make room, each with the row it
    /// held, in eviction order. A victim's bytes are still in its row when
    /// the call returns, but the row may be one of the call's own placements:
    /// a lower tier copies the victims out before the call's pages are
    /// written (the SGLang backend's spills to L3).
    pub fn store_evicting(
        &mut self,
        keys: &[&[u8]],
        prefix: Option<&[u8]>,
    ) -> Result<(Vec<Option<Placed>>, Vec<Evicted>)> {
        Self::check_keys(keys)?;
        Self::check_keys(prefix.as_slice())?;
        let step = |k: &[u8]| {
            self.tokens_per_chunk
                .get(group_of(k) as usize)
                .copied()
                .unwrap_or(1)
        };
        let positions: Vec<Option<u64>> = keys
            .iter()
            .zip(1u64..)
            .map(|(k, i)| i.checked_mul(step(k))) // past u64: no parent, still exact
            .collect();
        // Refused (a key hash collision) before the prefix is stamped: a
        // refused call changes nothing.
        let mut offer = self.offer(keys)?;
        let anchor = prefix.filter(|p| self.lookup(p) == KeyState::Ready);
        if let Some(p) = anchor {
            self.prepare_load(STORE_REQUEST, &[p], &[Some(0)])?;
        }
        let first = std::mem::take(&mut offer.first);
        let placement = self.place_offer(STORE_REQUEST, keys, &positions, offer, Mode::Synchronous);
        if let Ok(placement) = &placement {
            for &slot in &placement.stored {
                self.complete_slot(slot, true);
            }
        }
        if let Some(p) = anchor {
            self.complete_load(STORE_REQUEST, &[p]);
        }
        self.request_finished(STORE_REQUEST);
        let Placement { plan, slots, .. } = placement?;
        // No plan means nothing was placed, and then nothing was evicted
        // either (an eviction frees a row, so something fits).
        let evicted = match plan {
            Some(plan) => plan.evicted.into_iter().zip(plan.evicted_rows).collect(),
            None => Vec::new(),
        };
        // Each key as `locate` reads it: its slot was carried through the
        // call, and nothing since has evicted a slot the call placed or
        // locked.
        Ok((
            first.iter().map(|&f| self.placed_at(slots[f])).collect(),
            evicted,
        ))
    }

    /// Evicts in policy order until `needed` rows are free or nothing else
    /// can go; returns the victims' keys and the row each held, less failed
    /// chunks (never stored: their removal was reported when they failed).
    fn make_room(&mut self, needed: usize) -> Result<Victims> {
        let free = self.free_rows() as usize;
        if needed <= free {
            return Ok((Vec::new(), Vec::new()));
        }
        let mut evicted = Vec::new();
        let mut evicted_rows = Vec::new();
        for victim in self.host.tree_mut().evict(needed - free) {
            for &row in &victim.pages {
                let slot = self.by_row[row as usize];
                let chunk = self.forget(slot);
                if chunk.state != State::Failed {
                    evicted.push(chunk.key);
                    evicted_rows.push(row as u32);
                }
            }
            self.host.rows_mut().release_rows(&victim.pages)?;
        }
        self.evicted += evicted.len() as u64;
        Ok((evicted, evicted_rows))
    }

    /// Rows for the `new` keys, inserted into the tree and pinned until
    /// their stores complete. One insert per run of chunks that continue
    /// each other.
    fn place(
        &mut self,
        keys: &[&[u8]],
        tokens: &[u64],
        new: &[usize],
        parents: &[Parent],
        slots: &mut [u32],
    ) -> Result<()> {
        let mut runs: Vec<Vec<u32>> = Vec::new();
        // One reservation for the call's blocks, held by row number: each
        // is freed on its own, by the row its chunk records.
        let rows: Vec<u32> = self
            .host
            .rows_mut()
            .reserve_rows(new.len() as u64)?
            .ok_or_else(|| {
                TierError::Divergence(format!("{} rows admitted, fewer free", new.len()))
            })?
            .iter()
            .map(|&row| row as u32)
            .collect();
        for (&i, row) in new.iter().zip(rows) {
            let parent = match parents[i] {
                Parent::Slot(s) => s,
                Parent::InCall(j) => slots[j],
                Parent::None => NO_SLOT,
            };
            if self.by_row.len() <= row as usize {
                self.by_row.resize(row as usize + 1, NO_SLOT);
            }
            let chunk = Chunk {
                key: keys[i].into(),
                token: tokens[i],
                group: group_of(keys[i]),
                parent,
                row,
                serial: self.next_serial,
                state: State::Pending,
                store_pin: None,
                mark: 0,
            };
            self.next_serial += 1;
            self.chunk_digest = self.chunk_digest.wrapping_add(chunk_term(&chunk));
            let slot = match self.free_slots.pop() {
                Some(s) => {
                    self.slots[s as usize] = Some(chunk);
                    s
                }
                None => {
                    self.slots.push(Some(chunk));
                    (self.slots.len() - 1) as u32
                }
            };
            self.by_token.insert(tokens[i], slot);
            self.by_row[row as usize] = slot;
            slots[i] = slot;
            match runs.last_mut() {
                Some(run) if run.last() == Some(&parent) => run.push(slot),
                _ => runs.push(vec![slot]),
            }
        }
        for run in runs {
            let last = *run.last().expect("runs are not empty");
            let (tokens, rows) = self.path(last);
            let namespace = Namespace::Id(u64::from(self.chunk(last).group));
            let result = self.host.tree_mut().insert(&tokens, &rows, &namespace)?;
            if result.cached != tokens.len() - run.len() {
                return Err(TierError::Divergence(format!(
                    "prefix tree already held {} of {} chunks, expected {} (a 64-bit key hash collided?)",
                    result.cached,
                    tokens.len(),
                    tokens.len() - run.len()
                )));
            }
            self.host.tree_mut().lock(result.node)?;
            let pin = self.host.pin(vec![result.node], run.len(), Vec::new());
            for slot in run {
                self.chunk_mut(slot).store_pin = Some(pin);
            }
        }
        Ok(())
    }
}
