//! Framing: how long is the packet that starts at the front of a byte stream?
//!
//! [`PacketFramer`] answers that from a prefix of the packet, a little more each time
//! the prefix grows, without decoding it: it walks headers, shapes, length prefixes and
//! LZ4 block headers, and says how many bytes the prefix must reach before it can say
//! more. Nested bundles and sparse packets live on an explicit stack bounded by
//! [`PacketLimits::max_nesting`], never on the call stack. Every declared count and
//! length is checked against the limits before anything is computed from it, and every
//! offset is checked arithmetic.

use tensorwire_core::{align_up, Error, Result};

use crate::codec::PacketLimits;
use crate::dtype::dtype_from_code;
use crate::{flags, DEFAULT_ALIGNMENT, MAGIC};

/// Length of a GPU IPC reference packet: a v4 header and a 96-byte body (64-byte
/// handle, `u64` offset, `u64` byte count, 16-byte device UUID).
const IPC_REF_PACKET_LEN: u64 = 106;

/// The magic number of an LZ4 frame (`0x184D2204`, little-endian).
const LZ4_MAGIC: [u8; 4] = [0x04, 0x22, 0x4D, 0x18];

/// What a [`PacketFramer`] knows about the packet at the front of its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// The prefix must grow to at least `need` bytes before the framer can go on
    /// (`need` is more than the prefix holds now, and at most the packet's length).
    Incomplete {
        /// Bytes the prefix must hold for the next step.
        need: u64,
    },
    /// The packet is exactly `len` bytes long (the prefix holds all of it).
    Complete {
        /// The packet's length.
        len: u64,
    },
}

/// A resumable "how long is this packet" state machine, shared by the blocking and the
/// async stream readers.
///
/// Feed it the bytes of one packet received so far, always the same prefix grown by
/// whatever arrived since ([`advance`](Self::advance)); it keeps its place between
/// calls, so the total work is linear in the packet's structure. It never looks at
/// tensor bodies, only at headers, length prefixes, string offsets and LZ4 block
/// headers, and it checks each declared size against [`PacketLimits`] (including
/// [`max_packet_bytes`](PacketLimits::max_packet_bytes)) before asking for it.
///
/// ```
/// use tensorwire_core::{DType, Shape};
/// use tensorwire_packet::{encode, EncodeOptions, Framing, PacketFramer, PacketLimits};
/// let shape = Shape::from_dims(&[5]).unwrap();
/// let packet = encode(DType::F32, &shape, &[0u8; 20], EncodeOptions::default()).unwrap();
/// let mut framer = PacketFramer::new(PacketLimits::default());
/// assert_eq!(framer.advance(&packet[..3]).unwrap(), Framing::Incomplete { need: 8 });
/// assert_eq!(framer.advance(&packet[..10]).unwrap(), Framing::Incomplete { need: 14 });
/// assert_eq!(framer.advance(&packet[..14]).unwrap(), Framing::Incomplete { need: 84 });
/// assert_eq!(framer.advance(&packet).unwrap(), Framing::Complete { len: 84 });
/// ```
#[derive(Debug, Clone)]
pub struct PacketFramer {
    limits: PacketLimits,
    stack: Vec<Frame>,
}

/// One (sub-)packet being framed.
#[derive(Debug, Clone, Copy)]
struct Frame {
    /// Offset of its first byte in the top-level packet (alignment counts from here).
    start: u64,
    /// Where it must end, when a length prefix gave its size.
    bound: Option<u64>,
    /// The next byte to look at.
    pos: u64,
    state: State,
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// Magic, version, flags, dtype code, ndim.
    Header,
    /// `ndim` dimensions at `pos`, then the kind's own layout.
    Shape { kind: Kind, ndim: u8, flags: u16 },
    /// Quantization metadata at `pos`: scheme, axis, group size, scale count, scales,
    /// zero points; then the alignment byte and the packed body.
    QuantMeta { body_len: u64, flags: u16 },
    /// The optional alignment exponent byte at `pos`, then padding to the body.
    Align { body: Body, flags: u16 },
    /// String / ragged offsets: `count + 1` `u64`s at `pos`; the last one is the
    /// payload length.
    Offsets { count: u64, footer: u64 },
    /// An LZ4 frame header at `pos`.
    Lz4Header { raw_len: u64, footer: u64 },
    /// An LZ4 block header (or end mark) at `pos`.
    Lz4Block { lz4: Lz4Frame, footer: u64 },
    /// `left` bundle entries: `klen u32 | key | vlen u32 | packet` at `pos`.
    BundleKey { left: u16 },
    /// The value length of a bundle entry at `pos`.
    BundleValue { left: u16 },
    /// `left` sparse components: `len u32 | packet` at `pos`.
    Sparse { left: u8 },
    /// Nothing left to parse: the (sub-)packet ends at `end`.
    Until { end: u64 },
}

/// The kinds whose layout starts with a shape.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Dense { itemsize: u64 },
    Quantized { four_bit: bool },
    Offsets,
    Sparse,
}

/// What follows the padding.
#[derive(Debug, Clone, Copy)]
enum Body {
    /// A body of known length.
    Fixed(u64),
    /// An LZ4 frame that decompresses to `raw_len` bytes.
    Lz4 { raw_len: u64 },
    /// String / ragged offsets and payload.
    Offsets { count: u64 },
}

/// Options of an LZ4 frame that decide where its blocks end.
#[derive(Debug, Clone, Copy)]
struct Lz4Frame {
    block_checksums: bool,
    content_checksum: bool,
    max_block: u64,
}

/// `len` bytes of `buf` at `offset`, when the buffer holds them.
fn bytes_at(buf: &[u8], offset: u64, len: usize) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    buf.get(start..start.checked_add(len)?)
}

fn u32_at(buf: &[u8], offset: u64) -> Option<u32> {
    bytes_at(buf, offset, 4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_le_bytes)
}

fn u64_at(buf: &[u8], offset: u64) -> Option<u64> {
    bytes_at(buf, offset, 8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)
}

fn add(a: u64, b: u64) -> Result<u64> {
    a.checked_add(b).ok_or(Error::Overflow {
        what: "packet length",
    })
}

fn mul(a: u64, b: u64) -> Result<u64> {
    a.checked_mul(b).ok_or(Error::Overflow {
        what: "packet length",
    })
}

impl PacketFramer {
    /// A framer at the start of a packet.
    pub fn new(limits: PacketLimits) -> PacketFramer {
        let mut framer = PacketFramer {
            limits,
            stack: Vec::with_capacity(4),
        };
        framer.reset();
        framer
    }

    /// The limits it enforces.
    pub fn limits(&self) -> &PacketLimits {
        &self.limits
    }

    /// Starts over, for the next packet.
    pub fn reset(&mut self) {
        self.stack.clear();
        self.stack.push(Frame {
            start: 0,
            bound: None,
            pos: 0,
            state: State::Header,
        });
    }

    /// Frames as much of the packet as `prefix` allows. `prefix` must be the packet's
    /// first bytes, the same ones as in the previous call plus any that arrived since
    /// (it may hold bytes after the packet's end; they are not looked at). After
    /// [`Framing::Complete`] the framer starts over with the next packet.
    ///
    /// Errors (the framer is then in an undefined place; [`reset`](Self::reset) it for
    /// a new stream): [`Error::BadMagic`], [`Error::Unsupported`] for an unknown
    /// protocol version, [`Error::LimitExceeded`] for ndim, element, bundle-entry,
    /// nesting, alignment or packet-size limits, [`Error::Malformed`] for an unknown
    /// dtype, a sub-packet longer than its length prefix or a bad LZ4 frame,
    /// [`Error::Overflow`]. Offsets in errors count from the packet's first byte.
    pub fn advance(&mut self, prefix: &[u8]) -> Result<Framing> {
        let have = prefix.len() as u64;
        loop {
            let depth = self.stack.len();
            let Some(frame) = self.stack.last_mut() else {
                // Unreachable: the stack is never left empty; recover by restarting.
                self.reset();
                continue;
            };
            // `need!(end)`: returns `Incomplete` unless the prefix holds `end` bytes,
            // after checking `end` against this frame's length prefix and the limits.
            // A step that returns `Incomplete` reruns from its start on the next call,
            // so each step changes `frame` only after its last `need!`.
            macro_rules! need {
                ($end:expr) => {{
                    let end: u64 = $end;
                    if let Some(bound) = frame.bound {
                        if end > bound {
                            return Err(Error::malformed(
                                frame.start,
                                format!(
                                    "sub-packet needs at least {} bytes, its length prefix gives {}",
                                    end - frame.start,
                                    bound - frame.start
                                ),
                            ));
                        }
                    }
                    Error::check_limit("packet length", end, self.limits.max_packet_bytes)?;
                    if have < end {
                        return Ok(Framing::Incomplete { need: end });
                    }
                }};
            }
            let start = frame.start;
            let pos = frame.pos;
            match frame.state {
                State::Header => {
                    // Refuse a wrong magic as soon as its first byte is in.
                    let from = usize::try_from(start).unwrap_or(usize::MAX);
                    let rest = prefix.get(from..).unwrap_or(&[]);
                    let seen = rest.get(..4).unwrap_or(rest);
                    if MAGIC.get(..seen.len()) != Some(seen) {
                        return Err(Error::BadMagic {
                            offset: start,
                            expected: "TNSO",
                            found: seen.to_vec(),
                        });
                    }
                    need!(add(start, 8)?);
                    let version = bytes_at(prefix, start + 4, 1).map_or(0, |b| b[0]);
                    let (flags, code, ndim, base) = match version {
                        4 => {
                            need!(add(start, 10)?);
                            let h = bytes_at(prefix, start + 5, 4).unwrap_or(&[0; 4]);
                            (u16::from_le_bytes([h[0], h[1]]), h[2], h[3], 10)
                        }
                        3 => {
                            let h = bytes_at(prefix, start + 5, 3).unwrap_or(&[0; 3]);
                            (u16::from(h[0]), h[1], h[2], 8)
                        }
                        other => {
                            return Err(Error::unsupported(format!(
                                "tenso protocol version {other} at offset {} (3 and 4 are read)",
                                start + 4
                            )))
                        }
                    };
                    frame.pos = start + base;
                    let code_at = start + if base == 10 { 7 } else { 6 };
                    frame.state = kind_of(&self.limits, code_at, start, flags, code, ndim)?;
                }
                State::Shape { kind, ndim, flags } => {
                    let shape_len = 4 * u64::from(ndim);
                    need!(add(pos, shape_len)?);
                    let mut numel: u64 = 1;
                    let mut first = 0u64;
                    for i in 0..u64::from(ndim) {
                        let d = u64::from(u32_at(prefix, pos + 4 * i).unwrap_or(0));
                        if i == 0 {
                            first = d;
                        }
                        numel = numel.saturating_mul(d);
                    }
                    frame.pos = pos + shape_len;
                    let footer = if flags & flags::INTEGRITY != 0 { 8 } else { 0 };
                    frame.state = match kind {
                        Kind::Sparse => State::Sparse { left: 3 },
                        Kind::Offsets => {
                            let count = if ndim == 0 { 0 } else { first };
                            Error::check_limit("string count", count, self.limits.max_elements)?;
                            State::Align {
                                body: Body::Offsets { count },
                                flags,
                            }
                        }
                        Kind::Dense { itemsize } => {
                            Error::check_limit("element count", numel, self.limits.max_elements)?;
                            let raw_len = mul(numel, itemsize)?;
                            let body = if flags & flags::COMPRESSED != 0 {
                                Body::Lz4 { raw_len }
                            } else {
                                Body::Fixed(add(raw_len, footer)?)
                            };
                            State::Align { body, flags }
                        }
                        Kind::Quantized { four_bit } => {
                            Error::check_limit("element count", numel, self.limits.max_elements)?;
                            let packed = if four_bit { numel.div_ceil(2) } else { numel };
                            State::QuantMeta {
                                body_len: add(packed, footer)?,
                                flags,
                            }
                        }
                    };
                }
                State::QuantMeta { body_len, flags } => {
                    need!(add(pos, 10)?);
                    let scales = u64::from(u32_at(prefix, pos + 6).unwrap_or(0));
                    Error::check_limit(
                        "quantization scale count",
                        scales,
                        self.limits.max_elements,
                    )?;
                    frame.pos = add(add(pos, 10)?, mul(scales, 8)?)?;
                    frame.state = State::Align {
                        body: Body::Fixed(body_len),
                        flags,
                    };
                }
                State::Align { body, flags } => {
                    let mut header_end = pos;
                    let alignment = if flags & flags::CUSTOM_ALIGNMENT != 0 {
                        need!(add(pos, 1)?);
                        let exp = bytes_at(prefix, pos, 1).map_or(0, |b| b[0]);
                        Error::check_limit(
                            "alignment exponent",
                            u64::from(exp),
                            u64::from(self.limits.max_alignment_exponent),
                        )?;
                        header_end = pos + 1;
                        1u64 << exp
                    } else if flags & flags::ALIGNED != 0 {
                        DEFAULT_ALIGNMENT as u64
                    } else {
                        1
                    };
                    // Alignment counts from this (sub-)packet's first byte.
                    let body_start = align_up(header_end - start, alignment)
                        .and_then(|o| o.checked_add(start))
                        .ok_or(Error::Overflow {
                            what: "packet body offset",
                        })?;
                    let footer = if flags & flags::INTEGRITY != 0 { 8 } else { 0 };
                    // Nothing changes before the last `need!`: the step reruns whole
                    // when it returns `Incomplete`.
                    let next = match body {
                        Body::Fixed(len) => State::Until {
                            end: add(body_start, len)?,
                        },
                        Body::Offsets { count } => State::Offsets { count, footer },
                        // Inside a length prefix the LZ4 frame runs to the footer, as
                        // tenso reads it; at the top level its blocks say where it ends.
                        Body::Lz4 { raw_len } => match frame.bound {
                            Some(bound) => {
                                need!(add(body_start, footer)?);
                                State::Until { end: bound }
                            }
                            None => State::Lz4Header { raw_len, footer },
                        },
                    };
                    frame.pos = body_start;
                    frame.state = next;
                }
                State::Offsets { count, footer } => {
                    let table = mul(add(count, 1)?, 8)?;
                    need!(add(pos, table)?);
                    let payload = u64_at(prefix, pos + 8 * count).unwrap_or(0);
                    frame.state = State::Until {
                        end: add(add(add(pos, table)?, payload)?, footer)?,
                    };
                }
                State::Lz4Header { raw_len, footer } => {
                    need!(add(pos, 7)?);
                    let h = bytes_at(prefix, pos, 7).unwrap_or(&[0; 7]);
                    if h[..4] != LZ4_MAGIC {
                        return Err(Error::malformed(
                            pos,
                            format!("LZ4 frame magic expected, found {:02x?}", &h[..4]),
                        ));
                    }
                    let (flg, bd) = (h[4], h[5]);
                    let block_code = (bd >> 4) & 7;
                    if flg >> 6 != 1 || flg & 0x02 != 0 || bd & 0x8F != 0 || block_code < 4 {
                        return Err(Error::malformed(
                            pos + 4,
                            format!("bad LZ4 frame descriptor FLG {flg:#04x} BD {bd:#04x}"),
                        ));
                    }
                    let has_size = flg & 0x08 != 0;
                    let header_len =
                        7 + if has_size { 8 } else { 0 } + if flg & 0x01 != 0 { 4 } else { 0 };
                    need!(add(pos, header_len)?);
                    if has_size {
                        let size = u64_at(prefix, pos + 6).unwrap_or(0);
                        if size != raw_len {
                            return Err(Error::malformed(
                                pos + 6,
                                format!(
                                    "LZ4 frame content size {size}, the shape needs {raw_len} bytes"
                                ),
                            ));
                        }
                    }
                    frame.pos = pos + header_len;
                    frame.state = State::Lz4Block {
                        lz4: Lz4Frame {
                            block_checksums: flg & 0x10 != 0,
                            content_checksum: flg & 0x04 != 0,
                            max_block: 1 << (8 + 2 * u64::from(block_code)),
                        },
                        footer,
                    };
                }
                State::Lz4Block { lz4, footer } => {
                    need!(add(pos, 4)?);
                    let word = u32_at(prefix, pos).unwrap_or(0);
                    if word == 0 {
                        let checksum = if lz4.content_checksum { 4 } else { 0 };
                        frame.state = State::Until {
                            end: add(pos, 4 + checksum + footer)?,
                        };
                    } else {
                        let size = u64::from(word & 0x7FFF_FFFF);
                        if size > lz4.max_block {
                            return Err(Error::malformed(
                                pos,
                                format!(
                                    "LZ4 block of {size} bytes, above the frame's {} byte blocks",
                                    lz4.max_block
                                ),
                            ));
                        }
                        let checksum = if lz4.block_checksums { 4 } else { 0 };
                        frame.pos = add(pos, 4 + size + checksum)?;
                    }
                }
                State::BundleKey { left } => {
                    if left == 0 {
                        frame.state = State::Until { end: pos };
                        continue;
                    }
                    need!(add(pos, 4)?);
                    let klen = u64::from(u32_at(prefix, pos).unwrap_or(0));
                    frame.pos = add(pos, add(4, klen)?)?;
                    frame.state = State::BundleValue { left };
                }
                State::BundleValue { left } => {
                    need!(add(pos, 4)?);
                    let vlen = u64::from(u32_at(prefix, pos).unwrap_or(0));
                    let child = pos + 4;
                    let end = add(child, vlen)?;
                    need_within(frame, end, &self.limits)?;
                    frame.pos = end;
                    frame.state = State::BundleKey { left: left - 1 };
                    self.push(depth, child, end)?;
                }
                State::Sparse { left } => {
                    if left == 0 {
                        frame.state = State::Until { end: pos };
                        continue;
                    }
                    need!(add(pos, 4)?);
                    let len = u64::from(u32_at(prefix, pos).unwrap_or(0));
                    let child = pos + 4;
                    let end = add(child, len)?;
                    need_within(frame, end, &self.limits)?;
                    frame.pos = end;
                    frame.state = State::Sparse { left: left - 1 };
                    self.push(depth, child, end)?;
                }
                State::Until { end } => {
                    need!(end);
                    // A member may end before its length prefix says (padding after it,
                    // as `EncodeOptions::aligned_bundle` writes and tenso reads); its
                    // parent goes on at the prefix's end.
                    self.stack.pop();
                    if self.stack.is_empty() {
                        self.reset();
                        return Ok(Framing::Complete { len: end });
                    }
                }
            }
        }
    }

    /// Starts framing a sub-packet that must end exactly at `end`.
    fn push(&mut self, depth: usize, start: u64, end: u64) -> Result<()> {
        Error::check_limit(
            "packet nesting depth",
            depth as u64,
            self.limits.max_nesting as u64,
        )?;
        self.stack.push(Frame {
            start,
            bound: Some(end),
            pos: start,
            state: State::Header,
        });
        Ok(())
    }
}

/// The layout that follows a header, by tenso's precedence: GPU reference, bundle,
/// sparse, string/ragged, quantized dtype, dense.
fn kind_of(
    limits: &PacketLimits,
    code_at: u64,
    start: u64,
    flags: u16,
    code: u8,
    ndim: u8,
) -> Result<State> {
    if flags & flags::GPU_IPC != 0 {
        return Ok(State::Until {
            end: add(start, IPC_REF_PACKET_LEN)?,
        });
    }
    if flags & flags::BUNDLE != 0 {
        Error::check_limit(
            "bundle entries",
            u64::from(ndim),
            limits.max_bundle_entries as u64,
        )?;
        return Ok(State::BundleKey {
            left: u16::from(ndim),
        });
    }
    Error::check_limit(
        "number of dimensions",
        u64::from(ndim),
        limits.max_ndim as u64,
    )?;
    let kind = if flags & (flags::SPARSE_COO | flags::SPARSE_CSR | flags::SPARSE_CSC) != 0 {
        Kind::Sparse
    } else if flags & (flags::STRING | flags::RAGGED) != 0 {
        Kind::Offsets
    } else if (16..=19).contains(&code) {
        Kind::Quantized {
            four_bit: code >= 18,
        }
    } else {
        let itemsize = dtype_from_code(code)
            .and_then(|d| d.size())
            .ok_or_else(|| {
                Error::malformed(code_at, format!("unknown dense packet dtype code {code}"))
            })?;
        Kind::Dense {
            itemsize: itemsize as u64,
        }
    };
    Ok(State::Shape { kind, ndim, flags })
}

/// Checks that a sub-packet ending at `end` fits its parent's length prefix and the
/// packet-size limit.
fn need_within(parent: &Frame, end: u64, limits: &PacketLimits) -> Result<()> {
    if let Some(bound) = parent.bound {
        if end > bound {
            return Err(Error::malformed(
                parent.start,
                format!(
                    "a member ends at {} bytes, past its parent's length prefix of {}",
                    end - parent.start,
                    bound - parent.start
                ),
            ));
        }
    }
    Error::check_limit("packet length", end, limits.max_packet_bytes)
}
