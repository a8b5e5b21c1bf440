//! Decoded packets of every kind.

use tensorwire_core::{Bytes, DType, Error, Result, Shape, TensorView};

/// A decoded packet: what [`decode_packet`](crate::decode_packet) returns.
///
/// Dense bodies, bundle members, sparse parts, string and ragged components borrow the
/// input [`Bytes`] (zero-copy); only LZ4 bodies are decompressed into a new 64-aligned
/// buffer.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Packet {
    /// A dense tensor (flags 0x01/0x02/0x04/0x80 only).
    Dense(TensorView),
    /// A sparse COO, CSR or CSC matrix (flag 0x08, 0x20 or 0x40).
    Sparse(SparsePacket),
    /// A bundle of named packets (flag 0x10).
    Bundle(Bundle),
    /// A batch of variable-length strings (flag 0x100, dtype code 20).
    Strings(StringPacket),
    /// A ragged array: a bundle with tenso's `__ragged_*__` keys, or a flag-0x200 packet.
    Ragged(RaggedPacket),
    /// A quantized tensor (dtype codes 16–19).
    Quantized(QuantizedPacket),
    /// A reference to memory on a GPU (flag 0x400).
    IpcRef(IpcRef),
}

impl Packet {
    /// The kind's short name (`dense`, `sparse`, `bundle`, `strings`, `ragged`,
    /// `quantized`, `ipc_ref`).
    pub fn kind(&self) -> &'static str {
        match self {
            Packet::Dense(_) => "dense",
            Packet::Sparse(_) => "sparse",
            Packet::Bundle(_) => "bundle",
            Packet::Strings(_) => "strings",
            Packet::Ragged(_) => "ragged",
            Packet::Quantized(_) => "quantized",
            Packet::IpcRef(_) => "ipc_ref",
        }
    }

    /// The dense tensor, if this is one.
    pub fn as_dense(&self) -> Option<&TensorView> {
        match self {
            Packet::Dense(v) => Some(v),
            _ => None,
        }
    }
}

/// A bundle: named member packets in wire order (tenso's dict).
#[derive(Debug, Clone, Default)]
pub struct Bundle {
    /// `(key, member)` pairs in the order the packet stores them; keys are unique.
    pub entries: Vec<(String, Packet)>,
}

impl Bundle {
    /// The member stored under `key`.
    pub fn get(&self, key: &str) -> Option<&Packet> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, p)| p)
    }
}

/// The storage format of a sparse matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SparseFormat {
    /// Coordinate list (flag 0x08): values, row indices, column indices.
    Coo,
    /// Compressed sparse row (flag 0x20): values, column indices, row pointers.
    Csr,
    /// Compressed sparse column (flag 0x40): values, row indices, column pointers.
    Csc,
}

impl SparseFormat {
    /// The packet flag of the format.
    pub fn flag(self) -> u16 {
        match self {
            SparseFormat::Coo => crate::flags::SPARSE_COO,
            SparseFormat::Csr => crate::flags::SPARSE_CSR,
            SparseFormat::Csc => crate::flags::SPARSE_CSC,
        }
    }

    /// scipy's name for the format (`coo`, `csr`, `csc`).
    pub fn name(self) -> &'static str {
        match self {
            SparseFormat::Coo => "coo",
            SparseFormat::Csr => "csr",
            SparseFormat::Csc => "csc",
        }
    }

    /// scipy's attribute names of the three parts, in wire order: `data, row, col`
    /// (COO) or `data, indices, indptr` (CSR, CSC).
    pub fn part_names(self) -> [&'static str; 3] {
        match self {
            SparseFormat::Coo => ["data", "row", "col"],
            SparseFormat::Csr | SparseFormat::Csc => ["data", "indices", "indptr"],
        }
    }
}

/// The logical shape of a sparse matrix: `[rows, columns]`, each below 2³² as the
/// wire stores them. Unlike a [`Shape`], the element count may pass `i64::MAX` (a
/// 2³² − 1 square matrix, which tenso reads): only the stored values are arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MatrixShape {
    /// Number of rows.
    pub rows: u64,
    /// Number of columns.
    pub cols: u64,
}

impl MatrixShape {
    /// The shape of `dims`, which must be 2-D: tenso rebuilds every sparse packet as
    /// a 2-D scipy matrix (it writes a 1-D `csr_array` but cannot read it back).
    pub fn from_dims(dims: &[u64]) -> std::result::Result<MatrixShape, String> {
        match *dims {
            [rows, cols] => Ok(MatrixShape { rows, cols }),
            _ => Err(format!(
                "sparse packets hold 2-D matrices, not {}-D ones",
                dims.len()
            )),
        }
    }

    /// `[rows, cols]`.
    pub fn dims(&self) -> [u64; 2] {
        [self.rows, self.cols]
    }
}

impl std::fmt::Display for MatrixShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}, {}]", self.rows, self.cols)
    }
}

/// A sparse matrix: its logical shape and three 1-D dense parts.
#[derive(Debug, Clone)]
pub struct SparsePacket {
    /// COO, CSR or CSC.
    pub format: SparseFormat,
    /// The matrix shape.
    pub shape: MatrixShape,
    /// The stored values (first part).
    pub data: TensorView,
    /// Second part: row indices (COO) or the compressed axis' minor indices, scipy's
    /// `indices` (CSR: column of each value, CSC: row of each value).
    pub indices: TensorView,
    /// Third part: column indices (COO) or scipy's `indptr` (CSR: where each row
    /// starts in `data`, CSC: where each column starts), `n + 1` entries.
    pub pointers: TensorView,
}

/// A batch of strings: `count + 1` little-endian `u64` byte offsets into a payload.
///
/// Offsets are checked on decode (start at 0, never decrease, end at the payload
/// length). Elements are the payload bytes between two offsets; tenso writes UTF-8 but
/// does not require it, so [`StringPacket::get_str`] checks each element.
#[derive(Debug, Clone)]
pub struct StringPacket {
    /// `count + 1` offsets (`u64`, shape `[count + 1]`), borrowed from the packet.
    pub offsets: TensorView,
    /// The concatenated elements (`u8`, shape `[payload length]`), borrowed.
    pub payload: TensorView,
}

impl StringPacket {
    /// Number of strings.
    pub fn count(&self) -> usize {
        (self.offsets.bytes.len() / 8).saturating_sub(1)
    }

    /// True when the batch holds no strings.
    pub fn is_empty(&self) -> bool {
        self.count() == 0
    }

    fn offset(&self, i: usize) -> Option<usize> {
        let at = i.checked_mul(8)?;
        let b = self.offsets.bytes.get(at..at.checked_add(8)?)?;
        usize::try_from(u64::from_le_bytes(b.try_into().ok()?)).ok()
    }

    /// The bytes of string `i`, `None` past the end.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        if i >= self.count() {
            return None;
        }
        self.payload
            .bytes
            .get(self.offset(i)?..self.offset(i.checked_add(1)?)?)
    }

    /// String `i` as UTF-8 (`Malformed` when it is not valid UTF-8, `NotFound` past
    /// the end).
    pub fn get_str(&self, i: usize) -> Result<&str> {
        let bytes = self.get(i).ok_or_else(|| Error::NotFound {
            name: format!("string {i}"),
        })?;
        std::str::from_utf8(bytes).map_err(|e| {
            Error::malformed(
                self.offset(i).unwrap_or(0).saturating_add(e.valid_up_to()) as u64,
                format!("string {i} is not valid UTF-8"),
            )
        })
    }

    /// The payload as one shared [`Bytes`].
    pub fn payload_bytes(&self) -> &Bytes {
        &self.payload.bytes
    }

    /// Every string's bytes, in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.count()).filter_map(move |i| self.get(i))
    }
}

/// How a ragged array was framed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RaggedFraming {
    /// What tenso's `RaggedArray.dumps` writes: a bundle with exactly the keys
    /// `__ragged_offsets__`, `__ragged_flat__`, `__ragged_count__`, in that order.
    Bundle,
    /// A flag-0x200 packet (tenso's Rust core reads it; tenso writes none): offsets and
    /// payload in one body, the offsets counting bytes on the wire.
    Flag,
}

/// A ragged array: `count` rows of different lengths stored back to back in `flat`.
#[derive(Debug, Clone)]
pub struct RaggedPacket {
    /// `count + 1` row starts (`u64`, shape `[count + 1]`), counting elements of
    /// `flat`, from 0, never decreasing, ending at `flat`'s length. Borrowed for the
    /// bundle framing; for the flag framing, converted from the wire's byte offsets.
    pub offsets: TensorView,
    /// The rows' elements, 1-D.
    pub flat: TensorView,
    /// How the packet framed it.
    pub framing: RaggedFraming,
}

impl RaggedPacket {
    /// Number of rows.
    pub fn count(&self) -> usize {
        (self.offsets.bytes.len() / 8).saturating_sub(1)
    }
}

/// How a quantized tensor's scales apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantScheme {
    /// One scale and zero point for the whole tensor (wire value 0).
    PerTensor,
    /// One per slice along `axis` (wire value 1).
    PerChannel,
    /// One per `group_size` consecutive elements (wire value 2).
    PerGroup,
}

impl QuantScheme {
    /// The wire byte.
    pub fn code(self) -> u8 {
        match self {
            QuantScheme::PerTensor => 0,
            QuantScheme::PerChannel => 1,
            QuantScheme::PerGroup => 2,
        }
    }

    /// The scheme of a wire byte.
    pub fn from_code(code: u8) -> Option<QuantScheme> {
        match code {
            0 => Some(QuantScheme::PerTensor),
            1 => Some(QuantScheme::PerChannel),
            2 => Some(QuantScheme::PerGroup),
            _ => None,
        }
    }

    /// tenso's name (`per_tensor`, `per_channel`, `per_group`).
    pub fn name(self) -> &'static str {
        match self {
            QuantScheme::PerTensor => "per_tensor",
            QuantScheme::PerChannel => "per_channel",
            QuantScheme::PerGroup => "per_group",
        }
    }
}

/// A quantized tensor: packed integers plus affine parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedPacket {
    /// [`DType::QInt8`], [`DType::QUInt8`], [`DType::QInt4`] or [`DType::QUInt4`].
    pub dtype: DType,
    /// The logical shape.
    pub shape: Shape,
    /// How the scales apply.
    pub scheme: QuantScheme,
    /// The channel axis (per-channel), one wire byte: tenso writes `axis & 0xFF`, so
    /// axis −1 reads as 255.
    pub axis: u8,
    /// Elements per group (per-group; tenso writes 0 otherwise).
    pub group_size: u32,
    /// Scales, one per tensor / channel / group.
    pub scales: Vec<f32>,
    /// Zero points, as many as scales.
    pub zero_points: Vec<f32>,
    /// The packed body, borrowed: one byte per element for the 8-bit types; two per byte
    /// for the 4-bit types (element `2i` in the low nibble), `ceil(n / 2)` bytes.
    pub data: Bytes,
}

impl QuantizedPacket {
    /// The packed body as a tensor view of the quantized dtype.
    pub fn view(&self) -> Result<TensorView> {
        TensorView::new(
            "quantized body",
            self.dtype,
            self.shape.clone(),
            self.data.clone(),
            true,
        )
    }
}

/// A GPU IPC reference: where another process's device allocation lives. The wire
/// carries no dtype or shape (header dtype 0, ndim 0); the receiver knows them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IpcRef {
    /// The opaque IPC handle (e.g. `cudaIpcMemHandle_t`).
    pub handle: [u8; 64],
    /// Offset of the tensor in the shared allocation.
    pub byte_offset: u64,
    /// Length of the tensor in bytes.
    pub nbytes: u64,
    /// The device's UUID.
    pub device_uuid: [u8; 16],
}
