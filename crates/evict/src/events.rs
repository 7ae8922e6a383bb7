//! Residency events for the engine: what entered or left each tier, as page
//! ranges (page offsets from the namespace root). Drained by `take_events`.

use crate::ids::{HostKey, NodeId, PageId};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Device pages `pages` now hold pages `start..start + pages.len()` of the
    /// prefix ending at `node`.
    DeviceStored {
        node: NodeId,
        start: usize,
        pages: Vec<PageId>,
    },
    /// Device pages `pages` (pages `start..`) were evicted from `node`.
    DeviceRemoved {
        node: NodeId,
        start: usize,
        pages: Vec<PageId>,
    },
    /// Host object `key` now holds pages `start..start + num_pages`.
    HostStored {
        node: NodeId,
        start: usize,
        num_pages: usize,
        key: HostKey,
    },
    /// The host copy of pages `start..start + num_pages` was dropped.
    HostRemoved {
        node: NodeId,
        start: usize,
        num_pages: usize,
        key: HostKey,
    },
}
