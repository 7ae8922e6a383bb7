//! The logical clock: the only notion of time the tree has.
//!
//! It advances by one per accepted event, so every rank that replays the same
//! event stream reads the same stamps (a wall clock would not).

/// A point on the logical clock.
pub type Stamp = u64;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogicalClock {
    now: Stamp,
}

impl LogicalClock {
    /// Advances to and returns the stamp of the next event.
    pub fn tick(&mut self) -> Stamp {
        self.now += 1;
        self.now
    }

    pub fn now(&self) -> Stamp {
        self.now
    }

    /// A clock that reads `now` (restoring a snapshot).
    pub fn at(now: Stamp) -> Self {
        Self { now }
    }
}
