//! `convert` to safetensors takes a raw type's logical shape from the source's
//! `safetensors.shape` attribute (a `.zt` file converted from safetensors keeps it
//! there). A `.zt` file's attributes are its writer's, so anything: a shape that does
//! not describe the tensor's bytes is refused, rather than written into a header no
//! reader accepts.

use std::collections::BTreeMap;

use tensorwire::core::{DType, Shape, TensorSource, Value};
use tensorwire::formats::safetensors::SafetensorsReader;
use tensorwire::zt::{Checksum, Compression, WriteOptions, ZtWriter};
use tensorwire::{convert, ConvertOptions, OutputFormat};

fn zt_with_attributes(path: &std::path::Path, attributes: BTreeMap<String, Value>) {
    let mut w = ZtWriter::create(path).unwrap();
    w.add_dense_with_attributes(
        "x",
        DType::U8,
        &Shape::new(vec![4]).unwrap(),
        &[1, 2, 3, 4],
        Some(attributes),
        WriteOptions::default(),
    )
    .unwrap();
    w.finish().unwrap();
}

fn to_safetensors(src: &std::path::Path, dst: &std::path::Path) -> tensorwire::core::Result<usize> {
    let options = ConvertOptions {
        format: Some(OutputFormat::Safetensors),
        compression: Compression::Raw,
        checksum: Checksum::None,
        ..ConvertOptions::default()
    };
    convert(src, dst, &options, &mut |_, _, _| Ok(()))
}

fn raw_type(layout: &str, shape: Value) -> BTreeMap<String, Value> {
    BTreeMap::from([
        (
            "tensorwire.layout".to_owned(),
            Value::Str(layout.to_owned()),
        ),
        ("safetensors.shape".to_owned(), shape),
    ])
}

fn dims(d: &[i64]) -> Value {
    Value::List(d.iter().map(|&n| Value::Int(n.into())).collect())
}

#[test]
fn a_logical_shape_that_fits_the_bytes_converts() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("ok.zt"), dir.path().join("ok.safetensors"));
    // 4 bytes: 8 F4 values, or 4 F8_E8M0 ones.
    for (layout, shape) in [("safetensors:F4", [2, 4]), ("safetensors:F8_E8M0", [2, 2])] {
        zt_with_attributes(&src, raw_type(layout, dims(&shape)));
        assert_eq!(to_safetensors(&src, &dst).unwrap(), 1);
        let back = SafetensorsReader::open(&dst).unwrap();
        let info = &back.tensors()[0];
        assert_eq!(info.attributes["safetensors.shape"], dims(&shape));
        assert_eq!(info.nbytes, 4);
    }
}

#[test]
fn a_logical_shape_that_does_not_fit_the_bytes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (
        dir.path().join("bad.zt"),
        dir.path().join("bad.safetensors"),
    );
    for (layout, shape) in [
        ("safetensors:F4", dims(&[3])),        // not a whole number of bytes
        ("safetensors:F4", dims(&[100, 100])), // 5000 bytes
        ("safetensors:F4", Value::Int(5.into())), // not a list: the stored shape, [4]
        ("safetensors:F6_E2M3", dims(&[5])),
        ("safetensors:F8_E8M0", dims(&[1 << 62, 1 << 62])), // overflows
    ] {
        zt_with_attributes(&src, raw_type(layout, shape.clone()));
        let err = to_safetensors(&src, &dst).unwrap_err();
        assert!(
            err.to_string().contains("does not describe its 4 bytes"),
            "{layout} {shape:?}: {err}"
        );
        assert!(!dst.exists(), "{layout} {shape:?}: output left behind");
    }
}
