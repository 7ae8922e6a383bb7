//! Operation counters and per-payload occupancy.

/// Counts of successful operations since construction (restored by a snapshot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Reserves that placed an object.
    pub reserves: u64,
    /// Reserves that found too few free pages (nothing changed).
    pub misses: u64,
    /// Objects released.
    pub releases: u64,
    pub splits: u64,
    /// Objects that became committed (repeat commits are not counted).
    pub commits: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PayloadStats {
    pub capacity: u64,
    pub used: u64,
    pub free: u64,
    pub free_extents: usize,
    pub largest_free_extent: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stats {
    pub counters: Counters,
    /// Live objects.
    pub objects: usize,
    /// Per payload, in construction order.
    pub payloads: Vec<PayloadStats>,
}
