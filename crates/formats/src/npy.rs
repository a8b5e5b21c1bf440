//! NumPy `.npy` files and `.npz` archives.
//!
//! An `.npy` file is the magic `\x93NUMPY`, a major and minor version byte, the header
//! length (`u16` LE in version 1, `u32` LE in versions 2 and 3), then the header: a
//! Python dict literal `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }`
//! padded with spaces and a newline so the data starts at a multiple of 64 bytes;
//! then the elements. An `.npz` is a ZIP archive of `.npy` members (`np.savez` stores
//! them, `np.savez_compressed` deflates them); each member's name less `.npy` is the
//! array's name.
//!
//! [`NumpyReader`] parses every header on open (deflated members inflate only their
//! first bytes for it, reading their compressed bytes a chunk at a time). Little-endian
//! C-order arrays of a mapped file or a stored member are zero-copy; Fortran-order
//! arrays are served strided (zero-copy) by [`TensorSource::strided`] and gathered
//! into C order by [`TensorSource::view`]; big-endian arrays are byte-swapped copies;
//! deflated members are inflated on each read. A member's CRC-32 is checked once per
//! reader: a stored member's by [`TensorSource::check_record_at`] (which copies and
//! conversions call first; zero-copy views touch no byte), a deflated member's by the
//! inflation that reaches its end ([`TensorSource::verify`] checks every member). Object, string, structured and
//! datetime arrays are refused: only numeric and boolean arrays are tensors.

use std::any::Any;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use tensorwire_core::strided::{column_major_strides, swap_bytes};
use tensorwire_core::{
    AlignedBuf, Attributes, Bytes, DType, Dims, Error, Layout, Limits, Result, Shape, StridedView,
    TensorIndex, TensorInfo, TensorSource, TensorView, Value,
};
use tensorwire_pytorch::zip::{read_entry_prefix, Method, ZipArchive, ZipEntry};
use tensorwire_pytorch::Input;
use tensorwire_range::RangeFile;

/// The magic bytes at the start of every `.npy` file.
pub const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Largest `.npy` header accepted, in bytes (NumPy itself refuses headers over 10 000
/// bytes unless told otherwise; numeric arrays need far less).
pub const MAX_HEADER_BYTES: u64 = 1 << 20;

/// The name of the one array of an `.npy` file.
pub const NPY_TENSOR_NAME: &str = "array";

/// True when `head` starts with the `.npy` magic.
pub fn sniff(head: &[u8]) -> bool {
    head.starts_with(MAGIC)
}

/// What an `.npy` header says.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyHeader {
    /// Format version (major, minor).
    pub version: (u8, u8),
    /// The `descr` string, as written (`<f4`).
    pub descr: String,
    /// Element type.
    pub dtype: DType,
    /// True when the elements are stored big-endian (and need swapping).
    pub big_endian: bool,
    /// True when the elements are stored in column-major order.
    pub fortran_order: bool,
    /// Shape.
    pub shape: Shape,
    /// Offset of the first element from the start of the `.npy` bytes.
    pub data_offset: u64,
    /// Bytes of the elements.
    pub nbytes: u64,
}

impl NpyHeader {
    /// Where the array's bytes end, from the start of the `.npy` data.
    fn data_end(&self) -> u64 {
        self.data_offset.saturating_add(self.nbytes)
    }
}

/// Length of the magic, version and header-length fields, and the header length,
/// read from the first bytes of an `.npy` (12 suffice).
fn preamble(head: &[u8]) -> Result<(u8, u8, u64, u64)> {
    let truncated = |needed: u64| Error::Truncated {
        offset: 0,
        needed,
        available: head.len() as u64,
    };
    if head.len() < 8 {
        return Err(truncated(8));
    }
    if !head.starts_with(MAGIC) {
        return Err(Error::BadMagic {
            offset: 0,
            expected: "\\x93NUMPY",
            found: head[..6].to_vec(),
        });
    }
    let (major, minor) = (head[6], head[7]);
    let (fixed, len) = match major {
        1 => {
            let b = head.get(8..10).ok_or_else(|| truncated(10))?;
            (10u64, u64::from(u16::from_le_bytes([b[0], b[1]])))
        }
        2 | 3 => {
            let b = head.get(8..12).ok_or_else(|| truncated(12))?;
            (
                12u64,
                u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            )
        }
        _ => {
            return Err(Error::unsupported(format!(
                ".npy format version {major}.{minor} (known: 1.0, 2.0, 3.0)"
            )))
        }
    };
    if minor != 0 {
        return Err(Error::unsupported(format!(
            ".npy format version {major}.{minor} (known: 1.0, 2.0, 3.0)"
        )));
    }
    Error::check_limit(".npy header length", len, MAX_HEADER_BYTES)?;
    Ok((major, minor, fixed, len))
}

/// Parses the header at the start of `npy` (which must hold at least the whole
/// header; the data may be cut off).
pub fn parse_header(npy: &[u8], limits: &Limits) -> Result<NpyHeader> {
    let (major, minor, fixed, len) = preamble(npy)?;
    let end = fixed + len;
    let text = npy
        .get(fixed as usize..end as usize)
        .ok_or(Error::Truncated {
            offset: fixed,
            needed: len,
            available: npy.len() as u64 - fixed,
        })?;
    // Versions 1 and 2 are latin-1, version 3 UTF-8; the keys and values of numeric
    // arrays are ASCII in both, so anything else is refused below.
    let text = std::str::from_utf8(text)
        .map_err(|_| Error::malformed(fixed, ".npy header is not ASCII/UTF-8"))?;
    let dict = match HeaderDict::parse_canonical(text) {
        Some(dict) => dict,
        None => HeaderDict::parse(text, fixed, major <= 2)?,
    };
    let (dtype, big_endian) = parse_descr(dict.descr)?;
    Error::check_limit(
        "tensor rank",
        dict.shape.len() as u64,
        limits.max_ndim as u64,
    )?;
    let shape = Shape::try_from_dims(dict.shape)?;
    let nbytes = shape.byte_len(dtype)?;
    // numpy's own limit, which the shape's (in elements) does not reach: the non-zero
    // dimensions times the item size fit `i64`.
    let nonzero_bytes = shape
        .nonzero_numel()
        .checked_mul(dtype.size().unwrap_or(1) as u64);
    if nonzero_bytes.is_none_or(|n| n > i64::MAX as u64) {
        return Err(Error::Overflow {
            what: ".npy array size (numpy's limit: the non-zero dimensions times the item size fit i64)",
        });
    }
    Ok(NpyHeader {
        version: (major, minor),
        descr: dict.descr.to_owned(),
        dtype,
        big_endian: big_endian && dtype.swap_unit() > 1,
        fortran_order: dict.fortran_order,
        shape,
        data_offset: end,
        nbytes,
    })
}

/// The three keys of a header dict (strings borrowed from the header).
struct HeaderDict<'a> {
    descr: &'a str,
    fortran_order: bool,
    shape: Dims,
}

/// A value of the header's Python literal.
enum Literal<'a> {
    Str(&'a str),
    Bool(bool),
    Tuple(Dims),
}

/// A cursor over the header's Python dict literal.
struct Parser<'a> {
    /// The header text, and its bytes.
    src: &'a str,
    text: &'a [u8],
    at: usize,
    base: u64,
    /// Whether integers may carry Python 2's `L` suffix (numpy strips it from
    /// version 1 and 2 headers only).
    python2_longs: bool,
}

impl<'a> Parser<'a> {
    fn error(&self, reason: impl Into<String>) -> Error {
        Error::malformed(
            self.base + self.at as u64,
            format!(".npy header: {}", reason.into()),
        )
    }

    fn skip_space(&mut self) {
        while self.text.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_space();
        self.text.get(self.at).copied()
    }

    fn expect(&mut self, byte: u8) -> Result<()> {
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.error(format!("expected `{}`", byte as char)))
        }
    }

    fn string(&mut self) -> Result<&'a str> {
        // Python 3 takes a `u` prefix (`u'<f4'`, which Python 2's repr wrote) as
        // the same str.
        if matches!(self.peek(), Some(b'u' | b'U'))
            && matches!(self.text.get(self.at + 1), Some(b'\'' | b'"'))
        {
            self.at += 1;
        }
        let quote = match self.peek() {
            Some(q @ (b'\'' | b'"')) => q,
            _ => return Err(self.error("expected a string")),
        };
        let start = self.at + 1;
        let len = self.text[start..]
            .iter()
            .position(|&b| b == quote || b == b'\\')
            .ok_or_else(|| self.error("unterminated string"))?;
        if self.text[start + len] == b'\\' {
            return Err(self.error("escapes in header strings are not supported"));
        }
        self.at = start + len + 1;
        // Quotes are ASCII, so both ends are character boundaries of `src`.
        self.src
            .get(start..start + len)
            .ok_or_else(|| self.error("string is not UTF-8"))
    }

    fn integer(&mut self) -> Result<u64> {
        self.skip_space();
        // Digits, with single underscores between them as Python 3 allows (`1_000`),
        // added up as they come (`None` once past u64).
        let (mut n, mut digits, mut leading_zero) = (Some(0u64), 0usize, false);
        while let Some(&b) = self.text.get(self.at) {
            let next_is_digit = self.text.get(self.at + 1).is_some_and(u8::is_ascii_digit);
            match b {
                b'0'..=b'9' => {
                    // `02` is a syntax error in Python 3, which numpy's literal_eval
                    // is (`00` is not).
                    leading_zero |= n == Some(0) && digits > 0 && b != b'0';
                    n = n.and_then(|n| n.checked_mul(10)?.checked_add(u64::from(b - b'0')));
                    digits += 1;
                }
                b'_' if digits > 0 && next_is_digit => {}
                _ => break,
            }
            self.at += 1;
        }
        if leading_zero {
            return Err(self.error("an integer with a leading zero"));
        }
        let n = n
            .filter(|_| digits > 0)
            .ok_or_else(|| self.error("expected a non-negative integer that fits 64 bits"))?;
        // numpy drops every `L` name token that follows a number in version 1 and 2
        // headers (`1L`, `1 L`, `0L L`), not `LL` or `L_`.
        while self.python2_longs {
            let mut at = self.at;
            while matches!(self.text.get(at), Some(b' ' | b'\t')) {
                at += 1;
            }
            let ident = |b: Option<&u8>| b.is_some_and(|&b| b.is_ascii_alphanumeric() || b == b'_');
            if self.text.get(at) != Some(&b'L') || ident(self.text.get(at + 1)) {
                break;
            }
            self.at = at + 1;
        }
        Ok(n)
    }

    fn literal(&mut self) -> Result<Literal<'a>> {
        match self.peek() {
            Some(b'\'' | b'"' | b'u' | b'U') => self.string().map(Literal::Str),
            Some(b'T') if self.text[self.at..].starts_with(b"True") => {
                self.at += 4;
                Ok(Literal::Bool(true))
            }
            Some(b'F') if self.text[self.at..].starts_with(b"False") => {
                self.at += 5;
                Ok(Literal::Bool(false))
            }
            Some(b'(') => {
                self.at += 1;
                let mut dims = Dims::default();
                let mut trailing_comma = false;
                loop {
                    if self.peek() == Some(b')') {
                        // `(2)` is the int 2 in Python, not a shape: numpy refuses it.
                        if dims.len() == 1 && !trailing_comma {
                            return Err(
                                self.error("a one-dimensional shape needs its comma: `(n,)`")
                            );
                        }
                        self.at += 1;
                        return Ok(Literal::Tuple(dims));
                    }
                    if dims.len() > tensorwire_core::MAX_NDIM {
                        return Err(self.error("shape has too many dimensions"));
                    }
                    dims.push(self.integer()?);
                    trailing_comma = self.peek() == Some(b',');
                    match self.peek() {
                        Some(b',') => self.at += 1,
                        Some(b')') => {}
                        _ => return Err(self.error("expected `,` or `)` in the shape")),
                    }
                }
            }
            _ => Err(self.error("expected a string, True, False or a tuple")),
        }
    }
}

impl<'a> HeaderDict<'a> {
    /// The header exactly as numpy writes it, read without the general parser:
    /// `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }` and padding.
    /// `None` for anything else (other spacing or key order, Python 2 longs, …),
    /// which [`HeaderDict::parse`] then reads or refuses: for a header this accepts,
    /// that parser gives the same dict (a test holds the two to it).
    fn parse_canonical(text: &'a str) -> Option<HeaderDict<'a>> {
        let rest = text.strip_prefix("{'descr': '")?;
        let quote = rest.find(['\'', '\\'])?;
        let (descr, rest) = rest.split_at(quote);
        let rest = rest.strip_prefix("', 'fortran_order': ")?;
        let (fortran_order, rest) = if let Some(rest) = rest.strip_prefix("False") {
            (false, rest)
        } else {
            (true, rest.strip_prefix("True")?)
        };
        let mut rest = rest.strip_prefix(", 'shape': (")?.as_bytes();
        let mut shape = Dims::default();
        // Dimensions: `()`, `(5,)` or `(2, 3)`; at most 8 here (more: the general
        // parser).
        loop {
            if let Some(after) = rest.strip_prefix(b"), }") {
                rest = after;
                break;
            }
            let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
            // No leading zeros, at most 19 digits: always fits u64.
            if digits == 0 || digits > 19 || (digits > 1 && rest[0] == b'0') {
                return None;
            }
            let dim = rest[..digits]
                .iter()
                .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
            if shape.len() == 8 {
                return None;
            }
            shape.push(dim);
            rest = &rest[digits..];
            rest = match (shape.len(), rest) {
                (1, [b',', b')', ..]) => &rest[1..],
                (_, [b',', b' ', next, ..]) if next.is_ascii_digit() => &rest[2..],
                (2.., [b')', ..]) => rest,
                _ => return None,
            };
        }
        is_blank(rest).then_some(HeaderDict {
            descr,
            fortran_order,
            shape,
        })
    }

    fn parse(text: &'a str, base: u64, python2_longs: bool) -> Result<HeaderDict<'a>> {
        let mut p = Parser {
            src: text,
            text: text.as_bytes(),
            at: 0,
            base,
            python2_longs,
        };
        let (mut descr, mut fortran, mut shape) = (None, None, None);
        p.expect(b'{')?;
        loop {
            if p.peek() == Some(b'}') {
                p.at += 1;
                break;
            }
            let key = p.string()?;
            p.expect(b':')?;
            if key == "descr" && p.peek() == Some(b'[') {
                return Err(Error::unsupported(
                    "structured .npy arrays (a list `descr`): only numeric and boolean arrays are tensors",
                ));
            }
            let value = p.literal()?;
            let slot_taken = match (key, value) {
                ("descr", Literal::Str(s)) => descr.replace(s).is_some(),
                ("fortran_order", Literal::Bool(b)) => fortran.replace(b).is_some(),
                ("shape", Literal::Tuple(t)) => shape.replace(t).is_some(),
                ("descr" | "fortran_order" | "shape", _) => {
                    return Err(p.error(format!("`{key}` has the wrong type")))
                }
                _ => return Err(p.error(format!("unexpected key `{key}`"))),
            };
            if slot_taken {
                return Err(p.error(format!("repeated key `{key}`")));
            }
            match p.peek() {
                Some(b',') => p.at += 1,
                Some(b'}') => {}
                _ => return Err(p.error("expected `,` or `}`")),
            }
        }
        if !is_blank(&p.text[p.at..]) {
            p.skip_space();
            return Err(p.error("bytes after the header dict"));
        }
        match (descr, fortran, shape) {
            (Some(descr), Some(fortran_order), Some(shape)) => Ok(HeaderDict {
                descr,
                fortran_order,
                shape,
            }),
            _ => Err(p.error("the header needs `descr`, `fortran_order` and `shape`")),
        }
    }
}

/// True when `bytes` is all ASCII whitespace (as [`u8::is_ascii_whitespace`]): numpy
/// pads a header with spaces to a multiple of 64 bytes, checked in one pass the
/// compiler can vectorize rather than byte by byte.
fn is_blank(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .fold(true, |blank, &b| blank & b.is_ascii_whitespace())
}

/// The dtype of one of numpy's type names (`np.dtype("float32")`), in the machine's
/// byte order (little-endian on every platform tensorwire builds for).
fn numpy_type_name(name: &str) -> Option<DType> {
    Some(match name {
        "bool" => DType::Bool,
        "int8" => DType::I8,
        "int16" => DType::I16,
        "int32" => DType::I32,
        "int64" => DType::I64,
        "uint8" => DType::U8,
        "uint16" => DType::U16,
        "uint32" => DType::U32,
        "uint64" => DType::U64,
        "float16" | "half" => DType::F16,
        "float32" | "single" => DType::F32,
        "float64" | "double" => DType::F64,
        "complex64" => DType::Complex64,
        "complex128" => DType::Complex128,
        _ => return None,
    })
}

/// The dtype and byte order of a `descr` string.
fn parse_descr(descr: &str) -> Result<(DType, bool)> {
    // numpy's type names, which take no byte-order character.
    if let Some(dtype) = numpy_type_name(descr) {
        return Ok((dtype, false));
    }
    let (big_endian, code) = match descr.as_bytes().first() {
        Some(b'<' | b'|' | b'=') => (false, &descr[1..]),
        Some(b'>') => (true, &descr[1..]),
        _ => (false, descr),
    };
    let dtype = match code {
        "b1" => DType::Bool,
        "i1" => DType::I8,
        "i2" => DType::I16,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "u1" => DType::U8,
        "u2" => DType::U16,
        "u4" => DType::U32,
        "u8" => DType::U64,
        "f2" => DType::F16,
        "f4" => DType::F32,
        "f8" => DType::F64,
        "c8" => DType::Complex64,
        "c16" => DType::Complex128,
        // numpy's one-character codes (`np.dtype("<f")`) for the types whose width
        // does not depend on the platform (`l`, `L` and `g` do), as a hand-written
        // or another tool's header may spell them.
        "?" => DType::Bool,
        "b" => DType::I8,
        "B" => DType::U8,
        "h" => DType::I16,
        "H" => DType::U16,
        "i" => DType::I32,
        "I" => DType::U32,
        "q" => DType::I64,
        "Q" => DType::U64,
        "e" => DType::F16,
        "f" => DType::F32,
        "d" => DType::F64,
        "F" => DType::Complex64,
        "D" => DType::Complex128,
        _ => {
            let what = match code.as_bytes().first() {
                Some(b'O') => "object arrays hold pickled Python objects; refusing to load them",
                Some(b'U' | b'S' | b'a') => "string arrays are not tensors",
                Some(b'V') => "raw void arrays (ml_dtypes types such as bfloat16 save as these) have no element type",
                Some(b'M' | b'm') => "datetime arrays are not tensors",
                _ => "not a numeric or boolean type",
            };
            return Err(Error::unsupported(format!(".npy dtype `{descr}`: {what}")));
        }
    };
    Ok((dtype, big_endian))
}

/// Which container a [`NumpyReader`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumpyFormat {
    /// One `.npy` array.
    Npy,
    /// An `.npz` archive of `.npy` members.
    Npz,
}

/// Where an array's `.npy` bytes are.
#[derive(Debug, Clone)]
enum Location {
    /// An `.npy` file in memory (a map, a buffer), header included.
    Mapped(Bytes),
    /// A stored NPZ member: its whole `.npy` in memory, and the member's record.
    Stored { npy: Bytes, member: ZipEntry },
    /// A deflated NPZ member.
    Deflated(ZipEntry),
}

impl Location {
    /// The NPZ member holding the array (`None` in an `.npy` file).
    fn member(&self) -> Option<&ZipEntry> {
        match self {
            Location::Mapped(_) => None,
            Location::Stored { member, .. } | Location::Deflated(member) => Some(member),
        }
    }
}

struct ArrayRecord {
    header: NpyHeader,
    location: Location,
}

impl ArrayRecord {
    fn new(header: NpyHeader, location: Location) -> ArrayRecord {
        ArrayRecord { header, location }
    }

    /// Checks this array's NPZ member against its CRC-32 once per reader, by `check`
    /// (which computes and compares it): [`Error::DigestMismatch`] on a mismatch. An
    /// `.npy` file has no digest to check.
    fn check_crc(&self, check: impl FnOnce(&ZipEntry) -> Result<()>) -> Result<()> {
        match self.location.member() {
            Some(member) => member.check_once(check).map_err(naming_array),
            None => Ok(()),
        }
    }
}

/// A CRC mismatch or undecodable data of an NPZ member named for its array, as
/// tensors are listed: the ZIP layer names the member (`f2.npy`), the error says
/// ``tensor `f2` (NPZ member f2.npy)``.
fn naming_array(error: Error) -> Error {
    let named = |member: String| match member.strip_suffix(".npy") {
        Some(array) => format!("{array} (NPZ member {member})"),
        None => format!("NPZ member {member}"),
    };
    match error {
        Error::DigestMismatch {
            tensor,
            algorithm,
            expected,
            found,
        } => Error::DigestMismatch {
            tensor: named(tensor),
            algorithm,
            expected,
            found,
        },
        Error::Decode {
            tensor,
            encoding,
            reason,
        } => Error::Decode {
            tensor: named(tensor),
            encoding,
            reason,
        },
        other => other,
    }
}

/// An `.npy` file or `.npz` archive as a [`TensorSource`].
pub struct NumpyReader {
    format: NumpyFormat,
    input: Input,
    records: Vec<ArrayRecord>,
    index: TensorIndex,
    attributes: BTreeMap<String, Value>,
    limits: Limits,
    /// An `.npz` archive's records, with their CRC-32s for [`TensorSource::verify`].
    archive: Option<ZipArchive>,
}

impl NumpyReader {
    /// Maps `path` copy-on-write and reads it as `.npy` or `.npz` (by its magic).
    pub fn open(path: impl AsRef<Path>) -> Result<NumpyReader> {
        NumpyReader::open_with(path, &Limits::default())
    }

    /// [`NumpyReader::open`] with explicit limits.
    /// An `.npz` archive's member headers are read with positional reads of the file
    /// (see [`NumpyReader::npz`]); array bytes come from the map.
    pub fn open_with(path: impl AsRef<Path>, limits: &Limits) -> Result<NumpyReader> {
        let path = path.as_ref();
        crate::open_mapped(path, |bytes| {
            if sniff(&bytes) {
                return NumpyReader::from_bytes(bytes, limits);
            }
            let file = Arc::new(RangeFile::open(path)?);
            NumpyReader::npz(Input::mapped_with_file(bytes, file)?, limits)
        })
    }

    /// Reads an `.npy` or `.npz` image already in memory.
    pub fn from_bytes(bytes: Bytes, limits: &Limits) -> Result<NumpyReader> {
        if sniff(&bytes) {
            let header = parse_header(&bytes, limits)?;
            check_data(&header, bytes.len() as u64, NPY_TENSOR_NAME)?;
            let record = ArrayRecord::new(header, Location::Mapped(bytes.clone()));
            NumpyReader::new(
                NumpyFormat::Npy,
                Input::mapped(bytes),
                vec![(Arc::from(NPY_TENSOR_NAME), record, 0)],
                limits,
            )
        } else {
            NumpyReader::npz(Input::mapped(bytes), limits)
        }
    }

    /// Reads an `.npz` archive from `input`: a map, possibly with the file for the
    /// per-member headers (see [`Input::mapped_with_file`]; one positional read per
    /// member is cheaper than first touches of map pages spread over the file).
    pub fn npz(input: Input, limits: &Limits) -> Result<NumpyReader> {
        let archive = ZipArchive::parse_with_heads(
            &input,
            limits.max_tensors,
            limits.max_name_bytes,
            NPY_HEAD_READ,
        )?;
        let mut arrays = Vec::with_capacity(archive.entries().len());
        for entry in archive.entries() {
            // A folder's entry (an archive made with `zip -r`): no array, as `np.load`
            // lists it (its value is the empty bytes).
            if entry.name.ends_with('/') && entry.size == 0 {
                continue;
            }
            let name = entry.name.strip_suffix(".npy").unwrap_or(&entry.name);
            let (header, location) = match entry.method {
                Method::Stored => {
                    let npy = input.read(entry.data_offset, entry.size)?;
                    let head = stored_member_header(&input, entry, limits)?;
                    (
                        parse_member(&head, &entry.name, limits)?,
                        Location::Stored {
                            npy,
                            member: entry.clone(),
                        },
                    )
                }
                Method::Deflated => {
                    let head = inflate_head(&input, entry)?;
                    let header = parse_member(&head, &entry.name, limits)?;
                    Error::check_limit(
                        "decompressed zip record size",
                        entry.size,
                        limits.max_decoded_bytes,
                    )?;
                    (header, Location::Deflated(entry.clone()))
                }
            };
            check_data(&header, entry.size, &entry.name)?;
            arrays.push((
                Arc::from(name),
                ArrayRecord::new(header, location),
                entry.data_offset,
            ));
        }
        let mut reader = NumpyReader::new(NumpyFormat::Npz, input, arrays, limits)?;
        reader.archive = Some(archive);
        Ok(reader)
    }

    fn new(
        format: NumpyFormat,
        input: Input,
        arrays: Vec<(Arc<str>, ArrayRecord, u64)>,
        limits: &Limits,
    ) -> Result<NumpyReader> {
        let mut records = Vec::with_capacity(arrays.len());
        let mut index = TensorIndex::with_capacity(arrays.len());
        // Members with the same descr and order share one attribute map.
        let mut shared: Vec<(String, bool, Attributes)> = Vec::new();
        for (name, record, member_offset) in arrays {
            let h = &record.header;
            let (encoding, stored_bytes) = match &record.location {
                Location::Mapped(_) | Location::Stored { .. } => (None, h.nbytes),
                Location::Deflated(e) => (Some("deflate".to_owned()), e.compressed_size),
            };
            let known = shared
                .iter()
                .find(|(descr, fortran, _)| *descr == h.descr && *fortran == h.fortran_order);
            let attributes = match known {
                Some((_, _, a)) => a.clone(),
                None => {
                    let mut map =
                        BTreeMap::from([("npy.descr".to_owned(), Value::Str(h.descr.clone()))]);
                    if h.fortran_order {
                        map.insert("npy.fortran_order".to_owned(), Value::Bool(true));
                    }
                    let a = Attributes::from(map);
                    if shared.len() < SHARED_ATTRIBUTE_MAPS {
                        shared.push((h.descr.clone(), h.fortran_order, a.clone()));
                    }
                    a
                }
            };
            index.push(TensorInfo {
                name,
                dtype: h.dtype,
                shape: h.shape.clone(),
                layout: Layout::Dense,
                nbytes: h.nbytes,
                stored_bytes,
                offset: member_offset + if encoding.is_none() { h.data_offset } else { 0 },
                encoding,
                attributes,
            })?;
            records.push(record);
        }
        Ok(NumpyReader {
            format,
            input,
            records,
            index,
            attributes: Default::default(),
            limits: *limits,
            archive: None,
        })
    }

    /// Whether this is an `.npy` file or an `.npz` archive.
    pub fn numpy_format(&self) -> NumpyFormat {
        self.format
    }

    /// The parsed `.npy` header of an array.
    pub fn header(&self, name: &str) -> Result<&NpyHeader> {
        Ok(&self.records[self.position(name)?].header)
    }

    /// The array's element bytes as stored (file order, file byte order), and whether
    /// they borrow the input. A deflated member inflated whole (the array ends where
    /// the member does, as numpy writes it) is checked against its CRC-32 on the way.
    fn stored(&self, record: &ArrayRecord) -> Result<(Bytes, bool)> {
        let h = &record.header;
        let (npy, borrowed) = match &record.location {
            // Inputs are always maps (see `from_bytes`), so stored members borrow.
            Location::Mapped(npy) | Location::Stored { npy, .. } => (npy.clone(), true),
            // Inflated up to the array's end: bytes after it (numpy ignores them) are
            // never decompressed.
            Location::Deflated(entry) => {
                let end = h.data_end();
                let npy = read_entry_prefix(&self.input, entry, end, self.limits.max_decoded_bytes)
                    .map_err(naming_array)?;
                if end == entry.size {
                    record.check_crc(|member| member.check_crc32(&npy))?;
                }
                (npy, false)
            }
        };
        Ok((npy.slice_at(h.data_offset, h.nbytes)?, borrowed))
    }
}

/// Parses an NPZ member's header, naming the member in errors about its bytes.
fn parse_member(npy: &[u8], member: &str, limits: &Limits) -> Result<NpyHeader> {
    if !sniff(npy) {
        return Err(Error::unsupported(format!(
            "NPZ member `{member}` is not an .npy array"
        )));
    }
    parse_header(npy, limits).map_err(|e| match e {
        e @ (Error::Unsupported { .. } | Error::LimitExceeded { .. }) => e,
        e => Error::malformed(0, format!("NPZ member `{member}`: {e}")),
    })
}

/// Most distinct attribute maps a reader keeps for sharing (files rarely mix more
/// than a few dtypes; past this, maps are simply not shared).
const SHARED_ATTRIBUTE_MAPS: usize = 16;

/// Bytes of a member's start read along with its ZIP local header: enough for the
/// `.npy` header of the arrays numpy writes (their headers are padded to 64 or 128).
const NPY_HEAD_READ: u64 = 256;

/// The `.npy` header bytes of a stored NPZ member: the head read with its local
/// header when that covers the whole header, else read now (bounded by the member
/// and the metadata limit). Only these bytes are read at open, never the array.
fn stored_member_header(input: &Input, entry: &ZipEntry, limits: &Limits) -> Result<Bytes> {
    let covered = |head: &Bytes| {
        preamble(head).is_ok_and(|(_, _, fixed, len)| fixed + len <= head.len() as u64)
    };
    if let Some(head) = entry.head.as_ref().filter(|h| covered(h)) {
        return Ok(head.clone());
    }
    let first = input.read_meta_up_to(entry.data_offset, NPY_HEAD_READ.min(entry.size))?;
    let Ok((_, _, fixed, len)) = preamble(&first) else {
        // Not an .npy start: `parse_member` names the problem.
        return Ok(first);
    };
    let total = fixed.saturating_add(len).min(entry.size);
    if total <= first.len() as u64 {
        return Ok(first);
    }
    Error::check_limit(".npy header size", total, limits.max_metadata_bytes)?;
    input.read_meta(entry.data_offset, total)
}

/// Checks the elements fit in the `.npy` bytes (`available` long).
fn check_data(header: &NpyHeader, available: u64, name: &str) -> Result<()> {
    let end = header
        .data_offset
        .checked_add(header.nbytes)
        .ok_or(Error::Overflow {
            what: ".npy data end",
        })?;
    if end > available {
        return Err(Error::OutOfBounds {
            tensor: name.to_owned(),
            offset: header.data_offset,
            length: header.nbytes,
            limit: available,
        });
    }
    Ok(())
}

/// Compressed bytes of a deflated member read at a time while inflating its head.
const INFLATE_CHUNK: u64 = 16 << 10;

/// The first bytes of a deflated member's stream, inflated as they are asked for:
/// the compressed bytes are read [`INFLATE_CHUNK`] at a time (the first from the
/// head read with the member's local header), never the whole member at once.
struct HeadInflater<'a> {
    input: &'a Input,
    entry: &'a ZipEntry,
    state: Box<miniz_oxide::inflate::stream::InflateState>,
    /// Compressed bytes read, of which the first `consumed` went into the stream.
    chunk: Bytes,
    consumed: usize,
    /// Compressed bytes of the member read so far.
    read: u64,
    /// The output buffer, of which the first `filled` bytes are inflated.
    out: Vec<u8>,
    filled: usize,
    /// True once the stream ended or its compressed bytes ran out.
    done: bool,
}

impl<'a> HeadInflater<'a> {
    fn new(input: &'a Input, entry: &'a ZipEntry) -> HeadInflater<'a> {
        let chunk = entry.head.clone().unwrap_or_else(Bytes::empty);
        HeadInflater {
            input,
            entry,
            state: miniz_oxide::inflate::stream::InflateState::new_boxed(
                miniz_oxide::DataFormat::Raw,
            ),
            read: chunk.len() as u64,
            chunk,
            consumed: 0,
            out: Vec::new(),
            filled: 0,
            done: false,
        }
    }

    fn decode_error(&self, reason: String) -> Error {
        Error::Decode {
            tensor: self.entry.name.to_string(),
            encoding: "deflate".into(),
            reason,
        }
    }

    /// Inflates until `want` bytes (at most the member's size) are out, the stream
    /// ends or its compressed bytes run out; returns everything inflated so far.
    fn inflate_to(&mut self, want: u64) -> Result<&[u8]> {
        let want = usize::try_from(want.min(self.entry.size)).unwrap_or(usize::MAX);
        if self.out.len() < want {
            self.out.resize(want, 0);
        }
        while !self.done && self.filled < want {
            if self.consumed == self.chunk.len() {
                if self.read >= self.entry.compressed_size {
                    self.done = true;
                    break;
                }
                let len = INFLATE_CHUNK.min(self.entry.compressed_size - self.read);
                self.chunk = self
                    .input
                    .read_meta(self.entry.data_offset + self.read, len)?;
                self.consumed = 0;
                self.read += len;
            }
            let result = miniz_oxide::inflate::stream::inflate(
                &mut self.state,
                &self.chunk[self.consumed..],
                &mut self.out[self.filled..want],
                miniz_oxide::MZFlush::None,
            );
            self.filled += result.bytes_written;
            self.consumed += result.bytes_consumed;
            match result.status {
                Ok(miniz_oxide::MZStatus::StreamEnd) => self.done = true,
                // `Buf`: the input given was used up; the next turn reads more.
                Ok(_) | Err(miniz_oxide::MZError::Buf) => {
                    let stalled = result.bytes_consumed == 0 && result.bytes_written == 0;
                    if stalled && self.consumed < self.chunk.len() {
                        // Input and room for output, and neither used: never loop.
                        return Err(self.decode_error("the stream makes no progress".into()));
                    }
                }
                Err(e) => return Err(self.decode_error(format!("{e:?}"))),
            }
        }
        Ok(&self.out[..self.filled])
    }

    /// Everything inflated so far.
    fn into_inflated(mut self) -> Vec<u8> {
        self.out.truncate(self.filled);
        self.out
    }
}

/// Inflates the first bytes of a deflated member, enough for its `.npy` header,
/// reading its compressed bytes a chunk at a time: only as many as those bytes need.
fn inflate_head(input: &Input, entry: &ZipEntry) -> Result<Vec<u8>> {
    let mut inflater = HeadInflater::new(input, entry);
    let head = inflater.inflate_to(NPY_HEAD_READ)?;
    let whole = head.len() as u64 == entry.size;
    if !sniff(head) || whole {
        // Not an array, or all of the member: `parse_member` names the problem.
        return Ok(inflater.into_inflated());
    }
    let (_, _, fixed, len) = match preamble(head) {
        Ok(found) => found,
        Err(e @ Error::Truncated { .. }) => {
            return Err(inflater.decode_error(format!("inflated member too short: {e}")))
        }
        Err(e) => return Err(e),
    };
    // `preamble` held `len` to `MAX_HEADER_BYTES`: at most that much is inflated.
    inflater.inflate_to(fixed + len)?;
    Ok(inflater.into_inflated())
}

impl TensorSource for NumpyReader {
    fn format(&self) -> &'static str {
        match self.format {
            NumpyFormat::Npy => "npy",
            NumpyFormat::Npz => "npz",
        }
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

    /// Zero-copy for a little-endian C-order array of a map or stored member (no byte
    /// of it is read); a row-major (and byte-swapped) copy otherwise, made after the
    /// member's CRC-32 is checked ([`TensorSource::check_record_at`]), as for every
    /// copy of a stored member.
    fn view_at(&self, position: usize) -> Result<TensorView> {
        let strided = self.strided_at(position)?;
        let name = &self.index.at(position).name;
        if strided.is_contiguous() {
            return TensorView::new(
                name,
                strided.dtype,
                strided.shape,
                strided.bytes,
                strided.zero_copy,
            );
        }
        if strided.zero_copy {
            self.check_record_at(position)?; // a copy of the map's bytes: the CRC first
        }
        let row_major = strided.to_contiguous(self.limits.max_decoded_bytes)?;
        TensorView::new(
            name,
            strided.dtype,
            strided.shape,
            row_major.into_bytes(),
            false,
        )
    }

    /// The array as stored: Fortran-order arrays keep their column-major strides
    /// (zero-copy from a map).
    fn strided_at(&self, position: usize) -> Result<StridedView> {
        self.index.checked_at(position)?;
        let record = &self.records[position];
        let h = &record.header;
        let (mut bytes, mut zero_copy) = self.stored(record)?;
        if h.big_endian {
            if zero_copy {
                self.check_record_at(position)?; // a copy of the map's bytes: the CRC first
            }
            let mut copy = AlignedBuf::copy_from(&bytes)?;
            swap_bytes(copy.as_mut_slice(), h.dtype);
            (bytes, zero_copy) = (copy.into_bytes(), false);
        }
        let strides = h
            .fortran_order
            .then(|| column_major_strides(h.shape.dims()));
        Ok(StridedView {
            dtype: h.dtype,
            shape: h.shape.clone(),
            strides,
            bytes,
            zero_copy,
        })
    }

    /// A stored member's CRC-32, over its bytes as the file holds them (not the
    /// private map, which a zero-copy array may have written to), once per reader.
    /// A deflated member is checked by the read that inflates it to its end (the
    /// array's read: numpy writes nothing after it); one with bytes after its array
    /// is not inflated again to check them, as `np.load`, which reads just the
    /// array, never checks it either.
    fn check_record_at(&self, position: usize) -> Result<()> {
        self.index.checked_at(position)?;
        let record = &self.records[position];
        match &record.location {
            Location::Stored { .. } => record.check_crc(|member| {
                member.check_stored_data(&self.input, self.limits.max_decoded_bytes)
            }),
            Location::Mapped(_) | Location::Deflated(_) => Ok(()),
        }
    }

    /// Checks every `.npz` member's CRC-32 (inflating deflated ones), as `np.load`
    /// does when it reads them; an `.npy` file has no digest (`Ok(0)`).
    fn verify(&self) -> Result<usize> {
        match &self.archive {
            Some(archive) => archive
                .verify(&self.input, self.limits.max_decoded_bytes, false)
                .map_err(naming_array),
            None => Ok(0),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(dict: &str, data: &[u8]) -> Vec<u8> {
        let mut header = dict.to_owned();
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&[1, 0]);
        v.extend_from_slice(&(header.len() as u16).to_le_bytes());
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        v
    }

    fn open(bytes: Vec<u8>) -> Result<NumpyReader> {
        NumpyReader::from_bytes(Bytes::from_vec(bytes), &Limits::default())
    }

    /// The dict `HeaderDict::parse` reads from `text`, as comparable values.
    fn general(text: &str) -> Option<(String, bool, Vec<u64>)> {
        HeaderDict::parse(text, 0, true)
            .ok()
            .map(|d| (d.descr.to_owned(), d.fortran_order, d.shape.to_vec()))
    }

    fn canonical(text: &str) -> Option<(String, bool, Vec<u64>)> {
        HeaderDict::parse_canonical(text)
            .map(|d| (d.descr.to_owned(), d.fortran_order, d.shape.to_vec()))
    }

    #[test]
    fn descr_takes_numpys_character_codes_and_type_names() {
        for (descr, dtype, big) in [
            ("<f", DType::F32, false),
            (">d", DType::F64, true),
            ("?", DType::Bool, false),
            ("=B", DType::U8, false),
            ("h", DType::I16, false),
            ("<Q", DType::U64, false),
            ("e", DType::F16, false),
            ("D", DType::Complex128, false),
            ("float32", DType::F32, false),
            ("double", DType::F64, false),
            ("uint16", DType::U16, false),
            ("bool", DType::Bool, false),
            ("complex64", DType::Complex64, false),
        ] {
            assert_eq!(parse_descr(descr).unwrap(), (dtype, big), "{descr}");
        }
        // A name takes no byte order (numpy refuses `<float32` too); `l`, `L` and
        // `g` are as wide as the platform makes them.
        for descr in ["<float32", ">int64", "l", "L", "g", "int", "float", "x"] {
            assert!(parse_descr(descr).is_err(), "{descr}");
        }
        // As numpy reads them, with Python's `u` prefix on the string too.
        let values = [1.5f32, -2.0];
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        for descr in ["'<f'", "'float32'", "u'<f4'", "U\"f\""] {
            let dict = format!("{{'descr': {descr}, 'fortran_order': False, 'shape': (2,), }}");
            let r = open(npy(&dict, &data)).unwrap();
            assert_eq!(r.tensors()[0].dtype, DType::F32, "{descr}");
            assert_eq!(&*r.view_at(0).unwrap().bytes, &data[..], "{descr}");
        }
    }

    #[test]
    fn numpy_written_headers_take_the_canonical_path() {
        for text in [
            "{'descr': '<f8', 'fortran_order': False, 'shape': (), }   \n",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (32000, 768), }  \n",
            "{'descr': '<f8', 'fortran_order': False, 'shape': (5,), }\n",
            "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }  \n",
            "{'descr': '|b1', 'fortran_order': False, 'shape': (0, 9999999999999999999), } \n",
        ] {
            let fast = canonical(text);
            assert!(fast.is_some(), "{text:?}");
            assert_eq!(fast, general(text), "{text:?}");
        }
        // Left to the general parser (which reads or refuses them).
        for text in [
            "{'descr': '<f8', 'shape': (5,), 'fortran_order': False, }\n",
            "{'descr':'<f8', 'fortran_order': False, 'shape': (5,), }\n",
            "{'descr': '<f8', 'fortran_order': False, 'shape': (05,), }\n",
            "{'descr': '<f8', 'fortran_order': False, 'shape': (5), }\n",
            "{'descr': '<f8', 'fortran_order': False, 'shape': (5, 6,), }\n",
            "{'descr': '<f8', 'fortran_order': False, 'shape': (5L,), }\n",
            "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1), }\n",
            "{'descr': '<f8', 'fortran_order': False, 'shape': (5,), }x\n",
            "{'descr': '<f\\8', 'fortran_order': False, 'shape': (5,), }\n",
            "{'descr': '<f8', 'fortran_order': False, 'shape': (18446744073709551615,), }\n",
        ] {
            assert_eq!(canonical(text), None, "{text:?}");
        }
    }

    proptest::proptest! {
        /// Whatever the canonical path accepts, the general parser reads alike.
        #[test]
        fn the_canonical_path_agrees_with_the_general_parser(
            descr in "[<>|=]?[a-zA-Z][0-9]{0,2}",
            fortran in proptest::bool::ANY,
            dims in proptest::collection::vec(
                proptest::prop_oneof![0u64..4, proptest::num::u64::ANY], 0..10),
            spacing in 0usize..6,
            tail in "[ \t\n]{0,4}[x}]?[ \n]{0,3}",
        ) {
            let shape = match (dims.len(), spacing) {
                (1, 0) => format!("({},)", dims[0]),
                (1, 1) => format!("({})", dims[0]),
                (_, 2) => format!("({},)", dims.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")),
                (_, 3) => format!("({})", dims.iter().map(u64::to_string).collect::<Vec<_>>().join(",")),
                (_, 4) => format!("( {} )", dims.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")),
                _ => format!("({})", dims.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")),
            };
            let fortran = if fortran { "True" } else { "False" };
            let text = format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}{tail}");
            if let Some(fast) = canonical(&text) {
                proptest::prop_assert_eq!(Some(fast), general(&text), "{:?}", text);
            }
        }
    }

    #[test]
    fn shapes_of_every_rank_parse_alike() {
        // Ranks 0 to 12 cross the parser's 8 inline dimensions; sizes of 1 and 2
        // keep the data small.
        for rank in 0..=12usize {
            let dims: Vec<u64> = (0..rank).map(|i| 1 + (i % 2) as u64).collect();
            let text = match rank {
                0 => "()".to_owned(),
                1 => format!("({},)", dims[0]),
                _ => format!(
                    "({})",
                    dims.iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            let n: u64 = dims.iter().product();
            let dict = format!("{{'descr': '|u1', 'fortran_order': False, 'shape': {text}, }}");
            let r = open(npy(&dict, &vec![7u8; n as usize])).unwrap();
            let info = r.info(NPY_TENSOR_NAME).unwrap();
            assert_eq!(info.shape.dims(), &dims[..], "rank {rank}");
        }
    }

    #[test]
    fn reads_c_fortran_and_big_endian_arrays() {
        let data: Vec<u8> = (0u8..6).collect();
        let c = open(npy(
            "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3), }",
            &data,
        ))
        .unwrap();
        let v = c.view(NPY_TENSOR_NAME).unwrap();
        assert!(v.zero_copy);
        assert_eq!(&*v.bytes, &data[..]);

        let f = open(npy(
            "{'descr': '|u1', 'fortran_order': True, 'shape': (2, 3), }",
            &data,
        ))
        .unwrap();
        let s = f.strided(NPY_TENSOR_NAME).unwrap();
        assert!(s.zero_copy && !s.is_contiguous());
        assert_eq!(s.strides, Some(vec![1, 2]));
        assert_eq!(
            &*f.view(NPY_TENSOR_NAME).unwrap().bytes,
            &[0, 2, 4, 1, 3, 5]
        );

        let be = open(npy(
            "{'descr': '>u2', 'fortran_order': False, 'shape': (1,), }",
            &[1, 2],
        ))
        .unwrap();
        let v = be.view(NPY_TENSOR_NAME).unwrap();
        assert!(!v.zero_copy);
        assert_eq!(&*v.bytes, &[2, 1]);
    }

    #[test]
    fn refuses_what_is_not_a_tensor() {
        let dict = |d: &str| format!("{{'descr': '{d}', 'fortran_order': False, 'shape': (1,), }}");
        for descr in ["|O", "<U3", "|S4", "|V2", "<M8[ns]", "<f16"] {
            assert!(
                matches!(
                    open(npy(&dict(descr), &[0; 16])),
                    Err(Error::Unsupported { .. })
                ),
                "{descr}"
            );
        }
        let structured = "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }";
        assert!(matches!(
            open(npy(structured, &[0; 4])),
            Err(Error::Unsupported { .. })
        ));
    }

    #[test]
    fn malformed_headers_are_typed_errors() {
        let bad = [
            "{'descr': '<f4', 'fortran_order': False}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}",
            "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}",
            "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} trailing",
            // `(1)` is an int in Python, so numpy refuses the header.
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1)}",
            "{'descr: '<f4'",
            "[]",
            // A list is not a shape (numpy: "shape is not valid"), nor any other value.
            "{'descr': '<f4', 'fortran_order': False, 'shape': [6]}",
            "{'descr': '<f4', 'fortran_order': [False], 'shape': (6,)}",
        ];
        for dict in bad {
            let err = open(npy(dict, &[0; 4])).err().expect(dict);
            assert!(err.is_corrupt_data(), "{dict}: {err}");
        }
        let short = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
            &[0; 4],
        );
        assert!(matches!(open(short), Err(Error::OutOfBounds { .. })));
        let huge = npy(
            "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296), }",
            &[],
        );
        assert!(open(huge).is_err());
        let mut v3 = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (), }",
            &[0; 4],
        );
        v3[6] = 9;
        assert!(matches!(open(v3), Err(Error::Unsupported { .. })));
        assert!(matches!(open(MAGIC.to_vec()), Err(Error::Truncated { .. })));
    }
}
