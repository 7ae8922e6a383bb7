//! Payload kinds (main KV, indexer K, ...): one pool each, named, in
//! construction order, and the set of payloads a request touches.

use crate::error::{AllocError, Result};

/// Index of a payload in construction order.
pub type PayloadId = usize;

/// The most payload kinds one allocator holds (a `PayloadSet` is a bit mask).
pub const MAX_PAYLOADS: usize = 64;

/// The largest pool, 2**32 pages (16 TiB of 4 KB pages). Any object's page
/// list can then be materialised (32 GiB at most, never an abort), and page
/// numbers fit an int64 (numpy on the Python side) with room to spare.
pub const MAX_CAPACITY: u64 = 1 << 32;

/// The payload names and capacities, in construction order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Payloads {
    names: Vec<String>,
    capacities: Vec<u64>,
}

impl Payloads {
    /// Validates `(name, capacity)` pairs: non-empty, unique names; capacities
    /// in `1..=MAX_CAPACITY`; between 1 and `MAX_PAYLOADS` payloads.
    pub fn new<S: AsRef<str>>(pools: &[(S, u64)]) -> Result<Self> {
        if pools.is_empty() {
            return Err(AllocError::NoPayloads);
        }
        if pools.len() > MAX_PAYLOADS {
            return Err(AllocError::TooManyPayloads {
                count: pools.len(),
                max: MAX_PAYLOADS,
            });
        }
        let mut names: Vec<String> = Vec::with_capacity(pools.len());
        let mut capacities = Vec::with_capacity(pools.len());
        for (name, capacity) in pools {
            let name = name.as_ref();
            if name.is_empty() {
                return Err(AllocError::EmptyPayloadName);
            }
            if names.iter().any(|n| n == name) {
                return Err(AllocError::RepeatedPayload { name: name.into() });
            }
            if *capacity == 0 || *capacity > MAX_CAPACITY {
                return Err(AllocError::InvalidCapacity {
                    payload: name.into(),
                    capacity: *capacity,
                });
            }
            names.push(name.into());
            capacities.push(*capacity);
        }
        Ok(Payloads { names, capacities })
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn name(&self, id: PayloadId) -> &str {
        &self.names[id]
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn capacity(&self, id: PayloadId) -> u64 {
        self.capacities[id]
    }

    /// The id of payload `name`.
    pub fn id(&self, name: &str) -> Result<PayloadId> {
        if name.is_empty() {
            return Err(AllocError::EmptyPayloadName);
        }
        self.names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| AllocError::UnknownPayload { name: name.into() })
    }

    /// Every payload.
    pub fn all(&self) -> PayloadSet {
        PayloadSet(if self.len() == 64 {
            u64::MAX
        } else {
            (1u64 << self.len()) - 1
        })
    }

    /// The set named by `names` (`None`: every payload). Names must be known,
    /// non-empty and not repeated, and the list must not be empty.
    pub fn select<S: AsRef<str>>(&self, names: Option<&[S]>) -> Result<PayloadSet> {
        let Some(names) = names else {
            return Ok(self.all());
        };
        if names.is_empty() {
            return Err(AllocError::NoPayloads);
        }
        let mut set = PayloadSet::EMPTY;
        for name in names {
            let id = self.id(name.as_ref())?;
            if set.contains(id) {
                return Err(AllocError::RepeatedPayload {
                    name: name.as_ref().into(),
                });
            }
            set.0 |= 1 << id;
        }
        Ok(set)
    }
}

/// A set of payloads; iterates in construction order whatever order the
/// caller named them in, so decisions never depend on the caller's spelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PayloadSet(u64);

impl PayloadSet {
    pub const EMPTY: PayloadSet = PayloadSet(0);

    /// This set with payload `id` added (`id < MAX_PAYLOADS`).
    pub fn with(self, id: PayloadId) -> PayloadSet {
        assert!(id < MAX_PAYLOADS, "payload id {id} out of range");
        PayloadSet(self.0 | 1 << id)
    }

    pub fn contains(self, id: PayloadId) -> bool {
        id < MAX_PAYLOADS && self.0 & (1 << id) != 0
    }

    pub fn iter(self) -> impl Iterator<Item = PayloadId> {
        let mut bits = self.0;
        std::iter::from_fn(move || {
            if bits == 0 {
                return None;
            }
            let id = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            Some(id)
        })
    }
}
