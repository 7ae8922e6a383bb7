//! `OffloadIndex::store` and `locate` per key, as SGLang's HiCache calls
//! them through `SglangIndex`: batches of 128 keys (64 hex characters, then
//! group 0's four bytes), each batch a chain of its own (no prefix). `empty`: 32 batches into an empty index of 4,096 rows (fills it,
//! no eviction); `full`: 32 batches into a full index (each evicts 128 rows);
//! `locate`: 32 batches of resident keys. criterion's `thrpt` line is keys/s
//! (its time / 4,096 is ns per key), to set against a 4 KB page's memcpy.

use std::hint::black_box;
use std::time::Duration;

use cpkv_tier::{OffloadIndex, Policy};
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};

/// splitmix64: distinct, well-spread words for the keys' hex.
fn mix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const ROWS: u64 = 4_096;
const BATCH: usize = 128;
const BATCHES: usize = ROWS as usize / BATCH;

/// `count` distinct SGLang-shaped keys, seeded.
fn keys(seed: u64, count: usize) -> Vec<Vec<u8>> {
    (0..count as u64)
        .map(|i| {
            let mut key: Vec<u8> = (0..4)
                .flat_map(|w| format!("{:016x}", mix(seed ^ (i << 2 | w))).into_bytes())
                .collect();
            key.extend_from_slice(&0u32.to_be_bytes());
            key
        })
        .collect()
}

/// Stores `keys` in batches; returns the keys placed.
fn store_all(index: &mut OffloadIndex, keys: &[Vec<u8>]) -> usize {
    let mut placed = 0;
    for batch in keys.chunks(BATCH) {
        let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
        placed += index
            .store(&refs, None)
            .unwrap()
            .iter()
            .filter(|p| p.is_some())
            .count();
    }
    placed
}

fn bench(c: &mut Criterion) {
    let first = keys(0x5eed, ROWS as usize);
    let second = keys(0x5eee, ROWS as usize);
    let mut group = c.benchmark_group("store_keys");
    group.throughput(Throughput::Elements(ROWS));
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3));
    for policy in [Policy::Lru, Policy::Ghost] {
        let fresh = || OffloadIndex::new(ROWS, policy, vec![1]).unwrap();
        group.bench_function(BenchmarkId::new("empty", format!("{policy:?}")), |b| {
            b.iter_batched(
                fresh,
                |mut index| black_box(store_all(&mut index, &first)),
                BatchSize::LargeInput,
            )
        });
        let filled = || {
            let mut index = fresh();
            assert_eq!(store_all(&mut index, &first), ROWS as usize);
            index
        };
        group.bench_function(BenchmarkId::new("full", format!("{policy:?}")), |b| {
            b.iter_batched(
                filled,
                |mut index| black_box(store_all(&mut index, &second)),
                BatchSize::LargeInput,
            )
        });
        let index = filled();
        let batches: Vec<Vec<&[u8]>> = first
            .chunks(BATCH)
            .map(|b| b.iter().map(Vec::as_slice).collect())
            .collect();
        assert_eq!(batches.len(), BATCHES);
        group.bench_function(BenchmarkId::new("locate", format!("{policy:?}")), |b| {
            b.iter(|| {
                let mut found = 0;
                for batch in &batches {
                    found += batch.iter().filter(|k| index.locate(k).is_some()).count();
                }
                black_box(found)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
