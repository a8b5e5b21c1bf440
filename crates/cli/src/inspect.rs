//! `tensorwire inspect`: a file's header and a table (or JSON document) of its tensors.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::{json, Map, Value as J};
use tensorwire::pytorch::{MetaEntry, PtReader, Quantization, TorchOnlyDType};
use tensorwire::zt::ZtReader;
use tensorwire::{ShardedSource, TensorInfo, TensorSource};

use crate::output::{escape_controls, human_bytes, table_cell, value_to_json, width};

/// Longest tensor name the table shows before cutting it with `…`.
const MAX_NAME_WIDTH: usize = 60;
/// Longest attribute value the header shows before cutting it with `…`.
const MAX_ATTR_WIDTH: usize = 100;

/// Arguments of `tensorwire inspect`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The tensor file.
    file: PathBuf,
    /// Print a JSON document instead of a table (names and values are never cut;
    /// integers are exact numbers up to 64 bits, which a reader must keep exact past
    /// 2^53 as Python's json does, and strings beyond; NaN and infinities are strings).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    limits: crate::limits::LimitArgs,
}

/// Runs the command.
pub fn run(args: &Args) -> Result<()> {
    let src = args.limits.open(&args.file)?;
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    if args.json {
        serde_json::to_writer_pretty(&mut out, &document(&args.file, src.as_ref()))?;
        writeln!(out)?;
    } else {
        table(&mut out, &args.file, src.as_ref())?;
    }
    out.flush()?;
    Ok(())
}

fn table(out: &mut impl Write, path: &Path, src: &dyn TensorSource) -> io::Result<()> {
    let tensors = src.tensors();
    let total: u64 = tensors.iter().map(|t| t.nbytes).sum();
    let stored: u64 = tensors.iter().map(|t| t.stored_bytes).sum();
    let zt = src.as_any().downcast_ref::<ZtReader>();

    write!(
        out,
        "{}: {}, {} tensor{}, {}",
        path.display(),
        src.format(),
        tensors.len(),
        if tensors.len() == 1 { "" } else { "s" },
        human_bytes(total),
    )?;
    if stored != total {
        write!(out, " ({} stored)", human_bytes(stored))?;
    }
    writeln!(out)?;
    if !src.attributes().is_empty() {
        writeln!(out, "attributes:")?;
        for (key, value) in src.attributes() {
            writeln!(
                out,
                "  {}: {}",
                table_cell(key, MAX_NAME_WIDTH),
                value_cell(value, MAX_ATTR_WIDTH)
            )?;
        }
    }
    if let Some(sharded) = src.as_any().downcast_ref::<ShardedSource>() {
        writeln!(out, "shards:")?;
        for (name, count) in shard_counts(sharded) {
            // A name from the index file: escaped like the table's names.
            writeln!(
                out,
                "  {}: {count} tensor{}",
                escape_controls(name),
                if count == 1 { "" } else { "s" }
            )?;
        }
    }
    let meta = meta_tensors(src);
    if !meta.is_empty() {
        writeln!(out, "meta tensors (on torch's meta device: no data):")?;
        for m in meta {
            writeln!(
                out,
                "  {}: {} {}",
                table_cell(&m.name, MAX_NAME_WIDTH),
                m.tensor.dtype_name.trim_start_matches("torch."),
                m.tensor.shape
            )?;
        }
    }
    if tensors.is_empty() {
        return Ok(());
    }
    writeln!(out)?;

    let digests: Vec<String> = tensors
        .iter()
        .map(|t| zt.map(|zt| digest_names(zt, t)).unwrap_or_default())
        .collect();
    let show_digests = digests.iter().any(|d| !d.is_empty());

    let mut rows: Vec<Vec<String>> = vec![["NAME", "DTYPE", "SHAPE", "LAYOUT", "SIZE", "STORED"]
        .iter()
        .map(|s| s.to_string())
        .collect()];
    if show_digests {
        rows[0].push("DIGEST".to_owned());
    }
    for (t, digest) in tensors.iter().zip(&digests) {
        let stored = match &t.encoding {
            Some(enc) => format!("{} {enc}", human_bytes(t.stored_bytes)),
            None => "-".to_owned(),
        };
        // A `.zt` type tensorwire has no dtype for, a torch quantized dtype or a dtype
        // only torch has is shown over the dtype it is stored as.
        let holder = tensorwire::zt_holding(src, &t.name);
        let logical = holder
            .and_then(|zt| zt.opaque_type(&t.name).ok().flatten())
            .or_else(|| {
                t.attributes
                    .contains_key(Quantization::SCHEME_ATTRIBUTE)
                    .then(|| Quantization::torch_dtype(t.dtype))
                    .flatten()
            })
            .or_else(|| TorchOnlyDType::of(t).map(TorchOnlyDType::name));
        let dtype = match logical {
            Some(logical) => format!("{logical} ({})", t.dtype),
            None => t.dtype.to_string(),
        };
        let (shape, layout) = shown(holder, t);
        let mut row = vec![
            table_cell(&t.name, MAX_NAME_WIDTH),
            dtype,
            shape.to_string(),
            layout.to_string(),
            human_bytes(t.nbytes),
            stored,
        ];
        if show_digests {
            row.push(if digest.is_empty() {
                "-".to_owned()
            } else {
                digest.clone()
            });
        }
        rows.push(row);
    }
    let ncols = rows[0].len();
    let widths: Vec<usize> = (0..ncols)
        .map(|c| rows.iter().map(|r| width(&r[c])).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let mut line = String::new();
        for (c, (cell, &w)) in row.iter().zip(&widths).enumerate() {
            if c > 0 {
                line.push_str("  ");
            }
            let pad = " ".repeat(w - width(cell));
            // Sizes read best right-aligned; the last column is not padded.
            if c == 4 {
                line.push_str(&pad);
                line.push_str(cell);
            } else {
                line.push_str(cell);
                if c + 1 < ncols {
                    line.push_str(&pad);
                }
            }
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// The digest algorithms recorded for a tensor's components (`crc32c`, `sha256`).
fn digest_names(zt: &ZtReader, t: &TensorInfo) -> String {
    let Ok(obj) = zt.object(&t.name) else {
        return String::new();
    };
    let mut names: Vec<&str> = obj
        .components
        .iter()
        .filter_map(|c| c.digest.as_ref().map(|d| d.algorithm()))
        .collect();
    names.dedup();
    names.join(",")
}

/// Each shard of a sharded checkpoint with the number of its tensors the index lists.
fn shard_counts(sharded: &ShardedSource) -> Vec<(&str, usize)> {
    sharded
        .shard_names()
        .map(|name| {
            let count = sharded
                .tensors()
                .iter()
                .filter(|t| sharded.shard_of(&t.name).ok() == Some(name))
                .count();
            (name, count)
        })
        .collect()
}

/// A PyTorch checkpoint's tensors on the meta device (none for other sources).
fn meta_tensors(src: &dyn TensorSource) -> &[MetaEntry] {
    src.as_any()
        .downcast_ref::<PtReader>()
        .map_or(&[], PtReader::meta_tensors)
}

fn document(path: &Path, src: &dyn TensorSource) -> J {
    let tensors = src.tensors();
    let zt = src.as_any().downcast_ref::<ZtReader>();
    let mut doc = Map::new();
    doc.insert("path".into(), J::from(path.display().to_string()));
    doc.insert("format".into(), J::from(src.format()));
    if let Some(zt) = zt {
        doc.insert("version".into(), J::from(zt.manifest_version()));
    }
    doc.insert("tensor_count".into(), J::from(tensors.len()));
    doc.insert(
        "total_bytes".into(),
        J::from(tensors.iter().map(|t| t.nbytes).sum::<u64>()),
    );
    doc.insert(
        "stored_bytes".into(),
        J::from(tensors.iter().map(|t| t.stored_bytes).sum::<u64>()),
    );
    doc.insert("attributes".into(), attributes_json(src.attributes()));
    let sharded = src.as_any().downcast_ref::<ShardedSource>();
    if let Some(sharded) = sharded {
        let shards = shard_counts(sharded)
            .into_iter()
            .map(|(name, count)| json!({"file": name, "tensors": count}))
            .collect();
        doc.insert("shards".into(), J::Array(shards));
    }
    let tensor_doc = |t: &TensorInfo| {
        let mut obj = tensor_json(tensorwire::zt_holding(src, &t.name), t);
        if let (Some(sharded), J::Object(map)) = (sharded, &mut obj) {
            if let Ok(shard) = sharded.shard_of(&t.name) {
                map.insert("shard".into(), J::from(shard));
            }
        }
        obj
    };
    doc.insert(
        "tensors".into(),
        J::Array(tensors.iter().map(tensor_doc).collect()),
    );
    let meta = meta_tensors(src);
    if !meta.is_empty() {
        let meta = meta
            .iter()
            .map(|m| {
                json!({
                    "name": &*m.name,
                    "dtype": m.tensor.dtype_name.trim_start_matches("torch."),
                    "shape": m.tensor.shape.dims(),
                    "stride": &m.tensor.strides[..],
                    "requires_grad": m.tensor.requires_grad,
                    "parameter": m.tensor.parameter,
                })
            })
            .collect();
        doc.insert("meta_tensors".into(), J::Array(meta));
    }
    J::Object(doc)
}

fn attributes_json<'a>(attrs: impl IntoIterator<Item = (&'a String, &'a tensorwire::Value)>) -> J {
    J::Object(
        attrs
            .into_iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

/// A tensor's shape and layout as shown, from one lookup of its `.zt` object: the
/// object's layout, and its logical shape (an `f4_e2m1` tensor is listed as its
/// bytes, two elements per byte) unless the object is listed in another layout (a
/// version 2 `gguf.q4_k/1` object, listed and read as its `u8` rows of blocks: its
/// shape then goes with the listed dtype and size).
fn shown<'a>(
    zt: Option<&'a ZtReader>,
    t: &'a TensorInfo,
) -> (&'a tensorwire::Shape, &'a tensorwire::Layout) {
    match zt.and_then(|zt| zt.object(&t.name).ok()) {
        Some(o) if o.layout == t.layout => (&o.shape, &o.layout),
        Some(o) => (&t.shape, &o.layout),
        None => (&t.shape, &t.layout),
    }
}

fn tensor_json(zt: Option<&ZtReader>, t: &TensorInfo) -> J {
    let (shape, layout) = shown(zt, t);
    let mut obj = json!({
        "name": &*t.name,
        "dtype": t.dtype.to_string(),
        "shape": shape.dims(),
        "layout": layout.to_string(),
        "nbytes": t.nbytes,
        "stored_bytes": t.stored_bytes,
        "offset": t.offset,
        "encoding": t.encoding,
        "attributes": attributes_json(&*t.attributes),
    });
    if let (Some(zt), J::Object(map)) = (zt, &mut obj) {
        if let Ok(o) = zt.object(&t.name) {
            let comps = o
                .components
                .iter()
                .map(|c| {
                    json!({
                        "role": c.role,
                        "dtype": c.dtype.to_string(),
                        "type": c.logical_type,
                        "offset": c.offset,
                        "length": c.length,
                        "uncompressed_length": c.uncompressed_length,
                        "encoding": c.encoding.name(),
                        "digest": c.digest.as_ref().map(ToString::to_string),
                    })
                })
                .collect();
            map.insert("components".into(), J::Array(comps));
        }
    }
    obj
}

/// An attribute value for the header, at most about `max` columns: a list or map too
/// long to show whole keeps the items that fit and says how many it has (a GGUF
/// vocabulary is hundreds of thousands of strings), rather than cutting an item in two.
fn value_cell(value: &tensorwire::Value, max: usize) -> String {
    match value {
        tensorwire::Value::List(items) => container_cell(
            items.iter().map(|v| (String::new(), v)),
            ('[', ']'),
            ("item", "items"),
            max,
        ),
        tensorwire::Value::Map(entries) => container_cell(
            entries.iter().map(|(k, v)| (format!("{k:?}: "), v)),
            ('{', '}'),
            ("entry", "entries"),
            max,
        ),
        other => table_cell(&other.to_string(), max),
    }
}

/// The items of a list or map (each with its `"key": ` prefix, empty for a list)
/// between `open` and `close`, as many as fit in `max` columns with the count of all.
fn container_cell<'v>(
    items: impl ExactSizeIterator<Item = (String, &'v tensorwire::Value)>,
    (open, close): (char, char),
    (one, many): (&str, &str),
    max: usize,
) -> String {
    let total = items.len();
    let noun = if total == 1 { one } else { many };
    let count = format!("… {total} {noun}{close}");
    let mut out = String::from(open);
    // Items are made (keys formatted) only as far as the cell reaches.
    for (i, (prefix, item)) in items.enumerate() {
        let separator = if i == 0 { "" } else { ", " };
        // What must still fit after this item: the closing bracket, or the count of
        // a cut container.
        let after = if i + 1 == total { 1 } else { 2 + width(&count) };
        // Lists and maps inside take the room left (they cut between their own
        // items); a scalar is cut only when it comes first, so that something shows.
        let room = max.saturating_sub(width(&out) + separator.len() + width(&prefix) + after);
        let shown = match item {
            tensorwire::Value::List(_) | tensorwire::Value::Map(_) => value_cell(item, room),
            _ if i == 0 => value_cell(item, room),
            _ => value_cell(item, max),
        };
        let text = format!("{prefix}{shown}");
        if width(&out) + separator.len() + width(&text) + after > max {
            if i > 0 {
                out.push_str(", ");
            }
            out.push_str(&count);
            return out;
        }
        out.push_str(separator);
        out.push_str(&text);
    }
    out.push(close);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensorwire::Value;

    #[test]
    fn long_lists_keep_whole_items_and_say_how_many() {
        let tokens = Value::List(
            (0..128_256)
                .map(|i| Value::Str(format!("tok{i}")))
                .collect(),
        );
        let cell = value_cell(&tokens, 40);
        assert_eq!(cell, "[\"tok0\", \"tok1\", \"tok2\", … 128256 items]");
        assert!(width(&cell) <= 40);
        let short = Value::List(vec![Value::Int(1), Value::Int(2)]);
        assert_eq!(value_cell(&short, 40), "[1, 2]");
        assert_eq!(value_cell(&Value::List(vec![]), 40), "[]");
        // A long string item is cut to the room left; with no room, only the count.
        let wide = Value::List(vec![Value::Str("x".repeat(100)), Value::Int(1)]);
        let cell = value_cell(&wide, 20);
        assert!(
            cell.starts_with("[\"x") && cell.ends_with("x\", 1]"),
            "{cell}"
        );
        assert!(cell.contains('…') && width(&cell) <= 20, "{cell}");
        assert_eq!(value_cell(&wide, 12), "[… 2 items]");
        // Nested lists get the room left; maps are cut between entries.
        let nested = Value::List(vec![
            Value::List((0..50).map(Value::Int).collect()),
            Value::List(vec![Value::Int(7)]),
        ]);
        assert_eq!(
            value_cell(&nested, 40),
            "[[0, 1, 2, 3, 4, … 50 items], [7]]"
        );
        let map = Value::Map((0..20).map(|i| (format!("k{i}"), Value::Int(i))).collect());
        assert_eq!(value_cell(&map, 30), "{\"k0\": 0, … 20 entries}");
    }
}
