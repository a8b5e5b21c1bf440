//! Helpers shared by the fixture tests.
#![allow(dead_code)]

use std::path::PathBuf;

use sha2::{Digest, Sha256};

/// Path of a file under `fixtures/`.
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(rel)
}

/// The JSON expectation next to a fixture.
pub fn expected(rel: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixture(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    serde_json::from_str(&text).unwrap()
}

/// Lower-case hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A JSON array of non-negative integers as `u64`s.
pub fn dims(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap())
        .collect()
}
