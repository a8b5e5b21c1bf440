//! A legacy checkpoint read through a counting positional reader: opening reads the
//! pickles only, and a tensor read reads its own bytes (and its storage's 8-byte
//! element count), never the storages around it.

mod common;

use std::sync::Arc;

use common::{f32s, legacy, Storage, Tensor};
use tensorwire_core::{Error, Limits, TensorSource};
use tensorwire_pytorch::PtReader;
use tensorwire_range::RangeFile;

const N: usize = 1 << 18; // 1 MiB of f32 per storage

fn write(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.legacy.pt");
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

fn tensor<'a>(name: &'a str, key: &'a str, offset: u64, n: u64) -> Tensor<'a> {
    Tensor {
        name,
        key,
        storage_numel: N as u64,
        offset,
        shape: vec![n],
        strides: vec![1],
    }
}

#[test]
fn reads_touch_only_the_requested_storage() {
    let storages: Vec<Storage<'_>> = ["10", "20", "30", "40"]
        .iter()
        .enumerate()
        .map(|(i, key)| Storage {
            key,
            count: N as u64,
            bytes: f32s(i as f32 * 1e6, N),
        })
        .collect();
    let tensors = [
        tensor("a", "10", 0, N as u64),
        tensor("b", "20", 0, N as u64),
        tensor("c_part", "30", 1000, 24),
        tensor("d", "40", 0, N as u64),
    ];
    let file_bytes = legacy(&tensors, &storages);
    let (_dir, path) = write(&file_bytes);
    let file = Arc::new(RangeFile::open(&path).unwrap());
    let reader = PtReader::from_range(file.clone(), &Limits::default()).unwrap();
    let after_open = file.bytes_read();
    let first_storage = reader.tensors().iter().map(|t| t.offset).min().unwrap();
    assert!(
        after_open < 64 * 1024 + 32 && after_open < file_bytes.len() as u64 / 16,
        "opening read {after_open} bytes of {}",
        file_bytes.len()
    );
    assert!(first_storage < 4096);

    let view = reader.view("c_part").unwrap();
    assert_eq!(file.bytes_read() - after_open, 24 * 4 + 8);
    assert_eq!(view.bytes.as_slice(), &f32s(2e6 + 1000.0, 24)[..]);
    assert!(!view.zero_copy);

    let before = file.bytes_read();
    let d = reader.view("d").unwrap();
    assert_eq!(file.bytes_read() - before, (N * 4 + 8) as u64);
    assert_eq!(&d.bytes[..8], &f32s(3e6, 2)[..]);

    // Mapped, the same file's contiguous tensors are zero-copy slices.
    let mapped = PtReader::open(&path).unwrap();
    assert!(mapped.view("b").unwrap().zero_copy);
    assert_eq!(
        mapped.view("b").unwrap().bytes,
        reader.view("b").unwrap().bytes
    );
}

#[test]
fn lying_element_counts_and_short_files_are_errors() {
    let storages = [
        Storage {
            key: "1",
            count: 16,
            bytes: f32s(0.0, 16),
        },
        Storage {
            key: "2",
            count: 99, // the pickle says 16
            bytes: f32s(0.0, 16),
        },
    ];
    let tensors = [
        Tensor {
            storage_numel: 16,
            ..tensor("a", "1", 0, 16)
        },
        Tensor {
            storage_numel: 16,
            ..tensor("b", "2", 0, 16)
        },
    ];
    let bytes = legacy(&tensors, &storages);
    let (_dir, path) = write(&bytes);
    let reader = PtReader::open(&path).unwrap();
    assert!(reader.view("a").is_ok());
    assert!(matches!(
        reader.view("b").unwrap_err(),
        Error::SizeMismatch {
            expected: 16,
            found: 99,
            ..
        }
    ));
    assert!(reader.verify().is_err());

    // Truncated anywhere: opening fails or the tensor read fails, with a typed error.
    for cut in 0..bytes.len() {
        let result = PtReader::from_bytes(bytes[..cut].to_vec().into(), &Limits::default())
            .and_then(|r| r.view("a").map(|_| ()));
        assert!(result.is_err(), "cut at {cut}");
    }
}

#[test]
fn extents_past_the_storage_are_refused() {
    let storages = [Storage {
        key: "1",
        count: 16,
        bytes: f32s(0.0, 16),
    }];
    for t in [
        Tensor {
            storage_numel: 16,
            ..tensor("a", "1", 10, 7)
        },
        Tensor {
            storage_numel: 16,
            shape: vec![4, 4],
            strides: vec![5, 1],
            ..tensor("a", "1", 0, 0)
        },
        Tensor {
            storage_numel: 16,
            shape: vec![u32::MAX as u64, 2],
            strides: vec![u32::MAX as u64, 1 << 31],
            ..tensor("a", "1", 0, 0)
        },
    ] {
        let bytes = legacy(&[t], &storages);
        let err = PtReader::from_bytes(bytes.into(), &Limits::default()).unwrap_err();
        assert!(
            matches!(err, Error::OutOfBounds { .. } | Error::Overflow { .. }),
            "{err}"
        );
    }
    // A storage the pickle uses but the key list omits.
    let bytes = legacy(
        &[Tensor {
            storage_numel: 16,
            ..tensor("a", "missing", 0, 16)
        }],
        &storages,
    );
    assert!(PtReader::from_bytes(bytes.into(), &Limits::default()).is_err());
}
