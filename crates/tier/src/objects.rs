//! Host objects: the rows one backup holds, from its reservation until the
//! last tree segment that points into it leaves (rows from the host core's
//! allocator, one allocator object under the same key). Committed once
//! every rank has written it.

use std::collections::BTreeMap;

use cpkv_hash::hash_words as term;

const OBJECT: u64 = 0x4f42;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostObject {
    pub rows: Vec<u32>,
    pub committed: bool,
}

#[derive(Debug, Clone, Default)]
pub struct HostObjects {
    by_key: BTreeMap<u64, HostObject>,
    digest: u64,
}

fn object_term(key: u64, o: &HostObject) -> u64 {
    let mut words = Vec::with_capacity(o.rows.len() + 2);
    words.push(key);
    words.push(u64::from(o.committed));
    words.extend(o.rows.iter().map(|&r| u64::from(r)));
    term(OBJECT, &words)
}

impl HostObjects {
    pub fn get(&self, key: u64) -> Option<&HostObject> {
        self.by_key.get(&key)
    }
    pub fn len(&self) -> usize {
        self.by_key.len()
    }
    pub fn contains(&self, key: u64) -> bool {
        self.by_key.contains_key(&key)
    }
    pub fn digest(&self) -> u64 {
        self.digest
    }
    pub fn digest_from_scratch(&self) -> u64 {
        self.by_key
            .iter()
            .fold(0u64, |d, (&k, o)| d.wrapping_add(object_term(k, o)))
    }

    /// A new, uncommitted object on `rows`.
    pub fn insert(&mut self, key: u64, rows: Vec<u32>) {
        let object = HostObject {
            rows,
            committed: false,
        };
        self.digest = self.digest.wrapping_add(object_term(key, &object));
        let old = self.by_key.insert(key, object);
        debug_assert!(old.is_none(), "object key {key} reused");
    }

    pub fn mark_committed(&mut self, key: u64) {
        let object = self.by_key.get_mut(&key).expect("live object");
        self.digest = self.digest.wrapping_sub(object_term(key, object));
        object.committed = true;
        self.digest = self.digest.wrapping_add(object_term(key, object));
    }

    /// Forgets `key` (the caller frees its rows).
    pub fn remove(&mut self, key: u64) {
        let object = self.by_key.remove(&key).expect("live object");
        self.digest = self.digest.wrapping_sub(object_term(key, &object));
    }
}
