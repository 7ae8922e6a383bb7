//! Namespaces (LoRA id, cache salt): each has its own root, so two namespaces
//! never share a prefix.

use std::fmt;

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
