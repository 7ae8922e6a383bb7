//! Issue 36's prototype measured: ghost's five candidates as page-level
//! simulators over one shared page table (`page_candidates.rs`, a
//! prototype that lives only here) against the replica shadows; the
//! figures are in docs/ghost.md.
//!
//! ```text
//! cargo build --release -p cpkv-evict --example shared_candidates
//! shared_candidates compare TRACE CAPACITY   # hits per candidate, both designs
//! valgrind --tool=callgrind shared_candidates cost TRACE CAPACITY N   # the shared structure alone
//! ```

mod page_candidates;
#[path = "../common/trace.rs"]
mod trace;

use cpkv_evict::{candidate_hits, Namespace, Policy, PrefixTree};
use page_candidates::{PageCandidates, PairMap};
use trace::requests;

const NAMES: [&str; 5] = ["priority", "recency", "segmented", "arc", "s3fifo"];

/// The replica shadows' switch rule (`shadow.rs`) applied to their hits.
#[derive(Default)]
struct Leader {
    scores: [u64; 5],
    leader: usize,
    since_switch: u64,
}

impl Leader {
    fn watch(&mut self, hits: &[usize; 5]) -> usize {
        for (s, h) in self.scores.iter_mut().zip(hits) {
            *s = *s - (*s >> 10) + ((*h as u64) << 8);
        }
        self.since_switch += 1;
        let best = (0..5)
            .max_by_key(|&i| (self.scores[i], std::cmp::Reverse(i)))
            .expect("candidates");
        let lead = self.scores[self.leader];
        if self.scores[best] > lead + (lead >> 7) && self.since_switch >= 64 {
            (self.leader, self.since_switch) = (best, 0);
        }
        self.leader
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: shared_candidates compare TRACE CAPACITY | cost TRACE CAPACITY N | walk|trie-walk TRACE CAPACITY N";
    let (mode, path, capacity) = match &args[..] {
        [_, mode, path, capacity, ..] => (mode.as_str(), path, capacity),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let capacity: usize = capacity.parse().expect("CAPACITY: an integer");
    let requests = requests(path);
    let namespace = Namespace::Default;
    match mode {
        "cost" => {
            let count: usize = args.get(4).expect(usage).parse().expect("N: an integer");
            let mut shared = PageCandidates::new();
            let mut hits = [0usize; 5];
            for blocks in requests.iter().take(count) {
                shared.mirror(blocks, &namespace, capacity);
                for (h, l) in hits.iter_mut().zip(&shared.last_hits) {
                    *h += l;
                }
            }
            println!(
                "{hits:?} hit pages of {count} requests, {} shared pages",
                shared.pages()
            );
        }
        "walk" => {
            // The floor of a page-level shared structure: one probe per
            // page of one table keyed by (parent, page word), nothing evicted.
            let count: usize = args.get(4).expect(usage).parse().expect("N: an integer");
            let mut table = PairMap::default();
            let mut depth_sum = 0usize;
            for blocks in requests.iter().take(count) {
                let mut at = 0u32;
                for &w in blocks {
                    let next = table.len() as u32 + 1;
                    at = *table.entry((at, w)).or_insert(next);
                }
                depth_sum += blocks.len();
            }
            println!("{depth_sum} pages walked, {} in the table", table.len());
        }
        "trie-walk" => {
            // The floor of a node-level shared structure (a compressed
            // trie, the crate's own tree): match and insert each request,
            // nothing evicted, no order kept beyond the tree's own.
            let count: usize = args.get(4).expect(usage).parse().expect("N: an integer");
            let mut tree = PrefixTree::new(1, Policy::Lru).expect("page size 1");
            let mut next_page = 0u64;
            for blocks in requests.iter().take(count) {
                let m = tree.match_prefix(blocks, &namespace);
                let mut pages = m.device_pages;
                let fresh = (blocks.len() - m.length) as u64;
                pages.extend(next_page..next_page + fresh);
                next_page += fresh;
                tree.insert(blocks, &pages, &namespace)
                    .expect("fresh page ids");
            }
            println!("{} nodes, {} pages", tree.len(), tree.device_pages());
        }
        "compare" => {
            let replica = candidate_hits(&requests, capacity);
            let mut shared = PageCandidates::new();
            let (mut totals, mut same) = ([[0usize; 2]; 5], [0usize; 5]);
            let (mut peak_pages, mut peak_bytes) = (0, 0);
            // Requests led by each candidate: [replica, shared].
            let (mut led, mut replica_leader) = ([[0usize; 2]; 5], Leader::default());
            for (blocks, r) in requests.iter().zip(&replica) {
                shared.mirror(blocks, &namespace, capacity);
                led[replica_leader.watch(r)][0] += 1;
                led[shared.leader() as usize][1] += 1;
                for i in 0..5 {
                    totals[i][0] += r[i];
                    totals[i][1] += shared.last_hits[i];
                    same[i] += usize::from(r[i] == shared.last_hits[i]);
                }
                if let Err(e) = shared.check() {
                    panic!(
                        "after request {}: {e}",
                        led.iter().map(|l| l[0]).sum::<usize>()
                    );
                }
                peak_pages = peak_pages.max(shared.pages());
                peak_bytes = peak_bytes.max(shared.bytes());
            }
            let all: usize = requests.iter().map(Vec::len).sum();
            println!(
                "{} requests, {all} pages, capacity {capacity}",
                requests.len()
            );
            println!("| candidate | hit ratio, replica / shared | requests with equal hits | requests led, replica / shared |");
            println!("|---|---|---|---|");
            for i in 0..5 {
                println!(
                    "| {} | {:.4} / {:.4} | {:.3} | {} / {} |",
                    NAMES[i],
                    totals[i][0] as f64 / all as f64,
                    totals[i][1] as f64 / all as f64,
                    same[i] as f64 / requests.len() as f64,
                    led[i][0],
                    led[i][1]
                );
            }
            println!(
                "shared table: peak {peak_pages} pages, peak {peak_bytes} bytes ({:.1} per cached page)",
                peak_bytes as f64 / capacity as f64
            );
        }
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    }
}
