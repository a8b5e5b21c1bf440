//! How deep a checkpoint's containers may nest: `Limits::max_depth` (64 by default)
//! can be raised for an honest deep checkpoint, up to `MAX_DEPTH_CEILING`, which no
//! setting passes (every level is a stack frame of the walk).

mod common;

use common::{four_floats, four_floats_storage, legacy_with_object, Pickle};
use tensorwire_core::{Bytes, Error, Limits, TensorSource, MAX_DEPTH_CEILING};
use tensorwire_pytorch::PtReader;

/// `{"a": {"a": ... {"w": tensor} ...}}`, `levels` dicts deep.
fn nested(levels: usize) -> Vec<u8> {
    let mut object = Pickle::new();
    for _ in 1..levels {
        object.op(b"}(").str("a");
    }
    object.op(b"}(").str("w");
    four_floats(&mut object);
    for _ in 0..levels {
        object.op(b"u");
    }
    legacy_with_object(object.stop(), &[four_floats_storage()])
}

fn open(levels: usize, max_depth: usize) -> tensorwire_core::Result<PtReader> {
    let limits = Limits {
        max_depth,
        ..Limits::default()
    };
    PtReader::from_bytes(Bytes::from(nested(levels)), &limits)
}

fn depth_limit(err: &Error) -> Option<u64> {
    match err {
        Error::LimitExceeded { what, limit, .. } if what.contains("nesting") => Some(*limit),
        _ => None,
    }
}

#[test]
fn the_default_refuses_70_levels_and_a_raised_limit_reads_them() {
    let err = open(70, Limits::default().max_depth).unwrap_err();
    assert_eq!(depth_limit(&err), Some(64), "{err}");
    let reader = open(70, 100).unwrap();
    let name = format!("{}w", "a.".repeat(69));
    assert_eq!(reader.tensors()[0].name.as_ref(), name);
    assert_eq!(reader.view(&name).unwrap().bytes.len(), 16);
    // The object itself, as `torch.load` builds it, walks the same depth.
    reader.structure().unwrap();
}

#[test]
fn no_limit_passes_the_ceiling() {
    let deepest = MAX_DEPTH_CEILING - 2;
    let reader = open(deepest, usize::MAX).unwrap();
    reader.structure().unwrap();
    let err = open(MAX_DEPTH_CEILING + 10, usize::MAX).unwrap_err();
    assert_eq!(depth_limit(&err), Some(MAX_DEPTH_CEILING as u64), "{err}");
}
