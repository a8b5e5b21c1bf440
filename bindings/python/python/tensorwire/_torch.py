"""torch interop, imported only when a torch method is used."""

from __future__ import annotations

import math

import numpy as np
import torch

from . import _native
from ._native import UnsupportedError

# tensorwire dtype name -> torch dtype (those this torch build has).
_NAMES = {
    "f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
    "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8",
    "u64": "uint64", "u32": "uint32", "u16": "uint16", "u8": "uint8", "bool": "bool",
    "f8_e4m3fn": "float8_e4m3fn", "f8_e5m2": "float8_e5m2",
    "f8_e4m3fnuz": "float8_e4m3fnuz", "f8_e5m2fnuz": "float8_e5m2fnuz",
    "complex64": "complex64", "complex128": "complex128",
}
TO_TORCH = {k: getattr(torch, v) for k, v in _NAMES.items() if hasattr(torch, v)}
# Looked up once: `read_torch` calls it per tensor.
from_numpy = torch.from_numpy
FROM_TORCH = {v: k for k, v in TO_TORCH.items()}

# safetensors and .zt types tensorwire reads as raw bytes, and the torch dtypes that
# hold them (in torch builds that have them). float4_e2m1fn_x2 packs two values per
# element.
_SAFETENSORS_RAW = {"safetensors:F8_E8M0": "float8_e8m0fnu", "safetensors:F4": "float4_e2m1fn_x2"}
_RAW = {**_SAFETENSORS_RAW, "zt:f8_e8m0": "float8_e8m0fnu", "zt:f4_e2m1": "float4_e2m1fn_x2"}
RAW_TO_TORCH = {k: getattr(torch, v) for k, v in _RAW.items() if hasattr(torch, v)}
# torch dtype -> the safetensors raw type that writes it.
RAW_FROM_TORCH = {RAW_TO_TORCH[k]: k for k in _SAFETENSORS_RAW if k in RAW_TO_TORCH}
_F4 = "safetensors:F4"
_PACKED = {_F4, "zt:f4_e2m1"}  # two values per byte
# A PyTorch checkpoint's dtypes tensorwire has none for, read as the elements holding
# them (uint8, or complex32's float16 pairs), by their layout names: torch's shape.
_TORCH_ONLY = {f"pytorch:{n}": n for n in ("float8_e8m0fnu", "float4_e2m1fn_x2", "complex32")}
_COMPLEX32 = "pytorch:complex32"
# torch dtype -> its layout name, in torch builds that have it.
_LAYOUT_OF = {getattr(torch, n): k for k, n in _TORCH_ONLY.items() if hasattr(torch, n)}


# Quantized types tensorwire reads as their integers (tenso packets' qint8 and quint8):
# torch gets the integers, as read_torch gives them.
_INTEGERS_OF = {"qint8": torch.int8, "quint8": torch.uint8}
# numpy dtype -> the torch dtype torch.from_numpy gives it, filled on first use.
_FROM_NUMPY = {}


def dtype_of(array):
    """The torch dtype ``torch.from_numpy(array)`` would have."""
    dt = _FROM_NUMPY.get(array.dtype)
    if dt is None:
        dt = _FROM_NUMPY[array.dtype] = torch.from_numpy(np.empty(0, array.dtype)).dtype
    return dt


def flat_bytes(t):
    """The bytes of a tensor whose elements fill their span with no gaps (a contiguous
    one, or one with its dimensions in another order, such as a transposed one) as a
    flat uint8 view, in memory order."""
    return t.as_strided((t.numel(),), (1,)).view(torch.uint8)


def torch_dtype(name: str):
    try:
        return TO_TORCH[name]
    except KeyError:
        raise TypeError(f"this torch build has no dtype for {name} tensors") from None


def torch_type(name, shape):
    """(torch dtype, torch shape) for a tensor read_torch reports as (name, shape); a
    safetensors or .zt raw type this torch lacks (or a packed float4 tensor whose last
    dimension does not pair up) stays raw bytes: (uint8, [byte count]). A type torch has no dtype for
    (a tenso packet's qint4) is an ``UnsupportedError``, as numpy's is: the file's
    type, not the caller's argument."""
    dt = TO_TORCH.get(name) or _INTEGERS_OF.get(name)
    if dt is not None:
        return dt, tuple(shape)
    torch_only = _TORCH_ONLY.get(name)
    if torch_only is not None:
        if not hasattr(torch, torch_only):
            raise UnsupportedError(f"this torch build has no dtype torch.{torch_only}")
        return getattr(torch, torch_only), tuple(shape)
    if name not in _RAW:
        raise UnsupportedError(f"this torch build has no dtype for {name} tensors")
    dt = RAW_TO_TORCH.get(name)
    if name in _PACKED:  # two values per byte, and per float4_e2m1fn_x2 element
        pairs = None if dt is None else _native.raw_torch_dims(name, list(shape))
        if pairs is not None:
            return dt, tuple(pairs)
        # The bytes (a .zt tensor of an odd count has a spare high nibble).
        return torch.uint8, ((math.prod(shape) + 1) // 2,)
    if dt is None:
        return torch.uint8, (math.prod(shape),)
    return dt, tuple(shape)


class StorageViews:
    """Tensors set on storages (``set_``), as ``torch.load`` rebuilds them. Each is made
    with ``new_empty`` from one empty tensor per (dtype, device), which takes a third
    of the time ``torch.empty`` takes to parse its arguments."""

    def __init__(self):
        self._empties = {}

    def view(self, storage, dtype, offset, shape, strides):
        """A ``dtype`` tensor over ``storage`` at element ``offset``."""
        key = (dtype, storage.device)
        empty = self._empties.get(key)
        if empty is None:
            empty = self._empties[key] = torch.empty((0,), dtype=dtype, device=storage.device)
        return empty.new_empty(0).set_(storage, offset, tuple(shape), tuple(strides))


def holder_to_torch(holder, dtype_name):
    """A torch tensor of ``dtype_name`` sharing ``holder``, a numpy array of the
    elements holding it with its shape and strides: ``uint16`` for bfloat16, ``uint8``
    for the float8 types and for the safetensors and .zt raw types (torch's shape:
    float4 pairs), and for a PyTorch checkpoint's complex32 float16 pairs in a last
    dimension of 2."""
    t = from_numpy(holder)
    if dtype_name == _COMPLEX32:
        return torch.view_as_complex(t)
    if dtype_name in _RAW:
        dt = RAW_TO_TORCH.get(dtype_name)
        # A torch without the dtype gets the bytes, flat, as bytes_to_torch gives them.
        return t.reshape(-1) if dt is None else t.view(dt)
    return t.view(torch_type(dtype_name, ())[0])


def bytes_to_torch(raw, dtype_name, shape, strides=None):
    """A uint8 numpy array of little-endian bytes as a torch tensor of dtype/shape,
    sharing its memory: row-major, or laid out by element ``strides`` over bytes
    that run from the first element to the last."""
    dt, shape = torch_type(dtype_name, shape)
    if raw.size == 0:
        if strides is None:
            return torch.empty(shape, dtype=dt)
        return torch.empty_strided(shape, strides, dtype=dt)
    t = torch.from_numpy(raw)
    if dt != torch.uint8:
        t = t.view(dt)
    return t.reshape(shape) if strides is None else t.as_strided(shape, strides)


# ml_dtypes' numpy dtype names -> tensorwire dtype names (torch.from_numpy refuses them).
_ML_DTYPES = {"bfloat16": "bf16", "float8_e4m3fn": "f8_e4m3fn", "float8_e5m2": "f8_e5m2",
              "float8_e4m3fnuz": "f8_e4m3fnuz", "float8_e5m2fnuz": "f8_e5m2fnuz"}


def numpy_dtype_to_torch(array):
    """The torch dtype of ``numpy_to_torch(array)``, without making the tensor."""
    name = _ML_DTYPES.get(array.dtype.name)
    return dtype_of(array) if name is None else torch_dtype(name)


def numpy_to_torch(arr):
    """torch.from_numpy, also for ml_dtypes arrays (bfloat16, float8), sharing memory."""
    name = _ML_DTYPES.get(arr.dtype.name)
    if name is None:
        # torch.from_numpy takes any address, but torch's kernels assume each element
        # aligned to its size (a complex128 at 8 bytes past a 16-byte boundary
        # crashes them): such arrays (a legacy checkpoint's, an NPZ member's) are
        # copied.
        if arr.size and arr.ctypes.data % arr.dtype.itemsize:
            arr = arr.copy()
        return torch.from_numpy(arr)
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return bytes_to_torch(raw, name, arr.shape)


def torch_to_bytes(tensor):
    """(uint8 numpy array sharing a CPU copy's memory, dtype name, shape). The name is
    a tensorwire dtype, or ``safetensors:<TYPE>`` for a type only safetensors holds
    (with the shape counted in its values: an F4 tensor has two per byte)."""
    name = FROM_TORCH.get(tensor.dtype)
    shape_scale = 1
    if name is None:
        name = RAW_FROM_TORCH.get(tensor.dtype)
        if name is None:
            raise TypeError(f"tensorwire has no type for torch dtype {tensor.dtype}")
        shape_scale = 2 if name == _F4 else 1
    t = tensor.detach()
    if t.layout != torch.strided:
        raise TypeError(f"cannot write a {t.layout} tensor: only dense ones "
                        "(call .to_dense() first)")
    if t.device.type != "cpu":
        t = t.cpu()
    # Lazily conjugated or negated tensors (x.conj(), torch._neg_view) keep their bits
    # apart from their memory: resolve them, or the memory's values would be written.
    t = t.resolve_conj().resolve_neg().contiguous()
    shape = list(t.shape)
    if shape_scale != 1:
        if not shape:
            # The package's SafetensorError (which UnsupportedError is).
            raise UnsupportedError(f"a 0-d {tensor.dtype} tensor has no safetensors shape "
                                   "(F4 counts single values along the last dimension)")
        shape[-1] *= shape_scale
    return torch_dst_bytes(t), name, shape


def torch_only_holder(tensor):
    """For a dense tensor of a dtype only torch has (float8_e8m0fnu,
    float4_e2m1fn_x2, complex32): (a C-order numpy array of the elements holding it,
    as tensorwire reads a checkpoint's: uint8 with torch's shape, or complex32's
    float16 pairs in a last dimension of 2; its layout name). None for other dtypes."""
    layout = _LAYOUT_OF.get(tensor.dtype)
    if layout is None:
        return None
    t = tensor.detach()
    if t.layout != torch.strided:
        raise TypeError(f"cannot write a {t.layout} tensor: only dense ones "
                        "(call .to_dense() first)")
    # Lazily conjugated or negated views keep their bits apart from their memory.
    t = t.cpu().resolve_conj().resolve_neg().contiguous()
    if layout == _COMPLEX32:
        return torch.view_as_real(t).contiguous().numpy(), layout
    return t.view(torch.uint8).numpy(), layout


def torch_dst_bytes(dst):
    """A CPU, contiguous torch tensor's memory as a uint8 numpy array (empty for an
    empty tensor, whatever its strides: torch cannot view one with stride 0)."""
    if dst.numel() == 0:
        return np.empty(0, np.uint8)
    flat = dst.reshape(-1)
    if flat.dtype.is_complex:
        flat = torch.view_as_real(flat).reshape(-1)
    return flat.view(torch.uint8).numpy()
