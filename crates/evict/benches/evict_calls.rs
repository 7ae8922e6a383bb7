//! The rows of `cpkv bench evict` without the binding: lru `evict(num_pages)`
//! calls of 1, 16 and 256 pages on the same tree (two-page leaves of 16-token
//! pages under 64 shared one-page prefixes, each accessed once in a scrambled
//! order), at 10k, 41k and 150k leaves, per evicted page. Victims come back
//! (untimed) as new leaves, so the tree keeps its size however many
//! iterations criterion runs.

use std::time::{Duration, Instant};

use cpkv_evict::{Namespace, Policy, PrefixTree};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const NS: Namespace = Namespace::Default;
const PAGE_SIZE: usize = 16;
const PREFIXES: u64 = 64;

/// Leaf `j`'s tokens: its prefix's page, then two pages of its own.
fn leaf(j: u64) -> Vec<u64> {
    [j % PREFIXES, 1_000 + j, 2_000_000 + j]
        .iter()
        .flat_map(|&t| [t; PAGE_SIZE])
        .collect()
}

/// A tree and the next free page id, growing by one leaf at a time.
struct Growing {
    tree: PrefixTree,
    next_page: u64,
}

impl Growing {
    fn add(&mut self, j: u64) {
        let tokens = leaf(j);
        let m = self.tree.match_prefix(&tokens, &NS);
        let new = 3 - (m.length / PAGE_SIZE) as u64;
        let mut pages = m.device_pages;
        pages.extend(self.next_page..self.next_page + new);
        self.next_page += new;
        self.tree.insert(&tokens, &pages, &NS).unwrap();
    }
}

fn evict_calls(c: &mut Criterion) {
    let mut group = c.benchmark_group("evict_calls");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for &n in &[10_000u64, 41_000, 150_000] {
        let mut growing = Growing {
            tree: PrefixTree::new(PAGE_SIZE, Policy::Lru).unwrap(),
            next_page: 0,
        };
        for i in 0..n {
            growing.add((i * 7919) % n);
        }
        let mut fresh = n;
        for per_call in [1usize, 16, 256] {
            // Every victim is a whole two-page leaf.
            let freed = per_call.next_multiple_of(2);
            group.throughput(Throughput::Elements(freed as u64));
            let id = BenchmarkId::new(format!("{per_call}_pages"), n);
            group.bench_with_input(id, &n, |b, _| {
                b.iter_custom(|iters| {
                    let mut spent = Duration::ZERO;
                    for _ in 0..iters {
                        let start = Instant::now();
                        let victims = growing.tree.evict(per_call);
                        spent += start.elapsed();
                        assert_eq!(victims.len(), freed / 2);
                        for _ in 0..victims.len() {
                            growing.add(fresh);
                            fresh += 1;
                        }
                    }
                    spent
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, evict_calls);
criterion_main!(benches);
