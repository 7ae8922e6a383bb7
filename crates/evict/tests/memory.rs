//! Bounded memory for a tree that runs for weeks: node slots are reused,
//! idle namespace roots are dropped beyond a bound, the event buffer is
//! bounded, and none of it costs determinism.

use cpkv_evict::{EvictError, Namespace, NodeId, Policy, PrefixTree, IDLE_ROOTS_KEPT};

/// Inserts then evicts `rounds` distinct one-page prefixes on top of `live`
/// resident ones, so the live size stays fixed.
fn churn(tree: &mut PrefixTree, live: u64, rounds: u64) {
    let ns = Namespace::Default;
    for i in 0..live {
        tree.insert(&[i], &[i], &ns).unwrap();
    }
    let mut free_pages = vec![live];
    for r in 0..rounds {
        let page = free_pages.pop().expect("a page was freed");
        tree.insert(&[live + r], &[page], &ns).unwrap();
        for victim in tree.evict(1) {
            free_pages.extend(victim.pages);
        }
    }
}

#[test]
fn node_slots_follow_the_live_size_not_the_history() {
    for policy in Policy::ALL {
        let mut tree = PrefixTree::new(1, policy).unwrap();
        churn(&mut tree, 50, 5_000);
        assert!(tree.len() <= 52, "{policy:?}: {} live nodes", tree.len());
        assert!(
            tree.node_slots() <= 53,
            "{policy:?}: {} slots for {} live nodes",
            tree.node_slots(),
            tree.len()
        );
        tree.check_invariants().unwrap();
    }
}

#[test]
fn a_reused_slot_gets_a_new_id_and_the_old_id_names_nothing() {
    let ns = Namespace::Default;
    let mut tree = PrefixTree::new(1, Policy::Lru).unwrap();
    let first = tree.insert(&[7], &[1], &ns).unwrap().node;
    tree.evict(1);
    let second = tree.insert(&[8], &[2], &ns).unwrap().node;
    assert_eq!(first.0 & 0xffff_ffff, second.0 & 0xffff_ffff, "slot reused");
    assert_ne!(first, second);
    assert!(tree.node(first).is_none());
    assert_eq!(tree.lock(first), Err(EvictError::UnknownNode(first)));
    assert_eq!(
        tree.lock(NodeId(u64::MAX)),
        Err(EvictError::UnknownNode(NodeId(u64::MAX)))
    );
    tree.check_invariants().unwrap();
}

#[test]
fn one_off_namespaces_do_not_accumulate() {
    let mut tree = PrefixTree::new(1, Policy::Lru).unwrap();
    for i in 0..(3 * IDLE_ROOTS_KEPT as u64) {
        let ns = Namespace::Id(i);
        let m = tree.match_prefix(&[1, 2], &ns);
        assert_eq!(m.length, 0);
        // A match's root stays usable right after the match.
        tree.lock(m.node).unwrap();
        tree.unlock(m.node).unwrap();
    }
    assert!(
        tree.namespaces() <= IDLE_ROOTS_KEPT + 1,
        "{} roots",
        tree.namespaces()
    );
    assert!(tree.node_slots() <= IDLE_ROOTS_KEPT + 2);
    tree.check_invariants().unwrap();
}

#[test]
fn a_namespace_with_content_or_a_lock_is_never_dropped() {
    let mut tree = PrefixTree::new(1, Policy::Lru).unwrap();
    let kept = Namespace::Name("kept".into());
    tree.insert(&[1, 2], &[10, 11], &kept).unwrap();
    let locked = Namespace::Name("locked".into());
    let root = tree.match_prefix(&[5], &locked).node;
    tree.lock(root).unwrap();
    for i in 0..(2 * IDLE_ROOTS_KEPT as u64) {
        tree.match_prefix(&[1], &Namespace::Id(i));
    }
    assert_eq!(tree.match_prefix(&[1, 2], &kept).length, 2);
    assert_eq!(tree.root(&locked), Some(root));
    tree.unlock(root).unwrap();
    tree.check_invariants().unwrap();
}

#[test]
fn the_event_buffer_is_bounded_and_counts_what_it_dropped() {
    let ns = Namespace::Default;
    let mut tree = PrefixTree::new(1, Policy::Lru).unwrap();
    tree.set_event_limit(10);
    for i in 0..25u64 {
        tree.insert(&[i], &[i], &ns).unwrap();
    }
    let events = tree.take_events();
    assert_eq!(events.len(), 10);
    assert_eq!(tree.dropped_events(), 15);
    assert!(tree.take_events().is_empty());
    tree.set_event_limit(0);
    tree.evict(5);
    assert!(tree.take_events().is_empty());
    assert_eq!(tree.dropped_events(), 20);
}

#[test]
fn events_are_off_until_a_caller_asks_for_them() {
    let ns = Namespace::Default;
    let mut tree = PrefixTree::new(1, Policy::Lru).unwrap();
    assert_eq!(tree.event_limit(), 0);
    tree.insert(&[1, 2], &[1, 2], &ns).unwrap();
    tree.evict(2);
    assert!(tree.take_events().is_empty());
    assert_eq!(tree.dropped_events(), 2);
    tree.set_event_limit(4);
    tree.insert(&[3], &[3], &ns).unwrap();
    assert_eq!(tree.take_events().len(), 1);
}

#[test]
fn replicas_reuse_the_same_slots() {
    let mut a = PrefixTree::new(1, Policy::Ghost).unwrap();
    let mut b = PrefixTree::new(1, Policy::Ghost).unwrap();
    churn(&mut a, 20, 500);
    churn(&mut b, 20, 500);
    assert_eq!(a.digest(), b.digest());
    assert_eq!(
        a.nodes().map(|n| n.id()).collect::<Vec<_>>(),
        b.nodes().map(|n| n.id()).collect::<Vec<_>>()
    );
}
