//! match, insert and evict at 10k, 100k and 1M nodes (evict for lru, for
//! ghost, which also keeps its ghost history and shadow caches, and for the
//! queue policies arc and s3fifo, which choose between queues and keep ghost
//! lists). The cost per victim must stay flat as the tree grows (target:
//! under 2 us at 1M leaves). What each policy keeps beyond the live nodes
//! is printed once per size.

use std::hint::black_box;
use std::time::{Duration, Instant};

use cpkv_evict::{Namespace, Policy, PrefixTree};
use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion};

const NS: Namespace = Namespace::Default;
const FANOUT: u64 = 1024;

/// Leaf `i`: a shared one-page prefix (one of FANOUT) and two pages of its own.
fn leaf(i: u64) -> [u64; 3] {
    [i % FANOUT, 1_000_000 + i, 2_000_000_000 + i]
}

/// A tree of `leaves` evictable leaves (plus the shared prefixes), accessed in
/// a scrambled order so eviction order differs from insertion order.
fn build(leaves: u64, policy: Policy) -> (PrefixTree, u64) {
    let mut tree = PrefixTree::new(1, policy).unwrap();
    let mut next_page = 0;
    for i in 0..leaves {
        let t = leaf((i * 7919) % leaves);
        let m = tree.match_prefix(&t, &NS);
        let mut pages = m.device_pages;
        pages.extend(next_page..next_page + 3 - m.length as u64);
        next_page += 3 - m.length as u64;
        tree.insert(&t, &pages, &NS).unwrap();
    }
    tree.take_events();
    (tree, next_page)
}

fn bench(c: &mut Criterion) {
    for &n in &[10_000u64, 100_000, 1_000_000] {
        let (mut tree, mut next_page) = build(n, Policy::Lru);
        let mut group = c.benchmark_group("prefix_tree");
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1));

        let mut i = 0u64;
        group.bench_with_input(BenchmarkId::new("match_3_pages", n), &n, |b, &n| {
            b.iter(|| {
                i = (i + 7919) % n;
                black_box(tree.match_prefix(&leaf(i), &NS).length)
            })
        });

        let mut fresh = n;
        group.bench_with_input(BenchmarkId::new("insert_new_leaf", n), &n, |b, _| {
            b.iter(|| {
                fresh += 1;
                let t = leaf(fresh);
                let pages = [next_page, next_page + 1, next_page + 2];
                next_page += 3;
                // Two pages are new; the shared first page is reported cached.
                black_box(tree.insert(&t, &pages, &NS).unwrap().cached)
            })
        });

        evict_one_victim(
            &mut group,
            "evict_one_victim",
            n,
            &mut tree,
            &mut fresh,
            &mut next_page,
        );
        // The ghost policy also records each victim in its ghost history
        // (bounded at 4x the tree's peak pages: at 1M it does not fill within
        // a run, so its first-in first-out expiry is timed at 10k and 100k).
        let (mut ghost, mut ghost_next_page) = build(n, Policy::Ghost);
        let mut ghost_fresh = n;
        evict_one_victim(
            &mut group,
            "evict_one_victim_ghost",
            n,
            &mut ghost,
            &mut ghost_fresh,
            &mut ghost_next_page,
        );
        assert!(ghost.evictable(cpkv_evict::Tier::Device) as u64 >= n / 2);
        eprintln!(
            "ghost at {n}: {} live nodes, beyond them {:?}",
            ghost.len(),
            ghost.policy_memory()
        );
        drop(ghost);
        for policy in [Policy::Arc, Policy::S3fifo] {
            let (mut queued, mut queued_next_page) = build(n, policy);
            let mut queued_fresh = n;
            evict_one_victim(
                &mut group,
                &format!("evict_one_victim_{}", policy.name()),
                n,
                &mut queued,
                &mut queued_fresh,
                &mut queued_next_page,
            );
            assert!(queued.evictable(cpkv_evict::Tier::Device) as u64 >= n / 2);
            eprintln!(
                "{} at {n}: {} live nodes, beyond them {:?}",
                policy.name(),
                queued.len(),
                queued.policy_memory()
            );
        }
        group.finish();
        assert!(tree.evictable(cpkv_evict::Tier::Device) as u64 >= n / 2);
    }
}

/// Times only evict(1); puts each victim back (untimed) so the tree keeps
/// its size however many iterations criterion runs.
fn evict_one_victim(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    n: u64,
    tree: &mut PrefixTree,
    fresh: &mut u64,
    next_page: &mut u64,
) {
    group.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let victims = tree.evict(1);
                spent += start.elapsed();
                black_box(victims);
                *fresh += 1;
                let pages: Vec<u64> = (*next_page..*next_page + 3).collect();
                *next_page += 3;
                tree.insert(&leaf(*fresh), &pages, &NS).unwrap();
            }
            tree.take_events();
            spent
        })
    });
}

/// The Rust baselines beside cpkv's ordered index, over the same leaf keys
/// (last access, leaf id): an SGLang-shaped eviction (collect every leaf,
/// heapify a `BinaryHeap` once per call, pop the victim) and an ordered
/// `BTreeMap` popped from the front. One victim per iteration; the victim is
/// put back with a fresh key (untimed) so the size stays at `n`.
fn baseline_bench(c: &mut Criterion) {
    use std::cmp::Reverse;
    use std::collections::{BTreeMap, BinaryHeap};

    let mut group = c.benchmark_group("evict_one_victim_baselines");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .throughput(criterion::Throughput::Elements(1));
    for &n in &[10_000u64, 100_000, 1_000_000] {
        // Leaf j accessed at time i, in build()'s scrambled order.
        let mut last_access: Vec<u64> = vec![0; n as usize];
        for i in 0..n {
            last_access[((i * 7919) % n) as usize] = i;
        }
        let mut clock = n;
        let mut heap_keys = last_access.clone();
        group.bench_with_input(BenchmarkId::new("binary_heap_per_call", n), &n, |b, _| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    let heap: BinaryHeap<Reverse<(u64, usize)>> = heap_keys
                        .iter()
                        .enumerate()
                        .map(|(id, &t)| Reverse((t, id)))
                        .collect();
                    let Reverse((_, victim)) = *heap.peek().expect("leaves");
                    spent += start.elapsed();
                    black_box(heap);
                    heap_keys[victim] = clock; // the victim's slot comes back as a new leaf
                    clock += 1;
                }
                spent
            })
        });
        let mut ordered: BTreeMap<(u64, usize), ()> = last_access
            .iter()
            .enumerate()
            .map(|(id, &t)| ((t, id), ()))
            .collect();
        group.bench_with_input(BenchmarkId::new("btreemap_ordered", n), &n, |b, _| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    let ((_, victim), ()) = ordered.pop_first().expect("leaves");
                    spent += start.elapsed();
                    ordered.insert((clock, victim), ());
                    clock += 1;
                }
                spent
            })
        });
        let (mut tree, mut next_page) = build(n, Policy::Lru);
        let mut fresh = n;
        group.throughput(criterion::Throughput::Elements(1));
        evict_one_victim(
            &mut group,
            "cpkv_prefix_tree_lru",
            n,
            &mut tree,
            &mut fresh,
            &mut next_page,
        );
    }
    group.finish();
}

criterion_group!(benches, bench, baseline_bench);
criterion_main!(benches);
