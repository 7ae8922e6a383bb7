//! The row stack the host tier ran before it placed rows with the first-fit
//! allocator, kept as the rows bench's baseline: rows never handed out are
//! taken in ascending order; freed rows are pushed last-first and popped
//! back, so a freed group returns as the run it was.

pub struct RowStack {
    capacity: u64,
    /// Rows below this have been handed out at least once.
    fresh_from: u64,
    free: Vec<u32>,
    used: u64,
}

impl RowStack {
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            fresh_from: 0,
            free: Vec::new(),
            used: 0,
        }
    }

    pub fn free(&self) -> u64 {
        self.capacity - self.used
    }

    /// One row; the caller has checked that one is free.
    pub fn take_one(&mut self) -> u32 {
        let row = self.free.pop().unwrap_or_else(|| {
            self.fresh_from += 1;
            (self.fresh_from - 1) as u32
        });
        self.used += 1;
        row
    }

    /// Frees `rows`; the next takes of that many return them in this order.
    pub fn give_back(&mut self, rows: &[u32]) {
        self.free.extend(rows.iter().rev());
        self.used -= rows.len() as u64;
    }
}
