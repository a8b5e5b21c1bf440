//! Checkpoints split by `huggingface_hub` (fixtures/sharded: safetensors shards and
//! torch pickle shards, each with its index) read back as one source equal to the
//! state dict that was saved; and broken or hostile indexes are refused.

// The fixture helpers of the formats crate's tests (same `fixtures/` depth).
#[path = "../../formats/tests/common/mod.rs"]
mod common;

use std::path::PathBuf;

use common::{dims, sha256_hex};
use tensorwire::formats::safetensors::StDType;
use tensorwire::{Error, ShardedSource, TensorSource, Value};

fn fixtures() -> PathBuf {
    common::fixture("sharded")
}

fn expected() -> serde_json::Value {
    common::expected("sharded/expected.json")
}

const INDEXES: [(&str, &str); 2] = [
    ("safetensors", "model.safetensors.index.json"),
    ("pytorch", "pytorch_model.bin.index.json"),
];

/// Checks a source against the expectation of the `flavor` folder.
fn check_source(src: &dyn TensorSource, flavor: &str) {
    let exp = expected();
    let tensors = exp["tensors"].as_object().unwrap();
    assert_eq!(src.format(), "sharded");
    assert_eq!(src.tensors().len(), tensors.len(), "{flavor}");
    assert_eq!(src.attributes()["total_size"], Value::Int(324));
    for (name, t) in tensors {
        let info = src.info(name).unwrap();
        let dtype = StDType::from_name(t["dtype"].as_str().unwrap())
            .unwrap()
            .dtype()
            .unwrap();
        assert_eq!(info.dtype, dtype, "{flavor}/{name}");
        let shape = dims(&t["shape"]);
        assert_eq!(info.shape.dims(), &shape[..], "{flavor}/{name}");
        let shard = t["shard"][flavor].as_str().unwrap();
        let sharded = src.as_any().downcast_ref::<ShardedSource>().unwrap();
        assert_eq!(sharded.shard_of(name).unwrap(), shard, "{flavor}/{name}");
        let view = src.view(name).unwrap();
        assert_eq!(
            sha256_hex(&view.bytes),
            t["sha256"].as_str().unwrap(),
            "{flavor}/{name}"
        );
        if flavor == "safetensors" {
            assert!(view.zero_copy, "{name}");
        }
    }
    // Shard by shard, in shard-name order, and reads ordered the same way.
    let sharded = src.as_any().downcast_ref::<ShardedSource>().unwrap();
    let shards: Vec<&str> = src
        .tensors()
        .iter()
        .map(|t| sharded.shard_of(&t.name).unwrap())
        .collect();
    assert!(shards.windows(2).all(|w| w[0] <= w[1]), "{shards:?}");
    let order: Vec<(usize, u64)> = (0..src.tensors().len())
        .map(|i| src.read_order(i))
        .collect();
    for (i, (shard, offset)) in order.iter().enumerate() {
        let names: Vec<&str> = sharded.shard_names().collect();
        assert_eq!(names[*shard], shards[i]);
        assert_eq!(*offset, src.tensors()[i].offset);
    }
}

#[test]
fn both_shardings_read_back_as_saved() {
    for (flavor, index) in INDEXES {
        let path = fixtures().join(flavor).join(index);
        let src = tensorwire::open(&path).unwrap_or_else(|e| panic!("{flavor}: {e}"));
        check_source(&*src, flavor);
        let sharded = src.as_any().downcast_ref::<ShardedSource>().unwrap();
        assert_eq!(sharded.shard_names().count(), 3, "{flavor}");
        // torch's ZIP records carry CRCs (every record of the three shards is
        // checked); safetensors has no digests.
        let checked = src.verify().unwrap();
        assert_eq!(checked > 0, flavor == "pytorch", "{flavor}: {checked}");
        let first = sharded.shard_names().next().unwrap();
        assert!(sharded.shard(first).is_some());
        assert!(sharded.shard("elsewhere.bin").is_none());
        assert_eq!(
            tensorwire::sniff(&std::fs::read(&path).unwrap()).unwrap(),
            tensorwire::FileFormat::ShardIndex
        );
    }
}

#[test]
fn converting_an_index_merges_its_shards() {
    let dir = tempfile::tempdir().unwrap();
    for (flavor, index) in INDEXES {
        for out in ["merged.safetensors", "merged.zt"] {
            let dst = dir.path().join(format!("{flavor}-{out}"));
            let n = tensorwire::convert(
                fixtures().join(flavor).join(index),
                &dst,
                &Default::default(),
                &mut |_, _, _| Ok(()),
            )
            .unwrap();
            assert_eq!(n, 7);
            let merged = tensorwire::open(&dst).unwrap();
            let original = tensorwire::open(fixtures().join(flavor).join(index)).unwrap();
            for info in original.tensors() {
                let a = original.view(&info.name).unwrap();
                let b = merged.view(&info.name).unwrap();
                assert_eq!((a.dtype, &a.shape), (b.dtype, &b.shape), "{dst:?}");
                assert_eq!(&*a.bytes, &*b.bytes, "{dst:?} {}", info.name);
            }
        }
    }
}

/// A folder holding copies of the safetensors shards and `index` as the index.
fn with_index(index: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixtures().join("safetensors")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let path = dir.path().join("model.safetensors.index.json");
    std::fs::write(&path, index).unwrap();
    (dir, path)
}

#[test]
fn serves_only_what_the_index_lists() {
    // The index lists one tensor of the first shard; the shard's others are not served.
    let (_dir, path) =
        with_index(r#"{"weight_map": {"embed.weight": "model-00001-of-00003.safetensors"}}"#);
    let src = tensorwire::open(&path).unwrap();
    let names: Vec<&str> = src.tensors().iter().map(|t| &*t.name).collect();
    assert_eq!(names, ["embed.weight"]);
    assert!(matches!(src.view("step"), Err(Error::NotFound { .. })));
    // The one shard's own metadata, as no index metadata says otherwise.
    assert_eq!(src.attributes().len(), 1);
    assert_eq!(src.attributes()["format"], Value::Str("pt".into()));
}

/// A file merged from the shards keeps what every shard says alike (`format: pt`,
/// without which `transformers` refuses a safetensors file), under the index's own
/// metadata; what the shards disagree on is left out.
#[test]
fn attributes_all_shards_hold_alike_join_the_index_metadata() {
    let src =
        tensorwire::open(fixtures().join("safetensors/model.safetensors.index.json")).unwrap();
    assert_eq!(src.attributes()["format"], Value::Str("pt".into()));
    assert_eq!(src.attributes()["total_size"], Value::Int(324));

    let (dir, path) = with_index(
        r#"{"metadata": {"format": "index"}, "weight_map": {"embed.weight": "model-00001-of-00003.safetensors", "x": "other.safetensors"}}"#,
    );
    let header = br#"{"__metadata__":{"format":"tf","kind":"other"},"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
    let mut other = (header.len() as u64).to_le_bytes().to_vec();
    other.extend_from_slice(header);
    other.push(7);
    std::fs::write(dir.path().join("other.safetensors"), other).unwrap();
    let src = tensorwire::open(&path).unwrap();
    assert_eq!(src.attributes().len(), 1);
    assert_eq!(src.attributes()["format"], Value::Str("index".into()));
    let (_dir2, path) = with_index(
        r#"{"weight_map": {"embed.weight": "model-00001-of-00003.safetensors", "x": "other.safetensors"}}"#,
    );
    std::fs::copy(
        dir.path().join("other.safetensors"),
        path.with_file_name("other.safetensors"),
    )
    .unwrap();
    assert!(tensorwire::open(&path).unwrap().attributes().is_empty());
}

#[test]
fn refuses_broken_and_hostile_indexes() {
    let cases = [
        (
            r#"{"weight_map": {"embed.weight": "model-00009-of-00009.safetensors"}}"#,
            "model-00009-of-00009.safetensors",
        ),
        (
            r#"{"weight_map": {"step": "model-00001-of-00003.safetensors"}}"#,
            "puts `step` in `model-00001-of-00003.safetensors`, which has no such tensor",
        ),
        (
            r#"{"weight_map": {"step": "../model-00001-of-00003.safetensors"}}"#,
            "not a file name in its folder",
        ),
        (
            r#"{"weight_map": {"step": "model.safetensors.index.json"}}"#,
            "shard index as a shard",
        ),
        (r#"{"metadata": {"total_size": 1}}"#, "unrecognised"),
    ];
    for (index, says) in cases {
        let (_dir, path) = with_index(index);
        let Err(err) = tensorwire::open(&path) else {
            panic!("{index}: opened");
        };
        let text = err.to_string();
        assert!(text.contains(says), "{index}: {text}");
        // Errors name the file they are about.
        assert!(
            text.contains("model"),
            "{index}: the error names no file: {text}"
        );
    }
    // In memory, an index has no folder to find its shards in.
    let bytes = tensorwire::Bytes::from(
        br#"{"weight_map": {"a": "model-00001-of-00003.safetensors"}}"#.to_vec(),
    );
    let Err(err) = tensorwire::open_bytes(bytes, &Default::default()) else {
        panic!("an index in memory opened");
    };
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
}

/// A PyTorch shard's tensor on the meta device has no data to serve: an index that
/// lists it is `Unsupported` saying so (not malformed, as a name the shard lacks).
#[test]
fn an_index_listing_a_meta_tensor_says_it_has_no_data() {
    let dir = tempfile::tempdir().unwrap();
    let shard = "pytorch_model-00001-of-00001.bin";
    std::fs::copy(
        fixtures().join("../pytorch/meta_tensors.pt"),
        dir.path().join(shard),
    )
    .unwrap();
    let path = dir.path().join("pytorch_model.bin.index.json");
    let index = |names: &[&str]| {
        let map: Vec<String> = names
            .iter()
            .map(|n| format!("\"{n}\": \"{shard}\""))
            .collect();
        format!("{{\"weight_map\": {{{}}}}}", map.join(", "))
    };
    std::fs::write(&path, index(&["b", "nested.real"])).unwrap();
    let src = tensorwire::open(&path).unwrap();
    assert_eq!(src.tensors().len(), 2);
    std::fs::write(&path, index(&["b", "w"])).unwrap();
    let Err(err) = tensorwire::open(&path) else {
        panic!("an index listing a meta tensor opened");
    };
    assert!(
        matches!(err.root(), Error::Unsupported { .. }) && err.to_string().contains("meta device"),
        "{err}"
    );
    assert!(err.to_string().contains("index.json"), "{err}");
}
