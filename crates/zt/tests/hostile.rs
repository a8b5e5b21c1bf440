//! Malformed and hostile `.zt` inputs: each must give a typed error, never a panic.

mod common;

use common::*;
use tensorwire_core::{Bytes, Error, Limits, TensorSource};
use tensorwire_zt::ZtReader;

fn open(data: Vec<u8>) -> Result<ZtReader, Error> {
    ZtReader::from_bytes(Bytes::from_vec(data))
}

fn valid() -> Vec<u8> {
    let blob: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    image(
        &at64(&blob),
        &manifest(vec![("w", dense(&[2], component("f32", 64, 8)))]),
    )
}

#[test]
fn the_valid_baseline_opens() {
    let r = open(valid()).unwrap();
    assert_eq!(r.view("w").unwrap().bytes.len(), 8);
}

#[test]
fn every_truncation_is_a_typed_error() {
    let full = valid();
    for cut in 0..full.len() {
        let err = open(full[..cut].to_vec()).expect_err("truncated file opened");
        assert!(
            matches!(
                err,
                Error::Truncated { .. } | Error::BadMagic { .. } | Error::Malformed { .. }
            ),
            "cut at {cut}: {err:?}"
        );
    }
}

#[test]
fn bad_header_magic() {
    let mut f = valid();
    f[0] = b'X';
    assert!(matches!(open(f), Err(Error::BadMagic { offset: 0, .. })));
}

#[test]
fn bad_footer_magic() {
    let mut f = valid();
    let n = f.len();
    f[n - 1] = b'X';
    assert!(matches!(open(f), Err(Error::BadMagic { .. })));
}

#[test]
fn oversized_manifest_length_is_refused_before_allocating() {
    let mut f = valid();
    let n = f.len();
    f[n - 16..n - 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(open(f), Err(Error::LimitExceeded { .. })));
    let mut f = valid();
    f[n - 16..n - 8].copy_from_slice(&(1u64 << 29).to_le_bytes());
    assert!(matches!(open(f), Err(Error::Truncated { .. })));
}

#[test]
fn manifest_size_limit_is_configurable() {
    let limits = Limits {
        max_metadata_bytes: 16,
        ..Limits::default()
    };
    let err = ZtReader::from_bytes_with(Bytes::from_vec(valid()), &limits).unwrap_err();
    assert!(matches!(
        err,
        Error::LimitExceeded {
            what: "manifest size",
            ..
        }
    ));
}

#[test]
fn offsets_out_of_range() {
    let f = image(
        &at64(&[0; 8]),
        &manifest(vec![("w", dense(&[2], component("f32", 64, 8)))]),
    );
    assert!(open(f).is_ok());
    // Range reaching into the manifest.
    let f = image(
        &at64(&[0; 8]),
        &manifest(vec![("w", dense(&[100], component("f32", 64, 400)))]),
    );
    assert!(matches!(open(f), Err(Error::OutOfBounds { .. })));
    // Offset overflowing u64.
    let f = image(
        &at64(&[0; 8]),
        &manifest(vec![("w", dense(&[2], component("f32", u64::MAX - 63, 8)))]),
    );
    assert!(matches!(
        open(f),
        Err(Error::Overflow { .. } | Error::OutOfBounds { .. })
    ));
    // A blob over the header magic.
    let f = image(
        &at64(&[0; 8]),
        &manifest(vec![("w", dense(&[2], component("f32", 0, 8)))]),
    );
    assert!(matches!(open(f), Err(Error::OutOfBounds { .. })));
}

#[test]
fn misaligned_blob() {
    let f = image(
        &at64(&[0; 16]),
        &manifest(vec![("w", dense(&[2], component("f32", 68, 8)))]),
    );
    assert!(matches!(open(f), Err(Error::Misaligned { offset: 68, .. })));
}

#[test]
fn overlapping_blobs() {
    let f = image(
        &at64(&[0; 16]),
        &manifest(vec![
            ("a", dense(&[4], component("f32", 64, 16))),
            ("b", dense(&[2], component("f32", 64, 8))),
        ]),
    );
    assert!(matches!(open(f), Err(Error::Overlap { .. })));
}

#[test]
fn length_that_disagrees_with_the_shape() {
    let f = image(
        &at64(&[0; 8]),
        &manifest(vec![("w", dense(&[3], component("f32", 64, 8)))]),
    );
    assert!(matches!(
        open(f),
        Err(Error::SizeMismatch {
            expected: 12,
            found: 8,
            ..
        })
    ));
}

#[test]
fn shape_product_overflow() {
    let f = image(
        &at64(&[0; 8]),
        &manifest(vec![("w", dense(&[u64::MAX, 4], component("f32", 64, 8)))]),
    );
    assert!(matches!(open(f), Err(Error::Overflow { .. })));
}

#[test]
fn too_many_dimensions() {
    let f = image(
        &at64(&[0; 8]),
        &manifest(vec![("w", dense(&[1; 65], component("f32", 64, 4)))]),
    );
    assert!(matches!(open(f), Err(Error::LimitExceeded { .. })));
}

#[test]
fn wrong_digest_is_caught_on_read_and_verify() {
    let blob = [7u8; 8];
    let mut comp = component("u8", 64, 8);
    if let ciborium::Value::Map(m) = &mut comp {
        m.push((text("digest"), text("crc32c:0x00000000")));
    }
    let f = image(&at64(&blob), &manifest(vec![("w", dense(&[8], comp))]));
    let r = open(f).unwrap();
    assert!(matches!(r.view("w"), Err(Error::DigestMismatch { .. })));
    assert!(matches!(r.verify(), Err(Error::DigestMismatch { .. })));
}

#[test]
fn unparseable_digest_is_malformed() {
    let mut comp = component("u8", 64, 8);
    if let ciborium::Value::Map(m) = &mut comp {
        m.push((text("digest"), text("md5:abc")));
    }
    let f = image(&at64(&[0; 8]), &manifest(vec![("w", dense(&[8], comp))]));
    assert!(matches!(open(f), Err(Error::Malformed { .. })));
}

#[test]
fn zstd_frame_that_inflates_beyond_its_declared_size() {
    let payload = vec![0u8; 1 << 20];
    let frame = zstd::encode_all(&payload[..], 3).unwrap();
    let comp = map(vec![
        ("dtype", text("u8")),
        ("offset", int(64)),
        ("length", int(frame.len() as u64)),
        ("uncompressed_length", int(16)),
        ("encoding", text("zstd")),
    ]);
    let f = image(&at64(&frame), &manifest(vec![("bomb", dense(&[16], comp))]));
    let r = open(f).unwrap();
    assert!(matches!(r.view("bomb"), Err(Error::Decode { .. })));
}

#[test]
fn zstd_frame_shorter_than_declared() {
    let frame = zstd::encode_all(&[1u8; 8][..], 3).unwrap();
    let comp = map(vec![
        ("dtype", text("u8")),
        ("offset", int(64)),
        ("length", int(frame.len() as u64)),
        ("uncompressed_length", int(16)),
        ("encoding", text("zstd")),
    ]);
    let f = image(
        &at64(&frame),
        &manifest(vec![("short", dense(&[16], comp))]),
    );
    let r = open(f).unwrap();
    assert!(matches!(r.view("short"), Err(Error::SizeMismatch { .. })));
}

#[test]
fn garbage_zstd_is_a_decode_error() {
    let comp = map(vec![
        ("dtype", text("u8")),
        ("offset", int(64)),
        ("length", int(8)),
        ("uncompressed_length", int(8)),
        ("encoding", text("zstd")),
    ]);
    let f = image(
        &at64(&[0xAB; 8]),
        &manifest(vec![("junk", dense(&[8], comp))]),
    );
    assert!(matches!(
        open(f).unwrap().view("junk"),
        Err(Error::Decode { .. })
    ));
}

#[test]
fn decoded_size_above_the_limit_is_refused() {
    let comp = map(vec![
        ("dtype", text("u8")),
        ("offset", int(64)),
        ("length", int(8)),
        ("uncompressed_length", int(1 << 40)),
        ("encoding", text("zstd")),
    ]);
    let f = image(
        &at64(&[0; 8]),
        &manifest(vec![("huge", dense(&[1 << 40], comp))]),
    );
    let limits = Limits {
        max_decoded_bytes: 1 << 30,
        ..Limits::default()
    };
    assert!(matches!(
        ZtReader::from_bytes_with(Bytes::from_vec(f), &limits),
        Err(Error::LimitExceeded { .. })
    ));
}

#[test]
fn manifest_that_is_not_cbor_or_has_wrong_types() {
    assert!(matches!(
        open(image_raw(&at64(&[0; 8]), &[0xff, 0xff, 0xff])),
        Err(Error::Malformed { .. })
    ));
    let f = image(
        &[],
        &map(vec![("version", int(1)), ("objects", map(vec![]))]),
    );
    assert!(matches!(open(f), Err(Error::Malformed { .. })));
    let f = image(&[], &map(vec![("version", text("1.2.0"))]));
    assert!(matches!(open(f), Err(Error::Malformed { .. })));
    let f = image(
        &[],
        &map(vec![("version", text("2.0.0")), ("objects", map(vec![]))]),
    );
    assert!(matches!(open(f), Err(Error::Unsupported { .. })));
    let f = image(
        &at64(&[0; 8]),
        &manifest(vec![("w", dense(&[2], component("f128", 64, 8)))]),
    );
    assert!(matches!(open(f), Err(Error::UnknownDType { .. })));
    let f = image(
        &at64(&[0; 8]),
        &manifest(vec![("w", dense(&[2], component("complex64", 64, 8)))]),
    );
    assert!(matches!(open(f), Err(Error::Malformed { .. })));
}

#[test]
fn trailing_bytes_after_the_cbor_manifest() {
    let mut cbor = Vec::new();
    ciborium::ser::into_writer(&manifest(vec![]), &mut cbor).unwrap();
    cbor.push(0);
    assert!(matches!(
        open(image_raw(&[], &cbor)),
        Err(Error::Malformed { .. })
    ));
}

#[test]
fn deeply_nested_attributes() {
    let mut v = int(0);
    for _ in 0..500 {
        v = ciborium::Value::Array(vec![v]);
    }
    let f = image(
        &[],
        &map(vec![
            ("version", text("1.2.0")),
            ("attributes", map(vec![("x", v)])),
            ("objects", map(vec![])),
        ]),
    );
    assert!(matches!(
        open(f),
        Err(Error::Malformed { .. } | Error::LimitExceeded { .. })
    ));
}

#[test]
fn empty_and_duplicate_names() {
    // An empty name reads (ztensor 1.2.3 writes and reads one); a repeated one does not.
    let f = image(
        &at64(&[0; 8]),
        &manifest(vec![("", dense(&[2], component("f32", 64, 8)))]),
    );
    let r = open(f).unwrap();
    assert_eq!(r.tensors()[0].name.as_ref(), "");
    let f = image(
        &at64(&[0; 8]),
        &manifest(vec![
            ("w", dense(&[2], component("f32", 64, 8))),
            ("w", dense(&[0], component("f32", 64, 0))),
        ]),
    );
    assert!(matches!(
        open(f),
        Err(Error::Duplicate { .. } | Error::Malformed { .. })
    ));
}

#[test]
fn non_dense_view_is_unsupported_not_a_panic() {
    let obj = map(vec![
        ("shape", ciborium::Value::Array(vec![int(2), int(2)])),
        ("format", text("sparse_coo")),
        (
            "components",
            map(vec![
                ("values", component("f32", 64, 4)),
                ("coords", component("u64", 128, 16)),
            ]),
        ),
    ]);
    let mut data = at64(&[0; 4]);
    data.resize(120, 0);
    data.extend_from_slice(&[0; 16]);
    let r = open(image(&data, &manifest(vec![("s", obj)]))).unwrap();
    assert!(matches!(r.view("s"), Err(Error::Unsupported { .. })));
    assert_eq!(r.component("s", "coords").unwrap().len(), 16);
}

#[test]
fn verify_decodes_compressed_components() {
    let frame = zstd::encode_all(&[1u8; 8][..], 3).unwrap();
    let comp = map(vec![
        ("dtype", text("u8")),
        ("offset", int(64)),
        ("length", int(frame.len() as u64)),
        ("uncompressed_length", int(16)),
        ("encoding", text("zstd")),
    ]);
    let f = image(
        &at64(&frame),
        &manifest(vec![("short", dense(&[16], comp))]),
    );
    let r = open(f).unwrap();
    assert!(matches!(r.verify(), Err(Error::SizeMismatch { .. })));
    assert!(r.verify().unwrap_err().is_corrupt_data());
}

/// A zstd frame of one RLE block: 12 bytes that decode to `size` copies of 7, the most
/// output per stored byte libzstd gives (single-segment frames honour the block header's
/// 21-bit size). The format caps blocks at 128 KiB and no encoder writes larger ones;
/// libzstd's one-shot decoder (reads) accepts them, its streaming decoder does not, so
/// the bound is set for the laxer of the two and `verify` decodes such frames as reads do.
fn densest_zstd_frame(size: u32) -> Vec<u8> {
    let mut frame = 0xFD2F_B528u32.to_le_bytes().to_vec();
    frame.push(0x20 | 0x80); // single segment, 4-byte content size
    frame.extend_from_slice(&size.to_le_bytes());
    let block_header = 1 | (1 << 1) | (size << 3); // last block, RLE
    frame.extend_from_slice(&block_header.to_le_bytes()[..3]);
    frame.push(7);
    frame
}

fn zstd_component(stored: u64, decoded: u64) -> ciborium::Value {
    map(vec![
        ("dtype", text("u8")),
        ("offset", int(64)),
        ("length", int(stored)),
        ("uncompressed_length", int(decoded)),
        ("encoding", text("zstd")),
    ])
}

#[test]
fn a_decoded_size_no_zstd_data_of_that_length_makes_is_refused_on_open() {
    // 8 stored bytes claiming 8 GiB (under the 64 GiB limit): refused before any
    // buffer for it is allocated.
    let f = image(
        &at64(&[0; 8]),
        &manifest(vec![(
            "bomb",
            dense(&[8 << 30], zstd_component(8, 8 << 30)),
        )]),
    );
    match open(f) {
        Err(Error::Decode { tensor, reason, .. }) => {
            assert_eq!(tensor, "bomb/data");
            assert!(reason.contains("8589934592 decoded bytes"), "{reason}");
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[test]
fn the_densest_zstd_frame_libzstd_decodes_is_within_the_bound() {
    let size = (1u32 << 21) - 1;
    let frame = densest_zstd_frame(size);
    let n = frame.len() as u64;
    let f = image(
        &at64(&frame),
        &manifest(vec![(
            "dense",
            dense(&[size as u64], zstd_component(n, size as u64)),
        )]),
    );
    let r = open(f).unwrap();
    let v = r.view("dense").unwrap();
    assert_eq!(v.bytes.len(), size as usize);
    assert!(v.bytes.iter().all(|&b| b == 7));
    assert_eq!(r.verify().unwrap(), 0, "verify accepts what reads accept");
}

/// A frame that is not single-segment, with a 1 KiB window, and one RLE block of
/// `size` bytes (more than the window: the streaming decoder refuses it, the one-shot
/// decoder does not).
fn windowed_rle_frame(size: u32) -> Vec<u8> {
    let mut frame = 0xFD2F_B528u32.to_le_bytes().to_vec();
    frame.push(0x00); // no content size, not single-segment
    frame.push(0x00); // window descriptor: 1 KiB
    let block_header = 1 | (1 << 1) | (size << 3); // last block, RLE
    frame.extend_from_slice(&block_header.to_le_bytes()[..3]);
    frame.push(7);
    frame
}

#[test]
fn verify_accepts_what_reads_accept_and_refuses_what_they_refuse() {
    let frame = windowed_rle_frame(100_000);
    let n = frame.len() as u64;
    for (declared, readable) in [(100_000u64, true), (100_001, false), (99_999, false)] {
        let f = image(
            &at64(&frame),
            &manifest(vec![("w", dense(&[declared], zstd_component(n, declared)))]),
        );
        let r = open(f).unwrap();
        assert_eq!(r.view("w").is_ok(), readable, "{declared}");
        assert_eq!(r.verify().is_ok(), readable, "{declared}");
        if readable {
            assert!(r.view("w").unwrap().bytes.iter().all(|&b| b == 7));
        }
    }
}

#[test]
fn verify_of_a_frame_claiming_gigabytes_is_an_error_not_an_abort() {
    // 8 KiB stored (the RLE frame, then a skippable frame as padding) may claim
    // 4 GiB under the expansion bound; the frame makes 200 000 bytes.
    let mut stored = densest_zstd_frame(200_000);
    stored.extend(0x184D_2A50u32.to_le_bytes());
    let pad = 8192 - stored.len() - 4;
    stored.extend((pad as u32).to_le_bytes());
    stored.resize(8192, 0);
    let declared = 4u64 << 30;
    let f = image(
        &at64(&stored),
        &manifest(vec![(
            "big",
            dense(&[declared], zstd_component(8192, declared)),
        )]),
    );
    let r = open(f).unwrap();
    assert!(r.verify().is_err());
}

#[test]
fn verify_checks_the_length_of_a_frame_with_an_oversized_block() {
    // The RLE block makes 200 000 bytes; the manifest says 200 001.
    let frame = densest_zstd_frame(200_000);
    let n = frame.len() as u64;
    let f = image(
        &at64(&frame),
        &manifest(vec![(
            "long",
            dense(&[200_001], zstd_component(n, 200_001)),
        )]),
    );
    let r = open(f).unwrap();
    assert!(r.view("long").is_err());
    let err = r.verify().unwrap_err();
    assert!(err.is_corrupt_data(), "{err}");
}
