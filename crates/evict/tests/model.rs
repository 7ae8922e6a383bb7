//! Model-based test: random call sequences against a page-level model.
//!
//! The model is a map from (namespace, token prefix ending at page k) to the
//! page's residency; it knows nothing of nodes, splits or indexes. After every
//! step the tree's structural invariants, its incremental index and digest
//! (against from-scratch recomputation) and its residency map (against the
//! model) are checked; rejected calls must leave the digest unchanged.
//!
//! The model also keeps, page by page, what the classic policies rank by
//! (creation, last access and hit count on its own logical clock), and
//! checks that every victim is the evictable leaf that an independent
//! ranking of the policy's order puts first. For `arc` and `s3fifo` it runs
//! its own implementation of the two algorithms (`QueueModel`, written from
//! their definitions over the model's pages: queues, positions, the ARC
//! target, ghost lists) and checks every victim and every second chance
//! against it. `ghost`, whose order follows shadow caches, is checked only
//! for the structural properties (an unlocked leaf of the right tier).

use std::collections::{BTreeMap, VecDeque};

use cpkv_evict::{EvictError, Namespace, NodeId, Policy, PrefixTree, Sampling, Tier};
use proptest::prelude::*;

const PAGE: usize = 2;

#[derive(Debug, Clone)]
enum Op {
    Match {
        ns: u8,
        pages: Vec<u8>,
    },
    Insert {
        ns: u8,
        pages: Vec<u8>,
        reuse_live_page: bool,
    },
    Lock(usize),
    Unlock(usize),
    Evict(usize),
    EvictHost(usize),
    SetHost {
        pick: usize,
        key: u64,
    },
    Attach(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let pages = || prop::collection::vec(0u8..3, 0..6);
    prop_oneof![
        3 => (0u8..2, pages()).prop_map(|(ns, pages)| Op::Match { ns, pages }),
        4 => (0u8..2, pages(), prop::bool::weighted(0.1))
            .prop_map(|(ns, pages, reuse_live_page)| Op::Insert { ns, pages, reuse_live_page }),
        2 => (0usize..64).prop_map(Op::Lock),
        2 => (0usize..64).prop_map(Op::Unlock),
        2 => (0usize..6).prop_map(Op::Evict),
        1 => (0usize..6).prop_map(Op::EvictHost),
        2 => (0usize..64, 0u64..40).prop_map(|(pick, key)| Op::SetHost { pick, key }),
        1 => (0usize..64).prop_map(Op::Attach),
    ]
}

/// Traffic that keeps a queue policy busy: many distinct prefixes, repeat
/// matches and frequent evictions (queues fill, ghosts come back).
fn busy_op() -> impl Strategy<Value = Op> {
    let pages = || prop::collection::vec(0u8..5, 1..5);
    prop_oneof![
        4 => (0u8..1, pages()).prop_map(|(ns, pages)| Op::Match { ns, pages }),
        5 => (0u8..1, pages()).prop_map(|(ns, pages)| Op::Insert { ns, pages, reuse_live_page: false }),
        3 => (1usize..4).prop_map(Op::Evict),
        1 => (0usize..64, 0u64..40).prop_map(|(pick, key)| Op::SetHost { pick, key }),
        1 => (0usize..6).prop_map(Op::EvictHost),
        1 => (0usize..64).prop_map(Op::Attach),
    ]
}

type Prefix = (u8, Vec<u64>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PageState {
    device: Option<u64>,
    host: Option<u64>,
}

struct Harness {
    tree: PrefixTree,
    model: BTreeMap<Prefix, PageState>,
    /// Lock count of every page prefix (a lock covers its whole path).
    locks: BTreeMap<Prefix, u64>,
    /// Outstanding `lock` calls per node, named by the node's full prefix.
    pins: BTreeMap<Prefix, u64>,
    known: Vec<NodeId>,
    next_page: u64,
    /// The model's own logical clock: one tick per accepted call.
    clock: u64,
    /// What the classic policies rank by, per page prefix.
    stats: BTreeMap<Prefix, Stats>,
    /// `arc` and `s3fifo`, rebuilt independently.
    queues: Option<QueueModel>,
}

/// A queue policy's state of one page (all pages of a node agree).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct QPage {
    queue: u64,
    count: u64,
    seq: u64,
}

/// Content that left the tree: its parent's id and its first page.
type GhostKey = (NodeId, Vec<u64>);

/// ARC (Megiddo and Modha) or S3-FIFO (Yang et al.) as their papers define
/// them, over the model's pages, with the tree adaptations the policies
/// document: sizes are device pages (interior nodes count), only leaves
/// leave, a chosen queue without an evictable leaf yields to the other, the
/// cache size is the most device pages held when the policy acted.
#[derive(Debug, Default)]
struct QueueModel {
    arc: bool,
    pages: BTreeMap<Prefix, QPage>,
    next_seq: u64,
    peak: u64,
    target: u64,
    /// Ghost lists: live entries (seq, list, pages) and per-list FIFO items
    /// (stale ones stay until they reach the front, and count).
    live: BTreeMap<GhostKey, (u64, usize, u64)>,
    order: [VecDeque<(u64, GhostKey)>; 2],
    ghost_pages: [u64; 2],
    ghost_seq: u64,
}

impl QueueModel {
    fn slot(&mut self, queue: u64, count: u64) -> QPage {
        self.next_seq += 1;
        QPage {
            queue,
            count,
            seq: self.next_seq - 1,
        }
    }

    fn set(&mut self, pages: &[Prefix], q: QPage) {
        for p in pages {
            self.pages.insert(p.clone(), q);
        }
    }

    fn record(&mut self, key: GhostKey, list: usize, pages: u64) {
        let seq = self.ghost_seq;
        self.ghost_seq += 1;
        if let Some((_, old_list, old_pages)) = self.live.insert(key.clone(), (seq, list, pages)) {
            self.ghost_pages[old_list] -= old_pages;
        }
        self.ghost_pages[list] += pages;
        self.order[list].push_back((seq, key));
    }

    fn take(&mut self, key: &GhostKey) -> Option<usize> {
        let (_, list, pages) = self.live.remove(key)?;
        self.ghost_pages[list] -= pages;
        Some(list)
    }

    fn trim(&mut self, list: usize, bound: u64) {
        while self.ghost_pages[list] > bound || self.order[list].len() as u64 > bound.max(1) {
            let Some((seq, key)) = self.order[list].pop_front() else {
                break;
            };
            if self.live.get(&key).is_some_and(|e| e.0 == seq) {
                let (_, _, pages) = self.live.remove(&key).unwrap();
                self.ghost_pages[list] -= pages;
            }
        }
    }

    /// ARC's adaptation on a ghost hit in B1 (list 0) or B2.
    fn adapt(&mut self, list: u64, pages: u64) {
        let b1 = self.ghost_pages[0].max(1);
        let b2 = self.ghost_pages[1].max(1);
        if list == 0 {
            self.target = (self.target + pages * (b2 / b1).max(1)).min(self.peak);
        } else {
            self.target = self.target.saturating_sub(pages * (b1 / b2).max(1));
        }
    }

    fn hit(&mut self, pages: &[Prefix]) {
        let q = if self.arc {
            self.slot(1, 0)
        } else {
            let old = self.pages[&pages[0]];
            QPage {
                count: (old.count + 1).min(3),
                ..old
            }
        };
        self.set(pages, q);
    }

    fn reloaded(&mut self, pages: &[Prefix]) {
        if self.arc {
            let old = self.pages[&pages[0]].queue;
            self.adapt(old, pages.len() as u64);
        }
        let q = self.slot(1, 0);
        self.set(pages, q);
    }

    fn created(&mut self, key: &GhostKey, pages: &[Prefix]) {
        let back = self.take(key);
        let q = match (self.arc, back) {
            (true, Some(list)) => {
                self.adapt(list as u64, pages.len() as u64);
                self.slot(1, 0)
            }
            (true, None) => self.slot(0, 0),
            (false, Some(_)) => self.slot(1, 0),
            (false, None) => self.slot(0, 0),
        };
        self.set(pages, q);
    }

    /// A node of `queue` with `pages` pages left the tree; `t` = device pages per queue now.
    fn dropped(&mut self, key: GhostKey, queue: u64, pages: u64, t: [u64; 2]) {
        let c = self.peak;
        if self.arc {
            self.record(key, queue as usize, pages);
            self.trim(0, c.saturating_sub(t[0]));
            let b1 = self.ghost_pages[0];
            self.trim(1, (2 * c).saturating_sub(t[0] + t[1] + b1));
        } else if queue == 0 {
            self.record(key, 0, pages);
            self.trim(0, c);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stats {
    created: u64,
    last_access: u64,
    hits: u64,
}

/// The classic policies' orders, written from their definitions: the key
/// of a node with these stats, ties going to the smaller node id.
fn classic_key(policy: Policy, s: Stats) -> Option<(u64, u64)> {
    match policy {
        Policy::Lru => Some((s.last_access, 0)),
        Policy::Lfu => Some((s.hits, s.last_access)),
        Policy::Fifo => Some((s.created, 0)),
        Policy::Slru => Some((u64::from(s.hits >= 2), s.last_access)),
        _ => None,
    }
}

fn namespace(ns: u8) -> Namespace {
    if ns == 0 {
        Namespace::Default
    } else {
        Namespace::Id(u64::from(ns))
    }
}

fn tokens(pages: &[u8]) -> Vec<u64> {
    // Page p is PAGE tokens [p, p + 10]; a trailing partial page is appended
    // to check that only whole pages count.
    let mut t: Vec<u64> = pages
        .iter()
        .flat_map(|p| [u64::from(*p), u64::from(*p) + 10])
        .collect();
    t.push(99);
    t
}

impl Harness {
    fn new(policy: Policy) -> Self {
        Self {
            tree: PrefixTree::new(PAGE, policy).unwrap(),
            model: BTreeMap::new(),
            locks: BTreeMap::new(),
            pins: BTreeMap::new(),
            known: Vec::new(),
            next_page: 1000,
            clock: 0,
            stats: BTreeMap::new(),
            queues: policy.is_queued().then(|| QueueModel {
                arc: policy == Policy::Arc,
                ..QueueModel::default()
            }),
        }
    }

    /// Device pages per queue of the queue model.
    fn queue_pages(&self) -> [u64; 2] {
        let mut t = [0; 2];
        let q = self.queues.as_ref().unwrap();
        for (p, s) in &self.model {
            if s.device.is_some() {
                t[q.pages[p].queue as usize] += 1;
            }
        }
        t
    }

    fn observe(&mut self) {
        let held = self.model.values().filter(|s| s.device.is_some()).count() as u64;
        if let Some(q) = self.queues.as_mut() {
            q.peak = q.peak.max(held);
        }
    }

    /// The nodes from the root's child to `id`, with their page prefixes.
    fn path_nodes(&self, id: NodeId) -> Vec<(NodeId, Vec<Prefix>)> {
        let mut out = Vec::new();
        let mut at = self.tree.node(id);
        while let Some(node) = at.filter(|n| !n.is_root()) {
            let (p, pages) = self.node_prefix(node.id()).unwrap();
            out.push((node.id(), self.page_prefixes(&p, pages)));
            at = node.parent().and_then(|parent| self.tree.node(parent));
        }
        out.reverse();
        out
    }

    fn parents(&self) -> BTreeMap<NodeId, NodeId> {
        self.tree
            .nodes()
            .filter_map(|n| Some((n.id(), n.parent()?)))
            .collect()
    }

    fn ghost_key(&self, id: NodeId, first: &Prefix) -> GhostKey {
        let parent = self.tree.node(id).unwrap().parent().unwrap();
        (parent, first.1[first.1.len() - PAGE..].to_vec())
    }

    /// Whether the node with these pages is an evictable leaf of `tier` in the model.
    fn evictable(&self, pages: &[Prefix], tier: Tier) -> bool {
        let Some(first) = self.model.get(&pages[0]) else {
            return false; // gone
        };
        let last = pages.last().unwrap();
        let mut child_pages = self.model.iter().filter(|(q, _)| {
            q.0 == last.0 && q.1.len() == last.1.len() + PAGE && q.1.starts_with(&last.1)
        });
        let leaf = match tier {
            Tier::Device => first.device.is_some() && !child_pages.any(|(_, s)| s.device.is_some()),
            Tier::Host => {
                first.device.is_none() && first.host.is_some() && child_pages.next().is_none()
            }
        };
        leaf && !self.is_locked(&pages[0])
    }

    /// The queue model's next device victim, making its second chances on
    /// the way (S3-FIFO).
    fn queue_victim(&mut self, nodes: &[(NodeId, Vec<Prefix>)]) -> Option<NodeId> {
        self.observe();
        loop {
            let t = self.queue_pages();
            let q = self.queues.as_ref().unwrap();
            let first = if q.arc {
                u64::from(t[0] <= q.target)
            } else {
                u64::from(t[0] * 10 <= t[0] + t[1])
            };
            let head = |queue: u64| {
                nodes
                    .iter()
                    .filter(|(_, pages)| self.evictable(pages, Tier::Device))
                    .filter(|(_, pages)| q.pages[&pages[0]].queue == queue)
                    .min_by_key(|(id, pages)| (q.pages[&pages[0]].seq, *id))
                    .cloned()
            };
            let (id, pages) = head(first).or_else(|| head(1 - first))?;
            let state = q.pages[&pages[0]];
            if q.arc || state.count == 0 {
                return Some(id);
            }
            let q = self.queues.as_mut().unwrap();
            let moved = if state.queue == 0 {
                q.slot(1, 0)
            } else {
                q.slot(1, state.count - 1)
            };
            q.set(&pages, moved);
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The non-root nodes with their page prefixes (nodes group pages; the
    /// model uses their ids only as labels and for the tie-break).
    fn node_pages(&self) -> Vec<(NodeId, Vec<Prefix>)> {
        self.tree
            .nodes()
            .filter(|n| !n.is_root())
            .map(|n| {
                let (p, pages) = self.node_prefix(n.id()).unwrap();
                (n.id(), self.page_prefixes(&p, pages))
            })
            .collect()
    }

    /// The evictable leaf of `tier` that the policy's order ranks first,
    /// by the model's state; `None` when nothing is evictable or the model
    /// does not rank this policy's leaves itself.
    fn expected_victim(&self, nodes: &[(NodeId, Vec<Prefix>)], tier: Tier) -> Option<NodeId> {
        let policy = self.tree.policy();
        if self.queues.is_none() {
            classic_key(
                policy,
                Stats {
                    created: 0,
                    last_access: 0,
                    hits: 0,
                },
            )?;
        }
        let mut best: Option<((u64, u64), NodeId)> = None;
        for (id, pages) in nodes {
            if !self.evictable(pages, tier) {
                continue;
            }
            let key = match (&self.queues, classic_key(policy, self.stats[&pages[0]])) {
                (_, Some(key)) => key,
                // Host victims of the queue policies: queue, then position.
                (Some(q), None) => (q.pages[&pages[0]].queue, q.pages[&pages[0]].seq),
                (None, None) => unreachable!("checked above"),
            };
            for q in pages {
                assert_eq!(
                    self.stats[q], self.stats[&pages[0]],
                    "pages of node {id} disagree"
                );
            }
            if best.is_none_or(|b| (key, *id) < b) {
                best = Some((key, *id));
            }
        }
        best.map(|(_, id)| id)
    }

    fn pick(&self, i: usize) -> NodeId {
        // Mostly known ids; sometimes an id that never existed.
        self.known
            .get(i)
            .copied()
            .unwrap_or(NodeId(10_000 + i as u64))
    }

    /// (namespace, token prefix through the node's last page, node pages).
    fn node_prefix(&self, id: NodeId) -> Option<(Prefix, usize)> {
        let mut node = self.tree.node(id)?;
        let pages = node.tokens().len() / PAGE;
        let mut chunks = vec![node.tokens().to_vec()];
        while let Some(parent) = node.parent() {
            node = self.tree.node(parent).unwrap();
            chunks.push(node.tokens().to_vec());
        }
        let ns = (0..2u8).find(|ns| self.tree.root(&namespace(*ns)) == Some(node.id()))?;
        chunks.reverse();
        Some(((ns, chunks.concat()), pages))
    }

    fn page_prefixes(&self, (ns, toks): &Prefix, pages: usize) -> Vec<Prefix> {
        let total = toks.len() / PAGE;
        (total - pages..total)
            .map(|k| (*ns, toks[..(k + 1) * PAGE].to_vec()))
            .collect()
    }

    fn is_locked(&self, p: &Prefix) -> bool {
        self.locks.get(p).is_some_and(|c| *c > 0)
    }

    /// Every page prefix from the root through `p`.
    fn path_pages(&self, p: &Prefix) -> Vec<Prefix> {
        self.page_prefixes(p, p.1.len() / PAGE)
    }

    fn apply(&mut self, op: &Op) {
        let before = self.tree.digest();
        let rejected = |h: &Self, r: Result<(), EvictError>| {
            if r.is_err() {
                assert_eq!(
                    h.tree.digest(),
                    before,
                    "a rejected call changed the digest"
                );
            }
        };
        match op {
            Op::Match { ns, pages } => {
                let t = tokens(pages);
                let m = self.tree.match_prefix(&t, &namespace(*ns));
                let now = self.tick();
                for k in 0..pages.len() {
                    match self.stats.get_mut(&(*ns, t[..(k + 1) * PAGE].to_vec())) {
                        Some(s) => {
                            s.hits += 1;
                            s.last_access = now;
                        }
                        None => break,
                    }
                }
                if self.queues.is_some() {
                    for (_, node_pages) in self.path_nodes(m.host_node) {
                        self.observe();
                        self.queues.as_mut().unwrap().hit(&node_pages);
                    }
                }
                let (mut dev, mut host, mut dev_pages) = (0, 0, Vec::new());
                for k in 0..pages.len() {
                    match self.model.get(&(*ns, t[..(k + 1) * PAGE].to_vec())) {
                        Some(s) => {
                            if let (true, Some(page)) = (dev == k, s.device) {
                                dev += 1;
                                dev_pages.push(page);
                            }
                            host += 1;
                        }
                        None => break,
                    }
                }
                assert_eq!(
                    (m.length, m.host_length),
                    (dev * PAGE, host * PAGE),
                    "{op:?}"
                );
                assert_eq!(m.device_pages, dev_pages);
                self.known.extend([m.node, m.host_node]);
            }
            Op::Insert {
                ns,
                pages,
                reuse_live_page,
            } => {
                let t = tokens(pages);
                let mut ids: Vec<u64> = (0..pages.len() as u64)
                    .map(|i| self.next_page + i)
                    .collect();
                let live = self.model.values().find_map(|s| s.device);
                if let (true, Some(live), Some(last)) = (*reuse_live_page, live, ids.last_mut()) {
                    *last = live;
                }
                let cached = (0..pages.len())
                    .take_while(|k| {
                        self.model
                            .get(&(*ns, t[..(k + 1) * PAGE].to_vec()))
                            .is_some_and(|s| s.device.is_some())
                    })
                    .count();
                let adopts_live = ids[cached.min(ids.len())..]
                    .iter()
                    .any(|p| Some(*p) == live);
                let pre = self.model.clone();
                let r = self.tree.insert(&t, &ids, &namespace(*ns));
                if *reuse_live_page && adopts_live {
                    assert!(matches!(r, Err(EvictError::PageInUse(_))), "{r:?}");
                    rejected(self, r.map(|_| ()));
                    return;
                }
                let r = r.unwrap();
                assert_eq!(r.cached, cached);
                self.next_page += pages.len() as u64;
                let now = self.tick();
                for k in 0..pages.len() {
                    let p = (*ns, t[..(k + 1) * PAGE].to_vec());
                    // Cached or attached pages are accessed; new ones start with one hit.
                    let s = self.stats.entry(p).or_insert(Stats {
                        created: now,
                        last_access: now,
                        hits: 1,
                    });
                    s.last_access = now;
                }
                for (k, id) in ids.iter().enumerate() {
                    let s = self
                        .model
                        .entry((*ns, t[..(k + 1) * PAGE].to_vec()))
                        .or_insert(PageState {
                            device: None,
                            host: None,
                        });
                    if s.device.is_none() {
                        s.device = Some(*id);
                    }
                }
                if self.tree.policy().is_queued() {
                    // Replays the insert on the pre-insert device count: attached
                    // nodes one by one, then the new leaf.
                    let mut held = pre.values().filter(|s| s.device.is_some()).count() as u64;
                    for (id, node_pages) in self.path_nodes(r.node) {
                        let q = self.queues.as_mut().unwrap();
                        match pre.get(&node_pages[0]) {
                            Some(s) if s.device.is_some() => {}
                            Some(_) => {
                                q.peak = q.peak.max(held);
                                q.reloaded(&node_pages);
                                held += node_pages.len() as u64;
                            }
                            None => {
                                held += node_pages.len() as u64;
                                q.peak = q.peak.max(held);
                                let key = self.ghost_key(id, &node_pages[0]);
                                self.queues.as_mut().unwrap().created(&key, &node_pages);
                            }
                        }
                    }
                }
                self.known.push(r.node);
            }
            Op::Lock(i) => {
                let id = self.pick(*i);
                let r = self.tree.lock(id);
                match self.node_prefix(id) {
                    Some((p, _)) => {
                        r.clone().unwrap();
                        self.tick();
                        for q in self.path_pages(&p) {
                            *self.locks.entry(q).or_default() += 1;
                        }
                        *self.pins.entry(p).or_default() += 1;
                    }
                    None => assert_eq!(r, Err(EvictError::UnknownNode(id))),
                }
                rejected(self, r);
            }
            Op::Unlock(i) => {
                let id = self.pick(*i);
                let r = self.tree.unlock(id);
                match self.node_prefix(id) {
                    Some((p, _)) => {
                        let path = self.path_pages(&p);
                        if self.pins.get(&p).is_some_and(|c| *c > 0) {
                            r.clone().unwrap();
                            self.tick();
                            *self.pins.get_mut(&p).unwrap() -= 1;
                            for q in path {
                                *self.locks.get_mut(&q).unwrap() -= 1;
                            }
                        } else {
                            assert!(matches!(r, Err(EvictError::LockUnderflow(_))), "{r:?}");
                        }
                    }
                    None => assert_eq!(r, Err(EvictError::UnknownNode(id))),
                }
                rejected(self, r);
            }
            Op::Evict(n) => {
                let nodes = self.node_pages();
                let parents = self.parents();
                let victims = self.tree.evict(*n);
                self.tick();
                let mut freed = 0;
                for v in &victims {
                    let expected = if self.queues.is_some() {
                        self.queue_victim(&nodes)
                    } else {
                        self.expected_victim(&nodes, Tier::Device)
                    };
                    if let Some(expected) = expected {
                        assert_eq!(v.node, expected, "victim order of {:?}", self.tree.policy());
                    }
                    let parent = dropped_content(&nodes, &parents, v.node);
                    assert!(freed < *n, "evicted past the request");
                    freed += v.pages.len();
                    let mut prefixes = Vec::new();
                    for page in &v.pages {
                        let (p, s) = self
                            .model
                            .iter()
                            .find(|(_, s)| s.device == Some(*page))
                            .expect("victim page was cached");
                        assert!(!self.is_locked(p), "locked page {page} evicted");
                        prefixes.push((p.clone(), *s));
                    }
                    let last = &prefixes.last().expect("victims hold pages").0;
                    let deeper_on_device = self.model.iter().any(|(p, s)| {
                        p.0 == last.0
                            && p.1.len() > last.1.len()
                            && p.1.starts_with(&last.1)
                            && s.device.is_some()
                    });
                    assert!(!deeper_on_device, "victim {} is not a device leaf", v.node);
                    let left_tree = prefixes[0].1.host.is_none();
                    for (p, s) in prefixes {
                        if s.host.is_some() {
                            self.model.get_mut(&p).unwrap().device = None;
                        } else {
                            self.model.remove(&p);
                            self.stats.remove(&p);
                        }
                    }
                    if let (true, Some(_), Some((key, pages))) = (left_tree, &self.queues, parent) {
                        self.queue_dropped(key, &pages);
                    }
                }
                assert!(freed >= *n || self.tree.evictable(Tier::Device) == 0);
            }
            Op::EvictHost(n) => {
                let nodes = self.node_pages();
                let parents = self.parents();
                let victims = self.tree.evict_host(*n);
                self.tick();
                let mut dropped = 0;
                for v in &victims {
                    if let Some(expected) = self.expected_victim(&nodes, Tier::Host) {
                        assert_eq!(
                            v.node,
                            expected,
                            "host victim order of {:?}",
                            self.tree.policy()
                        );
                    }
                    let parent = dropped_content(&nodes, &parents, v.node);
                    assert!(dropped < *n, "dropped past the request");
                    dropped += v.num_pages;
                    let hits: Vec<Prefix> = self
                        .model
                        .iter()
                        .filter(|(_, s)| s.host == Some(v.object_key) && s.device.is_none())
                        .map(|(p, _)| p.clone())
                        .collect();
                    // The victim's pages are the deepest host-only pages of that
                    // object: drop the last `num_pages` of them.
                    assert!(hits.len() >= v.num_pages);
                    let mut by_depth = hits;
                    by_depth.sort_by_key(|p| p.1.len());
                    for p in by_depth.iter().rev().take(v.num_pages) {
                        assert!(!self.is_locked(p));
                        let deeper = self.model.keys().any(|q| {
                            q.0 == p.0
                                && q.1.len() > p.1.len()
                                && q.1.starts_with(&p.1)
                                && !by_depth.contains(q)
                        });
                        assert!(!deeper, "host victim {} has descendants", v.node);
                    }
                    for p in by_depth
                        .iter()
                        .rev()
                        .take(v.num_pages)
                        .cloned()
                        .collect::<Vec<_>>()
                    {
                        self.model.remove(&p);
                        self.stats.remove(&p);
                    }
                    if let (Some(_), Some((key, pages))) = (&self.queues, parent) {
                        self.queue_dropped(key, &pages);
                    }
                    let still = self.model.values().any(|s| s.host == Some(v.object_key));
                    assert_eq!(v.released, !still, "released flag of key {}", v.object_key);
                }
                assert!(dropped >= *n || self.tree.evictable(Tier::Host) == 0);
            }
            Op::SetHost { pick, key } => {
                let id = self.pick(*pick);
                let r = self.tree.set_host(id, *key);
                let expect_ok = self.node_prefix(id).is_some_and(|(p, pages)| {
                    let own = self.page_prefixes(&p, pages);
                    if own.is_empty() {
                        return false; // a root
                    }
                    let parent_ok = own[0].1.len() == PAGE || {
                        let parent = (p.0, own[0].1[..own[0].1.len() - PAGE].to_vec());
                        self.model[&parent].host.is_some()
                    };
                    self.model[&own[0]].host.is_none()
                        && parent_ok
                        && !self.model.values().any(|s| s.host == Some(*key))
                });
                assert_eq!(r.is_ok(), expect_ok, "{op:?}: {r:?}");
                if r.is_ok() {
                    self.tick();
                    let (p, pages) = self.node_prefix(id).unwrap();
                    for q in self.page_prefixes(&p, pages) {
                        self.model.get_mut(&q).unwrap().host = Some(*key);
                    }
                }
                rejected(self, r);
            }
            Op::Attach(pick) => {
                let id = self.pick(*pick);
                let info = self.node_prefix(id);
                let pages = info.as_ref().map_or(1, |(_, n)| *n);
                let ids: Vec<u64> = (0..pages as u64).map(|i| self.next_page + i).collect();
                let r = self.tree.attach_device(id, &ids);
                let expect_ok = info.as_ref().is_some_and(|(p, n)| {
                    let own = self.page_prefixes(p, *n);
                    let parent_ok = own.first().is_some_and(|first| {
                        first.1.len() == PAGE || {
                            let parent = (p.0, first.1[..first.1.len() - PAGE].to_vec());
                            self.model[&parent].device.is_some()
                        }
                    });
                    parent_ok && self.model[&own[0]].device.is_none()
                });
                assert_eq!(r.is_ok(), expect_ok, "{op:?}: {r:?}");
                if r.is_ok() {
                    if self.queues.is_some() {
                        self.observe();
                        let (p, n) = info.clone().unwrap();
                        let node_pages = self.page_prefixes(&p, n);
                        self.queues.as_mut().unwrap().reloaded(&node_pages);
                    }
                    self.next_page += pages as u64;
                    let now = self.tick();
                    let (p, n) = info.unwrap();
                    for (q, page) in self.page_prefixes(&p, n).into_iter().zip(&ids) {
                        self.model.get_mut(&q).unwrap().device = Some(*page);
                        self.stats.get_mut(&q).unwrap().last_access = now;
                    }
                }
                rejected(self, r);
            }
        }
    }

    /// The tree's residency, page by page, in the model's terms.
    fn residency(&self) -> BTreeMap<Prefix, PageState> {
        let mut out = BTreeMap::new();
        for node in self.tree.nodes().filter(|n| !n.is_root()) {
            let (p, pages) = self.node_prefix(node.id()).unwrap();
            for (k, q) in self.page_prefixes(&p, pages).into_iter().enumerate() {
                let device = node.device_pages().map(|d| d[k]);
                out.insert(
                    q,
                    PageState {
                        device,
                        host: node.host_key(),
                    },
                );
            }
        }
        out
    }

    /// A node with `pages` left the tree: into the queue model's ghost lists.
    fn queue_dropped(&mut self, key: GhostKey, pages: &[Prefix]) {
        self.observe();
        let t = self.queue_pages();
        let q = self.queues.as_mut().unwrap();
        let queue = q.pages[&pages[0]].queue;
        for p in pages {
            q.pages.remove(p);
        }
        q.dropped(key, queue, pages.len() as u64, t);
    }

    fn check(&self) {
        self.tree.check_invariants().unwrap();
        if let Some(q) = &self.queues {
            // Each node's packed state (queue, count, position) equals the model's.
            for node in self.tree.nodes().filter(|n| !n.is_root()) {
                let (p, pages) = self.node_prefix(node.id()).unwrap();
                let want = q.pages[&self.page_prefixes(&p, pages)[0]];
                let packed = node.queue_slot();
                let have = QPage {
                    queue: packed >> 62,
                    count: (packed >> 60) & 3,
                    seq: packed & ((1 << 60) - 1),
                };
                assert_eq!(have, want, "queue state of node {}", node.id());
            }
        }
        assert_eq!(self.tree.clock(), self.clock, "logical clock");
        assert_eq!(self.residency(), self.model);
    }
}

fn run(policy: Policy, ops: &[Op]) {
    run_harness(Harness::new(policy), ops);
}

fn run_harness(mut h: Harness, ops: &[Op]) {
    for op in ops {
        h.apply(op);
        h.check();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn model_lru(ops in prop::collection::vec(op(), 1..60)) {
        run(Policy::Lru, &ops);
    }

    #[test]
    fn model_queue_policies_under_busy_traffic(ops in prop::collection::vec(busy_op(), 20..200), arc in any::<bool>()) {
        run(if arc { Policy::Arc } else { Policy::S3fifo }, &ops);
    }

    #[test]
    fn model_every_policy(ops in prop::collection::vec(op(), 1..60), p in 0usize..Policy::ALL.len()) {
        run(Policy::ALL[p], &ops);
    }

    /// Ghost with its candidates sampling from the first pages on (a floor
    /// of 2 pages, rates 1/2 to 1/8), so the sampled path runs inside these
    /// small trees: the same structural checks after every step, the
    /// shadows' own invariants included (`check_invariants`).
    #[test]
    fn model_ghost_sampling(ops in prop::collection::vec(busy_op(), 20..200), shift in 1u32..4) {
        let mut h = Harness::new(Policy::Ghost);
        h.tree = PrefixTree::ghost_sampled(PAGE, Sampling::new(shift, 2).unwrap()).unwrap();
        run_harness(h, &ops);
    }
}

/// The ghost-list key of victim `node` (its parent and first page's tokens)
/// and its pages, read from the node list taken before the eviction.
fn dropped_content(
    nodes: &[(NodeId, Vec<Prefix>)],
    parents: &BTreeMap<NodeId, NodeId>,
    node: NodeId,
) -> Option<(GhostKey, Vec<Prefix>)> {
    let (id, pages) = nodes.iter().find(|(id, _)| *id == node)?;
    let first = &pages[0];
    Some((
        (parents[id], first.1[first.1.len() - PAGE..].to_vec()),
        pages.clone(),
    ))
}
