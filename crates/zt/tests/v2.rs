//! `.zt` version 2: the fixtures under `fixtures/zt/v2/` (written by the real ztensor
//! 2.1.2, see `make_fixtures.py`) read back equal to the arrays that made them, and
//! rewriting them with our writer gives ztensor's bytes; hostile files give typed
//! errors; the writer round-trips and refuses what the reader refuses; and, when a
//! ztensor 2.x interpreter is around, ztensor reads the files we write.

mod common;

use common::hex;
use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value as Json;
use sha2::{Digest as _, Sha256};
use tensorwire_core::{Bytes, DType, Error, Layout, Limits, Shape, TensorSource, Value};
use tensorwire_zt::{
    ByteType, Checksum, ComponentData, Compression, Digest, Encoding, WriteOptions, ZtReader,
    ZtVersion, ZtWriter, MAGIC_V2,
};

#[path = "../examples/write_v2.rs"]
#[allow(dead_code)]
mod write_v2;

fn fixtures() -> Vec<(PathBuf, Json)> {
    common::fixtures("zt/v2", 9)
}

fn fixture_dir() -> PathBuf {
    common::fixture_dir("zt/v2")
}

fn sha(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// A tagged JSON attribute value (see `make_fixtures.py`) as a [`Value`].
fn untag(j: &Json) -> Value {
    let t = j.as_array().unwrap();
    match t[0].as_str().unwrap() {
        "null" => Value::Null,
        "bool" => Value::Bool(t[1].as_bool().unwrap()),
        "int" => Value::Int(t[1].as_str().unwrap().parse().unwrap()),
        "float" => Value::Float(f64::from_bits(
            u64::from_str_radix(t[1].as_str().unwrap(), 16).unwrap(),
        )),
        "str" => Value::Str(t[1].as_str().unwrap().to_owned()),
        "bytes" => Value::Bytes(
            (0..t[1].as_str().unwrap().len() / 2)
                .map(|i| u8::from_str_radix(&t[1].as_str().unwrap()[2 * i..2 * i + 2], 16).unwrap())
                .collect(),
        ),
        "list" => Value::List(t[1].as_array().unwrap().iter().map(untag).collect()),
        "map" => Value::Map(
            t[1].as_array()
                .unwrap()
                .iter()
                .map(|kv| (kv[0].as_str().unwrap().to_owned(), untag(&kv[1])))
                .collect(),
        ),
        other => panic!("tag {other}"),
    }
}

/// Attribute equality that treats NaN as equal to NaN and sorts nested maps.
fn norm(v: &Value) -> String {
    match v {
        Value::Float(x) => format!(
            "f{:016x}",
            if x.is_nan() {
                f64::NAN.to_bits()
            } else {
                x.to_bits()
            }
        ),
        Value::List(items) => format!("[{}]", items.iter().map(norm).collect::<Vec<_>>().join(",")),
        Value::Map(entries) => {
            let mut e: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{k:?}:{}", norm(v)))
                .collect();
            e.sort();
            format!("{{{}}}", e.join(","))
        }
        other => format!("{other:?}"),
    }
}

fn norm_map(m: &BTreeMap<String, Value>) -> String {
    norm(&Value::Map(
        m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    ))
}

fn untag_map(j: &Json) -> Option<BTreeMap<String, Value>> {
    match j {
        Json::Null => None,
        j => match untag(j) {
            Value::Map(m) => Some(m.into_iter().collect()),
            other => panic!("attributes {other:?}"),
        },
    }
}

fn layout_id(l: &Layout) -> String {
    match l {
        Layout::Dense => "dense".into(),
        Layout::SparseCsr => "zt.sparse_csr/1".into(),
        other => other.name().to_owned(),
    }
}

#[test]
fn every_v2_fixture_reads_back_equal_to_its_source_arrays() {
    let mut parts_checked = 0;
    for (path, expected) in fixtures() {
        let label = path.display().to_string();
        let reader = ZtReader::open(&path).unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_eq!(reader.version(), ZtVersion::V2, "{label}");
        assert_eq!(reader.format(), "zt-2", "{label}");
        assert_eq!(reader.manifest_version(), "2", "{label}");
        let want_attrs = untag_map(&expected["attributes"]).unwrap_or_default();
        assert_eq!(
            norm_map(reader.attributes()),
            norm_map(&want_attrs),
            "{label}: attributes"
        );
        let objects = expected["objects"].as_object().unwrap();
        assert_eq!(
            reader.objects().len(),
            objects.len(),
            "{label}: object count"
        );
        let mut digests = 0;
        for (name, want) in objects {
            let obj = reader
                .object(name)
                .unwrap_or_else(|e| panic!("{label}: {name}: {e}"));
            let shape: Vec<u64> = want["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            assert_eq!(obj.shape.dims(), &shape[..], "{label}: {name} shape");
            assert_eq!(
                layout_id(&obj.layout),
                want["layout"].as_str().unwrap(),
                "{label}: {name}"
            );
            assert_eq!(
                obj.attributes
                    .as_ref()
                    .filter(|a| !a.is_empty())
                    .map(norm_map),
                untag_map(&want["attributes"])
                    .filter(|a| !a.is_empty())
                    .map(|m| norm_map(&m)),
                "{label}: {name} attributes"
            );
            let parts = want["parts"].as_object().unwrap();
            assert_eq!(obj.components.len(), parts.len(), "{label}: {name}");
            for (role, wp) in parts {
                let what = format!("{label}: {name}/{role}");
                let c = obj
                    .component(role)
                    .unwrap_or_else(|| panic!("{what}: missing"));
                assert_eq!(c.dtype.name(), wp["dtype"].as_str().unwrap(), "{what}");
                assert_eq!(c.logical_type.as_deref(), wp["type"].as_str(), "{what}");
                assert_eq!(
                    (c.encoding != Encoding::Raw).then(|| c.encoding.name()),
                    wp["encoding"].as_str(),
                    "{what}"
                );
                assert_eq!(
                    c.digest.as_ref().map(Digest::algorithm),
                    wp["digest"].as_str(),
                    "{what}"
                );
                digests += usize::from(c.digest.is_some());
                let got = reader
                    .component(name, role)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(got.len() as u64, wp["nbytes"].as_u64().unwrap(), "{what}");
                assert_eq!(sha(&got), wp["sha256"].as_str().unwrap(), "{what}: bytes");
                if let Some(h) = wp["hex"].as_str() {
                    assert_eq!(hex(&got), h, "{what}: bytes");
                }
                let mut copy = vec![0u8; got.len()];
                reader.component_into(name, role, &mut copy).unwrap();
                assert_eq!(copy, got.to_vec(), "{what}: copy");
                if c.encoding == Encoding::Raw {
                    assert_eq!(
                        reader.stored(name, role).unwrap().as_slice(),
                        got.as_slice()
                    );
                }
                parts_checked += 1;
            }
            let info = reader.info(name).unwrap();
            if obj.layout == Layout::Dense {
                let data = obj.component("data").unwrap();
                // Every registered type reads: f8_e8m0 and f4_e2m1 as their bytes.
                let interpretable = !data
                    .logical_type
                    .as_deref()
                    .is_some_and(|t| t.contains('.'));
                match reader.view(name) {
                    Ok(view) => {
                        assert!(interpretable, "{label}: {name}: viewed");
                        assert_eq!(view.zero_copy, data.encoding == Encoding::Raw);
                        assert_eq!(view.dtype, info.dtype);
                        let packed = data.logical_type.as_deref() == Some("f4_e2m1");
                        let want = if packed {
                            vec![data.decoded_length()]
                        } else {
                            obj.shape.dims().to_vec()
                        };
                        assert_eq!(view.shape.dims(), want, "{label}: {name}");
                        assert_eq!(
                            view.bytes.len() as u64,
                            view.shape.byte_len(view.dtype).unwrap()
                        );
                        let mut buf = vec![0u8; view.bytes.len()];
                        reader.read_into(name, &mut buf).unwrap();
                        assert_eq!(buf, view.bytes.to_vec());
                    }
                    Err(e) => {
                        assert!(!interpretable, "{label}: {name}: {e}");
                        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
                    }
                }
            } else if let Some(ty) = layout_id(&obj.layout)
                .strip_prefix("gguf.")
                .and_then(|t| t.strip_suffix("/1"))
            {
                // ztensor 2's GGUF objects: listed and viewed as the GGUF reader gives
                // them, rows of blocks with the type and logical shape as attributes.
                let view = reader.view(name).unwrap_or_else(|e| panic!("{label}: {e}"));
                let data = reader.component(name, "data").unwrap();
                assert_eq!(view.bytes.as_slice(), data.as_slice(), "{label}: {name}");
                assert_eq!(info.layout, Layout::Dense);
                assert_eq!(
                    info.source_layout_name(),
                    Some(&*format!("gguf:{}", ty.to_uppercase()))
                );
                let (lead, last) = (&shape[..shape.len() - 1], shape[shape.len() - 1]);
                let row_bytes = view.shape.dims().last().copied().unwrap();
                assert_eq!(&view.shape.dims()[..lead.len()], lead, "{label}: {name}");
                assert_eq!(row_bytes * lead.iter().product::<u64>(), data.len() as u64);
                assert!(last > 0 && row_bytes > 0, "{label}: {name}");
            } else {
                assert!(matches!(reader.view(name), Err(Error::Unsupported { .. })));
            }
        }
        assert_eq!(
            reader
                .verify()
                .unwrap_or_else(|e| panic!("{label}: verify: {e}")),
            digests,
            "{label}"
        );
    }
    assert!(parts_checked >= 60, "only {parts_checked} parts checked");
}

#[test]
fn v2_dtypes_map_to_tensorwire_dtypes() {
    let reader = ZtReader::open(fixture_dir().join("dtypes.zt")).unwrap();
    let dtype = |n: &str| reader.info(n).unwrap().dtype;
    assert_eq!(dtype("mask"), DType::Bool);
    assert_eq!(dtype("bf16"), DType::BF16);
    assert_eq!(dtype("c64"), DType::Complex64);
    assert_eq!(dtype("c128"), DType::Complex128);
    assert_eq!(dtype("f8_e4m3fn"), DType::F8E4M3Fn);
    assert_eq!(dtype("f8_e5m2fnuz"), DType::F8E5M2Fnuz);
    // No tensorwire dtype: reported as their u8 storage and read as their bytes,
    // f8_e8m0 with the tensor's shape, f4_e2m1 (two per byte) flat.
    assert_eq!(dtype("f8_e8m0"), DType::U8);
    assert_eq!(reader.byte_type("f8_e8m0").unwrap(), Some(ByteType::F8E8M0));
    assert_eq!(reader.byte_type("f4_e2m1").unwrap(), Some(ByteType::F4E2M1));
    assert_eq!(reader.byte_type("c64").unwrap(), None);
    let e8m0 = reader.view("f8_e8m0").unwrap();
    assert_eq!(e8m0.shape, reader.info("f8_e8m0").unwrap().shape);
    assert!(e8m0.zero_copy);
    let f4 = reader.view("f4_e2m1").unwrap();
    // Listed as its bytes; the object keeps the logical shape.
    let numel = reader.object("f4_e2m1").unwrap().shape.numel().unwrap();
    assert_eq!(f4.shape.dims(), &[numel.div_ceil(2)]);
    assert_eq!(f4.shape, reader.info("f4_e2m1").unwrap().shape);
    assert_eq!(
        f4.bytes.as_slice(),
        reader.component("f4_e2m1", "data").unwrap().as_slice()
    );
    let c64 = reader.view("c64").unwrap();
    assert_eq!(c64.shape.dims(), &[3, 2]);
    assert_eq!(c64.bytes.len(), 6 * 8);
    let mask = reader.view("mask").unwrap();
    assert_eq!(mask.bytes.as_slice(), &[1, 0, 1, 0, 0, 1]);
    // Objects of a shared blob point at the same bytes.
    let edge = ZtReader::open(fixture_dir().join("edge.zt")).unwrap();
    assert_eq!(
        edge.object("a").unwrap().components[0].offset,
        edge.object("b").unwrap().components[0].offset
    );
    assert_eq!(edge.view("scalar").unwrap().shape.dims(), &[] as &[u64]);
    // CSR keeps its v2 meaning; the rest stays structural.
    let layouts = ZtReader::open(fixture_dir().join("layouts.zt")).unwrap();
    assert_eq!(layouts.info("csr").unwrap().layout, Layout::SparseCsr);
    assert_eq!(
        layouts.info("q").unwrap().layout,
        Layout::Other("zt.quant_group/1".into())
    );
    assert_eq!(
        layouts.info("q").unwrap().encoding.as_deref(),
        Some("zt.zstd-seekable/1")
    );
}

/// Rewrites every fixture ztensor wrote in one pass with our writer, in ztensor's write
/// order and with its options, and expects the very same bytes.
#[test]
fn rewriting_a_v2_fixture_reproduces_ztensors_bytes() {
    let mut compared = Vec::new();
    for (path, expected) in fixtures() {
        if expected["byte_identical"] != Json::Bool(true) {
            continue;
        }
        let label = path.display().to_string();
        let reader = ZtReader::open(&path).unwrap();
        let mut w = ZtWriter::with_version(Vec::new(), ZtVersion::V2).unwrap();
        w.set_alignment(expected["align"].as_u64().unwrap())
            .unwrap();
        w.set_attributes(reader.attributes().clone()).unwrap();
        for name in expected["write_order"].as_array().unwrap() {
            let name = name.as_str().unwrap();
            let obj = reader.object(name).unwrap();
            let compression = match obj.components[0].encoding {
                Encoding::Raw => Compression::Raw,
                _ => Compression::Zstd(3),
            };
            w.copy_object(
                &reader,
                name,
                WriteOptions {
                    compression,
                    checksum: Checksum::Xxh3,
                },
            )
            .unwrap_or_else(|e| panic!("{label}: {name}: {e}"));
        }
        let ours = w.finish_into().unwrap();
        let theirs = std::fs::read(&path).unwrap();
        if ours != theirs {
            let first = ours.iter().zip(&theirs).position(|(a, b)| a != b);
            panic!(
                "{label}: our {} bytes differ from ztensor's {} (first at {first:?})",
                ours.len(),
                theirs.len()
            );
        }
        compared.push(path.file_name().unwrap().to_string_lossy().into_owned());
    }
    assert!(
        compared.len() >= 6,
        "only {compared:?} compared byte for byte"
    );
}

// ===== hostile input =====

fn open(data: Vec<u8>) -> Result<ZtReader, Error> {
    ZtReader::from_bytes(Bytes::from_vec(data))
}

fn open_with(data: Vec<u8>, limits: &Limits) -> Result<ZtReader, Error> {
    ZtReader::from_bytes_with(Bytes::from_vec(data), limits)
}

/// A small valid file: two raw tensors and a compressed one, 4096-aligned.
fn small() -> Vec<u8> {
    let mut w = ZtWriter::with_version(Vec::new(), ZtVersion::V2).unwrap();
    w.set_alignment(4096).unwrap();
    let xxh3 = WriteOptions {
        checksum: Checksum::Xxh3,
        ..WriteOptions::default()
    };
    w.add_dense(
        "a",
        DType::F32,
        &Shape::new(vec![2]).unwrap(),
        &[0, 0, 128, 63, 0, 0, 0, 64],
        xxh3,
    )
    .unwrap();
    w.add_dense(
        "b",
        DType::U8,
        &Shape::new(vec![3]).unwrap(),
        &[1, 2, 3],
        xxh3,
    )
    .unwrap();
    let data: Vec<u8> = (0..3000u32).flat_map(|i| (i % 7).to_le_bytes()).collect();
    w.add_dense(
        "z",
        DType::U32,
        &Shape::new(vec![3000]).unwrap(),
        &data,
        WriteOptions {
            compression: Compression::Zstd(3),
            checksum: Checksum::Xxh3,
        },
    )
    .unwrap();
    w.finish_into().unwrap()
}

/// Footer fields of a file.
fn footer(file: &[u8]) -> (u64, u64) {
    let f = &file[file.len() - 40..];
    (
        u64::from_le_bytes(f[0..8].try_into().unwrap()),
        u64::from_le_bytes(f[8..16].try_into().unwrap()),
    )
}

/// Minimal deterministic CBOR for test manifests: a JSON-like tree.
#[derive(Clone)]
enum C {
    U(u64),
    T(&'static str),
    S(String),
    A(Vec<C>),
    M(Vec<(&'static str, C)>),
    Raw(Vec<u8>),
}

fn head(major: u8, n: u64, out: &mut Vec<u8>) {
    let m = major << 5;
    match n {
        0..=23 => out.push(m | n as u8),
        24..=0xff => out.extend_from_slice(&[m | 24, n as u8]),
        0x100..=0xffff => {
            out.push(m | 25);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(m | 26);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
        _ => {
            out.push(m | 27);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
}

fn enc(c: &C, out: &mut Vec<u8>) {
    match c {
        C::U(n) => head(0, *n, out),
        C::T(s) => {
            head(3, s.len() as u64, out);
            out.extend_from_slice(s.as_bytes());
        }
        C::S(s) => {
            head(3, s.len() as u64, out);
            out.extend_from_slice(s.as_bytes());
        }
        C::A(items) => {
            head(4, items.len() as u64, out);
            items.iter().for_each(|i| enc(i, out));
        }
        C::M(entries) => {
            let mut e: Vec<(Vec<u8>, Vec<u8>)> = entries
                .iter()
                .map(|(k, v)| {
                    let (mut kb, mut vb) = (Vec::new(), Vec::new());
                    enc(&C::T(k), &mut kb);
                    enc(v, &mut vb);
                    (kb, vb)
                })
                .collect();
            e.sort();
            head(5, e.len() as u64, out);
            for (k, v) in e {
                out.extend_from_slice(&k);
                out.extend_from_slice(&v);
            }
        }
        C::Raw(b) => out.extend_from_slice(b),
    }
}

fn cbor(c: &C) -> Vec<u8> {
    let mut out = Vec::new();
    enc(c, &mut out);
    out
}

fn blob(offset: u64, length: u64) -> C {
    C::A(vec![C::U(offset), C::U(length)])
}

fn part(dtype: &'static str, offset: u64, length: u64) -> Vec<(&'static str, C)> {
    vec![("dtype", C::T(dtype)), ("blob", blob(offset, length))]
}

fn object(
    shape: &[u64],
    layout: &'static str,
    parts: Vec<(&'static str, Vec<(&'static str, C)>)>,
) -> C {
    C::M(vec![
        ("shape", C::A(shape.iter().map(|&d| C::U(d)).collect())),
        ("layout", C::T(layout)),
        (
            "parts",
            C::M(parts.into_iter().map(|(k, v)| (k, C::M(v))).collect()),
        ),
    ])
}

fn dense(shape: &[u64], p: Vec<(&'static str, C)>) -> C {
    object(shape, "dense", vec![("data", p)])
}

fn objects(list: Vec<(&'static str, C)>) -> C {
    C::M(vec![("objects", C::M(list))])
}

/// A file with `heap` placed at 4096 (blobs), then the manifest bytes at the next
/// multiple of 4096, and a correct footer.
fn image_raw(heap: &[u8], manifest: &[u8]) -> Vec<u8> {
    let mut out = MAGIC_V2.to_vec();
    out.resize(4096, 0);
    out.extend_from_slice(heap);
    let at = (out.len() as u64).div_ceil(4096) * 4096;
    out.resize(at as usize, 0);
    out.extend_from_slice(manifest);
    out.extend_from_slice(&at.to_le_bytes());
    out.extend_from_slice(&(manifest.len() as u64).to_le_bytes());
    out.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(manifest).to_le_bytes());
    out.extend_from_slice(&2u32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(MAGIC_V2);
    out
}

fn image(heap: &[u8], manifest: &C) -> Vec<u8> {
    image_raw(heap, &cbor(manifest))
}

/// The heap for most hand-made files: 8 bytes of f32 [1, 2] at 4096.
fn heap8() -> Vec<u8> {
    [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn err_of(data: Vec<u8>) -> Error {
    match open(data) {
        Ok(_) => panic!("opened"),
        Err(e) => e,
    }
}

#[test]
fn hand_made_baseline_opens() {
    let r = open(image(
        &heap8(),
        &objects(vec![("w", dense(&[2], part("f32", 4096, 8)))]),
    ))
    .unwrap();
    assert_eq!(r.view("w").unwrap().bytes.as_slice(), heap8().as_slice());
    // Unknown keys are ignored at every level (spec §3.1), as is the reserved word.
    let mut p = part("f32", 4096, 8);
    p.push((
        "zz_future",
        C::M(vec![(
            "x",
            C::A(vec![C::U(1), C::Raw(vec![0xf9, 0x3e, 0x00])]),
        )]),
    ));
    let mut o = dense(&[2], p);
    if let C::M(fields) = &mut o {
        fields.push(("note", C::T("hi")));
    }
    let mut file = image(
        &heap8(),
        &C::M(vec![
            ("objects", C::M(vec![("w", o)])),
            ("version", C::U(9)),
        ]),
    );
    let n = file.len();
    file[n - 12] = 0xee;
    open(file).unwrap();
    // The small writer-made file opens and verifies.
    let r = open(small()).unwrap();
    assert_eq!(r.verify().unwrap(), 3);
}

#[test]
fn every_truncation_is_a_typed_error() {
    let file = small();
    for cut in 0..file.len() {
        let e = err_of(file[..cut].to_vec());
        assert!(
            matches!(
                e,
                Error::Truncated { .. }
                    | Error::BadMagic { .. }
                    | Error::OutOfBounds { .. }
                    | Error::UnknownFormat { .. }
            ),
            "cut {cut}: {e}"
        );
    }
    // So is every single-byte corruption of the footer and of the manifest.
    let (at, len) = footer(&file);
    for i in (at as usize..at as usize + len as usize).chain(file.len() - 40..file.len()) {
        let mut bad = file.clone();
        bad[i] ^= 0x41;
        if let Ok(r) = open(bad) {
            // Only the reserved footer word may change unnoticed.
            assert!(
                (file.len() - 12..file.len() - 8).contains(&i),
                "byte {i} flipped and still opened"
            );
            assert_eq!(r.verify().unwrap(), 3);
        }
    }
}

#[test]
fn footer_errors() {
    let good = small();
    let n = good.len();
    let mut bad = good.clone();
    bad[n - 1] = 0;
    assert!(matches!(err_of(bad), Error::BadMagic { offset, .. } if offset == n as u64 - 8));
    let mut bad = good.clone();
    bad[n - 16] = 3;
    assert!(matches!(err_of(bad), Error::Unsupported { .. }));
    // A data shard: no manifest.
    let mut shard = good.clone();
    shard[n - 40..n - 16].fill(0);
    assert!(matches!(err_of(shard), Error::Unsupported { .. }));
    let mut half = good.clone();
    half[n - 32..n - 24].fill(0);
    assert!(matches!(err_of(half), Error::Malformed { .. }));
    // Manifest hash.
    let mut bad = good.clone();
    bad[n - 24] ^= 1;
    assert!(
        matches!(err_of(bad), Error::DigestMismatch { ref tensor, .. } if tensor == "<manifest>")
    );
    // Manifest bounds, alignment and size.
    let (at, len) = footer(&good);
    let put = |offset: u64, length: u64| {
        let mut f = good.clone();
        f[n - 40..n - 32].copy_from_slice(&offset.to_le_bytes());
        f[n - 32..n - 24].copy_from_slice(&length.to_le_bytes());
        f
    };
    assert!(matches!(err_of(put(at + 1, len)), Error::Misaligned { .. }));
    assert!(matches!(err_of(put(0, len)), Error::OutOfBounds { .. }));
    assert!(matches!(
        err_of(put(at, len + 41)),
        Error::OutOfBounds { .. }
    ));
    assert!(matches!(
        err_of(put(at, u64::MAX)),
        Error::LimitExceeded { .. }
    ));
    assert!(matches!(
        err_of(put(u64::MAX - 4095, len)),
        Error::OutOfBounds { .. }
    ));
    let tight = Limits {
        max_metadata_bytes: len - 1,
        ..Limits::default()
    };
    assert!(matches!(
        open_with(good.clone(), &tight),
        Err(Error::LimitExceeded { .. })
    ));
    // Too short, and another format's magic.
    assert!(matches!(err_of(MAGIC_V2.to_vec()), Error::Truncated { .. }));
    let mut other = good;
    other[3] = b'3';
    assert!(matches!(err_of(other), Error::BadMagic { offset: 0, .. }));
}

#[test]
fn blobs_out_of_range_misaligned_or_overlapping() {
    let heap = vec![0u8; 8192];
    let one = |offset, length| {
        objects(vec![(
            "w",
            dense(&[length / 4], part("f32", offset, length)),
        )])
    };
    assert!(matches!(
        err_of(image(&heap, &one(4096 * 4, 8))),
        Error::OutOfBounds { .. }
    ));
    assert!(matches!(
        err_of(image(&heap, &one(0, 8))),
        Error::OutOfBounds { .. }
    ));
    assert!(matches!(
        err_of(image(&heap, &one(4100, 8))),
        Error::Misaligned { offset: 4100, .. }
    ));
    assert!(matches!(
        err_of(image(&heap, &one(u64::MAX - 4095, 8))),
        Error::OutOfBounds { .. }
    ));
    // Into the manifest blob.
    assert!(matches!(
        err_of(image(&heap, &one(4096, 8192 + 8))),
        Error::Overlap { .. } | Error::OutOfBounds { .. }
    ));
    // Partial overlap of two parts is refused; identical references are weight tying.
    let two = |b: u64| {
        objects(vec![
            ("a", dense(&[4], part("f32", 4096, 16))),
            ("b", dense(&[2], part("f32", b, 8))),
        ])
    };
    assert!(matches!(
        err_of(image(&heap, &two(4096))),
        Error::Overlap { .. } | Error::SizeMismatch { .. }
    ));
    let tied = objects(vec![
        ("a", dense(&[2], part("f32", 4096, 8))),
        ("b", dense(&[2], part("f32", 4096, 8))),
    ]);
    let r = open(image(&heap8(), &tied)).unwrap();
    assert_eq!(
        r.view("a").unwrap().bytes.as_slice(),
        r.view("b").unwrap().bytes.as_slice()
    );
    let partial = objects(vec![
        ("a", dense(&[4], part("f32", 4096, 16))),
        (
            "b",
            object(&[2], "acme.x/1", vec![("p", part("u8", 4096, 8))]),
        ),
    ]);
    assert!(matches!(
        err_of(image(&heap, &partial)),
        Error::Overlap { .. }
    ));
    // Zero-length blobs are exempt from the overlap rule, not from alignment.
    let empty = objects(vec![
        ("a", dense(&[2], part("f32", 4096, 8))),
        ("e", dense(&[0], part("f32", 4096, 0))),
    ]);
    open(image(&heap8(), &empty)).unwrap();
}

#[test]
fn sizes_dtypes_and_layout_rules() {
    let file = |o: C| image(&heap8(), &objects(vec![("w", o)]));
    assert!(matches!(
        err_of(file(dense(&[3], part("f32", 4096, 8)))),
        Error::SizeMismatch { .. }
    ));
    assert!(matches!(
        err_of(file(dense(&[2], part("float32", 4096, 8)))),
        Error::UnknownDType { .. }
    ));
    assert!(matches!(
        err_of(file(dense(&[8], part("bool", 4096, 8)))),
        Error::UnknownDType { .. }
    ));
    let mut typed = part("u16", 4096, 8);
    typed.push(("type", C::T("bool")));
    assert!(matches!(
        err_of(file(dense(&[4], typed))),
        Error::Malformed { .. }
    ));
    // Unregistered logical types stay structural: no size rule, no view.
    let mut weird = part("u8", 4096, 8);
    weird.push(("type", C::T("acme.fp5")));
    let r = open(file(dense(&[3], weird))).unwrap();
    assert!(matches!(r.view("w"), Err(Error::Unsupported { .. })));
    assert_eq!(r.component("w", "data").unwrap().len(), 8);
    // Dense needs exactly one part named data.
    assert!(matches!(
        err_of(file(object(
            &[2],
            "dense",
            vec![("x", part("f32", 4096, 8))]
        ))),
        Error::Malformed { .. }
    ));
    assert!(matches!(
        err_of(file(object(&[2], "dense", vec![]))),
        Error::Malformed { .. }
    ));
    // CSR rules.
    let csr = |indptr_len: u64| {
        object(
            &[1, 4],
            "zt.sparse_csr/1",
            vec![
                ("values", part("f32", 4096, 4)),
                ("indices", part("u32", 8192, 4)),
                ("indptr", part("u32", 12288, indptr_len)),
            ],
        )
    };
    let heap = vec![0u8; 12288];
    open(image(&heap, &objects(vec![("w", csr(8))]))).unwrap();
    assert!(matches!(
        err_of(image(&heap, &objects(vec![("w", csr(12))]))),
        Error::Malformed { .. }
    ));
    // Shape rank and product.
    assert!(matches!(
        err_of(file(dense(&[1; 65], part("f32", 4096, 4)))),
        Error::LimitExceeded { .. }
    ));
    assert!(matches!(
        err_of(file(dense(&[u64::MAX, 3], part("f32", 4096, 8)))),
        Error::Overflow { .. }
    ));
    // Encodings, shards, digests.
    let mut p = part("f32", 4096, 8);
    p.push(("encoding", C::T("zt.lz4/1")));
    p.push(("decoded_length", C::U(8)));
    assert!(matches!(
        err_of(file(dense(&[2], p))),
        Error::Unsupported { .. }
    ));
    let mut p = part("f32", 4096, 8);
    p.push(("encoding", C::T("zt.zstd-seekable/1")));
    assert!(matches!(
        err_of(file(dense(&[2], p))),
        Error::Malformed { .. }
    ));
    let mut p = part("f32", 4096, 8);
    p.push(("decoded_length", C::U(8)));
    assert!(matches!(
        err_of(file(dense(&[2], p))),
        Error::Malformed { .. }
    ));
    let mut p = part("f32", 4096, 8);
    p.push(("shard", C::T("00001")));
    assert!(matches!(
        err_of(file(dense(&[2], p))),
        Error::Unsupported { .. }
    ));
    let sharded = C::M(vec![
        ("objects", C::M(vec![])),
        (
            "shards",
            C::M(vec![(
                "00001",
                C::M(vec![
                    ("size", C::U(48)),
                    ("digest", C::T("xxh3:0000000000000000")),
                ]),
            )]),
        ),
    ]);
    assert!(matches!(
        err_of(image(&heap8(), &sharded)),
        Error::Unsupported { .. }
    ));
    for (digest, unsupported) in [
        ("xxh3:ABCDEF0123456789", false),
        ("md5:00", true),
        ("xxh3:1", false),
        ("nope", false),
    ] {
        let mut p = part("f32", 4096, 8);
        p.push(("digest", C::S(digest.into())));
        let e = err_of(file(dense(&[2], p)));
        assert_eq!(
            matches!(e, Error::Unsupported { .. }),
            unsupported,
            "{digest}: {e}"
        );
        assert!(
            matches!(e, Error::Unsupported { .. } | Error::Malformed { .. }),
            "{digest}: {e}"
        );
    }
    // Blob arrays of the wrong length.
    let p = vec![
        ("dtype", C::T("f32")),
        ("blob", C::A(vec![C::U(4096), C::U(8), C::U(0)])),
    ];
    assert!(matches!(
        err_of(file(dense(&[2], p))),
        Error::Malformed { .. }
    ));
    // Names.
    for bad in ["", "a\0b"] {
        let m = C::M(vec![("objects", C::M(vec![]))]);
        let mut bytes = cbor(&m);
        // Replace the empty objects map by one entry with a bad name.
        bytes.truncate(bytes.len() - 1);
        let mut entry = vec![0xa1];
        enc(&C::S(bad.into()), &mut entry);
        enc(&dense(&[2], part("f32", 4096, 8)), &mut entry);
        bytes.extend_from_slice(&entry);
        assert!(
            matches!(err_of(image_raw(&heap8(), &bytes)), Error::Malformed { .. }),
            "{bad:?}"
        );
    }
    let long: &'static str = Box::leak("n".repeat(1025).into_boxed_str());
    assert!(matches!(
        err_of(image(
            &heap8(),
            &objects(vec![(long, dense(&[2], part("f32", 4096, 8)))])
        )),
        Error::LimitExceeded { .. }
    ));
}

#[test]
fn non_deterministic_or_bad_cbor_is_malformed() {
    let good = cbor(&objects(vec![("w", dense(&[2], part("f32", 4096, 8)))]));
    open(image_raw(&heap8(), &good)).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("not a map", vec![0x80]),
        ("indefinite map", {
            let mut b = vec![0xbf];
            b.extend_from_slice(&good[1..]);
            b.push(0xff);
            b
        }),
        ("non-shortest count", {
            let mut b = vec![0xb8, 0x01];
            b.extend_from_slice(&good[1..]);
            b
        }),
        ("trailing byte", {
            let mut b = good.clone();
            b.push(0x00);
            b
        }),
        ("truncated", good[..good.len() - 3].to_vec()),
        (
            "huge map count",
            vec![0xbb, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        ),
        (
            "huge array count",
            cbor(&C::M(vec![(
                "objects",
                C::M(vec![(
                    "w",
                    C::M(vec![("shape", C::Raw(vec![0x9b, 0, 0, 0, 1, 0, 0, 0, 0]))]),
                )]),
            )])),
        ),
        (
            "no objects",
            cbor(&C::M(vec![("attributes", C::M(vec![]))])),
        ),
        (
            "tag",
            cbor(&C::M(vec![("objects", C::Raw(vec![0xc0, 0xa0]))])),
        ),
        ("unsorted keys", {
            // {"objects": {}, "attributes": {}} with the longer key first.
            let mut b = vec![0xa2];
            enc(&C::T("attributes"), &mut b);
            b.push(0xa0);
            enc(&C::T("objects"), &mut b);
            b.push(0xa0);
            b
        }),
        ("repeated key", {
            let mut b = vec![0xa2];
            for _ in 0..2 {
                enc(&C::T("objects"), &mut b);
                b.push(0xa0);
            }
            b
        }),
        (
            "float not shortest",
            cbor(&C::M(vec![
                (
                    "attributes",
                    C::M(vec![(
                        "x",
                        C::Raw(vec![0xfb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0]),
                    )]),
                ),
                ("objects", C::M(vec![])),
            ])),
        ),
        (
            "NaN payload",
            cbor(&C::M(vec![
                (
                    "attributes",
                    C::M(vec![("x", C::Raw(vec![0xf9, 0x7e, 0x01]))]),
                ),
                ("objects", C::M(vec![])),
            ])),
        ),
        (
            "undefined",
            cbor(&C::M(vec![
                ("zz", C::Raw(vec![0xf7])),
                ("objects", C::M(vec![])),
            ])),
        ),
        (
            "bad UTF-8 key",
            cbor(&C::M(vec![
                ("objects", C::M(vec![])),
                ("z", C::Raw(vec![0xa1, 0x61, 0xff, 0x00])),
            ])),
        ),
        ("too deep", {
            let mut v = C::U(1);
            for _ in 0..40 {
                v = C::A(vec![v]);
            }
            cbor(&C::M(vec![
                ("attributes", C::M(vec![("x", v)])),
                ("objects", C::M(vec![])),
            ]))
        }),
    ];
    for (why, bytes) in cases {
        let e = err_of(image_raw(&heap8(), &bytes));
        assert!(matches!(e, Error::Malformed { .. }), "{why}: {e}");
    }
    // Attribute keys must obey the name rules; nested maps need text keys to be kept.
    let nested = cbor(&C::M(vec![
        (
            "attributes",
            C::M(vec![("x", C::Raw(vec![0xa1, 0x01, 0x02]))]),
        ),
        ("objects", C::M(vec![])),
    ]));
    assert!(matches!(
        err_of(image_raw(&heap8(), &nested)),
        Error::Unsupported { .. }
    ));
    // Objects above the limit.
    let many = objects(
        (0..3)
            .map(|i| (["a", "b", "c"][i], dense(&[0], part("u8", 4096, 0))))
            .collect(),
    );
    let limits = Limits {
        max_tensors: 2,
        ..Limits::default()
    };
    assert!(matches!(
        open_with(image(&heap8(), &many), &limits),
        Err(Error::LimitExceeded { .. })
    ));
}

/// A compressed part with its stored bytes replaced by `stored` (the manifest says
/// `decoded` bytes), at 4096.
fn seekable_file(stored: &[u8], decoded: u64) -> Vec<u8> {
    let mut p = part("u8", 4096, stored.len() as u64);
    p.push(("encoding", C::T("zt.zstd-seekable/1")));
    p.push(("decoded_length", C::U(decoded)));
    image(stored, &objects(vec![("w", dense(&[decoded], p))]))
}

fn seek_table(frames: &[(u32, u32)], descriptor: u8) -> Vec<u8> {
    let mut t = 0x184D_2A5Eu32.to_le_bytes().to_vec();
    t.extend_from_slice(&(frames.len() as u32 * 8 + 9).to_le_bytes());
    for (c, d) in frames {
        t.extend_from_slice(&c.to_le_bytes());
        t.extend_from_slice(&d.to_le_bytes());
    }
    t.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    t.push(descriptor);
    t.extend_from_slice(&0x8F92_EAB1u32.to_le_bytes());
    t
}

fn read_err(file: Vec<u8>) -> Error {
    let r = open(file).expect("opens: structure is fine");
    let e = r.view("w").expect_err("read");
    let mut buf = vec![0u8; r.object("w").unwrap().components[0].decoded_length() as usize];
    assert!(r.component_into("w", "data", &mut buf).is_err());
    assert!(r.verify().is_err());
    e
}

#[test]
fn seekable_streams_that_lie() {
    let frame = zstd::bulk::compress(&[7u8; 100], 3).unwrap();
    let mut ok = frame.clone();
    ok.extend_from_slice(&seek_table(&[(frame.len() as u32, 100)], 0));
    let r = open(seekable_file(&ok, 100)).unwrap();
    assert_eq!(r.view("w").unwrap().bytes.as_slice(), &[7u8; 100]);
    assert_eq!(r.verify().unwrap(), 0);
    // The manifest says more (or fewer) bytes than the table.
    assert!(matches!(
        read_err(seekable_file(&ok, 101)),
        Error::Decode { .. }
    ));
    assert!(matches!(
        read_err(seekable_file(&ok, 99)),
        Error::Decode { .. }
    ));
    // A bomb: the frame inflates to 1 MiB but the table (and manifest) say 100.
    let bomb = zstd::bulk::compress(&vec![0u8; 1 << 20], 3).unwrap();
    let mut b = bomb.clone();
    b.extend_from_slice(&seek_table(&[(bomb.len() as u32, 100)], 0));
    assert!(matches!(
        read_err(seekable_file(&b, 100)),
        Error::Decode { .. }
    ));
    // A frame shorter than the table says.
    let mut short = frame.clone();
    short.extend_from_slice(&seek_table(&[(frame.len() as u32, 200)], 0));
    assert!(matches!(
        read_err(seekable_file(&short, 200)),
        Error::Decode { .. }
    ));
    // Table framing.
    let mut bad = ok.clone();
    let n = bad.len();
    bad[n - 1] ^= 1;
    assert!(matches!(
        read_err(seekable_file(&bad, 100)),
        Error::Decode { .. }
    ));
    let mut reserved = frame.clone();
    reserved.extend_from_slice(&seek_table(&[(frame.len() as u32, 100)], 0x01));
    assert!(matches!(
        read_err(seekable_file(&reserved, 100)),
        Error::Decode { .. }
    ));
    let mut huge = frame.clone();
    let mut t = seek_table(&[(frame.len() as u32, 100)], 0);
    let tn = t.len();
    t[tn - 9..tn - 5].copy_from_slice(&u32::MAX.to_le_bytes());
    huge.extend_from_slice(&t);
    assert!(matches!(
        read_err(seekable_file(&huge, 100)),
        Error::Decode { .. }
    ));
    assert!(matches!(
        read_err(seekable_file(&[0u8; 5], 0)),
        Error::Decode { .. }
    ));
    // Frames that do not tile the stream, unequal non-final frames, a frame over 16 MiB.
    let mut gap = frame.clone();
    gap.push(0);
    gap.extend_from_slice(&seek_table(&[(frame.len() as u32, 100)], 0));
    assert!(matches!(
        read_err(seekable_file(&gap, 100)),
        Error::Decode { .. }
    ));
    let f50 = zstd::bulk::compress(&[7u8; 50], 3).unwrap();
    let mut unequal = f50.clone();
    unequal.extend_from_slice(&frame);
    unequal.extend_from_slice(&f50);
    unequal.extend_from_slice(&seek_table(
        &[
            (f50.len() as u32, 50),
            (frame.len() as u32, 100),
            (f50.len() as u32, 50),
        ],
        0,
    ));
    assert!(matches!(
        read_err(seekable_file(&unequal, 200)),
        Error::Decode { .. }
    ));
    let mut big = frame.clone();
    big.extend_from_slice(&seek_table(&[(frame.len() as u32, (16 << 20) + 1)], 0));
    assert!(matches!(
        read_err(seekable_file(&big, (16 << 20) + 1)),
        Error::Decode { .. }
    ));
    // Garbage in place of a frame.
    let mut junk = vec![0x55u8; frame.len()];
    junk.extend_from_slice(&seek_table(&[(frame.len() as u32, 100)], 0));
    assert!(matches!(
        read_err(seekable_file(&junk, 100)),
        Error::Decode { .. }
    ));
    // The optional checksum column is checked.
    let sum = xxhash_rust::xxh64::xxh64(&[7u8; 100], 0) as u32;
    let table = |s: u32| {
        let mut t = 0x184D_2A5Eu32.to_le_bytes().to_vec();
        t.extend_from_slice(&21u32.to_le_bytes());
        for v in [frame.len() as u32, 100, s, 1] {
            t.extend_from_slice(&v.to_le_bytes());
        }
        t.push(0x80);
        t.extend_from_slice(&0x8F92_EAB1u32.to_le_bytes());
        t
    };
    let mut good = frame.clone();
    good.extend_from_slice(&table(sum));
    open(seekable_file(&good, 100)).unwrap().verify().unwrap();
    let mut wrong = frame.clone();
    wrong.extend_from_slice(&table(sum ^ 1));
    assert!(matches!(
        read_err(seekable_file(&wrong, 100)),
        Error::Decode { .. }
    ));
    // Decoded sizes above the limit are refused on open, before any allocation.
    let limits = Limits {
        max_decoded_bytes: 99,
        ..Limits::default()
    };
    assert!(matches!(
        open_with(seekable_file(&ok, 100), &limits),
        Err(Error::LimitExceeded { .. })
    ));
    let huge_claim = seekable_file(&ok, u64::MAX / 2);
    assert!(matches!(open(huge_claim), Err(Error::LimitExceeded { .. })));
}

#[test]
fn digests_and_content_rules_are_checked_on_read_and_verify() {
    // A wrong xxh3 on a raw part, and on a compressed one.
    let mut file = small();
    let (at, len) = footer(&file);
    let manifest = file[at as usize..(at + len) as usize].to_vec();
    let r = open(file.clone()).unwrap();
    let digest = r.object("a").unwrap().components[0]
        .digest
        .as_ref()
        .unwrap()
        .to_string();
    let hexpart = digest.strip_prefix("xxh3:").unwrap();
    let pos = manifest
        .windows(16)
        .position(|w| w == hexpart.as_bytes())
        .unwrap();
    let mut m2 = manifest.clone();
    m2[pos] = if m2[pos] == b'0' { b'1' } else { b'0' };
    file[at as usize..(at + len) as usize].copy_from_slice(&m2);
    let n = file.len();
    file[n - 24..n - 16].copy_from_slice(&xxhash_rust::xxh3::xxh3_64(&m2).to_le_bytes());
    let r = open(file).unwrap();
    assert!(matches!(r.view("a"), Err(Error::DigestMismatch { .. })));
    assert!(matches!(r.verify(), Err(Error::DigestMismatch { .. })));
    assert!(r.view("b").is_ok());
    // Corrupt the compressed part's data: its frame checksum (or the digest) fails.
    let mut file = small();
    let r = open(file.clone()).unwrap();
    let z = r.object("z").unwrap().components[0].clone();
    file[z.offset as usize + 20] ^= 0xff;
    let r = open(file).unwrap();
    assert!(r.view("z").is_err());
    assert!(r.verify().is_err());
    // bool bytes must be 0 or 1 when decoded as a tensor or verified, not for raw reads.
    let mut p = part("u8", 4096, 8);
    p.push(("type", C::T("bool")));
    let r = open(image(
        &[0, 1, 1, 0, 2, 0, 1, 1],
        &objects(vec![("m", dense(&[8], p))]),
    ))
    .unwrap();
    assert!(matches!(r.view("m"), Err(Error::Decode { .. })));
    assert!(matches!(r.verify(), Err(Error::Decode { .. })));
    let mut buf = [0u8; 8];
    assert!(r.read_into("m", &mut buf).is_err());
    assert_eq!(r.component("m", "data").unwrap().len(), 8);
    // An odd f4_e2m1 count leaves the last high nibble zero.
    let mut p = part("u8", 4096, 2);
    p.push(("type", C::T("f4_e2m1")));
    let r = open(image(&[0x21, 0x13], &objects(vec![("q", dense(&[3], p))]))).unwrap();
    assert!(matches!(r.verify(), Err(Error::Decode { .. })));
    assert!(matches!(r.view("q"), Err(Error::Decode { .. })));
    assert!(r.read_into("q", &mut buf[..2]).is_err());
    assert_eq!(r.component("q", "data").unwrap().as_slice(), &[0x21, 0x13]);
}

// ===== writer =====

fn all_options() -> Vec<WriteOptions> {
    let mut out = Vec::new();
    for compression in [Compression::Raw, Compression::Zstd(3), Compression::Zstd(1)] {
        for checksum in [Checksum::None, Checksum::Xxh3, Checksum::Sha256] {
            out.push(WriteOptions {
                compression,
                checksum,
            });
        }
    }
    out
}

#[test]
fn writer_round_trips_every_dtype_encoding_and_digest() {
    for options in all_options() {
        let mut w = ZtWriter::with_version(Vec::new(), ZtVersion::V2).unwrap();
        let mut expected = Vec::new();
        for (i, dtype) in DType::ALL.into_iter().enumerate() {
            let shape = Shape::new(vec![2, 3]).unwrap();
            let n = shape.byte_len(dtype).unwrap() as usize;
            let data: Vec<u8> = (0..n)
                .map(|j| {
                    if dtype == DType::Bool {
                        (j % 2) as u8
                    } else {
                        (i * 31 + j) as u8
                    }
                })
                .collect();
            let name = format!("t{i:02}_{dtype}");
            let r = w.add_dense(&name, dtype, &shape, &data, options);
            if matches!(
                dtype,
                DType::QInt8 | DType::QUInt8 | DType::QInt4 | DType::QUInt4
            ) {
                assert!(r.is_err(), "{dtype}");
                continue;
            }
            r.unwrap();
            expected.push((name, dtype, data));
        }
        let big: Vec<u8> = (0..(5u32 << 18))
            .flat_map(|i| (i / 3).to_le_bytes())
            .collect();
        w.add_dense(
            "zz_big",
            DType::U32,
            &Shape::new(vec![5 << 18]).unwrap(),
            &big,
            options,
        )
        .unwrap();
        expected.push(("zz_big".into(), DType::U32, big));
        let file = w.finish_into().unwrap();
        let r = open(file).unwrap();
        for (name, dtype, data) in &expected {
            let v = r
                .view(name)
                .unwrap_or_else(|e| panic!("{options:?} {name}: {e}"));
            assert_eq!(v.dtype, *dtype, "{name}");
            assert_eq!(v.bytes.as_slice(), data.as_slice(), "{options:?} {name}");
            let c = &r.object(name).unwrap().components[0];
            assert_eq!(
                c.encoding == Encoding::ZstdSeekable,
                options.compression != Compression::Raw
            );
            assert_eq!(
                c.digest.as_ref().map(Digest::checksum),
                (options.checksum != Checksum::None).then_some(options.checksum)
            );
            if *dtype == DType::Bool {
                assert_eq!(
                    (c.dtype, c.logical_type.as_deref()),
                    (DType::U8, Some("bool"))
                );
            }
        }
        let digests = if options.checksum == Checksum::None {
            0
        } else {
            expected.len()
        };
        assert_eq!(r.verify().unwrap(), digests, "{options:?}");
    }
}

#[test]
fn writer_refuses_what_the_reader_refuses() {
    let mut w = ZtWriter::with_version(Vec::new(), ZtVersion::V2).unwrap();
    let s = |d: &[u64]| Shape::new(d.to_vec()).unwrap();
    let opts = WriteOptions::default();
    assert!(w.add_dense("", DType::U8, &s(&[1]), &[1], opts).is_err());
    assert!(w.add_dense("a\0", DType::U8, &s(&[1]), &[1], opts).is_err());
    assert!(w
        .add_dense(&"n".repeat(1025), DType::U8, &s(&[1]), &[1], opts)
        .is_err());
    assert!(w.add_dense("x", DType::U8, &s(&[2]), &[1], opts).is_err());
    let crc = WriteOptions {
        checksum: Checksum::Crc32c,
        ..opts
    };
    assert!(matches!(
        w.add_dense("x", DType::U8, &s(&[1]), &[1], crc),
        Err(Error::Unsupported { .. })
    ));
    let c = |role, dtype, logical, data| ComponentData {
        role,
        dtype,
        logical_type: logical,
        data,
    };
    // bool type on a u16, a repeated part, dense with two parts, a bad CSR (signed
    // indices with a negative one: non-negative ones are written as unsigned).
    assert!(w
        .add_object(
            "x",
            &s(&[1]),
            Layout::Dense,
            None,
            &[c("data", DType::U16, Some("bool"), &[0, 0])],
            opts
        )
        .is_err());
    assert!(w
        .add_object(
            "x",
            &s(&[1]),
            Layout::Other("acme/1".into()),
            None,
            &[c("p", DType::U8, None, &[0]), c("p", DType::U8, None, &[0])],
            opts
        )
        .is_err());
    assert!(w
        .add_object(
            "x",
            &s(&[1]),
            Layout::Dense,
            None,
            &[
                c("data", DType::U8, None, &[0]),
                c("more", DType::U8, None, &[0])
            ],
            opts
        )
        .is_err());
    assert!(w
        .add_object(
            "x",
            &s(&[2, 2]),
            Layout::SparseCsr,
            None,
            &[
                c("values", DType::F32, None, &[0; 4]),
                c("indices", DType::I32, None, &[0xFF; 4]),
                c("indptr", DType::I32, None, &[0; 12])
            ],
            opts
        )
        .is_err());
    // v1 layouts with no v2 profile, and attribute keys outside the name rules.
    assert!(matches!(
        w.add_object(
            "x",
            &s(&[1]),
            Layout::QuantizedGroup,
            None,
            &[c("data", DType::U8, None, &[0])],
            opts
        ),
        Err(Error::Unsupported { .. })
    ));
    let bad_attrs: BTreeMap<String, Value> = [(String::new(), Value::Null)].into_iter().collect();
    assert!(w
        .add_object(
            "x",
            &s(&[1]),
            Layout::Dense,
            Some(bad_attrs),
            &[c("data", DType::U8, None, &[0])],
            opts
        )
        .is_err());
    // Nothing refused left a trace: the file has only what was accepted.
    w.add_dense("ok", DType::U8, &s(&[1]), &[9], opts).unwrap();
    assert!(matches!(
        w.add_dense("ok", DType::U8, &s(&[1]), &[9], opts),
        Err(Error::Duplicate { .. })
    ));
    let r = open(w.finish_into().unwrap()).unwrap();
    assert_eq!(r.objects().len(), 1);
    assert_eq!(r.view("ok").unwrap().bytes.as_slice(), &[9]);
    // Alignment rules, xxh3 in 1.x, 0.1 writing, appending to version 2.
    let mut w = ZtWriter::with_version(Vec::new(), ZtVersion::V2).unwrap();
    assert!(w.set_alignment(2048).is_err());
    assert!(w.set_alignment(12288).is_err());
    w.set_alignment(8192).unwrap();
    w.add_dense("a", DType::U8, &s(&[1]), &[1], opts).unwrap();
    assert!(w.set_alignment(4096).is_err());
    let mut v1 = ZtWriter::new(Vec::new()).unwrap();
    assert!(v1.set_alignment(4096).is_err());
    let x = WriteOptions {
        checksum: Checksum::Xxh3,
        ..opts
    };
    assert!(matches!(
        v1.add_dense("a", DType::U8, &s(&[1]), &[1], x),
        Err(Error::Unsupported { .. })
    ));
    assert!(ZtWriter::with_version(Vec::new(), ZtVersion::V0_1).is_err());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.zt");
    let mut f = ZtWriter::create_with_version(&path, ZtVersion::V2).unwrap();
    f.add_dense("a", DType::U8, &s(&[1]), &[1], opts).unwrap();
    f.finish().unwrap();
    assert!(
        matches!(ZtWriter::append(&path).map(|_| ()), Err(e) if matches!(e.root(), Error::Unsupported { .. }))
    );
}

#[test]
fn writer_keeps_types_without_a_dtype_and_checks_content_rules() {
    let s = |d: &[u64]| Shape::new(d.to_vec()).unwrap();
    let opts = WriteOptions::default();
    let data = |logical, shape: &[u64], bytes: &'static [u8]| {
        (
            logical,
            s(shape),
            [ComponentData {
                role: "data",
                dtype: DType::U8,
                logical_type: Some(logical),
                data: bytes,
            }],
        )
    };
    // Accepted: f4_e2m1 packs two per byte (5 elements in 3 bytes, the last high
    // nibble zero), f8_e8m0 one per byte, and a type of the user's own.
    let mut w = ZtWriter::with_version(Vec::new(), ZtVersion::V2).unwrap();
    for (i, (logical, shape, parts)) in [
        data("f4_e2m1", &[5], &[0x21, 0x43, 0x05]),
        data("f4_e2m1", &[2, 3], &[0x21, 0x43, 0xf5]),
        data("f8_e8m0", &[4], &[0, 1, 2, 0xff]),
        data("acme.f6", &[2], &[7, 9]),
    ]
    .into_iter()
    .enumerate()
    {
        w.add_object(&format!("t{i}"), &shape, Layout::Dense, None, &parts, opts)
            .unwrap_or_else(|e| panic!("{logical}: {e}"));
    }
    let r = open(w.finish_into().unwrap()).unwrap();
    assert_eq!(r.verify().unwrap(), 0);
    assert_eq!(
        r.component("t0", "data").unwrap().as_slice(),
        &[0x21, 0x43, 0x05]
    );
    assert_eq!(
        r.component("t1", "data").unwrap().as_slice(),
        &[0x21, 0x43, 0xf5]
    );
    assert_eq!(
        r.object("t3").unwrap().components[0]
            .logical_type
            .as_deref(),
        Some("acme.f6")
    );
    // Refused before a byte is written, as invalid arguments: a wrong packed size,
    // a used last nibble after an odd count, bool bytes other than 0 and 1.
    let mut w = ZtWriter::with_version(Vec::new(), ZtVersion::V2).unwrap();
    for (logical, shape, parts) in [
        data("f4_e2m1", &[7], &[0x21, 0x43, 0x05]),
        data("f4_e2m1", &[5], &[0x21, 0x43, 0x15]),
        data("bool", &[3], &[0, 1, 2]),
    ] {
        let err = w
            .add_object("x", &shape, Layout::Dense, None, &parts, opts)
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument { .. }),
            "{logical}: {err}"
        );
    }
    w.add_dense("ok", DType::U8, &s(&[1]), &[9], opts).unwrap();
    let r = open(w.finish_into().unwrap()).unwrap();
    assert_eq!(r.objects().len(), 1);
}

#[test]
fn identical_raw_parts_share_one_blob_in_files_and_streams() {
    let s = Shape::new(vec![4]).unwrap();
    let opts = WriteOptions {
        checksum: Checksum::Xxh3,
        ..WriteOptions::default()
    };
    let write = |w: &mut dyn FnMut(&str, &[u8])| {
        w("a", &[1, 2, 3, 4]);
        w("b", &[1, 2, 3, 5]);
        w("c", &[1, 2, 3, 4]);
        w("d", &[]);
        w("e", &[]);
    };
    let mut stream = ZtWriter::with_version(Vec::new(), ZtVersion::V2).unwrap();
    write(&mut |n, d| {
        stream
            .add_dense(
                n,
                DType::U8,
                &Shape::new(vec![d.len() as u64]).unwrap(),
                d,
                opts,
            )
            .unwrap()
    });
    let bytes = stream.finish_into().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.zt");
    let mut file = ZtWriter::create_with_version(&path, ZtVersion::V2).unwrap();
    write(&mut |n, d| {
        file.add_dense(
            n,
            DType::U8,
            &Shape::new(vec![d.len() as u64]).unwrap(),
            d,
            opts,
        )
        .unwrap()
    });
    let total = file.finish().unwrap();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "file and stream writers agree"
    );
    assert_eq!(total, bytes.len() as u64);
    let r = ZtReader::open(&path).unwrap();
    let off = |n: &str| r.object(n).unwrap().components[0].offset;
    assert_eq!(off("a"), off("c"));
    assert_ne!(off("a"), off("b"));
    assert_eq!(off("d"), off("e"));
    // Compressed parts are never shared (ztensor writes each).
    let mut w = ZtWriter::with_version(Vec::new(), ZtVersion::V2).unwrap();
    let z = WriteOptions {
        compression: Compression::Zstd(3),
        ..opts
    };
    w.add_dense("a", DType::U8, &s, &[1, 2, 3, 4], z).unwrap();
    w.add_dense("b", DType::U8, &s, &[1, 2, 3, 4], z).unwrap();
    let r = open(w.finish_into().unwrap()).unwrap();
    assert_ne!(
        r.object("a").unwrap().components[0].offset,
        r.object("b").unwrap().components[0].offset
    );
}

#[test]
fn writer_attributes_round_trip_exactly() {
    let attrs: BTreeMap<String, Value> = [
        ("i", Value::Int(-(1i128 << 64))),
        ("u", Value::Int(u64::MAX.into())),
        ("f", Value::Float(f64::NAN)),
        ("g", Value::Float(-0.0)),
        ("b", Value::Bytes(vec![0, 255])),
        ("l", Value::List(vec![Value::Null, Value::Bool(false)])),
        (
            "m",
            Value::Map(vec![
                ("z".into(), Value::Int(1)),
                ("a".into(), Value::Str("é".into())),
            ]),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let mut w = ZtWriter::with_version(Vec::new(), ZtVersion::V2).unwrap();
    w.set_attributes(attrs.clone()).unwrap();
    w.add_dense_with_attributes(
        "t",
        DType::U8,
        &Shape::new(vec![1]).unwrap(),
        &[0],
        Some(attrs.clone()),
        WriteOptions::default(),
    )
    .unwrap();
    let r = open(w.finish_into().unwrap()).unwrap();
    assert_eq!(norm_map(r.attributes()), norm_map(&attrs));
    assert_eq!(
        norm_map(r.object("t").unwrap().attributes.as_ref().unwrap()),
        norm_map(&attrs)
    );
    let mut w = ZtWriter::with_version(Vec::new(), ZtVersion::V2).unwrap();
    let big: BTreeMap<String, Value> = [("x".to_owned(), Value::Int(1i128 << 64))]
        .into_iter()
        .collect();
    assert!(w.set_attributes(big).is_err());
}

/// Writes the `write_v2` example's files and has the real ztensor 2.x read them
/// (`fixtures/zt/v2/check_ours.py`), comparing with ztensor's own output where it can
/// write the same input. Skipped (passes, with a note) when no interpreter with
/// ztensor 2.x is found: `$ZT2_PYTHON`, else `/work/zt2venv/bin/python`.
#[test]
fn ztensor2_reads_the_files_we_write() {
    let python = std::env::var("ZT2_PYTHON").unwrap_or_else(|_| "/work/zt2venv/bin/python".into());
    let has_zt2 = std::process::Command::new(&python)
        .args([
            "-c",
            "import ztensor, numpy, sys; sys.exit(0 if hasattr(ztensor, 'Source') else 1)",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_zt2 {
        eprintln!("skipped: no ztensor 2.x at {python} (set ZT2_PYTHON)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_v2::write_all(dir.path()).unwrap();
    let out = std::process::Command::new(&python)
        .arg(fixture_dir().join("check_ours.py"))
        .arg(dir.path())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "check_ours.py failed:\n{text}");
    assert_eq!(
        text.matches("byte-identical to ztensor's own output")
            .count(),
        3,
        "{text}"
    );
}

/// A seek table whose frames take no bytes and claim 16 MiB each: it tiles and adds up,
/// but 4 KiB of stored bytes cannot decode to 8 GiB, so the file is refused on open
/// rather than when a read has allocated the 8 GiB.
#[test]
fn a_seek_table_claiming_more_than_zstd_can_make_is_refused_on_open() {
    let frames = 512u32;
    let mut table = Vec::new();
    table.extend_from_slice(&0x184D_2A5Eu32.to_le_bytes());
    table.extend_from_slice(&(frames * 8 + 9).to_le_bytes());
    for _ in 0..frames {
        table.extend_from_slice(&0u32.to_le_bytes());
        table.extend_from_slice(&(16u32 << 20).to_le_bytes());
    }
    table.extend_from_slice(&frames.to_le_bytes());
    table.push(0);
    table.extend_from_slice(&0x8F92_EAB1u32.to_le_bytes());
    let decoded = u64::from(frames) << 24;
    let mut p = part("u8", 4096, table.len() as u64);
    p.push(("encoding", C::T("zt.zstd-seekable/1")));
    p.push(("decoded_length", C::U(decoded)));
    let f = image(&table, &objects(vec![("w", dense(&[decoded], p))]));
    match err_of(f) {
        Error::Decode { reason, .. } => {
            assert!(reason.contains("8589934592 decoded bytes"), "{reason}")
        }
        e => panic!("{e}"),
    }
}

/// A name `.zt` 2 cannot hold is input the format refuses (`Unsupported`, named),
/// not a bad file (`LimitExceeded`, which the CLI reports as corrupt).
#[test]
fn a_name_too_long_for_v2_is_unsupported() {
    let mut w = ZtWriter::with_version(Vec::new(), ZtVersion::V2).unwrap();
    let long = "w".repeat(2000);
    let err = w
        .add_dense(
            &long,
            DType::U8,
            &Shape::new(vec![1]).unwrap(),
            &[1],
            WriteOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("2000 bytes long"), "{err}");
    let at_most = "w".repeat(1024);
    w.add_dense(
        &at_most,
        DType::U8,
        &Shape::new(vec![1]).unwrap(),
        &[1],
        WriteOptions::default(),
    )
    .unwrap();
}

/// `value` nested in `levels` one-item lists.
fn nested_list(levels: usize, value: Value) -> Value {
    (0..levels).fold(value, |v, _| Value::List(vec![v]))
}

/// A `.zt` 2 manifest nests at most 32 levels: attribute values deeper than that are
/// refused when written (no reader would open the file), exactly at the line the
/// reader draws; a reader's lower `max_depth` is a limit it may raise, not a bad file.
#[test]
fn attribute_nesting_is_refused_where_the_reader_would_refuse_it() {
    let write = |file_levels: usize, object_levels: usize| -> Result<Vec<u8>, Error> {
        let mut w = ZtWriter::with_version(Vec::new(), ZtVersion::V2)?;
        let mut file = BTreeMap::new();
        file.insert("f".to_owned(), nested_list(file_levels, Value::Int(1)));
        w.set_attributes(file)?;
        let mut object = BTreeMap::new();
        object.insert("o".to_owned(), nested_list(object_levels, Value::Int(2)));
        w.add_object(
            "t",
            &Shape::new(vec![1]).unwrap(),
            Layout::Dense,
            Some(object),
            &[ComponentData {
                role: "data",
                dtype: DType::U8,
                logical_type: None,
                data: &[9],
            }],
            WriteOptions::default(),
        )?;
        w.finish_into()
    };
    let deepest = write(30, 28).unwrap();
    let reader = open(deepest.clone()).unwrap();
    assert_eq!(reader.attributes()["f"], nested_list(30, Value::Int(1)));
    for (file, object) in [(31, 28), (30, 29)] {
        let err = write(file, object).unwrap_err();
        assert!(
            matches!(err, Error::Unsupported { .. }),
            "{file} {object}: {err}"
        );
    }
    let limits = Limits {
        max_depth: 10,
        ..Limits::default()
    };
    assert!(matches!(
        open_with(deepest, &limits),
        Err(Error::LimitExceeded { limit: 10, .. })
    ));
}
