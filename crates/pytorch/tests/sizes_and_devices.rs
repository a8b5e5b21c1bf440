//! `torch.Size` and `torch.device` values in a checkpoint (a saved input shape, the
//! device a run trained on): `torch.load` gives back those classes, so the structure
//! keeps them ([`Node::Size`], [`Node::Device`]); the flat view's metadata has a list
//! of ints and the device's text, and a dict key of either is named as `str(key)`.

mod common;

use common::{four_floats, four_floats_storage, legacy_with_object, Pickle};
use tensorwire_core::{Bytes, Error, Limits, TensorSource, Value};
use tensorwire_pytorch::{Node, PtReader};

fn open(object: Vec<u8>) -> tensorwire_core::Result<PtReader> {
    let image = legacy_with_object(object, &[four_floats_storage()]);
    PtReader::from_bytes(Bytes::from(image), &Limits::default())
}

/// Pushes `torch.Size(items)`, the items pushed by `items`.
fn size(p: &mut Pickle, items: impl FnOnce(&mut Pickle)) {
    p.global("torch", "Size").op(b"((");
    items(p);
    p.op(b"ttR");
}

/// Pushes `torch.device(kind)` or `torch.device(kind, index)`, as torch pickles one.
fn device(p: &mut Pickle, kind: &str, index: Option<i64>) {
    p.global("torch", "device").op(b"(").str(kind);
    if let Some(index) = index {
        p.int(index);
    }
    p.op(b"tR");
}

#[test]
fn sizes_and_devices_keep_their_class_in_the_structure() {
    let mut p = Pickle::new();
    p.op(b"}(").str("w");
    four_floats(&mut p);
    p.str("shape");
    size(&mut p, |p| {
        p.int(2).int(3);
    });
    p.str("flags");
    size(&mut p, |p| {
        p.op(b"\x88\x89"); // True, False: torch.Size([1, 0])
    });
    p.str("scalar_shape");
    size(&mut p, |_| {});
    p.str("dev");
    device(&mut p, "cuda", Some(1));
    p.str("cpu_dev");
    device(&mut p, "cpu", None);
    p.str("one_string");
    device(&mut p, "privateuseone:3", None);
    p.str("index_alone");
    p.global("torch", "device").op(b"(").int(2).op(b"tR");
    p.str("by_key").op(b"}(");
    size(&mut p, |p| {
        p.int(4);
    });
    p.int(1).op(b"(");
    device(&mut p, "cuda", Some(0));
    p.int(2).op(b"t").str("x");
    device(&mut p, "meta", None);
    p.int(5).op(b"u");
    p.op(b"u");
    let reader = open(p.stop()).unwrap();

    let ints = |v: &[i64]| Value::List(v.iter().map(|&n| Value::Int(n.into())).collect());
    let attributes = reader.attributes();
    assert_eq!(attributes["shape"], ints(&[2, 3]));
    assert_eq!(attributes["flags"], ints(&[1, 0]));
    assert_eq!(attributes["scalar_shape"], ints(&[]));
    assert_eq!(attributes["dev"], Value::Str("cuda:1".into()));
    assert_eq!(attributes["cpu_dev"], Value::Str("cpu".into()));
    assert_eq!(
        attributes["one_string"],
        Value::Str("privateuseone:3".into())
    );
    assert_eq!(attributes["index_alone"], Value::Str("cuda:2".into()));
    // Keys written as Python's str() writes them.
    assert_eq!(
        attributes["by_key"],
        Value::Map(vec![
            ("torch.Size([4])".into(), Value::Int(1.into())),
            (
                "(device(type='cuda', index=0), 2)".into(),
                Value::Str("x".into())
            ),
            ("meta".into(), Value::Int(5.into())),
        ])
    );
    assert_eq!(reader.tensors().len(), 1);

    let Node::Dict { items, .. } = reader.structure().unwrap() else {
        panic!("not a dict");
    };
    let value = |name: &str| {
        items
            .iter()
            .find(|(k, _)| matches!(k, Node::Value(Value::Str(s)) if s == name))
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    assert_eq!(value("shape"), Node::Size(vec![2, 3]));
    assert_eq!(value("flags"), Node::Size(vec![1, 0]));
    assert_eq!(value("scalar_shape"), Node::Size(vec![]));
    assert_eq!(value("dev"), Node::Device("cuda:1".into()));
    assert_eq!(value("cpu_dev"), Node::Device("cpu".into()));
    let Node::Dict { items: keyed, .. } = value("by_key") else {
        panic!("by_key is not a dict");
    };
    let keys: Vec<&Node> = keyed.iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        [
            &Node::Size(vec![4]),
            &Node::Tuple(vec![
                Node::Device("cuda:0".into()),
                Node::Value(Value::Int(2.into()))
            ]),
            &Node::Device("meta".into()),
        ]
    );
}

#[test]
fn a_size_or_device_referenced_again_is_one_shared_node() {
    // {"w": t, "a": Size([2, 3]) memoized, "b": the memo's size, "c": device
    // memoized, "d": the memo's device}: torch.load gives one object for "a" and
    // "b", and one for "c" and "d".
    let mut p = Pickle::new();
    p.op(b"}(").str("w");
    four_floats(&mut p);
    p.str("a");
    size(&mut p, |p| {
        p.int(2).int(3);
    });
    p.op(b"q\x09").str("b").op(b"h\x09").str("c");
    device(&mut p, "cuda", Some(1));
    p.op(b"q\x0a").str("d").op(b"h\x0a").op(b"u");
    let reader = open(p.stop()).unwrap();
    assert_eq!(reader.attributes()["b"], reader.attributes()["a"]);
    assert_eq!(reader.attributes()["d"], Value::Str("cuda:1".into()));

    let Node::Dict { items, .. } = reader.structure().unwrap() else {
        panic!("not a dict");
    };
    let shared = |at: usize| match &items[at].1 {
        Node::Shared { id, node } => (*id, (**node).clone()),
        other => panic!("item {at} is not shared: {other:?}"),
    };
    assert_eq!(shared(1), shared(2));
    assert_eq!(shared(1).1, Node::Size(vec![2, 3]));
    assert_eq!(shared(3), shared(4));
    assert_eq!(shared(3).1, Node::Device("cuda:1".into()));
    assert_ne!(shared(1).0, shared(3).0);
}

/// Opens `{"v": value}`, `value` pushed by `push`, expecting a malformed error that
/// says `want`.
fn assert_refused(want: &str, push: impl FnOnce(&mut Pickle)) {
    let mut p = Pickle::new();
    p.op(b"}(").str("v");
    push(&mut p);
    p.op(b"u");
    let err = open(p.stop()).unwrap_err();
    assert!(matches!(err, Error::Malformed { .. }), "{want}: {err:?}");
    assert!(err.to_string().contains(want), "{want}: {err}");
}

#[test]
fn sizes_and_devices_torch_would_not_make_are_refused() {
    assert_refused("a size that is a float", |p| {
        p.global("torch", "Size").op(b"((G");
        p.op(&1.5f64.to_be_bytes()).op(b"ttR");
    });
    assert_refused("a size that is a str", |p| {
        size(p, |p| {
            p.str("2");
        })
    });
    assert_refused("0 arguments", |p| {
        p.global("torch", "device").op(b")R");
    });
    // What torch refuses: a negative index, an index given twice, a malformed type
    // or index.
    assert_refused("a negative device index -1", |p| {
        device(p, "cuda", Some(-1))
    });
    assert_refused("an index given twice", |p| device(p, "cuda:0", Some(1)));
    for spec in [
        "not a device",
        "",
        "cuda:",
        "cuda:01",
        "cuda:-1",
        "cuda:0:1",
        "cu3da",
    ] {
        assert_refused("invalid device string", |p| device(p, spec, None));
    }
    assert_refused("an index given twice", |p| {
        p.global("torch", "device")
            .op(b"(")
            .str("cuda:0")
            .op(b"NtR");
    });
    assert_refused("a negative device index -2", |p| {
        p.global("torch", "device").op(b"(").int(-2).op(b"tR");
    });
    assert_refused("a device type that is a float", |p| {
        p.global("torch", "device").op(b"(G");
        p.op(&1.0f64.to_be_bytes()).op(b"tR");
    });
    assert_refused("a float", |p| {
        p.global("torch", "device").op(b"(").str("cuda");
        p.op(b"G").op(&1.0f64.to_be_bytes()).op(b"tR");
    });
}

#[test]
fn a_size_is_a_shape_where_torch_takes_one() {
    // `_rebuild_tensor_v2(storage, 0, torch.Size([2, 2]), (2, 1), ...)`: torch
    // pickles plain tuples, but a Size reads as the same shape.
    let mut p = Pickle::new();
    p.op(b"}(").str("w");
    p.global("torch._utils", "_rebuild_tensor_v2")
        .op(b"((")
        .str("storage")
        .global("torch", "FloatStorage")
        .str("0")
        .str("cpu")
        .int(4)
        .op(b"tQ")
        .int(0);
    size(&mut p, |p| {
        p.int(2).int(2);
    });
    p.ints(&[2, 1])
        .op(b"\x89")
        .global("collections", "OrderedDict")
        .op(b")RtR");
    p.op(b"u");
    let reader = open(p.stop()).unwrap();
    assert_eq!(reader.tensors()[0].shape.dims(), [2, 2]);
    assert_eq!(reader.view("w").unwrap().bytes.len(), 16);
}
