//! How a node keys its children: by the tokens of their first page, which
//! each child carries as one word (`child_word`) computed when that page
//! becomes its first.
//!
//! A child table holds only (word, id) pairs; the first page's tokens live
//! in the child, which a lookup visits anyway to match the rest of its
//! pages. Only a lookup compares tokens, with the one child its word names,
//! or with the few whose first pages differ but whose words are equal.
//!
//! A child that leaves the tree (eviction's common step) only counts itself
//! out: its entry stays, naming a dead id (ids are never reused), until a
//! new child with the same word takes its place or the departed outnumber
//! the children, when one sweep drops them all. Leaving thus touches no
//! bucket, and the table stays within about twice its children. Nothing
//! iterates a table in a decision.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::HashMap;

use crate::ids::{NodeId, Token};
use cpkv_hash::{Hasher64, WordHashing};

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

/// One word per page of `tokens`: the token itself for one-token pages,
/// else a hash of the page (`page_word`). The shadows only compare pages,
/// so they keep a word where the tree keeps `page_size` tokens. A
/// collision (two distinct pages under one parent with one hash, odds of
/// about 2^-64 a pair) can only blur a score, and it blurs it alike on
/// every rank.
pub(crate) fn page_words(tokens: &[Token], page_size: usize) -> Cow<'_, [Token]> {
    if page_size == 1 {
        return Cow::Borrowed(tokens);
    }
    tokens
        .chunks_exact(page_size)
        .map(|page| page_word(page[0], &page[1..]))
        .collect()
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

/// Departed entries a table keeps however few its children, so a parent
/// whose last children come and go does not sweep at every departure.
pub(crate) const DEPARTED_KEPT: usize = 8;

/// A node's children, each under its `child_word`, and the entries of
/// children that left the tree. `is_live` (the tree's) tells them apart.
#[derive(Debug, Clone, Default)]
pub struct ChildTable {
    by_word: HashMap<u64, NodeId, WordHashing>,
    /// Entries whose word an entry in `by_word` already holds (distinct
    /// first pages, equal words): rare, so a list scanned on lookup.
    sharing: Vec<(u64, NodeId)>,
    /// Children in the tree.
    live: usize,
    /// Entries of children that left the tree.
    departed: usize,
}

impl ChildTable {
    /// A table holding one child.
    pub(crate) fn one(word: u64, id: NodeId) -> Self {
        let mut table = Self::default();
        table.insert(word, id, |_| true);
        table
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Adds child `id` under `word`; the caller knows no child has its first
    /// page. A departed entry under the word gives it its place.
    pub(crate) fn insert(&mut self, word: u64, id: NodeId, is_live: impl Fn(NodeId) -> bool) {
        self.live += 1;
        match self.by_word.entry(word) {
            Entry::Occupied(mut held) if !is_live(*held.get()) => {
                held.insert(id);
                self.departed -= 1;
            }
            Entry::Occupied(_) => self.sharing.push((word, id)),
            Entry::Vacant(free) => {
                free.insert(id);
            }
        }
    }

    /// Counts out a child that has left the tree (`is_live` says so now);
    /// sweeps once the departed outnumber the children.
    pub(crate) fn depart(&mut self, is_live: impl Fn(NodeId) -> bool) {
        self.live -= 1;
        self.departed += 1;
        if self.departed > self.live.max(DEPARTED_KEPT) {
            self.by_word.retain(|_, id| is_live(*id));
            let sharing = std::mem::take(&mut self.sharing);
            let live = self.live;
            for (word, id) in sharing.into_iter().filter(|&(_, id)| is_live(id)) {
                self.insert(word, id, &is_live);
            }
            self.live = self.by_word.len() + self.sharing.len();
            debug_assert_eq!(self.live, live, "a sweep keeps every child");
            self.departed = 0;
        }
    }

    /// Takes child `id`, held under `word` and staying in the tree (it moves
    /// under a new parent), out of the table.
    pub(crate) fn remove(&mut self, word: u64, id: NodeId) {
        self.live -= 1;
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

    /// The child under `word` that `is_page` accepts (a live child whose
    /// first page is the page looked up): at most one child can be.
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

    /// Children that left the tree and still have an entry.
    pub(crate) fn departed(&self) -> usize {
        self.departed
    }

    /// Every (word, id) entry, departed children's included, in no
    /// particular order.
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
        /// The picked child leaves the tree (its entry stays until swept).
        Depart(usize),
        /// The picked child moves under a new child that takes its place
        /// (as a split does): its entry goes now, the new child's comes.
        Replace(usize),
    }

    proptest! {
        /// Against a map from live child to word, with words from a tiny
        /// range so that most children share their word with another: every
        /// live child is found under its word (a child "is" its page here), no
        /// departed or replaced one is, the counts agree and departed entries
        /// stay within the bound.
        #[test]
        fn behaves_like_a_map_of_children_to_words(
            ops in proptest::collection::vec(
                prop_oneof![
                    (0..4u64).prop_map(Op::Insert),
                    (0..64usize).prop_map(Op::Depart),
                    (0..64usize).prop_map(Op::Replace),
                ],
                0..300,
            )
        ) {
            let (mut table, mut model) = (ChildTable::default(), BTreeMap::new());
            let mut next = 0;
            for op in ops {
                match op {
                    Op::Insert(word) => {
                        table.insert(word, NodeId(next), |c| model.contains_key(&c.0));
                        model.insert(next, word);
                        next += 1;
                    }
                    Op::Depart(pick) | Op::Replace(pick) if !model.is_empty() => {
                        let (&id, &word) = model.iter().nth(pick % model.len()).expect("picked");
                        if matches!(op, Op::Replace(_)) {
                            table.remove(word, NodeId(id));
                            model.remove(&id);
                            table.insert(word, NodeId(next), |c| model.contains_key(&c.0));
                            model.insert(next, word);
                            next += 1;
                        } else {
                            model.remove(&id);
                            table.depart(|c| model.contains_key(&c.0));
                        }
                    }
                    Op::Depart(_) | Op::Replace(_) => {}
                }
                let live = |id: NodeId| model.contains_key(&id.0);
                prop_assert_eq!(table.is_empty(), model.is_empty());
                for id in 0..next {
                    let word = model.get(&id).copied().unwrap_or(id % 4);
                    let found = table.find(word, |c| c == NodeId(id) && live(c));
                    prop_assert_eq!(found.is_some(), model.contains_key(&id));
                }
                let mut kept: Vec<(u64, u64)> =
                    table.entries().filter(|&(_, c)| live(c)).map(|(w, c)| (c.0, w)).collect();
                kept.sort_unstable();
                prop_assert_eq!(kept, model.iter().map(|(&c, &w)| (c, w)).collect::<Vec<_>>());
                let departed = table.entries().filter(|&(_, c)| !live(c)).count();
                prop_assert_eq!(departed, table.departed());
                prop_assert!(departed <= model.len().max(DEPARTED_KEPT));
            }
        }
    }
}
