//! `OffloadIndex`: an engine's host tier of offloaded blocks, one call per
//! engine call (vLLM's scheduler-side `OffloadingManager`).
//!
//! Keys are the engine's opaque bytes; the last four name the block's group
//! (big-endian, vLLM's `OffloadKey` layout), and each group is a namespace of
//! the prefix tree. A block's path in the tree is the chain of blocks before
//! it in the request that stored it (the engine's hashes are chained, so the
//! chain is the block's identity); a block whose parent is not on the host
//! when it is stored starts a path under its namespace root, which is still
//! exact. The tree evicts leaves in the policy's order, so a block never
//! leaves before the blocks that continue it: what stays is a usable prefix.
//! A victim loses only the rows the call still needs, cut from its tail
//! (ghost by its own tail rule: at most half of a victim, else all of it).
//!
//! Pins are tree locks: a store pins its blocks until each completes, a load
//! pins what it reads until `complete_load`, and `prepare_store` pins the
//! resident blocks it was offered (and the parents of the new ones) while it
//! evicts. A failed store leaves its blocks unreadable and unpinned; the next
//! offer rewrites them in their own rows.
//!
//! Every decision is a function of the calls alone (the key map is only
//! looked up, never iterated in a decision), so two indexes fed the same
//! calls report the same `digest`.
//!
//! An engine whose stores are synchronous (SGLang's HiCache `batch_set`:
//! keys continue a prefix key and each other, and are written before the
//! call returns) makes one `store` call, which is exactly those calls in a
//! row. Its reads (`locate`) change nothing. Each chunk's `serial` (from 1,
//! never reused, not even across `reset`) names one content of its row: the
//! engine stamps a written row with it, so a reused row is never read torn.

use std::collections::{BTreeMap, HashMap, VecDeque};

use cpkv_evict::{Namespace, NodeId, Policy, PrefixTree};
use cpkv_hash::{hash_words, Hasher64, KeyHashing};

use crate::error::{Result, TierError};

/// The most rows an index holds (row numbers fit a u32, as the engine's
/// int32 block ids need).
pub const MAX_OFFLOAD_ROWS: u64 = (1 << 31) - 1;
/// Bytes a key needs at least: the four that name its group.
pub const GROUP_BYTES: usize = 4;

const TOKEN_TAG: u64 = 0x6f66_6c64_746f_6b6e; // "ofldtokn"
const CHUNK_TAG: u64 = 0x6f66_6c64_6368_6e6b; // "ofldchnk"
const DIGEST_TAG: u64 = 0x6f66_6c64_6467_7374; // "oflddgst"
const NO_SLOT: u32 = u32::MAX;

/// The request `store` runs as; an engine's own request ids never start
/// with a NUL.
const STORE_REQUEST: &str = "\0store";

/// What `lookup` says of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyState {
    /// Not on the host, or its store failed.
    Miss,
    /// Written and readable.
    Ready,
    /// Its store is in flight.
    Pending,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Pending,
    Ready,
    Failed,
}

impl State {
    fn code(self) -> u64 {
        match self {
            Self::Pending => 1,
            Self::Ready => 2,
            Self::Failed => 3,
        }
    }
}

#[derive(Debug)]
struct Chunk {
    key: Box<[u8]>,
    token: u64,
    group: u32,
    parent: u32, // slot of the chunk before it on its path, or NO_SLOT
    row: u32,
    serial: u64, // unique per chunk ever made (from 1): a stale record or row stamp matches nothing
    state: State,
    store_pin: Option<u64>,
    mark: u64, // lock walks: covered in the walk with this epoch
}

/// Tree locks held for one transfer.
#[derive(Debug)]
struct Pin {
    nodes: Vec<NodeId>,
    /// A store: its chunks still in flight (released at zero). A load: 0.
    waiting: usize,
    /// A load: the chunks it reads.
    reads: Vec<u32>,
}

/// A request's chunks by (group, end position): (slot, serial).
type Chain = Map<(u32, u64), (u32, u64)>;

/// The index's tables: looked up, never iterated in a decision.
type Map<K, V> = HashMap<K, V, KeyHashing>;

/// Where a new chunk's parent is: earlier in the same call, or resident.
#[derive(Debug, Clone, Copy)]
enum Parent {
    None,
    InCall(usize),
    Slot(u32),
}

/// A store call's keys, checked: each key's token, and the first occurrence
/// of each key (its index, its slot when resident), in offer order.
struct Offer {
    tokens: Vec<u64>,
    unique: Vec<(usize, Option<u32>)>,
}

/// What `prepare_store` decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct StorePlan {
    /// Indexes into the offered keys, in offer order: the chunks to write.
    pub store: Vec<usize>,
    /// Their rows, in the same order.
    pub rows: Vec<u32>,
    /// Keys evicted to make room, in eviction order.
    pub evicted: Vec<Box<[u8]>>,
}

/// A readable chunk: its row, and its serial (unique per chunk ever
/// placed, from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub row: u32,
    pub serial: u64,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffloadStats {
    pub capacity: u64,
    pub resident: u64,
    pub ready: u64,
    pub pins: u64,
    pub evicted: u64,
}

#[derive(Debug)]
pub struct OffloadIndex {
    capacity: u32,
    policy: Policy,
    tokens_per_chunk: Vec<u64>,
    tree: PrefixTree,
    slots: Vec<Option<Chunk>>,
    free_slots: Vec<u32>,
    /// Each resident chunk's slot by its key's token (`token_of`); a
    /// lookup confirms the key itself, so a token never names a wrong key.
    by_token: Map<u64, u32>,
    by_row: Vec<u32>,
    free_rows: Vec<u32>,
    used_rows: u32,
    pins: BTreeMap<u64, Pin>,
    next_pin: u64,
    /// (request, its chunks sorted) -> load pins, oldest first: an engine
    /// completes a load with the same keys.
    loads: Map<(Box<str>, Vec<u32>), VecDeque<u64>>,
    /// Per live request: (group, end position) -> (slot, serial) of the
    /// chunks it loaded, touched or stored, so a later store finds parents.
    requests: Map<Box<str>, Chain>,
    next_serial: u64,
    epoch: u64,
    evicted: u64,
    chunk_digest: u64,
}

fn group_of(key: &[u8]) -> u32 {
    let tail: [u8; GROUP_BYTES] = key[key.len() - GROUP_BYTES..]
        .try_into()
        .unwrap_or_default();
    u32::from_be_bytes(tail)
}

fn token_of(key: &[u8]) -> u64 {
    Hasher64::new(TOKEN_TAG).bytes(key).finish()
}

/// An engine key as errors name it: its bytes in hex.
pub fn key_hex(key: &[u8]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

fn chunk_term(c: &Chunk) -> u64 {
    hash_words(
        CHUNK_TAG,
        &[
            c.token,
            u64::from(c.group),
            u64::from(c.row),
            c.state.code(),
        ],
    )
}

impl OffloadIndex {
    pub fn new(capacity: u64, policy: Policy, tokens_per_chunk: Vec<u64>) -> Result<Self> {
        if capacity == 0 || capacity > MAX_OFFLOAD_ROWS {
            return Err(TierError::Config {
                field: "capacity",
                reason: format!("must be in [1, {MAX_OFFLOAD_ROWS}], got {capacity}"),
            });
        }
        if let Some(&t) = tokens_per_chunk.iter().find(|&&t| t == 0) {
            return Err(TierError::Config {
                field: "tokens_per_chunk",
                reason: format!("every entry must be >= 1, got {t}"),
            });
        }
        let mut tree = PrefixTree::new(1, policy)?;
        // No one reads the tree's residency events here.
        tree.set_event_limit(0);
        // A call needs a few rows and a victim may be a long chain: it loses
        // only what the call needs, from its tail (vLLM's own LRU evicts per
        // block), under every policy but ghost, which has a rule of its own.
        tree.set_trim_tails(true);
        Ok(Self {
            capacity: capacity as u32,
            policy,
            tokens_per_chunk,
            tree,
            slots: Vec::new(),
            free_slots: Vec::new(),
            by_token: Map::default(),
            by_row: Vec::new(),
            free_rows: Vec::new(),
            used_rows: 0,
            pins: BTreeMap::new(),
            next_pin: 0,
            loads: Map::default(),
            requests: Map::default(),
            next_serial: 1,
            epoch: 0,
            evicted: 0,
            chunk_digest: 0,
        })
    }

    pub fn capacity(&self) -> u64 {
        u64::from(self.capacity)
    }
    pub fn policy(&self) -> Policy {
        self.policy
    }
    pub fn len(&self) -> usize {
        self.by_token.len()
    }
    pub fn is_empty(&self) -> bool {
        self.by_token.is_empty()
    }
    pub fn free_rows(&self) -> u64 {
        u64::from(self.capacity - self.used_rows)
    }
    pub fn num_pins(&self) -> usize {
        self.pins.len()
    }

    fn chunk(&self, slot: u32) -> &Chunk {
        self.slots[slot as usize].as_ref().expect("live slot")
    }
    fn chunk_mut(&mut self, slot: u32) -> &mut Chunk {
        self.slots[slot as usize].as_mut().expect("live slot")
    }

    /// Every key must be long enough to name its group; checked before a
    /// call changes anything.
    pub fn check_keys(keys: &[&[u8]]) -> Result<()> {
        match keys.iter().find(|k| k.len() < GROUP_BYTES) {
            Some(k) => Err(TierError::BadKey {
                key: key_hex(k),
                reason: "is shorter than the 4 bytes that name its group",
            }),
            None => Ok(()),
        }
    }

    fn check_call(keys: &[&[u8]], positions: &[Option<u64>]) -> Result<()> {
        if positions.len() != keys.len() {
            return Err(TierError::BadKey {
                key: format!("{} keys with {} positions", keys.len(), positions.len()),
                reason: "need one position (or none) per key",
            });
        }
        Self::check_keys(keys)
    }

    // ---- the engine's calls ---------------------------------------------

    pub fn lookup(&self, key: &[u8]) -> KeyState {
        match self.slot_of(key) {
            None => KeyState::Miss,
            Some(slot) => match self.chunk(slot).state {
                State::Ready => KeyState::Ready,
                State::Pending => KeyState::Pending,
                State::Failed => KeyState::Miss,
            },
        }
    }

    /// Pins `keys` (all readable) until `complete_load(request, keys)`;
    /// returns their rows. `positions[i]` is key i's end token in the
    /// request, when the engine knows it.
    pub fn prepare_load(
        &mut self,
        request: &str,
        keys: &[&[u8]],
        positions: &[Option<u64>],
    ) -> Result<Vec<u32>> {
        Self::check_call(keys, positions)?;
        let mut slots = Vec::with_capacity(keys.len());
        for key in keys {
            match self.slot_of(key) {
                Some(s) if self.chunk(s).state == State::Ready => slots.push(s),
                _ => {
                    return Err(TierError::BadKey {
                        key: key_hex(key),
                        reason: "is not readable on the host",
                    })
                }
            }
        }
        let rows = slots.iter().map(|&s| self.chunk(s).row).collect();
        if slots.is_empty() {
            return Ok(rows);
        }
        let nodes = self.lock(&slots)?;
        let mut job = slots.clone();
        job.sort_unstable();
        job.dedup();
        let pin = self.new_pin(nodes, 0, job.clone());
        self.loads
            .entry((request.into(), job))
            .or_default()
            .push_back(pin);
        self.remember(request, &slots, positions);
        Ok(rows)
    }

    /// Releases the oldest load of exactly these keys by `request`; a load
    /// from before `reset` is ignored.
    pub fn complete_load(&mut self, request: &str, keys: &[&[u8]]) {
        let mut job = Vec::with_capacity(keys.len());
        for key in keys {
            match self.slot_of(key) {
                Some(s) => job.push(s),
                None => return,
            }
        }
        job.sort_unstable();
        job.dedup();
        let id = (Box::<str>::from(request), job);
        let Some(queue) = self.loads.get_mut(&id) else {
            return;
        };
        let pin = queue.pop_front();
        if queue.is_empty() {
            self.loads.remove(&id);
        }
        if let Some(pin) = pin {
            self.release(pin);
        }
    }

    /// Stamps an access on the resident keys' paths.
    pub fn touch(
        &mut self,
        request: &str,
        keys: &[&[u8]],
        positions: &[Option<u64>],
    ) -> Result<()> {
        Self::check_call(keys, positions)?;
        // Each key hashed once: a lock and unlock change no residency.
        let (slots, positions): (Vec<u32>, Vec<Option<u64>>) = keys
            .iter()
            .zip(positions)
            .filter_map(|(k, p)| self.slot_of(k).map(|s| (s, *p)))
            .unzip();
        let nodes = self.lock(&slots)?;
        for node in nodes {
            self.tree.unlock(node)?;
        }
        self.remember(request, &slots, &positions);
        Ok(())
    }

    /// Places the offered keys that are not on the host (evicting in policy
    /// order to make room) and rewrites failed ones; `None` when nothing can
    /// be placed. Resident offered keys, and the parents of new ones, stay.
    pub fn prepare_store(
        &mut self,
        request: &str,
        keys: &[&[u8]],
        positions: &[Option<u64>],
    ) -> Result<Option<StorePlan>> {
        Self::check_call(keys, positions)?;
        let offer = self.offer(keys)?;
        self.place_offer(request, keys, positions, offer)
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
        for (i, key) in keys.iter().enumerate() {
            let token = token_of(key);
            if let Some(&first) = seen.get(&token) {
                if keys[first] == *key {
                    continue;
                }
                return Err(Self::collision(key));
            }
            seen.insert(token, i);
            tokens[i] = token;
            // One probe tells resident, new, and another key's token apart.
            let slot = match self.by_token.get(&token) {
                Some(&s) if *self.chunk(s).key == **key => Some(s),
                Some(_) => return Err(Self::collision(key)),
                None => None,
            };
            unique.push((i, slot));
        }
        Ok(Offer { tokens, unique })
    }

    /// `prepare_store` once its keys are checked.
    fn place_offer(
        &mut self,
        request: &str,
        keys: &[&[u8]],
        positions: &[Option<u64>],
        offer: Offer,
    ) -> Result<Option<StorePlan>> {
        let Offer { tokens, unique } = offer;
        let mut in_call: Map<(u32, u64), usize> = Map::default();
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
                Parent::InCall(j) => self.slot_at(tokens[j], keys[j]),
                Parent::None => None,
            })
            .collect();
        guarded.extend(resident.iter().copied());
        let guard = self.lock(&guarded)?;

        let rewrite: Vec<u32> = resident
            .iter()
            .copied()
            .filter(|&s| {
                let c = self.chunk(s);
                c.state == State::Failed && c.store_pin.is_none()
            })
            .collect();
        let evicted = self.make_room(new.len())?;
        let fits = new.len().min(self.free_rows() as usize);
        if !new.is_empty() && fits == 0 && rewrite.is_empty() {
            for node in guard {
                self.tree.unlock(node)?;
            }
            return Ok(None);
        }
        new.truncate(fits);
        let placed = self.place(keys, &tokens, &new, &parents);
        for node in guard {
            self.tree.unlock(node)?;
        }
        placed?;
        for &s in &rewrite {
            self.set_state(s, State::Pending);
        }
        if !rewrite.is_empty() {
            let nodes = self.lock(&rewrite)?;
            let pin = self.new_pin(nodes, rewrite.len(), Vec::new());
            for &s in &rewrite {
                self.chunk_mut(s).store_pin = Some(pin);
            }
        }
        let mut plan = StorePlan {
            evicted,
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
        let mut stored_slots = Vec::new();
        for &(i, _) in &unique {
            let Some(slot) = self.slot_at(tokens[i], keys[i]) else {
                continue;
            };
            let c = self.chunk(slot);
            if take[i] || c.mark == epoch {
                plan.store.push(i);
                plan.rows.push(c.row);
                stored_slots.push((slot, positions[i]));
            }
        }
        let (s, p): (Vec<u32>, Vec<Option<u64>>) = stored_slots.into_iter().unzip();
        self.remember(request, &s, &p);
        Ok(Some(plan))
    }

    /// Marks stored keys readable (or, on failure, unreadable until a later
    /// offer rewrites them); keys not in flight are ignored.
    /// Returns the indexes of the keys that became readable.
    ///
    /// The result does not depend on the keys' order (vLLM completes a
    /// Python `set`): each key only changes its own chunk and pin, and a
    /// pin's release stamps nothing.
    pub fn complete_store(&mut self, keys: &[&[u8]], success: bool) -> Vec<usize> {
        let mut stored = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let Some(slot) = self.slot_of(key) else {
                continue;
            };
            let Some(pin) = self.chunk_mut(slot).store_pin.take() else {
                continue;
            };
            self.set_state(slot, if success { State::Ready } else { State::Failed });
            if success {
                stored.push(i);
            }
            let done = match self.pins.get_mut(&pin) {
                Some(p) => {
                    p.waiting -= 1;
                    p.waiting == 0
                }
                None => false,
            };
            if done {
                self.release(pin);
            }
        }
        stored
    }

    pub fn request_finished(&mut self, request: &str) {
        self.requests.remove(request);
    }

    /// Evicts at least `num` unpinned chunks in policy order (fewer when
    /// fewer are unpinned); returns their keys in eviction order.
    pub fn evict(&mut self, num: u64) -> Result<Vec<Box<[u8]>>> {
        let target = self
            .free_rows()
            .saturating_add(num)
            .min(u64::from(self.capacity) * 2);
        self.make_room(target as usize)
    }

    /// Drops everything; completions of earlier transfers are then ignored.
    /// Serials keep counting, so no row stamped before the reset matches a
    /// chunk placed after it.
    pub fn reset(&mut self) -> Result<()> {
        let serial = self.next_serial;
        *self = Self::new(
            self.capacity(),
            self.policy,
            std::mem::take(&mut self.tokens_per_chunk),
        )?;
        self.next_serial = serial;
        Ok(())
    }

    /// One synchronous store: `keys` continue `prefix` (the key before
    /// `keys[0]` in the sequence, when known) and each other, and are
    /// written when the call returns. Exactly `prepare_load` of a readable
    /// prefix (which pins the path the call continues and names it as the
    /// first key's parent), `prepare_store`, `complete_store` (success),
    /// `complete_load`, `request_finished`, as one request whose positions
    /// are the prefix's 0 and then one chunk per key. So resident keys are
    /// touched, new ones placed (evicting unpinned leaves in policy order,
    /// never the call's own keys or its prefix path), and what does not fit
    /// is refused from the end of the call. Returns each key's row and
    /// serial when readable, `None` when refused.
    pub fn store(&mut self, keys: &[&[u8]], prefix: Option<&[u8]>) -> Result<Vec<Option<Placed>>> {
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
        let offer = self.offer(keys)?;
        let anchor = prefix.filter(|p| self.lookup(p) == KeyState::Ready);
        if let Some(p) = anchor {
            self.prepare_load(STORE_REQUEST, &[p], &[Some(0)])?;
        }
        let plan = self.place_offer(STORE_REQUEST, keys, &positions, offer);
        if let Ok(Some(plan)) = &plan {
            let stored: Vec<&[u8]> = plan.store.iter().map(|&i| keys[i]).collect();
            self.complete_store(&stored, true);
        }
        if let Some(p) = anchor {
            self.complete_load(STORE_REQUEST, &[p]);
        }
        self.request_finished(STORE_REQUEST);
        plan?;
        Ok(keys.iter().map(|k| self.locate(k)).collect())
    }

    // ---- views ----------------------------------------------------------

    /// A readable key's row and serial; reads nothing else and changes
    /// nothing.
    pub fn locate(&self, key: &[u8]) -> Option<Placed> {
        let c = self.chunk(self.slot_of(key)?);
        (c.state == State::Ready).then_some(Placed {
            row: c.row,
            serial: c.serial,
        })
    }

    /// Every readable chunk, in the order they were placed.
    pub fn readable(&self) -> Vec<Placed> {
        let mut live: Vec<Placed> = self
            .slots
            .iter()
            .flatten()
            .filter(|c| c.state == State::Ready)
            .map(|c| Placed {
                row: c.row,
                serial: c.serial,
            })
            .collect();
        live.sort_unstable_by_key(|p| p.serial);
        live
    }

    /// One digest of the tree, the chunks and their rows, and the next
    /// serial (an engine stamps rows with serials).
    pub fn digest(&self) -> u64 {
        hash_words(
            DIGEST_TAG,
            &[
                self.tree.digest(),
                self.chunk_digest,
                self.tree.clock(),
                u64::from(self.used_rows),
                self.next_serial,
            ],
        )
    }

    /// Resident keys in the order they were placed.
    pub fn resident_keys(&self) -> Vec<Box<[u8]>> {
        let mut live: Vec<&Chunk> = self.slots.iter().flatten().collect();
        live.sort_unstable_by_key(|c| c.serial);
        live.into_iter().map(|c| c.key.clone()).collect()
    }

    /// Keys an in-flight store or load pins, sorted.
    pub fn pinned_keys(&self) -> Vec<Box<[u8]>> {
        let mut keys: Vec<Box<[u8]>> = self
            .slots
            .iter()
            .flatten()
            .filter(|c| c.store_pin.is_some())
            .map(|c| c.key.clone())
            .collect();
        for pin in self.pins.values() {
            keys.extend(pin.reads.iter().map(|&s| self.chunk(s).key.clone()));
        }
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    pub fn row_of(&self, key: &[u8]) -> Option<u32> {
        self.slot_of(key).map(|s| self.chunk(s).row)
    }

    /// The key before `key` on its path, when it is on the host.
    pub fn parent_of(&self, key: &[u8]) -> Option<Box<[u8]>> {
        let slot = self.slot_of(key)?;
        let parent = self.chunk(slot).parent;
        (parent != NO_SLOT).then(|| self.chunk(parent).key.clone())
    }

    /// Whether `key`'s store is in flight.
    pub fn is_storing(&self, key: &[u8]) -> bool {
        self.slot_of(key)
            .is_some_and(|s| self.chunk(s).store_pin.is_some())
    }

    pub fn stats(&self) -> OffloadStats {
        OffloadStats {
            capacity: self.capacity(),
            resident: self.len() as u64,
            ready: self
                .slots
                .iter()
                .flatten()
                .filter(|c| c.state == State::Ready)
                .count() as u64,
            pins: self.pins.len() as u64,
            evicted: self.evicted,
        }
    }

    /// Audit: the tree's invariants, and that tree, rows and keys agree.
    pub fn check(&self) -> std::result::Result<(), String> {
        self.tree.check_invariants()?;
        let live = self.slots.iter().flatten().count();
        if self.tree.device_pages() != live
            || self.by_token.len() != live
            || self.used_rows as usize != live
        {
            return Err(format!(
                "{live} chunks, {} tree pages, {} keys, {} rows used",
                self.tree.device_pages(),
                self.by_token.len(),
                self.used_rows
            ));
        }
        for (slot, c) in self.slots.iter().enumerate() {
            let Some(c) = c else { continue };
            if self.by_row[c.row as usize] != slot as u32
                || self.by_token.get(&c.token) != Some(&(slot as u32))
                || c.token != token_of(&c.key)
            {
                return Err(format!(
                    "chunk {} is not where its row and key say",
                    key_hex(&c.key)
                ));
            }
            if c.parent != NO_SLOT && self.slots[c.parent as usize].is_none() {
                return Err(format!("chunk {}'s parent left first", key_hex(&c.key)));
            }
        }
        Ok(())
    }

    // ---- inside ---------------------------------------------------------

    /// The resident chunk holding `key`.
    fn slot_of(&self, key: &[u8]) -> Option<u32> {
        self.slot_at(token_of(key), key)
    }

    /// `slot_of`, with the key's token already at hand.
    fn slot_at(&self, token: u64, key: &[u8]) -> Option<u32> {
        let &slot = self.by_token.get(&token)?;
        (*self.chunk(slot).key == *key).then_some(slot)
    }

    fn collision(key: &[u8]) -> TierError {
        TierError::BadKey {
            key: key_hex(key),
            reason: "has the same 64-bit hash as another key on the host or in the call",
        }
    }

    fn serial_at(&self, slot: u32) -> Option<u64> {
        self.slots.get(slot as usize)?.as_ref().map(|c| c.serial)
    }

    fn remember(&mut self, request: &str, slots: &[u32], positions: &[Option<u64>]) {
        let mut entries = slots
            .iter()
            .zip(positions)
            .filter_map(|(&s, p)| p.map(|end| (s, end)))
            .peekable();
        if entries.peek().is_none() {
            return;
        }
        let records: Vec<((u32, u64), (u32, u64))> = entries
            .map(|(s, end)| {
                let c = self.chunk(s);
                ((c.group, end), (s, c.serial))
            })
            .collect();
        let chain = match self.requests.get_mut(request) {
            Some(c) => c,
            None => self.requests.entry(request.into()).or_default(),
        };
        chain.extend(records);
    }

    fn set_state(&mut self, slot: u32, state: State) {
        let before = chunk_term(self.chunk(slot));
        self.chunk_mut(slot).state = state;
        let after = chunk_term(self.chunk(slot));
        self.chunk_digest = self.chunk_digest.wrapping_sub(before).wrapping_add(after);
    }

    fn new_pin(&mut self, nodes: Vec<NodeId>, waiting: usize, reads: Vec<u32>) -> u64 {
        self.next_pin += 1;
        self.pins.insert(
            self.next_pin,
            Pin {
                nodes,
                waiting,
                reads,
            },
        );
        self.next_pin
    }

    fn release(&mut self, pin: u64) {
        if let Some(p) = self.pins.remove(&pin) {
            for node in p.nodes {
                // A node this index locked is still in the tree: locks keep it.
                let _ = self.tree.unlock(node);
            }
        }
    }

    /// Tree tokens from the namespace root down to `slot`.
    fn path(&self, slot: u32) -> (Vec<u64>, Vec<u64>) {
        let (mut tokens, mut rows) = (Vec::new(), Vec::new());
        let mut at = slot;
        while at != NO_SLOT {
            let c = self.chunk(at);
            tokens.push(c.token);
            rows.push(u64::from(c.row));
            at = c.parent;
        }
        tokens.reverse();
        rows.reverse();
        (tokens, rows)
    }

    /// Stamps an access on every path through `slots` and locks it; returns
    /// the locked nodes. Deepest first, so one lock covers a run of chunks.
    fn lock(&mut self, slots: &[u32]) -> Result<Vec<NodeId>> {
        self.epoch += 1;
        let epoch = self.epoch;
        let mut nodes = Vec::new();
        for &slot in slots.iter().rev() {
            if self.chunk(slot).mark == epoch {
                continue;
            }
            let (tokens, _) = self.path(slot);
            let namespace = Namespace::Id(u64::from(self.chunk(slot).group));
            let found = self.tree.match_prefix(&tokens, &namespace);
            if found.length != tokens.len() {
                for node in nodes {
                    let _ = self.tree.unlock(node);
                }
                return Err(TierError::Divergence(format!(
                    "key {} matched {} of {} chunks in the prefix tree",
                    key_hex(&self.chunk(slot).key),
                    found.length,
                    tokens.len()
                )));
            }
            self.tree.lock(found.node)?;
            nodes.push(found.node);
            let mut at = slot;
            while at != NO_SLOT && self.chunk(at).mark != epoch {
                self.chunk_mut(at).mark = epoch;
                at = self.chunk(at).parent;
            }
        }
        Ok(nodes)
    }

    /// Evicts in policy order until `needed` rows are free or nothing else
    /// can go.
    fn make_room(&mut self, needed: usize) -> Result<Vec<Box<[u8]>>> {
        let free = self.free_rows() as usize;
        if needed <= free {
            return Ok(Vec::new());
        }
        let mut evicted = Vec::new();
        for victim in self.tree.evict(needed - free) {
            for row in victim.pages {
                let slot = std::mem::replace(&mut self.by_row[row as usize], NO_SLOT);
                let chunk = self.slots[slot as usize]
                    .take()
                    .expect("a victim's row holds a chunk");
                self.chunk_digest = self.chunk_digest.wrapping_sub(chunk_term(&chunk));
                self.by_token.remove(&chunk.token);
                self.free_slots.push(slot);
                self.free_rows.push(row as u32);
                self.used_rows -= 1;
                evicted.push(chunk.key);
            }
        }
        self.evicted += evicted.len() as u64;
        Ok(evicted)
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
    ) -> Result<()> {
        let mut runs: Vec<Vec<u32>> = Vec::new();
        for &i in new {
            let parent = match parents[i] {
                Parent::Slot(s) => s,
                Parent::InCall(j) => self.slot_at(tokens[j], keys[j]).unwrap_or(NO_SLOT),
                Parent::None => NO_SLOT,
            };
            let row = self.free_rows.pop().unwrap_or_else(|| {
                self.by_row.push(NO_SLOT);
                (self.by_row.len() - 1) as u32
            });
            self.used_rows += 1;
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
            match runs.last_mut() {
                Some(run) if run.last() == Some(&parent) => run.push(slot),
                _ => runs.push(vec![slot]),
            }
        }
        for run in runs {
            let last = *run.last().expect("runs are not empty");
            let (tokens, rows) = self.path(last);
            let namespace = Namespace::Id(u64::from(self.chunk(last).group));
            let result = self.tree.insert(&tokens, &rows, &namespace)?;
            if result.cached != tokens.len() - run.len() {
                return Err(TierError::Divergence(format!(
                    "prefix tree already held {} of {} chunks, expected {} (a 64-bit key hash collided?)",
                    result.cached,
                    tokens.len(),
                    tokens.len() - run.len()
                )));
            }
            self.tree.lock(result.node)?;
            let pin = self.new_pin(vec![result.node], run.len(), Vec::new());
            for slot in run {
                self.chunk_mut(slot).store_pin = Some(pin);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpkv_hash::{mix64, SEED};

    /// A second 24-byte key (group 0) with `key`'s token: the key hash
    /// absorbs word by word through a bijection, so the second word can
    /// undo a different first one.
    fn colliding(key: &[u8; 24]) -> [u8; 24] {
        let word =
            |k: &[u8; 24], i: usize| u64::from_le_bytes(k[8 * i..8 * i + 8].try_into().unwrap());
        let start = mix64(mix64(SEED ^ TOKEN_TAG) ^ 24);
        let first = word(key, 0) ^ 1;
        let second = mix64(start ^ word(key, 0)) ^ mix64(start ^ first) ^ word(key, 1);
        let mut other = *key;
        other[..8].copy_from_slice(&first.to_le_bytes());
        other[8..16].copy_from_slice(&second.to_le_bytes());
        assert_ne!(&other, key);
        assert_eq!(token_of(&other), token_of(key));
        other
    }

    #[test]
    fn a_key_whose_token_another_key_holds_is_refused_and_changes_nothing() {
        let a = *b"first key, and group 0:\0";
        let b = colliding(&a);
        let mut index = OffloadIndex::new(4, Policy::Lru, vec![1]).unwrap();
        // Both in one call: refused before anything is placed.
        let err = index.prepare_store("r", &[&a, &b], &[Some(1), Some(2)]);
        assert!(matches!(err, Err(TierError::BadKey { .. })), "{err:?}");
        assert_eq!(
            (index.len(), index.digest()),
            (
                0,
                OffloadIndex::new(4, Policy::Lru, vec![1]).unwrap().digest()
            )
        );
        // One resident, the other offered: refused, and the other reads as a miss.
        let plan = index
            .prepare_store("r", &[&a], &[Some(1)])
            .unwrap()
            .unwrap();
        assert_eq!(plan.store, [0]);
        index.complete_store(&[&a], true);
        let before = index.digest();
        let err = index.prepare_store("s", &[&b], &[Some(1)]);
        assert!(matches!(err, Err(TierError::BadKey { .. })), "{err:?}");
        assert_eq!((index.len(), index.digest()), (1, before));
        assert_eq!(
            (index.lookup(&a), index.lookup(&b)),
            (KeyState::Ready, KeyState::Miss)
        );
        index.check().unwrap();
    }

    #[test]
    fn a_refused_store_leaves_its_prefix_unstamped() {
        let a = *b"first key, and group 0:\0";
        let b = colliding(&a);
        let prefix = *b"the prefix, in group 0:\0";
        let mut index = OffloadIndex::new(4, Policy::Lru, vec![1]).unwrap();
        index.store(&[&prefix], None).unwrap();
        index.store(&[&a], None).unwrap();
        let before = index.digest();
        // `b` collides with resident `a`: the call is refused, and the
        // readable prefix it continues is not stamped (nor locked).
        let err = index.store(&[&b], Some(&prefix));
        assert!(matches!(err, Err(TierError::BadKey { .. })), "{err:?}");
        assert_eq!(index.digest(), before);
        assert_eq!(index.num_pins(), 0);
        index.check().unwrap();
    }
}
