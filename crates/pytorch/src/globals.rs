//! The globals a checkpoint may name, and what calling them means.
//!
//! The allowlist follows `torch.load(weights_only=True)`: torch's tensor-rebuild
//! functions, storage classes and dtypes, `collections.OrderedDict`, and plain
//! containers. Calls are interpreted here, never executed: `_rebuild_tensor_v2(...)`
//! becomes a [`TensorRecord`], `OrderedDict()` an empty ordered dict, and so on.
//! Anything else is refused when the pickle names it, with
//! [`Error::RefusedGlobal`] naming it.

use tensorwire_core::{DType, Error, Result};

use crate::pickle::{Arena, Id, Obj, Span};
use crate::tensor::{storage_dtype, TensorRecord};

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
    /// `torch._utils._rebuild_parameter(data, requires_grad, backward_hooks)`.
    RebuildParameter,
    /// `torch._utils._rebuild_parameter_with_state(data, requires_grad,
    /// backward_hooks, state)`.
    RebuildParameterWithState,
    /// `torch._tensor._rebuild_from_type_v2(func, new_type, args, state)`.
    RebuildFromTypeV2,
    /// `torch.Tensor` or `torch.nn.parameter.Parameter` (as a `new_type`).
    TensorClass,
    /// A storage class: `torch.FloatStorage` and friends (the element type), or
    /// `torch.storage.UntypedStorage` (bytes).
    Storage(DType),
    /// A dtype object, `torch.float32` and friends.
    Dtype(DType),
    /// `collections.OrderedDict`.
    OrderedDict,
    /// `torch.Size` (a tuple).
    Size,
    /// `torch.device` (kept as its string).
    Device,
    /// `_codecs.encode`, which protocol 2 uses for Python 3 `bytes`.
    CodecsEncode,
    /// `builtins.set` / `builtins.frozenset`.
    Set,
    /// `builtins.bytearray`.
    ByteArray,
}

impl Global {
    /// The global's name, for error messages.
    pub fn name(self) -> &'static str {
        match self {
            Global::RebuildTensor => "torch._utils._rebuild_tensor",
            Global::RebuildTensorV2 => "torch._utils._rebuild_tensor_v2",
            Global::RebuildTensorV3 => "torch._utils._rebuild_tensor_v3",
            Global::RebuildParameter => "torch._utils._rebuild_parameter",
            Global::RebuildParameterWithState => "torch._utils._rebuild_parameter_with_state",
            Global::RebuildFromTypeV2 => "torch._tensor._rebuild_from_type_v2",
            Global::TensorClass => "torch.Tensor",
            Global::Storage(_) => "a torch storage class",
            Global::Dtype(_) => "a torch dtype",
            Global::OrderedDict => "collections.OrderedDict",
            Global::Size => "torch.Size",
            Global::Device => "torch.device",
            Global::CodecsEncode => "_codecs.encode",
            Global::Set => "builtins.set",
            Global::ByteArray => "builtins.bytearray",
        }
    }
}

/// Looks up `module.name` in the allowlist.
pub fn resolve(module: &str, name: &str, offset: u64) -> Result<Global> {
    // Python 2 pickles name builtins `__builtin__`.
    let module = if module == "__builtin__" {
        "builtins"
    } else {
        module
    };
    let global = match (module, name) {
        ("torch._utils", "_rebuild_tensor") => Some(Global::RebuildTensor),
        ("torch._utils", "_rebuild_tensor_v2") => Some(Global::RebuildTensorV2),
        ("torch._utils", "_rebuild_tensor_v3") => Some(Global::RebuildTensorV3),
        ("torch._utils", "_rebuild_parameter") => Some(Global::RebuildParameter),
        ("torch._utils", "_rebuild_parameter_with_state") => {
            Some(Global::RebuildParameterWithState)
        }
        ("torch._tensor" | "torch._utils", "_rebuild_from_type_v2") => {
            Some(Global::RebuildFromTypeV2)
        }
        ("torch", "Tensor") | ("torch.nn.parameter", "Parameter") | ("torch.nn", "Parameter") => {
            Some(Global::TensorClass)
        }
        ("torch.storage" | "torch", "UntypedStorage") => Some(Global::Storage(DType::U8)),
        ("torch" | "torch.cuda", storage) if storage.ends_with("Storage") => {
            storage_dtype(storage).map(Global::Storage)
        }
        ("torch", "Size") => Some(Global::Size),
        ("torch", "device") => Some(Global::Device),
        ("torch", dtype) if UNSUPPORTED_TORCH_DTYPES.contains(&dtype) => {
            // A dtype object is data, not code: say what is missing.
            return Err(Error::unsupported(format!(
                "tensors of torch.{dtype}, which tensorwire has no dtype for"
            )));
        }
        ("torch", dtype) => torch_dtype(dtype).map(Global::Dtype),
        ("collections", "OrderedDict") => Some(Global::OrderedDict),
        ("_codecs", "encode") => Some(Global::CodecsEncode),
        ("builtins", "set" | "frozenset") => Some(Global::Set),
        ("builtins", "bytearray") => Some(Global::ByteArray),
        _ => None,
    };
    global.ok_or_else(|| Error::RefusedGlobal {
        global: format!("{module}.{name}"),
        offset,
    })
}

/// torch dtypes that tensorwire cannot represent: a checkpoint naming one is
/// `Unsupported`, not refused as unsafe.
const UNSUPPORTED_TORCH_DTYPES: &[&str] = &[
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
    "complex32",
    "chalf",
    "qint8",
    "quint8",
    "qint32",
    "quint4x2",
    "quint2x4",
    "bits1x8",
    "bits2x4",
    "bits4x2",
    "bits8",
    "bits16",
    "uint1",
    "uint2",
    "uint3",
    "uint4",
    "uint5",
    "uint6",
    "uint7",
    "int1",
    "int2",
    "int3",
    "int4",
    "int5",
    "int6",
    "int7",
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

fn bad_args(what: &str, offset: u64, reason: impl std::fmt::Display) -> Error {
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
            TensorRecord::from_rebuild(arena, argv[0], argv[1], argv[2], argv[3], None, offset)
                .map(|t| Obj::Tensor(Box::new(t)))
        }
        Global::RebuildTensorV3 => {
            if argv.len() < 7 || argv.len() > 8 {
                return Err(bad_args(what, offset, format!("{} arguments", argv.len())));
            }
            let Obj::Global(Global::Dtype(dtype)) = arena.get(argv[6]) else {
                return Err(bad_args(what, offset, "the dtype argument is not a dtype"));
            };
            TensorRecord::from_rebuild(
                arena,
                argv[0],
                argv[1],
                argv[2],
                argv[3],
                Some(*dtype),
                offset,
            )
            .map(|t| Obj::Tensor(Box::new(t)))
        }
        Global::RebuildParameter | Global::RebuildParameterWithState => {
            if argv.is_empty() {
                return Err(bad_args(what, offset, "no arguments"));
            }
            tensor_arg(arena, argv[0], what, offset)
        }
        Global::RebuildFromTypeV2 => {
            let [func, new_type, inner_args, _state] = argv else {
                return Err(bad_args(what, offset, format!("{} arguments", argv.len())));
            };
            if !matches!(arena.get(*new_type), Obj::Global(Global::TensorClass)) {
                return Err(bad_args(what, offset, "new_type is not torch.Tensor"));
            }
            call(arena, *func, *inner_args, offset)
        }
        Global::OrderedDict => match argv {
            [] => Ok(Obj::Dict {
                items: Vec::new(),
                ordered: true,
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
                    ordered: true,
                })
            }
            _ => Err(bad_args(what, offset, format!("{} arguments", argv.len()))),
        },
        Global::Size => match argv {
            [dims] => match arena.get(*dims) {
                // The same items (tuples are immutable).
                Obj::Tuple(span) => Ok(Obj::Tuple(*span)),
                // A list's items may change later: a copy, as a list (a shape reads
                // the same from either).
                Obj::List(items) => Ok(Obj::List(items.clone())),
                other => Err(bad_args(what, offset, format!("a {}", other.kind()))),
            },
            [] => Ok(Obj::Tuple(Span::EMPTY)),
            _ => Err(bad_args(what, offset, format!("{} arguments", argv.len()))),
        },
        Global::Device => {
            let mut text = String::new();
            for (i, &a) in argv.iter().enumerate() {
                match arena.get(a) {
                    Obj::Str(s) if i == 0 => text.push_str(s),
                    Obj::Int(n) if i == 1 => text.push_str(&format!(":{n}")),
                    other => return Err(bad_args(what, offset, format!("a {}", other.kind()))),
                }
            }
            Ok(Obj::Str(text.into()))
        }
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
        Global::Set => match argv {
            [] => Ok(Obj::Set(Vec::new())),
            [items] => arena
                .items(*items)
                .map(|i| Obj::Set(i.to_vec()))
                .ok_or_else(|| bad_args(what, offset, "expected a list")),
            _ => Err(bad_args(what, offset, format!("{} arguments", argv.len()))),
        },
        Global::ByteArray => match argv {
            [] => Ok(Obj::Bytes(Box::new([]))),
            [b] => match arena.get(*b) {
                Obj::Bytes(b) => Ok(Obj::Bytes(b.clone())),
                other => Err(bad_args(what, offset, format!("a {}", other.kind()))),
            },
            _ => Err(bad_args(what, offset, format!("{} arguments", argv.len()))),
        },
        Global::TensorClass | Global::Storage(_) | Global::Dtype(_) => Err(Error::malformed(
            offset,
            format!("pickle: {what} is not callable here"),
        )),
    }
}

/// Interprets `BUILD` (`target.__setstate__(state)`): the attributes torch attaches to
/// a state dict (`_metadata`) or to a tensor are accepted and dropped; nothing else
/// takes state.
pub fn build(arena: &Arena, target: Id, _state: Id, offset: u64) -> Result<()> {
    match arena.get(target) {
        Obj::Dict { .. } | Obj::Tensor(_) => Ok(()),
        other => Err(Error::malformed(
            offset,
            format!("pickle: BUILD on a {}", other.kind()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_without_a_tensorwire_dtype_are_unsupported_not_unsafe() {
        for name in ["float8_e8m0fnu", "float4_e2m1fn_x2", "complex32"] {
            let err = resolve("torch", name, 7).unwrap_err();
            assert!(
                matches!(&err, Error::Unsupported { .. }) && err.to_string().contains(name),
                "{err}"
            );
        }
        assert!(matches!(
            resolve("torch", "float8_e4m3fn", 0),
            Ok(Global::Dtype(DType::F8E4M3Fn))
        ));
        assert!(matches!(
            resolve("torch", "load", 3),
            Err(Error::RefusedGlobal { offset: 3, .. })
        ));
    }
}
