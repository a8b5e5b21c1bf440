//! The `.zt` version 2 manifest: decoding (strict deterministic CBOR) into the same
//! [`Manifest`] model the 1.x reader uses, the v2 validation rules, and encoding
//! byte for byte as ztensor 2.x does.
//!
//! The mapping onto the model: an object's `parts` become its components (role =
//! part name), `blob: [offset, length]` gives `offset` and `length`, `decoded_length`
//! goes in `uncompressed_length`, `encoding: "zt.zstd-seekable/1"` is
//! [`Encoding::ZstdSeekable`], `type` is the logical type, and `digest` (over the
//! *decoded* bytes in v2) is parsed as [`Digest::Xxh3`] or [`Digest::Sha256`]. Layout
//! `dense` is [`Layout::Dense`], `zt.sparse_csr/1` is [`Layout::SparseCsr`] (the same
//! parts as 1.x `sparse_csr`); every other layout id is [`Layout::Other`] with its
//! name, readable part by part but not interpreted.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use tensorwire_core::{DType, Error, Layout, Limits, Result, Shape, Value};

use crate::cbor::CborError;
use crate::cbor_det::{Det, Item, KeyOrder};
use crate::digest::Digest;
use crate::manifest::{Component, Ctx, Encoding, Manifest, Object};

/// Nesting limit of the v2 manifest, counted from its root (spec §3.1).
pub(crate) const MAX_DEPTH: usize = 32;
/// Longest object, part or attribute name (spec §3.5).
pub(crate) const MAX_NAME: usize = 1024;
/// Highest rank (spec §3.3).
pub(crate) const MAX_RANK: usize = 64;
/// The layout id of 1.x `sparse_csr` in version 2.
pub(crate) const SPARSE_CSR: &str = "zt.sparse_csr/1";
/// The `version` string [`Manifest`] gets for a v2 file (v2 manifests have none; the
/// footer holds the integer 2).
pub(crate) const VERSION: &str = "2";

/// A logical type registered by the v2 specification (Appendix A).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Logical {
    /// The storage dtype it requires.
    pub storage: DType,
    /// Our dtype for it, when tensorwire has one (`f8_e8m0` and `f4_e2m1` have none).
    pub dtype: Option<DType>,
    /// Decoded bytes per element, in half bytes (`f4_e2m1` packs two per byte).
    half_bytes: u64,
}

impl Logical {
    /// Decoded size of `elements` elements.
    pub(crate) fn size(self, elements: u64) -> Option<u64> {
        Some(elements.checked_mul(self.half_bytes)?.div_ceil(2))
    }
}

/// The registered logical type `name`, if it is one.
pub(crate) fn logical(name: &str) -> Option<Logical> {
    let (storage, dtype, half_bytes) = match name {
        "bool" => (DType::U8, Some(DType::Bool), 2),
        "f8_e4m3fn" => (DType::U8, Some(DType::F8E4M3Fn), 2),
        "f8_e5m2" => (DType::U8, Some(DType::F8E5M2), 2),
        "f8_e4m3fnuz" => (DType::U8, Some(DType::F8E4M3Fnuz), 2),
        "f8_e5m2fnuz" => (DType::U8, Some(DType::F8E5M2Fnuz), 2),
        "f8_e8m0" => (DType::U8, None, 2),
        "f4_e2m1" => (DType::U8, None, 1),
        "complex64" => (DType::F32, Some(DType::Complex64), 16),
        "complex128" => (DType::F64, Some(DType::Complex128), 32),
        _ => return None,
    };
    Some(Logical {
        storage,
        dtype,
        half_bytes,
    })
}

/// The 12 v2 storage dtypes (`bool` is a logical type over `u8` in v2).
pub(crate) fn storage_dtype(name: &str) -> Option<DType> {
    DType::ALL
        .into_iter()
        .find(|t| t.is_primitive() && *t != DType::Bool && t.name() == name)
}

/// The element dtype a v2 component denotes: its registered logical type's dtype,
/// else its storage dtype (for unregistered or dtype-less logical types, which
/// [`can_interpret`] refuses to view).
pub(crate) fn element_dtype(c: &Component) -> DType {
    match c.logical_type.as_deref() {
        Some(t) => logical(t).and_then(|l| l.dtype).unwrap_or(c.dtype),
        None => c.dtype,
    }
}

/// True when tensorwire can present a component as typed elements: no logical type,
/// or a registered one it has a dtype for.
pub(crate) fn can_interpret(c: &Component) -> bool {
    c.logical_type
        .as_deref()
        .is_none_or(|t| logical(t).is_some_and(|l| l.dtype.is_some()))
}

/// The v2 layout id of a layout.
pub(crate) fn layout_id(layout: &Layout) -> Result<Cow<'_, str>> {
    Ok(match layout {
        Layout::Dense => Cow::Borrowed("dense"),
        Layout::SparseCsr => Cow::Borrowed(SPARSE_CSR),
        Layout::Other(name) => match layout_of(name) {
            Layout::Other(_) => Cow::Borrowed(name.as_str()),
            known => return layout_id(&known).map(|c| Cow::Owned(c.into_owned())),
        },
        other => {
            return Err(Error::unsupported(format!(
                "layout {other} in a .zt 2 file (its 1.x components have no registered v2 profile)"
            )))
        }
    })
}

/// The layout a v2 layout id names.
pub(crate) fn layout_of(id: &str) -> Layout {
    match id {
        "dense" => Layout::Dense,
        SPARSE_CSR => Layout::SparseCsr,
        other => Layout::Other(other.to_owned()),
    }
}

/// Name rules (spec §3.5): non-empty, at most 1024 bytes (and the caller's limit),
/// no NUL. `what` says which kind of name.
pub(crate) fn check_name(name: &str, what: &str, limits: &Limits) -> Result<()> {
    Error::check_limit(
        "name length",
        name.len() as u64,
        limits.max_name_bytes.min(MAX_NAME) as u64,
    )?;
    if name.is_empty() || name.contains('\0') {
        return Err(Error::invalid(format!(
            "{what} {name:?}: names must be non-empty and free of NUL"
        )));
    }
    Ok(())
}

// ===== decoding =====

/// Converts a decoder error into a [`Error::Malformed`] at its file offset.
fn det(ctx: &Ctx<'_>, e: CborError) -> Error {
    match e.depth_limit {
        // Past the spec's own nesting limit: no setting reads it.
        Some(limit) if limit >= MAX_DEPTH => Error::malformed(
            ctx.offset.saturating_add(e.at as u64),
            format!("the manifest nests deeper than the {MAX_DEPTH} levels .zt 2 allows"),
        ),
        // Past the caller's lower limit: `LimitExceeded`, which they may raise.
        _ => e.at_file_offset(ctx.offset),
    }
}

fn malformed(ctx: &Ctx<'_>, d: &Det<'_>, reason: impl Into<String>) -> Error {
    Error::malformed(ctx.offset.saturating_add(d.position() as u64), reason)
}

/// A name read from the manifest, checked against the name rules.
fn read_name<'a>(
    d: &mut Det<'a>,
    depth: usize,
    order: &mut KeyOrder,
    ctx: &Ctx<'_>,
    what: &str,
) -> Result<&'a str> {
    let name = d
        .key(depth, order)
        .map_err(|e| det(ctx, e))?
        .ok_or_else(|| malformed(ctx, d, format!("a {what} is not a text string")))?;
    check_name(name, what, ctx.limits).map_err(|e| match e {
        Error::InvalidArgument { reason } => malformed(ctx, d, reason),
        other => other,
    })?;
    Ok(name)
}

/// Reads an `attributes` map: text keys obeying the name rules, any permitted values.
fn read_attributes(
    d: &mut Det<'_>,
    depth: usize,
    ctx: &Ctx<'_>,
) -> Result<BTreeMap<String, Value>> {
    let n = d.map(depth).map_err(|e| det(ctx, e))?;
    let mut out = BTreeMap::new();
    let mut order = KeyOrder::default();
    for _ in 0..n {
        let key = read_name(d, depth + 1, &mut order, ctx, "attribute key")?;
        let at = d.position();
        let value = d.value(depth + 1).map_err(|e| {
            if e.reason == "non-text map key in an attribute value" {
                Error::unsupported(format!(
                    "attribute `{key}` holds a map with a non-text key (at manifest byte {at})"
                ))
            } else {
                det(ctx, e)
            }
        })?;
        out.insert(key.to_owned(), value);
    }
    Ok(out)
}

/// Decodes a version 2 manifest (the bytes the footer points at, hash already
/// checked). `ctx.offset` is the manifest's file offset.
pub(crate) fn decode(bytes: &[u8], ctx: &Ctx<'_>) -> Result<Manifest> {
    let mut d = Det::new(bytes, ctx.limits.depth().min(MAX_DEPTH));
    let n = d.map(0).map_err(|e| {
        Error::malformed(
            ctx.offset + e.at as u64,
            format!("the manifest is not a map ({})", e.reason),
        )
    })?;
    let mut order = KeyOrder::default();
    let (mut attributes, mut objects) = (None, None);
    for _ in 0..n {
        match d.key(1, &mut order).map_err(|e| det(ctx, e))? {
            Some("objects") => objects = Some(read_objects(&mut d, ctx)?),
            Some("attributes") => attributes = Some(read_attributes(&mut d, 1, ctx)?),
            Some("shards") => {
                return Err(Error::unsupported(
                    "a multi-file .zt 2 model (the manifest has a `shards` table)",
                ))
            }
            _ => d.skip(1).map_err(|e| det(ctx, e))?,
        }
    }
    if !d.is_done() {
        return Err(malformed(ctx, &d, "trailing bytes after the CBOR manifest"));
    }
    let mut objects = objects.ok_or_else(|| malformed(ctx, &d, "the manifest has no `objects`"))?;
    // Map order is by encoded key (shorter names first); the model keeps byte order.
    objects.sort_unstable_by(|a: &Object, b: &Object| a.name.cmp(&b.name));
    Ok(Manifest {
        version: VERSION.to_owned(),
        attributes: attributes.unwrap_or_default(),
        objects,
        keys_made_text: false,
    })
}

fn read_objects(d: &mut Det<'_>, ctx: &Ctx<'_>) -> Result<Vec<Object>> {
    let n = d.map(1).map_err(|e| det(ctx, e))?;
    Error::check_limit("number of objects", n, ctx.limits.max_tensors)?;
    let mut list = Vec::with_capacity(d.capacity(n));
    let mut order = KeyOrder::default();
    for _ in 0..n {
        let name = read_name(d, 2, &mut order, ctx, "object name")?;
        list.push(read_object(d, name, ctx)?);
    }
    Ok(list)
}

fn read_shape(d: &mut Det<'_>, depth: usize, ctx: &Ctx<'_>) -> Result<Shape> {
    let n = d.array(depth).map_err(|e| det(ctx, e))?;
    Error::check_limit(
        "number of dimensions",
        n,
        ctx.limits.max_ndim.min(MAX_RANK) as u64,
    )?;
    let mut dims = [0u64; MAX_RANK];
    for slot in dims.iter_mut().take(n as usize) {
        *slot = d.u64(depth + 1).map_err(|e| det(ctx, e))?;
    }
    Shape::from_dims(&dims[..n as usize])
}

fn read_object(d: &mut Det<'_>, name: &str, ctx: &Ctx<'_>) -> Result<Object> {
    let n = d.map(2).map_err(|e| det(ctx, e))?;
    let mut order = KeyOrder::default();
    let (mut shape, mut layout, mut attributes, mut parts) = (None, None, None, None);
    for _ in 0..n {
        match d.key(3, &mut order).map_err(|e| det(ctx, e))? {
            Some("shape") => shape = Some(read_shape(d, 3, ctx)?),
            Some("layout") => layout = Some(layout_of(d.text(3).map_err(|e| det(ctx, e))?)),
            Some("attributes") => attributes = Some(read_attributes(d, 3, ctx)?),
            Some("parts") => {
                let count = d.map(3).map_err(|e| det(ctx, e))?;
                let mut list = Vec::with_capacity(d.capacity(count).min(16));
                let mut part_order = KeyOrder::default();
                for _ in 0..count {
                    let role = read_name(d, 4, &mut part_order, ctx, "part name")?;
                    list.push(read_part(d, name, role, ctx)?);
                }
                parts = Some(list);
            }
            _ => d.skip(3).map_err(|e| det(ctx, e))?,
        }
    }
    let missing = |key: &str| malformed(ctx, d, format!("object `{name}` has no `{key}`"));
    let mut components = parts.ok_or_else(|| missing("parts"))?;
    if components.is_empty() {
        return Err(malformed(ctx, d, format!("object `{name}` has no parts")));
    }
    components.sort_unstable_by(|a, b| a.role.cmp(&b.role));
    Ok(Object {
        name: Arc::from(name),
        shape: shape.ok_or_else(|| missing("shape"))?,
        layout: layout.ok_or_else(|| missing("layout"))?,
        attributes,
        components,
    })
}

/// Role names shared instead of allocated per part.
const KNOWN_ROLES: [&str; 5] = ["data", "values", "indices", "indptr", "scales"];

fn read_part(d: &mut Det<'_>, name: &str, role: &str, ctx: &Ctx<'_>) -> Result<Component> {
    let here = || format!("object `{name}` part `{role}`");
    let n = d.map(4).map_err(|e| det(ctx, e))?;
    let mut order = KeyOrder::default();
    let (mut dtype, mut logical_type, mut blob) = (None, None, None);
    let (mut encoding, mut decoded_length, mut digest) = (None, None, None);
    for _ in 0..n {
        match d.key(5, &mut order).map_err(|e| det(ctx, e))? {
            Some("dtype") => {
                let text = d.text(5).map_err(|e| det(ctx, e))?;
                dtype = Some(storage_dtype(text).ok_or_else(|| Error::UnknownDType {
                    name: text.to_owned(),
                })?);
            }
            Some("type") => logical_type = Some(d.text(5).map_err(|e| det(ctx, e))?.to_owned()),
            Some("blob") => {
                let count = d.array(5).map_err(|e| det(ctx, e))?;
                if count != 2 {
                    return Err(malformed(
                        ctx,
                        d,
                        format!("{}: `blob` must be [offset, length]", here()),
                    ));
                }
                let offset = d.u64(6).map_err(|e| det(ctx, e))?;
                let length = d.u64(6).map_err(|e| det(ctx, e))?;
                blob = Some((offset, length));
            }
            Some("shard") => {
                return Err(Error::unsupported(format!(
                    "{}: its bytes are in another file (`shard`)",
                    here()
                )))
            }
            Some("encoding") => {
                let text = d.text(5).map_err(|e| det(ctx, e))?;
                if text != crate::seekable::NAME {
                    return Err(Error::unsupported(format!("{}: encoding `{text}`", here())));
                }
                encoding = Some(Encoding::ZstdSeekable);
            }
            Some("decoded_length") => decoded_length = Some(d.u64(5).map_err(|e| det(ctx, e))?),
            Some("digest") => {
                let text = d.text(5).map_err(|e| det(ctx, e))?;
                digest = Some(Digest::parse_v2(text).map_err(|unknown| {
                    if unknown {
                        Error::unsupported(format!("{}: digest algorithm of `{text}`", here()))
                    } else {
                        malformed(
                            ctx,
                            d,
                            format!("{}: `{text}` is not an xxh3 or sha256 digest", here()),
                        )
                    }
                })?);
            }
            _ => d.skip(5).map_err(|e| det(ctx, e))?,
        }
    }
    let dtype = dtype.ok_or_else(|| malformed(ctx, d, format!("{} has no `dtype`", here())))?;
    let (offset, length) =
        blob.ok_or_else(|| malformed(ctx, d, format!("{} has no `blob`", here())))?;
    if encoding.is_some() != decoded_length.is_some() {
        return Err(malformed(
            ctx,
            d,
            format!(
                "{}: `decoded_length` must be present exactly when `encoding` is",
                here()
            ),
        ));
    }
    let role = match KNOWN_ROLES.iter().find(|r| **r == role) {
        Some(&known) => Cow::Borrowed(known),
        None => Cow::Owned(role.to_owned()),
    };
    Ok(Component {
        role,
        dtype,
        logical_type,
        offset,
        length,
        uncompressed_length: decoded_length,
        encoding: encoding.unwrap_or(Encoding::Raw),
        digest,
    })
}

// ===== validation =====

/// Per-object rules shared by the reader (on open) and the writer (before writing):
/// registered logical types on their required dtype, and the layout rules of
/// `dense` and `zt.sparse_csr/1` (spec §5.1, Appendix B). Other layouts stay
/// structural. Errors are [`Error::Malformed`] at `at` (or `SizeMismatch`).
pub(crate) fn check_object(obj: &Object, at: u64) -> Result<()> {
    let bad = |reason: String| {
        Err(Error::malformed(
            at,
            format!("object `{}`: {reason}", obj.name),
        ))
    };
    if obj.components.is_empty() {
        return bad("no parts".into());
    }
    let n = obj.shape.numel()?;
    if let Some(w) = obj.components.windows(2).find(|w| w[0].role == w[1].role) {
        return bad(format!("part `{}` appears twice", w[0].role));
    }
    for c in &obj.components {
        if let Some(l) = c
            .logical_type
            .as_deref()
            .and_then(|t| logical(t).map(|l| (t, l)))
        {
            if l.1.storage != c.dtype {
                return bad(format!(
                    "part `{}`: type `{}` requires dtype {}, not {}",
                    c.role, l.0, l.1.storage, c.dtype
                ));
            }
        }
    }
    // Decoded size of `n` elements of a part, when its size function is known.
    let size_of = |c: &Component, n: u64| -> Option<u64> {
        match c.logical_type.as_deref() {
            None => n.checked_mul(c.dtype.size().unwrap_or(1) as u64),
            Some(t) => logical(t)?.size(n),
        }
    };
    match &obj.layout {
        Layout::Dense => {
            if obj.components.len() != 1 || obj.components[0].role != "data" {
                return bad("dense requires exactly one part, named `data`".into());
            }
            let data = &obj.components[0];
            // Unregistered logical types have no size function: structural (§4.2).
            if data
                .logical_type
                .as_deref()
                .is_none_or(|t| logical(t).is_some())
            {
                let expected = size_of(data, n).ok_or(Error::Overflow {
                    what: "tensor byte length",
                })?;
                if data.decoded_length() != expected {
                    return Err(Error::SizeMismatch {
                        tensor: obj.name.to_string(),
                        expected,
                        found: data.decoded_length(),
                    });
                }
            }
        }
        Layout::SparseCsr => {
            let [rows, _cols] = obj.shape.dims()[..] else {
                return bad("zt.sparse_csr/1 requires a rank-2 shape".into());
            };
            let (Some(values), Some(indices), Some(indptr)) = (
                obj.component("values"),
                obj.component("indices"),
                obj.component("indptr"),
            ) else {
                return bad("zt.sparse_csr/1 requires parts `values`, `indices`, `indptr`".into());
            };
            if obj.components.len() != 3 {
                return bad("zt.sparse_csr/1 requires exactly 3 parts".into());
            }
            if !matches!(indices.dtype, DType::U32 | DType::U64) || indices.logical_type.is_some() {
                return bad("`indices` must be plain u32 or u64".into());
            }
            if indptr.dtype != indices.dtype || indptr.logical_type.is_some() {
                return bad("`indptr` must have the dtype of `indices`".into());
            }
            let w = indices.dtype.size().unwrap_or(1) as u64;
            let want =
                rows.checked_add(1)
                    .and_then(|r| r.checked_mul(w))
                    .ok_or(Error::Overflow {
                        what: "indptr size",
                    })?;
            if indptr.decoded_length() != want {
                return bad(format!(
                    "`indptr` must hold rows + 1 elements ({want} bytes, not {})",
                    indptr.decoded_length()
                ));
            }
            if indices.decoded_length() % w != 0 {
                return bad(format!(
                    "`indices` is not a whole number of {w}-byte elements"
                ));
            }
            let nnz = indices.decoded_length() / w;
            if let Some(expected) = size_of(values, nnz) {
                if values.decoded_length() != expected {
                    return bad(format!(
                        "`values` must be {expected} bytes for {nnz} entries, not {}",
                        values.decoded_length()
                    ));
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// Checks a whole v2 manifest against the file: every blob at a multiple of 4096
/// and at or past 4096, inside the data region (before the footer), pairwise
/// identical or disjoint with each other and with the manifest blob (zero-length
/// blobs exempt), decoded sizes within the limits, names within the rules, and each
/// object's layout rules.
pub(crate) fn validate(
    manifest: &Manifest,
    data_end: u64,
    manifest_blob: (u64, u64),
    limits: &Limits,
) -> Result<()> {
    const FLOOR: u64 = crate::V2_ALIGNMENT;
    let label = |o: usize, c: usize| {
        let obj = &manifest.objects[o];
        format!("{}/{}", obj.name, obj.components[c].role)
    };
    let mut spans: Vec<(u64, u64, usize, usize)> =
        vec![(manifest_blob.0, manifest_blob.1, usize::MAX, 0)];
    for (oi, obj) in manifest.objects.iter().enumerate() {
        check_object(obj, manifest_blob.0)?;
        for (ci, c) in obj.components.iter().enumerate() {
            if c.offset % FLOOR != 0 {
                return Err(Error::Misaligned {
                    tensor: label(oi, ci),
                    offset: c.offset,
                    alignment: FLOOR,
                });
            }
            let end = c
                .offset
                .checked_add(c.length)
                .filter(|&e| e <= data_end && c.offset >= FLOOR);
            if end.is_none() {
                return Err(Error::OutOfBounds {
                    tensor: label(oi, ci),
                    offset: c.offset,
                    length: c.length,
                    limit: data_end,
                });
            }
            Error::check_limit(
                "decoded component size",
                c.decoded_length(),
                limits.max_decoded_bytes,
            )?;
            c.check_expansion(|| label(oi, ci))?;
            if c.length > 0 {
                spans.push((c.offset, c.length, oi, ci));
            }
        }
    }
    spans.sort_unstable_by_key(|&(offset, length, _, _)| (offset, length));
    spans.dedup_by_key(|s| (s.0, s.1));
    let name = |s: &(u64, u64, usize, usize)| {
        if s.2 == usize::MAX {
            "<manifest>".to_owned()
        } else {
            label(s.2, s.3)
        }
    };
    for pair in spans.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.0 + a.1 > b.0 {
            return Err(Error::Overlap {
                tensor: name(b),
                other: name(a),
                offset: b.0,
            });
        }
    }
    Ok(())
}

// ===== encoding =====

fn attributes_item(m: &BTreeMap<String, Value>) -> Item<'_> {
    Item::Map(
        m.iter()
            .map(|(k, v)| (k.as_str(), Item::Value(v)))
            .collect(),
    )
}

/// Encodes a manifest as ztensor 2.x does: deterministic CBOR, file `attributes`
/// only when non-empty, object `attributes` only when non-empty, part fields only
/// when set.
pub(crate) fn encode(manifest: &Manifest) -> Result<Vec<u8>> {
    let layouts = manifest
        .objects
        .iter()
        .map(|o| layout_id(&o.layout))
        .collect::<Result<Vec<_>>>()?;
    let digests: Vec<Vec<Option<String>>> = manifest
        .objects
        .iter()
        .map(|o| {
            o.components
                .iter()
                .map(|c| c.digest.as_ref().map(ToString::to_string))
                .collect()
        })
        .collect();
    let mut objects = Vec::with_capacity(manifest.objects.len());
    for ((o, layout), digests) in manifest.objects.iter().zip(&layouts).zip(&digests) {
        let mut fields = vec![
            (
                "shape",
                Item::Array(o.shape.dims().iter().map(|&d| Item::U64(d)).collect()),
            ),
            ("layout", Item::Text(layout)),
        ];
        if let Some(a) = o.attributes.as_ref().filter(|a| !a.is_empty()) {
            fields.push(("attributes", attributes_item(a)));
        }
        let mut parts = Vec::with_capacity(o.components.len());
        for (c, digest) in o.components.iter().zip(digests) {
            let mut p = vec![
                ("dtype", Item::Text(c.dtype.name())),
                (
                    "blob",
                    Item::Array(vec![Item::U64(c.offset), Item::U64(c.length)]),
                ),
            ];
            if let Some(t) = &c.logical_type {
                p.push(("type", Item::Text(t)));
            }
            if c.encoding != Encoding::Raw {
                p.push(("encoding", Item::Text(c.encoding.name())));
                p.push(("decoded_length", Item::U64(c.decoded_length())));
            }
            if let Some(d) = digest {
                p.push(("digest", Item::Text(d)));
            }
            parts.push((c.role.as_ref(), Item::Map(p)));
        }
        fields.push(("parts", Item::Map(parts)));
        objects.push((o.name.as_ref(), Item::Map(fields)));
    }
    let mut root = vec![("objects", Item::Map(objects))];
    if !manifest.attributes.is_empty() {
        root.push(("attributes", attributes_item(&manifest.attributes)));
    }
    crate::cbor_det::encode(&Item::Map(root))
}
