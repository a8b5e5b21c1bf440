//! Parses arbitrary bytes as a shard index (`model.safetensors.index.json`). None may
//! panic; an index the parser accepts must be valid JSON to serde_json too (but for
//! numbers past f64's range, which serde_json refuses), with the same tensors mapped
//! to the same shards, only plain file names as shards, and its string metadata as
//! serde_json reads them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorwire_core::{Limits, Value};
use tensorwire_formats::shards::ShardIndex;

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_metadata_bytes: 1 << 20,
        max_tensors: 10_000,
        ..Limits::default()
    };
    let Ok(index) = ShardIndex::parse(data, &limits) else {
        return;
    };
    let json: serde_json::Value = match serde_json::from_slice(data) {
        Ok(json) => json,
        // JSON allows numbers of any size; serde_json refuses those past f64 (the
        // index keeps them as infinities).
        Err(e) if e.to_string().starts_with("number out of range") => return,
        Err(e) => panic!("an accepted index is not JSON to serde_json: {e}"),
    };
    let map = json["weight_map"]
        .as_object()
        .expect("an accepted index has a weight_map object");
    assert_eq!(map.len(), index.tensors().len(), "tensor count differs");
    let shards = index.shards();
    assert!(shards.windows(2).all(|w| w[0] < w[1]), "shards not sorted");
    for (name, shard) in index.tensors() {
        let file = &shards[*shard];
        assert_eq!(map[&**name].as_str(), Some(file.as_str()), "{name}");
        assert!(!file.is_empty() && !file.contains(['/', '\\', '\0', ':']) && file != ".." && file != ".");
    }
    if let Some(meta) = json.get("metadata").and_then(|m| m.as_object()) {
        for (key, value) in meta {
            if let serde_json::Value::String(s) = value {
                assert_eq!(index.metadata().get(key), Some(&Value::Str(s.clone())), "{key}");
            }
        }
    }
});
