//! GGUF quantized tensors and `.zt` version 2: `convert` writes each as ztensor 2's
//! registered object `gguf.<type>/1` (logical shape, `block_bytes`,
//! `elems_per_block`, the blocks as one `u8` part), as `ztensor.convert` does
//! (`fixtures/zt/v2/gguf_blocks.zt`, written by it from the same GGUF file); the
//! reader lists such an object as the GGUF reader lists the tensor, and a further
//! conversion writes it back unchanged.

use std::path::{Path, PathBuf};

use tensorwire::core::{Layout, TensorSource, Value};
use tensorwire::zt::{ZtReader, GGUF_BLOCK_BYTES, GGUF_ELEMS_PER_BLOCK};
use tensorwire::{convert, ConvertOptions, OutputFormat};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn to(src: &Path, dst: &Path, format: OutputFormat) {
    let options = ConvertOptions {
        format: Some(format),
        checksum: if format == OutputFormat::Zt2 {
            tensorwire::zt::Checksum::Xxh3
        } else {
            tensorwire::zt::Checksum::None
        },
        ..ConvertOptions::default()
    };
    convert(src, dst, &options, &mut |_, _, _| Ok(())).unwrap();
}

#[test]
fn gguf_blocks_go_to_zt2_as_ztensor_writes_them_and_read_back_as_gguf_rows() {
    let gguf_path = fixtures().join("gguf/quantized.gguf");
    let dir = tempfile::tempdir().unwrap();
    let ours = dir.path().join("ours.zt");
    to(&gguf_path, &ours, OutputFormat::Zt2);

    let gguf = tensorwire::open(&gguf_path).unwrap();
    let peer = ZtReader::open(fixtures().join("zt/v2/gguf_blocks.zt")).unwrap();
    let zt = ZtReader::open(&ours).unwrap();
    let mut blocks = 0;
    for info in gguf.tensors() {
        let name = &*info.name;
        // The objects as written: ztensor's own conversion's layout, shape and
        // attributes, and the same bytes.
        let (obj, theirs) = (zt.object(name).unwrap(), peer.object(name).unwrap());
        assert_eq!(obj.layout, theirs.layout, "{name}");
        assert_eq!(obj.shape, theirs.shape, "{name}");
        assert_eq!(
            zt.component(name, "data").unwrap().as_slice(),
            peer.component(name, "data").unwrap().as_slice(),
            "{name}"
        );
        if let Layout::Other(id) = &info.layout {
            blocks += 1;
            let ty = id.strip_prefix("gguf:").unwrap();
            assert_eq!(
                obj.layout,
                Layout::Other(format!("gguf.{}/1", ty.to_lowercase()))
            );
            // (A plain type's tensor also keeps its `gguf.type`, which ztensor drops.)
            assert_eq!(obj.attributes, theirs.attributes, "{name}");
            let attrs = obj.attributes.as_ref().unwrap();
            assert!(matches!(attrs.get(GGUF_BLOCK_BYTES), Some(Value::Int(n)) if *n > 0));
            assert!(matches!(attrs.get(GGUF_ELEMS_PER_BLOCK), Some(Value::Int(n)) if *n > 0));
        }
        // Listed and viewed as the GGUF reader gives the tensor, from either file.
        for (label, reader) in [("ours", &zt), ("ztensor's", &peer)] {
            let listed = reader.info(name).unwrap();
            assert_eq!(listed.source_layout(), info.layout, "{label} {name}");
            assert_eq!(listed.shape, info.shape, "{label} {name}");
            assert_eq!(listed.dtype, info.dtype, "{label} {name}");
            let quantized = matches!(info.layout, Layout::Other(_));
            for key in ["gguf.type", "gguf.shape"]
                .into_iter()
                .filter(|_| quantized)
            {
                assert_eq!(
                    listed.attributes.get(key),
                    info.attributes.get(key),
                    "{label} {name} {key}"
                );
            }
            assert_eq!(
                reader.view(name).unwrap().bytes.as_slice(),
                gguf.view(name).unwrap().bytes.as_slice(),
                "{label} {name}"
            );
        }
    }
    assert!(blocks >= 5, "only {blocks} quantized tensors");

    // Version 2 again: the same file; version 1: what a direct conversion writes.
    let again = dir.path().join("again.zt");
    to(&ours, &again, OutputFormat::Zt2);
    assert_eq!(
        std::fs::read(&again).unwrap(),
        std::fs::read(&ours).unwrap()
    );
    let (direct, via) = (dir.path().join("direct.zt"), dir.path().join("via.zt"));
    to(&gguf_path, &direct, OutputFormat::Zt);
    to(&ours, &via, OutputFormat::Zt);
    let (direct, via) = (
        ZtReader::open(&direct).unwrap(),
        ZtReader::open(&via).unwrap(),
    );
    for info in gguf.tensors() {
        let name = &*info.name;
        assert_eq!(
            direct.object(name).unwrap(),
            via.object(name).unwrap(),
            "{name}"
        );
    }
}

/// An object that only looks like one of ztensor's GGUF objects (sizes that do not
/// agree, a part of another dtype) stays an object of its layout: read by component.
#[test]
fn a_gguf_object_whose_sizes_disagree_is_not_listed_as_rows() {
    use std::collections::BTreeMap;
    use tensorwire::core::{DType, Shape};
    use tensorwire::zt::{ComponentData, WriteOptions, ZtVersion, ZtWriter};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.zt");
    let mut w = ZtWriter::create_with_version(&path, ZtVersion::V2).unwrap();
    let blocks = |block_bytes: i128, per_block: i128| {
        Some(BTreeMap::from([
            (GGUF_BLOCK_BYTES.to_owned(), Value::Int(block_bytes)),
            (GGUF_ELEMS_PER_BLOCK.to_owned(), Value::Int(per_block)),
        ]))
    };
    let bytes = [7u8; 68];
    for (name, shape, attributes, dtype) in [
        // 64 values are 2 blocks of 34 bytes: 68 bytes for one row.
        ("fits", vec![1, 64], blocks(34, 32), DType::U8),
        ("short", vec![2, 64], blocks(34, 32), DType::U8),
        ("uneven", vec![1, 48], blocks(34, 32), DType::U8),
        ("no_sizes", vec![1, 64], None, DType::U8),
        ("typed", vec![1, 64], blocks(34, 32), DType::I8),
    ] {
        let data = [ComponentData {
            role: "data",
            dtype,
            logical_type: None,
            data: &bytes,
        }];
        w.add_object(
            name,
            &Shape::new(shape).unwrap(),
            Layout::Other("gguf.q8_0/1".to_owned()),
            attributes,
            &data,
            WriteOptions::default(),
        )
        .unwrap();
    }
    w.finish().unwrap();
    let zt = ZtReader::open(&path).unwrap();
    assert_eq!(zt.info("fits").unwrap().shape.dims(), [1, 68]);
    assert!(zt.view("fits").is_ok());
    for name in ["short", "uneven", "no_sizes", "typed"] {
        let info = zt.info(name).unwrap();
        assert_eq!(
            info.layout,
            Layout::Other("gguf.q8_0/1".to_owned()),
            "{name}"
        );
        assert!(zt.view(name).is_err(), "{name}");
        assert_eq!(zt.component(name, "data").unwrap().len(), 68, "{name}");
    }
}
