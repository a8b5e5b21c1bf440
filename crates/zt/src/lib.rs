//! Reader and writer for the `.zt` tensor format, byte-compatible with the `ztensor`
//! package: version 2 (ztensor 2.x, magic `89 5A 54 32 0D 0A 1A 0A`, read and write),
//! version 1.2 (`ZTEN1000`, read and write) and version 0.1 (`ZTEN0001`, read).
//! ztensor 2.x cannot read 1.x files and 1.x cannot read 2.x; this crate reads all
//! three, telling them apart by the leading magic.
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
//! A `.zt` version 2 file is the magic, blobs at offsets that are multiples of 4096
//! (65536 in ztensor's canonical form), a manifest in deterministic CBOR (objects →
//! shape, layout, parts → dtype, `blob: [offset, length]`, optional logical `type`,
//! `zt.zstd-seekable/1` encoding with its `decoded_length`, `xxh3:`/`sha256:` digest
//! of the decoded bytes), and a 40-byte footer: manifest offset, length and XXH3-64
//! hash, version 2, a reserved word and the magic again. The same [`ZtReader`] opens
//! it ([`ZtVersion::V2`]), checking the footer, the manifest hash, the whole manifest
//! and every blob reference on open; [`ZtWriter::with_version`] writes it with the
//! bytes ztensor 2.x writes for the same input.
//!
//! Not in scope: opening other formats (see the `tensorwire` facade), multi-file
//! (sharded) version 2 models, appending to version 2 files.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod cbor;
mod cbor_det;
mod digest;
mod manifest;
mod manifest_v2;
mod reader;
mod seekable;
mod writer;

pub use crate::digest::{Checksum, Digest};
pub use crate::manifest::{is_int_outside_cbor, Component, Encoding, Object};
pub use crate::reader::{
    gguf_layout_id, ByteType, ZtReader, ZtVersion, GGUF_BLOCK_BYTES, GGUF_ELEMS_PER_BLOCK,
};
pub use crate::writer::{ComponentData, Compression, WriteOptions, ZtWriter};

/// Magic bytes at the start and end of a version 1.x file.
pub const MAGIC: &[u8; 8] = b"ZTEN1000";
/// Magic bytes at the start of a version 0.1 file.
pub const MAGIC_V01: &[u8; 8] = b"ZTEN0001";
/// Magic bytes at the start and at the end of a version 2 file (`0x89 'Z' 'T' '2'
/// CR LF SUB LF`).
pub const MAGIC_V2: &[u8; 8] = &[0x89, b'Z', b'T', b'2', 0x0d, 0x0a, 0x1a, 0x0a];
/// Alignment floor of every version 2 blob: offsets are multiples of it, and at least
/// it.
pub const V2_ALIGNMENT: u64 = 4096;
/// Blob alignment of ztensor 2.x's canonical form, and of [`ZtWriter`]'s version 2
/// files unless [`ZtWriter::set_alignment`] says otherwise.
pub const V2_CANONICAL_ALIGNMENT: u64 = 65536;
/// Size of the version 2 footer.
pub const V2_FOOTER_LEN: u64 = 40;
/// Largest version 2 manifest the specification allows (1 GiB).
pub const V2_MAX_MANIFEST: u64 = 1 << 30;
/// The name of the version 2 zstd encoding.
pub const ZSTD_SEEKABLE: &str = "zt.zstd-seekable/1";
/// Alignment of every component blob in a 1.x file.
pub const ALIGNMENT: u64 = 64;
/// The manifest version this crate writes in 1.x files.
pub const WRITE_VERSION: &str = "1.2.0";
/// The zstd level `compress=True` means in ztensor (and the level ztensor 2.x uses for
/// `zt.zstd-seekable/1`).
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;
