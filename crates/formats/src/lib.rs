//! Readers for the tensor formats ML engineers already hold, all zero-copy over a map:
//!
//! - [`safetensors`]: read (every dtype, `__metadata__` as attributes) and write
//!   (byte-compatible with the `safetensors` package's `save_file`);
//! - [`gguf`]: GGUF v2/v3 with its key-value metadata; quantized block types come out
//!   as their raw blocks, named;
//! - [`npy`]: NumPy `.npy` (v1–v3) and `.npz` archives (stored entries mapped,
//!   deflated ones inflated on demand);
//! - [`shards`]: the JSON index of a checkpoint split over several files
//!   (`model.safetensors.index.json`); the `tensorwire` facade opens the shards.
//!
//! Every reader validates the whole header on open (limits, ranges inside the file,
//! sizes against shapes) so later reads cannot fail on structure, and implements
//! [`TensorSource`](tensorwire_core::TensorSource).
//!
//! Not in scope: `.zt` (`tensorwire-zt`), PyTorch checkpoints (`tensorwire-pytorch`),
//! recognising a file's format (the `tensorwire` facade).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod gguf;
mod json;
pub mod npy;
pub mod safetensors;
pub mod shards;

use std::path::Path;

use tensorwire_core::{Bytes, Result};
use tensorwire_mmap::{MapMode, MappedFile};

/// Maps `path` privately (copy-on-write) and parses the map with `parse`; errors from
/// either step carry the path. The one `open_with` of every reader here.
pub(crate) fn open_mapped<T>(path: &Path, parse: impl FnOnce(Bytes) -> Result<T>) -> Result<T> {
    let bytes = MappedFile::open_bytes(path, MapMode::CopyOnWrite)?;
    parse(bytes).map_err(|e| e.with_path(path))
}
