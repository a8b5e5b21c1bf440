//! Writes a small `.zt` file from fuzzer-chosen tensors (names, dtypes, shapes,
//! layouts, components, compression, digests, attributes) with `ZtWriter`, including
//! objects the reader would refuse (which `add_object` must refuse too), and checks
//! that `ZtReader` reads back exactly what was accepted.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tensorwire_core::{Bytes, DType, Layout, Limits, Shape, TensorSource, Value};
use tensorwire_zt::{
    Checksum, ComponentData, Compression, Encoding, WriteOptions, ZtReader, ZtWriter,
};

/// Most tensors per file and dimensions per shape; dims are taken modulo `MAX_DIM`.
const MAX_TENSORS: usize = 8;
const MAX_NDIM: usize = 4;
const MAX_DIM: u8 = 6;
/// Deepest attribute nesting generated (the reader's limit is far above).
const MAX_ATTR_DEPTH: usize = 4;

#[derive(Arbitrary, Debug)]
struct Input {
    file_attributes: Vec<(String, Attr)>,
    tensors: Vec<TensorSpec>,
}

#[derive(Arbitrary, Debug)]
struct TensorSpec {
    name: String,
    dims: Vec<u8>,
    /// Bytes cycled to fill the tensor's data.
    fill: Vec<u8>,
    compression: Option<i8>,
    checksum: u8,
    attributes: Option<Vec<(String, Attr)>>,
    kind: Kind,
}

#[derive(Arbitrary, Debug)]
enum Kind {
    /// `add_dense` with `DType::ALL[dtype % 23]`.
    Dense { dtype: u8 },
    /// `add_object` with any layout (dense included) and free-form components:
    /// repeated roles, logical types that do not fit their storage and dense data of
    /// the wrong size are generated too, and the writer must refuse them.
    Object {
        layout: LayoutSpec,
        components: Vec<ComponentSpec>,
    },
}

#[derive(Arbitrary, Debug)]
enum LayoutSpec {
    Dense,
    SparseCsr,
    SparseCoo,
    QuantizedGroup,
    /// `Layout::Other("dense")`, which names the dense layout.
    OtherDense,
    /// `Layout::Other(s)` as given, not normalized (`s` may name a known layout).
    Other(String),
}

#[derive(Arbitrary, Debug)]
struct ComponentSpec {
    role: RoleSpec,
    /// Index into the 13 storage primitives.
    dtype: u8,
    /// Logical type (`type`), which need not fit `dtype`.
    logical: Option<LogicalSpec>,
    size: SizeSpec,
}

#[derive(Arbitrary, Debug)]
enum RoleSpec {
    Data,
    Values,
    Indices,
    Scales,
    Other(String),
}

#[derive(Arbitrary, Debug)]
enum LogicalSpec {
    /// Canonical name of `DType::ALL[i % 23]`.
    Name(u8),
    /// One of the long spellings `DType::from_str` also accepts.
    Alias(u8),
    /// Anything (an unknown name is recorded but names no dtype).
    Free(String),
}

/// Spellings that parse to a dtype but are not its canonical name.
const ALIASES: [&str; 21] = [
    "float64",
    "double",
    "float32",
    "float",
    "float16",
    "half",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint64",
    "uint32",
    "uint16",
    "uint8",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "c64",
    "c128",
];

#[derive(Arbitrary, Debug)]
enum SizeSpec {
    /// `n % 32` elements of the storage dtype.
    Elements(u8),
    /// Exactly `shape × dtype` bytes (dtype: the logical type if it fits, else the
    /// storage dtype), as a dense `data` component needs.
    Exact,
    /// `shape × dtype` bytes plus `d % 9` (may go below zero: then empty).
    Off(i8),
    /// `n % 64` bytes, possibly not a whole number of elements.
    Bytes(u8),
}

#[derive(Arbitrary, Debug)]
enum Attr {
    Null,
    Bool(bool),
    I64(i64),
    U64(u64),
    /// `-1 - n`: the whole CBOR negative range.
    Neg(u64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Attr>),
    Map(Vec<(String, Attr)>),
}

fn to_value(a: &Attr, depth: usize) -> Value {
    if depth >= MAX_ATTR_DEPTH {
        return Value::Null;
    }
    match a {
        Attr::Null => Value::Null,
        Attr::Bool(b) => Value::Bool(*b),
        Attr::I64(i) => Value::Int(i128::from(*i)),
        Attr::U64(u) => Value::Int(i128::from(*u)),
        Attr::Neg(n) => Value::Int(-1 - i128::from(*n)),
        // NaN is not equal to itself; everything else must round-trip exactly.
        Attr::Float(f) if f.is_nan() => Value::Null,
        Attr::Float(f) => Value::Float(*f),
        Attr::Str(s) => Value::Str(s.clone()),
        Attr::Bytes(b) => Value::Bytes(b.clone()),
        Attr::List(items) => Value::List(items.iter().map(|x| to_value(x, depth + 1)).collect()),
        Attr::Map(entries) => Value::Map(unique(entries, depth + 1).into_iter().collect()),
    }
}

/// Entries with duplicate keys dropped (the format forbids repeated map keys).
fn unique(entries: &[(String, Attr)], depth: usize) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = Vec::new();
    for (k, v) in entries {
        if !out.iter().any(|(seen, _)| seen == k) {
            out.push((k.clone(), to_value(v, depth)));
        }
    }
    out
}

fn attr_map(entries: &[(String, Attr)]) -> BTreeMap<String, Value> {
    unique(entries, 1).into_iter().collect()
}

const PRIMITIVES: [DType; 13] = [
    DType::F64,
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I64,
    DType::I32,
    DType::I16,
    DType::I8,
    DType::U64,
    DType::U32,
    DType::U16,
    DType::U8,
    DType::Bool,
];

fn fill(n: u64, pattern: &[u8]) -> Vec<u8> {
    if pattern.is_empty() {
        return vec![0; n as usize];
    }
    pattern.iter().copied().cycle().take(n as usize).collect()
}

/// The element type a component's bytes hold: its logical type when that names a
/// dtype stored as `dtype`, else `dtype` (any other type is a label, as ztensor 1.2.3
/// writes and reads it).
fn logical_dtype(dtype: DType, logical: Option<&str>) -> DType {
    logical
        .and_then(|t| t.parse::<DType>().ok())
        .filter(|t| t.storage().0 == dtype)
        .unwrap_or(dtype)
}

/// Why the reader would refuse an object with these components (so `add_object`
/// must refuse it too), or `None` when it must be accepted. `layout` is the layout
/// as recorded (`Layout::from_name` of the name).
fn object_refusal(
    shape: &Shape,
    layout: &Layout,
    comps: &[(String, DType, Option<String>, Vec<u8>)],
) -> Option<&'static str> {
    if comps.is_empty() {
        return Some("no components");
    }
    for (i, (role, dtype, logical, bytes)) in comps.iter().enumerate() {
        if bytes.len() % dtype.size().unwrap() != 0 {
            return Some("bytes not a whole number of elements");
        }
        if comps[..i].iter().any(|c| c.0 == *role) {
            return Some("repeated role");
        }
    }
    if *layout == Layout::Dense {
        let Some((_, dtype, logical, bytes)) = comps.iter().find(|c| c.0 == "data") else {
            return Some("dense object without a data component");
        };
        let want = shape
            .byte_len(logical_dtype(*dtype, logical.as_deref()))
            .unwrap();
        if bytes.len() as u64 != want {
            return Some("dense data is not shape x dtype bytes");
        }
    }
    None
}

/// What was written, to compare against what is read.
struct Expected {
    name: String,
    shape: Shape,
    layout: Layout,
    /// Element dtype of a dense tensor (its logical type).
    dense_dtype: Option<DType>,
    attributes: Option<BTreeMap<String, Value>>,
    /// (role, storage dtype, logical type, bytes)
    components: Vec<(String, DType, Option<String>, Vec<u8>)>,
    options: WriteOptions,
}

fuzz_target!(|input: Input| {
    let mut writer = ZtWriter::new(Vec::new()).expect("writer on a Vec");
    let file_attributes = attr_map(&input.file_attributes);
    writer
        .set_attributes(file_attributes.clone())
        .expect("generated attributes lie in CBOR's integer range");
    let mut expected: Vec<Expected> = Vec::new();

    for spec in input.tensors.iter().take(MAX_TENSORS) {
        let shape = Shape::new(
            spec.dims
                .iter()
                .take(MAX_NDIM)
                .map(|&d| u64::from(d % MAX_DIM))
                .collect::<Vec<_>>(),
        )
        .expect("small shape");
        let options = WriteOptions {
            // Levels up to 9 only: high levels allocate large windows for nothing.
            compression: match spec.compression {
                None => Compression::Raw,
                Some(l) => Compression::Zstd(i32::from(l).clamp(-5, 9)),
            },
            checksum: match spec.checksum % 3 {
                0 => Checksum::None,
                1 => Checksum::Crc32c,
                _ => Checksum::Sha256,
            },
        };
        let attributes = spec.attributes.as_deref().map(attr_map);
        let duplicate = writer.contains(&spec.name);
        let must_fail = spec.name.is_empty() || duplicate;

        match &spec.kind {
            Kind::Dense { dtype } => {
                let dtype = DType::ALL[usize::from(*dtype) % DType::ALL.len()];
                let n = shape.byte_len(dtype).unwrap();
                let data = fill(n, &spec.fill);
                let res = writer.add_dense_with_attributes(
                    &spec.name,
                    dtype,
                    &shape,
                    &data,
                    attributes.clone(),
                    options,
                );
                let quantized = matches!(
                    dtype,
                    DType::QInt8 | DType::QUInt8 | DType::QInt4 | DType::QUInt4
                );
                if must_fail || quantized {
                    assert!(res.is_err(), "add_dense accepted {spec:?}");
                    continue;
                }
                res.unwrap_or_else(|e| panic!("add_dense refused {spec:?}: {e}"));
                let (storage, _) = dtype.storage();
                expected.push(Expected {
                    name: spec.name.clone(),
                    shape,
                    layout: Layout::Dense,
                    dense_dtype: Some(dtype),
                    attributes,
                    components: vec![(
                        "data".to_owned(),
                        storage,
                        (storage != dtype).then(|| dtype.name().to_owned()),
                        data,
                    )],
                    options,
                });
            }
            Kind::Object { layout, components } => {
                let layout = match layout {
                    LayoutSpec::Dense => Layout::Dense,
                    LayoutSpec::SparseCsr => Layout::SparseCsr,
                    LayoutSpec::SparseCoo => Layout::SparseCoo,
                    LayoutSpec::QuantizedGroup => Layout::QuantizedGroup,
                    LayoutSpec::OtherDense => Layout::Other("dense".to_owned()),
                    LayoutSpec::Other(s) => Layout::Other(s.clone()),
                };
                // What the file records (and the reader returns).
                let stored_layout = Layout::from_name(layout.name());
                let mut comps: Vec<(String, DType, Option<String>, Vec<u8>)> = Vec::new();
                for c in components.iter().take(4) {
                    let role = match &c.role {
                        RoleSpec::Data => "data".to_owned(),
                        RoleSpec::Values => "values".to_owned(),
                        RoleSpec::Indices => "indices".to_owned(),
                        RoleSpec::Scales => "scales".to_owned(),
                        RoleSpec::Other(s) => s.clone(),
                    };
                    let dtype = PRIMITIVES[usize::from(c.dtype) % PRIMITIVES.len()];
                    let logical = c.logical.as_ref().map(|l| match l {
                        LogicalSpec::Name(i) => DType::ALL[usize::from(*i) % DType::ALL.len()]
                            .name()
                            .to_owned(),
                        LogicalSpec::Alias(i) => {
                            ALIASES[usize::from(*i) % ALIASES.len()].to_owned()
                        }
                        LogicalSpec::Free(s) => s.clone(),
                    });
                    let element = logical_dtype(dtype, logical.as_deref());
                    let exact = shape.byte_len(element).unwrap();
                    let n = match c.size {
                        SizeSpec::Elements(k) => dtype.byte_len(u64::from(k % 32)).unwrap(),
                        SizeSpec::Exact => exact,
                        SizeSpec::Off(d) => exact.saturating_add_signed(i64::from(d % 9)),
                        SizeSpec::Bytes(k) => u64::from(k % 64),
                    };
                    comps.push((role, dtype, logical, fill(n, &spec.fill)));
                }
                let data: Vec<ComponentData<'_>> = comps
                    .iter()
                    .map(|(role, dtype, logical, bytes)| ComponentData {
                        role,
                        dtype: *dtype,
                        logical_type: logical.as_deref(),
                        data: bytes,
                    })
                    .collect();
                let res = writer.add_object(
                    &spec.name,
                    &shape,
                    layout.clone(),
                    attributes.clone(),
                    &data,
                    options,
                );
                let refusal = if must_fail {
                    Some("empty or repeated name")
                } else {
                    object_refusal(&shape, &stored_layout, &comps)
                };
                if let Some(why) = refusal {
                    assert!(res.is_err(), "add_object accepted ({why}) {spec:?}");
                    // A refused object leaves nothing behind.
                    assert_eq!(writer.contains(&spec.name), duplicate, "refused {spec:?}");
                    continue;
                }
                res.unwrap_or_else(|e| panic!("add_object refused {spec:?}: {e}"));
                comps.sort_by(|a, b| a.0.cmp(&b.0));
                let dense_dtype = (stored_layout == Layout::Dense).then(|| {
                    let (_, dtype, logical, _) = comps.iter().find(|c| c.0 == "data").unwrap();
                    logical_dtype(*dtype, logical.as_deref())
                });
                expected.push(Expected {
                    name: spec.name.clone(),
                    shape,
                    layout: stored_layout,
                    dense_dtype,
                    attributes,
                    components: comps,
                    options,
                });
            }
        }
    }

    let file = writer.finish_into().expect("finish into a Vec");
    let reader = ZtReader::from_bytes_with(Bytes::from_vec(file), &Limits::default())
        .unwrap_or_else(|e| panic!("written file does not open: {e}"));

    assert_eq!(reader.attributes(), &file_attributes, "file attributes");
    expected.sort_by(|a, b| a.name.cmp(&b.name));
    let names: Vec<&str> = reader.objects().iter().map(|o| &*o.name).collect();
    let want: Vec<&str> = expected.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, want, "object names");

    let mut digests = 0;
    for e in &expected {
        let obj = reader.object(&e.name).unwrap();
        assert_eq!(obj.shape, e.shape, "{}: shape", e.name);
        assert_eq!(obj.layout, e.layout, "{}: layout", e.name);
        assert_eq!(obj.attributes, e.attributes, "{}: attributes", e.name);
        assert_eq!(
            obj.components.len(),
            e.components.len(),
            "{}: components",
            e.name
        );
        for (c, (role, dtype, logical, bytes)) in obj.components.iter().zip(&e.components) {
            assert_eq!(&c.role[..], role.as_str(), "{}: role", e.name);
            assert_eq!(c.dtype, *dtype, "{}/{role}: dtype", e.name);
            assert_eq!(&c.logical_type, logical, "{}/{role}: logical type", e.name);
            let want_encoding = match e.options.compression {
                Compression::Raw => Encoding::Raw,
                Compression::Zstd(_) => Encoding::Zstd,
            };
            assert_eq!(c.encoding, want_encoding, "{}/{role}: encoding", e.name);
            assert_eq!(
                c.digest.as_ref().map(|d| d.checksum()),
                (e.options.checksum != Checksum::None).then_some(e.options.checksum),
                "{}/{role}: digest",
                e.name
            );
            if c.digest.is_some() {
                digests += 1;
            }
            assert_eq!(c.decoded_length(), bytes.len() as u64);
            let got = reader.component(&e.name, role).unwrap();
            assert_eq!(got.as_slice(), &bytes[..], "{}/{role}: bytes", e.name);
            let mut buf = vec![0u8; bytes.len()];
            reader.component_into(&e.name, role, &mut buf).unwrap();
            assert_eq!(buf, *bytes, "{}/{role}: component_into bytes", e.name);
        }
        let info = reader.info(&e.name).unwrap();
        if let Some(dtype) = e.dense_dtype {
            assert_eq!(info.dtype, dtype, "{}: info dtype", e.name);
            assert_eq!(obj.dtype(), dtype, "{}: object dtype", e.name);
            let view = reader.view(&e.name).unwrap();
            assert_eq!(view.dtype, dtype, "{}: view dtype", e.name);
            assert_eq!(view.shape, e.shape, "{}: view shape", e.name);
            let data = &e.components.iter().find(|c| c.0 == "data").unwrap().3;
            assert_eq!(view.bytes.as_slice(), &data[..], "{}: view bytes", e.name);
            assert_eq!(
                view.zero_copy,
                e.options.compression == Compression::Raw,
                "{}: zero_copy",
                e.name
            );
        } else {
            assert!(
                reader.view(&e.name).is_err(),
                "{}: view of a non-dense object",
                e.name
            );
        }
    }
    assert_eq!(reader.verify().unwrap(), digests, "verify count");
});
