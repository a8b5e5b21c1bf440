//! GGUF reader: the fixtures written by gguf-py (`fixtures/gguf/make_fixtures.py`)
//! read back as gguf-py's own `GGUFReader` saw them (`*.expected.json`), and hostile
//! headers built byte by byte give typed errors.

use std::path::PathBuf;

use proptest::prelude::*;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use tensorwire_core::{Bytes, DType, Error, Layout, Limits, TensorSource, Value};
use tensorwire_formats::gguf::{sniff, GgmlType, GgufReader, DEFAULT_ALIGNMENT, MAGIC};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/gguf")
        .join(name)
}

fn read_fixture(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).unwrap()
}

fn open_bytes(data: &[u8]) -> tensorwire_core::Result<GgufReader> {
    GgufReader::from_bytes(Bytes::from_vec(data.to_vec()), &Limits::default())
}

fn open_with(data: &[u8], limits: &Limits) -> tensorwire_core::Result<GgufReader> {
    GgufReader::from_bytes(Bytes::from_vec(data.to_vec()), limits)
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn u64s(j: &Json) -> Vec<u64> {
    j.as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap())
        .collect()
}

/// `value` matches the JSON `expected` of GGUF type `ty` ("UINT8"…, or
/// ["ARRAY", item type]) exactly: integers as integers, floats bit-exact.
fn assert_value(key: &str, value: &Value, ty: &Json, expected: &Json) {
    if let Some(ty) = ty.as_str() {
        match ty {
            "UINT8" | "INT8" | "UINT16" | "INT16" | "UINT32" | "INT32" | "UINT64" | "INT64" => {
                let want = expected
                    .as_i64()
                    .map(i128::from)
                    .or_else(|| expected.as_u64().map(i128::from))
                    .unwrap();
                assert_eq!(value, &Value::Int(want), "{key}");
            }
            "FLOAT32" | "FLOAT64" => {
                let Value::Float(x) = value else {
                    panic!("{key}: {value:?} is not a float")
                };
                assert_eq!(x.to_bits(), expected.as_f64().unwrap().to_bits(), "{key}");
            }
            "BOOL" => assert_eq!(value, &Value::Bool(expected.as_bool().unwrap()), "{key}"),
            "STRING" => assert_eq!(value.as_str(), expected.as_str(), "{key}"),
            other => panic!("{key}: unexpected type {other}"),
        }
        return;
    }
    let pair = ty.as_array().unwrap();
    assert_eq!(pair[0], "ARRAY");
    let Value::List(items) = value else {
        panic!("{key}: {value:?} is not a list")
    };
    let want = expected.as_array().unwrap();
    assert_eq!(items.len(), want.len(), "{key}: length");
    for (i, (v, e)) in items.iter().zip(want).enumerate() {
        assert_value(&format!("{key}[{i}]"), v, &pair[1], e);
    }
}

/// Reads `name` (mapped, through `GgufReader::open`) and compares everything with
/// `<stem>.expected.json`.
fn check_fixture(name: &str) -> GgufReader {
    let stem = name.strip_suffix(".gguf").unwrap();
    let expected: Json = serde_json::from_str(
        &std::fs::read_to_string(fixture(&format!("{stem}.expected.json"))).unwrap(),
    )
    .unwrap();
    let r = GgufReader::open(fixture(name)).unwrap();
    assert_eq!(r.format(), "gguf");
    assert_eq!(
        u64::from(r.version()),
        expected["version"].as_u64().unwrap()
    );
    assert_eq!(r.alignment(), expected["alignment"].as_u64().unwrap());
    assert_eq!(r.data_offset(), expected["data_offset"].as_u64().unwrap());
    assert_eq!(r.data_offset() % r.alignment(), 0);

    // Metadata: same keys in the same order, same values.
    let kvs = expected["metadata"].as_array().unwrap();
    assert_eq!(r.metadata().len(), kvs.len());
    for ((key, value), kv) in r.metadata().iter().zip(kvs) {
        assert_eq!(key, kv["key"].as_str().unwrap());
        assert_value(key, value, &kv["type"], &kv["value"]);
        assert_eq!(r.attributes().get(key), Some(value));
        assert_eq!(r.metadata_value(key).as_ref(), Some(value));
    }
    assert_eq!(r.attributes().len(), kvs.len());

    // Tensors, in file order.
    let tensors = expected["tensors"].as_array().unwrap();
    assert_eq!(r.tensors().len(), tensors.len());
    assert_eq!(r.gguf_tensors().len(), tensors.len());
    for (info, t) in r.tensors().iter().zip(tensors) {
        let name = t["name"].as_str().unwrap();
        assert_eq!(&*info.name, name);
        let g = r.tensor(name).unwrap();
        let ty = t["type"].as_str().unwrap();
        assert_eq!(g.ggml_type.name(), ty, "{name}");
        assert_eq!(g.dims, u64s(&t["ggml_dims"]), "{name}");
        assert_eq!(g.shape(), u64s(&t["shape"]), "{name}");
        assert_eq!(g.n_elements, t["n_elements"].as_u64().unwrap(), "{name}");
        assert_eq!(g.file_offset, t["offset"].as_u64().unwrap(), "{name}");
        assert_eq!(g.offset, t["relative_offset"].as_u64().unwrap(), "{name}");
        assert_eq!(g.nbytes, t["n_bytes"].as_u64().unwrap(), "{name}");
        assert_eq!(info.offset, g.file_offset);
        assert_eq!(info.nbytes, g.nbytes);
        assert_eq!(info.stored_bytes, g.nbytes);
        assert_eq!(info.encoding, None);
        assert_eq!(
            info.attributes.get("gguf.type"),
            Some(&Value::Str(ty.into()))
        );
        // Plain tensors of one type share one attribute map.
        if let Some(first) = r.tensors().iter().find(|o| {
            o.layout == info.layout
                && o.attributes.get("gguf.type") == info.attributes.get("gguf.type")
        }) {
            if info.layout == tensorwire_core::Layout::Dense {
                assert!(
                    std::ptr::eq(&*first.attributes, &*info.attributes),
                    "{name}"
                );
            }
        }

        let raw = r.raw(name).unwrap();
        assert_eq!(sha256_hex(&raw), t["sha256"].as_str().unwrap(), "{name}");
        let view = r.view(name).unwrap();
        assert!(view.zero_copy);
        assert_eq!(view.bytes.as_slice(), raw.as_slice(), "{name}");
        assert_eq!(view.bytes.len() as u64, info.nbytes);
        assert_eq!(view.dtype, info.dtype);
        assert_eq!(view.shape, info.shape);
        // Zero-copy: the view points into the input at the tensor's offset.
        assert_eq!(
            view.bytes.as_ptr() as usize - r.bytes().as_ptr() as usize,
            g.file_offset as usize
        );

        if g.ggml_type.is_quantized() {
            assert_eq!(info.dtype, DType::U8, "{name}");
            assert_eq!(info.layout, Layout::Other(format!("gguf:{ty}")));
            // The shape gguf-py's GGUFReader gives its uint8 array.
            assert_eq!(info.shape.dims(), u64s(&t["reader_shape"]), "{name}");
            let logical: Vec<Value> = u64s(&t["shape"])
                .into_iter()
                .map(|d| Value::Int(d.into()))
                .collect();
            assert_eq!(
                info.attributes.get("gguf.shape"),
                Some(&Value::List(logical))
            );
        } else {
            assert_eq!(info.layout, Layout::Dense, "{name}");
            assert_eq!(info.dtype, g.ggml_type.dtype().unwrap());
            assert_eq!(info.shape.dims(), u64s(&t["shape"]), "{name}");
            assert_eq!(info.shape.byte_len(info.dtype).unwrap(), info.nbytes);
            assert!(!info.attributes.contains_key("gguf.shape"));
        }
    }
    r
}

#[test]
fn plain_fixture_matches_gguf_py() {
    let r = check_fixture("plain.gguf");
    assert_eq!(r.version(), 3);
    assert_eq!(r.alignment(), DEFAULT_ALIGNMENT);
    // Every plain type is there, with the right dtype.
    let dtypes: Vec<DType> = r.tensors().iter().map(|t| t.dtype).collect();
    for d in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
    ] {
        assert!(dtypes.contains(&d), "{d:?} missing");
    }
    // A few values decoded by hand.
    let v = r.view("i64_1d").unwrap();
    let vals: Vec<i64> = v
        .bytes
        .as_slice()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(vals, [i64::MIN, 0, i64::MAX]);
    let s = r.view("scalar_f32").unwrap();
    assert_eq!(s.shape.ndim(), 0);
    assert_eq!(s.bytes.as_slice(), 42.5f32.to_le_bytes());
    let e = r.view("empty_f32").unwrap();
    assert_eq!(e.shape.dims(), [0, 4]);
    assert!(e.bytes.is_empty());
    // Metadata of every type, nested arrays included.
    let attrs = r.attributes();
    assert_eq!(
        attrs["general.architecture"],
        Value::Str("tensorwire-test".into())
    );
    assert_eq!(attrs["test.u64"], Value::Int(u64::MAX.into()));
    assert_eq!(attrs["test.i64"], Value::Int(i64::MIN.into()));
    assert_eq!(attrs["test.bool_true"], Value::Bool(true));
    assert_eq!(attrs["test.f32_inexact"], Value::Float(f64::from(0.1f32)));
    let Value::List(tokens) = &attrs["tokenizer.ggml.tokens"] else {
        panic!()
    };
    assert_eq!(tokens.len(), 300);
    assert_eq!(
        attrs["test.nested3"],
        Value::List(vec![
            Value::List(vec![
                Value::List(vec![Value::Int(1)]),
                Value::List(vec![Value::Int(2), Value::Int(3)]),
            ]),
            Value::List(vec![Value::List(vec![Value::Int(4)])]),
        ])
    );
}

#[test]
fn quantized_fixture_matches_gguf_py() {
    let r = check_fixture("quantized.gguf");
    let q4k = r.tensor("q4_k").unwrap();
    assert_eq!(q4k.ggml_type, GgmlType::Q4_K);
    assert_eq!(q4k.dims, [256, 2]);
    assert_eq!(q4k.nbytes, 2 * 144);
    let info = r.info("q4_k").unwrap();
    assert_eq!(info.shape.dims(), [2, 144]);
    assert_eq!(info.layout.name(), "gguf:Q4_K");
    for (name, ty) in [
        ("q4_0", GgmlType::Q4_0),
        ("q8_0", GgmlType::Q8_0),
        ("q6_k", GgmlType::Q6_K),
        ("iq4_nl", GgmlType::IQ4_NL),
        ("q5_1_1d", GgmlType::Q5_1),
        ("norm_f32", GgmlType::F32),
    ] {
        assert_eq!(r.tensor(name).unwrap().ggml_type, ty);
    }
    assert_eq!(
        r.attributes()["general.quantization_version"],
        Value::Int(2)
    );
}

#[test]
fn aligned64_fixture_matches_gguf_py() {
    let r = check_fixture("aligned64.gguf");
    assert_eq!(r.alignment(), 64);
    assert_eq!(r.attributes()["general.alignment"], Value::Int(64));
    for t in r.gguf_tensors() {
        assert_eq!(t.file_offset % 64, 0);
    }
}

#[test]
fn v2_fixture_matches_gguf_py() {
    let r = check_fixture("v2.gguf");
    assert_eq!(r.version(), 2);
}

#[test]
fn big_endian_fixture_is_refused() {
    let err = GgufReader::open(fixture("bigendian.gguf")).unwrap_err();
    assert!(err.to_string().contains("bigendian.gguf"), "{err}");
    match err.root() {
        Error::Unsupported { what } => assert!(what.contains("big-endian"), "{what}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn missing_file_error_names_the_path() {
    let err = GgufReader::open("/nonexistent/x.gguf").unwrap_err();
    assert!(err.to_string().contains("/nonexistent/x.gguf"), "{err}");
}

#[test]
fn sniff_and_magic() {
    assert_eq!(MAGIC, b"GGUF");
    assert!(sniff(&read_fixture("plain.gguf")));
    assert!(!sniff(b"\x93NUMPY"));
}

#[test]
fn unknown_tensor_is_not_found() {
    let r = GgufReader::open(fixture("aligned64.gguf")).unwrap();
    for res in [
        r.view("nope").map(|_| ()),
        r.raw("nope").map(|_| ()),
        r.tensor("nope").map(|_| ()),
        r.info("nope").map(|_| ()),
    ] {
        assert!(matches!(res, Err(Error::NotFound { .. })));
    }
}

#[test]
fn every_truncated_prefix_is_a_typed_error() {
    for name in ["plain.gguf", "quantized.gguf", "aligned64.gguf", "v2.gguf"] {
        let data = read_fixture(name);
        let full = open_bytes(&data).unwrap();
        let header_end = full
            .gguf_tensors()
            .iter()
            .map(|t| t.file_offset)
            .min()
            .unwrap_or(full.data_offset());
        let data_end = full
            .gguf_tensors()
            .iter()
            .map(|t| t.file_offset + t.nbytes)
            .max()
            .unwrap();
        for len in 0..data.len() {
            match open_bytes(&data[..len]) {
                // gguf-py pads after the last tensor; without that padding the file
                // is still whole.
                Ok(_) => assert!(len >= data_end as usize, "{name}: prefix {len} opened"),
                Err(e @ Error::Truncated { .. }) => {
                    assert!(e.is_corrupt_data());
                    assert!((len as u64) < header_end, "{name}: prefix {len}: {e}");
                }
                Err(Error::OutOfBounds { limit, .. }) => {
                    assert_eq!(limit, len as u64);
                    assert!(len < data_end as usize);
                }
                Err(e) => panic!("{name}: prefix {len}: unexpected {e:?}"),
            }
        }
    }
}

#[test]
fn header_larger_than_the_metadata_limit_is_refused() {
    let data = read_fixture("plain.gguf");
    let limits = Limits {
        max_metadata_bytes: 1000,
        ..Limits::default()
    };
    let err = open_with(&data, &limits).unwrap_err();
    assert!(
        matches!(
            err,
            Error::LimitExceeded {
                what: "GGUF header size",
                limit: 1000,
                ..
            }
        ),
        "{err:?}"
    );
}

// ===== a small GGUF builder for hostile headers =====

const T_U8: u32 = 0;
const T_U32: u32 = 4;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;

fn gstr(s: &[u8]) -> Vec<u8> {
    let mut out = (s.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(s);
    out
}

struct Builder {
    version: u32,
    kv: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    n_tensors: u64,
    alignment: u64,
    data: Vec<u8>,
    kv_count: Option<u64>,
    tensor_count: Option<u64>,
}

impl Builder {
    fn new() -> Builder {
        Builder {
            version: 3,
            kv: Vec::new(),
            n_kv: 0,
            infos: Vec::new(),
            n_tensors: 0,
            alignment: 32,
            data: Vec::new(),
            kv_count: None,
            tensor_count: None,
        }
    }

    /// A key with a value already encoded (type tag included).
    fn kv_raw(mut self, key: &[u8], typed_value: &[u8]) -> Builder {
        self.kv.extend(gstr(key));
        self.kv.extend_from_slice(typed_value);
        self.n_kv += 1;
        self
    }

    fn kv(self, key: &str, vtype: u32, value: &[u8]) -> Builder {
        let mut v = vtype.to_le_bytes().to_vec();
        v.extend_from_slice(value);
        self.kv_raw(key.as_bytes(), &v)
    }

    fn tensor_raw(mut self, name: &[u8], dims: &[u64], ty: u32, offset: u64) -> Builder {
        self.infos.extend(gstr(name));
        self.infos
            .extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            self.infos.extend_from_slice(&d.to_le_bytes());
        }
        self.infos.extend_from_slice(&ty.to_le_bytes());
        self.infos.extend_from_slice(&offset.to_le_bytes());
        self.n_tensors += 1;
        self
    }

    fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Builder {
        self.tensor_raw(name.as_bytes(), dims, ty, offset)
    }

    fn data(mut self, n: usize) -> Builder {
        self.data = (0..n).map(|i| i as u8).collect();
        self
    }

    fn build(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.tensor_count.unwrap_or(self.n_tensors).to_le_bytes());
        out.extend_from_slice(&self.kv_count.unwrap_or(self.n_kv).to_le_bytes());
        out.extend_from_slice(&self.kv);
        out.extend_from_slice(&self.infos);
        while out.len() as u64 % self.alignment != 0 {
            out.push(0);
        }
        out.extend_from_slice(&self.data);
        out
    }
}

/// An array value (type tag included) of `count` items of `item_type`, followed by
/// `items` (already encoded).
fn array(item_type: u32, count: u64, items: &[u8]) -> Vec<u8> {
    let mut v = T_ARRAY.to_le_bytes().to_vec();
    v.extend_from_slice(&item_type.to_le_bytes());
    v.extend_from_slice(&count.to_le_bytes());
    v.extend_from_slice(items);
    v
}

/// Arrays nested `depth` deep around a single u8.
fn nested(depth: usize) -> Vec<u8> {
    // The innermost array holds one u8; each level above holds one array.
    let mut body = array(T_U8, 1, &[7]);
    for _ in 1..depth {
        // An item of an array of arrays is `item_type | count | items`, no tag.
        let inner = body[4..].to_vec();
        body = array(T_ARRAY, 1, &inner);
    }
    body
}

fn err(data: &[u8]) -> Error {
    open_bytes(data).unwrap_err()
}

#[test]
fn builder_makes_files_the_reader_accepts() {
    let data = Builder::new()
        .kv("general.architecture", T_STRING, &gstr(b"llama"))
        .kv("general.alignment", T_U32, &16u32.to_le_bytes())
        .kv_raw(b"empty.arr", &array(T_U32, 0, &[]))
        .tensor("a", &[4, 2], 0, 0)
        .tensor("b", &[32], 8, 32)
        .data(32 + 34);
    let mut b = data;
    b.alignment = 16;
    let r = open_bytes(&b.build()).unwrap();
    assert_eq!(r.alignment(), 16);
    assert_eq!(r.attributes()["empty.arr"], Value::List(vec![]));
    assert_eq!(r.info("a").unwrap().shape.dims(), [2, 4]);
    assert_eq!(r.info("b").unwrap().shape.dims(), [34]);
    assert_eq!(r.tensor("b").unwrap().shape(), [32]);
}

#[test]
fn empty_file_and_no_tensors() {
    assert!(matches!(err(b""), Error::Truncated { offset: 0, .. }));
    assert!(matches!(err(b"GG"), Error::Truncated { .. }));
    // A header with no KVs and no tensors needs no data section.
    let r = open_bytes(&Builder::new().build()).unwrap();
    assert!(r.tensors().is_empty());
    assert!(r.metadata().is_empty());
    assert_eq!(r.data_offset(), 32);
}

#[test]
fn bad_magic() {
    let mut data = Builder::new().build();
    data[0] = b'X';
    assert!(matches!(
        err(&data),
        Error::BadMagic { offset: 0, ref found, .. } if found == b"XGUF"
    ));
    assert!(matches!(err(b"GGX"), Error::BadMagic { .. }));
    assert!(matches!(err(b"ZTEN1000"), Error::BadMagic { .. }));
}

#[test]
fn version_1_and_unknown_versions_are_unsupported() {
    for v in [0u32, 1, 4, 0x1234_5678] {
        let mut b = Builder::new();
        b.version = v;
        assert!(
            matches!(err(&b.build()), Error::Unsupported { .. }),
            "version {v}"
        );
    }
}

#[test]
fn big_endian_is_unsupported() {
    for v in [2u32, 3] {
        let mut b = Builder::new();
        b.version = v.swap_bytes();
        match err(&b.build()) {
            Error::Unsupported { what } => assert!(what.contains("big-endian"), "{what}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn huge_kv_count_is_refused_before_allocating() {
    let mut b = Builder::new();
    b.kv_count = Some(1 << 62);
    // The pairs cannot fit the file: cut short, not too big for the limit.
    assert!(matches!(err(&b.build()), Error::Truncated { .. }));
    b.kv_count = Some(1000);
    assert!(matches!(err(&b.build()), Error::Truncated { .. }));
}

/// A GGUF file whose one metadata value is a string claiming `len` bytes, of which
/// `present` follow.
fn gguf_with_string_claim(len: u64, present: usize) -> Vec<u8> {
    let mut v = T_STRING.to_le_bytes().to_vec();
    v.extend_from_slice(&len.to_le_bytes());
    v.extend(vec![b'a'; present]);
    Builder::new().kv_raw(b"k", &v).build()
}

#[test]
fn lying_lengths_in_a_small_file_are_truncated_not_over_the_limit() {
    // A 2 GiB string, 2^62 pairs, 2^60 strings, claimed by files of a few dozen
    // bytes: truncated files, whatever the header limit (the default 64 MiB, or 0).
    let mut kv = Builder::new();
    kv.kv_count = Some(1 << 62);
    let files = [
        gguf_with_string_claim(2 << 30, 3),
        gguf_with_string_claim(512 << 20, 3),
        gguf_with_string_claim(u64::MAX, 3),
        kv.build(),
        Builder::new()
            .kv_raw(b"a", &array(T_STRING, 1 << 60, &gstr(b"a")))
            .build(),
        Builder::new()
            .kv_raw(b"a", &array(T_U8, u64::MAX, &[1]))
            .build(),
    ];
    // Each file's fixed fields fit a 64-byte limit; the claims pass it and the file.
    for limit in [Limits::default().max_metadata_bytes, 64] {
        let limits = Limits {
            max_metadata_bytes: limit,
            ..Limits::default()
        };
        for (i, data) in files.iter().enumerate() {
            assert!(data.len() <= 64);
            match open_with(data, &limits) {
                Err(Error::Truncated { .. }) => {}
                other => panic!("file {i}, limit {limit}: {:?}", other.map(|_| ())),
            }
        }
    }
    // A string that is there, in a header longer than the limit: the limit's error.
    let data = gguf_with_string_claim(4096, 4096);
    let limits = Limits {
        max_metadata_bytes: 1024,
        ..Limits::default()
    };
    assert!(matches!(
        open_with(&data, &limits),
        Err(Error::LimitExceeded {
            what: "GGUF header size",
            limit: 1024,
            ..
        })
    ));
    assert!(open_bytes(&data).is_ok());
}

#[test]
fn huge_tensor_count_is_refused() {
    let mut b = Builder::new();
    b.tensor_count = Some(u64::MAX);
    assert!(matches!(
        err(&b.build()),
        Error::LimitExceeded {
            what: "tensor count",
            ..
        }
    ));
    b.tensor_count = Some(1000);
    assert!(matches!(err(&b.build()), Error::Truncated { .. }));
}

#[test]
fn huge_string_lengths_are_refused() {
    // A key longer than max_name_bytes.
    let mut data = Builder::new().kv("k", T_U8, &[1]).build();
    data[24..32].copy_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(matches!(
        err(&data),
        Error::LimitExceeded {
            what: "metadata key length",
            ..
        }
    ));
    // A string value claiming 2^62 bytes of a small file.
    let mut v = T_STRING.to_le_bytes().to_vec();
    v.extend_from_slice(&(1u64 << 62).to_le_bytes());
    let data = Builder::new().kv_raw(b"s", &v).build();
    assert!(matches!(err(&data), Error::Truncated { .. }));
    // A string value running past the end of the file.
    let mut v = T_STRING.to_le_bytes().to_vec();
    v.extend_from_slice(&100u64.to_le_bytes());
    v.extend_from_slice(b"short");
    let data = Builder::new().kv_raw(b"s", &v).build();
    assert!(matches!(err(&data), Error::Truncated { .. }));
    // A tensor name longer than the limit.
    let data = Builder::new()
        .tensor_raw(&[b'n'; 100], &[1], 0, 0)
        .data(4)
        .build();
    let limits = Limits {
        max_name_bytes: 64,
        ..Limits::default()
    };
    assert!(matches!(
        open_with(&data, &limits),
        Err(Error::LimitExceeded {
            what: "tensor name length",
            ..
        })
    ));
}

#[test]
fn string_array_with_count_2_pow_60_is_refused() {
    let data = Builder::new()
        .kv_raw(
            b"tokenizer.ggml.tokens",
            &array(T_STRING, 1 << 60, &gstr(b"a")),
        )
        .build();
    // The strings cannot fit the file: cut short, whatever the limit.
    assert!(matches!(err(&data), Error::Truncated { .. }));
    // Also when the limit is effectively off: the bytes are not there.
    let limits = Limits {
        max_metadata_bytes: u64::MAX,
        ..Limits::default()
    };
    assert!(matches!(
        open_with(&data, &limits),
        Err(Error::Truncated { .. })
    ));
    // u64 items: 8 bytes each, checked before reserving.
    let data = Builder::new()
        .kv_raw(b"a", &array(T_U64, 1000, &[0; 16]))
        .build();
    assert!(matches!(err(&data), Error::Truncated { .. }));
}

#[test]
fn large_vocabulary_is_fine() {
    let n = 150_000u64;
    let mut items = Vec::new();
    for i in 0..n {
        items.extend(gstr(format!("token{i}").as_bytes()));
    }
    let data = Builder::new()
        .kv_raw(b"tokenizer.ggml.tokens", &array(T_STRING, n, &items))
        .build();
    let r = open_bytes(&data).unwrap();
    let Value::List(tokens) = &r.attributes()["tokenizer.ggml.tokens"] else {
        panic!()
    };
    assert_eq!(tokens.len(), n as usize);
    assert_eq!(tokens[149_999], Value::Str("token149999".into()));
}

#[test]
fn nesting_beyond_max_depth_is_refused() {
    let limits = Limits {
        max_depth: 3,
        ..Limits::default()
    };
    let ok = Builder::new().kv_raw(b"n", &nested(3)).build();
    let r = open_with(&ok, &limits).unwrap();
    assert_eq!(
        r.attributes()["n"],
        Value::List(vec![Value::List(vec![Value::List(vec![Value::Int(7)])])])
    );
    let deep = Builder::new().kv_raw(b"n", &nested(4)).build();
    assert!(matches!(
        open_with(&deep, &limits),
        Err(Error::LimitExceeded {
            what: "metadata nesting depth",
            limit: 3,
            found: 4
        })
    ));
    // Very deep input with the default limits (64) and with "no" limit: refused, no
    // stack overflow.
    let very = Builder::new().kv_raw(b"n", &nested(100_000)).build();
    assert!(matches!(err(&very), Error::LimitExceeded { .. }));
    let unlimited = Limits {
        max_depth: usize::MAX,
        ..Limits::default()
    };
    assert!(matches!(
        open_with(&very, &unlimited),
        Err(Error::LimitExceeded { .. })
    ));
}

#[test]
fn unknown_value_types_are_malformed() {
    let data = Builder::new().kv("x", 13, &[0; 8]).build();
    assert!(matches!(err(&data), Error::Malformed { offset: 33, .. }));
    let data = Builder::new().kv_raw(b"x", &array(99, 1, &[0])).build();
    assert!(matches!(err(&data), Error::Malformed { .. }));
}

#[test]
fn keys_and_names_not_utf8_and_bad_bools_are_malformed() {
    let data = Builder::new().kv_raw(b"\xff\xfe", &[0, 0, 0, 0, 1]).build();
    assert!(matches!(err(&data), Error::Malformed { offset: 24, .. }));
    let data = Builder::new()
        .tensor_raw(b"\xc0\x80", &[1], 0, 0)
        .data(4)
        .build();
    assert!(matches!(err(&data), Error::Malformed { .. }));
    let data = Builder::new().kv("b", T_BOOL, &[2]).build();
    assert!(matches!(err(&data), Error::Malformed { .. }));
}

/// An array value of `STRING` items.
fn strings(items: &[&[u8]]) -> Vec<u8> {
    let bytes: Vec<u8> = items.iter().flat_map(|s| gstr(s)).collect();
    array(T_STRING, items.len() as u64, &bytes)
}

/// The spec asks for UTF-8 values, but llama.cpp and gguf-py keep a value's bytes as
/// they are: a value that is not UTF-8 reads as bytes, and the file stays readable.
#[test]
fn string_values_not_utf8_read_as_bytes() {
    let data = Builder::new()
        .kv("s", T_STRING, &gstr(b"a\xc3"))
        .kv_raw(b"tokens", &strings(&[b"ab", b"c\xff", b"\xe2\x96\x81d"]))
        .tensor("t", &[2], 0, 0)
        .data(8)
        .build();
    let r = open_bytes(&data).unwrap();
    assert_eq!(r.metadata_value("s"), Some(Value::Bytes(b"a\xc3".to_vec())));
    assert_eq!(
        r.metadata_value("tokens"),
        Some(Value::List(vec![
            Value::Str("ab".into()),
            Value::Bytes(b"c\xff".to_vec()),
            Value::Str("\u{2581}d".into()),
        ]))
    );
    assert_eq!(
        r.attributes().get("s"),
        Some(&Value::Bytes(b"a\xc3".to_vec()))
    );
    assert_eq!(r.view("t").unwrap().bytes.len(), 8);
}

#[test]
fn values_inside_arrays_are_checked_on_open() {
    // Key "s" puts the array's items at 49: header 24, key 9, type 4, item type 4,
    // count 8.
    let data = Builder::new()
        .kv_raw(b"s", &array(T_BOOL, 3, &[1, 0, 2]))
        .build();
    assert!(matches!(err(&data), Error::Malformed { offset: 51, .. }));
    // A string running past the header, and a count larger than the items present.
    let mut overrun = strings(&[b"ab", b"cd"]);
    overrun[16 + 10 + 2] = 200; // the second string's length
    let data = Builder::new().kv_raw(b"s", &overrun).build();
    assert!(err(&data).is_corrupt_data());
    let mut short = strings(&[b"ab", b"cd"]);
    short[8] = 200;
    assert!(err(&Builder::new().kv_raw(b"s", &short).build()).is_corrupt_data());
}

#[test]
fn values_decode_on_use_alike_one_by_one_and_all_together() {
    let nested_strings = {
        // Items carry no type tag of their own.
        let inner = array(T_STRING, 2, &[gstr(b"x"), gstr(b"")].concat());
        array(T_ARRAY, 1, &inner[4..])
    };
    let data = Builder::new()
        .kv_raw(
            b"s",
            &array(
                T_STRING,
                3,
                &[gstr("ü€".as_bytes()), gstr(b""), gstr(b"z")].concat(),
            ),
        )
        .kv_raw(b"b", &array(T_BOOL, 3, &[1, 0, 1]))
        .kv_raw(b"n", &nested_strings)
        .kv_raw(
            b"u",
            &array(
                T_U64,
                2,
                &[u64::MAX.to_le_bytes(), 7u64.to_le_bytes()].concat(),
            ),
        )
        .kv("one", T_U32, &5u32.to_le_bytes())
        .build();
    let str_ = |s: &str| Value::Str(s.to_owned());
    let expected = [
        ("s", Value::List(vec![str_("ü€"), str_(""), str_("z")])),
        (
            "b",
            Value::List(vec![
                Value::Bool(true),
                Value::Bool(false),
                Value::Bool(true),
            ]),
        ),
        (
            "n",
            Value::List(vec![Value::List(vec![str_("x"), str_("")])]),
        ),
        (
            "u",
            Value::List(vec![Value::Int(u64::MAX.into()), Value::Int(7)]),
        ),
        ("one", Value::Int(5)),
    ];
    // One key at a time before anything else is decoded, then all of them.
    let r = open_bytes(&data).unwrap();
    assert_eq!(
        r.metadata_keys().collect::<Vec<_>>(),
        ["s", "b", "n", "u", "one"]
    );
    for (key, value) in &expected {
        assert_eq!(r.metadata_value(key).as_ref(), Some(value), "{key}");
    }
    assert_eq!(r.metadata_value("missing"), None);
    let all: Vec<(String, Value)> = expected
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    assert_eq!(r.metadata(), &all[..]);
    for (key, value) in &expected {
        assert_eq!(r.metadata_value(key).as_ref(), Some(value), "{key}");
    }
    // The attributes first, on a fresh reader.
    let r = open_bytes(&data).unwrap();
    for (key, value) in &expected {
        assert_eq!(r.attributes().get(*key), Some(value), "{key}");
    }
}

#[test]
fn duplicate_keys_and_tensor_names() {
    let data = Builder::new()
        .kv("k", T_U8, &[1])
        .kv("k", T_U8, &[2])
        .build();
    match err(&data) {
        Error::Malformed { reason, .. } => assert!(reason.contains("duplicate"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let data = Builder::new()
        .tensor("w", &[1], 0, 0)
        .tensor("w", &[1], 0, 32)
        .data(64)
        .build();
    assert!(matches!(err(&data), Error::Duplicate { ref name } if name == "w"));
}

#[test]
fn bad_alignments_are_malformed() {
    for (vtype, value) in [
        (T_U32, 0u32.to_le_bytes().to_vec()),
        (T_U32, 48u32.to_le_bytes().to_vec()),
        (T_U64, 64u64.to_le_bytes().to_vec()),
        (T_U8, vec![32]),
    ] {
        let data = Builder::new()
            .kv("general.alignment", vtype, &value)
            .build();
        assert!(
            matches!(err(&data), Error::Malformed { .. }),
            "{vtype} {value:?}"
        );
    }
}

#[test]
fn misaligned_offset() {
    let data = Builder::new().tensor("w", &[4], 0, 4).data(64).build();
    assert!(matches!(
        err(&data),
        Error::Misaligned {
            alignment: 32,
            ref tensor,
            ..
        } if tensor == "w"
    ));
}

#[test]
fn overlapping_tensors() {
    let data = Builder::new()
        .tensor("a", &[8], 0, 0)
        .tensor("b", &[8], 0, 32)
        .tensor("c", &[16], 0, 32)
        .data(128)
        .build();
    match err(&data) {
        Error::Overlap { tensor, other, .. } => {
            assert_eq!((tensor.as_str(), other.as_str()), ("c", "b"))
        }
        other => panic!("{other:?}"),
    }
    // A big tensor covering a later one, with a small one in between.
    let data = Builder::new()
        .tensor("big", &[64], 0, 0)
        .tensor("x", &[1], 0, 64)
        .data(256)
        .build();
    assert!(matches!(err(&data), Error::Overlap { .. }));
    // Empty tensors own no bytes: they overlap nothing.
    let data = Builder::new()
        .tensor("a", &[16], 0, 0)
        .tensor("empty", &[0, 3], 0, 32)
        .data(64)
        .build();
    assert!(open_bytes(&data).is_ok());
}

#[test]
fn tensor_out_of_bounds() {
    let data = Builder::new().tensor("w", &[16], 0, 0).data(63).build();
    assert!(matches!(err(&data), Error::OutOfBounds { length: 64, .. }));
    let data = Builder::new()
        .tensor("w", &[1], 0, u64::MAX - 31)
        .data(4)
        .build();
    assert!(matches!(err(&data), Error::Overflow { .. }));
    let data = Builder::new().tensor("w", &[1], 0, 1 << 40).data(4).build();
    assert!(matches!(err(&data), Error::OutOfBounds { .. }));
}

#[test]
fn unknown_type_id() {
    for id in [4u32, 31, 36, 1000] {
        let data = Builder::new().tensor("w", &[1], id, 0).data(64).build();
        match err(&data) {
            Error::UnknownDType { name } => assert_eq!(name, format!("ggml type {id}")),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn row_not_a_multiple_of_the_block_size() {
    let data = Builder::new().tensor("q", &[33, 1], 2, 0).data(64).build();
    match err(&data) {
        Error::Malformed { reason, offset } => {
            assert!(reason.contains("Q4_0"), "{reason}");
            assert_eq!(offset, 24);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn dims_that_overflow() {
    let data = Builder::new()
        .tensor("w", &[1 << 32, 1 << 32, 1 << 32], 0, 0)
        .data(4)
        .build();
    assert!(matches!(err(&data), Error::Overflow { .. }));
    let data = Builder::new()
        .tensor("w", &[1 << 62, 4], 0, 0)
        .data(4)
        .build();
    assert!(matches!(err(&data), Error::Overflow { .. }));
    let data = Builder::new()
        .tensor("w", &[u64::MAX], 0, 0)
        .data(4)
        .build();
    assert!(matches!(err(&data), Error::Malformed { .. }));
    let data = Builder::new().tensor("w", &[1; 65], 0, 0).data(4).build();
    assert!(matches!(
        err(&data),
        Error::LimitExceeded {
            what: "number of dimensions",
            ..
        }
    ));
    // n_dims claiming 2^32 - 1 dims with a high limit: refused, not allocated.
    let mut data = Builder::new().tensor("w", &[1], 0, 0).data(4).build();
    data[24 + 9..24 + 13].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(err(&data), Error::LimitExceeded { .. }));
}

#[test]
fn every_quantized_type_is_served_as_raw_blocks() {
    let mut b = Builder::new();
    let mut offset = 0u64;
    for &t in GgmlType::ALL {
        let ne0 = t.block_size() * 2;
        b = b.tensor(t.name(), &[ne0, 3], t.id(), offset);
        offset += (2 * 3 * t.type_size()).div_ceil(32) * 32;
    }
    let data = b.data(offset as usize).build();
    let r = open_bytes(&data).unwrap();
    for &t in GgmlType::ALL {
        let info = r.info(t.name()).unwrap();
        let view = r.view(t.name()).unwrap();
        assert_eq!(view.bytes.len() as u64, 6 * t.type_size());
        assert_eq!(info.attributes["gguf.type"], Value::Str(t.name().into()));
        match t.dtype() {
            Some(d) => {
                assert_eq!(view.dtype, d);
                assert_eq!(view.shape.dims(), [3, 2]);
            }
            None => {
                assert_eq!(view.dtype, DType::U8);
                assert_eq!(view.shape.dims(), [3, 2 * t.type_size()]);
                assert_eq!(
                    info.attributes["gguf.shape"],
                    Value::List(vec![Value::Int(3), Value::Int((2 * t.block_size()).into())])
                );
            }
        }
    }
}

#[test]
fn scalar_quantized_tensor_is_malformed() {
    // No dims means one element, which is not a whole Q8_0 block.
    let data = Builder::new().tensor("q", &[], 8, 0).data(64).build();
    assert!(matches!(err(&data), Error::Malformed { .. }));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random byte edits of a real file never panic; whatever opens serves every
    /// tensor with `nbytes` bytes.
    #[test]
    fn mutated_fixtures_never_panic(
        which in 0usize..3,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
    ) {
        let name = ["aligned64.gguf", "quantized.gguf", "v2.gguf"][which];
        let mut data = read_fixture(name);
        for (at, b) in edits {
            let i = at % data.len();
            data[i] = b;
        }
        if let Ok(r) = open_bytes(&data) {
            for info in r.tensors() {
                let v = r.view(&info.name).unwrap();
                prop_assert_eq!(v.bytes.len() as u64, info.nbytes);
                prop_assert_eq!(r.raw(&info.name).unwrap().len() as u64, info.nbytes);
            }
            let _ = r.attributes().len();
        }
    }
}
