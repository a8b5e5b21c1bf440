//! Helpers shared by the zt integration tests: build `.zt` images by hand.

#![allow(dead_code)]

use ciborium::Value as Cbor;

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
