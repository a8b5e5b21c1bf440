//! Helpers shared by the facade's fixture tests.
#![allow(dead_code)]

use sha2::{Digest, Sha256};

/// Lower-case hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A JSON array of non-negative integers (a shape in an expectation file).
pub fn dims(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .expect("a JSON array")
        .iter()
        .map(|d| d.as_u64().expect("a non-negative integer"))
        .collect()
}

/// A JSON expectation file.
pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap()
}
