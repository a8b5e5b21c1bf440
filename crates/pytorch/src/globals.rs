//! The globals a checkpoint may name, and what calling them means.
//!
//! The allowlist follows `torch.load(weights_only=True)`: torch's tensor-rebuild
//! functions, storage classes and dtypes, `collections.OrderedDict`, and plain
//! containers. Calls are interpreted here, never executed: `_rebuild_tensor_v2(...)`
//! becomes a [`TensorRecord`], `OrderedDict()` an empty ordered dict, and so on.
//! Anything else is refused when the pickle names it, with
//! [`Error::RefusedGlobal`] naming it.

use tensorwire_core::{BigInt, DType, Error, Result};

use crate::pickle::{Arena, DictKind, Id, Obj};
use crate::sparse::SparseTensor;
use crate::tensor::{
    MetaTensor, Quantization, StorageClass, TensorDType, TensorRecord, TorchOnlyDType,
};

/// An allowlisted global.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Global {
    /// `torch._utils._rebuild_tensor(storage, offset, size, stride)`.
    RebuildTensor,
    /// `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad,
    /// backward_hooks[, metadata])`.
    RebuildTensorV2,
    /// `torch._utils._rebuild_tensor_v3(storage, offset, size, stride, requires_grad,
    /// backward_hooks, dtype[, metadata])`: an untyped storage read as `dtype`.
    RebuildTensorV3,
    /// `torch._utils._rebuild_meta_tensor_no_storage(dtype, size, stride,
    /// requires_grad)`: a [`MetaTensor`].
    RebuildMetaTensor,
    /// `torch._utils._rebuild_parameter(data, requires_grad, backward_hooks)`.
    RebuildParameter,
    /// `torch._utils._rebuild_parameter_with_state(data, requires_grad,
    /// backward_hooks, state)`.
    RebuildParameterWithState,
    /// `torch._tensor._rebuild_from_type_v2(func, new_type, args, state)`.
    RebuildFromTypeV2,
    /// `torch._utils._rebuild_qtensor(storage, storage_offset, size, stride,
    /// quantizer_params, requires_grad, backward_hooks)`: a quantized tensor.
    RebuildQTensor,
    /// `torch.Tensor` or `torch.nn.parameter.Parameter` (as a `new_type`), by its name.
    TensorClass(&'static str),
    /// A storage class: `torch.FloatStorage` and friends, or
    /// `torch.storage.UntypedStorage` (bytes).
    Storage(StorageClass),
    /// A dtype object, `torch.float32` and friends.
    Dtype(DType),
    /// A torch dtype tensorwire has no dtype for (`torch.qint8`, `torch.int4`), or a
    /// quantization scheme (`torch.per_tensor_affine`): a value, kept as its name. A
    /// tensor of such a dtype is [`Error::Unsupported`].
    TorchConstant(&'static str),
    /// A harmless class `torch.load(weights_only=True)` allows as a value (the legacy
    /// tensor types, `torch.FloatTensor` and friends): kept as its name.
    Named(&'static str),
    /// `collections.Counter` (a dict).
    Counter,
    /// `torch.serialization._get_layout(name)`: the layout (a [`Global::TorchConstant`]).
    GetLayout,
    /// `torch._utils._rebuild_sparse_tensor(layout, data)`: a [`SparseTensor`].
    RebuildSparseTensor,
    /// `torch._utils._rebuild_device_tensor_from_cpu_tensor(data, dtype, device,
    /// requires_grad)`: `data`, for a tensor saved from a device without storages.
    RebuildFromCpuTensor,
    /// An allowlisted global whose objects tensorwire cannot build (legacy sparse and
    /// subclassed tensors): naming it is fine, calling it is
    /// [`Error::Unsupported`], saying what it builds.
    Unsupported {
        /// The global's name.
        name: &'static str,
        /// What calling it builds, for the error.
        builds: &'static str,
    },
    /// `collections.OrderedDict`.
    OrderedDict,
    /// `torch.Size`, called with an iterable of ints.
    Size,
    /// `torch.device`, called with its type and index, or its text.
    Device,
    /// `_codecs.encode`, which protocol 2 uses for Python 3 `bytes`.
    CodecsEncode,
    /// `builtins.set`.
    Set,
    /// `builtins.frozenset`.
    FrozenSet,
    /// `builtins.bytearray`.
    ByteArray,
    /// `builtins.complex`, called with numbers.
    Complex,
}

impl Global {
    /// The global's name, for error messages.
    pub fn name(self) -> &'static str {
        match self {
            Global::RebuildTensor => "torch._utils._rebuild_tensor",
            Global::RebuildTensorV2 => "torch._utils._rebuild_tensor_v2",
            Global::RebuildTensorV3 => "torch._utils._rebuild_tensor_v3",
            Global::RebuildMetaTensor => "torch._utils._rebuild_meta_tensor_no_storage",
            Global::RebuildParameter => "torch._utils._rebuild_parameter",
            Global::RebuildParameterWithState => "torch._utils._rebuild_parameter_with_state",
            Global::RebuildFromTypeV2 => "torch._tensor._rebuild_from_type_v2",
            Global::RebuildQTensor => "torch._utils._rebuild_qtensor",
            Global::TensorClass(name) => name,
            Global::Storage(class) => class.name,
            Global::Dtype(d) => torch_dtype_name(d),
            Global::TorchConstant(name) | Global::Named(name) => name,
            Global::Counter => "collections.Counter",
            Global::GetLayout => "torch.serialization._get_layout",
            Global::RebuildSparseTensor => "torch._utils._rebuild_sparse_tensor",
            Global::RebuildFromCpuTensor => "torch._utils._rebuild_device_tensor_from_cpu_tensor",
            Global::Unsupported { name, .. } => name,
            Global::OrderedDict => "collections.OrderedDict",
            Global::Size => "torch.Size",
            Global::Device => "torch.device",
            Global::CodecsEncode => "_codecs.encode",
            Global::Set => "builtins.set",
            Global::FrozenSet => "builtins.frozenset",
            Global::ByteArray => "builtins.bytearray",
            Global::Complex => "builtins.complex",
        }
    }
}

/// Looks up `module.name` in the allowlist.
pub fn resolve(module: &str, name: &str, offset: u64) -> Result<Global> {
    // Python 2 pickles name builtins `__builtin__`, some by their Python 2 names.
    let (module, name) = if module == "__builtin__" {
        python3_builtin(name)
    } else {
        (module, name)
    };
    let global = match (module, name) {
        ("torch._utils", "_rebuild_tensor") => Some(Global::RebuildTensor),
        ("torch._utils", "_rebuild_tensor_v2") => Some(Global::RebuildTensorV2),
        ("torch._utils", "_rebuild_tensor_v3") => Some(Global::RebuildTensorV3),
        ("torch._utils", "_rebuild_parameter") => Some(Global::RebuildParameter),
        ("torch._utils", "_rebuild_meta_tensor_no_storage") => Some(Global::RebuildMetaTensor),
        ("torch._utils", "_rebuild_parameter_with_state") => {
            Some(Global::RebuildParameterWithState)
        }
        ("torch._tensor" | "torch._utils", "_rebuild_from_type_v2") => {
            Some(Global::RebuildFromTypeV2)
        }
        ("torch", "Tensor") => Some(Global::TensorClass("torch.Tensor")),
        ("torch.nn.parameter", "Parameter") => {
            Some(Global::TensorClass("torch.nn.parameter.Parameter"))
        }
        ("torch.nn", "Parameter") => Some(Global::TensorClass("torch.nn.Parameter")),
        ("torch.storage", "TypedStorage") => Some(Global::Named("torch.storage.TypedStorage")),
        ("torch" | "torch.cuda", "QUInt4x2Storage" | "QUInt2x4Storage") => {
            // Storage data, not code: say what is missing.
            return Err(Error::unsupported(format!(
                "{module}.{name}: quantized tensors of 4 or 2 bits"
            )));
        }
        ("torch" | "torch.cuda" | "torch.storage", storage) if storage.ends_with("Storage") => {
            StorageClass::find(module, storage).map(Global::Storage)
        }
        ("torch", "Size") => Some(Global::Size),
        ("torch", "device") => Some(Global::Device),
        ("torch", name) => torch_dtype(name)
            .map(Global::Dtype)
            .or_else(|| constant(TORCH_CONSTANTS, module, name).map(Global::TorchConstant))
            .or_else(|| constant(LEGACY_TENSOR_TYPES, module, name).map(Global::Named)),
        ("torch.cuda", name) => constant(LEGACY_TENSOR_TYPES, module, name).map(Global::Named),
        ("torch.sparse" | "torch.cuda.sparse", name) => constant(LEGACY_SPARSE_TYPES, module, name)
            .map(|name| Global::Unsupported {
                name,
                builds: "legacy sparse tensors",
            }),
        ("torch.serialization", "_get_layout") => Some(Global::GetLayout),
        ("torch._utils", "_rebuild_qtensor") => Some(Global::RebuildQTensor),
        ("torch._utils", "_rebuild_sparse_tensor") => Some(Global::RebuildSparseTensor),
        ("torch._utils", "_rebuild_device_tensor_from_cpu_tensor") => {
            Some(Global::RebuildFromCpuTensor)
        }
        ("torch._utils", name) => UNSUPPORTED_REBUILDS
            .iter()
            .find(|(full, _)| is_named(full, module, name))
            .map(|&(name, builds)| Global::Unsupported { name, builds }),
        ("collections", "OrderedDict") => Some(Global::OrderedDict),
        ("_codecs", "encode") => Some(Global::CodecsEncode),
        ("builtins", "set") => Some(Global::Set),
        ("builtins", "frozenset") => Some(Global::FrozenSet),
        ("builtins", "bytearray") => Some(Global::ByteArray),
        ("builtins", "complex") => Some(Global::Complex),
        ("collections", "Counter") => Some(Global::Counter),
        _ => None,
    };
    global.ok_or_else(|| Error::RefusedGlobal {
        global: format!("{module}.{name}"),
        offset,
    })
}

/// The Python 3 global that Python's unpickler (so `torch.load`) resolves the Python 2
/// builtin `__builtin__.name` to: `_compat_pickle.NAME_MAPPING` (`xrange` is
/// `builtins.range`, `reduce` is `functools.reduce`), else `builtins.name`.
fn python3_builtin(name: &str) -> (&str, &str) {
    const RENAMED: &[(&str, (&str, &str))] = &[
        ("xrange", ("builtins", "range")),
        ("reduce", ("functools", "reduce")),
        ("intern", ("sys", "intern")),
        ("unichr", ("builtins", "chr")),
        ("unicode", ("builtins", "str")),
        ("long", ("builtins", "int")),
        ("basestring", ("builtins", "str")),
    ];
    RENAMED
        .iter()
        .find(|(python2, _)| *python2 == name)
        .map_or(("builtins", name), |&(_, python3)| python3)
}

/// True when the dotted name `full` is `module.name`.
pub(crate) fn is_named(full: &str, module: &str, name: &str) -> bool {
    full.strip_prefix(module).and_then(|n| n.strip_prefix('.')) == Some(name)
}

/// `module.name` from `names`, as a `&'static str`.
fn constant(names: &[&'static str], module: &str, name: &str) -> Option<&'static str> {
    names
        .iter()
        .copied()
        .find(|full| is_named(full, module, name))
}

/// torch dtypes that tensorwire cannot represent, and the quantization schemes: data
/// that `torch.load(weights_only=True)` allows as values.
const TORCH_CONSTANTS: &[&str] = &[
    "torch.float8_e8m0fnu",
    "torch.float4_e2m1fn_x2",
    "torch.complex32",
    "torch.chalf",
    "torch.bcomplex32",
    "torch.qint8",
    "torch.quint8",
    "torch.qint32",
    "torch.quint4x2",
    "torch.quint2x4",
    "torch.bits1x8",
    "torch.bits2x4",
    "torch.bits4x2",
    "torch.bits8",
    "torch.bits16",
    "torch.uint1",
    "torch.uint2",
    "torch.uint3",
    "torch.uint4",
    "torch.uint5",
    "torch.uint6",
    "torch.uint7",
    "torch.int1",
    "torch.int2",
    "torch.int3",
    "torch.int4",
    "torch.int5",
    "torch.int6",
    "torch.int7",
    "torch.per_tensor_affine",
    "torch.per_tensor_symmetric",
    "torch.per_channel_affine",
    "torch.per_channel_symmetric",
    "torch.per_channel_affine_float_qparams",
];

/// torch's layouts, which a pickle names through `torch.serialization._get_layout`
/// (not as globals).
const LAYOUTS: &[&str] = &[
    "torch.strided",
    "torch.sparse_coo",
    "torch.sparse_csr",
    "torch.sparse_csc",
    "torch.sparse_bsr",
    "torch.sparse_bsc",
    "torch._mkldnn",
    "torch.jagged",
];

/// torch's legacy tensor types (also under `torch.cuda.`), allowed as values.
const LEGACY_TENSOR_TYPES: &[&str] = &[
    "torch.DoubleTensor",
    "torch.FloatTensor",
    "torch.HalfTensor",
    "torch.BFloat16Tensor",
    "torch.LongTensor",
    "torch.IntTensor",
    "torch.ShortTensor",
    "torch.CharTensor",
    "torch.ByteTensor",
    "torch.BoolTensor",
    "torch.cuda.DoubleTensor",
    "torch.cuda.FloatTensor",
    "torch.cuda.HalfTensor",
    "torch.cuda.BFloat16Tensor",
    "torch.cuda.LongTensor",
    "torch.cuda.IntTensor",
    "torch.cuda.ShortTensor",
    "torch.cuda.CharTensor",
    "torch.cuda.ByteTensor",
    "torch.cuda.BoolTensor",
];

/// torch's legacy sparse tensor types.
const LEGACY_SPARSE_TYPES: &[&str] = &[
    "torch.sparse.DoubleTensor",
    "torch.sparse.FloatTensor",
    "torch.sparse.HalfTensor",
    "torch.sparse.BFloat16Tensor",
    "torch.sparse.LongTensor",
    "torch.sparse.IntTensor",
    "torch.sparse.ShortTensor",
    "torch.sparse.CharTensor",
    "torch.sparse.ByteTensor",
    "torch.cuda.sparse.DoubleTensor",
    "torch.cuda.sparse.FloatTensor",
    "torch.cuda.sparse.HalfTensor",
    "torch.cuda.sparse.BFloat16Tensor",
    "torch.cuda.sparse.LongTensor",
    "torch.cuda.sparse.IntTensor",
    "torch.cuda.sparse.ShortTensor",
    "torch.cuda.sparse.CharTensor",
    "torch.cuda.sparse.ByteTensor",
];

/// torch's rebuild functions that `torch.load(weights_only=True)` allows and
/// tensorwire cannot follow, with what they build.
const UNSUPPORTED_REBUILDS: &[(&str, &str)] = &[
    (
        "torch._utils._rebuild_wrapper_subclass",
        "tensor subclasses (DTensor and the like)",
    ),
    (
        "torch._utils._rebuild_device_tensor_from_numpy",
        "device tensors saved as numpy arrays",
    ),
];

/// The dtype a `torch.<name>` global names.
fn torch_dtype(name: &str) -> Option<DType> {
    Some(match name {
        "float32" | "float" => DType::F32,
        "float64" | "double" => DType::F64,
        "float16" | "half" => DType::F16,
        "bfloat16" => DType::BF16,
        "int64" | "long" => DType::I64,
        "int32" | "int" => DType::I32,
        "int16" | "short" => DType::I16,
        "int8" => DType::I8,
        "uint8" => DType::U8,
        "uint16" => DType::U16,
        "uint32" => DType::U32,
        "uint64" => DType::U64,
        "bool" => DType::Bool,
        "complex64" | "cfloat" => DType::Complex64,
        "complex128" | "cdouble" => DType::Complex128,
        "float8_e4m3fn" => DType::F8E4M3Fn,
        "float8_e5m2" => DType::F8E5M2,
        "float8_e4m3fnuz" => DType::F8E4M3Fnuz,
        "float8_e5m2fnuz" => DType::F8E5M2Fnuz,
        _ => return None,
    })
}

/// The torch spelling of a dtype (`torch.float32`), for metadata values.
pub fn torch_dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "torch.float32",
        DType::F64 => "torch.float64",
        DType::F16 => "torch.float16",
        DType::BF16 => "torch.bfloat16",
        DType::I64 => "torch.int64",
        DType::I32 => "torch.int32",
        DType::I16 => "torch.int16",
        DType::I8 => "torch.int8",
        DType::U8 => "torch.uint8",
        DType::U16 => "torch.uint16",
        DType::U32 => "torch.uint32",
        DType::U64 => "torch.uint64",
        DType::Bool => "torch.bool",
        DType::Complex64 => "torch.complex64",
        DType::Complex128 => "torch.complex128",
        DType::F8E4M3Fn => "torch.float8_e4m3fn",
        DType::F8E5M2 => "torch.float8_e5m2",
        DType::F8E4M3Fnuz => "torch.float8_e4m3fnuz",
        DType::F8E5M2Fnuz => "torch.float8_e5m2fnuz",
        _ => "torch.unknown",
    }
}

pub(crate) fn bad_args(what: &str, offset: u64, reason: impl std::fmt::Display) -> Error {
    Error::malformed(offset, format!("pickle: bad arguments to {what}: {reason}"))
}

/// The arguments tuple of a call.
fn args_of<'a>(arena: &'a Arena, args: Id, what: &str, offset: u64) -> Result<&'a [Id]> {
    match arena.get(args) {
        Obj::Tuple(span) => Ok(arena.tuple_items(*span)),
        other => Err(bad_args(
            what,
            offset,
            format!("expected a tuple, found {}", other.kind()),
        )),
    }
}

/// The text of `torch.device(*argv)` (`"cuda:0"`), as torch parses it: a type of
/// letters and `_`, then an index (a non-negative int, no leading zeros in text)
/// either after a `:` or as the second argument (`None`: no index), not both; or an
/// index alone, a CUDA device. torch pickles `device(type)` or `device(type, index)`;
/// other writers may pickle the other forms. Anything else is the reason torch would
/// refuse it. Types torch does not know are kept (a renamed private backend, such as
/// `npu`, is one only in a process that registered it).
fn device_text(arena: &Arena, argv: &[Id]) -> std::result::Result<String, String> {
    let (spec, index) = match argv {
        [spec] => (*spec, None),
        [spec, index] => (*spec, Some(*index)),
        _ => return Err(format!("{} arguments", argv.len())),
    };
    if let (Obj::Int(n), None) = (arena.get(spec), index) {
        // `torch.device(0)`: an index alone names a CUDA device.
        return match *n {
            n if n >= 0 => Ok(format!("cuda:{n}")),
            n => Err(format!("a negative device index {n}")),
        };
    }
    let Obj::Str(spec) = arena.get(spec) else {
        return Err(format!(
            "a device type that is a {}",
            arena.get(spec).kind()
        ));
    };
    let (kind, text_index) = match spec.split_once(':') {
        Some((kind, index)) => (kind, Some(index)),
        None => (&**spec, None),
    };
    if kind.is_empty() || !kind.bytes().all(|b| b.is_ascii_alphabetic() || b == b'_') {
        return Err(format!("invalid device string {spec:?}"));
    }
    if let Some(index) = text_index {
        let digits = !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit());
        if !digits || (index.len() > 1 && index.starts_with('0')) || index.len() > 18 {
            return Err(format!("invalid device string {spec:?}"));
        }
    }
    let index = match index.map(|i| arena.get(i)) {
        None => None,
        // torch refuses a second argument, even `None`, beside an index in the text.
        Some(_) if text_index.is_some() => {
            return Err(format!("an index given twice ({spec:?} and an argument)"))
        }
        Some(Obj::None) => None,
        Some(Obj::Int(n)) if *n >= 0 => Some(*n),
        Some(Obj::Int(n)) => return Err(format!("a negative device index {n}")),
        Some(other) => return Err(format!("a device index that is a {}", other.kind())),
    };
    Ok(match index {
        Some(n) => format!("{kind}:{n}"),
        None => spec.to_string(),
    })
}

/// Whether tensors of `dtype` can require grad: torch's "only Tensors of floating
/// point and complex dtype can require gradients".
fn differentiable(dtype: Option<DType>) -> bool {
    use DType::*;
    matches!(
        dtype,
        Some(
            F16 | BF16
                | F32
                | F64
                | F8E4M3Fn
                | F8E5M2
                | F8E4M3Fnuz
                | F8E5M2Fnuz
                | Complex64
                | Complex128
        )
    )
}

/// A tensor requiring grad must be [`differentiable`] (and not quantized).
fn check_requires_grad(record: &TensorRecord, what: &str, offset: u64) -> Result<()> {
    let dtype = record.torch_only.map_or(
        TensorDType::Tensorwire(record.dtype),
        TensorDType::TorchOnly,
    );
    check_grad(
        record.requires_grad,
        grad_allowed(Some(dtype)) && record.quantization.is_none(),
        torch_dtype_name(record.dtype),
        what,
        offset,
    )
}

/// Whether torch lets a tensor of `dtype` require grad: the floating-point and
/// complex dtypes (every torch-only one is one); not the integer, bit and quantized
/// types (`None`: one tensorwire neither has nor holds).
fn grad_allowed(dtype: Option<TensorDType>) -> bool {
    match dtype {
        Some(TensorDType::Tensorwire(dtype)) => differentiable(Some(dtype)),
        Some(TensorDType::TorchOnly(_)) => true,
        None => false,
    }
}

/// Fails when a tensor requires grad where torch would not let it (`allowed`).
fn check_grad(
    requires_grad: bool,
    allowed: bool,
    dtype_name: &str,
    what: &str,
    offset: u64,
) -> Result<()> {
    if requires_grad && !allowed {
        return Err(bad_args(
            what,
            offset,
            format!("a {dtype_name} tensor requiring grad"),
        ));
    }
    Ok(())
}

/// The same check for a meta tensor.
fn check_meta_requires_grad(meta: &MetaTensor, what: &str, offset: u64) -> Result<()> {
    check_grad(
        meta.requires_grad,
        grad_allowed(meta.dtype),
        meta.dtype_name,
        what,
        offset,
    )
}

/// A dtype argument (`_rebuild_tensor_v3`): one tensorwire has, or one only torch
/// has; any other torch dtype (`torch.qint8`, `torch.int4`) is [`Error::Unsupported`].
fn dtype_arg(arena: &Arena, id: Id, what: &str, offset: u64) -> Result<TensorDType> {
    match torch_dtype_arg(arena, id, what, offset)? {
        (Some(dtype), _) => Ok(dtype),
        (None, name) => Err(Error::unsupported(format!(
            "tensors of {name}, which tensorwire has no dtype for"
        ))),
    }
}

/// A dtype argument as torch names it, with the [`TensorDType`] where tensorwire has
/// or holds it (`None` for `torch.qint8`, `torch.int4` and the like, which a tensor
/// without data may have, `_rebuild_meta_tensor_no_storage`).
fn torch_dtype_arg(
    arena: &Arena,
    id: Id,
    what: &str,
    offset: u64,
) -> Result<(Option<TensorDType>, &'static str)> {
    match arena.get(id) {
        Obj::Global(Global::Dtype(dtype)) => Ok((
            Some(TensorDType::Tensorwire(*dtype)),
            torch_dtype_name(*dtype),
        )),
        // The quantization schemes are torch constants too, but no dtypes.
        Obj::Global(Global::TorchConstant(name)) if !name.starts_with("torch.per_") => Ok((
            TorchOnlyDType::from_torch_name(name).map(TensorDType::TorchOnly),
            name,
        )),
        _ => Err(bad_args(what, offset, "the dtype argument is not a dtype")),
    }
}

/// `requires_grad`, which torch sets on the tensor: a bool.
fn requires_grad_arg(arena: &Arena, id: Id, what: &str, offset: u64) -> Result<bool> {
    match arena.get(id) {
        Obj::Bool(b) => Ok(*b),
        other => Err(bad_args(
            what,
            offset,
            format!("requires_grad is of type {}, not bool", other.kind()),
        )),
    }
}

/// Checks that `record` lies on a quantized tensor's storage exactly when the
/// rebuild is `_rebuild_qtensor` (`quantized`): only it gives those storages meaning,
/// and it only them.
fn check_storage_kind(
    record: &TensorRecord,
    quantized: bool,
    what: &str,
    offset: u64,
) -> Result<()> {
    if record.storage.quantized == quantized {
        return Ok(());
    }
    let holds = if quantized {
        format!("{}, not a quantized tensor's integers", record.dtype)
    } else {
        "a quantized tensor's integers".to_owned()
    };
    Err(bad_args(
        what,
        offset,
        format!("storage `{}` holds {holds}", record.storage.key),
    ))
}

/// Sets on `record` the bits of the metadata `torch.save` passes last to
/// `_rebuild_tensor_v2/v3` (`torch._utils.get_tensor_metadata`), which `torch.load`
/// sets on the tensor: `None` or a dict, `{}`, `{"conj": True}`, `{"neg": True}` or
/// both. Any other key, or a value other than `True`, is [`Error::Unsupported`],
/// naming it (torch sets the bit of a key given `False` all the same, and never writes
/// one). The conjugate bit on a tensor that is not complex is malformed: torch fails
/// on it.
fn set_tensor_metadata(
    arena: &Arena,
    metadata: Id,
    record: &mut TensorRecord,
    what: &str,
    offset: u64,
) -> Result<()> {
    let items = match arena.get(metadata) {
        Obj::None => return Ok(()),
        Obj::Dict { items, .. } => items,
        other => {
            return Err(bad_args(
                what,
                offset,
                format!("the tensor metadata is a {}, not a dict", other.kind()),
            ))
        }
    };
    for &(key, value) in items {
        let Obj::Str(key) = arena.get(key) else {
            return Err(Error::unsupported(format!(
                "tensor metadata keyed by a {} ({what} at offset {offset})",
                arena.get(key).kind()
            )));
        };
        let bit = match &**key {
            "conj" => &mut record.is_conj,
            "neg" => &mut record.is_neg,
            other => {
                return Err(Error::unsupported(format!(
                    "tensor metadata {other:?} ({what} at offset {offset}; torch writes \
                     only \"conj\" and \"neg\")"
                )))
            }
        };
        match arena.get(value) {
            Obj::Bool(true) => *bit = true,
            other => {
                let value = match other {
                    Obj::Bool(false) => "False".to_owned(),
                    other => format!("of type {}", other.kind()),
                };
                return Err(Error::unsupported(format!(
                    "tensor metadata {key:?} {value} ({what} at offset {offset}; torch \
                     writes only True, and sets the bit whatever the value)"
                )));
            }
        }
    }
    if record.is_conj && record.complex_part_size().is_none() {
        return Err(bad_args(
            what,
            offset,
            format!(
                "the conjugate bit on a {} tensor (only complex tensors have one; torch \
                 fails on it)",
                record.torch_dtype_name()
            ),
        ));
    }
    Ok(())
}

fn tensor_arg(arena: &Arena, id: Id, what: &str, offset: u64) -> Result<Obj> {
    match arena.get(id) {
        t @ Obj::Tensor(_) => Ok(t.clone()),
        other => Err(bad_args(
            what,
            offset,
            format!("expected a tensor, found {}", other.kind()),
        )),
    }
}

/// Interprets `callable(*args)`.
pub fn call(arena: &Arena, callable: Id, args: Id, offset: u64) -> Result<Obj> {
    let Obj::Global(global) = arena.get(callable) else {
        return Err(Error::malformed(
            offset,
            format!("pickle: calling a {}", arena.get(callable).kind()),
        ));
    };
    let global = *global;
    let what = global.name();
    let argv = args_of(arena, args, what, offset)?;
    match global {
        Global::RebuildTensor | Global::RebuildTensorV2 => {
            let min = if global == Global::RebuildTensor {
                4
            } else {
                6
            };
            if argv.len() < min || argv.len() > 7 {
                return Err(bad_args(what, offset, format!("{} arguments", argv.len())));
            }
            let mut record = TensorRecord::from_rebuild(
                arena, argv[0], argv[1], argv[2], argv[3], None, offset,
            )?;
            if global == Global::RebuildTensorV2 {
                record.requires_grad = requires_grad_arg(arena, argv[4], what, offset)?;
                if let Some(&metadata) = argv.get(6) {
                    set_tensor_metadata(arena, metadata, &mut record, what, offset)?;
                }
            }
            check_storage_kind(&record, false, what, offset)?;
            check_requires_grad(&record, what, offset)?;
            Ok(Obj::Tensor(Box::new(record)))
        }
        Global::RebuildTensorV3 => {
            if argv.len() < 7 || argv.len() > 8 {
                return Err(bad_args(what, offset, format!("{} arguments", argv.len())));
            }
            let dtype = dtype_arg(arena, argv[6], what, offset)?;
            let mut record = TensorRecord::from_rebuild(
                arena,
                argv[0],
                argv[1],
                argv[2],
                argv[3],
                Some(dtype),
                offset,
            )?;
            record.requires_grad = requires_grad_arg(arena, argv[4], what, offset)?;
            if let Some(&metadata) = argv.get(7) {
                set_tensor_metadata(arena, metadata, &mut record, what, offset)?;
            }
            check_storage_kind(&record, false, what, offset)?;
            check_requires_grad(&record, what, offset)?;
            Ok(Obj::Tensor(Box::new(record)))
        }
        Global::RebuildQTensor => {
            let [storage, storage_offset, size, stride, params, requires_grad, _hooks] = argv
            else {
                return Err(bad_args(what, offset, format!("{} arguments", argv.len())));
            };
            if requires_grad_arg(arena, *requires_grad, what, offset)? {
                // torch: "only Tensors of floating point and complex dtype can require
                // gradients".
                return Err(bad_args(what, offset, "a quantized tensor requiring grad"));
            }
            let mut record = TensorRecord::from_rebuild(
                arena,
                *storage,
                *storage_offset,
                *size,
                *stride,
                None,
                offset,
            )?;
            check_storage_kind(&record, true, what, offset)?;
            let quantization = quantization(arena, *params, &record, offset)?;
            record.quantization = Some(Box::new(quantization));
            Ok(Obj::Tensor(Box::new(record)))
        }
        Global::RebuildMetaTensor => {
            let [dtype, size, stride, requires_grad] = argv else {
                return Err(bad_args(what, offset, format!("{} arguments", argv.len())));
            };
            // A tensor without data may have any torch dtype, one tensorwire lacks too.
            let (dtype, dtype_name) = torch_dtype_arg(arena, *dtype, what, offset)?;
            let mut meta =
                MetaTensor::from_rebuild(arena, dtype, dtype_name, *size, *stride, offset)?;
            meta.requires_grad = requires_grad_arg(arena, *requires_grad, what, offset)?;
            check_meta_requires_grad(&meta, what, offset)?;
            Ok(Obj::Meta(Box::new(meta)))
        }
        Global::RebuildParameter | Global::RebuildParameterWithState => {
            // (data, requires_grad, backward_hooks[, state]): torch makes
            // `nn.Parameter(data, requires_grad)` (the state sets Python attributes on
            // it, which are not kept here).
            let arity = if global == Global::RebuildParameter {
                3
            } else {
                4
            };
            let [data, requires_grad, ..] = argv else {
                return Err(bad_args(what, offset, format!("{} arguments", argv.len())));
            };
            if argv.len() != arity {
                return Err(bad_args(what, offset, format!("{} arguments", argv.len())));
            }
            let requires_grad = requires_grad_arg(arena, *requires_grad, what, offset)?;
            match arena.get(*data) {
                Obj::Sparse(sparse) => {
                    let mut sparse = sparse.clone();
                    let values = sparse.parts.last().map(|v| v.dtype);
                    if requires_grad && !differentiable(values) {
                        return Err(bad_args(what, offset, "a sparse tensor requiring grad"));
                    }
                    sparse.parameter = Some(requires_grad);
                    Ok(Obj::Sparse(sparse))
                }
                Obj::Tensor(record) => {
                    let mut record = record.clone();
                    record.parameter = true;
                    record.requires_grad = requires_grad;
                    check_requires_grad(&record, what, offset)?;
                    Ok(Obj::Tensor(record))
                }
                Obj::Meta(meta) => {
                    let mut meta = meta.clone();
                    meta.parameter = true;
                    meta.requires_grad = requires_grad;
                    check_meta_requires_grad(&meta, what, offset)?;
                    Ok(Obj::Meta(meta))
                }
                _ => tensor_arg(arena, *data, what, offset),
            }
        }
        Global::RebuildFromTypeV2 => {
            let [func, new_type, inner_args, _state] = argv else {
                return Err(bad_args(what, offset, format!("{} arguments", argv.len())));
            };
            let Obj::Global(Global::TensorClass(class)) = arena.get(*new_type) else {
                return Err(bad_args(what, offset, "new_type is not torch.Tensor"));
            };
            // torch: `func(*args)`, then `as_subclass(new_type)` when not of that type.
            match call(arena, *func, *inner_args, offset)? {
                Obj::Tensor(mut record) if class.ends_with("Parameter") => {
                    record.parameter = true;
                    Ok(Obj::Tensor(record))
                }
                Obj::Meta(mut meta) if class.ends_with("Parameter") => {
                    meta.parameter = true;
                    Ok(Obj::Meta(meta))
                }
                other => Ok(other),
            }
        }
        Global::OrderedDict => match argv {
            [] => Ok(Obj::Dict {
                items: Vec::new(),
                kind: DictKind::OrderedDict,
            }),
            [pairs] => {
                let list = arena
                    .items(*pairs)
                    .ok_or_else(|| bad_args(what, offset, "expected a list of pairs"))?;
                let items = list
                    .iter()
                    .map(|&p| match arena.items(p) {
                        Some(&[k, v]) => Ok((k, v)),
                        _ => Err(bad_args(what, offset, "an item is not a pair")),
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(Obj::Dict {
                    items,
                    kind: DictKind::OrderedDict,
                })
            }
            _ => Err(bad_args(what, offset, format!("{} arguments", argv.len()))),
        },
        Global::Size => {
            // torch.Size takes any iterable of ints (a bool is an int); torch pickles
            // its own tuple. Copied: a list's items may change later.
            let items: &[Id] = match argv {
                [] => &[],
                [dims] => match arena.get(*dims) {
                    Obj::Tuple(span) => arena.tuple_items(*span),
                    Obj::List(items) => items,
                    Obj::Size(dims) => return Ok(Obj::Size(dims.clone())),
                    other => return Err(bad_args(what, offset, format!("a {}", other.kind()))),
                },
                _ => return Err(bad_args(what, offset, format!("{} arguments", argv.len()))),
            };
            let dims = items
                .iter()
                .map(|&item| match arena.get(item) {
                    Obj::Int(n) => Ok(*n),
                    Obj::Bool(b) => Ok(i64::from(*b)),
                    other => Err(bad_args(
                        what,
                        offset,
                        format!("a size that is a {}", other.kind()),
                    )),
                })
                .collect::<Result<_>>()?;
            Ok(Obj::Size(dims))
        }
        Global::Device => device_text(arena, argv)
            .map(|text| Obj::Device(text.into()))
            .map_err(|reason| bad_args(what, offset, reason)),
        Global::CodecsEncode => {
            let (text, encoding) = match argv {
                [t] => (*t, None),
                [t, e] => (*t, Some(*e)),
                _ => return Err(bad_args(what, offset, format!("{} arguments", argv.len()))),
            };
            let Obj::Str(text) = arena.get(text) else {
                return Err(bad_args(what, offset, "the text is not a str"));
            };
            let encoding = match encoding.map(|e| arena.get(e)) {
                None => "utf-8",
                Some(Obj::Str(e)) => e,
                Some(other) => return Err(bad_args(what, offset, format!("a {}", other.kind()))),
            };
            let bytes: Vec<u8> = match encoding {
                "latin1" | "latin-1" | "iso-8859-1" => text
                    .chars()
                    .map(|c| u8::try_from(u32::from(c)).map_err(|_| c))
                    .collect::<std::result::Result<_, _>>()
                    .map_err(|c| bad_args(what, offset, format!("{c:?} is not latin-1")))?,
                "utf-8" | "utf8" => text.as_bytes().to_vec(),
                other => {
                    return Err(bad_args(what, offset, format!("encoding {other:?}")));
                }
            };
            Ok(Obj::Bytes(bytes.into()))
        }
        Global::Set | Global::FrozenSet => {
            let items = match argv {
                [] => Vec::new(),
                [items] => arena
                    .items(*items)
                    .map(<[Id]>::to_vec)
                    .ok_or_else(|| bad_args(what, offset, "expected a list"))?,
                _ => return Err(bad_args(what, offset, format!("{} arguments", argv.len()))),
            };
            Ok(if global == Global::FrozenSet {
                Obj::FrozenSet(items)
            } else {
                Obj::Set(items)
            })
        }
        Global::Complex => {
            // Python's `complex(real, imag)`: `real + imag * 1j`, either part itself
            // a number of any kind.
            let part = |id: Id| -> Result<(f64, Option<f64>)> {
                Ok(match arena.get(id) {
                    Obj::Bool(b) => (f64::from(u8::from(*b)), None),
                    Obj::Int(n) => (*n as f64, None),
                    Obj::WideInt(b) => (wide_int_f64(b, what, offset)?, None),
                    Obj::Float(f) => (*f, None),
                    Obj::Complex(re, im) => (*re, Some(*im)),
                    Obj::Str(_) => {
                        return Err(Error::unsupported(format!(
                            "{what} of a string (at offset {offset})"
                        )))
                    }
                    other => return Err(bad_args(what, offset, format!("a {}", other.kind()))),
                })
            };
            match argv {
                [] => Ok(Obj::Complex(0.0, 0.0)),
                [real] => {
                    let (re, im) = part(*real)?;
                    Ok(Obj::Complex(re, im.unwrap_or(0.0)))
                }
                [real, imag] => {
                    let (mut re, real_im) = part(*real)?;
                    let (mut im, imag_im) = part(*imag)?;
                    // Only complex parts add (adding 0.0 would turn -0.0 into 0.0).
                    if let Some(imag_im) = imag_im {
                        re -= imag_im;
                    }
                    if let Some(real_im) = real_im {
                        im += real_im;
                    }
                    Ok(Obj::Complex(re, im))
                }
                _ => Err(bad_args(what, offset, format!("{} arguments", argv.len()))),
            }
        }
        Global::ByteArray => match argv {
            [] => Ok(Obj::ByteArray(Box::new([]))),
            [b] => match arena.get(*b) {
                Obj::Bytes(b) | Obj::ByteArray(b) => Ok(Obj::ByteArray(b.clone())),
                other => Err(bad_args(what, offset, format!("a {}", other.kind()))),
            },
            _ => Err(bad_args(what, offset, format!("{} arguments", argv.len()))),
        },
        Global::Counter => match argv {
            [] => Ok(Obj::Dict {
                items: Vec::new(),
                kind: DictKind::Counter,
            }),
            [counts] => match arena.get(*counts) {
                Obj::Dict { items, .. } => Ok(Obj::Dict {
                    items: items.clone(),
                    kind: DictKind::Counter,
                }),
                other => Err(bad_args(what, offset, format!("a {}", other.kind()))),
            },
            _ => Err(bad_args(what, offset, format!("{} arguments", argv.len()))),
        },
        Global::GetLayout => match argv {
            [layout] => match arena.get(*layout) {
                Obj::Str(s) => LAYOUTS
                    .iter()
                    .find(|&&name| name == &**s)
                    .map(|name| Obj::Global(Global::TorchConstant(name)))
                    .ok_or_else(|| bad_args(what, offset, format!("no layout is named {s:?}"))),
                other => Err(bad_args(what, offset, format!("a {}", other.kind()))),
            },
            _ => Err(bad_args(what, offset, format!("{} arguments", argv.len()))),
        },
        Global::RebuildSparseTensor => match argv {
            [layout, data] => Ok(Obj::Sparse(Box::new(SparseTensor::from_rebuild(
                arena, *layout, *data, offset,
            )?))),
            _ => Err(bad_args(what, offset, format!("{} arguments", argv.len()))),
        },
        Global::RebuildFromCpuTensor => {
            let [data, dtype, _device, requires_grad] = argv else {
                return Err(bad_args(what, offset, format!("{} arguments", argv.len())));
            };
            let requires_grad = requires_grad_arg(arena, *requires_grad, what, offset)?;
            let tensor = tensor_arg(arena, *data, what, offset)?;
            match (arena.get(*dtype), &tensor) {
                (Obj::Global(Global::Dtype(d)), Obj::Tensor(t)) if *d == t.dtype => {
                    // torch: `data.to(dtype, device)`, then `requires_grad` set on it.
                    let mut record = t.clone();
                    record.requires_grad = requires_grad;
                    check_requires_grad(&record, what, offset)?;
                    Ok(Obj::Tensor(record))
                }
                (Obj::Global(g), _) => Err(Error::unsupported(format!(
                    "{what} converting a tensor to {}",
                    g.name()
                ))),
                (other, _) => Err(bad_args(what, offset, format!("a {}", other.kind()))),
            }
        }
        Global::Unsupported { name, builds } => Err(Error::unsupported(format!(
            "{builds} ({name}, which torch.load(weights_only=True) allows)"
        ))),
        Global::TensorClass(_)
        | Global::Storage(_)
        | Global::Dtype(_)
        | Global::TorchConstant(_)
        | Global::Named(_) => Err(Error::malformed(
            offset,
            format!("pickle: {what} is not callable here"),
        )),
    }
}

/// The quantizer parameters of `_rebuild_qtensor` for `tensor`: `(scheme, scale,
/// zero_point)` or `(scheme, scales, zero_points, axis)`.
fn quantization(
    arena: &Arena,
    params: Id,
    tensor: &TensorRecord,
    offset: u64,
) -> Result<Quantization> {
    let what = Global::RebuildQTensor.name();
    let bad = |reason: String| bad_args(what, offset, format!("quantizer parameters: {reason}"));
    let items = arena
        .items(params)
        .ok_or_else(|| bad("not a tuple".into()))?;
    let Some(Obj::Global(Global::TorchConstant(scheme))) = items.first().map(|&i| arena.get(i))
    else {
        return Err(bad("the first is not a quantization scheme".into()));
    };
    match (*scheme, &items[1..]) {
        ("torch.per_tensor_affine", &[scale, zero_point]) => {
            let scale = match arena.get(scale) {
                Obj::Float(f) => *f,
                Obj::Int(n) => *n as f64,
                other => return Err(bad(format!("a scale of type {}", other.kind()))),
            };
            let Obj::Int(zero_point) = arena.get(zero_point) else {
                return Err(bad("the zero point is not an int".into()));
            };
            Ok(Quantization::PerTensor {
                scale,
                zero_point: *zero_point,
            })
        }
        (
            "torch.per_channel_affine" | "torch.per_channel_affine_float_qparams",
            &[scales, zero_points, axis],
        ) => {
            let dims = tensor.shape.dims();
            let axis = match arena.get(axis) {
                Obj::Int(n) if usize::try_from(*n).is_ok_and(|n| n < dims.len()) => *n as u64,
                other => return Err(bad(format!("axis {other:?} for {} dims", dims.len()))),
            };
            let channels = dims[axis as usize];
            // One value per channel, as torch requires: scales are floats, zero
            // points ints, or floats (float_qparams).
            let per_channel = |id: Id, which: &str, ints_allowed: bool| {
                let t = match arena.get(id) {
                    Obj::Tensor(t) if t.quantization.is_none() => t,
                    // torch turns lists into tensors; tensorwire has no bytes for them.
                    Obj::List(_) => {
                        return Err(Error::unsupported(format!(
                            "per-channel quantization {which} given as a list, not a tensor"
                        )))
                    }
                    other => return Err(bad(format!("the {which} are a {}", other.kind()))),
                };
                if t.shape.dims() != [channels] {
                    return Err(bad(format!(
                        "the {which} have shape {}, not [{channels}] (dimension {axis})",
                        t.shape
                    )));
                }
                let is_int = matches!(t.dtype, DType::I8 | DType::I16 | DType::I32 | DType::I64);
                if !(is_float(t.dtype) || ints_allowed && is_int) {
                    return Err(bad(format!("the {which} are {}", t.dtype)));
                }
                Ok(t.clone())
            };
            let scales = per_channel(scales, "scales", false)?;
            let zero_points = per_channel(zero_points, "zero points", true)?;
            Ok(Quantization::PerChannel {
                // torch pickles float_qparams tensors as per_channel_affine and tells
                // them apart at load by their float zero points: so do we.
                float_qparams: is_float(zero_points.dtype),
                scales,
                zero_points,
                axis,
            })
        }
        ("torch.per_tensor_symmetric" | "torch.per_channel_symmetric", _) => {
            Err(Error::unsupported(format!(
                "quantized tensors with the scheme {scheme} (torch cannot load them either)"
            )))
        }
        (scheme, rest) => Err(bad(format!(
            "{scheme} with {} values after it (per tensor: scale, zero point; per \
             channel: scales, zero points, axis)",
            rest.len()
        ))),
    }
}

/// True for the float dtypes torch takes as quantization scales.
fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
}

/// Interprets `BUILD` (`target.__setstate__(state)`): the attributes torch attaches to
/// a state dict (`_metadata`) or to a tensor are accepted and dropped; nothing else
/// takes state.
pub fn build(arena: &Arena, target: Id, state: Id, offset: u64) -> Result<Option<Id>> {
    match arena.get(target) {
        // torch: `inst.__dict__.update(state)`, the attributes `state_dict()` sets
        // (`_metadata`, the modules' versions).
        Obj::Dict {
            kind: DictKind::OrderedDict,
            ..
        } => match arena.get(state) {
            Obj::None => Ok(None),
            Obj::Dict { items, .. } => {
                if let Some(&(key, _)) = items
                    .iter()
                    .find(|(k, _)| !matches!(arena.get(*k), Obj::Str(_)))
                {
                    return Err(Error::malformed(
                        offset,
                        format!(
                            "pickle: BUILD of an OrderedDict with an attribute named by a {}",
                            arena.get(key).kind()
                        ),
                    ));
                }
                Ok(Some(state))
            }
            other => Err(Error::malformed(
                offset,
                format!(
                    "pickle: BUILD of an OrderedDict with a {} state",
                    other.kind()
                ),
            )),
        },
        // Kept as before torch knew them: accepted, their state dropped.
        Obj::Dict { .. } | Obj::Tensor(_) => Ok(None),
        other => Err(Error::malformed(
            offset,
            format!("pickle: BUILD on a {}", other.kind()),
        )),
    }
}

/// An [`Obj::WideInt`] as Python's `float(int)` gives it: the nearest float (ties to
/// even); an integer past the largest float is refused, as Python's `OverflowError`.
fn wide_int_f64(bytes: &[u8], what: &str, offset: u64) -> Result<f64> {
    match BigInt::value_from_le_bytes(bytes)? {
        tensorwire_core::Value::Int(v) => Ok(v as f64),
        // Rust's float parsing rounds the decimal text exactly.
        wide => match wide.to_string().parse::<f64>() {
            Ok(f) if f.is_finite() => Ok(f),
            _ => Err(bad_args(what, offset, "int too large to convert to float")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pickle::{unpickle, PersistentLoad, PickleLimits};
    use crate::tensor::StorageRef;

    /// Persistent ids as torch's ZIP files have them.
    struct Storages;
    impl PersistentLoad for Storages {
        fn load(&mut self, arena: &Arena, pid: Id, at: u64) -> Result<StorageRef> {
            StorageRef::from_persistent_id(arena, pid, at)
        }
    }

    /// Protocol-2 pickle text of a 1-d `_rebuild_tensor_v2` tensor of `n` elements
    /// of storage `class`, key `key`.
    fn tensor_pickle(class: &str, key: &str, n: u8) -> Vec<u8> {
        let mut p = b"ctorch._utils\n_rebuild_tensor_v2\n(".to_vec();
        p.extend(persistent_id(class, key, n));
        p.extend([
            b'K', 0, b'K', n, 0x85, b'K', 1, 0x85, 0x89, b'}', b't', b'R',
        ]);
        p
    }

    fn persistent_id(class: &str, key: &str, n: u8) -> Vec<u8> {
        let mut p = b"(X\x07\x00\x00\x00storagectorch\n".to_vec();
        p.extend(class.as_bytes());
        p.push(b'\n');
        p.extend([b'X', key.len() as u8, 0, 0, 0]);
        p.extend(key.as_bytes());
        p.extend(b"X\x03\x00\x00\x00cpuK");
        p.extend([n, b't', b'Q']);
        p
    }

    /// A `_rebuild_qtensor` of a (2, 3) tensor on a storage of `class` with the
    /// quantizer parameters `params` (pickle text), as torch writes it.
    fn qtensor(class: &str, params: &[u8]) -> Result<TensorRecord> {
        let mut p = b"\x80\x02ctorch._utils\n_rebuild_qtensor\n(".to_vec();
        p.extend(persistent_id(class, "0", 6));
        p.extend(b"K\x00K\x02K\x03\x86K\x03K\x01\x86");
        p.extend(params);
        p.extend(b"\x89}tR.");
        let u = unpickle(&p, 0, &PickleLimits::default(), &mut Storages)?;
        match u.arena.get(u.root) {
            Obj::Tensor(t) => Ok((**t).clone()),
            other => panic!("{other:?}"),
        }
    }

    /// Pickle text of `(torch.<scheme>, <rest>)`.
    fn params(scheme: &str, rest: &[&[u8]]) -> Vec<u8> {
        let mut p = b"(ctorch\n".to_vec();
        p.extend(scheme.as_bytes());
        p.push(b'\n');
        rest.iter().for_each(|r| p.extend(*r));
        p.push(b't');
        p
    }

    const HALF: &[u8] = b"G\x3f\xe0\x00\x00\x00\x00\x00\x00";

    #[test]
    fn a_tensor_with_elements_must_lie_inside_its_storage_an_empty_one_need_not() {
        // A 1-d tensor of 3 f32 on a storage of 3, at offset 1 (past the end) and at
        // offset 5 with no elements (torch.empty(3)[5:] has offset 3 at most, but
        // torch loads any offset for an empty tensor).
        let run = |offset: u8, n: u8| {
            let mut p = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(".to_vec();
            p.extend(persistent_id("FloatStorage", "0", 3));
            p.extend([
                b'K', offset, b'K', n, 0x85, b'K', 1, 0x85, 0x89, b'}', b't', b'R', b'.',
            ]);
            unpickle(&p, 0, &PickleLimits::default(), &mut Storages)
        };
        assert!(matches!(run(1, 3), Err(Error::OutOfBounds { .. })));
        assert!(run(0, 3).is_ok());
        let u = run(5, 0).unwrap();
        let Obj::Tensor(t) = u.arena.get(u.root) else {
            panic!()
        };
        assert_eq!((t.storage_offset, t.byte_extent().unwrap()), (5, (12, 12)));
    }

    #[test]
    fn per_channel_parts_are_named_as_the_flat_view_names() {
        // {"": q} and {"w": q}: the parts join as every flat name joins.
        for (key, parts) in [
            ("", ["q_per_channel_scales", "q_per_channel_zero_points"]),
            (
                "w",
                ["w.q_per_channel_scales", "w.q_per_channel_zero_points"],
            ),
        ] {
            let mut p = b"\x80\x02}X".to_vec();
            p.extend((key.len() as u32).to_le_bytes());
            p.extend(key.as_bytes());
            p.extend(b"ctorch._utils\n_rebuild_qtensor\n(");
            p.extend(persistent_id("QInt8Storage", "0", 6));
            p.extend(b"K\x00K\x02K\x03\x86K\x03K\x01\x86");
            let scales = tensor_pickle("DoubleStorage", "1", 3);
            let zps = tensor_pickle("LongStorage", "2", 3);
            p.extend(params("per_channel_affine", &[&scales, &zps, b"K\x01"]));
            p.extend(b"\x89}tRs.");
            let u = unpickle(&p, 0, &PickleLimits::default(), &mut Storages).unwrap();
            let flat = crate::flatten::flatten(&u.arena, u.root, 64, 100).unwrap();
            let names: Vec<&str> = flat.tensors.iter().map(|(n, _)| &**n).collect();
            assert_eq!(names, [key, parts[0], parts[1]]);
            let q = flat.tensors[0].1.quantization.as_deref().unwrap();
            let attributes = q.attributes(key);
            for (k, part) in [
                "torch.q_per_channel_scales",
                "torch.q_per_channel_zero_points",
            ]
            .into_iter()
            .zip(parts)
            {
                assert_eq!(attributes.get(k).and_then(|v| v.as_str()), Some(part));
            }
        }
    }

    #[test]
    fn quantized_tensors_are_their_integers_with_their_parameters() {
        let t = qtensor(
            "QInt8Storage",
            &params("per_tensor_affine", &[HALF, b"K\x03"]),
        )
        .unwrap();
        assert_eq!(t.dtype, DType::I8);
        assert_eq!(
            t.quantization.as_deref(),
            Some(&Quantization::PerTensor {
                scale: 0.5,
                zero_point: 3
            })
        );
        for (class, dtype) in [("QUInt8Storage", DType::U8), ("QInt32Storage", DType::I32)] {
            let t = qtensor(
                class,
                &params("per_tensor_affine", &[HALF, b"J\xfb\xff\xff\xff"]),
            )
            .unwrap();
            assert_eq!(t.dtype, dtype);
            assert!(matches!(
                t.quantization.as_deref(),
                Some(Quantization::PerTensor { zero_point: -5, .. })
            ));
        }
        // Per channel along axis 1 (3 channels); float zero points make float_qparams,
        // as torch tells the two apart at load.
        for (zero_points, float_qparams) in [("LongStorage", false), ("FloatStorage", true)] {
            let scales = tensor_pickle("DoubleStorage", "1", 3);
            let zps = tensor_pickle(zero_points, "2", 3);
            let p = params("per_channel_affine", &[&scales, &zps, b"K\x01"]);
            let t = qtensor("QInt8Storage", &p).unwrap();
            let Some(Quantization::PerChannel {
                float_qparams: got,
                scales,
                zero_points,
                axis: 1,
            }) = t.quantization.as_deref()
            else {
                panic!("{:?}", t.quantization)
            };
            assert_eq!(*got, float_qparams);
            assert_eq!(scales.shape.dims(), [3]);
            assert_eq!(&*zero_points.storage.key, "2");
        }
    }

    /// The root object of pickle `p` (protocol 2 header and STOP added) as a tensor.
    fn root_tensor(body: &[u8]) -> Result<TensorRecord> {
        let mut p = b"\x80\x02".to_vec();
        p.extend(body);
        p.push(b'.');
        match root_of(&p)? {
            Obj::Tensor(t) => Ok(*t),
            other => panic!("{}", other.kind()),
        }
    }

    /// The object a whole pickle `p` builds (its storages parsed as the reader's).
    fn root_of(p: &[u8]) -> Result<Obj> {
        let u = unpickle(p, 0, &PickleLimits::default(), &mut Storages)?;
        Ok(u.arena.get(u.root).clone())
    }

    /// `tensor_pickle` with `requires_grad=True`.
    fn requiring_grad(class: &str) -> Vec<u8> {
        let mut p = tensor_pickle(class, "0", 3);
        let flag = p.iter().rposition(|&b| b == 0x89).unwrap();
        p[flag] = 0x88; // NEWTRUE
        p
    }

    #[test]
    fn complex_is_called_as_python_calls_it() {
        // `complex(*args)`: pickle text of the arguments, and what Python gives.
        let call = |args: &[u8]| {
            let mut p = b"\x80\x02c__builtin__\ncomplex\n(".to_vec();
            p.extend(args);
            p.extend(b"tR.");
            root_of(&p)
        };
        let one_j = b"c__builtin__\ncomplex\nK\x00K\x01\x86R"; // 1j, made by a call too
        let float = |f: f64| [&[b'G'][..], &f.to_be_bytes()].concat();
        for (args, want) in [
            (vec![], (0.0_f64, 0.0_f64)),
            (b"K\x02".to_vec(), (2.0, 0.0)),
            (b"\x88K\x03".to_vec(), (1.0, 3.0)),
            ([&float(-0.0)[..], &float(1.5)].concat(), (-0.0, 1.5)),
            // 2**64 - 1 (LONG1 of 9 bytes), rounded to the nearest double as Python does
            (
                b"\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00".to_vec(),
                (1.8446744073709552e19, 0.0),
            ),
            (one_j.to_vec(), (0.0, 1.0)),
            ([&one_j[..], b"K\x02"].concat(), (0.0, 3.0)),
            ([&b"K\x03"[..], one_j].concat(), (2.0, 0.0)),
        ] {
            match call(&args).unwrap() {
                Obj::Complex(re, im) => {
                    assert_eq!(
                        (re.to_bits(), im.to_bits()),
                        (want.0.to_bits(), want.1.to_bits())
                    )
                }
                other => panic!("{other:?}"),
            }
        }
        // complex("1+2j") parses text: not here. A list is no number; three arguments
        // are too many.
        assert!(matches!(
            call(b"X\x04\x00\x00\x001+2j"),
            Err(Error::Unsupported { .. })
        ));
        for args in [&b"]"[..], b"K\x01K\x02K\x03"] {
            let err = call(args).unwrap_err();
            assert!(err.to_string().contains("builtins.complex"), "{err}");
            assert!(!matches!(err, Error::Unsupported { .. }), "{err}");
        }
    }

    #[test]
    fn build_keeps_an_ordered_dicts_attributes_only() {
        let run = |body: &[u8]| {
            let mut p = b"\x80\x02ccollections\nOrderedDict\n)R".to_vec();
            p.extend(body);
            p.push(b'.');
            unpickle(&p, 0, &PickleLimits::default(), &mut Storages)
        };
        const META: &[u8] = b"}X\x09\x00\x00\x00_metadata}sb";
        let u = run(META).unwrap();
        let state = u.arena.attributes(u.root).expect("attributes kept");
        assert!(matches!(u.arena.get(state), Obj::Dict { items, .. } if items.len() == 1));
        // A None state sets nothing, as Python's BUILD.
        let u = run(b"Nb").unwrap();
        assert_eq!(u.arena.attributes(u.root), None);
        for (body, message) in [
            (&b"}K\x01K\x02sb"[..], "attribute named by a int"),
            (b"]b", "with a list state"),
            (&[META, META].concat()[..], "a second BUILD"),
        ] {
            let err = run(body).unwrap_err();
            assert!(err.to_string().contains(message), "{err}");
        }
        // On a plain dict, accepted and dropped.
        let p = b"\x80\x02}}X\x01\x00\x00\x00aK\x01sb.";
        let u = unpickle(p, 0, &PickleLimits::default(), &mut Storages).unwrap();
        assert_eq!(u.arena.attributes(u.root), None);
    }

    #[test]
    fn requires_grad_and_parameters_are_kept() {
        let plain = root_tensor(&tensor_pickle("FloatStorage", "0", 3)).unwrap();
        assert!(!plain.requires_grad && !plain.parameter);
        let grad = root_tensor(&requiring_grad("FloatStorage")).unwrap();
        assert!(grad.requires_grad && !grad.parameter);
        // _rebuild_parameter(data, requires_grad, OrderedDict()): the parameter's flag.
        for (flag, want) in [(0x88, true), (0x89, false)] {
            let mut p = b"ctorch._utils\n_rebuild_parameter\n(".to_vec();
            p.extend(tensor_pickle("FloatStorage", "0", 3));
            p.extend([flag, b'}', b't', b'R']);
            let param = root_tensor(&p).unwrap();
            assert!(param.parameter && param.requires_grad == want);
        }
        // An int parameter that does not require grad is one torch makes.
        let mut p = b"ctorch._utils\n_rebuild_parameter\n(".to_vec();
        p.extend(tensor_pickle("LongStorage", "0", 3));
        p.extend(b"\x89}tR");
        assert!(root_tensor(&p).unwrap().parameter);
        // Integer tensors cannot require grad (torch refuses to make them).
        for body in [requiring_grad("LongStorage"), {
            let mut p = b"ctorch._utils\n_rebuild_parameter\n(".to_vec();
            p.extend(tensor_pickle("IntStorage", "0", 3));
            p.extend(b"\x88}tR");
            p
        }] {
            let err = root_tensor(&body).unwrap_err();
            assert!(err.to_string().contains("tensor requiring grad"), "{err}");
        }
        // torch's arities: 3 for _rebuild_parameter, 4 with state.
        for (function, args, count) in [
            ("_rebuild_parameter", &b""[..], "1 arguments"),
            ("_rebuild_parameter", b"\x88", "2 arguments"),
            ("_rebuild_parameter", b"\x88}}", "4 arguments"),
            ("_rebuild_parameter_with_state", b"\x88}", "3 arguments"),
        ] {
            let mut p = format!("ctorch._utils\n{function}\n(").into_bytes();
            p.extend(tensor_pickle("FloatStorage", "0", 3));
            p.extend(args);
            p.extend(b"tR");
            let err = root_tensor(&p).unwrap_err();
            assert!(err.to_string().contains(count), "{function}: {err}");
        }
        let mut p = b"ctorch._utils\n_rebuild_parameter_with_state\n(".to_vec();
        p.extend(tensor_pickle("FloatStorage", "0", 3));
        p.extend(b"\x88}}tR");
        assert!(root_tensor(&p).unwrap().parameter);
        // _rebuild_device_tensor_from_cpu_tensor(data, dtype, device, requires_grad).
        let mut p = b"ctorch._utils\n_rebuild_device_tensor_from_cpu_tensor\n(".to_vec();
        p.extend(tensor_pickle("FloatStorage", "0", 3));
        p.extend(b"ctorch\nfloat32\nX\x03\x00\x00\x00xla\x88tR");
        let t = root_tensor(&p).unwrap();
        assert!(t.requires_grad && !t.parameter);
    }

    #[test]
    fn quantized_storages_are_for_quantized_tensors_only() {
        // `_rebuild_tensor_v2` over a QInt8Storage: torch fails, so do we.
        let mut p = b"\x80\x02".to_vec();
        p.extend(tensor_pickle("QInt8Storage", "0", 3));
        p.push(b'.');
        let err = unpickle(&p, 0, &PickleLimits::default(), &mut Storages).unwrap_err();
        assert!(
            err.to_string().contains("quantized tensor's integers"),
            "{err}"
        );
        // requires_grad must be a bool (torch sets it on the tensor).
        let mut p = b"\x80\x02".to_vec();
        p.extend(tensor_pickle("FloatStorage", "0", 3));
        p.push(b'.');
        let not_bool = p.iter().rposition(|&b| b == 0x89).unwrap();
        p.splice(not_bool..=not_bool, *b"K\x01");
        let err = unpickle(&p, 0, &PickleLimits::default(), &mut Storages).unwrap_err();
        assert!(
            err.to_string().contains("requires_grad is of type int"),
            "{err}"
        );
    }

    /// Protocol-2 pickle text of a contiguous tensor of sizes `dims` on storage `class`.
    fn nd_pickle(class: &str, key: &str, dims: &[u8]) -> Vec<u8> {
        let numel = dims.iter().map(|&d| d as usize).product::<usize>();
        let mut p = b"ctorch._utils\n_rebuild_tensor_v2\n(".to_vec();
        p.extend(persistent_id(class, key, u8::try_from(numel).unwrap()));
        p.extend(b"K\x00(");
        dims.iter().for_each(|&d| p.extend([b'K', d]));
        p.extend(b"t(");
        let mut stride = 1;
        let mut strides: Vec<u8> = dims
            .iter()
            .rev()
            .map(|&d| {
                let s = stride;
                stride *= d;
                s
            })
            .collect();
        strides.reverse();
        strides.iter().for_each(|&s| p.extend([b'K', s]));
        p.extend(b"t\x89}tR");
        p
    }

    /// `_rebuild_sparse_tensor(_get_layout(layout), (*parts, torch.Size(size), *rest))`.
    fn sparse(layout: &str, parts: &[Vec<u8>], size: &[u64], rest: &[u8]) -> Result<Obj> {
        let mut p = b"\x80\x02ctorch._utils\n_rebuild_sparse_tensor\n(".to_vec();
        p.extend(b"ctorch.serialization\n_get_layout\nX");
        p.extend((layout.len() as u32).to_le_bytes());
        p.extend(layout.as_bytes());
        p.extend(b"\x85R(");
        parts.iter().for_each(|part| p.extend(part));
        p.extend(b"ctorch\nSize\n(");
        for d in size {
            p.extend(b"\x8a\x08"); // LONG1 of 8 bytes
            p.extend(d.to_le_bytes());
        }
        p.extend(b"t\x85R");
        p.extend(rest);
        p.extend(b"ttR.");
        let u = unpickle(&p, 0, &PickleLimits::default(), &mut Storages)?;
        Ok(u.arena.get(u.root).clone())
    }

    #[test]
    fn sparse_tensors_are_their_parts_checked_against_their_size() {
        use crate::sparse::SparseLayout;
        // A (3, 4) COO tensor with 2 values: indices (2, 2) i64, values (2,).
        let coo = |indices: &str, values: Vec<u8>, size: &[u64], rest: &[u8]| {
            sparse(
                "torch.sparse_coo",
                &[nd_pickle(indices, "0", &[2, 2]), values],
                size,
                rest,
            )
        };
        let got = coo(
            "LongStorage",
            tensor_pickle("FloatStorage", "1", 2),
            &[3, 4],
            b"\x88",
        )
        .unwrap();
        let Obj::Sparse(s) = got else {
            panic!("{got:?}")
        };
        assert_eq!(
            (s.layout, s.size.as_slice(), s.is_coalesced),
            (SparseLayout::Coo, &[3, 4][..], Some(true))
        );
        assert_eq!(s.parts[0].shape.dims(), [2, 2]);
        assert_eq!(s.part_names("adj"), ["adj.indices", "adj.values"]);
        assert_eq!(s.part_names(""), ["indices", "values"]);
        // Without is_coalesced (torch < 1.13): None.
        let got = coo(
            "LongStorage",
            tensor_pickle("FloatStorage", "1", 2),
            &[3, 4],
            b"",
        )
        .unwrap();
        assert!(matches!(got, Obj::Sparse(s) if s.is_coalesced.is_none()));

        let malformed = |r: Result<Obj>, says: &str| {
            let err = r.unwrap_err();
            assert!(
                matches!(err, Error::Malformed { .. }) && err.to_string().contains(says),
                "{err}"
            );
        };
        // Indices must be i64; values one per index; the size must match the dims.
        // int32 indices are taken (torch converts them); others are not.
        assert!(matches!(
            coo(
                "IntStorage",
                tensor_pickle("FloatStorage", "1", 2),
                &[3, 4],
                b""
            ),
            Ok(Obj::Sparse(_))
        ));
        malformed(
            coo(
                "ShortStorage",
                tensor_pickle("FloatStorage", "1", 2),
                &[3, 4],
                b"",
            ),
            "not i64 or i32",
        );
        // A size whose element count does not fit i64 (torch: "numel: integer
        // multiplication overflow"), even with few values.
        malformed(
            coo(
                "LongStorage",
                tensor_pickle("FloatStorage", "1", 2),
                &[1 << 40, 1 << 40],
                b"",
            ),
            "does not fit i64",
        );
        malformed(
            coo(
                "LongStorage",
                tensor_pickle("FloatStorage", "1", 3),
                &[3, 4],
                b"",
            ),
            "2 indices but 3 values",
        );
        malformed(
            coo(
                "LongStorage",
                tensor_pickle("FloatStorage", "1", 2),
                &[3, 4, 5],
                b"",
            ),
            "do not make size",
        );
        malformed(
            coo(
                "LongStorage",
                tensor_pickle("FloatStorage", "1", 2),
                &[3, 4],
                b"K\x01",
            ),
            "is_coalesced is a int",
        );
        // Not a layout, a strided layout, an unknown layout name.
        malformed(
            sparse("torch.strided", &[], &[1], b""),
            "not a sparse layout",
        );
        malformed(
            sparse("torch.sparse_nope", &[], &[1], b""),
            "no layout is named",
        );

        // CSR (2, 3) with 2 values: crow (3,), col (2,), values (2,), same index dtype.
        let csr = |crow: &str, col: &str, rows: u8, size: &[u64]| {
            sparse(
                "torch.sparse_csr",
                &[
                    tensor_pickle(crow, "0", rows + 1),
                    tensor_pickle(col, "1", 2),
                    tensor_pickle("DoubleStorage", "2", 2),
                ],
                size,
                b"",
            )
        };
        assert!(matches!(
            csr("IntStorage", "IntStorage", 2, &[2, 3]),
            Ok(Obj::Sparse(_))
        ));
        assert!(matches!(
            csr("LongStorage", "LongStorage", 2, &[2, 3]),
            Ok(Obj::Sparse(_))
        ));
        malformed(
            csr("IntStorage", "LongStorage", 2, &[2, 3]),
            "not both i32 or both i64",
        );
        malformed(
            csr("FloatStorage", "FloatStorage", 2, &[2, 3]),
            "not both i32 or both i64",
        );
        malformed(
            csr("LongStorage", "LongStorage", 3, &[2, 3]),
            "4 compressed indices for 2 rows",
        );
        malformed(
            csr("LongStorage", "LongStorage", 2, &[2, 3, 4]),
            "do not make size",
        );
        // A CSR tensor's data has 4 items, not 3.
        malformed(
            sparse(
                "torch.sparse_csr",
                &[tensor_pickle("LongStorage", "0", 3)],
                &[2, 3],
                b"",
            ),
            "2 items of torch.sparse_csr data",
        );

        // BSR (4, 6) in 2 × 3 blocks, 2 of them: crow (3,), col (2,), values (2, 2, 3).
        let bsr = |values: &[u8], size: &[u64]| {
            sparse(
                "torch.sparse_bsr",
                &[
                    tensor_pickle("LongStorage", "0", 3),
                    tensor_pickle("LongStorage", "1", 2),
                    nd_pickle("FloatStorage", "2", values),
                ],
                size,
                b"",
            )
        };
        assert!(matches!(bsr(&[2, 2, 3], &[4, 6]), Ok(Obj::Sparse(_))));
        // The columns must be whole blocks too, not only the compressed rows.
        malformed(bsr(&[2, 2, 3], &[4, 7]), "is not made of blocks of 2 × 3");
        malformed(bsr(&[2, 2, 3], &[6, 6]), "3 compressed indices for 3 rows");
        malformed(bsr(&[2, 0, 3], &[0, 6]), "blocks of 0 × 3");

        // A batch of 2 CSR (2, 2) matrices: the size's batch dimension must be 2.
        let batched = |size: &[u64]| {
            sparse(
                "torch.sparse_csr",
                &[
                    nd_pickle("LongStorage", "0", &[2, 3]),
                    nd_pickle("LongStorage", "1", &[2, 2]),
                    nd_pickle("FloatStorage", "2", &[2, 2]),
                ],
                size,
                b"",
            )
        };
        assert!(matches!(batched(&[2, 2, 2]), Ok(Obj::Sparse(_))));
        malformed(batched(&[5, 2, 2]), "do not make size");
    }

    /// A 1-d `_rebuild_tensor_v2` of 2 elements of storage `class`, with `metadata`
    /// (pickle text) as its 7th argument, as torch writes a lazy view.
    fn with_metadata(class: &str, metadata: &[u8]) -> Result<TensorRecord> {
        let mut p = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(".to_vec();
        p.extend(persistent_id(class, "0", 2));
        p.extend(b"K\x00K\x02\x85K\x01\x85\x89}");
        p.extend(metadata);
        p.extend(b"tR.");
        match root_of(&p)? {
            Obj::Tensor(t) => Ok(*t),
            other => panic!("not a tensor: {other:?}"),
        }
    }

    const CONJ: &[u8] = b"}X\x04\x00\x00\x00conj\x88s";
    const NEG: &[u8] = b"}X\x03\x00\x00\x00neg\x88s";
    const BOTH: &[u8] = b"}(X\x04\x00\x00\x00conj\x88X\x03\x00\x00\x00neg\x88u";

    #[test]
    fn tensor_metadata_sets_torchs_conjugate_and_negative_bits() {
        let bits = |t: TensorRecord| (t.is_conj, t.is_neg);
        let read = |class, metadata| bits(with_metadata(class, metadata).unwrap());
        assert_eq!(read("ComplexFloatStorage", CONJ), (true, false));
        assert_eq!(read("FloatStorage", NEG), (false, true));
        assert_eq!(read("ComplexDoubleStorage", BOTH), (true, true));
        // torch loads a negative view of any dtype (only reading its values fails).
        assert_eq!(read("BoolStorage", NEG), (false, true));
        // No bits: an empty dict, None, or no 7th argument.
        assert_eq!(read("ComplexFloatStorage", b"}"), (false, false));
        assert_eq!(read("ComplexFloatStorage", b"N"), (false, false));
        // `_rebuild_tensor_v3` takes it 8th: a complex32 conjugate view.
        let mut rest = b"K\x00K\x02\x85K\x01\x85\x89}ctorch\ncomplex32\n".to_vec();
        rest.extend(CONJ);
        let mut p = b"\x80\x02ctorch._utils\n_rebuild_tensor_v3\n(".to_vec();
        p.extend(persistent_id("UntypedStorage", "0", 8));
        p.extend(rest);
        p.extend(b"tR.");
        let Obj::Tensor(t) = root_of(&p).unwrap() else {
            panic!("not a tensor")
        };
        assert_eq!(
            (t.torch_only, t.is_conj),
            (Some(TorchOnlyDType::Complex32), true)
        );
        assert!(
            !tensor_v3("complex32", 8, b"K\x00K\x02\x85K\x01\x85\x89")
                .unwrap()
                .is_conj
        );
    }

    #[test]
    fn tensor_metadata_tensorwire_does_not_know_is_unsupported() {
        let unsupported = [
            // another key
            (&b"}X\x04\x00\x00\x00zero\x88s"[..], "\"zero\""),
            // False: torch never writes it, and would set the bit all the same
            (b"}X\x03\x00\x00\x00neg\x89s", "False"),
            // not a bool
            (b"}X\x03\x00\x00\x00negK\x01s", "of type int"),
            // a key that is not a str
            (b"}K\x01\x88s", "keyed by a int"),
        ];
        for (metadata, want) in unsupported {
            let err = with_metadata("FloatStorage", metadata).unwrap_err();
            assert!(
                matches!(err, Error::Unsupported { .. }) && err.to_string().contains(want),
                "{want}: {err}"
            );
        }
        // Malformed: not a dict, and the conjugate bit on a real tensor (torch fails).
        let err = with_metadata("FloatStorage", b"]").unwrap_err();
        assert!(
            err.is_corrupt_data() && err.to_string().contains("not a dict"),
            "{err}"
        );
        let err = with_metadata("FloatStorage", CONJ).unwrap_err();
        assert!(
            err.is_corrupt_data() && err.to_string().contains("conjugate bit on a torch.float32"),
            "{err}"
        );
    }

    #[test]
    fn python2_builtins_are_named_as_python3_resolves_them() {
        for (name, want) in [
            ("xrange", "builtins.range"),
            ("long", "builtins.int"),
            ("unicode", "builtins.str"),
            ("basestring", "builtins.str"),
            ("unichr", "builtins.chr"),
            ("reduce", "functools.reduce"),
            ("intern", "sys.intern"),
            ("eval", "builtins.eval"),
        ] {
            match resolve("__builtin__", name, 5) {
                Err(Error::RefusedGlobal { global, offset: 5 }) => assert_eq!(global, want),
                other => panic!("{name}: {other:?}"),
            }
        }
        // The allowed ones still resolve under their Python 2 module.
        assert_eq!(resolve("__builtin__", "set", 0).unwrap(), Global::Set);
        assert_eq!(
            resolve("__builtin__", "complex", 0).unwrap(),
            Global::Complex
        );
    }

    #[test]
    fn classes_kept_as_values_are_named_exactly() {
        for (module, name) in [
            ("torch", "FloatStorage"),
            ("torch.cuda", "HalfStorage"),
            ("torch", "QInt8Storage"),
            ("torch.storage", "UntypedStorage"),
            ("torch", "UntypedStorage"),
            ("torch.storage", "TypedStorage"),
            ("torch.nn.parameter", "Parameter"),
            ("torch", "Tensor"),
            ("torch.sparse", "FloatTensor"),
            ("torch.cuda.sparse", "ByteTensor"),
            ("torch.cuda", "LongTensor"),
        ] {
            let global = resolve(module, name, 0).unwrap();
            assert_eq!(global.name(), format!("{module}.{name}"), "{global:?}");
        }
    }

    #[test]
    fn bad_quantizer_parameters_are_malformed_and_symmetric_schemes_unsupported() {
        let scales = |n| tensor_pickle("DoubleStorage", "1", n);
        let zps = |n| tensor_pickle("LongStorage", "2", n);
        let bools = |n| tensor_pickle("BoolStorage", "2", n);
        let malformed = [
            // a plain int storage is not a quantized tensor's
            (
                "CharStorage",
                params("per_tensor_affine", &[HALF, b"K\x03"]),
            ),
            // scales that are not floats; zero points that are neither ints nor floats
            (
                "QInt8Storage",
                params("per_channel_affine", &[&zps(3), &zps(3), b"K\x01"]),
            ),
            (
                "QInt8Storage",
                params("per_channel_affine", &[&scales(3), &bools(3), b"K\x01"]),
            ),
            // a float storage is not quantized integers
            (
                "FloatStorage",
                params("per_tensor_affine", &[HALF, b"K\x03"]),
            ),
            // a zero point that is not an int; one value too many or too few
            ("QInt8Storage", params("per_tensor_affine", &[HALF, HALF])),
            (
                "QInt8Storage",
                params("per_tensor_affine", &[HALF, b"K\x03K\x03"]),
            ),
            ("QInt8Storage", params("per_tensor_affine", &[HALF])),
            // an axis past the last dimension, negative, or not an int
            (
                "QInt8Storage",
                params("per_channel_affine", &[&scales(3), &zps(3), b"K\x02"]),
            ),
            (
                "QInt8Storage",
                params(
                    "per_channel_affine",
                    &[&scales(3), &zps(3), b"J\xff\xff\xff\xff"],
                ),
            ),
            (
                "QInt8Storage",
                params("per_channel_affine", &[&scales(3), &zps(3), HALF]),
            ),
            // scales or zero points of the wrong length (axis 1 has 3 channels)
            (
                "QInt8Storage",
                params("per_channel_affine", &[&scales(2), &zps(3), b"K\x01"]),
            ),
            (
                "QInt8Storage",
                params("per_channel_affine", &[&scales(3), &zps(4), b"K\x01"]),
            ),
            // not a scheme first; not a tuple
            ("QInt8Storage", params("float32", &[HALF, b"K\x03"])),
            ("QInt8Storage", b"K\x01".to_vec()),
        ];
        for (class, p) in malformed {
            let err = qtensor(class, &p).unwrap_err();
            assert!(
                err.is_corrupt_data() && err.to_string().contains("_rebuild_qtensor"),
                "{class} {}: {err}",
                String::from_utf8_lossy(&p)
            );
        }
        // Lists of scales and zero points (torch makes tensors of them): unsupported.
        let lists = params("per_channel_affine", &[b"]K\x01a", b"]K\x01a", b"K\x00"]);
        let err = qtensor("QInt8Storage", &lists).unwrap_err();
        assert!(
            matches!(err, Error::Unsupported { .. }) && err.to_string().contains("list"),
            "{err}"
        );
        // requires_grad=True: torch refuses it for quantized tensors.
        let mut p = b"\x80\x02ctorch._utils\n_rebuild_qtensor\n(".to_vec();
        p.extend(persistent_id("QInt8Storage", "0", 6));
        p.extend(b"K\x00K\x02K\x03\x86K\x03K\x01\x86");
        p.extend(params("per_tensor_affine", &[HALF, b"K\x03"]));
        p.extend(b"\x88}tR.");
        let err = unpickle(&p, 0, &PickleLimits::default(), &mut Storages).unwrap_err();
        assert!(err.to_string().contains("requiring grad"), "{err}");
        for scheme in ["per_tensor_symmetric", "per_channel_symmetric"] {
            let err = qtensor("QInt8Storage", &params(scheme, &[HALF, b"K\x03"])).unwrap_err();
            assert!(
                matches!(err, Error::Unsupported { .. }) && err.to_string().contains(scheme),
                "{err}"
            );
        }
    }

    /// A `_rebuild_tensor_v3` of the torch dtype `dtype` on an untyped storage of
    /// `nbytes`, with `rest` (pickle text: offset, sizes, strides, requires_grad).
    /// `_rebuild_meta_tensor_no_storage(torch.<dtype>, <args>)` (`args`: the size,
    /// stride and requires_grad items), optionally inside `_rebuild_parameter`.
    fn meta_tensor(dtype: &str, args: &[u8], parameter: Option<bool>) -> Result<MetaTensor> {
        let mut p = b"\x80\x02".to_vec();
        if parameter.is_some() {
            p.extend(b"ctorch._utils\n_rebuild_parameter\n(");
        }
        p.extend(b"ctorch._utils\n_rebuild_meta_tensor_no_storage\n(ctorch\n");
        p.extend(dtype.as_bytes());
        p.push(b'\n');
        p.extend(args);
        p.extend(b"tR");
        if let Some(flag) = parameter {
            p.extend([if flag { 0x88 } else { 0x89 }, b'}', b't', b'R']);
        }
        p.push(b'.');
        match root_of(&p)? {
            Obj::Meta(m) => Ok(*m),
            other => panic!("not a meta tensor: {other:?}"),
        }
    }

    #[test]
    fn meta_tensors_are_built_with_their_dtype_sizes_and_strides() {
        // (3, 4) strides (1, 3): a transpose; not requiring grad.
        let m = meta_tensor("float32", b"K\x03K\x04\x86K\x01K\x03\x86\x89", None).unwrap();
        assert_eq!(m.dtype, Some(TensorDType::Tensorwire(DType::F32)));
        assert_eq!(m.dtype_name, "torch.float32");
        assert_eq!((m.shape.dims(), &m.strides[..]), (&[3, 4][..], &[1, 3][..]));
        assert!(!m.requires_grad && !m.parameter);
        // torch-only dtypes keep torch's sizes (no holder dimension: there is no data).
        let m = meta_tensor("complex32", b"K\x02\x85K\x01\x85\x88", None).unwrap();
        assert_eq!(m.dtype_name, "torch.complex32");
        assert_eq!(
            m.dtype,
            Some(TensorDType::TorchOnly(TorchOnlyDType::Complex32))
        );
        assert_eq!((m.shape.dims(), m.requires_grad), (&[2][..], true));
        // 0-d, and an nn.Parameter around one (its flag wins).
        let m = meta_tensor("bfloat16", b"))\x89", Some(true)).unwrap();
        assert!(m.shape.dims().is_empty() && m.parameter && m.requires_grad);
        // A dtype tensorwire neither has nor holds: a tensor without data has it all
        // the same, by name.
        for name in ["uint4", "int1", "bits8", "qint8", "quint4x2", "bcomplex32"] {
            let m = meta_tensor(name, b"K\x02\x85K\x01\x85\x89", None).unwrap();
            assert_eq!(
                (m.dtype, m.dtype_name),
                (None, &*format!("torch.{name}").leak())
            );
        }
        // Empty: any strides.
        let huge_stride = b"K\x00K\x07\x86\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7fK\x01\x86\x89";
        assert!(meta_tensor("float64", huge_stride, None).is_ok());
        // What torch would refuse to make, and what the format cannot hold.
        for (dtype, args, parameter, want) in [
            (
                "int64",
                &b"K\x02\x85K\x01\x85\x88"[..],
                None,
                "tensor requiring grad",
            ),
            (
                "int8",
                b"K\x02\x85K\x01\x85\x89",
                Some(true),
                "tensor requiring grad",
            ),
            ("float32", b"K\x02\x85)\x89", None, "1 sizes but 0 strides"),
            (
                "float32",
                b"K\x02\x85K\x01\x85K\x01",
                None,
                "requires_grad is of type int",
            ),
            ("float32", b"K\x02\x85K\x01\x85", None, "3 arguments"),
            // A reach of 2^63 - 1 elements of 8 bytes: past torch's int64 bytes.
            (
                "float64",
                &b"K\x02\x85\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x85\x89"[..],
                None,
                "extent",
            ),
            (
                "per_tensor_affine",
                b"K\x02\x85K\x01\x85\x89",
                None,
                "not a dtype",
            ),
            (
                "uint4",
                b"K\x02\x85K\x01\x85\x88",
                None,
                "torch.uint4 tensor requiring grad",
            ),
            (
                "float32",
                b"J\xff\xff\xff\xff\x85K\x01\x85\x89",
                None,
                "non-negative",
            ),
        ] {
            let err = meta_tensor(dtype, args, parameter).unwrap_err();
            assert!(err.to_string().contains(want), "{dtype}: {err}");
        }
    }

    fn tensor_v3(dtype: &str, nbytes: u8, rest: &[u8]) -> Result<TensorRecord> {
        let mut p = b"\x80\x02ctorch._utils\n_rebuild_tensor_v3\n(".to_vec();
        p.extend(persistent_id("UntypedStorage", "0", nbytes));
        p.extend(rest);
        p.extend(b"}ctorch\n");
        p.extend(dtype.as_bytes());
        p.extend(b"\ntR.");
        match root_of(&p)? {
            Obj::Tensor(t) => Ok(*t),
            other => panic!("not a tensor: {other:?}"),
        }
    }

    #[test]
    fn torch_only_dtypes_are_read_as_their_holder_elements() {
        use crate::tensor::TorchOnlyDType;
        // A transposed (3, 2) complex32 tensor at offset 1: 7 elements of 4 bytes.
        let transposed = b"K\x01K\x03K\x02\x86K\x01K\x03\x86\x89";
        for name in ["complex32", "chalf"] {
            let t = tensor_v3(name, 28, transposed).unwrap();
            assert_eq!(t.torch_only, Some(TorchOnlyDType::Complex32));
            assert_eq!(t.dtype, DType::F16);
            assert_eq!(
                (t.shape.dims(), &t.strides[..]),
                (&[3, 2, 2][..], &[2, 6, 1][..])
            );
            assert_eq!(t.storage_offset, 2);
            assert_eq!(t.byte_extent().unwrap(), (4, 28));
            let (offset, sizes, strides) = t.torch_view();
            assert_eq!(
                (offset, &sizes[..], &strides[..]),
                (1, &[3, 2][..], &[1, 3][..])
            );
        }
        // One byte short of the last element's imaginary part.
        let short = tensor_v3("complex32", 27, transposed).unwrap_err();
        assert!(matches!(short, Error::OutOfBounds { .. }), "{short}");
        // The largest stride, counted in f16, on a dimension it moves along.
        let huge = b"K\x00K\x02\x85\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x85\x89";
        let err = tensor_v3("complex32", 4, huge).unwrap_err();
        assert!(matches!(err, Error::Overflow { .. }), "{err}");
        // One byte per element, requiring grad as the floating-point types may.
        for (name, dtype) in [
            ("float8_e8m0fnu", TorchOnlyDType::Float8E8M0Fnu),
            ("float4_e2m1fn_x2", TorchOnlyDType::Float4E2M1FnX2),
        ] {
            let t = tensor_v3(name, 6, b"K\x00K\x02K\x03\x86K\x03K\x01\x86\x88").unwrap();
            assert_eq!(
                (t.torch_only, t.dtype, t.requires_grad),
                (Some(dtype), DType::U8, true)
            );
            assert_eq!((t.shape.dims(), &t.strides[..]), (&[2, 3][..], &[3, 1][..]));
            assert_eq!(t.torch_view().1.as_slice(), &[2, 3]);
            assert_eq!(TorchOnlyDType::from_layout(&dtype.layout()), Some(dtype));
        }
        // Listed as one only over its holder elements, with the lanes' dimension.
        let info = |dtype: DType, dims: &[u64]| tensorwire_core::TensorInfo {
            name: "x".into(),
            dtype,
            shape: tensorwire_core::Shape::new(dims.to_vec()).unwrap(),
            layout: TorchOnlyDType::Complex32.layout(),
            nbytes: 0,
            stored_bytes: 0,
            offset: 0,
            encoding: None,
            attributes: Default::default(),
        };
        assert_eq!(
            TorchOnlyDType::of(&info(DType::F16, &[3, 2])),
            Some(TorchOnlyDType::Complex32)
        );
        for (dtype, dims) in [
            (DType::F16, &[][..]),
            (DType::F16, &[2, 3]),
            (DType::U8, &[2]),
        ] {
            assert_eq!(
                TorchOnlyDType::of(&info(dtype, dims)),
                None,
                "{dtype} {dims:?}"
            );
        }
        // The dtypes still without one.
        let err = tensor_v3("bits8", 4, b"K\x00K\x04\x85K\x01\x85\x89").unwrap_err();
        assert!(
            matches!(err, Error::Unsupported { .. }) && err.to_string().contains("torch.bits8"),
            "{err}"
        );
    }

    #[test]
    fn dtypes_without_a_tensorwire_dtype_are_values_and_unsupported_for_tensors() {
        for name in [
            "float8_e8m0fnu",
            "float4_e2m1fn_x2",
            "complex32",
            "qint8",
            "int4",
        ] {
            let global = resolve("torch", name, 7).unwrap();
            assert_eq!(global.name(), format!("torch.{name}"));
            assert!(matches!(global, Global::TorchConstant(_)), "{global:?}");
        }
        assert!(matches!(
            resolve("torch", "float8_e4m3fn", 0),
            Ok(Global::Dtype(DType::F8E4M3Fn))
        ));
        assert!(matches!(
            resolve("torch", "load", 3),
            Err(Error::RefusedGlobal { offset: 3, .. })
        ));
        assert!(matches!(
            resolve("torch.cuda", "FloatTensor", 0),
            Ok(Global::Named("torch.cuda.FloatTensor"))
        ));
        assert!(matches!(
            resolve("torch.cuda", "load", 0),
            Err(Error::RefusedGlobal { .. })
        ));
    }
}
