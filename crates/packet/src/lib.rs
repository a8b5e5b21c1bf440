//! Tensor packets, byte-compatible with the `tenso` wire format: protocol v4 written and
//! read, v3 read.
//!
//! A dense packet is a 10-byte header (`"TNSO"`, version 4, flags `u16`, dtype code,
//! ndim, a reserved byte), `ndim` little-endian `u32` dimensions, an alignment exponent
//! byte when the alignment is not the default 64, zero padding so the body starts at a
//! multiple of the alignment counted from the packet start, the body, and an optional
//! XXH3-64 footer of the body. See `docs/formats/packet.md`.
//!
//! [`decode`] validates a packet against [`PacketLimits`] and returns a zero-copy
//! [`TensorView`](tensorwire_core::TensorView) of the body; [`encode`] /
//! [`encode_into`] write the bytes tenso 0.24 writes for the same array and options,
//! and [`encode_parts`] returns the header and footer around the caller's own body
//! bytes, so large tensors can be sent with vectored writes and no copy.
//!
//! Streams of packets back to back (what `tenso.write_stream` writes): [`PacketReader`]
//! reads one packet at a time from a `std::io::Read` (raw bytes or decoded), framed by
//! [`PacketFramer`] for every kind, LZ4 bodies included, with every announced length
//! checked against [`PacketLimits`] and a 64-aligned buffer that grows by at most
//! [`READ_CHUNK`] past the bytes received; [`PacketWriter`] writes packets, dense
//! bodies with vectored writes and no copy. The `tokio` feature adds
//! `AsyncPacketReader` / `AsyncPacketWriter` with the same framing and limits.
//!
//! Every other kind: [`decode_packet`] returns a [`Packet`] — dense (LZ4 bodies
//! decompressed into an exactly sized 64-aligned buffer, never past the size the header
//! declares), [`Bundle`], [`SparsePacket`] (COO/CSR/CSC), [`StringPacket`],
//! [`RaggedPacket`] (tenso's `__ragged_*__` bundle or a flag-0x200 packet),
//! [`QuantizedPacket`] (qint8/quint8/qint4/quint4, per tensor/channel/group) or
//! [`IpcRef`] — with bundle members, sparse parts and string components borrowed from
//! the input. [`encode_packet`] writes one from borrowed [`PacketRef`] parts, byte for
//! byte what tenso 0.24 writes for the same value and [`EncodeOptions`] (including which
//! options each kind ignores, as tenso does); `aligned_bundle` additionally pads bundle
//! members so their bodies are aligned counted from the outer packet (tenso still reads
//! the result). [`Packet::encode`] re-encodes a decoded value. [`PacketSource`] serves
//! any packet as named tensors (`a`, `bb.c`, `m.indptr`, …).
//!
//! Not in scope: decompressing or validating data on a GPU (an [`IpcRef`] is only its
//! wire payload), and checking sparse index values against the matrix shape.
//!
//! ```
//! use tensorwire_core::{Bytes, DType, Shape};
//! use tensorwire_packet::{decode_packet, encode_packet, EncodeOptions, Packet, PacketRef};
//!
//! let body = [1u8, 2, 3];
//! let member = PacketRef::Dense { dtype: DType::U8, shape: Shape::from_dims(&[3])?, body: &body };
//! let bundle = PacketRef::Bundle(vec![("x", member)]);
//! let options = EncodeOptions { integrity: true, ..EncodeOptions::default() };
//! let bytes = Bytes::from_vec(encode_packet(&bundle, &options)?);
//! let Packet::Bundle(b) = decode_packet(&bytes)? else { unreachable!() };
//! assert_eq!(&b.entries[0].1.as_dense().unwrap().bytes[..], &body);
//! # Ok::<(), tensorwire_core::Error>(())
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod codec;
mod dtype;
mod lz4;
mod read;
mod source;
mod stream;
mod value;
mod write;

pub use crate::codec::{
    decode, decode_with, encode, encode_into, encode_parts, packet_info, EncodeOptions, PacketInfo,
    PacketLimits, PacketParts,
};
pub use crate::dtype::{dtype_code, dtype_from_code};
pub use crate::read::{decode_packet, decode_packet_with};
pub use crate::source::{PacketSource, PACKET_TENSOR_NAME};
#[cfg(feature = "tokio")]
pub use crate::stream::{AsyncPacketReader, AsyncPacketWriter};
pub use crate::stream::{Framing, PacketFramer, PacketReader, PacketWriter, READ_CHUNK};
pub use crate::value::{
    Bundle, IpcRef, MatrixShape, Packet, QuantScheme, QuantizedPacket, RaggedFraming, RaggedPacket,
    SparseFormat, SparsePacket, StringPacket,
};
pub use crate::write::{encode_packet, encode_packet_into, PacketRef};

/// The four magic bytes at the start of every packet.
pub const MAGIC: &[u8; 4] = b"TNSO";
/// The protocol version this crate writes.
pub const VERSION: u8 = 4;
/// The default body alignment.
pub const DEFAULT_ALIGNMENT: usize = 64;

/// Packet flags (a `u16` in v4, a `u8` in v3).
pub mod flags {
    /// Body aligned to 64 bytes.
    pub const ALIGNED: u16 = 0x01;
    /// An XXH3-64 footer of the body follows it.
    pub const INTEGRITY: u16 = 0x02;
    /// The body is an LZ4 frame.
    pub const COMPRESSED: u16 = 0x04;
    /// Sparse COO tensor.
    pub const SPARSE_COO: u16 = 0x08;
    /// A bundle (dict) of packets.
    pub const BUNDLE: u16 = 0x10;
    /// Sparse CSR tensor.
    pub const SPARSE_CSR: u16 = 0x20;
    /// Sparse CSC tensor.
    pub const SPARSE_CSC: u16 = 0x40;
    /// Custom alignment: an exponent byte follows the shape.
    pub const CUSTOM_ALIGNMENT: u16 = 0x80;
    /// Variable-length string tensor.
    pub const STRING: u16 = 0x100;
    /// Ragged array.
    pub const RAGGED: u16 = 0x200;
    /// Reference to a GPU IPC allocation.
    pub const GPU_IPC: u16 = 0x400;
}
