//! Writes `.zt` version 2 files with `ZtWriter`, each with a `<name>.expected.json`
//! saying what it must read back as, for `fixtures/zt/v2/check_ours.py` to read with
//! the real ztensor 2.x (and, where ztensor can write the same input, to rewrite with
//! it and compare the bytes).
//!
//! ```sh
//! cargo run -p tensorwire-zt --example write_v2 -- /tmp/ours
//! /work/zt2venv/bin/python fixtures/zt/v2/check_ours.py /tmp/ours
//! ```
//!
//! `crates/zt/tests/v2.rs` runs the same two steps when a ztensor 2.x interpreter is
//! found, and skips otherwise.
//!
//! With `--seeds DIR` it writes the `zt2_reader` fuzz seeds instead: the tensors of
//! every `fixtures/zt/v2/*.zt`, rewritten at 4096-byte alignment in files of at most
//! 8 objects (so each stays under the fuzzer's 64 KiB `-max_len`), plus
//! `align4096.zt` as ztensor wrote it.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value as Json};
use sha2::{Digest as _, Sha256};
use tensorwire_core::{DType, Layout, Result, Shape, Value};
use tensorwire_zt::{Checksum, ComponentData, Compression, WriteOptions, ZtVersion, ZtWriter};

/// Deterministic pseudo-random bytes (an LCG), so every run writes the same files.
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u8
        })
        .collect()
}

fn le<T: Copy, const N: usize>(values: &[T], to: fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|&v| to(v)).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An attribute value as the tagged JSON `make_fixtures.py` uses.
fn tagged(v: &Value) -> Json {
    match v {
        Value::Null => json!(["null"]),
        Value::Bool(b) => json!(["bool", b]),
        Value::Int(i) => json!(["int", i.to_string()]),
        Value::BigInt(i) => json!(["int", i.to_string()]),
        Value::Float(x) => json!(["float", format!("{:016x}", x.to_bits())]),
        Value::Str(s) => json!(["str", s]),
        Value::Bytes(b) => json!(["bytes", hex(b)]),
        Value::List(items) => json!(["list", items.iter().map(tagged).collect::<Vec<_>>()]),
        Value::Map(entries) => json!([
            "map",
            entries
                .iter()
                .map(|(k, v)| json!([k, tagged(v)]))
                .collect::<Vec<_>>()
        ]),
    }
}

fn tagged_map(m: &BTreeMap<String, Value>) -> Json {
    tagged(&Value::Map(
        m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    ))
}

/// One part to write: role, storage dtype, logical type, bytes.
struct Part {
    role: &'static str,
    dtype: DType,
    logical: Option<&'static str>,
    data: Vec<u8>,
}

fn part(role: &'static str, dtype: DType, logical: Option<&'static str>, data: Vec<u8>) -> Part {
    Part {
        role,
        dtype,
        logical,
        data,
    }
}

/// Writes one file and its expectations as tensors are added.
struct File {
    name: String,
    writer: ZtWriter<std::io::BufWriter<std::fs::File>>,
    expected: serde_json::Map<String, Json>,
    objects: serde_json::Map<String, Json>,
    order: Vec<String>,
}

impl File {
    fn new(dir: &Path, name: &str, alignment: u64) -> Result<File> {
        let mut writer =
            ZtWriter::create_with_version(dir.join(format!("{name}.zt")), ZtVersion::V2)?;
        writer.set_alignment(alignment)?;
        let mut expected = serde_json::Map::new();
        expected.insert("made_by".into(), json!("tensorwire ZtWriter (version 2)"));
        expected.insert("align".into(), json!(alignment));
        expected.insert("attributes".into(), Json::Null);
        Ok(File {
            name: name.to_owned(),
            writer,
            expected,
            objects: serde_json::Map::new(),
            order: Vec::new(),
        })
    }

    fn attributes(&mut self, attrs: BTreeMap<String, Value>) {
        self.expected
            .insert("attributes".into(), tagged_map(&attrs));
        self.writer
            .set_attributes(attrs)
            .expect("the fixture attributes fit a .zt 2 file");
    }

    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        name: &str,
        shape: &[u64],
        layout: Layout,
        layout_id: &str,
        attributes: Option<BTreeMap<String, Value>>,
        parts: Vec<Part>,
        options: WriteOptions,
    ) -> Result<()> {
        let comps: Vec<ComponentData<'_>> = parts
            .iter()
            .map(|p| ComponentData {
                role: p.role,
                dtype: p.dtype,
                logical_type: p.logical,
                data: &p.data,
            })
            .collect();
        self.writer.add_object(
            name,
            &Shape::new(shape.to_vec())?,
            layout,
            attributes.clone(),
            &comps,
            options,
        )?;
        let mut out = serde_json::Map::new();
        let mut sorted: Vec<&Part> = parts.iter().collect();
        sorted.sort_by_key(|p| p.role);
        for p in sorted {
            let (dtype, logical) = match (p.dtype, p.logical) {
                (DType::Bool, _) => ("u8", Some("bool")),
                (d, l) => (d.name(), l),
            };
            out.insert(
                p.role.to_owned(),
                json!({
                    "dtype": dtype,
                    "type": logical,
                    "encoding": match options.compression {
                        Compression::Raw => Json::Null,
                        Compression::Zstd(_) => json!(tensorwire_zt::ZSTD_SEEKABLE),
                    },
                    "digest": match options.checksum {
                        Checksum::None => Json::Null,
                        other => json!(other.name()),
                    },
                    "nbytes": p.data.len(),
                    "sha256": hex(&Sha256::digest(&p.data)),
                    "hex": (p.data.len() <= 512).then(|| hex(&p.data)),
                }),
            );
        }
        self.objects.insert(
            name.to_owned(),
            json!({
                "layout": layout_id,
                "shape": shape,
                "attributes": attributes.as_ref().filter(|a| !a.is_empty()).map(tagged_map),
                "parts": out,
            }),
        );
        self.order.push(name.to_owned());
        Ok(())
    }

    fn dense(&mut self, name: &str, shape: &[u64], p: Part, options: WriteOptions) -> Result<()> {
        self.add(name, shape, Layout::Dense, "dense", None, vec![p], options)
    }

    /// Finishes the file. `rewrite` says how ztensor 2.x can write the same input,
    /// for a byte comparison (`None` when it cannot, e.g. sha256 digests).
    fn finish(mut self, dir: &Path, rewrite: Option<Json>) -> Result<()> {
        self.writer.finish()?;
        self.expected
            .insert("write_order".into(), json!(self.order));
        self.expected
            .insert("objects".into(), Json::Object(self.objects));
        self.expected
            .insert("rewrite_with_ztensor".into(), rewrite.unwrap_or(Json::Null));
        let text = serde_json::to_string_pretty(&Json::Object(self.expected)).map_err(|e| {
            tensorwire_core::Error::invalid(format!("cannot encode expectations: {e}"))
        })?;
        std::fs::write(
            dir.join(format!("{}.expected.json", self.name)),
            text + "\n",
        )?;
        Ok(())
    }
}

/// A dense sample: name, storage dtype, logical type, shape, bytes.
type Sample = (&'static str, DType, Option<&'static str>, Vec<u64>, Vec<u8>);

const RAW_XXH3: WriteOptions = WriteOptions {
    compression: Compression::Raw,
    checksum: Checksum::Xxh3,
};

/// Writes every sample file into `dir` (created if missing).
pub fn write_all(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;

    // 1. Canonical form: ascending names, raw, xxh3, 64 KiB: ztensor.Writer(path).
    let mut f = File::new(dir, "ours_canonical", 65536)?;
    f.dense(
        "a.bias",
        &[4],
        part(
            "data",
            DType::F32,
            None,
            le(&[0.5f32, -1.0, 3.25, 0.0], f32::to_le_bytes),
        ),
        RAW_XXH3,
    )?;
    f.dense(
        "a.weight",
        &[2, 3],
        part(
            "data",
            DType::F32,
            None,
            le(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], f32::to_le_bytes),
        ),
        RAW_XXH3,
    )?;
    // Same bytes as a.bias: one shared blob, as ztensor shares them.
    f.dense(
        "b.tied",
        &[4],
        part(
            "data",
            DType::F32,
            None,
            le(&[0.5f32, -1.0, 3.25, 0.0], f32::to_le_bytes),
        ),
        RAW_XXH3,
    )?;
    f.dense(
        "c.empty",
        &[0, 3],
        part("data", DType::F16, None, Vec::new()),
        RAW_XXH3,
    )?;
    f.dense(
        "d.scalar",
        &[],
        part("data", DType::I64, None, le(&[-7i64], i64::to_le_bytes)),
        RAW_XXH3,
    )?;
    f.dense(
        "e.mask",
        &[5],
        part("data", DType::Bool, None, vec![1, 0, 0, 1, 1]),
        RAW_XXH3,
    )?;
    f.dense(
        "f.noise",
        &[100, 100],
        part("data", DType::U8, None, noise(10_000, 1)),
        RAW_XXH3,
    )?;
    f.finish(dir, Some(json!({"canonical": true, "align": Json::Null})))?;

    // 2. Every dtype and logical type, raw with xxh3 (not sorted: non-canonical order).
    let mut f = File::new(dir, "ours_dtypes", 65536)?;
    let all: Vec<Sample> = vec![
        (
            "z_f64",
            DType::F64,
            None,
            vec![3],
            le(&[1.5f64, f64::NAN, -0.0], f64::to_le_bytes),
        ),
        (
            "f32",
            DType::F32,
            None,
            vec![2, 2],
            le(&[f32::INFINITY, 1e-45, -2.0, 0.1], f32::to_le_bytes),
        ),
        (
            "f16",
            DType::F16,
            None,
            vec![3],
            le(&[0x3c00u16, 0x7c00, 0x0001], u16::to_le_bytes),
        ),
        (
            "bf16",
            DType::BF16,
            None,
            vec![2],
            le(&[0x3f80u16, 0xc000], u16::to_le_bytes),
        ),
        (
            "i64",
            DType::I64,
            None,
            vec![2],
            le(&[i64::MIN, i64::MAX], i64::to_le_bytes),
        ),
        (
            "i32",
            DType::I32,
            None,
            vec![2],
            le(&[i32::MIN, 5], i32::to_le_bytes),
        ),
        (
            "i16",
            DType::I16,
            None,
            vec![2],
            le(&[i16::MIN, -1], i16::to_le_bytes),
        ),
        ("i8", DType::I8, None, vec![2], vec![0x80, 0x7f]),
        (
            "u64",
            DType::U64,
            None,
            vec![1],
            le(&[u64::MAX], u64::to_le_bytes),
        ),
        (
            "u32",
            DType::U32,
            None,
            vec![2],
            le(&[0u32, u32::MAX], u32::to_le_bytes),
        ),
        (
            "u16",
            DType::U16,
            None,
            vec![1],
            le(&[65535u16], u16::to_le_bytes),
        ),
        ("u8", DType::U8, None, vec![2, 2, 2], (0..8).collect()),
        ("bool", DType::U8, Some("bool"), vec![3], vec![1, 0, 1]),
        (
            "f8_e4m3fn",
            DType::U8,
            Some("f8_e4m3fn"),
            vec![2],
            vec![0x38, 0x7e],
        ),
        (
            "f8_e5m2",
            DType::U8,
            Some("f8_e5m2"),
            vec![2],
            vec![0x3c, 0xfc],
        ),
        (
            "f8_e4m3fnuz",
            DType::U8,
            Some("f8_e4m3fnuz"),
            vec![1],
            vec![0x40],
        ),
        (
            "f8_e5m2fnuz",
            DType::U8,
            Some("f8_e5m2fnuz"),
            vec![1],
            vec![0x40],
        ),
        (
            "f8_e8m0",
            DType::U8,
            Some("f8_e8m0"),
            vec![2],
            vec![0x7f, 0x80],
        ),
        (
            "f4_e2m1",
            DType::U8,
            Some("f4_e2m1"),
            vec![3],
            vec![0x21, 0x03],
        ),
        (
            "complex64",
            DType::F32,
            Some("complex64"),
            vec![2],
            le(&[1.0f32, 2.0, -3.0, 0.5], f32::to_le_bytes),
        ),
        (
            "complex128",
            DType::F64,
            Some("complex128"),
            vec![1],
            le(&[1.0f64, -1.0], f64::to_le_bytes),
        ),
    ];
    for (name, dtype, logical, shape, data) in all {
        f.dense(name, &shape, part("data", dtype, logical, data), RAW_XXH3)?;
    }
    f.finish(dir, Some(json!({"canonical": false, "align": Json::Null})))?;

    // 3. zstd-seekable (multi-frame, empty, incompressible) beside raw parts,
    //    attributes, 4 KiB placement: ztensor.Writer(path, canonical=False, align=4096).
    let mut f = File::new(dir, "ours_compressed", 4096)?;
    let attrs: BTreeMap<String, Value> = [
        ("model", Value::Str("tiny".into())),
        ("layers", Value::Int(2)),
        ("eps", Value::Float(1e-5)),
        ("ratio", Value::Float(0.5)),
        ("neg", Value::Int(-3)),
        (
            "flags",
            Value::List(vec![Value::Bool(true), Value::Null, Value::Float(2.5)]),
        ),
        (
            "nested",
            Value::Map(vec![
                ("b".into(), Value::Int(1)),
                ("a".into(), Value::Str("x".into())),
            ]),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    f.attributes(attrs);
    let zstd = WriteOptions {
        compression: Compression::Zstd(3),
        checksum: Checksum::Xxh3,
    };
    let ramp: Vec<u8> = (0..2_500_000u32 / 4)
        .flat_map(|i| (i % 1000).to_le_bytes())
        .collect();
    f.dense(
        "ramp",
        &[625_000],
        part("data", DType::U32, None, ramp),
        zstd,
    )?;
    f.dense(
        "empty",
        &[0],
        part("data", DType::F32, None, Vec::new()),
        zstd,
    )?;
    f.dense(
        "noise",
        &[1000],
        part("data", DType::U8, None, noise(1000, 2)),
        zstd,
    )?;
    f.dense(
        "raw",
        &[3],
        part(
            "data",
            DType::I16,
            None,
            le(&[1i16, -2, 3], i16::to_le_bytes),
        ),
        RAW_XXH3,
    )?;
    let tensor_attrs: BTreeMap<String, Value> = [("unit".to_owned(), Value::Str("m/s".into()))]
        .into_iter()
        .collect();
    f.add(
        "with_attrs",
        &[2],
        Layout::Dense,
        "dense",
        Some(tensor_attrs),
        vec![part(
            "data",
            DType::F64,
            None,
            le(&[1.0f64, 2.0], f64::to_le_bytes),
        )],
        zstd,
    )?;
    f.add(
        "csr",
        &[3, 4],
        Layout::SparseCsr,
        "zt.sparse_csr/1",
        None,
        vec![
            part(
                "values",
                DType::F32,
                None,
                le(&[1.0f32, 2.0, 3.0], f32::to_le_bytes),
            ),
            part(
                "indices",
                DType::U32,
                None,
                le(&[0u32, 2, 3], u32::to_le_bytes),
            ),
            part(
                "indptr",
                DType::U32,
                None,
                le(&[0u32, 1, 1, 3], u32::to_le_bytes),
            ),
        ],
        RAW_XXH3,
    )?;
    f.finish(dir, Some(json!({"canonical": false, "align": 4096})))?;

    // 4. sha256 and no digests (ztensor's writer records xxh3 only: read and verify).
    let mut f = File::new(dir, "ours_sha256", 4096)?;
    // Byte strings are valid attribute values in version 2 (ztensor's Python writer
    // refuses them, its reader accepts them).
    f.attributes(
        [
            ("raw".to_owned(), Value::Bytes(vec![0, 1, 254, 255])),
            ("big_neg".to_owned(), Value::Int(-(1i128 << 64))),
        ]
        .into_iter()
        .collect(),
    );
    let sha = WriteOptions {
        compression: Compression::Raw,
        checksum: Checksum::Sha256,
    };
    f.dense(
        "a",
        &[2, 2],
        part(
            "data",
            DType::F32,
            None,
            le(&[1.0f32, 2.0, 3.0, 4.0], f32::to_le_bytes),
        ),
        sha,
    )?;
    f.dense(
        "b",
        &[300],
        part(
            "data",
            DType::I32,
            None,
            le(&(0..300).collect::<Vec<i32>>(), i32::to_le_bytes),
        ),
        WriteOptions {
            compression: Compression::Zstd(3),
            checksum: Checksum::Sha256,
        },
    )?;
    f.dense(
        "c",
        &[2],
        part("data", DType::U8, None, vec![7, 8]),
        WriteOptions::default(),
    )?;
    f.add(
        "q",
        &[4, 8],
        Layout::Other("zt.quant_group/1".into()),
        "zt.quant_group/1",
        Some(
            [("group_size".to_owned(), Value::Int(32))]
                .into_iter()
                .collect(),
        ),
        vec![
            part("data", DType::U8, Some("f4_e2m1"), (0..16).collect()),
            part("scales", DType::U8, Some("f8_e8m0"), vec![127]),
        ],
        sha,
    )?;
    f.finish(dir, None)?;
    Ok(())
}

/// Writes the fuzz seeds (see the module doc) into `dir`; returns how many.
pub fn write_seeds(dir: &Path) -> Result<usize> {
    use tensorwire_core::TensorSource;
    use tensorwire_zt::{Encoding, ZtReader};
    std::fs::create_dir_all(dir)?;
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/zt/v2");
    let mut paths: Vec<_> = std::fs::read_dir(&fixtures)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "zt"))
        .collect();
    paths.sort();
    let mut count = 0;
    for path in paths {
        let stem = path
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let reader = ZtReader::open(&path)?;
        if std::fs::metadata(&path)?.len() <= 65536 {
            std::fs::copy(&path, dir.join(format!("{stem}.zt")))?;
            count += 1;
        }
        let objects = reader.objects();
        let groups: Vec<&[tensorwire_zt::Object]> = if objects.is_empty() {
            vec![&[]]
        } else {
            objects.chunks(8).collect()
        };
        for (g, group) in groups.into_iter().enumerate() {
            let mut w = ZtWriter::with_version(Vec::new(), ZtVersion::V2)?;
            w.set_alignment(4096)?;
            w.set_attributes(reader.attributes().clone())?;
            for obj in group {
                let options = WriteOptions {
                    compression: match obj.components[0].encoding {
                        Encoding::Raw => Compression::Raw,
                        _ => Compression::Zstd(3),
                    },
                    checksum: obj.components[0]
                        .digest
                        .as_ref()
                        .map_or(Checksum::None, |d| d.checksum()),
                };
                w.copy_object(&reader, &obj.name, options)?;
            }
            let bytes = w.finish_into()?;
            if bytes.len() <= 65536 {
                std::fs::write(dir.join(format!("{stem}-{g}.zt")), bytes)?;
                count += 1;
            }
        }
    }
    Ok(count)
}

#[allow(dead_code)]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [flag, dir] if flag == "--seeds" => {
            write_seeds(Path::new(dir)).map(|n| format!("wrote {n} zt2_reader fuzz seeds to {dir}"))
        }
        [dir] => write_all(Path::new(dir)).map(|()| format!("wrote .zt 2 samples to {dir}")),
        _ => write_all(Path::new("target/zt2-ours"))
            .map(|()| "wrote .zt 2 samples to target/zt2-ours".to_owned()),
    };
    match result {
        Ok(msg) => println!("{msg}"),
        Err(e) => {
            eprintln!("write_v2: {e}");
            std::process::exit(1);
        }
    }
}
