//! Model test: random engine call sequences against a byte-level model of
//! both tiers.
//!
//! The driver plays the engine: lookup, load-back, allocate, insert, and
//! copies that the model performs on "bytes" (each device page and slab row
//! holds the identity of the token prefix it caches). Ranks finish backups
//! at random; commits take the MIN of their frontiers. After every step:
//! every invariant, the incremental digest against a recomputation, a
//! second instance fed the same calls has the same digest, every device hit
//! and every loaded page holds exactly the bytes of its prefix, and no node
//! has a host copy before every rank finished its backup.

use std::collections::BTreeMap;

use cpkv_tier::{Namespace, Policy, TierCache, TierConfig};
use proptest::prelude::*;

const PAGE: usize = 2;
const RANKS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    /// Conversation `conv`, the first `pages` pages of its token stream.
    Request {
        conv: u8,
        pages: u8,
    },
    /// Rank `rank` finishes its copies up to `n` more tickets.
    Progress {
        rank: usize,
        n: u8,
    },
    /// The commit point: MIN over ranks.
    Commit,
    EvictDevice(u8),
    EvictHost(u8),
    Abort,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..6, 1u8..9).prop_map(|(conv, pages)| Op::Request { conv, pages }),
        3 => (0..RANKS, 1u8..4).prop_map(|(rank, n)| Op::Progress { rank, n }),
        2 => Just(Op::Commit),
        1 => (1u8..8).prop_map(Op::EvictDevice),
        1 => (1u8..8).prop_map(Op::EvictHost),
        1 => Just(Op::Abort),
    ]
}

/// Conversations 0-2 share a two-page system prompt, 3-5 another.
fn tokens(conv: u8, pages: u8) -> Vec<u64> {
    (0..pages as u64 * PAGE as u64)
        .map(|i| {
            if i < 2 * PAGE as u64 {
                1000 + u64::from(conv / 3) * 100 + i
            } else {
                u64::from(conv) * 10_000 + i
            }
        })
        .collect()
}

/// The identity of the KV a page holds: its whole token prefix.
fn content(tokens: &[u64], page: usize) -> Vec<u64> {
    tokens[..(page + 1) * PAGE].to_vec()
}

struct Harness {
    cache: TierCache,
    twin: TierCache,
    device: BTreeMap<u64, Vec<u64>>,
    slab: BTreeMap<u64, Vec<u64>>,
    /// Ticket -> (device pages, host rows), not yet copied by every rank.
    inflight: BTreeMap<u64, (Vec<u64>, Vec<u64>)>,
    done: [u64; RANKS],
}

impl Harness {
    fn new(policy: Policy) -> Self {
        let config = TierConfig {
            page_size: PAGE,
            cp_size: RANKS as u64,
            device_pages: 24,
            host_pages: 20,
            policy,
            host_free_target: 4,
        };
        let cache = TierCache::new(config).unwrap();
        Self {
            twin: cache.clone(),
            cache,
            device: BTreeMap::new(),
            slab: BTreeMap::new(),
            inflight: BTreeMap::new(),
            done: [0; RANKS],
        }
    }

    fn both<T: PartialEq + std::fmt::Debug>(&mut self, f: impl Fn(&mut TierCache) -> T) -> T {
        let a = f(&mut self.cache);
        let b = f(&mut self.twin);
        assert_eq!(a, b, "twins decided differently");
        a
    }

    fn request(&mut self, conv: u8, pages: u8) {
        let toks = tokens(conv, pages);
        let ns = Namespace::Default;
        let hit = self.both(|c| c.lookup(&toks, &ns));
        for (i, page) in hit.device_pages.iter().enumerate() {
            assert_eq!(
                self.device[page],
                content(&toks, i),
                "device hit holds other bytes"
            );
        }
        let plan = if hit.locked {
            self.both(|c| c.plan_load(hit.node).unwrap())
        } else {
            Default::default()
        };
        let mut page_list = hit.device_pages.clone();
        for run in &plan.runs {
            for (&dev, &row) in run.device_pages.iter().zip(&run.host_pages) {
                let bytes = self.slab[&row].clone();
                assert_eq!(
                    bytes,
                    content(&toks, page_list.len()),
                    "slab row holds other bytes"
                );
                self.device.insert(dev, bytes);
                page_list.push(dev);
            }
        }
        let whole = toks.len() / PAGE;
        let loaded_all = plan.num_pages() == hit.host_only_pages(PAGE);
        let covered = if loaded_all {
            page_list.len()
        } else {
            hit.device_pages.len()
        };
        if !loaded_all {
            // A load miss: recompute from the device hit.
            self.both(|c| c.free(&plan.device_pages()).unwrap());
            page_list.truncate(covered);
        }
        let fresh = self.both(|c| c.allocate((whole - covered) as u64));
        let Some(fresh) = fresh else {
            if hit.locked {
                self.both(|c| c.unlock(hit.node).unwrap());
            }
            return;
        };
        for (k, &page) in fresh.iter().enumerate() {
            self.device.insert(page, content(&toks, covered + k));
            page_list.push(page);
        }
        let out = self.both(|c| c.insert(&toks, &page_list, &ns).unwrap());
        for b in out.backups {
            self.inflight
                .insert(b.ticket, (b.device_pages, b.host_pages));
        }
        if hit.locked {
            self.both(|c| c.unlock(hit.node).unwrap());
        }
    }

    fn progress(&mut self, rank: usize, n: u8) {
        let issued = self.cache.issued();
        self.done[rank] = (self.done[rank] + u64::from(n)).min(issued);
    }

    fn commit(&mut self) {
        let frontier = *self.done.iter().min().unwrap();
        // Every rank has copied its owned pages of tickets <= frontier.
        let due: Vec<u64> = self.inflight.range(..=frontier).map(|(&t, _)| t).collect();
        for t in due {
            let (dev, rows) = self.inflight.remove(&t).unwrap();
            for (d, r) in dev.iter().zip(&rows) {
                self.slab.insert(*r, self.device[d].clone());
            }
        }
        let out = self.both(|c| c.commit(frontier).unwrap());
        for t in out.committed.iter().chain(&out.aborted) {
            assert!(
                *t <= frontier,
                "ticket {t} committed before every rank finished"
            );
        }
    }

    fn abort(&mut self) {
        self.both(|c| c.abort_pending());
        self.inflight.clear();
        let issued = self.cache.issued();
        self.done = [issued; RANKS];
    }

    fn check(&self) {
        self.cache.check_invariants().unwrap();
        assert_eq!(self.cache.digest(), self.twin.digest());
        // Only committed backups are host copies: no in-flight ticket's node is on host.
        for node in self.cache.tree().nodes() {
            if node.on_host() {
                for row in self.cache.host_rows(node.id()).unwrap() {
                    assert!(
                        self.slab.contains_key(&row),
                        "host node {} reads an unwritten row",
                        node.id()
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn engine_sequences_keep_both_tiers_consistent(
        policy in prop_oneof![Just(Policy::Lru), Just(Policy::Ghost), Just(Policy::Slru)],
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let mut h = Harness::new(policy);
        for op in ops {
            match op {
                Op::Request { conv, pages } => h.request(conv, pages),
                Op::Progress { rank, n } => h.progress(rank, n),
                Op::Commit => h.commit(),
                Op::EvictDevice(n) => { h.both(|c| c.evict_device(u64::from(n))); }
                Op::EvictHost(n) => { h.both(|c| c.evict_host(u64::from(n))); }
                Op::Abort => h.abort(),
            }
            h.check();
        }
    }
}
