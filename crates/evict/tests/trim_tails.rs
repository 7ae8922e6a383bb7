//! `PrefixTree::set_trim_tails`: with it on, an eviction frees what it
//! needs and no more under every policy but ghost, each victim cut from its
//! tail; ghost keeps its own tail rule (`keeps_head`) either way; off, the
//! tree decides as before.

use cpkv_evict::{Namespace, Policy, PrefixTree, Tier};
use proptest::prelude::*;

const NS: Namespace = Namespace::Default;

/// A 6-page chain, then a 2-page chain touched after it (page_size 1).
fn two_chains(policy: Policy, trim: bool) -> PrefixTree {
    let mut tree = PrefixTree::new(1, policy).unwrap();
    tree.set_trim_tails(trim);
    tree.insert(&[1, 2, 3, 4, 5, 6], &[0, 1, 2, 3, 4, 5], &NS)
        .unwrap();
    tree.insert(&[9, 8], &[6, 7], &NS).unwrap();
    let m = tree.match_prefix(&[9, 8], &NS);
    tree.lock(m.node).unwrap();
    tree.unlock(m.node).unwrap();
    tree
}

#[test]
fn one_page_needed_takes_one_page_from_the_tail_under_every_policy() {
    for policy in Policy::ALL {
        let mut tree = two_chains(policy, true);
        let victims = tree.evict(1);
        let freed: Vec<u64> = victims.iter().flat_map(|v| v.pages.clone()).collect();
        assert_eq!(freed.len(), 1, "{policy:?}: {victims:?}");
        assert!(
            freed == [5] || freed == [7],
            "{policy:?}: a tail page leaves, got {freed:?}"
        );
        // What stays of the victim is its head, still matched.
        let (head, len) = if freed == [5] {
            (&[1u64, 2, 3, 4, 5][..], 5)
        } else {
            (&[9u64][..], 1)
        };
        assert_eq!(tree.match_prefix(head, &NS).length, len, "{policy:?}");
        assert_eq!(tree.device_pages(), 7);
        tree.check_invariants().unwrap();
    }
}

#[test]
fn off_by_default_and_then_only_ghost_cuts_a_tail() {
    for policy in Policy::ALL {
        let mut plain = two_chains(policy, false);
        assert!(!plain.trims_tails());
        let freed: usize = plain.evict(1).iter().map(|v| v.pages.len()).sum();
        let whole = if policy == Policy::Ghost { 1 } else { 6 };
        // Every non-ghost policy takes the older 6-page chain whole.
        assert_eq!(freed, whole, "{policy:?}");
    }
}

#[test]
fn ghost_keeps_its_own_rule_with_the_option_on() {
    // Four of six pages needed: more than half, so ghost's rule takes the
    // whole victim, with the option on or off.
    for trim in [false, true] {
        let mut tree = two_chains(Policy::Ghost, trim);
        let freed: usize = tree.evict(4).iter().map(|v| v.pages.len()).sum();
        assert_eq!(freed, 6, "trim {trim}");
    }
    let mut lru = two_chains(Policy::Lru, true);
    assert_eq!(lru.evict(4).iter().map(|v| v.pages.len()).sum::<usize>(), 4);
}

#[test]
fn the_setting_is_not_replicated_state() {
    let (on, off) = (
        two_chains(Policy::Lru, true),
        two_chains(Policy::Lru, false),
    );
    assert_eq!(on.digest(), off.digest());
}

/// (tokens of a request over a small vocabulary, pages to evict first)
fn step() -> impl Strategy<Value = (Vec<u64>, usize)> {
    (prop::collection::vec(0u64..3, 1..9), 0usize..7)
}

fn trims_exactly(policy: Policy, steps: &[(Vec<u64>, usize)]) {
    let capacity = 12;
    let mut tree = PrefixTree::new(1, policy).unwrap();
    tree.set_trim_tails(true);
    let mut next_page = 0u64;
    for (tokens, extra) in steps {
        // A request's path: each token continues the ones before it.
        let m = tree.match_prefix(tokens, &NS);
        tree.lock(m.node).unwrap();
        let new = tokens.len() - m.length;
        let free = capacity - tree.device_pages();
        let need = new.saturating_sub(free) + extra;
        let before = tree.device_pages();
        let freed: usize = tree.evict(need).iter().map(|v| v.pages.len()).sum();
        // Exactly what was asked, unless the unlocked pages ran out first.
        assert!(freed <= need, "{policy:?}: freed {freed} for {need}");
        assert!(
            freed == need || tree.evictable(Tier::Device) == 0,
            "{policy:?}: freed {freed} of {need} with pages left to take"
        );
        assert_eq!(tree.device_pages(), before - freed);
        let room = capacity - tree.device_pages();
        if new <= room {
            let mut pages = tree.match_prefix(tokens, &NS).device_pages;
            let have = pages.len();
            pages.extend(next_page..next_page + (tokens.len() - have) as u64);
            next_page += (tokens.len() - have) as u64;
            tree.insert(tokens, &pages, &NS).unwrap();
        }
        tree.unlock(m.node).unwrap();
        tree.check_invariants().unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn every_policy_but_ghost_frees_what_it_needs_and_no_more(
        steps in prop::collection::vec(step(), 1..40),
        p in 0usize..Policy::ALL.len(),
    ) {
        prop_assume!(Policy::ALL[p] != Policy::Ghost);
        trims_exactly(Policy::ALL[p], &steps);
    }
}
