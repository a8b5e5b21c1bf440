//! A pickle may reference one object from many places (the memo). Walking it copies
//! that object once per place, so a small file could ask for far more memory than
//! it holds. These checkpoints are small and hostile (or large and honest): the
//! hostile ones are refused with a limit error, at once and without the memory;
//! the honest ones open.

mod common;

use common::{four_floats, four_floats_storage, legacy_with_object, Pickle, Storage};
use tensorwire_core::{Bytes, Error, Limits, TensorSource, Value};
use tensorwire_pytorch::{Node, PtReader};

fn open(object: Vec<u8>, storages: &[Storage<'_>]) -> tensorwire_core::Result<PtReader> {
    let image = legacy_with_object(object, storages);
    PtReader::from_bytes(Bytes::from(image), &Limits::default())
}

fn is_text_limit(err: &Error) -> bool {
    matches!(
        err,
        Error::LimitExceeded { what, .. } if what.contains("text copied")
    )
}

/// One 1 MiB str, memoized, then a list of 20 000 references to it: an 8 MiB pickle
/// whose flat view would copy 20 GiB of text.
#[test]
fn one_str_referenced_everywhere_is_refused() {
    let big = "x".repeat(1 << 20);
    let mut object = Pickle::new();
    object
        .op(b"}(")
        .str("notes")
        .op(b"](")
        .str(&big)
        .op(b"q\x00");
    for _ in 1..20_000 {
        object.op(b"h\x00");
    }
    object.op(b"eu");
    let err = open(object.stop(), &[]).unwrap_err();
    assert!(is_text_limit(&err), "{err}");
}

/// Names are text too: one tensor under a dict with a 60 KB key, shared by every
/// item of a list of 20 000, makes 20 000 names of 60 KB.
#[test]
fn long_keys_shared_under_many_names_are_refused() {
    let key = "k".repeat(60_000);
    let mut object = Pickle::new();
    object.op(b"}(").str("layers").op(b"](").op(b"}(").str(&key);
    four_floats(&mut object);
    object.op(b"uq\x00");
    for _ in 1..20_000 {
        object.op(b"h\x00");
    }
    object.op(b"eu");
    let err = open(object.stop(), &[four_floats_storage()]).unwrap_err();
    assert!(is_text_limit(&err), "{err}");
}

/// An honest checkpoint that shares one list of 20 000 floats under five keys (a
/// training history kept twice, say) opens, as `torch.load` opens it: five values
/// in the flat view, one shared node in the structure.
#[test]
fn a_large_list_shared_under_several_keys_opens() {
    let mut object = Pickle::new();
    object.op(b"}(").str("weight");
    four_floats(&mut object);
    object.str("loss_0").op(b"](");
    for i in 0..20_000 {
        object.op(b"G").op(&f64::from(i).to_be_bytes());
    }
    object.op(b"eq\x00");
    for k in 1..5 {
        object.str(&format!("loss_{k}")).op(b"h\x00");
    }
    object.op(b"u");
    let reader = open(object.stop(), &[four_floats_storage()]).unwrap();
    assert_eq!(reader.tensors().len(), 1);
    for k in 0..5 {
        let Some(Value::List(items)) = reader.attributes().get(&format!("loss_{k}")) else {
            panic!(
                "loss_{k}: {:?}",
                reader.attributes().get(&format!("loss_{k}"))
            );
        };
        assert_eq!(items.len(), 20_000);
        assert_eq!(items[19_999], Value::Float(19_999.0));
    }
    let Node::Dict { items, .. } = reader.structure().unwrap() else {
        panic!("not a dict");
    };
    let ids: Vec<u64> = items[1..]
        .iter()
        .map(|(_, v)| match v {
            Node::Shared { id, .. } => *id,
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(ids.iter().all(|&id| id == ids[0]), "{ids:?}");
}

/// One `torch.Size` of 20 000 ints, memoized, then a list of 20 000 references to
/// it: a 100 KB pickle whose structure would copy 400 M ints. Each visit counts the
/// size's items, as a tuple's would be counted, in the flat view and the structure.
#[test]
fn one_size_referenced_everywhere_is_refused() {
    let mut object = Pickle::new();
    object.op(b"}(").str("sizes").op(b"](");
    object.global("torch", "Size").op(b"((");
    for i in 0..20_000 {
        object.int(i);
    }
    object.op(b"ttRq\x01");
    for _ in 1..20_000 {
        object.op(b"h\x01");
    }
    object.op(b"eu");
    let err = open(object.stop(), &[]).unwrap_err();
    assert!(
        matches!(&err, Error::LimitExceeded { what, .. } if what.contains("nodes visited")),
        "{err}"
    );
    // The same as a dict key, whose text (`torch.Size([0, 1, ...])`) is capped.
    let mut object = Pickle::new();
    object.op(b"}(").str("by_size").op(b"}(");
    object.global("torch", "Size").op(b"((");
    for i in 0..20_000 {
        object.int(i);
    }
    object.op(b"ttR").int(1).op(b"uu");
    let err = open(object.stop(), &[]).unwrap_err();
    assert!(
        matches!(&err, Error::LimitExceeded { what, .. } if what.contains("dict key text")),
        "{err}"
    );
}
