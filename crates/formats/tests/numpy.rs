//! `.npy` and `.npz` files written by numpy (fixtures/numpy) read back equal to the
//! arrays numpy saved.

mod common;

use common::{dims, expected, fixture, sha256_hex};
use tensorwire_core::{Bytes, Error, Limits, TensorSource};
use tensorwire_formats::npy::{NumpyFormat, NumpyReader, NPY_TENSOR_NAME};

fn check(file: &str, expect: &str) {
    let reader = NumpyReader::open(fixture(&format!("numpy/{file}")))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let exp = expected(&format!("numpy/{expect}"));
    let arrays = exp.as_object().unwrap();
    assert_eq!(reader.tensors().len(), arrays.len(), "{file}");
    for (name, a) in arrays {
        let header = reader.header(name).unwrap();
        assert_eq!(header.descr, a["descr"].as_str().unwrap(), "{file}/{name}");
        assert_eq!(header.fortran_order, a["fortran_order"].as_bool().unwrap());
        let view = reader.view(name).unwrap();
        assert_eq!(view.shape.dims(), &dims(&a["shape"])[..], "{file}/{name}");
        assert_eq!(
            sha256_hex(&view.bytes),
            a["sha256"].as_str().unwrap(),
            "{file}/{name}"
        );
        let stored_le_c = !header.big_endian && !header.fortran_order;
        let deflated = reader.info(name).unwrap().encoding.is_some();
        assert_eq!(view.zero_copy, stored_le_c && !deflated, "{file}/{name}");
        // The strided form holds the same elements.
        let strided = reader.strided(name).unwrap();
        assert_eq!(
            strided.is_contiguous(),
            !header.fortran_order || view.shape.ndim() < 2
        );
        let gathered = strided.to_contiguous(u64::MAX).unwrap();
        assert_eq!(gathered.as_slice(), &*view.bytes);
        if header.fortran_order && !header.big_endian && !deflated {
            assert!(
                strided.zero_copy,
                "{file}/{name}: Fortran arrays are served strided"
            );
        }
    }
}

#[test]
fn every_npy_fixture_reads_back() {
    for name in [
        "c_order",
        "fortran",
        "fortran3d",
        "big_endian",
        "big_endian_c8",
        "scalar",
        "empty",
        "bool",
        "v2",
        "v3",
    ] {
        check(&format!("{name}.npy"), &format!("{name}.expected.json"));
        let r = NumpyReader::open(fixture(&format!("numpy/{name}.npy"))).unwrap();
        assert_eq!(r.numpy_format(), NumpyFormat::Npy);
        assert_eq!(&*r.tensors()[0].name, NPY_TENSOR_NAME);
    }
}

#[test]
fn every_npz_fixture_reads_back() {
    for name in ["arrays", "compressed", "one"] {
        check(&format!("{name}.npz"), &format!("{name}.expected.json"));
    }
    let stored = NumpyReader::open(fixture("numpy/arrays.npz")).unwrap();
    assert_eq!(stored.format(), "npz");
    assert!(stored.tensors().iter().all(|t| t.encoding.is_none()));
    let deflated = NumpyReader::open(fixture("numpy/compressed.npz")).unwrap();
    assert!(deflated
        .tensors()
        .iter()
        .all(|t| t.encoding.as_deref() == Some("deflate")));
}

#[test]
fn non_tensor_arrays_are_refused_by_name() {
    for name in [
        "object.npy",
        "structured.npy",
        "strings.npy",
        "datetime.npy",
        "with_object.npz",
    ] {
        let err = NumpyReader::open(fixture(&format!("numpy/{name}")))
            .err()
            .unwrap();
        assert!(
            matches!(err.root(), Error::Unsupported { .. }),
            "{name}: {err}"
        );
    }
    let err = NumpyReader::open(fixture("numpy/object.npy"))
        .err()
        .unwrap();
    assert!(err.to_string().contains("pickled"), "{err}");
}

#[test]
fn every_truncation_is_a_typed_error() {
    for file in ["fortran.npy", "v3.npy", "one.npz", "compressed.npz"] {
        let bytes = std::fs::read(fixture(&format!("numpy/{file}"))).unwrap();
        for len in 0..bytes.len() {
            let opened =
                NumpyReader::from_bytes(Bytes::from_vec(bytes[..len].to_vec()), &Limits::default());
            if let Err(err) = opened {
                assert!(err.is_corrupt_data(), "{file}[..{len}]: {err}");
            } else {
                panic!("{file}: a {len}-byte prefix opened");
            }
        }
    }
}

#[test]
fn corrupt_deflate_streams_fail_on_read_not_open_or_panic() {
    let mut bytes = std::fs::read(fixture("numpy/compressed.npz")).unwrap();
    let reader = NumpyReader::open(fixture("numpy/compressed.npz")).unwrap();
    // Flip bytes in the middle of the first member's compressed data, past its header.
    let first = reader.tensors().iter().min_by_key(|t| t.offset).unwrap();
    let at = first.offset as usize + first.stored_bytes as usize / 2 + 4;
    for b in &mut bytes[at..at + 8] {
        *b ^= 0x5a;
    }
    if let Ok(r) = NumpyReader::from_bytes(Bytes::from_vec(bytes), &Limits::default()) {
        for t in r.tensors() {
            if let Err(e) = r.view(&t.name) {
                assert!(e.is_corrupt_data(), "{e}");
            }
        }
    }
}

/// The same archive read from memory alone and with its member headers read
/// positionally (as `NumpyReader::open` and `tensorwire::open` do): equal results.
fn assert_same_arrays(a: &NumpyReader, b: &NumpyReader) {
    assert_eq!(a.tensors(), b.tensors());
    for t in a.tensors() {
        assert_eq!(a.header(&t.name).unwrap(), b.header(&t.name).unwrap());
        assert_eq!(
            &*a.view(&t.name).unwrap().bytes,
            &*b.view(&t.name).unwrap().bytes
        );
    }
}

#[test]
fn npz_member_headers_are_read_positionally_never_the_arrays() {
    for name in ["arrays", "compressed", "one"] {
        let path = fixture(&format!("numpy/{name}.npz"));
        let image = std::fs::read(&path).unwrap();
        let in_memory =
            NumpyReader::from_bytes(Bytes::from_vec(image.clone()), &Limits::default()).unwrap();
        let file = std::sync::Arc::new(tensorwire_range::RangeFile::open(&path).unwrap());
        let input = tensorwire_pytorch::Input::mapped_with_file(
            Bytes::from_vec(image.clone()),
            file.clone(),
        )
        .unwrap();
        let positional = NumpyReader::npz(input, &Limits::default()).unwrap();
        assert_same_arrays(&in_memory, &positional);
        assert_same_arrays(&in_memory, &NumpyReader::open(&path).unwrap());
        if name != "compressed" {
            // Stored members: the directory, then one read of at most a local header
            // plus 256 bytes per member; never a whole array.
            let members = in_memory.tensors().len() as u64;
            let budget = 64 * 1024 + members * (30 + 128 + 96 + 256);
            assert!(
                file.bytes_read() <= budget,
                "{name}: read {}",
                file.bytes_read()
            );
            let biggest = in_memory.tensors().iter().map(|t| t.nbytes).max().unwrap();
            assert!(biggest < 256 || file.bytes_read() < image.len() as u64);
        }
    }
}

/// The ZIP CRC-32 of `data` (bit by bit: test archives are small).
fn crc32(data: &[u8]) -> u32 {
    !data.iter().fold(!0u32, |crc, &byte| {
        (0..8).fold(crc ^ u32::from(byte), |crc, _| {
            (crc >> 1) ^ (0xedb8_8320 & (crc & 1).wrapping_neg())
        })
    })
}

/// How a test archive holds a member.
#[derive(Clone, Copy, PartialEq)]
enum Store {
    Stored,
    /// Deflated at this level (0: stored deflate blocks, no compression).
    Deflated(u8),
}

/// A ZIP archive of `(name, data, store)` records, each with its data's CRC-32, and
/// no general-purpose flags (names are ASCII).
fn zip_archive(records: &[(&str, Vec<u8>, Store)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data, store) in records {
        let offset = out.len() as u32;
        let fixed = |sig: u32, extra_fields: &[u8]| {
            let mut h = sig.to_le_bytes().to_vec();
            h.extend_from_slice(extra_fields);
            h
        };
        let (method, body) = match store {
            Store::Stored => (0u8, data.clone()),
            Store::Deflated(level) => (8u8, miniz_oxide::deflate::compress_to_vec(data, *level)),
        };
        let mut sizes = Vec::new();
        sizes.extend_from_slice(&crc32(data).to_le_bytes());
        sizes.extend_from_slice(&(body.len() as u32).to_le_bytes());
        sizes.extend_from_slice(&(data.len() as u32).to_le_bytes());
        let name_len = (name.len() as u16).to_le_bytes();
        // Local header: version, flags, method, time, date, crc/sizes, name, extra 0.
        let mut local = fixed(0x0403_4b50, &[20, 0, 0, 0, method, 0, 0, 0, 0, 0]);
        local.extend_from_slice(&sizes);
        local.extend_from_slice(&name_len);
        local.extend_from_slice(&[0, 0]);
        local.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&local);
        out.extend_from_slice(&body);
        // Central record: versions, flags, method, time, date, crc/sizes, lengths,
        // disk, attributes, local header offset, name.
        let mut c = fixed(0x0201_4b50, &[20, 0, 20, 0, 0, 0, method, 0, 0, 0, 0, 0]);
        c.extend_from_slice(&sizes);
        c.extend_from_slice(&name_len);
        c.extend_from_slice(&[0; 12]);
        c.extend_from_slice(&offset.to_le_bytes());
        c.extend_from_slice(name.as_bytes());
        central.extend_from_slice(&c);
    }
    let dir_offset = out.len() as u32;
    out.extend_from_slice(&central);
    let n = (records.len() as u16).to_le_bytes();
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&n);
    out.extend_from_slice(&n);
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&dir_offset.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out
}

/// A ZIP archive of stored `(name, data)` records.
fn stored_zip(records: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let records: Vec<_> = records
        .iter()
        .map(|(name, data)| (*name, data.clone(), Store::Stored))
        .collect();
    zip_archive(&records)
}

/// A `.npy` v1 image of `count` elements of `descr` held by `data`, whose header dict
/// is padded with spaces to `header_len` bytes (the format allows any padding; numpy
/// reads it).
fn npy_image(descr: &str, count: usize, data: &[u8], header_len: usize) -> Vec<u8> {
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({count},), }}");
    assert!(
        dict.len() < header_len,
        "a header of {header_len} bytes cannot hold {dict}"
    );
    let mut header = dict.into_bytes();
    header.resize(header_len - 1, b' ');
    header.push(b'\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(data);
    out
}

/// A `.npy` v1 image of little-endian f32 values, its header padded to `header_len`.
fn padded_npy(values: &[f32], header_len: usize) -> Vec<u8> {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    npy_image("<f4", values.len(), &data, header_len)
}

#[test]
fn npz_member_headers_longer_than_the_first_read_are_read_whole() {
    let short: Vec<f32> = (0..40).map(|i| i as f32).collect();
    let long: Vec<f32> = (0..9).map(|i| -(i as f32)).collect();
    let image = stored_zip(&[
        ("short.npy", padded_npy(&short, 118)),
        ("long.npy", padded_npy(&long, 2038)),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("padded.npz");
    std::fs::write(&path, &image).unwrap();
    let positional = NumpyReader::open(&path).unwrap();
    let in_memory = NumpyReader::from_bytes(Bytes::from_vec(image), &Limits::default()).unwrap();
    assert_same_arrays(&in_memory, &positional);
    let floats = |r: &NumpyReader, name: &str| -> Vec<f32> {
        r.view(name)
            .unwrap()
            .bytes
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    assert_eq!(floats(&positional, "short"), short);
    assert_eq!(floats(&positional, "long"), long);
    assert_eq!(positional.header("long").unwrap().data_offset, 10 + 2038);
}

/// A file image in memory that counts the positional reads made of it, and their
/// bytes.
struct CountingFile {
    image: Vec<u8>,
    reads: std::sync::atomic::AtomicUsize,
    bytes: std::sync::atomic::AtomicU64,
}

impl CountingFile {
    fn new(image: Vec<u8>) -> CountingFile {
        CountingFile {
            image,
            reads: Default::default(),
            bytes: Default::default(),
        }
    }

    /// The archive as `NumpyReader::open` reads it: a map, with this file for the
    /// member headers.
    fn open_npz(self: &std::sync::Arc<Self>) -> tensorwire_core::Result<NumpyReader> {
        let input = tensorwire_pytorch::Input::mapped_with_file(
            Bytes::from_vec(self.image.clone()),
            self.clone(),
        )?;
        NumpyReader::npz(input, &Limits::default())
    }
}

impl tensorwire_range::RangeRead for CountingFile {
    fn len(&self) -> u64 {
        self.image.len() as u64
    }

    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> tensorwire_core::Result<()> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.bytes
            .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let start = offset as usize;
        buf.copy_from_slice(&self.image[start..start + buf.len()]);
        Ok(())
    }
}

#[test]
fn small_npz_members_share_header_reads() {
    let members: Vec<(String, Vec<f32>)> = (0..40)
        .map(|i| {
            (
                format!("m{i}.npy"),
                (0..(i % 7 + 1)).map(|v| (i * 10 + v) as f32).collect(),
            )
        })
        .collect();
    let records: Vec<(&str, Vec<u8>)> = members
        .iter()
        .map(|(name, values)| (name.as_str(), padded_npy(values, 118)))
        .collect();
    let image = stored_zip(&records);
    let file = std::sync::Arc::new(CountingFile::new(image.clone()));
    let positional = file.open_npz().unwrap();
    let in_memory = NumpyReader::from_bytes(Bytes::from_vec(image), &Limits::default()).unwrap();
    assert_same_arrays(&in_memory, &positional);
    let reads = file.reads.load(std::sync::atomic::Ordering::Relaxed);
    // The directory's end and records (a few reads), then one read per 8 KiB of
    // ~200-byte members, not one per member.
    assert!(reads <= 8, "{reads} reads for 40 members");
}

#[test]
fn verify_checks_every_npz_members_crc() {
    // arrays.npz holds stored members, compressed.npz deflated ones.
    for file in ["arrays.npz", "compressed.npz"] {
        let good = std::fs::read(fixture(&format!("numpy/{file}"))).unwrap();
        let reader =
            NumpyReader::from_bytes(Bytes::from(good.clone()), &Limits::default()).unwrap();
        assert_eq!(reader.verify().unwrap(), reader.tensors().len(), "{file}");
        // Flip a bit of the last member's last byte, just before the central
        // directory: the open still works, `verify` finds the damage.
        let directory = good
            .windows(4)
            .position(|w| w == b"PK\x01\x02")
            .expect("a central directory");
        let mut bad = good;
        bad[directory - 1] ^= 0x10;
        let reader = NumpyReader::from_bytes(Bytes::from(bad), &Limits::default()).unwrap();
        let err = reader.verify().unwrap_err();
        assert!(err.is_corrupt_data(), "{file}: {err}");
        // Named as the array is listed, with its member.
        let last = reader.tensors().last().unwrap().name.to_string();
        assert!(
            matches!(&err, tensorwire_core::Error::DigestMismatch { tensor, .. }
                | tensorwire_core::Error::Decode { tensor, .. }
                if *tensor == format!("{last} (NPZ member {last}.npy)")),
            "{file}: {err}"
        );
        // A read that checks the member first says the same.
        let at = reader.tensors().len() - 1;
        if let Err(err) = reader
            .check_record_at(at)
            .and_then(|()| reader.view_at(at).map(drop))
        {
            assert!(
                err.to_string()
                    .contains(&format!("`{last} (NPZ member {last}.npy)`")),
                "{err}"
            );
        }
    }
    let npy = std::fs::read(fixture("numpy/c_order.npy")).unwrap();
    let reader = NumpyReader::from_bytes(Bytes::from(npy), &Limits::default()).unwrap();
    assert_eq!(reader.verify().unwrap(), 0, "an .npy file has no digest");
}

/// `n` bytes that do not compress (xorshift).
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A `.npy` v1 image of `data` as a `|u1` array, its header padded to `header_len`.
fn u8_npy(data: &[u8], header_len: usize) -> Vec<u8> {
    npy_image("|u1", data.len(), data, header_len)
}

#[test]
fn opening_a_deflated_npz_reads_a_bounded_part_of_each_member() {
    // 4 MiB that deflate cannot shrink, and a small member after it.
    let big = noise(4 << 20, 7);
    let small: Vec<f32> = (0..10).map(|i| i as f32).collect();
    let image = zip_archive(&[
        ("big.npy", u8_npy(&big, 118), Store::Deflated(1)),
        ("small.npy", padded_npy(&small, 118), Store::Deflated(6)),
    ]);
    assert!(image.len() > 4 << 20);
    let file = std::sync::Arc::new(CountingFile::new(image.clone()));
    let reader = file.open_npz().unwrap();
    let read = file.bytes.load(std::sync::atomic::Ordering::Relaxed);
    // The directory and local headers with their heads, and at most a chunk of
    // each member's compressed bytes: not the 4 MiB member.
    assert!(read <= 64 << 10, "open read {read} bytes");
    assert_eq!(&*reader.view("big").unwrap().bytes, &big[..]);
    let in_memory = NumpyReader::from_bytes(Bytes::from_vec(image), &Limits::default()).unwrap();
    assert_same_arrays(&in_memory, &reader);
}

#[test]
fn long_headers_of_deflated_members_inflate_across_chunks() {
    // A 60 000-byte header in stored deflate blocks (about 60 KiB of compressed
    // bytes, several reads' worth) and compressed (a few hundred bytes), before
    // 200 000 bytes of array that deflate cannot shrink.
    let data = noise(200_000, 11);
    let npy = u8_npy(&data, 60_000);
    for level in [0, 6] {
        let image = zip_archive(&[
            ("long.npy", npy.clone(), Store::Deflated(level)),
            ("after.npy", padded_npy(&[1.0], 118), Store::Deflated(level)),
        ]);
        let file = std::sync::Arc::new(CountingFile::new(image.clone()));
        let reader = file.open_npz().unwrap();
        assert_eq!(reader.header("long").unwrap().data_offset, 10 + 60_000);
        let read = file.bytes.load(std::sync::atomic::Ordering::Relaxed);
        // The header's compressed bytes and at most one chunk more, not the array.
        assert!(
            read <= 60_000 + (16 << 10) + 4096,
            "level {level}: read {read} of {}",
            image.len()
        );
        assert_eq!(&*reader.view("long").unwrap().bytes, &data[..]);
        let in_memory =
            NumpyReader::from_bytes(Bytes::from_vec(image), &Limits::default()).unwrap();
        assert_same_arrays(&in_memory, &reader);
    }
}

/// Sets the CRC-32 the central directory gives every record to `crc`.
fn set_directory_crcs(image: &mut [u8], crc: u32) {
    let mut at = 0;
    while let Some(found) = image[at..].windows(4).position(|w| w == b"PK\x01\x02") {
        let record = at + found;
        image[record + 16..record + 20].copy_from_slice(&crc.to_le_bytes());
        at = record + 4;
    }
}

#[test]
fn check_record_checks_a_stored_members_crc_and_views_do_not() {
    // What `tensorwire convert` and copies call before reading every byte:
    // `check_record_at`. A bit of one array flipped, as a damaged copy would have
    // it; `np.load` refuses the member ("Bad CRC-32").
    let good = std::fs::read(fixture("numpy/arrays.npz")).unwrap();
    let reader = NumpyReader::from_bytes(Bytes::from(good.clone()), &Limits::default()).unwrap();
    let damaged_at = reader
        .tensors()
        .iter()
        .position(|t| t.nbytes > 0 && t.encoding.is_none())
        .unwrap();
    let damaged_info = reader.tensors()[damaged_at].clone();
    for at in 0..reader.tensors().len() {
        reader.check_record_at(at).unwrap();
    }
    let mut bad = good;
    bad[damaged_info.offset as usize] ^= 0x40;
    let reader = NumpyReader::from_bytes(Bytes::from(bad), &Limits::default()).unwrap();
    // Reads that need not touch the bytes do not check (and stay zero-copy).
    assert!(reader.strided(&damaged_info.name).unwrap().zero_copy);
    reader.view(&damaged_info.name).unwrap();
    for round in 0..2 {
        match reader.check_record_at(damaged_at) {
            Err(Error::DigestMismatch {
                tensor, algorithm, ..
            }) => {
                let name = &damaged_info.name;
                assert_eq!(tensor, format!("{name} (NPZ member {name}.npy)"));
                assert_eq!(algorithm, "crc32");
            }
            other => panic!("round {round}: {other:?}"),
        }
    }
    for at in (0..reader.tensors().len()).filter(|&at| at != damaged_at) {
        reader.check_record_at(at).unwrap();
    }
    assert!(reader.check_record_at(reader.tensors().len()).is_err());
    assert!(reader.verify().is_err());
}

#[test]
fn deflated_members_inflated_whole_are_checked_against_their_crc() {
    let values: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let npy = padded_npy(&values, 118);
    let mut with_tail = npy.clone();
    with_tail.extend_from_slice(&[0; 64]);
    let mut image = zip_archive(&[
        ("whole.npy", npy, Store::Deflated(6)),
        ("tail.npy", with_tail, Store::Deflated(6)),
    ]);
    let reader = NumpyReader::from_bytes(Bytes::from(image.clone()), &Limits::default()).unwrap();
    assert_eq!(reader.view("whole").unwrap().bytes.len(), 64 * 4);
    for at in 0..2 {
        reader.check_record_at(at).unwrap();
    }
    set_directory_crcs(&mut image, 0x1234_5678);
    let reader = NumpyReader::from_bytes(Bytes::from(image), &Limits::default()).unwrap();
    // Inflated to the member's end on every read, strided or not: checked.
    for result in [
        reader.view("whole").map(drop),
        reader.strided("whole").map(drop),
    ] {
        match result {
            Err(Error::DigestMismatch { tensor, .. }) => {
                assert_eq!(tensor, "whole (NPZ member whole.npy)")
            }
            other => panic!("{other:?}"),
        }
    }
    // Bytes after the array are never inflated on reads (nor by `np.load`, which
    // reads just the array), so there is nothing to check the CRC against;
    // `verify` inflates everything.
    assert_eq!(reader.view("tail").unwrap().bytes.len(), 64 * 4);
    reader
        .check_record_at(reader.position("tail").unwrap())
        .unwrap();
    assert!(matches!(reader.verify(), Err(Error::DigestMismatch { .. })));
}

/// An archive made by zipping a folder (`zip -r`): its folder's empty entry holds no
/// array and is skipped, as `np.load` lists it; a file that is not `.npy`, or a
/// "folder" entry with bytes, still makes the archive `Unsupported`.
#[test]
fn npz_folder_entries_are_skipped() {
    let array = padded_npy(&[1.0, 2.0], 64);
    let zip = stored_zip(&[("weights/", Vec::new()), ("weights/a.npy", array.clone())]);
    let reader = NumpyReader::from_bytes(Bytes::from_vec(zip), &Limits::default()).unwrap();
    let names: Vec<_> = reader
        .tensors()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(names, ["weights/a"]);
    assert_eq!(
        reader.view("weights/a").unwrap().bytes.as_slice(),
        &array[array.len() - 8..]
    );
    assert_eq!(reader.verify().unwrap(), 2);
    for other in [("README.txt", b"hi".to_vec()), ("weights/", b"x".to_vec())] {
        let zip = stored_zip(&[other, ("a.npy", array.clone())]);
        assert!(matches!(
            NumpyReader::from_bytes(Bytes::from_vec(zip), &Limits::default()),
            Err(Error::Unsupported { .. })
        ));
    }
}
