//! Conformance: the fixtures under `fixtures/zt/`, written by the real ztensor package
//! (see `fixtures/zt/make_fixtures.py`), read back equal to the arrays that made them,
//! and rewriting them with our writer gives the same bytes ztensor wrote.

mod common;

use common::hex;
use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value as Json;
use tensorwire_core::{DType, Layout, TensorSource, Value};
use tensorwire_zt::{
    Checksum, ComponentData, Compression, Encoding, WriteOptions, ZtReader, ZtVersion, ZtWriter,
};

fn fixtures() -> Vec<(PathBuf, Json)> {
    common::fixtures("zt", 8)
}

fn fixture_dir() -> PathBuf {
    common::fixture_dir("zt")
}

fn json_to_value(j: &Json) -> Value {
    match j {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i.into()),
            None => match n.as_u64() {
                Some(u) => Value::Int(u.into()),
                None => Value::Float(n.as_f64().unwrap()),
            },
        },
        Json::String(s) => Value::Str(s.clone()),
        Json::Array(a) => Value::List(a.iter().map(json_to_value).collect()),
        Json::Object(m) => Value::Map(
            m.iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        ),
    }
}

fn attrs(j: &Json) -> Option<BTreeMap<String, Value>> {
    match json_to_value(j) {
        Value::Map(m) => Some(m.into_iter().collect()),
        _ => None,
    }
}

#[test]
fn every_fixture_reads_back_equal_to_its_source_arrays() {
    for (path, expected) in fixtures() {
        let label = path.display().to_string();
        let reader = ZtReader::open(&path).unwrap_or_else(|e| panic!("{label}: {e}"));
        let objects = expected["objects"].as_object().unwrap();
        assert_eq!(
            reader.objects().len(),
            objects.len(),
            "{label}: object count"
        );
        if expected["magic"] == "ZTEN0001" {
            assert_eq!(reader.version(), ZtVersion::V0_1, "{label}");
        }
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
                obj.layout.name(),
                want["format"].as_str().unwrap(),
                "{label}: {name}"
            );
            assert_eq!(
                obj.attributes,
                attrs(&want["attributes"]),
                "{label}: {name} attributes"
            );
            let primary = obj.primary().unwrap();
            assert_eq!(
                primary.dtype.name(),
                want["dtype"].as_str().unwrap(),
                "{label}: {name}"
            );
            assert_eq!(
                primary.logical_type.as_deref(),
                want["type"].as_str(),
                "{label}: {name} type"
            );
            let comps = want["components"].as_object().unwrap();
            assert_eq!(obj.components.len(), comps.len(), "{label}: {name}");
            for (role, wc) in comps {
                let c = obj.component(role).unwrap();
                assert_eq!(
                    c.dtype.name(),
                    wc["dtype"].as_str().unwrap(),
                    "{label}: {name}/{role}"
                );
                assert_eq!(
                    c.encoding.name(),
                    wc["encoding"].as_str().unwrap(),
                    "{label}: {name}/{role}"
                );
                assert_eq!(
                    c.digest.as_ref().map(|d| d.algorithm()),
                    wc["digest"].as_str(),
                    "{label}: {name}/{role} digest"
                );
                let got = reader
                    .component(name, role)
                    .unwrap_or_else(|e| panic!("{label}: {name}/{role}: {e}"));
                assert_eq!(
                    hex(&got),
                    wc["hex"].as_str().unwrap(),
                    "{label}: {name}/{role} bytes"
                );
                let mut copy = vec![0u8; got.len()];
                reader.component_into(name, role, &mut copy).unwrap();
                assert_eq!(copy, got.to_vec(), "{label}: {name}/{role} copy");
            }
            if obj.layout == Layout::Dense {
                let view = reader.view(name).unwrap();
                assert_eq!(view.zero_copy, obj.components[0].encoding == Encoding::Raw);
                assert_eq!(view.dtype, obj.dtype());
            }
        }
        reader
            .verify()
            .unwrap_or_else(|e| panic!("{label}: verify: {e}"));
    }
}

/// Rewrites each 1.2 fixture with our writer, in ztensor's write order and with the
/// options it used, and expects the very same bytes.
#[test]
fn rewriting_a_fixture_reproduces_ztensors_bytes() {
    let mut compared = 0;
    for (path, expected) in fixtures() {
        if expected["magic"] != "ZTEN1000" || expected.get("write_order").is_none() {
            continue;
        }
        let label = path.display().to_string();
        // Appended files were written in two sessions; the layout is the same as one.
        let reader = ZtReader::open(&path).unwrap();
        let mut w = ZtWriter::new(Vec::new()).unwrap();
        w.set_attributes(TensorSource::attributes(&reader).clone())
            .unwrap();
        let mut skip = false;
        for name in expected["write_order"].as_array().unwrap() {
            let name = name.as_str().unwrap();
            let obj = reader.object(name).unwrap();
            let want = &expected["objects"][name]["components"];
            // Blobs go to the file in the order ztensor received the components.
            let order: Vec<&str> = expected["objects"][name]["blob_order"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_str().unwrap())
                .collect();
            let components: Vec<_> = order
                .iter()
                .map(|role| obj.component(role).unwrap())
                .collect();
            let datas: Vec<_> = components
                .iter()
                .map(|c| reader.component(name, &c.role).unwrap())
                .collect();
            // The zstd level is recorded per component by make_fixtures.py.
            let first = &want[obj.components[0].role.as_ref()];
            let compression = match obj.components[0].encoding {
                Encoding::Raw => Compression::Raw,
                Encoding::Zstd => match first.get("zstd_level").and_then(Json::as_i64) {
                    Some(level) => Compression::Zstd(level as i32),
                    None => {
                        skip = true;
                        break;
                    }
                },
                Encoding::ZstdSeekable => unreachable!("1.x fixtures have no .zt 2 encoding"),
            };
            let checksum = match obj.components[0].digest.as_ref() {
                None => Checksum::None,
                Some(d) => d.checksum(),
            };
            let comps: Vec<ComponentData<'_>> = components
                .iter()
                .zip(&datas)
                .map(|(c, d)| c.with_data(d))
                .collect();
            w.add_object(
                name,
                &obj.shape,
                obj.layout.clone(),
                obj.attributes.clone(),
                &comps,
                WriteOptions {
                    compression,
                    checksum,
                },
            )
            .unwrap();
        }
        if skip {
            continue;
        }
        let ours = w.finish_into().unwrap();
        let theirs = std::fs::read(&path).unwrap();
        assert!(ours == theirs, "{label}: our bytes differ from ztensor's");
        compared += 1;
    }
    assert!(
        compared >= 5,
        "only {compared} fixtures compared byte for byte"
    );
}

#[test]
fn dense_dtypes_map_to_the_logical_types() {
    let reader = ZtReader::open(fixture_dir().join("logical.zt")).unwrap();
    let dtypes: Vec<DType> = reader.tensors().iter().map(|t| t.dtype).collect();
    for d in [
        DType::F8E4M3Fn,
        DType::F8E5M2,
        DType::Complex64,
        DType::Complex128,
    ] {
        assert!(dtypes.contains(&d), "{d} missing from {dtypes:?}");
    }
}

/// ztensor 1.2.3 writes any `type` over any data and reads the data as stored: such
/// a file opens, each of those tensors reads as its storage dtype with the name kept
/// as its type, and the others are untouched.
#[test]
fn known_type_names_over_other_storage_are_labels() {
    let reader = ZtReader::open(fixture_dir().join("labels.zt")).unwrap();
    for (name, dtype, label) in [
        ("bf16_over_u16", DType::U16, "bf16"),
        ("bool_over_u8", DType::U8, "bool"),
        ("f8_over_f32", DType::F32, "f8_e4m3fn"),
        ("complex64_over_f64", DType::F64, "complex64"),
    ] {
        let info = reader.tensors().iter().find(|t| &*t.name == name).unwrap();
        assert_eq!(info.dtype, dtype, "{name}");
        assert_eq!(reader.opaque_type(name).unwrap(), Some(label), "{name}");
    }
    assert_eq!(
        &reader.view("bool_over_u8").unwrap().bytes[..],
        &[0, 1, 2],
        "a label changes no byte"
    );
    assert_eq!(reader.opaque_type("plain_f32").unwrap(), None);
    assert_eq!(reader.verify().unwrap(), 0);
}
