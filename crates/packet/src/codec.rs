//! Encoding and decoding dense packets.

use tensorwire_core::{align_up, Bytes, DType, Error, Result, Shape, TensorView};
use xxhash_rust::xxh3::xxh3_64;

use crate::dtype::{dtype_code, dtype_from_code};
use crate::{flags, DEFAULT_ALIGNMENT, MAGIC, VERSION};

/// Bounds a decoder enforces before trusting a packet's declared sizes (the reference
/// implementation's limits by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketLimits {
    /// Most dimensions (32).
    pub max_ndim: usize,
    /// Most elements in one tensor (10⁹).
    pub max_elements: u64,
    /// Largest alignment exponent accepted (2^20 = 1 MiB).
    pub max_alignment_exponent: u8,
    /// Deepest nesting of bundles and sparse sub-packets (64).
    pub max_nesting: usize,
    /// Most entries in one bundle (255, what the `u8` count field can hold).
    pub max_bundle_entries: usize,
    /// Largest packet, in bytes, a stream reader accepts (16 GiB); it never buffers more.
    pub max_packet_bytes: u64,
}

impl Default for PacketLimits {
    fn default() -> Self {
        PacketLimits {
            max_ndim: 32,
            max_elements: 1_000_000_000,
            max_alignment_exponent: 20,
            max_nesting: 64,
            max_bundle_entries: 255,
            max_packet_bytes: 16 << 30,
        }
    }
}

/// How [`encode`] and [`encode_packet`](crate::encode_packet) lay a packet out. Bundle
/// members inherit the options, as in tenso; see `docs/formats/packet.md` for the
/// kinds that ignore some of them (tenso does too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Body alignment in bytes, a power of two (64 by default, as in tenso).
    pub alignment: usize,
    /// Append an XXH3-64 footer of the body.
    pub integrity: bool,
    /// LZ4-compress dense bodies (one LZ4 frame each, flag 0x04).
    pub compress: bool,
    /// Pad bundle members (and sparse parts) so their bodies are aligned counted from
    /// the outermost packet's start, not only from their own packet's start. Off by
    /// default: the output is then byte-identical to tenso's. tenso 0.24 still reads
    /// such packets (the padding sits after a member, inside its length).
    pub aligned_bundle: bool,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            alignment: DEFAULT_ALIGNMENT,
            integrity: false,
            compress: false,
            aligned_bundle: false,
        }
    }
}

/// What a packet's header declares, after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketInfo {
    /// Protocol version (3 or 4).
    pub version: u8,
    /// Flags.
    pub flags: u16,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Shape,
    /// Body alignment, counted from the packet start.
    pub alignment: usize,
    /// Offset of the body in the packet.
    pub body_offset: usize,
    /// Length of the body.
    pub body_len: usize,
    /// Length of the whole packet (body, padding and footer included).
    pub total_len: usize,
}

fn truncated(offset: usize, needed: usize, available: usize) -> Error {
    Error::Truncated {
        offset: offset as u64,
        needed: needed as u64,
        available: available as u64,
    }
}

/// Reads and checks a packet's header: magic, version, flags, dtype, shape against the
/// limits, alignment, and that the input is long enough for the declared body and
/// footer. Does not check the footer's digest.
pub fn packet_info(input: &[u8], limits: &PacketLimits) -> Result<PacketInfo> {
    let magic = input.get(..4).ok_or_else(|| truncated(0, 4, input.len()))?;
    if magic != MAGIC {
        return Err(Error::BadMagic {
            offset: 0,
            expected: "TNSO",
            found: magic.to_vec(),
        });
    }
    let version = *input.get(4).ok_or_else(|| truncated(4, 1, 0))?;
    let (flags, code, ndim, mut pos) = match version {
        4 => {
            let h = input
                .get(5..10)
                .ok_or_else(|| truncated(5, 5, input.len() - 5))?;
            (u16::from_le_bytes([h[0], h[1]]), h[2], h[3], 10usize)
        }
        3 => {
            let h = input
                .get(5..8)
                .ok_or_else(|| truncated(5, 3, input.len() - 5))?;
            (u16::from(h[0]), h[1], h[2], 8usize)
        }
        other => {
            return Err(Error::unsupported(format!(
                "tenso protocol version {other} (3 and 4 are read)"
            )))
        }
    };
    let supported = flags::ALIGNED | flags::INTEGRITY | flags::CUSTOM_ALIGNMENT;
    if flags & !supported != 0 {
        return Err(Error::unsupported(format!(
            "packet flags {:#06x} (only dense packets are read in this version)",
            flags & !supported
        )));
    }
    let dtype = dtype_from_code(code)
        .ok_or_else(|| Error::malformed(7, format!("unknown packet dtype code {code}")))?;
    if matches!(
        dtype,
        DType::QInt8 | DType::QUInt8 | DType::QInt4 | DType::QUInt4
    ) {
        return Err(Error::unsupported(format!("quantized ({dtype}) packets")));
    }
    let ndim = usize::from(ndim);
    Error::check_limit("number of dimensions", ndim as u64, limits.max_ndim as u64)?;
    let mut dims = [0u64; 255];
    for dim in dims.iter_mut().take(ndim) {
        let b = input
            .get(pos..pos + 4)
            .ok_or_else(|| truncated(pos, 4, input.len().saturating_sub(pos)))?;
        *dim = u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        pos += 4;
    }
    let shape = Shape::from_dims(&dims[..ndim])?;
    let numel = shape.numel()?;
    Error::check_limit("element count", numel, limits.max_elements)?;
    let alignment = if flags & flags::CUSTOM_ALIGNMENT != 0 {
        let exp = *input.get(pos).ok_or_else(|| truncated(pos, 1, 0))?;
        pos += 1;
        Error::check_limit(
            "alignment exponent",
            u64::from(exp),
            u64::from(limits.max_alignment_exponent),
        )?;
        1usize << exp
    } else if flags & flags::ALIGNED != 0 {
        DEFAULT_ALIGNMENT
    } else {
        1
    };
    let body_len = usize::try_from(shape.byte_len(dtype)?).map_err(|_| Error::Overflow {
        what: "packet body length",
    })?;
    let body_offset = align_up(pos as u64, alignment as u64)
        .and_then(|o| usize::try_from(o).ok())
        .ok_or(Error::Overflow {
            what: "packet body offset",
        })?;
    let footer = if flags & flags::INTEGRITY != 0 { 8 } else { 0 };
    let total_len = body_offset
        .checked_add(body_len)
        .and_then(|n| n.checked_add(footer))
        .ok_or(Error::Overflow {
            what: "packet length",
        })?;
    if input.len() < total_len {
        return Err(truncated(
            body_offset,
            total_len - body_offset,
            input.len().saturating_sub(body_offset),
        ));
    }
    Ok(PacketInfo {
        version,
        flags,
        dtype,
        shape,
        alignment,
        body_offset,
        body_len,
        total_len,
    })
}

/// Decodes a packet with default limits: a zero-copy view of its body.
pub fn decode(input: &Bytes) -> Result<TensorView> {
    decode_with(input, &PacketLimits::default())
}

/// Decodes a packet: validates the header, requires the input to be exactly one
/// packet, checks the XXH3 footer when present, and returns a view that borrows the
/// body from `input` (no copy).
pub fn decode_with(input: &Bytes, limits: &PacketLimits) -> Result<TensorView> {
    let info = packet_info(input, limits)?;
    if input.len() != info.total_len {
        return Err(Error::malformed(
            info.total_len as u64,
            format!(
                "{} bytes after the end of the packet",
                input.len() - info.total_len
            ),
        ));
    }
    let body = input.slice(info.body_offset..info.body_offset + info.body_len)?;
    if info.flags & flags::INTEGRITY != 0 {
        let at = info.body_offset + info.body_len;
        let stored = input
            .get(at..at + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
            .ok_or_else(|| truncated(at, 8, input.len().saturating_sub(at)))?;
        let found = xxh3_64(&body);
        if stored != found {
            return Err(Error::DigestMismatch {
                tensor: "packet body".to_owned(),
                algorithm: "xxh3-64",
                expected: format!("{stored:016x}"),
                found: format!("{found:016x}"),
            });
        }
    }
    Ok(TensorView {
        dtype: info.dtype,
        shape: info.shape,
        bytes: body,
        zero_copy: true,
    })
}

/// A packet's bytes around a body the caller keeps: write `header`, then the body,
/// then `footer` (vectored I/O sends a large tensor without copying it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketParts {
    /// Header, shape, alignment byte and padding.
    pub header: Vec<u8>,
    /// The XXH3-64 footer, when integrity was asked for.
    pub footer: Option<[u8; 8]>,
}

/// The header and footer of a dense packet for `body` (little-endian elements of
/// `dtype` in row-major order, exactly `shape × dtype` bytes). The body is sent as it
/// is, so `options.compress` is refused; `aligned_bundle` does not apply.
pub fn encode_parts(
    dtype: DType,
    shape: &Shape,
    body: &[u8],
    options: EncodeOptions,
) -> Result<PacketParts> {
    let code = dtype_code(dtype)
        .filter(|c| *c <= 15)
        .ok_or_else(|| Error::unsupported(format!("{dtype} in a dense packet")))?;
    if options.compress {
        return Err(Error::invalid(
            "encode_parts sends the body as it is; compress with encode_packet",
        ));
    }
    let limits = PacketLimits::default();
    Error::check_limit(
        "number of dimensions",
        shape.ndim() as u64,
        limits.max_ndim as u64,
    )?;
    Error::check_limit("element count", shape.numel()?, limits.max_elements)?;
    let expected = shape.byte_len(dtype)?;
    if expected != body.len() as u64 {
        return Err(Error::SizeMismatch {
            tensor: "packet body".to_owned(),
            expected,
            found: body.len() as u64,
        });
    }
    let alignment = options.alignment;
    if !alignment.is_power_of_two()
        || alignment.trailing_zeros() > u32::from(limits.max_alignment_exponent)
    {
        return Err(Error::invalid(format!(
            "alignment {alignment} is not a power of two up to 2^{}",
            limits.max_alignment_exponent
        )));
    }
    let mut packet_flags = if alignment == DEFAULT_ALIGNMENT {
        flags::ALIGNED
    } else {
        flags::CUSTOM_ALIGNMENT
    };
    if options.integrity {
        packet_flags |= flags::INTEGRITY;
    }
    let mut header = Vec::with_capacity(16 + 4 * shape.ndim() + alignment.min(64));
    header.extend_from_slice(MAGIC);
    header.push(VERSION);
    header.extend_from_slice(&packet_flags.to_le_bytes());
    header.push(code);
    header.push(shape.ndim() as u8);
    header.push(0);
    for &d in shape.dims() {
        let d = u32::try_from(d).map_err(|_| {
            Error::invalid(format!("dimension {d} does not fit a packet's u32 shape"))
        })?;
        header.extend_from_slice(&d.to_le_bytes());
    }
    if packet_flags & flags::CUSTOM_ALIGNMENT != 0 {
        header.push(alignment.trailing_zeros() as u8);
    }
    let body_offset = header.len().div_ceil(alignment) * alignment;
    header.resize(body_offset, 0);
    Ok(PacketParts {
        header,
        footer: options.integrity.then(|| xxh3_64(body).to_le_bytes()),
    })
}

/// Appends a dense packet to `out`.
pub fn encode_into(
    dtype: DType,
    shape: &Shape,
    body: &[u8],
    options: EncodeOptions,
    out: &mut Vec<u8>,
) -> Result<()> {
    if options.compress {
        let packet = crate::PacketRef::Dense {
            dtype,
            shape: shape.clone(),
            body,
        };
        return crate::encode_packet_into(&packet, &options, out);
    }
    let parts = encode_parts(dtype, shape, body, options)?;
    out.reserve(parts.header.len() + body.len() + 8);
    out.extend_from_slice(&parts.header);
    out.extend_from_slice(body);
    if let Some(footer) = parts.footer {
        out.extend_from_slice(&footer);
    }
    Ok(())
}

/// A dense packet as a new vector.
pub fn encode(dtype: DType, shape: &Shape, body: &[u8], options: EncodeOptions) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    encode_into(dtype, shape, body, options, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// The worked example from tenso's documentation: float32 [1,2,3,4,5] is 84 bytes
    /// with the body at 64, and its integrity footer is `6c fe ee 49 96 d6 61 eb`.
    #[test]
    fn worked_example() {
        let body = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        let shape = Shape::from_dims(&[5]).unwrap();
        let p = encode(DType::F32, &shape, &body, EncodeOptions::default()).unwrap();
        assert_eq!(p.len(), 84);
        assert_eq!(&p[64..], &body[..]);
        let opts = EncodeOptions {
            integrity: true,
            ..EncodeOptions::default()
        };
        let p = encode(DType::F32, &shape, &body, opts).unwrap();
        assert_eq!(&p[84..], &[0x6c, 0xfe, 0xee, 0x49, 0x96, 0xd6, 0x61, 0xeb]);
        let v = decode(&Bytes::from_vec(p)).unwrap();
        assert_eq!(&v.bytes[..], &body[..]);
        assert_eq!(v.shape, shape);
    }
}
