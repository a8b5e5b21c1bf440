//! Decoding packets of every kind.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use tensorwire_core::{
    align_up, AlignedBuf, Bytes, DType, Dims, Error, NameSet, Result, Shape, TensorView,
};
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use crate::codec::PacketLimits;
use crate::dtype::dtype_from_code;
use crate::value::{
    Bundle, IpcRef, MatrixShape, Packet, QuantScheme, QuantizedPacket, RaggedFraming, RaggedPacket,
    SparseFormat, SparsePacket, StringPacket,
};
use crate::{flags, DEFAULT_ALIGNMENT, MAGIC};

/// The dtype code of string packets.
pub(crate) const STRING_CODE: u8 = 20;
/// The keys tenso's `RaggedArray.dumps` writes, in its order.
pub(crate) const RAGGED_KEYS: [&str; 3] =
    ["__ragged_offsets__", "__ragged_flat__", "__ragged_count__"];
/// The v4 reserved byte of an IPC reference.
pub(crate) const IPC_DISCRIMINATOR: u8 = 1;
/// Length of an IPC reference packet: header and a 96-byte body.
pub(crate) const IPC_PACKET_LEN: usize = 10 + 64 + 8 + 8 + 16;

const KIND_FLAGS: [u16; 7] = [
    flags::BUNDLE,
    flags::SPARSE_COO,
    flags::SPARSE_CSR,
    flags::SPARSE_CSC,
    flags::STRING,
    flags::RAGGED,
    flags::GPU_IPC,
];
const KNOWN_FLAGS: u16 = 0x07ff;
const LAYOUT_FLAGS: u16 = flags::ALIGNED | flags::CUSTOM_ALIGNMENT | flags::INTEGRITY;

/// Decodes one packet of any kind with default limits.
pub fn decode_packet(input: &Bytes) -> Result<Packet> {
    decode_packet_with(input, &PacketLimits::default())
}

/// Decodes one packet of any kind: `input` must be exactly one packet. Every length is
/// checked against the input and `limits` before it is used; dense bodies, bundle
/// members and sparse parts borrow `input`; XXH3 footers are verified.
pub fn decode_packet_with(input: &Bytes, limits: &PacketLimits) -> Result<Packet> {
    decode_noting(input, limits).map(|(packet, _)| packet)
}

/// What [`decode_noting`] saw beside the packet, for `PacketSource`.
#[derive(Debug, Default)]
pub(crate) struct DecodeNotes {
    /// Integrity footers checked (one per packet, nested ones included, that carries
    /// one).
    pub digests: usize,
    /// Where each LZ4 frame lies in the input, `(offset, length)`, by the buffer it was
    /// decoded into ([`decoded_buffer_key`] of the tensor's bytes).
    pub frames: HashMap<usize, (u64, u64)>,
}

/// Tells decoded buffers apart: the address of their owner, which each decoded body
/// has to itself (an empty one too) and keeps while any view of it lives.
pub(crate) fn decoded_buffer_key(bytes: &Bytes) -> usize {
    Arc::as_ptr(bytes.owner()) as *const u8 as usize
}

/// [`decode_packet_with`], also returning what it saw on the way ([`DecodeNotes`]).
pub(crate) fn decode_noting(input: &Bytes, limits: &PacketLimits) -> Result<(Packet, DecodeNotes)> {
    Error::check_limit("packet length", input.len() as u64, limits.max_packet_bytes)?;
    let reader = Reader {
        input,
        limits,
        notes: RefCell::new(DecodeNotes::default()),
    };
    let (packet, end) = reader.packet(0, input.len(), 0)?;
    if end != input.len() {
        return Err(Error::malformed(
            end as u64,
            format!("{} bytes after the end of the packet", input.len() - end),
        ));
    }
    Ok((packet, reader.notes.into_inner()))
}

/// The header fields every packet starts with.
struct Head {
    start: usize,
    version: u8,
    flags: u16,
    code: u8,
    ndim: usize,
    reserved: u8,
    /// Absolute offset just after the fixed header.
    pos: usize,
}

struct Reader<'a> {
    input: &'a Bytes,
    limits: &'a PacketLimits,
    /// What decoding saw so far.
    notes: RefCell<DecodeNotes>,
}

fn truncated(offset: usize, needed: usize, available: usize) -> Error {
    Error::Truncated {
        offset: offset as u64,
        needed: needed as u64,
        available: available as u64,
    }
}

fn overflow(what: &'static str) -> Error {
    Error::Overflow { what }
}

fn u32_le(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(b);
    u32::from_le_bytes(a)
}

fn u64_le(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_le_bytes(a)
}

fn to_usize(v: u64, what: &'static str) -> Result<usize> {
    usize::try_from(v).map_err(|_| overflow(what))
}

fn vector(len: usize) -> Result<Shape> {
    Shape::from_dims(&[len as u64])
}

impl Reader<'_> {
    /// `n` bytes at absolute offset `at`, within a span ending at `end`.
    fn take(&self, at: usize, n: usize, end: usize) -> Result<&[u8]> {
        let stop = at.checked_add(n).ok_or_else(|| overflow("packet offset"))?;
        if stop > end {
            return Err(truncated(at, n, end.saturating_sub(at)));
        }
        self.input
            .get(at..stop)
            .ok_or_else(|| truncated(at, n, self.input.len().saturating_sub(at)))
    }

    fn u32_at(&self, at: usize, end: usize) -> Result<u32> {
        self.take(at, 4, end).map(u32_le)
    }

    fn view(&self, dtype: DType, shape: Shape, at: usize, len: usize) -> Result<TensorView> {
        let bytes = self.input.slice(at..at + len)?;
        TensorView::new("packet body", dtype, shape, bytes, true)
    }

    /// Decodes the packet at `start` in a span ending at `end`; returns it and the
    /// absolute offset where it ends.
    fn packet(&self, start: usize, end: usize, depth: usize) -> Result<(Packet, usize)> {
        Error::check_limit(
            "packet nesting depth",
            depth as u64,
            self.limits.max_nesting as u64,
        )?;
        let head = self.head(start, end)?;
        if head.flags & !KNOWN_FLAGS != 0 {
            return Err(Error::unsupported(format!(
                "packet flags {:#06x}",
                head.flags & !KNOWN_FLAGS
            )));
        }
        let kinds: Vec<u16> = KIND_FLAGS
            .iter()
            .copied()
            .filter(|k| head.flags & k != 0)
            .collect();
        match kinds.as_slice() {
            [] if (16..=19).contains(&head.code) => self.quantized(&head, end),
            [] => self.dense(&head, end),
            [flags::BUNDLE] => self.bundle(&head, end, depth),
            [flags::SPARSE_COO] => self.sparse(&head, end, depth, SparseFormat::Coo),
            [flags::SPARSE_CSR] => self.sparse(&head, end, depth, SparseFormat::Csr),
            [flags::SPARSE_CSC] => self.sparse(&head, end, depth, SparseFormat::Csc),
            [flags::STRING] => self.strings(&head, end),
            [flags::RAGGED] => self.ragged_flag(&head, end),
            [flags::GPU_IPC] => self.ipc_ref(&head, end),
            _ => Err(Error::malformed(
                start as u64 + 5,
                format!("packet flags {:#06x} name more than one kind", head.flags),
            )),
        }
    }

    fn head(&self, start: usize, end: usize) -> Result<Head> {
        let magic = self.take(start, 4, end)?;
        if magic != MAGIC {
            return Err(Error::BadMagic {
                offset: start as u64,
                expected: "TNSO",
                found: magic.to_vec(),
            });
        }
        let version = self.take(start + 4, 1, end)?[0];
        match version {
            4 => {
                let h = self.take(start + 5, 5, end)?;
                Ok(Head {
                    start,
                    version,
                    flags: u16::from_le_bytes([h[0], h[1]]),
                    code: h[2],
                    ndim: usize::from(h[3]),
                    reserved: h[4],
                    pos: start + 10,
                })
            }
            3 => {
                let h = self.take(start + 5, 3, end)?;
                Ok(Head {
                    start,
                    version,
                    flags: u16::from(h[0]),
                    code: h[1],
                    ndim: usize::from(h[2]),
                    reserved: 0,
                    pos: start + 8,
                })
            }
            other => Err(Error::unsupported(format!(
                "tenso protocol version {other} (3 and 4 are read)"
            ))),
        }
    }

    fn only_flags(&self, head: &Head, allowed: u16, kind: &str) -> Result<()> {
        let extra = head.flags & !allowed;
        if extra != 0 {
            return Err(Error::malformed(
                head.start as u64 + 5,
                format!("flags {extra:#06x} are not valid on a {kind} packet"),
            ));
        }
        Ok(())
    }

    fn code(&self, head: &Head, want: u8, kind: &str) -> Result<()> {
        if head.code != want {
            return Err(Error::malformed(
                head.start as u64 + 7,
                format!(
                    "dtype code {} on a {kind} packet (expected {want})",
                    head.code
                ),
            ));
        }
        Ok(())
    }

    /// Reads `ndim` dimensions at `head.pos`; returns the shape and the offset after it.
    fn shape(&self, head: &Head, end: usize, max_elements: Option<u64>) -> Result<(Shape, usize)> {
        let (dims, after) = self.dims(head, end)?;
        let shape = Shape::try_from_dims(dims)?;
        if let Some(max) = max_elements {
            Error::check_limit("element count", shape.numel()?, max)?;
        }
        Ok((shape, after))
    }

    /// The `ndim` raw dimensions at `head.pos` (inline for the usual ranks), and the
    /// offset after them; their product is not checked.
    fn dims(&self, head: &Head, end: usize) -> Result<(Dims, usize)> {
        Error::check_limit(
            "number of dimensions",
            head.ndim as u64,
            self.limits.max_ndim as u64,
        )?;
        let raw = self.take(head.pos, head.ndim * 4, end)?;
        let dims = raw.chunks_exact(4).map(|b| u64::from(u32_le(b))).collect();
        Ok((dims, head.pos + head.ndim * 4))
    }

    /// Resolves the alignment (custom exponent byte at `pos` when flagged) and returns
    /// `(alignment, absolute body offset)`.
    fn body_offset(&self, head: &Head, mut pos: usize, end: usize) -> Result<(usize, usize)> {
        let alignment = if head.flags & flags::CUSTOM_ALIGNMENT != 0 {
            let exp = self.take(pos, 1, end)?[0];
            pos += 1;
            Error::check_limit(
                "alignment exponent",
                u64::from(exp),
                u64::from(self.limits.max_alignment_exponent),
            )?;
            1usize << exp
        } else if head.flags & flags::ALIGNED != 0 {
            DEFAULT_ALIGNMENT
        } else {
            1
        };
        let rel = align_up((pos - head.start) as u64, alignment as u64)
            .and_then(|r| usize::try_from(r).ok())
            .ok_or_else(|| overflow("packet body offset"))?;
        let body = head
            .start
            .checked_add(rel)
            .ok_or_else(|| overflow("packet body offset"))?;
        if body > end {
            return Err(truncated(pos, body - pos, end.saturating_sub(pos)));
        }
        Ok((alignment, body))
    }

    fn check_footer(&self, head: &Head, hash: u64, at: usize, end: usize) -> Result<usize> {
        if head.flags & flags::INTEGRITY == 0 {
            return Ok(at);
        }
        let stored = u64_le(self.take(at, 8, end)?);
        if stored != hash {
            return Err(Error::DigestMismatch {
                tensor: format!("packet at offset {}", head.start),
                algorithm: "xxh3-64",
                expected: format!("{stored:016x}"),
                found: format!("{hash:016x}"),
            });
        }
        self.notes.borrow_mut().digests += 1;
        Ok(at + 8)
    }

    fn dense(&self, head: &Head, end: usize) -> Result<(Packet, usize)> {
        self.only_flags(head, LAYOUT_FLAGS | flags::COMPRESSED, "dense")?;
        let dtype = dtype_from_code(head.code)
            .filter(|_| (1..=15).contains(&head.code))
            .ok_or_else(|| {
                Error::malformed(
                    head.start as u64 + 7,
                    format!("unknown dense dtype code {}", head.code),
                )
            })?;
        let (shape, pos) = self.shape(head, end, Some(self.limits.max_elements))?;
        let (_, body_at) = self.body_offset(head, pos, end)?;
        let body_len = to_usize(shape.byte_len(dtype)?, "packet body length")?;
        let footer = if head.flags & flags::INTEGRITY != 0 {
            8
        } else {
            0
        };
        if head.flags & flags::COMPRESSED != 0 {
            // No length field: the frame runs to the footer, i.e. to the span's end.
            if end - body_at < footer {
                return Err(truncated(body_at, footer, end - body_at));
            }
            let frame = self.take(body_at, end - body_at - footer, end)?;
            let stop = self.check_footer(head, xxh3_64(frame), end - footer, end)?;
            let what = format!("packet at offset {}", head.start);
            let buf = crate::lz4::decompress(frame, body_len, &what)?.into_bytes();
            self.notes.borrow_mut().frames.insert(
                decoded_buffer_key(&buf),
                (body_at as u64, frame.len() as u64),
            );
            let view = TensorView::new(&what, dtype, shape, buf, false)?;
            return Ok((Packet::Dense(view), stop));
        }
        let body = self.take(body_at, body_len, end)?;
        let hash = if footer != 0 { xxh3_64(body) } else { 0 };
        let stop = self.check_footer(head, hash, body_at + body_len, end)?;
        let view = self.view(dtype, shape, body_at, body_len)?;
        Ok((Packet::Dense(view), stop))
    }

    /// A member's span: the member packet, then only zero padding (what an aligned
    /// bundle puts there; tenso ignores bytes after a member).
    fn member(&self, start: usize, end: usize, depth: usize) -> Result<Packet> {
        let (packet, stop) = self.packet(start, end, depth + 1)?;
        let pad = self.take(stop, end - stop, end)?;
        if let Some(i) = pad.iter().position(|&b| b != 0) {
            return Err(Error::malformed(
                (stop + i) as u64,
                "non-zero bytes after a member packet",
            ));
        }
        Ok(packet)
    }

    fn bundle(&self, head: &Head, end: usize, depth: usize) -> Result<(Packet, usize)> {
        self.only_flags(head, flags::BUNDLE, "bundle")?;
        self.code(head, 0, "bundle")?;
        let count = head.ndim;
        Error::check_limit(
            "bundle entries",
            count as u64,
            self.limits.max_bundle_entries as u64,
        )?;
        let mut entries = Vec::with_capacity(count);
        let mut seen = NameSet::with_capacity_and_hasher(count, Default::default());
        let mut at = head.pos;
        for _ in 0..count {
            let klen = to_usize(u64::from(self.u32_at(at, end)?), "bundle key length")?;
            let key_at = at + 4;
            let key = std::str::from_utf8(self.take(key_at, klen, end)?).map_err(|e| {
                Error::malformed(
                    (key_at + e.valid_up_to()) as u64,
                    "bundle key is not valid UTF-8",
                )
            })?;
            if !seen.insert(key) {
                return Err(Error::Duplicate {
                    name: key.to_owned(),
                });
            }
            let vlen_at = key_at + klen;
            let vlen = to_usize(u64::from(self.u32_at(vlen_at, end)?), "bundle value length")?;
            let value_at = vlen_at + 4;
            self.take(value_at, vlen, end)?;
            let member = self.member(value_at, value_at + vlen, depth)?;
            entries.push((key.to_owned(), member));
            at = value_at + vlen;
        }
        let bundle = Bundle { entries };
        let packet = if bundle
            .entries
            .iter()
            .map(|(k, _)| k.as_str())
            .eq(RAGGED_KEYS)
        {
            Packet::Ragged(ragged_from_bundle(bundle, head.start)?)
        } else {
            Packet::Bundle(bundle)
        };
        Ok((packet, at))
    }

    fn sparse(
        &self,
        head: &Head,
        end: usize,
        depth: usize,
        format: SparseFormat,
    ) -> Result<(Packet, usize)> {
        self.only_flags(head, format.flag(), "sparse")?;
        self.code(head, 0, "sparse")?;
        // The logical shape of a sparse matrix may exceed the element limit, and even
        // i64 (only its parts are arrays, checked as the dense packets they are).
        let (dims, mut at) = self.dims(head, end)?;
        let shape = MatrixShape::from_dims(dims.as_slice())
            .map_err(|reason| Error::malformed(head.start as u64, reason))?;
        let mut parts = Vec::with_capacity(3);
        for name in format.part_names() {
            let len = to_usize(u64::from(self.u32_at(at, end)?), "sparse part length")?;
            self.take(at + 4, len, end)?;
            match self.member(at + 4, at + 4 + len, depth)? {
                Packet::Dense(v) if v.shape.ndim() == 1 => parts.push(v),
                _ => {
                    return Err(Error::malformed(
                        at as u64 + 4,
                        format!("sparse part `{name}` is not a 1-D dense packet"),
                    ))
                }
            }
            at += 4 + len;
        }
        let [data, indices, pointers]: [TensorView; 3] = parts
            .try_into()
            .map_err(|_| Error::malformed(head.start as u64, "sparse packet without 3 parts"))?;
        let sparse = SparsePacket {
            format,
            shape,
            data,
            indices,
            pointers,
        };
        let described =
            [&sparse.data, &sparse.indices, &sparse.pointers].map(|v| (v.dtype, v.shape.dims()[0]));
        check_sparse_parts(format, &sparse.shape, described)
            .map_err(|reason| Error::malformed(head.start as u64, reason))?;
        Ok((Packet::Sparse(sparse), at))
    }

    /// The shared body of string and flag-ragged packets: `count + 1` u64 offsets (from
    /// 0, non-decreasing) then the payload they index; returns the offsets' and the
    /// payload's absolute ranges and where the packet ends.
    fn offsets_payload(&self, head: &Head, end: usize) -> Result<(usize, usize, usize, usize)> {
        if head.ndim != 1 {
            return Err(Error::malformed(
                head.start as u64 + 8,
                format!("ndim {} (string and ragged packets have 1)", head.ndim),
            ));
        }
        let (shape, pos) = self.shape(head, end, None)?;
        let count = shape.dims()[0];
        Error::check_limit("string or row count", count, self.limits.max_elements)?;
        let (_, body_at) = self.body_offset(head, pos, end)?;
        let offsets_len = count
            .checked_add(1)
            .and_then(|n| n.checked_mul(8))
            .ok_or_else(|| overflow("offsets length"))
            .and_then(|n| to_usize(n, "offsets length"))?;
        let raw = self.take(body_at, offsets_len, end)?;
        let mut prev = 0u64;
        for (i, b) in raw.chunks_exact(8).enumerate() {
            let o = u64_le(b);
            if (i == 0 && o != 0) || o < prev {
                return Err(Error::malformed(
                    (body_at + i * 8) as u64,
                    format!("offset {i} is {o}, after {prev}: offsets must start at 0 and never decrease"),
                ));
            }
            prev = o;
        }
        let payload_at = body_at + offsets_len;
        let payload_len = to_usize(prev, "payload length")?;
        let payload = self.take(payload_at, payload_len, end)?;
        let hash = if head.flags & flags::INTEGRITY != 0 {
            let mut h = Xxh3::new();
            h.update(raw);
            h.update(payload);
            h.digest()
        } else {
            0
        };
        let stop = self.check_footer(head, hash, payload_at + payload_len, end)?;
        Ok((body_at, offsets_len, payload_len, stop))
    }

    fn strings(&self, head: &Head, end: usize) -> Result<(Packet, usize)> {
        self.only_flags(head, flags::STRING | LAYOUT_FLAGS, "string")?;
        self.code(head, STRING_CODE, "string")?;
        let (at, offsets_len, payload_len, stop) = self.offsets_payload(head, end)?;
        let offsets = self.view(DType::U64, vector(offsets_len / 8)?, at, offsets_len)?;
        let payload = self.view(
            DType::U8,
            vector(payload_len)?,
            at + offsets_len,
            payload_len,
        )?;
        Ok((Packet::Strings(StringPacket { offsets, payload }), stop))
    }

    fn ragged_flag(&self, head: &Head, end: usize) -> Result<(Packet, usize)> {
        self.only_flags(head, flags::RAGGED | LAYOUT_FLAGS, "ragged")?;
        let dtype = dtype_from_code(head.code)
            .filter(|_| (1..=15).contains(&head.code))
            .ok_or_else(|| {
                Error::malformed(
                    head.start as u64 + 7,
                    format!("dtype code {} on a ragged packet", head.code),
                )
            })?;
        let item = dtype.size().unwrap_or(1);
        let (at, offsets_len, payload_len, stop) = self.offsets_payload(head, end)?;
        // The wire counts bytes; the value counts elements of `flat`.
        let mut offsets = AlignedBuf::zeroed(offsets_len)?;
        let raw = self.take(at, offsets_len, end)?;
        for (i, (src, dst)) in raw
            .chunks_exact(8)
            .zip(offsets.as_mut_slice().chunks_exact_mut(8))
            .enumerate()
        {
            let o = u64_le(src);
            if o % item as u64 != 0 {
                return Err(Error::malformed(
                    (at + i * 8) as u64,
                    format!("ragged byte offset {o} is not a multiple of the {item}-byte {dtype}"),
                ));
            }
            dst.copy_from_slice(&(o / item as u64).to_le_bytes());
        }
        let offsets = TensorView::new(
            "ragged offsets",
            DType::U64,
            vector(offsets_len / 8)?,
            offsets.into_bytes(),
            false,
        )?;
        let flat = self.view(
            dtype,
            vector(payload_len / item)?,
            at + offsets_len,
            payload_len,
        )?;
        let ragged = RaggedPacket {
            offsets,
            flat,
            framing: RaggedFraming::Flag,
        };
        Ok((Packet::Ragged(ragged), stop))
    }

    fn quantized(&self, head: &Head, end: usize) -> Result<(Packet, usize)> {
        self.only_flags(head, LAYOUT_FLAGS, "quantized")?;
        let dtype = dtype_from_code(head.code).ok_or_else(|| {
            Error::malformed(head.start as u64 + 7, "unknown quantized dtype code")
        })?;
        let (shape, meta_at) = self.shape(head, end, Some(self.limits.max_elements))?;
        let meta = self.take(meta_at, 10, end)?;
        let scheme = QuantScheme::from_code(meta[0]).ok_or_else(|| {
            Error::malformed(
                meta_at as u64,
                format!("unknown quantization scheme {}", meta[0]),
            )
        })?;
        let axis = meta[1];
        let group_size = u32_le(&meta[2..6]);
        let num_scales = to_usize(u64::from(u32_le(&meta[6..10])), "number of scales")?;
        check_scale_count(&shape, scheme, axis, group_size, num_scales)
            .map_err(|reason| Error::malformed(meta_at as u64 + 6, reason))?;
        let floats_at = meta_at + 10;
        // Both arrays must be in the input before anything is allocated for them.
        let floats_len = num_scales
            .checked_mul(8)
            .ok_or_else(|| overflow("scales length"))?;
        let floats = self.take(floats_at, floats_len, end)?;
        let (scales_raw, zeros_raw) = floats.split_at(num_scales * 4);
        let f32s = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_bits(u32_le(c)))
                .collect()
        };
        let meta_end = floats_at + floats_len;
        let (_, body_at) = self.body_offset(head, meta_end, end)?;
        let body_len = to_usize(shape.byte_len(dtype)?, "quantized body length")?;
        let body = self.take(body_at, body_len, end)?;
        let hash = if head.flags & flags::INTEGRITY != 0 {
            let mut h = Xxh3::new();
            h.update(self.take(meta_at, meta_end - meta_at, end)?);
            h.update(body);
            h.digest()
        } else {
            0
        };
        let stop = self.check_footer(head, hash, body_at + body_len, end)?;
        let q = QuantizedPacket {
            dtype,
            shape,
            scheme,
            axis,
            group_size,
            scales: f32s(scales_raw),
            zero_points: f32s(zeros_raw),
            data: self.input.slice(body_at..body_at + body_len)?,
        };
        Ok((Packet::Quantized(q), stop))
    }

    fn ipc_ref(&self, head: &Head, end: usize) -> Result<(Packet, usize)> {
        self.only_flags(head, flags::GPU_IPC, "GPU IPC reference")?;
        self.code(head, 0, "GPU IPC reference")?;
        if head.version != 4 || head.reserved != IPC_DISCRIMINATOR || head.ndim != 0 {
            return Err(Error::malformed(
                head.start as u64 + 4,
                "a GPU IPC reference is a v4 packet with ndim 0 and reserved byte 1",
            ));
        }
        let body = self.take(head.pos, IPC_PACKET_LEN - 10, end)?;
        let (handle, rest) = body.split_at(64);
        let (offset, rest) = rest.split_at(8);
        let (nbytes, uuid) = rest.split_at(8);
        let r = IpcRef {
            handle: handle.try_into().unwrap_or([0; 64]),
            byte_offset: u64_le(offset),
            nbytes: u64_le(nbytes),
            device_uuid: uuid.try_into().unwrap_or([0; 16]),
        };
        Ok((Packet::IpcRef(r), head.start + IPC_PACKET_LEN))
    }
}

/// How many scales a scheme needs, as tenso's `QuantizedTensor.quantize` writes them:
/// one per tensor, one per slice along `axis` (a signed byte: 255 is the last axis), or
/// one per `group_size` elements.
pub(crate) fn check_scale_count(
    shape: &Shape,
    scheme: QuantScheme,
    axis: u8,
    group_size: u32,
    num_scales: usize,
) -> std::result::Result<(), String> {
    let want = match scheme {
        QuantScheme::PerTensor => 1,
        QuantScheme::PerChannel => {
            let ndim = shape.ndim() as i64;
            let a = i64::from(axis as i8);
            let a = if a < 0 { a + ndim } else { a };
            if !(0..ndim).contains(&a) {
                return Err(format!(
                    "per-channel axis {axis} outside the {ndim} dimensions"
                ));
            }
            shape.dims()[a as usize]
        }
        QuantScheme::PerGroup => {
            if group_size == 0 {
                return Err("per-group quantization with group size 0".to_owned());
            }
            shape
                .numel()
                .map_err(|e| e.to_string())?
                .div_ceil(u64::from(group_size))
        }
    };
    if want != num_scales as u64 {
        return Err(format!(
            "{num_scales} scales for {} quantization of {shape} (expected {want})",
            scheme.name()
        ));
    }
    Ok(())
}

fn is_index(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::I8
            | DType::I16
            | DType::I32
            | DType::I64
            | DType::U8
            | DType::U16
            | DType::U32
            | DType::U64
    )
}

/// The structural checks scipy itself makes on the parts' dtypes and lengths
/// (`(dtype, length)` of data, indices, pointers); index values are not range-checked.
pub(crate) fn check_sparse_parts(
    format: SparseFormat,
    shape: &MatrixShape,
    parts: [(DType, u64); 3],
) -> std::result::Result<(), String> {
    let names = format.part_names();
    let [(_, n), (idx_dtype, idx_len), (ptr_dtype, ptr_len)] = parts;
    if !is_index(idx_dtype) || !is_index(ptr_dtype) {
        return Err(format!(
            "sparse {} parts `{}`/`{}` must be integers, not {idx_dtype}/{ptr_dtype}",
            format.name(),
            names[1],
            names[2],
        ));
    }
    match format {
        SparseFormat::Coo if idx_len != n || ptr_len != n => Err(format!(
            "sparse coo parts have {n}, {idx_len} and {ptr_len} entries"
        )),
        SparseFormat::Csr | SparseFormat::Csc if idx_len != n => Err(format!(
            "sparse {} has {n} values but {idx_len} indices",
            format.name()
        )),
        SparseFormat::Csr | SparseFormat::Csc => {
            let major = shape.dims()[usize::from(format == SparseFormat::Csc)];
            if major.checked_add(1) != Some(ptr_len) {
                return Err(format!(
                    "sparse {} of shape {shape} has {ptr_len} pointers (expected {major} + 1)",
                    format.name()
                ));
            }
            Ok(())
        }
        SparseFormat::Coo => Ok(()),
    }
}

/// A bundle with exactly tenso's ragged keys, checked as `RaggedArray.loads` checks it
/// (and a little more: offsets start at 0).
fn ragged_from_bundle(bundle: Bundle, start: usize) -> Result<RaggedPacket> {
    let bad = |reason: String| Error::malformed(start as u64, reason);
    let mut members = bundle.entries.into_iter().map(|(_, p)| p);
    let (Some(Packet::Dense(offsets)), Some(Packet::Dense(flat)), Some(Packet::Dense(count))) =
        (members.next(), members.next(), members.next())
    else {
        return Err(bad("ragged bundle members must be dense tensors".into()));
    };
    if offsets.dtype != DType::U64 || offsets.shape.ndim() != 1 {
        return Err(bad(format!(
            "ragged offsets are {} {}, not u64 [n + 1]",
            offsets.dtype, offsets.shape
        )));
    }
    if count.dtype != DType::U64 || count.shape.dims() != [1] {
        return Err(bad(format!(
            "ragged count is {} {}, not u64 [1]",
            count.dtype, count.shape
        )));
    }
    if flat.shape.ndim() != 1 {
        return Err(bad(format!(
            "ragged values have shape {}, not 1-D",
            flat.shape
        )));
    }
    let n = u64_le(&count.bytes);
    let values: Vec<u64> = offsets.bytes.chunks_exact(8).map(u64_le).collect();
    if values.len() as u64 != n.saturating_add(1) {
        return Err(bad(format!("{} ragged offsets for {n} rows", values.len())));
    }
    let mut prev = 0u64;
    for (i, &o) in values.iter().enumerate() {
        if (i == 0 && o != 0) || o < prev {
            return Err(bad(format!(
                "ragged offset {i} is {o}, after {prev}: offsets must start at 0 and never decrease"
            )));
        }
        prev = o;
    }
    if prev != flat.shape.dims()[0] {
        return Err(bad(format!(
            "ragged offsets end at {prev} but there are {} values",
            flat.shape.dims()[0]
        )));
    }
    Ok(RaggedPacket {
        offsets,
        flat,
        framing: RaggedFraming::Bundle,
    })
}
