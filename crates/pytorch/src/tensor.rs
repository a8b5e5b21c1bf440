//! Tensors as a checkpoint describes them: a storage, an element offset, sizes and
//! strides, and the arithmetic that turns them into byte ranges, checked.

use std::collections::BTreeMap;
use std::sync::Arc;

use tensorwire_core::{
    AlignedBuf, DType, Dims, Error, Layout, Result, Shape, TensorInfo, MAX_NDIM,
};

use crate::pickle::{Arena, Id, Obj};

/// A storage named by a persistent id `('storage', storage_type, key, location,
/// numel[, view_metadata])`.
#[derive(Debug, Clone, PartialEq)]
pub struct StorageRef {
    /// The record (ZIP) or pointer string (legacy) that holds the bytes.
    pub key: Arc<str>,
    /// The storage class's element type (`u8` for untyped storages).
    pub dtype: DType,
    /// True for a quantized tensor's storage (`torch.QInt8Storage` …).
    pub quantized: bool,
    /// Elements in the stored storage.
    pub numel: u64,
    /// Where the tensor lived when saved (`cpu`, `cuda:0`).
    pub location: Arc<str>,
    /// Legacy files of old torch versions only: the tensor uses the window
    /// `(element offset, element count)` of the stored storage.
    pub view: Option<(u64, u64)>,
}

impl StorageRef {
    /// Size of the stored storage in bytes.
    pub fn nbytes(&self) -> Result<u64> {
        self.dtype.byte_len(self.numel)
    }

    /// The byte range `[start, end)` of the stored storage that tensors on this
    /// storage index into (all of it unless it is a view).
    pub fn window(&self) -> Result<(u64, u64)> {
        let (first, count) = self.view.unwrap_or((0, self.numel));
        let elem = self.dtype.bits() / 8;
        let overflow = || Error::Overflow {
            what: "storage view range",
        };
        let start = first.checked_mul(elem).ok_or_else(overflow)?;
        let end = first
            .checked_add(count)
            .and_then(|n| n.checked_mul(elem))
            .ok_or_else(overflow)?;
        Ok((start, end))
    }

    /// Parses the persistent id tuple (5 fields in ZIP files, 6 in legacy ones).
    pub fn from_persistent_id(arena: &Arena, pid: Id, offset: u64) -> Result<StorageRef> {
        let bad = |reason: &str| Error::malformed(offset, format!("persistent id: {reason}"));
        let items = arena.items(pid).ok_or_else(|| bad("not a tuple"))?;
        match items.first().map(|&i| arena.get(i)) {
            Some(Obj::Str(tag)) if &**tag == "storage" => {}
            Some(Obj::Str(tag)) if &**tag == "module" => {
                return Err(Error::RefusedGlobal {
                    global: "a pickled nn.Module class (persistent id 'module')".into(),
                    offset,
                })
            }
            _ => return Err(bad("not a ('storage', ...) tuple")),
        }
        if items.len() != 5 && items.len() != 6 {
            return Err(bad("expected 5 or 6 fields"));
        }
        let (dtype, quantized) = match arena.get(items[1]) {
            Obj::Global(crate::globals::Global::Storage(class)) => (class.dtype, class.quantized),
            Obj::Global(crate::globals::Global::Dtype(d)) => (*d, false),
            _ => return Err(bad("the storage type is not a storage class")),
        };
        let key = match arena.get(items[2]) {
            Obj::Str(s) => s.clone(),
            Obj::Int(n) => n.to_string().into(),
            _ => return Err(bad("the key is not a string")),
        };
        let location = match arena.get(items[3]) {
            Obj::Str(s) => s.clone(),
            _ => return Err(bad("the location is not a string")),
        };
        let numel = match arena.get(items[4]) {
            Obj::Int(n) if *n >= 0 => *n as u64,
            _ => return Err(bad("the element count is not a non-negative int")),
        };
        let mut view = None;
        if let Some(&meta) = items.get(5) {
            match arena.items(meta) {
                None if arena.get(meta) == &Obj::None => {}
                Some(&[_view_key, first, count]) => {
                    let (Obj::Int(first), Obj::Int(count)) = (arena.get(first), arena.get(count))
                    else {
                        return Err(bad("bad view metadata"));
                    };
                    let (Ok(first), Ok(count)) = (u64::try_from(*first), u64::try_from(*count))
                    else {
                        return Err(bad("bad view metadata"));
                    };
                    if first.checked_add(count).is_none_or(|end| end > numel) {
                        return Err(bad("the view lies outside its storage"));
                    }
                    view = Some((first, count));
                }
                _ => return Err(bad("bad view metadata")),
            }
        }
        let storage = StorageRef {
            key,
            dtype,
            quantized,
            numel,
            location,
            view,
        };
        storage.nbytes()?;
        Ok(storage)
    }
}

/// A tensor: `dtype` elements of `storage`, starting `storage_offset` elements in,
/// laid out by `shape` and `strides` (both in elements).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRecord {
    /// The storage holding the elements.
    pub storage: StorageRef,
    /// Element type of the tensor.
    pub dtype: DType,
    /// Offset of the first element, in elements of `dtype`.
    pub storage_offset: u64,
    /// Sizes.
    pub shape: Shape,
    /// Strides, in elements.
    pub strides: Dims,
    /// For a quantized tensor (`_rebuild_qtensor`), how its integers (`dtype`: i8
    /// for `torch.qint8`, u8 for `quint8`, i32 for `qint32`) map to real values.
    pub quantization: Option<Box<Quantization>>,
    /// The `requires_grad` flag torch sets on the tensor (only floating-point and
    /// complex tensors have it set).
    pub requires_grad: bool,
    /// Pickled as an `nn.Parameter` (`_rebuild_parameter`), which `torch.load`
    /// returns as one.
    pub parameter: bool,
    /// For a torch dtype tensorwire has no [`DType`] for, that dtype: `dtype`,
    /// `shape`, `strides` and `storage_offset` then describe the elements holding it
    /// ([`TorchOnlyDType::holder`]); [`TensorRecord::torch_view`] gives torch's.
    pub torch_only: Option<TorchOnlyDType>,
    /// torch's conjugate bit (`Tensor.is_conj()`, a complex tensor saved as a lazy
    /// `conj()` view): the stored elements are the conjugates of the tensor's.
    pub is_conj: bool,
    /// torch's negative bit (`Tensor.is_neg()`, a lazy negative view such as
    /// `z.conj().imag`): the stored elements are the negatives of the tensor's.
    pub is_neg: bool,
}

/// The dtype a `_rebuild_tensor_v3` call names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorDType {
    /// One tensorwire has.
    Tensorwire(DType),
    /// One only torch has.
    TorchOnly(TorchOnlyDType),
}

impl TensorDType {
    /// Bytes per element, as torch counts them (a complex32 is 4).
    pub fn element_size(self) -> u64 {
        match self {
            TensorDType::Tensorwire(dtype) => dtype.bits().div_ceil(8),
            TensorDType::TorchOnly(torch_only) => {
                torch_only.holder().bits() / 8 * torch_only.lanes()
            }
        }
    }
}

/// A tensor on torch's `"meta"` device (`torch._utils._rebuild_meta_tensor_no_storage`):
/// a dtype, sizes and strides, and no data. `torch.save` writes one for each tensor of
/// a model still on the meta device (built with `device="meta"`, or under an
/// empty-weights context and never materialized); `torch.load` gives it back there.
/// The flat view does not list it among the tensors (there are no bytes to view):
/// [`PtReader::meta_tensors`](crate::PtReader::meta_tensors) has it.
#[derive(Debug, Clone, PartialEq)]
pub struct MetaTensor {
    /// torch's dtype where tensorwire has (or holds) it; `None` for the torch dtypes
    /// it neither has nor holds (`torch.uint4`, `torch.bits8`, ...), which a tensor
    /// without data may have all the same.
    pub dtype: Option<TensorDType>,
    /// torch's name of the dtype (`torch.float32`, `torch.uint4`).
    pub dtype_name: &'static str,
    /// Sizes.
    pub shape: Shape,
    /// Strides, in elements.
    pub strides: Dims,
    /// The `requires_grad` flag torch sets on it.
    pub requires_grad: bool,
    /// Pickled as an `nn.Parameter`.
    pub parameter: bool,
}

impl MetaTensor {
    /// The tensor of a `_rebuild_meta_tensor_no_storage(dtype, size, stride,
    /// requires_grad)` call: sizes and strides of one rank whose extent, in bytes,
    /// fits torch's `int64` (as `torch.empty_strided` needs).
    pub(crate) fn from_rebuild(
        arena: &Arena,
        dtype: Option<TensorDType>,
        dtype_name: &'static str,
        size: Id,
        stride: Id,
        offset: u64,
    ) -> Result<MetaTensor> {
        let shape = Shape::try_from_dims(dims_of(arena, size, "size", offset)?)?;
        let strides = dims_of(arena, stride, "stride", offset)?;
        if strides.len() != shape.ndim() {
            return Err(Error::malformed(
                offset,
                format!(
                    "meta tensor has {} sizes but {} strides",
                    shape.ndim(),
                    strides.len()
                ),
            ));
        }
        let overflow = || Error::Overflow {
            what: "meta tensor extent (in bytes, which must fit i64)",
        };
        let extent = tensorwire_core::strided::extent_elements(shape.dims(), &strides)
            .map_err(|_| overflow())?;
        let element_size = match dtype {
            Some(dtype) => dtype.element_size(),
            None => match dtype_name {
                "torch.qint32" | "torch.bcomplex32" => 4,
                "torch.bits16" => 2,
                _ => 1, // the sub-byte and 8-bit types, one byte per element
            },
        };
        extent
            .checked_mul(element_size)
            .filter(|&bytes| bytes <= i64::MAX as u64)
            .ok_or_else(overflow)?;
        Ok(MetaTensor {
            dtype,
            dtype_name,
            shape,
            strides,
            requires_grad: false,
            parameter: false,
        })
    }
}

/// torch dtypes that tensorwire has no [`DType`] for but reads, as the elements that
/// hold them: `torch.float8_e8m0fnu` (MX block scales) and `torch.float4_e2m1fn_x2`
/// (two packed float4 values, NVFP4 and MXFP4 weights) as `u8`, one per element,
/// and `torch.complex32` as `f16` pairs (real, imaginary), the tensor gaining a last
/// dimension of 2 as `torch.view_as_real` gives it. Such a tensor is listed with the
/// layout `pytorch:<name>` ([`TorchOnlyDType::layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TorchOnlyDType {
    /// `torch.float8_e8m0fnu`: an 8-bit exponent (a power of two), 0xFF is NaN.
    Float8E8M0Fnu,
    /// `torch.float4_e2m1fn_x2`: two float4 e2m1 values per byte.
    Float4E2M1FnX2,
    /// `torch.complex32` (`torch.chalf`): two `f16`.
    Complex32,
}

impl TorchOnlyDType {
    /// Every one.
    pub const ALL: [TorchOnlyDType; 3] = [
        TorchOnlyDType::Float8E8M0Fnu,
        TorchOnlyDType::Float4E2M1FnX2,
        TorchOnlyDType::Complex32,
    ];
    /// The prefix of the layout names ([`TorchOnlyDType::layout`]).
    pub const LAYOUT_PREFIX: &'static str = "pytorch:";

    /// torch's name, without `torch.` (`complex32`).
    pub fn name(self) -> &'static str {
        &self.torch_name()["torch.".len()..]
    }

    /// torch's full name (`torch.complex32`).
    pub fn torch_name(self) -> &'static str {
        match self {
            TorchOnlyDType::Float8E8M0Fnu => "torch.float8_e8m0fnu",
            TorchOnlyDType::Float4E2M1FnX2 => "torch.float4_e2m1fn_x2",
            TorchOnlyDType::Complex32 => "torch.complex32",
        }
    }

    /// The dtype named `name` (without `torch.`).
    fn from_name(name: &str) -> Option<TorchOnlyDType> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The dtype `torch.<name>` names (`torch.chalf` is `torch.complex32`).
    pub fn from_torch_name(full: &str) -> Option<TorchOnlyDType> {
        match full.strip_prefix("torch.")? {
            "chalf" => Some(TorchOnlyDType::Complex32),
            name => Self::from_name(name),
        }
    }

    /// The element type that holds it.
    pub fn holder(self) -> DType {
        match self {
            TorchOnlyDType::Float8E8M0Fnu | TorchOnlyDType::Float4E2M1FnX2 => DType::U8,
            TorchOnlyDType::Complex32 => DType::F16,
        }
    }

    /// Holder elements per element: the size of the last dimension a tensor gains
    /// when it has more than one (2 for complex32).
    pub fn lanes(self) -> u64 {
        match self {
            TorchOnlyDType::Complex32 => 2,
            _ => 1,
        }
    }

    /// The layout a tensor of this dtype is listed with: `pytorch:<name>`.
    pub fn layout(self) -> Layout {
        Layout::Other(format!("{}{}", Self::LAYOUT_PREFIX, self.name()))
    }

    /// The dtype whose [`TorchOnlyDType::layout`] is `layout`.
    pub fn from_layout(layout: &Layout) -> Option<TorchOnlyDType> {
        let Layout::Other(name) = layout else {
            return None;
        };
        Self::from_name(name.strip_prefix(Self::LAYOUT_PREFIX)?)
    }

    /// The sizes or strides of a tensor as listed without the lanes' last dimension
    /// (all of them for a dtype of one lane): torch's, but for strides counted in
    /// holder elements.
    pub fn outer(self, dims: &[u64]) -> &[u64] {
        match self.lanes() {
            1 => dims,
            _ => &dims[..dims.len().saturating_sub(1)],
        }
    }

    /// The dtype of a tensor listed as one: its layout names it (or, for a `.zt`
    /// tensor converted from a checkpoint, the layout it records,
    /// [`TensorInfo::source_layout_name`]), and its dtype and last dimension are the
    /// holder's ([`TorchOnlyDType::holder`], [`TorchOnlyDType::lanes`]). `None` for
    /// anything else, such as a `.zt` tensor a user labelled `pytorch:complex32` over
    /// other elements.
    pub fn of(info: &TensorInfo) -> Option<TorchOnlyDType> {
        let name = info.source_layout_name()?;
        let dtype = Self::from_name(name.strip_prefix(Self::LAYOUT_PREFIX)?)?;
        let lanes_fit = dtype.lanes() == 1 || info.shape.dims().last() == Some(&dtype.lanes());
        (info.dtype == dtype.holder() && lanes_fit).then_some(dtype)
    }
}

/// How a quantized tensor's integers map to real values: torch's `qscheme()` and
/// its parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum Quantization {
    /// `torch.per_tensor_affine`: `real = (q - zero_point) * scale`.
    PerTensor {
        /// `q_scale()`.
        scale: f64,
        /// `q_zero_point()`.
        zero_point: i64,
    },
    /// `torch.per_channel_affine` (or `per_channel_affine_float_qparams`, where the
    /// zero points are floats): one scale and zero point per index along `axis`.
    PerChannel {
        /// True for `torch.per_channel_affine_float_qparams`.
        float_qparams: bool,
        /// `q_per_channel_scales()`: one per channel.
        scales: Box<TensorRecord>,
        /// `q_per_channel_zero_points()`: one per channel.
        zero_points: Box<TensorRecord>,
        /// `q_per_channel_axis()`.
        axis: u64,
    },
}

impl Quantization {
    /// The per-tensor attribute that marks a quantized tensor and names its scheme;
    /// the others it carries start with `torch.` too ([`Quantization::attributes`]).
    pub const SCHEME_ATTRIBUTE: &'static str = "torch.qscheme";
    /// Suffix of the flat name of a per-channel tensor's scales
    /// (`fc.weight.q_per_channel_scales`).
    pub const SCALES: &'static str = "q_per_channel_scales";
    /// Suffix of the flat name of a per-channel tensor's zero points.
    pub const ZERO_POINTS: &'static str = "q_per_channel_zero_points";

    /// torch's name of the quantized dtype whose integers are `ints` (`qint8` for
    /// i8, `quint8` for u8, `qint32` for i32).
    pub fn torch_dtype(ints: DType) -> Option<&'static str> {
        match ints {
            DType::I8 => Some("qint8"),
            DType::U8 => Some("quint8"),
            DType::I32 => Some("qint32"),
            _ => None,
        }
    }

    /// torch's name of the scheme (`torch.per_tensor_affine`).
    pub fn scheme(&self) -> &'static str {
        match self {
            Quantization::PerTensor { .. } => "torch.per_tensor_affine",
            Quantization::PerChannel {
                float_qparams: false,
                ..
            } => "torch.per_channel_affine",
            Quantization::PerChannel {
                float_qparams: true,
                ..
            } => "torch.per_channel_affine_float_qparams",
        }
    }

    /// The flat name of the tensor `suffix` ([`Quantization::SCALES`] or
    /// [`Quantization::ZERO_POINTS`]) of the quantized tensor `name`: joined as the
    /// flat view joins names (`fc.weight.q_per_channel_scales`; a tensor under the
    /// empty key has `q_per_channel_scales`).
    pub fn part_name(name: &str, suffix: &str) -> String {
        crate::flatten::flat_name(name, suffix)
    }

    /// The per-tensor attributes a quantized tensor carries in the flat view, named
    /// after torch's methods: `torch.qscheme`, and `torch.q_scale` and
    /// `torch.q_zero_point`, or `torch.q_per_channel_axis` and the names of the
    /// tensors holding the scales and zero points.
    pub fn attributes(&self, name: &str) -> BTreeMap<String, tensorwire_core::Value> {
        use tensorwire_core::Value;
        let mut out = BTreeMap::new();
        out.insert(
            Self::SCHEME_ATTRIBUTE.to_owned(),
            Value::Str(self.scheme().into()),
        );
        match self {
            Quantization::PerTensor { scale, zero_point } => {
                out.insert("torch.q_scale".into(), Value::Float(*scale));
                out.insert(
                    "torch.q_zero_point".into(),
                    Value::Int((*zero_point).into()),
                );
            }
            Quantization::PerChannel { axis, .. } => {
                out.insert(
                    "torch.q_per_channel_axis".into(),
                    Value::Int((*axis).into()),
                );
                for suffix in [Self::SCALES, Self::ZERO_POINTS] {
                    let key = format!("torch.{suffix}");
                    out.insert(key, Value::Str(Self::part_name(name, suffix)));
                }
            }
        }
        out
    }
}

fn int_of(arena: &Arena, id: Id, what: &str, offset: u64) -> Result<u64> {
    match arena.get(id) {
        Obj::Int(n) if *n >= 0 => Ok(*n as u64),
        other => Err(Error::malformed(
            offset,
            format!("tensor {what}: expected a non-negative int, found {other:?}"),
        )),
    }
}

/// The ints of the tuple (or list, or `torch.Size`) `id`: sizes or strides (inline `Dims`: no
/// allocation for the usual ranks).
pub(crate) fn dims_of(arena: &Arena, id: Id, what: &str, offset: u64) -> Result<Dims> {
    if let Obj::Size(dims) = arena.get(id) {
        Error::check_limit("number of dimensions", dims.len() as u64, MAX_NDIM as u64)?;
        return dims
            .iter()
            .map(|&n| {
                u64::try_from(n).map_err(|_| {
                    Error::malformed(
                        offset,
                        format!("tensor {what}: expected a non-negative int, found {n}"),
                    )
                })
            })
            .collect();
    }
    let items = arena.items(id).ok_or_else(|| {
        Error::malformed(offset, format!("tensor {what}: expected a tuple of ints"))
    })?;
    Error::check_limit("number of dimensions", items.len() as u64, MAX_NDIM as u64)?;
    items
        .iter()
        .map(|&item| int_of(arena, item, what, offset))
        .collect()
}

impl TensorRecord {
    /// Builds the tensor of a `_rebuild_tensor*` call, checking that its extent lies
    /// inside its storage. `dtype` is given for `_rebuild_tensor_v3` (untyped
    /// storages); otherwise the storage's type is the tensor's. A torch-only dtype's
    /// tensor is described by its holder elements ([`TorchOnlyDType`]).
    pub fn from_rebuild(
        arena: &Arena,
        storage: Id,
        storage_offset: Id,
        size: Id,
        stride: Id,
        dtype: Option<TensorDType>,
        offset: u64,
    ) -> Result<TensorRecord> {
        let &Obj::Storage(index) = arena.get(storage) else {
            return Err(Error::malformed(
                offset,
                format!(
                    "tensor storage: expected a storage, found {}",
                    arena.get(storage).kind()
                ),
            ));
        };
        let storage = arena.storage(index).ok_or_else(|| {
            Error::malformed(offset, "tensor storage: not a storage of this pickle")
        })?;
        let (dtype, torch_only) = match dtype {
            None => (storage.dtype, None),
            Some(TensorDType::Tensorwire(dtype)) => (dtype, None),
            Some(TensorDType::TorchOnly(torch_only)) => (torch_only.holder(), Some(torch_only)),
        };
        let mut record = TensorRecord {
            storage: storage.clone(),
            dtype,
            storage_offset: int_of(arena, storage_offset, "storage offset", offset)?,
            shape: Shape::try_from_dims(dims_of(arena, size, "size", offset)?)?,
            strides: dims_of(arena, stride, "stride", offset)?,
            quantization: None,
            requires_grad: false,
            parameter: false,
            torch_only,
            is_conj: false,
            is_neg: false,
        };
        if record.strides.len() != record.shape.ndim() {
            return Err(Error::malformed(
                offset,
                format!(
                    "tensor has {} sizes but {} strides",
                    record.shape.ndim(),
                    record.strides.len()
                ),
            ));
        }
        if let Some(torch_only) = torch_only {
            record.split_lanes(torch_only.lanes())?;
        }
        let extent = record.byte_extent()?;
        let (window_start, window_end) = record.storage.window()?;
        let storage_bytes = window_end - window_start;
        if extent.1 > storage_bytes {
            return Err(Error::OutOfBounds {
                tensor: format!("storage {}", record.storage.key),
                offset: extent.0,
                length: extent.1 - extent.0,
                limit: storage_bytes,
            });
        }
        Ok(record)
    }

    /// Describes the tensor by `lanes` holder elements per element: a last
    /// dimension of `lanes` (stride 1), the other strides and the offset scaled.
    fn split_lanes(&mut self, lanes: u64) -> Result<()> {
        if lanes == 1 {
            return Ok(());
        }
        let overflow = || Error::Overflow {
            what: "tensor strides",
        };
        let mut strides = Dims::default();
        for &stride in &self.strides {
            strides.push(stride.checked_mul(lanes).ok_or_else(overflow)?);
        }
        strides.push(1);
        let mut dims: Dims = self.shape.dims().iter().copied().collect();
        dims.push(lanes);
        self.shape = Shape::try_from_dims(dims)?;
        self.strides = strides;
        self.storage_offset = self
            .storage_offset
            .checked_mul(lanes)
            .ok_or_else(overflow)?;
        Ok(())
    }

    /// `(storage offset, sizes, strides)` as torch has them, in elements of the
    /// tensor's torch dtype: the record's own, but for a [`TorchOnlyDType`] of
    /// several lanes without the last dimension the lanes added.
    pub fn torch_view(&self) -> (u64, Dims, Dims) {
        let Some(torch_only) = self.torch_only else {
            return (
                self.storage_offset,
                self.shape.dims().iter().copied().collect(),
                self.strides.clone(),
            );
        };
        let lanes = torch_only.lanes();
        (
            self.storage_offset / lanes,
            torch_only
                .outer(self.shape.dims())
                .iter()
                .copied()
                .collect(),
            torch_only
                .outer(&self.strides)
                .iter()
                .map(|&s| s / lanes)
                .collect(),
        )
    }

    /// Size of one element in bytes.
    pub fn element_size(&self) -> u64 {
        self.dtype.bits() / 8
    }

    /// Where the tensor's first element lies in the whole stored storage, in bytes:
    /// its view's start (legacy views) plus its storage offset. Divided by
    /// [`TensorRecord::element_size`], torch's storage offset for a tensor set on
    /// [`PtReader::storage_bytes`](crate::PtReader::storage_bytes) — except for an
    /// empty tensor whose offset lies past its storage, which is kept at the
    /// storage's end here ([`TensorRecord::byte_extent`]); `storage_offset` is torch's.
    pub fn stored_byte_offset(&self) -> Result<u64> {
        self.storage
            .window()?
            .0
            .checked_add(self.byte_extent()?.0)
            .ok_or(Error::Overflow {
                what: "tensor offset in its storage",
            })
    }

    /// The byte range `[start, end)` of the storage the tensor's elements lie in.
    /// A tensor with no elements has an empty range at its offset, or at the end of its
    /// storage when the offset lies past it (torch allows that: `empty(0, 4)[:, 2:]`
    /// has offset 2 in a storage of no bytes).
    pub fn byte_extent(&self) -> Result<(u64, u64)> {
        let overflow = || Error::Overflow {
            what: "tensor extent",
        };
        let elem = self.element_size();
        let start = self.storage_offset.checked_mul(elem).ok_or_else(overflow)?;
        if self.shape.numel()? == 0 {
            let (window_start, window_end) = self.storage.window()?;
            let start = start.min(window_end - window_start);
            return Ok((start, start));
        }
        let mut last = 0u64;
        for (&size, &stride) in self.shape.dims().iter().zip(&self.strides) {
            let step = (size - 1).checked_mul(stride).ok_or_else(overflow)?;
            last = last.checked_add(step).ok_or_else(overflow)?;
        }
        let end_elems = self
            .storage_offset
            .checked_add(last)
            .and_then(|n| n.checked_add(1))
            .ok_or_else(overflow)?;
        let end = end_elems.checked_mul(elem).ok_or_else(overflow)?;
        Ok((start, end))
    }

    /// True when the elements are stored in row-major order with no gaps (sizes of 1
    /// may carry any stride, as in torch).
    pub fn is_contiguous(&self) -> bool {
        tensorwire_core::strided::is_row_major(self.shape.dims(), &self.strides)
    }

    /// The tensor's elements in row-major order, gathered from `extent` (the bytes of
    /// [`TensorRecord::byte_extent`]) into a fresh aligned buffer of `max_bytes` at
    /// most.
    pub fn gather(&self, extent: &[u8], max_bytes: u64) -> Result<AlignedBuf> {
        tensorwire_core::strided::gather(extent, self.dtype, &self.shape, &self.strides, max_bytes)
    }

    /// The per-tensor attribute of a tensor with torch's conjugate bit (`true`), named
    /// after torch's method.
    pub const CONJ_ATTRIBUTE: &'static str = "torch.is_conj";
    /// The per-tensor attribute of a tensor with torch's negative bit (`true`).
    pub const NEG_ATTRIBUTE: &'static str = "torch.is_neg";

    /// True when torch keeps the tensor as a lazy conjugate or negative view
    /// ([`TensorRecord::is_conj`], [`TensorRecord::is_neg`]): its stored elements are
    /// not its values, so it is never viewed zero-copy.
    pub fn has_lazy_signs(&self) -> bool {
        self.is_conj || self.is_neg
    }

    /// [`TensorRecord::CONJ_ATTRIBUTE`] and [`TensorRecord::NEG_ATTRIBUTE`] where the
    /// tensor has those bits (none for the others).
    pub fn sign_attributes(&self) -> BTreeMap<String, tensorwire_core::Value> {
        [
            (Self::CONJ_ATTRIBUTE, self.is_conj),
            (Self::NEG_ATTRIBUTE, self.is_neg),
        ]
        .into_iter()
        .filter(|&(_, set)| set)
        .map(|(name, _)| (name.to_owned(), tensorwire_core::Value::Bool(true)))
        .collect()
    }

    /// How the stored elements encode the tensor's values: `conj`, `neg` or
    /// `conj+neg` for a lazy view, `None` when they are its values.
    pub fn sign_encoding(&self) -> Option<&'static str> {
        match (self.is_conj, self.is_neg) {
            (false, false) => None,
            (true, false) => Some("conj"),
            (false, true) => Some("neg"),
            (true, true) => Some("conj+neg"),
        }
    }

    /// Turns stored elements of the tensor into its values, in place, as torch's
    /// `resolve_neg()` and `resolve_conj()` do: negates them, then negates the
    /// imaginary parts. `elements` holds whole elements of [`TensorRecord::dtype`] in
    /// this machine's byte order, starting at one (a complex32's at its real part).
    /// Floats and complex parts get their sign bit flipped (infinities and NaN
    /// payloads kept); integers are negated wrapping around (`-(-128)` is `-128` in
    /// i8 and `-1` is 255 in u8), as torch negates them. Negating a bool, u16, u32,
    /// u64 or float8 tensor is [`Error::Unsupported`]: torch has no negation for those
    /// either ("neg_cpu" not implemented), though it loads such a view.
    pub fn resolve_signs(&self, elements: &mut [u8]) -> Result<()> {
        if self.is_neg {
            self.negate(elements)?;
        }
        if self.is_conj {
            let part = self.complex_part_size().ok_or_else(|| {
                Error::unsupported(format!(
                    "the conjugate of a {} tensor, which is not complex",
                    self.torch_dtype_name()
                ))
            })?;
            // The imaginary parts: every second float, from the second.
            flip_sign_bits(elements, part, 2);
        }
        Ok(())
    }

    /// Bytes of a complex tensor's real (or imaginary) part; `None` for the others.
    pub(crate) fn complex_part_size(&self) -> Option<usize> {
        match (self.dtype, self.torch_only) {
            (DType::Complex64, None) => Some(4),
            (DType::Complex128, None) => Some(8),
            (DType::F16, Some(TorchOnlyDType::Complex32)) => Some(2),
            _ => None,
        }
    }

    /// torch's name of the tensor's dtype (`torch.complex32`, `torch.int8`).
    pub(crate) fn torch_dtype_name(&self) -> &'static str {
        self.torch_only.map_or_else(
            || crate::globals::torch_dtype_name(self.dtype),
            TorchOnlyDType::torch_name,
        )
    }

    /// Negates every element of `elements` (see [`TensorRecord::resolve_signs`]).
    fn negate(&self, elements: &mut [u8]) -> Result<()> {
        use DType::*;
        match (self.dtype, self.torch_only) {
            (F16 | BF16, None) | (F16, Some(TorchOnlyDType::Complex32)) => {
                flip_sign_bits(elements, 2, 1)
            }
            (F32 | Complex64, None) => flip_sign_bits(elements, 4, 1),
            (F64 | Complex128, None) => flip_sign_bits(elements, 8, 1),
            (I8 | U8, None) => elements.iter_mut().for_each(|b| *b = b.wrapping_neg()),
            (I16, None) => negate_ints::<2>(elements, |b| {
                i16::from_ne_bytes(b).wrapping_neg().to_ne_bytes()
            }),
            (I32, None) => negate_ints::<4>(elements, |b| {
                i32::from_ne_bytes(b).wrapping_neg().to_ne_bytes()
            }),
            (I64, None) => negate_ints::<8>(elements, |b| {
                i64::from_ne_bytes(b).wrapping_neg().to_ne_bytes()
            }),
            _ => {
                return Err(Error::unsupported(format!(
                    "the negative view of a {} tensor (torch.load gives it with its \
                     negative bit set, but torch cannot negate that dtype either)",
                    self.torch_dtype_name()
                )))
            }
        }
        Ok(())
    }
}

/// Flips the sign bit of `part`-byte floats in `bytes` (this machine's byte order):
/// of every one (`every` 1) or of every second one from the second (`every` 2, the
/// imaginary parts of complex numbers).
fn flip_sign_bits(bytes: &mut [u8], part: usize, every: usize) {
    let sign_byte = if cfg!(target_endian = "little") {
        part - 1
    } else {
        0
    };
    for float in bytes.chunks_exact_mut(part).skip(every - 1).step_by(every) {
        float[sign_byte] ^= 0x80;
    }
}

/// Replaces each `N`-byte integer of `bytes` by `negated(it)`.
fn negate_ints<const N: usize>(bytes: &mut [u8], negated: impl Fn([u8; N]) -> [u8; N]) {
    for int in bytes.chunks_exact_mut(N) {
        let value: [u8; N] = (&*int).try_into().expect("chunks of N bytes");
        int.copy_from_slice(&negated(value));
    }
}

/// A torch storage class named in a persistent id: its dotted name and element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageClass {
    /// `torch.FloatStorage`, `torch.cuda.HalfStorage`, `torch.UntypedStorage`, …
    pub name: &'static str,
    /// The element type (`u8` for untyped storages).
    pub dtype: DType,
    /// True for the storages of quantized tensors' integers (`torch.QInt8Storage`,
    /// `QUInt8Storage`, `QInt32Storage`), which only `_rebuild_qtensor` may use.
    pub quantized: bool,
}

impl StorageClass {
    /// The class `module.name`, when torch has it and tensorwire has its dtype.
    pub fn find(module: &str, name: &str) -> Option<StorageClass> {
        TYPED_STORAGE_CLASSES
            .iter()
            .chain(QUANTIZED_STORAGE_CLASSES)
            .chain(UNTYPED_STORAGE_CLASSES)
            .copied()
            .find(|class| crate::globals::is_named(class.name, module, name))
    }
}

/// Each class under `torch.` and `torch.cuda.`, quantized or not.
macro_rules! storage_classes {
    ($quantized:literal: $($class:literal => $dtype:ident),* $(,)?) => {
        &[$(
            StorageClass {
                name: concat!("torch.", $class),
                dtype: DType::$dtype,
                quantized: $quantized,
            },
            StorageClass {
                name: concat!("torch.cuda.", $class),
                dtype: DType::$dtype,
                quantized: $quantized,
            },
        )*]
    };
}

/// The typed storages.
const TYPED_STORAGE_CLASSES: &[StorageClass] = storage_classes![false:
    "FloatStorage" => F32,
    "DoubleStorage" => F64,
    "HalfStorage" => F16,
    "BFloat16Storage" => BF16,
    "LongStorage" => I64,
    "IntStorage" => I32,
    "ShortStorage" => I16,
    "CharStorage" => I8,
    "ByteStorage" => U8,
    "BoolStorage" => Bool,
    "ComplexFloatStorage" => Complex64,
    "ComplexDoubleStorage" => Complex128,
    "UInt16Storage" => U16,
    "UInt32Storage" => U32,
    "UInt64Storage" => U64,
    "Float8_e4m3fnStorage" => F8E4M3Fn,
    "Float8_e5m2Storage" => F8E5M2,
    "Float8_e4m3fnuzStorage" => F8E4M3Fnuz,
    "Float8_e5m2fnuzStorage" => F8E5M2Fnuz,
];

/// The storages of quantized tensors' integers.
const QUANTIZED_STORAGE_CLASSES: &[StorageClass] = storage_classes![true:
    "QInt8Storage" => I8,
    "QUInt8Storage" => U8,
    "QInt32Storage" => I32,
];

/// The untyped (byte) storages.
const UNTYPED_STORAGE_CLASSES: &[StorageClass] = &[
    StorageClass {
        name: "torch.UntypedStorage",
        dtype: DType::U8,
        quantized: false,
    },
    StorageClass {
        name: "torch.storage.UntypedStorage",
        dtype: DType::U8,
        quantized: false,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    fn record(shape: &[u64], strides: &[u64], offset: u64) -> TensorRecord {
        TensorRecord {
            storage: StorageRef {
                key: "0".into(),
                dtype: DType::I32,
                quantized: false,
                numel: 24,
                location: "cpu".into(),
                view: None,
            },
            dtype: DType::I32,
            storage_offset: offset,
            shape: Shape::new(shape.to_vec()).unwrap(),
            strides: Dims::new(strides),
            quantization: None,
            requires_grad: false,
            parameter: false,
            torch_only: None,
            is_conj: false,
            is_neg: false,
        }
    }

    fn storage() -> Vec<u8> {
        (0..24i32).flat_map(|v| v.to_le_bytes()).collect()
    }

    fn values(b: &[u8]) -> Vec<i32> {
        b.chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn an_empty_tensor_may_start_past_its_storage() {
        // torch.empty(0, 4)[:, 2:] has offset 2 in a storage of no bytes; here the
        // storage holds 24 i32 (96 bytes) and the offset is 30 elements.
        let empty = record(&[0, 2], &[4, 1], 30);
        assert_eq!(empty.byte_extent().unwrap(), (96, 96));
        let inside = record(&[0, 2], &[4, 1], 3);
        assert_eq!(inside.byte_extent().unwrap(), (12, 12));
        // A tensor with elements may not.
        let past = record(&[1, 2], &[4, 1], 23);
        assert_eq!(past.byte_extent().unwrap(), (92, 100));
    }

    #[test]
    fn transposed_and_sliced_views_gather_in_row_major_order() {
        // base = arange(24).reshape(4, 6); base.t() and base[1:3, 2:5].
        let t = record(&[6, 4], &[1, 6], 0);
        assert!(!t.is_contiguous());
        let (s, e) = t.byte_extent().unwrap();
        let out = t
            .gather(&storage()[s as usize..e as usize], u64::MAX)
            .unwrap();
        assert_eq!(&values(out.as_slice())[..5], &[0, 6, 12, 18, 1]);

        let sl = record(&[2, 3], &[6, 1], 8);
        let (s, e) = sl.byte_extent().unwrap();
        assert_eq!((s, e), (32, 4 * 17));
        let out = sl
            .gather(&storage()[s as usize..e as usize], u64::MAX)
            .unwrap();
        assert_eq!(values(out.as_slice()), vec![8, 9, 10, 14, 15, 16]);
    }

    #[test]
    fn contiguity_ignores_unit_dims_and_stride_zero_is_strided() {
        assert!(record(&[4, 6], &[6, 1], 0).is_contiguous());
        assert!(record(&[1, 6], &[99, 1], 0).is_contiguous());
        assert!(record(&[0, 6], &[0, 0], 0).is_contiguous());
        let expanded = record(&[4, 3], &[0, 1], 0);
        assert!(!expanded.is_contiguous());
        assert_eq!(expanded.byte_extent().unwrap(), (0, 12));
        let (s, e) = expanded.byte_extent().unwrap();
        let out = expanded
            .gather(&storage()[s as usize..e as usize], u64::MAX)
            .unwrap();
        assert_eq!(
            values(out.as_slice()),
            vec![0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]
        );
        // A stride-0 expand claiming a huge size is stopped by the copy limit.
        let huge = record(&[1 << 40], &[0], 0);
        assert!(matches!(
            huge.gather(&storage()[..4], 1 << 30),
            Err(Error::LimitExceeded { .. })
        ));
    }

    /// `record` of `dtype` (a torch-only one's holder) with torch's bits.
    fn lazy(
        dtype: DType,
        torch_only: Option<TorchOnlyDType>,
        conj: bool,
        neg: bool,
    ) -> TensorRecord {
        TensorRecord {
            dtype,
            torch_only,
            is_conj: conj,
            is_neg: neg,
            ..record(&[1], &[1], 0)
        }
    }

    fn resolved(record: &TensorRecord, mut bytes: Vec<u8>) -> Result<Vec<u8>> {
        record.resolve_signs(&mut bytes).map(|()| bytes)
    }

    fn f32_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn lazy_views_resolve_to_torchs_values() {
        use TorchOnlyDType::Complex32;
        let nan = f32::from_bits(0x7fc0_0001);
        // 3 complex64. conj: every imaginary part's sign flips (NaN payload kept);
        // neg: every part's; both: the real parts'.
        let z = f32_bytes(&[1.0, 2.0, -3.0, -0.0, nan, nan]);
        let cases = [
            (true, false, [1.0, -2.0, -3.0, 0.0, nan, -nan]),
            (false, true, [-1.0, -2.0, 3.0, 0.0, -nan, -nan]),
            (true, true, [-1.0, 2.0, 3.0, -0.0, -nan, nan]),
        ];
        for (conj, neg, want) in cases {
            let got = resolved(&lazy(DType::Complex64, None, conj, neg), z.clone()).unwrap();
            let got: Vec<u32> = got
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "conj {conj} neg {neg}");
        }
        // complex128 and complex32 (f16 pairs): the second part of each.
        let w: Vec<u8> = [1.5f64, 2.5].iter().flat_map(|v| v.to_le_bytes()).collect();
        let got = resolved(&lazy(DType::Complex128, None, true, false), w).unwrap();
        assert_eq!(f64::from_le_bytes(got[8..].try_into().unwrap()), -2.5);
        let c32 = vec![0x00, 0x3c, 0x00, 0x40, 0x00, 0xbc, 0x00, 0xc0]; // (1+2j), (-1-2j)
        let got = resolved(&lazy(DType::F16, Some(Complex32), true, false), c32.clone()).unwrap();
        assert_eq!(got, [0x00, 0x3c, 0x00, 0xc0, 0x00, 0xbc, 0x00, 0x40]);
        let got = resolved(&lazy(DType::F16, Some(Complex32), false, true), c32).unwrap();
        assert_eq!(got, [0x00, 0xbc, 0x00, 0xc0, 0x00, 0x3c, 0x00, 0x40]);
        // Floats flip their sign bit, ±0 and infinities too.
        let got = resolved(
            &lazy(DType::F64, None, false, true),
            [0.0f64, f64::INFINITY]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        )
        .unwrap();
        assert_eq!(
            got,
            [-0.0f64, f64::NEG_INFINITY]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>()
        );
        assert_eq!(
            resolved(&lazy(DType::BF16, None, false, true), vec![0x80, 0x3f]).unwrap(),
            [0x80, 0xbf]
        );
        // Integers negate wrapping around, as torch's do; u8 too.
        let i8s = [-128i8, -1, 0, 5, 127].map(|v| v as u8).to_vec();
        assert_eq!(
            resolved(&lazy(DType::I8, None, false, true), i8s).unwrap(),
            [-128i8, 1, 0, -5, -127].map(|v| v as u8)
        );
        assert_eq!(
            resolved(&lazy(DType::U8, None, false, true), vec![0, 1, 128, 255]).unwrap(),
            [0, 255, 128, 1]
        );
        let i64s: Vec<u8> = [i64::MIN, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
        let want: Vec<u8> = [i64::MIN, -7]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            resolved(&lazy(DType::I64, None, false, true), i64s).unwrap(),
            want
        );
        let i16s: Vec<u8> = [-3i16, 300].iter().flat_map(|v| v.to_le_bytes()).collect();
        let want: Vec<u8> = [3i16, -300].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            resolved(&lazy(DType::I16, None, false, true), i16s).unwrap(),
            want
        );
        // Without bits, nothing changes.
        assert_eq!(
            resolved(&lazy(DType::F32, None, false, false), z.clone()).unwrap(),
            z
        );
    }

    #[test]
    fn negating_what_torch_cannot_negate_is_unsupported() {
        for (dtype, torch_only, name) in [
            (DType::Bool, None, "torch.bool"),
            (DType::U16, None, "torch.uint16"),
            (DType::U32, None, "torch.uint32"),
            (DType::U64, None, "torch.uint64"),
            (DType::F8E4M3Fn, None, "torch.float8_e4m3fn"),
            (DType::F8E5M2Fnuz, None, "torch.float8_e5m2fnuz"),
            (
                DType::U8,
                Some(TorchOnlyDType::Float8E8M0Fnu),
                "torch.float8_e8m0fnu",
            ),
            (
                DType::U8,
                Some(TorchOnlyDType::Float4E2M1FnX2),
                "torch.float4_e2m1fn_x2",
            ),
        ] {
            let err = resolved(&lazy(dtype, torch_only, false, true), vec![1; 8]).unwrap_err();
            assert!(
                matches!(err, Error::Unsupported { .. }) && err.to_string().contains(name),
                "{name}: {err}"
            );
        }
        // A conjugate of a real tensor (refused when the pickle is read) is too.
        let err = resolved(&lazy(DType::F32, None, true, false), vec![0; 4]).unwrap_err();
        assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    }

    #[test]
    fn lazy_views_name_their_bits() {
        let both = lazy(DType::Complex64, None, true, true);
        assert!(both.has_lazy_signs());
        assert_eq!(both.sign_encoding(), Some("conj+neg"));
        let attributes = both.sign_attributes();
        assert_eq!(
            attributes.keys().collect::<Vec<_>>(),
            [TensorRecord::CONJ_ATTRIBUTE, TensorRecord::NEG_ATTRIBUTE]
        );
        assert_eq!(
            lazy(DType::F32, None, false, true).sign_encoding(),
            Some("neg")
        );
        let plain = lazy(DType::F32, None, false, false);
        assert!(!plain.has_lazy_signs() && plain.sign_attributes().is_empty());
        assert_eq!(plain.sign_encoding(), None);
    }

    #[test]
    fn extents_overflow_cleanly() {
        let r = record(&[2, 3], &[u64::MAX, 1], 0);
        assert!(matches!(r.byte_extent(), Err(Error::Overflow { .. })));
    }
}
