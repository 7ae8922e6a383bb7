//! The cache's side of spills (see `spill.rs`): turning them on, noting
//! each backup's content keys, queueing what host eviction releases, and
//! handing the queue to the caller. The bookkeeping itself is `SpillState`.

use cpkv_evict::{Namespace, Token};

use crate::cache::TierCache;
use crate::plan::Backup;
use crate::spill::{page_keys, SpillState, Spilled};

impl TierCache {
    /// Turns spills on (before the first insert): from now on host eviction
    /// queues the released objects' pages for `take_spills`.
    pub fn enable_spills(&mut self) {
        if self.spill_state().is_none() {
            *self.spill_state_mut() = Some(SpillState::default());
        }
    }

    pub fn spills_enabled(&self) -> bool {
        self.spill_state().is_some()
    }

    /// The pages host eviction released since the last call, oldest first.
    pub fn take_spills(&mut self) -> Vec<Spilled> {
        self.spill_state_mut()
            .as_mut()
            .map(SpillState::take)
            .unwrap_or_default()
    }

    /// The content keys of `tokens`' whole pages under `namespace` (what
    /// the spilled pages of that path are keyed by).
    pub fn page_keys(&self, tokens: &[Token], namespace: &Namespace) -> Vec<u64> {
        page_keys(tokens, self.config().page_size, namespace)
    }

    /// After `insert(tokens, .., namespace)` reserved `backups`: remembers
    /// each backup object's page keys (its rows hold the path's pages from
    /// the node's depth on).
    pub(crate) fn note_backup_keys(
        &mut self,
        tokens: &[Token],
        namespace: &Namespace,
        backups: &[Backup],
    ) {
        if self.spill_state().is_none() || backups.is_empty() {
            return;
        }
        let keys = self.page_keys(tokens, namespace);
        let placed: Vec<(u64, Vec<u64>)> = backups
            .iter()
            .map(|b| {
                let (object, depth) = self.pending_object(b.ticket);
                let depth = depth as usize;
                (object, keys[depth..depth + b.host_pages.len()].to_vec())
            })
            .collect();
        let state = self.spill_state_mut().as_mut().expect("checked");
        state.note(placed);
    }

    /// Host eviction is about to release `object` (committed, its rows
    /// hold its pages): queue them.
    pub(crate) fn spill_object(&mut self, object: u64, rows: &[u32]) {
        if let Some(state) = self.spill_state_mut().as_mut() {
            state.release(object, rows);
        }
    }

    /// `object` leaves without a spill (aborted, or already spilled).
    pub(crate) fn forget_object_keys(&mut self, object: u64) {
        if let Some(state) = self.spill_state_mut().as_mut() {
            state.forget(object);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TierConfig;
    use cpkv_evict::Policy;

    fn cache(host_pages: u64) -> TierCache {
        TierCache::new(TierConfig {
            page_size: 2,
            cp_size: 1,
            device_pages: 8,
            host_pages,
            policy: Policy::Lru,
            host_free_target: 0,
        })
        .unwrap()
    }

    #[test]
    fn host_eviction_queues_the_released_pages_with_their_keys_and_rows() {
        let mut plain = cache(4);
        let mut spilling = cache(4);
        spilling.enable_spills();
        let ns = Namespace::Default;
        let mut rows_a = Vec::new();
        for c in [&mut plain, &mut spilling] {
            // Path A: 2 pages, backed up and committed, then moved off device.
            let pages = c.allocate(2).unwrap();
            c.insert(&[1, 2, 3, 4], &pages, &ns).unwrap();
            c.commit(c.issued()).unwrap();
            c.evict_device(8);
            let node = c.lookup(&[1, 2, 3, 4], &ns).node;
            rows_a = c.host_rows(node).unwrap();
            c.unlock(node).unwrap();
        }
        assert!(spilling.take_spills().is_empty(), "nothing released yet");
        for c in [&mut plain, &mut spilling] {
            // Path B needs the whole slab: A leaves it.
            let pages = c.allocate(4).unwrap();
            c.insert(&[7, 7, 8, 8, 9, 9, 6, 6], &pages, &ns).unwrap();
        }
        let spilled = spilling.take_spills();
        assert_eq!(spilled.len(), 1);
        assert_eq!(spilled[0].keys, page_keys(&[1, 2, 3, 4], 2, &ns));
        let rows: Vec<u64> = spilled[0].rows.iter().map(|&r| u64::from(r)).collect();
        assert_eq!(rows, rows_a);
        assert!(spilling.take_spills().is_empty(), "taken once");
        spilling.check_invariants().unwrap();
        assert_eq!(spilling.stats().host_evicted_pages, 2);
        assert_eq!(
            plain.digest(),
            spilling.digest(),
            "spills change no decision"
        );
        assert!(plain.take_spills().is_empty(), "off unless enabled");
    }

    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[derive(Debug, Clone)]
    enum Op {
        /// Look up, allocate and insert a path of `len` pages from branch `branch`.
        Insert {
            branch: u64,
            len: usize,
        },
        Commit,
        EvictDevice(u64),
        EvictHost(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u64..6, 1usize..5).prop_map(|(branch, len)| Op::Insert { branch, len }),
            2 => Just(Op::Commit),
            1 => (1u64..8).prop_map(Op::EvictDevice),
            1 => (1u64..8).prop_map(Op::EvictHost),
        ]
    }

    proptest! {
        /// Against a reference (a cache without spills, and the keys of every path inserted):
        /// after every op the digests are equal, every spilled key is the key of an inserted
        /// page, a spill never names a row twice and never a row still held, and nothing is
        /// spilled twice while it is out of the slab.
        #[test]
        fn spills_follow_host_eviction_and_change_no_decision(ops in prop::collection::vec(op(), 1..80)) {
            let mut plain = cache(6);
            let mut spilling = cache(6);
            spilling.enable_spills();
            let ns = Namespace::Default;
            let mut inserted: BTreeSet<u64> = BTreeSet::new();
            for op in ops {
                for c in [&mut plain, &mut spilling] {
                    match op {
                        Op::Insert { branch, len } => {
                            // Paths share their first page by branch parity: prefixes overlap.
                            let tokens: Vec<u64> = (0..len as u64 * 2)
                                .map(|i| if i < 2 { branch % 2 } else { branch * 100 + i })
                                .collect();
                            let hit = c.lookup(&tokens, &ns);
                            if hit.locked {
                                c.unlock(hit.node).unwrap();
                            }
                            if let Some(pages) = c.allocate(len as u64) {
                                // Pages the tree does not adopt go back inside insert.
                                c.insert(&tokens, &pages, &ns).unwrap();
                            }
                            inserted.extend(page_keys(&tokens, 2, &ns));
                        }
                        Op::Commit => {
                            c.commit(c.issued()).unwrap();
                        }
                        Op::EvictDevice(n) => {
                            c.evict_device(n);
                        }
                        Op::EvictHost(n) => {
                            c.evict_host(n);
                        }
                    }
                }
                prop_assert_eq!(plain.digest(), spilling.digest());
                spilling.check_invariants().map_err(TestCaseError::fail)?;
                let mut rows = BTreeSet::new();
                for s in spilling.take_spills() {
                    prop_assert_eq!(s.keys.len(), s.rows.len());
                    for k in &s.keys {
                        prop_assert!(inserted.contains(k), "spilled key {k:#x} was never inserted");
                    }
                    for &r in &s.rows {
                        prop_assert!(rows.insert(r), "row {r} spilled twice in one step");
                    }
                }
                // A spilled row holds no committed host copy any more (a backup reserved in the
                // same step may have taken it: its copy starts after the next commit point).
                let held: Vec<_> = spilling.tree().nodes().filter(|n| n.on_host()).map(|n| n.id()).collect();
                for node in held {
                    for r in spilling.host_rows(node).unwrap() {
                        prop_assert!(!rows.contains(&(r as u32)), "spilled row {r} is still a host copy");
                    }
                }
                prop_assert!(plain.take_spills().is_empty());
            }
        }
    }
}
