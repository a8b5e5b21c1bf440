//! Every checkpoint in `fixtures/pytorch` (written by the real torch, see
//! `make_fixtures.py`) reads back equal to what torch saved: names, dtypes, shapes,
//! strides, storage offsets, values (`.npy` files saved from torch) and the non-tensor
//! metadata; the malicious ones are refused naming their global. Both the mapped and
//! the positional-read paths are checked.

use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use tensorwire_core::{DType, Error, Limits, TensorSource, Value};
use tensorwire_pytorch::{DictKind, PtReader};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch")
}

fn expectations() -> Vec<(PathBuf, Json)> {
    let mut out: Vec<_> = std::fs::read_dir(dir().join("expected"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let json: Json = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            let file = p.file_stem().unwrap().to_str().unwrap().to_owned();
            (dir().join(file), json)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        out.len() >= 25,
        "expected the fixture set, found {}",
        out.len()
    );
    out
}

/// The expectations of the checkpoints that read (not the malicious ones).
fn readable() -> impl Iterator<Item = (PathBuf, Json)> {
    expectations()
        .into_iter()
        .filter(|(_, want)| want.get("error").is_none())
}

/// The expectations of the checkpoints that fail with the error `kind` (`refused
/// global`, `unsupported`).
fn failing(kind: &str) -> impl Iterator<Item = (PathBuf, Json)> + '_ {
    expectations()
        .into_iter()
        .filter(move |(_, want)| want.get("error").and_then(Json::as_str) == Some(kind))
}

/// The data bytes of a little-endian, C-order `.npy` file.
fn npy_data(path: &Path) -> Vec<u8> {
    let raw = std::fs::read(path).unwrap();
    assert_eq!(&raw[..6], b"\x93NUMPY", "{}", path.display());
    let (header_len, start) = match raw[6] {
        1 => (u16::from_le_bytes([raw[8], raw[9]]) as usize, 10),
        _ => (
            u32::from_le_bytes(raw[8..12].try_into().unwrap()) as usize,
            12,
        ),
    };
    let header = std::str::from_utf8(&raw[start..start + header_len]).unwrap();
    assert!(header.contains("'fortran_order': False"), "{header}");
    assert!(!header.contains("'>"), "big-endian npy: {header}");
    raw[start + header_len..].to_vec()
}

fn dims(json: &Json) -> Vec<u64> {
    json.as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

fn value_matches(value: &Value, json: &Json) -> bool {
    match (value, json) {
        (Value::Null, Json::Null) => true,
        (Value::Bool(a), Json::Bool(b)) => a == b,
        (Value::Int(a), Json::Number(n)) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i128::from(i) == *a,
            (_, Some(u)) => i128::from(u) == *a,
            // Past 64 bits serde_json has only the nearest f64 (the exact values of
            // big_ints.pt are checked in `ints_of_any_width_read_exactly`).
            _ => n.as_f64() == Some(*a as f64),
        },
        (Value::BigInt(a), Json::Number(n)) => {
            n.as_i64().is_none() && n.as_u64().is_none() && n.as_f64() == a.to_string().parse().ok()
        }
        (Value::Float(a), Json::Number(n)) => n.as_f64() == Some(*a),
        (Value::Str(a), Json::String(b)) => a == b,
        (Value::List(a), Json::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| value_matches(x, y))
        }
        (Value::Map(a), Json::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .all(|(k, v)| b.get(k).is_some_and(|j| value_matches(v, j)))
        }
        _ => false,
    }
}

fn check_source(path: &Path, reader: &PtReader, want: &Json) {
    let label = path.display();
    assert_eq!(reader.format(), want["format"].as_str().unwrap(), "{label}");
    let tensors = want["tensors"].as_array().unwrap();
    let names: Vec<&str> = reader.tensors().iter().map(|t| &*t.name).collect();
    let want_names: Vec<&str> = tensors
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, want_names, "{label}");
    for t in tensors {
        let name = t["name"].as_str().unwrap();
        let info = reader.info(name).unwrap();
        let dtype: DType = t["dtype"].as_str().unwrap().parse().unwrap();
        assert_eq!(info.dtype, dtype, "{label} {name}");
        assert_eq!(info.shape.dims(), dims(&t["shape"]), "{label} {name}");
        // A dtype only torch has is listed as its holder elements, named by the layout.
        let layout = t.get("layout").and_then(Json::as_str).unwrap_or("dense");
        assert_eq!(info.layout.name(), layout, "{label} {name}");
        let record = reader.record(name).unwrap();
        assert_eq!(
            record.strides.to_vec(),
            dims(&t["strides"]),
            "{label} {name}"
        );
        assert_eq!(
            record.storage_offset,
            t["storage_offset"].as_u64().unwrap(),
            "{label} {name}"
        );
        assert_eq!(
            record.is_contiguous(),
            t["contiguous"].as_bool().unwrap(),
            "{label} {name}"
        );
        if reader.format() == "pytorch-zip" {
            if let Some(key) = t.get("storage_key").and_then(Json::as_str) {
                assert_eq!(&*record.storage.key, key, "{label} {name}");
            }
        }
        // A quantized tensor's scheme and parameters; none for the others.
        let want_attributes = t.get("attributes").and_then(Json::as_object);
        assert_eq!(
            info.attributes.len(),
            want_attributes.map_or(0, |a| a.len()),
            "{label} {name}: {:?}",
            info.attributes
        );
        for (k, v) in want_attributes.into_iter().flatten() {
            let got = info.attributes.get(k);
            assert!(
                got.is_some_and(|got| value_matches(got, v)),
                "{label} {name} {k}: {got:?} vs {v}"
            );
        }
        let view = reader.view(name).unwrap();
        let expected = npy_data(&dir().join("expected").join(t["npy"].as_str().unwrap()));
        assert_eq!(view.bytes.as_slice(), &expected[..], "{label} {name}");
        let little = want["byteorder"].as_str() != Some("big");
        let mapped_raw = little && info.encoding.is_none();
        assert_eq!(
            view.zero_copy,
            mapped_raw && record.is_contiguous() && reader_is_mapped(reader),
            "{label} {name}"
        );
    }
    check_meta_tensors(path, reader, want);
    let attributes = want["attributes"].as_object().unwrap();
    assert_eq!(
        reader.attributes().len(),
        attributes.len(),
        "{label}: {:?}",
        reader.attributes()
    );
    for (k, v) in attributes {
        let got = reader
            .attributes()
            .get(k)
            .unwrap_or_else(|| panic!("{label}: no attribute {k}"));
        assert!(value_matches(got, v), "{label} {k}: {got:?} vs {v}");
    }
}

/// The tensors on the meta device, as torch saved them (none where the JSON lists
/// none); viewing one is `Unsupported`, naming it.
fn check_meta_tensors(path: &Path, reader: &PtReader, want: &Json) {
    let label = path.display();
    let empty = Vec::new();
    let want = want
        .get("meta_tensors")
        .and_then(Json::as_array)
        .unwrap_or(&empty);
    let got = reader.meta_tensors();
    assert_eq!(got.len(), want.len(), "{label}: {got:?}");
    for (m, w) in got.iter().zip(want) {
        let name = w["name"].as_str().unwrap();
        assert_eq!(&*m.name, name, "{label}");
        let t = &m.tensor;
        assert_eq!(
            t.dtype_name,
            format!("torch.{}", w["dtype"].as_str().unwrap()),
            "{label} {name}"
        );
        assert_eq!(t.shape.dims(), dims(&w["shape"]), "{label} {name}");
        assert_eq!(t.strides.to_vec(), dims(&w["stride"]), "{label} {name}");
        assert_eq!(
            (t.requires_grad, t.parameter),
            (
                w["requires_grad"].as_bool().unwrap(),
                w["parameter"].as_bool().unwrap()
            ),
            "{label} {name}"
        );
        assert_eq!(
            m.position as u64,
            w["position"].as_u64().unwrap(),
            "{label} {name}"
        );
        assert_eq!(
            m.same_as.map(|i| i as u64),
            w["same_as"].as_u64(),
            "{label} {name}"
        );
        let err = reader.view(name).unwrap_err();
        assert!(
            matches!(err.root(), Error::Unsupported { .. }) && err.to_string().contains("meta"),
            "{label} {name}: {err}"
        );
    }
}

/// Whether a fixture's tensor is a lazy conjugate or negative view (its attributes).
fn has_lazy_signs(t: &Json) -> bool {
    ["torch.is_conj", "torch.is_neg"]
        .iter()
        .any(|bit| t["attributes"][bit].as_bool() == Some(true))
}

fn reader_is_mapped(reader: &PtReader) -> bool {
    // Sources opened with `PtReader::open` are mapped, `open_ranged` ones are not.
    format!("{reader:?}").contains("Mapped")
}

#[test]
fn every_fixture_reads_back_as_torch_saved_it() {
    let mut checked = 0;
    for (path, want) in readable() {
        let mapped = PtReader::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        check_source(&path, &mapped, &want);
        let ranged = PtReader::open_ranged(&path, &Limits::default()).unwrap();
        check_source(&path, &ranged, &want);
        checked += 1;
    }
    assert!(checked >= 20, "{checked}");
}

/// `torch.load` of `views.pt` (ZIP and legacy) gives one tensor object under both
/// `tied_a` and `tied_b` (`sd["tied_b"] is sd["tied_a"]`: pickled once, memoized), and
/// of `shared.pt` one list under `a`, `b` and in `pair`; no other fixture has such a
/// pair, though several share storages between tensors.
#[test]
fn tensors_pickled_once_under_two_names_are_one_object() {
    for (path, _) in readable() {
        let reader = PtReader::open(&path).unwrap();
        let names: Vec<(&str, &str)> = reader
            .same_objects()
            .iter()
            .map(|&(at, first)| (&*reader.tensors()[at].name, &*reader.tensors()[first].name))
            .collect();
        let file = path.file_name().unwrap().to_str().unwrap();
        let expected: &[(&str, &str)] = if file.starts_with("views.") {
            &[("tied_b", "tied_a")]
        } else if file.starts_with("quantized.") {
            &[("tied", "fc.weight")]
        } else if file.starts_with("sparse.") {
            &[
                ("coo_again.indices", "coo.indices"),
                ("coo_again.values", "coo.values"),
            ]
        } else if file.starts_with("shared.") {
            &[
                ("b.0", "a.0"),
                ("b.1", "a.1"),
                ("w", "a.0"),
                ("pair.0.0", "a.0"),
                ("pair.0.1", "a.1"),
                ("pair.1.0", "a.0"),
                ("pair.1.1", "a.1"),
            ]
        } else {
            &[]
        };
        assert_eq!(names, expected, "{file}");
    }
}

/// `shared.pt`: every place of a container pickled once is a `Node::Shared` with one
/// id, holding the whole container (so the tensor names stay those of the flat view).
#[test]
fn containers_pickled_once_are_shared_nodes() {
    use tensorwire_pytorch::Node;
    for file in ["shared.pt", "shared.legacy.pt"] {
        let reader = PtReader::open(dir().join(file)).unwrap();
        let tree = reader.structure().unwrap();
        let Node::Dict { items, .. } = &tree else {
            panic!("{file}: {tree:?}")
        };
        let get = |items: &[(Node, Node)], key: &str| -> Node {
            items
                .iter()
                .find(|(k, _)| *k == Node::Value(Value::Str(key.into())))
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("{file}: no `{key}`"))
        };
        let shared = |node: &Node| -> (u64, Node) {
            match node {
                Node::Shared { id, node } => (*id, (**node).clone()),
                other => panic!("{file}: not shared: {other:?}"),
            }
        };
        let (a_id, a) = shared(&get(items, "a"));
        let (b_id, b) = shared(&get(items, "b"));
        assert_eq!(a_id, b_id, "{file}");
        // The first place names the tensors `a.*`, the second `b.*`.
        assert_eq!(
            a,
            Node::List(vec![Node::Tensor("a.0".into()), Node::Tensor("a.1".into())])
        );
        assert_eq!(
            b,
            Node::List(vec![Node::Tensor("b.0".into()), Node::Tensor("b.1".into())])
        );
        let Node::Tuple(pair) = get(items, "pair") else {
            panic!("{file}: pair")
        };
        assert!(pair.iter().all(|p| shared(p).0 == a_id), "{file}");
        // Tensors are not wrapped: their identity comes from `same_objects`.
        assert_eq!(get(items, "w"), Node::Tensor("w".into()));
        let Node::Dict { items: opt, .. } = get(items, "opt") else {
            panic!("{file}: opt")
        };
        let (group_id, group) = shared(&get(&opt, "group"));
        assert_eq!(shared(&get(&opt, "again")).0, group_id);
        let Node::Dict { items: group, .. } = group else {
            panic!("{file}: group")
        };
        let (betas_id, _) = shared(&get(&opt, "betas"));
        assert_eq!(shared(&get(&group, "betas")).0, betas_id);
        assert_ne!(betas_id, group_id);
        // Nothing else is shared.
        assert!(!matches!(tree, Node::Shared { .. }));
    }
}

/// `partial_storages` lists exactly the tensors whose storage (as torch saved it:
/// `storage_key`, `storage_nbytes`) holds another tensor, or more than their bytes,
/// and the lazy conjugate and negative views (torch's tensor lies on the stored
/// elements with its bit set).
#[test]
fn partial_storages_are_those_torch_shares_or_covers_in_part() {
    let mut seen_partial = 0;
    for (path, want) in readable() {
        let tensors = want["tensors"].as_array().unwrap();
        let key = |t: &Json| t["storage_key"].as_str().unwrap().to_owned();
        let expected: Vec<usize> = tensors
            .iter()
            .enumerate()
            .filter(|(_, t)| {
                let dims = dims(&t["shape"]);
                let strides = self::dims(&t["strides"]);
                let elem = t["dtype"]
                    .as_str()
                    .unwrap()
                    .parse::<DType>()
                    .unwrap()
                    .size()
                    .unwrap() as u64;
                let start = t["storage_offset"].as_u64().unwrap() * elem;
                let end = if dims.contains(&0) {
                    start
                } else {
                    let last: u64 = dims.iter().zip(&strides).map(|(&d, &s)| (d - 1) * s).sum();
                    (t["storage_offset"].as_u64().unwrap() + last + 1) * elem
                };
                let sharers = tensors.iter().filter(|u| key(u) == key(t)).count();
                sharers > 1
                    || (start, end) != (0, t["storage_nbytes"].as_u64().unwrap())
                    || has_lazy_signs(t)
            })
            .map(|(i, _)| i)
            .collect();
        let reader = PtReader::open(&path).unwrap();
        assert_eq!(reader.partial_storages(), expected, "{}", path.display());
        seen_partial += expected.len();
    }
    assert!(seen_partial >= 10, "{seen_partial}");
}

#[test]
fn malicious_pickles_are_refused_naming_the_global() {
    let mut refused = 0;
    for (path, want) in failing("refused global") {
        let err = PtReader::open(&path).unwrap_err();
        match err.root() {
            Error::RefusedGlobal { global, .. } => {
                assert_eq!(
                    global,
                    want["global"].as_str().unwrap(),
                    "{}",
                    path.display()
                )
            }
            other => panic!("{}: {other}", path.display()),
        }
        assert!(err.is_corrupt_data());
        refused += 1;
    }
    assert!(refused >= 4, "{refused}");
}

/// Files `torch.load(weights_only=True)` reads (the fixture script checks) that hold
/// what tensorwire cannot build: `Unsupported`, naming it, not refused as unsafe.
#[test]
fn what_torch_allows_but_tensorwire_cannot_build_is_unsupported() {
    let mut seen = 0;
    for (path, want) in failing("unsupported") {
        let builds = want["builds"].as_str().unwrap();
        let err = PtReader::open(&path).unwrap_err();
        assert!(
            matches!(err.root(), Error::Unsupported { .. }) && err.to_string().contains(builds),
            "{}: {err}",
            path.display()
        );
        assert!(!err.is_corrupt_data(), "{}: {err}", path.display());
        seen += 1;
    }
    assert!(seen >= 1, "{seen}");
}

/// Every global torch's `weights_only=True` unpickler allows (listed by the fixture
/// script from torch itself) resolves, or is `Unsupported` (a storage of 4 or 2-bit
/// quantized values): none is refused as unsafe.
#[test]
fn every_global_torch_allows_resolves_or_is_unsupported() {
    let list = std::fs::read_to_string(dir().join("weights_only_globals.txt")).unwrap();
    let mut resolved = 0;
    let mut wrong = Vec::new();
    for full in list.lines() {
        let (module, name) = full.rsplit_once('.').unwrap();
        match tensorwire_pytorch::globals::resolve(module, name, 0) {
            Ok(_) => resolved += 1,
            Err(Error::Unsupported { what }) if what.contains(full) => {}
            Err(other) => wrong.push(format!("{full}: {other}")),
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert!(resolved >= 140, "{resolved}");
    for refused in [
        "torch.load",
        "builtins.eval",
        "os.system",
        "torch._utils._rebuild_nested_tensor",
        "numpy.core.multiarray._reconstruct",
    ] {
        let (module, name) = refused.rsplit_once('.').unwrap();
        assert!(
            matches!(
                tensorwire_pytorch::globals::resolve(module, name, 0),
                Err(Error::RefusedGlobal { .. })
            ),
            "{refused}"
        );
    }
}

#[test]
fn dtypes_cover_every_torch_storage_type() {
    let reader = PtReader::open(dir().join("dtypes.pt")).unwrap();
    let mut seen: Vec<DType> = reader.tensors().iter().map(|t| t.dtype).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 19, "{seen:?}");
}

#[test]
fn every_structure_names_the_flat_tensors_in_order() {
    for (path, _) in readable() {
        let reader = PtReader::open(&path).unwrap();
        let tree = reader.structure().unwrap();
        // Less the scales and zero points of per-channel quantized tensors: parts of
        // their tensor in the structure, as in torch's object.
        let parts = reader.quantization_parts();
        for &at in &parts {
            let name = &reader.tensors()[at].name;
            assert!(
                name.ends_with(".q_per_channel_scales")
                    || name.ends_with(".q_per_channel_zero_points"),
                "{name}"
            );
        }
        let names: Vec<_> = reader
            .tensors()
            .iter()
            .enumerate()
            .filter(|(at, _)| !parts.contains(at))
            .map(|(_, t)| &t.name)
            .collect();
        assert_eq!(tree.tensor_names(), names, "{}", path.display());
        let meta: Vec<_> = reader.meta_tensors().iter().map(|m| &m.name).collect();
        assert_eq!(tree.meta_names(), meta, "{}", path.display());
    }
}

#[test]
fn the_nested_structure_is_what_torch_saved() {
    use tensorwire_pytorch::Node;
    let s = |v: &str| Node::Value(Value::Str(v.into()));
    let t = |v: &str| Node::Tensor(v.into());
    let int = |n: i64| Node::Value(Value::Int(n.into()));
    let dict = |items: Vec<(Node, Node)>| Node::Dict {
        items,
        kind: DictKind::Dict,
        attributes: vec![],
    };
    let layer = |i: usize| {
        dict(vec![
            (s("weight"), t(&format!("model.layers.{i}.weight"))),
            (s("bias"), t(&format!("model.layers.{i}.bias"))),
        ])
    };
    let want = dict(vec![
        (
            s("model"),
            dict(vec![
                (s("layers"), Node::List(vec![layer(0), layer(1)])),
                (
                    s("head"),
                    Node::Dict {
                        items: vec![(s("proj"), t("model.head.proj"))],
                        kind: DictKind::OrderedDict,
                        attributes: vec![],
                    },
                ),
            ]),
        ),
        (s("step"), int(1200)),
        (s("lr"), Node::Value(Value::Float(0.0005))),
        (s("name"), s("run-7")),
        (
            s("flags"),
            dict(vec![
                (s("ema"), Node::Value(Value::Bool(true))),
                (s("note"), Node::Value(Value::Null)),
            ]),
        ),
        (
            s("sizes"),
            Node::List(vec![int(3), int(4), Node::Tuple(vec![int(5), int(6)])]),
        ),
        (s("pair"), Node::Tuple(vec![t("pair.0"), int(7)])),
    ]);
    for file in ["nested.pt", "nested.legacy.pt"] {
        let reader = PtReader::open(dir().join(file)).unwrap();
        assert_eq!(reader.structure().unwrap(), want, "{file}");
    }
    // A bare tensor is its one leaf.
    let single = PtReader::open(dir().join("single.pt")).unwrap();
    assert_eq!(single.structure().unwrap(), t("tensor"));
}

#[test]
fn every_tensor_lies_in_its_whole_storage_at_its_stored_offset() {
    let mut checked = 0;
    for (path, _) in readable() {
        let mapped = PtReader::open(&path).unwrap();
        let ranged = PtReader::open_ranged(&path, &Limits::default()).unwrap();
        for reader in [&mapped, &ranged] {
            for (at, record) in reader.records().iter().enumerate() {
                let (storage, borrowed) = reader.storage_bytes(record).unwrap();
                assert_eq!(storage.len() as u64, record.storage.nbytes().unwrap());
                assert_eq!(
                    borrowed,
                    reader_is_mapped(reader) && reader.is_little_endian(),
                    "{}",
                    path.display()
                );
                let tensor = reader.strided_at(at).unwrap();
                let start = record.stored_byte_offset().unwrap() as usize;
                let end = start + tensor.bytes.len();
                // The stored elements; a lazy view's values are their conjugates or
                // negatives.
                let mut stored = storage[start..end].to_vec();
                record.resolve_signs(&mut stored).unwrap();
                assert_eq!(
                    &stored[..],
                    &tensor.bytes[..],
                    "{} {}",
                    path.display(),
                    reader.tensors()[at].name
                );
                assert_eq!(start as u64 % record.element_size(), 0);
                checked += 1;
            }
        }
    }
    assert!(checked >= 200, "{checked}");
}

/// `sparse.pt`: every layout torch saves, read as the dense parts of each sparse
/// tensor; the structure holds the sparse tensors, by name, with their parts.
#[test]
fn sparse_tensors_are_listed_with_their_parts() {
    use tensorwire_pytorch::{Node, SparseLayout};
    for file in ["sparse.pt", "sparse.legacy.pt"] {
        let reader = PtReader::open(dir().join(file)).unwrap();
        let got: Vec<(&str, SparseLayout, &[u64])> = reader
            .sparse_tensors()
            .iter()
            .map(|(name, s)| (&**name, s.layout, s.size.as_slice()))
            .collect();
        use SparseLayout::*;
        let want: &[(&str, SparseLayout, &[u64])] = &[
            ("coo", Coo, &[4, 6]),
            ("uncoalesced", Coo, &[3, 3]),
            ("hybrid", Coo, &[4, 3]),
            ("csr", Csr, &[4, 6]),
            ("csr_int32", Csr, &[3, 3]),
            ("batched_csr", Csr, &[2, 4, 6]),
            ("csc", Csc, &[4, 6]),
            ("bsr", Bsr, &[4, 6]),
            ("bsc", Bsc, &[4, 6]),
            ("coo_again", Coo, &[4, 6]),
            ("graph.adjacency", Coo, &[3, 3]),
        ];
        assert_eq!(got, want, "{file}");
        let (_, uncoalesced) = &reader.sparse_tensors()[1];
        assert_eq!(uncoalesced.is_coalesced, Some(false));
        let info = &reader.tensors()[reader.position("graph.adjacency.values").unwrap()];
        assert_eq!(
            info.attributes.get("torch.layout").and_then(|v| v.as_str()),
            Some("torch.sparse_coo")
        );

        let tree = reader.structure().unwrap();
        let Node::Dict { items, .. } = &tree else {
            panic!("{tree:?}")
        };
        let csr = items
            .iter()
            .find(|(k, _)| k == &Node::Value(tensorwire_core::Value::Str("csr".into())))
            .map(|(_, v)| v);
        assert_eq!(
            csr,
            Some(&Node::Sparse {
                name: "csr".into(),
                layout: Csr,
                parts: vec![
                    "csr.crow_indices".into(),
                    "csr.col_indices".into(),
                    "csr.values".into()
                ],
            })
        );
    }
}

/// `module.pt`: a module's `state_dict()` is an `OrderedDict` whose `_metadata`
/// attribute (the modules' versions, set by `BUILD`) comes back as torch sets it.
#[test]
fn a_state_dicts_metadata_is_kept() {
    use tensorwire_pytorch::Node;
    let s = |v: &str| Node::Value(Value::Str(v.into()));
    let version = || Node::Dict {
        items: vec![(s("version"), Node::Value(Value::Int(1.into())))],
        kind: DictKind::Dict,
        attributes: vec![],
    };
    for file in ["module.pt", "module.legacy.pt"] {
        let reader = PtReader::open(dir().join(file)).unwrap();
        let Node::Dict {
            kind, attributes, ..
        } = reader.structure().unwrap()
        else {
            panic!("{file}: not a dict")
        };
        assert_eq!(kind, DictKind::OrderedDict, "{file}");
        let want = Node::Dict {
            items: ["", "emb", "proj", "norm", "out"]
                .into_iter()
                .map(|module| (s(module), version()))
                .collect(),
            kind: DictKind::OrderedDict,
            attributes: vec![],
        };
        assert_eq!(attributes, vec![("_metadata".into(), want)], "{file}");
    }
    // Other files' dicts have none.
    let reader = PtReader::open(dir().join("nested.pt")).unwrap();
    let Node::Dict { attributes, .. } = reader.structure().unwrap() else {
        panic!("nested.pt: not a dict")
    };
    assert!(attributes.is_empty());
}

/// The ints of `big_ints.pt` (and its legacy twin), exactly: a numpy PCG64 state
/// above 2^127, powers past 128 bits, the edges of `i128`, one as a dict key, and
/// two of 1 002 bits. Those that fit 128 bits are `Value::Int`, the others
/// `Value::BigInt`.
#[test]
fn ints_of_any_width_read_exactly() {
    for name in ["big_ints.pt", "big_ints.legacy.pt"] {
        let reader = PtReader::open(dir().join(name)).unwrap();
        let attributes = reader.attributes();
        let text = |v: &Value| v.to_string();
        let state = attributes["rng"].get("state").unwrap();
        assert_eq!(
            text(state.get("state").unwrap()),
            "207833532711051698738587646355624148094"
        );
        assert!(matches!(state.get("inc").unwrap(), Value::BigInt(_)));
        assert_eq!(
            text(&attributes["big"]),
            "1606938044258990275541962092341162602522202993782792835301376"
        );
        assert_eq!(
            text(&attributes["neg"]),
            "-369988485035126972924700782451696644186473100389722973815184405301748249"
        );
        let Value::List(edges) = &attributes["edges"] else {
            panic!("{name}: edges")
        };
        let two_127 = "170141183460469231731687303715884105728";
        assert_eq!(
            edges,
            &[
                Value::BigInt(big(two_127)),
                Value::BigInt(big("-170141183460469231731687303715884105729")),
                Value::Int(i128::MAX),
                Value::Int(i128::MIN),
                Value::Int(1 << 64),
                Value::Int(-(1 << 64) - 1),
            ]
        );
        assert_eq!(
            attributes["by_key"],
            Value::Map(vec![(
                "1361129467683753853853498429727072845824".into(),
                Value::Str("k".into())
            )])
        );
        let Value::List(kilobit) = &attributes["kilobit"] else {
            panic!("{name}: kilobit")
        };
        for (v, negative) in kilobit.iter().zip([false, true]) {
            let Value::BigInt(b) = v else {
                panic!("{name}: {v:?}")
            };
            assert_eq!((b.to_le_bytes().len(), b.is_negative()), (126, negative));
        }
        // 2**1000 + 1 and -(2**1000) - 1
        let two_1000 = "1071508607186267320948425049060001810561404811705533607443750388370351\
             0511249361224931983788156958581275946729175531468251871452856923140435\
             9845775746985748039345677748242309854210746050623711418779541821530464\
             7498358194126739876755916554394607706291457119647768654216766042983165\
             2624386837205668069377";
        assert_eq!(kilobit[0].to_string(), two_1000);
        assert_eq!(kilobit[1].to_string(), format!("-{two_1000}"));
    }
}

fn big(text: &str) -> tensorwire_core::BigInt {
    match tensorwire_core::BigInt::value_from_decimal(text) {
        Some(Ok(Value::BigInt(b))) => b,
        other => panic!("{text}: {other:?}"),
    }
}

/// `in_place_extent` is `Some` exactly where `strided_at` lends the map, with the
/// same bytes: every tensor of a stored little-endian ZIP checkpoint; none of a
/// big-endian one (swapped copies), a legacy one, or a lazy conjugate view.
#[test]
fn in_place_extents_are_the_lent_views() {
    for (file, lent) in [
        ("views.pt", true),
        ("dtypes.pt", true),
        ("big_endian.pt", false),
        ("views.legacy.pt", false),
    ] {
        let reader = PtReader::open(dir().join(file)).unwrap();
        for at in 0..reader.tensors().len() {
            let view = reader.strided_at(at).unwrap();
            match reader.in_place_extent(at) {
                Some(bytes) => {
                    assert!(lent && view.zero_copy, "{file} #{at}");
                    assert_eq!(bytes.as_ptr(), view.bytes.as_ptr(), "{file} #{at}");
                    assert_eq!(bytes.len(), view.bytes.len(), "{file} #{at}");
                }
                None => assert!(!lent || !view.zero_copy, "{file} #{at}"),
            }
        }
        assert!(reader.in_place_extent(reader.tensors().len()).is_none());
    }
    let lazy = PtReader::open(dir().join("conj_neg.pt")).unwrap();
    let names: Vec<_> = (0..lazy.tensors().len())
        .filter(|&at| lazy.in_place_extent(at).is_none())
        .map(|at| lazy.tensors()[at].name.to_string())
        .collect();
    assert!(
        !names.is_empty() && names.len() < lazy.tensors().len(),
        "{names:?}"
    );
}
