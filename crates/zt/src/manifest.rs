//! The manifest model and its CBOR form.
//!
//! Decoding goes CBOR bytes → `ciborium::Value` (bounded recursion) → checked model,
//! so every field is type-checked with the manifest's offset in the error. Encoding
//! builds a `ciborium::Value` with fields in the order ztensor 1.2.3 writes them
//! (`version`, `attributes`, `objects`; `shape`, `format`, `attributes`,
//! `components`; `dtype`, `type`, `offset`, `length`, `uncompressed_length`,
//! `encoding`, `digest`), with maps of names in byte order, so our manifests are
//! byte-identical to ztensor's.

use std::collections::BTreeMap;

use ciborium::Value as Cbor;
use tensorwire_core::{DType, Error, Layout, Limits, Result, Shape, Value};

use crate::digest::Digest;

/// How a component's bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// Stored as-is.
    #[default]
    Raw,
    /// A zstd frame; the manifest records the decoded length.
    Zstd,
}

impl Encoding {
    /// The manifest spelling.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Raw => "raw",
            Encoding::Zstd => "zstd",
        }
    }
}

/// One stored blob of an object.
#[derive(Debug, Clone, PartialEq)]
pub struct Component {
    /// Role name (`data`, `values`, `indices`, `scales`, …).
    pub role: String,
    /// Storage dtype (one of the 13 primitives).
    pub dtype: DType,
    /// Logical type as written (`f8_e4m3fn`, `complex64`, or a name we do not know).
    pub logical_type: Option<String>,
    /// Absolute file offset (a multiple of 64).
    pub offset: u64,
    /// Stored bytes (compressed size for zstd).
    pub length: u64,
    /// Decoded bytes (zstd only).
    pub uncompressed_length: Option<u64>,
    /// Encoding of the stored bytes.
    pub encoding: Encoding,
    /// Digest of the stored bytes.
    pub digest: Option<Digest>,
}

impl Component {
    /// Bytes after decoding.
    pub fn decoded_length(&self) -> u64 {
        match self.encoding {
            Encoding::Raw => self.length,
            Encoding::Zstd => self.uncompressed_length.unwrap_or(0),
        }
    }

    /// The logical dtype if the `type` names one we know and it matches the storage.
    pub fn logical_dtype(&self) -> DType {
        self.logical_type
            .as_deref()
            .and_then(|t| t.parse::<DType>().ok())
            .filter(|d| d.storage().0 == self.dtype)
            .unwrap_or(self.dtype)
    }
}

/// One named object (tensor) of a file.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    /// Name.
    pub name: String,
    /// Logical shape.
    pub shape: Shape,
    /// Layout.
    pub layout: Layout,
    /// Per-object attributes (`None` when the manifest has no `attributes` key, which
    /// ztensor distinguishes from an empty map).
    pub attributes: Option<BTreeMap<String, Value>>,
    /// Components in role-name order.
    pub components: Vec<Component>,
}

impl Object {
    /// The component with this role.
    pub fn component(&self, role: &str) -> Option<&Component> {
        self.components.iter().find(|c| c.role == role)
    }

    /// The component that carries the object's element type: `data` for dense,
    /// `values` for sparse, `packed_weight` (or the first) for others.
    pub fn primary(&self) -> Option<&Component> {
        let role = match self.layout {
            Layout::Dense => "data",
            Layout::SparseCsr | Layout::SparseCoo => "values",
            Layout::QuantizedGroup => "packed_weight",
            _ => "data",
        };
        self.component(role).or_else(|| self.components.first())
    }

    /// The element type: the primary component's logical dtype.
    pub fn dtype(&self) -> DType {
        self.primary().map_or(DType::U8, Component::logical_dtype)
    }
}

/// A parsed manifest.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Manifest {
    /// The `version` field (`"1.2.0"`, or `"0.1.0"` for converted 0.1 files).
    pub version: String,
    /// File-level attributes.
    pub attributes: BTreeMap<String, Value>,
    /// Objects in name order.
    pub objects: Vec<Object>,
}

/// Decoding context: where the manifest starts (for error offsets) and the limits.
pub(crate) struct Ctx<'a> {
    pub offset: u64,
    pub limits: &'a Limits,
}

impl Ctx<'_> {
    fn err(&self, reason: impl Into<String>) -> Error {
        Error::malformed(self.offset, reason)
    }
}

/// Parses CBOR bytes into a value tree with bounded recursion.
pub(crate) fn parse_cbor(bytes: &[u8], ctx: &Ctx<'_>) -> Result<Cbor> {
    let mut reader = bytes;
    let value: Cbor =
        ciborium::de::from_reader_with_recursion_limit(&mut reader, ctx.limits.max_depth + 8)
            .map_err(|e| ctx.err(format!("invalid CBOR: {e}")))?;
    if !reader.is_empty() {
        return Err(ctx.err(format!(
            "{} trailing bytes after the CBOR manifest",
            reader.len()
        )));
    }
    Ok(value)
}

fn text_map<'v>(v: &'v Cbor, what: &str, ctx: &Ctx<'_>) -> Result<Vec<(&'v str, &'v Cbor)>> {
    let Cbor::Map(entries) = v else {
        return Err(ctx.err(format!("{what} is not a map")));
    };
    let mut out = Vec::with_capacity(entries.len());
    let mut seen = std::collections::HashSet::with_capacity(entries.len());
    for (k, v) in entries {
        let Cbor::Text(k) = k else {
            return Err(ctx.err(format!("{what} has a key that is not a string")));
        };
        if !seen.insert(k.as_str()) {
            return Err(ctx.err(format!("{what} repeats the key `{k}`")));
        }
        out.push((k.as_str(), v));
    }
    Ok(out)
}

fn field<'v>(map: &[(&str, &'v Cbor)], key: &str) -> Option<&'v Cbor> {
    map.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

fn as_u64(v: &Cbor, what: &str, ctx: &Ctx<'_>) -> Result<u64> {
    match v {
        Cbor::Integer(i) => u64::try_from(i128::from(*i))
            .map_err(|_| ctx.err(format!("{what} is not an unsigned 64-bit integer"))),
        _ => Err(ctx.err(format!("{what} is not an integer"))),
    }
}

fn as_text<'v>(v: &'v Cbor, what: &str, ctx: &Ctx<'_>) -> Result<&'v str> {
    match v {
        Cbor::Text(s) => Ok(s),
        _ => Err(ctx.err(format!("{what} is not a string"))),
    }
}

/// Converts a CBOR attribute value into a [`Value`], bounded in depth.
pub(crate) fn cbor_to_value(v: &Cbor, depth: usize, ctx: &Ctx<'_>) -> Result<Value> {
    if depth > ctx.limits.max_depth {
        return Err(Error::LimitExceeded {
            what: "attribute nesting depth",
            limit: ctx.limits.max_depth as u64,
            found: depth as u64,
        });
    }
    Ok(match v {
        Cbor::Null => Value::Null,
        Cbor::Bool(b) => Value::Bool(*b),
        Cbor::Integer(i) => Value::Int(i128::from(*i)),
        Cbor::Float(f) => Value::Float(*f),
        Cbor::Text(s) => Value::Str(s.clone()),
        Cbor::Bytes(b) => Value::Bytes(b.clone()),
        Cbor::Array(items) => Value::List(
            items
                .iter()
                .map(|x| cbor_to_value(x, depth + 1, ctx))
                .collect::<Result<_>>()?,
        ),
        Cbor::Map(_) => Value::Map(
            text_map(v, "an attribute map", ctx)?
                .into_iter()
                .map(|(k, x)| Ok((k.to_owned(), cbor_to_value(x, depth + 1, ctx)?)))
                .collect::<Result<_>>()?,
        ),
        Cbor::Tag(_, inner) => cbor_to_value(inner, depth + 1, ctx)?,
        _ => return Err(ctx.err("unsupported CBOR value in attributes")),
    })
}

fn parse_attributes(v: &Cbor, depth: usize, ctx: &Ctx<'_>) -> Result<BTreeMap<String, Value>> {
    text_map(v, "attributes", ctx)?
        .into_iter()
        .map(|(k, v)| Ok((k.to_owned(), cbor_to_value(v, depth, ctx)?)))
        .collect()
}

/// Converts a [`Value`] to CBOR for writing.
pub(crate) fn value_to_cbor(v: &Value) -> Result<Cbor> {
    Ok(match v {
        Value::Null => Cbor::Null,
        Value::Bool(b) => Cbor::Bool(*b),
        Value::Int(i) => Cbor::Integer(
            ciborium::value::Integer::try_from(*i)
                .map_err(|_| Error::invalid(format!("integer {i} does not fit CBOR")))?,
        ),
        Value::Float(f) => Cbor::Float(*f),
        Value::Str(s) => Cbor::Text(s.clone()),
        Value::Bytes(b) => Cbor::Bytes(b.clone()),
        Value::List(items) => Cbor::Array(items.iter().map(value_to_cbor).collect::<Result<_>>()?),
        Value::Map(m) => Cbor::Map(
            m.iter()
                .map(|(k, v)| Ok((Cbor::Text(k.clone()), value_to_cbor(v)?)))
                .collect::<Result<_>>()?,
        ),
    })
}

fn attributes_to_cbor(m: &BTreeMap<String, Value>) -> Result<Cbor> {
    Ok(Cbor::Map(
        m.iter()
            .map(|(k, v)| Ok((Cbor::Text(k.clone()), value_to_cbor(v)?)))
            .collect::<Result<_>>()?,
    ))
}

fn check_name(name: &str, ctx: &Ctx<'_>) -> Result<()> {
    Error::check_limit(
        "tensor name length",
        name.len() as u64,
        ctx.limits.max_name_bytes as u64,
    )?;
    if name.is_empty() {
        return Err(ctx.err("an object has an empty name"));
    }
    Ok(())
}

fn parse_shape(v: &Cbor, name: &str, ctx: &Ctx<'_>) -> Result<Shape> {
    let Cbor::Array(dims) = v else {
        return Err(ctx.err(format!("object `{name}`: shape is not an array")));
    };
    Error::check_limit(
        "number of dimensions",
        dims.len() as u64,
        ctx.limits.max_ndim as u64,
    )?;
    let dims = dims
        .iter()
        .map(|d| as_u64(d, "a shape dimension", ctx))
        .collect::<Result<Vec<_>>>()?;
    Shape::new(dims)
}

fn parse_component(role: &str, v: &Cbor, name: &str, ctx: &Ctx<'_>) -> Result<Component> {
    let map = text_map(v, "a component", ctx)?;
    let need = |key: &str| {
        field(&map, key)
            .ok_or_else(|| ctx.err(format!("object `{name}` component `{role}` has no `{key}`")))
    };
    let dtype_name = as_text(need("dtype")?, "dtype", ctx)?;
    let dtype: DType = dtype_name.parse()?;
    if !dtype.is_primitive() {
        return Err(ctx.err(format!(
            "object `{name}` component `{role}`: `{dtype_name}` is not a storage dtype"
        )));
    }
    let logical_type = match field(&map, "type") {
        None | Some(Cbor::Null) => None,
        Some(t) => Some(as_text(t, "type", ctx)?.to_owned()),
    };
    if let Some(Ok(logical)) = logical_type.as_deref().map(str::parse::<DType>) {
        if logical.storage().0 != dtype {
            return Err(ctx.err(format!(
                "object `{name}` component `{role}`: type `{logical}` cannot be stored as `{dtype}`"
            )));
        }
    }
    let encoding = match field(&map, "encoding") {
        None | Some(Cbor::Null) => Encoding::Raw,
        Some(e) => match as_text(e, "encoding", ctx)? {
            "raw" => Encoding::Raw,
            "zstd" => Encoding::Zstd,
            other => {
                return Err(Error::unsupported(format!(
                    "object `{name}` component `{role}`: encoding `{other}`"
                )))
            }
        },
    };
    let uncompressed_length = match field(&map, "uncompressed_length") {
        None | Some(Cbor::Null) => None,
        Some(u) => Some(as_u64(u, "uncompressed_length", ctx)?),
    };
    if encoding == Encoding::Zstd && uncompressed_length.is_none() {
        return Err(ctx.err(format!(
            "object `{name}` component `{role}`: zstd without uncompressed_length"
        )));
    }
    let digest = match field(&map, "digest") {
        None | Some(Cbor::Null) => None,
        Some(d) => {
            let s = as_text(d, "digest", ctx)?;
            Some(Digest::parse(s).ok_or_else(|| {
                ctx.err(format!(
                    "object `{name}` component `{role}`: unrecognised digest `{s}`"
                ))
            })?)
        }
    };
    Ok(Component {
        role: role.to_owned(),
        dtype,
        logical_type,
        offset: as_u64(need("offset")?, "offset", ctx)?,
        length: as_u64(need("length")?, "length", ctx)?,
        uncompressed_length,
        encoding,
        digest,
    })
}

/// Decodes a version 1.x manifest.
pub(crate) fn decode_v1(bytes: &[u8], ctx: &Ctx<'_>) -> Result<Manifest> {
    let root = parse_cbor(bytes, ctx)?;
    let root = text_map(&root, "the manifest", ctx)?;
    let version = match field(&root, "version") {
        Some(v) => as_text(v, "version", ctx)?.to_owned(),
        None => return Err(ctx.err("the manifest has no `version`")),
    };
    if !version.starts_with("1.") {
        return Err(Error::unsupported(format!("manifest version `{version}`")));
    }
    let attributes = match field(&root, "attributes") {
        None | Some(Cbor::Null) => BTreeMap::new(),
        Some(a) => parse_attributes(a, 1, ctx)?,
    };
    let objects_value = field(&root, "objects").ok_or_else(|| ctx.err("no `objects`"))?;
    let Cbor::Map(entries) = objects_value else {
        return Err(ctx.err("`objects` is not a map"));
    };
    Error::check_limit(
        "number of objects",
        entries.len() as u64,
        ctx.limits.max_tensors,
    )?;
    let mut objects = Vec::with_capacity(entries.len());
    for (k, v) in entries {
        let name = as_text(k, "an object name", ctx)?;
        check_name(name, ctx)?;
        let obj = text_map(v, "an object", ctx)?;
        let shape = parse_shape(
            field(&obj, "shape").ok_or_else(|| ctx.err(format!("object `{name}` has no shape")))?,
            name,
            ctx,
        )?;
        let layout = match field(&obj, "format") {
            Some(f) => Layout::from_name(as_text(f, "format", ctx)?),
            None => Layout::Dense,
        };
        let attributes = match field(&obj, "attributes") {
            None | Some(Cbor::Null) => None,
            Some(a) => Some(parse_attributes(a, 1, ctx)?),
        };
        let comps = text_map(
            field(&obj, "components")
                .ok_or_else(|| ctx.err(format!("object `{name}` has no components")))?,
            "components",
            ctx,
        )?;
        let mut components = comps
            .into_iter()
            .map(|(role, c)| parse_component(role, c, name, ctx))
            .collect::<Result<Vec<_>>>()?;
        components.sort_by(|a, b| a.role.cmp(&b.role));
        objects.push(Object {
            name: name.to_owned(),
            shape,
            layout,
            attributes,
            components,
        });
    }
    objects.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = objects.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(Error::Duplicate {
            name: w[0].name.clone(),
        });
    }
    Ok(Manifest {
        version,
        attributes,
        objects,
    })
}

/// Decodes a version 0.1 manifest (a CBOR array of tensor records) into the 1.2 model.
pub(crate) fn decode_v01(bytes: &[u8], ctx: &Ctx<'_>) -> Result<Manifest> {
    let root = parse_cbor(bytes, ctx)?;
    let Cbor::Array(records) = root else {
        return Err(ctx.err("a 0.1 manifest must be an array"));
    };
    Error::check_limit(
        "number of objects",
        records.len() as u64,
        ctx.limits.max_tensors,
    )?;
    let mut objects = Vec::with_capacity(records.len());
    for rec in &records {
        let map = text_map(rec, "a tensor record", ctx)?;
        let need = |key: &str| {
            field(&map, key).ok_or_else(|| ctx.err(format!("a 0.1 tensor record has no `{key}`")))
        };
        let name = as_text(need("name")?, "name", ctx)?;
        check_name(name, ctx)?;
        let layout = match field(&map, "layout") {
            Some(l) => as_text(l, "layout", ctx)?,
            None => "dense",
        };
        if layout != "dense" {
            return Err(Error::unsupported(format!(
                "tensor `{name}`: 0.1 layout `{layout}`"
            )));
        }
        let dtype: DType = as_text(need("dtype")?, "dtype", ctx)?.parse()?;
        if !dtype.is_primitive() {
            return Err(ctx.err(format!("tensor `{name}`: `{dtype}` is not a 0.1 dtype")));
        }
        let shape = parse_shape(need("shape")?, name, ctx)?;
        if let Some(e) = field(&map, "data_endianness") {
            let e = as_text(e, "data_endianness", ctx)?;
            if e != "little" && dtype.size().unwrap_or(1) > 1 {
                return Err(Error::unsupported(format!(
                    "tensor `{name}`: {e}-endian data"
                )));
            }
        }
        let encoding = match as_text(need("encoding")?, "encoding", ctx)? {
            "raw" => Encoding::Raw,
            "zstd" => Encoding::Zstd,
            other => {
                return Err(Error::unsupported(format!(
                    "tensor `{name}`: encoding `{other}`"
                )))
            }
        };
        let digest = match field(&map, "checksum") {
            None | Some(Cbor::Null) => None,
            Some(c) => {
                let s = as_text(c, "checksum", ctx)?;
                if s == "none" {
                    None
                } else {
                    Some(Digest::parse(s).ok_or_else(|| {
                        ctx.err(format!("tensor `{name}`: unrecognised checksum `{s}`"))
                    })?)
                }
            }
        };
        let uncompressed_length = match encoding {
            Encoding::Raw => None,
            Encoding::Zstd => Some(shape.byte_len(dtype)?),
        };
        let component = Component {
            role: "data".to_owned(),
            dtype,
            logical_type: None,
            offset: as_u64(need("offset")?, "offset", ctx)?,
            length: as_u64(need("size")?, "size", ctx)?,
            uncompressed_length,
            encoding,
            digest,
        };
        objects.push(Object {
            name: name.to_owned(),
            shape,
            layout: Layout::Dense,
            attributes: None,
            components: vec![component],
        });
    }
    objects.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = objects.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(Error::Duplicate {
            name: w[0].name.clone(),
        });
    }
    Ok(Manifest {
        version: "0.1.0".to_owned(),
        attributes: BTreeMap::new(),
        objects,
    })
}

fn component_to_cbor(c: &Component) -> Cbor {
    let mut m = vec![(
        Cbor::Text("dtype".into()),
        Cbor::Text(c.dtype.name().into()),
    )];
    if let Some(t) = &c.logical_type {
        m.push((Cbor::Text("type".into()), Cbor::Text(t.clone())));
    }
    m.push((Cbor::Text("offset".into()), Cbor::Integer(c.offset.into())));
    m.push((Cbor::Text("length".into()), Cbor::Integer(c.length.into())));
    if let Some(u) = c.uncompressed_length {
        m.push((
            Cbor::Text("uncompressed_length".into()),
            Cbor::Integer(u.into()),
        ));
    }
    if c.encoding != Encoding::Raw {
        m.push((
            Cbor::Text("encoding".into()),
            Cbor::Text(c.encoding.name().into()),
        ));
    }
    if let Some(d) = &c.digest {
        m.push((Cbor::Text("digest".into()), Cbor::Text(d.to_string())));
    }
    Cbor::Map(m)
}

/// Encodes a manifest as ztensor 1.2.3 does.
pub(crate) fn encode(manifest: &Manifest) -> Result<Vec<u8>> {
    let mut objects: Vec<&Object> = manifest.objects.iter().collect();
    objects.sort_by(|a, b| a.name.cmp(&b.name));
    let mut object_entries = Vec::with_capacity(objects.len());
    for o in objects {
        let mut m = vec![
            (
                Cbor::Text("shape".into()),
                Cbor::Array(
                    o.shape
                        .dims()
                        .iter()
                        .map(|&d| Cbor::Integer(d.into()))
                        .collect(),
                ),
            ),
            (
                Cbor::Text("format".into()),
                Cbor::Text(o.layout.name().into()),
            ),
        ];
        if let Some(attributes) = &o.attributes {
            m.push((
                Cbor::Text("attributes".into()),
                attributes_to_cbor(attributes)?,
            ));
        }
        let mut comps: Vec<&Component> = o.components.iter().collect();
        comps.sort_by(|a, b| a.role.cmp(&b.role));
        m.push((
            Cbor::Text("components".into()),
            Cbor::Map(
                comps
                    .into_iter()
                    .map(|c| (Cbor::Text(c.role.clone()), component_to_cbor(c)))
                    .collect(),
            ),
        ));
        object_entries.push((Cbor::Text(o.name.clone()), Cbor::Map(m)));
    }
    let mut root = vec![(
        Cbor::Text("version".into()),
        Cbor::Text(manifest.version.clone()),
    )];
    if !manifest.attributes.is_empty() {
        root.push((
            Cbor::Text("attributes".into()),
            attributes_to_cbor(&manifest.attributes)?,
        ));
    }
    root.push((Cbor::Text("objects".into()), Cbor::Map(object_entries)));
    let mut out = Vec::new();
    ciborium::ser::into_writer(&Cbor::Map(root), &mut out)
        .map_err(|e| Error::invalid(format!("cannot encode manifest: {e}")))?;
    Ok(out)
}
