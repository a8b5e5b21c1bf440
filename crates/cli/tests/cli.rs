//! End-to-end tests of the `tensorwire` binary: each runs the built executable on files
//! written here with `ZtWriter` (or on the committed fixtures) and checks its output and
//! exit status.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value as J;
use tensorwire::core::{DType, Shape};
use tensorwire::zt::{Checksum, Compression, WriteOptions, ZtReader, ZtWriter};
use tensorwire::Value;

const BIN: &str = env!("CARGO_BIN_EXE_tensorwire");

fn tw<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(BIN)
        .args(args)
        .output()
        .expect("the tensorwire binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).expect("stderr is UTF-8")
}

#[track_caller]
fn assert_exit(o: &Output, code: i32) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "exit status\n--- stdout\n{}\n--- stderr\n{}",
        stdout(o),
        stderr(o)
    );
}

/// A name longer than the table's name column (the JSON keeps it whole).
fn long_name() -> String {
    let mut name = String::from("model");
    for i in 0..30 {
        name.push_str(&format!(".layer{i:02}"));
    }
    name.push_str(".weight");
    name
}

fn f32_bytes(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values.into_iter().flat_map(f32::to_le_bytes).collect()
}

/// Writes a small file: a raw f32 matrix with attributes, a zstd-compressed f32 vector,
/// an i64 vector with a long name, and file attributes. `checksum` goes on every
/// tensor.
fn write_sample(path: &Path, checksum: Checksum) {
    let raw = WriteOptions {
        compression: Compression::Raw,
        checksum,
    };
    let zstd = WriteOptions {
        compression: Compression::Zstd(3),
        checksum,
    };
    let mut w = ZtWriter::create(path).unwrap();
    w.set_attributes(BTreeMap::from([
        ("model".to_owned(), Value::Str("tiny".into())),
        ("layers".to_owned(), Value::Int(2)),
    ]))
    .unwrap();
    w.add_dense_with_attributes(
        "weight",
        DType::F32,
        &Shape::new(vec![2, 3]).unwrap(),
        &f32_bytes((0..6).map(|i| i as f32 * 0.5)),
        Some(BTreeMap::from([(
            "role".to_owned(),
            Value::Str("w".into()),
        )])),
        raw,
    )
    .unwrap();
    w.add_dense(
        "bias",
        DType::F32,
        &Shape::new(vec![256]).unwrap(),
        &f32_bytes(vec![1.0; 256]),
        zstd,
    )
    .unwrap();
    w.add_dense(
        &long_name(),
        DType::I64,
        &Shape::new(vec![2]).unwrap(),
        &[7i64, -7]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<u8>>(),
        raw,
    )
    .unwrap();
    w.finish().unwrap();
}

fn sample(dir: &Path, checksum: Checksum) -> PathBuf {
    let path = dir.join("sample.zt");
    write_sample(&path, checksum);
    path
}

/// Every dense tensor's name, dtype, shape and decoded bytes.
fn contents(path: &Path) -> Vec<(String, DType, Shape, Vec<u8>)> {
    let src = tensorwire::open(path).unwrap();
    src.tensors()
        .iter()
        .map(|t| {
            let view = src.view(&t.name).unwrap();
            (
                t.name.to_string(),
                view.dtype,
                view.shape,
                view.bytes.to_vec(),
            )
        })
        .collect()
}

fn inspect_json(path: &Path) -> J {
    let o = tw([
        OsStr::new("inspect"),
        OsStr::new("--json"),
        path.as_os_str(),
    ]);
    assert_exit(&o, 0);
    serde_json::from_slice(&o.stdout).expect("inspect --json prints JSON")
}

/// Offset of a tensor's first stored byte and its length.
fn stored_span(path: &Path, name: &str) -> (usize, usize) {
    let reader = ZtReader::open(path).unwrap();
    let comp = reader.object(name).unwrap().components[0].clone();
    (comp.offset as usize, comp.length as usize)
}

fn flip_byte(path: &Path, at: usize) {
    let mut bytes = fs::read(path).unwrap();
    bytes[at] ^= 0xFF;
    fs::write(path, bytes).unwrap();
}

#[test]
fn inspect_prints_header_and_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path(), Checksum::None);
    let o = tw([OsStr::new("inspect"), path.as_os_str()]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    let mut lines = out.lines();
    let header = lines.next().unwrap();
    assert!(header.starts_with(&path.display().to_string()), "{header}");
    assert!(header.contains("zt, 3 tensors, 1.0 KiB"), "{header}");
    assert!(header.contains("stored"), "{header}");
    assert!(
        out.contains("attributes:\n  layers: 2\n  model: \"tiny\"\n"),
        "{out}"
    );

    let table: Vec<&str> = out.lines().skip_while(|l| !l.starts_with("NAME")).collect();
    assert_eq!(table.len(), 4, "{out}");
    for col in ["NAME", "DTYPE", "SHAPE", "LAYOUT", "SIZE", "STORED"] {
        assert!(table[0].contains(col), "{}", table[0]);
    }
    assert!(
        !table[0].contains("DIGEST"),
        "no digest column without digests"
    );
    let row = |name: &str| {
        *table
            .iter()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no row for {name} in\n{out}"))
    };
    let weight: Vec<&str> = row("weight ").split_whitespace().collect();
    assert_eq!(
        weight,
        ["weight", "f32", "[2,", "3]", "dense", "24", "B", "-"]
    );
    let bias = row("bias ");
    assert!(bias.contains("1.0 KiB") && bias.contains("zstd"), "{bias}");
    // The long name is cut in the middle, keeping both ends, and never wraps the row.
    let long = row("model.layer00");
    assert!(
        long.contains('…') && long.contains(".weight  i64"),
        "{long}"
    );
    assert!(!out.contains(&long_name()), "{out}");
}

#[test]
fn inspect_shows_digest_column_when_digests_exist() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path(), Checksum::Sha256);
    let o = tw([OsStr::new("inspect"), path.as_os_str()]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert!(out.contains("DIGEST"), "{out}");
    assert_eq!(out.matches("sha256").count(), 3, "{out}");
}

#[test]
fn inspect_json_has_every_field_and_whole_names() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path(), Checksum::Crc32c);
    let doc = inspect_json(&path);
    assert_eq!(doc["format"], "zt");
    assert_eq!(doc["version"], "1.2.0");
    assert_eq!(doc["path"], path.display().to_string());
    assert_eq!(doc["tensor_count"], 3);
    assert_eq!(doc["total_bytes"], 24 + 1024 + 16);
    assert_eq!(doc["attributes"]["model"], "tiny");
    assert_eq!(doc["attributes"]["layers"], 2);

    let tensors = doc["tensors"].as_array().unwrap();
    let by_name = |name: &str| {
        tensors
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no tensor {name} in {doc}"))
    };
    let weight = by_name("weight");
    assert_eq!(weight["dtype"], "f32");
    assert_eq!(weight["shape"], serde_json::json!([2, 3]));
    assert_eq!(weight["layout"], "dense");
    assert_eq!(weight["nbytes"], 24);
    assert_eq!(weight["stored_bytes"], 24);
    assert_eq!(weight["encoding"], J::Null);
    assert_eq!(weight["attributes"]["role"], "w");
    let comp = &weight["components"][0];
    assert_eq!(comp["role"], "data");
    assert_eq!(comp["encoding"], "raw");
    assert!(comp["digest"].as_str().unwrap().starts_with("crc32c:0x"));
    assert_eq!(comp["offset"], weight["offset"]);

    let bias = by_name("bias");
    assert_eq!(bias["encoding"], "zstd");
    assert_eq!(bias["nbytes"], 1024);
    assert!(bias["stored_bytes"].as_u64().unwrap() < 1024);
    assert_eq!(bias["components"][0]["uncompressed_length"], 1024);

    let long = by_name(&long_name());
    assert_eq!(long["dtype"], "i64");
    assert_eq!(long["shape"], serde_json::json!([2]));
}

#[test]
fn convert_round_trip_compressed_with_crc32c() {
    let dir = tempfile::tempdir().unwrap();
    let src = sample(dir.path(), Checksum::None);
    let dst = dir.path().join("out.zt");
    let o = tw([
        OsStr::new("convert"),
        src.as_os_str(),
        dst.as_os_str(),
        OsStr::new("--compress"),
        OsStr::new("--checksum"),
        OsStr::new("crc32c"),
    ]);
    assert_exit(&o, 0);
    let summary = stdout(&o);
    assert_eq!(summary.lines().count(), 1, "{summary}");
    assert!(
        summary.starts_with("converted 3 tensors (1.0 KiB) to "),
        "{summary}"
    );
    assert!(
        summary.contains(" s, ") && summary.contains("MB/s"),
        "{summary}"
    );
    assert!(
        stderr(&o).is_empty(),
        "no progress bar off a terminal: {}",
        stderr(&o)
    );

    let doc = inspect_json(&dst);
    assert_eq!(doc["attributes"]["model"], "tiny");
    for t in doc["tensors"].as_array().unwrap() {
        assert_eq!(t["encoding"], "zstd", "{t}");
        let digest = t["components"][0]["digest"].as_str().unwrap();
        assert!(digest.starts_with("crc32c:0x"), "{t}");
    }
    assert_eq!(
        doc["tensors"].as_array().unwrap()[0]["attributes"],
        inspect_json(&src)["tensors"].as_array().unwrap()[0]["attributes"]
    );

    let o = tw([OsStr::new("verify"), dst.as_os_str()]);
    assert_exit(&o, 0);
    assert_eq!(stdout(&o), "ok: 3 tensors, 3 digests checked\n");

    assert_eq!(contents(&src), contents(&dst));
}

#[test]
fn convert_takes_a_compression_level_and_sha256() {
    let dir = tempfile::tempdir().unwrap();
    let src = sample(dir.path(), Checksum::Crc32c);
    let dst = dir.path().join("out.zt");
    let o = tw([
        OsStr::new("convert"),
        src.as_os_str(),
        dst.as_os_str(),
        OsStr::new("--compress=19"),
        OsStr::new("--checksum=sha256"),
        OsStr::new("--format"),
        OsStr::new("zt"),
    ]);
    assert_exit(&o, 0);
    let doc = inspect_json(&dst);
    for t in doc["tensors"].as_array().unwrap() {
        assert_eq!(t["encoding"], "zstd", "{t}");
        assert!(t["components"][0]["digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:"));
    }
    assert_eq!(contents(&src), contents(&dst));

    // Without --compress the output is raw and zero-copy readable again.
    let raw = dir.path().join("raw.zt");
    let o = tw([OsStr::new("convert"), dst.as_os_str(), raw.as_os_str()]);
    assert_exit(&o, 0);
    let doc = inspect_json(&raw);
    for t in doc["tensors"].as_array().unwrap() {
        assert_eq!(t["encoding"], J::Null, "{t}");
        assert_eq!(t["components"][0]["digest"], J::Null, "{t}");
    }
    assert_eq!(contents(&src), contents(&raw));
}

#[test]
fn convert_refuses_to_overwrite_its_source() {
    let dir = tempfile::tempdir().unwrap();
    let src = sample(dir.path(), Checksum::None);
    let before = fs::read(&src).unwrap();
    // The same file under another spelling, and through a hard link.
    let dotted = dir.path().join(".").join("sample.zt");
    let linked = dir.path().join("linked.zt");
    fs::hard_link(&src, &linked).unwrap();
    for dst in [&src, &dotted, &linked] {
        let o = tw([
            OsStr::new("convert"),
            src.as_os_str(),
            dst.as_os_str(),
            OsStr::new("--compress"),
        ]);
        assert_exit(&o, 2);
        let err = stderr(&o);
        assert!(
            err.starts_with("error: invalid argument: refusing to overwrite the source"),
            "{err}"
        );
    }
    assert_eq!(fs::read(&src).unwrap(), before);
}

#[cfg(unix)]
#[test]
fn convert_writes_through_a_link_and_keeps_the_mode() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let src = sample(dir.path(), Checksum::None);
    for ext in ["zt", "safetensors"] {
        let target = dir.path().join(format!("release.{ext}"));
        fs::write(&target, b"old").unwrap();
        fs::set_permissions(&target, fs::Permissions::from_mode(0o640)).unwrap();
        let link = dir.path().join(format!("current.{ext}"));
        symlink(&target, &link).unwrap();
        let o = tw([OsStr::new("convert"), src.as_os_str(), link.as_os_str()]);
        assert_exit(&o, 0);
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink(),
            "the link was replaced by a file"
        );
        assert_ne!(
            fs::read(&target).unwrap(),
            b"old",
            "the target was not rewritten"
        );
        let mode = fs::metadata(&target).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640, "{ext}");
        let o = tw([OsStr::new("verify"), link.as_os_str()]);
        assert_exit(&o, 0);
    }
}

#[test]
fn convert_to_an_unsupported_extension_fails_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let src = sample(dir.path(), Checksum::None);
    assert_convert_refused(&src, &dir.path().join("out.gguf"), "unsupported");
}

/// `tensorwire convert src dst` exits 2, says `says` and leaves no `dst`.
fn assert_convert_refused(src: &Path, dst: &Path, says: &str) {
    let o = tw([OsStr::new("convert"), src.as_os_str(), dst.as_os_str()]);
    assert_exit(&o, 2);
    assert!(stderr(&o).contains(says), "{}", stderr(&o));
    assert!(!dst.exists());
}

#[test]
fn convert_takes_extensions_in_any_case_and_refuses_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let src = sample(dir.path(), Checksum::None);
    let upper = dir.path().join("OUT.ZT");
    let o = tw([OsStr::new("convert"), src.as_os_str(), upper.as_os_str()]);
    assert_exit(&o, 0);
    assert!(ZtReader::open(&upper).is_ok());
    let o = tw([
        OsStr::new("convert"),
        src.as_os_str(),
        dir.path().as_os_str(),
    ]);
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("is a directory"), "{}", stderr(&o));
}

#[test]
fn verify_counts_tensors_and_digests() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path(), Checksum::None);
    let o = tw([OsStr::new("verify"), path.as_os_str()]);
    assert_exit(&o, 0);
    assert_eq!(stdout(&o), "ok: 3 tensors, 0 digests checked\n");
}

#[test]
fn verify_and_bench_read_types_without_a_dtype_as_their_components() {
    // ztensor 2.1.2's fixture holds `f4_e2m1` and `f8_e8m0` tensors, which have no
    // tensorwire dtype: verify reads their bytes, bench skips them.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/zt/v2/dtypes.zt");
    let o = tw([OsStr::new("verify"), path.as_os_str()]);
    assert_exit(&o, 0);
    assert!(stdout(&o).starts_with("ok: "), "{}", stdout(&o));
    let o = tw([OsStr::new("inspect"), path.as_os_str()]);
    assert_exit(&o, 0);
    assert!(stdout(&o).contains("f4_e2m1 (u8)"), "{}", stdout(&o));
    // Listed as its 4 bytes; shown with its logical shape.
    let row = stdout(&o)
        .lines()
        .find(|l| l.starts_with("f4_e2m1 "))
        .map(str::to_owned);
    assert!(
        row.as_deref().is_some_and(|r| r.contains(" [7] ")),
        "{row:?}"
    );
    let o = tw([
        OsStr::new("bench"),
        path.as_os_str(),
        OsStr::new("--repeat"),
        OsStr::new("1"),
    ]);
    assert_exit(&o, 0);
    assert!(
        stdout(&o).contains("tensors without a dense view"),
        "{}",
        stdout(&o)
    );
    // They convert to .zt 2 with their types. 1.x stores one value per byte, so
    // f4_e2m1 goes there as torch's pairs along the last dimension: this one's is odd,
    // and it is refused with a message that says so.
    let dir = tempfile::tempdir().unwrap();
    let v2 = dir.path().join("v2.zt");
    let o = tw([
        OsStr::new("convert"),
        path.as_os_str(),
        v2.as_os_str(),
        OsStr::new("--zt-version"),
        OsStr::new("2"),
    ]);
    assert_exit(&o, 0);
    let o = tw([OsStr::new("verify"), v2.as_os_str()]);
    assert_exit(&o, 0);
    assert_convert_refused(
        &path,
        &dir.path().join("v1.zt"),
        "f4_e2m1 tensor `f4_e2m1` of shape [7] to .zt 1.x",
    );
}

#[test]
fn verify_fails_on_a_flipped_byte_in_a_checksummed_blob() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path(), Checksum::Crc32c);
    let (offset, len) = stored_span(&path, "weight");
    flip_byte(&path, offset + len / 2);

    let o = tw([OsStr::new("verify"), path.as_os_str()]);
    assert_exit(&o, 1);
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(
        err.contains("tensor `weight/data`: crc32c digest mismatch"),
        "{err}"
    );
    // The path and the reason are each said once.
    assert_eq!(err.matches("digest mismatch").count(), 1, "{err}");
    assert_eq!(err.matches("sample.zt").count(), 1, "{err}");
}

#[test]
fn error_messages_escape_control_characters_from_the_file() {
    // A tensor name that would rewrite the terminal line to a success message.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("evil.zt");
    let name = "w\r\x1b[2Kok: 1 tensor, 1 digest checked\x1b[8m";
    let mut w = ZtWriter::create(&path).unwrap();
    let checked = WriteOptions {
        compression: Compression::Raw,
        checksum: Checksum::Crc32c,
    };
    let data = f32_bytes([1.0, 2.0, 3.0, 4.0]);
    w.add_dense(
        name,
        DType::F32,
        &Shape::new(vec![4]).unwrap(),
        &data,
        checked,
    )
    .unwrap();
    w.finish().unwrap();
    let (offset, len) = stored_span(&path, name);
    flip_byte(&path, offset + len / 2);

    let o = tw([OsStr::new("verify"), path.as_os_str()]);
    assert_exit(&o, 1);
    let err = stderr(&o);
    assert!(!err.trim_end().chars().any(char::is_control), "{err:?}");
    assert!(err.contains("w\\r\\u{1b}[2Kok"), "{err:?}");
    assert!(err.contains("digest mismatch"), "{err:?}");
}

#[test]
fn verify_fails_on_an_undecodable_blob_without_digest() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path(), Checksum::None);
    // Break the zstd frame's magic number: no digest catches it, decoding does.
    let (offset, _) = stored_span(&path, "bias");
    flip_byte(&path, offset);

    let o = tw([OsStr::new("verify"), path.as_os_str()]);
    assert_exit(&o, 1);
    let err = stderr(&o);
    assert!(
        err.contains("tensor `bias/data`: cannot decode zstd data"),
        "{err}"
    );
}

#[test]
fn usage_errors_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path(), Checksum::None);
    let out = dir.path().join("out.zt");
    let p = path.to_str().unwrap();
    let o = out.to_str().unwrap();
    let cases: &[&[&str]] = &[
        &[],
        &["frobnicate"],
        &["inspect"],
        &["inspect", p, "--yaml"],
        &["convert", p],
        &["convert", p, o, "--compress=0"],
        &["convert", p, o, "--compress=23"],
        &["convert", p, o, "--compress=fast"],
        &["convert", p, o, "--checksum", "md5"],
        &["convert", p, o, "--format", "gguf"],
        &["bench", p, "--repeat", "0"],
        &["verify", p, "extra"],
    ];
    for args in cases {
        let r = tw(*args);
        assert_exit(&r, 2);
        let err = stderr(&r);
        assert!(
            err.starts_with("error: ") || err.contains("\nUsage: "),
            "{args:?}: {err}"
        );
    }
    assert!(!out.exists());

    let missing = dir.path().join("missing.zt");
    for cmd in ["inspect", "verify", "bench"] {
        let r = tw([OsStr::new(cmd), missing.as_os_str()]);
        assert_exit(&r, 2);
        let err = stderr(&r);
        assert!(err.starts_with("error: "), "{err}");
        assert!(
            err.contains("missing.zt") && err.contains("No such file"),
            "{err}"
        );
    }
}

#[test]
fn a_non_tensor_file_is_an_unrecognised_format() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    fs::write(&path, "just some text, not tensors\n").unwrap();
    for cmd in ["inspect", "verify", "bench"] {
        let o = tw([OsStr::new(cmd), path.as_os_str()]);
        assert_exit(&o, 2);
        let err = stderr(&o);
        assert!(err.starts_with("error: "), "{err}");
        assert!(err.contains("notes.txt: unrecognised format"), "{err}");
    }
    let o = tw([
        OsStr::new("convert"),
        path.as_os_str(),
        dir.path().join("out.zt").as_os_str(),
    ]);
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("unrecognised format"), "{}", stderr(&o));
}

#[test]
fn a_truncated_file_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path(), Checksum::None);
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    let o = tw([OsStr::new("verify"), path.as_os_str()]);
    assert_exit(&o, 1);
    assert!(stderr(&o).starts_with("error: "), "{}", stderr(&o));
}

#[test]
fn bench_reports_median_times() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path(), Checksum::None);
    let o = tw([
        OsStr::new("bench"),
        path.as_os_str(),
        OsStr::new("--repeat"),
        OsStr::new("3"),
    ]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert!(
        out.contains("3 dense tensors") && out.contains("median of 3 runs"),
        "{out}"
    );
    assert!(out.contains("(2 of 3 views zero-copy)"), "{out}");
    let timed: Vec<&str> = out.lines().filter(|l| l.contains(" ms ")).collect();
    assert_eq!(timed.len(), 2, "{out}");
    assert!(timed.iter().all(|l| l.contains("GB/s")), "{out}");
}

#[test]
fn help_documents_exit_codes() {
    for args in [&["--help"][..], &["verify", "--help"]] {
        let o = tw(args);
        assert_exit(&o, 0);
        let out = stdout(&o);
        assert!(out.contains("Exit status:"), "{out}");
        assert!(
            out.contains("1  the file is corrupt or failed verification"),
            "{out}"
        );
        assert!(out.contains("2  usage error"), "{out}");
    }
}

#[test]
fn a_closed_stdout_exits_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many.zt");
    let mut w = ZtWriter::create(&path).unwrap();
    let shape = Shape::new(vec![1]).unwrap();
    for i in 0..5000 {
        w.add_dense(
            &format!("tensor.{i:05}"),
            DType::U8,
            &shape,
            &[0],
            WriteOptions::default(),
        )
        .unwrap();
    }
    w.finish().unwrap();

    // The table, and the JSON (written through serde_json, whose errors hide the
    // io error from the chain).
    for json in [false, true] {
        let mut args = vec![OsStr::new("inspect"), path.as_os_str()];
        if json {
            args.push(OsStr::new("--json"));
        }
        let mut child = Command::new(BIN)
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Read one byte, then hang up, as `| head -c1` would.
        let mut first = [0u8; 1];
        child.stdout.take().unwrap().read_exact(&mut first).unwrap();
        let o = child.wait_with_output().unwrap();
        assert_exit(&o, 0);
        assert!(stderr(&o).is_empty(), "json {json}: {}", stderr(&o));
    }
}

/// The README quick start: convert a committed fixture with `--compress`, inspect and
/// verify the result, and check the data survived.
#[test]
fn quick_start_on_the_fixtures() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/zt");
    let dir = tempfile::tempdir().unwrap();
    let mut seen = 0;
    for entry in fs::read_dir(&fixtures).unwrap() {
        let src = entry.unwrap().path();
        if src.extension() != Some(OsStr::new("zt")) {
            continue;
        }
        seen += 1;
        let dst = dir.path().join(src.file_name().unwrap());
        let o = tw([
            OsStr::new("convert"),
            src.as_os_str(),
            dst.as_os_str(),
            OsStr::new("--compress"),
        ]);
        assert_exit(&o, 0);
        for cmd in ["inspect", "verify"] {
            assert_exit(&tw([OsStr::new(cmd), dst.as_os_str()]), 0);
        }
        assert_eq!(
            inspect_json(&src)["tensor_count"],
            inspect_json(&dst)["tensor_count"],
            "{}",
            src.display()
        );
        let dense = |p: &Path| {
            let src = tensorwire::open(p).unwrap();
            src.tensors()
                .iter()
                .filter(|t| t.layout == tensorwire::Layout::Dense)
                .map(|t| (t.name.clone(), src.view(&t.name).unwrap().bytes.to_vec()))
                .collect::<Vec<_>>()
        };
        assert_eq!(dense(&src), dense(&dst), "{}", src.display());
    }
    assert!(seen > 0, "no fixtures in {}", fixtures.display());
}

/// Every format we read converts to `.zt` (and to safetensors, where safetensors has
/// the types), and the result holds the same tensors as row-major little-endian bytes.
#[test]
fn converts_every_readable_format_to_zt_and_safetensors() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let dir = tempfile::tempdir().unwrap();
    // (file, whether safetensors can hold every tensor: not complex128, not GGUF blocks)
    let sources = [
        ("safetensors/dtypes.safetensors", true),
        ("safetensors/raw_types.safetensors", true),
        ("numpy/fortran.npy", true),
        ("numpy/big_endian.npy", true),
        ("numpy/arrays.npz", false),
        ("numpy/compressed.npz", false),
        ("pytorch/module.pt", true),
        ("pytorch/views.legacy.pt", true),
        ("gguf/plain.gguf", true),
        ("gguf/quantized.gguf", false),
    ];
    let dense = |p: &Path| {
        let src = tensorwire::open(p).unwrap();
        let mut all: Vec<_> = src
            .tensors()
            .iter()
            .map(|t| {
                (
                    t.name.to_string(),
                    src.view(&t.name).unwrap().bytes.to_vec(),
                )
            })
            .collect();
        all.sort();
        all
    };
    for (rel, to_safetensors) in sources {
        let src = fixtures.join(rel);
        assert_exit(&tw([OsStr::new("inspect"), src.as_os_str()]), 0);
        for ext in ["zt", "safetensors"] {
            let dst = dir.path().join(format!("out.{ext}"));
            let o = tw([OsStr::new("convert"), src.as_os_str(), dst.as_os_str()]);
            if ext == "safetensors" && !to_safetensors {
                assert_exit(&o, 2);
                assert!(stderr(&o).contains("unsupported"), "{rel}: {}", stderr(&o));
                assert!(!dst.exists(), "{rel}: a refused conversion left a file");
                continue;
            }
            assert_exit(&o, 0);
            assert_eq!(dense(&src), dense(&dst), "{rel} -> {ext}");
            assert_exit(&tw([OsStr::new("verify"), dst.as_os_str()]), 0);
            fs::remove_file(&dst).unwrap();
        }
    }
    // safetensors has no compression or digests.
    let src = fixtures.join("numpy/c_order.npy");
    let dst = dir.path().join("x.safetensors");
    let o = tw([
        OsStr::new("convert"),
        src.as_os_str(),
        dst.as_os_str(),
        OsStr::new("--compress"),
    ]);
    assert_exit(&o, 2);
    assert!(!dst.exists());
}

/// The path of `fixtures/<rel>` and the table `inspect` prints for it.
fn inspect_fixture(rel: &str) -> (PathBuf, String) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(rel);
    let o = tw([OsStr::new("inspect"), src.as_os_str()]);
    assert_exit(&o, 0);
    (src, stdout(&o))
}

/// A checkpoint's values go to the new file's metadata: a complex number as its
/// text; an int past CBOR's range makes `.zt` refuse, naming the value, and leave no
/// file; safetensors (string metadata) takes it.
#[test]
fn checkpoint_values_carry_over_as_the_format_can_hold_them() {
    let (src, table) = inspect_fixture("pytorch/torch_values.pt");
    assert!(table.contains("(1+2j)"), "{table}");
    let dir = tempfile::tempdir().unwrap();
    // `offset` = -2**70, past CBOR's integers: its decimal text in `.zt`.
    let zt = dir.path().join("out.zt");
    assert_exit(
        &tw([OsStr::new("convert"), src.as_os_str(), zt.as_os_str()]),
        0,
    );
    let converted = tensorwire::open(&zt).unwrap();
    assert_eq!(
        converted.attributes().get("offset"),
        Some(&Value::Str("-1180591620717411303424".into()))
    );
    assert_eq!(
        converted.attributes().get("seed"),
        Some(&Value::Int((1 << 64) - 1))
    );
    let st = dir.path().join("out.safetensors");
    assert_exit(
        &tw([OsStr::new("convert"), src.as_os_str(), st.as_os_str()]),
        0,
    );
    let converted = tensorwire::open(&st).unwrap();
    let phase = converted.attributes().get("phase").and_then(|v| v.as_str());
    assert_eq!(phase, Some("(1+2j)"));
}

/// safetensors has no per-tensor metadata: a `.zt` tensor's attributes (what its
/// packed weights mean) go to `__metadata__` as `<tensor>.<key>`, not lost.
#[test]
fn convert_to_safetensors_keeps_tensor_attributes_in_the_metadata() {
    let (src, _) = inspect_fixture("zt/attributes.zt");
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("out.safetensors");
    assert_exit(
        &tw([OsStr::new("convert"), src.as_os_str(), st.as_os_str()]),
        0,
    );
    let converted = tensorwire::open(&st).unwrap();
    let meta = |k: &str| {
        converted
            .attributes()
            .get(k)
            .and_then(|v| v.as_str().map(str::to_owned))
    };
    assert_eq!(meta("quant_like.bits").as_deref(), Some("4"));
    assert_eq!(meta("quant_like.packing").as_deref(), Some("8_per_i32"));
    assert_eq!(meta("scalars.str").as_deref(), Some("hello"));
    assert!(meta("containers.nested").is_some());
}

/// The DTYPE cell of tensor `name` in `inspect`'s table.
fn dtype_of(table: &str, name: &str) -> String {
    let line = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("{name}: {table}"));
    line.split("  ")
        .filter(|c| !c.is_empty())
        .nth(1)
        .unwrap()
        .trim()
        .to_owned()
}

/// The dtypes only torch has: `inspect` names them over their holder elements;
/// `convert` to `.zt` keeps them, to safetensors refuses complex32 (which it lacks)
/// and writes nothing.
#[test]
fn torch_only_dtypes_are_named_and_converted_where_the_format_has_them() {
    let (src, table) = inspect_fixture("pytorch/torch_only.pt");
    assert_eq!(dtype_of(&table, "e8m0"), "float8_e8m0fnu (u8)");
    assert_eq!(dtype_of(&table, "f4"), "float4_e2m1fn_x2 (u8)");
    assert_eq!(dtype_of(&table, "c32"), "complex32 (f16)");

    let dir = tempfile::tempdir().unwrap();
    assert_convert_refused(&src, &dir.path().join("out.safetensors"), "complex32");
    let zt = dir.path().join("out.zt");
    assert_exit(
        &tw([OsStr::new("convert"), src.as_os_str(), zt.as_os_str()]),
        0,
    );
    let from_zt = tensorwire::open(&zt).unwrap();
    let c32 = from_zt.info("c32").unwrap();
    assert_eq!((c32.dtype, c32.shape.dims()), (DType::F16, &[2, 3, 2][..]));
    assert_eq!(
        c32.attributes.get("tensorwire.layout"),
        Some(&Value::Str("pytorch:complex32".into()))
    );
    // Version 2 has types for two of them: f8_e8m0, and f4_e2m1 counting single
    // values (the pairs' last dimension doubles).
    let zt2 = dir.path().join("out2.zt");
    assert_exit(
        &tw([
            OsStr::new("convert"),
            src.as_os_str(),
            zt2.as_os_str(),
            OsStr::new("--zt-version"),
            OsStr::new("2"),
        ]),
        0,
    );
    let o = tw([OsStr::new("inspect"), zt2.as_os_str()]);
    assert_exit(&o, 0);
    let table = stdout(&o);
    assert_eq!(dtype_of(&table, "e8m0_grid"), "f8_e8m0 (u8)");
    assert_eq!(dtype_of(&table, "f4"), "f4_e2m1 (u8)");
    let f4 = table.lines().find(|l| l.starts_with("f4 ")).unwrap();
    assert!(f4.contains(" [3, 8] "), "{f4}");
    // complex32, which version 2 lacks, keeps its holders and names its dtype.
    assert_eq!(dtype_of(&table, "c32"), "complex32 (f16)");

    // Back to 1.x, f4_e2m1 goes as torch's pairs again, as the direct conversion
    // wrote it; f8_e8m0, which 1.x registers too, keeps its type. Every tensor has
    // the direct conversion's dtype, shape and bytes.
    let back = dir.path().join("back.zt");
    assert_exit(
        &tw([OsStr::new("convert"), zt2.as_os_str(), back.as_os_str()]),
        0,
    );
    let back = tensorwire::open(&back).unwrap();
    assert_eq!(back.tensors().len(), from_zt.tensors().len());
    for want in from_zt.tensors() {
        let got = back.info(&want.name).unwrap();
        assert_eq!(
            (got.dtype, &got.shape),
            (want.dtype, &want.shape),
            "{}",
            want.name
        );
        let (got_view, want_view) = (
            back.view(&want.name).unwrap(),
            from_zt.view(&want.name).unwrap(),
        );
        assert_eq!(
            got_view.bytes.as_slice(),
            want_view.bytes.as_slice(),
            "{}",
            want.name
        );
    }
    assert_eq!(
        back.info("f4").unwrap().source_layout_name(),
        Some("pytorch:float4_e2m1fn_x2")
    );
    let back = back
        .as_any()
        .downcast_ref::<tensorwire::zt::ZtReader>()
        .unwrap();
    assert_eq!(
        back.byte_type("e8m0").unwrap(),
        Some(tensorwire::zt::ByteType::F8E8M0)
    );
}

/// Tensors on torch's meta device (no data): `inspect` lists them apart from the
/// tensors, with torch's dtype and shape (in JSON with strides and flags too);
/// `convert` refuses the file, naming them, and leaves nothing behind.
#[test]
fn meta_tensors_are_listed_apart_and_not_converted() {
    let (src, table) = inspect_fixture("pytorch/meta_tensors.pt");
    assert!(table.starts_with(&format!("{}: pytorch-zip, 2 tensors", src.display())));
    let listed: Vec<&str> = table
        .lines()
        .skip_while(|l| !l.starts_with("meta tensors"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    assert_eq!(listed.len(), 10, "{table}");
    assert_eq!(listed[0], "  w: float32 [3, 4]");
    assert!(listed.contains(&"  c32: complex32 [2]"), "{table}");
    assert!(listed.contains(&"  nested.scalar: int64 []"), "{table}");
    assert_eq!(dtype_of(&table, "b"), "f32");

    let o = tw([OsStr::new("inspect"), OsStr::new("--json"), src.as_os_str()]);
    assert_exit(&o, 0);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(doc["tensor_count"], 2);
    let t = &doc["meta_tensors"][2];
    assert_eq!(t["name"], "t");
    assert_eq!(t["stride"], serde_json::json!([1, 3]));
    assert_eq!(doc["meta_tensors"][3]["parameter"], true);

    let dir = tempfile::tempdir().unwrap();
    for out in ["out.zt", "out.safetensors"] {
        let says = "meta device (`w` and 9 more names)";
        assert_convert_refused(&src, &dir.path().join(out), says);
    }
}

/// A quantized torch checkpoint: `inspect` names torch's quantized dtypes over the
/// integers they hold; `.zt` output keeps each tensor's scheme and parameters, and
/// safetensors output (which has no per-tensor metadata) keeps them in
/// `__metadata__` as `<tensor>.torch.q_scale` and so on.
#[test]
fn quantized_checkpoints_keep_their_quantization_through_convert() {
    let (src, table) = inspect_fixture("pytorch/quantized.pt");
    for row in [
        "fc.weight  ",
        "act  ",
        "acc  ",
        "emb.weight.q_per_channel_scales  ",
    ] {
        assert!(table.lines().any(|l| l.starts_with(row)), "{row}: {table}");
    }
    assert_eq!(dtype_of(&table, "fc.weight"), "qint8 (i8)");
    assert_eq!(dtype_of(&table, "act"), "quint8 (u8)");
    assert_eq!(dtype_of(&table, "acc"), "qint32 (i32)");
    assert_eq!(dtype_of(&table, "fc.bias"), "f32");

    let dir = tempfile::tempdir().unwrap();
    let (zt, meta) = convert_keeping_attributes(&src, dir.path());
    assert_eq!(
        dtype_of(
            &stdout(&tw([OsStr::new("inspect"), zt.as_os_str()])),
            "fc.weight"
        ),
        "qint8 (i8)"
    );
    let from_zt = tensorwire::open(&zt).unwrap();
    let conv = from_zt
        .tensors()
        .iter()
        .find(|t| &*t.name == "conv.weight")
        .unwrap();
    assert_eq!(
        conv.attributes.get("torch.q_per_channel_axis"),
        Some(&Value::Int(1))
    );

    let text = |k: &str| meta.get(k).cloned();
    assert_eq!(
        text("fc.weight.torch.qscheme").as_deref(),
        Some("torch.per_tensor_affine")
    );
    assert_eq!(text("fc.weight.torch.q_scale").as_deref(), Some("0.05"));
    assert_eq!(text("acc.torch.q_zero_point").as_deref(), Some("-5"));
    assert_eq!(
        text("emb.weight.torch.qscheme").as_deref(),
        Some("torch.per_channel_affine_float_qparams")
    );
    assert_eq!(text("fc.bias.torch.qscheme"), None);
}

/// Converts `src` into `out.zt` and `out.safetensors` in `dir`: every tensor of the
/// `.zt` output has the source's per-tensor attributes. Returns the `.zt` path and the
/// safetensors output's `__metadata__`.
fn convert_keeping_attributes(
    src: &Path,
    dir: &Path,
) -> (
    std::path::PathBuf,
    std::collections::BTreeMap<String, String>,
) {
    let (zt, st) = (dir.join("out.zt"), dir.join("out.safetensors"));
    for out in [&zt, &st] {
        assert_exit(
            &tw([OsStr::new("convert"), src.as_os_str(), out.as_os_str()]),
            0,
        );
    }
    let (from_src, from_zt) = (
        tensorwire::open(src).unwrap(),
        tensorwire::open(&zt).unwrap(),
    );
    for t in from_src.tensors() {
        let got = from_zt.tensors().iter().find(|z| z.name == t.name).unwrap();
        assert_eq!(*got.attributes, *t.attributes, "{}", t.name);
    }
    let meta = tensorwire::open(&st).unwrap().attributes().clone();
    let text = meta
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())));
    (zt, text.collect())
}

/// A checkpoint of sparse tensors converts as their parts: each part keeps the
/// tensor's layout and size, as per-tensor attributes in `.zt` and under
/// `<part>.torch.layout` (and so on) in safetensors' `__metadata__`.
#[test]
fn sparse_checkpoints_convert_as_their_parts() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch/sparse.pt");
    let dir = tempfile::tempdir().unwrap();
    let (zt, meta) = convert_keeping_attributes(&src, dir.path());
    let (from_pt, from_zt) = (
        tensorwire::open(&src).unwrap(),
        tensorwire::open(&zt).unwrap(),
    );
    for t in from_pt.tensors() {
        assert_eq!(
            from_zt.view(&t.name).unwrap().bytes,
            from_pt.view(&t.name).unwrap().bytes
        );
    }
    let text = |k: &str| meta.get(k).cloned();
    assert_eq!(
        text("csr.values.torch.layout").as_deref(),
        Some("torch.sparse_csr")
    );
    assert_eq!(text("coo.indices.torch.size").as_deref(), Some("[4, 6]"));
    assert_eq!(
        text("uncoalesced.values.torch.is_coalesced").as_deref(),
        Some("false")
    );
    assert_eq!(text("dense.torch.layout"), None);
}

/// `--zt-version 2` writes `.zt` version 2 (xxh3 digests, zstd-seekable compression),
/// which opens as `zt-2` with the same tensors and verifies.
#[test]
fn convert_writes_zt_version_2() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let dir = tempfile::tempdir().unwrap();
    let src = fixtures.join("safetensors/dtypes.safetensors");
    let dst = dir.path().join("v2.zt");
    let o = tw([
        OsStr::new("convert"),
        src.as_os_str(),
        dst.as_os_str(),
        OsStr::new("--zt-version"),
        OsStr::new("2"),
        OsStr::new("--checksum"),
        OsStr::new("xxh3"),
        OsStr::new("--compress"),
    ]);
    assert_exit(&o, 0);
    let (a, b) = (
        tensorwire::open(&src).unwrap(),
        tensorwire::open(&dst).unwrap(),
    );
    assert_eq!(b.format(), "zt-2");
    assert_eq!(&fs::read(&dst).unwrap()[..8], tensorwire::zt::MAGIC_V2);
    for t in a.tensors() {
        assert_eq!(
            a.view(&t.name).unwrap().bytes.to_vec(),
            b.view(&t.name).unwrap().bytes.to_vec()
        );
    }
    assert!(b.verify().unwrap() >= a.tensors().len());
    assert_exit(&tw([OsStr::new("verify"), dst.as_os_str()]), 0);
    // Not for safetensors output.
    let st = dir.path().join("x.safetensors");
    let o = tw([
        OsStr::new("convert"),
        src.as_os_str(),
        st.as_os_str(),
        OsStr::new("--zt-version"),
        OsStr::new("2"),
    ]);
    assert_exit(&o, 2);
}

#[test]
fn a_shard_index_inspects_and_converts_as_one_checkpoint() {
    let index = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/sharded/pytorch/pytorch_model.bin.index.json");
    let o = tw([OsStr::new("inspect"), index.as_os_str()]);
    assert_exit(&o, 0);
    let text = stdout(&o);
    assert!(text.contains("sharded, 7 tensors"), "{text}");
    assert!(
        text.contains("shards:\n  pytorch_model-00001-of-00003.bin: 1 tensor\n"),
        "{text}"
    );
    let doc = inspect_json(&index);
    assert_eq!(doc["shards"].as_array().unwrap().len(), 3);
    let shards: Vec<&str> = doc["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["shard"].as_str().unwrap())
        .collect();
    assert_eq!(shards.len(), 7);
    assert!(shards.iter().all(|s| s.starts_with("pytorch_model-0000")));

    let dir = tempfile::tempdir().unwrap();
    let merged = dir.path().join("merged.zt");
    let o = tw([OsStr::new("convert"), index.as_os_str(), merged.as_os_str()]);
    assert_exit(&o, 0);
    let merged_doc = inspect_json(&merged);
    assert_eq!(merged_doc["tensor_count"], 7);
    assert_eq!(merged_doc["total_bytes"], doc["total_bytes"]);
}

#[test]
fn an_interrupted_convert_leaves_no_partial_file() {
    // 32 MiB of incompressible floats at zstd level 19 takes seconds: long enough to
    // interrupt once the temporary output exists.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big.npy");
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    let mut header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}",
        8 << 20
    )
    .into_bytes();
    header.resize(117, b' ');
    header.push(b'\n');
    npy.extend((header.len() as u16).to_le_bytes());
    npy.extend(header);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    npy.extend((0..8u32 << 20).flat_map(|_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state as u32).to_le_bytes()
    }));
    fs::write(&src, npy).unwrap();
    let dst = dir.path().join("big.zt");
    for (signal, number) in [
        ("INT", 2),
        ("TERM", 15),
        ("HUP", 1),
        ("QUIT", 3),
        ("BUS", 7),
    ] {
        let mut child = Command::new(BIN)
            .args([OsStr::new("convert"), src.as_os_str(), dst.as_os_str()])
            .arg("--compress=19")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // `tensorwire::core::create_temporary`'s name for the destination, in the
        // child: `.big.zt.tmp-PID-RANDOM`.
        let prefix = format!(".big.zt.tmp-{}-", child.id());
        let temporaries = || -> Vec<PathBuf> {
            fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| {
                    p.file_name()
                        .and_then(OsStr::to_str)
                        .is_some_and(|n| n.starts_with(&prefix))
                })
                .collect()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while temporaries().is_empty() && std::time::Instant::now() < deadline {
            if child.try_wait().unwrap().is_some() {
                panic!("convert ended before it could be interrupted");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(temporaries().len(), 1, "no temporary output appeared");
        let killed = Command::new("kill")
            .args([format!("-{signal}"), child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let status = child.wait().unwrap();
        if signal == "BUS" {
            // A fatal signal (what reading a truncated mapped source raises): the
            // handler removes the temporary, then the signal ends the process.
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(number), "SIGBUS: {status:?}");
        } else {
            assert_eq!(status.code(), Some(128 + number), "SIG{signal}: {status:?}");
        }
        assert!(
            temporaries().is_empty(),
            "SIG{signal}: the temporary output was left behind"
        );
        assert!(!dst.exists());
    }
}

/// Runs `tensorwire ARGS` and gives its output, or fails the test if it has not
/// ended within 20 seconds (it is killed).
fn tw_within_20s(args: &[&OsStr]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`tensorwire {args:?}` hung");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[cfg(unix)]
fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success());
}

#[cfg(unix)]
#[test]
fn a_pipe_is_refused_at_once_as_source() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.zt");
    mkfifo(&fifo);
    let out = dir.path().join("out.zt");
    for args in [
        vec![OsStr::new("inspect"), fifo.as_os_str()],
        vec![OsStr::new("verify"), fifo.as_os_str()],
        vec![OsStr::new("convert"), fifo.as_os_str(), out.as_os_str()],
    ] {
        let o = tw_within_20s(&args);
        assert_exit(&o, 2);
        assert!(stderr(&o).contains("not a regular file"), "{}", stderr(&o));
    }
    assert!(!out.exists());
}

/// `/dev/stdout` when stdout is a pipe: `/proc/self/fd/1` links to `pipe:[N]`, which
/// names no path; the refusal says what it is (it was an ENOENT from a path made of
/// that text).
#[cfg(target_os = "linux")]
#[test]
fn convert_to_dev_stdout_as_a_pipe_is_refused_as_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let src = sample(dir.path(), Checksum::None);
    let o = Command::new(BIN)
        .args([
            OsStr::new("convert"),
            src.as_os_str(),
            OsStr::new("/dev/stdout"),
        ])
        .args(["--format", "zt"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("not a regular file"), "{}", stderr(&o));
}

#[cfg(unix)]
#[test]
fn convert_never_replaces_a_pipe_or_a_socket() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let src = sample(dir.path(), Checksum::None);
    let fifo = dir.path().join("fifo.zt");
    mkfifo(&fifo);
    let socket = dir.path().join("socket.safetensors");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    // Through a link too: the link's target is what a write replaces.
    let link = dir.path().join("link.zt");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    for dst in [&fifo, &socket, &link] {
        let o = tw_within_20s(&[OsStr::new("convert"), src.as_os_str(), dst.as_os_str()]);
        assert_exit(&o, 2);
        assert!(stderr(&o).contains("not a regular file"), "{}", stderr(&o));
    }
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    assert!(fs::symlink_metadata(&socket)
        .unwrap()
        .file_type()
        .is_socket());
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    // Nothing else was written: the sample, the pipe, the socket and the link.
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 4);
}

#[cfg(unix)]
#[test]
fn convert_never_follows_a_link_planted_at_its_temporary_name() {
    let dir = tempfile::tempdir().unwrap();
    let src = sample(dir.path(), Checksum::None);
    let victim = dir.path().join("victim.txt");
    fs::write(&victim, b"precious").unwrap();
    for name in ["out.zt", "out.safetensors"] {
        let dst = dir.path().join(name);
        // The shell plants a link where the temporary used to be named
        // (`.NAME.tmp-PID`), then becomes the convert process (same PID).
        let o = Command::new("sh")
            .arg("-c")
            .arg(r#"ln -s "$1" "$2/.$3.tmp-$$" && exec "$4" convert "$5" "$2/$3""#)
            .arg("sh")
            .args([victim.as_os_str(), dir.path().as_os_str(), OsStr::new(name)])
            .args([OsStr::new(BIN), src.as_os_str()])
            .output()
            .unwrap();
        assert_exit(&o, 0);
        assert_eq!(fs::read(&victim).unwrap(), b"precious", "{name}");
        assert!(fs::symlink_metadata(&dst).unwrap().is_file(), "{name}");
        assert_eq!(contents(&dst).len(), 3, "{name}");
    }
}

#[test]
fn convert_to_safetensors_refuses_a_tensor_named_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("meta.zt");
    let mut w = ZtWriter::create(&src).unwrap();
    for name in ["__metadata__", "x"] {
        w.add_dense(
            name,
            DType::F32,
            &Shape::new(vec![2]).unwrap(),
            &f32_bytes([1.0, 2.0]),
            WriteOptions::default(),
        )
        .unwrap();
    }
    w.finish().unwrap();
    assert_convert_refused(
        &src,
        &dir.path().join("out.safetensors"),
        "a tensor named `__metadata__`",
    );
    // `.zt` has no such reserved name.
    let o = tw([
        OsStr::new("convert"),
        src.as_os_str(),
        dir.path().join("out.zt").as_os_str(),
    ]);
    assert_exit(&o, 0);
}

#[test]
fn a_damaged_source_is_named_as_the_source_whatever_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let src = sample(dir.path(), Checksum::Crc32c);
    let (offset, len) = stored_span(&src, "weight");
    flip_byte(&src, offset + len / 2);
    for name in ["out.zt", "out.safetensors"] {
        let dst = dir.path().join(name);
        let o = tw([OsStr::new("convert"), src.as_os_str(), dst.as_os_str()]);
        assert_exit(&o, 1);
        let err = stderr(&o);
        assert!(
            err.contains("tensor `weight/data`: crc32c digest mismatch"),
            "{err}"
        );
        // Said once, in "converting SRC to DST", never as the error's own file.
        assert_eq!(err.matches(name).count(), 1, "{err}");
        assert!(!dst.exists());
    }
}

#[test]
fn inspect_shows_an_lz4_packets_compressed_frame_as_stored() {
    let packets = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/packet");
    // (file, tensor, bytes after its frame: the integrity footer, if any)
    for (file, tensor, after) in [
        ("lz4_i32.tnso", "tensor", 0),
        ("lz4_i32_integrity.tnso", "tensor", 8),
        ("lz4_f64_align_32.tnso", "tensor", 0),
        ("bundle_compress.tnso", "y.z", 0),
    ] {
        let path = packets.join(file);
        let bytes = fs::read(&path).unwrap();
        let doc = inspect_json(&path);
        let t = doc["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == tensor)
            .unwrap();
        let offset = t["offset"].as_u64().unwrap() as usize;
        let stored = t["stored_bytes"].as_u64().unwrap() as usize;
        assert_eq!(t["encoding"], "lz4", "{file}");
        // The stored bytes are the LZ4 frame: its magic, up to the packet's end.
        assert_eq!(
            &bytes[offset..offset + 4],
            &[0x04, 0x22, 0x4d, 0x18],
            "{file}: {t}"
        );
        if file == "bundle_compress.tnso" {
            assert_eq!(stored, 27, "the member's frame alone");
        } else {
            assert_eq!(offset + stored + after, bytes.len(), "{file}: {t}");
        }
    }
}

/// `verify` counts digests only: a ZIP checkpoint's record CRC-32s, none for a legacy
/// one (its storages' element counts are checked, but they are no digests).
#[test]
fn verify_counts_no_digests_for_a_legacy_checkpoint() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch");
    let o = tw([
        OsStr::new("verify"),
        dir.join("views.legacy.pt").as_os_str(),
    ]);
    assert_exit(&o, 0);
    assert!(stdout(&o).contains(", 0 digests checked"), "{}", stdout(&o));
    let o = tw([OsStr::new("verify"), dir.join("views.pt").as_os_str()]);
    assert_exit(&o, 0);
    assert!(
        !stdout(&o).contains(", 0 digests checked"),
        "{}",
        stdout(&o)
    );
}

/// A sharded source reads more files than the one named: converting it over one of
/// them (an index's shard, a GGUF split) is refused like converting a file over
/// itself, and the shard is left as it was.
#[test]
fn convert_refuses_to_overwrite_a_file_of_a_sharded_source() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let dir = tempfile::tempdir().unwrap();
    for (from, entry, shard) in [
        (
            "sharded/safetensors",
            "model.safetensors.index.json",
            "model-00002-of-00003.safetensors",
        ),
        (
            "gguf/split",
            "model-00001-of-00003.gguf",
            "model-00002-of-00003.gguf",
        ),
    ] {
        let copy = dir.path().join(from.replace('/', "_"));
        std::fs::create_dir_all(&copy).unwrap();
        for file in std::fs::read_dir(fixtures.join(from)).unwrap() {
            let file = file.unwrap().path();
            std::fs::copy(&file, copy.join(file.file_name().unwrap())).unwrap();
        }
        let before = std::fs::read(copy.join(shard)).unwrap();
        let o = tw([
            OsStr::new("convert"),
            copy.join(entry).as_os_str(),
            copy.join(shard).as_os_str(),
            OsStr::new("--format"),
            OsStr::new("zt"),
        ]);
        assert_exit(&o, 2);
        assert!(
            stderr(&o).contains("refusing to overwrite the source"),
            "{}",
            stderr(&o)
        );
        assert_eq!(std::fs::read(copy.join(shard)).unwrap(), before, "{from}");
    }
}

/// A GGUF file whose one key holds `levels` arrays nested in each other, and one
/// f32 tensor.
fn gguf_nested(levels: usize) -> Vec<u8> {
    let mut value = [
        4u32.to_le_bytes().as_slice(),
        &1u64.to_le_bytes(),
        &7u32.to_le_bytes(),
    ]
    .concat();
    for _ in 1..levels {
        value = [9u32.to_le_bytes().as_slice(), &1u64.to_le_bytes(), &value].concat();
    }
    let string = |s: &[u8]| [(s.len() as u64).to_le_bytes().as_slice(), s].concat();
    let mut file = [
        b"GGUF".as_slice(),
        &3u32.to_le_bytes(),
        &1u64.to_le_bytes(),
        &1u64.to_le_bytes(),
    ]
    .concat();
    file.extend(string(b"k"));
    file.extend(9u32.to_le_bytes());
    file.extend(value);
    file.extend(string(b"t"));
    file.extend(1u32.to_le_bytes());
    file.extend(4u64.to_le_bytes());
    file.extend(0u32.to_le_bytes()); // F32
    file.extend(0u64.to_le_bytes());
    file.resize(file.len().next_multiple_of(32), 0);
    file.extend(f32_bytes([1.0, 2.0, 3.0, 4.0]));
    file
}

#[test]
fn limits_are_raised_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let deep = dir.path().join("deep.gguf");
    fs::write(&deep, gguf_nested(70)).unwrap();
    let o = tw([OsStr::new("inspect"), deep.as_os_str()]);
    assert_exit(&o, 1);
    assert!(
        stderr(&o).contains("nesting depth is 65, above the limit of 64"),
        "{}",
        stderr(&o)
    );
    let raised = ["--limit", "max_depth=70"];
    for command in ["inspect", "verify", "bench"] {
        let mut args = vec![OsStr::new(command), deep.as_os_str()];
        args.extend(raised.iter().map(OsStr::new));
        assert_exit(&tw(args), 0);
    }
    let out = dir.path().join("deep.zt");
    let mut args = vec![OsStr::new("convert"), deep.as_os_str(), out.as_os_str()];
    args.extend(raised.iter().map(OsStr::new));
    assert_exit(&tw(args), 0);
    // The attribute went along, as deep (the manifest adds four levels above it): the
    // output needs a raised limit too.
    assert!(matches!(
        tensorwire::open(&out),
        Err(e) if matches!(e.root(), tensorwire::Error::LimitExceeded { .. })
    ));
    let limits = tensorwire::Limits {
        max_depth: 80,
        ..Default::default()
    };
    let written = ZtReader::open_with(&out, tensorwire::mmap::MapMode::ReadOnly, &limits).unwrap();
    assert_eq!(
        &tensorwire::TensorSource::view(&written, "t").unwrap().bytes[..],
        f32_bytes([1.0, 2.0, 3.0, 4.0])
    );
    // Lowered, and misspelt.
    let mut args = vec![OsStr::new("inspect"), deep.as_os_str()];
    args.extend(["--limit", "max_tensors=0"].iter().map(OsStr::new));
    assert_exit(&tw(args), 1);
    for bad in ["max_dpth=70", "max_depth", "max_depth=-1"] {
        let o = tw([
            OsStr::new("inspect"),
            deep.as_os_str(),
            OsStr::new("--limit"),
            OsStr::new(bad),
        ]);
        assert_exit(&o, 2);
    }
}

/// A `.zt` 2 GGUF block object is listed as its `u8` rows of blocks: the shape shown
/// goes with the dtype and size shown (it was the logical shape, which 136 bytes of a
/// `[2, 64]` `u8` tensor cannot be), and the layout names the block type.
#[test]
fn inspect_shows_gguf_block_objects_as_their_rows_of_blocks() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/zt/v2/gguf_blocks.zt");
    let doc = inspect_json(&path);
    let mut blocks = 0;
    for t in doc["tensors"].as_array().unwrap() {
        let numel: u64 = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .product();
        let item = if t["dtype"] == "f32" { 4 } else { 1 };
        assert_eq!(numel * item, t["nbytes"].as_u64().unwrap(), "{t}");
        if t["layout"].as_str().unwrap().starts_with("gguf.") {
            blocks += 1;
            assert_eq!(t["dtype"], "u8", "{t}");
        }
    }
    assert_eq!(blocks, 6);
}
