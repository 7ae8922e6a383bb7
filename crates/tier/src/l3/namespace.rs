//! What a page must share with the running server to be served: format
//! version, model identity, dtype, KV layout, page size, CP/TP geometry and
//! page bytes. Any difference gives another id, and a record of another id is
//! a miss (`RecordReject::ForeignNamespace`), so FP16 pages are never served
//! to a BF16 server, nor one model's pages to another.

use cpkv_hash::Hasher64;

use super::record::FORMAT_VERSION;

/// Tag of namespace ids in the one hash construction.
const NAMESPACE_TAG: u64 = 0x4c33_4e53; // "L3NS"

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct L3Namespace {
    pub model: String,
    pub dtype: String,
    pub kv_layout: String,
    pub page_size: u64,
    pub cp_size: u64,
    pub tp_size: u64,
    pub page_bytes: u64,
}

impl L3Namespace {
    /// The namespace's id: every field, length-prefixed, with the format
    /// version, through the fixed-seed hash (equal in every process).
    pub fn id(&self) -> u64 {
        Hasher64::new(NAMESPACE_TAG)
            .word(u64::from(FORMAT_VERSION))
            .bytes(self.model.as_bytes())
            .bytes(self.dtype.as_bytes())
            .bytes(self.kv_layout.as_bytes())
            .words(&[self.page_size, self.cp_size, self.tp_size, self.page_bytes])
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_changes_the_id() {
        let base = L3Namespace {
            model: "m".into(),
            dtype: "float16".into(),
            kv_layout: "nhd".into(),
            page_size: 64,
            cp_size: 2,
            tp_size: 1,
            page_bytes: 4096,
        };
        type Change = Box<dyn Fn(&mut L3Namespace)>;
        let variants: Vec<Change> = vec![
            Box::new(|n| n.model = "m2".into()),
            Box::new(|n| n.dtype = "bfloat16".into()),
            Box::new(|n| n.kv_layout = "hnd".into()),
            Box::new(|n| n.page_size = 32),
            Box::new(|n| n.cp_size = 4),
            Box::new(|n| n.tp_size = 2),
            Box::new(|n| n.page_bytes = 8192),
            // A field's bytes moving into its neighbour is another namespace.
            Box::new(|n| {
                n.model = "mf".into();
                n.dtype = "loat16".into();
            }),
        ];
        for change in variants {
            let mut other = base.clone();
            change(&mut other);
            assert_ne!(other.id(), base.id(), "{other:?}");
        }
        assert_eq!(base.clone().id(), base.id());
    }
}
