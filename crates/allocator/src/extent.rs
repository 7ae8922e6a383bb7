//! A run of physically contiguous pages.

/// Pages `start .. start + len` of one payload pool; `len` is never zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Extent {
    pub start: u64,
    pub len: u64,
}

impl Extent {
    pub fn new(start: u64, len: u64) -> Self {
        Extent { start, len }
    }

    /// One past the last page.
    pub fn end(&self) -> u64 {
        self.start + self.len
    }
}
