//! The host tier's row placement, `HostRows` (the first-fit allocator's
//! extents), against the row stack it replaced, side by side in one process
//! on the two call patterns the tier serves, at a full host of 16k rows:
//!
//! - `engine`: one store call places a batch of 1..=8 blocks, one row
//!   each, in one reservation (rows held by number: no allocator object);
//!   blocks are evicted one by one at random.
//! - `backup`: the main job's pattern, one object of 1..=8 rows per backup,
//!   freed whole at random.
//!
//! Before Criterion runs, a table prints each pattern's rows placed (and
//! freed) per second under both, best of a few interleaved runs, the
//! ratio, and the mean copy runs per batch (a run is one copy in the slab's
//! run table: fewer is better). Criterion's `thrpt` is rows per second.

use std::hint::black_box;
use std::time::{Duration, Instant};

use cpkv_tier::HostRows;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

mod common;
use common::Rng;
#[path = "common/row_stack.rs"]
mod row_stack;
use row_stack::RowStack;

const ROWS: u64 = 16_384;
const OPS: usize = 65_536;
const MAX_BATCH: u64 = 8;

/// What a placement offers the two patterns.
trait Rows {
    fn free(&self) -> u64;
    /// `n` rows for object `key`, freed together.
    fn place_group(&mut self, key: u64, n: u64, out: &mut Vec<u32>);
    fn free_group(&mut self, key: u64, rows: &[u32]);
    /// One row per key, in one call; each freed on its own.
    fn place_each(&mut self, keys: &[u64], out: &mut Vec<u32>);
    fn free_one(&mut self, key: u64, row: u32);
}

impl Rows for RowStack {
    fn free(&self) -> u64 {
        RowStack::free(self)
    }
    fn place_group(&mut self, _key: u64, n: u64, out: &mut Vec<u32>) {
        out.extend((0..n).map(|_| self.take_one()));
    }
    fn free_group(&mut self, _key: u64, rows: &[u32]) {
        self.give_back(rows);
    }
    fn place_each(&mut self, keys: &[u64], out: &mut Vec<u32>) {
        out.extend(keys.iter().map(|_| self.take_one()));
    }
    fn free_one(&mut self, _key: u64, row: u32) {
        self.give_back(&[row]);
    }
}

impl Rows for HostRows {
    fn free(&self) -> u64 {
        HostRows::free(self)
    }
    fn place_group(&mut self, key: u64, n: u64, out: &mut Vec<u32>) {
        assert!(self.reserve_into(key, n, out).unwrap(), "room");
    }
    fn free_group(&mut self, key: u64, _rows: &[u32]) {
        self.release(key).unwrap();
    }
    fn place_each(&mut self, keys: &[u64], out: &mut Vec<u32>) {
        let rows = self.reserve_rows(keys.len() as u64).unwrap().expect("room");
        out.extend(rows.iter().map(|&r| r as u32));
    }
    fn free_one(&mut self, _key: u64, row: u32) {
        self.release_row(u64::from(row)).unwrap();
    }
}

/// Rows placed and the copy runs their batches came in.
#[derive(Default, Clone, Copy)]
struct Placed {
    rows: u64,
    batches: u64,
    runs: u64,
}

impl Placed {
    fn count(&mut self, rows: &[u32]) {
        self.rows += rows.len() as u64;
        self.batches += 1;
        self.runs += 1 + rows.windows(2).filter(|w| w[1] != w[0] + 1).count() as u64;
    }
}

/// The engines' pattern: fill the host with batches, then `OPS` times
/// evict as many random blocks as the next batch needs and place it.
fn engine(p: &mut impl Rows, seed: u64) -> Placed {
    let mut rng = Rng(seed | 1);
    let mut live: Vec<(u64, u32)> = Vec::new();
    let (mut placed, mut next_key) = (Placed::default(), 0u64);
    let (mut keys, mut rows) = (Vec::new(), Vec::new());
    for op in 0.. {
        let n = rng.range(1, MAX_BATCH);
        if op >= OPS && p.free() < n {
            break;
        }
        while p.free() < n {
            let i = rng.range(0, live.len() as u64 - 1) as usize;
            let (key, row) = live.swap_remove(i);
            p.free_one(key, row);
        }
        keys.clear();
        keys.extend(next_key..next_key + n);
        next_key += n;
        rows.clear();
        p.place_each(&keys, &mut rows);
        placed.count(&rows);
        live.extend(keys.iter().copied().zip(rows.iter().copied()));
    }
    placed
}

/// The main job's pattern: fill the host with backups, then `OPS` times
/// free random backups until the next one fits and place it.
fn backup(p: &mut impl Rows, seed: u64) -> Placed {
    let mut rng = Rng(seed | 1);
    let mut live: Vec<(u64, Vec<u32>)> = Vec::new();
    let mut placed = Placed::default();
    for key in 0.. {
        let n = rng.range(1, MAX_BATCH);
        if key as usize >= OPS && p.free() < n {
            break;
        }
        while p.free() < n {
            let i = rng.range(0, live.len() as u64 - 1) as usize;
            let (k, rows) = live.swap_remove(i);
            p.free_group(k, &rows);
        }
        let mut rows = Vec::with_capacity(n as usize);
        p.place_group(key, n, &mut rows);
        placed.count(&rows);
        live.push((key, rows));
    }
    placed
}

fn run_engine_stack() -> Placed {
    engine(&mut RowStack::new(ROWS), 7)
}
fn run_engine_allocator() -> Placed {
    engine(&mut HostRows::new(ROWS).unwrap(), 7)
}
fn run_backup_stack() -> Placed {
    backup(&mut RowStack::new(ROWS), 7)
}
fn run_backup_allocator() -> Placed {
    backup(&mut HostRows::new(ROWS).unwrap(), 7)
}

/// Seconds of the fastest of `reps` runs, the two candidates interleaved
/// so load on a shared machine falls on both alike.
fn best_of(reps: usize, a: fn() -> Placed, b: fn() -> Placed) -> (f64, f64) {
    let time = |f: fn() -> Placed| {
        let start = Instant::now();
        black_box(f());
        start.elapsed().as_secs_f64()
    };
    let (mut ta, mut tb) = (f64::MAX, f64::MAX);
    for _ in 0..reps {
        ta = ta.min(time(a));
        tb = tb.min(time(b));
    }
    (ta, tb)
}

/// A pattern's name, and its run under the stack and under the allocator.
type Candidates = (&'static str, fn() -> Placed, fn() -> Placed);

fn bench(c: &mut Criterion) {
    let patterns: [Candidates; 2] = [
        ("engine", run_engine_stack, run_engine_allocator),
        ("backup", run_backup_stack, run_backup_allocator),
    ];
    println!(
        "rows: {ROWS} rows, {OPS} batches of 1..={MAX_BATCH} after the fill; rows placed/s and copy runs per batch"
    );
    println!("| pattern | stack rows/s | allocator rows/s | allocator / stack | runs per batch, stack / allocator |");
    println!("|---|---|---|---|---|");
    for &(name, stack, allocator) in &patterns {
        let (s, a) = (stack(), allocator());
        assert_eq!(s.rows, a.rows, "both place the same stream");
        let (ts, ta) = best_of(5, stack, allocator);
        println!(
            "| {name} | {:.1} M | {:.1} M | {:.2}x | {:.3} / {:.3} |",
            s.rows as f64 / ts / 1e6,
            a.rows as f64 / ta / 1e6,
            ts / ta,
            s.runs as f64 / s.batches as f64,
            a.runs as f64 / a.batches as f64,
        );
    }
    for &(name, stack, allocator) in &patterns {
        let mut group = c.benchmark_group(format!("rows/{name}"));
        group.throughput(Throughput::Elements(stack().rows));
        group.bench_function(BenchmarkId::from_parameter("stack"), |b| {
            b.iter(|| black_box(stack()))
        });
        group.bench_function(BenchmarkId::from_parameter("allocator"), |b| {
            b.iter(|| black_box(allocator()))
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
