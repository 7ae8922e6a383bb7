//! The versioned binary snapshot of a tree, and the canonical digest.
//!
//! Layout (little endian):
//! ```text
//! magic "CPKVTREE" | version u32 | body length u64 | SHA-256(body) [32] | body
//! body  = page_size u64, policy name (u32 length, UTF-8), clock u64, floor u64,
//!         slot count u64, per slot: generation u32, live u8, live ? node,
//!         free list (u64 count, slot u32 each, in reuse order),
//!         roots (u64 count, per root in namespace order: id u64, namespace),
//!         idle roots (u64 count, per root in id order: id u64, since u64),
//!         ghost history (see `GhostHistory::encode`),
//!         policy state: arc, s3fifo: see `QueueState::encode`;
//!         ghost: u8 0 then ranking u8 (a shadow tree), or u8 1 then its
//!         shadows (see `Shadows::encode`: each shadow a nested body) and
//!         the queue state of the leader when that is a queue policy;
//!         other policies: nothing
//! node  = parent u64 (u64::MAX for a root), tokens (u64 count, u64 each),
//!         device (u8 flag, then u64 count, u64 each), host (u8 flag, u64),
//!         depth, created, last_access, hits, locks, pins, priority (u64 each)
//! namespace = tag u8 (0 default, 1 id u64, 2 name: u32 length, UTF-8)
//! ```
//! The body is the whole replicated state and nothing else (no event buffer,
//! no caches), written in an order every replica shares, so its SHA-256 is the
//! canonical digest: two trees have equal canonical digests exactly when they
//! will make the same decisions. Restore rebuilds every derived structure
//! (children, index, page set, host references, digest) and checks every
//! invariant before handing the tree out; bad bytes give `CorruptSnapshot`.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::error::EvictError;
use crate::ids::NodeId;
use crate::namespace::{decode_namespace, encode_namespace};
use crate::node::{Children, Node};
use crate::policy::Policy;
use crate::queues::QueueState;
use crate::shadow::Shadows;
use crate::tree::{Decoded, PrefixTree, RankingChooser, MAX_PAGE_SIZE};
use cpkv_wire::{Reader, Writer};

const MAGIC: &[u8; 8] = b"CPKVTREE";
/// 2: the policies' own state (arc, s3fifo, ghost's shadows) follows the
/// ghost history. 3: ghost's shadows include arc and s3fifo, and a ghost
/// tree following one of them carries its queue state. 4: ghost's shadows
/// are miniatures and carry their sampling (rate and floor). 5: ghost's
/// shadows tag each candidate's kind, and the recency candidate is the
/// lean one (`lean_candidate.rs`). 6: the ghost history writes its queue
/// once, each item's key with its live entry's counts (`GhostHistory::
/// encode`); an empty history is written as before. 7: every candidate is
/// a lean cache, with its history or queue books, carrying hits or queue
/// slots, lifetime ids and idle roots; no shadow tree is nested any more.
pub const TREE_SNAPSHOT_VERSION: u32 = 7;

const HEADER_LEN: usize = 8 + 4 + 8 + 32;
const NO_PARENT: u64 = u64::MAX;

/// Whether a snapshot of `version` of a `policy` tree restores in this
/// build: each version wrote the policies whose state it did not change
/// exactly as the next one does, so a rank of an earlier build can still be
/// rebuilt from.
fn readable(version: u32, policy: Policy) -> bool {
    match version {
        TREE_SNAPSHOT_VERSION => true,
        2..=6 => policy != Policy::Ghost,
        1 => matches!(
            policy,
            Policy::Lru | Policy::Lfu | Policy::Fifo | Policy::Slru
        ),
        _ => false,
    }
}

impl PrefixTree {
    /// SHA-256 of the canonical encoding of the replicated state.
    pub fn canonical_digest(&self) -> [u8; 32] {
        let mut body = Writer::default();
        self.encode_state(&mut body);
        Sha256::digest(body.bytes()).into()
    }

    /// The whole replicated state as versioned, checksummed bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut body = Writer::default();
        self.encode_state(&mut body);
        let body = body.into_bytes();
        let mut out = Writer::default();
        out.raw(MAGIC);
        out.u32(TREE_SNAPSHOT_VERSION);
        out.u64(body.len() as u64);
        out.raw(&Sha256::digest(&body));
        out.raw(&body);
        out.into_bytes()
    }

    /// Rebuilds a tree from `snapshot()` bytes. It has the same fast and
    /// canonical digests as the tree it was taken from and makes the same
    /// decisions from then on.
    pub fn restore(data: &[u8]) -> Result<Self, EvictError> {
        if data.len() < HEADER_LEN {
            return Err(corrupt(format!(
                "{} bytes is shorter than the {HEADER_LEN}-byte header",
                data.len()
            )));
        }
        let mut header = Reader::new(&data[..HEADER_LEN]);
        if header.bytes(8).map_err(corrupt)? != MAGIC {
            return Err(corrupt("bad magic (not a cpkv prefix tree snapshot)"));
        }
        let version = header.u32().map_err(corrupt)?;
        if !(1..=TREE_SNAPSHOT_VERSION).contains(&version) {
            return Err(corrupt(format!(
                "unsupported version {version} (this build reads 1 to {TREE_SNAPSHOT_VERSION})"
            )));
        }
        let body_len = header.u64().map_err(corrupt)?;
        let checksum = header.bytes(32).map_err(corrupt)?;
        let body = &data[HEADER_LEN..];
        if body.len() as u64 != body_len {
            return Err(corrupt(format!(
                "body is {} bytes, the header says {body_len}",
                body.len()
            )));
        }
        if Sha256::digest(body).as_slice() != checksum {
            return Err(corrupt("checksum mismatch (corrupted bytes)"));
        }
        let policy = policy_name(body).map_err(corrupt)?;
        if !readable(version, policy) {
            return Err(corrupt(format!(
                "a version {version} snapshot of a {} tree cannot be read by this build \
                 (its policy state changed since)",
                policy.name()
            )));
        }
        Self::rebuild(decode(body).map_err(corrupt)?).map_err(corrupt)
    }

    pub(crate) fn encode_state(&self, w: &mut Writer) {
        w.u64(self.page_size() as u64);
        w.str(self.policy().name());
        w.u64(self.clock());
        w.u64(self.floor());
        let (slots, free) = self.arena_parts();
        w.u64(slots.len() as u64);
        for (generation, node) in slots {
            w.u32(generation);
            w.u8(u8::from(node.is_some()));
            if let Some(node) = node {
                encode_node(w, node);
            }
        }
        w.u64(free.len() as u64);
        for &slot in free {
            w.u32(slot);
        }
        w.u64(self.roots_map().len() as u64);
        for (namespace, id) in self.roots_map() {
            w.u64(id.0);
            encode_namespace(w, namespace);
        }
        w.u64(self.idle_roots_map().len() as u64);
        for (id, since) in self.idle_roots_map() {
            w.u64(id.0);
            w.u64(*since);
        }
        self.ghost_history().encode(w);
        if self.policy() != Policy::Ghost {
            self.queue_state().encode(w);
        } else {
            // A ghost tree without shadows is a replica held against a lean
            // candidate in tests, never snapshotted.
            let chooser = self.chooser().expect("a ghost tree has its shadows");
            w.u8(1);
            chooser.encode(w);
            self.queue_state().encode(w);
        }
    }
}

fn corrupt(why: impl Into<String>) -> EvictError {
    EvictError::CorruptSnapshot(why.into())
}

fn encode_node(w: &mut Writer, n: &Node) {
    w.u64(n.parent.map_or(NO_PARENT, |p| p.0));
    w.u64s(&n.tokens);
    match &n.device {
        Some(pages) => {
            w.u8(1);
            w.u64s(pages);
        }
        None => w.u8(0),
    }
    match n.host {
        Some(key) => {
            w.u8(1);
            w.u64(key);
        }
        None => w.u8(0),
    }
    for value in [
        n.depth as u64,
        n.created,
        n.last_access,
        n.hits,
        n.locks,
        n.pins,
        n.order_word(),
    ] {
        w.u64(value);
    }
}

/// The policy a body names (its second field), read before the rest.
fn policy_name(body: &[u8]) -> Result<Policy, String> {
    let mut r = Reader::new(body);
    r.u64()?;
    r.str()?.parse().map_err(|e: EvictError| e.to_string())
}

fn decode(body: &[u8]) -> Result<Decoded, String> {
    let mut r = Reader::new(body);
    let decoded = decode_from(&mut r)?;
    if !r.is_empty() {
        return Err(format!("{} trailing bytes", r.remaining()));
    }
    Ok(decoded)
}

/// One tree's body from `r`.
fn decode_from(r: &mut Reader<'_>) -> Result<Decoded, String> {
    let r = &mut *r;
    let page_size = usize::try_from(r.u64()?)
        .ok()
        .filter(|p| (1..=MAX_PAGE_SIZE).contains(p))
        .ok_or("page_size out of range")?;
    let policy: Policy = r.str()?.parse().map_err(|e: EvictError| e.to_string())?;
    let (clock, floor) = (r.u64()?, r.u64()?);
    let slot_count = r.len(5)?;
    let mut slots = Vec::with_capacity(slot_count);
    for _ in 0..slot_count {
        let generation = r.u32()?;
        let node = match r.u8()? {
            0 => None,
            1 => Some(decode_node(r)?),
            flag => return Err(format!("bad slot flag {flag}")),
        };
        slots.push((generation, node));
    }
    let free_count = r.len(4)?;
    let free = (0..free_count).map(|_| r.u32()).collect::<Result<_, _>>()?;
    let mut roots = BTreeMap::new();
    for _ in 0..r.len(9)? {
        let id = NodeId(r.u64()?);
        let namespace = decode_namespace(r)?;
        if roots.insert(namespace.clone(), id).is_some() {
            return Err(format!("namespace {namespace} listed twice"));
        }
    }
    let mut idle_roots = BTreeMap::new();
    for _ in 0..r.len(16)? {
        let (id, since) = (NodeId(r.u64()?), r.u64()?);
        if idle_roots.insert(id, since).is_some() {
            return Err(format!("idle root {id} listed twice"));
        }
    }
    let ghost = crate::ghost_history::GhostHistory::decode(r)?;
    let queues;
    let mut chooser: Option<Box<dyn RankingChooser>> = None;
    if policy == Policy::Ghost {
        // 1: the shadows follow (0 was a shadow tree's fixed ranking, when
        // candidates were replica trees).
        match r.u8()? {
            1 => {
                let decoded = Shadows::decode(r, page_size)?;
                // The leader's queue state, when it is a queue policy.
                let leader = decoded.leader().queue_policy().unwrap_or(Policy::Ghost);
                queues = QueueState::decode(leader, r)?;
                chooser = Some(Box::new(decoded));
            }
            flag => return Err(format!("bad ghost shadow flag {flag}")),
        }
    } else {
        queues = QueueState::decode(policy, r)?;
    }
    Ok(Decoded {
        page_size,
        policy,
        clock,
        floor,
        slots,
        free,
        roots,
        idle_roots,
        ghost,
        queues,
        chooser,
    })
}

fn decode_node(r: &mut Reader<'_>) -> Result<Node, String> {
    let parent = match r.u64()? {
        NO_PARENT => None,
        id => Some(NodeId(id)),
    };
    let tokens = r.u64s()?;
    let device = match r.u8()? {
        0 => None,
        1 => Some(r.u64s()?),
        flag => return Err(format!("bad device flag {flag}")),
    };
    let host = match r.u8()? {
        0 => None,
        1 => Some(r.u64()?),
        flag => return Err(format!("bad host flag {flag}")),
    };
    let depth = usize::try_from(r.u64()?).map_err(|_| "depth out of range")?;
    let [created, last_access, hits, locks, pins, priority] =
        [r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?];
    Ok(Node {
        id: NodeId(0),
        parent,
        tokens,
        children: Children::default(),
        child_word: 0, // the tree sets it on rebuild
        device,
        host,
        device_children: 0,
        depth,
        created,
        last_access,
        hits,
        locks,
        pins,
        priority,
        queue_slot: 0, // the tree moves a queue policy's word here on rebuild
        tokens_hash: 0,
        digest_term: 0,
        indexed: None,
    })
}

#[cfg(test)]
mod tests {
    //! Same-clock divergence: two trees that differ in exactly one replicated
    //! field, at the same clock, must have different digests (fast and
    //! canonical). Each variant edits one field of decoded snapshot state and
    //! rebuilds; a variant the rebuild refuses as inconsistent proves nothing,
    //! so the test also requires the plain fields to be accepted.
    use super::*;
    use crate::ids::Tier;
    use crate::namespace::Namespace;

    fn busy_tree() -> PrefixTree {
        busy_tree_of(Policy::Ghost)
    }

    fn busy_tree_of(policy: Policy) -> PrefixTree {
        let mut t = PrefixTree::new(2, policy).unwrap();
        let a = Namespace::Default;
        let b = Namespace::Name("lora".into());
        let mut page = 0;
        for i in 0..40u64 {
            let tokens: Vec<u64> = (0..2 * (i % 5 + 1)).map(|k| (i % 7) * 100 + k).collect();
            let ns = if i % 3 == 0 { &b } else { &a };
            let m = t.match_prefix(&tokens, ns);
            let new = tokens.len() / 2 - m.device_pages.len();
            if t.device_pages() + new > 14 {
                t.evict(t.device_pages() + new - 14);
            }
            let m = t.match_prefix(&tokens, ns);
            let mut pages = m.device_pages.clone();
            pages.extend(page..page + (tokens.len() / 2 - pages.len()) as u64);
            page += 20;
            t.insert(&tokens, &pages, ns).unwrap();
        }
        // Host copies top-down for the first device leaves, one lock, one
        // host-only node, and ghost history from the evictions above.
        let leaves = t.eviction_order(Tier::Device);
        for (k, id) in leaves.iter().take(2).enumerate() {
            let mut path = vec![*id];
            while let Some(p) = t.node(*path.last().unwrap()).unwrap().parent() {
                path.push(p);
            }
            for node in path.iter().rev().skip(1) {
                if t.node(*node).unwrap().host_key().is_none() {
                    t.set_host(*node, 1000 + node.0 + 100 * k as u64).unwrap();
                }
            }
        }
        t.match_prefix(&[9, 9], &Namespace::Id(5));
        t.lock(leaves[0]).unwrap();
        t.evict(8);
        t.evict_host(1);
        assert!(t.nodes().any(|n| n.host_key().is_some()));
        t.check_invariants().unwrap();
        t
    }

    fn decoded(t: &PrefixTree) -> Decoded {
        let mut w = Writer::default();
        t.encode_state(&mut w);
        decode(w.bytes()).unwrap()
    }

    type Edit = (&'static str, bool, fn(&mut Decoded) -> bool);

    fn first_node(d: &mut Decoded, pick: impl Fn(&Node) -> bool) -> Option<&mut Node> {
        d.slots
            .iter_mut()
            .filter_map(|(_, n)| n.as_mut())
            .find(|n| pick(n))
    }

    const EDITS: &[Edit] = &[
        ("hits", true, |d| {
            first_node(d, |n| n.parent.is_some())
                .map(|n| n.hits += 1)
                .is_some()
        }),
        ("last_access", true, |d| {
            first_node(d, |n| n.parent.is_some())
                .map(|n| n.last_access += 1)
                .is_some()
        }),
        ("created", true, |d| {
            first_node(d, |n| n.parent.is_some())
                .map(|n| n.created += 1)
                .is_some()
        }),
        ("priority", true, |d| {
            first_node(d, |n| n.parent.is_some())
                .map(|n| n.priority ^= 1)
                .is_some()
        }),
        ("root created", true, |d| {
            first_node(d, |n| n.parent.is_none())
                .map(|n| n.created += 1)
                .is_some()
        }),
        ("device page", true, |d| {
            first_node(d, |n| n.device.is_some())
                .map(|n| n.device.as_mut().unwrap()[0] = 999_999)
                .is_some()
        }),
        ("host key", true, |d| {
            first_node(d, |n| n.host.is_some())
                .map(|n| n.host = Some(777_777))
                .is_some()
        }),
        ("a token", true, |d| {
            first_node(d, |n| n.parent.is_some() && n.tokens.len() > 1)
                .map(|n| *n.tokens.last_mut().unwrap() += 1_000_000)
                .is_some()
        }),
        ("pins without locks (inconsistent)", false, |d| {
            first_node(d, |n| n.parent.is_some())
                .map(|n| n.pins += 1)
                .is_some()
        }),
        ("floor", true, |d| {
            d.floor += 1;
            true
        }),
        ("idle root since", true, |d| {
            d.idle_roots.values_mut().next().map(|s| *s += 1).is_some()
        }),
        ("free slot generation", true, |d| {
            let Some(&slot) = d.free.first() else {
                return false;
            };
            d.slots[slot as usize].0 += 1;
            true
        }),
        ("free list order", true, |d| {
            if d.free.len() < 2 {
                return false;
            }
            d.free.swap(0, 1);
            true
        }),
        ("policy", true, |d| {
            // Another policy, without this one's own state.
            d.policy = Policy::Lru;
            d.queues = QueueState::new(Policy::Lru);
            d.chooser = None;
            true
        }),
    ];

    /// The new policies' own state, edited one byte at a time in the encoded
    /// body (their queues, positions, ARC target, ghost lists, and ghost's
    /// shadows: leader, scores, counters and every byte of each shadow
    /// tree): each edit is refused or moves both digests.
    #[test]
    fn every_byte_of_policy_state_moves_both_digests() {
        for policy in [Policy::Arc, Policy::S3fifo, Policy::Ghost] {
            let t = busy_tree_of(policy);
            let mut w = Writer::default();
            t.encode_state(&mut w);
            let body = w.into_bytes();
            let mut tail = Writer::default();
            t.queue_state().encode(&mut tail);
            if let Some(shadows) = t.chooser() {
                tail.u8(1);
                shadows.encode(&mut tail);
                let (nodes, _) = shadows.memory();
                assert!(nodes > 3, "{policy:?}: the shadows hold content");
            } else {
                assert!(
                    t.queue_state().remembered_pages() > 0,
                    "{policy:?}: the ghost lists hold content"
                );
            }
            let start = body.len() - tail.bytes().len();
            assert_eq!(&body[start..], tail.bytes(), "{policy:?}: the tail is last");
            let (mut accepted, mut refused) = (0, 0);
            for at in start..body.len() {
                for bit in [0, 5] {
                    let mut edited = body.clone();
                    edited[at] ^= 1 << bit;
                    let Ok(Ok(changed)) = decode(&edited).map(PrefixTree::rebuild) else {
                        refused += 1;
                        continue;
                    };
                    accepted += 1;
                    assert_ne!(
                        changed.digest(),
                        t.digest(),
                        "{policy:?}: fast digest blind to byte {} bit {bit}",
                        at - start
                    );
                    assert_ne!(changed.canonical_digest(), t.canonical_digest());
                }
            }
            assert!(
                accepted > refused / 4,
                "{policy:?}: {accepted} accepted, {refused} refused"
            );
        }
    }

    #[test]
    fn the_new_policies_fields_move_both_digests_at_the_same_clock() {
        for policy in [Policy::Arc, Policy::S3fifo] {
            let t = busy_tree_of(policy);
            for (name, must_accept, edit) in EDITS {
                let mut d = decoded(&t);
                if !edit(&mut d) {
                    continue;
                }
                match PrefixTree::rebuild(d) {
                    Ok(changed) => {
                        assert_ne!(changed.digest(), t.digest(), "{policy:?} {name}");
                        assert_ne!(changed.canonical_digest(), t.canonical_digest());
                    }
                    Err(why) => assert!(!must_accept, "{policy:?} {name}: refused ({why})"),
                }
            }
        }
    }

    #[test]
    fn every_replicated_field_moves_both_digests_at_the_same_clock() {
        let t = busy_tree();
        let base = PrefixTree::rebuild(decoded(&t)).unwrap();
        assert_eq!(base.digest(), t.digest());
        assert_eq!(base.canonical_digest(), t.canonical_digest());
        for (name, must_accept, edit) in EDITS {
            let mut d = decoded(&t);
            assert!(
                edit(&mut d),
                "{name}: the test tree lacks what this edit changes"
            );
            match PrefixTree::rebuild(d) {
                Ok(changed) => {
                    assert_eq!(changed.clock(), t.clock(), "{name}");
                    assert_ne!(
                        changed.digest(),
                        t.digest(),
                        "{name}: fast digest blind to it"
                    );
                    assert_ne!(
                        changed.canonical_digest(),
                        t.canonical_digest(),
                        "{name}: canonical digest blind to it"
                    );
                }
                Err(why) => assert!(!must_accept, "{name}: refused ({why})"),
            }
        }
    }

    #[test]
    fn ghost_fields_move_the_digest() {
        let t = busy_tree();
        assert!(
            t.ghost_history().pages() > 0,
            "the test tree has ghost history"
        );
        let mut w = Writer::default();
        t.ghost_history().encode(&mut w);
        let bytes = w.into_bytes();
        // Every u64 word of the ghost encoding, bumped alone: the rebuilt
        // history either is refused or digests differently.
        for word in 0..bytes.len() / 8 {
            let mut edited = bytes.clone();
            edited[word * 8] ^= 1;
            let Ok(g) = crate::ghost_history::GhostHistory::decode(&mut Reader::new(&edited))
            else {
                continue;
            };
            assert_ne!(g.digest(), t.ghost_history().digest(), "ghost word {word}");
        }
    }
}
