//! Replays the first N requests of a Mooncake-format trace through ghost's
//! recency candidate alone, as the shadows replay it: the lean miniature
//! (`lean`) or the replica tree (`replica`), and prints the hit blocks.
//! Made for callgrind, like `replay_cost` (two N, by difference).
//!
//! ```text
//! cargo build --release -p cpkv-evict --features floor-measurements --example lean_candidate
//! valgrind --tool=callgrind target/release/examples/lean_candidate TRACE CAPACITY lean|replica N
//! ```

#[path = "common/trace.rs"]
mod trace;

use cpkv_evict::recency_candidate_hits;
use trace::requests;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, path, capacity, kind, count] = &args[..] else {
        eprintln!("usage: lean_candidate TRACE CAPACITY lean|replica N");
        std::process::exit(2);
    };
    let capacity: usize = capacity.parse().expect("CAPACITY: an integer");
    let count: usize = count.parse().expect("N: an integer");
    let lean = match kind.as_str() {
        "lean" => true,
        "replica" => false,
        _ => {
            eprintln!("lean_candidate: the candidate must be lean or replica, got {kind}");
            std::process::exit(2);
        }
    };
    let requests: Vec<Vec<u64>> = requests(path).into_iter().take(count).collect();
    let hits: usize = recency_candidate_hits(&requests, capacity, lean)
        .iter()
        .sum();
    println!("{hits} hit blocks of {count} requests");
}
