//! safetensors files written by the real `safetensors` package (fixtures/safetensors)
//! read back as the package wrote them, and our writer reproduces them byte for byte.

mod common;

use std::collections::BTreeMap;

use common::{dims, expected, fixture, sha256_hex};
use tensorwire_core::{Bytes, DType, Error, Layout, Limits, TensorSource, Value};
use tensorwire_formats::safetensors::{
    save_source, write_source, SafetensorsReader, SafetensorsWriter, StDType,
};

const FIXTURES: [&str; 6] = ["dtypes", "numpy", "metadata", "empty", "raw_types", "fnuz"];

#[test]
fn every_fixture_reads_back_as_written() {
    for name in FIXTURES {
        let reader = SafetensorsReader::open(fixture(&format!("safetensors/{name}.safetensors")))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let exp = expected(&format!("safetensors/{name}.expected.json"));
        let tensors = exp["tensors"].as_object().unwrap();
        assert_eq!(reader.tensors().len(), tensors.len(), "{name}");
        for (tname, t) in tensors {
            let st = StDType::from_name(t["dtype"].as_str().unwrap()).unwrap();
            let info = reader.info(tname).unwrap();
            let raw = reader.raw(tname).unwrap();
            assert_eq!(
                sha256_hex(&raw),
                t["sha256"].as_str().unwrap(),
                "{name}/{tname}"
            );
            match st.dtype() {
                Some(dtype) => {
                    assert_eq!(info.dtype, dtype);
                    assert_eq!(info.shape.dims(), &dims(&t["shape"])[..], "{name}/{tname}");
                    let view = reader.view(tname).unwrap();
                    assert!(view.zero_copy);
                    assert_eq!(&*view.bytes, &*raw);
                }
                None => {
                    assert_eq!(
                        info.layout,
                        Layout::Other(format!("safetensors:{}", st.name()))
                    );
                    assert_eq!(info.dtype, DType::U8);
                    assert_eq!(info.shape.dims(), &[raw.len() as u64]);
                    let logical = info.attributes["safetensors.shape"].clone();
                    let want: Vec<Value> = dims(&t["shape"])
                        .into_iter()
                        .map(|d| Value::Int(d.into()))
                        .collect();
                    assert_eq!(logical, Value::List(want));
                }
            }
        }
        let meta: BTreeMap<String, String> = reader.metadata().iter().cloned().collect();
        let want: BTreeMap<String, String> = exp["metadata"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(meta, want, "{name}");
    }
}

#[test]
fn rewriting_a_package_file_gives_the_same_bytes() {
    // These have at most one metadata entry, so key order cannot differ.
    for name in ["dtypes", "numpy", "empty", "raw_types", "fnuz"] {
        let path = fixture(&format!("safetensors/{name}.safetensors"));
        let original = std::fs::read(&path).unwrap();
        let reader = SafetensorsReader::open(&path).unwrap();
        let mut ours = Vec::new();
        write_source(&reader, &mut ours, &mut |_, _, _| Ok(())).unwrap();
        assert!(
            ours == original,
            "{name}: our bytes differ from the package's"
        );
    }
}

#[test]
fn the_writer_orders_like_save_file() {
    // Same tensors as fixtures/safetensors/numpy.safetensors, added in another order.
    let path = fixture("safetensors/numpy.safetensors");
    let reader = SafetensorsReader::open(&path).unwrap();
    let mut w = SafetensorsWriter::new();
    for name in ["mask", "embed", "bias"] {
        let v = reader.view(name).unwrap();
        w.add(name, v.dtype, &v.shape, v.bytes).unwrap();
    }
    let mut ours = Vec::new();
    w.write(&mut ours).unwrap();
    assert!(ours == std::fs::read(&path).unwrap());
}

#[test]
fn converts_other_sources_lazily_and_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let reader = SafetensorsReader::open(fixture("safetensors/dtypes.safetensors")).unwrap();
    let out = dir.path().join("copy.safetensors");
    let mut calls = Vec::new();
    save_source(&reader, &out, &mut |done, total, bytes| {
        calls.push((done, total, bytes));
        Ok(())
    })
    .unwrap();
    assert_eq!(calls.len(), reader.tensors().len());
    let total: u64 = reader.tensors().iter().map(|t| t.nbytes).sum();
    assert_eq!(calls.last().unwrap().2, total);
    let copy = SafetensorsReader::open(&out).unwrap();
    for info in reader.tensors() {
        assert_eq!(
            &*copy.raw(&info.name).unwrap(),
            &*reader.raw(&info.name).unwrap()
        );
    }
    // Nothing but the output is left in the directory.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn every_truncation_is_a_typed_error() {
    let bytes = std::fs::read(fixture("safetensors/dtypes.safetensors")).unwrap();
    for len in 0..bytes.len() {
        let err = SafetensorsReader::from_bytes(
            Bytes::from_vec(bytes[..len].to_vec()),
            &Limits::default(),
        )
        .err()
        .unwrap_or_else(|| panic!("a {len}-byte prefix opened"));
        assert!(err.is_corrupt_data(), "{len}: {err}");
    }
}

#[test]
fn limits_apply_to_header_and_counts() {
    let bytes = Bytes::from_vec(std::fs::read(fixture("safetensors/dtypes.safetensors")).unwrap());
    let small_meta = Limits {
        max_metadata_bytes: 64,
        ..Limits::default()
    };
    assert!(matches!(
        SafetensorsReader::from_bytes(bytes.clone(), &small_meta),
        Err(Error::LimitExceeded { .. })
    ));
    let few = Limits {
        max_tensors: 3,
        ..Limits::default()
    };
    assert!(matches!(
        SafetensorsReader::from_bytes(bytes.clone(), &few),
        Err(Error::LimitExceeded { .. })
    ));
    let flat = Limits {
        max_ndim: 2,
        ..Limits::default()
    };
    assert!(matches!(
        SafetensorsReader::from_bytes(bytes, &flat),
        Err(Error::LimitExceeded { .. })
    ));
}

#[test]
fn an_empty_metadata_map_is_kept_apart_from_none() {
    // The package writes `"__metadata__":{}` for `metadata={}` and nothing for None;
    // reading tells them apart and rewriting keeps each as it was.
    for with_map in [true, false] {
        let mut w = SafetensorsWriter::new();
        let shape = tensorwire_core::Shape::new(vec![2]).unwrap();
        w.add("x", DType::F32, &shape, Bytes::from_vec(vec![0; 8]))
            .unwrap();
        if with_map {
            w.set_metadata(BTreeMap::new());
        }
        let mut file = Vec::new();
        w.write(&mut file).unwrap();
        assert_eq!(
            std::str::from_utf8(&file[8..40])
                .unwrap()
                .contains("__metadata__"),
            with_map
        );
        let reader =
            SafetensorsReader::from_bytes(Bytes::from_vec(file.clone()), &Limits::default())
                .unwrap();
        assert_eq!(reader.has_metadata(), with_map);
        assert!(reader.metadata().is_empty() && reader.attributes().is_empty());
        let mut again = Vec::new();
        write_source(&reader, &mut again, &mut |_, _, _| Ok(())).unwrap();
        assert!(again == file, "with_map = {with_map}");
    }
}

#[test]
fn only_the_outputs_own_errors_name_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let reader = SafetensorsReader::open(fixture("safetensors/dtypes.safetensors")).unwrap();
    let out = dir.path().join("copy.safetensors");
    // An error that is not the output's (here the caller's cancel; a source's damaged
    // tensor alike) comes back as it was, without the output's path.
    let err = save_source(&reader, &out, &mut |_, _, _| Err(Error::invalid("stop"))).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // The output's own errors name it.
    let nowhere = dir.path().join("missing").join("copy.safetensors");
    let err = save_source(&reader, &nowhere, &mut |_, _, _| Ok(())).unwrap_err();
    match err {
        Error::WithPath { path, .. } => assert_eq!(path, nowhere),
        other => panic!("{other:?}"),
    }
}

#[cfg(unix)]
#[test]
fn a_pipe_is_never_replaced_and_a_planted_link_never_followed() {
    use std::os::unix::fs::{symlink, FileTypeExt};
    let dir = tempfile::tempdir().unwrap();
    let reader = SafetensorsReader::open(fixture("safetensors/dtypes.safetensors")).unwrap();
    let mut w = SafetensorsWriter::new();
    let shape = tensorwire_core::Shape::new(vec![2]).unwrap();
    w.add("x", DType::F32, &shape, Bytes::from_vec(vec![0; 8]))
        .unwrap();

    let fifo = dir.path().join("fifo.safetensors");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    for err in [
        w.write_file(&fifo).unwrap_err(),
        save_source(&reader, &fifo, &mut |_, _, _| Ok(())).unwrap_err(),
    ] {
        assert!(
            matches!(err.root(), Error::InvalidArgument { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    // A link where the temporary file used to be named (`.NAME.tmp-PID`).
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, b"precious").unwrap();
    let out = dir.path().join("out.safetensors");
    let planted = dir
        .path()
        .join(format!(".out.safetensors.tmp-{}", std::process::id()));
    symlink(&victim, &planted).unwrap();
    w.write_file(&out).unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(std::fs::symlink_metadata(&out).unwrap().is_file());
    assert_eq!(SafetensorsReader::open(&out).unwrap().tensors().len(), 1);
    assert!(std::fs::symlink_metadata(&planted)
        .unwrap()
        .file_type()
        .is_symlink());
}
