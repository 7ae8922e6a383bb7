//! Deferred digest terms, for the shadow trees.
//!
//! A shadow replays each insert as five calls (match, lock, evict, insert,
//! unlock) that update the same path nodes again and again, and a node's
//! term hashes all its device pages: re-hashing them at every update was a
//! seventh of ghost's time. A tree that defers its terms only marks a changed
//! node stale (its old term already left the sum) and hashes it once when
//! the caller settles them, before anything reads the digest. The sum after
//! settling is what eager updates give, so digests do not change.

use crate::digest::node_hash;
use crate::ids::NodeId;
use crate::node::Node;

use super::PrefixTree;

impl PrefixTree {
    /// From now on, node terms wait for `settle_terms`.
    #[cfg(any(test, feature = "floor-measurements"))]
    pub(crate) fn defer_terms(&mut self) {
        self.stale_terms.get_or_insert_with(Vec::new);
    }

    /// Keeps only the count of the device pages held, not the set (a
    /// shadow, which hands out fresh page ids itself: `LivePages`), and
    /// hashes each node's pages as the run they are (`digest::node_hash`);
    /// the terms of nodes already in the tree (a restored shadow) are
    /// hashed again that way.
    #[cfg(any(test, feature = "floor-measurements"))]
    pub(crate) fn count_pages_only(&mut self) {
        self.live_pages.count_only();
        if self.run_terms {
            return;
        }
        self.run_terms = true;
        let ids: Vec<NodeId> = self.nodes.iter().map(|n| n.id).collect();
        let mut sum = 0u64;
        for id in ids {
            let node = self.nodes.live_mut(id);
            if !node.term_stale {
                node.digest_term = node_hash(node, node.tokens_hash, true);
                sum = sum.wrapping_add(node.digest_term);
            }
        }
        self.digest_sum = sum;
    }

    /// `node`'s digest term as this tree hashes it.
    pub(crate) fn term_of(&self, node: &Node) -> u64 {
        node_hash(node, node.tokens_hash, self.run_terms)
    }

    /// Hashes the nodes changed since the last call into the digest (nothing
    /// for a tree that does not defer its terms).
    #[cfg(any(test, feature = "floor-measurements"))]
    pub(crate) fn settle_terms(&mut self) {
        let Some(mut stale) = self.stale_terms.take() else {
            return;
        };
        for id in stale.drain(..) {
            // Removed nodes left the sum when they were detached.
            if let Some(node) = self.nodes.get_mut(id) {
                node.term_stale = false;
                node.digest_term = node_hash(node, node.tokens_hash, self.run_terms);
                self.digest_sum = self.digest_sum.wrapping_add(node.digest_term);
            }
        }
        self.stale_terms = Some(stale);
    }

    /// Puts a detached (or new) node's term back into the sum, now or, in a
    /// tree that defers, when its terms are settled.
    pub(super) fn renew_term(&mut self, id: NodeId) {
        let node = self.nodes.live_mut(id);
        match self.stale_terms.as_mut() {
            None => {
                node.digest_term = node_hash(node, node.tokens_hash, self.run_terms);
                self.digest_sum = self.digest_sum.wrapping_add(node.digest_term);
            }
            Some(stale) if !node.term_stale => {
                node.term_stale = true;
                stale.push(id);
            }
            Some(_) => {}
        }
    }
}
