//! The position-based `TensorSource` methods (`position`, `info_at`, `view_at`, `strided_at`)
//! over every fixture the facade opens: a name's position is its place in
//! `tensors()`, the view there is that tensor, and a position past the end is an
//! error.

use std::path::{Path, PathBuf};

use tensorwire::{Error, TensorSource};

fn fixture_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let mut files = Vec::new();
    for dir in std::fs::read_dir(&root).expect("fixtures/") {
        let dir = dir.expect("fixture dir").path();
        if !dir.is_dir() {
            continue;
        }
        collect_tensor_files(&dir, 2, &mut files);
    }
    files.sort();
    files
}

/// The tensor files under `dir` (and its folders, `depth` levels down): every file
/// but scripts, notes and JSON expectations; shard indexes (`*.index.json`) count.
fn collect_tensor_files(dir: &Path, depth: usize, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("fixture files") {
        let path = entry.expect("fixture file").path();
        if path.is_dir() {
            if depth > 1 {
                collect_tensor_files(&path, depth - 1, files);
            }
            continue;
        }
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        if name.ends_with(".index.json") || !matches!(ext, "json" | "py" | "md") {
            files.push(path);
        }
    }
}

#[test]
fn positions_name_their_tensors() {
    let mut opened = 0;
    let mut tensors = 0;
    for path in fixture_files() {
        // Files made to be refused (object arrays, hostile pickles) are other tests'.
        let Ok(src) = tensorwire::open(&path) else {
            continue;
        };
        opened += 1;
        let src: &dyn TensorSource = &*src;
        let n = src.tensors().len();
        for (i, info) in src.tensors().iter().enumerate() {
            let name = &*info.name;
            assert_eq!(src.position(name).unwrap(), i, "{path:?} {name}");
            assert!(
                std::ptr::eq(src.info(name).unwrap(), info),
                "{path:?} {name}"
            );
            assert!(
                std::ptr::eq(src.info_at(i).unwrap(), info),
                "{path:?} {name}"
            );
            // The view at a position is that position's tensor (values are checked
            // against the fixtures' expectations by each format's own tests).
            if let Ok(view) = src.view_at(i) {
                assert_eq!(view.shape, info.shape, "{path:?} {name}");
                assert_eq!(view.bytes.len() as u64, info.nbytes, "{path:?} {name}");
            }
            if let Ok(strided) = src.strided_at(i) {
                assert_eq!(strided.shape, info.shape, "{path:?} {name}");
            }
            tensors += 1;
        }
        assert!(
            matches!(src.view_at(n), Err(Error::NotFound { .. })),
            "{path:?}"
        );
        assert!(
            matches!(src.strided_at(n), Err(Error::NotFound { .. })),
            "{path:?}"
        );
        assert!(
            matches!(src.info_at(n), Err(Error::NotFound { .. })),
            "{path:?}"
        );
        assert!(matches!(
            src.position("no such tensor"),
            Err(Error::NotFound { .. })
        ));
    }
    // Every format's fixtures are here: a test that opened nothing would prove nothing.
    assert!(opened >= 30, "opened only {opened} fixture files");
    assert!(tensors >= 200, "checked only {tensors} tensors");
}
