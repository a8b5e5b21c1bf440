//! `convert`'s progress moves within a large tensor, for every output format: the
//! bar of `tensorwire convert` does not stall on a multi-gigabyte embedding.

use tensorwire::core::progress::PROGRESS_CHUNK;
use tensorwire::core::{DType, Shape};
use tensorwire::zt::{Checksum, Compression, WriteOptions, ZtWriter};
use tensorwire::{convert, ConvertOptions, OutputFormat};

#[test]
fn progress_is_reported_within_a_large_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big.zt");
    // One tensor of 2.5 chunks, then a small one.
    let big: Vec<u8> = (0..PROGRESS_CHUNK * 5 / 2)
        .map(|i| (i % 251) as u8)
        .collect();
    let mut w = ZtWriter::create(&src).unwrap();
    let raw = WriteOptions::default();
    let shape = Shape::new(vec![big.len() as u64 / 4]).unwrap();
    w.add_dense("big", DType::F32, &shape, &big, raw).unwrap();
    w.add_dense(
        "small",
        DType::U8,
        &Shape::new(vec![3]).unwrap(),
        &[1, 2, 3],
        raw,
    )
    .unwrap();
    w.finish().unwrap();
    let total = big.len() as u64 + 3;

    for (format, compression, ext) in [
        (OutputFormat::Zt, Compression::Raw, "zt"),
        (OutputFormat::Zt, Compression::Zstd(1), "zt"),
        (OutputFormat::Zt2, Compression::Raw, "zt"),
        (OutputFormat::Zt2, Compression::Zstd(1), "zt"),
        (OutputFormat::Safetensors, Compression::Raw, "safetensors"),
    ] {
        let dst = dir
            .path()
            .join(format!("out-{format:?}-{compression:?}.{ext}"));
        let options = ConvertOptions {
            format: Some(format),
            compression,
            checksum: Checksum::None,
            ..ConvertOptions::default()
        };
        let mut calls = Vec::new();
        let n = convert(&src, &dst, &options, &mut |done, of, bytes| {
            calls.push((done, of, bytes));
            Ok(())
        })
        .unwrap();
        let case = format!("{format:?} {compression:?}: {calls:?}");
        assert_eq!(n, 2, "{case}");
        // Reports inside the big tensor (no tensor done yet, some bytes done) ...
        let inside = calls
            .iter()
            .filter(|&&(done, _, bytes)| done == 0 && bytes > 0 && bytes < big.len() as u64)
            .count();
        assert!(inside >= 2, "{case}");
        // ... that never go back, and end at the total with both tensors done.
        assert!(
            calls
                .windows(2)
                .all(|w| w[0].2 <= w[1].2 && w[0].0 <= w[1].0),
            "{case}"
        );
        assert_eq!(calls.last(), Some(&(2, 2, total)), "{case}");
        assert!(
            calls
                .iter()
                .all(|&(_, of, bytes)| of == 2 && bytes <= total),
            "{case}"
        );
        let out = tensorwire::open(&dst).unwrap();
        assert_eq!(&*out.view("big").unwrap().bytes, &big[..], "{case}");
    }
}

/// A progress callback that returns an error stops the conversion within the large
/// tensor, and no output (nor its temporary) is left behind, for every format.
#[test]
fn an_error_from_progress_cancels_the_conversion_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big.zt");
    let big = vec![7u8; PROGRESS_CHUNK * 3];
    let mut w = ZtWriter::create(&src).unwrap();
    let shape = Shape::new(vec![big.len() as u64]).unwrap();
    w.add_dense("big", DType::U8, &shape, &big, WriteOptions::default())
        .unwrap();
    w.finish().unwrap();
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    for (format, compression) in [
        (OutputFormat::Zt, Compression::Raw),
        (OutputFormat::Zt, Compression::Zstd(1)),
        (OutputFormat::Zt2, Compression::Raw),
        (OutputFormat::Zt2, Compression::Zstd(1)),
        (OutputFormat::Safetensors, Compression::Raw),
    ] {
        let dst = out_dir.join("out");
        let options = ConvertOptions {
            format: Some(format),
            compression,
            checksum: Checksum::None,
            ..ConvertOptions::default()
        };
        let mut reports = 0;
        let err = convert(&src, &dst, &options, &mut |_, _, _| {
            reports += 1;
            Err(tensorwire::Error::Cancelled { what: "a test" })
        })
        .unwrap_err();
        let case = format!("{format:?} {compression:?}");
        assert!(
            matches!(err.root(), tensorwire::Error::Cancelled { .. }),
            "{case}: {err}"
        );
        assert_eq!(reports, 1, "{case}");
        let left: Vec<_> = std::fs::read_dir(&out_dir).unwrap().collect();
        assert!(left.is_empty(), "{case}: {left:?}");
    }
}

/// A `ZtWriter` whose write stopped part-way refuses to go on (its offsets no longer
/// match the file), and dropping it removes the new file's temporary.
#[test]
fn a_writer_stopped_part_way_refuses_more_and_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.zt");
    let data = vec![1u8; PROGRESS_CHUNK * 2];
    let shape = Shape::new(vec![data.len() as u64]).unwrap();
    let mut w = ZtWriter::create(&path).unwrap();
    w.add_dense(
        "a",
        DType::U8,
        &Shape::new(vec![2]).unwrap(),
        &[1, 2],
        WriteOptions::default(),
    )
    .unwrap();
    let err = w
        .add_dense_with_progress(
            "big",
            DType::U8,
            &shape,
            &data,
            None,
            WriteOptions::default(),
            &mut |_| Err(tensorwire::Error::Cancelled { what: "a test" }),
        )
        .unwrap_err();
    assert!(matches!(err, tensorwire::Error::Cancelled { .. }), "{err}");
    let again = w
        .add_dense(
            "b",
            DType::U8,
            &Shape::new(vec![1]).unwrap(),
            &[3],
            WriteOptions::default(),
        )
        .unwrap_err();
    assert!(again.to_string().contains("cannot go on"), "{again}");
    assert!(w.finish().is_err());
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Objects copied whole from a `.zt` source (a sparse one here) report progress
/// within themselves too, and can be stopped there.
#[test]
fn objects_copied_from_a_zt_source_report_progress_within() {
    use tensorwire::core::Layout;
    use tensorwire::zt::ComponentData;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("sparse.zt");
    let nnz = PROGRESS_CHUNK / 2; // 2 chunks of f32 values, 8 of u64 coordinates (2 × nnz)
    let values = vec![0u8; nnz * 4];
    let coords = vec![0u8; nnz * 2 * 8];
    let mut w = ZtWriter::create(&src).unwrap();
    w.add_object(
        "s",
        &Shape::new(vec![4, 4]).unwrap(),
        Layout::SparseCoo,
        None,
        &[
            ComponentData {
                role: "coords",
                dtype: DType::U64,
                logical_type: None,
                data: &coords,
            },
            ComponentData {
                role: "values",
                dtype: DType::F32,
                logical_type: None,
                data: &values,
            },
        ],
        WriteOptions::default(),
    )
    .unwrap();
    w.finish().unwrap();
    let total = (values.len() + coords.len()) as u64;
    let mut calls = Vec::new();
    let dst = dir.path().join("copy.zt");
    convert(&src, &dst, &Default::default(), &mut |done, of, bytes| {
        calls.push((done, of, bytes));
        Ok(())
    })
    .unwrap();
    let inside = calls
        .iter()
        .filter(|&&(done, _, b)| done == 0 && b < total)
        .count();
    assert!(inside >= 8, "{calls:?}");
    assert_eq!(calls.last(), Some(&(1, 1, total)));
}

/// A stopped version 2 writer refuses even writes that would add no byte: an empty
/// tensor, or one whose bytes it would share with an earlier blob.
#[test]
fn a_stopped_version_2_writer_refuses_shared_and_empty_blobs() {
    use tensorwire::zt::ZtVersion;
    let mut w = ZtWriter::with_version(Vec::new(), ZtVersion::V2).unwrap();
    let raw = WriteOptions::default();
    let a = vec![5u8; 4096];
    let shape = |n: usize| Shape::new(vec![n as u64]).unwrap();
    w.add_dense("a", DType::U8, &shape(a.len()), &a, raw)
        .unwrap();
    let big = vec![1u8; PROGRESS_CHUNK * 2];
    let cancel = &mut |_| Err(tensorwire::Error::Cancelled { what: "a test" });
    let err =
        w.add_dense_with_progress("big", DType::U8, &shape(big.len()), &big, None, raw, cancel);
    assert!(matches!(err, Err(tensorwire::Error::Cancelled { .. })));
    for (name, data) in [("a_again", &a[..]), ("empty", &[][..])] {
        let err = w
            .add_dense(name, DType::U8, &shape(data.len()), data, raw)
            .unwrap_err();
        assert!(err.to_string().contains("cannot go on"), "{name}: {err}");
    }
    assert!(w.finish_into().is_err());
}
