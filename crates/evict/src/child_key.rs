//! How a node keys its children: by the tokens of their first page, which
//! each child carries as one word (`child_word`) computed when that page
//! becomes its first.
//!
//! A child table holds only (word, id) pairs, so a child leaves its parent
//! by its word and id without reading, hashing or comparing a token (the
//! first page's tokens live in the child, which a lookup visits anyway to
//! match the rest of its pages). Only a lookup compares tokens, with the one
//! child its word names, or with the few whose first pages differ but whose
//! words are equal. Nothing iterates a table in a decision.

use std::collections::HashMap;

use crate::digest::{Hasher64, WordHashing};
use crate::node::{NodeId, Token};

/// The one word a page stands for, as `head` and `rest` split it: the token
/// of a one-token page, else a tagged hash of all its tokens (equal pages
/// give equal words). The shadow caches keep it in place of a page's tokens.
pub(crate) fn page_word(head: Token, rest: &[Token]) -> u64 {
    if rest.is_empty() {
        return head;
    }
    // `Hasher64::words` over the whole page, without joining it first.
    let start = Hasher64::new(PAGE_TAG)
        .word(1 + rest.len() as u64)
        .word(head);
    rest.iter().fold(start, |h, &t| h.word(t)).finish()
}

const PAGE_TAG: u64 = 0x5ad0_0000_0000_0001;

/// Where a first page (not empty) goes in its parent's child table. Only a
/// spread, never an identity (children with equal words are told apart by
/// their tokens), so one multiply per token instead of `page_word`'s full
/// mix: the table's hasher mixes the result once more.
pub(crate) fn child_word(page: &[Token]) -> u64 {
    page[1..].iter().fold(page[0], |h, &t| {
        (h.rotate_left(23) ^ t).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    })
}

/// A node's children, each under its `child_word`.
#[derive(Debug, Clone, Default)]
pub struct ChildTable {
    by_word: HashMap<u64, NodeId, WordHashing>,
    /// Children whose word a child in `by_word` already holds (distinct
    /// first pages, equal words): rare, so a list scanned on lookup.
    sharing: Vec<(u64, NodeId)>,
}

impl ChildTable {
    /// A table holding one child.
    pub(crate) fn one(word: u64, id: NodeId) -> Self {
        let mut table = Self::default();
        table.insert(word, id);
        table
    }

    pub fn is_empty(&self) -> bool {
        self.by_word.is_empty()
    }

    /// Adds child `id` under `word`; the caller knows no child has its first page.
    pub(crate) fn insert(&mut self, word: u64, id: NodeId) {
        if let Some(&held) = self.by_word.get(&word) {
            debug_assert_ne!(held, id, "child {id} added twice");
            self.sharing.push((word, id));
        } else {
            self.by_word.insert(word, id);
        }
    }

    /// Takes child `id`, held under `word`, out of the table.
    pub(crate) fn remove(&mut self, word: u64, id: NodeId) {
        if self.by_word.get(&word) == Some(&id) {
            match self.sharing.iter().position(|&(w, _)| w == word) {
                // Another child with the word moves up, so `by_word` holds every word in use.
                Some(at) => {
                    self.by_word.insert(word, self.sharing.swap_remove(at).1);
                }
                None => {
                    self.by_word.remove(&word);
                }
            }
        } else {
            let at = self.sharing.iter().position(|&entry| entry == (word, id));
            self.sharing.swap_remove(at.expect("a child of this table"));
        }
    }

    /// The child under `word` that `is_page` accepts (the one whose first
    /// page is the page looked up): at most one child can be.
    pub(crate) fn find(&self, word: u64, is_page: impl Fn(NodeId) -> bool) -> Option<NodeId> {
        let &first = self.by_word.get(&word)?;
        if is_page(first) {
            return Some(first);
        }
        self.sharing
            .iter()
            .find(|&&(w, id)| w == word && is_page(id))
            .map(|&(_, id)| id)
    }

    /// Every (word, child), in no particular order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (u64, NodeId)> + '_ {
        self.by_word
            .iter()
            .map(|(&word, &id)| (word, id))
            .chain(self.sharing.iter().copied())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_page_word_is_the_token_or_the_hash_of_the_whole_page() {
        assert_eq!(page_word(42, &[]), 42);
        let page = [3, 1, 4, 1];
        let whole = Hasher64::new(PAGE_TAG).words(&page).finish();
        assert_eq!(page_word(page[0], &page[1..]), whole);
        assert_ne!(page_word(3, &[1, 4]), whole);
    }

    #[test]
    fn a_one_token_page_is_its_own_child_word() {
        assert_eq!(child_word(&[7]), 7);
        assert_ne!(child_word(&[2, 9]), child_word(&[9, 2]));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64),
        Remove(usize),
    }

    proptest! {
        /// Against a map from child to word, with words from a tiny range so
        /// that most children share their word with another: every live child
        /// is found under its word (a child "is" its page here), no removed
        /// one is, and the counts agree.
        #[test]
        fn behaves_like_a_map_of_children_to_words(
            ops in proptest::collection::vec(
                prop_oneof![(0..4u64).prop_map(Op::Insert), (0..64usize).prop_map(Op::Remove)],
                0..200,
            )
        ) {
            let (mut table, mut model) = (ChildTable::default(), BTreeMap::new());
            let mut next = 0;
            for op in ops {
                match op {
                    Op::Insert(word) => {
                        table.insert(word, NodeId(next));
                        model.insert(next, word);
                        next += 1;
                    }
                    Op::Remove(pick) if !model.is_empty() => {
                        let (&id, &word) = model.iter().nth(pick % model.len()).expect("picked");
                        table.remove(word, NodeId(id));
                        model.remove(&id);
                    }
                    Op::Remove(_) => {}
                }
                prop_assert_eq!(table.entries().count(), model.len());
                prop_assert_eq!(table.is_empty(), model.is_empty());
                for id in 0..next {
                    let word = model.get(&id).copied().unwrap_or(id % 4);
                    let found = table.find(word, |c| c == NodeId(id));
                    prop_assert_eq!(found.is_some(), model.contains_key(&id));
                }
                let mut entries: Vec<(u64, u64)> = table.entries().map(|(w, c)| (c.0, w)).collect();
                entries.sort_unstable();
                prop_assert_eq!(entries, model.iter().map(|(&c, &w)| (c, w)).collect::<Vec<_>>());
            }
        }
    }
}
