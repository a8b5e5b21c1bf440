//! `tensorwire._native`: the Python extension behind the `tensorwire` package —
//! zero-copy numpy arrays over tensor files, and a `.zt` writer.
//!
//! The module is split by job: `errors` (the exception hierarchy and the one
//! conversion from `tensorwire::Error`), `dtypes` (DType ↔ numpy), `arrays`
//! (zero-copy and fresh arrays), `values` (attributes), `limits` (parser limits),
//! `reader`, `writer`,
//! `formats` (safetensors files from arrays),
//! `packet` (tenso packets), `shm` (packets in shared memory) and `ipc`
//! (sharing tensors with other processes over a Unix socket).
//! The pure-Python package (`python/tensorwire`) adds the ztensor-style conveniences
//! on top (`metadata`, `read`, `read_torch`, `write`, `write_torch`).
//!
//! Not in scope: format logic (the Rust crates), torch (imported lazily in Python).
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod arrays;
mod cache;
mod dtypes;
mod errors;
mod formats;
mod ipc;
mod limits;
mod packet;
mod reader;
mod shm;
mod values;
mod writer;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    m.add_class::<arrays::BytesOwner>()?;
    m.add_class::<arrays::ArenaBuffer>()?;
    m.add_class::<reader::Reader>()?;
    m.add_class::<writer::Writer>()?;
    m.add_function(wrap_pyfunction!(arrays::copy_pairs_py, m)?)?;
    m.add_function(wrap_pyfunction!(reader::raw_torch_dims, m)?)?;
    m.add_function(wrap_pyfunction!(reader::float4_pairs_as_values, m)?)?;
    m.add_function(wrap_pyfunction!(writer::convert, m)?)?;
    m.add_function(wrap_pyfunction!(limits::default_limits, m)?)?;
    m.add_function(wrap_pyfunction!(formats::safetensors_save, m)?)?;
    m.add_function(wrap_pyfunction!(packet::packet_dumps, m)?)?;
    m.add_function(wrap_pyfunction!(packet::packet_loads, m)?)?;
    m.add_function(wrap_pyfunction!(packet::packet_dense_parts, m)?)?;
    m.add_function(wrap_pyfunction!(packet::packet_read_stream, m)?)?;
    m.add_class::<packet::PendingPacket>()?;
    m.add_function(wrap_pyfunction!(packet::packet_frame_need, m)?)?;
    m.add_function(wrap_pyfunction!(packet::packet_length, m)?)?;
    m.add_class::<shm::ShmSegment>()?;
    m.add_class::<shm::ShmMapping>()?;
    m.add_class::<cache::CacheHandle>()?;
    m.add_function(wrap_pyfunction!(cache::prepare_fork, m)?)?;
    m.add_function(wrap_pyfunction!(cache::parent_after_fork, m)?)?;
    m.add_function(wrap_pyfunction!(cache::child_after_fork, m)?)?;
    ipc::register(m)?;
    Ok(())
}
