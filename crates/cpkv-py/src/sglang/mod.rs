//! The SGLang HiCache backend's native side: `SglangIndex` (the replicated
//! index and one native call per SGLang batch call) over `SglangPool` (one
//! host pool's layout, its slab region, the checked copies between them), and
//! `L3Staging` (the node-shared area that reads an L3 record once per node).

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
