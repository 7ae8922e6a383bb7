//! The tier's decisions on small, hand-checked scenarios.

use cpkv_tier::{Namespace, Policy, TierCache, TierConfig, TierError, MAX_PAGES};

const NS: Namespace = Namespace::Default;

fn cache(device_pages: u64, host_pages: u64) -> TierCache {
    TierCache::new(TierConfig {
        page_size: 4,
        cp_size: 2,
        device_pages,
        host_pages,
        policy: Policy::Lru,
        host_free_target: 0,
    })
    .unwrap()
}

fn toks(seed: u64, pages: u64) -> Vec<u64> {
    (0..pages * 4).map(|i| seed * 1000 + i).collect()
}

/// Inserts `tokens` on fresh pages and commits its backups.
fn cache_and_back_up(c: &mut TierCache, tokens: &[u64]) -> Vec<u64> {
    let pages = c.allocate(tokens.len() as u64 / 4).unwrap();
    let out = c.insert(tokens, &pages, &NS).unwrap();
    c.commit(c.issued()).unwrap();
    out.backups
        .iter()
        .flat_map(|b| b.host_pages.clone())
        .collect()
}

#[test]
fn backup_evict_and_load_back_round_trip() {
    let mut c = cache(8, 16);
    let a = toks(1, 3);
    let rows = cache_and_back_up(&mut c, &a);
    assert_eq!(rows, vec![0, 1, 2]);
    assert_eq!(c.evict_device(3), 3);
    let hit = c.lookup(&a, &NS);
    assert_eq!((hit.device_tokens, hit.host_tokens), (0, 12));
    assert!(hit.locked);
    let plan = c.plan_load(hit.node).unwrap();
    assert_eq!(plan.runs.len(), 1);
    assert_eq!(plan.runs[0].host_pages, rows);
    let pages = plan.device_pages();
    let out = c.insert(&a, &pages, &NS).unwrap();
    assert!(out.backups.is_empty(), "already backed up");
    assert!(
        out.freed_pages.is_empty(),
        "the tree adopted the loaded pages"
    );
    c.unlock(hit.node).unwrap();
    assert_eq!(c.lookup(&a, &NS).device_tokens, 12);
    c.check_invariants().unwrap();
}

#[test]
fn a_node_is_not_a_host_copy_before_its_commit() {
    let mut c = cache(8, 16);
    let pages = c.allocate(2).unwrap();
    let out = c.insert(&toks(1, 2), &pages, &NS).unwrap();
    assert_eq!(out.backups.len(), 1);
    // Pending: locked, so device eviction cannot take its source pages.
    assert_eq!(c.evict_device(8), 0);
    assert_eq!(c.tree().host_pages(), 0);
    c.commit(out.backups[0].ticket).unwrap();
    assert_eq!(c.tree().host_pages(), 2);
    assert_eq!(c.evict_device(8), 2);
    c.check_invariants().unwrap();
}

#[test]
fn host_capacity_miss_evicts_in_policy_order_then_skips() {
    let mut c = cache(16, 4);
    cache_and_back_up(&mut c, &toks(1, 2));
    cache_and_back_up(&mut c, &toks(2, 2));
    c.evict_device(16);
    assert_eq!(c.free_host_pages(), 0);
    // A touch makes conversation 1 the most recent host object.
    let hit = c.lookup(&toks(1, 2), &NS);
    c.unlock(hit.node).unwrap();
    let pages = c.allocate(2).unwrap();
    let out = c.insert(&toks(3, 2), &pages, &NS).unwrap();
    assert_eq!(out.backups.len(), 1, "admission made room");
    assert_eq!(c.stats().host_victims, 1);
    assert_eq!(
        c.lookup(&toks(2, 2), &NS).host_tokens,
        0,
        "lru victim: conversation 2"
    );
    // Nothing evictable: the next backup that does not fit is skipped.
    let pages = c.allocate(4).unwrap();
    let out = c.insert(&toks(4, 4), &pages, &NS).unwrap();
    assert!(out.backups.is_empty());
    assert_eq!(out.skipped_pages, 4);
    assert_eq!(c.stats().backups_skipped, 1);
    c.check_invariants().unwrap();
}

#[test]
fn rejected_calls_change_nothing() {
    let mut c = cache(8, 8);
    let pages = c.allocate(2).unwrap();
    c.insert(&toks(1, 2), &pages, &NS).unwrap();
    let held = c.allocate(1).unwrap();
    let before = c.digest();
    let cases: Vec<(TierError, &str)> = vec![
        (c.free(&[7]).unwrap_err(), "is free"),
        (c.free(&[pages[0]]).unwrap_err(), "held by the cache"),
        (c.free(&[99]).unwrap_err(), "outside the pool"),
        (c.free(&[held[0], held[0]]).unwrap_err(), "twice"),
        (c.insert(&toks(5, 1), &[6], &NS).unwrap_err(), "is free"),
        (
            c.insert(&toks(5, 2), &held, &NS).unwrap_err(),
            "page ids for 2 whole pages",
        ),
        (c.commit(5).unwrap_err(), "beyond the last issued"),
        (
            c.plan_load(cpkv_tier::NodeId(999)).unwrap_err(),
            "unknown node",
        ),
        (c.unlock(cpkv_tier::NodeId(1)).unwrap_err(), "is not locked"),
    ];
    for (err, text) in cases {
        assert!(
            err.to_string().contains(text),
            "{err} should mention {text:?}"
        );
        assert_eq!(c.digest(), before, "{err} changed the state");
    }
    c.check_invariants().unwrap();
}

#[test]
fn duplicate_pages_for_cached_positions_go_back_to_the_pool() {
    let mut c = cache(8, 8);
    let pages = c.allocate(2).unwrap();
    c.insert(&toks(1, 2), &pages, &NS).unwrap();
    let mine = c.allocate(3).unwrap();
    let out = c.insert(&toks(1, 3), &mine, &NS).unwrap();
    assert_eq!(out.cached_pages, 2);
    assert_eq!(out.freed_pages, mine[..2].to_vec());
    c.check_invariants().unwrap();
}

#[test]
fn bad_configs_are_refused() {
    for (device, host, target) in [(1, 8, 0), (8, 0, 0), (8, 8, 9)] {
        let err = TierCache::new(TierConfig {
            page_size: 4,
            cp_size: 2,
            device_pages: device,
            host_pages: host,
            policy: Policy::Lru,
            host_free_target: target,
        })
        .unwrap_err();
        assert!(matches!(err, TierError::Config { .. }), "{err}");
    }
}

/// Each size has one limit, checked before anything is built, and a cache at
/// the limits is built in O(1): the device pool stores only pages in use.
#[test]
fn limits_are_checked_and_a_cache_at_the_limits_costs_nothing() {
    let config = |device_pages, host_pages, page_size| TierConfig {
        page_size,
        cp_size: 1,
        device_pages,
        host_pages,
        policy: Policy::Lru,
        host_free_target: 0,
    };
    let max_page = cpkv_evict::MAX_PAGE_SIZE;
    let started = std::time::Instant::now();
    let mut c = TierCache::new(config(MAX_PAGES, MAX_PAGES, max_page)).unwrap();
    assert!(
        started.elapsed().as_secs_f64() < 1.0,
        "{:?}",
        started.elapsed()
    );
    let pages = c.allocate(4).unwrap();
    assert_eq!(pages, [0, 1, 2, 3]);
    c.free(&pages[1..2]).unwrap();
    assert_eq!(c.allocate(2).unwrap(), [1, 4], "lowest free first");
    c.free(&[4, 3]).unwrap();
    assert_eq!(c.device().free_pages(), MAX_PAGES - 3);
    c.check_invariants().unwrap();
    for (device, host, page_size) in [
        (MAX_PAGES + 1, 8, 4),
        (8, MAX_PAGES + 1, 4),
        (8, 8, max_page + 1),
    ] {
        let err = TierCache::new(config(device, host, page_size)).unwrap_err();
        assert!(matches!(err, TierError::Config { .. }), "{err}");
    }
}

/// Pinned digests: a change of hash, platform or compiler that alters them is caught here (and
/// then means every rank of a mixed deployment would disagree).
#[test]
fn digests_are_pinned_and_cover_the_config() {
    let mut c = cache(8, 16);
    let fresh = c.digest();
    cache_and_back_up(&mut c, &toks(1, 3));
    let after = c.digest();
    let wider = TierCache::new(TierConfig {
        cp_size: 4,
        ..*c.config()
    })
    .unwrap();
    assert_ne!(wider.digest(), fresh, "cp_size is part of the digest");
    assert_eq!(
        (fresh, after),
        (PINNED_FRESH, PINNED_AFTER),
        "{fresh:#x} {after:#x}"
    );
}

// Updated deliberately when the device pool became lazy (issue 24): its digest no longer
// includes the terms of every free page, a constant of the capacity that cost O(capacity).
// Updated again when the cache moved onto the host tier's core (issue 34): the host part is
// `HostIndex`'s digest (tree, row stack, pins) and the backups' row objects, where it was the
// first-fit allocator's. Updated again when the core placed its rows with the first-fit allocator
// again (issue 45): `HostIndex`'s digest takes the allocator's (its configuration and every
// object's rows at their positions) where it took the row stack's counts.
const PINNED_FRESH: u64 = 0xa663_631b_1209_5460;
const PINNED_AFTER: u64 = 0x1ef8_a744_e329_487e;
