//! What the examples read from a Mooncake trace.

/// The `hash_ids` of each line of a Mooncake trace, read without a JSON
/// library: the list after the `"hash_ids"` key.
pub fn requests(path: &str) -> Vec<Vec<u64>> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let start = line.find("\"hash_ids\"").expect("a hash_ids key");
            let open = start + line[start..].find('[').expect("a list");
            let close = open + line[open..].find(']').expect("a closed list");
            line[open + 1..close]
                .split(',')
                .filter(|s| !s.trim().is_empty())
                .map(|s| s.trim().parse().expect("an integer block id"))
                .collect()
        })
        .collect()
}
