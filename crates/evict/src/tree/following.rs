//! How a `Policy::Ghost` tree follows its shadows: the ranking it uses is
//! the shadow leader's, and when the leader changes the tree re-keys its
//! nodes or builds the new leader's queue state from them.

use crate::ids::{NodeId, Token};
use crate::namespace::Namespace;
use crate::policy::Policy;
use crate::queues::{QueueState, Slot};
use crate::shadow::{Ranking, Shadows};
use crate::transplant::queue_order;
use crate::Stamp;

use super::PrefixTree;

impl PrefixTree {
    /// The ranking `Policy::Ghost` uses now: the shadow leader's.
    pub(super) fn ranking(&self) -> Ranking {
        match (self.fixed_ranking, &self.shadows) {
            (Some(r), _) => r,
            (None, Some(s)) => s.leader(),
            (None, None) => Ranking::Ghost,
        }
    }

    /// Shows an insert to the shadows; follows their leader when it changed.
    pub(super) fn mirror_in_shadows(&mut self, tokens: &[Token], namespace: &Namespace) {
        if let Some(shadows) = self.shadows.as_mut() {
            let before = shadows.leader();
            if shadows.mirror(tokens, namespace, self.live_pages.len()) {
                let (capacity, arc_target) = (shadows.capacity(), shadows.arc_target());
                self.follow(before, capacity, arc_target);
            }
        }
    }

    /// Moves the tree from ranking `before` to the shadows' new leader. A
    /// queue policy's state is built when it takes over and dropped again
    /// when a ranking leads. S3-FIFO queues each node as its shadow holds the
    /// same content, what the shadow let go first (`transplant`). ARC queues
    /// reused content in T2 and one-shot content in T1, each least recently
    /// used first, with its shadow's target `arc_target`: queued after its
    /// shadow too, docqa lost up to 0.03 of hit ratio at 1,255 blocks (not
    /// established why; likely the target, which ARC steers by ghost lists
    /// that cannot come along, the shadow's naming the shadow's nodes).
    /// The ghost priority is recomputed as of each node's last access.
    fn follow(&mut self, before: Ranking, capacity: usize, arc_target: u64) {
        let after = self.ranking();
        if before.queue_policy().is_none() && after.queue_policy().is_none() {
            return self.rekey();
        }
        // Off first: the old priorities leave no books behind.
        self.queues = QueueState::Off;
        if let Some(policy) = after.queue_policy() {
            let mut state = QueueState::new(policy);
            if policy == Policy::S3fifo {
                let shadows = self.shadows.as_ref().expect("a following tree has shadows");
                for (id, held) in queue_order(self, shadows.leader_tree()) {
                    let slot = state.adopted_as(held);
                    self.update(id, |n| (n.queue_slot, n.priority) = (slot, 0));
                }
            } else {
                for id in self.by_last_access() {
                    let slot = state.adopted(self.node_ref(id).hits);
                    self.update(id, |n| (n.queue_slot, n.priority) = (slot, 0));
                }
            }
            let pages = self.pages_per_queue();
            state.adopt_books(pages, capacity as u64, arc_target, self.ghost.remembered());
            self.queues = state;
        } else {
            let (floor, weights) = (self.floor, self.weights());
            for id in self.by_last_access() {
                self.update(id, |n| {
                    n.priority = Policy::Ghost.priority(n, n.last_access, floor, weights);
                    n.queue_slot = 0;
                });
            }
        }
    }

    /// Every node, least recently accessed first (ties by id).
    fn by_last_access(&self) -> Vec<NodeId> {
        let mut ids: Vec<(Stamp, NodeId)> = self.nodes().map(|n| (n.last_access, n.id)).collect();
        ids.sort_unstable();
        ids.into_iter().map(|(_, id)| id).collect()
    }

    /// Device pages per queue, counted from the nodes' queue states (only
    /// while a queue policy keeps state: otherwise priorities are no slots).
    pub(super) fn pages_per_queue(&self) -> [u64; 2] {
        let mut pages = [0u64; 2];
        for node in self.nodes().filter(|n| n.on_device()) {
            let queue = Slot::unpack(node.queue_slot).queue as usize;
            pages[queue] += node.pages(self.page_size) as u64;
        }
        pages
    }

    /// Re-keys every indexed node (the ranking changed).
    fn rekey(&mut self) {
        let ids: Vec<NodeId> = self
            .nodes()
            .filter(|n| n.indexed.is_some())
            .map(|n| n.id)
            .collect();
        for id in ids {
            self.update(id, |_| {});
        }
    }

    /// Turns a fresh tree into a shadow ranking by `ranking` (no shadows of its own).
    pub(crate) fn make_shadow(&mut self, ranking: Ranking) {
        self.fixed_ranking = Some(ranking);
    }
}

/// The policy whose queue state a tree keeps: its own, or for a ghost tree
/// the queue policy its shadows' leader is (`Policy::Ghost`, none, while a
/// ranking leads).
pub(super) fn queue_owner(policy: Policy, shadows: Option<&Shadows>) -> Policy {
    shadows
        .and_then(|s| s.leader().queue_policy())
        .unwrap_or(policy)
}
