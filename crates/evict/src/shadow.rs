//! Shadow caches for `Policy::Ghost` (miniature simulations, Waldspurger et
//! al., ATC '17): one miniature cache per candidate ranking (a lean cache,
//! `lean_candidate.rs`) replays the sampled inserts (`sampling.rs`:
//! requests whose first pages hash under a threshold) at the sampled share
//! of the tree's capacity and counts the pages it would have hit; the tree
//! ranks its leaves the way the candidate with the most recent hits does. Scores, their decay and the switch
//! spacing count sampled inserts: each miniature keeps its own time.
//!
//! No single ranking wins everywhere: plain recency is best where the cache
//! holds nearly all reuse, a segmented ranking that remembers hits across
//! evictions where long documents come back with new questions, the ghost
//! priority where conversations return from beyond the cache's reach, and
//! arc or s3fifo at some sizes in between (their shadows are those policies
//! themselves; the tree that follows one builds its queue state from its
//! nodes, see `PrefixTree::follow`). The shadows measure which one fits the
//! traffic and the capacity at hand, online, instead of a constant chosen
//! offline.
//!
//! The switch needs the challenger ahead by more than 1/`SWITCH_MARGIN_SHIFT`
//! powers of two of the leader's score and at least `MIN_REQUESTS_BETWEEN`
//! mirrored inserts since the last switch: a switch re-keys every node
//! (O(n log n)), and a ranking needs time to shape the cache before it is
//! judged. Chosen on the conversation trace and checked on the
//! synthetic one (and the other way round), see `docs/ghost.md`.
//!
//! Memory: a shadow keeps one word per page, not the page's tokens (see
//! `page_words`), and holds at most its miniature share of the tree's peak
//! device pages plus its own history (a ghost history of 4x that; arc's and
//! s3fifo's ghost lists, at most 1x), so the shadows together are bounded
//! by a constant times the sampled capacity, and
//! `PrefixTree::policy_memory` reports them.

use crate::child_key::page_words;
use crate::error::EvictError;
use crate::ids::{NodeId, Token};
use crate::lean_candidate::LeanCandidate;
use crate::namespace::Namespace;
use crate::policy::Policy;
use crate::queue_shared::Slot;
use crate::ranking::{Ranking, CANDIDATES};
use crate::sampling::Sampling;
use crate::transplant::{queue_order, QueueShadow};
use crate::tree::{PrefixTree, RankingChooser};
use cpkv_hash::Hasher64;
use cpkv_wire::{Reader, Writer};

/// Scores decay by 1/2^DECAY_SHIFT per mirrored insert (a window of about
/// a thousand requests) when every request is mirrored.
const DECAY_SHIFT: u32 = 10;
/// A sampled window is never shorter than about 2^MIN_DECAY_SHIFT
/// mirrored inserts: fewer sampled requests cannot tell the candidates apart.
const MIN_DECAY_SHIFT: u32 = 6;
/// Scores count hit pages in fixed point, so the decay does not round
/// small counts away.
const SCORE_FRACTION_BITS: u32 = 8;
/// A challenger must lead by more than score / 2^SWITCH_MARGIN_SHIFT.
const SWITCH_MARGIN_SHIFT: u32 = 7;
const MIN_REQUESTS_BETWEEN: u64 = 64;

/// The decay shift and switch spacing, in mirrored inserts, when the
/// sample is 1/2^`halvings` of the requests: the window keeps about the
/// same number of requests of the whole stream (down to
/// 2^MIN_DECAY_SHIFT mirrored ones) and the spacing shrinks with it. Kept
/// in sampled inserts, a miniature at a rate of 1/8 judged over 8,000
/// requests and followed a stale leader (docs/ghost.md, "Sampled
/// candidates").
fn window(halvings: u32) -> (u32, u64) {
    let shift = DECAY_SHIFT.saturating_sub(halvings).max(MIN_DECAY_SHIFT);
    (
        shift,
        (MIN_REQUESTS_BETWEEN >> (DECAY_SHIFT - shift)).max(4),
    )
}

impl PrefixTree {
    /// An empty tree with pages of `page_size` tokens, evicting by `policy`.
    /// A `Policy::Ghost` tree is made here, under its shadows: the layer
    /// that chooses its ranking sits above the tree, which knows it only as
    /// a `RankingChooser`.
    pub fn new(page_size: usize, policy: Policy) -> Result<Self, EvictError> {
        let mut tree = Self::without_chooser(page_size, policy)?;
        if policy == Policy::Ghost {
            tree.follow_chooser(Box::new(Shadows::new(page_size, Sampling::DEFAULT)));
        }
        Ok(tree)
    }

    /// A `Policy::Ghost` tree whose candidates sample as `sampling` says
    /// (`Sampling::EXACT`: full-size replicas fed every request). For tests
    /// and measurements that compare the sampled choice with the exact one;
    /// not a policy users pick.
    #[doc(hidden)]
    pub fn ghost_sampled(page_size: usize, sampling: Sampling) -> Result<Self, EvictError> {
        let mut tree = Self::without_chooser(page_size, Policy::Ghost)?;
        tree.follow_chooser(Box::new(Shadows::new(page_size, sampling)));
        Ok(tree)
    }
}

/// One candidate's miniature cache: a lean cache (`lean_candidate.rs`),
/// or in tests and measurements the replica it is held against (a shadow
/// `PrefixTree` ranking as the candidate does; the lean cache hits exactly
/// what it hits).
#[derive(Debug, Clone)]
// Replicas and lean caches are both large: boxing either would add a
// pointer chase to every mirrored request and save nothing.
#[allow(clippy::large_enum_variant)]
enum Candidate {
    Lean(LeanCandidate),
    #[cfg(any(test, feature = "floor-measurements"))]
    Replica(PrefixTree),
}

/// The snapshot tag of a candidate (earlier versions also had replicas).
const LEAN: u8 = 1;

impl Candidate {
    /// Replays one request of page words (see `PrefixTree::replay`);
    /// replicas number their fresh pages from `next_page`, and a lean
    /// candidate, which numbers none, moves it on by the pages it stores as
    /// its replica did, so a replica beside it has the pages and digest it
    /// had beside a replica.
    fn replay(
        &mut self,
        pages: &[Token],
        namespace: &Namespace,
        cap: usize,
        next_page: &mut u64,
    ) -> usize {
        match self {
            Self::Lean(lean) => {
                let (hit, stored) = lean.replay(pages, namespace, cap);
                *next_page += stored as u64;
                hit
            }
            #[cfg(any(test, feature = "floor-measurements"))]
            Self::Replica(t) => t.replay(pages, namespace, cap, next_page),
        }
    }

    fn digest(&self) -> u64 {
        match self {
            Self::Lean(lean) => lean.digest(),
            #[cfg(any(test, feature = "floor-measurements"))]
            Self::Replica(t) => t.digest(),
        }
    }

    /// Nodes (entries), and pages held or remembered.
    fn memory(&self) -> (usize, usize) {
        match self {
            Self::Lean(lean) => (lean.entries(), lean.pages() + lean.remembered_pages()),
            #[cfg(any(test, feature = "floor-measurements"))]
            Self::Replica(t) => (t.len(), t.device_pages() + t.remembered_pages()),
        }
    }

    /// Pages it holds (a miniature's device pages).
    #[cfg(test)]
    fn pages(&self) -> usize {
        match self {
            Self::Lean(lean) => lean.pages(),
            Self::Replica(t) => t.device_pages(),
        }
    }

    /// ARC's adapted target, for the ARC candidate.
    fn arc_target(&self) -> Option<u64> {
        match self {
            Self::Lean(lean) => lean.arc_target(),
            #[cfg(any(test, feature = "floor-measurements"))]
            Self::Replica(t) => t.queue_state().arc_target(),
        }
    }

    /// What a tree following this queue candidate reads its order from.
    fn queue_shadow(&self) -> &dyn QueueShadow {
        match self {
            Self::Lean(lean) => lean,
            #[cfg(any(test, feature = "floor-measurements"))]
            Self::Replica(t) => t,
        }
    }

    fn check(&self) -> Result<(), String> {
        match self {
            Self::Lean(lean) => lean.check(),
            #[cfg(any(test, feature = "floor-measurements"))]
            Self::Replica(t) => t.check_invariants().map_err(|e| e.to_string()),
        }
    }

    fn encode(&self, w: &mut Writer) {
        match self {
            Self::Lean(lean) => {
                w.u8(LEAN);
                lean.encode(w);
            }
            #[cfg(any(test, feature = "floor-measurements"))]
            Self::Replica(_) => unreachable!("replicas are models, never snapshotted"),
        }
    }
}

/// `ranking`'s replica: what `Shadows` ran for each candidate before the
/// lean ones, and the model they are tested against (a page-size-1 tree
/// ranking as the candidate does).
#[cfg(any(test, feature = "floor-measurements"))]
pub(crate) fn candidate_replica(ranking: Ranking) -> PrefixTree {
    let policy = ranking.queue_policy().unwrap_or(Policy::Ghost);
    let mut t = PrefixTree::without_chooser(1, policy).expect("page size 1");
    t.set_event_limit(0); // no one reads a replica's residency events
    if policy == Policy::Ghost {
        t.make_shadow(ranking);
    }
    t
}

#[derive(Debug, Clone)]
pub struct Shadows {
    /// The main tree's page size; the shadows hold one word per page.
    page_size: usize,
    /// One per ranking of `CANDIDATES`, in its order.
    candidates: Vec<Candidate>,
    /// Decayed hit pages per candidate.
    scores: Vec<u64>,
    leader: usize,
    next_page: u64,
    /// The most device pages the main tree has held.
    capacity: usize,
    /// Sampled inserts since the last switch.
    since_switch: u64,
    /// Which inserts the shadows see, and at what share of `capacity`.
    sampling: Sampling,
}

impl Shadows {
    /// Shadows of a tree with pages of `page_size` tokens, sampling as
    /// `sampling` says.
    pub fn new(page_size: usize, sampling: Sampling) -> Self {
        Self {
            page_size,
            candidates: CANDIDATES
                .iter()
                .map(|&r| Candidate::Lean(LeanCandidate::new(r)))
                .collect(),
            scores: vec![0; CANDIDATES.len()],
            leader: 0,
            next_page: 0,
            capacity: 0,
            since_switch: 0,
            sampling,
        }
    }

    /// The target the ARC shadow has adapted to (0 before it has one),
    /// scaled from its miniature to the whole cache.
    pub fn arc_target(&self) -> u64 {
        let arc = CANDIDATES.iter().position(|r| *r == Ranking::Arc);
        let target = arc
            .and_then(|i| self.candidates[i].arc_target())
            .unwrap_or(0);
        self.sampling.scale_up(self.capacity, target)
    }

    pub fn leader(&self) -> Ranking {
        CANDIDATES[self.leader]
    }

    /// Replays one insert of whole-page `tokens` into every shadow, as an
    /// engine would (match, evict just enough, insert) at the miniature
    /// share of the main tree's high-water mark of device pages, `held`
    /// included, when its prefix root is in the sample. True when the
    /// leader changed (the caller re-keys its leaves).
    pub fn mirror(&mut self, tokens: &[Token], namespace: &Namespace, held: usize) -> bool {
        self.capacity = self.capacity.max(held);
        if !self
            .sampling
            .samples(self.capacity, namespace, tokens, self.page_size)
        {
            return false;
        }
        let cap = self.sampling.miniature_capacity(self.capacity);
        let (decay_shift, min_between) = window(self.sampling.halvings(self.capacity));
        let pages = page_words(tokens, self.page_size);
        for (i, c) in self.candidates.iter_mut().enumerate() {
            let matched = c.replay(&pages, namespace, cap, &mut self.next_page);
            self.scores[i] = self.scores[i] - (self.scores[i] >> decay_shift)
                + ((matched as u64) << SCORE_FRACTION_BITS);
        }
        self.since_switch += 1;
        let best = (0..self.scores.len())
            .max_by_key(|&i| (self.scores[i], std::cmp::Reverse(i)))
            .expect("candidates");
        let lead = self.scores[self.leader];
        if self.scores[best] > lead + (lead >> SWITCH_MARGIN_SHIFT)
            && self.since_switch >= min_between
        {
            self.leader = best;
            self.since_switch = 0;
            return true;
        }
        false
    }

    pub fn digest(&self) -> u64 {
        let mut h = Hasher64::default()
            .word(self.leader as u64)
            .word(self.next_page)
            .word(self.capacity as u64)
            .word(self.since_switch)
            .word(u64::from(self.sampling.rate_shift()))
            .word(self.sampling.floor());
        for (c, s) in self.candidates.iter().zip(&self.scores) {
            h = h.word(c.digest()).word(*s);
        }
        h.finish()
    }

    /// Every field, for snapshots: the counters and the sampling, then per
    /// candidate its score, its kind and its whole body.
    pub(crate) fn encode(&self, w: &mut Writer) {
        for v in [
            self.leader as u64,
            self.next_page,
            self.capacity as u64,
            self.since_switch,
            u64::from(self.sampling.rate_shift()),
            self.sampling.floor(),
        ] {
            w.u64(v);
        }
        for (c, score) in self.candidates.iter().zip(&self.scores) {
            w.u64(*score);
            c.encode(w);
        }
    }

    /// The inverse of `encode`: each candidate a lean cache of its
    /// ranking, decoded and checked (`LeanCandidate::decode`), holding no
    /// more than the miniature capacity.
    pub(crate) fn decode(r: &mut Reader<'_>, page_size: usize) -> Result<Self, String> {
        let leader = r.u64()?;
        let leader = usize::try_from(leader)
            .ok()
            .filter(|l| *l < CANDIDATES.len())
            .ok_or(format!("shadow leader {leader} out of range"))?;
        let next_page = r.u64()?;
        let capacity = usize::try_from(r.u64()?).map_err(|_| "shadow capacity out of range")?;
        let since_switch = r.u64()?;
        let rate_shift = u32::try_from(r.u64()?).map_err(|_| "shadow rate_shift out of range")?;
        let sampling = Sampling::new(rate_shift, r.u64()?).map_err(|e| e.to_string())?;
        let miniature = sampling.miniature_capacity(capacity);
        let mut candidates = Vec::with_capacity(CANDIDATES.len());
        let mut scores = Vec::with_capacity(CANDIDATES.len());
        for ranking in CANDIDATES {
            scores.push(r.u64()?);
            let tag = r.u8()?;
            if tag != LEAN {
                return Err(format!("shadow {ranking:?}: bad candidate tag {tag}"));
            }
            let lean = LeanCandidate::decode(r, ranking)
                .map_err(|e| format!("shadow {ranking:?}: {e}"))?;
            if lean.pages() > miniature {
                return Err(format!("shadow {ranking:?} holds more than its capacity"));
            }
            candidates.push(Candidate::Lean(lean));
        }
        Ok(Self {
            page_size,
            candidates,
            scores,
            leader,
            next_page,
            capacity,
            since_switch,
            sampling,
        })
    }

    pub fn memory(&self) -> (usize, usize) {
        self.candidates
            .iter()
            .map(Candidate::memory)
            .fold((0, 0), |(n, p), (cn, cp)| (n + cn, p + cp))
    }

    /// Checks every candidate's own invariants (for `check_invariants`).
    pub fn check(&self) -> Result<(), String> {
        self.candidates
            .iter()
            .try_for_each(|c| c.check().map_err(|e| format!("shadow: {e}")))
    }
}

/// Issue 36's comparison: each candidate's hit pages per request under the
/// exact (unsampled) shadows, fed one-token pages with the main tree holding
/// `held` (a lean candidate hits what its replica hits).
#[doc(hidden)]
pub fn candidate_hits(requests: &[Vec<Token>], held: usize) -> Vec<[usize; 5]> {
    let mut s = Shadows::new(1, Sampling::EXACT);
    requests
        .iter()
        .map(|pages| {
            s.capacity = s.capacity.max(held);
            let mut hits = [0; 5];
            for (i, c) in s.candidates.iter_mut().enumerate() {
                hits[i] = c.replay(pages, &Namespace::Default, s.capacity, &mut s.next_page);
            }
            hits
        })
        .collect()
}

/// The hits per request of the recency candidate fed `requests` (page
/// words) at `cap` pages: the lean one, or a recency replica. For the
/// measuring example (`examples/lean_candidate.rs`).
#[cfg(feature = "floor-measurements")]
#[doc(hidden)]
pub fn recency_candidate_hits(requests: &[Vec<Token>], cap: usize, lean: bool) -> Vec<usize> {
    let mut candidate = if lean {
        Candidate::Lean(LeanCandidate::new(Ranking::Recency))
    } else {
        Candidate::Replica(candidate_replica(Ranking::Recency))
    };
    let mut next_page = 0;
    requests
        .iter()
        .map(|p| candidate.replay(p, &Namespace::Default, cap, &mut next_page))
        .collect()
}

impl RankingChooser for Shadows {
    fn watch(&mut self, tokens: &[Token], namespace: &Namespace, held: usize) -> bool {
        self.mirror(tokens, namespace, held)
    }
    fn leader(&self) -> Ranking {
        CANDIDATES[self.leader]
    }
    fn capacity(&self) -> usize {
        self.capacity
    }
    fn arc_target(&self) -> u64 {
        self.arc_target()
    }
    fn queue_order(&self, tree: &PrefixTree) -> Vec<(NodeId, Slot)> {
        let miniature = self.sampling.miniature_capacity(self.capacity) < self.capacity;
        queue_order(tree, self.candidates[self.leader].queue_shadow(), miniature)
    }
    fn digest(&self) -> u64 {
        self.digest()
    }
    fn encode(&self, w: &mut Writer) {
        self.encode(w)
    }
    fn memory(&self) -> (usize, usize) {
        self.memory()
    }
    fn check(&self) -> Result<(), String> {
        self.check()
    }
    fn boxed_clone(&self) -> Box<dyn RankingChooser> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Requests of one-token pages: conversations under `roots` prefix
    /// roots, each request a root, a shared middle and a fresh tail.
    fn requests() -> impl Strategy<Value = Vec<Vec<Token>>> {
        let request = (0u64..60, 0u64..4, 1usize..6, 0u64..1000);
        prop::collection::vec(request, 50..400).prop_map(|rs| {
            rs.into_iter()
                .map(|(root, mid, len, tail)| {
                    let mut r = vec![root, 100 + root * 10 + mid];
                    r.extend((0..len as u64).map(|k| 10_000 + tail * 10 + k));
                    r
                })
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// The model: sampled shadows are exact shadows fed only the
        /// requests whose prefix root is under the threshold, at the
        /// miniature capacity. Their trees agree after every request, the
        /// sampled ones hold no more than the miniature capacity, and every
        /// invariant holds.
        #[test]
        fn sampled_shadows_are_exact_shadows_fed_the_sample(
            requests in requests(), shift in 1u32..4, held in 40usize..200,
        ) {
            let sampling = Sampling::new(shift, 8).unwrap();
            let mini = sampling.miniature_capacity(held);
            prop_assert!(mini < held);
            let (mut sampled, mut model) = (Shadows::new(1, sampling), Shadows::new(1, Sampling::EXACT));
            let ns = Namespace::Default;
            let mut seen = 0;
            for r in &requests {
                sampled.mirror(r, &ns, held);
                if sampling.samples(held, &ns, r, 1) {
                    model.mirror(r, &ns, mini);
                    seen += 1;
                }
                for (a, b) in sampled.candidates.iter().zip(&model.candidates) {
                    prop_assert_eq!(a.digest(), b.digest());
                    prop_assert!(a.pages() <= mini);
                }
                sampled.check().map_err(TestCaseError::fail)?;
            }
            prop_assert!(seen < requests.len() || requests.len() < 64, "something left out");
        }

        /// The model of the lean candidates in place: shadows whose
        /// candidates are replicas (what ghost ran before) fed the same
        /// requests in several namespaces, sampled, keep the same scores,
        /// leader, switches and ARC target after every request, each
        /// candidate holding and remembering what its replica does, and a
        /// tree following the leader takes the same queue order from either.
        #[test]
        fn the_lean_candidates_score_as_their_replicas(
            requests in requests(), shift in 0u32..3, held in 40usize..200, spaces in 1u64..4,
        ) {
            let sampling = match shift {
                0 => Sampling::EXACT,
                _ => Sampling::new(shift, 8).unwrap(),
            };
            let mut lean = Shadows::new(1, sampling);
            let mut model = Shadows::new(1, sampling);
            for (k, ranking) in CANDIDATES.into_iter().enumerate() {
                model.candidates[k] = Candidate::Replica(candidate_replica(ranking));
            }
            let mut tree = PrefixTree::new(1, Policy::Lru).unwrap();
            for (i, r) in requests.iter().enumerate() {
                let ns = match i as u64 % spaces {
                    0 => Namespace::Default,
                    n => Namespace::Id(n),
                };
                prop_assert_eq!(lean.mirror(r, &ns, held), model.mirror(r, &ns, held), "switch at {}", i);
                prop_assert_eq!(&lean.scores, &model.scores);
                prop_assert_eq!(lean.leader, model.leader);
                for k in 0..CANDIDATES.len() {
                    prop_assert_eq!(lean.candidates[k].memory().1, model.candidates[k].memory().1);
                }
                prop_assert_eq!(lean.arc_target(), model.arc_target());
                // The main tree holds this request too; its order, taken
                // from each queue candidate, is the same.
                let m = tree.match_prefix(r, &ns);
                let mut ids = m.device_pages;
                let fresh = (r.len() - ids.len()) as u64;
                ids.extend(1_000_000 * (i as u64 + 1)..1_000_000 * (i as u64 + 1) + fresh);
                tree.insert(r, &ids, &ns).unwrap();
                for k in [3, 4] {
                    for miniature in [false, true] {
                        prop_assert_eq!(
                            queue_order(&tree, lean.candidates[k].queue_shadow(), miniature),
                            queue_order(&tree, model.candidates[k].queue_shadow(), miniature)
                        );
                    }
                }
            }
            lean.check().map_err(TestCaseError::fail)?;
        }
    }

    /// An insert whose key (its first four pages) is out of the sample
    /// leaves every shadow and the score as they were; one inside, longer
    /// than its key, moves them. The digest names the
    /// sampling, so trees that sample differently never agree by accident.
    #[test]
    fn only_sampled_keys_reach_the_shadows() {
        let sampling = Sampling::new(3, 8).unwrap();
        let ns = Namespace::Default;
        let (held, roots) = (256, 0..200u64);
        let sampled = |r: u64| sampling.samples(held, &ns, &[r, 1, 2, 3], 1);
        let outside = roots.clone().find(|&r| !sampled(r)).unwrap();
        let inside = roots.clone().find(|&r| sampled(r)).unwrap();
        let mut s = Shadows::new(1, sampling);
        s.mirror(&[inside, 1, 2, 3], &ns, held);
        let before = s.digest();
        let trees: Vec<u64> = s.candidates.iter().map(Candidate::digest).collect();
        s.mirror(&[outside, 1, 2, 3], &ns, held);
        assert_eq!(s.digest(), before, "an unsampled root changes nothing");
        s.mirror(&[inside, 1, 2, 3, 5], &ns, held);
        let after: Vec<u64> = s.candidates.iter().map(Candidate::digest).collect();
        assert!(
            after.iter().zip(&trees).all(|(a, b)| a != b),
            "a sampled one reaches all five"
        );
        let other = Shadows::new(1, Sampling::new(4, 8).unwrap());
        assert_ne!(Shadows::new(1, sampling).digest(), other.digest());
    }

    #[test]
    fn only_the_shadows_whose_order_uses_it_remember_dropped_content() {
        let mut s = Shadows::new(1, Sampling::EXACT);
        for i in 0..200u64 {
            let tokens = [i % 40, 1000 + i % 17, 2000 + i];
            s.mirror(&tokens, &Namespace::Default, 30);
        }
        let remembered: Vec<usize> = s
            .candidates
            .iter()
            .map(|c| match c {
                Candidate::Replica(t) => t.remembered_pages(),
                Candidate::Lean(lean) => lean.remembered_pages(),
            })
            .collect();
        assert_eq!(CANDIDATES[1], Ranking::Recency);
        assert!(remembered[0] > 0 && remembered[2] > 0, "{remembered:?}");
        assert_eq!(remembered[1], 0, "recency keeps no history");
        assert!(
            s.candidates.iter().all(|c| matches!(c, Candidate::Lean(_))),
            "every candidate is a lean cache"
        );
        s.check().unwrap();
    }

    /// The measuring hook replays what the shadows replay: its hits, scored
    /// as `mirror` scores them, give the shadows' own scores and leader.
    #[test]
    fn candidate_hits_are_the_hits_the_shadows_score() {
        let requests: Vec<Vec<Token>> = (0..600u64)
            .map(|i| {
                // Conversations of growing length among one-shot documents.
                let (c, len) = (i % 13, 2 + (i * 7) % 5);
                match i % 4 {
                    0 => (0..5).map(|k| 1_000_000 + 5 * i + k).collect(),
                    _ => (0..len)
                        .map(|k| 1000 * c + k)
                        .chain([500_000 + i])
                        .collect(),
                }
            })
            .collect();
        let hits = candidate_hits(&requests, 30);
        let mut s = Shadows::new(1, Sampling::EXACT);
        let mut scores = [0u64; 5];
        for (pages, h) in requests.iter().zip(&hits) {
            s.mirror(pages, &Namespace::Default, 30);
            for (score, hit) in scores.iter_mut().zip(h) {
                *score = *score - (*score >> DECAY_SHIFT) + ((*hit as u64) << SCORE_FRACTION_BITS);
            }
            assert_eq!(s.scores, scores);
        }
        assert!(
            hits.iter().any(|h| h[0] != h[3]),
            "the candidates differ somewhere"
        );
    }

    /// Shadows of trees with pages of 1 and of 8 tokens, fed the same
    /// pages: the same scores and leaders, one word per page either way.
    #[test]
    fn shadows_keep_one_word_per_page_whatever_the_page_size() {
        let (mut one, mut eight) = (
            Shadows::new(1, Sampling::EXACT),
            Shadows::new(8, Sampling::EXACT),
        );
        for i in 0..400u64 {
            let pages = [i % 7, 100 + i % 13, 200 + i % 29, 300 + i];
            let tokens: Vec<Token> = pages
                .iter()
                .flat_map(|&p| (0..8).map(move |k| p * 8 + k))
                .collect();
            let a = one.mirror(&pages, &Namespace::Default, 40);
            let b = eight.mirror(&tokens, &Namespace::Default, 40);
            assert_eq!(a, b, "switch at insert {i}");
            assert_eq!(one.scores, eight.scores, "scores at insert {i}");
        }
        let pages =
            |s: &Shadows| -> Vec<usize> { s.candidates.iter().map(Candidate::pages).collect() };
        assert!(pages(&eight).iter().all(|&p| p > 0));
        assert_eq!(pages(&one), pages(&eight), "one word per page");
        assert_eq!(one.memory(), eight.memory());
        eight.check().unwrap();
    }
}
