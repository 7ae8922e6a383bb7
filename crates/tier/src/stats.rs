//! Counters a dashboard can read. Replicated (every rank counts the same
//! decisions) but not part of the digest: they describe, they do not decide.

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    pub lookups: u64,
    pub lookup_tokens: u64,
    pub device_hit_tokens: u64,
    pub host_hit_tokens: u64,
    pub allocations: u64,
    pub allocation_misses: u64,
    pub device_victims: u64,
    pub device_evicted_pages: u64,
    /// Device victims that stayed in the tree as host-only nodes.
    pub demoted_to_host: u64,
    pub host_victims: u64,
    pub host_evicted_pages: u64,
    pub loads: u64,
    pub load_misses: u64,
    pub loaded_pages: u64,
    pub backups_reserved: u64,
    pub backup_pages: u64,
    pub backups_committed: u64,
    pub backups_aborted: u64,
    pub backups_skipped: u64,
    pub skipped_pages: u64,
    /// Backups that did not fit and made admission evict host objects.
    pub admission_evictions: u64,
    pub commits: u64,
}
