//! The kernel against a plain copy of the same bytes: a compose-shaped gather
//! (cp sources, each request's pages owned round-robin, so every run is
//! strided by cp) at 4 KB and 32 KB rows, in cache (2 MB) and far out of it
//! (256 MB, several times a 32 MB last-level cache); the kernel's own choice
//! of stores beside both kinds forced.

use cpkv_copy::{copy_runs, copy_runs_with, Run, Stores};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// Runs of a gather of `slots` rows from `cp` sources: slot i comes from
/// source i % cp, row i / cp, in runs of `run_len` slots per source.
fn gather_runs(cp: u64, slots: u64, run_len: u64) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut first = 0;
    while first < slots {
        let span = run_len.min(slots - first);
        for owner in 0..cp.min(span) {
            runs.push(Run {
                dst_row: first + owner,
                dst_stride: cp,
                count: (span - owner).div_ceil(cp),
                source: owner,
                src_row: first / cp,
                src_stride: 1,
            });
        }
        first += span;
    }
    runs
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("copy");
    group.sample_size(10);
    for (label, total) in [
        ("in_cache_2MB", 2usize << 20),
        ("out_of_cache_256MB", 256 << 20),
    ] {
        for row_bytes in [4096usize, 32768] {
            let slots = (total / row_bytes) as u64;
            group.throughput(Throughput::Bytes(total as u64));
            let flat = vec![7u8; total];
            let mut dst = vec![0u8; total];
            group.bench_function(
                BenchmarkId::new(format!("plain_copy_{label}"), row_bytes),
                |b| b.iter(|| dst.copy_from_slice(&flat)),
            );
            for cp in [2u64, 4, 8] {
                let rows = slots.div_ceil(cp) as usize;
                let sources: Vec<Vec<u8>> = (0..cp).map(|_| vec![3u8; rows * row_bytes]).collect();
                let views: Vec<&[u8]> = sources.iter().map(Vec::as_slice).collect();
                let runs = gather_runs(cp, slots, 52);
                group.bench_function(
                    BenchmarkId::new(format!("gather_cp{cp}_{label}"), row_bytes),
                    |b| b.iter(|| copy_runs(&mut dst, &views, row_bytes, &runs).unwrap()),
                );
                for (name, stores) in [("cached", Stores::Cached), ("streaming", Stores::Streaming)]
                {
                    group.bench_function(
                        BenchmarkId::new(format!("gather_cp{cp}_{label}_{name}_stores"), row_bytes),
                        |b| {
                            b.iter(|| {
                                copy_runs_with(&mut dst, &views, row_bytes, &runs, Some(stores))
                                    .unwrap()
                            })
                        },
                    );
                }
            }
        }
    }
    group.finish();
}

criterion_group!(copy, bench);
criterion_main!(copy);
