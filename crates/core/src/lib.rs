//! Core types shared by every tensorwire crate: [`DType`], [`Shape`], [`TensorInfo`],
//! the typed [`Error`], parser [`Limits`], the [`Bytes`] handle that keeps the owner of
//! borrowed memory alive, and the [`TensorSource`] read trait that every format reader
//! implements.
//!
//! Not in scope: opening files, mapping memory or parsing any format; those live in the
//! storage crates (`tensorwire-mmap`, `tensorwire-range`) and the codec crates.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod bytes;
pub mod copy;
mod dtype;
mod error;
pub mod helpers;
mod index;
mod limits;
mod shape;
mod source;
pub mod strided;
mod value;

pub use crate::bytes::{AlignedBuf, Bytes, Owner};
pub use crate::dtype::DType;
pub use crate::error::{Error, Result};
pub use crate::index::{NameMap, NameSet, TensorIndex};
pub use crate::limits::Limits;
pub use crate::shape::{Dims, Shape, MAX_NDIM};
pub use crate::source::{
    Attributes, Layout, TensorInfo, TensorSource, TensorView, SOURCE_LAYOUT_KEY,
};
pub use crate::strided::StridedView;
pub use crate::value::Value;

/// The name a file written atomically to `path` has until it is renamed into place:
/// `.NAME.tmp-PID` in the same folder (so on the same file system, where the rename
/// is atomic). The writers of every format use it, and `tensorwire convert` removes
/// it when interrupted.
pub fn temporary_sibling(path: &std::path::Path) -> Result<std::path::PathBuf> {
    let file_name = path
        .file_name()
        .ok_or_else(|| Error::invalid(format!("not a file path: {}", path.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    Ok(path.with_file_name(tmp_name))
}

/// Rounds `offset` up to the next multiple of `align` (a power of two or any non-zero
/// value), returning `None` on overflow.
pub fn align_up(offset: u64, align: u64) -> Option<u64> {
    if align == 0 {
        return Some(offset);
    }
    let rem = offset % align;
    if rem == 0 {
        Some(offset)
    } else {
        offset.checked_add(align - rem)
    }
}
