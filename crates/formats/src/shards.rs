//! Shard indexes: the JSON table of contents of a checkpoint split over several files,
//! as Hugging Face writes it (`model.safetensors.index.json`,
//! `pytorch_model.bin.index.json`):
//!
//! ```json
//! {"metadata": {"total_size": 1048},
//!  "weight_map": {"embed.weight": "model-00001-of-00002.safetensors", ...}}
//! ```
//!
//! This module parses the index only; the `tensorwire` facade opens the shards (each a
//! file of its own format, in the index's folder) and serves their tensors as one
//! source. Shard names must be plain file names in that folder: an index cannot point
//! outside it.

use std::collections::BTreeMap;
use std::sync::Arc;

use tensorwire_core::{Error, Limits, NameSet, Result, Value};

use crate::json::{JsonError, JsonReader, Number};

/// A parsed shard index: which shard file holds each tensor, and the index's own
/// metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardIndex {
    /// Distinct shard file names, sorted (`model-00001-of-00003…` first).
    shards: Vec<String>,
    /// Every tensor with the position of its shard in `shards`, in index order.
    tensors: Vec<(Arc<str>, usize)>,
    /// The `metadata` object (strings, integers, numbers, booleans and nulls; nested
    /// values are kept as their JSON text).
    metadata: BTreeMap<String, Value>,
}

/// Whether `head` (a file's first bytes) may be a shard index: a JSON object, whose
/// first key follows. A JSON text has no NUL byte, where a safetensors file's 8-byte
/// header length has some for any header under 2^56 bytes, so the two never mix.
pub fn sniff(head: &[u8]) -> bool {
    let mut rest = head.iter().skip_while(|b| b.is_ascii_whitespace());
    if rest.next() != Some(&b'{') {
        return false;
    }
    let mut rest = rest.skip_while(|b| b.is_ascii_whitespace());
    rest.next() == Some(&b'"') && !head.iter().take(16).any(|&b| b == 0)
}

impl ShardIndex {
    /// Parses an index document (at most `limits.max_metadata_bytes` long, at most
    /// `limits.max_tensors` tensors with names of at most `limits.max_name_bytes`).
    pub fn parse(text: &[u8], limits: &Limits) -> Result<ShardIndex> {
        Error::check_limit(
            "shard index size",
            text.len() as u64,
            limits.max_metadata_bytes,
        )?;
        let text = std::str::from_utf8(text).map_err(|e| {
            Error::malformed(e.valid_up_to() as u64, "shard index is not UTF-8 text")
        })?;
        let mut json = JsonReader::new(text);
        json.expect(b'{', "expected a JSON object")
            .map_err(syntax)?;
        let mut weight_map = None;
        let mut metadata = None;
        let mut first = true;
        while json.more(b'}', first).map_err(syntax)? {
            first = false;
            let key = json.string().map_err(syntax)?;
            json.expect(b':', "expected `:`").map_err(syntax)?;
            match &*key {
                "weight_map" if weight_map.is_none() => {
                    weight_map = Some(read_weight_map(&mut json, limits)?);
                }
                "metadata" if metadata.is_none() => {
                    metadata = Some(read_metadata(&mut json).map_err(syntax)?);
                }
                "weight_map" | "metadata" => {
                    return Err(Error::malformed(
                        0,
                        format!("shard index: repeated `{key}`"),
                    ))
                }
                _ => json.skip_value(1).map_err(syntax)?,
            }
        }
        json.end().map_err(syntax)?;
        // Any other JSON object (a `config.json`) is a file of no format we read.
        let mut index = weight_map.ok_or_else(|| Error::UnknownFormat {
            head: text.bytes().take(16).collect(),
        })?;
        index.metadata = metadata.unwrap_or_default();
        Ok(index)
    }

    /// Distinct shard file names, sorted.
    pub fn shards(&self) -> &[String] {
        &self.shards
    }

    /// Every tensor and the position of its shard in [`Self::shards`], in index order.
    pub fn tensors(&self) -> &[(Arc<str>, usize)] {
        &self.tensors
    }

    /// The index's `metadata` object (Hugging Face writes `total_size`).
    pub fn metadata(&self) -> &BTreeMap<String, Value> {
        &self.metadata
    }
}

/// A JSON syntax error in an index.
fn syntax(e: JsonError) -> Error {
    Error::malformed(e.at as u64, format!("shard index: {e}"))
}

/// The `weight_map` object, as an index without metadata.
fn read_weight_map(json: &mut JsonReader<'_>, limits: &Limits) -> Result<ShardIndex> {
    json.expect(b'{', "`weight_map` must be an object")
        .map_err(syntax)?;
    // Each distinct shard, with the order of its first mention; sorted by name, so
    // the sorted places come from it at the end (an index names few shards).
    let mut first_mention: BTreeMap<String, usize> = BTreeMap::new();
    let mut tensors: Vec<(Arc<str>, usize)> = Vec::new();
    let mut seen: NameSet<Arc<str>> = NameSet::default();
    let mut first = true;
    while json.more(b'}', first).map_err(syntax)? {
        first = false;
        let name = json.string().map_err(syntax)?;
        json.expect(b':', "expected `:`").map_err(syntax)?;
        let shard = json.string().map_err(|e| {
            syntax(JsonError {
                what: "a shard must be a file name string",
                at: e.at,
            })
        })?;
        Error::check_limit("tensor count", tensors.len() as u64 + 1, limits.max_tensors)?;
        Error::check_limit(
            "tensor name length",
            name.len() as u64,
            limits.max_name_bytes as u64,
        )?;
        let at = match first_mention.get(&*shard) {
            Some(&at) => at,
            None => {
                check_shard_name(&shard)?;
                let at = first_mention.len();
                first_mention.insert(shard.into_owned(), at);
                at
            }
        };
        let name: Arc<str> = Arc::from(&*name);
        if !seen.insert(Arc::clone(&name)) {
            return Err(Error::malformed(
                0,
                format!("shard index lists `{name}` twice"),
            ));
        }
        tensors.push((name, at));
    }
    // Each entry pointed at its shard's place among the shards sorted by name.
    let mut sorted_place = vec![0; first_mention.len()];
    for (place, &at) in first_mention.values().enumerate() {
        sorted_place[at] = place;
    }
    for (_, at) in &mut tensors {
        *at = sorted_place[*at];
    }
    let shards = first_mention.into_keys().collect();
    Ok(ShardIndex {
        shards,
        tensors,
        metadata: BTreeMap::new(),
    })
}

/// Refuses shard names that are not plain file names in the index's folder (a path
/// separator, `..`, a NUL, or a `:`, which on Windows names a drive or a stream): an
/// index must not make a reader open files elsewhere.
fn check_shard_name(shard: &str) -> Result<()> {
    let mut parts = std::path::Path::new(shard).components();
    let one_name = matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(name)), None) if name == shard
    );
    let plain = one_name && !shard.contains(['/', '\\', '\0', ':']) && shard.len() <= 4096;
    if plain {
        Ok(())
    } else {
        Err(Error::malformed(
            0,
            format!("shard index names `{shard}`, which is not a file name in its folder"),
        ))
    }
}

/// The `metadata` object's members (a non-object `metadata` is refused).
fn read_metadata(
    json: &mut JsonReader<'_>,
) -> std::result::Result<BTreeMap<String, Value>, JsonError> {
    json.expect(b'{', "`metadata` must be an object")?;
    let mut out = BTreeMap::new();
    let mut first = true;
    while json.more(b'}', first)? {
        first = false;
        let key = json.string()?.into_owned();
        json.expect(b':', "expected `:`")?;
        json.ws();
        let value = match json.peek() {
            Some(b'"') => Value::Str(json.string()?.into_owned()),
            Some(b't' | b'f' | b'n') => {
                let start = json.position();
                json.skip_value(1)?;
                match json.text_since(start) {
                    "true" => Value::Bool(true),
                    "false" => Value::Bool(false),
                    _ => Value::Null,
                }
            }
            Some(b'-' | b'0'..=b'9') => {
                let start = json.position();
                let number = json.number()?;
                let text = json.text_since(start);
                match number {
                    Number::U64(n) => Value::Int(n.into()),
                    Number::Other => match text.parse::<i64>() {
                        Ok(n) => Value::Int(n.into()),
                        Err(_) => Value::Float(text.parse().unwrap_or(f64::NAN)),
                    },
                }
            }
            _ => {
                let start = json.position();
                json.skip_value(1)?;
                Value::Str(json.text_since(start).to_owned())
            }
        };
        out.insert(key, value);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ShardIndex> {
        ShardIndex::parse(text.as_bytes(), &Limits::default())
    }

    #[test]
    fn reads_a_hugging_face_index() {
        let index = parse(
            r#"{
  "metadata": {"total_size": 1048, "format": "pt", "ratio": 0.5, "neg": -3,
               "flag": true, "none": null, "nested": {"a": [1, 2]}},
  "weight_map": {
    "b.weight": "model-00002-of-00002.safetensors",
    "a.weight": "model-00001-of-00002.safetensors",
    "c.bias": "model-00002-of-00002.safetensors"
  }
}"#,
        )
        .unwrap();
        assert_eq!(
            index.shards(),
            [
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        );
        let tensors: Vec<(&str, usize)> = index.tensors().iter().map(|(n, s)| (&**n, *s)).collect();
        assert_eq!(tensors, [("b.weight", 1), ("a.weight", 0), ("c.bias", 1)]);
        let m = index.metadata();
        assert_eq!(m["total_size"], Value::Int(1048));
        assert_eq!(m["format"], Value::Str("pt".into()));
        assert_eq!(m["ratio"], Value::Float(0.5));
        assert_eq!(m["neg"], Value::Int(-3));
        assert_eq!(m["flag"], Value::Bool(true));
        assert_eq!(m["none"], Value::Null);
        assert_eq!(m["nested"], Value::Str(r#"{"a": [1, 2]}"#.into()));
    }

    #[test]
    fn numbers_of_any_size_are_json() {
        let index = parse(
            r#"{"metadata": {"big": 15e999, "long": 123456789012345678901234},
                             "weight_map": {}}"#,
        )
        .unwrap();
        assert_eq!(index.metadata()["big"], Value::Float(f64::INFINITY));
        assert_eq!(
            index.metadata()["long"],
            Value::Float(1.2345678901234568e23)
        );
    }

    #[test]
    fn metadata_and_other_keys_are_optional() {
        let index = parse(r#"{"weight_map": {}, "extra": [1, {"x": null}]}"#).unwrap();
        assert!(index.tensors().is_empty() && index.shards().is_empty());
        assert!(index.metadata().is_empty());
    }

    #[test]
    fn refuses_what_is_not_a_sound_index() {
        for (text, says) in [
            (
                r#"{"weight_map": {"a": "../secret.safetensors"}}"#,
                "not a file name",
            ),
            (r#"{"weight_map": {"a": "/etc/passwd"}}"#, "not a file name"),
            (r#"{"weight_map": {"a": "sub\\x.bin"}}"#, "not a file name"),
            (r#"{"weight_map": {"a": ".."}}"#, "not a file name"),
            (r#"{"weight_map": {"a": "."}}"#, "not a file name"),
            (
                r#"{"weight_map": {"a": "C:secret.bin"}}"#,
                "not a file name",
            ),
            (
                r#"{"weight_map": {"a": "model.safetensors:stream"}}"#,
                "not a file name",
            ),
            (r#"{"weight_map": {"a": ""}}"#, "not a file name"),
            (r#"{"weight_map": {"a": "x\u0000y"}}"#, "not a file name"),
            (r#"{"weight_map": {"a": "s1", "a": "s2"}}"#, "twice"),
            (r#"{"weight_map": {"a": 3}}"#, "file name string"),
            (r#"{"weight_map": []}"#, "must be an object"),
            (r#"{"weight_map": {}, "weight_map": {}}"#, "repeated"),
            (r#"{"metadata": [], "weight_map": {}}"#, "must be an object"),
            (r#"{"weight_map": {"a": "s"}"#, "expected"),
            (r#"{"weight_map": {"a": "s"}} x"#, "trailing"),
            ("[]", "expected a JSON object"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(matches!(err, Error::Malformed { .. }), "{text}: {err:?}");
            assert!(err.to_string().contains(says), "{text}: {err}");
        }
        // A JSON object that is no index (a `config.json`) is no format at all.
        let err = parse(r#"{"metadata": {}, "architectures": ["X"]}"#).unwrap_err();
        assert!(matches!(err, Error::UnknownFormat { .. }), "{err:?}");
        let err = ShardIndex::parse(b"{\"weight_map\": {\xff}}", &Limits::default()).unwrap_err();
        assert!(err.to_string().contains("UTF-8"), "{err}");
    }

    #[test]
    fn limits_hold() {
        let small = Limits {
            max_tensors: 2,
            max_name_bytes: 4,
            max_metadata_bytes: 64,
            ..Limits::default()
        };
        let three = r#"{"weight_map": {"a": "s", "b": "s", "c": "s"}}"#;
        let err = ShardIndex::parse(three.as_bytes(), &small).unwrap_err();
        assert!(matches!(err, Error::LimitExceeded { .. }), "{err}");
        let long = r#"{"weight_map": {"abcde": "s"}}"#;
        let err = ShardIndex::parse(long.as_bytes(), &small).unwrap_err();
        assert!(matches!(err, Error::LimitExceeded { .. }), "{err}");
        let big = format!(r#"{{"weight_map": {{}}, "pad": "{}"}}"#, "x".repeat(64));
        let err = ShardIndex::parse(big.as_bytes(), &small).unwrap_err();
        assert!(matches!(err, Error::LimitExceeded { .. }), "{err}");
    }

    #[test]
    fn sniffs_json_objects_not_safetensors() {
        assert!(sniff(b"{\n  \"metadata\": {"));
        assert!(sniff(b"  {\"weight_map\""));
        assert!(!sniff(b"{}"));
        assert!(!sniff(b"[{\"a\""));
        // A safetensors file whose header length starts with `{` (0x7b).
        assert!(!sniff(b"\x7b\0\0\0\0\0\0\0{\"a\":"));
    }
}
