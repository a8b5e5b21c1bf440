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
            calls.push((done, of, bytes))
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
