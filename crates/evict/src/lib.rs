//! Replicated prefix tree with a logical clock and O(log n) deterministic eviction.
