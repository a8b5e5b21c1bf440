//! Encoding packets of every kind from borrowed parts.

use tensorwire_core::{DType, Error, NameSet, Result, Shape};
use xxhash_rust::xxh3::xxh3_64;

use crate::codec::{encode_parts, EncodeOptions, PacketLimits};
use crate::dtype::dtype_code;
use crate::read::{
    check_scale_count, check_sparse_parts, IPC_DISCRIMINATOR, RAGGED_KEYS, STRING_CODE,
};
use crate::value::{IpcRef, MatrixShape, Packet, QuantScheme, RaggedFraming, SparseFormat};
use crate::{flags, DEFAULT_ALIGNMENT, MAGIC, VERSION};

/// A packet to encode, borrowing the caller's bytes (nothing is copied until the
/// packet itself is written).
///
/// Element bytes are little-endian and row-major, exactly `shape × dtype` long.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum PacketRef<'a> {
    /// A dense tensor (dtype codes 1–15).
    Dense {
        /// Element type.
        dtype: DType,
        /// Shape.
        shape: Shape,
        /// The elements.
        body: &'a [u8],
    },
    /// A sparse matrix; each part must be a 1-D [`PacketRef::Dense`].
    Sparse {
        /// COO, CSR or CSC.
        format: SparseFormat,
        /// The matrix shape.
        shape: MatrixShape,
        /// The values.
        data: Box<PacketRef<'a>>,
        /// COO row indices; CSR/CSC `indices`.
        indices: Box<PacketRef<'a>>,
        /// COO column indices; CSR/CSC `indptr`.
        pointers: Box<PacketRef<'a>>,
    },
    /// A bundle: `(key, member)` in wire order; keys unique, at most 255 entries.
    Bundle(Vec<(&'a str, PacketRef<'a>)>),
    /// Strings: `count + 1` little-endian `u64` byte offsets (from 0, never
    /// decreasing, ending at `payload.len()`) and the concatenated elements.
    Strings {
        /// The offsets, `8 × (count + 1)` bytes.
        offsets: &'a [u8],
        /// The elements' bytes.
        payload: &'a [u8],
    },
    /// A ragged array: `count + 1` little-endian `u64` row starts counting elements of
    /// `flat` (from 0, never decreasing, ending at its length).
    Ragged {
        /// Bundle (what tenso writes) or flag-0x200 framing.
        framing: RaggedFraming,
        /// The row starts, `8 × (count + 1)` bytes.
        offsets: &'a [u8],
        /// Element type of `flat` (a dense dtype).
        dtype: DType,
        /// The rows' elements back to back.
        flat: &'a [u8],
    },
    /// A quantized tensor.
    Quantized {
        /// [`DType::QInt8`], [`DType::QUInt8`], [`DType::QInt4`] or [`DType::QUInt4`].
        dtype: DType,
        /// The logical shape.
        shape: Shape,
        /// How the scales apply.
        scheme: QuantScheme,
        /// Channel axis byte (tenso writes `axis & 0xFF`).
        axis: u8,
        /// Elements per group.
        group_size: u32,
        /// Little-endian `f32` scales.
        scales: &'a [u8],
        /// Little-endian `f32` zero points, as many as scales.
        zero_points: &'a [u8],
        /// The packed body, exactly `ceil(n × bits / 8)` bytes.
        data: &'a [u8],
    },
    /// A GPU IPC reference.
    IpcRef(IpcRef),
}

/// How one packet is laid out (what tenso passes down to members and parts).
#[derive(Debug, Clone, Copy)]
struct Layout {
    alignment: usize,
    integrity: bool,
    compress: bool,
}

/// tenso writes sparse parts as plain packets whatever the options.
const PART_LAYOUT: Layout = Layout {
    alignment: DEFAULT_ALIGNMENT,
    integrity: false,
    compress: false,
};

/// Encodes a packet of any kind as a new vector: the bytes tenso 0.24 writes for the
/// same value and options (see `docs/formats/packet.md` for which options each kind
/// honours).
pub fn encode_packet(packet: &PacketRef<'_>, options: &EncodeOptions) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    encode_packet_into(packet, options, &mut out)?;
    Ok(out)
}

/// Appends a packet to `out` (alignment counts from where it starts); on error `out`
/// is left as it was.
pub fn encode_packet_into(
    packet: &PacketRef<'_>,
    options: &EncodeOptions,
    out: &mut Vec<u8>,
) -> Result<()> {
    let origin = out.len();
    let layout = Layout {
        alignment: options.alignment,
        integrity: options.integrity,
        compress: options.compress,
    };
    let mut w = Writer {
        out,
        origin,
        aligned: options.aligned_bundle,
        limits: PacketLimits::default(),
    };
    let result = w.packet(packet, layout, 0);
    if result.is_err() {
        out.truncate(origin);
    }
    result
}

struct Writer<'o> {
    out: &'o mut Vec<u8>,
    origin: usize,
    aligned: bool,
    limits: PacketLimits,
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::InvalidArgument {
        reason: reason.into(),
    }
}

fn le_u64s(bytes: &[u8], what: &str) -> Result<Vec<u64>> {
    if bytes.len() % 8 != 0 || bytes.is_empty() {
        return Err(invalid(format!(
            "{what}: {} bytes is not 8 × (count + 1)",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect())
}

/// Checks offsets: from 0, never decreasing, ending at `last`.
fn check_offsets(offsets: &[u64], last: u64, what: &str) -> Result<()> {
    let mut prev = 0u64;
    for (i, &o) in offsets.iter().enumerate() {
        if (i == 0 && o != 0) || o < prev {
            return Err(invalid(format!(
                "{what}: offset {i} is {o} after {prev} (must start at 0 and never decrease)"
            )));
        }
        prev = o;
    }
    if prev != last {
        return Err(invalid(format!(
            "{what}: offsets end at {prev}, not {last}"
        )));
    }
    Ok(())
}

fn header_flags(layout: Layout) -> u16 {
    let mut f = if layout.alignment == DEFAULT_ALIGNMENT {
        flags::ALIGNED
    } else {
        flags::CUSTOM_ALIGNMENT
    };
    if layout.integrity {
        f |= flags::INTEGRITY;
    }
    f
}

fn check_alignment(alignment: usize) -> Result<()> {
    let max = PacketLimits::default().max_alignment_exponent;
    if !alignment.is_power_of_two() || alignment.trailing_zeros() > u32::from(max) {
        return Err(invalid(format!(
            "alignment {alignment} is not a power of two up to 2^{max}"
        )));
    }
    Ok(())
}

/// Bytes before the body: `header_len` (+1 for a custom exponent byte) padded up.
fn padded(header_len: usize, layout: Layout) -> usize {
    let custom = usize::from(layout.alignment != DEFAULT_ALIGNMENT);
    (header_len + custom).div_ceil(layout.alignment) * layout.alignment
}

/// Where the first body of `p` lies in its own encoding, and the alignment it wants;
/// `None` when it has none worth aligning (compressed, IPC, empty bundle). Mirrors the
/// layout [`Writer`] produces: everything before a packet's first body has a fixed size.
fn first_body(p: &PacketRef<'_>, layout: Layout) -> Option<(usize, usize)> {
    let at = |header: usize, layout: Layout| Some((padded(header, layout), layout.alignment));
    match p {
        PacketRef::Dense { .. } if layout.compress => None,
        PacketRef::Dense { shape, .. } => at(10 + 4 * shape.ndim(), layout),
        PacketRef::Quantized { shape, scales, .. } => {
            at(10 + 4 * shape.ndim() + 10 + 2 * scales.len(), layout)
        }
        PacketRef::Strings { .. } => Some((64, 64)),
        PacketRef::Ragged {
            framing: RaggedFraming::Flag,
            ..
        } => at(14, layout),
        PacketRef::Ragged {
            framing: RaggedFraming::Bundle,
            ..
        } if layout.compress => None,
        PacketRef::Ragged {
            framing: RaggedFraming::Bundle,
            ..
        } => {
            let (c, a) = at(14, layout)?;
            Some((10 + 8 + RAGGED_KEYS[0].len() + c, a))
        }
        PacketRef::Bundle(entries) => {
            let (key, member) = entries.first()?;
            let (c, a) = first_body(member, layout)?;
            Some((10 + 8 + key.len() + c, a))
        }
        PacketRef::Sparse { shape, data, .. } => {
            let (c, a) = first_body(data, PART_LAYOUT)?;
            Some((10 + 4 * shape.dims().len() + 4 + c, a))
        }
        PacketRef::IpcRef(_) => None,
    }
}

impl Writer<'_> {
    fn pos(&self) -> usize {
        self.out.len() - self.origin
    }

    fn header(&mut self, packet_flags: u16, code: u8, ndim: usize) {
        self.out.extend_from_slice(MAGIC);
        self.out.push(VERSION);
        self.out.extend_from_slice(&packet_flags.to_le_bytes());
        self.out.push(code);
        self.out.push(ndim as u8);
        self.out.push(0);
    }

    fn shape(&mut self, shape: &Shape) -> Result<()> {
        self.dims(shape.dims())
    }

    fn dims(&mut self, dims: &[u64]) -> Result<()> {
        Error::check_limit(
            "number of dimensions",
            dims.len() as u64,
            self.limits.max_ndim as u64,
        )?;
        for &d in dims {
            let d = u32::try_from(d)
                .map_err(|_| invalid(format!("dimension {d} does not fit a packet's u32 shape")))?;
            self.out.extend_from_slice(&d.to_le_bytes());
        }
        Ok(())
    }

    /// The custom alignment byte (when not 64) and zero padding up to the body, counted
    /// from the packet start at `start`.
    fn pad_to_body(&mut self, start: usize, layout: Layout) {
        if layout.alignment != DEFAULT_ALIGNMENT {
            self.out.push(layout.alignment.trailing_zeros() as u8);
        }
        let rel = self.out.len() - start;
        let body = rel.div_ceil(layout.alignment) * layout.alignment;
        self.out.resize(start + body, 0);
    }

    fn footer(&mut self, hash: u64) {
        self.out.extend_from_slice(&hash.to_le_bytes());
    }

    /// Reserves a `u32` length field; returns where it is.
    fn length_field(&mut self) -> usize {
        self.out.extend_from_slice(&[0; 4]);
        self.out.len() - 4
    }

    fn patch_length(&mut self, at: usize, len: usize) -> Result<()> {
        let len = u32::try_from(len).map_err(|_| Error::LimitExceeded {
            what: "member packet length",
            limit: u64::from(u32::MAX),
            found: len as u64,
        })?;
        self.out[at..at + 4].copy_from_slice(&len.to_le_bytes());
        Ok(())
    }

    /// In an aligned layout, pads the previous member's span (whose length field is at
    /// `prev_len_at`) so that `next`'s first body, which follows `gap` more bytes, lands
    /// on its alignment counted from the outermost packet start.
    fn align_next(
        &mut self,
        prev_len_at: Option<usize>,
        gap: usize,
        next: &PacketRef<'_>,
        layout: Layout,
    ) -> Result<()> {
        let (Some(len_at), true) = (prev_len_at, self.aligned) else {
            return Ok(());
        };
        let Some((c, a)) = first_body(next, layout) else {
            return Ok(());
        };
        let body = self.pos() + gap + c;
        let pad = (a - body % a) % a;
        if pad > 0 {
            let prev =
                u32::from_le_bytes(self.out[len_at..len_at + 4].try_into().unwrap_or([0; 4]));
            self.out.resize(self.out.len() + pad, 0);
            self.patch_length(len_at, prev as usize + pad)?;
        }
        Ok(())
    }

    fn packet(&mut self, p: &PacketRef<'_>, layout: Layout, depth: usize) -> Result<()> {
        Error::check_limit(
            "packet nesting depth",
            depth as u64,
            self.limits.max_nesting as u64,
        )?;
        check_alignment(layout.alignment)?;
        match p {
            PacketRef::Dense { dtype, shape, body } => self.dense(*dtype, shape, body, layout),
            PacketRef::Bundle(entries) => {
                let entries: Vec<(&str, &PacketRef<'_>)> =
                    entries.iter().map(|(k, v)| (*k, v)).collect();
                self.bundle(&entries, layout, depth)
            }
            PacketRef::Sparse {
                format,
                shape,
                data,
                indices,
                pointers,
            } => self.sparse(*format, shape, [&**data, &**indices, &**pointers], depth),
            PacketRef::Strings { offsets, payload } => self.strings(offsets, payload, layout),
            PacketRef::Ragged {
                framing,
                offsets,
                dtype,
                flat,
            } => self.ragged(*framing, offsets, *dtype, flat, layout, depth),
            PacketRef::Quantized {
                dtype,
                shape,
                scheme,
                axis,
                group_size,
                scales,
                zero_points,
                data,
            } => self.quantized(
                *dtype,
                shape,
                (*scheme, *axis, *group_size),
                (scales, zero_points),
                data,
                layout,
            ),
            PacketRef::IpcRef(r) => {
                self.header(flags::GPU_IPC, 0, 0);
                let at = self.out.len();
                self.out[at - 1] = IPC_DISCRIMINATOR;
                self.out.extend_from_slice(&r.handle);
                self.out.extend_from_slice(&r.byte_offset.to_le_bytes());
                self.out.extend_from_slice(&r.nbytes.to_le_bytes());
                self.out.extend_from_slice(&r.device_uuid);
                Ok(())
            }
        }
    }

    fn dense(&mut self, dtype: DType, shape: &Shape, body: &[u8], layout: Layout) -> Result<()> {
        let options = EncodeOptions {
            alignment: layout.alignment,
            integrity: layout.integrity,
            ..EncodeOptions::default()
        };
        let parts = encode_parts(dtype, shape, body, options)?;
        let start = self.out.len();
        self.out.extend_from_slice(&parts.header);
        if !layout.compress {
            self.out.extend_from_slice(body);
            if let Some(footer) = parts.footer {
                self.out.extend_from_slice(&footer);
            }
            return Ok(());
        }
        let f = u16::from_le_bytes([self.out[start + 5], self.out[start + 6]]) | flags::COMPRESSED;
        self.out[start + 5..start + 7].copy_from_slice(&f.to_le_bytes());
        let body_at = self.out.len();
        crate::lz4::compress(body, self.out)?;
        if layout.integrity {
            let hash = xxh3_64(&self.out[body_at..]);
            self.footer(hash);
        }
        Ok(())
    }

    fn bundle(
        &mut self,
        entries: &[(&str, &PacketRef<'_>)],
        layout: Layout,
        depth: usize,
    ) -> Result<()> {
        Error::check_limit(
            "bundle entries",
            entries.len() as u64,
            self.limits.max_bundle_entries.min(255) as u64,
        )?;
        let mut seen = NameSet::with_capacity_and_hasher(entries.len(), Default::default());
        for (key, _) in entries {
            if !seen.insert(*key) {
                return Err(Error::Duplicate {
                    name: (*key).to_owned(),
                });
            }
            u32::try_from(key.len()).map_err(|_| invalid("bundle key longer than 4 GiB"))?;
        }
        self.header(flags::BUNDLE, 0, entries.len());
        let mut prev_len_at = None;
        for (key, member) in entries {
            if prev_len_at.is_some() {
                self.align_next(prev_len_at, 8 + key.len(), member, layout)?;
            }
            self.out
                .extend_from_slice(&(key.len() as u32).to_le_bytes());
            self.out.extend_from_slice(key.as_bytes());
            let len_at = self.length_field();
            let start = self.out.len();
            self.packet(member, layout, depth + 1)?;
            self.patch_length(len_at, self.out.len() - start)?;
            // An LZ4 body runs to the end of its span: nothing may follow it there.
            let compressed = layout.compress && matches!(member, PacketRef::Dense { .. });
            prev_len_at = (!compressed).then_some(len_at);
        }
        Ok(())
    }

    fn sparse(
        &mut self,
        format: SparseFormat,
        shape: &MatrixShape,
        parts: [&PacketRef<'_>; 3],
        depth: usize,
    ) -> Result<()> {
        let mut described = [(DType::U8, 0u64); 3];
        for ((part, name), slot) in parts
            .iter()
            .zip(format.part_names())
            .zip(described.iter_mut())
        {
            match part {
                PacketRef::Dense {
                    dtype, shape: s, ..
                } if s.ndim() == 1 => *slot = (*dtype, s.dims()[0]),
                _ => {
                    return Err(invalid(format!(
                        "sparse part `{name}` must be a 1-D dense tensor"
                    )))
                }
            }
        }
        check_sparse_parts(format, shape, described).map_err(invalid)?;
        self.header(format.flag(), 0, 2);
        self.dims(&shape.dims())?;
        let mut prev_len_at = None;
        for part in parts {
            self.align_next(prev_len_at, 4, part, PART_LAYOUT)?;
            let len_at = self.length_field();
            let start = self.out.len();
            self.packet(part, PART_LAYOUT, depth + 1)?;
            self.patch_length(len_at, self.out.len() - start)?;
            prev_len_at = Some(len_at);
        }
        Ok(())
    }

    fn strings(&mut self, offsets: &[u8], payload: &[u8], layout: Layout) -> Result<()> {
        let values = le_u64s(offsets, "string offsets")?;
        check_offsets(&values, payload.len() as u64, "string offsets")?;
        let count =
            u32::try_from(values.len() - 1).map_err(|_| invalid("more than 2^32 - 1 strings"))?;
        // tenso's string packets are always 64-aligned and never compressed.
        let layout = Layout {
            alignment: DEFAULT_ALIGNMENT,
            compress: false,
            ..layout
        };
        let start = self.out.len();
        self.header(flags::STRING | header_flags(layout), STRING_CODE, 1);
        self.out.extend_from_slice(&count.to_le_bytes());
        self.pad_to_body(start, layout);
        let body_at = self.out.len();
        self.out.extend_from_slice(offsets);
        self.out.extend_from_slice(payload);
        if layout.integrity {
            let hash = xxh3_64(&self.out[body_at..]);
            self.footer(hash);
        }
        Ok(())
    }

    fn ragged(
        &mut self,
        framing: RaggedFraming,
        offsets: &[u8],
        dtype: DType,
        flat: &[u8],
        layout: Layout,
        depth: usize,
    ) -> Result<()> {
        let item = dtype
            .size()
            .filter(|_| dtype_code(dtype).is_some_and(|c| c <= 15))
            .ok_or_else(|| invalid(format!("{dtype} cannot be a ragged array's values")))?;
        if flat.len() % item != 0 {
            return Err(invalid(format!(
                "ragged values: {} bytes is not a whole number of {dtype}",
                flat.len()
            )));
        }
        let n = flat.len() / item;
        let values = le_u64s(offsets, "ragged offsets")?;
        check_offsets(&values, n as u64, "ragged offsets")?;
        let count = values.len() - 1;
        match framing {
            RaggedFraming::Bundle => {
                let count_le = (count as u64).to_le_bytes();
                let members = [
                    PacketRef::Dense {
                        dtype: DType::U64,
                        shape: Shape::from_dims(&[values.len() as u64])?,
                        body: offsets,
                    },
                    PacketRef::Dense {
                        dtype,
                        shape: Shape::from_dims(&[n as u64])?,
                        body: flat,
                    },
                    PacketRef::Dense {
                        dtype: DType::U64,
                        shape: Shape::from_dims(&[1])?,
                        body: &count_le,
                    },
                ];
                let entries: Vec<(&str, &PacketRef<'_>)> =
                    RAGGED_KEYS.iter().copied().zip(members.iter()).collect();
                self.bundle(&entries, layout, depth)
            }
            RaggedFraming::Flag => {
                let count = u32::try_from(count).map_err(|_| invalid("more than 2^32 - 1 rows"))?;
                let layout = Layout {
                    compress: false,
                    ..layout
                };
                let start = self.out.len();
                let code = dtype_code(dtype).unwrap_or(0);
                self.header(flags::RAGGED | header_flags(layout), code, 1);
                self.out.extend_from_slice(&count.to_le_bytes());
                self.pad_to_body(start, layout);
                let body_at = self.out.len();
                for o in &values {
                    // The wire counts bytes.
                    let bytes = o.checked_mul(item as u64).ok_or(Error::Overflow {
                        what: "ragged byte offset",
                    })?;
                    self.out.extend_from_slice(&bytes.to_le_bytes());
                }
                self.out.extend_from_slice(flat);
                if layout.integrity {
                    let hash = xxh3_64(&self.out[body_at..]);
                    self.footer(hash);
                }
                Ok(())
            }
        }
    }

    fn quantized(
        &mut self,
        dtype: DType,
        shape: &Shape,
        (scheme, axis, group_size): (QuantScheme, u8, u32),
        (scales, zero_points): (&[u8], &[u8]),
        data: &[u8],
        layout: Layout,
    ) -> Result<()> {
        let code = dtype_code(dtype)
            .filter(|c| (16..=19).contains(c))
            .ok_or_else(|| invalid(format!("{dtype} is not a quantized dtype")))?;
        if scales.len() != zero_points.len() || scales.len() % 4 != 0 {
            return Err(invalid(format!(
                "{} bytes of scales and {} of zero points (need as many f32 of each)",
                scales.len(),
                zero_points.len()
            )));
        }
        let num_scales =
            u32::try_from(scales.len() / 4).map_err(|_| invalid("more than 2^32 - 1 scales"))?;
        Error::check_limit("element count", shape.numel()?, self.limits.max_elements)?;
        check_scale_count(shape, scheme, axis, group_size, num_scales as usize).map_err(invalid)?;
        let expected = shape.byte_len(dtype)?;
        if expected != data.len() as u64 {
            return Err(Error::SizeMismatch {
                tensor: "quantized body".to_owned(),
                expected,
                found: data.len() as u64,
            });
        }
        // tenso never compresses quantized bodies.
        let layout = Layout {
            compress: false,
            ..layout
        };
        let start = self.out.len();
        self.header(header_flags(layout), code, shape.ndim());
        self.shape(shape)?;
        let meta_at = self.out.len();
        self.out.push(scheme.code());
        self.out.push(axis);
        self.out.extend_from_slice(&group_size.to_le_bytes());
        self.out.extend_from_slice(&num_scales.to_le_bytes());
        self.out.extend_from_slice(scales);
        self.out.extend_from_slice(zero_points);
        let meta_end = self.out.len();
        self.pad_to_body(start, layout);
        self.out.extend_from_slice(data);
        if layout.integrity {
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            h.update(&self.out[meta_at..meta_end]);
            h.update(data);
            let hash = h.digest();
            self.footer(hash);
        }
        Ok(())
    }
}

impl Packet {
    /// Encodes a decoded packet again: tenso's bytes for this value and `options`.
    pub fn encode(&self, options: &EncodeOptions) -> Result<Vec<u8>> {
        let mut floats = Vec::new();
        collect_floats(self, &mut floats);
        let mut floats = floats.iter();
        let r = self.to_ref(&mut floats)?;
        encode_packet(&r, options)
    }

    /// A borrowed form of the packet; `floats` holds the little-endian scales and zero
    /// points of its quantized members, in depth-first order.
    fn to_ref<'a>(
        &'a self,
        floats: &mut std::slice::Iter<'a, (Vec<u8>, Vec<u8>)>,
    ) -> Result<PacketRef<'a>> {
        let dense = |v: &'a tensorwire_core::TensorView| PacketRef::Dense {
            dtype: v.dtype,
            shape: v.shape.clone(),
            body: &v.bytes,
        };
        Ok(match self {
            Packet::Dense(v) => dense(v),
            Packet::Bundle(b) => PacketRef::Bundle(
                b.entries
                    .iter()
                    .map(|(k, p)| Ok((k.as_str(), p.to_ref(floats)?)))
                    .collect::<Result<_>>()?,
            ),
            Packet::Sparse(s) => PacketRef::Sparse {
                format: s.format,
                shape: s.shape,
                data: Box::new(dense(&s.data)),
                indices: Box::new(dense(&s.indices)),
                pointers: Box::new(dense(&s.pointers)),
            },
            Packet::Strings(s) => PacketRef::Strings {
                offsets: &s.offsets.bytes,
                payload: &s.payload.bytes,
            },
            Packet::Ragged(r) => PacketRef::Ragged {
                framing: r.framing,
                offsets: &r.offsets.bytes,
                dtype: r.flat.dtype,
                flat: &r.flat.bytes,
            },
            Packet::Quantized(q) => {
                let (scales, zero_points) = floats
                    .next()
                    .ok_or_else(|| invalid("quantized member without its scales"))?;
                PacketRef::Quantized {
                    dtype: q.dtype,
                    shape: q.shape.clone(),
                    scheme: q.scheme,
                    axis: q.axis,
                    group_size: q.group_size,
                    scales,
                    zero_points,
                    data: &q.data,
                }
            }
            Packet::IpcRef(r) => PacketRef::IpcRef(r.clone()),
        })
    }
}

fn collect_floats(p: &Packet, out: &mut Vec<(Vec<u8>, Vec<u8>)>) {
    let le = |v: &[f32]| v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
    match p {
        Packet::Bundle(b) => b.entries.iter().for_each(|(_, m)| collect_floats(m, out)),
        Packet::Quantized(q) => out.push((le(&q.scales), le(&q.zero_points))),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensorwire_core::align_up;

    #[test]
    fn padded_matches_align_up() {
        for header in 0..200usize {
            for exp in 0..10u32 {
                let layout = Layout {
                    alignment: 1 << exp,
                    integrity: false,
                    compress: false,
                };
                let custom = usize::from(layout.alignment != DEFAULT_ALIGNMENT);
                let want = align_up((header + custom) as u64, 1 << exp).unwrap() as usize;
                assert_eq!(padded(header, layout), want);
            }
        }
    }
}
