//! `TierCache`: the two-tier cache's every decision: the device tier on top
//! of the host tier's core (`HostIndex`: the prefix tree, which carries both
//! tiers' residency, the slab rows, the backups' pins), with the device page
//! pool beside it.
//!
//! Page states. Device: free -> held by the caller (`allocate`,
//! `plan_load`) -> held by the tree (`insert` adopts) -> free (eviction);
//! held pages the tree does not adopt go back to free. Host: a backup
//! reserves one host object (rows) per node and pins the node (its device
//! pages are the copy's source; nothing may evict them); `commit` records
//! the object on the node (`set_host`) and releases the pin; host eviction drops
//! host-only leaves and releases objects no node refers to any more.
//!
//! Every public call validates first; a call that returns an error has
//! changed nothing (tree, allocator, pool, bookkeeping or digest).

use std::collections::BTreeMap;

use cpkv_evict::{Namespace, NodeId, PageId, Policy, PrefixTree, Token};

use crate::config::TierConfig;
use crate::device_pool::DevicePool;
use crate::error::{Result, TierError};
use crate::host_index::HostIndex;
use crate::objects::HostObjects;
use crate::plan::{Backup, CommitOutcome, InsertOutcome, LoadPlan, LoadRun, Lookup};
use crate::segments::{Segment, Segments};
use crate::spill::SpillState;
use crate::stats::TierStats;
use cpkv_hash::hash_words as term;

const PENDING: u64 = 0x5042;
const COMBINED: u64 = 0x4344;
const LOOKUP_LOCK: u64 = 0x4c4b;
const CONFIG: u64 = 0x4346;

fn config_term(c: &TierConfig) -> u64 {
    let policy = Policy::ALL
        .iter()
        .position(|p| *p == c.policy)
        .expect("listed") as u64;
    term(
        CONFIG,
        &[
            c.page_size as u64,
            c.cp_size,
            c.device_pages,
            c.host_pages,
            policy,
            c.host_free_target,
        ],
    )
}

/// A reserved backup not yet committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pending {
    node: NodeId,
    object: u64,
    /// The host core's pin on `node` (released at commit or abort).
    pin: u64,
    /// Depth of the node's first page when reserved (splits while pending
    /// put new pieces above it, down to this depth).
    start_depth: u64,
}

#[derive(Debug, Clone)]
pub struct TierCache {
    config: TierConfig,
    /// The host tier's core; its tree also carries device residency.
    host: HostIndex,
    /// Each backup's rows (segments point into them).
    objects: HostObjects,
    device: DevicePool,
    segments: Segments,
    pending: BTreeMap<u64, Pending>,
    /// Node -> ticket of its pending backup.
    pending_nodes: BTreeMap<NodeId, u64>,
    /// Locks taken by lookups and not yet undone, per node (a backup's own
    /// lock is not the caller's to undo).
    lookup_locks: BTreeMap<NodeId, u64>,
    /// Host object keys and tree host (segment) keys share this counter.
    next_key: u64,
    /// Tickets issued so far; ticket `t` is the `t`-th backup (from 1).
    issued: u64,
    committed_through: u64,
    /// The config's share of the digest: ranks built differently must not agree.
    config_term: u64,
    stats: TierStats,
    /// What host eviction hands to a third tier (`spill.rs`); None when off.
    spill: Option<SpillState>,
}

impl TierCache {
    pub fn new(config: TierConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            config,
            host: HostIndex::new(config.page_size, config.policy, config.host_pages)?,
            objects: HostObjects::default(),
            device: DevicePool::new(config.device_pages),
            segments: Segments::default(),
            pending: BTreeMap::new(),
            pending_nodes: BTreeMap::new(),
            lookup_locks: BTreeMap::new(),
            next_key: 1,
            issued: 0,
            committed_through: 0,
            config_term: config_term(&config),
            stats: TierStats::default(),
            spill: None,
        })
    }

    // ---- queries -------------------------------------------------------

    pub fn config(&self) -> &TierConfig {
        &self.config
    }
    pub fn tree(&self) -> &PrefixTree {
        self.host.tree()
    }
    /// The host tier's core under this cache.
    pub fn host(&self) -> &HostIndex {
        &self.host
    }
    pub fn device(&self) -> &DevicePool {
        &self.device
    }
    pub fn stats(&self) -> TierStats {
        self.stats
    }
    /// Backup tickets issued so far (the newest ticket).
    pub fn issued(&self) -> u64 {
        self.issued
    }
    pub fn committed_through(&self) -> u64 {
        self.committed_through
    }
    /// Tickets reserved and not yet committed or aborted, in order.
    pub fn pending_tickets(&self) -> Vec<u64> {
        self.pending.keys().copied().collect()
    }
    pub fn free_host_pages(&self) -> u64 {
        self.host.rows().free()
    }

    /// One digest of everything replicated: the host core (tree, rows,
    /// pins), host objects, device pool and the tier's own bookkeeping.
    /// O(pending backups).
    pub fn digest(&self) -> u64 {
        self.combine(
            self.host.digest(),
            self.objects.digest(),
            self.device.digest(),
            self.segments.digest(),
        )
    }

    /// `digest` recomputed from every part's full state.
    pub fn digest_from_scratch(&self) -> u64 {
        self.combine(
            self.host.digest_from_scratch(),
            self.objects.digest_from_scratch(),
            self.device.digest_from_scratch(),
            self.segments.digest_from_scratch(),
        )
    }

    fn combine(&self, host: u64, objects: u64, device: u64, segments: u64) -> u64 {
        let pending = self.pending.iter().fold(0u64, |d, (&t, p)| {
            d.wrapping_add(term(
                PENDING,
                &[t, p.node.0, p.object, p.pin, p.start_depth],
            ))
        });
        let locks = self.lookup_locks.iter().fold(0u64, |d, (n, &c)| {
            d.wrapping_add(term(LOOKUP_LOCK, &[n.0, c]))
        });
        term(
            COMBINED,
            &[
                host,
                objects,
                device,
                segments,
                pending,
                locks,
                self.next_key,
                self.issued,
                self.committed_through,
                self.config_term,
            ],
        )
    }

    /// Slab rows holding the pages of host node `node`, in order.
    pub fn host_rows(&self, node: NodeId) -> Result<Vec<u64>> {
        let n = self
            .host
            .tree()
            .node(node)
            .ok_or(TierError::Tree(cpkv_evict::EvictError::UnknownNode(node)))?;
        let key = n
            .host_key()
            .ok_or(TierError::Tree(cpkv_evict::EvictError::InvalidTier {
                node,
                reason: "has no host copy",
            }))?;
        let segment = self.segments.get(key).expect("host keys are segments");
        let start = segment.object_offset + (n.depth() as u64 - segment.start_depth);
        let rows = &self
            .objects
            .get(segment.object)
            .expect("segments point at live objects")
            .rows;
        let len = self.node_pages(node) as u64;
        Ok(rows[start as usize..(start + len) as usize]
            .iter()
            .map(|&r| u64::from(r))
            .collect())
    }

    // ---- the engine's calls --------------------------------------------

    /// Longest cached prefix in either tier; locks the deepest matched node
    /// (so neither tier evicts the path) until `unlock`.
    pub fn lookup(&mut self, tokens: &[Token], namespace: &Namespace) -> Lookup {
        let m = self.host.tree_mut().match_prefix(tokens, namespace);
        let locked = !self
            .host
            .tree()
            .node(m.host_node)
            .expect("matched")
            .is_root();
        if locked {
            self.host
                .tree_mut()
                .lock(m.host_node)
                .expect("live non-root node");
            *self.lookup_locks.entry(m.host_node).or_insert(0) += 1;
        }
        self.stats.lookups += 1;
        self.stats.lookup_tokens +=
            (tokens.len() / self.config.page_size * self.config.page_size) as u64;
        self.stats.device_hit_tokens += m.length as u64;
        self.stats.host_hit_tokens += (m.host_length - m.length) as u64;
        Lookup {
            device_tokens: m.length,
            host_tokens: m.host_length,
            device_pages: m.device_pages,
            device_node: m.node,
            node: m.host_node,
            locked,
        }
    }

    /// Undoes a lookup's lock.
    pub fn unlock(&mut self, node: NodeId) -> Result<()> {
        let Some(count) = self.lookup_locks.get_mut(&node) else {
            return Err(TierError::NotLocked(node));
        };
        self.host.tree_mut().unlock(node)?;
        *count -= 1;
        if *count == 0 {
            self.lookup_locks.remove(&node);
        }
        Ok(())
    }

    /// `n` device pages for the caller, evicting device leaves in policy
    /// order as needed; `None` (a counted miss) if even that cannot make
    /// room (the rest is locked). Eviction done toward a miss stays done.
    pub fn allocate(&mut self, n: u64) -> Option<Vec<PageId>> {
        self.stats.allocations += 1;
        let free = self.device.free_pages();
        if n > free {
            self.evict_device(n - free);
        }
        let pages = self.device.take(n);
        if pages.is_none() {
            self.stats.allocation_misses += 1;
        }
        pages
    }

    /// Returns caller-held pages to the free pool.
    pub fn free(&mut self, pages: &[PageId]) -> Result<()> {
        self.device.check(pages, true)?;
        self.device.release_held(pages);
        Ok(())
    }

    /// Frees at least `num_pages` device pages from unlocked device leaves
    /// (or all it can); a victim with a committed host copy stays as
    /// host-only, one without leaves the tree. Returns the pages freed.
    pub fn evict_device(&mut self, num_pages: u64) -> u64 {
        let mut freed = 0;
        for victim in self.host.tree_mut().evict(num_pages as usize) {
            self.stats.device_victims += 1;
            self.stats.device_evicted_pages += victim.pages.len() as u64;
            if self.host.tree().node(victim.node).is_some() {
                self.stats.demoted_to_host += 1;
            }
            freed += victim.pages.len() as u64;
            self.device.release_evicted(&victim.pages);
        }
        freed
    }

    /// Drops host-only leaves in policy order until at least `num_pages`
    /// host pages are free (or nothing more can go); returns pages released.
    pub fn evict_host(&mut self, num_pages: u64) -> u64 {
        let before = self.free_host_pages();
        let want = num_pages.saturating_sub(before);
        if want == 0 {
            return 0;
        }
        // Dropping a node of a shared object frees nothing until its last
        // segment goes, so keep asking until the pages are really free.
        while self.free_host_pages() < num_pages {
            let short = (num_pages - self.free_host_pages()) as usize;
            let victims = self.host.tree_mut().evict_host(short);
            if victims.is_empty() {
                break;
            }
            for v in victims {
                self.stats.host_victims += 1;
                self.stats.host_evicted_pages += v.num_pages as u64;
                if v.released {
                    if let Some(object) = self.segments.remove(v.object_key) {
                        if self.spill.is_some() {
                            let rows = self.objects.get(object).expect("live").rows.clone();
                            self.spill_object(object, &rows);
                        }
                        self.release_object(object);
                    }
                }
            }
        }
        self.free_host_pages() - before
    }

    /// Device pages and slab rows to bring back the host-only part of a
    /// locked lookup, top-down. The pages are held by the caller until it
    /// inserts them. An empty plan (a counted miss) when the device has no
    /// room even after eviction.
    pub fn plan_load(&mut self, node: NodeId) -> Result<LoadPlan> {
        if self.host.tree().node(node).is_none() {
            return Err(TierError::Tree(cpkv_evict::EvictError::UnknownNode(node)));
        }
        if !self.lookup_locks.contains_key(&node) {
            return Err(TierError::NotLocked(node));
        }
        let mut path = Vec::new();
        let mut at = node;
        loop {
            let n = self.host.tree().node(at).expect("live path");
            if n.is_root() || n.on_device() {
                break;
            }
            path.push(at);
            at = n.parent().expect("non-root");
        }
        path.reverse();
        let total: usize = path.iter().map(|&id| self.node_pages(id)).sum();
        if total == 0 {
            return Ok(LoadPlan::default());
        }
        self.stats.loads += 1;
        let Some(pages) = self.allocate(total as u64) else {
            self.stats.load_misses += 1;
            return Ok(LoadPlan::default());
        };
        self.stats.loaded_pages += total as u64;
        let mut runs = Vec::with_capacity(path.len());
        let mut offset = 0;
        for id in path {
            let len = self.node_pages(id);
            runs.push(LoadRun {
                node: id,
                device_pages: pages[offset..offset + len].to_vec(),
                host_pages: self.host_rows(id)?,
            });
            offset += len;
        }
        Ok(LoadPlan { runs })
    }

    /// Caches the whole pages of `tokens` on `pages` (one per page, each
    /// held by the caller or already the tree's own page at that position),
    /// then reserves write-through backups for the path's nodes that have
    /// none, top-down.
    pub fn insert(
        &mut self,
        tokens: &[Token],
        pages: &[PageId],
        namespace: &Namespace,
    ) -> Result<InsertOutcome> {
        self.device.check(pages, false)?;
        let result = self.host.tree_mut().insert(tokens, pages, namespace)?;
        let path = self.path(result.node);
        let mut tree_pages = Vec::with_capacity(pages.len());
        for &id in &path {
            let n = self.host.tree().node(id).expect("live path");
            tree_pages.extend_from_slice(n.device_pages().expect("inserted path is on device"));
        }
        let mut freed = Vec::new();
        for (i, &page) in pages.iter().enumerate() {
            if self.device.is_held(page) {
                if tree_pages.get(i) == Some(&page) {
                    self.device.adopt(page);
                } else {
                    freed.push(page);
                }
            }
        }
        self.device.release_held(&freed);
        let (backups, skipped_pages) = self.reserve_backups(&path);
        self.note_backup_keys(tokens, namespace, &backups);
        Ok(InsertOutcome {
            node: result.node,
            cached_pages: result.cached,
            freed_pages: freed,
            backups,
            skipped_pages,
        })
    }

    /// Commits every pending backup with a ticket up to `frontier` (the MIN
    /// over ranks of each rank's completed-backup frontier), in ticket order.
    pub fn commit(&mut self, frontier: u64) -> Result<CommitOutcome> {
        if frontier > self.issued {
            return Err(TierError::FutureTicket {
                frontier,
                issued: self.issued,
            });
        }
        self.stats.commits += 1;
        let mut outcome = CommitOutcome::default();
        let due: Vec<u64> = self.pending.range(..=frontier).map(|(&t, _)| t).collect();
        for ticket in due {
            let p = self.pending.remove(&ticket).expect("due");
            self.pending_nodes.remove(&p.node);
            // The node and the pieces split off above it, top-down.
            let mut pieces = vec![p.node];
            let mut at = p.node;
            while self.host.tree().node(at).expect("locked").depth() as u64 > p.start_depth {
                at = self
                    .host
                    .tree()
                    .node(at)
                    .expect("locked")
                    .parent()
                    .expect("piece");
                pieces.push(at);
            }
            pieces.reverse();
            let top_parent = self
                .host
                .tree()
                .node(pieces[0])
                .and_then(|n| n.parent())
                .expect("piece");
            let parent = self.host.tree().node(top_parent).expect("live");
            let parent_backed = parent.is_root() || parent.on_host();
            self.host.release(p.pin);
            if !parent_backed {
                self.release_object(p.object);
                self.stats.backups_aborted += 1;
                outcome.aborted.push(ticket);
                continue;
            }
            // A piece split off above the node may have been backed up on its
            // own meanwhile (a path that ends inside the node): keep that copy.
            pieces.retain(|&id| !self.host.tree().node(id).expect("live").on_host());
            if pieces.is_empty() {
                self.release_object(p.object);
                self.stats.backups_aborted += 1;
                outcome.aborted.push(ticket);
                continue;
            }
            for piece in pieces {
                let key = self.fresh_key();
                let depth = self.host.tree().node(piece).expect("live").depth() as u64;
                self.host
                    .tree_mut()
                    .set_host(piece, key)
                    .expect("top-down, fresh key");
                self.segments.insert(
                    key,
                    Segment {
                        object: p.object,
                        object_offset: depth - p.start_depth,
                        start_depth: depth,
                    },
                );
            }
            self.objects.mark_committed(p.object);
            self.stats.backups_committed += 1;
            outcome.committed.push(ticket);
        }
        self.committed_through = self.committed_through.max(frontier);
        Ok(outcome)
    }

    /// Aborts every pending backup (a transfer ran out of time on some rank,
    /// concluded together): objects released, nodes unlocked, newest first.
    pub fn abort_pending(&mut self) -> Vec<u64> {
        let tickets: Vec<u64> = self.pending.keys().rev().copied().collect();
        for &ticket in &tickets {
            let p = self.pending.remove(&ticket).expect("listed");
            self.pending_nodes.remove(&p.node);
            self.host.release(p.pin);
            self.release_object(p.object);
            self.stats.backups_aborted += 1;
        }
        tickets
    }

    /// Every invariant, recomputed; returns what is wrong.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.host.check()?;
        if self.digest() != self.digest_from_scratch() {
            return Err("incremental digest differs from a recomputation".into());
        }
        let accounted = self.device.free_pages()
            + self.device.held_pages()
            + self.host.tree().device_pages() as u64;
        if accounted != self.config.device_pages {
            return Err(format!(
                "device pages not conserved: {} free + {} held + {} in the tree != {}",
                self.device.free_pages(),
                self.device.held_pages(),
                self.host.tree().device_pages(),
                self.config.device_pages
            ));
        }
        let mut used = 0u64;
        let object = |key: u64| {
            self.objects
                .get(key)
                .ok_or_else(|| format!("host object {key} is not live"))
        };
        for (key, _) in self.segments.object_refs() {
            let o = object(key)?;
            if !o.committed {
                return Err(format!("segment object {key} is not committed"));
            }
            used += o.rows.len() as u64;
        }
        for p in self.pending.values() {
            let o = object(p.object)?;
            if o.committed {
                return Err(format!("pending object {} is committed", p.object));
            }
            used += o.rows.len() as u64;
            if self.host.tree().node(p.node).map_or(0, |n| n.pins()) == 0 {
                return Err(format!("pending node {} is not locked", p.node));
            }
        }
        if used + self.free_host_pages() != self.config.host_pages
            || self.host.rows().used() != used
            || self.objects.len() != self.segments.objects() + self.pending.len()
        {
            return Err("host pages not conserved between segments, pending and free".into());
        }
        for (_, s) in self.segments.iter() {
            if !self.objects.contains(s.object) {
                return Err(format!("segment points at released object {}", s.object));
            }
        }
        Ok(())
    }

    // ---- internals -----------------------------------------------------

    pub(crate) fn spill_state(&self) -> &Option<SpillState> {
        &self.spill
    }
    pub(crate) fn spill_state_mut(&mut self) -> &mut Option<SpillState> {
        &mut self.spill
    }
    /// (host object, depth of its first page) of pending backup `ticket`.
    pub(crate) fn pending_object(&self, ticket: u64) -> (u64, u64) {
        let p = &self.pending[&ticket];
        (p.object, p.start_depth)
    }

    /// Frees a host object's rows in the host core's allocator.
    fn release_object(&mut self, object: u64) {
        self.forget_object_keys(object);
        self.objects.remove(object);
        self.host
            .rows_mut()
            .release(object)
            .expect("a live host object has an allocator object");
    }

    fn fresh_key(&mut self) -> u64 {
        let key = self.next_key;
        self.next_key += 1;
        key
    }

    fn node_pages(&self, id: NodeId) -> usize {
        self.host.tree().node(id).expect("live").tokens().len() / self.config.page_size
    }

    /// Non-root nodes from the root down to `node`.
    fn path(&self, node: NodeId) -> Vec<NodeId> {
        let mut path = Vec::new();
        let mut at = node;
        while let Some(n) = self.host.tree().node(at) {
            if n.is_root() {
                break;
            }
            path.push(at);
            at = n.parent().expect("non-root");
        }
        path.reverse();
        path
    }

    /// Reserves one backup per path node below the deepest node that is
    /// backed up or pending, top-down; stops at the first that cannot fit.
    fn reserve_backups(&mut self, path: &[NodeId]) -> (Vec<Backup>, usize) {
        let first = path
            .iter()
            .rposition(|id| {
                self.host.tree().node(*id).expect("live").on_host()
                    || self.pending_nodes.contains_key(id)
            })
            .map_or(0, |i| i + 1);
        let mut backups = Vec::new();
        for (i, &node) in path[first..].iter().enumerate() {
            let num_pages = self.node_pages(node) as u64;
            if !self.admit(num_pages) {
                let skipped: usize = path[first + i..]
                    .iter()
                    .map(|&id| self.node_pages(id))
                    .sum();
                self.stats.backups_skipped += (path.len() - first - i) as u64;
                self.stats.skipped_pages += skipped as u64;
                return (backups, skipped);
            }
            let object = self.fresh_key();
            let rows = self
                .host
                .rows_mut()
                .reserve(object, num_pages)
                .expect("a fresh object key")
                .expect("admitted");
            let host_pages = rows.iter().map(|&r| u64::from(r)).collect();
            self.objects.insert(object, rows);
            self.host.tree_mut().lock(node).expect("live non-root");
            let pin = self.host.pin(vec![node], 1, Vec::new());
            self.issued += 1;
            let ticket = self.issued;
            let n = self.host.tree().node(node).expect("live");
            self.pending.insert(
                ticket,
                Pending {
                    node,
                    object,
                    pin,
                    start_depth: n.depth() as u64,
                },
            );
            self.pending_nodes.insert(node, ticket);
            self.stats.backups_reserved += 1;
            self.stats.backup_pages += num_pages;
            backups.push(Backup {
                ticket,
                node,
                device_pages: n.device_pages().expect("on device").to_vec(),
                host_pages,
            });
        }
        (backups, 0)
    }

    /// Write admission: gated on the hard deficit only; when there is one,
    /// evicts toward the free-room target, best effort. A backup that fits
    /// is never refused.
    fn admit(&mut self, num_pages: u64) -> bool {
        let free = self.free_host_pages();
        if num_pages <= free {
            return true;
        }
        self.stats.admission_evictions += 1;
        let target = num_pages.max(self.config.host_free_target);
        self.evict_host(target);
        num_pages <= self.free_host_pages()
    }
}
