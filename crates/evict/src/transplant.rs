//! Where a tree's nodes stand in a shadow's queues, for `Policy::Ghost`
//! taking over a queue policy's order (`PrefixTree::follow`).
//!
//! The shadow that earned the lead ran the policy at the tree's capacity on
//! the same stream, but on its own content: a tree that starts the policy
//! from its own nodes keeps what the shadow had let go and queues the rest
//! in an order the policy never produced. So each node takes the queue state
//! of the shadow node holding its last page (found by walking the shadow
//! beside the tree, one pass over the pages), in the shadow's queue order,
//! and content the shadow no longer holds goes first in line to leave.
//!
//! A miniature shadow (`sampling.rs`) saw only a sample of the requests, so
//! content it does not hold may never have reached it: the tree's nodes are
//! queued by last access, with the shadow's queue and count where it holds
//! the content and by the node's own hits (as ARC takes over) elsewhere.

use crate::child_key::page_words;
use crate::ids::{NodeId, Token};
use crate::lean_candidate::LeanCandidate;
use crate::namespace::Namespace;
use crate::queue_shared::{Slot, MAX_COUNT};
use crate::tree::PrefixTree;

/// What `queue_order` reads of the shadow that earned the lead, whose
/// pages are one word each: ghost's lean queue candidate, or a tree run as
/// that policy's replica.
pub trait QueueShadow {
    /// `namespace`'s root.
    fn root_of(&self, namespace: &Namespace) -> Option<NodeId>;
    /// The words of `node`'s pages.
    fn words(&self, node: NodeId) -> &[Token];
    /// The child of `node` whose first page is `word`.
    fn child_of(&self, node: NodeId, word: Token) -> Option<NodeId>;
    /// `node`'s packed queue slot.
    fn queue_slot_of(&self, node: NodeId) -> u64;
}

impl QueueShadow for PrefixTree {
    fn root_of(&self, namespace: &Namespace) -> Option<NodeId> {
        self.root(namespace)
    }
    fn words(&self, node: NodeId) -> &[Token] {
        debug_assert_eq!(self.page_size(), 1);
        self.node(node).expect("a live shadow node").tokens()
    }
    fn child_of(&self, node: NodeId, word: Token) -> Option<NodeId> {
        self.child(node, &[word])
    }
    fn queue_slot_of(&self, node: NodeId) -> u64 {
        self.node(node).expect("a live shadow node").queue_slot()
    }
}

impl QueueShadow for LeanCandidate {
    fn root_of(&self, namespace: &Namespace) -> Option<NodeId> {
        self.root_slot(namespace)
            .map(|slot| NodeId(u64::from(slot)))
    }
    fn words(&self, node: NodeId) -> &[Token] {
        self.entry_words(node.0 as u32)
    }
    fn child_of(&self, node: NodeId, word: Token) -> Option<NodeId> {
        self.child_slot(node.0 as u32, word)
            .map(|slot| NodeId(u64::from(slot)))
    }
    fn queue_slot_of(&self, node: NodeId) -> u64 {
        self.entry_key(node.0 as u32)
    }
}

/// The state of content the shadow does not hold: queued first, to leave first.
const FIRST_OUT: Slot = Slot {
    queue: 0,
    count: 0,
    seq: 0,
};

/// A position in a shadow tree: a node and how many of its pages are behind.
#[derive(Clone, Copy)]
struct Cursor {
    node: NodeId,
    used: usize,
}

/// The shadow's page-1 words `words` from `at` on, if the shadow holds them all.
fn advance(
    shadow: &(impl QueueShadow + ?Sized),
    mut at: Cursor,
    words: &[Token],
) -> Option<Cursor> {
    let mut done = 0;
    while done < words.len() {
        let held = &shadow.words(at.node)[at.used..];
        if held.is_empty() {
            let child = shadow.child_of(at.node, words[done])?;
            at = Cursor {
                node: child,
                used: 0,
            };
            continue;
        }
        let n = held.len().min(words.len() - done);
        if held[..n] != words[done..done + n] {
            return None;
        }
        at.used += n;
        done += n;
    }
    Some(at)
}

/// The tree's nodes (roots included) in the order a queue policy that took
/// over from `shadow` should queue them, each with its queue and access
/// count: first what the shadow does not hold (queue 0, count 0, least
/// recently used first), then the rest in the shadow's order with the
/// state of the shadow node that holds its last page. When the shadow is a
/// `miniature`, every node goes by last access (see the module).
pub fn queue_order(
    tree: &PrefixTree,
    shadow: &(impl QueueShadow + ?Sized),
    miniature: bool,
) -> Vec<(NodeId, Slot)> {
    let page_size = tree.page_size();
    // (shadow position or none, last access, id, state): sorted below, so
    // the walk's order (hash tables of children) cannot show.
    let mut placed = Vec::new();
    let mut stack: Vec<(NodeId, Option<Cursor>)> = Vec::new();
    for (namespace, root) in tree.roots() {
        let at = shadow
            .root_of(namespace)
            .map(|node| Cursor { node, used: 0 });
        stack.push((root, at));
    }
    while let Some((id, at)) = stack.pop() {
        let node = tree.node(id).expect("a live node");
        let held = at
            .filter(|_| !node.is_root())
            .map(|c| Slot::unpack(shadow.queue_slot_of(c.node)));
        let access = node.last_access();
        placed.push(match (held, miniature) {
            (Some(slot), false) => ((1, slot.seq, access), id, slot),
            (Some(slot), true) => ((1, 0, access), id, slot),
            (None, true) if !node.is_root() => {
                let hits = node.hits();
                let by_hits = Slot {
                    queue: u64::from(hits >= 2),
                    count: hits.saturating_sub(1).min(MAX_COUNT),
                    seq: 0,
                };
                ((1, 0, access), id, by_hits)
            }
            (None, _) => ((0, 0, access), id, FIRST_OUT),
        });
        for child in tree.children(node.id()) {
            let words = page_words(tree.node(child).expect("live").tokens(), page_size);
            stack.push((child, at.and_then(|c| advance(shadow, c, &words))));
        }
    }
    placed.sort_unstable_by_key(|&(key, id, _)| (key, id));
    placed.into_iter().map(|(_, id, slot)| (id, slot)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::Namespace;
    use crate::policy::Policy;

    const NS: Namespace = Namespace::Default;

    fn slot_of(tree: &PrefixTree, id: NodeId) -> Slot {
        Slot::unpack(tree.node(id).unwrap().queue_slot())
    }

    /// A main tree with pages of 2 tokens against an s3fifo shadow holding
    /// one word per page: shared content takes the shadow's queue and count
    /// in the shadow's order, the rest (and the root) goes first, queue 0.
    #[test]
    fn nodes_take_their_content_s_shadow_state_and_the_rest_goes_first() {
        let page = |p: u64| [p * 10, p * 10 + 1];
        let tokens =
            |pages: &[u64]| -> Vec<Token> { pages.iter().flat_map(|&p| page(p)).collect() };
        let mut shadow = PrefixTree::without_chooser(1, Policy::S3fifo).unwrap();
        let mut next = 0;
        for pages in [&[1u64, 2, 3][..], &[1, 2, 4], &[1, 2, 3]] {
            let words = page_words(&tokens(pages), 2).into_owned();
            let m = shadow.match_prefix(&words, &NS);
            let mut ids = m.device_pages;
            let fresh = (words.len() - ids.len()) as u64;
            ids.extend(next..next + fresh);
            next += fresh;
            shadow.insert(&words, &ids, &NS).unwrap();
        }
        let mut tree = PrefixTree::new(2, Policy::Lru).unwrap();
        let three = tree
            .insert(&tokens(&[1, 2, 3]), &[0, 1, 2], &NS)
            .unwrap()
            .node;
        let five = tree
            .insert(&tokens(&[1, 2, 5]), &[0, 1, 3], &NS)
            .unwrap()
            .node;
        let seven = tree.insert(&tokens(&[7]), &[4], &NS).unwrap().node;
        let shared = tree.node(three).unwrap().parent().unwrap();
        let root = tree.root(&NS).unwrap();

        let order = queue_order(&tree, &shadow, false);
        assert_eq!(order.len(), tree.len());
        let (first, rest) = order.split_at(3);
        let mut gone: Vec<NodeId> = first.iter().map(|&(id, _)| id).collect();
        gone.sort();
        let mut expected = vec![root, five, seven];
        expected.sort();
        assert_eq!(gone, expected, "what the shadow does not hold goes first");
        assert!(first.iter().all(|(_, s)| (s.queue, s.count) == (0, 0)));

        let in_shadow = |words: &[Token]| {
            let root = shadow.root(&NS).unwrap();
            let mut at = Cursor {
                node: root,
                used: 0,
            };
            at = advance(&shadow, at, words).unwrap();
            slot_of(&shadow, at.node)
        };
        let held_shared = in_shadow(&page_words(&tokens(&[1, 2]), 2));
        let held_three = in_shadow(&page_words(&tokens(&[1, 2, 3]), 2));
        // A split leaves both halves with the node's state: ties go by
        // last access, then id.
        let access = |id: NodeId| tree.node(id).unwrap().last_access();
        let mut by_seq = [(held_shared, shared), (held_three, three)];
        by_seq.sort_by_key(|&(s, id)| (s.seq, access(id), id));
        for ((id, slot), (held, expected_id)) in rest.iter().zip(by_seq) {
            assert_eq!(*id, expected_id, "shadow order");
            assert_eq!((slot.queue, slot.count), (held.queue, held.count));
        }
        assert!(held_three.count > 0, "the re-read leaf counts its hit");
    }
}
