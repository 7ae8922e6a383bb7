//! The SGLang HiCache backend's native side, wrapping `cpkv_slab` (the byte
//! protocol: row seqlock, run copies, L3 read staging) and `cpkv_tier`'s
//! `OffloadIndex`: `SglangIndex` (the replicated index and one native call
//! per SGLang batch call) over `SglangPool` (one host pool's layout and its
//! slab region), and `L3Staging` (the node-shared area that reads an L3
//! record once per node).

mod hook;
mod index;
mod pool;
mod staging;

use pyo3::prelude::*;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<index::SglangIndex>()?;
    m.add_class::<pool::SglangPool>()?;
    m.add_class::<staging::L3Staging>()?;
    Ok(())
}
