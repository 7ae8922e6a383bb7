//! Named behaviours: eviction order per policy, scan resistance, split and
//! namespace semantics, determinism of replicas.

use cpkv_evict::{Event, EvictError, Namespace, NodeId, Policy, PrefixTree, Tier};

const NS: Namespace = Namespace::Default;

/// Inserts `tokens` (page_size 1) with fresh page ids, evicting first so the
/// tree never holds more than `capacity` device pages.
fn admit(tree: &mut PrefixTree, tokens: &[u64], capacity: usize, next_page: &mut u64) {
    let m = tree.match_prefix(tokens, &NS);
    tree.lock(m.node).unwrap();
    let new = tokens.len() - m.length;
    let free = capacity - tree.device_pages();
    if new > free {
        tree.evict(new - free);
    }
    let mut pages = m.device_pages.clone();
    pages.extend(*next_page..*next_page + new as u64);
    *next_page += new as u64;
    tree.insert(tokens, &pages, &NS).unwrap();
    tree.unlock(m.node).unwrap();
}

/// Does the hot prefix survive a flood of one-shot prefixes while being hit
/// every 8 one-shots (more than the capacity passes in between)?
fn hot_survives(policy: Policy) -> bool {
    let (capacity, mut next) = (20, 0);
    let mut tree = PrefixTree::new(1, policy).unwrap();
    let hot = [1, 2, 3];
    admit(&mut tree, &hot, capacity, &mut next);
    admit(&mut tree, &hot, capacity, &mut next);
    let mut hits = 0;
    for i in 0..200u64 {
        admit(
            &mut tree,
            &[1000 + i, 5000 + i, 9000 + i],
            capacity,
            &mut next,
        );
        if i % 8 == 7 {
            hits += usize::from(tree.match_prefix(&hot, &NS).length == 3);
        }
        tree.check_invariants().unwrap();
        assert!(tree.device_pages() <= capacity);
    }
    hits == 25
}

#[test]
fn slru_resists_a_scan_and_lru_does_not() {
    assert!(hot_survives(Policy::Slru));
    assert!(!hot_survives(Policy::Lru));
    assert!(!hot_survives(Policy::Fifo));
}

#[test]
fn ghost_resists_a_scan_too() {
    assert!(hot_survives(Policy::Ghost));
}

#[test]
fn ghost_puts_one_shot_content_behind_reused_content_of_the_same_age() {
    let order = |policy| {
        let mut t = PrefixTree::new(1, policy).unwrap();
        let reused = t.insert(&[1, 2], &[10, 11], &NS).unwrap().node;
        let one_shot = t.insert(&[3, 4], &[12, 13], &NS).unwrap().node;
        t.match_prefix(&[1, 2], &NS);
        let newer = t.insert(&[5, 6], &[14, 15], &NS).unwrap().node;
        t.check_invariants().unwrap();
        (t.eviction_order(Tier::Device), [reused, one_shot, newer])
    };
    let (ghost, [reused, one_shot, newer]) = order(Policy::Ghost);
    // Nothing evicted yet: the horizon is the whole clock (4). One-shot
    // nodes sit half a horizon behind their access (2 - 2, 4 - 2); the
    // reused node one horizon ahead (3 + 3).
    assert_eq!(ghost, [one_shot, newer, reused]);
    let (lru, _) = order(Policy::Lru);
    assert_eq!(lru, [one_shot, reused, newer]);
}

#[test]
fn ghost_remembers_dropped_content_and_restores_its_count() {
    let mut t = PrefixTree::new(1, Policy::Ghost).unwrap();
    t.insert(&[1, 2], &[10, 11], &NS).unwrap();
    t.match_prefix(&[1, 2], &NS);
    t.match_prefix(&[1, 2], &NS);
    assert_eq!(t.evict(2).len(), 1);
    assert_eq!((t.len(), t.remembered_pages()), (1, 2));
    let back = t.insert(&[1, 2], &[20, 21], &NS).unwrap().node;
    assert_eq!(
        t.node(back).unwrap().hits(),
        4,
        "3 remembered + this insert"
    );
    assert_eq!(t.remembered_pages(), 0, "taken back");
    let fresh = t.insert(&[7, 8], &[22, 23], &NS).unwrap().node;
    assert_eq!(t.node(fresh).unwrap().hits(), 1);
    assert_eq!(t.eviction_order(Tier::Device), [fresh, back]);
    t.check_invariants().unwrap();

    let mut lru = PrefixTree::new(1, Policy::Lru).unwrap();
    lru.insert(&[1, 2], &[10, 11], &NS).unwrap();
    lru.evict(2);
    assert_eq!(lru.remembered_pages(), 0, "only ghost keeps a history");
    assert_eq!(lru.insert(&[1, 2], &[20, 21], &NS).unwrap().cached, 0);
}

#[test]
fn the_ghost_history_is_in_the_digest() {
    let digest = |policy, tokens: [u64; 2]| {
        let mut t = PrefixTree::new(1, policy).unwrap();
        t.insert(&tokens, &[10, 11], &NS).unwrap();
        t.evict(2);
        t.check_invariants().unwrap();
        t.digest()
    };
    // Both trees end empty with the same clock and ids; only what the ghost
    // history remembers differs.
    assert_eq!(digest(Policy::Lru, [1, 2]), digest(Policy::Lru, [3, 4]));
    assert_ne!(digest(Policy::Ghost, [1, 2]), digest(Policy::Ghost, [3, 4]));
}

#[test]
fn lru_evicts_least_recent_leaf_first_and_parents_after_children() {
    let mut t = PrefixTree::new(1, Policy::Lru).unwrap();
    let a = t.insert(&[1, 2], &[10, 11], &NS).unwrap().node;
    let b = t.insert(&[1, 3], &[12, 13], &NS).unwrap().node; // splits [1,2] at 1
    let c = t.insert(&[4], &[14], &NS).unwrap().node;
    t.match_prefix(&[1, 2], &NS);
    // Leaves by last access: b (insert 2), c (insert 3), a (match 4).
    let order: Vec<NodeId> = t.evict(10).into_iter().map(|v| v.node).collect();
    let shared = NodeId(2); // the split-off [1]: ids go root 0, a 1, split 2, b 3
    assert_eq!(order, vec![b, c, a, shared]);
    assert_eq!(t.device_pages(), 0);
    assert_eq!(t.len(), 1, "only the root is left");
}

#[test]
fn split_keeps_the_callers_id_on_the_suffix() {
    let mut t = PrefixTree::new(2, Policy::Lru).unwrap();
    let r = t.insert(&[1, 1, 2, 2, 3, 3], &[7, 8, 9], &NS).unwrap();
    t.lock(r.node).unwrap();
    let m = t.match_prefix(&[1, 1, 2, 2, 5, 5], &NS);
    assert_eq!((m.length, m.device_pages.clone()), (4, vec![7, 8]));
    assert_ne!(m.node, r.node);
    let tail = t.node(r.node).unwrap();
    assert_eq!(
        (tail.tokens(), tail.device_pages()),
        (&[3u64, 3][..], Some(&[9u64][..]))
    );
    assert_eq!(
        t.node(m.node).unwrap().locks(),
        1,
        "the split-off parent inherits the lock"
    );
    assert!(t.evict(10).is_empty(), "the whole locked path stays");
    t.unlock(r.node).unwrap();
    assert_eq!(t.unlock(r.node), Err(EvictError::LockUnderflow(r.node)));
    assert_eq!(t.evict(1).len(), 1);
    t.check_invariants().unwrap();
}

#[test]
fn namespaces_never_share_a_prefix() {
    let mut t = PrefixTree::new(1, Policy::Lru).unwrap();
    t.insert(&[1, 2, 3], &[1, 2, 3], &Namespace::Id(7)).unwrap();
    assert_eq!(t.match_prefix(&[1, 2, 3], &NS).length, 0);
    assert_eq!(
        t.match_prefix(&[1, 2, 3], &Namespace::Name("lora-a".into()))
            .length,
        0
    );
    assert_eq!(t.match_prefix(&[1, 2, 3], &Namespace::Id(7)).length, 3);
    let r = t.insert(&[1, 2, 3], &[4, 5, 6], &NS).unwrap();
    assert_eq!(r.cached, 0);
    t.check_invariants().unwrap();
}

#[test]
fn host_tier_round_trip() {
    let mut t = PrefixTree::new(1, Policy::Lru).unwrap();
    t.set_event_limit(1 << 16); // events are off by default
    let a = t.insert(&[1, 2], &[10, 11], &NS).unwrap().node;
    t.take_events();
    t.set_host(a, 77).unwrap();
    let v = t.evict(1);
    assert_eq!((v[0].node, v[0].pages.clone()), (a, vec![10, 11]));
    let m = t.match_prefix(&[1, 2, 3], &NS);
    assert_eq!((m.length, m.host_length, m.host_node), (0, 2, a));
    t.attach_device(a, &[20, 21]).unwrap();
    assert_eq!(t.match_prefix(&[1, 2], &NS).device_pages, vec![20, 21]);
    t.evict(2);
    // Split the host-only node: both halves share object 77 until the last goes.
    t.match_prefix(&[1, 9], &NS);
    assert_eq!(t.host_pages(), 2);
    let dropped = t.evict_host(2);
    assert_eq!(
        dropped.iter().map(|v| v.released).collect::<Vec<_>>(),
        vec![false, true]
    );
    assert!(dropped.iter().all(|v| v.object_key == 77));
    assert_eq!((t.len(), t.host_pages()), (1, 0));
    let kinds: Vec<&str> = t
        .take_events()
        .iter()
        .map(|e| match e {
            Event::DeviceStored { .. } => "d+",
            Event::DeviceRemoved { .. } => "d-",
            Event::HostStored { .. } => "h+",
            Event::HostRemoved { .. } => "h-",
        })
        .collect();
    assert_eq!(kinds, ["h+", "d-", "d+", "d-", "h-", "h-"]);
    t.check_invariants().unwrap();
}

#[test]
fn replicas_agree_and_one_extra_access_is_visible() {
    let run = |extra: bool| {
        let mut t = PrefixTree::new(1, Policy::Ghost).unwrap();
        t.set_event_limit(1 << 16); // events are off by default
        let mut next = 0;
        let mut victims = Vec::new();
        for i in 0..300u64 {
            let tokens: Vec<u64> = (0..(i % 7 + 1)).map(|k| (i % 13) * 100 + k).collect();
            admit(&mut t, &tokens, 25, &mut next);
            if extra && i == 150 {
                t.match_prefix(&[0], &NS);
            }
            victims.extend(t.take_events());
        }
        (t.digest(), victims, t.eviction_order(Tier::Device))
    };
    let a = run(false);
    assert_eq!(a, run(false));
    let b = run(true);
    assert_ne!(a.0, b.0, "one extra access must change the digest");
}

#[test]
fn unknown_policy_and_bad_counts_are_refused() {
    assert_eq!(
        "mru".parse::<Policy>(),
        Err(EvictError::UnknownPolicy("mru".into()))
    );
    assert!(PrefixTree::new(0, Policy::Lru).is_err());
    let mut t = PrefixTree::new(2, Policy::Lru).unwrap();
    let d = t.digest();
    assert!(matches!(
        t.insert(&[1, 2, 3, 4], &[1], &NS),
        Err(EvictError::PageCountMismatch { .. })
    ));
    assert_eq!(t.lock(NodeId(99)), Err(EvictError::UnknownNode(NodeId(99))));
    assert_eq!(t.digest(), d);
    assert_eq!(t.clock(), 0, "refused calls do not advance the clock");
}

#[test]
fn arc_and_s3fifo_resist_a_scan() {
    assert!(hot_survives(Policy::Arc));
    assert!(hot_survives(Policy::S3fifo));
}

#[test]
fn arc_evicts_seen_once_before_reused_and_returns_ghosts_to_the_reused_queue() {
    let mut t = PrefixTree::new(1, Policy::Arc).unwrap();
    let reused = t.insert(&[1, 2], &[10, 11], &NS).unwrap().node;
    t.match_prefix(&[1, 2], &NS); // T1 -> T2
    let once = t.insert(&[3, 4], &[12, 13], &NS).unwrap().node;
    let newer = t.insert(&[5, 6], &[14, 15], &NS).unwrap().node;
    t.check_invariants().unwrap();
    // T1 (least recent first), then T2; T1 holds more than its target (0).
    assert_eq!(t.eviction_order(Tier::Device), [once, newer, reused]);
    assert_eq!(t.evict(1)[0].node, once);
    assert_eq!(t.remembered_pages(), 2, "B1 remembers it");
    // It comes back: a ghost hit, so it enters T2 behind the reused node.
    let back = t.insert(&[3, 4], &[16, 17], &NS).unwrap().node;
    assert_eq!(t.remembered_pages(), 0);
    assert_eq!(t.eviction_order(Tier::Device), [newer, reused, back]);
    t.check_invariants().unwrap();
}

#[test]
fn s3fifo_moves_what_was_hit_in_the_small_queue_and_gives_second_chances() {
    let mut t = PrefixTree::new(1, Policy::S3fifo).unwrap();
    let a = t.insert(&[1], &[10], &NS).unwrap().node;
    let b = t.insert(&[2], &[11], &NS).unwrap().node;
    let c = t.insert(&[3], &[12], &NS).unwrap().node;
    t.match_prefix(&[1], &NS); // a: one hit while in S
                               // All three are in S (3 of 3 pages, over a tenth): S's head `a` was hit,
                               // so it moves to M instead of leaving; then `b` leaves.
    let victims = t.evict(1);
    assert_eq!(victims.iter().map(|v| v.node).collect::<Vec<_>>(), [b]);
    assert_eq!(t.eviction_order(Tier::Device), [c, a], "S before M");
    t.check_invariants().unwrap();
    // `b` was dropped from S into the ghost queue: on return it enters M.
    let b2 = t.insert(&[2], &[13], &NS).unwrap().node;
    assert_eq!(t.eviction_order(Tier::Device), [c, a, b2]);
    // S (just `c`, 1 of 3 pages) is over a tenth: `c` leaves, never hit.
    assert_eq!(t.evict(1)[0].node, c);
    // Now S is empty: M's head `a` (no hits since it moved) leaves.
    assert_eq!(t.evict(1)[0].node, a);
    t.match_prefix(&[2], &NS);
    let d = t.insert(&[4], &[14], &NS).unwrap().node;
    t.match_prefix(&[4], &NS);
    // S holds `d` (1 of 2 pages): `d` was hit, so it moves to M; M's head
    // `b2` has a hit left: it goes back behind `d` with one fewer; `d`
    // (moved with none) leaves.
    assert_eq!(t.evict(1)[0].node, d);
    assert_eq!(t.eviction_order(Tier::Device), [b2]);
    t.check_invariants().unwrap();
}

#[test]
fn queue_policies_keep_their_ghost_lists_in_the_digest() {
    for policy in [Policy::Arc, Policy::S3fifo] {
        let digest = |tokens: [u64; 2]| {
            let mut t = PrefixTree::new(1, policy).unwrap();
            t.insert(&tokens, &[10, 11], &NS).unwrap();
            t.evict(2);
            t.check_invariants().unwrap();
            t.digest()
        };
        assert_ne!(digest([1, 2]), digest([3, 4]), "{policy:?}");
    }
}

#[test]
fn replicas_of_every_policy_agree_and_see_one_extra_access() {
    for policy in Policy::ALL {
        let run = |extra: bool| {
            let mut t = PrefixTree::new(1, policy).unwrap();
            t.set_event_limit(1 << 16); // events are off by default
            let mut next = 0;
            let mut digests = Vec::new();
            for i in 0..300u64 {
                let tokens: Vec<u64> = (0..(i % 7 + 1)).map(|k| (i % 13) * 100 + k).collect();
                admit(&mut t, &tokens, 25, &mut next);
                if extra && i == 150 {
                    t.match_prefix(&[0], &NS);
                }
                digests.push(t.digest());
                t.check_invariants().unwrap();
            }
            (digests, t.take_events(), t.eviction_order(Tier::Device))
        };
        let a = run(false);
        assert_eq!(a, run(false), "{policy:?}");
        let b = run(true);
        assert_eq!(a.0[..150], b.0[..150], "{policy:?}");
        assert_ne!(
            a.0[150], b.0[150],
            "{policy:?}: the extra access shows at once"
        );
    }
}

#[test]
fn what_a_policy_keeps_beyond_the_live_nodes_is_bounded_by_the_capacity() {
    const CAPACITY: usize = 40;
    for policy in Policy::ALL {
        let mut t = PrefixTree::new(1, policy).unwrap();
        let mut next = 0;
        let mut most = cpkv_evict::PolicyMemory::default();
        for i in 0..3000u64 {
            // Mostly new conversations, some coming back.
            let conv = if i % 3 == 0 { i % 97 } else { i };
            let tokens: Vec<u64> = (0..(i % 5 + 1)).map(|k| conv * 10 + k).collect();
            admit(&mut t, &tokens, CAPACITY, &mut next);
            let m = t.policy_memory();
            most.remembered_pages = most.remembered_pages.max(m.remembered_pages);
            most.shadow_nodes = most.shadow_nodes.max(m.shadow_nodes);
            most.shadow_pages = most.shadow_pages.max(m.shadow_pages);
        }
        // Ghost history: 4x the pages held; ARC: B1 + B2 <= c; S3-FIFO: c.
        assert!(
            most.remembered_pages <= 4 * CAPACITY,
            "{policy:?}: {most:?}"
        );
        // Three shadows, each holding at most c pages and remembering 4c.
        assert!(
            most.shadow_pages <= 3 * 5 * CAPACITY,
            "{policy:?}: {most:?}"
        );
        assert!(
            most.shadow_nodes <= 3 * (CAPACITY + 1),
            "{policy:?}: {most:?}"
        );
        if policy == Policy::Ghost {
            assert!(most.shadow_pages > 0);
        } else {
            assert_eq!((most.shadow_nodes, most.shadow_pages), (0, 0));
        }
    }
}

#[test]
fn ghost_evicts_only_the_tail_of_a_long_victim() {
    for policy in [Policy::Ghost, Policy::Lru] {
        let mut tree = PrefixTree::new(1, policy).unwrap();
        tree.insert(&[1, 2, 3, 4, 5, 6], &[10, 11, 12, 13, 14, 15], &NS)
            .unwrap();
        // Two pages needed from a six-page leaf: ghost splits it and frees the
        // last two; lru frees the whole leaf.
        let victims = tree.evict(2);
        let freed: Vec<u64> = victims.iter().flat_map(|v| v.pages.clone()).collect();
        let kept = tree.match_prefix(&[1, 2, 3, 4, 5, 6], &NS).device_pages;
        if policy == Policy::Ghost {
            assert_eq!(freed, vec![14, 15]);
            assert_eq!(kept, vec![10, 11, 12, 13]);
            // The tail leaves in place: the victim keeps its id with the head.
            let head = tree.node(victims[0].node).expect("still live");
            assert_eq!(head.device_pages(), Some(&[10, 11, 12, 13][..]));
            // Needing more than half of a leaf takes all of it.
            let freed: usize = tree.evict(3).iter().map(|v| v.pages.len()).sum();
            assert_eq!(freed, 4);
        } else {
            assert_eq!(freed.len(), 6);
            assert!(kept.is_empty());
        }
        tree.check_invariants().unwrap();
    }
}

#[test]
fn ghost_splits_a_long_victim_with_a_host_copy_instead_of_trimming_it() {
    let mut tree = PrefixTree::new(1, Policy::Ghost).unwrap();
    let leaf = tree
        .insert(&[1, 2, 3, 4, 5, 6], &[10, 11, 12, 13, 14, 15], &NS)
        .unwrap()
        .node;
    tree.set_host(leaf, 77).unwrap();
    let victims = tree.evict(2);
    assert_eq!(victims.len(), 1);
    assert_eq!(victims[0].pages, vec![14, 15]);
    // The tail keeps the id (now host-only); the head is a new device leaf.
    let tail = tree.node(victims[0].node).unwrap();
    assert!(!tail.on_device() && tail.on_host());
    assert_eq!(tail.tokens(), &[5, 6]);
    let m = tree.match_prefix(&[1, 2, 3, 4, 5, 6], &NS);
    assert_eq!(m.device_pages, vec![10, 11, 12, 13]);
    tree.check_invariants().unwrap();
}

/// A count far beyond what is cached evicts everything under every policy
/// (ghost's "only the tail of a long victim" once wrapped `2 * count`).
#[test]
fn a_huge_evict_count_takes_everything_under_every_policy() {
    for policy in Policy::ALL {
        let mut tree = PrefixTree::new(1, policy).unwrap();
        tree.insert(&[5, 6, 7], &[1, 2, 3], &Namespace::Default)
            .unwrap();
        let victims = tree.evict((1 << 63) + 1);
        assert_eq!(
            victims.iter().map(|v| v.pages.len()).sum::<usize>(),
            3,
            "{policy:?}"
        );
    }
}
