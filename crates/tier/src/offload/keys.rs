//! Engine keys: opaque bytes whose last four name the block's group
//! (big-endian, vLLM's `OffloadKey` layout), hashed once to a 64-bit token
//! that the index's tables are keyed by (a lookup confirms the key itself).

use cpkv_hash::Hasher64;

use super::OffloadIndex;
use crate::error::{Result, TierError};

/// Bytes a key needs at least: the four that name its group.
pub const GROUP_BYTES: usize = 4;

/// The most keys one engine call takes: a binding checks it before it reads
/// a key.
pub const MAX_KEYS_PER_CALL: usize = 1 << 24;

const TOKEN_TAG: u64 = 0x6f66_6c64_746f_6b6e; // "ofldtokn"

pub(super) fn group_of(key: &[u8]) -> u32 {
    let tail: [u8; GROUP_BYTES] = key[key.len() - GROUP_BYTES..]
        .try_into()
        .unwrap_or_default();
    u32::from_be_bytes(tail)
}

pub(super) fn token_of(key: &[u8]) -> u64 {
    Hasher64::new(TOKEN_TAG).bytes(key).finish()
}

/// A text key's bytes (SGLang's page hashes), appended to `buf`: its UTF-8
/// then group 0's four bytes, the same in every process.
pub fn push_text_key(buf: &mut Vec<u8>, text: &str) {
    buf.extend_from_slice(text.as_bytes());
    buf.extend_from_slice(&[0; GROUP_BYTES]);
}

/// An engine key as errors name it: its bytes in hex.
pub fn key_hex(key: &[u8]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

impl OffloadIndex {
    /// Every key must be long enough to name its group; checked before a
    /// call changes anything.
    pub fn check_keys(keys: &[&[u8]]) -> Result<()> {
        match keys.iter().find(|k| k.len() < GROUP_BYTES) {
            Some(k) => Err(TierError::BadKey {
                key: key_hex(k),
                reason: "is shorter than the 4 bytes that name its group",
            }),
            None => Ok(()),
        }
    }

    pub(super) fn check_call(keys: &[&[u8]], positions: &[Option<u64>]) -> Result<()> {
        if positions.len() != keys.len() {
            return Err(TierError::BadKey {
                key: format!("{} keys with {} positions", keys.len(), positions.len()),
                reason: "need one position (or none) per key",
            });
        }
        Self::check_keys(keys)
    }

    pub(super) fn collision(key: &[u8]) -> TierError {
        TierError::BadKey {
            key: key_hex(key),
            reason: "has the same 64-bit hash as another key on the host or in the call",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offload::KeyState;
    use cpkv_evict::Policy;
    use cpkv_hash::{mix64, SEED};

    /// A second 24-byte key (group 0) with `key`'s token: the key hash
    /// absorbs word by word through a bijection, so the second word can
    /// undo a different first one.
    fn colliding(key: &[u8; 24]) -> [u8; 24] {
        let word =
            |k: &[u8; 24], i: usize| u64::from_le_bytes(k[8 * i..8 * i + 8].try_into().unwrap());
        let start = mix64(mix64(SEED ^ TOKEN_TAG) ^ 24);
        let first = word(key, 0) ^ 1;
        let second = mix64(start ^ word(key, 0)) ^ mix64(start ^ first) ^ word(key, 1);
        let mut other = *key;
        other[..8].copy_from_slice(&first.to_le_bytes());
        other[8..16].copy_from_slice(&second.to_le_bytes());
        assert_ne!(&other, key);
        assert_eq!(token_of(&other), token_of(key));
        other
    }

    #[test]
    fn a_key_whose_token_another_key_holds_is_refused_and_changes_nothing() {
        let a = *b"first key, and group 0:\0";
        let b = colliding(&a);
        let mut index = OffloadIndex::new(4, Policy::Lru, vec![1]).unwrap();
        // Both in one call: refused before anything is placed.
        let err = index.prepare_store("r", &[&a, &b], &[Some(1), Some(2)]);
        assert!(matches!(err, Err(TierError::BadKey { .. })), "{err:?}");
        assert_eq!(
            (index.len(), index.digest()),
            (
                0,
                OffloadIndex::new(4, Policy::Lru, vec![1]).unwrap().digest()
            )
        );
        // One resident, the other offered: refused, and the other reads as a miss.
        let plan = index
            .prepare_store("r", &[&a], &[Some(1)])
            .unwrap()
            .unwrap();
        assert_eq!(plan.store, [0]);
        index.complete_store(&[&a], true).unwrap();
        let before = index.digest();
        let err = index.prepare_store("s", &[&b], &[Some(1)]);
        assert!(matches!(err, Err(TierError::BadKey { .. })), "{err:?}");
        assert_eq!((index.len(), index.digest()), (1, before));
        assert_eq!(
            (index.lookup(&a), index.lookup(&b)),
            (KeyState::Ready, KeyState::Miss)
        );
        index.check().unwrap();
    }

    #[test]
    fn a_batch_lookup_confirms_each_key_not_only_its_token() {
        let a = *b"first key, and group 0:\0";
        let b = colliding(&a);
        let mut index = OffloadIndex::new(4, Policy::Lru, vec![1]).unwrap();
        index.store(&[&a], None).unwrap();
        let found = index.locate_many(&[&b, &a, &b]);
        assert_eq!(found, [None, index.locate(&a), None]);
        assert!(found[1].is_some());
    }

    #[test]
    fn a_refused_store_leaves_its_prefix_unstamped() {
        let a = *b"first key, and group 0:\0";
        let b = colliding(&a);
        let prefix = *b"the prefix, in group 0:\0";
        let mut index = OffloadIndex::new(4, Policy::Lru, vec![1]).unwrap();
        index.store(&[&prefix], None).unwrap();
        index.store(&[&a], None).unwrap();
        let before = index.digest();
        // `b` collides with resident `a`: the call is refused, and the
        // readable prefix it continues is not stamped (nor locked).
        let err = index.store(&[&b], Some(&prefix));
        assert!(matches!(err, Err(TierError::BadKey { .. })), "{err:?}");
        assert_eq!(index.digest(), before);
        assert_eq!(index.num_pins(), 0);
        index.check().unwrap();
    }
}
