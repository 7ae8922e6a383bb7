//! `OffloadIndex` alone (vLLM's scheduler-side host tier) on a seeded
//! stream of conversation-like requests, per request as the engine calls
//! it: lookup of each chunk until the first miss -> prepare_load of the
//! hits -> prepare_store of the rest -> complete_load, complete_store,
//! request_finished. Timed per policy at a host of 1/8 and 1/2 of the
//! stream's distinct chunks; criterion's `thrpt` line is requests/s.
//! (`cpkv bench vllm` times the same calls through the Python binding
//! against vLLM's own managers.)

use std::hint::black_box;
use std::time::Duration;

use cpkv_tier::{KeyState, OffloadIndex, Policy};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

mod common;
use common::Rng;

const REQUESTS: usize = 8_192;
const ACTIVE: u64 = 64;
const SYSTEM_PROMPTS: u64 = 6;
const MAX_CHUNKS: u64 = 48;
/// Tokens per chunk: a key's end position is its index times this.
const STEP: u64 = 256;

/// One request: its chunk keys (8 bytes naming the chunk's content, then
/// group 0) and each key's end position.
struct Request {
    keys: Vec<Vec<u8>>,
    positions: Vec<Option<u64>>,
    id: String,
}

/// Conversations share one of a few system prompts (their first chunks);
/// each turn re-sends the conversation so far plus a few new chunks.
fn stream(seed: u64) -> (Vec<Request>, usize) {
    let mut rng = Rng(seed | 1);
    let key = |content: u64| {
        let mut k = content.to_be_bytes().to_vec();
        k.extend_from_slice(&0u32.to_be_bytes());
        k
    };
    let mut next_conversation = 0u64;
    let mut open = |rng: &mut Rng| {
        next_conversation += 1;
        let system = rng.range(0, SYSTEM_PROMPTS - 1);
        (next_conversation, system, rng.range(1, 6), rng.range(1, 8))
    };
    let mut active: Vec<(u64, u64, u64, u64)> = (0..ACTIVE).map(|_| open(&mut rng)).collect();
    let mut distinct = std::collections::BTreeSet::new();
    let mut requests = Vec::with_capacity(REQUESTS);
    for r in 0..REQUESTS {
        let slot = rng.range(0, ACTIVE - 1) as usize;
        let (conversation, system, chunks, turns) = active[slot];
        let keys: Vec<Vec<u8>> = (0..chunks)
            .map(|i| {
                let content = if i < 2 {
                    system * 1_000 + i
                } else {
                    (conversation << 16) + i
                };
                distinct.insert(content);
                key(content)
            })
            .collect();
        let positions = (1..=chunks).map(|i| Some(i * STEP)).collect();
        requests.push(Request {
            keys,
            positions,
            id: r.to_string(),
        });
        let more = chunks + rng.range(1, 6);
        active[slot] = if turns <= 1 || more > MAX_CHUNKS {
            open(&mut rng)
        } else {
            (conversation, system, more, turns - 1)
        };
    }
    (requests, distinct.len())
}

/// Replays the stream once; returns the chunks found on the host.
fn replay(index: &mut OffloadIndex, requests: &[Request]) -> u64 {
    let mut found_total = 0;
    for r in requests {
        let keys: Vec<&[u8]> = r.keys.iter().map(Vec::as_slice).collect();
        // The engine computes at least one token, so the last chunk is never looked up.
        let reachable = keys.len() - 1;
        let found = keys[..reachable]
            .iter()
            .take_while(|k| index.lookup(k) == KeyState::Ready)
            .count();
        if found > 0 {
            index
                .prepare_load(&r.id, &keys[..found], &r.positions[..found])
                .unwrap();
        }
        let plan = index
            .prepare_store(&r.id, &keys[found..], &r.positions[found..])
            .unwrap();
        if found > 0 {
            index.complete_load(&r.id, &keys[..found]);
        }
        if let Some(plan) = plan {
            let stored: Vec<&[u8]> = plan.store.iter().map(|&i| keys[found + i]).collect();
            index.complete_store(&stored, true).unwrap();
        }
        index.request_finished(&r.id);
        found_total += found as u64;
    }
    found_total
}

fn bench(c: &mut Criterion) {
    let (requests, distinct) = stream(0x5eed);
    let mut group = c.benchmark_group("offload/request");
    group.throughput(Throughput::Elements(requests.len() as u64));
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(4));
    for share in [8, 2] {
        let capacity = (distinct / share) as u64;
        for policy in [Policy::Lru, Policy::Ghost] {
            let mut probe = OffloadIndex::new(capacity, policy, vec![STEP]).unwrap();
            let found = replay(&mut probe, &requests);
            let chunks: usize = requests.iter().map(|r| r.keys.len() - 1).sum();
            println!(
                "offload/request {policy:?} at {capacity} of {distinct} chunks: {:.3} of looked-up chunks found",
                found as f64 / chunks as f64
            );
            group.bench_function(BenchmarkId::new(format!("{policy:?}"), capacity), |b| {
                b.iter(|| {
                    let mut index = OffloadIndex::new(capacity, policy, vec![STEP]).unwrap();
                    black_box(replay(&mut index, &requests))
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
