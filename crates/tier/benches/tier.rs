//! The Rust core's decisions alone on a replayed, seeded stream of
//! conversation-like requests, per request: lookup -> plan_load (host hit)
//! -> allocate -> insert -> unlock, and commit with the issued frontier
//! every few requests (every backup counts as copied at once). Timed at a
//! device pool of 4k and of 64k pages (host 4x device); criterion's
//! `thrpt` line is requests/s, and a summary line per size prints the hit
//! and load-back mix the stream produced.

use std::hint::black_box;
use std::time::Duration;

use cpkv_tier::{Namespace, Policy, TierCache, TierConfig};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

mod common;
use common::Rng;

const NS: Namespace = Namespace::Default;
const PAGE: usize = 16;
const REQUESTS: usize = 16_384;
const ACTIVE: usize = 96;
const SYSTEM_PROMPTS: u64 = 8;
const MAX_PAGES: usize = 256;
const COMMIT_EVERY: usize = 4;
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// Conversations (full final token vectors) and requests (conversation,
/// pages): request `r` is the first `pages` pages of its conversation, so a
/// later turn extends an earlier one and conversations share one of a few
/// system prompts.
struct Stream {
    conversations: Vec<Vec<u64>>,
    requests: Vec<(usize, usize)>,
}

impl Stream {
    fn tokens(&self, r: usize) -> &[u64] {
        let (conv, pages) = self.requests[r];
        &self.conversations[conv][..pages * PAGE]
    }

    fn distinct_pages(&self) -> usize {
        // Each conversation's own pages plus the system prompts' (shared).
        let mut own = 0;
        for (c, conv) in self.conversations.iter().enumerate() {
            let longest = self
                .requests
                .iter()
                .filter(|r| r.0 == c)
                .map(|r| r.1)
                .max()
                .unwrap_or(0);
            let system = conv.iter().take_while(|&&t| t < 1 << 32).count() / PAGE;
            own += longest.saturating_sub(system);
        }
        own + (SYSTEM_PROMPTS as usize) * 32
    }
}

fn stream(seed: u64) -> Stream {
    let mut rng = Rng(seed | 1);
    let system: Vec<Vec<u64>> = (0..SYSTEM_PROMPTS)
        .map(|s| {
            let pages = rng.range(4, 32) as usize;
            (0..pages * PAGE).map(|i| s * 100_000 + i as u64).collect()
        })
        .collect();
    let mut conversations: Vec<Vec<u64>> = Vec::new();
    // Per active slot: (conversation, pages so far, turns left).
    let mut active: Vec<(usize, usize, u64)> = Vec::new();
    let mut requests = Vec::with_capacity(REQUESTS);
    let open = |rng: &mut Rng, conversations: &mut Vec<Vec<u64>>| {
        let c = conversations.len();
        let mut tokens = system[rng.range(0, SYSTEM_PROMPTS - 1) as usize].clone();
        let mut i = 0u64;
        while tokens.len() < MAX_PAGES * PAGE {
            tokens.push((1 << 32) + ((c as u64) << 20) + i);
            i += 1;
        }
        let first = tokens.iter().take_while(|&&t| t < 1 << 32).count() / PAGE;
        conversations.push(tokens);
        (c, first + rng.range(2, 20) as usize, rng.range(1, 8))
    };
    for _ in 0..ACTIVE {
        active.push(open(&mut rng, &mut conversations));
    }
    while requests.len() < REQUESTS {
        let slot = rng.range(0, ACTIVE as u64 - 1) as usize;
        let (conv, pages, turns) = active[slot];
        let pages = pages.min(MAX_PAGES);
        requests.push((conv, pages));
        let next = pages + rng.range(2, 24) as usize;
        active[slot] = if turns <= 1 || next > MAX_PAGES {
            open(&mut rng, &mut conversations)
        } else {
            (conv, next, turns - 1)
        };
    }
    Stream {
        conversations,
        requests,
    }
}

#[derive(Default)]
struct Mix {
    requests: u64,
    device_hit_pages: u64,
    loaded_pages: u64,
    new_pages: u64,
    misses: u64,
}

/// One request's calls; returns its decision calls.
fn request(cache: &mut TierCache, tokens: &[u64], r: usize, mix: &mut Mix) -> u64 {
    let mut calls = 2; // lookup, allocate
    let hit = cache.lookup(tokens, &NS);
    let mut pages = hit.device_pages.clone();
    if hit.locked && hit.host_tokens > hit.device_tokens {
        calls += 1;
        let plan = cache.plan_load(hit.node).expect("locked lookup");
        mix.loaded_pages += plan.num_pages() as u64;
        pages.extend(plan.device_pages());
    }
    let need = (tokens.len() / PAGE - pages.len()) as u64;
    mix.requests += 1;
    mix.device_hit_pages += hit.device_pages.len() as u64;
    match cache.allocate(need) {
        Some(fresh) => {
            mix.new_pages += need;
            pages.extend(fresh);
            calls += 1;
            cache
                .insert(&tokens[..pages.len() * PAGE], &pages, &NS)
                .expect("held pages");
        }
        None => {
            mix.misses += 1;
            let held = &pages[hit.device_pages.len()..];
            if !held.is_empty() {
                calls += 1;
                cache.free(held).expect("held by this request");
            }
        }
    }
    if hit.locked {
        calls += 1;
        cache.unlock(hit.node).expect("locked by the lookup");
    }
    if (r + 1).is_multiple_of(COMMIT_EVERY) {
        calls += 1;
        cache.commit(cache.issued()).expect("issued frontier");
    }
    calls
}

fn bench(c: &mut Criterion) {
    let s = stream(SEED);
    println!(
        "stream: {} requests over {} conversations, ~{} distinct pages of {PAGE} tokens",
        s.requests.len(),
        s.conversations.len(),
        s.distinct_pages()
    );
    let mut group = c.benchmark_group("tier_requests");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    for &device_pages in &[4_096u64, 65_536] {
        let mut cache = TierCache::new(TierConfig {
            page_size: PAGE,
            cp_size: 1,
            device_pages,
            host_pages: 4 * device_pages,
            policy: Policy::Lru,
            host_free_target: 0,
        })
        .expect("valid config");
        // One pass to reach the steady state (both tiers full), then replay.
        let mut mix = Mix::default();
        let mut calls = 0;
        for r in 0..s.requests.len() {
            calls += request(&mut cache, s.tokens(r), r, &mut mix);
        }
        println!(
            "device {device_pages} pages, host {}: per request {:.1} device-hit pages, {:.1} loaded back, \
             {:.1} new, {:.2} decision calls; {} allocation misses",
            4 * device_pages,
            mix.device_hit_pages as f64 / mix.requests as f64,
            mix.loaded_pages as f64 / mix.requests as f64,
            mix.new_pages as f64 / mix.requests as f64,
            calls as f64 / mix.requests as f64,
            mix.misses
        );
        let mut r = 0usize;
        group.bench_with_input(
            BenchmarkId::new("device_pages", device_pages),
            &device_pages,
            |b, _| {
                b.iter(|| {
                    let calls = request(&mut cache, s.tokens(r), r, &mut mix);
                    r = (r + 1) % s.requests.len();
                    black_box(calls)
                })
            },
        );
        cache
            .check_invariants()
            .expect("invariants hold after the run");
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
