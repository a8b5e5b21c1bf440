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
