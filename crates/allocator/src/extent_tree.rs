//! An ordered index of disjoint extents keyed by start address, augmented with
//! the largest extent length under every child, so first fit ("the
//! lowest-addressed extent holding at least n pages") follows one
//! root-to-leaf path.
//!
//! A B+tree: leaves hold up to `CAP` extents sorted by start; internal nodes
//! hold, per child, the smallest start and the largest length beneath it.
//! Nodes split above `CAP` and merge or rebalance with a sibling below `MIN`,
//! so the depth is O(log F) for F extents with a large base (nodes hold 12
//! to 48 entries: typically 3 levels for ten thousand extents, 5 for a
//! million) and every node is a short contiguous scan. The shape depends only on the operation sequence, never
//! on anything random, and no decision reads the shape anyway.

use crate::extent::Extent;

/// 48 measured fastest on the bench streams (32: 15% slower with a few
/// hundred free extents; 64: no faster).
const CAP: usize = 48;
const MIN: usize = CAP / 4;

/// A fixed-capacity inline vector (room for one entry over `CAP`, so a node
/// can overflow before it splits): nodes keep their entries in place, with no
/// pointer to chase per level.
#[derive(Clone, Copy, Debug)]
struct Slots<T: Copy + Default> {
    len: usize,
    items: [T; CAP + 1],
}

impl<T: Copy + Default> Default for Slots<T> {
    fn default() -> Self {
        Slots {
            len: 0,
            items: [T::default(); CAP + 1],
        }
    }
}

impl<T: Copy + Default> std::ops::Deref for Slots<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.items[..self.len]
    }
}

impl<T: Copy + Default> std::ops::DerefMut for Slots<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.items[..self.len]
    }
}

impl<T: Copy + Default> Slots<T> {
    fn from_slice(items: &[T]) -> Self {
        let mut out = Slots::default();
        out.items[..items.len()].copy_from_slice(items);
        out.len = items.len();
        out
    }

    fn insert(&mut self, at: usize, value: T) {
        self.items.copy_within(at..self.len, at + 1);
        self.items[at] = value;
        self.len += 1;
    }

    fn remove(&mut self, at: usize) -> T {
        let value = self.items[at];
        self.items.copy_within(at + 1..self.len, at);
        self.len -= 1;
        value
    }

    fn split_off(&mut self, at: usize) -> Self {
        let right = Slots::from_slice(&self.items[at..self.len]);
        self.len = at;
        right
    }

    fn extend(&mut self, other: &Self) {
        self.items[self.len..self.len + other.len].copy_from_slice(other);
        self.len += other.len;
    }
}

/// How many of the sorted `keys` are below `key`: a scan that stops at the
/// first key at or above it. First fit keeps the busiest extents at low
/// addresses, at the front of their nodes, so the scan is usually short; it
/// measured faster than a branch-free count of the whole node (which x86-64's
/// baseline SSE2, lacking a 64-bit compare, cannot vectorise) and than a
/// binary search's unpredictable branches.
fn count_below(keys: &[u64], key: u64) -> usize {
    keys.iter().position(|&k| k >= key).unwrap_or(keys.len())
}

/// How many of the sorted `keys` are at most `key` (the same scan).
fn count_at_most(keys: &[u64], key: u64) -> usize {
    keys.iter().position(|&k| k > key).unwrap_or(keys.len())
}

/// What `ExtentTree::give_back` did with a returned extent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GiveBack {
    /// Neither neighbour touches it: it is a new free extent.
    Inserted,
    /// Merged into the free extent before it (given as it was).
    MergedBefore(Extent),
    /// Merged into the free extent after it (given as it was).
    MergedAfter(Extent),
    /// Joined the extents before and after it into one.
    Joined(Extent, Extent),
}

#[derive(Clone, Debug, Default)]
struct Node {
    leaf: bool,
    /// The largest of `vals`, kept up to date so a parent reads it in O(1);
    /// rescanned only when the largest entry shrinks or leaves.
    max: u64,
    /// Leaf: extent starts. Internal: the smallest start under each child.
    keys: Slots<u64>,
    /// Leaf: extent lengths. Internal: the largest length under each child.
    vals: Slots<u64>,
    /// Internal only: child node ids.
    children: Slots<u32>,
}

impl Node {
    fn leaf() -> Self {
        Node {
            leaf: true,
            ..Node::default()
        }
    }

    fn max(&self) -> u64 {
        self.max
    }

    fn recompute_max(&mut self) {
        self.max = self.vals.iter().copied().max().unwrap_or(0);
    }

    fn set_val(&mut self, i: usize, val: u64) {
        let old = std::mem::replace(&mut self.vals[i], val);
        if val >= self.max {
            self.max = val;
        } else if old == self.max {
            self.recompute_max();
        }
    }

    fn insert_entry(&mut self, i: usize, key: u64, val: u64) {
        self.keys.insert(i, key);
        self.vals.insert(i, val);
        self.max = self.max.max(val);
    }

    fn remove_entry(&mut self, i: usize) -> (u64, u64) {
        let (key, val) = (self.keys.remove(i), self.vals.remove(i));
        if val == self.max {
            self.recompute_max();
        }
        (key, val)
    }

    /// The child (internal) or slot (leaf) whose range holds `key`: the last
    /// entry with a key not above `key`, or the first.
    fn route(&self, key: u64) -> usize {
        count_at_most(&self.keys, key).saturating_sub(1)
    }
}

#[derive(Clone, Debug)]
pub struct ExtentTree {
    nodes: Vec<Node>,
    vacant: Vec<u32>,
    root: u32,
}

impl Default for ExtentTree {
    fn default() -> Self {
        ExtentTree {
            nodes: vec![Node::leaf()],
            vacant: Vec::new(),
            root: 0,
        }
    }
}

impl ExtentTree {
    pub fn max_len(&self) -> u64 {
        self.node(self.root).max()
    }

    /// The lowest-addressed extent.
    pub fn first(&self) -> Option<Extent> {
        let mut node = self.node(self.root);
        while !node.leaf {
            node = self.node(node.children[0]);
        }
        Some(Extent::new(*node.keys.first()?, node.vals[0]))
    }

    /// The extent with the largest start below `addr`.
    pub fn last_before(&self, addr: u64) -> Option<Extent> {
        let mut node = self.node(self.root);
        loop {
            // Keys are subtree minimums: the last child starting below `addr`
            // holds the answer, and later children start at or above it.
            let i = count_below(&node.keys, addr).checked_sub(1)?;
            if node.leaf {
                return Some(Extent::new(node.keys[i], node.vals[i]));
            }
            node = self.node(node.children[i]);
        }
    }

    /// The extent with the smallest start above `addr`.
    pub fn first_after(&self, addr: u64) -> Option<Extent> {
        let mut node = self.node(self.root);
        let mut fallback = None;
        loop {
            let i = count_at_most(&node.keys, addr);
            if node.leaf {
                return match node.keys.get(i) {
                    Some(&start) => Some(Extent::new(start, node.vals[i])),
                    None => fallback.and_then(|c| self.first_under(c)),
                };
            }
            // Descend into the child that may hold `addr`; the next child's
            // first extent is the answer if that child has nothing above.
            let routed = i.saturating_sub(1);
            if routed + 1 < node.children.len() {
                fallback = Some(node.children[routed + 1]);
            }
            node = self.node(node.children[routed]);
        }
    }

    /// Every extent in address order.
    pub fn extents(&self) -> Vec<Extent> {
        let mut out = Vec::new();
        self.collect(self.root, &mut out);
        out
    }

    /// Hands every extent to `each` in address order and empties the tree.
    pub fn drain(&mut self, mut each: impl FnMut(Extent)) {
        self.walk(self.root, &mut each);
        self.nodes.truncate(1);
        self.vacant.clear();
        self.root = 0;
        let root = &mut self.nodes[0];
        root.leaf = true;
        root.max = 0;
        root.keys.len = 0;
        root.vals.len = 0;
        root.children.len = 0;
    }

    fn walk(&self, id: u32, each: &mut impl FnMut(Extent)) {
        let node = self.node(id);
        if node.leaf {
            for (&start, &len) in node.keys.iter().zip(node.vals.iter()) {
                each(Extent::new(start, len));
            }
        } else {
            node.children.iter().for_each(|&c| self.walk(c, each));
        }
    }

    /// Adds an extent whose start is not present.
    pub fn insert(&mut self, extent: Extent) {
        if let Some(sibling) = self.insert_at(self.root, extent) {
            let old = self.root;
            let mut root = Node {
                leaf: false,
                max: 0,
                keys: Slots::from_slice(&[self.node(old).keys[0], self.node(sibling).keys[0]]),
                vals: Slots::from_slice(&[self.node(old).max(), self.node(sibling).max()]),
                children: Slots::from_slice(&[old, sibling]),
            };
            root.recompute_max();
            self.root = self.alloc(root);
        }
    }

    /// Removes the extent starting at `start` (which must exist); returns it.
    pub fn remove(&mut self, start: u64) -> Extent {
        let removed = self.remove_at(self.root, start);
        self.collapse_root();
        removed
    }

    /// Takes `len` pages from the front of the lowest-addressed extent that
    /// holds them, in one descent; returns that extent as it was.
    pub fn take_first_fit(&mut self, len: u64) -> Option<Extent> {
        if self.max_len() < len {
            return None;
        }
        let found = self.take_fit_at(self.root, len);
        self.collapse_root();
        Some(found)
    }

    /// Returns `extent` (disjoint from every free extent), merging it with
    /// the free extents that end where it starts and start where it ends.
    /// One descent when both neighbours share its leaf (the common case).
    pub fn give_back(&mut self, extent: Extent) -> GiveBack {
        if let Some(outcome) = self.give_back_at(self.root, extent, true, true) {
            self.collapse_root();
            return outcome;
        }
        // A neighbour may sit in the next leaf over: look both up first.
        let before = self
            .last_before(extent.start)
            .filter(|p| p.end() == extent.start);
        let after = self
            .first_after(extent.start)
            .filter(|n| n.start == extent.end());
        match (before, after) {
            (Some(p), Some(n)) => {
                self.remove(n.start);
                self.replace(p.start, Extent::new(p.start, p.len + extent.len + n.len));
                GiveBack::Joined(p, n)
            }
            (Some(p), None) => {
                self.replace(p.start, Extent::new(p.start, p.len + extent.len));
                GiveBack::MergedBefore(p)
            }
            (None, Some(n)) => {
                self.replace(n.start, Extent::new(extent.start, extent.len + n.len));
                GiveBack::MergedAfter(n)
            }
            (None, None) => {
                self.insert(extent);
                GiveBack::Inserted
            }
        }
    }

    /// Replaces the extent starting at `start` by `new`; the caller
    /// guarantees `new` keeps the address order.
    pub fn replace(&mut self, start: u64, new: Extent) {
        self.replace_at(self.root, start, new);
    }

    /// Checks order, summaries and fill; returns what is wrong.
    pub fn check(&self) -> Result<(), String> {
        let extents = self.extents();
        if extents.windows(2).any(|w| w[0].start >= w[1].start) {
            return Err("extent tree out of address order".into());
        }
        self.check_node(self.root, true).map(|_| ())
    }

    fn check_node(&self, id: u32, is_root: bool) -> Result<usize, String> {
        let node = self.node(id);
        let scanned = node.vals.iter().copied().max().unwrap_or(0);
        if node.keys.len() != node.vals.len() || node.keys.len() > CAP || node.max != scanned {
            return Err(format!("node {id} has a bad fill"));
        }
        if !is_root && node.keys.len() < MIN {
            return Err(format!("node {id} is underfull"));
        }
        if node.leaf {
            return Ok(1);
        }
        let mut depth = None;
        for (i, &child) in node.children.iter().enumerate() {
            let c = self.node(child);
            if c.keys.first() != Some(&node.keys[i]) || c.max() != node.vals[i] {
                return Err(format!("node {id} has a stale summary for child {child}"));
            }
            let d = self.check_node(child, false)?;
            if depth.is_some_and(|e| e != d) {
                return Err(format!("node {id} has children at different depths"));
            }
            depth = Some(d);
        }
        Ok(depth.unwrap_or(0) + 1)
    }

    fn node(&self, id: u32) -> &Node {
        &self.nodes[id as usize]
    }

    fn node_mut(&mut self, id: u32) -> &mut Node {
        &mut self.nodes[id as usize]
    }

    fn alloc(&mut self, node: Node) -> u32 {
        match self.vacant.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                u32::try_from(self.nodes.len() - 1).expect("fewer than 2^32 tree nodes")
            }
        }
    }

    fn free(&mut self, id: u32) {
        *self.node_mut(id) = Node::default();
        self.vacant.push(id);
    }

    fn first_under(&self, mut id: u32) -> Option<Extent> {
        loop {
            let node = self.node(id);
            if node.leaf {
                return Some(Extent::new(*node.keys.first()?, node.vals[0]));
            }
            id = node.children[0];
        }
    }

    fn collect(&self, id: u32, out: &mut Vec<Extent>) {
        let node = self.node(id);
        if node.leaf {
            out.extend(
                node.keys
                    .iter()
                    .zip(node.vals.iter())
                    .map(|(&s, &l)| Extent::new(s, l)),
            );
        } else {
            node.children.iter().for_each(|&c| self.collect(c, out));
        }
    }

    /// Refreshes the summary of child `i` of `id` from the child itself.
    fn refresh(&mut self, id: u32, i: usize) {
        let child = self.node(id).children[i];
        let (min, max) = {
            let c = self.node(child);
            (c.keys.first().copied(), c.max())
        };
        let node = self.node_mut(id);
        if let Some(min) = min {
            node.keys[i] = min;
        }
        node.set_val(i, max);
    }

    /// Inserts under `id`; returns a new right sibling of `id` if it split.
    fn insert_at(&mut self, id: u32, extent: Extent) -> Option<u32> {
        if self.node(id).leaf {
            let node = self.node_mut(id);
            let at = count_below(&node.keys, extent.start);
            node.insert_entry(at, extent.start, extent.len);
        } else {
            let i = self.node(id).route(extent.start);
            let child = self.node(id).children[i];
            let split = self.insert_at(child, extent);
            self.refresh(id, i);
            if let Some(sibling) = split {
                let (key, max) = (self.node(sibling).keys[0], self.node(sibling).max());
                let node = self.node_mut(id);
                node.insert_entry(i + 1, key, max);
                node.children.insert(i + 1, sibling);
            }
        }
        (self.node(id).keys.len() > CAP).then(|| self.split_off_half(id))
    }

    /// Moves the upper half of node `id` into a new node; returns its id.
    fn split_off_half(&mut self, id: u32) -> u32 {
        let node = self.node_mut(id);
        let half = node.keys.len() / 2;
        let mut right = Node {
            leaf: node.leaf,
            max: 0,
            keys: node.keys.split_off(half),
            vals: node.vals.split_off(half),
            children: if node.leaf {
                Slots::default()
            } else {
                node.children.split_off(half)
            },
        };
        node.recompute_max();
        right.recompute_max();
        self.alloc(right)
    }

    fn remove_at(&mut self, id: u32, start: u64) -> Extent {
        let i = self.node(id).route(start);
        if self.node(id).leaf {
            let node = self.node_mut(id);
            assert_eq!(
                node.keys.get(i),
                Some(&start),
                "no extent starts at {start}"
            );
            let (_, len) = node.remove_entry(i);
            return Extent::new(start, len);
        }
        let child = self.node(id).children[i];
        let removed = self.remove_at(child, start);
        self.settle(id, i);
        removed
    }

    /// `give_back` within the leaf under `id` that `extent` routes to, with
    /// the summaries on the path fixed on the way back; `None` (nothing
    /// changed) if a neighbour could lie in another leaf (`extent` would be
    /// the leaf's first or last entry) or the leaf would overflow.
    /// `leftmost`/`rightmost`: `id` is the first/last node of its level, so
    /// no extent lies before/after its entries in another leaf (the lowest
    /// free extent, the one first fit takes most often, sits at a leaf edge).
    fn give_back_at(
        &mut self,
        id: u32,
        extent: Extent,
        leftmost: bool,
        rightmost: bool,
    ) -> Option<GiveBack> {
        let node = self.node(id);
        if !node.leaf {
            let i = node.route(extent.start);
            let child = node.children[i];
            let (leftmost, rightmost) = (
                leftmost && i == 0,
                rightmost && i + 1 == node.children.len(),
            );
            let outcome = self.give_back_at(child, extent, leftmost, rightmost)?;
            self.settle(id, i);
            return Some(outcome);
        }
        let at = count_below(&node.keys, extent.start);
        if (at == 0 && !leftmost) || (at == node.keys.len() && !rightmost) {
            return None;
        }
        let before = at
            .checked_sub(1)
            .map(|b| Extent::new(node.keys[b], node.vals[b]));
        let after = (at < node.keys.len()).then(|| Extent::new(node.keys[at], node.vals[at]));
        let touches_before = before.is_some_and(|b| b.end() == extent.start);
        let touches_after = after.is_some_and(|a| a.start == extent.end());
        if !touches_before && !touches_after && node.keys.len() == CAP {
            return None;
        }
        // Only read below when the matching `touches_*` is true.
        let before = before.unwrap_or(extent);
        let after = after.unwrap_or(extent);
        let node = self.node_mut(id);
        Some(match (touches_before, touches_after) {
            (true, true) => {
                node.remove_entry(at);
                node.set_val(at - 1, before.len + extent.len + after.len);
                GiveBack::Joined(before, after)
            }
            (true, false) => {
                node.set_val(at - 1, before.len + extent.len);
                GiveBack::MergedBefore(before)
            }
            (false, true) => {
                node.keys[at] = extent.start;
                node.set_val(at, extent.len + after.len);
                GiveBack::MergedAfter(after)
            }
            (false, false) => {
                node.insert_entry(at, extent.start, extent.len);
                GiveBack::Inserted
            }
        })
    }

    fn take_fit_at(&mut self, id: u32, len: u64) -> Extent {
        let node = self.node(id);
        let i = node
            .vals
            .iter()
            .position(|&v| v >= len)
            .expect("the subtree maximum promised a fit");
        if node.leaf {
            let found = Extent::new(node.keys[i], node.vals[i]);
            let node = self.node_mut(id);
            if found.len == len {
                node.remove_entry(i);
            } else {
                // Shrinking from the front keeps the extent between its neighbours.
                node.keys[i] += len;
                node.set_val(i, found.len - len);
            }
            return found;
        }
        let child = node.children[i];
        let found = self.take_fit_at(child, len);
        self.settle(id, i);
        found
    }

    /// After child `i` of `id` changed: rebalance it if it became underfull,
    /// else refresh its summary.
    fn settle(&mut self, id: u32, i: usize) {
        let child = self.node(id).children[i];
        if self.node(child).keys.len() < MIN && self.node(id).children.len() > 1 {
            self.rebalance(id, i);
        } else {
            self.refresh(id, i);
        }
    }

    /// Replaces an internal root that has a single child by that child.
    fn collapse_root(&mut self) {
        let root = self.node(self.root);
        if !root.leaf && root.children.len() == 1 {
            let child = root.children[0];
            self.free(self.root);
            self.root = child;
        }
    }

    /// Merges underfull child `i` of `id` with a sibling, or shares the
    /// sibling's entries evenly when both do not fit in one node.
    fn rebalance(&mut self, id: u32, i: usize) {
        let (a, b) = if i + 1 < self.node(id).children.len() {
            (i, i + 1)
        } else {
            (i - 1, i)
        };
        let (left, right) = (self.node(id).children[a], self.node(id).children[b]);
        if self.node(left).keys.len() + self.node(right).keys.len() <= CAP {
            let moved = std::mem::take(self.node_mut(right));
            let l = self.node_mut(left);
            l.keys.extend(&moved.keys);
            l.vals.extend(&moved.vals);
            l.children.extend(&moved.children);
            l.recompute_max();
            self.free(right);
            let node = self.node_mut(id);
            node.remove_entry(b);
            node.children.remove(b);
            self.refresh(id, a);
        } else {
            // Too many for one node: share them evenly (each half >= CAP / 2).
            let (l, r) = (self.node(left), self.node(right));
            let keys: Vec<u64> = l.keys.iter().chain(r.keys.iter()).copied().collect();
            let vals: Vec<u64> = l.vals.iter().chain(r.vals.iter()).copied().collect();
            let children: Vec<u32> = l
                .children
                .iter()
                .chain(r.children.iter())
                .copied()
                .collect();
            let (leaf, half) = (l.leaf, keys.len() / 2);
            for (node_id, range) in [(left, 0..half), (right, half..keys.len())] {
                let mut node = Node {
                    leaf,
                    max: 0,
                    keys: Slots::from_slice(&keys[range.clone()]),
                    vals: Slots::from_slice(&vals[range.clone()]),
                    children: if leaf {
                        Slots::default()
                    } else {
                        Slots::from_slice(&children[range])
                    },
                };
                node.recompute_max();
                *self.node_mut(node_id) = node;
            }
            self.refresh(id, a);
            self.refresh(id, b);
        }
    }

    fn replace_at(&mut self, id: u32, start: u64, new: Extent) {
        let i = self.node(id).route(start);
        if self.node(id).leaf {
            let node = self.node_mut(id);
            assert_eq!(
                node.keys.get(i),
                Some(&start),
                "no extent starts at {start}"
            );
            node.keys[i] = new.start;
            node.set_val(i, new.len);
            return;
        }
        let child = self.node(id).children[i];
        self.replace_at(child, start, new);
        self.refresh(id, i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inserts clustered in one window while removals drain a neighbouring
    /// one: underfull nodes next to full siblings (redistribution), merges,
    /// and root growth and collapse.
    #[test]
    fn clustered_churn_rebalances() {
        use std::collections::BTreeMap;
        let mut tree = ExtentTree::default();
        let mut map = BTreeMap::new();
        let mut x = 99u64;
        let mut next = || {
            x = cpkv_hash::mix64(x);
            x
        };
        for phase in 0..60u64 {
            let window = next() % 20 * 400;
            for _ in 0..300 {
                let start = (window + next() % 400) * 2;
                if phase % 3 == 2 || map.contains_key(&start) {
                    if let Some((&s, _)) = map.range(start..).next() {
                        assert_eq!(tree.remove(s).start, s);
                        map.remove(&s);
                    }
                } else {
                    let len = 1 + next() % 40;
                    map.insert(start, len);
                    tree.insert(Extent::new(start, len));
                }
            }
            tree.check().unwrap();
            let expect: Vec<Extent> = map.iter().map(|(&s, &l)| Extent::new(s, l)).collect();
            assert_eq!(tree.extents(), expect);
            assert_eq!(tree.max_len(), map.values().copied().max().unwrap_or(0));
        }
        for s in map.keys().copied().collect::<Vec<_>>() {
            tree.remove(s);
        }
        tree.check().unwrap();
        assert_eq!(tree.first(), None);
    }

    /// Returning random page runs to a fragmented tree against a BTreeMap
    /// that coalesces by hand: exercises the one-leaf path and the fallback
    /// for neighbours in another leaf or a full leaf.
    #[test]
    fn give_back_matches_coalescing_model() {
        use std::collections::BTreeMap;
        let (mut tree, mut map) = (ExtentTree::default(), BTreeMap::new());
        // Every page of [0, 40000) starts used; give back random single pages
        // and short runs of used pages until everything is free.
        let mut used: Vec<u64> = (0..40_000).collect();
        let mut x = 7u64;
        let mut next = || {
            x = cpkv_hash::mix64(x);
            x
        };
        let mut step = 0;
        while !used.is_empty() {
            let page = used.swap_remove((next() % used.len() as u64) as usize);
            let extent = Extent::new(page, 1);
            let before = map
                .range(..page)
                .next_back()
                .map(|(&s, &l)| Extent::new(s, l))
                .filter(|p: &Extent| p.end() == page);
            let after = map.get(&(page + 1)).map(|&l| Extent::new(page + 1, l));
            let expect = match (before, after) {
                (Some(p), Some(n)) => GiveBack::Joined(p, n),
                (Some(p), None) => GiveBack::MergedBefore(p),
                (None, Some(n)) => GiveBack::MergedAfter(n),
                (None, None) => GiveBack::Inserted,
            };
            assert_eq!(tree.give_back(extent), expect, "page {page}");
            let start = before.map_or(page, |p| p.start);
            let len = before.map_or(0, |p| p.len) + 1 + after.map_or(0, |n| n.len);
            if let Some(n) = after {
                map.remove(&n.start);
            }
            map.insert(start, len);
            step += 1;
            if step % 499 == 0 {
                tree.check().unwrap();
                let want: Vec<Extent> = map.iter().map(|(&s, &l)| Extent::new(s, l)).collect();
                assert_eq!(tree.extents(), want);
            }
        }
        assert_eq!(tree.extents(), vec![Extent::new(0, 40_000)]);
        tree.check().unwrap();
    }

    /// Random inserts, removals and replacements against a BTreeMap, with the
    /// tree's own checks after every step.
    #[test]
    fn matches_btreemap() {
        use std::collections::BTreeMap;
        let mut tree = ExtentTree::default();
        let mut map = BTreeMap::new();
        let mut x = 12345u64;
        let mut next = || {
            x = cpkv_hash::mix64(x);
            x
        };
        for step in 0..20_000 {
            let start = next() % 4000 * 2;
            let grow = step % 5000 < 3000;
            if let Some(len) = map.get_mut(&start) {
                if next() % 3 == 0 {
                    *len = 1 + next() % 50;
                    tree.replace(start, Extent::new(start, *len));
                } else if !grow || next() % 2 == 0 {
                    assert_eq!(
                        tree.remove(start),
                        Extent::new(start, map.remove(&start).unwrap())
                    );
                }
            } else if grow || next() % 4 == 0 {
                let len = 1 + next() % 50;
                map.insert(start, len);
                tree.insert(Extent::new(start, len));
            }
            if step % 97 == 0 {
                tree.check().unwrap();
                let expect: Vec<Extent> = map.iter().map(|(&s, &l)| Extent::new(s, l)).collect();
                assert_eq!(tree.extents(), expect);
                let probe = next() % 8000;
                let before = map
                    .range(..probe)
                    .next_back()
                    .map(|(&s, &l)| Extent::new(s, l));
                let after = map
                    .range(probe + 1..)
                    .next()
                    .map(|(&s, &l)| Extent::new(s, l));
                assert_eq!(tree.last_before(probe), before, "probe {probe}");
                assert_eq!(tree.first_after(probe), after, "probe {probe}");
                assert_eq!(
                    tree.first(),
                    map.iter().next().map(|(&s, &l)| Extent::new(s, l))
                );
                let want = 1 + next() % 60;
                let fit = map
                    .iter()
                    .find(|(_, &l)| l >= want)
                    .map(|(&s, &l)| Extent::new(s, l));
                assert_eq!(tree.clone().take_first_fit(want), fit);
                assert_eq!(tree.max_len(), map.values().copied().max().unwrap_or(0));
            }
        }
    }
}
