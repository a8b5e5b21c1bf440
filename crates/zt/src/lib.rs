//! Reader and writer for the `.zt` tensor format, byte-compatible with the `ztensor`
//! package: version 1.2 (`ZTEN1000`, read and write) and version 0.1 (`ZTEN0001`,
//! read).
//!
//! A `.zt` 1.2 file is `"ZTEN1000"`, then component blobs at 64-byte-aligned offsets,
//! then a CBOR manifest, its length as a little-endian `u64`, and `"ZTEN1000"` again.
//! The manifest names *objects* (tensors) with a shape, a layout (`dense`,
//! `sparse_csr`, `sparse_coo`, `quantized_group`) and *components*: the blobs, each
//! with a storage dtype, an optional logical type, an optional zstd encoding and an
//! optional crc32c or sha256 digest of the stored bytes. See `docs/formats/zt.md`.
//!
//! [`ZtReader`] validates the whole manifest on open (bounds, alignment, overlap, sizes
//! against shapes, limits) so later reads cannot fail on structure; raw components are
//! zero-copy [`Bytes`](tensorwire_core::Bytes) views of the map, zstd components are
//! decoded into fresh aligned buffers, and digests are checked before bytes are
//! handed out. [`ZtWriter`] writes files ztensor 1.2.3 reads, with the same bytes
//! ztensor writes for the same input.
//!
//! Not in scope: opening other formats (see the `tensorwire` facade), `.zt` version 2.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod cbor;
mod digest;
mod manifest;
mod reader;
mod writer;

pub use crate::digest::{Checksum, Digest};
pub use crate::manifest::{Component, Encoding, Object};
pub use crate::reader::{ZtReader, ZtVersion};
pub use crate::writer::{ComponentData, Compression, WriteOptions, ZtWriter};

/// Magic bytes at the start and end of a version 1.x file.
pub const MAGIC: &[u8; 8] = b"ZTEN1000";
/// Magic bytes at the start of a version 0.1 file.
pub const MAGIC_V01: &[u8; 8] = b"ZTEN0001";
/// Alignment of every component blob.
pub const ALIGNMENT: u64 = 64;
/// The manifest version this crate writes.
pub const WRITE_VERSION: &str = "1.2.0";
/// The zstd level `compress=True` means in ztensor.
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;
