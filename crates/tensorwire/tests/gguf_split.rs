//! A GGUF model split into three files by gguf-py's writer (fixtures/gguf/split, named
//! as llama.cpp's gguf-split names them): opening the first split serves every
//! tensor of the set, as the package wrote them; any other split, or a renamed one,
//! opens as the one file it is; a missing or wrong split fails the open.

// The fixture helpers of the formats crate's tests (same `fixtures/` depth).
#[path = "../../formats/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};

use common::{dims, sha256_hex};
use tensorwire::{Error, ShardedSource, Value};

const SPLITS: [&str; 3] = [
    "model-00001-of-00003.gguf",
    "model-00002-of-00003.gguf",
    "model-00003-of-00003.gguf",
];

fn split_dir() -> PathBuf {
    common::fixture("gguf/split")
}

fn expected(split: &str) -> serde_json::Value {
    common::expected(&format!(
        "gguf/split/{}",
        split.replace(".gguf", ".expected.json")
    ))
}

#[test]
fn the_first_split_opens_the_whole_model() {
    let src = tensorwire::open(split_dir().join(SPLITS[0])).unwrap();
    assert_eq!(src.format(), "sharded");
    let sharded = src.as_any().downcast_ref::<ShardedSource>().unwrap();
    assert_eq!(sharded.shard_names().collect::<Vec<_>>(), SPLITS);
    // The model's metadata come from the first split, without the split keys.
    assert_eq!(
        src.attributes().get("general.name"),
        Some(&Value::Str("split-test".into()))
    );
    assert!(
        src.attributes().keys().all(|k| !k.starts_with("split.")),
        "{:?}",
        src.attributes()
    );
    let mut names = Vec::new();
    for split in SPLITS {
        for t in expected(split)["tensors"].as_array().unwrap() {
            let name = t["name"].as_str().unwrap();
            names.push(name.to_owned());
            assert_eq!(sharded.shard_of(name).unwrap(), split);
            let info = src.info(name).unwrap();
            let shape = dims(&t["shape"]);
            assert_eq!(info.shape.dims(), &shape[..], "{name}");
            let view = src.view(name).unwrap();
            assert!(view.zero_copy, "{name}");
            assert_eq!(
                sha256_hex(&view.bytes),
                t["sha256"].as_str().unwrap(),
                "{name}"
            );
        }
    }
    // Split by split, in each split's order.
    let listed: Vec<&str> = src.tensors().iter().map(|t| &*t.name).collect();
    assert_eq!(listed, names);
    assert_eq!(listed.len(), 5);
}

#[test]
fn other_splits_and_renamed_ones_open_alone() {
    let second = tensorwire::open(split_dir().join(SPLITS[1])).unwrap();
    assert_eq!(second.format(), "gguf");
    assert_eq!(second.tensors().len(), 2);

    let dir = tempfile::tempdir().unwrap();
    let renamed = dir.path().join("model.gguf");
    std::fs::copy(split_dir().join(SPLITS[0]), &renamed).unwrap();
    let alone = tensorwire::open(&renamed).unwrap();
    assert_eq!(alone.format(), "gguf");
    assert_eq!(alone.tensors().len(), 2);
}

/// A folder holding copies of the three splits.
fn copies() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for split in SPLITS {
        std::fs::copy(split_dir().join(split), dir.path().join(split)).unwrap();
    }
    dir
}

fn open_error(dir: &Path) -> String {
    match tensorwire::open(dir.join(SPLITS[0])) {
        Ok(_) => panic!("opened"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_missing_or_wrong_split_fails_the_open() {
    let dir = copies();
    std::fs::remove_file(dir.path().join(SPLITS[2])).unwrap();
    let err = open_error(dir.path());
    assert!(err.contains(SPLITS[2]), "{err}");

    // The third split where the second should be.
    let dir = copies();
    std::fs::copy(split_dir().join(SPLITS[2]), dir.path().join(SPLITS[1])).unwrap();
    let err = open_error(dir.path());
    assert!(err.contains("not split 2 of the 3"), "{err}");
    assert!(err.contains(SPLITS[1]), "{err}");

    // A first split that counts a tensor more than the splits hold.
    let dir = copies();
    let first = dir.path().join(SPLITS[0]);
    let mut bytes = std::fs::read(&first).unwrap();
    let key = b"split.tensors.count";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    // The value follows the key's 4-byte type (INT32).
    assert_eq!(&bytes[at + 4..at + 8], &5i32.to_le_bytes());
    bytes[at + 4..at + 8].copy_from_slice(&6i32.to_le_bytes());
    std::fs::write(&first, bytes).unwrap();
    let err = open_error(dir.path());
    assert!(
        err.contains("hold 5 tensors, but split.tensors.count says 6"),
        "{err}"
    );
    assert!(
        matches!(tensorwire::open(&first), Err(Error::WithPath { .. })),
        "the error names the file"
    );
}

/// A GGUF v3 file with no tensors and the given key-value pairs (key, type id, value
/// bytes), padded to its 32-byte alignment.
fn tiny_gguf(kvs: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend((kvs.len() as u64).to_le_bytes());
    for (key, ty, value) in kvs {
        out.extend((key.len() as u64).to_le_bytes());
        out.extend(key.as_bytes());
        out.extend(ty.to_le_bytes());
        out.extend(value);
    }
    out.resize(out.len().div_ceil(32) * 32, 0);
    out
}

#[test]
fn a_split_count_no_set_can_have_allocates_nothing() {
    // `split.count` as a u64 of a billion (llama.cpp writes a u16): named to match,
    // the file is still read as the one file it is, without reserving room for a
    // billion splits.
    const UINT16: u32 = 2;
    const UINT64: u32 = 10;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("evil-00001-of-1000000000.gguf");
    std::fs::write(
        &path,
        tiny_gguf(&[
            ("split.no", UINT16, 0u16.to_le_bytes().to_vec()),
            (
                "split.count",
                UINT64,
                1_000_000_000u64.to_le_bytes().to_vec(),
            ),
        ]),
    )
    .unwrap();
    let src = tensorwire::open(&path).unwrap();
    assert_eq!(src.format(), "gguf");
    assert!(src.tensors().is_empty());

    // The largest count a u16 holds: the open looks for the second split and fails
    // there, naming it.
    let path = dir.path().join("big-00001-of-65535.gguf");
    std::fs::write(
        &path,
        tiny_gguf(&[
            ("split.no", UINT16, 0u16.to_le_bytes().to_vec()),
            ("split.count", UINT16, u16::MAX.to_le_bytes().to_vec()),
        ]),
    )
    .unwrap();
    let err = tensorwire::open(&path).err().expect("a missing split");
    assert!(err.to_string().contains("big-00002-of-65535.gguf"), "{err}");
}
