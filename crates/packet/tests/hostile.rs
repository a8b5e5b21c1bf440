//! Malformed packets give typed errors, never panics or large allocations.

use proptest::prelude::*;
use tensorwire_core::{Bytes, DType, Error, Shape};
use tensorwire_packet::{decode, encode, encode_parts, EncodeOptions};

fn good(integrity: bool) -> Vec<u8> {
    let body: Vec<u8> = (0..24u8).collect();
    let options = EncodeOptions {
        integrity,
        ..EncodeOptions::default()
    };
    encode(
        DType::F32,
        &Shape::from_dims(&[2, 3]).unwrap(),
        &body,
        options,
    )
    .unwrap()
}

fn dec(v: Vec<u8>) -> Result<tensorwire_core::TensorView, Error> {
    decode(&Bytes::from_vec(v))
}

#[test]
fn every_truncation_is_a_typed_error() {
    for integrity in [false, true] {
        let p = good(integrity);
        for cut in 0..p.len() {
            assert!(
                matches!(dec(p[..cut].to_vec()), Err(Error::Truncated { .. })),
                "cut at {cut}"
            );
        }
    }
}

#[test]
fn bad_magic_version_and_trailing_bytes() {
    let mut p = good(false);
    p[0] = b'X';
    assert!(matches!(dec(p), Err(Error::BadMagic { .. })));
    let mut p = good(false);
    p[4] = 9;
    assert!(matches!(dec(p), Err(Error::Unsupported { .. })));
    let mut p = good(false);
    p.push(0);
    assert!(matches!(dec(p), Err(Error::Malformed { .. })));
}

#[test]
fn lying_shapes_never_allocate() {
    // 4 × 0xFFFFFFFF f64 elements declared in a 64-byte packet.
    let mut p = good(false);
    p[7] = 3;
    p[10..14].copy_from_slice(&u32::MAX.to_le_bytes());
    p[14..18].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        dec(p),
        Err(Error::LimitExceeded { .. } | Error::Overflow { .. })
    ));
    // ndim 33.
    let mut p = good(false);
    p[8] = 33;
    assert!(matches!(dec(p), Err(Error::LimitExceeded { .. })));
    // Unknown dtype code.
    let mut p = good(false);
    p[7] = 99;
    assert!(matches!(dec(p), Err(Error::Malformed { .. })));
}

#[test]
fn corrupted_body_fails_the_integrity_check() {
    let mut p = good(true);
    p[70] ^= 1;
    assert!(matches!(dec(p), Err(Error::DigestMismatch { .. })));
    let mut p = good(true);
    let n = p.len();
    p[n - 1] ^= 1;
    assert!(matches!(dec(p), Err(Error::DigestMismatch { .. })));
}

#[test]
fn packet_kinds_not_read_yet_are_unsupported() {
    for flag in [0x04u16, 0x08, 0x10, 0x20, 0x40, 0x100, 0x200, 0x400] {
        let mut p = good(false);
        p[5..7].copy_from_slice(&(0x01 | flag).to_le_bytes());
        assert!(
            matches!(dec(p), Err(Error::Unsupported { .. })),
            "{flag:#x}"
        );
    }
    let mut p = good(false);
    p[7] = 16; // qint8
    assert!(matches!(dec(p), Err(Error::Unsupported { .. })));
}

#[test]
fn huge_alignment_exponent_is_refused() {
    // Custom alignment with exponent 63.
    let mut p = good(false);
    p[5..7].copy_from_slice(&0x80u16.to_le_bytes());
    p.insert(18, 63);
    assert!(matches!(dec(p), Err(Error::LimitExceeded { .. })));
}

#[test]
fn version_3_packets_decode() {
    // v3: 8-byte header (flags are one byte), then the same layout.
    let mut p = b"TNSO".to_vec();
    p.extend_from_slice(&[3, 0x01, 5, 1, 3, 0, 0, 0]);
    p.resize(64, 0);
    p.extend_from_slice(&[7, 8, 9]);
    let v = dec(p).unwrap();
    assert_eq!(v.dtype, DType::U8);
    assert_eq!(&v.bytes[..], &[7, 8, 9]);
}

#[test]
fn encoder_refuses_bad_input() {
    let shape = Shape::from_dims(&[2]).unwrap();
    let opts = EncodeOptions::default();
    assert!(encode(DType::F32, &shape, &[0; 7], opts).is_err());
    assert!(encode(DType::F8E4M3Fn, &shape, &[0; 2], opts).is_err());
    assert!(encode(DType::QInt8, &shape, &[0; 2], opts).is_err());
    let bad_align = EncodeOptions {
        alignment: 48,
        ..opts
    };
    assert!(encode(DType::U8, &shape, &[0; 2], bad_align).is_err());
    let wide = Shape::from_dims(&[1 << 33]).unwrap();
    assert!(encode_parts(DType::U8, &wide, &[], opts).is_err());
}

proptest! {
    #[test]
    fn round_trips_with_any_shape_and_options(
        dims in proptest::collection::vec(0u64..5, 0..4),
        exp in 0u32..10,
        integrity: bool,
        seed: u8,
    ) {
        let shape = Shape::new(dims).unwrap();
        let body: Vec<u8> = (0..shape.byte_len(DType::I16).unwrap() as usize)
            .map(|i| (i as u8).wrapping_add(seed))
            .collect();
        let options = EncodeOptions { alignment: 1 << exp, integrity, ..EncodeOptions::default() };
        let p = encode(DType::I16, &shape, &body, options).unwrap();
        let info = tensorwire_packet::packet_info(&p, &Default::default()).unwrap();
        prop_assert_eq!(info.body_offset % (1usize << exp), 0);
        prop_assert_eq!(info.total_len, p.len());
        let v = decode(&Bytes::from_vec(p)).unwrap();
        prop_assert_eq!(&v.shape, &shape);
        prop_assert_eq!(&v.bytes[..], &body[..]);
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode(&Bytes::from_vec(data));
    }
}
