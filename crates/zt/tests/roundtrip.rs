//! Writer → reader round trips, append, and abandoned writes.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tensorwire_core::{Bytes, DType, Layout, Shape, TensorSource, Value};
use tensorwire_zt::{
    Checksum, ComponentData, Compression, WriteOptions, ZtReader, ZtVersion, ZtWriter, ALIGNMENT,
};

/// Every dtype a `.zt` file can hold (all but the packet-only quantized types).
fn zt_dtypes() -> Vec<DType> {
    DType::ALL
        .into_iter()
        .filter(|d| {
            !matches!(
                d,
                DType::QInt8 | DType::QUInt8 | DType::QInt4 | DType::QUInt4
            )
        })
        .collect()
}

fn options() -> impl Strategy<Value = WriteOptions> {
    (
        prop_oneof![
            Just(Compression::Raw),
            Just(Compression::Zstd(1)),
            Just(Compression::Zstd(3))
        ],
        prop_oneof![
            Just(Checksum::None),
            Just(Checksum::Crc32c),
            Just(Checksum::Sha256)
        ],
    )
        .prop_map(|(compression, checksum)| WriteOptions {
            compression,
            checksum,
        })
}

fn tensor() -> impl Strategy<Value = (DType, Vec<u64>, WriteOptions, u8)> {
    (
        proptest::sample::select(zt_dtypes()),
        proptest::collection::vec(0u64..6, 0..4),
        options(),
        any::<u8>(),
    )
}

fn data_for(dtype: DType, shape: &Shape, seed: u8) -> Vec<u8> {
    let n = shape.byte_len(dtype).unwrap() as usize;
    (0..n)
        .map(|i| {
            if dtype == DType::Bool {
                ((i + seed as usize) % 2) as u8
            } else {
                (i as u8).wrapping_mul(31).wrapping_add(seed)
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn anything_written_reads_back(tensors in proptest::collection::vec(tensor(), 0..8)) {
        let mut w = ZtWriter::new(Vec::new()).unwrap();
        let mut expect = Vec::new();
        for (i, (dtype, dims, opts, seed)) in tensors.into_iter().enumerate() {
            let name = format!("t{i}.{}", dtype.name());
            let shape = Shape::new(dims).unwrap();
            let data = data_for(dtype, &shape, seed);
            w.add_dense(&name, dtype, &shape, &data, opts).unwrap();
            expect.push((name, dtype, shape, data, opts));
        }
        let file = w.finish_into().unwrap();
        let r = ZtReader::from_bytes(Bytes::from_vec(file)).unwrap();
        prop_assert_eq!(r.tensors().len(), expect.len());
        prop_assert_eq!(r.verify().unwrap(), expect.iter().filter(|e| e.4.checksum != Checksum::None).count());
        for (name, dtype, shape, data, opts) in &expect {
            let v = r.view(name).unwrap();
            prop_assert_eq!(v.dtype, *dtype);
            prop_assert_eq!(&v.shape, shape);
            prop_assert_eq!(&v.bytes[..], &data[..]);
            prop_assert_eq!(v.zero_copy, opts.compression == Compression::Raw);
            let c = &r.object(name).unwrap().components[0];
            prop_assert_eq!(c.offset % ALIGNMENT, 0);
            // Raw views are aligned in memory as well as in the file when the buffer is.
            let mut copy = vec![0u8; data.len()];
            r.read_into(name, &mut copy).unwrap();
            prop_assert_eq!(&copy, data);
        }
    }
}

#[test]
fn views_of_a_mapped_file_are_aligned_for_every_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.zt");
    let mut w = ZtWriter::create(&path).unwrap();
    for (i, dtype) in zt_dtypes().iter().enumerate() {
        let shape = Shape::new(vec![i as u64 + 1]).unwrap();
        let data = data_for(*dtype, &shape, 1);
        w.add_dense(dtype.name(), *dtype, &shape, &data, WriteOptions::default())
            .unwrap();
    }
    w.finish().unwrap();
    let r = ZtReader::open(&path).unwrap();
    for dtype in zt_dtypes() {
        let v = r.view(dtype.name()).unwrap();
        assert!(v.zero_copy);
        assert!(v.bytes.is_aligned(64), "{dtype}");
        assert!(v.bytes.writable_ptr().is_some(), "copy-on-write map");
    }
}

#[test]
fn scalar_and_empty_tensors() {
    let mut w = ZtWriter::new(Vec::new()).unwrap();
    w.add_dense(
        "scalar",
        DType::F64,
        &Shape::scalar(),
        &2.5f64.to_le_bytes(),
        WriteOptions::default(),
    )
    .unwrap();
    w.add_dense(
        "empty",
        DType::F32,
        &Shape::new(vec![0, 3]).unwrap(),
        &[],
        WriteOptions::default(),
    )
    .unwrap();
    let r = ZtReader::from_bytes(Bytes::from_vec(w.finish_into().unwrap())).unwrap();
    let s = r.view("scalar").unwrap();
    assert_eq!(s.shape.ndim(), 0);
    assert_eq!(&s.bytes[..], &2.5f64.to_le_bytes());
    assert_eq!(r.view("empty").unwrap().bytes.len(), 0);
}

#[test]
fn writer_refuses_bad_input() {
    let mut w = ZtWriter::new(Vec::new()).unwrap();
    let shape = Shape::new(vec![2]).unwrap();
    assert!(w
        .add_dense("w", DType::F32, &shape, &[0; 7], WriteOptions::default())
        .is_err());
    w.add_dense("w", DType::F32, &shape, &[0; 8], WriteOptions::default())
        .unwrap();
    assert!(w
        .add_dense("w", DType::F32, &shape, &[0; 8], WriteOptions::default())
        .is_err());
    assert!(w
        .add_dense("", DType::F32, &shape, &[0; 8], WriteOptions::default())
        .is_err());
    assert!(w
        .add_dense("q", DType::QInt4, &shape, &[0; 1], WriteOptions::default())
        .is_err());
}

#[test]
fn integer_attributes_are_exact_in_cbor_range_and_refused_beyond_it() {
    let shape = Shape::new(vec![1]).unwrap();
    let exact = [1i128 << 63, (1 << 64) - 1, -(1 << 63) - 1, -(1 << 64)];
    let beyond = [1i128 << 64, -(1 << 64) - 1, i128::MAX, i128::MIN];
    let map = |v: Value| BTreeMap::from([("v".to_owned(), Value::List(vec![v]))]);
    for version in [ZtVersion::V1, ZtVersion::V2] {
        let mut w = ZtWriter::with_version(Vec::new(), version).unwrap();
        for (i, &v) in exact.iter().enumerate() {
            let name = format!("t{i}");
            w.add_dense_with_attributes(
                &name,
                DType::U8,
                &shape,
                &[0],
                Some(map(Value::Int(v))),
                WriteOptions::default(),
            )
            .unwrap();
        }
        w.set_attributes(map(Value::Int(exact[3]))).unwrap();
        // Refused when given, so the file still finishes with what was accepted.
        for &v in &beyond {
            let err = w
                .add_dense_with_attributes(
                    "x",
                    DType::U8,
                    &shape,
                    &[0],
                    Some(map(Value::Int(v))),
                    WriteOptions::default(),
                )
                .unwrap_err();
            assert!(
                err.to_string().contains("outside CBOR's 64-bit integers"),
                "{err}"
            );
            assert!(w.set_attributes(map(Value::Int(v))).is_err());
        }
        let r = ZtReader::from_bytes(Bytes::from(w.finish_into().unwrap())).unwrap();
        for (i, &v) in exact.iter().enumerate() {
            let obj = r.object(&format!("t{i}")).unwrap();
            assert_eq!(obj.attributes, Some(map(Value::Int(v))), "{version:?}");
        }
        assert_eq!(TensorSource::attributes(&r), &map(Value::Int(exact[3])));
    }
}

/// Names come in any order (the writer sorts them when it writes the manifest), each
/// once: a name given again, early or late among many, is refused, and the file lists
/// every name in order with its own bytes, in both versions.
#[test]
fn names_in_any_order_are_listed_sorted_and_given_once() {
    let dir = tempfile::tempdir().unwrap();
    let shape = Shape::new(vec![1]).unwrap();
    // "layer.{i}" for i = 0..3000 is not in byte order ("layer.10" < "layer.2").
    let names: Vec<String> = (0..3000).map(|i| format!("layer.{i}")).collect();
    for version in [ZtVersion::V1, ZtVersion::V2] {
        let path = dir.path().join(format!("{version:?}.zt"));
        let mut w = ZtWriter::create_with_version(&path, version).unwrap();
        for (i, name) in names.iter().enumerate() {
            let byte = [(i % 251) as u8];
            w.add_dense(name, DType::U8, &shape, &byte, WriteOptions::default())
                .unwrap();
        }
        for again in ["layer.0", "layer.1999", "layer.2999"] {
            let err = w
                .add_dense(again, DType::U8, &shape, &[0], WriteOptions::default())
                .unwrap_err();
            assert!(
                matches!(err, tensorwire_core::Error::Duplicate { .. }),
                "{err}"
            );
        }
        w.finish().unwrap();
        let r = ZtReader::open(&path).unwrap();
        let mut sorted = names.clone();
        sorted.sort();
        let listed: Vec<&str> = r.objects().iter().map(|o| &*o.name).collect();
        assert_eq!(listed, sorted);
        for (i, name) in names.iter().enumerate() {
            assert_eq!(&r.view(name).unwrap().bytes[..], &[(i % 251) as u8]);
        }
    }
    // Appending checks against the names already in the file.
    let path = dir.path().join("V1.zt");
    let mut w = ZtWriter::append(&path).unwrap();
    assert!(w
        .add_dense("layer.42", DType::U8, &shape, &[0], WriteOptions::default())
        .is_err());
    w.add_dense("layer.-1", DType::U8, &shape, &[7], WriteOptions::default())
        .unwrap();
    w.finish().unwrap();
    let r = ZtReader::open(&path).unwrap();
    assert_eq!(&*r.objects()[0].name, "layer.-1");
    assert_eq!(r.objects().len(), 3001);
}

#[test]
fn append_keeps_old_tensors_and_adds_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.zt");
    let shape = Shape::new(vec![3]).unwrap();
    let mut w = ZtWriter::create(&path).unwrap();
    let mut attrs = BTreeMap::new();
    attrs.insert("k".to_owned(), Value::Str("v".into()));
    w.set_attributes(attrs.clone()).unwrap();
    w.add_dense("a", DType::U8, &shape, &[1, 2, 3], WriteOptions::default())
        .unwrap();
    w.finish().unwrap();
    let before = std::fs::read(&path).unwrap();

    let mut w = ZtWriter::append(&path).unwrap();
    assert!(w
        .add_dense("a", DType::U8, &shape, &[0; 3], WriteOptions::default())
        .is_err());
    w.add_dense(
        "b",
        DType::U8,
        &shape,
        &[4, 5, 6],
        WriteOptions {
            compression: Compression::Zstd(3),
            checksum: Checksum::Crc32c,
        },
    )
    .unwrap();
    w.finish().unwrap();

    let r = ZtReader::open(&path).unwrap();
    assert_eq!(&r.view("a").unwrap().bytes[..], &[1, 2, 3]);
    assert_eq!(&r.view("b").unwrap().bytes[..], &[4, 5, 6]);
    assert_eq!(TensorSource::attributes(&r), &attrs);
    // Everything up to the end of the old blobs is untouched.
    let after = std::fs::read(&path).unwrap();
    assert_eq!(&after[..64 + 3], &before[..64 + 3]);
}

#[test]
fn abandoned_writes_leave_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.zt");
    let shape = Shape::new(vec![1]).unwrap();
    {
        let mut w = ZtWriter::create(&path).unwrap();
        w.add_dense("a", DType::U8, &shape, &[1], WriteOptions::default())
            .unwrap();
        // dropped without finish
    }
    assert!(!path.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "temp file left"
    );

    let mut w = ZtWriter::create(&path).unwrap();
    w.add_dense("a", DType::U8, &shape, &[1], WriteOptions::default())
        .unwrap();
    w.finish().unwrap();
    let before = std::fs::read(&path).unwrap();
    let mut w = ZtWriter::append(&path).unwrap();
    w.add_dense("b", DType::U8, &shape, &[2], WriteOptions::default())
        .unwrap();
    w.discard();
    assert_eq!(std::fs::read(&path).unwrap(), before, "append rolled back");
}

#[test]
fn sparse_and_quantized_objects_round_trip() {
    let mut w = ZtWriter::new(Vec::new()).unwrap();
    let values: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    let indices: Vec<u8> = [0u64, 2].iter().flat_map(|x| x.to_le_bytes()).collect();
    let indptr: Vec<u8> = [0u64, 1, 2].iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut attrs = BTreeMap::new();
    attrs.insert("bits".to_owned(), Value::Int(4));
    w.add_object(
        "csr",
        &Shape::new(vec![2, 3]).unwrap(),
        Layout::SparseCsr,
        Some(attrs.clone()),
        &[
            ComponentData {
                role: "values",
                dtype: DType::F32,
                logical_type: None,
                data: &values,
            },
            ComponentData {
                role: "indices",
                dtype: DType::U64,
                logical_type: None,
                data: &indices,
            },
            ComponentData {
                role: "indptr",
                dtype: DType::U64,
                logical_type: None,
                data: &indptr,
            },
        ],
        WriteOptions::default(),
    )
    .unwrap();
    let r = ZtReader::from_bytes(Bytes::from_vec(w.finish_into().unwrap())).unwrap();
    let obj = r.object("csr").unwrap();
    assert_eq!(obj.layout, Layout::SparseCsr);
    assert_eq!(obj.attributes, Some(attrs));
    assert_eq!(&r.component("csr", "indptr").unwrap()[..], &indptr[..]);
    assert_eq!(r.info("csr").unwrap().dtype, DType::F32);
}

/// Found by the `zt_roundtrip` fuzz target: objects the reader would refuse must be
/// refused by the writer before anything is written.
#[test]
fn writer_refuses_objects_the_reader_would_refuse() {
    let shape = Shape::new(vec![2]).unwrap();
    let comp = |role, dtype, logical_type, data| ComponentData {
        role,
        dtype,
        logical_type,
        data,
    };
    let cases: Vec<(Layout, Vec<ComponentData<'_>>)> = vec![
        // Two components with one role.
        (
            Layout::SparseCoo,
            vec![
                comp("values", DType::U8, None, &[1, 2]),
                comp("values", DType::U8, None, &[3]),
            ],
        ),
        // A logical type that does not fit its storage dtype.
        (
            Layout::Dense,
            vec![comp("data", DType::U8, Some("complex64"), &[0; 16])],
        ),
        // Dense without `data`, and with the wrong size; also spelled as Other("dense").
        (
            Layout::Dense,
            vec![comp("values", DType::U8, None, &[1, 2])],
        ),
        (
            Layout::Dense,
            vec![comp("data", DType::U8, None, &[1, 2, 3])],
        ),
        (
            Layout::Other("dense".into()),
            vec![comp("data", DType::U8, None, &[1])],
        ),
    ];
    for (layout, comps) in cases {
        let mut w = ZtWriter::new(Vec::new()).unwrap();
        let err = w.add_object(
            "t",
            &shape,
            layout.clone(),
            None,
            &comps,
            WriteOptions::default(),
        );
        // The caller's mistake, not a malformed file.
        assert!(
            matches!(
                err,
                Err(tensorwire_core::Error::InvalidArgument { .. }
                    | tensorwire_core::Error::Duplicate { .. })
            ),
            "{layout:?} {comps:?}: {err:?}"
        );
        w.add_dense("ok", DType::U8, &shape, &[1, 2], WriteOptions::default())
            .unwrap();
        let file = w.finish_into().unwrap();
        let r = ZtReader::from_bytes(Bytes::from_vec(file)).expect("the file still opens");
        assert_eq!(r.objects().len(), 1);
    }
}
