//! Token buffers of removed nodes, kept for the nodes created next.
//!
//! Freeing a node's token buffer was the largest single cost of an eviction
//! (the allocator coalesces the freed chunk with its neighbours), and an
//! insert allocates one again: a tree churning at a steady size now does
//! neither. Only a buffer that fits a new node without wasting more than
//! its size is reused, so no live node carries much more than its tokens,
//! and the spare capacity stays within the tokens the tree held at the last
//! removal, so memory still follows the live contents. Buffers carry no
//! state: which one a node gets changes nothing but where its tokens live.

use crate::ids::Token;

#[derive(Debug, Clone, Default)]
pub(crate) struct TokenPool {
    spare: Vec<Vec<Token>>,
    /// Sum of the spare buffers' capacities, in tokens.
    tokens: usize,
}

impl TokenPool {
    /// A buffer holding `tokens`: the last spare one if it fits, else a new one.
    pub(crate) fn take(&mut self, tokens: &[Token]) -> Vec<Token> {
        match self.spare.last() {
            Some(b) if (tokens.len()..=2 * tokens.len()).contains(&b.capacity()) => {
                let mut buffer = self.spare.pop().expect("a last buffer");
                self.tokens -= buffer.capacity();
                buffer.extend_from_slice(tokens);
                buffer
            }
            _ => tokens.to_vec(),
        }
    }

    /// Keeps `buffer` for a later node while the spare capacity stays within
    /// `bound` tokens (what the tree still holds); frees it otherwise.
    pub(crate) fn give(&mut self, mut buffer: Vec<Token>, bound: usize) {
        if buffer.capacity() > 0 && self.tokens + buffer.capacity() <= bound {
            buffer.clear();
            self.tokens += buffer.capacity();
            self.spare.push(buffer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_a_fitting_buffer_and_stays_within_its_bound() {
        let mut pool = TokenPool::default();
        pool.give(vec![1, 2, 3, 4], 100);
        let b = pool.take(&[7, 8, 9]);
        assert_eq!(
            (b.as_slice(), b.capacity(), pool.tokens),
            (&[7, 8, 9][..], 4, 0)
        );
        pool.give(vec![0; 64], 100);
        assert_eq!(
            pool.take(&[5]),
            vec![5],
            "too big for one token: a new buffer"
        );
        assert_eq!(pool.tokens, 64, "the big one stays spare");
        pool.give(vec![0; 64], 100);
        assert_eq!(pool.tokens, 64, "beyond the bound: freed");
    }
}
