//! Core types shared by every tensorwire crate: [`DType`], [`Shape`], [`TensorInfo`],
//! the typed [`Error`], parser [`Limits`], the [`Bytes`] handle that keeps the owner of
//! borrowed memory alive, and the [`TensorSource`] read trait that every format reader
//! implements.
//!
//! Not in scope: opening files, mapping memory or parsing any format; those live in the
//! storage crates (`tensorwire-mmap`, `tensorwire-range`) and the codec crates.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod atomic;
mod bigint;
mod bytes;
pub mod copy;
mod dtype;
mod error;
pub mod helpers;
mod index;
mod limits;
pub mod progress;
mod reading;
mod shape;
mod source;
pub mod strided;
mod value;

#[cfg(unix)]
pub use crate::atomic::temporary_names_for_signal_handlers;
pub use crate::atomic::{
    check_replaceable, create_temporary, keep_temporaries_for_signal_handlers,
    remove_temporaries_before_exit, remove_temporary, replace_with_temporary, write_destination,
};
pub use crate::bigint::{BigInt, MAX_BIG_INT_BYTES, MAX_BIG_INT_DIGITS};
pub use crate::bytes::{AlignedBuf, Bytes, Owner};
pub use crate::dtype::DType;
pub use crate::error::{Error, Result};
pub use crate::index::{NameMap, NameSet, TensorIndex};
pub use crate::limits::{Limits, MAX_DEPTH_CEILING};
pub use crate::reading::{check_regular_file, open_for_reading};
pub use crate::shape::{Dims, Shape, MAX_NDIM};
pub use crate::source::{
    Attributes, Layout, TensorInfo, TensorSource, TensorView, SOURCE_LAYOUT_KEY,
};
pub use crate::strided::StridedView;
pub use crate::value::{push_python_float, push_python_str, Value};

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
