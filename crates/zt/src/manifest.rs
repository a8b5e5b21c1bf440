//! The manifest model and its CBOR form.
//!
//! Decoding goes CBOR bytes → `ciborium::Value` (bounded recursion) → checked model,
//! so every field is type-checked with the manifest's offset in the error. Encoding
//! builds a `ciborium::Value` with fields in the order ztensor 1.2.3 writes them
//! (`version`, `attributes`, `objects`; `shape`, `format`, `attributes`,
//! `components`; `dtype`, `type`, `offset`, `length`, `uncompressed_length`,
//! `encoding`, `digest`), with maps of names in byte order, so our manifests are
//! byte-identical to ztensor's.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use ciborium::Value as Cbor;

use crate::cbor::{CborError, Decoder, Len};
use tensorwire_core::{DType, Error, Layout, Limits, Result, Shape, Value, MAX_NDIM};

use crate::digest::Digest;

/// How a component's bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Encoding {
    /// Stored as-is.
    #[default]
    Raw,
    /// A zstd frame; the manifest records the decoded length (`.zt` 1.x `zstd`).
    Zstd,
    /// The zstd seekable format: independent frames of at most 16 MiB decoded, then a
    /// seek table (`.zt` 2 `zt.zstd-seekable/1`).
    ZstdSeekable,
}

impl Encoding {
    /// The manifest spelling.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Raw => "raw",
            Encoding::Zstd => "zstd",
            Encoding::ZstdSeekable => crate::seekable::NAME,
        }
    }
}

/// One stored blob of an object.
#[derive(Debug, Clone, PartialEq)]
pub struct Component {
    /// Role name (`data`, `values`, `indices`, `scales`, …).
    pub role: Cow<'static, str>,
    /// Storage dtype (one of the 13 primitives).
    pub dtype: DType,
    /// Logical type as written (`f8_e4m3fn`, `complex64`, or a name we do not know).
    pub logical_type: Option<String>,
    /// Absolute file offset (a multiple of 64 in 1.x, of 4096 in version 2).
    pub offset: u64,
    /// Stored bytes (compressed size for zstd).
    pub length: u64,
    /// Decoded bytes (encoded components only; version 2 calls it `decoded_length`).
    pub uncompressed_length: Option<u64>,
    /// Encoding of the stored bytes.
    pub encoding: Encoding,
    /// Digest: of the stored bytes in 1.x, of the decoded bytes in version 2.
    pub digest: Option<Digest>,
}

/// The most bytes one stored byte of zstd data can decode to. The densest block is an
/// RLE block: a 3-byte header whose 21-bit size libzstd honours in a single-segment
/// frame (up to 2 MiB - 1), and the one byte it repeats; so 4 bytes make < 2^21.
pub const MAX_ZSTD_EXPANSION: u64 = 1 << 19;

impl Component {
    /// Bytes after decoding.
    pub fn decoded_length(&self) -> u64 {
        match self.encoding {
            Encoding::Raw => self.length,
            Encoding::Zstd | Encoding::ZstdSeekable => self.uncompressed_length.unwrap_or(0),
        }
    }

    /// Fails unless the stored bytes could decode to [`Self::decoded_length`] of them,
    /// so that a component of a few bytes cannot make a reader allocate gigabytes
    /// for its output before the decoder finds it short. zstd makes at most
    /// [`MAX_ZSTD_EXPANSION`] bytes per stored byte.
    pub(crate) fn check_expansion(&self, label: impl FnOnce() -> String) -> Result<()> {
        if self.encoding == Encoding::Raw {
            return Ok(());
        }
        let most = self.length.saturating_mul(MAX_ZSTD_EXPANSION);
        if self.decoded_length() > most {
            return Err(Error::Decode {
                tensor: label(),
                encoding: self.encoding.name().to_owned(),
                reason: format!(
                    "{} decoded bytes cannot come from {} stored bytes (zstd expands at most {MAX_ZSTD_EXPANSION}:1)",
                    self.decoded_length(),
                    self.length
                ),
            });
        }
        Ok(())
    }

    /// The logical dtype if the `type` names one we know and it matches the storage
    /// (`bool` over `u8` is how version 2 stores booleans).
    pub fn logical_dtype(&self) -> DType {
        self.logical_type
            .as_deref()
            .and_then(|t| t.parse::<DType>().ok())
            .filter(|d| {
                d.storage().0 == self.dtype || (*d == DType::Bool && self.dtype == DType::U8)
            })
            .unwrap_or(self.dtype)
    }

    /// The dtype a 1.x file's reader gives this component: its `type` where that names
    /// a dtype stored exactly as this component is (`f8_e4m3fn` over `u8`,
    /// `complex64` over `f32`), else the storage dtype, with the `type` kept as a
    /// label (ztensor 1.2.3 writes any `type` over any data and reads it that way:
    /// `bf16` over `u16` reads as `u16`; so does `bool` over `u8`, which is version
    /// 2's spelling).
    pub fn logical_dtype_v1(&self) -> DType {
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
    pub name: Arc<str>,
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
        self.primary()
            .map_or(DType::U8, Component::logical_dtype_v1)
    }
}

/// A parsed manifest.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Manifest {
    /// The `version` field (`"1.2.0"`, `"0.1.0"` for 0.1 files, `"2"` for version 2
    /// files, whose manifest has no version field).
    pub version: String,
    /// File-level attributes.
    pub attributes: BTreeMap<String, Value>,
    /// Objects in name order.
    pub objects: Vec<Object>,
    /// True when an attribute map had keys that were not text (ztensor 1.x writes a
    /// Python dict's keys as they are), read as their text: writing these attributes
    /// back would change those keys.
    pub keys_made_text: bool,
}

/// Decoding context: where the manifest starts (for error offsets) and the limits.
pub(crate) struct Ctx<'a> {
    pub offset: u64,
    pub limits: &'a Limits,
}

impl Ctx<'_> {
    /// A [`Error::Malformed`] at the decoder's current position.
    fn err(&self, d: &Decoder<'_>, reason: impl Into<String>) -> Error {
        Error::malformed(self.offset.saturating_add(d.position() as u64), reason)
    }

    /// Converts a CBOR-level error, keeping its offset.
    fn cbor(&self, e: CborError) -> Error {
        e.at_file_offset(self.offset)
    }
}

/// Records that a map key was seen, failing on a repeat.
fn first_time(seen: &mut u32, bit: u32, key: &[u8], d: &Decoder<'_>, ctx: &Ctx<'_>) -> Result<()> {
    if *seen & bit != 0 {
        let key = String::from_utf8_lossy(key);
        return Err(ctx.err(d, format!("the key `{key}` appears twice")));
    }
    *seen |= bit;
    Ok(())
}

/// Reads a map of attributes into a sorted map, refusing repeated keys.
fn read_attributes(d: &mut Decoder<'_>, ctx: &Ctx<'_>) -> Result<Option<BTreeMap<String, Value>>> {
    if d.take_null() {
        return Ok(None);
    }
    let at = d.position();
    match d.value(1).map_err(|e| ctx.cbor(e))? {
        Value::Map(entries) => {
            let mut out = BTreeMap::new();
            for (k, v) in entries {
                if out.contains_key(&k) {
                    return Err(Error::malformed(
                        ctx.offset + at as u64,
                        format!("attributes repeat the key `{k}`"),
                    ));
                }
                out.insert(k, v);
            }
            Ok(Some(out))
        }
        _ => Err(Error::malformed(
            ctx.offset + at as u64,
            "attributes are not a map",
        )),
    }
}

/// The error for an integer CBOR cannot hold (outside [-2^64, 2^64)).
pub(crate) fn int_outside_cbor(i: impl std::fmt::Display) -> Error {
    Error::invalid(outside_cbor_reason(i))
}

fn outside_cbor_reason(i: impl std::fmt::Display) -> String {
    format!(
        "integer {i} is outside CBOR's 64-bit integers (ztensor rounds such a value to a float); store it as a float or a string"
    )
}

/// True when `v` is an integer CBOR cannot hold: outside [-2^64, 2^64), which a
/// [`Value::BigInt`] always is.
pub fn is_int_outside_cbor(v: &Value) -> bool {
    match v {
        Value::Int(i) => !(-(1i128 << 64)..(1i128 << 64)).contains(i),
        Value::BigInt(_) => true,
        _ => false,
    }
}

/// Fails on the first integer in `v`, the attribute `key`, that CBOR cannot hold,
/// so a writer refuses such an attribute when it is given, not when the manifest is
/// written. The error names the attribute.
pub(crate) fn check_cbor_ints(key: &str, v: &Value) -> Result<()> {
    fn first_outside(v: &Value) -> Option<String> {
        match v {
            v if is_int_outside_cbor(v) => Some(v.to_string()),
            Value::List(items) => items.iter().find_map(first_outside),
            Value::Map(entries) => entries.iter().find_map(|(_, v)| first_outside(v)),
            _ => None,
        }
    }
    match first_outside(v) {
        Some(i) => Err(Error::invalid(format!(
            "attribute `{key}`: {}",
            outside_cbor_reason(i)
        ))),
        None => Ok(()),
    }
}

/// Converts a [`Value`] to CBOR for writing.
pub(crate) fn value_to_cbor(v: &Value) -> Result<Cbor> {
    Ok(match v {
        Value::Null => Cbor::Null,
        Value::Bool(b) => Cbor::Bool(*b),
        Value::Int(i) => {
            Cbor::Integer(ciborium::value::Integer::try_from(*i).map_err(|_| int_outside_cbor(*i))?)
        }
        Value::BigInt(i) => return Err(int_outside_cbor(i)),
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

/// A name's length against the limit. An empty name is read (ztensor 1.x writes one);
/// the writers refuse to make one.
fn check_name(name: &str, ctx: &Ctx<'_>) -> Result<()> {
    Error::check_limit(
        "tensor name length",
        name.len() as u64,
        ctx.limits.max_name_bytes as u64,
    )
}

fn read_shape(d: &mut Decoder<'_>, ctx: &Ctx<'_>) -> Result<Shape> {
    let len = d.array().map_err(|e| ctx.cbor(e))?;
    let max = ctx.limits.max_ndim.min(MAX_NDIM);
    if let Some(n) = len {
        Error::check_limit("number of dimensions", n, max as u64)?;
    }
    // Common case: a short definite-length array, read without a large buffer.
    if let Some(n @ 0..=4) = len {
        let mut dims = [0u64; 4];
        for slot in dims.iter_mut().take(n as usize) {
            *slot = d.u64().map_err(|e| ctx.cbor(e))?;
        }
        return Shape::from_dims(&dims[..n as usize]);
    }
    let mut dims = [0u64; MAX_NDIM];
    let mut ndim = 0;
    d.each(len, |d| {
        if ndim >= max {
            return Err(d.err("too many dimensions"));
        }
        dims[ndim] = d.u64()?;
        ndim += 1;
        Ok(())
    })
    .map_err(|e| ctx.cbor(e))?;
    Shape::from_dims(&dims[..ndim])
}

/// The storage dtype named by raw manifest bytes (no UTF-8 check needed to match).
fn storage_dtype(raw: &[u8]) -> Option<DType> {
    DType::ALL
        .into_iter()
        .find(|t| t.is_primitive() && t.name().as_bytes() == raw)
}

/// Role names ztensor uses, shared instead of allocated per component.
const KNOWN_ROLES: [&str; 8] = [
    "data",
    "values",
    "indices",
    "indptr",
    "coords",
    "packed_weight",
    "scales",
    "zeros",
];

fn read_opt_text(d: &mut Decoder<'_>, ctx: &Ctx<'_>) -> Result<Option<String>> {
    if d.take_null() {
        return Ok(None);
    }
    Ok(Some(d.text().map_err(|e| ctx.cbor(e))?.into_owned()))
}

fn read_component(
    d: &mut Decoder<'_>,
    ctx: &Ctx<'_>,
    name: &str,
    role: Cow<'static, str>,
) -> Result<Component> {
    let here = || format!("object `{name}` component `{role}`");
    let len = d.map().map_err(|e| ctx.cbor(e))?;
    let mut seen = 0u32;
    let (mut dtype, mut logical_type, mut offset, mut length) = (None, None, None, None);
    let (mut uncompressed_length, mut encoding, mut digest) = (None, Encoding::Raw, None);
    d.each_with(
        len,
        |e| ctx.cbor(e),
        |d| {
            let key = d.key().map_err(|e| ctx.cbor(e))?;
            match key.as_ref() {
                b"dtype" => {
                    first_time(&mut seen, 1, &key, d, ctx)?;
                    let text = d.text().map_err(|e| ctx.cbor(e))?;
                    let parsed: DType = text.parse()?;
                    if !parsed.is_primitive() {
                        return Err(
                            ctx.err(d, format!("{}: `{text}` is not a storage dtype", here()))
                        );
                    }
                    dtype = Some(parsed);
                }
                b"type" => {
                    first_time(&mut seen, 2, &key, d, ctx)?;
                    logical_type = read_opt_text(d, ctx)?;
                }
                b"offset" => {
                    first_time(&mut seen, 4, &key, d, ctx)?;
                    offset = Some(d.u64().map_err(|e| ctx.cbor(e))?);
                }
                b"length" => {
                    first_time(&mut seen, 8, &key, d, ctx)?;
                    length = Some(d.u64().map_err(|e| ctx.cbor(e))?);
                }
                b"uncompressed_length" => {
                    first_time(&mut seen, 16, &key, d, ctx)?;
                    if !d.take_null() {
                        uncompressed_length = Some(d.u64().map_err(|e| ctx.cbor(e))?);
                    }
                }
                b"encoding" => {
                    first_time(&mut seen, 32, &key, d, ctx)?;
                    encoding = match read_opt_text(d, ctx)?.as_deref() {
                        None | Some("raw") => Encoding::Raw,
                        Some("zstd") => Encoding::Zstd,
                        Some(other) => {
                            return Err(Error::unsupported(format!(
                                "{}: encoding `{other}`",
                                here()
                            )))
                        }
                    };
                }
                b"digest" => {
                    first_time(&mut seen, 64, &key, d, ctx)?;
                    if let Some(text) = read_opt_text(d, ctx)? {
                        digest = Some(Digest::parse(&text).ok_or_else(|| {
                            ctx.err(d, format!("{}: unrecognised digest `{text}`", here()))
                        })?);
                    }
                }
                _ => d.skip().map_err(|e| ctx.cbor(e))?,
            }
            Ok(())
        },
    )?;
    let need = |v: Option<u64>, key: &str| {
        v.ok_or_else(|| ctx.err(d, format!("{} has no `{key}`", here())))
    };
    let dtype = dtype.ok_or_else(|| ctx.err(d, format!("{} has no `dtype`", here())))?;
    if encoding == Encoding::Zstd && uncompressed_length.is_none() {
        return Err(ctx.err(d, format!("{}: zstd without uncompressed_length", here())));
    }
    let (offset, length) = (need(offset, "offset")?, need(length, "length")?);
    Ok(Component {
        role,
        dtype,
        logical_type,
        offset,
        length,
        uncompressed_length,
        encoding,
        digest,
    })
}

fn read_object(d: &mut Decoder<'_>, ctx: &Ctx<'_>, name: &str) -> Result<Object> {
    let len = d.map().map_err(|e| ctx.cbor(e))?;
    let mut seen = 0u32;
    let (mut shape, mut layout, mut attributes) = (None, Layout::Dense, None);
    let mut components: Option<Vec<Component>> = None;
    d.each_with(
        len,
        |e| ctx.cbor(e),
        |d| {
            let key = d.key().map_err(|e| ctx.cbor(e))?;
            match key.as_ref() {
                b"shape" => {
                    first_time(&mut seen, 1, &key, d, ctx)?;
                    shape = Some(read_shape(d, ctx)?);
                }
                b"format" => {
                    first_time(&mut seen, 2, &key, d, ctx)?;
                    let raw = d.key().map_err(|e| ctx.cbor(e))?;
                    layout = match raw.as_ref() {
                        b"dense" => Layout::Dense,
                        _ => Layout::from_name(
                            std::str::from_utf8(&raw)
                                .map_err(|_| ctx.err(d, "invalid UTF-8 in `format`"))?,
                        ),
                    };
                }
                b"attributes" => {
                    first_time(&mut seen, 4, &key, d, ctx)?;
                    attributes = read_attributes(d, ctx)?;
                }
                b"components" => {
                    first_time(&mut seen, 8, &key, d, ctx)?;
                    let n = d.map().map_err(|e| ctx.cbor(e))?;
                    let mut comps = Vec::with_capacity(d.capacity(n).min(16));
                    d.each_with(
                        n,
                        |e| ctx.cbor(e),
                        |d| {
                            let raw = d.key().map_err(|e| ctx.cbor(e))?;
                            let role =
                                match KNOWN_ROLES.iter().find(|r| r.as_bytes() == raw.as_ref()) {
                                    Some(&known) => Cow::Borrowed(known),
                                    None => Cow::Owned(
                                        std::str::from_utf8(&raw)
                                            .map_err(|_| {
                                                ctx.err(d, "invalid UTF-8 in a component role")
                                            })?
                                            .to_owned(),
                                    ),
                                };
                            comps.push(read_component(d, ctx, name, role)?);
                            Ok(())
                        },
                    )?;
                    comps.sort_by(|a, b| a.role.cmp(&b.role));
                    if let Some(w) = comps.windows(2).find(|w| w[0].role == w[1].role) {
                        return Err(ctx.err(
                            d,
                            format!("object `{name}` repeats component `{}`", w[0].role),
                        ));
                    }
                    components = Some(comps);
                }
                _ => d.skip().map_err(|e| ctx.cbor(e))?,
            }
            Ok(())
        },
    )?;
    Ok(Object {
        name: Arc::from(name),
        shape: shape.ok_or_else(|| ctx.err(d, format!("object `{name}` has no shape")))?,
        layout,
        attributes,
        components: components
            .ok_or_else(|| ctx.err(d, format!("object `{name}` has no components")))?,
    })
}

/// Fast path for the object encoding ztensor (and our writer) produce for a plain raw
/// dense tensor: `{"shape": [..], "format": "dense", "components": {"data": {"dtype",
/// "offset", "length"}}}` with exactly those keys in that order. Returns `None` (and
/// leaves the decoder anywhere; the caller rewinds) for anything else, which then takes
/// the general path with its full error reporting. Accepts nothing the general path
/// would refuse.
fn canonical_dense(d: &mut Decoder<'_>, name: &str) -> Option<Object> {
    if !d.expect(&[0xa3, 0x65]) || !d.expect(b"shape") {
        return None;
    }
    let ndim = match d.array() {
        Ok(Some(n @ 0..=4)) => n as usize,
        _ => return None,
    };
    let mut dims = [0u64; 4];
    for slot in dims.iter_mut().take(ndim) {
        *slot = d.u64().ok()?;
    }
    let shape = Shape::from_dims(&dims[..ndim]).ok()?;
    if !d.expect(b"\x66format\x65dense\x6acomponents\xa1\x64data\xa3\x65dtype") {
        return None;
    }
    let raw = d.key().ok()?;
    let dtype = storage_dtype(&raw)?;
    if !d.expect(b"\x66offset") {
        return None;
    }
    let offset = d.u64().ok()?;
    if !d.expect(b"\x66length") {
        return None;
    }
    let length = d.u64().ok()?;
    Some(Object {
        name: Arc::from(name),
        shape,
        layout: Layout::Dense,
        attributes: None,
        components: vec![Component {
            role: Cow::Borrowed("data"),
            dtype,
            logical_type: None,
            offset,
            length,
            uncompressed_length: None,
            encoding: Encoding::Raw,
            digest: None,
        }],
    })
}

/// Sorts objects by name and refuses duplicates.
fn finish_objects(objects: &mut [Object]) -> Result<()> {
    // Writers emit names in sorted order; sort only when they did not.
    if !objects.is_sorted_by(|a, b| a.name <= b.name) {
        objects.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    }
    if let Some(w) = objects.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(Error::Duplicate {
            name: w[0].name.to_string(),
        });
    }
    Ok(())
}

fn count_check(len: Len, ctx: &Ctx<'_>) -> Result<()> {
    if let Some(n) = len {
        Error::check_limit("number of objects", n, ctx.limits.max_tensors)?;
    }
    Ok(())
}

/// Decodes a version 1.x manifest.
pub(crate) fn decode_v1(bytes: &[u8], ctx: &Ctx<'_>) -> Result<Manifest> {
    let mut d = Decoder::new(bytes, ctx.limits.depth());
    let len = d
        .map()
        .map_err(|e| ctx.err(&d, format!("the manifest is not a map ({})", e.reason)))?;
    let mut seen = 0u32;
    let (mut version, mut attributes, mut objects) = (None, None, None);
    d.each_with(
        len,
        |e| ctx.cbor(e),
        |d| {
            let key = d.key().map_err(|e| ctx.cbor(e))?;
            match key.as_ref() {
                b"version" => {
                    first_time(&mut seen, 1, &key, d, ctx)?;
                    version = Some(d.text().map_err(|e| ctx.cbor(e))?.into_owned());
                }
                b"attributes" => {
                    first_time(&mut seen, 2, &key, d, ctx)?;
                    attributes = read_attributes(d, ctx)?;
                }
                b"objects" => {
                    first_time(&mut seen, 4, &key, d, ctx)?;
                    let n = d.map().map_err(|e| ctx.cbor(e))?;
                    count_check(n, ctx)?;
                    let mut list = Vec::with_capacity(d.capacity(n));
                    d.each_with(
                        n,
                        |e| ctx.cbor(e),
                        |d| {
                            Error::check_limit(
                                "number of objects",
                                list.len() as u64 + 1,
                                ctx.limits.max_tensors,
                            )?;
                            let name = d.text().map_err(|e| ctx.cbor(e))?;
                            check_name(&name, ctx)?;
                            let start = d.position();
                            let object = match canonical_dense(d, &name) {
                                Some(object) => object,
                                None => {
                                    d.rewind(start);
                                    read_object(d, ctx, &name)?
                                }
                            };
                            list.push(object);
                            Ok(())
                        },
                    )?;
                    objects = Some(list);
                }
                _ => d.skip().map_err(|e| ctx.cbor(e))?,
            }
            Ok(())
        },
    )?;
    if !d.is_done() {
        return Err(ctx.err(&d, "trailing bytes after the CBOR manifest"));
    }
    let version = version.ok_or_else(|| ctx.err(&d, "the manifest has no `version`"))?;
    if !version.starts_with("1.") {
        return Err(Error::unsupported(format!("manifest version `{version}`")));
    }
    let mut objects = objects.ok_or_else(|| ctx.err(&d, "the manifest has no `objects`"))?;
    finish_objects(&mut objects)?;
    Ok(Manifest {
        version,
        attributes: attributes.unwrap_or_default(),
        objects,
        keys_made_text: d.keys_made_text(),
    })
}

/// Decodes a version 0.1 manifest (a CBOR array of tensor records) into the 1.2 model.
pub(crate) fn decode_v01(bytes: &[u8], ctx: &Ctx<'_>) -> Result<Manifest> {
    let mut d = Decoder::new(bytes, ctx.limits.depth());
    let len = d
        .array()
        .map_err(|_| ctx.err(&d, "a 0.1 manifest must be an array"))?;
    count_check(len, ctx)?;
    let mut objects = Vec::with_capacity(d.capacity(len));
    d.each_with(
        len,
        |e| ctx.cbor(e),
        |d| {
            Error::check_limit(
                "number of objects",
                objects.len() as u64 + 1,
                ctx.limits.max_tensors,
            )?;
            objects.push(read_v01_record(d, ctx)?);
            Ok(())
        },
    )?;
    if !d.is_done() {
        return Err(ctx.err(&d, "trailing bytes after the CBOR manifest"));
    }
    finish_objects(&mut objects)?;
    Ok(Manifest {
        version: "0.1.0".to_owned(),
        attributes: Default::default(),
        objects,
        keys_made_text: false,
    })
}

fn read_v01_record(d: &mut Decoder<'_>, ctx: &Ctx<'_>) -> Result<Object> {
    let len = d.map().map_err(|e| ctx.cbor(e))?;
    let mut seen = 0u32;
    let (mut name, mut offset, mut size, mut dtype, mut shape) = (None, None, None, None, None);
    let (mut encoding, mut layout, mut endianness, mut digest) = (None, None, None, None);
    d.each_with(
        len,
        |e| ctx.cbor(e),
        |d| {
            let key = d.key().map_err(|e| ctx.cbor(e))?;
            match key.as_ref() {
                b"name" => {
                    first_time(&mut seen, 1, &key, d, ctx)?;
                    let n = d.text().map_err(|e| ctx.cbor(e))?;
                    check_name(&n, ctx)?;
                    name = Some(n.into_owned());
                }
                b"offset" => {
                    first_time(&mut seen, 2, &key, d, ctx)?;
                    offset = Some(d.u64().map_err(|e| ctx.cbor(e))?);
                }
                b"size" => {
                    first_time(&mut seen, 4, &key, d, ctx)?;
                    size = Some(d.u64().map_err(|e| ctx.cbor(e))?);
                }
                b"dtype" => {
                    first_time(&mut seen, 8, &key, d, ctx)?;
                    let t: DType = d.text().map_err(|e| ctx.cbor(e))?.parse()?;
                    if !t.is_primitive() {
                        return Err(ctx.err(d, format!("`{t}` is not a 0.1 dtype")));
                    }
                    dtype = Some(t);
                }
                b"shape" => {
                    first_time(&mut seen, 16, &key, d, ctx)?;
                    shape = Some(read_shape(d, ctx)?);
                }
                b"encoding" => {
                    first_time(&mut seen, 32, &key, d, ctx)?;
                    encoding = read_opt_text(d, ctx)?;
                }
                b"layout" => {
                    first_time(&mut seen, 64, &key, d, ctx)?;
                    layout = read_opt_text(d, ctx)?;
                }
                b"data_endianness" => {
                    first_time(&mut seen, 128, &key, d, ctx)?;
                    endianness = read_opt_text(d, ctx)?;
                }
                b"checksum" => {
                    first_time(&mut seen, 256, &key, d, ctx)?;
                    if let Some(text) = read_opt_text(d, ctx)? {
                        if text != "none" {
                            digest = Some(Digest::parse(&text).ok_or_else(|| {
                                ctx.err(d, format!("unrecognised checksum `{text}`"))
                            })?);
                        }
                    }
                }
                _ => d.skip().map_err(|e| ctx.cbor(e))?,
            }
            Ok(())
        },
    )?;
    let missing = |key: &str| ctx.err(d, format!("a 0.1 tensor record has no `{key}`"));
    let name = name.ok_or_else(|| missing("name"))?;
    let dtype = dtype.ok_or_else(|| missing("dtype"))?;
    let shape = shape.ok_or_else(|| missing("shape"))?;
    if let Some(layout) = layout.as_deref().filter(|l| *l != "dense") {
        return Err(Error::unsupported(format!(
            "tensor `{name}`: 0.1 layout `{layout}`"
        )));
    }
    if let Some(e) = endianness.as_deref().filter(|e| *e != "little") {
        if dtype.size().unwrap_or(1) > 1 {
            return Err(Error::unsupported(format!(
                "tensor `{name}`: {e}-endian data"
            )));
        }
    }
    let encoding = match encoding.as_deref() {
        None | Some("raw") => Encoding::Raw,
        Some("zstd") => Encoding::Zstd,
        Some(other) => {
            return Err(Error::unsupported(format!(
                "tensor `{name}`: encoding `{other}`"
            )))
        }
    };
    let uncompressed_length = match encoding {
        Encoding::Raw => None,
        _ => Some(shape.byte_len(dtype)?),
    };
    let component = Component {
        role: Cow::Borrowed("data"),
        dtype,
        logical_type: None,
        offset: offset.ok_or_else(|| missing("offset"))?,
        length: size.ok_or_else(|| missing("size"))?,
        uncompressed_length,
        encoding,
        digest,
    };
    Ok(Object {
        name: name.into(),
        shape,
        layout: Layout::Dense,
        attributes: None,
        components: vec![component],
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
                    .map(|c| (Cbor::Text(c.role.to_string()), component_to_cbor(c)))
                    .collect(),
            ),
        ));
        object_entries.push((Cbor::Text(o.name.to_string()), Cbor::Map(m)));
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
