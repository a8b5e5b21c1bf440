//! GGUF v2/v3 (the llama.cpp / ggml model format): read, zero-copy.
//!
//! # Layout
//!
//! Everything is little-endian (GGUF v3 allows big-endian files; we refuse them).
//! Strings are `u64` byte length | UTF-8 bytes (no terminator).
//! Keys and tensor names must be UTF-8; a string *value* that is not reads as bytes,
//! as llama.cpp and gguf-py keep such values.
//!
//! ```text
//! "GGUF" | version u32 (2 or 3) | tensor_count u64 | kv_count u64
//! kv_count × { key: string | value_type u32 | value }
//! tensor_count × { name: string | n_dims u32 | ne: n_dims × u64 | ggml_type u32 | offset u64 }
//! zero padding to a multiple of the alignment
//! data section: each tensor's bytes at data_start + offset
//! ```
//!
//! Value types: 0 `UINT8`, 1 `INT8`, 2 `UINT16`, 3 `INT16`, 4 `UINT32`, 5 `INT32`,
//! 6 `FLOAT32`, 7 `BOOL` (one byte, 0 or 1), 8 `STRING`, 9 `ARRAY` (`item_type u32 |
//! count u64 | count × item`, items encoded without their own type tag; an item may
//! itself be an array), 10 `UINT64`, 11 `INT64`, 12 `FLOAT64`.
//!
//! The alignment is the `general.alignment` key (a `UINT32`, a non-zero power of two)
//! or 32. `data_start` is the end of the tensor infos rounded up to it, and every
//! tensor's `offset` (relative to `data_start`) must be a multiple of it.
//!
//! A tensor's dims `ne` are innermost first: `ne[0]` is the row length, so the numpy
//! (row-major) shape is `ne` reversed. Its bytes are `ne[0] / block_size × type_size`
//! per row (see [`GgmlType`]); `ne[0]` must be a multiple of the block size.
//!
//! # Mapping to tensorwire
//!
//! [`GgufReader`] validates the whole header on open and implements
//! [`TensorSource`]. Key-value metadata become attributes (integers → `Int`, floats →
//! `Float`, `BOOL` → `Bool`, strings → `Str`, or `Bytes` when not UTF-8, arrays →
//! `List`). Plain types (`F32`,
//! `F16`, `BF16`, `F64`, `I8`, `I16`, `I32`, `I64`) are dense tensors of the logical
//! shape. Block (quantized) types are exposed as their raw blocks, as gguf-py's
//! `GGUFReader` does: dtype `U8`, shape = logical shape with the last dimension
//! replaced by the bytes per row, layout `Other("gguf:Q4_K")`, and the attributes
//! `gguf.type` (`"Q4_K"`) and `gguf.shape` (the logical shape). Every tensor gets
//! `gguf.type`. Views are zero-copy slices of the input.
//!
//! Not in scope: dequantizing, writing GGUF, big-endian files, GGUF v1.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use tensorwire_core::{
    align_up, Attributes, Bytes, DType, Error, Layout, Limits, NameSet, Result, Shape, TensorIndex,
    TensorInfo, TensorSource, TensorView, Value,
};

/// The four bytes every GGUF file starts with.
pub const MAGIC: &[u8; 4] = b"GGUF";

/// Data alignment when the file has no `general.alignment` key.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The metadata key that sets the data alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// True when `head` (the first bytes of a file) starts with the GGUF magic.
pub fn sniff(head: &[u8]) -> bool {
    head.starts_with(MAGIC)
}

macro_rules! ggml_types {
    ($( $(#[$doc:meta])* $variant:ident = $id:literal, $block:literal, $size:expr; )*) => {
        /// A ggml tensor type: the element type of a plain tensor or the block
        /// encoding of a quantized one. Ids, block sizes and type sizes are those of
        /// gguf-py's `GGMLQuantizationType` and `GGML_QUANT_SIZES` (gguf 0.19.0).
        ///
        /// Variants keep the ggml spellings (`Q4_K`, `IQ2_XXS`).
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum GgmlType {
            $( $(#[$doc])* $variant, )*
        }

        impl GgmlType {
            /// Every type this version knows, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant),*];

            /// The type with ggml id `id`; unknown ids give [`Error::UnknownDType`]
            /// (`"ggml type {id}"`).
            pub fn from_id(id: u32) -> Result<GgmlType> {
                match id {
                    $( $id => Ok(GgmlType::$variant), )*
                    _ => Err(Error::UnknownDType { name: format!("ggml type {id}") }),
                }
            }

            /// The ggml id stored in the file.
            pub fn id(self) -> u32 {
                match self { $( GgmlType::$variant => $id, )* }
            }

            /// The ggml name (`"F32"`, `"Q4_0"`, `"IQ2_XXS"`).
            pub fn name(self) -> &'static str {
                match self { $( GgmlType::$variant => stringify!($variant), )* }
            }

            /// Elements per block (1 for plain types).
            pub fn block_size(self) -> u64 {
                match self { $( GgmlType::$variant => $block, )* }
            }

            /// Bytes per block (the element size for plain types).
            pub fn type_size(self) -> u64 {
                match self { $( GgmlType::$variant => $size, )* }
            }
        }
    };
}

/// Elements per super-block of the k-quants and i-quants.
const QK_K: u64 = 256;

ggml_types! {
    /// 32-bit float.
    F32 = 0, 1, 4;
    /// 16-bit float.
    F16 = 1, 1, 2;
    /// 4-bit, 32 per block, f16 scale.
    Q4_0 = 2, 32, 2 + 16;
    /// 4-bit, 32 per block, f16 scale and min.
    Q4_1 = 3, 32, 2 + 2 + 16;
    /// 5-bit, 32 per block, f16 scale.
    Q5_0 = 6, 32, 2 + 4 + 16;
    /// 5-bit, 32 per block, f16 scale and min.
    Q5_1 = 7, 32, 2 + 2 + 4 + 16;
    /// 8-bit, 32 per block, f16 scale.
    Q8_0 = 8, 32, 2 + 32;
    /// 8-bit, 32 per block, f32 scale and sum.
    Q8_1 = 9, 32, 4 + 4 + 32;
    /// 2-bit k-quant (256 per super-block).
    Q2_K = 10, 256, 2 + 2 + QK_K / 16 + QK_K / 4;
    /// 3-bit k-quant.
    Q3_K = 11, 256, 2 + QK_K / 4 + QK_K / 8 + 12;
    /// 4-bit k-quant.
    Q4_K = 12, 256, 2 + 2 + QK_K / 2 + 12;
    /// 5-bit k-quant.
    Q5_K = 13, 256, 2 + 2 + QK_K / 2 + QK_K / 8 + 12;
    /// 6-bit k-quant.
    Q6_K = 14, 256, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16;
    /// 8-bit k-quant (intermediate results).
    Q8_K = 15, 256, 4 + QK_K + QK_K / 8;
    /// 2.06-bit i-quant.
    IQ2_XXS = 16, 256, 2 + QK_K / 4;
    /// 2.31-bit i-quant.
    IQ2_XS = 17, 256, 2 + QK_K / 4 + QK_K / 32;
    /// 3.06-bit i-quant.
    IQ3_XXS = 18, 256, 2 + QK_K / 4 + QK_K / 8;
    /// 1.56-bit i-quant.
    IQ1_S = 19, 256, 2 + QK_K / 8 + QK_K / 16;
    /// 4.5-bit non-linear quant, 32 per block.
    IQ4_NL = 20, 32, 2 + 16;
    /// 3.44-bit i-quant.
    IQ3_S = 21, 256, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4;
    /// 2.5-bit i-quant.
    IQ2_S = 22, 256, 2 + QK_K / 4 + QK_K / 16;
    /// 4.25-bit non-linear quant, 256 per super-block.
    IQ4_XS = 23, 256, 2 + 2 + QK_K / 2 + QK_K / 64;
    /// 8-bit signed integer.
    I8 = 24, 1, 1;
    /// 16-bit signed integer.
    I16 = 25, 1, 2;
    /// 32-bit signed integer.
    I32 = 26, 1, 4;
    /// 64-bit signed integer.
    I64 = 27, 1, 8;
    /// 64-bit float.
    F64 = 28, 1, 8;
    /// 1.75-bit i-quant.
    IQ1_M = 29, 256, QK_K / 8 + QK_K / 16 + QK_K / 32;
    /// bfloat16.
    BF16 = 30, 1, 2;
    /// Ternary, 1.69 bits.
    TQ1_0 = 34, 256, 2 + 4 * 13;
    /// Ternary, 2.06 bits.
    TQ2_0 = 35, 256, 2 + 64;
    /// OCP MX FP4 (e2m1 with an e8m0 scale per 32).
    MXFP4 = 39, 32, 1 + 16;
    /// NVIDIA FP4 (e2m1 with scales, 64 per block).
    NVFP4 = 40, 64, 4 + 32;
    /// 1-bit, 128 per block.
    Q1_0 = 41, 128, 2 + 16;
}

impl GgmlType {
    /// The tensorwire dtype of a plain type; `None` for block (quantized) types.
    pub fn dtype(self) -> Option<DType> {
        Some(match self {
            GgmlType::F32 => DType::F32,
            GgmlType::F16 => DType::F16,
            GgmlType::BF16 => DType::BF16,
            GgmlType::F64 => DType::F64,
            GgmlType::I8 => DType::I8,
            GgmlType::I16 => DType::I16,
            GgmlType::I32 => DType::I32,
            GgmlType::I64 => DType::I64,
            _ => return None,
        })
    }

    /// True for block (quantized) types, whose tensors come out as raw `U8` blocks.
    pub fn is_quantized(self) -> bool {
        self.dtype().is_none()
    }

    /// Bytes of one row of `ne0` elements: `ne0 / block_size × type_size`. Fails with
    /// [`Error::Malformed`] (offset 0) when `ne0` is not a multiple of the block size.
    pub fn row_bytes(self, ne0: u64) -> Result<u64> {
        if ne0 % self.block_size() != 0 {
            return Err(Error::malformed(
                0,
                format!(
                    "a row of {ne0} elements is not a multiple of the {} block size {}",
                    self.name(),
                    self.block_size()
                ),
            ));
        }
        (ne0 / self.block_size())
            .checked_mul(self.type_size())
            .ok_or(Error::Overflow {
                what: "GGUF row size",
            })
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor as the GGUF header describes it (validated on open).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    /// The tensor's name.
    pub name: Arc<str>,
    /// Its ggml type.
    pub ggml_type: GgmlType,
    /// The ggml dims `ne`, innermost (row length) first, as stored.
    pub dims: Vec<u64>,
    /// Number of logical elements (product of `dims`; 1 for no dims).
    pub n_elements: u64,
    /// Offset of its bytes relative to the data section, as stored.
    pub offset: u64,
    /// Offset of its bytes in the file (`data_offset + offset`).
    pub file_offset: u64,
    /// Bytes it occupies (`ne[0] / block_size × type_size` per row).
    pub nbytes: u64,
}

impl GgufTensorInfo {
    /// The logical (numpy, row-major) shape: `dims` reversed.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }
}

/// A validated GGUF v2/v3 file over any [`Bytes`] (a map, a buffer).
///
/// Opening parses and checks the whole header (limits, UTF-8, types, alignment,
/// every tensor's size against its type and dims, ranges inside the input, no
/// overlap, no duplicate names), so reads after that cannot fail on structure.
pub struct GgufReader {
    bytes: Bytes,
    version: u32,
    alignment: u64,
    data_offset: u64,
    /// Where each key-value pair's value lies; validated on open, decoded on first
    /// use (metadata can hold vocabularies of hundreds of thousands of strings).
    raw_metadata: Vec<RawKv>,
    /// Nesting limit the values were validated with, to decode them alike.
    max_depth: usize,
    metadata: OnceLock<Vec<(String, Value)>>,
    attributes: OnceLock<BTreeMap<String, Value>>,
    tensors: Vec<GgufTensorInfo>,
    index: TensorIndex,
}

/// A key-value pair as [`parse_header`] found and validated it.
struct RawKv {
    key: String,
    /// The value's type tag and where it was read.
    vtype: u32,
    type_at: u64,
    /// Where the value's bytes start.
    value_at: usize,
}

impl fmt::Debug for GgufReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufReader")
            .field("version", &self.version)
            .field("len", &self.bytes.len())
            .field("alignment", &self.alignment)
            .field("metadata", &self.raw_metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufReader {
    /// Maps `path` privately (copy-on-write) and opens it with default limits.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufReader> {
        GgufReader::open_with(path, &Limits::default())
    }

    /// Maps `path` privately (copy-on-write) and opens it with `limits`. Errors carry
    /// the path.
    pub fn open_with(path: impl AsRef<Path>, limits: &Limits) -> Result<GgufReader> {
        crate::open_mapped(path.as_ref(), |bytes| GgufReader::from_bytes(bytes, limits))
    }

    /// Opens a GGUF image held in `bytes`.
    pub fn from_bytes(bytes: Bytes, limits: &Limits) -> Result<GgufReader> {
        let header = parse_header(bytes.as_slice(), limits)?;
        let mut index = TensorIndex::with_capacity(header.tensors.len());
        let mut shared = Vec::new();
        for t in &header.tensors {
            index.push(tensor_info(t, &mut shared)?)?;
        }
        Ok(GgufReader {
            bytes,
            version: header.version,
            alignment: header.alignment,
            data_offset: header.data_offset,
            raw_metadata: header.metadata,
            max_depth: header.max_depth,
            metadata: OnceLock::new(),
            attributes: OnceLock::new(),
            tensors: header.tensors,
            index,
        })
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data alignment (`general.alignment`, or 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// File offset of the data section (the end of the header, aligned).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The key-value metadata, in file order (decoded on the first call; like the
    /// attributes and [`GgufReader::metadata_value`], from the map, so a file rewritten
    /// after it was opened reads as what it now holds, and a value that no longer
    /// decodes as `Null`).
    pub fn metadata(&self) -> &[(String, Value)] {
        self.metadata.get_or_init(|| self.decode_all().collect())
    }

    /// The metadata keys, in file order (nothing decoded).
    pub fn metadata_keys(&self) -> impl Iterator<Item = &str> {
        self.raw_metadata.iter().map(|kv| kv.key.as_str())
    }

    /// One metadata value by key, decoding only that value.
    pub fn metadata_value(&self, key: &str) -> Option<Value> {
        let at = self.raw_metadata.iter().position(|kv| kv.key == key)?;
        Some(match self.metadata.get() {
            Some(decoded) => decoded[at].1.clone(),
            None => self.decode(&self.raw_metadata[at]),
        })
    }

    /// Every key and its decoded value, in file order.
    fn decode_all(&self) -> impl Iterator<Item = (String, Value)> + '_ {
        self.raw_metadata
            .iter()
            .map(|kv| (kv.key.clone(), self.decode(kv)))
    }

    /// A value validated on open, read again from the input. It cannot fail unless
    /// the file was rewritten while mapped; such a value reads as `Null`.
    fn decode(&self, kv: &RawKv) -> Value {
        let mut c = Cursor {
            buf: self.bytes.as_slice(),
            pos: kv.value_at,
            limit: self.data_offset,
        };
        read_value(
            &mut c,
            kv.vtype,
            kv.type_at,
            0,
            self.max_depth,
            Build::Values,
        )
        .unwrap_or(Value::Null)
    }

    /// Every tensor's GGUF description, in file order (the order of
    /// [`TensorSource::tensors`]).
    pub fn gguf_tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// One tensor's GGUF description.
    pub fn tensor(&self, name: &str) -> Result<&GgufTensorInfo> {
        self.position(name).map(|i| &self.tensors[i])
    }

    /// A tensor's stored bytes, whatever its type (zero-copy).
    pub fn raw(&self, name: &str) -> Result<Bytes> {
        let t = self.tensor(name)?;
        self.bytes.slice_at(t.file_offset, t.nbytes)
    }

    /// The whole input.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }
}

impl TensorSource for GgufReader {
    fn format(&self) -> &'static str {
        "gguf"
    }

    fn tensors(&self) -> &[TensorInfo] {
        self.index.infos()
    }

    fn attributes(&self) -> &BTreeMap<String, Value> {
        self.attributes.get_or_init(|| match self.metadata.get() {
            Some(decoded) => decoded.iter().cloned().collect(),
            None => self.decode_all().collect(),
        })
    }

    fn position(&self, name: &str) -> Result<usize> {
        self.index.position(name)
    }

    /// Plain tensors as their dtype and logical shape; block types as their raw
    /// blocks (`U8`, bytes per row last). Always zero-copy.
    fn view_at(&self, position: usize) -> Result<TensorView> {
        let info = self.index.checked_at(position)?;
        let t = &self.tensors[position];
        let bytes = self.bytes.slice_at(t.file_offset, t.nbytes)?;
        TensorView::new(&info.name, info.dtype, info.shape.clone(), bytes, true)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The [`TensorInfo`] of a validated tensor.
/// `shared` keeps the attribute map of each plain (non-block) type met so far: every
/// `F32` tensor shares one `{"gguf.type": "F32"}`.
fn tensor_info(t: &GgufTensorInfo, shared: &mut Vec<(GgmlType, Attributes)>) -> Result<TensorInfo> {
    let logical = t.shape();
    let type_only = || {
        Attributes::from(BTreeMap::from([(
            "gguf.type".to_owned(),
            Value::Str(t.ggml_type.name().to_owned()),
        )]))
    };
    let (dtype, shape, layout, attributes) = match t.ggml_type.dtype() {
        Some(dtype) => {
            let attributes = match shared.iter().find(|(ty, _)| *ty == t.ggml_type) {
                Some((_, a)) => a.clone(),
                None => {
                    let a = type_only();
                    shared.push((t.ggml_type, a.clone()));
                    a
                }
            };
            (
                dtype,
                Shape::from_dims(&logical)?,
                Layout::Dense,
                attributes,
            )
        }
        None => {
            let ne0 = t.dims.first().copied().unwrap_or(1);
            let mut bytes_shape = logical.clone();
            if let Some(last) = bytes_shape.last_mut() {
                *last = t.ggml_type.row_bytes(ne0)?;
            }
            let mut attributes = type_only();
            attributes.make_mut().insert(
                "gguf.shape".to_owned(),
                Value::List(logical.iter().map(|&d| Value::Int(d.into())).collect()),
            );
            (
                DType::U8,
                Shape::from_dims(&bytes_shape)?,
                Layout::Other(format!("gguf:{}", t.ggml_type.name())),
                attributes,
            )
        }
    };
    Ok(TensorInfo {
        name: Arc::clone(&t.name),
        dtype,
        shape,
        layout,
        nbytes: t.nbytes,
        stored_bytes: t.nbytes,
        offset: t.file_offset,
        encoding: None,
        attributes,
    })
}

// ===== parsing =====

/// What [`parse_header`] found.
struct Header {
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<RawKv>,
    max_depth: usize,
    tensors: Vec<GgufTensorInfo>,
}

/// Reads the header from the front of the input. The header (everything up to the
/// end of the tensor infos) may not extend past `limit` bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    limit: u64,
}

impl<'a> Cursor<'a> {
    fn pos(&self) -> u64 {
        self.pos as u64
    }

    /// Checks that `n` more bytes exist and stay within the header limit. A claim
    /// past the end of the input is [`Error::Truncated`] whatever the limit (a small
    /// file that claims much is cut short, not too big); the limit's
    /// [`Error::LimitExceeded`] is for a header that really is that long.
    fn need(&self, n: u64) -> Result<()> {
        let available = (self.buf.len() as u64).saturating_sub(self.pos());
        if n > available {
            return Err(Error::Truncated {
                offset: self.pos(),
                needed: n,
                available,
            });
        }
        // Within the input, so no overflow.
        let end = self.pos() + n;
        if end > self.limit {
            return Err(Error::LimitExceeded {
                what: "GGUF header size",
                limit: self.limit,
                found: end,
            });
        }
        Ok(())
    }

    /// Checks that `count` items of at least `min_size` bytes each can follow.
    fn need_items(&self, count: u64, min_size: u64) -> Result<()> {
        self.need(count.saturating_mul(min_size))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        self.need(n)?;
        // `need` checked pos + n <= buf.len(), so both fit in usize.
        let end = self.pos + n as usize;
        let Some(s) = self.buf.get(self.pos..end) else {
            return Err(Error::Truncated {
                offset: self.pos(),
                needed: n,
                available: 0,
            });
        };
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N as u64)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64> {
        self.array().map(u64::from_le_bytes)
    }

    /// A GGUF string of at most `max` bytes (`what` names the limit).
    fn str(&mut self, max: Option<(&'static str, usize)>) -> Result<&'a str> {
        let at = self.pos();
        let len = self.u64()?;
        if let Some((what, max)) = max {
            Error::check_limit(what, len, max as u64)?;
        }
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes)
            .map_err(|e| Error::malformed(at, format!("string is not valid UTF-8: {e}")))
    }
}

impl<'a> Cursor<'a> {
    /// The bytes of a GGUF string value, UTF-8 or not: the spec asks for UTF-8, but
    /// llama.cpp and gguf-py keep a value's bytes as they are, so a tokenizer
    /// vocabulary holding a raw byte does not make the file unreadable.
    fn string_bytes(&mut self) -> Result<&'a [u8]> {
        let len = self.u64()?;
        self.take(len)
    }

    /// Steps over `n` string values, checking only that they are all there.
    fn skip_strings(&mut self, n: usize) -> Result<()> {
        (0..n).try_for_each(|_| self.string_bytes().map(drop))
    }
}

/// GGUF metadata value type ids.
mod vt {
    pub const UINT8: u32 = 0;
    pub const INT8: u32 = 1;
    pub const UINT16: u32 = 2;
    pub const INT16: u32 = 3;
    pub const UINT32: u32 = 4;
    pub const INT32: u32 = 5;
    pub const FLOAT32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const UINT64: u32 = 10;
    pub const INT64: u32 = 11;
    pub const FLOAT64: u32 = 12;
}

/// The fewest bytes a value of type `vtype` takes (an empty string is 8 bytes, an
/// empty array 12), or `None` for an unknown type.
fn min_value_size(vtype: u32) -> Option<u64> {
    Some(match vtype {
        vt::UINT8 | vt::INT8 | vt::BOOL => 1,
        vt::UINT16 | vt::INT16 => 2,
        vt::UINT32 | vt::INT32 | vt::FLOAT32 => 4,
        vt::UINT64 | vt::INT64 | vt::FLOAT64 | vt::STRING => 8,
        vt::ARRAY => 12,
        _ => return None,
    })
}

fn unknown_value_type(at: u64, vtype: u32) -> Error {
    Error::malformed(at, format!("unknown GGUF metadata value type {vtype}"))
}

/// What [`read_value`] makes of the bytes it checks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Build {
    /// Check only, allocating nothing; the result is `Value::Null`.
    Nothing,
    /// The decoded value.
    Values,
}

/// Reads one value of type `vtype` (the type tag already read from `type_at`);
/// `depth` is the number of arrays it sits in. Both [`Build`] modes accept exactly
/// the same bytes, so a value checked on open decodes later without error.
fn read_value(
    c: &mut Cursor<'_>,
    vtype: u32,
    type_at: u64,
    depth: usize,
    max_depth: usize,
    build: Build,
) -> Result<Value> {
    if vtype != vt::ARRAY {
        return read_scalar(c, vtype, type_at, build);
    }
    let depth = depth + 1;
    Error::check_limit("metadata nesting depth", depth as u64, max_depth as u64)?;
    let item_at = c.pos();
    let item_type = c.u32()?;
    let min = min_value_size(item_type).ok_or_else(|| unknown_value_type(item_at, item_type))?;
    let count = c.u64()?;
    // Every item takes at least `min` bytes, so this bounds the allocation by the
    // bytes actually present (and the header limit).
    c.need_items(count, min)?;
    let n = usize::try_from(count).map_err(|_| Error::Overflow {
        what: "array length as usize",
    })?;
    if build == Build::Nothing {
        match fixed_value_size(item_type) {
            // `need_items` checked they are all there.
            Some(size) => skip_fixed(c, item_type, count * size)?,
            None if item_type == vt::STRING => c.skip_strings(n)?,
            None => {
                for _ in 0..n {
                    read_value(c, item_type, item_at, depth, max_depth, build)?;
                }
            }
        }
        return Ok(Value::Null);
    }
    // Values are only decoded from bytes checked without decoding first, so every
    // counted item is there: reserve them all (a list grown by doubling would keep up
    // to twice its memory). Arrays of arrays reserve a bounded part: should the
    // file change under the map after the check, each nesting level would otherwise
    // reserve for the bytes left.
    let reserve = if item_type == vt::ARRAY {
        n.min(MAX_RESERVED_ARRAYS)
    } else {
        n
    };
    let mut items = Vec::with_capacity(reserve);
    for _ in 0..n {
        items.push(read_value(c, item_type, item_at, depth, max_depth, build)?);
    }
    Ok(Value::List(items))
}

/// [`read_value`] for every type but `ARRAY`; apart, so that the recursion through
/// nested arrays keeps small stack frames.
#[inline(never)]
fn read_scalar(c: &mut Cursor<'_>, vtype: u32, type_at: u64, build: Build) -> Result<Value> {
    if build == Build::Nothing {
        if let Some(size) = fixed_value_size(vtype) {
            skip_fixed(c, vtype, size)?;
            return Ok(Value::Null);
        }
    }
    Ok(match vtype {
        vt::UINT8 => Value::Int(c.u8()?.into()),
        vt::INT8 => Value::Int(i8::from_le_bytes(c.array()?).into()),
        vt::UINT16 => Value::Int(u16::from_le_bytes(c.array()?).into()),
        vt::INT16 => Value::Int(i16::from_le_bytes(c.array()?).into()),
        vt::UINT32 => Value::Int(c.u32()?.into()),
        vt::INT32 => Value::Int(i32::from_le_bytes(c.array()?).into()),
        vt::UINT64 => Value::Int(c.u64()?.into()),
        vt::INT64 => Value::Int(i64::from_le_bytes(c.array()?).into()),
        vt::FLOAT32 => Value::Float(f32::from_le_bytes(c.array()?).into()),
        vt::FLOAT64 => Value::Float(f64::from_le_bytes(c.array()?)),
        vt::BOOL => {
            let at = c.pos();
            let b = c.u8()?;
            check_bools(&[b], at)?;
            Value::Bool(b == 1)
        }
        vt::STRING => {
            let bytes = c.string_bytes()?;
            match build {
                Build::Nothing => Value::Null,
                Build::Values => match std::str::from_utf8(bytes) {
                    Ok(text) => Value::Str(text.to_owned()),
                    Err(_) => Value::Bytes(bytes.to_vec()),
                },
            }
        }
        other => return Err(unknown_value_type(type_at, other)),
    })
}

/// Most items an array of arrays reserves before its items are decoded.
const MAX_RESERVED_ARRAYS: usize = 1 << 12;

/// The size of a value of a fixed-size type (numbers and `BOOL`), `None` for strings,
/// arrays and unknown types.
fn fixed_value_size(vtype: u32) -> Option<u64> {
    match vtype {
        vt::STRING | vt::ARRAY => None,
        other => min_value_size(other),
    }
}

/// Steps over `len` bytes of fixed-size values of type `vtype`, checking `BOOL`s.
fn skip_fixed(c: &mut Cursor<'_>, vtype: u32, len: u64) -> Result<()> {
    let at = c.pos();
    let bytes = c.take(len)?;
    if vtype == vt::BOOL {
        check_bools(bytes, at)?;
    }
    Ok(())
}

/// `BOOL` values must be 0 or 1; `at` is the offset of `bytes`.
fn check_bools(bytes: &[u8], at: u64) -> Result<()> {
    match bytes.iter().position(|&b| b > 1) {
        None => Ok(()),
        Some(i) => Err(Error::malformed(
            at + i as u64,
            format!("BOOL value is {}, not 0 or 1", bytes[i]),
        )),
    }
}

/// Smallest key-value pair: an empty key (8), the type (4) and a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest tensor info: an empty name (8), `n_dims` (4), the type (4), the offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

fn parse_header(buf: &[u8], limits: &Limits) -> Result<Header> {
    let mut c = Cursor {
        buf,
        pos: 0,
        limit: limits.max_metadata_bytes,
    };
    // Magic: a short input that does not even start like GGUF is a bad magic, not a
    // truncated file.
    let head = buf.get(..4).unwrap_or(buf);
    if !MAGIC.starts_with(head) {
        return Err(Error::BadMagic {
            offset: 0,
            expected: "GGUF",
            found: head.to_vec(),
        });
    }
    c.take(4)?;

    let version = c.u32()?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(Error::unsupported(
                "GGUF version 1 (only versions 2 and 3 are read)",
            ))
        }
        v if v & 0xFFFF == 0 && matches!(v.swap_bytes(), 1..=3) => {
            return Err(Error::unsupported(format!(
                "big-endian GGUF (version {} byte-swapped) is not supported; only little-endian files are read",
                v.swap_bytes()
            )))
        }
        v => {
            return Err(Error::unsupported(format!(
                "GGUF version {v} (only versions 2 and 3 are read)"
            )))
        }
    }
    let tensor_count = c.u64()?;
    let kv_count = c.u64()?;
    Error::check_limit("tensor count", tensor_count, limits.max_tensors)?;

    // Key-value metadata.
    let max_depth = limits.depth();
    c.need_items(kv_count, MIN_KV_BYTES)?;
    let mut metadata = Vec::with_capacity(usize::try_from(kv_count).unwrap_or(0));
    let mut keys = NameSet::default();
    let mut alignment = DEFAULT_ALIGNMENT;
    for _ in 0..kv_count {
        let key_at = c.pos();
        let key = c.str(Some(("metadata key length", limits.max_name_bytes)))?;
        if !keys.insert(key) {
            return Err(Error::malformed(
                key_at,
                format!("duplicate metadata key `{key}`"),
            ));
        }
        let type_at = c.pos();
        let vtype = c.u32()?;
        let value_at = c.pos;
        if key == ALIGNMENT_KEY {
            alignment = read_alignment(&mut c, vtype, key_at)?;
        } else {
            read_value(&mut c, vtype, type_at, 0, max_depth, Build::Nothing)?;
        }
        metadata.push(RawKv {
            key: key.to_owned(),
            vtype,
            type_at,
            value_at,
        });
    }

    // Tensor infos.
    c.need_items(tensor_count, MIN_TENSOR_INFO_BYTES)?;
    let mut raw = Vec::with_capacity(usize::try_from(tensor_count).unwrap_or(0));
    let mut names: NameSet<&str> = NameSet::with_capacity_and_hasher(
        usize::try_from(tensor_count).unwrap_or(0),
        Default::default(),
    );
    let max_ndim = limits.max_ndim.min(tensorwire_core::MAX_NDIM);
    for _ in 0..tensor_count {
        let at = c.pos();
        let name = c.str(Some(("tensor name length", limits.max_name_bytes)))?;
        if !names.insert(name) {
            return Err(Error::Duplicate {
                name: name.to_owned(),
            });
        }
        let n_dims = c.u32()?;
        Error::check_limit("number of dimensions", n_dims.into(), max_ndim as u64)?;
        c.need_items(n_dims.into(), 8)?;
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = c.u64()?;
            if d > i64::MAX as u64 {
                return Err(Error::malformed(
                    at,
                    format!("tensor `{name}`: dimension {d} does not fit ggml's int64"),
                ));
            }
            dims.push(d);
        }
        let type_id = c.u32()?;
        let ggml_type = GgmlType::from_id(type_id)?;
        let offset = c.u64()?;
        raw.push((at, name, dims, ggml_type, offset));
    }
    let header_end = c.pos();
    let data_offset = align_up(header_end, alignment).ok_or(Error::Overflow {
        what: "GGUF data section offset",
    })?;

    // Sizes, alignment, bounds.
    let file_len = buf.len() as u64;
    let mut tensors = Vec::with_capacity(raw.len());
    for (at, name, dims, ggml_type, offset) in raw {
        let n_elements =
            dims.iter()
                .try_fold(1u64, |n, &d| n.checked_mul(d))
                .ok_or(Error::Overflow {
                    what: "GGUF tensor element count",
                })?;
        let ne0 = dims.first().copied().unwrap_or(1);
        let row = ggml_type.row_bytes(ne0).map_err(|e| match e {
            Error::Malformed { reason, .. } => {
                Error::malformed(at, format!("tensor `{name}`: {reason}"))
            }
            other => other,
        })?;
        let nbytes = dims
            .iter()
            .skip(1)
            .try_fold(row, |n, &d| n.checked_mul(d))
            .ok_or(Error::Overflow {
                what: "GGUF tensor byte size",
            })?;
        let file_offset = data_offset.checked_add(offset).ok_or(Error::Overflow {
            what: "GGUF tensor offset",
        })?;
        if offset % alignment != 0 {
            return Err(Error::Misaligned {
                tensor: name.to_owned(),
                offset: file_offset,
                alignment,
            });
        }
        let end = file_offset.checked_add(nbytes).ok_or(Error::Overflow {
            what: "GGUF tensor end offset",
        })?;
        if end > file_len {
            return Err(Error::OutOfBounds {
                tensor: name.to_owned(),
                offset: file_offset,
                length: nbytes,
                limit: file_len,
            });
        }
        tensors.push(GgufTensorInfo {
            name: Arc::from(name),
            ggml_type,
            dims,
            n_elements,
            offset,
            file_offset,
            nbytes,
        });
    }
    check_overlap(&tensors)?;

    Ok(Header {
        version,
        alignment,
        data_offset,
        metadata,
        max_depth,
        tensors,
    })
}

/// `general.alignment`, whose type tag was read: it must be a `UINT32` holding a
/// non-zero power of two (as gguf-py and llama.cpp require).
fn read_alignment(c: &mut Cursor<'_>, vtype: u32, key_at: u64) -> Result<u64> {
    let bad = |reason: String| Error::malformed(key_at, format!("{ALIGNMENT_KEY}: {reason}"));
    if vtype != vt::UINT32 {
        return Err(bad(format!("type {vtype} is not UINT32")));
    }
    match c.u32()? {
        a if a.is_power_of_two() => Ok(a.into()),
        a => Err(bad(format!("{a} is not a non-zero power of two"))),
    }
}

/// Fails with [`Error::Overlap`] if two tensors share a byte (empty tensors own no
/// bytes and overlap nothing).
fn check_overlap(tensors: &[GgufTensorInfo]) -> Result<()> {
    let mut spans: Vec<(u64, u64, usize)> = tensors
        .iter()
        .enumerate()
        .filter(|(_, t)| t.nbytes > 0)
        // Bounds were checked: file_offset + nbytes does not overflow.
        .map(|(i, t)| (t.file_offset, t.file_offset + t.nbytes, i))
        .collect();
    spans.sort_unstable();
    let mut reach: Option<(u64, usize)> = None;
    for (start, end, i) in spans {
        if let Some((max_end, owner)) = reach {
            if start < max_end {
                return Err(Error::Overlap {
                    tensor: tensors[i].name.to_string(),
                    other: tensors[owner].name.to_string(),
                    offset: start,
                });
            }
        }
        if reach.is_none_or(|(max_end, _)| end > max_end) {
            reach = Some((end, i));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_table_matches_gguf_py() {
        // Spot checks against GGML_QUANT_SIZES (gguf 0.19.0).
        let expect = [
            ("Q4_0", 2, 32, 18),
            ("Q8_0", 8, 32, 34),
            ("Q2_K", 10, 256, 84),
            ("Q3_K", 11, 256, 110),
            ("Q4_K", 12, 256, 144),
            ("Q5_K", 13, 256, 176),
            ("Q6_K", 14, 256, 210),
            ("Q8_K", 15, 256, 292),
            ("IQ2_XXS", 16, 256, 66),
            ("IQ2_XS", 17, 256, 74),
            ("IQ3_XXS", 18, 256, 98),
            ("IQ1_S", 19, 256, 50),
            ("IQ4_NL", 20, 32, 18),
            ("IQ3_S", 21, 256, 110),
            ("IQ2_S", 22, 256, 82),
            ("IQ4_XS", 23, 256, 136),
            ("IQ1_M", 29, 256, 56),
            ("BF16", 30, 1, 2),
            ("TQ1_0", 34, 256, 54),
            ("TQ2_0", 35, 256, 66),
            ("MXFP4", 39, 32, 17),
        ];
        for (name, id, block, size) in expect {
            let t = GgmlType::from_id(id).unwrap();
            assert_eq!(
                (t.name(), t.id(), t.block_size(), t.type_size()),
                (name, id, block, size)
            );
        }
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()).unwrap(), t);
        }
        assert_eq!(GgmlType::ALL.len(), 34);
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 42, u32::MAX] {
            assert!(matches!(
                GgmlType::from_id(id),
                Err(Error::UnknownDType { name }) if name == format!("ggml type {id}")
            ));
        }
    }

    #[test]
    fn row_bytes_requires_whole_blocks() {
        assert_eq!(GgmlType::Q4_K.row_bytes(512).unwrap(), 288);
        assert!(matches!(
            GgmlType::Q4_0.row_bytes(33),
            Err(Error::Malformed { .. })
        ));
        assert_eq!(GgmlType::F32.row_bytes(3).unwrap(), 12);
        assert!(matches!(
            GgmlType::F64.row_bytes(u64::MAX),
            Err(Error::Overflow { .. })
        ));
    }

    #[test]
    fn sniff_checks_the_magic() {
        assert!(sniff(b"GGUF\x03\0\0\0"));
        assert!(!sniff(b"GGU"));
        assert!(!sniff(b"ZTEN1000"));
    }
}
