//! Random packets of every kind (nested bundles too) under random options: what
//! `encode_packet` writes, `decode_packet` reads back to the same value, re-encoding
//! that value gives the same bytes, and with `aligned_bundle` every member body lands
//! on its alignment counted from the outer packet's start.

use proptest::prelude::*;
use tensorwire_core::{Bytes, DType, Shape, TensorView};
use tensorwire_packet::{
    decode_packet, encode_packet, EncodeOptions, IpcRef, MatrixShape, Packet, PacketRef,
    QuantScheme, RaggedFraming, SparseFormat,
};

/// An owned packet for the generator; [`Node::as_ref`] lends it to the encoder.
#[derive(Debug, Clone)]
enum Node {
    Dense(DType, Vec<u64>, Vec<u8>),
    Sparse(SparseFormat, [u64; 2], [(DType, Vec<u8>); 3]),
    Strings(Vec<u8>, Vec<u8>),
    Ragged(RaggedFraming, Vec<u8>, DType, Vec<u8>),
    Quantized(
        DType,
        Vec<u64>,
        QuantScheme,
        u8,
        u32,
        Vec<u8>,
        Vec<u8>,
        Vec<u8>,
    ),
    Ipc(IpcRef),
    Bundle(Vec<(String, Node)>),
}

fn vector(dtype: DType, bytes: &[u8]) -> PacketRef<'_> {
    let n = bytes.len() / dtype.size().unwrap();
    PacketRef::Dense {
        dtype,
        shape: Shape::from_dims(&[n as u64]).unwrap(),
        body: bytes,
    }
}

impl Node {
    fn as_ref(&self) -> PacketRef<'_> {
        match self {
            Node::Dense(dtype, dims, body) => PacketRef::Dense {
                dtype: *dtype,
                shape: Shape::from_dims(dims).unwrap(),
                body,
            },
            Node::Sparse(format, shape, [(dd, d), (di, i), (dp, p)]) => PacketRef::Sparse {
                format: *format,
                shape: MatrixShape::from_dims(shape).unwrap(),
                data: Box::new(vector(*dd, d)),
                indices: Box::new(vector(*di, i)),
                pointers: Box::new(vector(*dp, p)),
            },
            Node::Strings(offsets, payload) => PacketRef::Strings { offsets, payload },
            Node::Ragged(framing, offsets, dtype, flat) => PacketRef::Ragged {
                framing: *framing,
                offsets,
                dtype: *dtype,
                flat,
            },
            Node::Quantized(dtype, dims, scheme, axis, group_size, scales, zero_points, data) => {
                PacketRef::Quantized {
                    dtype: *dtype,
                    shape: Shape::from_dims(dims).unwrap(),
                    scheme: *scheme,
                    axis: *axis,
                    group_size: *group_size,
                    scales,
                    zero_points,
                    data,
                }
            }
            Node::Ipc(r) => PacketRef::IpcRef(r.clone()),
            Node::Bundle(entries) => PacketRef::Bundle(
                entries
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_ref()))
                    .collect(),
            ),
        }
    }
}

fn le_u64(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn bytes(n: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), n)
}

const DENSE: [DType; 8] = [
    DType::F32,
    DType::F64,
    DType::I8,
    DType::U16,
    DType::I64,
    DType::Bool,
    DType::BF16,
    DType::Complex64,
];

fn dense() -> impl Strategy<Value = Node> {
    (
        proptest::sample::select(&DENSE[..]),
        proptest::collection::vec(0u64..4, 0..4),
    )
        .prop_flat_map(|(dtype, dims)| {
            let n = Shape::from_dims(&dims).unwrap().byte_len(dtype).unwrap() as usize;
            bytes(n).prop_map(move |body| Node::Dense(dtype, dims.clone(), body))
        })
}

/// A valid sparse matrix: per-major-axis counts give the pointers (CSR/CSC), or
/// coordinates (COO).
fn sparse() -> impl Strategy<Value = Node> {
    (
        proptest::sample::select(&[SparseFormat::Coo, SparseFormat::Csr, SparseFormat::Csc][..]),
        1u64..5,
        1u64..5,
        proptest::collection::vec(0u64..3, 5),
        any::<u32>(),
    )
        .prop_map(|(format, rows, cols, counts, seed)| {
            let i32s = |v: &[u64]| -> Vec<u8> {
                v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect()
            };
            let (major, minor) = if format == SparseFormat::Csc {
                (cols, rows)
            } else {
                (rows, cols)
            };
            let mut pointers = vec![0u64];
            let mut indices = Vec::new();
            for m in 0..major as usize {
                let c = counts[m].min(minor);
                for k in 0..c {
                    indices.push((k + u64::from(seed)) % minor);
                }
                pointers.push(pointers[m] + c);
            }
            let nnz = indices.len();
            let data: Vec<u8> = (0..nnz)
                .flat_map(|k| (k as f32 + seed as f32).to_le_bytes())
                .collect();
            let (second, third) = match format {
                SparseFormat::Coo => {
                    let majors: Vec<u64> = (0..major as usize)
                        .flat_map(|m| {
                            std::iter::repeat_n(m as u64, (pointers[m + 1] - pointers[m]) as usize)
                        })
                        .collect();
                    (i32s(&majors), i32s(&indices))
                }
                _ => (i32s(&indices), i32s(&pointers)),
            };
            Node::Sparse(
                format,
                [rows, cols],
                [
                    (DType::F32, data),
                    (DType::I32, second),
                    (DType::I32, third),
                ],
            )
        })
}

fn strings() -> impl Strategy<Value = Node> {
    proptest::collection::vec("[a-zé世🦀]{0,5}", 0..5).prop_map(|items| {
        let mut offsets = vec![0u64];
        let mut payload = Vec::new();
        for s in &items {
            payload.extend_from_slice(s.as_bytes());
            offsets.push(payload.len() as u64);
        }
        Node::Strings(le_u64(&offsets), payload)
    })
}

fn ragged() -> impl Strategy<Value = Node> {
    (
        proptest::sample::select(&[RaggedFraming::Bundle, RaggedFraming::Flag][..]),
        proptest::sample::select(&[DType::F32, DType::I64, DType::U8][..]),
        proptest::collection::vec(0u64..4, 0..4),
    )
        .prop_flat_map(|(framing, dtype, rows)| {
            let mut offsets = vec![0u64];
            for r in &rows {
                offsets.push(offsets.last().unwrap() + r);
            }
            let n = *offsets.last().unwrap() as usize * dtype.size().unwrap();
            let offsets = le_u64(&offsets);
            bytes(n).prop_map(move |flat| Node::Ragged(framing, offsets.clone(), dtype, flat))
        })
}

fn quantized() -> impl Strategy<Value = Node> {
    (
        proptest::sample::select(&[DType::QInt8, DType::QUInt8, DType::QInt4, DType::QUInt4][..]),
        proptest::collection::vec(1u64..5, 1..3),
        proptest::sample::select(
            &[
                QuantScheme::PerTensor,
                QuantScheme::PerChannel,
                QuantScheme::PerGroup,
            ][..],
        ),
        any::<bool>(),
        1u32..8,
    )
        .prop_flat_map(|(dtype, dims, scheme, last_axis, group)| {
            let shape = Shape::from_dims(&dims).unwrap();
            let n = shape.byte_len(dtype).unwrap() as usize;
            // axis byte 255 is axis -1, as tenso writes `axis & 0xFF`.
            let (axis, group_size, nscales) = match scheme {
                QuantScheme::PerTensor => (0u8, 0u32, 1usize),
                QuantScheme::PerChannel if last_axis => (255, 0, *dims.last().unwrap() as usize),
                QuantScheme::PerChannel => (0, 0, dims[0] as usize),
                QuantScheme::PerGroup => (
                    0,
                    group,
                    shape.numel().unwrap().div_ceil(u64::from(group)) as usize,
                ),
            };
            (bytes(nscales * 4), bytes(nscales * 4), bytes(n)).prop_map(
                move |(scales, zeros, data)| {
                    Node::Quantized(
                        dtype,
                        dims.clone(),
                        scheme,
                        axis,
                        group_size,
                        scales,
                        zeros,
                        data,
                    )
                },
            )
        })
}

fn ipc() -> impl Strategy<Value = Node> {
    (bytes(64), any::<u64>(), any::<u64>(), bytes(16)).prop_map(|(h, o, n, u)| {
        Node::Ipc(IpcRef {
            handle: h.try_into().unwrap(),
            byte_offset: o,
            nbytes: n,
            device_uuid: u.try_into().unwrap(),
        })
    })
}

fn node() -> impl Strategy<Value = Node> {
    let leaf = prop_oneof![
        4 => dense(),
        1 => sparse(),
        1 => strings(),
        1 => ragged(),
        1 => quantized(),
        1 => ipc(),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        proptest::collection::vec(("[a-z._]{0,4}", inner), 0..5).prop_map(|entries| {
            // Keys must be unique, and must not make a ragged bundle by accident.
            let entries = entries
                .into_iter()
                .enumerate()
                .map(|(i, (k, v))| (format!("{k}{i}"), v))
                .collect();
            Node::Bundle(entries)
        })
    })
}

fn options() -> impl Strategy<Value = EncodeOptions> {
    (0u32..9, any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
        |(exp, integrity, compress, aligned_bundle)| EncodeOptions {
            alignment: 1 << exp,
            integrity,
            compress,
            aligned_bundle,
        },
    )
}

fn same_view(v: &TensorView, dtype: DType, body: &[u8]) -> bool {
    v.dtype == dtype && &v.bytes[..] == body
}

/// The decoded value equals the generated one.
fn same(p: &Packet, n: &Node) -> bool {
    match (p, n) {
        (Packet::Dense(v), Node::Dense(dtype, dims, body)) => {
            same_view(v, *dtype, body) && v.shape.dims() == dims.as_slice()
        }
        (Packet::Sparse(s), Node::Sparse(format, shape, [(dd, d), (di, i), (dp, pp)])) => {
            s.format == *format
                && s.shape.dims() == *shape
                && same_view(&s.data, *dd, d)
                && same_view(&s.indices, *di, i)
                && same_view(&s.pointers, *dp, pp)
        }
        (Packet::Strings(s), Node::Strings(offsets, payload)) => {
            s.offsets.bytes[..] == offsets[..] && s.payload.bytes[..] == payload[..]
        }
        (Packet::Ragged(r), Node::Ragged(framing, offsets, dtype, flat)) => {
            r.framing == *framing
                && r.offsets.bytes[..] == offsets[..]
                && same_view(&r.flat, *dtype, flat)
        }
        (Packet::Quantized(q), Node::Quantized(dtype, dims, scheme, axis, group, s, z, d)) => {
            let le = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
            q.dtype == *dtype
                && q.shape.dims() == &dims[..]
                && q.scheme == *scheme
                && q.axis == *axis
                && q.group_size == *group
                && le(&q.scales) == *s
                && le(&q.zero_points) == *z
                && q.data[..] == d[..]
        }
        (Packet::IpcRef(a), Node::Ipc(b)) => a == b,
        (Packet::Bundle(b), Node::Bundle(entries)) => {
            b.entries.len() == entries.len()
                && b.entries
                    .iter()
                    .zip(entries)
                    .all(|((k, p), (key, n))| k == key && same(p, n))
        }
        _ => false,
    }
}

/// `(offset from the packet start, alignment wanted)` of each leaf's first body.
fn bodies(p: &Packet, base: usize, alignment: usize, out: &mut Vec<(usize, usize)>) {
    let at = |v: &TensorView| v.bytes.as_ptr() as usize - base;
    match p {
        Packet::Dense(v) if v.zero_copy => out.push((at(v), alignment)),
        Packet::Quantized(q) => out.push((q.data.as_ptr() as usize - base, alignment)),
        Packet::Strings(s) => out.push((at(&s.offsets), 64)),
        Packet::Ragged(r) if r.framing == RaggedFraming::Flag => {
            out.push((at(&r.flat) - r.offsets.bytes.len(), alignment))
        }
        Packet::Ragged(r) => {
            out.push((at(&r.offsets), alignment));
            out.push((at(&r.flat), alignment));
        }
        Packet::Sparse(s) => {
            for v in [&s.data, &s.indices, &s.pointers] {
                out.push((at(v), 64));
            }
        }
        Packet::Bundle(b) => b
            .entries
            .iter()
            .for_each(|(_, m)| bodies(m, base, alignment, out)),
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn every_kind_round_trips(node in node(), options in options()) {
        let packet = encode_packet(&node.as_ref(), &options).unwrap();
        let input = Bytes::from_vec(packet.clone());
        let decoded = decode_packet(&input).unwrap();
        prop_assert!(same(&decoded, &node), "{decoded:?}\n{node:?}");
        prop_assert!(decoded.encode(&options).unwrap() == packet);
        if options.aligned_bundle && !options.compress {
            let mut found = Vec::new();
            bodies(&decoded, input.as_ptr() as usize, options.alignment, &mut found);
            found.sort();
            // The framing fixes where the first body lies (18 + key length in a
            // bundle); every later one is placed.
            for &(offset, alignment) in found.iter().skip(1) {
                prop_assert_eq!(offset % alignment, 0, "{:?}", found);
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode_packet(&Bytes::from_vec(data));
    }
}
