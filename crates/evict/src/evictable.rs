//! The ordered evictable index: one ordered set per tier, kept up to date
//! node by node, so taking a victim is O(log n) and nothing is ever rebuilt
//! over all leaves.

use std::collections::BTreeSet;

use crate::ids::{NodeId, Tier};

/// The policy part of an eviction key; the index appends the node id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyKey(pub [u64; 2]);

#[derive(Debug, Clone, Default)]
pub struct EvictableIndex {
    device: BTreeSet<(PolicyKey, NodeId)>,
    host: BTreeSet<(PolicyKey, NodeId)>,
}

impl EvictableIndex {
    fn set(&mut self, tier: Tier) -> &mut BTreeSet<(PolicyKey, NodeId)> {
        match tier {
            Tier::Device => &mut self.device,
            Tier::Host => &mut self.host,
        }
    }

    pub fn insert(&mut self, tier: Tier, key: PolicyKey, id: NodeId) {
        let fresh = self.set(tier).insert((key, id));
        debug_assert!(fresh, "node {id} indexed twice");
    }

    pub fn remove(&mut self, tier: Tier, key: PolicyKey, id: NodeId) {
        let set = self.set(tier);
        // A victim is the first entry: popping it walks the left edge down
        // instead of comparing keys on the way.
        let found = if set.first() == Some(&(key, id)) {
            set.pop_first().is_some()
        } else {
            set.remove(&(key, id))
        };
        debug_assert!(found, "node {id} missing from the {tier:?} index");
    }

    /// The next victim of `tier`, without removing it.
    pub fn first(&self, tier: Tier) -> Option<NodeId> {
        let set = match tier {
            Tier::Device => &self.device,
            Tier::Host => &self.host,
        };
        set.first().map(|(_, id)| *id)
    }

    /// The first entry of `tier` at or after `from` in eviction order (the
    /// queue policies pick a victim from one of their queues this way).
    pub fn first_from(&self, tier: Tier, from: PolicyKey) -> Option<(PolicyKey, NodeId)> {
        let set = match tier {
            Tier::Device => &self.device,
            Tier::Host => &self.host,
        };
        set.range((from, NodeId(0))..).next().copied()
    }

    pub fn len(&self, tier: Tier) -> usize {
        match tier {
            Tier::Device => self.device.len(),
            Tier::Host => self.host.len(),
        }
    }

    /// Entries of `tier` in eviction order (for checks and tests).
    pub fn iter(&self, tier: Tier) -> impl Iterator<Item = &(PolicyKey, NodeId)> + '_ {
        match tier {
            Tier::Device => self.device.iter(),
            Tier::Host => self.host.iter(),
        }
    }
}
