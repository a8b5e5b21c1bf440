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
pub mod progress;
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

/// The file a write to `path` replaces: `path` itself or, when `path` is a symbolic
/// link (or a chain of them), the file it finally names, so that writing through a
/// link updates its target and keeps the link, as writing in place would.
pub fn write_destination(path: &std::path::Path) -> Result<std::path::PathBuf> {
    /// Links followed before giving up, as the kernel's own limit.
    const MAX_LINKS: usize = 40;
    let mut at = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        let is_link = std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink());
        if !is_link {
            return Ok(at);
        }
        let target = std::fs::read_link(&at).map_err(|e| Error::from(e).with_path(&at))?;
        at = match at.parent() {
            Some(folder) if target.is_relative() => folder.join(target),
            _ => target,
        };
    }
    Err(Error::invalid(format!(
        "{}: more than {MAX_LINKS} levels of symbolic links",
        path.display()
    )))
}

/// The name a file written atomically to `path` has until it is renamed into place:
/// `.NAME.tmp-PID` beside [`write_destination`]`(path)` (so on the same file system,
/// where the rename is atomic). The writers of every format use it, and `tensorwire
/// convert` removes it when interrupted.
pub fn temporary_sibling(path: &std::path::Path) -> Result<std::path::PathBuf> {
    let path = write_destination(path)?;
    let file_name = path
        .file_name()
        .ok_or_else(|| Error::invalid(format!("not a file path: {}", path.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    Ok(path.with_file_name(tmp_name))
}

/// Puts the finished temporary file `tmp` (from [`temporary_sibling`]) in place of
/// `destination` (as [`write_destination`] gave it when the write began, so a link
/// retargeted meanwhile does not move the rename elsewhere), with the permissions of
/// the file it replaces, if any (a new file keeps the mode it was created with).
pub fn replace_with_temporary(tmp: &std::path::Path, destination: &std::path::Path) -> Result<()> {
    if let Ok(old) = std::fs::metadata(destination) {
        std::fs::set_permissions(tmp, old.permissions())?;
    }
    std::fs::rename(tmp, destination).map_err(|e| Error::from(e).with_path(destination))
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
