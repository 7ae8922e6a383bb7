//! criterion benches at 1k / 100k / 1M live objects with fragmented free
//! lists (one free extent per 10 objects: 10k free extents at 100k objects).
//!
//! Targets: reserve+release under 1 us at 100k objects / 10k free extents;
//! `digest()` read under 1 us at 1M objects.
//!
//! `stream/*`: the core alone on a churn stream shaped like `cpkv bench
//! allocator`'s (batches of 32 reserves of 1..=64 pages in both payloads, 10%
//! in the first only, releases back to 90% occupancy), per operation.

use std::hint::black_box;
use std::time::{Duration, Instant};

use cpkv_allocator::{PageAllocator, PayloadSet};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

const SIZES: [usize; 3] = [1_000, 100_000, 1_000_000];

/// `objects` live objects of 1..=8 pages in two payloads, with a hole (a
/// released object) after every 10th: `objects / 10` free extents plus the tail.
fn fragmented(objects: usize) -> PageAllocator {
    let holes = objects / 10;
    let total = (objects + holes) as u64;
    let pages = |i: u64| 1 + (i * 7 + i / 3) % 8;
    let capacity: u64 = (0..total).map(pages).sum::<u64>() + 64;
    let mut alloc = PageAllocator::new(&[("kv", capacity), ("index", capacity)]).unwrap();
    let all = alloc.payloads().all();
    for i in 0..total {
        alloc.reserve(i, pages(i), all).unwrap().expect("room");
    }
    for i in (0..total).filter(|i| i % 11 == 5) {
        alloc.release(i).unwrap();
    }
    assert_eq!(alloc.len(), objects);
    alloc
}

/// One step of a churn stream: a payload set, reserves, then releases.
type Step = (PayloadSet, Vec<(u64, u64)>, Vec<u64>);

/// A seeded churn stream over two pools of `capacity` pages; releases are
/// chosen by replaying it, so every one names a live key.
fn churn_stream(capacity: u64, steps: usize) -> Vec<Step> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut below = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let mut alloc = PageAllocator::new(&[("kv", capacity), ("index", capacity)]).unwrap();
    let (all, first) = (alloc.payloads().all(), alloc.select(Some(&["kv"])).unwrap());
    let (mut live, mut key, mut stream) = (Vec::new(), 0u64, Vec::new());
    for _ in 0..steps {
        let set = if below(10) == 0 { first } else { all };
        let mut reserves = Vec::new();
        for _ in 0..32 {
            let pages = 1 + below(64);
            reserves.push((key, pages));
            if alloc.reserve(key, pages, set).unwrap().is_some() {
                live.push(key);
            }
            key += 1 + below(1000);
        }
        let mut releases = Vec::new();
        while !live.is_empty() && capacity - alloc.free_pages(0) > capacity / 10 * 9 {
            let k = live.swap_remove(below(live.len() as u64) as usize);
            alloc.release(k).unwrap();
            releases.push(k);
        }
        stream.push((set, reserves, releases));
    }
    stream
}

fn stream_bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("stream");
    group.sample_size(10);
    // The bench command's two workloads: the pools and a 1M-page host pool.
    for (name, capacity, steps) in [("pool64k", 65_536, 600), ("pool1m", 1 << 20, 1_500)] {
        let stream = churn_stream(capacity, steps);
        let ops: usize = stream.iter().map(|(_, r, k)| r.len() + k.len()).sum();
        group.throughput(criterion::Throughput::Elements(ops as u64));
        group.bench_function(format!("{name}_reserve_many_release_many"), |b| {
            b.iter(|| {
                let mut alloc =
                    PageAllocator::new(&[("kv", capacity), ("index", capacity)]).unwrap();
                for (set, reserves, releases) in &stream {
                    alloc
                        .reserve_each(reserves, *set, |_, p| {
                            black_box(p);
                        })
                        .unwrap();
                    alloc.release_many(releases).unwrap();
                }
                alloc
            })
        });
    }
    group.finish();
}

fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("allocator");
    group.sample_size(20);
    for &n in &SIZES {
        let mut alloc = fragmented(n);
        let all = alloc.payloads().all();
        let free_extents = alloc.stats().payloads[0].free_extents;
        let label = format!("{n}_objects_{free_extents}_free_extents");

        group.bench_function(BenchmarkId::new("reserve_release", &label), |b| {
            b.iter(|| {
                alloc.reserve(u64::MAX, black_box(5), all).unwrap();
                alloc.release(u64::MAX).unwrap();
            })
        });

        group.bench_function(BenchmarkId::new("split", &label), |b| {
            // Setup (reserve + commit) and teardown (release both halves) are
            // outside the timed region; only the split is measured.
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    alloc.reserve(u64::MAX - 2, 8, all).unwrap();
                    alloc.mark_committed(u64::MAX - 2).unwrap();
                    let start = Instant::now();
                    alloc
                        .split(u64::MAX - 2, black_box(3), u64::MAX - 1, u64::MAX)
                        .unwrap();
                    timed += start.elapsed();
                    alloc.release_many(&[u64::MAX - 1, u64::MAX]).unwrap();
                }
                timed
            })
        });

        group.bench_function(BenchmarkId::new("digest", &label), |b| {
            b.iter(|| black_box(&alloc).digest())
        });

        if n == 1_000_000 {
            group.sample_size(10);
        }
        group.bench_function(BenchmarkId::new("canonical_digest", &label), |b| {
            b.iter(|| black_box(&alloc).canonical_digest())
        });
        group.sample_size(20);
    }
    group.finish();
}

/// The Rust baseline a user would write: the free extents of each payload in
/// a `Vec` sorted by start; first fit scans it from the front, release
/// binary-searches the slot and coalesces with both neighbours.
struct SortedVecFirstFit {
    free: Vec<Vec<(u64, u64)>>,
}

impl SortedVecFirstFit {
    fn reserve(&mut self, payload: usize, len: u64) -> Option<u64> {
        let free = &mut self.free[payload];
        let i = free.iter().position(|&(_, l)| l >= len)?;
        let (start, l) = free[i];
        if l == len {
            free.remove(i);
        } else {
            free[i] = (start + len, l - len);
        }
        Some(start)
    }

    fn release(&mut self, payload: usize, start: u64, len: u64) {
        let free = &mut self.free[payload];
        let i = free.partition_point(|&(s, _)| s < start);
        let joins_before = i > 0 && free[i - 1].0 + free[i - 1].1 == start;
        let joins_after = i < free.len() && start + len == free[i].0;
        match (joins_before, joins_after) {
            (true, true) => {
                free[i - 1].1 += len + free[i].1;
                free.remove(i);
            }
            (true, false) => free[i - 1].1 += len,
            (false, true) => free[i] = (start, len + free[i].1),
            (false, false) => free.insert(i, (start, len)),
        }
    }
}

/// cpkv's extent tree against the sorted-`Vec` scan on the same fragmented
/// state: one reserve(5 pages) + release per iteration in both payloads.
fn baseline_bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("first_fit_vs_sorted_vec_scan");
    group.sample_size(20);
    group.throughput(criterion::Throughput::Elements(2)); // one reserve + one release
    for &n in &SIZES {
        let mut alloc = fragmented(n);
        let all = alloc.payloads().all();
        let free_extents = alloc.stats().payloads[0].free_extents;
        let label = format!("{n}_objects_{free_extents}_free_extents");
        let mut scan = SortedVecFirstFit {
            free: (0..2)
                .map(|p| {
                    alloc
                        .free_extents(p)
                        .iter()
                        .map(|e| (e.start, e.len))
                        .collect()
                })
                .collect(),
        };
        group.bench_function(BenchmarkId::new("cpkv_extent_tree", &label), |b| {
            b.iter(|| {
                alloc.reserve(u64::MAX, black_box(5), all).unwrap();
                alloc.release(u64::MAX).unwrap();
            })
        });
        group.bench_function(BenchmarkId::new("baseline_sorted_vec_scan", &label), |b| {
            b.iter(|| {
                for payload in 0..2 {
                    let start = scan.reserve(payload, black_box(5)).expect("room");
                    scan.release(payload, start, 5);
                }
            })
        });
        // Both placed the same pages (first fit is first fit): checked, not assumed.
        let placed = alloc.reserve(u64::MAX, 5, all).unwrap().unwrap().clone();
        for payload in 0..2 {
            let start = scan.reserve(payload, 5).unwrap();
            assert_eq!(placed.extents(payload).unwrap()[0].start, start);
            scan.release(payload, start, 5);
        }
        alloc.release(u64::MAX).unwrap();
    }
    group.finish();
}

criterion_group!(allocator, benches, stream_bench, baseline_bench);
criterion_main!(allocator);
