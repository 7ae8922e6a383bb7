//! Unit tests of the allocator's documented semantics on hand-built states.

use cpkv_allocator::{AllocError, Extent, PageAllocator};

fn kv(capacity: u64) -> PageAllocator {
    PageAllocator::new(&[("kv", capacity)]).unwrap()
}

fn reserve(a: &mut PageAllocator, key: u64, pages: u64) -> Option<Vec<Extent>> {
    let all = a.payloads().all();
    a.reserve(key, pages, all)
        .unwrap()
        .map(|p| p.extents(0).unwrap().to_vec())
}

#[test]
fn first_fit_then_lowest_extents_in_address_order() {
    let mut a = kv(20);
    for key in 0..5 {
        reserve(&mut a, key, 4);
    }
    a.release(1).unwrap(); // free [4, 8)
    a.release(3).unwrap(); // free [12, 16)
                           // Fits in the first hole, taken from its start.
    assert_eq!(reserve(&mut a, 10, 3), Some(vec![Extent::new(4, 3)]));
    // Free now [7, 8) and [12, 16): 4 fits the second.
    assert_eq!(reserve(&mut a, 11, 4), Some(vec![Extent::new(12, 4)]));
    a.release(11).unwrap();
    // 5 fits nowhere: lowest extents in address order.
    assert_eq!(
        reserve(&mut a, 12, 5),
        Some(vec![Extent::new(7, 1), Extent::new(12, 4)])
    );
    assert_eq!(a.free_pages(0), 0);
    assert_eq!(reserve(&mut a, 13, 1), None);
    assert_eq!(a.stats().counters.misses, 1);
    a.verify().unwrap();
}

#[test]
fn all_or_nothing_across_payloads() {
    let mut a = PageAllocator::new(&[("kv", 10), ("index", 4)]).unwrap();
    let before = (a.digest(), a.stats());
    let all = a.payloads().all();
    assert!(a.reserve(1, 5, all).unwrap().is_none());
    assert_eq!(a.digest(), before.0);
    assert_eq!(a.stats().payloads, before.1.payloads);
    let kv_only = a.select(Some(&["kv"])).unwrap();
    let placement = a.reserve(1, 5, kv_only).unwrap().unwrap();
    assert_eq!(placement.extents(1), None);
    assert_eq!(placement.pages(0), Some(vec![0, 1, 2, 3, 4]));
}

#[test]
fn split_shares_pages_and_keeps_commit() {
    let mut a = kv(8);
    reserve(&mut a, 1, 3);
    reserve(&mut a, 2, 2);
    a.release(1).unwrap();
    reserve(&mut a, 3, 6); // [0, 3) then [5, 8)
    assert_eq!(
        a.split(3, 2, 4, 5),
        Err(AllocError::NotCommitted { key: 3 })
    );
    a.mark_committed(3).unwrap();
    a.mark_committed(3).unwrap();
    assert_eq!(a.stats().counters.commits, 1);
    a.split(3, 4, 4, 5).unwrap();
    assert!(!a.contains(3));
    assert_eq!(a.placement(4).unwrap().pages(0), Some(vec![0, 1, 2, 5]));
    assert_eq!(a.placement(5).unwrap().pages(0), Some(vec![6, 7]));
    assert_eq!(a.is_committed(4), Ok(true));
    assert_eq!(a.is_committed(5), Ok(true));
    a.verify().unwrap();
}

#[test]
fn rejected_calls_change_nothing() {
    let mut a = kv(16);
    reserve(&mut a, 1, 4);
    a.mark_committed(1).unwrap();
    reserve(&mut a, 2, 4);
    let all = a.payloads().all();
    let before = (a.digest(), a.canonical_digest(), a.stats());
    let errors = [
        a.reserve(1, 2, all).map(|_| ()),
        a.reserve(3, 0, all).map(|_| ()),
        a.reserve_many(&[(3, 1), (4, 0)], all).map(|_| ()),
        a.reserve_many(&[(3, 1), (3, 1)], all).map(|_| ()),
        a.release(9),
        a.release_many(&[2, 9]),
        a.release_many(&[2, 2]),
        a.mark_committed(9),
        a.split(1, 0, 5, 6),
        a.split(1, 4, 5, 6),
        a.split(1, 2, 5, 5),
        a.split(1, 2, 2, 6),
        a.split(1, 2, 1, 6),
        a.split(2, 2, 5, 6),
        a.split(9, 2, 5, 6),
    ];
    assert!(errors.iter().all(Result::is_err), "{errors:?}");
    assert_eq!((a.digest(), a.canonical_digest(), a.stats()), before);
    assert_eq!(
        a.select(Some(&["kv", "kv"])),
        Err(AllocError::RepeatedPayload { name: "kv".into() })
    );
    assert_eq!(a.select(Some(&[""])), Err(AllocError::EmptyPayloadName));
    assert_eq!(a.select::<&str>(Some(&[])), Err(AllocError::NoPayloads));
    assert!(matches!(
        a.select(Some(&["v"])),
        Err(AllocError::UnknownPayload { .. })
    ));
    assert!(PageAllocator::new(&[("kv", 0)]).is_err());
    assert!(PageAllocator::new(&[("kv", 1), ("kv", 1)]).is_err());
}

#[test]
fn digest_is_a_function_of_state_not_history() {
    // Same final state by two histories: equal digests.
    let mut a = kv(32);
    let mut b = kv(32);
    for (key, pages) in [(1, 4), (2, 5), (3, 6)] {
        reserve(&mut a, key, pages);
    }
    a.release(2).unwrap();
    for (key, pages) in [(1, 4), (7, 5), (3, 6)] {
        reserve(&mut b, key, pages);
    }
    b.release(7).unwrap();
    assert_eq!(a.digest(), b.digest());
    assert_eq!(a.canonical_digest(), b.canonical_digest());
    // Same objects at different pages: different digests.
    let mut c = kv(32);
    reserve(&mut c, 3, 6);
    reserve(&mut c, 1, 4);
    assert_ne!(a.digest(), c.digest());
    assert_ne!(a.canonical_digest(), c.canonical_digest());
    // Commit state is part of the digest.
    let before = a.digest();
    a.mark_committed(1).unwrap();
    assert_ne!(a.digest(), before);
}

#[test]
fn reserve_pages_places_a_batch_like_one_object_and_frees_each_page_alone() {
    let mut a = kv(12);
    for key in 0..4 {
        reserve(&mut a, key, 3);
    }
    a.release(1).unwrap(); // free [3, 6)
    a.release(3).unwrap(); // free [9, 12)
    let mut pages = Vec::new();
    // Two pages fit the first hole: one one-page object per key there.
    assert!(a.reserve_pages(&[20, 21], 0, &mut pages).unwrap());
    assert_eq!(pages, [3, 4]);
    assert_eq!(a.placement(21).unwrap().pages(0).unwrap(), [4]);
    // Four fit no hole whole: the lowest free pages, in address order.
    pages.clear();
    assert!(a.reserve_pages(&[22, 23, 24, 25], 0, &mut pages).unwrap());
    assert_eq!(pages, [5, 9, 10, 11]);
    a.release(20).unwrap();
    a.release(22).unwrap();
    assert_eq!(a.free_extents(0), [Extent::new(3, 1), Extent::new(5, 1)]);
    a.release(21).unwrap();
    assert_eq!(a.free_extents(0), [Extent::new(3, 3)], "frees coalesce");
    a.verify().unwrap();

    // Rejected calls change nothing; a miss is counted.
    let before = (a.digest(), a.free_extents(0), a.stats().counters);
    pages.clear();
    for (keys, payload, err) in [
        (&[30, 23][..], 0, AllocError::DuplicateKey { key: 23 }),
        (
            &[30, 31, 30][..],
            0,
            AllocError::RepeatedKeyInBatch { key: 30 },
        ),
        (
            &[30][..],
            1,
            AllocError::UnknownPayload { name: "#1".into() },
        ),
    ] {
        assert_eq!(a.reserve_pages(keys, payload, &mut pages), Err(err));
    }
    assert!(!a.reserve_pages(&[30, 31, 32, 33], 0, &mut pages).unwrap());
    assert!(pages.is_empty());
    assert_eq!((a.digest(), a.free_extents(0)), (before.0, before.1));
    assert_eq!(a.stats().counters.misses, before.2.misses + 1);
    a.verify().unwrap();
}
