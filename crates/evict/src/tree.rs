//! The replicated prefix tree: page-granular radix tree, two residency tiers,
//! a logical clock and an incrementally maintained evictable index.
//!
//! Invariants (checked by `check_invariants` in `invariants`, exercised by
//! the model tests):
//! - every non-root node is on device, on host, or both;
//! - the device set and the host set are each closed towards the root (a
//!   node's parent is a root or holds the same tier), so evicting a device
//!   leaf never strands a descendant and a node without a host copy that
//!   leaves the device has no children and leaves the tree;
//! - the index holds exactly the unlocked device leaves (no child on device)
//!   and the unlocked host-only nodes without children, keyed by the policy.
//!
//! Every public mutating call validates first and changes nothing when it
//! fails; when it succeeds it advances the clock by exactly one.

mod following;
mod invariants;
mod rebuild;

pub(crate) use following::RankingChooser;
pub(crate) use rebuild::Decoded;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::arena::NodeArena;

use crate::child_key::child_word;
use crate::clock::{LogicalClock, Stamp};
use crate::digest::{namespace_hash, node_hash, tokens_hash};
use crate::error::EvictError;
use crate::events::Event;
use crate::evictable::{EvictableIndex, PolicyKey};
use crate::ghost_history::{content_key, GhostHistory, Weights};
use crate::ids::{HostKey, NodeId, PageId, Tier, Token};
use crate::namespace::Namespace;
pub use crate::namespace::IDLE_ROOTS_KEPT;
use crate::node::{Children, Node};
use crate::page_set::PageSet;
use crate::policy::Policy;
use crate::queue_shared::{Choice, Slot};
use crate::queues::QueueState;
use crate::ranking::Ranking;
use cpkv_hash::Hasher64;

/// What a policy keeps beyond the live nodes of the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PolicyMemory {
    /// Pages of dropped content remembered (ghost history or ghost lists).
    pub remembered_pages: usize,
    /// Nodes of the shadow trees (`Policy::Ghost`).
    pub shadow_nodes: usize,
    /// Device pages the shadow trees hold plus the pages they remember.
    pub shadow_pages: usize,
}

/// What `match_prefix` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchResult {
    /// Tokens matched by nodes on device (a multiple of the page size).
    pub length: usize,
    /// The device pages along the device-matched path, in order.
    pub device_pages: Vec<PageId>,
    /// Tokens matched counting host-only nodes too (what a load-back brings).
    pub host_length: usize,
    /// Deepest node of the device match (the namespace root if none).
    pub node: NodeId,
    /// Deepest node of the whole match, host-only nodes included.
    pub host_node: NodeId,
}

/// What `insert` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsertResult {
    /// The node that ends at the last inserted page (the root if no page).
    pub node: NodeId,
    /// Leading pages that were already on device: the caller frees its copies.
    pub cached: usize,
}

/// A node whose device pages were freed, in eviction order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceVictim {
    pub node: NodeId,
    pub pages: Vec<PageId>,
}

/// A host-only node dropped from the tree, in eviction order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostVictim {
    pub node: NodeId,
    pub object_key: HostKey,
    pub num_pages: usize,
    /// True when no other node still refers to the object (a split node's
    /// halves share their object): the allocator may release it.
    pub released: bool,
}

#[derive(Debug, Clone)]
pub struct PrefixTree {
    page_size: usize,
    policy: Policy,
    clock: LogicalClock,
    nodes: NodeArena,
    roots: BTreeMap<Namespace, NodeId>,
    root_names: BTreeMap<NodeId, Namespace>,
    /// Roots without children or locks, with the clock when they became so;
    /// beyond `IDLE_ROOTS_KEPT` the longest idle one leaves the tree, so a
    /// stream of one-off namespaces does not grow it.
    idle_roots: BTreeMap<NodeId, Stamp>,
    idle_order: BTreeSet<(Stamp, NodeId)>,
    /// Wrapping sum of the idle roots' hashes.
    idle_digest: u64,
    index: EvictableIndex,
    /// Wrapping sum of the live nodes' digest terms.
    digest_sum: u64,
    /// Device pages held by the tree.
    live_pages: PageSet,
    /// Nodes referring to each host object.
    host_refs: BTreeMap<HostKey, usize>,
    host_pages: usize,
    /// Device pages of locked nodes (a lock covers its node's path): what
    /// no eviction can free until they are unlocked.
    locked_device_pages: usize,
    /// How far back the cache currently reaches, which scales
    /// `Policy::Ghost`'s weights: the latest position among device victims,
    /// a victim's position being its priority or, if later, its last access
    /// (one-shot content sits behind its access, on probation).
    floor: Stamp,
    /// Content dropped from the tree, for policies that remember it.
    ghost: GhostHistory,
    /// Queues and ghost lists of the queue policies (`Policy::Arc`, `S3fifo`).
    queues: QueueState,
    /// The layer a `Policy::Ghost` tree follows: its shadow caches (none
    /// in a shadow itself).
    chooser: Option<Box<dyn RankingChooser>>,
    /// The ranking `chooser` names now (`Ranking::Priority` without one).
    leader: Ranking,
    /// In a shadow: the ranking it always uses.
    fixed_ranking: Option<Ranking>,
    events: VecDeque<Event>,
    event_limit: usize,
    dropped_events: u64,
    /// Every policy's victim loses only what an eviction still needs, cut
    /// from its tail (`set_trim_tails`); off: only `keeps_head`'s rule.
    trim_tails: bool,
}

/// The largest page size a tree accepts, in tokens: the one limit the
/// binding, the tier's config and the snapshot decoder all check.
pub const MAX_PAGE_SIZE: usize = 1 << 20;

/// Residency events buffered until `take_events` unless a caller asks for
/// more: none, as nothing in cpkv reads them and each costs a copy of its
/// pages. A caller that drains them sets a limit (`set_event_limit`); beyond
/// it the oldest are dropped and counted, so one that stops draining stays
/// bounded.
pub const DEFAULT_EVENT_LIMIT: usize = 0;

/// One step of a read-only walk: a node and how many of its pages matched
/// (fewer than all only for the last step).
#[derive(Debug, Clone, Copy)]
struct Step {
    id: NodeId,
    matched: usize,
    pages: usize,
}

impl PrefixTree {
    pub(crate) fn without_chooser(page_size: usize, policy: Policy) -> Result<Self, EvictError> {
        if page_size == 0 || page_size > MAX_PAGE_SIZE {
            return Err(EvictError::InvalidTokens(format!(
                "page_size must be in [1, {MAX_PAGE_SIZE}], got {page_size}"
            )));
        }
        Ok(Self {
            page_size,
            policy,
            clock: LogicalClock::default(),
            nodes: NodeArena::default(),
            roots: BTreeMap::new(),
            root_names: BTreeMap::new(),
            idle_roots: BTreeMap::new(),
            idle_order: BTreeSet::new(),
            idle_digest: 0,
            index: EvictableIndex::default(),
            digest_sum: 0,
            live_pages: PageSet::default(),
            host_refs: BTreeMap::new(),
            host_pages: 0,
            locked_device_pages: 0,
            floor: 0,
            ghost: GhostHistory::default(),
            queues: QueueState::new(policy),
            chooser: None,
            leader: Ranking::Priority,
            fixed_ranking: None,
            events: VecDeque::new(),
            event_limit: DEFAULT_EVENT_LIMIT,
            dropped_events: 0,
            trim_tails: false,
        })
    }

    // ---- queries -------------------------------------------------------

    pub fn page_size(&self) -> usize {
        self.page_size
    }
    pub fn policy(&self) -> Policy {
        self.policy
    }
    pub fn clock(&self) -> Stamp {
        self.clock.now()
    }
    /// Live nodes, namespace roots included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.nodes.len() == 0
    }
    /// Node slots ever used: the high-water mark of live nodes, which bounds
    /// the tree's node storage.
    pub fn node_slots(&self) -> usize {
        self.nodes.slots()
    }
    /// Namespace roots currently in the tree.
    pub fn namespaces(&self) -> usize {
        self.roots.len()
    }
    pub fn device_pages(&self) -> usize {
        self.live_pages.len()
    }
    pub fn host_pages(&self) -> usize {
        self.host_pages
    }
    /// The ghost history's reuse mix (for the lean candidates' model tests).
    #[cfg(test)]
    pub(crate) fn reuse_pages(&self) -> (u64, u64) {
        self.ghost.reuse_pages()
    }
    /// Pages of dropped content the ghost history remembers (`Policy::Ghost`).
    pub fn remembered_pages(&self) -> usize {
        self.ghost.pages() + self.queues.remembered_pages() as usize
    }
    /// For `Policy::Ghost`, the ranking it follows now: its own `priority`,
    /// `recency`, `segmented`, `arc` or `s3fifo` (see `shadow.rs`).
    pub fn following(&self) -> Option<&'static str> {
        self.chooser.as_ref().map(|s| s.leader().name())
    }

    /// What the policy keeps beyond the live nodes (all bounded by a
    /// constant times the most pages the tree has held).
    pub fn policy_memory(&self) -> PolicyMemory {
        let (shadow_nodes, shadow_pages) = self.chooser.as_ref().map_or((0, 0), |s| s.memory());
        PolicyMemory {
            remembered_pages: self.remembered_pages(),
            shadow_nodes,
            shadow_pages,
        }
    }
    pub fn evictable(&self, tier: Tier) -> usize {
        self.index.len(tier)
    }
    /// Device pages under a lock (a locked node's, its ancestors').
    pub fn locked_device_pages(&self) -> usize {
        self.locked_device_pages
    }

    /// Read-only: the device pages that locking the end of each of `paths`
    /// (a namespace's tokens, whole pages, as `match_prefix` would find
    /// them) would add to `locked_device_pages`. So a caller can tell
    /// whether an eviction would free enough before it changes anything.
    pub fn pages_locking_adds(&self, paths: &[(&[Token], &Namespace)]) -> usize {
        // Per unlocked node, the most of its head pages any path covers:
        // paths share a node only through its head.
        let mut covered: BTreeMap<NodeId, usize> = BTreeMap::new();
        for &(tokens, namespace) in paths {
            let Some(&root) = self.roots.get(namespace) else {
                continue;
            };
            for step in self.walk(root, tokens) {
                let node = self.node_ref(step.id);
                if node.locks == 0 && node.device.is_some() {
                    let pages = covered.entry(step.id).or_default();
                    *pages = (*pages).max(step.matched);
                }
            }
        }
        covered.values().sum()
    }
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id)
    }
    pub fn root(&self, namespace: &Namespace) -> Option<NodeId> {
        self.roots.get(namespace).copied()
    }
    /// Namespace roots, in namespace order.
    pub(crate) fn roots(&self) -> impl Iterator<Item = (&Namespace, NodeId)> + '_ {
        self.roots.iter().map(|(ns, id)| (ns, *id))
    }
    /// The children of `id` (none if it is not live), in no particular order.
    pub fn children(&self, id: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        let entries = self.node(id).map(|n| n.children.entries());
        entries
            .into_iter()
            .flatten()
            .map(|(_, child)| child)
            .filter(|&child| self.nodes.is_live(child))
    }

    /// Live nodes in slot order (the same on every replica).
    pub fn nodes(&self) -> impl Iterator<Item = &Node> + '_ {
        self.nodes.iter()
    }
    /// The index of `tier` in eviction order.
    pub fn eviction_order(&self, tier: Tier) -> Vec<NodeId> {
        self.index.iter(tier).map(|(_, id)| *id).collect()
    }

    /// The digest of the replicated state; O(1).
    pub fn digest(&self) -> u64 {
        self.seal(self.digest_sum)
    }

    /// The digest recomputed from every node (for checks): equals `digest`.
    pub fn digest_from_scratch(&self) -> u64 {
        let sum = self
            .nodes()
            .map(|n| node_hash(n, n.tokens_hash))
            .fold(0u64, u64::wrapping_add);
        self.seal(sum)
    }

    fn seal(&self, sum: u64) -> u64 {
        let h = Hasher64::default()
            .word(sum)
            .word(self.clock.now())
            .word(self.page_size as u64)
            .word(
                Policy::ALL
                    .iter()
                    .position(|p| *p == self.policy)
                    .unwrap_or(0) as u64,
            )
            .word(self.nodes.digest())
            .word(self.idle_digest)
            .word(self.floor)
            .word(self.ghost.digest());
        // Only the queue policies add a word: other policies' digests stay as pinned.
        let h = match self.queues.digest() {
            Some(queues) => h.word(queues),
            None => h,
        };
        match &self.chooser {
            Some(chooser) => h.word(chooser.digest()),
            None => h,
        }
        .finish()
    }

    /// Drains the residency events since the last call (at most the event
    /// limit: older ones were dropped, see `dropped_events`).
    pub fn take_events(&mut self) -> Vec<Event> {
        self.events.drain(..).collect()
    }

    /// Bounds the event buffer to `limit` events (0 records none); events
    /// beyond it drop the oldest. Events are not replicated state.
    pub fn set_event_limit(&mut self, limit: usize) {
        self.event_limit = limit;
        while self.events.len() > limit {
            self.events.pop_front();
            self.dropped_events += 1;
        }
    }
    pub fn event_limit(&self) -> usize {
        self.event_limit
    }

    /// With `on`, a device victim of every policy but `Policy::Ghost` that
    /// holds more pages than an eviction still needs loses only that many,
    /// from its tail (an engine's host index, where a call needs a few rows
    /// and a victim chain may be long). Ghost cuts tails by its own rule
    /// (`keeps_head`) either way, as it does with the option off (the
    /// default). A setting of this object, like the event limit: not in its
    /// digest or snapshot.
    pub fn set_trim_tails(&mut self, on: bool) {
        self.trim_tails = on;
    }
    pub fn trims_tails(&self) -> bool {
        self.trim_tails
    }
    /// Events dropped because the buffer was full, since the tree was made.
    pub fn dropped_events(&self) -> u64 {
        self.dropped_events
    }

    /// Records the event `event` builds; with a limit of 0 it is counted as
    /// dropped and never built.
    fn record(&mut self, event: impl FnOnce() -> Event) {
        if self.events.len() == self.event_limit {
            self.dropped_events += 1;
            if self.event_limit == 0 {
                return;
            }
            self.events.pop_front();
        }
        self.events.push_back(event());
    }

    // ---- the engine's calls --------------------------------------------

    /// Longest cached prefix of the whole pages of `tokens`; stamps and
    /// counts a hit on every matched node. A match ending inside a node
    /// splits it there, so `node` ends exactly at the match.
    pub fn match_prefix(&mut self, tokens: &[Token], namespace: &Namespace) -> MatchResult {
        self.match_steps(tokens, namespace, 0).0
    }

    /// `match_prefix`, with the path it matched (split at its end); the
    /// result's page list has room for at least `room` pages.
    fn match_steps(
        &mut self,
        tokens: &[Token],
        namespace: &Namespace,
        room: usize,
    ) -> (MatchResult, Vec<Step>) {
        let now = self.clock.tick();
        let root = self.ensure_root(namespace, now);
        let mut steps = self.walk(root, tokens);
        self.split_last(&mut steps);
        let matched: usize = steps.iter().map(|s| s.matched).sum();
        let mut result = MatchResult {
            length: 0,
            device_pages: Vec::with_capacity(matched.max(room)),
            host_length: 0,
            node: root,
            host_node: root,
        };
        let mut on_device = true;
        let remembers = self.remembers();
        for step in &steps {
            let (policy, floor, weights) = (self.policy, self.floor, self.weights());
            let queued = self.queues.hit(self.node_ref(step.id).queue_slot);
            self.update(step.id, |n| {
                n.hits += 1;
                access(n, policy, now, floor, weights, queued);
            });
            if remembers && on_device && self.node_ref(step.id).on_device() {
                self.ghost.note_hit(step.matched);
            }
            let node = self.node_ref(step.id);
            match (&node.device, on_device) {
                (Some(pages), true) => {
                    result.device_pages.extend_from_slice(pages);
                    result.length += step.matched * self.page_size;
                    result.node = step.id;
                }
                _ => on_device = false,
            }
            result.host_length += step.matched * self.page_size;
            result.host_node = step.id;
        }
        (result, steps)
    }

    /// Caches the whole pages of `tokens` with one page id per page. Pages of
    /// host-only nodes on the path are attached (a recompute is as good as a
    /// load-back); pages already on device are reported in `cached`.
    pub fn insert(
        &mut self,
        tokens: &[Token],
        pages: &[PageId],
        namespace: &Namespace,
    ) -> Result<InsertResult, EvictError> {
        let whole_pages = tokens.len() / self.page_size;
        if pages.len() != whole_pages {
            return Err(EvictError::PageCountMismatch {
                pages: pages.len(),
                whole_pages,
                page_size: self.page_size,
            });
        }
        let tokens = &tokens[..whole_pages * self.page_size];
        let steps = match self.roots.get(namespace) {
            Some(&root) => self.walk(root, tokens),
            None => Vec::new(),
        };
        // Validate the pages the tree would adopt before touching anything.
        let mut adopted = Vec::with_capacity(pages.len());
        let mut offset = 0;
        for step in &steps {
            if !self.node_ref(step.id).on_device() {
                adopted.extend_from_slice(&pages[offset..offset + step.matched]);
            }
            offset += step.matched;
        }
        adopted.extend_from_slice(&pages[offset..]);
        self.check_new_pages(&adopted)?;
        Ok(self.insert_along(steps, tokens, pages, namespace))
    }

    /// `insert` once its pages are checked, along `steps`, the walk of
    /// `tokens` from the namespace's root (if it has one).
    fn insert_along(
        &mut self,
        mut steps: Vec<Step>,
        tokens: &[Token],
        pages: &[PageId],
        namespace: &Namespace,
    ) -> InsertResult {
        let whole_pages = pages.len();
        let now = self.clock.tick();
        let root = self.ensure_root(namespace, now);
        self.split_last(&mut steps);
        let mut cached = 0;
        let mut offset = 0;
        let mut at = root;
        for step in &steps {
            let span = offset..offset + step.matched;
            if self.node_ref(step.id).on_device() {
                cached += step.matched;
                let (policy, floor, weights) = (self.policy, self.floor, self.weights());
                // An insert over cached content is no hit: a queue policy's
                // state stays as it is.
                let queued = self
                    .queues
                    .is_on()
                    .then(|| self.node_ref(step.id).queue_slot);
                self.update(step.id, |n| access(n, policy, now, floor, weights, queued));
            } else {
                self.attach(step.id, pages[span.clone()].to_vec(), now);
            }
            offset = span.end;
            at = step.id;
        }
        if offset < whole_pages {
            at = self.create_leaf(
                at,
                &tokens[offset * self.page_size..],
                &pages[offset..],
                now,
            );
        }
        self.show_chooser(tokens, namespace);
        InsertResult { node: at, cached }
    }

    /// A shadow's replay of one request of one-token pages, as an engine
    /// would make it (match, lock, evict just enough for `cap` device pages,
    /// insert with fresh ids from `next_page`, unlock): a replica of one of
    /// ghost's candidates, the model its lean cache is tested against. The
    /// insert follows the match's path instead of
    /// walking it again: locked, the path outlives the eviction, and the
    /// match stopped where no child goes on. Returns the pages matched.
    #[cfg(any(test, feature = "floor-measurements"))]
    pub(crate) fn replay(
        &mut self,
        pages: &[Token],
        namespace: &Namespace,
        cap: usize,
        next_page: &mut u64,
    ) -> usize {
        debug_assert_eq!(self.page_size, 1);
        // The match's page list takes the fresh ids too.
        let (m, steps) = self.match_steps(pages, namespace, pages.len());
        let matched = m.length;
        let new = pages.len() - matched;
        self.lock(m.node).expect("a match result is live");
        let room = cap.saturating_sub(self.device_pages());
        if new > room {
            self.evict(new - room);
        }
        let keep = matched + new.min(cap.saturating_sub(self.device_pages()));
        let fresh = (keep - matched) as u64;
        let mut ids = m.device_pages;
        ids.extend(*next_page..*next_page + fresh);
        *next_page += fresh;
        if steps.iter().map(|s| s.matched).sum::<usize>() == matched {
            // Every matched node is on device: the pages to adopt are the
            // fresh ones, never handed out before.
            debug_assert!(self.check_new_pages(&ids[matched..]).is_ok());
            self.insert_along(steps, &pages[..keep], &ids, namespace);
        } else {
            self.insert(&pages[..keep], &ids, namespace)
                .expect("fresh page ids");
        }
        self.unlock(m.node).expect("locked above");
        matched
    }

    /// Locks `node` and its ancestors against eviction.
    pub fn lock(&mut self, node: NodeId) -> Result<(), EvictError> {
        self.node(node).ok_or(EvictError::UnknownNode(node))?;
        self.clock.tick();
        self.update(node, |n| {
            n.pins += 1;
            n.locks += 1;
        });
        self.update_ancestors(node, |n| n.locks += 1);
        Ok(())
    }

    /// Undoes one `lock(node)`; fails (changing nothing) if `node` itself
    /// holds no lock, even when a lock below it covers its path.
    pub fn unlock(&mut self, node: NodeId) -> Result<(), EvictError> {
        let n = self.node(node).ok_or(EvictError::UnknownNode(node))?;
        if n.pins == 0 {
            return Err(EvictError::LockUnderflow(node));
        }
        self.clock.tick();
        self.update(node, |n| {
            n.pins -= 1;
            n.locks -= 1;
        });
        self.update_ancestors(node, |n| n.locks -= 1);
        Ok(())
    }

    /// Frees device pages from device leaves in policy order until at least
    /// `num_pages` are freed or nothing is evictable. A victim with a host
    /// copy stays as host-only; one without leaves the tree. Under
    /// `Policy::Ghost` a victim holding at least twice the pages still needed
    /// loses only its tail (`keeps_head`): the head is what a returning
    /// request matches first. A device-only leaf without children is trimmed
    /// in place (it keeps its id); otherwise a split keeps the children or
    /// the host copy with the tail. With `set_trim_tails(true)` every other
    /// policy's victim holding more than is still needed loses only its last
    /// `need`.
    pub fn evict(&mut self, num_pages: usize) -> Vec<DeviceVictim> {
        self.clock.tick();
        // Every victim frees a page at least: growing the list as it filled
        // cost a sixth of a large call.
        let mut victims = Vec::with_capacity(num_pages.min(self.index.len(Tier::Device)));
        let mut freed = 0;
        while freed < num_pages {
            let Some(id) = self.next_device_victim() else {
                break;
            };
            let need = num_pages - freed;
            let held = self.node_ref(id).device.as_ref().map_or(0, Vec::len);
            // `need <= held / 2`, not `held >= 2 * need`: a huge count must not wrap.
            // Ghost keeps its own rule either way: cutting its victims exactly
            // cost it hits (`bench vllm`, synthetic trace at 6,022 blocks:
            // 0.343 -> 0.327) where the other policies gained or held.
            let cut = if self.trim_tails && self.policy != Policy::Ghost {
                need < held
            } else {
                self.keeps_head(id) && need <= held / 2
            };
            if cut {
                // Only the victim's last `need` pages leave (under ghost's own
                // rule, when that is at most half of it): its head stays a
                // leaf (same stamps) for a returning request to match first.
                if let Some(pages) = self.trim_tail(id, need) {
                    freed += pages.len();
                    victims.push(DeviceVictim { node: id, pages });
                    continue;
                }
                self.split(id, held - need);
            }
            let pages = self.evict_device(id);
            freed += pages.len();
            victims.push(DeviceVictim { node: id, pages });
        }
        victims
    }

    /// Takes the last `num_pages` device pages of `node` out of the tree:
    /// content that was placed but never written, which its owner takes
    /// back (a failed store). Only an unlocked device leaf without children
    /// or a host copy qualifies; `None`, changing nothing, otherwise.
    pub fn drop_tail(&mut self, node: NodeId, num_pages: usize) -> Option<Vec<PageId>> {
        let n = self.node(node)?;
        let held = n.device.as_ref().map_or(0, Vec::len);
        if n.is_root()
            || n.locks > 0
            || n.host.is_some()
            || !n.children.is_empty()
            || num_pages == 0
            || num_pages > held
        {
            return None;
        }
        self.clock.tick();
        if num_pages < held {
            return self.trim_tail(node, num_pages);
        }
        Some(self.evict_device(node))
    }

    /// Read-only: the node holding the last page of `tokens` (whole pages)
    /// in `namespace`, and whether that page is the node's last; `None`
    /// when the tree does not hold all of `tokens`.
    pub fn node_ending(&self, tokens: &[Token], namespace: &Namespace) -> Option<(NodeId, bool)> {
        let root = *self.roots.get(namespace)?;
        let steps = self.walk(root, tokens);
        let matched: usize = steps.iter().map(|s| s.matched).sum();
        let last = steps.last()?;
        (matched * self.page_size == tokens.len()).then_some((last.id, last.matched == last.pages))
    }

    /// Drops host-only leaves in policy order until at least `num_pages` host
    /// pages are dropped or nothing is evictable.
    pub fn evict_host(&mut self, num_pages: usize) -> Vec<HostVictim> {
        self.clock.tick();
        let mut victims = Vec::new();
        let mut dropped = 0;
        while dropped < num_pages {
            let Some(id) = self.index.first(Tier::Host) else {
                break;
            };
            let victim = self.drop_host_leaf(id);
            dropped += victim.num_pages;
            victims.push(victim);
        }
        victims
    }

    /// Records that `node` now has a host copy stored under `key`. Its parent
    /// must be a root or have a host copy (backups go top-down).
    pub fn set_host(&mut self, node: NodeId, key: HostKey) -> Result<(), EvictError> {
        let n = self.live_non_root(node)?;
        if n.host.is_some() {
            return Err(EvictError::InvalidTier {
                node,
                reason: "already has a host copy",
            });
        }
        let parent = self.node_ref(n.parent.expect("non-root"));
        if !parent.is_root() && parent.host.is_none() {
            return Err(EvictError::InvalidTier {
                node,
                reason: "its parent has no host copy (back up top-down)",
            });
        }
        if self.host_refs.contains_key(&key) {
            return Err(EvictError::HostKeyInUse(key));
        }
        let (start, num_pages) = (n.depth, n.pages(self.page_size));
        self.clock.tick();
        self.update(node, |n| n.host = Some(key));
        self.host_refs.insert(key, 1);
        self.host_pages += num_pages;
        self.record(|| Event::HostStored {
            node,
            start,
            num_pages,
            key,
        });
        Ok(())
    }

    /// Re-attaches device pages to a host-only node after a load-back. Its
    /// parent must be a root or on device (load-backs go top-down).
    pub fn attach_device(&mut self, node: NodeId, pages: &[PageId]) -> Result<(), EvictError> {
        let n = self.live_non_root(node)?;
        if n.device.is_some() {
            return Err(EvictError::InvalidTier {
                node,
                reason: "already on device",
            });
        }
        let parent = self.node_ref(n.parent.expect("non-root"));
        if !parent.is_root() && parent.device.is_none() {
            return Err(EvictError::InvalidTier {
                node,
                reason: "its parent is not on device (load back top-down)",
            });
        }
        let whole_pages = n.pages(self.page_size);
        if pages.len() != whole_pages {
            return Err(EvictError::PageCountMismatch {
                pages: pages.len(),
                whole_pages,
                page_size: self.page_size,
            });
        }
        self.check_new_pages(pages)?;
        let now = self.clock.tick();
        self.attach(node, pages.to_vec(), now);
        Ok(())
    }

    // ---- internals -----------------------------------------------------

    fn weights(&self) -> Weights {
        self.ghost.weights()
    }

    fn key_of(&self, node: &Node) -> PolicyKey {
        match self.policy {
            Policy::Ghost => self.ranking().key(node),
            policy => policy.key(node),
        }
    }

    /// Whether dropped content is remembered: for `Policy::Ghost`, except in
    /// its recency shadow, whose order uses neither the ghost priority nor
    /// remembered hits (a third less shadow memory, same decisions).
    fn remembers(&self) -> bool {
        self.policy.remembers_dropped() && self.fixed_ranking != Some(Ranking::Recency)
    }

    fn node_ref(&self, id: NodeId) -> &Node {
        self.node(id).expect("internal ids are live")
    }

    /// The child of `parent` whose first page is `page`.
    pub(crate) fn child(&self, parent: NodeId, page: &[Token]) -> Option<NodeId> {
        let first_page =
            |id| self.nodes.is_live(id) && &self.node_ref(id).tokens[..page.len()] == page;
        self.node_ref(parent)
            .children
            .find(child_word(page), first_page)
    }

    fn live_non_root(&self, id: NodeId) -> Result<&Node, EvictError> {
        let node = self.node(id).ok_or(EvictError::UnknownNode(id))?;
        if node.is_root() {
            return Err(EvictError::RootNode(id));
        }
        Ok(node)
    }

    /// Applies `change` (through `update`) to each of `id`'s ancestors,
    /// from its parent up: no list of the path is built.
    fn update_ancestors(&mut self, id: NodeId, change: impl Fn(&mut Node)) {
        let mut at = self.node_ref(id).parent;
        while let Some(id) = at {
            self.update(id, &change);
            at = self.node_ref(id).parent;
        }
    }

    fn check_new_pages(&self, pages: &[PageId]) -> Result<(), EvictError> {
        // Ascending ids (what pools and the shadows hand out) cannot repeat,
        // and neighbours are looked up a word at a time; otherwise a
        // `PageSet` (no SipHash) finds repeats page by page.
        let offender = if pages.windows(2).all(|w| w[0] < w[1]) {
            self.live_pages.first_held(pages)
        } else {
            let mut seen = PageSet::default();
            let mut fresh = |p: PageId| !self.live_pages.contains(p) && seen.insert(p);
            pages.iter().copied().find(|&p| !fresh(p))
        };
        match offender {
            Some(page) => Err(EvictError::PageInUse(page)),
            None => Ok(()),
        }
    }

    /// Read-only: the nodes the whole pages of `tokens` run through.
    fn walk(&self, root: NodeId, tokens: &[Token]) -> Vec<Step> {
        let ps = self.page_size;
        let total = tokens.len() / ps;
        let mut steps = Vec::new();
        let (mut at, mut done) = (root, 0);
        while done < total {
            let Some(child) = self.child(at, &tokens[done * ps..(done + 1) * ps]) else {
                break;
            };
            let node = self.node_ref(child);
            let pages = node.pages(ps);
            // The first page was matched by `child`; the first token that
            // differs after it ends the match at its page.
            let limit = pages.min(total - done);
            let rest = &tokens[(done + 1) * ps..(done + limit) * ps];
            let matched = node.tokens[ps..limit * ps]
                .iter()
                .zip(rest)
                .position(|(a, b)| a != b)
                .map_or(limit, |k| 1 + k / ps);
            steps.push(Step {
                id: child,
                matched,
                pages,
            });
            done += matched;
            at = child;
            if matched < pages {
                break;
            }
        }
        steps
    }

    /// Splits the last step's node where the walk left it, so the path ends
    /// exactly at a node boundary.
    fn split_last(&mut self, steps: &mut [Step]) {
        if let Some(last) = steps.last_mut() {
            if last.matched < last.pages {
                last.id = self.split(last.id, last.matched);
                last.pages = last.matched;
            }
        }
    }

    fn ensure_root(&mut self, namespace: &Namespace, now: Stamp) -> NodeId {
        if let Some(&root) = self.roots.get(namespace) {
            return root;
        }
        let id = self.alloc(Node {
            id: NodeId(0),
            parent: None,
            tokens: Vec::new(),
            children: Children::default(),
            child_word: 0,
            device: None,
            host: None,
            device_children: 0,
            depth: 0,
            created: now,
            last_access: now,
            hits: 0,
            locks: 0,
            pins: 0,
            priority: 0,
            queue_slot: 0,
            tokens_hash: namespace_hash(namespace),
            digest_term: 0,
            indexed: None,
        });
        self.roots.insert(namespace.clone(), id);
        self.root_names.insert(id, namespace.clone());
        self.reap_idle_roots(id);
        id
    }

    /// Drops the longest idle roots beyond `IDLE_ROOTS_KEPT`, sparing `keep`.
    fn reap_idle_roots(&mut self, keep: NodeId) {
        while self.idle_roots.len() > IDLE_ROOTS_KEPT {
            let &(since, oldest) = self
                .idle_order
                .iter()
                .find(|(_, id)| *id != keep)
                .expect("more idle roots than one");
            self.set_idle(oldest, None);
            debug_assert!(since <= self.clock.now());
            self.detach(oldest);
            self.nodes.remove(oldest, 0, |_| ());
            let namespace = self.root_names.remove(&oldest).expect("named root");
            self.roots.remove(&namespace);
        }
    }

    /// Records whether root `id` is idle (since `since`), keeping its digest term.
    fn set_idle(&mut self, id: NodeId, since: Option<Stamp>) {
        if let Some(old) = self.idle_roots.remove(&id) {
            self.idle_order.remove(&(old, id));
            self.idle_digest = self.idle_digest.wrapping_sub(idle_term(id, old));
        }
        if let Some(since) = since {
            self.idle_roots.insert(id, since);
            self.idle_order.insert((since, id));
            self.idle_digest = self.idle_digest.wrapping_add(idle_term(id, since));
        }
    }

    /// Puts a fully built node into the arena under the next id.
    fn alloc(&mut self, node: Node) -> NodeId {
        let id = self.nodes.insert(node);
        self.reattach(id);
        id
    }

    fn create_leaf(
        &mut self,
        parent: NodeId,
        tokens: &[Token],
        pages: &[PageId],
        now: Stamp,
    ) -> NodeId {
        let p = self.node_ref(parent);
        let depth = p.depth + p.pages(self.page_size);
        let word = child_word(&tokens[..self.page_size]);
        // Content back from the ghost history resumes its hit count.
        let returned = if self.remembers() {
            self.ghost
                .take_back(content_key(parent, &tokens[..self.page_size]))
                .unwrap_or(0)
        } else {
            0
        };
        let buffer = self.nodes.token_buffer(tokens);
        let mut node = Node {
            id: NodeId(0),
            parent: Some(parent),
            tokens: buffer,
            children: Children::default(),
            child_word: word,
            device: Some(pages.to_vec()),
            host: None,
            device_children: 0,
            depth,
            created: now,
            last_access: now,
            hits: 1 + returned,
            locks: 0,
            pins: 0,
            priority: 0,
            queue_slot: 0,
            tokens_hash: tokens_hash(tokens),
            digest_term: 0,
            indexed: None,
        };
        // The access is stamped before the node is stored, so it is indexed
        // and hashed once; the queues see its pages as the stored node's
        // (in the queue of slot 0) while they place it, as they would after.
        let (policy, floor, weights) = (self.policy, self.floor, self.weights());
        self.queues.enter(0, pages.len());
        let queued = self
            .queues
            .created(content_key(parent, &tokens[..self.page_size]), pages.len());
        self.queues.leave(0, pages.len());
        access(&mut node, policy, now, floor, weights, queued);
        let id = self.alloc(node);
        self.live_pages.insert_all(pages);
        let (p, is_live) = self.nodes.live_mut_and_liveness(parent);
        p.children.insert(word, id, is_live);
        self.restructure(parent, |p| p.device_children += 1);
        self.record(|| Event::DeviceStored {
            node: id,
            start: depth,
            pages: pages.to_vec(),
        });
        id
    }

    /// Splits `id` after `at` pages. The new node takes the first `at` pages
    /// and becomes the parent; `id` keeps the rest and its children, so ids
    /// held by callers (locks, match results) keep naming the same suffix.
    fn split(&mut self, id: NodeId, at: usize) -> NodeId {
        let ps = self.page_size;
        let cut = at * ps;
        let upper_tokens = self.nodes.head_buffer(id, cut);
        let node = self.node_ref(id);
        let parent = node.parent.expect("roots are never split");
        let lower_word = child_word(&node.tokens[cut..cut + ps]);
        let upper = Node {
            id: NodeId(0),
            parent: Some(parent),
            tokens_hash: tokens_hash(&upper_tokens),
            tokens: upper_tokens,
            children: Children::one(lower_word, id),
            child_word: node.child_word,
            device: node.device.as_ref().map(|d| d[..at].to_vec()),
            host: node.host,
            device_children: usize::from(node.device.is_some()),
            depth: node.depth,
            created: node.created,
            last_access: node.last_access,
            hits: node.hits,
            // Path locks pass through the upper part; the caller's own lock
            // stays with the id it holds (the suffix).
            locks: node.locks,
            pins: 0,
            priority: node.priority,
            queue_slot: node.queue_slot,
            digest_term: 0,
            indexed: None,
        };
        let word = node.child_word;
        if let Some(host) = node.host {
            *self.host_refs.get_mut(&host).expect("recorded") += 1;
        }
        let upper = self.alloc(upper);
        self.update(id, |n| {
            n.tokens.drain(..cut);
            n.tokens_hash = tokens_hash(&n.tokens);
            n.child_word = lower_word;
            if let Some(d) = n.device.as_mut() {
                d.drain(..at);
            }
            n.parent = Some(upper);
            n.depth += at;
        });
        // The upper part takes the node's place under the same first page.
        let (p, is_live) = self.nodes.live_mut_and_liveness(parent);
        p.children.remove(word, id);
        p.children.insert(word, upper, is_live);
        self.restructure(parent, |_| {});
        upper
    }

    fn attach(&mut self, id: NodeId, pages: Vec<PageId>, now: Stamp) {
        let node = self.node_ref(id);
        let (parent, start) = (node.parent.expect("non-root"), node.depth);
        self.live_pages.insert_all(&pages);
        self.record(|| Event::DeviceStored {
            node: id,
            start,
            pages: pages.clone(),
        });
        let (policy, floor, weights) = (self.policy, self.floor, self.weights());
        let queued = self
            .queues
            .reloaded(self.node_ref(id).queue_slot, pages.len());
        self.update(id, |n| {
            n.device = Some(pages);
            access(n, policy, now, floor, weights, queued);
        });
        self.restructure(parent, |p| p.device_children += 1);
    }

    /// Whether victim `id` keeps its head when it holds more than an eviction
    /// needs: under `Policy::Ghost`, except for one-shot content (ARC's T1)
    /// while the tree follows arc, which leaves whole as in ARC itself.
    fn keeps_head(&self, id: NodeId) -> bool {
        let one_shot = || Slot::unpack(self.node_ref(id).queue_slot).queue == 0;
        self.policy == Policy::Ghost && !(self.ranking() == Ranking::Arc && one_shot())
    }

    /// The policy's next device victim: the index's first leaf, or what a
    /// queue policy chooses once the nodes it moves on the way have moved.
    fn next_device_victim(&mut self) -> Option<NodeId> {
        loop {
            let nodes = &self.nodes;
            let slot_of = |id: NodeId| nodes.get(id).map_or(0, |n: &Node| n.queue_slot);
            match self.queues.choose(&self.index, slot_of)? {
                Choice::Evict(id) => return Some(id),
                Choice::Requeue(id, slot) => self.update(id, |n| n.queue_slot = slot),
            }
        }
    }

    /// Evicts the last `need` device pages of a childless, device-only leaf
    /// in place: the node keeps its id and stamps with the head, the tail is
    /// remembered as if it had been split off and dropped. `None` (nothing
    /// changed) when the leaf has children or a host copy: then a split
    /// keeps them with the tail.
    fn trim_tail(&mut self, id: NodeId, need: usize) -> Option<Vec<PageId>> {
        let ps = self.page_size;
        let node = self.node_ref(id);
        if !node.children.is_empty() || node.host.is_some() {
            return None;
        }
        let keep = node.pages(ps) - need;
        let (start, hits) = (node.depth + keep, node.hits);
        let key = content_key(id, &node.tokens[keep * ps..(keep + 1) * ps]);
        self.floor = self.floor.max(node.last_access.min(node.order_word()));
        let mut tail = Vec::new();
        self.update(id, |n| {
            n.tokens.truncate(keep * ps);
            n.tokens_hash = tokens_hash(&n.tokens);
            tail = n.device.as_mut().expect("a device leaf").split_off(keep);
        });
        self.live_pages.remove_all(&tail);
        if self.remembers() {
            let cached = self.live_pages.len() + self.host_pages + need;
            self.ghost.record(key, hits, need, cached);
        }
        self.record(|| Event::DeviceRemoved {
            node: id,
            start,
            pages: tail.clone(),
        });
        Some(tail)
    }

    fn evict_device(&mut self, id: NodeId) -> Vec<PageId> {
        let node = self.node_ref(id);
        let (parent, start, has_host) =
            (node.parent.expect("non-root"), node.depth, node.on_host());
        self.floor = self.floor.max(node.last_access.min(node.order_word()));
        // Pages leave the live set first: the ghost history sizes itself by
        // what the tree holds once the victim is gone.
        let device = self.nodes.get(id).and_then(|n| n.device.as_ref());
        self.live_pages
            .remove_all(device.expect("indexed on device"));
        // The node's own page list becomes the victim's (no copy).
        let pages = if has_host {
            let mut pages = None;
            self.update(id, |n| pages = n.device.take());
            self.restructure(parent, |p| p.device_children -= 1);
            pages
        } else {
            debug_assert!(
                self.node_ref(id).children.is_empty(),
                "host set is closed to the root"
            );
            self.remove(id)
        }
        .expect("indexed on device");
        self.record(|| Event::DeviceRemoved {
            node: id,
            start,
            pages: pages.clone(),
        });
        pages
    }

    fn drop_host_leaf(&mut self, id: NodeId) -> HostVictim {
        let node = self.node_ref(id);
        let key = node.host.expect("indexed on host");
        let (start, num_pages) = (node.depth, node.pages(self.page_size));
        let refs = self.host_refs.get_mut(&key).expect("recorded");
        *refs -= 1;
        let released = *refs == 0;
        if released {
            self.host_refs.remove(&key);
        }
        self.host_pages -= num_pages;
        self.record(|| Event::HostRemoved {
            node: id,
            start,
            num_pages,
            key,
        });
        self.remove(id);
        HostVictim {
            node: id,
            object_key: key,
            num_pages,
            released,
        }
    }

    /// Takes a childless node out of the tree (into the ghost history, for
    /// policies that keep one) and hands back its device pages.
    fn remove(&mut self, id: NodeId) -> Option<Vec<PageId>> {
        self.detach(id);
        let ps = self.page_size;
        let (remembers, queued) = (self.remembers(), self.queues.is_on());
        // Every live node holds its pages on device or on host (or both).
        let held = (self.live_pages.len() + self.host_pages) * ps;
        let (parent, device, pages, hits, queue_slot, content) = self.nodes.remove(id, held, |n| {
            let parent = n.parent.expect("roots are never removed");
            // Hashed only for the histories that keep it.
            let content = (remembers || queued).then(|| content_key(parent, &n.tokens[..ps]));
            let device = n.device.take();
            (parent, device, n.pages(ps), n.hits, n.queue_slot, content)
        });
        let on_device = device.is_some();
        if remembers {
            let cached = self.live_pages.len() + self.host_pages + pages;
            let key = content.expect("hashed");
            self.ghost.record(key, hits, pages, cached);
        }
        if queued {
            let key = content.expect("hashed");
            self.queues.dropped(key, queue_slot, pages);
        }
        // `id` is dead now: it only counts itself out of its parent's children.
        let (p, is_live) = self.nodes.live_mut_and_liveness(parent);
        p.children.depart(is_live);
        self.restructure(parent, |p| {
            if on_device {
                p.device_children -= 1;
            }
        });
        device
    }

    /// The one way nodes change: take the node out of the digest and the
    /// index, apply `change`, and put it back with its new hash and key.
    fn update(&mut self, id: NodeId, change: impl FnOnce(&mut Node)) {
        self.detach(id);
        change(self.nodes.live_mut(id));
        self.reattach(id);
    }

    fn detach(&mut self, id: NodeId) {
        let node = self.nodes.live_mut(id);
        self.digest_sum = self.digest_sum.wrapping_sub(node.digest_term);
        let device = node.device.as_ref().map_or(0, Vec::len);
        self.queues.leave(node.queue_slot, device);
        if node.locks > 0 {
            self.locked_device_pages -= device;
        }
        if let Some((tier, key)) = node.indexed.take() {
            self.index.remove(tier, key, id);
        }
    }

    /// Changes only `id`'s children or its count of device children: they
    /// are in neither its digest term, its policy key nor its queue pages,
    /// so only whether it is evictable (and, for a root, idle) can change,
    /// and the node is not re-hashed.
    fn restructure(&mut self, id: NodeId, change: impl FnOnce(&mut Node)) {
        let node = self.nodes.live_mut(id);
        change(node);
        debug_assert!(node.digest_term == node_hash(node, node.tokens_hash));
        let tier = evictable_tier(node);
        if tier != node.indexed.map(|(tier, _)| tier) {
            if let Some((tier, key)) = node.indexed.take() {
                self.index.remove(tier, key, id);
            }
            if let Some(tier) = tier {
                let key = self.key_of(self.node_ref(id));
                self.nodes.live_mut(id).indexed = Some((tier, key));
                self.index.insert(tier, key, id);
            }
        }
        self.note_idle_root(id);
    }

    fn reattach(&mut self, id: NodeId) {
        // Only a root can be idle.
        if self.index_node(id) {
            self.note_idle_root(id);
        }
    }

    /// Whether root `id` is idle now (no children, no locks), when it is a root.
    fn note_idle_root(&mut self, id: NodeId) {
        let now = self.clock.now();
        let node = self.nodes.live_mut(id);
        if node.is_root() {
            let idle = node.children.is_empty() && node.locks == 0;
            match (idle, self.idle_roots.contains_key(&id)) {
                (true, false) => self.set_idle(id, Some(now)),
                (false, true) => self.set_idle(id, None),
                _ => {}
            }
        }
    }

    /// Puts a detached node's digest term, queue pages and index entry back;
    /// true when the node is a root.
    fn index_node(&mut self, id: NodeId) -> bool {
        let key = self.key_of(self.nodes.get(id).expect("internal ids are live"));
        let node = self.nodes.live_mut(id);
        node.digest_term = node_hash(node, node.tokens_hash);
        self.digest_sum = self.digest_sum.wrapping_add(node.digest_term);
        let device = node.device.as_ref().map_or(0, Vec::len);
        self.queues.enter(node.queue_slot, device);
        if node.locks > 0 {
            self.locked_device_pages += device;
        }
        let root = node.is_root();
        if let Some(tier) = evictable_tier(node) {
            node.indexed = Some((tier, key));
            self.index.insert(tier, key, id);
        }
        root
    }
}

fn idle_term(id: NodeId, since: Stamp) -> u64 {
    Hasher64::default().word(id.0).word(since).finish()
}

/// Stamps an access: the last-access time and the policy's priority, or
/// `queued`, a queue policy's new state for the node, when it has one.
fn access(
    node: &mut Node,
    policy: Policy,
    now: Stamp,
    floor: Stamp,
    weights: Weights,
    queued: Option<u64>,
) {
    node.last_access = now;
    match queued {
        Some(slot) => node.queue_slot = slot,
        None => node.priority = policy.priority(node, now, floor, weights),
    }
}

/// The tier a node is evictable from, if any.
fn evictable_tier(node: &Node) -> Option<Tier> {
    if node.is_root() || node.locks > 0 {
        None
    } else if node.device.is_some() {
        (node.device_children == 0).then_some(Tier::Device)
    } else {
        (node.host.is_some() && node.children.is_empty()).then_some(Tier::Host)
    }
}
