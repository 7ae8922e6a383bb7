//! Spills: what host eviction hands to a third tier (L3). Off unless
//! `enable_spills` is called; then every backup remembers the content key
//! of each of its pages, and a host object released by host eviction is
//! queued as (keys, rows) for the caller to copy out of the slab before it
//! writes those rows again (its next slab write follows the next commit
//! point, which every rank reaches only after its own copies).
//!
//! A content key is chained over the token path and the namespace
//! (`page_keys`): a pure function of the tokens, so a restarted run computes
//! the same key for the same page. Nothing here enters the digest or
//! changes a decision: a cache with spills on decides exactly as one
//! without.

use std::collections::BTreeMap;

use cpkv_evict::{Namespace, Token};
use cpkv_hash::Hasher64;

const SPILL_SEED: u64 = 0x6c33_7370_696c_6c21; // "l3spill!"
const PAGE_KEY: u64 = 0x6c33_7061_6765_6b79; // "l3pageky"

/// The pages of one released host object: `keys[i]` is held by slab row
/// `rows[i]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spilled {
    pub keys: Vec<u64>,
    pub rows: Vec<u32>,
}

/// Spill bookkeeping (only when enabled): which content keys each host
/// object's rows hold, and the released objects not yet taken.
#[derive(Debug, Clone, Default)]
pub(crate) struct SpillState {
    /// Host object -> content key of each of its rows, in row order.
    keys_by_object: BTreeMap<u64, Vec<u64>>,
    /// Released objects not yet taken by the caller, in release order.
    queued: Vec<Spilled>,
}

/// The content key of every whole page of `tokens` under `namespace`:
/// `key[i]` hashes `key[i - 1]` with page `i`'s tokens, from a seed of the
/// namespace.
pub fn page_keys(tokens: &[Token], page_size: usize, namespace: &Namespace) -> Vec<u64> {
    let seed = match namespace {
        Namespace::Default => Hasher64::new(SPILL_SEED).word(0),
        Namespace::Id(id) => Hasher64::new(SPILL_SEED).word(1).word(*id),
        Namespace::Name(name) => Hasher64::new(SPILL_SEED).word(2).bytes(name.as_bytes()),
    }
    .finish();
    let mut keys = Vec::with_capacity(tokens.len() / page_size.max(1));
    let mut prev = seed;
    for page in tokens.chunks_exact(page_size.max(1)) {
        prev = Hasher64::new(PAGE_KEY).word(prev).words(page).finish();
        keys.push(prev);
    }
    keys
}

impl SpillState {
    /// Remembers the content keys of each backup object's rows.
    pub(crate) fn note(&mut self, placed: impl IntoIterator<Item = (u64, Vec<u64>)>) {
        self.keys_by_object.extend(placed);
    }

    /// Host eviction is releasing `object` (committed, its rows hold its
    /// pages): queues them when its keys are known.
    pub(crate) fn release(&mut self, object: u64, rows: &[u32]) {
        if let Some(keys) = self.keys_by_object.remove(&object) {
            debug_assert_eq!(keys.len(), rows.len());
            self.queued.push(Spilled {
                keys,
                rows: rows.to_vec(),
            });
        }
    }

    /// `object` leaves without a spill (aborted, or already spilled).
    pub(crate) fn forget(&mut self, object: u64) {
        self.keys_by_object.remove(&object);
    }

    /// The released objects since the last call, oldest first.
    pub(crate) fn take(&mut self) -> Vec<Spilled> {
        std::mem::take(&mut self.queued)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_chain_over_the_path_and_the_namespace() {
        let a = page_keys(&[1, 2, 3, 4, 5], 2, &Namespace::Default);
        assert_eq!(a.len(), 2, "whole pages only");
        assert_eq!(a[..1], page_keys(&[1, 2], 2, &Namespace::Default)[..]);
        assert_ne!(
            a[1],
            page_keys(&[9, 2, 3, 4], 2, &Namespace::Default)[1],
            "chained"
        );
        assert_ne!(a, page_keys(&[1, 2, 3, 4], 2, &Namespace::Id(1)));
    }
}
