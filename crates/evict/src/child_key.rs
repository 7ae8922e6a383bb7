//! How a node keys its children: by the tokens of their first page.
//!
//! The first token is kept inline and the rest of the page boxed, so a
//! lookup compares an inline word and touches the heap only on a tie (never
//! with one-token pages, whose rest is empty and allocates nothing). A page
//! stands for one word (`page_word`): a one-token page for its token, a
//! longer one for a hash of all its tokens. Children sit in a hash table of
//! these keys (one probe where an ordered map walked several nodes, each a
//! cache miss in a large tree), spread by `table_word`; nothing iterates it
//! in a decision.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

use crate::digest::Hasher64;
use crate::node::Token;

/// A child's key as stored: its first page, split after the first token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildKey {
    head: Token,
    rest: Box<[Token]>,
}

impl ChildKey {
    /// The key of a child whose first page is `page` (not empty).
    pub fn new(page: &[Token]) -> Self {
        Self {
            head: page[0],
            rest: page[1..].into(),
        }
    }

    /// Whether `page` is the page this key names.
    pub fn names(&self, page: &[Token]) -> bool {
        page.first() == Some(&self.head) && page[1..] == self.rest[..]
    }
}

/// A borrowed page, to look children up without building a `ChildKey`.
pub struct Page<'a>(pub &'a [Token]);

/// What `ChildKey` and `Page` share, so the map can compare either.
pub trait PageKey {
    fn head(&self) -> Token;
    fn rest(&self) -> &[Token];
}

impl PageKey for ChildKey {
    fn head(&self) -> Token {
        self.head
    }
    fn rest(&self) -> &[Token] {
        &self.rest
    }
}

impl PageKey for Page<'_> {
    fn head(&self) -> Token {
        self.0[0]
    }
    fn rest(&self) -> &[Token] {
        &self.0[1..]
    }
}

// The equality `ChildKey` derives: head, then the rest.
impl PartialEq for dyn PageKey + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.head() == other.head() && self.rest() == other.rest()
    }
}

impl Eq for dyn PageKey + '_ {}

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

/// Where a page goes in a child table. Only a spread, never an identity
/// (equal words are compared token by token), so one multiply per token
/// instead of `page_word`'s full mix: the table's hasher mixes the result
/// once more. Evicting a leaf re-hashes its first page to leave its parent.
fn table_word(head: Token, rest: &[Token]) -> u64 {
    rest.iter().fold(head, |h, &t| {
        (h.rotate_left(23) ^ t).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    })
}

impl Hash for dyn PageKey + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(table_word(self.head(), self.rest()));
    }
}

// As `dyn PageKey` hashes, so a borrowed page finds its key.
impl Hash for ChildKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(table_word(self.head, &self.rest));
    }
}

impl<'a> Borrow<dyn PageKey + 'a> for ChildKey {
    fn borrow(&self) -> &(dyn PageKey + 'a) {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn a_key_names_its_page_only() {
        for page in [&[2, 9][..], &[5], &[0, 0, 7]] {
            assert!(ChildKey::new(page).names(page));
        }
        assert!(!ChildKey::new(&[2, 9]).names(&[2, 1]));
        assert!(!ChildKey::new(&[2, 9]).names(&[3, 9]));
    }

    #[test]
    fn a_page_word_is_the_token_or_the_hash_of_the_whole_page() {
        assert_eq!(page_word(42, &[]), 42);
        let page = [3, 1, 4, 1];
        let whole = Hasher64::new(PAGE_TAG).words(&page).finish();
        assert_eq!(page_word(page[0], &page[1..]), whole);
        assert_ne!(page_word(3, &[1, 4]), whole);
    }

    #[test]
    fn a_borrowed_page_hashes_like_its_key() {
        use crate::node::Children;
        use crate::node::NodeId;
        let pages: [&[Token]; 6] = [&[7], &[8], &[2, 9], &[2, 1], &[9, 2], &[0, 0, 0]];
        let table: Children = pages
            .iter()
            .enumerate()
            .map(|(i, p)| (ChildKey::new(p), NodeId(i as u64)))
            .collect();
        for (i, p) in pages.iter().enumerate() {
            assert_eq!(table.get(&Page(p) as &dyn PageKey), Some(&NodeId(i as u64)));
        }
        for missing in [&[9][..], &[2, 2], &[0, 0], &[0, 0, 1]] {
            assert_eq!(table.get(&Page(missing) as &dyn PageKey), None);
        }
    }
}
