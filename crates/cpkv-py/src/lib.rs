//! `cpkv._cpkv`: the thin Python binding over the pure-Rust cores.
//!
//! Each module wraps one core type; `errors` maps every core error to the
//! Python exception hierarchy defined in `cpkv.errors`, in one place (one
//! conversion per core error type, the class objects imported once);
//! `convert` is the one argument-conversion rule and `shared` the one
//! concurrency and poison rule of every class.

mod allocator;
mod convert;
mod copy;
mod errors;
mod l3;
mod offload;
mod prefix_tree;
mod sglang;
mod shared;
mod tier;

use pyo3::prelude::*;

#[pymodule]
fn _cpkv(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::import_classes(m.py())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // The one policy every part of cpkv starts with.
    m.add("DEFAULT_POLICY", cpkv_evict::Policy::DEFAULT.name())?;
    // The size limits, each one number shared by the cores, the binding and
    // the engine configs (which import them from here).
    m.add("MAX_PAGES", cpkv_tier::MAX_PAGES)?;
    m.add("MAX_PAGE_SIZE", cpkv_evict::MAX_PAGE_SIZE)?;
    m.add("MAX_CP_SIZE", cpkv_tier::MAX_CP_SIZE)?;
    allocator::register(m)?;
    copy::register(m)?;
    l3::register(m)?;
    offload::register(m)?;
    prefix_tree::register(m)?;
    sglang::register(m)?;
    tier::register(m)?;
    Ok(())
}
