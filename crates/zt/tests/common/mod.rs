//! Helpers shared by the zt integration tests: build `.zt` images by hand, load the
//! committed fixtures with their expectations.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use ciborium::Value as Cbor;
use serde_json::Value as Json;

/// `fixtures/<sub>` of the repository.
pub fn fixture_dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(sub)
}

/// Every `X.zt` of `fixtures/<sub>` that has an `X.expected.json`, with that JSON,
/// sorted by path; at least `min` of them.
pub fn fixtures(sub: &str, min: usize) -> Vec<(PathBuf, Json)> {
    let dir = fixture_dir(sub);
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("the fixture directory exists") {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if let Some(stem) = name.strip_suffix(".expected.json") {
            let json: Json =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            out.push((dir.join(format!("{stem}.zt")), json));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        out.len() >= min,
        "expected the fixture set in {sub}, found {}",
        out.len()
    );
    out
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn text(s: &str) -> Cbor {
    Cbor::Text(s.to_owned())
}

pub fn int(i: u64) -> Cbor {
    Cbor::Integer(i.into())
}

pub fn map(entries: Vec<(&str, Cbor)>) -> Cbor {
    Cbor::Map(entries.into_iter().map(|(k, v)| (text(k), v)).collect())
}

/// A raw dense component map.
pub fn component(dtype: &str, offset: u64, length: u64) -> Cbor {
    map(vec![
        ("dtype", text(dtype)),
        ("offset", int(offset)),
        ("length", int(length)),
    ])
}

/// A dense object map.
pub fn dense(shape: &[u64], comp: Cbor) -> Cbor {
    map(vec![
        (
            "shape",
            Cbor::Array(shape.iter().map(|&d| int(d)).collect()),
        ),
        ("format", text("dense")),
        ("components", map(vec![("data", comp)])),
    ])
}

/// A 1.2 manifest from (name, object) pairs.
pub fn manifest(objects: Vec<(&str, Cbor)>) -> Cbor {
    map(vec![("version", text("1.2.0")), ("objects", map(objects))])
}

/// `ZTEN1000` + `data` (placed at offset 8, so pad it yourself) + manifest + size + magic.
pub fn image(data_after_magic: &[u8], manifest: &Cbor) -> Vec<u8> {
    let mut cbor = Vec::new();
    ciborium::ser::into_writer(manifest, &mut cbor).unwrap();
    image_raw(data_after_magic, &cbor)
}

pub fn image_raw(data_after_magic: &[u8], cbor: &[u8]) -> Vec<u8> {
    let mut out = b"ZTEN1000".to_vec();
    out.extend_from_slice(data_after_magic);
    out.extend_from_slice(cbor);
    out.extend_from_slice(&(cbor.len() as u64).to_le_bytes());
    out.extend_from_slice(b"ZTEN1000");
    out
}

/// 56 zero bytes of padding then `blob`, so `blob` starts at offset 64.
pub fn at64(blob: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; 56];
    v.extend_from_slice(blob);
    v
}
