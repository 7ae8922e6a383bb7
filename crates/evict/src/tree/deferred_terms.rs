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

use super::PrefixTree;

impl PrefixTree {
    /// From now on, node terms wait for `settle_terms`.
    pub(crate) fn defer_terms(&mut self) {
        self.stale_terms.get_or_insert_with(Vec::new);
    }

    /// Keeps only the count of the device pages held, not the set (a
    /// shadow, which hands out fresh page ids itself: `LivePages`).
    pub(crate) fn count_pages_only(&mut self) {
        self.live_pages.count_only();
    }

    /// Hashes the nodes changed since the last call into the digest (nothing
    /// for a tree that does not defer its terms).
    pub(crate) fn settle_terms(&mut self) {
        let Some(mut stale) = self.stale_terms.take() else {
            return;
        };
        for id in stale.drain(..) {
            // Removed nodes left the sum when they were detached.
            if let Some(node) = self.nodes.get_mut(id) {
                node.term_stale = false;
                node.digest_term = node_hash(node, node.tokens_hash);
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
                node.digest_term = node_hash(node, node.tokens_hash);
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
