//! What the cache's calls hand back: plain data the Python side turns into
//! copies. Every field is replicated (equal on every rank).

use cpkv_evict::{NodeId, PageId};

/// A lookup's result; `node` is locked when `locked` (undo with `unlock`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// Tokens matched on device (a multiple of the page size).
    pub device_tokens: usize,
    /// Tokens matched counting host-only nodes too.
    pub host_tokens: usize,
    /// Device pages of the device-matched prefix, in order.
    pub device_pages: Vec<PageId>,
    /// Deepest node of the device match.
    pub device_node: NodeId,
    /// Deepest node of the whole match (host-only nodes included).
    pub node: NodeId,
    /// Whether `node` was locked (a match that ends at a root is not).
    pub locked: bool,
}

impl Lookup {
    /// Pages a load-back would bring.
    pub fn host_only_pages(&self, page_size: usize) -> usize {
        (self.host_tokens - self.device_tokens) / page_size
    }
}

/// One host-only node to bring back: row `host_pages[i]` of the slab goes
/// to logical device page `device_pages[i]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadRun {
    pub node: NodeId,
    pub device_pages: Vec<PageId>,
    pub host_pages: Vec<u64>,
}

/// A load-back: host-only nodes top-down. The device pages are held by the
/// caller until it passes them to `insert` (or `free`s them).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoadPlan {
    pub runs: Vec<LoadRun>,
}

impl LoadPlan {
    pub fn num_pages(&self) -> usize {
        self.runs.iter().map(|r| r.device_pages.len()).sum()
    }

    /// Every device page of the plan, in token order.
    pub fn device_pages(&self) -> Vec<PageId> {
        self.runs
            .iter()
            .flat_map(|r| r.device_pages.iter().copied())
            .collect()
    }
}

/// A write-through backup in flight: copy device page `device_pages[i]` to
/// slab row `host_pages[i]`; the node is committed once every rank is done
/// with every ticket up to this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backup {
    pub ticket: u64,
    pub node: NodeId,
    pub device_pages: Vec<PageId>,
    pub host_pages: Vec<u64>,
}

/// What `insert` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsertOutcome {
    /// The node that ends at the last inserted page.
    pub node: NodeId,
    /// Leading pages that were already cached on device.
    pub cached_pages: usize,
    /// Caller pages the tree did not adopt (duplicates of cached pages),
    /// already returned to the free pool.
    pub freed_pages: Vec<PageId>,
    /// Backups reserved for the inserted path, top-down.
    pub backups: Vec<Backup>,
    /// Pages whose backup was skipped because the host tier was full even
    /// after evicting everything it could.
    pub skipped_pages: usize,
}

/// What `commit` did, in ticket order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommitOutcome {
    pub committed: Vec<u64>,
    /// Tickets that could not be committed (their parent lost its backup)
    /// and were released instead.
    pub aborted: Vec<u64>,
}
