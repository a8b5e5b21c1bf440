//! Writes a seed corpus for `zt_reader`: small valid `.zt` files made with `ZtWriter`
//! (every dtype, zstd, digests, sparse layouts, attributes), the fixtures under
//! `fixtures/zt/` when present, and truncated / bit-flipped variants of each.
//!
//! cargo run --release --example gen_seeds -- corpus/zt_reader

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tensorwire_core::{DType, Layout, Shape, Value};
use tensorwire_zt::{Checksum, ComponentData, Compression, WriteOptions, ZtWriter};

fn opts(compression: Compression, checksum: Checksum) -> WriteOptions {
    WriteOptions {
        compression,
        checksum,
    }
}

fn bytes(n: u64) -> Vec<u8> {
    (0..n).map(|i| (i * 37 + 11) as u8).collect()
}

fn dense(tensors: &[(&str, DType, &[u64])], o: WriteOptions) -> Vec<u8> {
    let mut w = ZtWriter::new(Vec::new()).unwrap();
    for (name, dtype, dims) in tensors {
        let shape = Shape::new(dims.to_vec()).unwrap();
        let data = bytes(shape.byte_len(*dtype).unwrap());
        w.add_dense(name, *dtype, &shape, &data, o).unwrap();
    }
    w.finish_into().unwrap()
}

fn generated() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let raw = opts(Compression::Raw, Checksum::None);
    out.push(("empty".into(), ZtWriter::new(Vec::new()).unwrap().finish_into().unwrap()));
    out.push(("one_f32".into(), dense(&[("w", DType::F32, &[2, 3])], raw)));
    out.push(("scalar".into(), dense(&[("s", DType::I64, &[])], raw)));
    out.push(("zero_dim".into(), dense(&[("z", DType::F16, &[0, 4])], raw)));
    for (i, d) in DType::ALL.iter().enumerate() {
        if matches!(d, DType::QInt8 | DType::QUInt8 | DType::QInt4 | DType::QUInt4) {
            continue;
        }
        out.push((format!("dtype_{}", d.name()), dense(&[("t", *d, &[3])], raw)));
        let _ = i;
    }
    let all: Vec<(&str, DType, &[u64])> = vec![
        ("a", DType::F32, &[4]),
        ("b", DType::BF16, &[2, 2]),
        ("c", DType::Complex64, &[2]),
        ("d", DType::F8E4M3Fn, &[5]),
        ("e", DType::Bool, &[3]),
    ];
    for (c, cn) in [
        (Compression::Raw, "raw"),
        (Compression::Zstd(3), "zstd"),
    ] {
        for (k, kn) in [
            (Checksum::None, "none"),
            (Checksum::Crc32c, "crc"),
            (Checksum::Sha256, "sha"),
        ] {
            out.push((format!("multi_{cn}_{kn}"), dense(&all, opts(c, k))));
        }
    }
    // Sparse, quantized and unknown layouts, with attributes.
    let mut w = ZtWriter::new(Vec::new()).unwrap();
    let mut attrs = BTreeMap::new();
    attrs.insert("model".to_owned(), Value::Str("tiny".into()));
    attrs.insert("n".to_owned(), Value::Int(-5));
    attrs.insert(
        "nested".to_owned(),
        Value::Map(vec![
            ("x".into(), Value::List(vec![Value::Float(1.5), Value::Null, Value::Bool(true)])),
            ("b".into(), Value::Bytes(vec![1, 2, 3])),
        ]),
    );
    w.set_attributes(attrs.clone()).expect("seed attributes fit a file");
    let vals = bytes(12);
    let idx = bytes(24);
    let ptr = bytes(16);
    w.add_object(
        "csr",
        &Shape::new(vec![3, 4]).unwrap(),
        Layout::SparseCsr,
        Some(attrs.clone()),
        &[
            ComponentData { role: "values", dtype: DType::F32, logical_type: None, data: &vals },
            ComponentData { role: "indices", dtype: DType::I64, logical_type: None, data: &idx },
            ComponentData { role: "indptr", dtype: DType::I32, logical_type: None, data: &ptr },
        ],
        opts(Compression::Raw, Checksum::Crc32c),
    )
    .unwrap();
    w.add_object(
        "coo",
        &Shape::new(vec![4, 4]).unwrap(),
        Layout::SparseCoo,
        None,
        &[
            ComponentData { role: "values", dtype: DType::F32, logical_type: None, data: &vals },
            ComponentData { role: "coords", dtype: DType::I64, logical_type: None, data: &idx },
        ],
        opts(Compression::Zstd(1), Checksum::Sha256),
    )
    .unwrap();
    w.add_object(
        "q",
        &Shape::new(vec![8]).unwrap(),
        Layout::QuantizedGroup,
        None,
        &[
            ComponentData { role: "packed_weight", dtype: DType::U8, logical_type: Some("qint4"), data: &bytes(4) },
            ComponentData { role: "scales", dtype: DType::F16, logical_type: None, data: &bytes(4) },
        ],
        opts(Compression::Raw, Checksum::None),
    )
    .unwrap();
    w.add_object(
        "weird",
        &Shape::new(vec![2]).unwrap(),
        Layout::Other("my_layout".into()),
        Some(BTreeMap::new()),
        &[ComponentData { role: "blob", dtype: DType::U8, logical_type: Some("mystery"), data: &bytes(7) }],
        opts(Compression::Raw, Checksum::None),
    )
    .unwrap();
    let data = bytes(16);
    w.add_dense_with_attributes(
        "dense",
        DType::F32,
        &Shape::new(vec![4]).unwrap(),
        &data,
        Some(attrs),
        opts(Compression::Zstd(3), Checksum::Crc32c),
    )
    .unwrap();
    out.push(("layouts".into(), w.finish_into().unwrap()));
    out
}

/// Truncations and bit flips of a valid file: near the header, in the blobs, in the
/// manifest and in the footer.
fn variants(name: &str, file: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let n = file.len();
    for cut in [n / 2, n.saturating_sub(1), n.saturating_sub(9), n.saturating_sub(17), 16] {
        if cut < n {
            out.push((format!("{name}.trunc{cut}"), file[..cut].to_vec()));
        }
    }
    // Drop the front (the footer still points at the manifest).
    if n > 72 {
        out.push((format!("{name}.nohead"), [&file[..8], &file[72..]].concat()));
    }
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ n as u64;
    for k in 0..6 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        // Bias flips toward the manifest at the end of the file.
        let at = if k % 2 == 0 {
            n - 1 - (state as usize % n.min(200))
        } else {
            state as usize % n
        };
        let mut f = file.to_vec();
        f[at] ^= 1 << (state >> 40) % 8;
        out.push((format!("{name}.flip{k}"), f));
    }
    out
}

fn main() {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "corpus/zt_reader".into()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut files = generated();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/zt");
    if let Ok(entries) = std::fs::read_dir(&fixtures) {
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "zt") {
                let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
                files.push((format!("fixture_{stem}"), std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut count = 0;
    for (name, file) in &files {
        std::fs::write(dir.join(format!("{name}.zt")), file).unwrap();
        count += 1;
        for (vname, v) in variants(name, file) {
            std::fs::write(dir.join(format!("{vname}.zt")), v).unwrap();
            count += 1;
        }
    }
    eprintln!("wrote {count} seeds to {}", dir.display());
}
