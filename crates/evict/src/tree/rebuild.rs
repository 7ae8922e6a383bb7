//! The tree's side of a snapshot: the state `snapshot` encodes, and a tree
//! rebuilt from decoded state.

use std::collections::BTreeMap;

use crate::arena::NodeArena;
use crate::child_key::child_word;
use crate::clock::{LogicalClock, Stamp};
use crate::digest::{namespace_hash, tokens_hash};
use crate::ghost_history::GhostHistory;
use crate::ids::NodeId;
use crate::namespace::Namespace;
use crate::node::Node;
use crate::policy::Policy;
use crate::queues::QueueState;
use crate::ranking::Ranking;

use super::following::{queue_owner, RankingChooser};
use super::PrefixTree;

/// Everything a snapshot decoded (`snapshot.rs`), for the tree to rebuild
/// itself from.
pub(crate) struct Decoded {
    pub page_size: usize,
    pub policy: Policy,
    pub clock: u64,
    pub floor: u64,
    /// Each slot's generation and, when live, its node.
    pub slots: Vec<(u32, Option<Node>)>,
    pub free: Vec<u32>,
    pub roots: BTreeMap<Namespace, NodeId>,
    pub idle_roots: BTreeMap<NodeId, u64>,
    pub ghost: GhostHistory,
    /// The queue policies' books (page counts left to the rebuild).
    pub queues: QueueState,
    /// `Policy::Ghost`: the layer it follows (its shadows).
    pub chooser: Option<Box<dyn RankingChooser>>,
}

impl PrefixTree {
    pub(crate) fn floor(&self) -> Stamp {
        self.floor
    }
    pub(crate) fn arena_parts(&self) -> (Vec<(u32, Option<&Node>)>, &[u32]) {
        self.nodes.parts()
    }
    pub(crate) fn roots_map(&self) -> &BTreeMap<Namespace, NodeId> {
        &self.roots
    }
    pub(crate) fn idle_roots_map(&self) -> &BTreeMap<NodeId, Stamp> {
        &self.idle_roots
    }
    pub(crate) fn ghost_history(&self) -> &GhostHistory {
        &self.ghost
    }
    pub(crate) fn queue_state(&self) -> &QueueState {
        &self.queues
    }
    pub(crate) fn chooser(&self) -> Option<&dyn RankingChooser> {
        self.chooser.as_deref()
    }

    /// A tree from decoded snapshot state: every derived structure rebuilt,
    /// every invariant checked; an inconsistency is an error, not a panic.
    pub(crate) fn rebuild(d: Decoded) -> Result<Self, String> {
        let ps = d.page_size;
        let mut tree = Self::without_chooser(ps, d.policy).map_err(|e| e.to_string())?;
        for (slot, (_, node)) in d.slots.iter().enumerate() {
            let Some(n) = node else { continue };
            if !d.queues.accepts(n.priority) {
                return Err(format!("node in slot {slot} has a bad queue state"));
            }
            let shape_ok = match n.parent {
                None => n.tokens.is_empty() && n.device.is_none() && n.host.is_none(),
                Some(_) => !n.tokens.is_empty() && n.tokens.len() % ps == 0,
            };
            let pages_ok = n
                .device
                .as_ref()
                .is_none_or(|d| d.len() == n.tokens.len() / ps);
            if !shape_ok || !pages_ok {
                return Err(format!("node in slot {slot} has a malformed shape"));
            }
        }
        // The policy's own state first: the index keys below depend on it.
        if !d
            .queues
            .belongs_to(queue_owner(d.policy, d.chooser.as_deref()))
            || (d.policy == Policy::Ghost) != d.chooser.is_some()
        {
            return Err(format!(
                "policy state does not match policy {}",
                d.policy.name()
            ));
        }
        tree.queues = d.queues;
        tree.leader = d.chooser.as_ref().map_or(Ranking::Priority, |s| s.leader());
        tree.chooser = d.chooser;
        tree.nodes = NodeArena::from_parts(d.slots, d.free)?;
        let ids: Vec<NodeId> = tree.nodes().map(|n| n.id).collect();
        for &id in &ids {
            let n = tree.nodes.live_mut(id);
            n.tokens_hash = tokens_hash(&n.tokens);
            if tree.queues.is_on() {
                n.queue_slot = std::mem::take(&mut n.priority); // one word in snapshots
            }
            let Some(parent) = n.parent else { continue };
            n.child_word = child_word(&n.tokens[..ps]);
            let (word, on_device) = (n.child_word, n.device.is_some());
            if tree.nodes.get(parent).is_none() {
                return Err(format!("node {id}: parent {parent} is not live"));
            }
            if tree
                .child(parent, &tree.node_ref(id).tokens[..ps])
                .is_some()
            {
                return Err(format!("node {parent}: two children share a first page"));
            }
            let (p, is_live) = tree.nodes.live_mut_and_liveness(parent);
            p.children.insert(word, id, is_live);
            p.device_children += usize::from(on_device);
        }
        for (namespace, &id) in &d.roots {
            let root = tree
                .nodes
                .get_mut(id)
                .filter(|n| n.is_root())
                .ok_or(format!("namespace {namespace}: {id} is not a live root"))?;
            root.tokens_hash = namespace_hash(namespace);
            tree.root_names.insert(id, namespace.clone());
        }
        if tree.nodes().filter(|n| n.is_root()).count() != d.roots.len() {
            return Err("a root has no namespace".into());
        }
        tree.roots = d.roots;
        for &id in &ids {
            let n = tree.nodes.live_mut(id);
            let (device, host, pages) = (n.device.clone(), n.host, n.tokens.len() / ps);
            for page in device.into_iter().flatten() {
                if !tree.live_pages.insert(page) {
                    return Err(format!("device page {page} held twice"));
                }
            }
            if let Some(key) = host {
                *tree.host_refs.entry(key).or_default() += 1;
                tree.host_pages += pages;
            }
            tree.index_node(id);
        }
        for (&id, &since) in &d.idle_roots {
            if !tree.root_names.contains_key(&id) {
                return Err(format!("idle root {id} is not a root"));
            }
            tree.set_idle(id, Some(since));
        }
        tree.clock = LogicalClock::at(d.clock);
        tree.floor = d.floor;
        tree.ghost = d.ghost;
        tree.check_invariants()?;
        Ok(tree)
    }
}
