//! Deterministic first-fit page allocator for a shared host (L2) KV pool.
