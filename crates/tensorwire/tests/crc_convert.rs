//! `convert` of a ZIP-based file (an NPZ archive, a `.pt` checkpoint) whose record no
//! longer matches its CRC-32 (a damaged copy; `np.load` refuses it with "Bad
//! CRC-32") stops with the checksum error and leaves no output, as a `.zt` source
//! with a bad digest does; zero-copy views still touch no byte.

use std::path::PathBuf;

use tensorwire::core::{Error, TensorSource};
use tensorwire::formats::npy::NumpyReader;
use tensorwire::{convert, ConvertOptions, OutputFormat};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

#[test]
fn convert_refuses_an_npz_member_whose_crc_does_not_match() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["arrays.npz", "compressed.npz"] {
        let good = std::fs::read(fixture(&format!("numpy/{name}"))).unwrap();
        let reader = NumpyReader::open(fixture(&format!("numpy/{name}"))).unwrap();
        let mut bad = good.clone();
        let damaged = reader
            .tensors()
            .iter()
            .max_by_key(|t| t.stored_bytes)
            .unwrap();
        if damaged.encoding.is_none() {
            // A stored member: one bit of its first element.
            bad[damaged.offset as usize] ^= 0x40;
        } else {
            // A deflated member: its CRC, in the central directory.
            let record = good
                .windows(4)
                .enumerate()
                .filter(|(_, w)| *w == b"PK\x01\x02")
                .map(|(at, _)| at)
                .find(|&at| {
                    let name_len = u16::from_le_bytes([good[at + 28], good[at + 29]]) as usize;
                    good[at + 46..at + 46 + name_len] == *format!("{}.npy", damaged.name).as_bytes()
                })
                .unwrap();
            bad[record + 16] ^= 0x01;
        }
        let src = dir.path().join(format!("bad-{name}"));
        std::fs::write(&src, &bad).unwrap();
        // (arrays.npz holds complex arrays, which safetensors cannot: `.zt` only.)
        for (out, format) in [("out.zt", OutputFormat::Zt), ("out2.zt", OutputFormat::Zt2)] {
            let dst = dir.path().join(format!("{name}-{out}"));
            let options = ConvertOptions {
                format: Some(format),
                ..ConvertOptions::default()
            };
            let err = convert(&src, &dst, &options, &mut |_, _, _| Ok(())).unwrap_err();
            match err.root() {
                Error::DigestMismatch { tensor, .. } => {
                    let array = &damaged.name;
                    let named = format!("{array} (NPZ member {array}.npy)");
                    assert_eq!(tensor, &named, "{name} -> {out}")
                }
                other => panic!("{name} -> {out}: {other:?}"),
            }
            assert!(!dst.exists(), "{name} -> {out}: output left behind");
        }
        // The undamaged archive converts.
        let good_src = dir.path().join(format!("good-{name}"));
        std::fs::write(&good_src, &good).unwrap();
        let dst = dir.path().join(format!("good-{name}.zt"));
        convert(
            &good_src,
            &dst,
            &ConvertOptions::default(),
            &mut |_, _, _| Ok(()),
        )
        .unwrap();
    }
}

/// `convert` to `.zt` (both versions) and safetensors of `src`, each failing with a
/// CRC mismatch of `record` and leaving no output.
fn assert_conversions_refuse(src: &std::path::Path, record: &str, dir: &std::path::Path) {
    for (out, format) in [
        ("out.zt", OutputFormat::Zt),
        ("out2.zt", OutputFormat::Zt2),
        ("out.safetensors", OutputFormat::Safetensors),
    ] {
        let dst = dir.join(out);
        let options = ConvertOptions {
            format: Some(format),
            ..ConvertOptions::default()
        };
        let err = convert(src, &dst, &options, &mut |_, _, _| Ok(())).unwrap_err();
        match err.root() {
            Error::DigestMismatch {
                tensor, algorithm, ..
            } => {
                assert_eq!(tensor, record, "{out}");
                assert_eq!(*algorithm, "crc32", "{out}");
            }
            other => panic!("{out}: {other:?}"),
        }
        assert!(!dst.exists(), "{out}: output left behind");
    }
}

#[test]
fn convert_and_copies_refuse_a_pt_record_whose_crc_does_not_match() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(fixture("pytorch/single.pt")).unwrap();
    let reader = tensorwire::open(fixture("pytorch/single.pt")).unwrap();
    assert_eq!(reader.format(), "pytorch-zip");
    let (at, damaged) = reader
        .tensors()
        .iter()
        .enumerate()
        .max_by_key(|(_, t)| t.nbytes)
        .map(|(at, t)| (at, t.clone()))
        .unwrap();
    let expected = reader.view_at(at).unwrap().bytes.to_vec();
    let mut bad = good.clone();
    bad[damaged.offset as usize] ^= 0x40;
    let src = dir.path().join("bad.pt");
    std::fs::write(&src, &bad).unwrap();

    let reader = tensorwire::open(&src).unwrap();
    // A zero-copy view reads no byte (torch.load does not check CRCs at all): the
    // flipped bit shows.
    let view = reader.view_at(at).unwrap();
    assert!(view.zero_copy);
    assert_ne!(view.bytes.to_vec(), expected);
    // What copies and conversions call first: the CRC of the storage's record, which
    // fails every time (a failed check is not remembered as done).
    let key = &reader
        .as_any()
        .downcast_ref::<tensorwire::pytorch::PtReader>()
        .unwrap()
        .records()[at]
        .storage
        .key;
    // The error names the tensor asked for and the record holding its storage.
    let record = format!("{} (zip record archive/data/{key})", damaged.name);
    for _ in 0..2 {
        match reader.check_record_at(at) {
            Err(Error::DigestMismatch { tensor, .. }) => assert_eq!(tensor, record),
            other => panic!("{other:?}"),
        }
    }
    assert_conversions_refuse(&src, &record, dir.path());

    // Undamaged, the same checks pass and the file converts.
    let good_src = dir.path().join("good.pt");
    std::fs::write(&good_src, &good).unwrap();
    let dst = dir.path().join("good.zt");
    let reader = checks_and_converts(&good_src, &dst);
    assert_eq!(
        tensorwire::open(&dst)
            .unwrap()
            .view_at(0)
            .unwrap()
            .bytes
            .len() as u64,
        reader.tensors()[0].nbytes
    );
}

#[test]
fn a_pt_checkpoint_saved_without_crcs_converts() {
    // `torch.serialization.set_crc32_options(False)` writes zero CRCs: nothing to
    // check, as `verify` also skips them.
    let dir = tempfile::tempdir().unwrap();
    checks_and_converts(&fixture("pytorch/crc_zero.pt"), &dir.path().join("out.zt"));
}

/// Opens `src`, checks every record's CRC and converts it to `.zt` at `dst`, each
/// step expected to pass; the opened source.
fn checks_and_converts(src: &std::path::Path, dst: &std::path::Path) -> Box<dyn TensorSource> {
    let reader = tensorwire::open(src).unwrap();
    for at in 0..reader.tensors().len() {
        reader.check_record_at(at).unwrap();
    }
    convert(src, dst, &ConvertOptions::default(), &mut |_, _, _| Ok(())).unwrap();
    reader
}
