//! criterion benches at 1k / 100k / 1M live objects with fragmented free
//! lists (one free extent per 10 objects: 10k free extents at 100k objects).
//!
//! Targets: reserve+release under 1 us at 100k objects / 10k free extents;
//! `digest()` read under 1 us at 1M objects.

use std::hint::black_box;
use std::time::{Duration, Instant};

use cpkv_allocator::PageAllocator;
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

criterion_group!(allocator, benches);
criterion_main!(allocator);
