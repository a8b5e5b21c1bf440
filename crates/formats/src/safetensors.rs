//! safetensors: read (zero-copy) and write (byte-compatible with the `safetensors`
//! package).
//!
//! A file is `u64` LE header length `N` | `N` bytes of JSON | data. The JSON is an
//! object mapping each tensor name to `{"dtype", "shape", "data_offsets": [begin,
//! end]}` (offsets relative to the data region) and optionally `"__metadata__"` to a
//! string → string map. `save_file` orders tensors by dtype (widest first, in the
//! order of the package's dtype enum) then by name, lays their bytes out back to back
//! in that order, and pads the JSON with spaces to a multiple of 8 bytes.
//!
//! [`SafetensorsReader`] checks, on open: the header length against a cap (100 MB, as
//! the package, or [`Limits::max_metadata_bytes`] if smaller), the JSON, every dtype
//! and shape, and that the tensors' byte ranges tile the data region exactly: no
//! overlap, no gap, no trailing bytes, each range `shape × dtype` long.

use std::any::Any;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use crate::json::{JsonError, JsonReader, Number};
use tensorwire_core::progress::{within_tensor, write_in_chunks};
use tensorwire_core::{
    Bytes, DType, Error, Layout, Limits, NameSet, Result, Shape, TensorIndex, TensorInfo,
    TensorSource, TensorView, Value, MAX_NDIM,
};

/// Largest header the `safetensors` package accepts (and so do we), in bytes.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The JSON key of the file-level string metadata.
pub const METADATA_KEY: &str = "__metadata__";

/// A safetensors element type, in the order of the package's dtype enum (which is the
/// order `save_file` sorts by, widest rank first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StDType {
    /// `BOOL`.
    Bool,
    /// `F4` (float4 e2m1, two per byte).
    F4,
    /// `F6_E2M3` (float6, packed).
    F6E2M3,
    /// `F6_E3M2` (float6, packed).
    F6E3M2,
    /// `U8`.
    U8,
    /// `I8`.
    I8,
    /// `F8_E5M2`.
    F8E5M2,
    /// `F8_E4M3` (the OCP e4m3fn type).
    F8E4M3,
    /// `F8_E8M0` (the MX scale type).
    F8E8M0,
    /// `F8_E4M3FNUZ` (the AMD e4m3 variant).
    F8E4M3Fnuz,
    /// `F8_E5M2FNUZ` (the AMD e5m2 variant).
    F8E5M2Fnuz,
    /// `I16`.
    I16,
    /// `U16`.
    U16,
    /// `F16`.
    F16,
    /// `BF16`.
    BF16,
    /// `I32`.
    I32,
    /// `U32`.
    U32,
    /// `F32`.
    F32,
    /// `C64` (complex of two f32).
    C64,
    /// `F64`.
    F64,
    /// `I64`.
    I64,
    /// `U64`.
    U64,
}

impl StDType {
    const ALL: [StDType; 22] = [
        StDType::Bool,
        StDType::F4,
        StDType::F6E2M3,
        StDType::F6E3M2,
        StDType::U8,
        StDType::I8,
        StDType::F8E5M2,
        StDType::F8E4M3,
        StDType::F8E8M0,
        StDType::F8E4M3Fnuz,
        StDType::F8E5M2Fnuz,
        StDType::I16,
        StDType::U16,
        StDType::F16,
        StDType::BF16,
        StDType::I32,
        StDType::U32,
        StDType::F32,
        StDType::C64,
        StDType::F64,
        StDType::I64,
        StDType::U64,
    ];

    /// The name in the JSON header (`"F32"`, `"BF16"`, `"F8_E4M3"`).
    pub fn name(self) -> &'static str {
        match self {
            StDType::Bool => "BOOL",
            StDType::F4 => "F4",
            StDType::F6E2M3 => "F6_E2M3",
            StDType::F6E3M2 => "F6_E3M2",
            StDType::U8 => "U8",
            StDType::I8 => "I8",
            StDType::F8E5M2 => "F8_E5M2",
            StDType::F8E4M3 => "F8_E4M3",
            StDType::F8E8M0 => "F8_E8M0",
            StDType::F8E4M3Fnuz => "F8_E4M3FNUZ",
            StDType::F8E5M2Fnuz => "F8_E5M2FNUZ",
            StDType::I16 => "I16",
            StDType::U16 => "U16",
            StDType::F16 => "F16",
            StDType::BF16 => "BF16",
            StDType::I32 => "I32",
            StDType::U32 => "U32",
            StDType::F32 => "F32",
            StDType::C64 => "C64",
            StDType::F64 => "F64",
            StDType::I64 => "I64",
            StDType::U64 => "U64",
        }
    }

    /// Parses a header name.
    pub fn from_name(name: &str) -> Option<StDType> {
        StDType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bits per element.
    pub fn bits(self) -> u64 {
        match self {
            StDType::F4 => 4,
            StDType::F6E2M3 | StDType::F6E3M2 => 6,
            StDType::Bool | StDType::U8 | StDType::I8 => 8,
            StDType::F8E5M2 | StDType::F8E4M3 | StDType::F8E8M0 => 8,
            StDType::F8E4M3Fnuz | StDType::F8E5M2Fnuz => 8,
            StDType::I16 | StDType::U16 | StDType::F16 | StDType::BF16 => 16,
            StDType::I32 | StDType::U32 | StDType::F32 => 32,
            StDType::C64 | StDType::F64 | StDType::I64 | StDType::U64 => 64,
        }
    }

    /// The tensorwire dtype, for the types tensorwire computes with (`None` for the
    /// packed float4/float6 types and the e8m0 scale type, which are read as raw bytes).
    pub fn dtype(self) -> Option<DType> {
        Some(match self {
            StDType::Bool => DType::Bool,
            StDType::U8 => DType::U8,
            StDType::I8 => DType::I8,
            StDType::F8E5M2 => DType::F8E5M2,
            StDType::F8E4M3 => DType::F8E4M3Fn,
            StDType::F8E4M3Fnuz => DType::F8E4M3Fnuz,
            StDType::F8E5M2Fnuz => DType::F8E5M2Fnuz,
            StDType::I16 => DType::I16,
            StDType::U16 => DType::U16,
            StDType::F16 => DType::F16,
            StDType::BF16 => DType::BF16,
            StDType::I32 => DType::I32,
            StDType::U32 => DType::U32,
            StDType::F32 => DType::F32,
            StDType::C64 => DType::Complex64,
            StDType::F64 => DType::F64,
            StDType::I64 => DType::I64,
            StDType::U64 => DType::U64,
            StDType::F4 | StDType::F6E2M3 | StDType::F6E3M2 | StDType::F8E8M0 => return None,
        })
    }

    /// The safetensors type of a tensorwire dtype (`None` where safetensors has none:
    /// complex128, the quantized types).
    pub fn from_dtype(dtype: DType) -> Option<StDType> {
        StDType::ALL.into_iter().find(|d| d.dtype() == Some(dtype))
    }

    /// The logical shape a tensor listed as this raw type's bytes records in
    /// `safetensors.shape` ([`StDType::raw_listing`]), when it describes exactly the
    /// tensor's `u8` bytes (a `.zt` file's copy of the attribute is its writer's
    /// word); `None` otherwise.
    pub fn fitting_recorded_shape(self, info: &TensorInfo) -> Option<Vec<u64>> {
        let dims = recorded_shape(info).ok()??;
        let fits = info.dtype == DType::U8
            && self.shape_byte_len(&dims) == Some(info.nbytes)
            && Shape::from_dims(&dims).is_ok(); // within the rank and element limits
        fits.then_some(dims)
    }

    /// Bytes of `numel` elements, or `None` when they do not fill whole bytes (or
    /// overflow).
    fn byte_len(self, numel: u64) -> Option<u64> {
        let bits = numel.checked_mul(self.bits())?;
        (bits % 8 == 0).then_some(bits / 8)
    }

    /// [`StDType::byte_len`] of a tensor of shape `dims`.
    fn shape_byte_len(self, dims: &[u64]) -> Option<u64> {
        let numel = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d))?;
        self.byte_len(numel)
    }

    /// How a tensor of this type is listed when tensorwire does not compute with it
    /// (`dtype()` is `None`): `u8` bytes of its byte length `nbytes`, layout
    /// `safetensors:<TYPE>`, and the attributes `safetensors.dtype` and
    /// `safetensors.shape` (the `logical` shape), under which [`write_source`] writes
    /// it back as this type.
    pub fn raw_listing(
        self,
        logical: &Shape,
        nbytes: u64,
    ) -> Result<(DType, Shape, Layout, BTreeMap<String, Value>)> {
        let dims = logical
            .dims()
            .iter()
            .map(|&d| Value::Int(d.into()))
            .collect();
        let attributes = BTreeMap::from([
            (
                "safetensors.dtype".to_owned(),
                Value::Str(self.name().to_owned()),
            ),
            ("safetensors.shape".to_owned(), Value::List(dims)),
        ]);
        let layout = Layout::Other(format!("safetensors:{}", self.name()));
        Ok((DType::U8, Shape::new(vec![nbytes])?, layout, attributes))
    }

    /// The safetensors type of a tensor as tensorwire lists it: its dtype, or for the
    /// raw-byte types the name in its layout. A PyTorch checkpoint's
    /// `torch.float8_e8m0fnu` and `torch.float4_e2m1fn_x2` tensors, listed as `u8`
    /// elements with the layouts `pytorch:<dtype>`, are `F8_E8M0` and `F4`.
    fn of_info(dtype: DType, layout: &Layout) -> Option<StDType> {
        match layout {
            Layout::Dense => StDType::from_dtype(dtype),
            Layout::Other(name) if dtype == DType::U8 => match name.as_str() {
                TORCH_E8M0_LAYOUT => Some(StDType::F8E8M0),
                TORCH_F4_X2_LAYOUT => Some(StDType::F4),
                _ => name
                    .strip_prefix("safetensors:")
                    .and_then(StDType::from_name)
                    .filter(|d| d.dtype().is_none()),
            },
            _ => None,
        }
    }
}

/// The shape the header records for `info`'s tensor of `dtype` (its layout
/// `layout`): a raw type's logical shape from its `safetensors.shape` attribute; a
/// torch float4 pair tensor's with its last dimension doubled, as F4 counts single
/// values; else the listed shape.
fn header_shape(info: &TensorInfo, layout: &Layout, dtype: StDType) -> Result<Vec<u64>> {
    if layout.name() == TORCH_F4_X2_LAYOUT {
        return float4_pairs_as_values(info.shape.dims())?.ok_or_else(|| {
            Error::unsupported(format!(
                "writing the 0-d torch.float4_e2m1fn_x2 tensor `{}` to safetensors, \
                 whose F4 tensors count single values",
                info.name
            ))
        });
    }
    match recorded_shape(info)? {
        Some(dims) if dtype.dtype().is_none() => Ok(dims),
        _ => Ok(info.shape.dims().to_vec()),
    }
}

/// The shape of a torch `float4_e2m1fn_x2` tensor of shape `pairs` (two values per
/// element, along the last dimension) counted in single values, as `F4` and `.zt`'s
/// `f4_e2m1` count them: the last dimension doubled. `None` for a 0-d tensor, which
/// has no dimension to double.
pub fn float4_pairs_as_values(pairs: &[u64]) -> Result<Option<Vec<u64>>> {
    let Some((&last, outer)) = pairs.split_last() else {
        return Ok(None);
    };
    let values = last.checked_mul(2).ok_or(Error::Overflow {
        what: "F4 tensor shape",
    })?;
    Ok(Some(outer.iter().copied().chain([values]).collect()))
}

/// The shape of torch's `float4_e2m1fn_x2` pairs holding F4 values of shape `values`
/// (the inverse of [`float4_pairs_as_values`]): the last dimension halved; `None`
/// when it is odd, or for a 0-d tensor (no pairs: such values are read as bytes).
pub fn float4_values_as_pairs(values: &[u64]) -> Option<Vec<u64>> {
    match values.split_last() {
        Some((&last, outer)) if last % 2 == 0 => {
            Some(outer.iter().copied().chain([last / 2]).collect())
        }
        _ => None,
    }
}

/// The logical shape in a raw-type tensor's `safetensors.shape` attribute (see
/// [`StDType::raw_listing`]), `None` when it has no such list; a list that is not
/// of dimensions is `InvalidArgument`.
pub fn recorded_shape(info: &TensorInfo) -> Result<Option<Vec<u64>>> {
    let Some(Value::List(dims)) = info.attributes.get("safetensors.shape") else {
        return Ok(None);
    };
    dims.iter()
        .map(|d| d.as_i64().and_then(|d| u64::try_from(d).ok()))
        .collect::<Option<Vec<u64>>>()
        .map(Some)
        .ok_or_else(|| Error::invalid(format!("tensor `{}`: bad safetensors.shape", info.name)))
}

/// The layouts a PyTorch checkpoint lists its `torch.float8_e8m0fnu` and
/// `torch.float4_e2m1fn_x2` tensors with (`tensorwire_pytorch::TorchOnlyDType`): one
/// `u8` per element, so that their shape is the safetensors one, but for F4's two
/// values per byte.
const TORCH_E8M0_LAYOUT: &str = "pytorch:float8_e8m0fnu";
const TORCH_F4_X2_LAYOUT: &str = "pytorch:float4_e2m1fn_x2";

/// A safetensors file, validated on open; tensors are zero-copy views of its map.
///
/// Tensors whose type tensorwire does not compute with (`F4`, `F6_E2M3`, `F6_E3M2`,
/// `F8_E8M0`) are listed as `u8` tensors of their byte length with the layout
/// `safetensors:<TYPE>` and the attributes `safetensors.dtype` and
/// `safetensors.shape`, so they can be read (and written back) as raw bytes.
pub struct SafetensorsReader {
    data: Bytes,
    header_len: u64,
    index: TensorIndex,
    /// Byte range of each tensor in `data`, by position in `index`.
    ranges: Vec<(u64, u64)>,
    /// `None` when the header has no `__metadata__` (an empty one is `Some`).
    metadata: Option<Metadata>,
    attributes: BTreeMap<String, Value>,
}

/// The `__metadata__` entries in header order.
type Metadata = Vec<(String, String)>;

/// One tensor entry of a header, before validation against the data region.
struct HeaderEntry {
    name: Arc<str>,
    dtype: StDType,
    shape: Shape,
    begin: u64,
    end: u64,
}

impl SafetensorsReader {
    /// Maps `path` copy-on-write and validates its header.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsReader> {
        SafetensorsReader::open_with(path, &Limits::default())
    }

    /// [`SafetensorsReader::open`] with explicit limits.
    pub fn open_with(path: impl AsRef<Path>, limits: &Limits) -> Result<SafetensorsReader> {
        crate::open_mapped(path.as_ref(), |bytes| {
            SafetensorsReader::from_bytes(bytes, limits)
        })
    }

    /// Reads a file image already in memory.
    pub fn from_bytes(bytes: Bytes, limits: &Limits) -> Result<SafetensorsReader> {
        let file_len = bytes.len() as u64;
        let head = bytes.get(..8).ok_or(Error::Truncated {
            offset: 0,
            needed: 8,
            available: file_len,
        })?;
        let header_len = u64::from_le_bytes(head.try_into().expect("8 bytes"));
        Error::check_limit(
            "safetensors header length",
            header_len,
            MAX_HEADER_BYTES.min(limits.max_metadata_bytes),
        )?;
        if header_len > file_len - 8 {
            return Err(Error::Truncated {
                offset: 8,
                needed: header_len,
                available: file_len - 8,
            });
        }
        let data_start = 8 + header_len;
        let header = &bytes[8..data_start as usize];
        let (entries, metadata) = parse_header(header, limits)?;
        let data = bytes.slice(data_start as usize..)?;
        // A name listed twice is refused by the index (`Duplicate`), before the ranges
        // are checked: its two entries would otherwise be reported as overlapping.
        let mut index = TensorIndex::with_capacity(entries.len());
        for entry in &entries {
            index.push(tensor_info(Arc::clone(&entry.name), entry, data_start)?)?;
        }
        let ranges = check_tiling(&entries, data.len() as u64, data_start)?;
        let attributes = metadata
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), Value::Str(v.clone())))
            .collect();
        Ok(SafetensorsReader {
            data,
            header_len,
            ranges,
            index,
            metadata,
            attributes,
        })
    }

    /// The `__metadata__` entries, in the order the header lists them.
    pub fn metadata(&self) -> &[(String, String)] {
        self.metadata.as_deref().unwrap_or_default()
    }

    /// True when the header has a `__metadata__` entry, even an empty one (the
    /// package writes `{}` for `metadata={}` and nothing for `metadata=None`).
    pub fn has_metadata(&self) -> bool {
        self.metadata.is_some()
    }

    /// Length of the JSON header in bytes (the data region starts at `8 + header_len`).
    pub fn header_len(&self) -> u64 {
        self.header_len
    }

    /// The stored bytes of a tensor of any type (zero-copy).
    pub fn raw(&self, name: &str) -> Result<Bytes> {
        let (begin, end) = self.ranges[self.position(name)?];
        self.data.slice(begin as usize..end as usize)
    }
}

impl TensorSource for SafetensorsReader {
    fn format(&self) -> &'static str {
        "safetensors"
    }

    fn tensors(&self) -> &[TensorInfo] {
        self.index.infos()
    }

    fn attributes(&self) -> &BTreeMap<String, Value> {
        &self.attributes
    }

    fn position(&self, name: &str) -> Result<usize> {
        self.index.position(name)
    }

    /// Always zero-copy: a slice of the map.
    fn view_at(&self, position: usize) -> Result<TensorView> {
        let info = self.index.checked_at(position)?;
        let (begin, end) = self.ranges[position];
        let bytes = self.data.slice(begin as usize..end as usize)?;
        TensorView::new(&info.name, info.dtype, info.shape.clone(), bytes, true)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn malformed(reason: impl Into<String>) -> Error {
    // Header errors point at the JSON's first byte.
    Error::malformed(8, reason)
}

/// Parses the JSON header into tensor entries (in header order) and metadata.
///
/// The header is read once with [`JsonReader`] straight into [`HeaderEntry`]s (no
/// JSON tree, names without escapes borrowed until the index keeps them). JSON
/// syntax errors and every semantic problem (a bad entry, a limit) are typed errors;
/// the first one found, in document order, is returned.
fn parse_header(header: &[u8], limits: &Limits) -> Result<(Vec<HeaderEntry>, Option<Metadata>)> {
    if header.first() != Some(&b'{') {
        return Err(malformed(
            "the header must be a JSON object starting with `{`",
        ));
    }
    let text = std::str::from_utf8(header).map_err(|e| {
        malformed(format!(
            "invalid JSON header: not UTF-8 at byte {}",
            e.valid_up_to()
        ))
    })?;
    let syntax = |e: JsonError| malformed(format!("invalid JSON header: {e}"));
    let mut json = JsonReader::new(text);
    json.expect(b'{', "expected `{`").map_err(syntax)?;
    let mut entries = Vec::new();
    let mut metadata = None;
    let mut seen_metadata = false;
    let mut first = true;
    while json.more(b'}', first).map_err(syntax)? {
        first = false;
        let name = json.string().map_err(syntax)?;
        json.expect(b':', "expected `:`").map_err(syntax)?;
        if name == METADATA_KEY {
            if seen_metadata {
                return Err(malformed("`__metadata__` appears twice"));
            }
            seen_metadata = true;
            json.ws();
            if json.peek() == Some(b'n') {
                // `null`, which the safetensors package reads as no metadata.
                json.skip_value(0).map_err(syntax)?;
            } else {
                metadata = Some(parse_metadata(&mut json)?);
            }
            continue;
        }
        Error::check_limit("tensor count", entries.len() as u64 + 1, limits.max_tensors)?;
        Error::check_limit(
            "tensor name length",
            name.len() as u64,
            limits.max_name_bytes as u64,
        )?;
        entries.push(parse_entry(&mut json, Arc::from(name.as_ref()), limits)?);
    }
    json.end().map_err(syntax)?;
    Ok((entries, metadata))
}

/// `__metadata__`: an object of strings, in order.
fn parse_metadata(json: &mut JsonReader<'_>) -> Result<Metadata> {
    let syntax = |e: JsonError| malformed(format!("invalid JSON header: {e}"));
    json.ws();
    if json.peek() != Some(b'{') {
        return Err(malformed("`__metadata__` must be an object of strings"));
    }
    json.expect(b'{', "expected `{`").map_err(syntax)?;
    let mut out = Vec::new();
    let mut first = true;
    while json.more(b'}', first).map_err(syntax)? {
        first = false;
        let key = json.string().map_err(syntax)?.into_owned();
        json.expect(b':', "expected `:`").map_err(syntax)?;
        json.ws();
        if json.peek() != Some(b'"') {
            return Err(malformed(format!(
                "`__metadata__` value of `{key}` must be a string"
            )));
        }
        let value = json.string().map_err(syntax)?.into_owned();
        out.push((key, value));
    }
    Ok(out)
}

/// One tensor entry: `{"dtype": str, "shape": [u64], "data_offsets": [u64, u64]}`
/// (other keys are skipped, as the package ignores them).
fn parse_entry(json: &mut JsonReader<'_>, name: Arc<str>, limits: &Limits) -> Result<HeaderEntry> {
    let syntax = |e: JsonError| malformed(format!("invalid JSON header: {e}"));
    let bad = |what: &str| malformed(format!("tensor `{name}`: {what}"));
    json.ws();
    if json.peek() != Some(b'{') {
        return Err(bad("entry must be an object"));
    }
    json.expect(b'{', "expected `{`").map_err(syntax)?;
    let (mut dtype, mut shape, mut offsets) = (None, None, None);
    let mut first = true;
    while json.more(b'}', first).map_err(syntax)? {
        first = false;
        let key = json.string().map_err(syntax)?;
        json.expect(b':', "expected `:`").map_err(syntax)?;
        json.ws();
        match key.as_ref() {
            "dtype" if dtype.is_none() => {
                if json.peek() != Some(b'"') {
                    return Err(bad("missing string `dtype`"));
                }
                let text = json.string().map_err(syntax)?;
                let Some(d) = StDType::from_name(&text) else {
                    return Err(Error::UnknownDType {
                        name: text.into_owned(),
                    });
                };
                dtype = Some(d);
            }
            "shape" if shape.is_none() => {
                let max_ndim = limits.max_ndim.min(MAX_NDIM);
                let mut dims = [0u64; MAX_NDIM];
                let n = parse_u64s(json, &mut dims[..max_ndim])
                    .map_err(syntax)?
                    .ok_or_else(|| bad("shape entries must be non-negative integers"))?;
                if n > max_ndim {
                    return Err(Error::LimitExceeded {
                        what: "tensor rank",
                        limit: max_ndim as u64,
                        found: n as u64,
                    });
                }
                shape = Some(Shape::from_dims(&dims[..n])?);
            }
            "data_offsets" if offsets.is_none() => {
                let mut pair = [0u64; 2];
                match parse_u64s(json, &mut pair).map_err(syntax)? {
                    Some(2) => offsets = Some((pair[0], pair[1])),
                    _ => {
                        return Err(bad(
                            "`data_offsets` must be [begin, end] of non-negative integers",
                        ))
                    }
                }
            }
            "dtype" | "shape" | "data_offsets" => {
                return Err(bad(&format!("`{key}` appears twice")))
            }
            _ => json.skip_value(2).map_err(syntax)?,
        }
    }
    let dtype = dtype.ok_or_else(|| bad("missing string `dtype`"))?;
    let shape = shape.ok_or_else(|| bad("missing array `shape`"))?;
    let (begin, end) = offsets.ok_or_else(|| bad("`data_offsets` must be [begin, end]"))?;
    if end < begin {
        return Err(bad("`data_offsets` end is before begin"));
    }
    Ok(HeaderEntry {
        name,
        dtype,
        shape,
        begin,
        end,
    })
}

/// A JSON array of non-negative integers, stored into `out` (the first `out.len()`
/// of them; the rest are only counted): `Ok(Some(count))`, or `Ok(None)` as soon as
/// the value turns out to be anything else (not an array, or an element that is not
/// such an integer).
fn parse_u64s(
    json: &mut JsonReader<'_>,
    out: &mut [u64],
) -> std::result::Result<Option<usize>, JsonError> {
    if !json.eat(b'[') {
        return Ok(None);
    }
    let mut count = 0;
    let mut first = true;
    while json.more(b']', first)? {
        first = false;
        json.ws();
        if !matches!(json.peek(), Some(b'-' | b'0'..=b'9')) {
            return Ok(None);
        }
        let Number::U64(v) = json.number()? else {
            return Ok(None);
        };
        if let Some(slot) = out.get_mut(count) {
            *slot = v;
        }
        count += 1;
    }
    Ok(Some(count))
}

/// Checks that the entries' ranges tile `0..data_len` exactly, each `shape × dtype`
/// long, and returns each entry's range (in entry order).
fn check_tiling(
    entries: &[HeaderEntry],
    data_len: u64,
    data_start: u64,
) -> Result<Vec<(u64, u64)>> {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by_key(|&i| (entries[i].begin, entries[i].end));
    let mut covered = 0u64;
    let mut previous: Option<&str> = None;
    for &i in &order {
        let e = &entries[i];
        let expected = e.dtype.byte_len(e.shape.numel()?).ok_or_else(|| {
            malformed(format!(
                "tensor `{}`: {} × {} bits is not a whole number of bytes",
                e.name,
                e.shape,
                e.dtype.bits()
            ))
        })?;
        if e.end - e.begin != expected {
            return Err(Error::SizeMismatch {
                tensor: e.name.to_string(),
                expected,
                found: e.end - e.begin,
            });
        }
        if e.begin < covered {
            return Err(Error::Overlap {
                tensor: e.name.to_string(),
                other: previous.unwrap_or_default().to_owned(),
                offset: data_start + e.begin,
            });
        }
        if e.begin > covered {
            return Err(Error::malformed(
                data_start + covered,
                format!(
                    "gap of {} bytes in the data region before tensor `{}`",
                    e.begin - covered,
                    e.name
                ),
            ));
        }
        if e.end > data_len {
            return Err(Error::OutOfBounds {
                tensor: e.name.to_string(),
                offset: e.begin,
                length: e.end - e.begin,
                limit: data_len,
            });
        }
        covered = e.end;
        previous = Some(&e.name);
    }
    if covered != data_len {
        return Err(Error::malformed(
            data_start + covered,
            format!(
                "{} bytes at the end of the data region belong to no tensor",
                data_len - covered
            ),
        ));
    }
    Ok(entries.iter().map(|e| (e.begin, e.end)).collect())
}

fn tensor_info(name: Arc<str>, entry: &HeaderEntry, data_start: u64) -> Result<TensorInfo> {
    let nbytes = entry.end - entry.begin;
    let (dtype, shape, layout, attributes) = match entry.dtype.dtype() {
        Some(dtype) => (dtype, entry.shape.clone(), Layout::Dense, BTreeMap::new()),
        None => entry.dtype.raw_listing(&entry.shape, nbytes)?,
    };
    Ok(TensorInfo {
        name,
        dtype,
        shape,
        layout,
        nbytes,
        stored_bytes: nbytes,
        // Unchecked ranges reach here (duplicates are found before tiling is checked).
        offset: data_start.checked_add(entry.begin).ok_or(Error::Overflow {
            what: "safetensors data offset",
        })?,
        encoding: None,
        attributes: attributes.into(),
    })
}

/// True when `head` (a file's first 10 bytes or more) looks like a safetensors file:
/// a header length followed by the JSON object's `{`. A length under 4 GiB that is
/// implausible (0, 1, or over the header limit) still counts, so that the reader
/// names what is wrong (`Truncated`, `LimitExceeded`) rather than calling the format
/// unrecognised; larger "lengths" are text or another format's magic.
pub fn sniff(head: &[u8]) -> bool {
    match (head.get(..8), head.get(8)) {
        (Some(len), Some(b'{')) => {
            let n = u64::from_le_bytes(len.try_into().expect("8 bytes"));
            n < 1 << 32
        }
        _ => false,
    }
}

/// One tensor to write: its safetensors type, shape and bytes.
struct WriteEntry {
    name: String,
    dtype: StDType,
    shape: Vec<u64>,
    nbytes: u64,
}

/// The header and tensor order `save_file` would produce for a set of tensors.
struct Plan {
    header: Vec<u8>,
    /// Indices of the entries in data order.
    order: Vec<usize>,
}

fn plan(entries: &[WriteEntry], metadata: Option<&BTreeMap<String, String>>) -> Result<Plan> {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    // Widest dtype rank first, then by name: the package's order.
    order.sort_by(|&a, &b| {
        let (a, b) = (&entries[a], &entries[b]);
        b.dtype.cmp(&a.dtype).then_with(|| a.name.cmp(&b.name))
    });
    let mut json = String::from("{");
    let mut first = true;
    let mut sep = |json: &mut String| {
        if !first {
            json.push(',');
        }
        first = false;
    };
    if let Some(meta) = metadata {
        sep(&mut json);
        json.push_str(&quoted(METADATA_KEY));
        json.push_str(":{");
        for (i, (k, v)) in meta.iter().enumerate() {
            if i > 0 {
                json.push(',');
            }
            json.push_str(&quoted(k));
            json.push(':');
            json.push_str(&quoted(v));
        }
        json.push('}');
    }
    let mut offset = 0u64;
    for &i in &order {
        let e = &entries[i];
        if e.name == METADATA_KEY {
            return Err(reserved_name());
        }
        sep(&mut json);
        let end = offset.checked_add(e.nbytes).ok_or(Error::Overflow {
            what: "safetensors data size",
        })?;
        let dims: Vec<String> = e.shape.iter().map(u64::to_string).collect();
        json.push_str(&format!(
            "{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{offset},{end}]}}",
            quoted(&e.name),
            e.dtype.name(),
            dims.join(",")
        ));
        offset = end;
    }
    json.push('}');
    let mut header = json.into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    Ok(Plan { header, order })
}

/// The error for a tensor named `__metadata__`: its header entry would take the place
/// of the file's metadata map, making a file no reader accepts.
fn reserved_name() -> Error {
    Error::invalid(format!(
        "a tensor named `{METADATA_KEY}`: safetensors reserves the name for the \
         header's metadata (rename the tensor)"
    ))
}

/// A JSON string literal, escaped as serde_json (and so the package) escapes it.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).expect("strings always serialize")
}

/// Collects tensors and writes them as one safetensors file, byte-identical to the
/// `safetensors` package's `save_file` for the same tensors (and, when there is at
/// most one metadata entry, the same metadata; the package writes several metadata
/// entries in hash order, we write them sorted).
///
/// ```
/// use tensorwire_core::{Bytes, DType, Shape};
/// use tensorwire_formats::safetensors::SafetensorsWriter;
/// # fn main() -> tensorwire_core::Result<()> {
/// let mut w = SafetensorsWriter::new();
/// w.add("bias", DType::F32, &Shape::new(vec![2])?, Bytes::from_vec(vec![0; 8]))?;
/// let mut file = Vec::new();
/// w.write(&mut file)?;
/// assert_eq!(&file[8..9], b"{");
/// # Ok(()) }
/// ```
#[derive(Default)]
pub struct SafetensorsWriter {
    entries: Vec<WriteEntry>,
    data: Vec<Bytes>,
    names: NameSet<String>,
    metadata: Option<BTreeMap<String, String>>,
}

impl SafetensorsWriter {
    /// An empty writer.
    pub fn new() -> SafetensorsWriter {
        SafetensorsWriter::default()
    }

    /// Sets the `__metadata__` map (written even when empty, as the package does for
    /// `metadata={}`).
    pub fn set_metadata(&mut self, metadata: BTreeMap<String, String>) {
        self.metadata = Some(metadata);
    }

    /// Adds a tensor of a tensorwire dtype; `bytes` (row-major, little-endian) is kept
    /// by reference until [`SafetensorsWriter::write`].
    pub fn add(&mut self, name: &str, dtype: DType, shape: &Shape, bytes: Bytes) -> Result<()> {
        let st = StDType::from_dtype(dtype).ok_or_else(|| {
            Error::unsupported(format!("safetensors has no {dtype} type (tensor `{name}`)"))
        })?;
        self.add_typed(name, st, shape.dims(), bytes)
    }

    /// Adds a tensor given its safetensors type (for the packed types tensorwire reads
    /// as raw bytes), checking `bytes` holds exactly `shape × dtype`.
    pub fn add_typed(
        &mut self,
        name: &str,
        dtype: StDType,
        shape: &[u64],
        bytes: Bytes,
    ) -> Result<()> {
        if name == METADATA_KEY {
            return Err(reserved_name());
        }
        Shape::from_dims(shape)?; // the rank limit
        let expected = dtype.shape_byte_len(shape).ok_or_else(|| {
            Error::invalid(format!(
                "tensor `{name}`: shape is not a whole number of bytes"
            ))
        })?;
        if expected != bytes.len() as u64 {
            return Err(Error::SizeMismatch {
                tensor: name.to_owned(),
                expected,
                found: bytes.len() as u64,
            });
        }
        if !self.names.insert(name.to_owned()) {
            return Err(Error::Duplicate {
                name: name.to_owned(),
            });
        }
        self.entries.push(WriteEntry {
            name: name.to_owned(),
            dtype,
            shape: shape.to_vec(),
            nbytes: expected,
        });
        self.data.push(bytes);
        Ok(())
    }

    /// Number of tensors added.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no tensor was added.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Writes the file at `path`: under a temporary name in the same directory,
    /// renamed into place once complete (so a failed write never leaves a torn file).
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<u64> {
        write_atomically(path.as_ref(), &mut |out| self.write(out))
    }

    /// Writes the file to `out`, returning the bytes written.
    pub fn write(&self, out: &mut dyn Write) -> Result<u64> {
        let plan = plan(&self.entries, self.metadata.as_ref())?;
        write_header(out, &plan.header)?;
        let mut written = 8 + plan.header.len() as u64;
        for &i in &plan.order {
            out.write_all(&self.data[i])?;
            written += self.data[i].len() as u64;
        }
        out.flush()?;
        Ok(written)
    }
}

/// Runs `write` on a buffered temporary file next to `path`, then renames it to
/// `path`; on failure the temporary file is removed. Errors of the output (creating,
/// writing, syncing or renaming it) name `path`; others (a source's damaged tensor, a
/// refused name, a cancel) are returned as they are, so they do not name the wrong file.
fn write_atomically(
    path: &Path,
    write: &mut dyn FnMut(&mut dyn Write) -> Result<u64>,
) -> Result<u64> {
    let of_output = |e: Error| e.with_path(path);
    let destination = tensorwire_core::write_destination(path).map_err(of_output)?;
    let (file, tmp) = tensorwire_core::create_temporary(&destination).map_err(of_output)?;
    let mut out = OutputErrors {
        inner: std::io::BufWriter::with_capacity(1 << 20, file),
        failed: false,
    };
    let result = match write(&mut out) {
        Ok(written) => (|| {
            let file = out.inner.into_inner().map_err(|e| e.into_error())?;
            // On disk before it takes the name, as `.zt` output is.
            file.sync_all()?;
            tensorwire_core::replace_with_temporary(&tmp, &destination)?;
            Ok(written)
        })()
        .map_err(of_output),
        Err(e) => {
            let failed = out.failed;
            drop(out);
            Err(if failed { of_output(e) } else { e })
        }
    };
    if result.is_err() {
        tensorwire_core::remove_temporary(&tmp);
    }
    result
}

/// The output of [`write_atomically`], noting whether writing to it failed (so that
/// only the output's own errors are given its path).
struct OutputErrors<W: Write> {
    inner: W,
    failed: bool,
}

impl<W: Write> Write for OutputErrors<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let result = self.inner.write(buf);
        self.note(&result);
        result
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let result = self.inner.flush();
        self.note(&result);
        result
    }
}

impl<W: Write> OutputErrors<W> {
    fn note<T>(&mut self, result: &std::io::Result<T>) {
        if result
            .as_ref()
            .is_err_and(|e| e.kind() != std::io::ErrorKind::Interrupted)
        {
            self.failed = true;
        }
    }
}

/// [`write_source`] into a new file at `path` (written under a temporary name and
/// renamed into place once complete).
pub fn save_source(
    source: &dyn TensorSource,
    path: impl AsRef<Path>,
    progress: &mut dyn FnMut(usize, usize, u64) -> Result<()>,
) -> Result<u64> {
    write_atomically(path.as_ref(), &mut |out| {
        write_source(source, out, progress)
    })
}

fn write_header(out: &mut dyn Write, header: &[u8]) -> Result<()> {
    out.write_all(&(header.len() as u64).to_le_bytes())?;
    out.write_all(header)?;
    Ok(())
}

/// True for a tensor attribute that describes how its source file holds the bytes
/// (`tensorwire.layout`, `safetensors.dtype`/`shape`, `gguf.type`,
/// `npy.fortran_order`), which a written file records in its own way.
fn is_source_layout_attribute(key: &str) -> bool {
    ["tensorwire.", "safetensors.", "gguf.", "npy."]
        .iter()
        .any(|prefix| key.starts_with(prefix))
}

/// Writes every tensor of `source` as a safetensors file, reading each tensor only
/// when its turn comes (so a compressed source is never decoded all at once).
///
/// Dense tensors of a dtype safetensors has and the raw-byte types a
/// [`SafetensorsReader`] lists (`safetensors:F4`, …) are written; anything else fails
/// with [`Error::Unsupported`] before a byte is written. String attributes of the
/// source become `__metadata__` (others are rendered with their display form), and
/// so do the tensors' own attributes, which safetensors has no place for (a quantized
/// tensor's `torch.q_scale` …, a sparse tensor's layout and size on each part, a
/// `.zt` tensor's attributes), as `<tensor>.torch.q_scale` and so on; those that
/// describe the source's layout of the bytes stay behind. `progress` is called
/// with (tensors done, total, bytes done): after each tensor, and within a large one
/// every [`tensorwire_core::progress::PROGRESS_CHUNK`] bytes; an error it returns
/// stops the write.
pub fn write_source(
    source: &dyn TensorSource,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(usize, usize, u64) -> Result<()>,
) -> Result<u64> {
    let mut entries = Vec::with_capacity(source.tensors().len());
    for info in source.tensors() {
        // A `.zt` tensor converted from safetensors' raw types keeps its layout in an
        // attribute: it goes back under its own type (one from GGUF is refused).
        let layout = info.source_layout();
        let dtype = StDType::of_info(info.dtype, &layout).ok_or_else(|| {
            Error::unsupported(format!(
                "writing {layout} {} tensor `{}` to safetensors",
                info.dtype, info.name
            ))
        })?;
        let shape = header_shape(info, &layout, dtype)?;
        // The shape comes from the source's attributes for a raw type (a `.zt` file's
        // own, so anything): it must describe the tensor's bytes, or the header would
        // promise what the data does not hold (a file no reader accepts).
        let needed = dtype.shape_byte_len(&shape);
        if needed != Some(info.nbytes) {
            return Err(Error::invalid(format!(
                "tensor `{}`: {} {shape:?} does not describe its {} bytes{}",
                info.name,
                dtype.name(),
                info.nbytes,
                needed.map_or_else(
                    || " (not a whole number of bytes)".to_owned(),
                    |n| format!(" ({n} bytes)")
                )
            )));
        }
        entries.push(WriteEntry {
            name: info.name.to_string(),
            dtype,
            shape,
            nbytes: info.nbytes,
        });
    }
    let text = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
    let mut metadata: BTreeMap<String, String> = source
        .attributes()
        .iter()
        .map(|(k, v)| (k.clone(), text(v)))
        .collect();
    // safetensors has no per-tensor metadata: a tensor's attributes (a PyTorch
    // tensor's `torch.` ones: a quantized tensor's scheme and parameters, a sparse
    // tensor's layout and size on each of its parts; a `.zt` tensor's own) go to
    // `__metadata__` under `<tensor>.<attribute>`. Those that only say how the source
    // holds the bytes stay behind: the new file says that itself.
    for info in source.tensors() {
        for (k, v) in info
            .attributes
            .iter()
            .filter(|(k, _)| !is_source_layout_attribute(k))
        {
            let key = format!("{}.{k}", info.name);
            if metadata.insert(key.clone(), text(v)).is_some() {
                return Err(Error::unsupported(format!(
                    "writing the attributes of tensor `{}` to safetensors: the metadata \
                     key `{key}` is taken",
                    info.name
                )));
            }
        }
    }
    // An empty `__metadata__` of a safetensors source is kept, so rewriting a file
    // gives its bytes back.
    let keep_empty = source
        .as_any()
        .downcast_ref::<SafetensorsReader>()
        .is_some_and(SafetensorsReader::has_metadata);
    let plan = plan(
        &entries,
        (keep_empty || !metadata.is_empty()).then_some(&metadata),
    )?;
    write_header(out, &plan.header)?;
    let mut written = 8 + plan.header.len() as u64;
    let total = plan.order.len();
    let mut data_done = 0u64;
    // A safetensors source hands out its raw types' bytes with `raw`, whatever view
    // they have.
    let same_format = source.as_any().downcast_ref::<SafetensorsReader>();
    for (done, &i) in plan.order.iter().enumerate() {
        let info = &source.tensors()[i];
        let bytes = match same_format {
            Some(st) => st.raw(&info.name)?,
            None => {
                // Every byte is copied: the record's CRC-32 first (NPZ, `.pt`).
                source.check_record_at(i)?;
                source.view_at(i)?.bytes
            }
        };
        if bytes.len() as u64 != entries[i].nbytes {
            return Err(Error::SizeMismatch {
                tensor: info.name.to_string(),
                expected: entries[i].nbytes,
                found: bytes.len() as u64,
            });
        }
        // Reports within a large tensor; its end is reported once, as done.
        let mut within = within_tensor(progress, (done, total), data_done, bytes.len() as u64);
        write_in_chunks(&bytes, &mut within, |chunk| Ok(out.write_all(chunk)?))?;
        drop(within); // gives `progress` back
        written += bytes.len() as u64;
        data_done += bytes.len() as u64;
        progress(done + 1, total, data_done)?;
    }
    out.flush()?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[u8]) -> Bytes {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        Bytes::from_vec(v)
    }

    fn open(header: &str, data: &[u8]) -> Result<SafetensorsReader> {
        SafetensorsReader::from_bytes(file(header, data), &Limits::default())
    }

    #[test]
    fn reads_what_it_writes() {
        let mut w = SafetensorsWriter::new();
        let f32s: Vec<u8> = [1.0f32, 2.0, 3.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        w.add(
            "w",
            DType::F32,
            &Shape::new(vec![3]).unwrap(),
            Bytes::from_vec(f32s.clone()),
        )
        .unwrap();
        w.add(
            "a",
            DType::I8,
            &Shape::new(vec![2]).unwrap(),
            Bytes::from_vec(vec![1, 2]),
        )
        .unwrap();
        w.add_typed("p", StDType::F4, &[3, 2], Bytes::from_vec(vec![7, 8, 9]))
            .unwrap();
        w.set_metadata(BTreeMap::from([("format".into(), "pt".into())]));
        let mut out = Vec::new();
        w.write(&mut out).unwrap();
        let r = SafetensorsReader::from_bytes(Bytes::from_vec(out), &Limits::default()).unwrap();
        assert_eq!(&*r.view("w").unwrap().bytes, &f32s[..]);
        assert_eq!(&*r.view("a").unwrap().bytes, &[1, 2]);
        let p = r.info("p").unwrap();
        assert_eq!((p.dtype, p.shape.dims()), (DType::U8, &[3u64][..]));
        assert_eq!(p.layout, Layout::Other("safetensors:F4".into()));
        assert_eq!(r.metadata(), &[("format".to_owned(), "pt".to_owned())]);
        assert_eq!((8 + r.header_len()) % 8, 0);
    }

    #[test]
    fn ranges_must_tile_the_data() {
        let t = |o: &str| format!(r#"{{"a":{{"dtype":"U8","shape":[2],"data_offsets":{o}}}}}"#);
        assert!(open(&t("[0,2]"), &[1, 2]).is_ok());
        assert!(matches!(
            open(&t("[0,2]"), &[1, 2, 3]),
            Err(Error::Malformed { .. })
        ));
        assert!(matches!(
            open(&t("[1,3]"), &[1, 2, 3]),
            Err(Error::Malformed { .. })
        ));
        assert!(matches!(
            open(&t("[0,3]"), &[1, 2, 3]),
            Err(Error::SizeMismatch { .. })
        ));
        assert!(matches!(
            open(&t("[0,2]"), &[1]),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            open(&t("[2,0]"), &[1, 2]),
            Err(Error::Malformed { .. })
        ));
        let two = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#;
        assert!(matches!(open(two, &[1, 2, 3]), Err(Error::Overlap { .. })));
    }

    #[test]
    fn bad_headers_are_typed_errors() {
        assert!(matches!(open("[]", &[]), Err(Error::Malformed { .. })));
        assert!(matches!(open("{\"a\":", &[]), Err(Error::Malformed { .. })));
        let bad_dtype = r#"{"a":{"dtype":"F128","shape":[],"data_offsets":[0,16]}}"#;
        assert!(matches!(
            open(bad_dtype, &[0; 16]),
            Err(Error::UnknownDType { .. })
        ));
        let bad_meta = r#"{"__metadata__":{"a":1}}"#;
        assert!(matches!(open(bad_meta, &[]), Err(Error::Malformed { .. })));
        let neg = r#"{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}"#;
        assert!(matches!(open(neg, &[]), Err(Error::Malformed { .. })));
        let mut huge = u64::MAX.to_le_bytes().to_vec();
        huge.push(b'{');
        assert!(matches!(
            SafetensorsReader::from_bytes(Bytes::from_vec(huge), &Limits::default()),
            Err(Error::LimitExceeded { .. })
        ));
        let mut short = 100u64.to_le_bytes().to_vec();
        short.extend_from_slice(b"{}");
        assert!(matches!(
            SafetensorsReader::from_bytes(Bytes::from_vec(short), &Limits::default()),
            Err(Error::Truncated { .. })
        ));
        let deep = format!("{}{}", "[".repeat(1000), "]".repeat(1000));
        let deep = format!(r#"{{"__metadata__":{deep}}}"#);
        assert!(matches!(open(&deep, &[]), Err(Error::Malformed { .. })));

        let message = |h: &str, data: &[u8]| open(h, data).err().map(|e| e.to_string()).unwrap();
        let dup = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
        assert!(matches!(open(dup, &[1, 2]), Err(Error::Duplicate { .. })));
        // Listed twice over the same bytes: still a duplicate, not an overlap.
        let same = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
        assert!(matches!(open(same, &[1]), Err(Error::Duplicate { .. })));
        // Offsets at the top of the range: an error, not an overflow.
        let top = format!(
            r#"{{"a":{{"dtype":"U8","shape":[0],"data_offsets":[{m},{m}]}}}}"#,
            m = u64::MAX
        );
        assert!(open(&top, &[]).is_err());
        let twice = r#"{"a":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}}"#;
        assert!(message(twice, &[1]).contains("`dtype` appears twice"));
        let not_object = r#"{"a":[1,2]}"#;
        assert!(message(not_object, &[]).contains("tensor `a`: entry must be an object"));
        let no_shape = r#"{"a":{"dtype":"U8","data_offsets":[0,1]}}"#;
        assert!(message(no_shape, &[1]).contains("missing array `shape`"));
        let three = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}"#;
        assert!(message(three, &[1]).contains("`data_offsets` must be [begin, end]"));
        assert!(message(r#"{"__metadata__":{"k":1}}"#, &[]).contains("value of `k`"));
        assert!(message(r#"{"__metadata__":[]}"#, &[]).contains("object of strings"));
        assert!(message(r#"{"__metadata__":nul}"#, &[]).contains("invalid JSON header"));
        let null_twice = r#"{"__metadata__":null,"__metadata__":{}}"#;
        assert!(message(null_twice, &[]).contains("appears twice"));
        // `null` is no metadata, as the safetensors package reads it.
        let null = open(
            r#"{"__metadata__":null,"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
            &[7],
        )
        .unwrap();
        assert!(!null.has_metadata() && null.tensors().len() == 1);
        assert!(message(
            r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}} x"#,
            &[1]
        )
        .contains("invalid JSON header"));
    }

    #[test]
    fn escaped_names_and_unknown_fields() {
        let h = r#"{"a\"b\u00e9":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"extra":{"x":[1]}},"__metadata__":{"k":"v\n"}}"#;
        let r = open(h, &[5, 6]).unwrap();
        assert_eq!(&*r.view("a\"b\u{e9}").unwrap().bytes, &[5, 6]);
        assert_eq!(r.metadata(), &[("k".to_owned(), "v\n".to_owned())]);
    }

    #[test]
    fn writer_refuses_what_safetensors_cannot_hold() {
        let mut w = SafetensorsWriter::new();
        let s = Shape::new(vec![1]).unwrap();
        assert!(w
            .add("c", DType::Complex128, &s, Bytes::from_vec(vec![0; 16]))
            .is_err());
        assert!(w
            .add("x", DType::F32, &s, Bytes::from_vec(vec![0; 3]))
            .is_err());
        w.add("x", DType::F32, &s, Bytes::from_vec(vec![0; 4]))
            .unwrap();
        assert!(matches!(
            w.add("x", DType::F32, &s, Bytes::from_vec(vec![0; 4])),
            Err(Error::Duplicate { .. })
        ));
        assert!(w
            .add(METADATA_KEY, DType::F32, &s, Bytes::from_vec(vec![0; 4]))
            .is_err());
        assert!(w
            .add_typed("f6", StDType::F6E2M3, &[3], Bytes::from_vec(vec![0; 3]))
            .is_err());
    }

    #[test]
    fn a_tensor_named_metadata_is_refused_whatever_adds_it() {
        let entry = |name: &str| WriteEntry {
            name: name.to_owned(),
            dtype: StDType::F32,
            shape: vec![1],
            nbytes: 4,
        };
        // `write_source` (convert) plans the names a source has, unchecked until here.
        let err = plan(&[entry("a"), entry(METADATA_KEY)], None)
            .err()
            .expect("refused");
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
        assert!(err.to_string().contains("`__metadata__`"), "{err}");
        let mut w = SafetensorsWriter::new();
        let s = Shape::new(vec![1]).unwrap();
        let err = w
            .add(METADATA_KEY, DType::F32, &s, Bytes::from_vec(vec![0; 4]))
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    }

    #[test]
    fn sniffs_the_header() {
        assert!(sniff(&file("{}", &[])));
        assert!(!sniff(b"GGUF\x03\x00\x00\x00{"));
        assert!(!sniff(b"\x02\0\0\0\0\0\0\0["));
        assert!(!sniff(b"{\"meta\":{\"a\": 1}}"), "JSON text");
        // Implausible lengths are still safetensors, so the reader can say why.
        assert!(sniff(b"\0\0\0\0\0\0\0\0{}"));
        let huge = (MAX_HEADER_BYTES + 1).to_le_bytes();
        assert!(sniff(&[&huge[..], b"{}"].concat()));
        let err = SafetensorsReader::from_bytes(
            Bytes::from_vec([&huge[..], b"{}"].concat()),
            &Limits::default(),
        )
        .err()
        .expect("refused");
        assert!(matches!(err, Error::LimitExceeded { .. }), "{err}");
    }
}
