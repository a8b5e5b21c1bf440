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
