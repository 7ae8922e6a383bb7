//! Which requests `Policy::Ghost`'s candidates see: spatial sampling after
//! SHARDS (Waldspurger et al., FAST '15), so the candidates run as miniature
//! caches (Waldspurger et al., ATC '17) instead of full-size replicas.
//!
//! A request enters the candidates only when the hash of its sampling key
//! (its namespace and its first `KEY_PAGES` pages, all of them when it has
//! fewer) falls under a threshold, so a subtree that deep is in or out whole
//! and prefix hits keep their meaning inside the sample. The key is deeper
//! than the first page because traffic shares short roots: every request of
//! the conversation trace starts with the same block (one root: sampled by
//! its first page, the trace is all in or all out), and a few roots of the
//! generated `slow` workload carry a fifth of its requests each over their
//! first three blocks; four pages spread both (at most 43 and 15 requests a
//! key). Content above that depth (a shared system prompt) is kept warm in
//! the miniatures by the sampled requests alone, as hot there as in the
//! whole cache.
//! The threshold is `2^64 / 2^rate_shift` (the rate R), raised so the
//! sample still fills `floor` pages of a small cache (SHARDS' fixed-size
//! variant): rate = min(1, max(R, floor / C)) for a cache of C pages, and
//! each candidate holds rate x C pages. At or below `floor` pages every
//! request is sampled and the candidates are exact replicas.
//!
//! C is the most pages the tree has held, so it only grows, the rate only
//! falls, and the sampled roots at a lower rate are a subset of those at a
//! higher one. Content of roots that left the sample stays in the
//! miniatures until their policies evict it (it is never requested there
//! again); it only shortens them while the cache warms up.
//!
//! The hash is `cpkv_hash`'s fixed-seed construction, so every rank samples
//! the same requests; the parameters are in the digest and the snapshot.

use crate::child_key::page_word;
use crate::digest::namespace_hash;
use crate::error::EvictError;
use crate::ids::Token;
use crate::namespace::Namespace;
use cpkv_hash::Hasher64;

const ALL: u128 = 1 << 64;
/// The pages of a request its sampling key covers.
pub const KEY_PAGES: usize = 4;
const KEY_TAG: u64 = 0x5a39_1e00_0000_0001;

/// The rate (`1 / 2^rate_shift`) and floor (pages) of the sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampling {
    rate_shift: u32,
    floor: u64,
}

impl Sampling {
    /// Every request, at full size: the replicas ghost ran before sampling.
    /// Reachable from tests and measurements only (`PrefixTree::ghost_sampled`).
    pub const EXACT: Self = Self {
        rate_shift: 0,
        floor: 0,
    };
    /// The rate and floor ghost runs with, chosen by measurement
    /// (`docs/ghost.md`, "Sampled candidates").
    pub const DEFAULT: Self = Self {
        rate_shift: 5,
        floor: 16384,
    };
    /// The most a rate may be divided: below 2^-32 of 2^64 a threshold
    /// samples too few roots to mean anything.
    pub const MAX_RATE_SHIFT: u32 = 32;

    /// A rate of `1 / 2^rate_shift` with a floor of `floor` pages; a shift
    /// of 0 samples everything (the floor is then moot and must be 0).
    pub fn new(rate_shift: u32, floor: u64) -> Result<Self, EvictError> {
        if rate_shift > Self::MAX_RATE_SHIFT {
            return Err(EvictError::InvalidSampling(format!(
                "sampling rate_shift must be in [0, {}], got {rate_shift}",
                Self::MAX_RATE_SHIFT
            )));
        }
        if rate_shift == 0 && floor != 0 {
            return Err(EvictError::InvalidSampling(format!(
                "sampling floor must be 0 when rate_shift is 0, got {floor}"
            )));
        }
        Ok(Self { rate_shift, floor })
    }

    pub fn rate_shift(self) -> u32 {
        self.rate_shift
    }

    pub fn floor(self) -> u64 {
        self.floor
    }

    pub fn is_exact(self) -> bool {
        self.rate_shift == 0
    }

    /// The threshold, out of 2^64, for a cache of `capacity` pages.
    fn threshold(self, capacity: usize) -> u128 {
        let capacity = capacity as u128;
        if self.is_exact() || capacity <= u128::from(self.floor) {
            return ALL;
        }
        (ALL >> self.rate_shift).max(u128::from(self.floor) * ALL / capacity)
    }

    /// The pages a miniature candidate holds for a cache of `capacity`
    /// pages: the sampled share of it, rounded up.
    pub fn miniature_capacity(self, capacity: usize) -> usize {
        let t = self.threshold(capacity);
        ((capacity as u128 * t).div_ceil(ALL)) as usize
    }

    /// How many times 1 halves to reach the rate at `capacity`, rounded up
    /// (0 when every request is sampled).
    pub fn halvings(self, capacity: usize) -> u32 {
        self.threshold(capacity).leading_zeros() - 63
    }

    /// Whether a request of `tokens` (whole pages of `page_size` tokens) in
    /// `namespace` enters the candidates while the cache holds `capacity`
    /// pages. Only its first `KEY_PAGES` pages are read, and only when
    /// sampling; a request without a whole page has no key and stays out.
    pub fn samples(
        self,
        capacity: usize,
        namespace: &Namespace,
        tokens: &[Token],
        page_size: usize,
    ) -> bool {
        let t = self.threshold(capacity);
        if t == ALL {
            return true;
        }
        let pages = (tokens.len() / page_size).min(KEY_PAGES);
        if pages == 0 {
            return false;
        }
        let mut h = Hasher64::new(KEY_TAG)
            .word(namespace_hash(namespace))
            .word(pages as u64);
        for page in tokens[..pages * page_size].chunks_exact(page_size) {
            h = h.word(page_word(page[0], &page[1..]));
        }
        u128::from(h.finish()) < t
    }

    /// A count measured in a miniature of `capacity`'s cache (ARC's target),
    /// scaled back to the whole cache.
    pub fn scale_up(self, capacity: usize, miniature_count: u64) -> u64 {
        let mini = self.miniature_capacity(capacity);
        if mini >= capacity || mini == 0 {
            return miniature_count;
        }
        (u128::from(miniature_count) * capacity as u128 / mini as u128) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_keeps_small_caches_whole_and_the_rate_takes_over_above() {
        let s = Sampling::new(5, 1024).unwrap();
        assert_eq!(
            s.miniature_capacity(500),
            500,
            "at or below the floor: exact"
        );
        assert_eq!(s.miniature_capacity(1024), 1024);
        assert_eq!(s.miniature_capacity(4096), 1024, "the floor");
        assert_eq!(
            s.miniature_capacity(32 * 1024),
            1024,
            "where R x C meets it"
        );
        assert_eq!(s.miniature_capacity(64 * 1024), 2048, "R x C");
        assert_eq!(Sampling::EXACT.miniature_capacity(1 << 30), 1 << 30);
        assert_eq!(s.scale_up(64 * 1024, 100), 3200);
        assert_eq!(s.scale_up(500, 100), 100);
    }

    #[test]
    fn the_sampled_share_of_roots_is_the_rate_and_nested_as_it_falls() {
        let s = Sampling::new(4, 256).unwrap();
        let ns = Namespace::Default;
        let count = |capacity: usize| {
            (0..64_000u64)
                .filter(|&w| s.samples(capacity, &ns, &[w], 1))
                .count()
        };
        // At 1 << 16 pages: R = 1/16 (4,000 of 64,000 expected).
        let at_rate = count(1 << 16);
        assert!((3_700..4_300).contains(&at_rate), "{at_rate}");
        // At 1,024 pages the floor samples a quarter.
        let at_floor = count(1024);
        assert!((15_400..16_600).contains(&at_floor), "{at_floor}");
        // What a smaller rate samples, a larger one samples too.
        assert!((0..64_000u64)
            .filter(|&w| s.samples(1 << 16, &ns, &[w], 1))
            .all(|w| s.samples(1024, &ns, &[w], 1)));
        // The namespace is part of the root: another one samples others.
        let other = Namespace::Id(7);
        assert!((0..64u64)
            .any(|w| s.samples(1 << 16, &ns, &[w], 1) != s.samples(1 << 16, &other, &[w], 1)));
        // A request without a whole page has no key to sample.
        assert!(!s.samples(1 << 16, &ns, &[1, 2], 4));
        // The key is the first four pages: what follows them goes with them,
        // and requests apart in their first four go apart.
        let in_sample = |tokens: &[Token]| s.samples(1 << 16, &ns, tokens, 2);
        let keys: Vec<Vec<Token>> = (0..200u64).map(|k| vec![1, 2, 3, 4, 5, 6, k, 8]).collect();
        let sampled = keys.iter().filter(|k| in_sample(k)).count();
        assert!(
            sampled > 0 && sampled < 200,
            "the fourth page splits them: {sampled}"
        );
        for k in &keys {
            assert_eq!(
                in_sample(&[k.clone(), vec![9, 9, 9, 9]].concat()),
                in_sample(k)
            );
        }
    }

    #[test]
    fn bad_parameters_are_refused_by_name() {
        let e = Sampling::new(33, 1).unwrap_err().to_string();
        assert!(e.contains("rate_shift") && e.contains("33"), "{e}");
        let e = Sampling::new(0, 5).unwrap_err().to_string();
        assert!(e.contains("floor") && e.contains('5'), "{e}");
    }
}
