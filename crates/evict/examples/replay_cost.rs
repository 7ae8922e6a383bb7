//! Replays the first N requests of a Mooncake-format trace through one
//! `PrefixTree` as `cpkv.hitrate.replay` does (match, lock, evict just
//! enough, insert, unlock), and prints the hit blocks. Made for callgrind:
//! two runs with different N give one request's instructions by difference,
//! free of start-up and of any interpreter.
//!
//! ```text
//! cargo build --release -p cpkv-evict --example replay_cost
//! valgrind --tool=callgrind target/release/examples/replay_cost TRACE CAPACITY POLICY N
//! ```

#[path = "common/trace.rs"]
mod trace;

use cpkv_evict::{Namespace, Policy, PrefixTree};
use trace::requests;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, path, capacity, policy, count] = &args[..] else {
        eprintln!("usage: replay_cost TRACE CAPACITY POLICY N");
        std::process::exit(2);
    };
    let capacity: usize = capacity.parse().expect("CAPACITY: an integer");
    let policy: Policy = policy.parse().expect("POLICY: a policy name");
    let count: usize = count.parse().expect("N: an integer");
    let requests = requests(path);
    let mut tree = PrefixTree::new(1, policy).expect("page size 1");
    let namespace = Namespace::Default;
    let (mut hits, mut next_page) = (0usize, 0u64);
    for blocks in requests.iter().take(count) {
        let m = tree.match_prefix(blocks, &namespace);
        hits += m.length;
        tree.lock(m.node).expect("a match result is live");
        let new = blocks.len() - m.length;
        let room = capacity.saturating_sub(tree.device_pages());
        if new > room {
            tree.evict(new - room);
        }
        let keep = m.length + new.min(capacity.saturating_sub(tree.device_pages()));
        let mut pages = m.device_pages;
        let fresh = (keep - m.length) as u64;
        pages.extend(next_page..next_page + fresh);
        next_page += fresh;
        tree.insert(&blocks[..keep], &pages, &namespace)
            .expect("fresh page ids");
        tree.unlock(m.node).expect("locked above");
    }
    println!("{hits} hit blocks of {count} requests");
}
