//! Namespaces (LoRA id, cache salt): each has its own root, so two namespaces
//! never share a prefix.

use std::fmt;

use cpkv_wire::{Reader, Writer};

/// Idle namespace roots kept before the longest idle one is dropped (by the
/// tree and by ghost's lean candidates, whose histories name roots by id).
pub const IDLE_ROOTS_KEPT: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Namespace {
    /// No namespace given.
    #[default]
    Default,
    Id(u64),
    Name(String),
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default => write!(f, "default"),
            Self::Id(id) => write!(f, "{id}"),
            Self::Name(name) => write!(f, "{name:?}"),
        }
    }
}

/// A namespace in snapshots: tag u8 (0 default, 1 id u64, 2 name: u32
/// length, UTF-8).
pub(crate) fn encode_namespace(w: &mut Writer, namespace: &Namespace) {
    match namespace {
        Namespace::Default => w.u8(0),
        Namespace::Id(id) => {
            w.u8(1);
            w.u64(*id);
        }
        Namespace::Name(name) => {
            w.u8(2);
            w.str(name);
        }
    }
}

/// The inverse of `encode_namespace`.
pub(crate) fn decode_namespace(r: &mut Reader<'_>) -> Result<Namespace, String> {
    Ok(match r.u8()? {
        0 => Namespace::Default,
        1 => Namespace::Id(r.u64()?),
        2 => Namespace::Name(r.str()?.to_owned()),
        tag => return Err(format!("bad namespace tag {tag}")),
    })
}
