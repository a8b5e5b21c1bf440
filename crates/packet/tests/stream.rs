//! Streams of packets: back to back over `Read` / `Write` (and tokio with the `tokio`
//! feature), any chunking, clean ends vs truncation, lying lengths with bounded
//! buffers, deep nesting, LZ4 frames, vectored partial writes.

use std::io::{self, Cursor, IoSlice, Read, Write};
use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use tensorwire_core::{Bytes, DType, Error, Shape};
use tensorwire_packet::{
    decode_packet, encode, flags, packet_info, EncodeOptions, Framing, PacketFramer, PacketLimits,
    PacketReader, PacketWriter, READ_CHUNK,
};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/packet")
}

/// Every single-packet fixture (`*.tnso`), sorted by name.
fn fixture_packets() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(fixture_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tnso"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    out.sort();
    assert!(out.len() >= 25, "fixture set incomplete: {}", out.len());
    out
}

/// The packets of `stream.json`: (name, kind, offset, len).
type Listing = Vec<(String, String, usize, usize)>;

/// `stream.bin` written by tenso, and its listing.
fn tenso_stream() -> (Vec<u8>, Listing) {
    let dir = fixture_dir();
    let data = std::fs::read(dir.join("stream.bin")).unwrap();
    let listing: Json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("stream.json")).unwrap()).unwrap();
    let packets = listing["packets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["kind"].as_str().unwrap().to_owned(),
                p["offset"].as_u64().unwrap() as usize,
                p["len"].as_u64().unwrap() as usize,
            )
        })
        .collect();
    (data, packets)
}

/// A reader that returns at most `chunk(i)` bytes on its i-th call.
struct Chunked<R, F> {
    inner: R,
    calls: usize,
    chunk: F,
}

impl<R: Read, F: FnMut(usize) -> usize> Read for Chunked<R, F> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (self.chunk)(self.calls).max(1).min(buf.len());
        self.calls += 1;
        self.inner.read(&mut buf[..n])
    }
}

fn one_byte_at_a_time(data: Vec<u8>) -> impl Read {
    Chunked {
        inner: Cursor::new(data),
        calls: 0,
        chunk: |_| 1,
    }
}

/// Odd chunk sizes from a small LCG, 1 to 4099 bytes.
fn odd_chunks(data: Vec<u8>, seed: u64) -> impl Read {
    let mut state = seed;
    Chunked {
        inner: Cursor::new(data),
        calls: 0,
        chunk: move |_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % 4099) as usize + 1
        },
    }
}

fn read_all<R: Read>(reader: &mut PacketReader<R>) -> Vec<Bytes> {
    let mut out = Vec::new();
    while let Some(p) = reader.read_packet_bytes().unwrap() {
        assert!(p.is_aligned(64), "packet buffer not 64-byte aligned");
        out.push(p);
    }
    out
}

fn v4_header(flags: u16, code: u8, ndim: u8) -> Vec<u8> {
    let mut h = b"TNSO".to_vec();
    h.push(4);
    h.extend_from_slice(&flags.to_le_bytes());
    h.extend_from_slice(&[code, ndim, 0]);
    h
}

fn dense(values: &[f32], options: EncodeOptions) -> Vec<u8> {
    let body: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let shape = Shape::from_dims(&[values.len() as u64]).unwrap();
    encode(DType::F32, &shape, &body, options).unwrap()
}

fn bundle(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut p = v4_header(flags::BUNDLE, 0, entries.len() as u8);
    for (k, v) in entries {
        p.extend_from_slice(&(k.len() as u32).to_le_bytes());
        p.extend_from_slice(k.as_bytes());
        p.extend_from_slice(&(v.len() as u32).to_le_bytes());
        p.extend_from_slice(v);
    }
    p
}

fn read_err(data: Vec<u8>, limits: PacketLimits) -> (Error, usize) {
    let mut r = PacketReader::with_limits(Cursor::new(data), limits);
    let e = loop {
        match r.read_packet_bytes() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("stream read without error"),
            Err(e) => break e,
        }
    };
    assert!(r.is_failed());
    (e, r.peak_buffer_capacity())
}

// ------------------------------------------------------------------ good streams

#[test]
fn every_fixture_back_to_back_in_any_chunking() {
    let packets = fixture_packets();
    let stream: Vec<u8> = packets.iter().flat_map(|(_, p)| p.clone()).collect();
    let readers: Vec<(&str, Box<dyn Read>)> = vec![
        ("cursor", Box::new(Cursor::new(stream.clone()))),
        ("one byte", Box::new(one_byte_at_a_time(stream.clone()))),
        ("odd chunks", Box::new(odd_chunks(stream.clone(), 1))),
    ];
    for (label, source) in readers {
        let mut r = PacketReader::new(source);
        let got = read_all(&mut r);
        assert_eq!(got.len(), packets.len(), "{label}");
        for ((name, want), got) in packets.iter().zip(&got) {
            assert_eq!(&got[..], &want[..], "{label}: {name}");
        }
        assert_eq!(r.position(), stream.len() as u64, "{label}");
        assert_eq!(r.packets_read(), packets.len() as u64);
        assert!(
            r.read_packet_bytes().unwrap().is_none(),
            "{label}: EOF is sticky"
        );
    }
}

#[test]
fn decoded_packets_match_decoding_each_file_and_dense_bodies_are_zero_copy_and_aligned() {
    let packets = fixture_packets();
    let stream: Vec<u8> = packets.iter().flat_map(|(_, p)| p.clone()).collect();
    let mut r = PacketReader::new(one_byte_at_a_time(stream));
    let mut kinds = std::collections::BTreeSet::new();
    for (name, file) in &packets {
        let want = decode_packet(&Bytes::from_vec(file.clone()));
        let got = r.read_packet();
        let (want, got) = match (want, got) {
            (Ok(w), Ok(Some(g))) => (w, g),
            (Err(w), Err(g)) => {
                // A packet that frames but does not decode fails alone.
                assert_eq!(w.to_string(), g.to_string(), "{name}");
                assert!(!r.is_failed(), "{name}");
                continue;
            }
            (w, g) => panic!("{name}: decoding the file gives {w:?}, the stream {g:?}"),
        };
        assert_eq!(got.kind(), want.kind(), "{name}");
        kinds.insert(got.kind());
        if let (Some(got), Some(want)) = (got.as_dense(), want.as_dense()) {
            assert_eq!((got.dtype, &got.shape), (want.dtype, &want.shape), "{name}");
            assert_eq!(&got.bytes[..], &want.bytes[..], "{name}");
            if let Ok(info) = packet_info(file, &PacketLimits::default()) {
                assert!(got.zero_copy, "{name}");
                let promised = info.alignment.min(64);
                assert!(
                    got.bytes.is_aligned(promised),
                    "{name}: body not {promised}-aligned"
                );
            }
        }
    }
    assert!(r.next().is_none());
    assert!(kinds.len() >= 2, "{kinds:?}");
}

#[test]
fn stream_written_by_tenso_frames_every_kind() {
    let (data, listing) = tenso_stream();
    assert!(listing.len() >= 20);
    for kind in [
        "dense",
        "dense_lz4",
        "bundle",
        "sparse",
        "quantized",
        "string",
    ] {
        assert!(
            listing.iter().any(|p| p.1 == kind),
            "no {kind} packet in stream.bin"
        );
    }
    for (label, source) in [
        (
            "cursor",
            Box::new(Cursor::new(data.clone())) as Box<dyn Read>,
        ),
        ("one byte", Box::new(one_byte_at_a_time(data.clone()))),
        ("odd chunks", Box::new(odd_chunks(data.clone(), 7))),
    ] {
        let mut r = PacketReader::new(source);
        let got = read_all(&mut r);
        assert_eq!(got.len(), listing.len(), "{label}");
        for ((name, _, offset, len), packet) in listing.iter().zip(&got) {
            assert_eq!(packet.len(), *len, "{label}: {name}");
            assert_eq!(&packet[..], &data[*offset..offset + len], "{label}: {name}");
        }
    }
}

#[test]
fn the_framer_agrees_with_itself_fed_whole_or_byte_by_byte() {
    let (data, listing) = tenso_stream();
    for (name, _, offset, len) in listing {
        let packet = &data[offset..offset + len];
        let mut whole = PacketFramer::new(PacketLimits::default());
        assert_eq!(
            whole.advance(packet).unwrap(),
            Framing::Complete { len: len as u64 },
            "{name}"
        );
        // Fed a growing prefix, it only ever asks for more, never past the end.
        let mut framer = PacketFramer::new(PacketLimits::default());
        let mut have = 0usize;
        loop {
            match framer.advance(&packet[..have]).unwrap() {
                Framing::Incomplete { need } => {
                    assert!(need as usize > have && need as usize <= len, "{name}");
                    have = need as usize;
                }
                Framing::Complete { len: got } => {
                    assert_eq!(got as usize, len, "{name}");
                    break;
                }
            }
        }
    }
}

/// A bundle holding an LZ4 member with a custom alignment (the member's LZ4 frame runs
/// to its length prefix).
fn bundle_with_aligned_lz4_member() -> Vec<u8> {
    let raw = [7u8; 40];
    let mut member = v4_header(
        flags::CUSTOM_ALIGNMENT | flags::COMPRESSED | flags::INTEGRITY,
        5,
        1,
    );
    member.extend_from_slice(&(raw.len() as u32).to_le_bytes());
    member.push(5); // 32-byte alignment
    member.resize(32, 0);
    member.extend_from_slice(&lz4_frame(&raw, 16, 0, false));
    member.extend_from_slice(&[1; 8]);
    bundle(&[
        ("lz4", &member),
        ("plain", &dense(&[1.0], EncodeOptions::default())),
    ])
}

#[test]
fn the_framer_gives_the_same_answer_fed_one_byte_more_each_time() {
    let (data, listing) = tenso_stream();
    let mut packets: Vec<(String, Vec<u8>)> = listing
        .iter()
        .map(|(name, _, o, l)| (name.clone(), data[*o..o + l].to_vec()))
        .collect();
    packets.extend(fixture_packets());
    packets.push((
        "aligned lz4 member".into(),
        bundle_with_aligned_lz4_member(),
    ));
    for (name, packet) in packets.iter().filter(|p| p.1.len() < 10_000) {
        let mut framer = PacketFramer::new(PacketLimits::default());
        for have in 0..packet.len() {
            match framer.advance(&packet[..have]) {
                Ok(Framing::Incomplete { need }) => {
                    assert!(
                        need as usize > have && need as usize <= packet.len(),
                        "{name}"
                    )
                }
                other => panic!("{name} at {have} bytes: {other:?}"),
            }
        }
        assert_eq!(
            framer.advance(packet).unwrap(),
            Framing::Complete {
                len: packet.len() as u64
            },
            "{name}"
        );
    }
}

// ------------------------------------------------------------------ ends

#[test]
fn empty_stream_is_a_clean_end() {
    let mut r = PacketReader::new(Cursor::new(Vec::new()));
    assert!(r.read_packet_bytes().unwrap().is_none());
    assert!(r.read_packet().unwrap().is_none());
    assert!(!r.is_failed());
}

#[test]
fn truncation_at_every_byte_names_needed_and_read_bytes() {
    let (data, listing) = tenso_stream();
    for (name, _, offset, len) in listing.iter().filter(|p| p.3 < 5000) {
        let packet = &data[*offset..offset + len];
        for cut in 1..*len {
            let mut r = PacketReader::new(Cursor::new(packet[..cut].to_vec()));
            match r.read_packet_bytes() {
                Err(Error::Truncated {
                    offset: 0,
                    needed,
                    available,
                }) => {
                    assert_eq!(available, cut as u64, "{name} cut at {cut}");
                    assert!(
                        needed > available && needed <= *len as u64,
                        "{name} cut at {cut}"
                    );
                }
                other => panic!("{name} cut at {cut}: {other:?}"),
            }
            // The stream is out of sync: no more packets, and the iterator ends.
            assert!(r.read_packet_bytes().is_err());
            assert!(r.next().is_none());
        }
    }
    // A whole packet, then a partial one.
    let mut two = dense(&[1.0, 2.0], EncodeOptions::default());
    two.extend_from_slice(b"TNSO\x04");
    let mut r = PacketReader::new(Cursor::new(two));
    assert!(r.read_packet().unwrap().is_some());
    assert!(matches!(
        r.read_packet(),
        Err(Error::Truncated {
            needed: 8,
            available: 5,
            ..
        })
    ));
}

#[test]
fn iterator_yields_a_framing_error_once_then_ends() {
    let mut data = dense(&[1.0], EncodeOptions::default());
    data.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n");
    let mut it = PacketReader::new(Cursor::new(data));
    assert!(it.next().unwrap().is_ok());
    let e = it.next().unwrap().unwrap_err();
    assert!(matches!(e, Error::BadMagic { offset: 0, .. }), "{e}");
    assert!(it.next().is_none());
}

#[test]
fn bad_magic_is_refused_from_the_first_byte() {
    let mut r = PacketReader::new(one_byte_at_a_time(b"XNSO\x04...........".to_vec()));
    assert!(matches!(
        r.read_packet_bytes(),
        Err(Error::BadMagic { ref found, .. }) if found == b"XNSO"
    ));
    // The framer needs one wrong byte only.
    let mut framer = PacketFramer::new(PacketLimits::default());
    assert_eq!(
        framer.advance(b"T").unwrap(),
        Framing::Incomplete { need: 8 }
    );
    assert!(matches!(
        framer.advance(b"TX"),
        Err(Error::BadMagic { ref found, .. }) if found == b"TX"
    ));
    let (e, _) = read_err(b"TNSO\x09\0\0\0\0\0".to_vec(), PacketLimits::default());
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
}

#[test]
fn a_packet_that_frames_but_does_not_decode_fails_alone() {
    let mut bad = dense(
        &[1.0, 2.0],
        EncodeOptions {
            integrity: true,
            ..EncodeOptions::default()
        },
    );
    let body_at = 64;
    bad[body_at] ^= 1;
    let good = dense(&[3.0], EncodeOptions::default());
    let mut r = PacketReader::new(Cursor::new([bad, good].concat()));
    assert!(matches!(r.read_packet(), Err(Error::DigestMismatch { .. })));
    assert!(!r.is_failed());
    let v = r.read_packet().unwrap().unwrap();
    assert_eq!(&v.as_dense().unwrap().bytes[..], &3.0f32.to_le_bytes());
}

// ------------------------------------------------------------------ lying lengths

#[test]
fn a_20_byte_packet_announcing_16_gib_allocates_one_chunk() {
    // complex128 × 10⁹ elements: a 16 GB body, within every limit.
    let mut p = v4_header(flags::ALIGNED, 14, 1);
    p.extend_from_slice(&1_000_000_000u32.to_le_bytes());
    p.extend_from_slice(&[0; 6]);
    assert_eq!(p.len(), 20);
    let (e, peak) = read_err(p, PacketLimits::default());
    assert!(
        matches!(
            e,
            Error::Truncated {
                needed: 16_000_000_064,
                available: 20,
                ..
            }
        ),
        "{e}"
    );
    assert!(peak <= READ_CHUNK + 256, "peak buffer {peak}");
}

#[test]
fn buffer_grows_with_the_bytes_received_not_the_bytes_announced() {
    // 10 MiB of a 16 GB body arrive, then the stream ends.
    let mut p = v4_header(flags::ALIGNED, 14, 1);
    p.extend_from_slice(&1_000_000_000u32.to_le_bytes());
    p.resize(64 + (10 << 20), 0);
    let received = p.len();
    let (e, peak) = read_err(p, PacketLimits::default());
    assert!(matches!(e, Error::Truncated { .. }), "{e}");
    assert!(peak <= received + READ_CHUNK + 256, "peak buffer {peak}");
}

#[test]
fn packets_above_max_packet_bytes_are_refused_before_reading_the_body() {
    let limits = PacketLimits {
        max_packet_bytes: 1 << 20,
        ..PacketLimits::default()
    };
    let mut p = v4_header(flags::ALIGNED, 1, 1);
    p.extend_from_slice(&(1u32 << 20).to_le_bytes());
    p.resize(64, 0);
    let (e, peak) = read_err(p, limits);
    assert!(
        matches!(
            e,
            Error::LimitExceeded {
                what: "packet length",
                found: 4_194_368,
                ..
            }
        ),
        "{e}"
    );
    assert!(peak < 4096, "{peak}");
}

#[test]
fn lying_header_fields_give_typed_errors() {
    let limits = PacketLimits::default();
    let limit = |e: &Error| match e {
        Error::LimitExceeded { what, .. } => *what,
        other => panic!("{other}"),
    };
    // 33 dimensions.
    let (e, _) = read_err(v4_header(flags::ALIGNED, 1, 33), limits);
    assert_eq!(limit(&e), "number of dimensions");
    // 2^32-1 × 2^32-1 elements.
    let mut p = v4_header(flags::ALIGNED, 1, 2);
    p.extend_from_slice(&[0xFF; 8]);
    let (e, _) = read_err(p, limits);
    assert_eq!(limit(&e), "element count");
    // Alignment 2^40.
    let mut p = v4_header(flags::CUSTOM_ALIGNMENT, 1, 1);
    p.extend_from_slice(&1u32.to_le_bytes());
    p.push(40);
    let (e, _) = read_err(p, limits);
    assert_eq!(limit(&e), "alignment exponent");
    // A bundle of 200 entries when 10 are allowed.
    let small = PacketLimits {
        max_bundle_entries: 10,
        ..limits
    };
    let (e, _) = read_err(v4_header(flags::BUNDLE, 0, 200), small);
    assert_eq!(limit(&e), "bundle entries");
    // A quantized packet with 4·10⁹ scales.
    let mut p = v4_header(flags::ALIGNED, 16, 1);
    p.extend_from_slice(&4u32.to_le_bytes());
    p.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    p.extend_from_slice(&4_000_000_000u32.to_le_bytes());
    let (e, _) = read_err(p, limits);
    assert_eq!(limit(&e), "quantization scale count");
    // An unknown dtype code.
    let mut p = v4_header(flags::ALIGNED, 99, 1);
    p.extend_from_slice(&1u32.to_le_bytes());
    let (e, _) = read_err(p, limits);
    assert!(matches!(e, Error::Malformed { offset: 7, .. }), "{e}");
}

#[test]
fn lying_member_lengths_are_caught_without_reading_them() {
    let inner = dense(&[1.0, 2.0], EncodeOptions::default());
    // A key announced as 4 GiB, 30 bytes sent.
    let mut p = v4_header(flags::BUNDLE, 0, 1);
    p.extend_from_slice(&u32::MAX.to_le_bytes());
    p.extend_from_slice(b"0123456789abcdef");
    let (e, peak) = read_err(p, PacketLimits::default());
    assert!(matches!(e, Error::Truncated { available: 30, .. }), "{e}");
    assert!(peak <= READ_CHUNK + 256, "{peak}");
    // A value length of 4 GiB around a 72-byte packet: the member frames, the rest
    // of its length never comes.
    let mut p = v4_header(flags::BUNDLE, 0, 1);
    p.extend_from_slice(&1u32.to_le_bytes());
    p.push(b'k');
    p.extend_from_slice(&u32::MAX.to_le_bytes());
    p.extend_from_slice(&inner);
    let (e, peak) = read_err(p, PacketLimits::default());
    assert!(
        matches!(
            e,
            Error::Truncated {
                needed: 4_294_967_314,
                available: 91,
                ..
            }
        ),
        "{e}"
    );
    assert!(peak <= READ_CHUNK + 256, "{peak}");
    // Padding after a member, inside its length, is allowed (tenso reads it).
    let mut padded = inner.clone();
    padded.extend_from_slice(&[0; 40]);
    let p = bundle(&[("k", &padded), ("j", &inner)]);
    let mut r = PacketReader::new(Cursor::new(p.clone()));
    assert_eq!(r.read_packet_bytes().unwrap().unwrap().len(), p.len());
    // A value length shorter than the packet inside it.
    let mut p = v4_header(flags::BUNDLE, 0, 1);
    p.extend_from_slice(&1u32.to_le_bytes());
    p.push(b'k');
    p.extend_from_slice(&20u32.to_le_bytes());
    p.extend_from_slice(&inner);
    let (e, _) = read_err(p, PacketLimits::default());
    assert!(matches!(e, Error::Malformed { offset: 19, .. }), "{e}");
    // A sparse component announcing 4 GiB.
    let mut p = v4_header(flags::SPARSE_CSR, 0, 2);
    p.extend_from_slice(&[4, 0, 0, 0, 4, 0, 0, 0]);
    p.extend_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
    p.extend_from_slice(&inner[..30]);
    let (e, peak) = read_err(p, PacketLimits::default());
    assert!(matches!(e, Error::Truncated { .. }), "{e}");
    assert!(peak <= READ_CHUNK + 256, "{peak}");
    // A string packet whose last offset announces 2^60 payload bytes.
    let mut p = v4_header(flags::STRING | flags::ALIGNED, 20, 1);
    p.extend_from_slice(&1u32.to_le_bytes());
    p.resize(64, 0);
    p.extend_from_slice(&0u64.to_le_bytes());
    p.extend_from_slice(&(1u64 << 60).to_le_bytes());
    let (e, _) = read_err(p, PacketLimits::default());
    assert!(
        matches!(
            e,
            Error::LimitExceeded {
                what: "packet length",
                ..
            }
        ),
        "{e}"
    );
}

// ------------------------------------------------------------------ nesting

fn nested_bundles(levels: usize) -> Vec<u8> {
    let mut p = dense(&[1.0], EncodeOptions::default());
    for _ in 0..levels {
        p = bundle(&[("x", &p)]);
    }
    p
}

#[test]
fn nesting_is_bounded_by_max_nesting() {
    let ok = nested_bundles(64);
    let mut r = PacketReader::new(Cursor::new(ok.clone()));
    assert_eq!(&r.read_packet_bytes().unwrap().unwrap()[..], &ok[..]);
    let (e, _) = read_err(nested_bundles(65), PacketLimits::default());
    assert!(
        matches!(
            e,
            Error::LimitExceeded {
                what: "packet nesting depth",
                found: 65,
                limit: 64
            }
        ),
        "{e}"
    );
    // Sparse inside bundle inside sparse: each level counts.
    let sparse = |inner: &[u8]| {
        let mut p = v4_header(flags::SPARSE_COO, 0, 1);
        p.extend_from_slice(&4u32.to_le_bytes());
        for _ in 0..3 {
            p.extend_from_slice(&(inner.len() as u32).to_le_bytes());
            p.extend_from_slice(inner);
        }
        p
    };
    let leaf = dense(&[1.0], EncodeOptions::default());
    let mixed = sparse(&bundle(&[("a", &sparse(&leaf))]));
    let tight = PacketLimits {
        max_nesting: 2,
        ..PacketLimits::default()
    };
    let (e, _) = read_err(mixed.clone(), tight);
    assert!(matches!(e, Error::LimitExceeded { found: 3, .. }), "{e}");
    let mut r = PacketReader::new(Cursor::new(mixed.clone()));
    assert_eq!(r.read_packet_bytes().unwrap().unwrap().len(), mixed.len());
}

#[test]
fn deep_nesting_uses_no_call_stack() {
    // 20 000 levels with the limit lifted, framed on a thread with a 256 KiB stack.
    let deep = nested_bundles(20_000);
    let len = deep.len();
    let framed = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || {
            let limits = PacketLimits {
                max_nesting: usize::MAX,
                ..PacketLimits::default()
            };
            let mut r = PacketReader::with_limits(Cursor::new(deep), limits);
            r.read_packet_bytes().unwrap().unwrap().len()
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(framed, len);
}

// ------------------------------------------------------------------ LZ4 frames

/// An LZ4 frame of stored (uncompressed) blocks, with the options the framer must
/// follow. The header checksum byte is not checked by framing.
fn lz4_frame(data: &[u8], block: usize, flg_extra: u8, content_size: bool) -> Vec<u8> {
    let mut f = vec![0x04, 0x22, 0x4D, 0x18];
    let flg = 0x40 | flg_extra | if content_size { 0x08 } else { 0 };
    f.push(flg);
    f.push(0x40); // 64 KiB blocks
    if content_size {
        f.extend_from_slice(&(data.len() as u64).to_le_bytes());
    }
    if flg & 0x01 != 0 {
        f.extend_from_slice(&7u32.to_le_bytes()); // dictionary id
    }
    f.push(0xAA);
    for chunk in data.chunks(block) {
        f.extend_from_slice(&(chunk.len() as u32 | 0x8000_0000).to_le_bytes());
        f.extend_from_slice(chunk);
        if flg & 0x10 != 0 {
            f.extend_from_slice(&[1, 2, 3, 4]);
        }
    }
    f.extend_from_slice(&0u32.to_le_bytes());
    if flg & 0x04 != 0 {
        f.extend_from_slice(&[5, 6, 7, 8]);
    }
    f
}

fn lz4_packet(raw: &[u8], frame: &[u8], integrity: bool) -> Vec<u8> {
    let mut flags = flags::ALIGNED | flags::COMPRESSED;
    if integrity {
        flags |= flags::INTEGRITY;
    }
    let mut p = v4_header(flags, 5, 1);
    p.extend_from_slice(&(raw.len() as u32).to_le_bytes());
    p.resize(64, 0);
    p.extend_from_slice(frame);
    if integrity {
        p.extend_from_slice(&[9; 8]);
    }
    p
}

#[test]
fn lz4_frames_are_streamed_by_their_block_headers() {
    let raw: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let mut stream = Vec::new();
    let mut lens = Vec::new();
    for (flg, size, integrity) in [
        (0x00, false, false),
        (0x10, false, true),  // block checksums
        (0x04, true, false),  // content checksum and size
        (0x15, true, true),   // everything, dictionary id too
        (0x20, false, false), // independent blocks
    ] {
        for block in [65536, 1000, 1] {
            let data = if block == 1 { &raw[..300] } else { &raw[..] };
            let p = lz4_packet(data, &lz4_frame(data, block, flg, size), integrity);
            lens.push(p.len());
            stream.extend_from_slice(&p);
        }
    }
    // Empty frame.
    let p = lz4_packet(&[], &lz4_frame(&[], 1, 0, false), true);
    lens.push(p.len());
    stream.extend_from_slice(&p);
    for source in [
        Box::new(Cursor::new(stream.clone())) as Box<dyn Read>,
        Box::new(odd_chunks(stream.clone(), 3)),
    ] {
        let mut r = PacketReader::new(source);
        let got: Vec<usize> = read_all(&mut r).iter().map(|p| p.len()).collect();
        assert_eq!(got, lens);
    }
}

#[test]
fn bad_lz4_frames_are_refused() {
    let raw = vec![1u8; 100];
    let good = lz4_frame(&raw, 64, 0, true);
    let malformed = |frame: Vec<u8>| {
        let (e, _) = read_err(lz4_packet(&raw, &frame, false), PacketLimits::default());
        assert!(matches!(e, Error::Malformed { .. }), "{e}");
    };
    let mut f = good.clone();
    f[0] = 0x05; // magic
    malformed(f);
    let mut f = good.clone();
    f[4] = 0x80 | 0x08; // version bits 10
    malformed(f);
    let mut f = good.clone();
    f[5] = 0x30; // block size code 3
    malformed(f);
    let mut f = good.clone();
    f[6] = 99; // content size 99, the shape says 100
    malformed(f);
    // A block of 1 GiB in a frame of 64 KiB blocks.
    let mut f = good[..15].to_vec();
    f.extend_from_slice(&(1u32 << 30).to_le_bytes());
    malformed(f);
}

#[test]
fn tenso_lz4_packets_are_streamed_where_tenso_refuses() {
    let (data, listing) = tenso_stream();
    let lz4: Vec<_> = listing.iter().filter(|p| p.1 == "dense_lz4").collect();
    assert!(lz4.len() >= 3);
    let stream: Vec<u8> = lz4
        .iter()
        .flat_map(|(_, _, o, l)| data[*o..o + l].to_vec())
        .collect();
    let mut r = PacketReader::new(one_byte_at_a_time(stream));
    let got: Vec<usize> = read_all(&mut r).iter().map(|p| p.len()).collect();
    let want: Vec<usize> = lz4.iter().map(|p| p.3).collect();
    assert_eq!(got, want);
}

// ------------------------------------------------------------------ non-blocking

/// Returns `WouldBlock` on every other call.
struct Flaky<R> {
    inner: R,
    calls: usize,
}

impl<R: Read> Read for Flaky<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.calls += 1;
        match self.calls % 3 {
            0 => Err(io::ErrorKind::WouldBlock.into()),
            1 => Err(io::ErrorKind::Interrupted.into()),
            _ => {
                let n = buf.len().min(5);
                self.inner.read(&mut buf[..n])
            }
        }
    }
}

#[test]
fn would_block_keeps_the_partial_packet() {
    let (data, listing) = tenso_stream();
    let mut r = PacketReader::new(Flaky {
        inner: Cursor::new(data),
        calls: 0,
    });
    let mut got = Vec::new();
    let mut would_block = 0;
    loop {
        match r.read_packet_bytes() {
            Ok(Some(p)) => got.push(p.len()),
            Ok(None) => break,
            Err(Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => would_block += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(would_block > 100);
    assert_eq!(got, listing.iter().map(|p| p.3).collect::<Vec<_>>());
}

// ------------------------------------------------------------------ writer

/// Takes at most 3 bytes per call, across slice boundaries, and is interrupted on
/// every fourth call.
#[derive(Default)]
struct Trickle {
    out: Vec<u8>,
    calls: usize,
}

impl Write for Trickle {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.calls += 1;
        if self.calls % 4 == 0 {
            return Err(io::ErrorKind::Interrupted.into());
        }
        let mut n = 0;
        for b in bufs {
            let take = b.len().min(3 - n);
            self.out.extend_from_slice(&b[..take]);
            n += take;
            if n == 3 {
                break;
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn writer_round_trips_through_partial_vectored_writes() {
    let mut w = PacketWriter::new(Trickle::default());
    let mut expected = Vec::new();
    let mut total = 0;
    for (i, alignment) in [64usize, 1, 8, 4096].into_iter().enumerate() {
        for integrity in [false, true] {
            let values: Vec<f32> = (0..i * 7 + 1).map(|v| v as f32).collect();
            let options = EncodeOptions {
                alignment,
                integrity,
                ..EncodeOptions::default()
            };
            let want = dense(&values, options);
            let body: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let shape = Shape::from_dims(&[values.len() as u64]).unwrap();
            total += w.write_dense(DType::F32, &shape, &body, options).unwrap();
            expected.extend_from_slice(&want);
        }
    }
    // Packets of other kinds go through as bytes, after framing.
    let (data, listing) = tenso_stream();
    for (_, _, offset, len) in &listing {
        total += w.write_packet_bytes(&data[*offset..offset + len]).unwrap();
        expected.extend_from_slice(&data[*offset..offset + len]);
    }
    w.flush().unwrap();
    assert_eq!(w.bytes_written(), expected.len() as u64);
    assert_eq!(total, expected.len() as u64);
    assert_eq!(w.packets_written(), 8 + listing.len() as u64);
    let out = w.into_inner().out;
    assert_eq!(out, expected);
    // And reads back.
    let mut r = PacketReader::new(Cursor::new(out));
    assert_eq!(read_all(&mut r).len(), 8 + listing.len());
}

#[test]
fn writer_refuses_anything_but_exactly_one_packet() {
    let p = dense(&[1.0, 2.0], EncodeOptions::default());
    let mut w = PacketWriter::new(Vec::new());
    let mut two = p.clone();
    two.extend_from_slice(&p);
    assert!(matches!(
        w.write_packet_bytes(&two),
        Err(Error::Malformed { offset: 72, .. })
    ));
    assert!(matches!(
        w.write_packet_bytes(&p[..70]),
        Err(Error::Truncated {
            needed: 72,
            available: 70,
            ..
        })
    ));
    assert!(matches!(
        w.write_packet_bytes(b"GET / HTTP/1.1"),
        Err(Error::BadMagic { .. })
    ));
    assert_eq!(w.bytes_written(), 0);
    assert!(w.get_ref().is_empty());
    w.write_packet_bytes(&p).unwrap();
    assert_eq!(w.into_inner(), p);
}

#[test]
fn read_then_write_copies_a_stream_unchanged() {
    let packets = fixture_packets();
    let stream: Vec<u8> = packets.iter().flat_map(|(_, p)| p.clone()).collect();
    let mut r = PacketReader::new(Cursor::new(stream.clone()));
    let mut w = PacketWriter::new(Vec::new());
    while let Some(p) = r.read_packet_bytes().unwrap() {
        w.write_packet_bytes(&p).unwrap();
    }
    assert_eq!(w.into_inner(), stream);
}

// ------------------------------------------------------------------ tokio

#[cfg(feature = "tokio")]
mod async_streams {
    use super::*;
    use tensorwire_packet::{AsyncPacketReader, AsyncPacketWriter};
    use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

    async fn send_all<W: AsyncWrite + Unpin>(w: W, stream: Vec<u8>, listing: Vec<(usize, usize)>) {
        let mut w = AsyncPacketWriter::new(w);
        for (offset, len) in listing {
            w.write_packet_bytes(&stream[offset..offset + len])
                .await
                .unwrap();
        }
        let body: Vec<u8> = (0..1000u32)
            .flat_map(|v| (v as f32).to_le_bytes())
            .collect();
        let shape = Shape::from_dims(&[10, 100]).unwrap();
        let options = EncodeOptions {
            integrity: true,
            ..EncodeOptions::default()
        };
        w.write_dense(DType::F32, &shape, &body, options)
            .await
            .unwrap();
        w.shutdown().await.unwrap();
    }

    async fn receive_all<R: AsyncRead + Unpin>(r: R) -> Vec<Bytes> {
        let mut r = AsyncPacketReader::new(r);
        let mut out = Vec::new();
        while let Some(p) = r.read_packet_bytes().await.unwrap() {
            assert!(p.is_aligned(64));
            out.push(p);
        }
        out
    }

    fn check(got: &[Bytes], data: &[u8], listing: &[(usize, usize)]) {
        assert_eq!(got.len(), listing.len() + 1);
        for (p, (offset, len)) in got.iter().zip(listing) {
            assert_eq!(&p[..], &data[*offset..offset + len]);
        }
        let last = tensorwire_packet::decode(got.last().unwrap()).unwrap();
        assert_eq!(last.shape.dims(), &[10, 100]);
    }

    fn listing() -> (Vec<u8>, Vec<(usize, usize)>) {
        let (data, listing) = tenso_stream();
        let spans = listing.iter().map(|p| (p.2, p.3)).collect();
        (data, spans)
    }

    #[tokio::test]
    async fn duplex_with_a_tiny_pipe() {
        let (data, spans) = listing();
        let (a, b) = tokio::io::duplex(7);
        let sender = tokio::spawn(send_all(a, data.clone(), spans.clone()));
        let got = receive_all(b).await;
        sender.await.unwrap();
        check(&got, &data, &spans);
    }

    #[tokio::test]
    async fn unix_socket_pair() {
        let (data, spans) = listing();
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let sender = tokio::spawn(send_all(a, data.clone(), spans.clone()));
        let got = receive_all(b).await;
        sender.await.unwrap();
        check(&got, &data, &spans);
    }

    #[tokio::test]
    async fn tcp_loopback() {
        let (data, spans) = listing();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sender = tokio::spawn({
            let (data, spans) = (data.clone(), spans.clone());
            async move {
                let conn = tokio::net::TcpStream::connect(addr).await.unwrap();
                send_all(conn, data, spans).await;
            }
        });
        let (conn, _) = listener.accept().await.unwrap();
        let got = receive_all(conn).await;
        sender.await.unwrap();
        check(&got, &data, &spans);
    }

    #[tokio::test]
    async fn truncated_and_lying_streams_fail_the_same_way() {
        let p = dense(&[1.0, 2.0, 3.0], EncodeOptions::default());
        let (mut a, b) = tokio::io::duplex(64);
        let half = p[..40].to_vec();
        tokio::spawn(async move {
            a.write_all(&half).await.unwrap();
        });
        let mut r = AsyncPacketReader::new(b);
        assert!(matches!(
            r.read_packet().await,
            Err(Error::Truncated {
                needed: 76,
                available: 40,
                ..
            })
        ));
        assert!(r.is_failed());
        // 16 GB announced, 20 bytes sent.
        let mut lie = v4_header(flags::ALIGNED, 14, 1);
        lie.extend_from_slice(&1_000_000_000u32.to_le_bytes());
        lie.extend_from_slice(&[0; 6]);
        let mut r = AsyncPacketReader::new(&lie[..]);
        assert!(matches!(
            r.read_packet_bytes().await,
            Err(Error::Truncated { available: 20, .. })
        ));
        assert!(r.peak_buffer_capacity() <= READ_CHUNK + 256);
        // Nesting past the limit.
        let deep = nested_bundles(65);
        let mut r = AsyncPacketReader::new(&deep[..]);
        assert!(matches!(
            r.read_packet_bytes().await,
            Err(Error::LimitExceeded {
                what: "packet nesting depth",
                ..
            })
        ));
    }

    #[tokio::test]
    async fn a_cancelled_read_loses_nothing() {
        let p = dense(&[1.0, 2.0, 3.0], EncodeOptions::default());
        let (mut a, b) = tokio::io::duplex(1024);
        let mut r = AsyncPacketReader::new(b);
        a.write_all(&p[..50]).await.unwrap();
        // Poll the read until it has taken what is there, then drop it.
        tokio::select! {
            biased;
            res = r.read_packet_bytes() => panic!("finished early: {res:?}"),
            () = tokio::task::yield_now() => {}
        }
        assert_eq!(r.buffered(), 50);
        a.write_all(&p[50..]).await.unwrap();
        let got = r.read_packet_bytes().await.unwrap().unwrap();
        assert_eq!(&got[..], &p[..]);
    }
}
