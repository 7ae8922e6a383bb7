//! `cpkv._cpkv`: the thin Python binding over the pure-Rust cores.
//!
//! Each module wraps one core type; `errors` maps every core error to the
//! Python exception hierarchy defined in `cpkv.errors`, in one place.

mod allocator;
mod convert;
mod copy;
mod errors;
mod offload;
mod prefix_tree;
mod shared;
mod tier;

use pyo3::prelude::*;

#[pymodule]
fn _cpkv(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DEFAULT_POLICY", cpkv_evict::Policy::DEFAULT.name())?;
    allocator::register(m)?;
    copy::register(m)?;
    offload::register(m)?;
    prefix_tree::register(m)?;
    tier::register(m)?;
    Ok(())
}
