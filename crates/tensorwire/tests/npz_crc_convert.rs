//! `convert` of an NPZ archive whose member no longer matches its CRC-32 (a damaged
//! copy; `np.load` refuses it with "Bad CRC-32") stops with the checksum error and
//! leaves no output, as a `.zt` source with a bad digest does.

use std::path::PathBuf;

use tensorwire::core::{Error, TensorSource};
use tensorwire::formats::npy::NumpyReader;
use tensorwire::{convert, ConvertOptions, OutputFormat};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/numpy")
        .join(name)
}

#[test]
fn convert_refuses_an_npz_member_whose_crc_does_not_match() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["arrays.npz", "compressed.npz"] {
        let good = std::fs::read(fixture(name)).unwrap();
        let reader = NumpyReader::open(fixture(name)).unwrap();
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
                    assert_eq!(tensor, &format!("{}.npy", damaged.name), "{name} -> {out}")
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
