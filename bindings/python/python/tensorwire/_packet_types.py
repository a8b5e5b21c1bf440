"""Value classes carried by tensor packets besides plain arrays: quantized tensors,
string tensors, ragged arrays and GPU IPC references (tenso 0.24 compatible API)."""

from __future__ import annotations

import math
from typing import List, Sequence, Union

import numpy as np

from . import _native

# Quantized dtype codes on the wire, and their names.
QINT8, QUINT8, QINT4, QUINT4 = 16, 17, 18, 19
QUANTIZED_NAMES = {QINT8: "qint8", QUINT8: "quint8", QINT4: "qint4", QUINT4: "quint4"}
_QUANTIZED_CODES = {name: code for code, name in QUANTIZED_NAMES.items()}

# Quantization schemes on the wire.
PER_TENSOR, PER_CHANNEL, PER_GROUP = 0, 1, 2
_SCHEMES = {"per_tensor": PER_TENSOR, "per_channel": PER_CHANNEL, "per_group": PER_GROUP}

# Bundle keys a ragged array is written under (tenso's RaggedArray layout).
RAGGED_OFFSETS = "__ragged_offsets__"
RAGGED_FLAT = "__ragged_flat__"
RAGGED_COUNT = "__ragged_count__"


def _range_of(code: int) -> tuple[int, int]:
    signed = code in (QINT8, QINT4)
    if code in (QINT4, QUINT4):
        return (-8, 7) if signed else (0, 15)
    return (-128, 127) if signed else (0, 255)


def _scale_and_zero_point(lo: float, hi: float, qmin: int, qmax: int):
    """Min-max affine parameters (float32), the arithmetic tenso 0.24 uses so the same
    input quantizes to the same bytes. The zero point is not clamped: it is stored as a
    float32, so data that does not straddle zero keeps its full range."""
    if lo == hi:
        return np.float32(1.0), np.float32(0.0)
    scale = np.float32((hi - lo) / (qmax - qmin))
    return scale, np.float32(qmin - lo / scale)


def _pack_nibbles(values: np.ndarray) -> np.ndarray:
    """Two 4-bit values per byte, element 2i in the low nibble, 2i+1 in the high one."""
    nibbles = values.astype(np.uint8) & 0x0F
    if len(nibbles) % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    return (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)


def _unpack_nibbles(packed: np.ndarray, count: int, signed: bool) -> np.ndarray:
    packed = np.asarray(packed, dtype=np.uint8)
    out = np.empty(2 * len(packed), dtype=np.int16)
    out[0::2] = packed & 0x0F
    out[1::2] = packed >> 4
    out = out[:count]
    if signed:
        out = np.where(out > 7, out - 16, out)
    return out


def _normalized_axis(axis: int, ndim: int) -> int:
    """``axis`` counted from the front; numpy's AxisError outside ``ndim`` dimensions."""
    if not -ndim <= axis < ndim:
        raise _AxisError(f"axis {axis} is out of bounds for a tensor of {ndim} dimensions")
    return axis + ndim if axis < 0 else axis


_AxisError = getattr(getattr(np, "exceptions", np), "AxisError", IndexError)


class QuantizedTensor:
    """A quantized tensor: packed integer data plus float32 scales and zero points.

    ``dequantize()`` gives ``(q - zero_point) * scale`` per tensor, per channel (along
    ``axis``) or per group of ``group_size`` consecutive elements.

    Example::

        q = QuantizedTensor.quantize(weights, "qint8", scheme="per_channel", axis=0)
        packet = tensorwire.packet.dumps(q)
        approx = tensorwire.packet.loads(packet).dequantize()
    """

    def __init__(self, data, scales, zero_points, shape, dtype_code,
                 quant_scheme=PER_TENSOR, group_size=0, axis=0):
        if dtype_code not in QUANTIZED_NAMES:
            raise ValueError(f"not a quantized dtype code: {dtype_code}")
        if quant_scheme not in (PER_TENSOR, PER_CHANNEL, PER_GROUP):
            raise ValueError(f"unknown quantization scheme: {quant_scheme}")
        self.data = np.asarray(data).reshape(-1).view(np.uint8)
        self.scales = np.asarray(scales, dtype=np.float32).ravel()
        self.zero_points = np.asarray(zero_points, dtype=np.float32).ravel()
        self.shape = tuple(int(d) for d in shape)
        self.dtype_code = int(dtype_code)
        self.quant_scheme = int(quant_scheme)
        self.group_size = int(group_size)
        self.axis = int(axis)
        if len(self.data) != self.nbytes:
            raise ValueError(
                f"quantized data holds {len(self.data)} bytes; shape {self.shape} of "
                f"{self.dtype_name} needs {self.nbytes}")
        if len(self.scales) != len(self.zero_points):
            raise ValueError("scales and zero_points differ in length")

    @property
    def dtype_name(self) -> str:
        """"qint8", "quint8", "qint4" or "quint4"."""
        return QUANTIZED_NAMES[self.dtype_code]

    @property
    def is_4bit(self) -> bool:
        return self.dtype_code in (QINT4, QUINT4)

    @property
    def is_signed(self) -> bool:
        return self.dtype_code in (QINT8, QINT4)

    @property
    def nbytes(self) -> int:
        """Bytes of packed data."""
        n = math.prod(self.shape)
        return (n + 1) // 2 if self.is_4bit else n

    @classmethod
    def quantize(cls, tensor, dtype: str, scheme: str = "per_tensor",
                 group_size: int = 0, axis: int = 0) -> "QuantizedTensor":
        """Quantize a float tensor (min-max affine) to ``dtype`` ("qint8", "quint8",
        "qint4", "quint4") with ``scheme`` "per_tensor", "per_channel" (along ``axis``)
        or "per_group" (``group_size`` consecutive elements in C order)."""
        if dtype not in _QUANTIZED_CODES:
            raise ValueError(f"unknown quantized dtype {dtype!r}; "
                             f"expected one of {sorted(_QUANTIZED_CODES)}")
        if scheme not in _SCHEMES:
            raise ValueError(f"unknown scheme {scheme!r}; expected one of {sorted(_SCHEMES)}")
        code, kind = _QUANTIZED_CODES[dtype], _SCHEMES[scheme]
        qmin, qmax = _range_of(code)
        values = np.asarray(tensor).astype(np.float32)
        shape = values.shape
        flat = values.ravel()

        if kind == PER_TENSOR:
            lo = float(flat.min()) if flat.size else 0.0
            hi = float(flat.max()) if flat.size else 0.0
            s, z = _scale_and_zero_point(lo, hi, qmin, qmax)
            scales, zeros = np.array([s], np.float32), np.array([z], np.float32)
            q = np.round(flat / s + z)
        elif kind == PER_CHANNEL:
            if not shape:
                raise ValueError("per_channel quantization needs at least one dimension")
            # As tenso: the axis is kept as given (-1 stays -1, written as byte 255),
            # and one outside the dimensions is numpy's AxisError (an IndexError).
            moved_values = np.moveaxis(values, axis, 0)
            # Sizes spelled out: numpy cannot infer a -1 next to a 0 (no channels).
            rows = moved_values.reshape(shape[axis], math.prod(moved_values.shape[1:]))
            scales, zeros = cls._parameters(rows, qmin, qmax)
            q_rows = np.round(rows / scales[:, None] + zeros[:, None])
            q = np.moveaxis(q_rows.reshape(moved_values.shape), 0, axis).ravel()
        else:
            if group_size <= 0:
                raise ValueError("group_size must be > 0 for per_group scheme")
            n = flat.size
            groups = -(-n // group_size)
            padded = np.empty(groups * group_size, np.float32)
            padded[:n] = flat
            if n and groups * group_size > n:
                padded[n:] = flat[(groups - 1) * group_size]  # keeps the tail's min/max
            rows = padded.reshape(groups, group_size)
            scales, zeros = cls._parameters(rows, qmin, qmax)
            q = np.round(rows / scales[:, None] + zeros[:, None]).ravel()[:n]

        q = np.clip(q, qmin, qmax).astype(np.int8 if qmin < 0 else np.uint8)
        data = _pack_nibbles(q) if code in (QINT4, QUINT4) else q.view(np.uint8)
        return cls(data, scales, zeros, shape, code, kind,
                   group_size=group_size,
                   axis=axis if kind == PER_CHANNEL else 0)

    @staticmethod
    def _parameters(rows: np.ndarray, qmin: int, qmax: int):
        """Scale and zero point of each row (computed one row at a time with the
        scalar arithmetic, so results match per-row quantization exactly)."""
        if rows.shape[1] == 0:
            lows = highs = np.zeros(rows.shape[0])
        else:
            lows, highs = rows.min(axis=1), rows.max(axis=1)
        params = [_scale_and_zero_point(float(lo), float(hi), qmin, qmax)
                  for lo, hi in zip(lows, highs)]
        scales = np.array([p[0] for p in params], np.float32)
        zeros = np.array([p[1] for p in params], np.float32)
        return scales, zeros

    def dequantize(self) -> np.ndarray:
        """A float32 approximation of the original tensor."""
        n = math.prod(self.shape)
        if self.is_4bit:
            q = _unpack_nibbles(self.data, n, self.is_signed)
        else:
            q = self.data[:n].view(np.int8 if self.is_signed else np.uint8)
        q = q.astype(np.float32)
        if self.quant_scheme == PER_TENSOR:
            out = (q - self.zero_points[0]) * self.scales[0]
        elif self.quant_scheme == PER_CHANNEL:
            axis = _normalized_axis(self.axis, len(self.shape))
            rows = np.moveaxis(q.reshape(self.shape), axis, 0)
            # Sizes spelled out: numpy cannot infer a -1 next to a 0 (no channels).
            rows = rows.reshape(len(self.scales), math.prod(rows.shape[1:]))
            rows = (rows - self.zero_points[:, None]) * self.scales[:, None]
            moved = (self.shape[axis],) + tuple(s for i, s in enumerate(self.shape) if i != axis)
            out = np.moveaxis(rows.reshape(moved), 0, axis)
        else:
            idx = np.arange(n) // max(self.group_size, 1)
            out = (q - self.zero_points[idx]) * self.scales[idx]
        return np.ascontiguousarray(out, dtype=np.float32).reshape(self.shape)

    def __eq__(self, other):
        if not isinstance(other, QuantizedTensor):
            return NotImplemented
        return (self.shape == other.shape and self.dtype_code == other.dtype_code
                and self.quant_scheme == other.quant_scheme
                and self.group_size == other.group_size and self.axis == other.axis
                and np.array_equal(self.data, other.data)
                and np.array_equal(self.scales, other.scales)
                and np.array_equal(self.zero_points, other.zero_points))

    def __repr__(self) -> str:
        scheme = {v: k for k, v in _SCHEMES.items()}[self.quant_scheme]
        return (f"QuantizedTensor(dtype={self.dtype_name}, shape={self.shape}, "
                f"scheme={scheme}, nbytes={self.nbytes})")


def _string_bytes(s) -> bytes:
    """A `StringTensor` element's bytes: a str's UTF-8, else those of a bytes-like
    object with a length, as tenso takes it (a number, even a numpy one, is a
    `TypeError`; `bytes(3)` would have been three NUL bytes)."""
    if isinstance(s, str):
        return s.encode("utf-8")
    len(s)
    return memoryview(s).tobytes()


class StringTensor:
    """A batch of variable-length UTF-8 strings: packed bytes plus ``count + 1``
    uint64 offsets, with no padding.

    Example::

        st = StringTensor(["hello", "wörld", ""])
        assert tensorwire.packet.loads(st.dumps())[1] == "wörld"
    """

    __slots__ = ("_offsets", "_data")

    def __init__(self, strings: Sequence[Union[str, bytes]]):
        parts = [_string_bytes(s) for s in strings]
        offsets = np.zeros(len(parts) + 1, dtype=np.uint64)
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        self._offsets = offsets
        self._data = np.frombuffer(b"".join(parts), dtype=np.uint8)

    @classmethod
    def _from_parts(cls, offsets, data) -> "StringTensor":
        """Wrap decoded offsets and payload (already validated) without copying."""
        obj = object.__new__(cls)
        obj._offsets = offsets
        obj._data = data
        return obj

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def _span(self, i: int) -> bytes:
        return self._data[int(self._offsets[i]):int(self._offsets[i + 1])].tobytes()

    def _text(self, i: int) -> str:
        """String ``i``; bytes that are not UTF-8 (a packet's payload is checked on
        access, not on decode) raise ``MalformedError``."""
        raw = self._span(i)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _native.MalformedError(
                f"string {i} is not valid UTF-8 ({e.reason} at byte {e.start} of "
                f"{len(raw)})") from None

    def __getitem__(self, index: int) -> str:
        count = len(self)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError(f"index {index} out of range for StringTensor of size {count}")
        return self._text(index)

    def __iter__(self):
        return (self._text(i) for i in range(len(self)))

    def __eq__(self, other):
        if not isinstance(other, StringTensor):
            return NotImplemented
        return (np.array_equal(self._offsets, other._offsets)
                and np.array_equal(self._data, other._data))

    def to_list(self) -> List[str]:
        return list(self)

    @property
    def offsets(self) -> np.ndarray:
        """The ``count + 1`` uint64 offsets into the payload."""
        return self._offsets

    @property
    def nbytes(self) -> int:
        """Bytes of UTF-8 payload."""
        return len(self._data)

    @property
    def shape(self) -> tuple:
        return (len(self),)

    def dumps(self, check_integrity: bool = False) -> memoryview:
        """This tensor as a string packet."""
        from .packet import dumps
        return dumps(self, check_integrity=check_integrity)

    @classmethod
    def loads(cls, data) -> "StringTensor":
        """Decode a string packet."""
        from .packet import loads
        obj = loads(data)
        if not isinstance(obj, cls):
            raise ValueError("Not a StringTensor packet")
        return obj

    def __repr__(self) -> str:
        head = [self[i] for i in range(min(3, len(self)))]
        more = ", ..." if len(self) > 3 else ""
        return f"StringTensor({head}{more}, count={len(self)})"


class RaggedArray:
    """A sequence of 1-D arrays of different lengths stored without padding: one flat
    array plus ``count + 1`` uint64 row splits.

    Example::

        ra = RaggedArray([np.arange(3), np.arange(1)])
        assert list(RaggedArray.loads(ra.dumps())[1]) == [0]
    """

    __slots__ = ("_offsets", "_flat")

    def __init__(self, arrays: Sequence[np.ndarray]):
        rows = [np.asarray(a).ravel() for a in arrays]
        dtype = rows[0].dtype if rows else np.dtype(np.float32)
        offsets = np.zeros(len(rows) + 1, dtype=np.uint64)
        np.cumsum([len(r) for r in rows], out=offsets[1:])
        self._offsets = offsets
        self._flat = (np.concatenate([r.astype(dtype, copy=False) for r in rows])
                      if rows else np.empty(0, dtype))

    @classmethod
    def _from_parts(cls, offsets, flat) -> "RaggedArray":
        """Wrap row splits and values, checking they agree."""
        offsets = np.asarray(offsets)
        flat = np.asarray(flat)
        if offsets.ndim != 1 or len(offsets) < 1 or flat.ndim != 1:
            raise ValueError("ragged offsets and values must be 1-D, offsets non-empty")
        if int(offsets[0]) != 0 or np.any(np.diff(offsets.astype(np.int64)) < 0):
            raise ValueError("ragged offsets must start at 0 and never decrease")
        if int(offsets[-1]) != len(flat):
            raise ValueError(f"last ragged offset {int(offsets[-1])} != values length {len(flat)}")
        obj = object.__new__(cls)
        obj._offsets = offsets.astype(np.uint64, copy=False)
        obj._flat = flat
        return obj

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        count = len(self)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError(f"index {index} out of range for RaggedArray of size {count}")
        return self._flat[int(self._offsets[index]):int(self._offsets[index + 1])].copy()

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __eq__(self, other):
        if not isinstance(other, RaggedArray):
            return NotImplemented
        return (self.dtype == other.dtype and np.array_equal(self._offsets, other._offsets)
                and np.array_equal(self._flat, other._flat))

    @property
    def dtype(self) -> np.dtype:
        return self._flat.dtype

    @property
    def flat_values(self) -> np.ndarray:
        return self._flat

    @property
    def row_splits(self) -> np.ndarray:
        return self._offsets

    def to_list(self) -> List[np.ndarray]:
        return list(self)

    def _bundle(self) -> dict:
        """The bundle tenso writes for a ragged array."""
        return {RAGGED_OFFSETS: self._offsets, RAGGED_FLAT: self._flat,
                RAGGED_COUNT: np.array([len(self)], dtype=np.uint64)}

    def dumps(self, check_integrity: bool = False) -> memoryview:
        """This array as a packet (a bundle of offsets, values and count, as tenso
        writes it)."""
        from .packet import dumps
        return dumps(self, check_integrity=check_integrity)

    @classmethod
    def loads(cls, data) -> "RaggedArray":
        """Decode a ragged packet, or wrap the dict ``loads`` returned for one."""
        if not isinstance(data, (dict, RaggedArray)):
            from .packet import loads
            data = loads(data)
        if isinstance(data, RaggedArray):
            return data
        if RAGGED_OFFSETS not in data or RAGGED_FLAT not in data:
            raise ValueError("Not a valid RaggedArray packet")
        ragged = cls._from_parts(data[RAGGED_OFFSETS], data[RAGGED_FLAT])
        count = data.get(RAGGED_COUNT)
        if count is not None and int(np.asarray(count).ravel()[0]) != len(ragged):
            raise ValueError(f"ragged count {int(np.asarray(count).ravel()[0])} "
                             f"!= {len(ragged)} rows")
        return ragged

    def __repr__(self) -> str:
        return f"RaggedArray(count={len(self)}, dtype={self.dtype}, nbytes={self._flat.nbytes})"


class IpcRef:
    """A GPU IPC reference packet: an opaque CUDA IPC memory handle, the byte range
    in that allocation, and the device's UUID. Opening it needs the CUDA runtime
    (see ``tensorwire.ipc``); ``loads`` only decodes it."""

    __slots__ = ("handle", "byte_offset", "nbytes", "device_uuid")

    def __init__(self, handle: bytes, byte_offset: int, nbytes: int, device_uuid: bytes):
        handle, device_uuid = bytes(handle), bytes(device_uuid)
        if len(handle) != 64 or len(device_uuid) != 16:
            raise ValueError("an IPC handle is 64 bytes and a device UUID 16 bytes")
        self.handle = handle
        self.byte_offset = int(byte_offset)
        self.nbytes = int(nbytes)
        self.device_uuid = device_uuid

    def __eq__(self, other):
        if not isinstance(other, IpcRef):
            return NotImplemented
        return all(getattr(self, s) == getattr(other, s) for s in self.__slots__)

    def __repr__(self) -> str:
        return (f"IpcRef(offset={self.byte_offset}, nbytes={self.nbytes}, "
                f"device={self.device_uuid.hex()})")
