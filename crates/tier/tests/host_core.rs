//! The host tier's one core under both of its users: the engines'
//! `OffloadIndex` and the main job's `TierCache` place rows with the same
//! first-fit allocator: a batch goes to the lowest free rows that hold it
//! whole, so rows freed by separate evictions coalesce and come back as one
//! ascending run (a row stack popped them back last-freed first).

use cpkv_tier::{Namespace, OffloadIndex, Policy, TierCache, TierConfig};

fn key(chain: &[u8], i: usize) -> Vec<u8> {
    let mut k: Vec<u8> = chain[..=i].to_vec();
    k.extend_from_slice(&0u32.to_be_bytes());
    k
}

#[test]
fn an_evicted_chains_rows_come_back_in_order_for_the_next_store() {
    let mut index = OffloadIndex::new(3, Policy::Lru, vec![1]).unwrap();
    let first: Vec<Vec<u8>> = (0..3).map(|i| key(b"abc", i)).collect();
    let refs: Vec<&[u8]> = first.iter().map(Vec::as_slice).collect();
    let rows: Vec<u32> = index
        .store(&refs, None)
        .unwrap()
        .iter()
        .map(|p| p.unwrap().row)
        .collect();
    assert_eq!(rows, [0, 1, 2]);
    // A second chain needs all three rows: the first chain leaves whole and
    // its rows are handed out again in their order, one contiguous run.
    let second: Vec<Vec<u8>> = (0..3).map(|i| key(b"xyz", i)).collect();
    let refs: Vec<&[u8]> = second.iter().map(Vec::as_slice).collect();
    let rows: Vec<u32> = index
        .store(&refs, None)
        .unwrap()
        .iter()
        .map(|p| p.unwrap().row)
        .collect();
    assert_eq!(rows, [0, 1, 2]);
    assert_eq!(index.host().rows().used(), 3);
    index.check().unwrap();
}

#[test]
fn the_main_job_takes_its_backup_rows_from_the_same_allocator() {
    let mut cache = TierCache::new(TierConfig {
        page_size: 1,
        cp_size: 1,
        device_pages: 8,
        host_pages: 3,
        policy: Policy::Lru,
        host_free_target: 0,
    })
    .unwrap();
    let ns = Namespace::Default;
    let backup = |cache: &mut TierCache, tokens: &[u64]| {
        let pages = cache.allocate(tokens.len() as u64).unwrap();
        let out = cache.insert(tokens, &pages, &ns).unwrap();
        let frontier = cache.issued();
        cache.commit(frontier).unwrap();
        cache.evict_device(8);
        out.backups
            .iter()
            .flat_map(|b| b.host_pages.clone())
            .collect::<Vec<u64>>()
    };
    assert_eq!(backup(&mut cache, &[1, 2, 3]), [0, 1, 2]);
    // The host is full: admission evicts the first path, whose rows return
    // in order, as in the engines' index.
    assert_eq!(backup(&mut cache, &[7, 8, 9]), [0, 1, 2]);
    assert_eq!(cache.host().rows().used(), 3);
    cache.check_invariants().unwrap();
}

#[test]
fn a_store_call_gets_its_rows_as_one_run_from_blocks_evicted_one_by_one() {
    let mut index = OffloadIndex::new(4, Policy::Lru, vec![1]).unwrap();
    let store = |index: &mut OffloadIndex, keys: &[Vec<u8>]| -> Vec<u32> {
        let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let placed = index.store(&refs, None).unwrap();
        placed.iter().map(|p| p.unwrap().row).collect()
    };
    for (chain, row) in [b"a", b"b", b"c", b"d"].iter().zip(0u32..) {
        assert_eq!(store(&mut index, &[key(*chain, 0)]), [row]);
    }
    // Two blocks: the two oldest chains leave, separately; their rows
    // merge into one free extent and the call takes it in address order.
    let rows = store(&mut index, &[key(b"xy", 0), key(b"xy", 1)]);
    assert_eq!(rows, [0, 1], "one copy run");
    let digest = index.host().rows().digest();
    let allocator = index.host().rows().allocator();
    assert_eq!(
        (allocator.len(), allocator.held_pages(0)),
        (0, 4),
        "each block's row held by number, no object"
    );
    index.check().unwrap();
    assert_ne!(
        digest,
        OffloadIndex::new(4, Policy::Lru, vec![1])
            .unwrap()
            .host()
            .rows()
            .digest()
    );
}

#[test]
fn a_backup_gets_its_rows_as_one_run_from_objects_evicted_one_by_one() {
    let mut cache = TierCache::new(TierConfig {
        page_size: 1,
        cp_size: 1,
        device_pages: 8,
        host_pages: 4,
        policy: Policy::Lru,
        host_free_target: 0,
    })
    .unwrap();
    let ns = Namespace::Default;
    let backup = |cache: &mut TierCache, tokens: &[u64]| {
        let pages = cache.allocate(tokens.len() as u64).unwrap();
        let out = cache.insert(tokens, &pages, &ns).unwrap();
        let frontier = cache.issued();
        cache.commit(frontier).unwrap();
        cache.evict_device(8);
        out.backups
            .iter()
            .flat_map(|b| b.host_pages.clone())
            .collect::<Vec<u64>>()
    };
    for (token, row) in (1..=4).zip(0u64..) {
        assert_eq!(backup(&mut cache, &[token * 10]), [row]);
    }
    // One backup of two rows: admission evicts the two oldest objects, one
    // at a time; first fit takes their merged rows in address order.
    assert_eq!(backup(&mut cache, &[50, 51]), [0, 1], "one copy run");
    assert_eq!(
        cache.host().rows().allocator().len(),
        3,
        "one object per backup"
    );
    cache.check_invariants().unwrap();
}
