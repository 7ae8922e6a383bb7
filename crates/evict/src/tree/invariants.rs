//! The tree's structural invariants, checked against a from-scratch
//! recomputation of everything the tree maintains incrementally.

use std::collections::{BTreeMap, BTreeSet};

use crate::child_key::{child_word, DEPARTED_KEPT};
use crate::digest::tokens_hash;
use crate::evictable::PolicyKey;
use crate::ids::{HostKey, NodeId, Tier};
use crate::namespace::Namespace;
use crate::page_set::PageSet;

use super::following::queue_owner;
use super::{evictable_tier, idle_term, PrefixTree, IDLE_ROOTS_KEPT};

impl PrefixTree {
    /// Checks every structural invariant and that the incremental index and
    /// digest equal their from-scratch recomputation. For tests; O(n).
    pub fn check_invariants(&self) -> Result<(), String> {
        let ps = self.page_size;
        let mut expected: BTreeMap<Tier, Vec<(PolicyKey, NodeId)>> = BTreeMap::new();
        let mut pages_seen = PageSet::default();
        let mut host_refs: BTreeMap<HostKey, usize> = BTreeMap::new();
        let mut host_pages = 0;
        for node in self.nodes() {
            let id = node.id;
            if let Some(tier) = evictable_tier(node) {
                expected
                    .entry(tier)
                    .or_default()
                    .push((self.key_of(node), id));
            }
            if node.tokens_hash != tokens_hash(&node.tokens) && !node.is_root() {
                return Err(format!("node {id}: stale tokens hash"));
            }
            let device_children = self
                .children(id)
                .filter(|c| self.node_ref(*c).on_device())
                .count();
            if device_children != node.device_children {
                return Err(format!(
                    "node {id}: device_children {} != {device_children}",
                    node.device_children
                ));
            }
            let (mut live, mut departed) = (0, 0);
            for (word, child) in node.children.entries() {
                let Some(c) = self.node(child) else {
                    departed += 1;
                    continue;
                };
                live += 1;
                let first_page = &c.tokens[..ps];
                if c.parent != Some(id)
                    || word != c.child_word
                    || word != child_word(first_page)
                    || self.child(id, first_page) != Some(child)
                {
                    return Err(format!("node {id}: child {child} miskeyed"));
                }
                if c.depth != node.depth + node.pages(ps) {
                    return Err(format!("node {child}: wrong depth"));
                }
            }
            if departed != node.children.departed() || departed > live.max(DEPARTED_KEPT) {
                return Err(format!(
                    "node {id}: {departed} departed children's entries, counted {}, beside {live} children",
                    node.children.departed()
                ));
            }
            if let Some(h) = node.host {
                *host_refs.entry(h).or_default() += 1;
                host_pages += node.pages(ps);
            }
            let locks_below: u64 = self.children(id).map(|c| self.node_ref(c).locks).sum();
            if node.locks != node.pins + locks_below {
                return Err(format!(
                    "node {id}: {} locks != {} own + {locks_below} below",
                    node.locks, node.pins
                ));
            }
            if node.is_root() {
                continue;
            }
            if node.tokens.is_empty() || node.tokens.len() % ps != 0 {
                return Err(format!("node {id}: {} tokens", node.tokens.len()));
            }
            if !node.on_device() && !node.on_host() {
                return Err(format!("node {id}: in no tier"));
            }
            let parent = self.node_ref(node.parent.expect("non-root"));
            if node.on_device() && !parent.is_root() && !parent.on_device() {
                return Err(format!("node {id}: on device below a parent that is not"));
            }
            if node.on_host() && !parent.is_root() && !parent.on_host() {
                return Err(format!("node {id}: on host below a parent that is not"));
            }
            if let Some(pages) = &node.device {
                if pages.len() != node.pages(ps) {
                    return Err(format!(
                        "node {id}: {} pages for {} tokens",
                        pages.len(),
                        node.tokens.len()
                    ));
                }
                for p in pages {
                    if !pages_seen.insert(*p) {
                        return Err(format!("page {p} held twice"));
                    }
                }
            }
        }
        let locked: usize = self
            .nodes()
            .filter(|n| n.locks > 0)
            .map(|n| n.device.as_ref().map_or(0, Vec::len))
            .sum();
        if locked != self.locked_device_pages {
            return Err(format!(
                "{} locked device pages counted, {locked} recounted",
                self.locked_device_pages
            ));
        }
        if self.live_pages != pages_seen {
            return Err("live page set out of sync".into());
        }
        if host_refs != self.host_refs || host_pages != self.host_pages {
            return Err("host bookkeeping out of sync".into());
        }
        for tier in [Tier::Device, Tier::Host] {
            let mut want = expected.remove(&tier).unwrap_or_default();
            want.sort();
            let have: Vec<_> = self.index.iter(tier).copied().collect();
            if want != have {
                return Err(format!("{tier:?} index differs from recomputation"));
            }
        }
        // Digests and snapshots carry one word per node for both fields.
        let queued = self.queues.is_on();
        if let Some(n) = self.nodes().find(|n| {
            if queued {
                n.priority != 0
            } else {
                n.queue_slot != 0
            }
        }) {
            return Err(format!("node {} has a priority and a queue slot", n.id));
        }
        if queued {
            self.queues.check(self.pages_per_queue())?;
        }
        let owner = queue_owner(self.policy, self.chooser.as_deref());
        if !self.queues.belongs_to(owner) {
            return Err(format!("queue state is not {}'s", owner.name()));
        }
        if let Some(chooser) = &self.chooser {
            chooser.check()?;
            if chooser.leader() != self.leader {
                return Err("the tree follows another ranking than its chooser's leader".into());
            }
        }
        if self.ghost.digest() != self.ghost.digest_from_scratch() {
            return Err("ghost history digest differs from recomputation".into());
        }
        if self.digest() != self.digest_from_scratch() {
            return Err("incremental digest differs from recomputation".into());
        }
        self.nodes.check()?;
        let idle: BTreeSet<NodeId> = self
            .nodes()
            .filter(|n| n.is_root() && n.children.is_empty() && n.locks == 0)
            .map(|n| n.id)
            .collect();
        if idle.iter().ne(self.idle_roots.keys()) || self.idle_order.len() != idle.len() {
            return Err("idle roots out of sync".into());
        }
        let idle_sum = self
            .idle_roots
            .iter()
            .map(|(id, since)| idle_term(*id, *since))
            .fold(0u64, u64::wrapping_add);
        if idle_sum != self.idle_digest || self.idle_roots.len() > IDLE_ROOTS_KEPT + 1 {
            return Err("idle roots digest or bound wrong".into());
        }
        let named: Vec<(NodeId, &Namespace)> =
            self.roots.iter().map(|(ns, id)| (*id, ns)).collect();
        if named.len() != self.root_names.len()
            || named
                .iter()
                .any(|(id, ns)| self.root_names.get(id) != Some(*ns))
        {
            return Err("root names out of sync".into());
        }
        Ok(())
    }
}
