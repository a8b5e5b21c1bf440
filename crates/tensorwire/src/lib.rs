//! tensorwire: zero-copy, safe tensor I/O.
//!
//! This facade re-exports the workspace's crates and adds the things that need all of
//! them: [`open`], which recognises a file by its magic bytes and returns a
//! [`TensorSource`], [`ShardedSource`], which serves a checkpoint split over several
//! files (of any of those formats) as one source, and [`convert`], which copies every
//! tensor of one file into a new file of another format.
//!
//! ```
//! # fn main() -> tensorwire::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("model.zt");
//! use tensorwire::{core::{DType, Shape}, zt::{WriteOptions, ZtWriter}};
//! let mut w = ZtWriter::create(&path)?;
//! w.add_dense("bias", DType::F32, &Shape::new(vec![2])?, &[0u8; 8], WriteOptions::default())?;
//! w.finish()?;
//!
//! let src = tensorwire::open(&path)?;
//! assert_eq!(src.format(), "zt");
//! let view = src.view("bias")?;
//! assert!(view.zero_copy);
//! # Ok(()) }
//! ```
//!
//! Not in scope: format details (each codec crate), the CLI (`tensorwire-cli`) and the
//! Python package (`bindings/python`).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod convert;
mod sharded;
mod sniff;

pub use tensorwire_cache as cache;
pub use tensorwire_core as core;
pub use tensorwire_cuda_ipc as ipc;
pub use tensorwire_formats as formats;
pub use tensorwire_mmap as mmap;
pub use tensorwire_packet as packet;
pub use tensorwire_pytorch as pytorch;
pub use tensorwire_range as range;
pub use tensorwire_shm as shm;
pub use tensorwire_zt as zt;

pub use tensorwire_core::{
    Bytes, DType, Error, Layout, Limits, Result, Shape, TensorInfo, TensorSource, TensorView,
    Value, MAX_DEPTH_CEILING, SOURCE_LAYOUT_KEY,
};

pub use crate::convert::{
    convert, convert_source, refuse_overwriting_source, ConvertOptions, OutputFormat,
};
pub use crate::sharded::{zt_holding, ShardedSource};
pub use crate::sniff::{open, open_bytes, open_with, sniff, FileFormat, OpenOptions};
