//! Ghost's sampled candidates against the exact replicas and the classic
//! policies: replays a Mooncake-format trace at each capacity as
//! `cpkv.hitrate.replay` does (match, lock, evict just enough, insert,
//! unlock) under each tree named (`common/tree_spec.rs`), and prints per
//! capacity and tree the hit blocks, the total blocks, how many times a
//! ghost tree switched what it follows (each switch re-keys the tree) and,
//! for ghost trees replayed after `exact`, the share of requests after
//! which they follow the same ranking as the exact replicas. The figures are in
//! docs/ghost.md ("Sampled candidates").
//!
//! ```text
//! cargo build --release -p cpkv-evict --example sampled_grid
//! sampled_grid TRACE CAPACITY,CAPACITY,... lru,arc,exact,ghost,ghost:6:2048,...
//! ```

#[path = "common/replay.rs"]
mod replay;
#[path = "common/trace.rs"]
mod trace;
#[path = "common/tree_spec.rs"]
mod tree_spec;

use cpkv_evict::PrefixTree;
use trace::requests;

/// (hit blocks, total blocks, what the tree follows after each request).
fn replay(
    tree: &mut PrefixTree,
    requests: &[Vec<u64>],
    capacity: usize,
) -> (usize, usize, Vec<&'static str>) {
    let (mut hits, mut total, mut next_page) = (0usize, 0usize, 0u64);
    let mut following = Vec::with_capacity(requests.len());
    for blocks in requests {
        hits += replay::step(tree, blocks, capacity, &mut next_page);
        total += blocks.len();
        following.push(tree.following().unwrap_or("-"));
    }
    (hits, total, following)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, path, capacities, specs] = &args[..] else {
        eprintln!("usage: sampled_grid TRACE CAPACITY,... TREE,...");
        std::process::exit(2);
    };
    let requests = requests(path);
    for capacity in capacities.split(',') {
        let capacity: usize = capacity.parse().expect("CAPACITY: an integer");
        let mut exact: Option<Vec<&'static str>> = None;
        for spec in specs.split(',') {
            let mut tree = tree_spec::tree(spec);
            let (hits, total, following) = replay(&mut tree, &requests, capacity);
            let agree = match (&exact, tree.following()) {
                (Some(e), Some(_)) => {
                    let same = e.iter().zip(&following).filter(|(a, b)| a == b).count();
                    format!("{:.4}", same as f64 / following.len().max(1) as f64)
                }
                _ => "-".to_string(),
            };
            let switches = following.windows(2).filter(|w| w[0] != w[1]).count();
            println!("{capacity} {spec} {hits} {total} {agree} {switches}");
            if spec == "exact" {
                exact = Some(following);
            }
        }
    }
}
