//! The trees the examples replay, named on the command line: a policy name
//! (`lru`, ..., `ghost` as it ships), `exact` (ghost with full-size replica
//! candidates fed every request) or `ghost:SHIFT:FLOOR` (ghost whose
//! candidates sample at a rate of 1/2^SHIFT with a floor of FLOOR pages).

use cpkv_evict::{Policy, PrefixTree, Sampling};

pub fn tree(spec: &str) -> PrefixTree {
    if spec == "exact" {
        return PrefixTree::ghost_sampled(1, Sampling::EXACT).expect("page size 1");
    }
    if let Some(rest) = spec.strip_prefix("ghost:") {
        let (shift, floor) = rest.split_once(':').expect("ghost:SHIFT:FLOOR");
        let sampling = Sampling::new(
            shift.parse().expect("SHIFT: an integer"),
            floor.parse().expect("FLOOR: an integer"),
        )
        .expect("a valid sampling");
        return PrefixTree::ghost_sampled(1, sampling).expect("page size 1");
    }
    let policy: Policy = spec
        .parse()
        .expect("a policy name, exact or ghost:SHIFT:FLOOR");
    PrefixTree::new(1, policy).expect("page size 1")
}
