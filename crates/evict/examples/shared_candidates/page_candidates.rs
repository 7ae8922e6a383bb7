//! Issue 36's prototype (a measurement, not part of the crate): ghost's five candidate rankings as page-level
//! simulators over ONE shared page table, instead of five replica trees.
//!
//! A request's pages are looked up (and added) once in the shared table,
//! keyed by (parent page, page word). Per page, each candidate keeps only
//! its residency, its order key, its hit count and its resident-children
//! count; it evicts under its own capacity from an ordered set of its
//! resident leaves (so its residency stays prefix-closed and its hit is its
//! resident prefix of the path). Remembered content (the priority and
//! segmented candidates' histories, ARC's B1/B2, S3-FIFO's ghost list) is a
//! per-candidate state of the same shared page. A page leaves the table when
//! no candidate holds or remembers it and no page below it is in the table.
//!
//! Decisions differ from the replica shadows by design (a victim is one page,
//! the clock counts requests, ties break by page id): docs/ghost.md measures
//! whether the hits, the cost and the grid's margins make it worth it.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use cpkv_evict::Namespace;

/// The candidates of `Policy::Ghost` (the crate's `ranking.rs`), in its
/// tie-break order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranking {
    Priority,
    Recency,
    Segmented,
    Arc,
    S3fifo,
}

pub const CANDIDATES: [Ranking; 5] = [
    Ranking::Priority,
    Ranking::Recency,
    Ranking::Segmented,
    Ranking::Arc,
    Ranking::S3fifo,
];

/// FxHash-style word hashing for the (parent, word) key.
#[derive(Default)]
pub struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

pub type PairMap = HashMap<(u32, u64), u32, BuildHasherDefault<PairHasher>>;

const NONE: u32 = u32::MAX;
/// Per-candidate state of a page.
const ABSENT: u8 = 0;
const RESIDENT: u8 = 1;
const REMEMBERED: u8 = 2;

const HISTORY_PER_CACHED_PAGE: usize = 4;
const SIXTEENTHS: u64 = 16;
const REUSE_WINDOW_PAGES: u64 = 1 << 14;
/// The same switch rule as the replica shadows (`shadow.rs`).
const DECAY_SHIFT: u32 = 10;
const SCORE_FRACTION_BITS: u32 = 8;
const SWITCH_MARGIN_SHIFT: u32 = 7;
const MIN_REQUESTS_BETWEEN: u64 = 64;
const QUEUE_BIT: u64 = 1 << 63;

/// One candidate's view of the shared pages.
#[derive(Debug, Clone)]
struct Candidate {
    ranking: Ranking,
    state: Vec<u8>,
    /// The order key of a resident page (bit 63: the queue, for the queue
    /// rankings and for segmented's reused segment).
    key: Vec<u64>,
    hits: Vec<u32>,
    /// Resident children (a page with none is a leaf, in `leaves`).
    kids: Vec<u32>,
    /// Last access, for the priority ranking's horizon.
    last: Vec<u64>,
    leaves: BTreeSet<(u64, u32)>,
    resident: usize,
    /// Remembered pages, oldest first, with the list they are in (ARC's B1
    /// or B2; 0 otherwise); stale entries are skipped.
    remembered: [VecDeque<u32>; 2],
    remembered_count: [usize; 2],
    /// Pages per queue (ARC: T1, T2; S3-FIFO: small, main).
    queue_pages: [usize; 2],
    /// ARC's target size of T1.
    target: usize,
    /// The priority ranking's horizon floor and reuse counters.
    floor: u64,
    hit_pages: u64,
    returned_pages: u64,
    seq: u64,
}

impl Candidate {
    fn new(ranking: Ranking) -> Self {
        Self {
            ranking,
            state: Vec::new(),
            key: Vec::new(),
            hits: Vec::new(),
            kids: Vec::new(),
            last: Vec::new(),
            leaves: BTreeSet::new(),
            resident: 0,
            remembered: [VecDeque::new(), VecDeque::new()],
            remembered_count: [0, 0],
            queue_pages: [0, 0],
            target: 0,
            floor: 0,
            hit_pages: 0,
            returned_pages: 0,
            seq: 0,
        }
    }

    fn grow(&mut self, len: usize) {
        self.state.resize(len, ABSENT);
        self.key.resize(len, 0);
        self.hits.resize(len, 0);
        self.kids.resize(len, 0);
        if self.ranking == Ranking::Priority {
            self.last.resize(len, 0);
        }
    }

    fn weights(&self) -> (u64, u64) {
        let reused = self.hit_pages + self.returned_pages;
        if reused == 0 {
            return (SIXTEENTHS / 2, SIXTEENTHS);
        }
        let share = SIXTEENTHS * self.returned_pages / reused;
        ((2 * share).clamp(SIXTEENTHS / 2, SIXTEENTHS), share)
    }

    fn rescale(&mut self) {
        while self.hit_pages + self.returned_pages > REUSE_WINDOW_PAGES {
            self.hit_pages /= 2;
            self.returned_pages /= 2;
        }
    }

    /// The order key of page `p` accessed at `now` (in queue `queue`, for
    /// the queue rankings: 0 or `QUEUE_BIT`).
    fn order_key(&mut self, p: usize, now: u64, queue: u64) -> u64 {
        match self.ranking {
            Ranking::Recency => now,
            Ranking::Segmented => (u64::from(self.hits[p] >= 2) * QUEUE_BIT) | now,
            Ranking::Priority => {
                self.last[p] = now;
                let horizon = now.saturating_sub(self.floor);
                let (probation, bonus) = self.weights();
                let prio = if self.hits[p] >= 2 {
                    let b = horizon
                        .saturating_mul(u64::from(self.hits[p] - 1))
                        .saturating_mul(bonus);
                    now.saturating_add(b / SIXTEENTHS)
                } else {
                    now.saturating_sub(horizon.saturating_mul(probation) / SIXTEENTHS)
                };
                prio.min(QUEUE_BIT - 1)
            }
            Ranking::Arc | Ranking::S3fifo => {
                self.seq += 1;
                queue | self.seq
            }
        }
    }

    fn queue_of(&self, p: usize) -> usize {
        usize::from(self.key[p] & QUEUE_BIT != 0)
    }

    /// Re-keys page `p` (a leaf keeps its place in `leaves` in step).
    fn rekey(&mut self, p: usize, key: u64) {
        let leaf = self.kids[p] == 0;
        if leaf {
            self.leaves.remove(&(self.key[p], p as u32));
        }
        self.key[p] = key;
        if leaf {
            self.leaves.insert((key, p as u32));
        }
    }

    /// A hit on resident page `p`.
    fn hit(&mut self, p: usize, now: u64) {
        self.hits[p] = self.hits[p].saturating_add(1);
        match self.ranking {
            // S3-FIFO counts to 3 and keeps its place.
            Ranking::S3fifo => self.hits[p] = self.hits[p].min(3),
            Ranking::Arc => {
                if self.queue_of(p) == 0 {
                    self.queue_pages[0] -= 1;
                    self.queue_pages[1] += 1;
                }
                let key = self.order_key(p, now, QUEUE_BIT);
                self.rekey(p, key);
            }
            _ => {
                let key = self.order_key(p, now, 0);
                self.rekey(p, key);
            }
        }
    }
}

/// The five candidates over one shared page table, and the switch rule.
#[derive(Debug, Clone)]
pub struct PageCandidates {
    roots: Vec<(Namespace, u32)>,
    map: PairMap,
    parent: Vec<u32>,
    word: Vec<u64>,
    /// Children in the table plus candidates holding or remembering the page.
    refs: Vec<u32>,
    free: Vec<u32>,
    candidates: Vec<Candidate>,
    scores: Vec<u64>,
    leader: usize,
    capacity: usize,
    since_switch: u64,
    clock: u64,
    path: Vec<u32>,
    /// Each candidate's hit pages on the last request.
    pub last_hits: Vec<usize>,
}

impl PageCandidates {
    pub fn new() -> Self {
        Self {
            roots: Vec::new(),
            map: PairMap::default(),
            parent: Vec::new(),
            word: Vec::new(),
            refs: Vec::new(),
            free: Vec::new(),
            candidates: CANDIDATES.iter().map(|&r| Candidate::new(r)).collect(),
            scores: vec![0; CANDIDATES.len()],
            leader: 0,
            capacity: 0,
            since_switch: 0,
            clock: 0,
            path: Vec::new(),
            last_hits: vec![0; CANDIDATES.len()],
        }
    }

    pub fn leader(&self) -> Ranking {
        CANDIDATES[self.leader]
    }

    /// Pages in the shared table.
    pub fn pages(&self) -> usize {
        self.map.len()
    }

    /// Bytes the structure holds (capacity of its vectors and sets, the
    /// map at its bucket count), for the memory comparison.
    pub fn bytes(&self) -> usize {
        let map = self.map.capacity() * (size_of::<((u32, u64), u32)>() + 1);
        let shared =
            self.parent.capacity() * 4 + self.word.capacity() * 8 + self.refs.capacity() * 4;
        let per: usize = self
            .candidates
            .iter()
            .map(|c| {
                c.state.capacity()
                    + c.key.capacity() * 8
                    + c.hits.capacity() * 4
                    + c.kids.capacity() * 4
                    + c.last.capacity() * 8
                    // A B-tree entry is 12 bytes in nodes about 2/3 full.
                    + c.leaves.len() * 18
                    + c.remembered.iter().map(|r| r.capacity() * 4).sum::<usize>()
            })
            .sum();
        map + shared + per
    }

    /// The structure's invariants, checked from scratch: the table holds
    /// exactly the pages something refers to; per candidate, residency is
    /// prefix-closed and within the capacity, the children counts are
    /// right, its leaf set is its resident pages without resident
    /// children, and its remembered counts match.
    #[allow(clippy::needless_range_loop)] // one index into several per-page arrays
    pub fn check(&self) -> Result<(), String> {
        let len = self.parent.len();
        let mut refs = vec![0u32; len];
        for (_, r) in &self.roots {
            refs[*r as usize] += 1;
        }
        for (&(parent, word), &p) in &self.map {
            let p = p as usize;
            if self.parent[p] != parent || self.word[p] != word {
                return Err(format!("page {p} is filed under another key"));
            }
            refs[parent as usize] += 1;
        }
        for (ci, c) in self.candidates.iter().enumerate() {
            let mut kids = vec![0u32; len];
            let (mut resident, mut remembered) = (0, [0usize; 2]);
            for p in 0..len {
                match c.state[p] {
                    ABSENT => continue,
                    RESIDENT => {
                        resident += 1;
                        let parent = self.parent[p] as usize;
                        if self.roots.iter().all(|(_, r)| *r as usize != parent) {
                            if c.state[parent] != RESIDENT {
                                return Err(format!("candidate {ci}: page {p} above a gap"));
                            }
                            kids[parent] += 1;
                        }
                    }
                    _ => {
                        let list =
                            usize::from(c.ranking == Ranking::Arc && c.key[p] & QUEUE_BIT != 0);
                        remembered[list] += 1;
                    }
                }
                refs[p] += 1;
            }
            if resident != c.resident || resident > self.capacity {
                return Err(format!(
                    "candidate {ci}: {resident} resident, counted {}",
                    c.resident
                ));
            }
            if remembered != c.remembered_count {
                return Err(format!(
                    "candidate {ci}: remembered {remembered:?}, counted {:?}",
                    c.remembered_count
                ));
            }
            for p in 0..len {
                if c.state[p] != RESIDENT {
                    continue;
                }
                if kids[p] != c.kids[p] {
                    return Err(format!(
                        "candidate {ci}: page {p} has {} children, counted {}",
                        kids[p], c.kids[p]
                    ));
                }
                if (kids[p] == 0) != c.leaves.contains(&(c.key[p], p as u32)) {
                    return Err(format!("candidate {ci}: page {p}'s leaf entry is wrong"));
                }
            }
            if c.leaves.len()
                != (0..len)
                    .filter(|&p| c.state[p] == RESIDENT && kids[p] == 0)
                    .count()
            {
                return Err(format!("candidate {ci}: stray leaf entries"));
            }
        }
        for p in 0..len {
            let in_table = self.map.get(&(self.parent[p], self.word[p])) == Some(&(p as u32))
                || self.roots.iter().any(|(_, r)| *r as usize == p);
            if in_table && refs[p] != self.refs[p] {
                return Err(format!(
                    "page {p}: {} references, counted {}",
                    refs[p], self.refs[p]
                ));
            }
            if in_table && refs[p] == 0 {
                return Err(format!("page {p} is held by nothing"));
            }
        }
        Ok(())
    }

    fn root(&mut self, namespace: &Namespace) -> u32 {
        if let Some((_, r)) = self.roots.iter().find(|(n, _)| n == namespace) {
            return *r;
        }
        let r = self.alloc(NONE, 0);
        self.refs[r as usize] += 1; // roots stay
        self.roots.push((namespace.clone(), r));
        r
    }

    fn alloc(&mut self, parent: u32, word: u64) -> u32 {
        let p = if let Some(p) = self.free.pop() {
            self.parent[p as usize] = parent;
            self.word[p as usize] = word;
            self.refs[p as usize] = 0;
            p
        } else {
            let p = self.parent.len() as u32;
            self.parent.push(parent);
            self.word.push(word);
            self.refs.push(0);
            for c in &mut self.candidates {
                c.grow(p as usize + 1);
            }
            p
        };
        if parent != NONE {
            self.refs[parent as usize] += 1;
        }
        p
    }

    /// Drops `p` from the table if nothing holds it, and its parents after it.
    fn release(&mut self, mut p: u32) {
        while self.refs[p as usize] == 0 {
            let parent = self.parent[p as usize];
            self.map.remove(&(parent, self.word[p as usize]));
            self.free.push(p);
            p = parent;
            self.refs[p as usize] -= 1;
        }
    }

    /// Replays one insert of `words` (one word per page, as the replica
    /// shadows keep) into every candidate at the main tree's high-water mark
    /// of device pages; true when the leader changed.
    pub fn mirror(&mut self, words: &[u64], namespace: &Namespace, held: usize) -> bool {
        self.capacity = self.capacity.max(held);
        self.clock += 1;
        let mut path = std::mem::take(&mut self.path);
        path.clear();
        let mut at = self.root(namespace);
        for &w in words.iter() {
            at = match self.map.get(&(at, w)) {
                Some(&p) => p,
                None => {
                    let p = self.alloc(at, w);
                    self.map.insert((at, w), p);
                    p
                }
            };
            path.push(at);
        }
        for i in 0..self.candidates.len() {
            let matched = self.replay(i, &path);
            self.last_hits[i] = matched;
            self.scores[i] = self.scores[i] - (self.scores[i] >> DECAY_SHIFT)
                + ((matched as u64) << SCORE_FRACTION_BITS);
        }
        // New pages no candidate kept (a zero capacity) leave again.
        for &p in path.iter().rev() {
            if self.refs[p as usize] != 0 {
                break;
            }
            self.release(p);
        }
        self.path = path;
        self.since_switch += 1;
        let best = (0..self.scores.len())
            .max_by_key(|&i| (self.scores[i], std::cmp::Reverse(i)))
            .expect("candidates");
        let lead = self.scores[self.leader];
        if self.scores[best] > lead + (lead >> SWITCH_MARGIN_SHIFT)
            && self.since_switch >= MIN_REQUESTS_BETWEEN
        {
            self.leader = best;
            self.since_switch = 0;
            return true;
        }
        false
    }

    /// One candidate's replay: hit its resident prefix, evict just enough
    /// (the matched path locked), admit what fits. Returns the pages hit.
    fn replay(&mut self, i: usize, path: &[u32]) -> usize {
        let now = self.clock;
        let cap = self.capacity;
        let c = &mut self.candidates[i];
        let matched = path
            .iter()
            .position(|&p| c.state[p as usize] != RESIDENT)
            .unwrap_or(path.len());
        for &p in &path[..matched] {
            c.hit(p as usize, now);
        }
        if c.ranking == Ranking::Priority && matched > 0 {
            c.hit_pages += matched as u64;
            c.rescale();
        }
        let new = path.len() - matched;
        // Lock: the deepest matched page leaves the evictable set meanwhile.
        let locked = (matched > 0).then(|| path[matched - 1] as usize);
        let lock_key = locked.filter(|&p| c.kids[p] == 0).map(|p| {
            c.leaves.remove(&(c.key[p], p as u32));
            (c.key[p], p as u32)
        });
        if c.resident + new > cap {
            self.evict(i, self.candidates[i].resident + new - cap);
        }
        let c = &mut self.candidates[i];
        if let Some(k) = lock_key {
            c.leaves.insert(k);
        }
        let keep = new.min(cap.saturating_sub(c.resident));
        for d in matched..matched + keep {
            let p = path[d] as usize;
            let c = &mut self.candidates[i];
            if d > 0 {
                let parent = path[d - 1] as usize;
                if c.kids[parent] == 0 {
                    c.leaves.remove(&(c.key[parent], parent as u32));
                }
                c.kids[parent] += 1;
            }
            self.admit(i, p, now);
        }
        matched
    }

    /// Page `p` enters candidate `i` (not resident there).
    fn admit(&mut self, i: usize, p: usize, now: u64) {
        let c = &mut self.candidates[i];
        let was = c.state[p];
        let mut queue = 0u64;
        if was == REMEMBERED {
            match c.ranking {
                Ranking::Priority | Ranking::Segmented => {
                    c.remembered_count[0] -= 1;
                    c.hits[p] += 1;
                    if c.ranking == Ranking::Priority {
                        c.returned_pages += 1;
                        c.rescale();
                    }
                }
                Ranking::Arc => {
                    let list = usize::from(c.key[p] & QUEUE_BIT != 0);
                    c.remembered_count[list] -= 1;
                    let (b1, b2) = (c.remembered_count[0].max(1), c.remembered_count[1].max(1));
                    if list == 0 {
                        c.target = (c.target + (b2 / b1).max(1)).min(self.capacity);
                    } else {
                        c.target = c.target.saturating_sub((b1 / b2).max(1));
                    }
                    c.hits[p] = 1;
                    queue = QUEUE_BIT;
                }
                Ranking::S3fifo => {
                    c.remembered_count[0] -= 1;
                    c.hits[p] = 0;
                    queue = QUEUE_BIT;
                }
                Ranking::Recency => unreachable!("recency remembers nothing"),
            }
        } else {
            self.refs[p] += 1;
            c.hits[p] = if c.ranking == Ranking::S3fifo { 0 } else { 1 };
        }
        c.state[p] = RESIDENT;
        c.resident += 1;
        c.kids[p] = 0;
        if matches!(c.ranking, Ranking::Arc | Ranking::S3fifo) {
            c.queue_pages[usize::from(queue != 0)] += 1;
        }
        let key = c.order_key(p, now, queue);
        c.key[p] = key;
        c.leaves.insert((key, p as u32));
    }

    /// Frees at least `need` pages of candidate `i` from its leaves.
    fn evict(&mut self, i: usize, need: usize) {
        let mut freed = 0;
        while freed < need {
            let c = &mut self.candidates[i];
            let Some((key, p)) = pick(c) else { break };
            let p = p as usize;
            match c.ranking {
                Ranking::S3fifo if c.hits[p] > 0 => {
                    // A second chance: to main's tail with one hit fewer
                    // (from small: with none).
                    let from_small = c.queue_of(p) == 0;
                    c.hits[p] = if from_small { 0 } else { c.hits[p] - 1 };
                    if from_small {
                        c.queue_pages[0] -= 1;
                        c.queue_pages[1] += 1;
                    }
                    c.leaves.remove(&(key, p as u32));
                    c.seq += 1;
                    c.key[p] = QUEUE_BIT | c.seq;
                    c.leaves.insert((c.key[p], p as u32));
                    continue;
                }
                _ => {}
            }
            c.leaves.remove(&(key, p as u32));
            c.resident -= 1;
            freed += 1;
            if c.ranking == Ranking::Priority {
                c.floor = c.floor.max(c.last[p]);
            }
            let queue = c.queue_of(p);
            if matches!(c.ranking, Ranking::Arc | Ranking::S3fifo) {
                c.queue_pages[queue] -= 1;
            }
            let parent = self.parent[p];
            if c.kids.get(parent as usize).is_some() && c.state[parent as usize] == RESIDENT {
                c.kids[parent as usize] -= 1;
                if c.kids[parent as usize] == 0 {
                    c.leaves.insert((c.key[parent as usize], parent));
                }
            }
            let list = match c.ranking {
                Ranking::Recency => None,
                Ranking::S3fifo => (queue == 0).then_some(0),
                Ranking::Arc => Some(queue),
                Ranking::Priority | Ranking::Segmented => Some(0),
            };
            match list {
                Some(list) => {
                    c.state[p] = REMEMBERED;
                    // ARC's list rides in the key's queue bit.
                    c.key[p] = if list == 1 { QUEUE_BIT } else { 0 };
                    c.remembered[list].push_back(p as u32);
                    c.remembered_count[list] += 1;
                    self.trim_remembered(i);
                }
                None => {
                    c.state[p] = ABSENT;
                    self.refs[p] -= 1;
                    self.release(p as u32);
                }
            }
        }
    }

    /// Keeps each candidate's remembered pages within its bound.
    fn trim_remembered(&mut self, i: usize) {
        let c = &self.candidates[i];
        let cap = self.capacity;
        let bounds = match c.ranking {
            Ranking::Priority | Ranking::Segmented => [HISTORY_PER_CACHED_PAGE * cap, 0],
            Ranking::S3fifo => [cap, 0],
            Ranking::Arc => {
                let [t1, t2] = c.queue_pages;
                let b1 = cap.saturating_sub(t1);
                let b1_now = c.remembered_count[0].min(b1);
                [b1, (2 * cap).saturating_sub(t1 + t2 + b1_now)]
            }
            Ranking::Recency => [0, 0],
        };
        for (list, bound) in bounds.into_iter().enumerate() {
            loop {
                let c = &mut self.candidates[i];
                if c.remembered_count[list] <= bound {
                    break;
                }
                let Some(p) = c.remembered[list].pop_front() else {
                    break;
                };
                let p = p as usize;
                let in_list = usize::from(c.key[p] & QUEUE_BIT != 0);
                // Stale: taken back since (or now in the other list).
                if c.state[p] != REMEMBERED || (c.ranking == Ranking::Arc && in_list != list) {
                    continue;
                }
                c.state[p] = ABSENT;
                c.remembered_count[list] -= 1;
                self.refs[p] -= 1;
                self.release(p as u32);
            }
        }
    }
}

/// The candidate's next victim among its leaves.
fn pick(c: &Candidate) -> Option<(u64, u32)> {
    let first_queue = match c.ranking {
        Ranking::Arc => Some(usize::from(c.queue_pages[0] <= c.target)),
        Ranking::S3fifo => Some(usize::from(c.queue_pages[0] * 10 <= c.resident)),
        _ => None,
    };
    match first_queue {
        None => c.leaves.first().copied(),
        Some(q) => {
            let (lo, hi) = if q == 0 {
                (0, QUEUE_BIT)
            } else {
                (QUEUE_BIT, u64::MAX)
            };
            c.leaves
                .range((lo, 0)..(hi, 0))
                .next()
                .or_else(|| c.leaves.first())
                .copied()
        }
    }
}
