//! One request through a tree as `cpkv.hitrate.replay` replays it: match,
//! lock, evict just enough, insert what fits, unlock.

use cpkv_evict::{Namespace, PrefixTree};

/// Replays one request's `blocks` under a device capacity of `capacity`
/// pages; fresh pages are numbered from `next_page`, which moves past them.
/// Returns the request's hit blocks.
pub fn step(tree: &mut PrefixTree, blocks: &[u64], capacity: usize, next_page: &mut u64) -> usize {
    let namespace = Namespace::Default;
    let m = tree.match_prefix(blocks, &namespace);
    let hits = m.length;
    tree.lock(m.node).expect("a match result is live");
    let new = blocks.len() - hits;
    let room = capacity.saturating_sub(tree.device_pages());
    if new > room {
        tree.evict(new - room);
    }
    let keep = hits + new.min(capacity.saturating_sub(tree.device_pages()));
    let mut pages = m.device_pages;
    let fresh = (keep - hits) as u64;
    pages.extend(*next_page..*next_page + fresh);
    *next_page += fresh;
    tree.insert(&blocks[..keep], &pages, &namespace)
        .expect("fresh page ids");
    tree.unlock(m.node).expect("locked above");
    hits
}
