//! Row placement for the host tier, the two candidates on the two call
//! patterns they serve: the deterministic first-fit `PageAllocator` (one
//! object per page group) against the tier's `RowStack`.
//!
//! - `engine`: the engines' pattern, one row per block: place one, free one
//!   at random, at a full host of 16k rows.
//! - `backup`: the main job's pattern, one group of 1..=8 rows per backup,
//!   freed whole at random, at a full host of 16k rows.
//!
//! Criterion's `thrpt` is rows placed and freed per second. Before timing,
//! each candidate's mean number of contiguous runs per backup group is
//! printed: a run is one copy in the slab's run table.

use std::hint::black_box;
use std::time::Duration;

use cpkv_allocator::PageAllocator;
use cpkv_tier::RowStack;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

mod common;
use common::Rng;

const ROWS: u64 = 16_384;
const OPS: usize = 65_536;

trait Placement {
    fn take(&mut self, key: u64, n: u64) -> Vec<u64>;
    fn free(&mut self, key: u64, rows: &[u64]);
}

struct FirstFit(PageAllocator);

impl Placement for FirstFit {
    fn take(&mut self, key: u64, n: u64) -> Vec<u64> {
        let all = self.0.payloads().all();
        self.0
            .reserve(key, n, all)
            .unwrap()
            .expect("room")
            .pages(0)
            .unwrap()
    }
    fn free(&mut self, key: u64, _rows: &[u64]) {
        self.0.release(key).unwrap();
    }
}

/// The host tier's `RowStack` (what the tier runs).
struct Stack(RowStack);

impl Placement for Stack {
    fn take(&mut self, _key: u64, n: u64) -> Vec<u64> {
        let rows = self.0.take(n).expect("room");
        rows.into_iter().map(u64::from).collect()
    }
    fn free(&mut self, _key: u64, rows: &[u64]) {
        let rows: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        self.0.give_back(&rows);
    }
}

fn first_fit() -> FirstFit {
    FirstFit(PageAllocator::new(&[("host", ROWS)]).unwrap())
}
fn stack() -> Stack {
    Stack(RowStack::new(ROWS).unwrap())
}

/// Fills the host with groups of `1..=max_group` rows, then `OPS` times
/// frees a random group and places a new one that fits. Returns the rows
/// placed and the contiguous runs they came in.
fn churn(p: &mut impl Placement, max_group: u64, seed: u64) -> (u64, u64) {
    let mut rng = Rng(seed | 1);
    let mut live: Vec<(u64, Vec<u64>)> = Vec::new();
    let (mut used, mut key) = (0u64, 0u64);
    let (mut placed, mut runs) = (0u64, 0u64);
    let mut count = |rows: &[u64]| {
        placed += rows.len() as u64;
        runs += 1 + rows.windows(2).filter(|w| w[1] != w[0] + 1).count() as u64;
    };
    loop {
        let n = rng.range(1, max_group);
        if used + n > ROWS {
            break;
        }
        key += 1;
        let rows = p.take(key, n);
        count(&rows);
        used += n;
        live.push((key, rows));
    }
    for _ in 0..OPS {
        let i = rng.range(0, live.len() as u64 - 1) as usize;
        let (k, rows) = live.swap_remove(i);
        p.free(k, &rows);
        used -= rows.len() as u64;
        let n = rng.range(1, max_group).min(ROWS - used);
        key += 1;
        let rows = p.take(key, n);
        count(&rows);
        used += n;
        live.push((key, rows));
    }
    (placed, runs)
}

fn bench(c: &mut Criterion) {
    for (name, max_group) in [("engine", 1u64), ("backup", 8)] {
        let (placed, ff_runs) = churn(&mut first_fit(), max_group, 7);
        let (_, st_runs) = churn(&mut stack(), max_group, 7);
        println!(
            "rows/{name}: runs per group: first-fit {:.3}, stack {:.3} ({placed} rows)",
            ff_runs as f64 / (placed as f64 / ((max_group + 1) as f64 / 2.0)),
            st_runs as f64 / (placed as f64 / ((max_group + 1) as f64 / 2.0)),
        );
        let mut group = c.benchmark_group(format!("rows/{name}"));
        group.throughput(Throughput::Elements(placed));
        group.bench_function(BenchmarkId::from_parameter("first-fit"), |b| {
            b.iter(|| black_box(churn(&mut first_fit(), max_group, 7)))
        });
        group.bench_function(BenchmarkId::from_parameter("stack"), |b| {
            b.iter(|| black_box(churn(&mut stack(), max_group, 7)))
        });
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
