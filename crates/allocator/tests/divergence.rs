//! Same-state-size divergence: two allocators that hold the same number of
//! objects and pages but differ in one replicated fact (where an object sits,
//! whether it is committed, which key an object has) have different fast and
//! canonical digests, and equal facts give equal digests whatever order built
//! them. (Free extents are the complement of the object extents, so a
//! placement change is also a free-extent change.)

use cpkv_allocator::{PageAllocator, PayloadSet};

fn pools() -> PageAllocator {
    PageAllocator::new(&[("kv", 64u64), ("idx", 64)]).unwrap()
}

fn both(a: &PageAllocator, b: &PageAllocator) -> bool {
    a.digest() == b.digest() && a.canonical_digest() == b.canonical_digest()
}

fn all(a: &PageAllocator) -> PayloadSet {
    a.select::<&str>(None).unwrap()
}

#[test]
fn placement_commit_key_and_free_extents_each_move_the_digests() {
    // Base: objects 1 (4 pages) and 2 (4 pages), object 3 released between them.
    let build = |tweak: &dyn Fn(&mut PageAllocator)| {
        let mut a = pools();
        let set = all(&a);
        a.reserve(1, 4, set).unwrap().unwrap();
        a.reserve(3, 2, set).unwrap().unwrap();
        a.reserve(2, 4, set).unwrap().unwrap();
        a.release(3).unwrap();
        tweak(&mut a);
        a.verify().unwrap();
        a
    };
    let base = build(&|_| {});
    let committed = build(&|a| a.mark_committed(2).unwrap());
    assert!(!both(&base, &committed), "committed set");

    // The same objects, but object 2 sits elsewhere (the hole is at the end).
    let moved = {
        let mut a = pools();
        let set = all(&a);
        a.reserve(1, 4, set).unwrap().unwrap();
        a.reserve(2, 4, set).unwrap().unwrap();
        a.verify().unwrap();
        a
    };
    assert_eq!(
        (moved.len(), moved.free_pages(0)),
        (base.len(), base.free_pages(0))
    );
    assert!(!both(&base, &moved), "placement and free extents");

    // The same placement under another key.
    let rekeyed = {
        let mut a = pools();
        let set = all(&a);
        a.reserve(1, 4, set).unwrap().unwrap();
        a.reserve(3, 2, set).unwrap().unwrap();
        a.reserve(9, 4, set).unwrap().unwrap();
        a.release(3).unwrap();
        a
    };
    assert!(!both(&base, &rekeyed), "object key");

    // Equal facts built in another order: equal digests.
    let reordered = {
        let mut a = pools();
        let set = all(&a);
        a.reserve(1, 4, set).unwrap().unwrap();
        a.reserve(3, 2, set).unwrap().unwrap();
        a.reserve(2, 4, set).unwrap().unwrap();
        a.mark_committed(2).unwrap();
        a.release(3).unwrap();
        a
    };
    assert!(both(&committed, &reordered));
}

/// Pinned digests of a fixed build-up: a change of hash, platform or
/// compiler that moves them is caught here.
#[test]
fn golden_digests() {
    let mut a = pools();
    let set = all(&a);
    for key in 0..20u64 {
        a.reserve(key, 1 + key % 5, set).unwrap().unwrap();
        if key % 3 == 0 {
            a.mark_committed(key).unwrap();
        }
        if key % 4 == 1 {
            a.release(key).unwrap();
        }
    }
    let canonical: String = a.canonical_digest()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        (a.digest(), canonical.as_str()),
        (GOLDEN_FAST, GOLDEN_CANONICAL),
        "{:#x}",
        a.digest()
    );
}

const GOLDEN_FAST: u64 = 0xdb04_fed1_2075_f66f;
const GOLDEN_CANONICAL: &str = "61e59353c717d032";
