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

/// A stored ZIP archive of `(name, data)` records (CRCs left 0: not checked on reads).
fn stored_zip(records: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in records {
        let offset = out.len() as u32;
        let fixed = |sig: u32, extra_fields: &[u8]| {
            let mut h = sig.to_le_bytes().to_vec();
            h.extend_from_slice(extra_fields);
            h
        };
        let mut sizes = Vec::new();
        sizes.extend_from_slice(&0u32.to_le_bytes()); // crc
        sizes.extend_from_slice(&(data.len() as u32).to_le_bytes());
        sizes.extend_from_slice(&(data.len() as u32).to_le_bytes());
        let name_len = (name.len() as u16).to_le_bytes();
        // Local header: version, flags, method 0, time, date, crc/sizes, name, extra 0.
        let mut local = fixed(0x0403_4b50, &[20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        local.extend_from_slice(&sizes);
        local.extend_from_slice(&name_len);
        local.extend_from_slice(&[0, 0]);
        local.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&local);
        out.extend_from_slice(data);
        // Central record: versions, flags, method, time, date, crc/sizes, lengths,
        // disk, attributes, local header offset, name.
        let mut c = fixed(0x0201_4b50, &[20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
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

/// A `.npy` v1 image of little-endian f32 values whose header dict is padded with
/// spaces to `header_len` bytes (the format allows any padding; numpy reads it).
fn padded_npy(values: &[f32], header_len: usize) -> Vec<u8> {
    let dict = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}",
        values.len()
    );
    let mut header = dict.into_bytes();
    header.resize(header_len - 1, b' ');
    header.push(b'\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(&header);
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
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

/// A file image in memory that counts the positional reads made of it.
struct CountingFile {
    image: Vec<u8>,
    reads: std::sync::atomic::AtomicUsize,
}

impl tensorwire_range::RangeRead for CountingFile {
    fn len(&self) -> u64 {
        self.image.len() as u64
    }

    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> tensorwire_core::Result<()> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
    let file = std::sync::Arc::new(CountingFile {
        image: image.clone(),
        reads: Default::default(),
    });
    let input =
        tensorwire_pytorch::Input::mapped_with_file(Bytes::from_vec(image.clone()), file.clone())
            .unwrap();
    let positional = NumpyReader::npz(input, &Limits::default()).unwrap();
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
    }
    let npy = std::fs::read(fixture("numpy/c_order.npy")).unwrap();
    let reader = NumpyReader::from_bytes(Bytes::from(npy), &Limits::default()).unwrap();
    assert_eq!(reader.verify().unwrap(), 0, "an .npy file has no digest");
}
