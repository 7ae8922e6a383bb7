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
//!
//! POLICY is a policy name, `exact` or `ghost:SHIFT:FLOOR` (`common/tree_spec.rs`).

#[path = "common/replay.rs"]
mod replay;
#[path = "common/trace.rs"]
mod trace;
#[path = "common/tree_spec.rs"]
mod tree_spec;

use trace::requests;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, path, capacity, policy, count] = &args[..] else {
        eprintln!("usage: replay_cost TRACE CAPACITY POLICY N");
        std::process::exit(2);
    };
    let capacity: usize = capacity.parse().expect("CAPACITY: an integer");
    let count: usize = count.parse().expect("N: an integer");
    let requests = requests(path);
    let mut tree = tree_spec::tree(policy);
    let (mut hits, mut next_page) = (0usize, 0u64);
    for blocks in requests.iter().take(count) {
        hits += replay::step(&mut tree, blocks, capacity, &mut next_page);
    }
    println!("{hits} hit blocks of {count} requests");
}
