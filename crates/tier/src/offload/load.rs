//! Reads: `lookup` (changes nothing), `prepare_load` (pins what it reads
//! until `complete_load`), `touch` (stamps an access), and the record of
//! each live request's chunks by position, in which a later store of the
//! same request finds its new chunks' parents.

use cpkv_evict::{Namespace, NodeId};

use super::chunks::{KeyState, State};
use super::keys::key_hex;
use super::{OffloadIndex, NO_SLOT};
use crate::error::{Result, TierError};

impl OffloadIndex {
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
        let pin = self.host.pin(nodes, 0, job.clone());
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
            self.host.release(pin);
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
            self.host.tree_mut().unlock(node)?;
        }
        self.remember(request, &slots, &positions);
        Ok(())
    }

    pub(super) fn remember(&mut self, request: &str, slots: &[u32], positions: &[Option<u64>]) {
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

    /// Stamps an access on every path through `slots` and locks it; returns
    /// the locked nodes. Deepest first, so one lock covers a run of chunks.
    pub(super) fn lock(&mut self, slots: &[u32]) -> Result<Vec<NodeId>> {
        self.epoch += 1;
        let epoch = self.epoch;
        let mut nodes = Vec::new();
        for &slot in slots.iter().rev() {
            if self.chunk(slot).mark == epoch {
                continue;
            }
            let (tokens, _) = self.path(slot);
            let namespace = Namespace::Id(u64::from(self.chunk(slot).group));
            let found = self.host.tree_mut().match_prefix(&tokens, &namespace);
            if found.length != tokens.len() {
                for node in nodes {
                    let _ = self.host.tree_mut().unlock(node);
                }
                return Err(TierError::Divergence(format!(
                    "key {} matched {} of {} chunks in the prefix tree",
                    key_hex(&self.chunk(slot).key),
                    found.length,
                    tokens.len()
                )));
            }
            self.host.tree_mut().lock(found.node)?;
            nodes.push(found.node);
            let mut at = slot;
            while at != NO_SLOT && self.chunk(at).mark != epoch {
                self.chunk_mut(at).mark = epoch;
                at = self.chunk(at).parent;
            }
        }
        Ok(nodes)
    }
}
