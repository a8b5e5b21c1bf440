"""torch interop, imported only when a torch method is used."""

from __future__ import annotations

import numpy as np
import torch

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


def torch_dtype(name: str):
    try:
        return TO_TORCH[name]
    except KeyError:
        raise TypeError(f"this torch build has no dtype for {name} tensors") from None


def bytes_to_torch(raw, dtype_name, shape):
    """A uint8 numpy array of little-endian bytes as a torch tensor of dtype/shape,
    sharing its memory."""
    dt = torch_dtype(dtype_name)
    if raw.size == 0:
        return torch.empty(tuple(shape), dtype=dt)
    t = torch.from_numpy(raw)
    if dt != torch.uint8:
        t = t.view(dt)
    return t.reshape(tuple(shape))


def numpy_to_torch(arr):
    """torch.from_numpy, also for ml_dtypes arrays (bfloat16, float8), sharing memory."""
    name = {"bfloat16": "bf16", "float8_e4m3fn": "f8_e4m3fn", "float8_e5m2": "f8_e5m2",
            "float8_e4m3fnuz": "f8_e4m3fnuz",
            "float8_e5m2fnuz": "f8_e5m2fnuz"}.get(arr.dtype.name)
    if name is None:
        return torch.from_numpy(arr)
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return bytes_to_torch(raw, name, arr.shape)


def torch_to_bytes(tensor):
    """(uint8 numpy array sharing a CPU copy's memory, dtype name, shape)."""
    name = FROM_TORCH.get(tensor.dtype)
    if name is None:
        raise TypeError(f"torch dtype {tensor.dtype} cannot be stored in a .zt file")
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    shape = list(t.shape)
    flat = t.reshape(-1)
    if flat.dtype.is_complex:
        flat = torch.view_as_real(flat).reshape(-1)
    return flat.view(torch.uint8).numpy(), name, shape


def torch_dst_bytes(dst):
    """A CPU, contiguous torch tensor's memory as a uint8 numpy array."""
    if dst.numel() == 0:
        return np.empty(0, np.uint8)
    flat = dst.reshape(-1)
    if flat.dtype.is_complex:
        flat = torch.view_as_real(flat).reshape(-1)
    return flat.view(torch.uint8).numpy()
