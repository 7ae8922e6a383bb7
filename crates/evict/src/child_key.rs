//! How a node keys its children: by the tokens of their first page.
//!
//! The first token is kept inline and the rest of the page boxed, so a
//! lookup among many children compares inline words and touches the heap
//! only on a tie (never with one-token pages, whose rest is empty and
//! allocates nothing). The order is the page's lexicographic order, as if
//! the whole page were one slice, so children are visited in the same order.

use std::borrow::Borrow;
use std::cmp::Ordering;

use crate::node::Token;

/// A child's key as stored: its first page, split after the first token.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
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

// The order `ChildKey` derives: head first, then the rest.
impl Ord for dyn PageKey + '_ {
    fn cmp(&self, other: &Self) -> Ordering {
        self.head()
            .cmp(&other.head())
            .then_with(|| self.rest().cmp(other.rest()))
    }
}

impl PartialOrd for dyn PageKey + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for dyn PageKey + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for dyn PageKey + '_ {}

impl<'a> Borrow<dyn PageKey + 'a> for ChildKey {
    fn borrow(&self) -> &(dyn PageKey + 'a) {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn orders_like_the_whole_page_and_finds_borrowed_pages() {
        let pages: [&[Token]; 5] = [&[2, 9], &[1, 5], &[2, 1], &[1, 7], &[0, 100]];
        let map: BTreeMap<ChildKey, usize> = pages
            .iter()
            .enumerate()
            .map(|(i, p)| (ChildKey::new(p), i))
            .collect();
        let mut sorted = pages.to_vec();
        sorted.sort();
        let order: Vec<&[Token]> = map.values().map(|&i| pages[i]).collect();
        assert_eq!(order, sorted);
        for (i, p) in pages.iter().enumerate() {
            assert_eq!(map.get(&Page(p) as &dyn PageKey), Some(&i));
            assert!(ChildKey::new(p).names(p));
        }
        assert_eq!(map.get(&Page(&[2, 2]) as &dyn PageKey), None);
        assert!(!ChildKey::new(&[2, 9]).names(&[2, 1]));
    }
}
