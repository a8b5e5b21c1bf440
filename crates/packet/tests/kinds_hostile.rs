//! Hostile packets of every kind give typed errors: never a panic, a stack overflow,
//! or an allocation sized by a number the input does not back.

use std::path::Path;

use tensorwire_core::{Bytes, DType, Error, Shape};
use tensorwire_packet::{
    decode_packet, decode_packet_with, encode_packet, flags, EncodeOptions, MatrixShape, Packet,
    PacketLimits, PacketRef, QuantScheme,
};

fn fixture(name: &str) -> Vec<u8> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/packet");
    std::fs::read(dir.join(format!("{name}.tnso"))).unwrap()
}

fn dec(v: Vec<u8>) -> Result<Packet, Error> {
    decode_packet(&Bytes::from_vec(v))
}

fn le32(v: u32) -> [u8; 4] {
    v.to_le_bytes()
}

/// A bundle packet from raw `(key, member bytes)` entries.
fn bundle(entries: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut p = b"TNSO\x04".to_vec();
    p.extend_from_slice(&flags::BUNDLE.to_le_bytes());
    p.extend_from_slice(&[0, entries.len() as u8, 0]);
    for (k, v) in entries {
        p.extend_from_slice(&le32(k.len() as u32));
        p.extend_from_slice(k);
        p.extend_from_slice(&le32(v.len() as u32));
        p.extend_from_slice(v);
    }
    p
}

fn small_dense() -> Vec<u8> {
    let body = [1u8, 2, 3];
    let p = PacketRef::Dense {
        dtype: DType::U8,
        shape: Shape::from_dims(&[3]).unwrap(),
        body: &body,
    };
    encode_packet(&p, &EncodeOptions::default()).unwrap()
}

const KINDS: [&str; 14] = [
    "bundle_nested",
    "bundle_integrity",
    "bundle_with_quantized",
    "bundle_with_strings",
    "bundle_compress",
    "sparse_coo",
    "sparse_csr_integrity",
    "strings_unicode",
    "strings_integrity",
    "ragged_f32",
    "ragged_flag_i32",
    "quant_qint4_per_group_integrity",
    "lz4_i32_integrity",
    "ipc_ref",
];

#[test]
fn every_truncation_of_every_kind_is_a_typed_error() {
    for name in KINDS {
        let p = fixture(name);
        for cut in 0..p.len() {
            let e = dec(p[..cut].to_vec()).expect_err(&format!("{name} cut at {cut}"));
            assert!(e.is_corrupt_data(), "{name} cut at {cut}: {e}");
        }
    }
}

#[test]
fn every_single_bit_flip_is_an_error_or_a_value() {
    for name in KINDS {
        let p = fixture(name);
        for i in 0..p.len() {
            let mut q = p.clone();
            q[i] ^= 0x80;
            // Any outcome but a panic; with integrity most flips are DigestMismatch.
            let _ = dec(q);
        }
    }
}

#[test]
fn lying_lengths_are_truncations() {
    let member = small_dense();
    // vlen past the end of the input.
    let mut p = bundle(&[(b"a", &member)]);
    let vlen_at = 10 + 4 + 1;
    p[vlen_at..vlen_at + 4].copy_from_slice(&le32(u32::MAX));
    assert!(matches!(dec(p), Err(Error::Truncated { .. })));
    // klen past the end.
    let mut p = bundle(&[(b"a", &member)]);
    p[10..14].copy_from_slice(&le32(0x7fff_ffff));
    assert!(matches!(dec(p), Err(Error::Truncated { .. })));
    // vlen shorter than the member: the member is cut.
    let mut p = bundle(&[(b"a", &member)]);
    p[vlen_at..vlen_at + 4].copy_from_slice(&le32(20));
    assert!(dec(p).unwrap_err().is_corrupt_data());
    // A sparse part length past the end.
    let mut p = fixture("sparse_csr");
    let at = 10 + 8;
    p[at..at + 4].copy_from_slice(&le32(1 << 30));
    assert!(matches!(dec(p), Err(Error::Truncated { .. })));
    // More entries declared than present.
    let mut p = bundle(&[(b"a", &member)]);
    p[8] = 2;
    assert!(matches!(dec(p), Err(Error::Truncated { .. })));
}

#[test]
fn quantized_num_scales_lies() {
    let p = fixture("quant_qint8_per_tensor");
    // header 10 + shape 8, then scheme, axis, group_size; num_scales at 24.
    for lie in [2u32, 1 << 20, u32::MAX] {
        let mut q = p.clone();
        q[24..28].copy_from_slice(&le32(lie));
        let e = dec(q).unwrap_err();
        assert!(
            matches!(e, Error::Truncated { .. } | Error::Malformed { .. }),
            "{lie}: {e}"
        );
    }
    let mut q = p.clone();
    q[18] = 7; // unknown scheme
    assert!(matches!(dec(q), Err(Error::Malformed { .. })));
}

/// A dense u8 packet declaring `n` elements whose body is an LZ4 frame of `raw`.
fn lz4_packet(n: u32, dtype_code: u8, frame: &[u8]) -> Vec<u8> {
    let mut p = b"TNSO\x04".to_vec();
    p.extend_from_slice(&(flags::ALIGNED | flags::COMPRESSED).to_le_bytes());
    p.extend_from_slice(&[dtype_code, 1, 0]);
    p.extend_from_slice(&le32(n));
    p.resize(64, 0);
    p.extend_from_slice(frame);
    p
}

fn frame_of(raw: &[u8]) -> Vec<u8> {
    let body = PacketRef::Dense {
        dtype: DType::U8,
        shape: Shape::from_dims(&[raw.len() as u64]).unwrap(),
        body: raw,
    };
    let options = EncodeOptions {
        compress: true,
        ..EncodeOptions::default()
    };
    encode_packet(&body, &options).unwrap()[64..].to_vec()
}

#[test]
fn lz4_bombs_never_inflate_past_the_header() {
    // 4 MiB of zeros compresses to a few KiB; the header declares 1000 bytes.
    let frame = frame_of(&vec![0u8; 4 << 20]);
    assert!(frame.len() < 40_000, "{}", frame.len());
    let e = dec(lz4_packet(1000, 5, &frame)).unwrap_err();
    assert!(matches!(e, Error::Decode { .. }), "{e}");
    // The header declares 10⁹ f64 (8 GB) for a 20-byte frame: refused before any
    // allocation, since no LZ4 frame inflates more than 255×.
    let frame = frame_of(&[0u8; 16]);
    let e = dec(lz4_packet(1_000_000_000, 3, &frame)).unwrap_err();
    assert!(matches!(e, Error::Decode { .. }), "{e}");
    // Fewer bytes than declared.
    let e = dec(lz4_packet(17, 5, &frame)).unwrap_err();
    assert!(matches!(e, Error::Decode { .. }), "{e}");
    // Not a frame at all.
    let e = dec(lz4_packet(4, 5, &[0, 0, 0, 0, 0, 0, 0, 0])).unwrap_err();
    assert!(matches!(e, Error::Decode { .. }), "{e}");
    // Exactly right.
    match dec(lz4_packet(16, 5, &frame)).unwrap() {
        Packet::Dense(v) => {
            assert!(!v.zero_copy && v.bytes.is_aligned(64) && v.bytes.len() == 16)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn nesting_ten_thousand_deep_is_a_limit_not_a_stack_overflow() {
    let mut p = small_dense();
    for _ in 0..10_000 {
        p = bundle(&[(b"n", &p)]);
    }
    let e = dec(p).unwrap_err();
    assert!(
        matches!(e, Error::LimitExceeded { what, .. } if what.contains("nesting")),
        "{e}"
    );
    // 64 levels are fine, 65 are not (the reference's limit).
    let mut p = small_dense();
    for _ in 0..64 {
        p = bundle(&[(b"n", &p)]);
    }
    dec(p.clone()).unwrap();
    let e = dec(bundle(&[(b"n", &p)])).unwrap_err();
    assert!(matches!(e, Error::LimitExceeded { .. }), "{e}");
    // The encoder refuses what the decoder would.
    let body = [0u8];
    let mut r = PacketRef::Dense {
        dtype: DType::U8,
        shape: Shape::from_dims(&[1]).unwrap(),
        body: &body,
    };
    for _ in 0..65 {
        r = PacketRef::Bundle(vec![("n", r)]);
    }
    let e = encode_packet(&r, &EncodeOptions::default()).unwrap_err();
    assert!(matches!(e, Error::LimitExceeded { .. }), "{e}");
}

#[test]
fn bundle_entry_limits() {
    let body = [0u8];
    let keys: Vec<String> = (0..256).map(|i| format!("k{i}")).collect();
    let member = || PacketRef::Dense {
        dtype: DType::U8,
        shape: Shape::from_dims(&[1]).unwrap(),
        body: &body,
    };
    let r = PacketRef::Bundle(keys.iter().map(|k| (k.as_str(), member())).collect());
    let e = encode_packet(&r, &EncodeOptions::default()).unwrap_err();
    assert!(matches!(e, Error::LimitExceeded { .. }), "{e}");
    let r = PacketRef::Bundle(keys[..255].iter().map(|k| (k.as_str(), member())).collect());
    let p = encode_packet(&r, &EncodeOptions::default()).unwrap();
    assert!(matches!(dec(p.clone()).unwrap(), Packet::Bundle(b) if b.entries.len() == 255));
    let limits = PacketLimits {
        max_bundle_entries: 16,
        ..PacketLimits::default()
    };
    let e = decode_packet_with(&Bytes::from_vec(p), &limits).unwrap_err();
    assert!(matches!(e, Error::LimitExceeded { .. }), "{e}");
    // Keys: unique, UTF-8.
    let m = small_dense();
    assert!(matches!(
        dec(bundle(&[(b"a", &m), (b"a", &m)])),
        Err(Error::Duplicate { .. })
    ));
    assert!(matches!(
        dec(bundle(&[(b"\xff\xfe", &m)])),
        Err(Error::Malformed { .. })
    ));
    let r = PacketRef::Bundle(vec![("a", member()), ("a", member())]);
    assert!(matches!(
        encode_packet(&r, &EncodeOptions::default()),
        Err(Error::Duplicate { .. })
    ));
}

/// The strings fixture `["hello", "world", "foo"]`: offsets at 64.
fn strings_ascii() -> Vec<u8> {
    fixture("strings_ascii")
}

fn set_offset(p: &mut [u8], i: usize, v: u64) {
    let at = 64 + 8 * i;
    p[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn string_offsets_that_lie() {
    let p = strings_ascii();
    // Non-monotonic.
    let mut q = p.clone();
    set_offset(&mut q, 1, 11);
    assert!(matches!(dec(q), Err(Error::Malformed { .. })));
    // Not starting at 0.
    let mut q = p.clone();
    set_offset(&mut q, 0, 1);
    assert!(matches!(dec(q), Err(Error::Malformed { .. })));
    // Last offset past the payload.
    let mut q = p.clone();
    set_offset(&mut q, 3, u64::MAX / 2);
    assert!(matches!(dec(q), Err(Error::Truncated { .. })));
    // A count the input cannot hold.
    let mut q = p.clone();
    q[10..14].copy_from_slice(&le32(u32::MAX));
    assert!(dec(q).unwrap_err().is_corrupt_data());
    // Offsets that split a multi-byte character decode (tenso stores any bytes), but
    // the element is not a str.
    let mut q = fixture("strings_unicode"); // "héllo", ...: é is bytes 1..3
    set_offset(&mut q, 1, 2);
    match dec(q).unwrap() {
        Packet::Strings(s) => {
            assert_eq!(s.get(0).unwrap(), b"h\xc3");
            assert!(matches!(s.get_str(0), Err(Error::Malformed { .. })));
            assert!(matches!(s.get_str(1), Err(Error::Malformed { .. })));
            assert!(s.get(99).is_none());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn ragged_and_sparse_structure_is_checked() {
    // A ragged bundle whose offsets decrease.
    let offsets: Vec<u8> = [0u64, 3, 1].iter().flat_map(|v| v.to_le_bytes()).collect();
    let flat = [0u8; 12];
    let count = 2u64.to_le_bytes();
    let v = |dtype, n: u64, body| PacketRef::Dense {
        dtype,
        shape: Shape::from_dims(&[n]).unwrap(),
        body,
    };
    let r = PacketRef::Bundle(vec![
        ("__ragged_offsets__", v(DType::U64, 3, &offsets)),
        ("__ragged_flat__", v(DType::F32, 3, &flat)),
        ("__ragged_count__", v(DType::U64, 1, &count)),
    ]);
    let p = encode_packet(&r, &EncodeOptions::default()).unwrap();
    assert!(matches!(dec(p), Err(Error::Malformed { .. })));
    // The encoder refuses the same offsets for a ragged value.
    let r = PacketRef::Ragged {
        framing: tensorwire_packet::RaggedFraming::Bundle,
        offsets: &offsets,
        dtype: DType::F32,
        flat: &flat,
    };
    assert!(encode_packet(&r, &EncodeOptions::default()).is_err());
    // CSR with the wrong number of row pointers.
    let data = [0u8; 8];
    let idx = [0u8; 8];
    let ptr = [0u8; 8];
    let r = PacketRef::Sparse {
        format: tensorwire_packet::SparseFormat::Csr,
        shape: MatrixShape { rows: 4, cols: 4 },
        data: Box::new(v(DType::F32, 2, &data)),
        indices: Box::new(v(DType::I32, 2, &idx)),
        pointers: Box::new(v(DType::I32, 2, &ptr)),
    };
    assert!(matches!(
        encode_packet(&r, &EncodeOptions::default()),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn flags_that_conflict_or_do_not_belong() {
    let mut p = fixture("bundle_nested");
    p[5] |= flags::SPARSE_CSR as u8; // bundle and CSR at once
    assert!(matches!(dec(p), Err(Error::Malformed { .. })));
    let mut p = fixture("worked_example");
    p[6] |= 0x08; // flag 0x800: unknown
    assert!(matches!(dec(p), Err(Error::Unsupported { .. })));
    let mut p = fixture("ipc_ref");
    p[5] |= flags::INTEGRITY as u8;
    assert!(matches!(dec(p), Err(Error::Malformed { .. })));
    let mut p = fixture("ipc_ref");
    p[9] = 0;
    assert!(matches!(dec(p), Err(Error::Malformed { .. })));
    let mut p = fixture("quant_qint8_per_tensor");
    p[5] |= flags::COMPRESSED as u8;
    assert!(matches!(dec(p), Err(Error::Malformed { .. })));
    let mut p = fixture("strings_ascii");
    p[7] = 21;
    assert!(matches!(dec(p), Err(Error::Malformed { .. })));
}

#[test]
fn digests_cover_what_tenso_hashes() {
    for (name, at) in [
        ("quant_qint4_per_group_integrity", 20), // a metadata byte (axis)
        ("strings_integrity", 70),               // an offset
        ("lz4_i32_integrity", 80),               // compressed bytes
        ("bundle_integrity", 100),               // inside a member's body
    ] {
        let mut p = fixture(name);
        p[at] ^= 1;
        let e = dec(p).unwrap_err();
        assert!(
            matches!(e, Error::DigestMismatch { .. } | Error::Malformed { .. }),
            "{name}: {e}"
        );
    }
}

#[test]
fn member_padding_must_be_zero() {
    let m = small_dense();
    let mut padded = m.clone();
    padded.extend_from_slice(&[0; 5]);
    assert!(dec(bundle(&[(b"a", &padded)])).is_ok());
    padded.push(1);
    assert!(matches!(
        dec(bundle(&[(b"a", &padded)])),
        Err(Error::Malformed { .. })
    ));
    // At the top level nothing may follow the packet.
    let mut p = m;
    p.push(0);
    assert!(matches!(dec(p), Err(Error::Malformed { .. })));
}

#[test]
fn encoder_refuses_inconsistent_parts() {
    let e = |r: PacketRef<'_>| encode_packet(&r, &EncodeOptions::default()).unwrap_err();
    let bad_offsets: Vec<u8> = [0u64, 4].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert!(matches!(
        e(PacketRef::Strings {
            offsets: &bad_offsets,
            payload: b"abc"
        }),
        Error::InvalidArgument { .. }
    ));
    assert!(matches!(
        e(PacketRef::Strings {
            offsets: &[1, 2, 3],
            payload: b""
        }),
        Error::InvalidArgument { .. }
    ));
    let one = 1.0f32.to_le_bytes();
    assert!(matches!(
        e(PacketRef::Quantized {
            dtype: DType::QInt4,
            shape: Shape::from_dims(&[3]).unwrap(),
            scheme: QuantScheme::PerTensor,
            axis: 0,
            group_size: 0,
            scales: &one,
            zero_points: &one,
            data: &[0; 1],
        }),
        Error::SizeMismatch { .. }
    ));
    assert!(matches!(
        e(PacketRef::Quantized {
            dtype: DType::I8,
            shape: Shape::from_dims(&[1]).unwrap(),
            scheme: QuantScheme::PerTensor,
            axis: 0,
            group_size: 0,
            scales: &one,
            zero_points: &[],
            data: &[0; 1],
        }),
        Error::InvalidArgument { .. }
    ));
}

#[test]
fn sparse_matrices_past_i64_elements_round_trip_and_other_ranks_are_refused() {
    // A 2³² − 1 square matrix holds more elements than i64 counts; tenso writes and
    // reads it, since only the two stored values are arrays.
    let side = u64::from(u32::MAX);
    let data: Vec<u8> = [1.0f64, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let rows: Vec<u8> = [0i64, side as i64 - 1]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let part = |dtype, body| PacketRef::Dense {
        dtype,
        shape: Shape::from_dims(&[2]).unwrap(),
        body,
    };
    let matrix = |shape| PacketRef::Sparse {
        format: tensorwire_packet::SparseFormat::Coo,
        shape,
        data: Box::new(part(DType::F64, &data)),
        indices: Box::new(part(DType::I64, &rows)),
        pointers: Box::new(part(DType::I64, &rows)),
    };
    let huge = MatrixShape {
        rows: side,
        cols: side,
    };
    let bytes = encode_packet(&matrix(huge), &EncodeOptions::default()).unwrap();
    match dec(bytes.clone()).unwrap() {
        Packet::Sparse(s) => {
            assert_eq!(s.shape, huge);
            assert_eq!(s.shape.to_string(), "[4294967295, 4294967295]");
            assert_eq!(s.data.bytes.as_ref(), &data[..]);
            assert_eq!(s.indices.bytes.as_ref(), &rows[..]);
        }
        other => panic!("expected a sparse packet, got {}", other.kind()),
    }
    // A dimension the wire's u32 cannot hold is refused by the encoder.
    let wider = MatrixShape {
        rows: side + 1,
        cols: 1,
    };
    assert!(matches!(
        encode_packet(&matrix(wider), &EncodeOptions::default()),
        Err(Error::InvalidArgument { .. })
    ));
    // A header claiming a 1-D or 3-D sparse matrix (ndim is byte 8) is malformed.
    for ndim in [1u8, 3] {
        let mut bad = bytes.clone();
        bad[8] = ndim;
        match dec(bad) {
            Err(Error::Malformed { reason, .. }) if ndim == 1 => {
                assert!(reason.contains("2-D matrices, not 1-D"), "{reason}")
            }
            Err(Error::Malformed { .. }) => {}
            other => panic!("ndim {ndim}: expected a malformed error, got {other:?}"),
        }
    }
}
