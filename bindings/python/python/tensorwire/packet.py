"""Tensor packets: the ``tenso`` 0.24 wire format (protocol v4, v3 read), with tenso's
Python API.

``dumps`` turns a numpy array, a dict of them (a *bundle*, nested dicts allowed), a
scipy sparse matrix (COO/CSR/CSC), a :class:`QuantizedTensor`, :class:`StringTensor`
or :class:`RaggedArray` into one packet; ``loads`` turns a packet back. The bytes are
what ``tenso.dumps`` writes for the same input and options, and tenso reads ours.

Differences from tenso, all deliberate:

* ``loads(data, copy=False)`` returns read-only arrays that *borrow* ``data``
  whenever a body is element-aligned in memory (``dumps`` output, mmap'd files,
  shared memory); tenso copies unless the body is 64-byte aligned. The array's
  ``base`` chain keeps ``data`` alive. ``copy=True`` gives writeable copies.
* Big-endian arrays are byte-swapped to little-endian on the way in (tenso writes
  their bytes as if they were little-endian, corrupting them).
* LZ4 bodies never inflate beyond the size their header declares, stream readers
  check every announced length against limits and read in bounded chunks, and
  compressed packets can be streamed.
* ``dumps(..., aligned_bundle=True)`` lays bundle members out so each body is
  aligned in the packet, making bundle members zero-copy too.
* A bad packet raises tensorwire's typed exceptions (``FormatError`` and its
  subclasses: ``TruncatedError``, ``ChecksumError``, ``LimitExceededError``, ...),
  which are ``ValueError`` subclasses, so code written for tenso still catches them.
"""

from __future__ import annotations

import math
import mmap as _mmap
import operator
import os
import weakref
from typing import Any, Iterator, Optional

import numpy as np

from . import _native
from ._packet_types import (
    QINT4,
    QUANTIZED_NAMES,
    QUINT4,
    IpcRef,
    QuantizedTensor,
    RaggedArray,
    StringTensor,
)

__all__ = [
    "IpcRef",
    "QuantizedTensor",
    "RaggedArray",
    "StreamEndedError",
    "StringTensor",
    "aread_stream",
    "awrite_stream",
    "dump",
    "dumps",
    "get_packet_info",
    "is_aligned",
    "iter_dumps",
    "load",
    "loads",
    "read_stream",
    "write_stream",
]

class StreamEndedError(_native.TruncatedError, EOFError):
    """A stream ended inside a packet: a ``TruncatedError``, and an ``EOFError`` as
    tenso's ``read_stream`` raises (``asyncio.IncompleteReadError`` is one too)."""


# Most entries in one bundle (its count is one byte on the wire).
MAX_BUNDLE_ENTRIES = 255
# Most elements in one tensor, and the largest dimension (u32 on the wire).
MAX_ELEMENTS = 10**9
_MAX_DIM = 0xFFFFFFFF
# Async readers fetch at most this much per await, whatever a header announces.
_ASYNC_CHUNK = 8 << 20


def _check_compressed(fmt, shape, indices, indptr):
    """The CSR/CSC structure scipy's kernels trust: pointers from 0, never
    decreasing, ending within the indices, and those indices inside the minor
    dimension. scipy's own full check skips all of it when the last pointer is 0."""
    minor = shape[1] if fmt == "csr" else shape[0]
    # Signed, so a wrapped unsigned value shows up as a decrease.
    ptr = np.asarray(indptr).astype(np.int64, copy=False)
    if ptr[0] != 0:
        raise ValueError(f"the first pointer is {ptr[0]}, not 0")
    if ptr.size > 1 and (np.diff(ptr) < 0).any():
        raise ValueError("the pointers decrease")
    nnz = int(ptr[-1])
    if nnz > len(indices):
        raise ValueError(f"the last pointer is {nnz}, past the {len(indices)} indices")
    used = np.asarray(indices[:nnz]).astype(np.int64, copy=False)
    if nnz and (used.min() < 0 or used.max() >= minor):
        raise ValueError(f"an index lies outside [0, {minor})")


# The element types scipy.sparse supports (its `supported_dtypes`), by type char.
_SCIPY_SPARSE_TYPES = frozenset("?bBhHiIlLqQfdgFDG")


def _make_sparse(fmt, shape, data, first, second):
    try:
        import scipy.sparse as sparse
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("scipy is required to decode sparse packets") from e
    # scipy builds some matrices of types it has no kernels for (float16, bfloat16),
    # which then fail in its own methods: refused here, by name.
    if np.dtype(data.dtype).char not in _SCIPY_SPARSE_TYPES:
        raise _native.UnsupportedError(
            f"sparse {fmt} packet of {data.dtype}: scipy.sparse has no {data.dtype} matrices")
    # scipy checks COO indices as it builds the matrix; CSR/CSC structure is checked
    # here first, as scipy's kernels would read outside the arrays otherwise.
    try:
        if fmt == "coo":
            return sparse.coo_matrix((data, (first, second)), shape=shape)
        _check_compressed(fmt, shape, first, second)
        maker = sparse.csr_matrix if fmt == "csr" else sparse.csc_matrix
        return maker((data, first, second), shape=shape)
    except ValueError as e:
        raise _native.MalformedError(f"sparse {fmt} packet: {e}") from None


def _make_quantized(data, scales, zero_points, shape, code, scheme, group_size, axis):
    return QuantizedTensor(data, scales, zero_points, shape, code, scheme, group_size, axis)


# How the native decoder builds the values numpy has no type for.
_FACTORIES = (
    _make_sparse,
    StringTensor._from_parts,
    RaggedArray._from_parts,
    _make_quantized,
    IpcRef,
)


def _check_dims(shape) -> None:
    for d in shape:
        if d > _MAX_DIM:
            raise ValueError(f"Dimension {d} exceeds the wire-format limit of {_MAX_DIM} "
                             "(each dimension is stored as a 32-bit integer)")


def _check_shape(shape) -> None:
    _check_dims(shape)
    count = 1
    for d in shape:
        count *= int(d)
    if count > MAX_ELEMENTS:
        raise ValueError(f"Packet exceeds maximum elements ({count} > {MAX_ELEMENTS})")


def _dense(array: np.ndarray, strict: bool):
    _check_shape(array.shape)
    if strict and not array.flags["C_CONTIGUOUS"]:
        raise ValueError("Tensor is not C-Contiguous")
    return ("dense", array)


def _is_sparse(obj) -> bool:
    return getattr(obj, "format", None) in ("coo", "csr", "csc") and hasattr(obj, "tocoo")


def _spec(obj: Any, strict: bool, depth: int = 0):
    """``obj`` as the tagged tuples the native encoder reads."""
    if depth > 64:
        raise ValueError("bundle nesting deeper than 64 levels")
    if isinstance(obj, np.ndarray):
        return _dense(obj, strict)
    if isinstance(obj, np.generic):
        return _dense(np.asarray(obj), strict)
    if isinstance(obj, dict):
        if len(obj) > MAX_BUNDLE_ENTRIES:
            raise ValueError(f"Bundle has {len(obj)} entries; the wire format encodes the "
                             f"entry count in one byte, so at most {MAX_BUNDLE_ENTRIES}")
        entries = []
        for key, value in obj.items():
            if not isinstance(key, str):
                raise TypeError(f"bundle keys must be str, not {type(key).__name__}")
            entries.append((key, _spec(value, strict, depth + 1)))
        return ("bundle", entries)
    if isinstance(obj, QuantizedTensor):
        _check_shape(obj.shape)
        return ("quantized", obj.dtype_code, tuple(obj.shape), obj.quant_scheme, obj.axis,
                obj.group_size, np.ascontiguousarray(obj.scales, dtype="<f4"),
                np.ascontiguousarray(obj.zero_points, dtype="<f4"),
                np.ascontiguousarray(obj.data, dtype=np.uint8))
    if isinstance(obj, StringTensor):
        return ("strings", np.ascontiguousarray(obj._offsets, dtype="<u8"),
                np.ascontiguousarray(obj._data, dtype=np.uint8))
    if isinstance(obj, RaggedArray):
        return _spec(obj._bundle(), strict, depth)
    if isinstance(obj, IpcRef):
        return ("ipcref", obj.handle, obj.byte_offset, obj.nbytes, obj.device_uuid)
    if _is_sparse(obj):
        # The logical shape of a sparse matrix is not its element count (a 10^5 x 10^5
        # matrix with ten values is small): only its dimensions are limited, as
        # tenso limits them; its parts are checked as the dense arrays they are.
        _check_dims(obj.shape)
        if obj.format == "coo":
            parts = (obj.data, obj.row, obj.col)
        else:
            parts = (obj.data, obj.indices, obj.indptr)
        return ("sparse", obj.format, tuple(int(d) for d in obj.shape),
                *(np.asarray(p) for p in parts))
    raise TypeError(f"Cannot serialize object of type {type(obj).__name__!r}")


def _check_alignment(alignment) -> int:
    """``alignment`` as an int (any integer type, numpy's too, as tenso takes it)."""
    try:
        alignment = operator.index(alignment)
    except TypeError:
        raise ValueError("Alignment must be a power of two") from None
    if not (alignment > 0 and alignment & (alignment - 1) == 0):
        raise ValueError("Alignment must be a power of two")
    return alignment


def dumps(tensor: Any, strict: bool = False, check_integrity: bool = False,
          compress: bool = False, alignment: int = 64, *,
          aligned_bundle: bool = False) -> memoryview:
    """Serialize an array, dict (bundle), sparse matrix, QuantizedTensor, StringTensor
    or RaggedArray to one packet.

    ``strict`` refuses non-C-contiguous arrays instead of copying them;
    ``check_integrity`` appends an XXH3-64 footer; ``compress`` LZ4-compresses the body;
    ``alignment`` (a power of two) aligns the body; ``aligned_bundle`` aligns bundle
    members' bodies too (tenso still reads the result). Returns a read-only
    memoryview over a 64-byte aligned buffer.
    """
    alignment = _check_alignment(alignment)
    spec = _spec(tensor, strict)
    out = _native.packet_dumps(spec, bool(check_integrity), bool(compress), alignment,
                               bool(aligned_bundle))
    return memoryview(out)


def _as_bytes_array(data) -> np.ndarray:
    """``data`` (any buffer) as a 1-D uint8 array over the same memory."""
    if isinstance(data, np.ndarray):
        if not data.flags["C_CONTIGUOUS"]:
            raise ValueError("packet buffer must be contiguous")
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def loads(data, copy: bool = False) -> Any:
    """Deserialize one packet from ``data`` (bytes, bytearray, memoryview, mmap, numpy
    array or anything with the buffer protocol).

    Arrays are zero-copy, read-only views of ``data`` when their bodies are aligned in
    memory (``copy=False``); ``copy=True`` returns writeable copies. Bundles come back as
    dicts, sparse packets as scipy matrices, the other kinds as their classes.
    """
    # As tenso: the first packet, whatever follows it (a tenso shared-memory segment
    # holds its packet with slack after it).
    return _native.packet_loads(_as_bytes_array(data), bool(copy), _FACTORIES)


def iter_dumps(tensor: Any, strict: bool = False,
               check_integrity: bool = False) -> Iterator[memoryview]:
    """The packet for ``tensor`` as a few buffers to write in turn. A dense array yields
    its header, its own memory (no copy) and the footer; other objects one buffer."""
    if isinstance(tensor, (np.ndarray, np.generic)):
        kind, array = _dense(np.asarray(tensor), strict)
        header, body, footer = _native.packet_dense_parts(array, bool(check_integrity), 64)
        yield memoryview(header)
        if body.nbytes:
            # As bytes: extension dtypes (bfloat16) have no buffer format.
            yield memoryview(_as_bytes_array(body))
        if footer:
            yield memoryview(footer)
    else:
        yield dumps(tensor, strict=strict, check_integrity=check_integrity)


def _writer_of(dest):
    write = getattr(dest, "sendall", None) or getattr(dest, "write", None)
    if write is None:
        raise AttributeError(f"Destination {type(dest)} has no '.write' or '.sendall' method.")
    return write


def write_stream(tensor: Any, dest, strict: bool = False, check_integrity: bool = False) -> int:
    """Write one packet to a file-like object (``.write``) or socket (``.sendall``)
    without building it in memory first. Returns the bytes written."""
    write = _writer_of(dest)
    written = 0
    for part in iter_dumps(tensor, strict=strict, check_integrity=check_integrity):
        write(part)
        written += part.nbytes
    return written


def dump(tensor: Any, fp, strict: bool = False, check_integrity: bool = False) -> None:
    """Write one packet to an open binary file."""
    write_stream(tensor, fp, strict=strict, check_integrity=check_integrity)


# Packets read_stream had begun when their source had no data ready, by source.
_PENDING = weakref.WeakKeyDictionary()


def read_stream(source, copy: bool = False) -> Optional[Any]:
    """Read and decode one packet from a file-like object (``readinto``/``read``) or a
    socket (``recv_into``/``recv``). Returns None at a clean end of stream; a stream
    that ends inside a packet raises :class:`StreamEndedError` (a ``TruncatedError``
    and an ``EOFError``, as tenso raises). Announced lengths are checked against
    limits and read in bounded chunks.

    The source should block until data comes. A non-blocking one with no data ready
    (``readinto``/``read`` returning None, a socket raising ``BlockingIOError``) makes
    this raise ``BlockingIOError``, never end the stream; a socket timeout raises
    ``TimeoutError``. The bytes of a packet begun before that are kept (for a source
    that takes weak references, as files and sockets do): the next ``read_stream``
    of the same source goes on with that packet."""
    try:
        pending = _PENDING.pop(source, None)
    except TypeError:  # a source that is not hashable or takes no weak references
        pending = None
    try:
        return _native.packet_read_stream(source, bool(copy), _FACTORIES, pending)
    except _native.TruncatedError as e:
        raise StreamEndedError(str(e)) from None
    except (BlockingIOError, TimeoutError) as e:
        left = e.__dict__.pop("pending", None)
        if left is not None:
            try:
                _PENDING[source] = left
            except TypeError:
                pass
        raise


def load(fp, mmap_mode: bool = False, copy: bool = False) -> Any:
    """Read one packet from an open binary file, at its current position.

    With ``mmap_mode`` the file is memory-mapped and arrays view the map (zero-copy);
    the file position moves past the packet either way."""
    if not mmap_mode:
        result = read_stream(fp, copy=copy)
        if result is None:
            raise EOFError("Empty file or stream")
        return result
    start = fp.tell()
    if os.fstat(fp.fileno()).st_size == 0:  # (mmap refuses an empty file: ValueError)
        raise EOFError("Empty file or stream")
    mapped = _mmap.mmap(fp.fileno(), 0, access=_mmap.ACCESS_READ)
    view = np.frombuffer(mapped, dtype=np.uint8)[start:]
    if view.size == 0:
        raise EOFError("Empty file or stream")
    length = _native.packet_length(view)
    result = loads(view[:length], copy=copy)
    fp.seek(start + length)
    return result


async def aread_stream(reader, copy: bool = False) -> Optional[Any]:
    """Read and decode one packet from an ``asyncio.StreamReader``. Returns None at a
    clean end of stream. The framing and limits are those of :func:`read_stream`."""
    import asyncio

    buf = bytearray()
    while True:
        need = _native.packet_frame_need(np.frombuffer(buf, dtype=np.uint8))
        if need == 0:
            break
        chunk = min(need, _ASYNC_CHUNK)
        try:
            buf += await reader.readexactly(chunk)
        except asyncio.IncompleteReadError as e:
            if not buf and not e.partial:
                return None
            raise StreamEndedError(
                f"stream ended inside a packet: {len(buf) + len(e.partial)} bytes read, "
                f"at least {len(buf) + chunk} needed") from None
    return loads(_aligned_copy(buf), copy=copy)


def _aligned_copy(buf: bytearray) -> np.ndarray:
    """``buf`` copied into a 64-byte aligned array, so decoded bodies are aligned."""
    raw = np.empty(len(buf) + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    out = raw[start:start + len(buf)]
    out[:] = np.frombuffer(buf, dtype=np.uint8)
    return out


async def awrite_stream(tensor: Any, writer, strict: bool = False,
                        check_integrity: bool = False) -> int:
    """Write one packet to an ``asyncio.StreamWriter`` and wait for ``drain()``.
    Returns the bytes written. The transport may still hold bytes when this returns,
    so they are copies: changing ``tensor`` afterwards never reaches the peer."""
    written = 0
    for part in iter_dumps(tensor, strict=strict, check_integrity=check_integrity):
        # asyncio (Python 3.12+) queues a memoryview without copying it.
        writer.write(bytes(part))
        written += part.nbytes
    await writer.drain()
    return written


_NUMPY_DTYPES = {1: "<f4", 2: "<i4", 3: "<f8", 4: "<i8", 5: "u1", 6: "<u2", 7: "?",
                 8: "<f2", 9: "i1", 10: "<i2", 11: "<u4", 12: "<u8", 13: "<c8", 14: "<c16"}


def _numpy_dtype(code: int):
    if code in _NUMPY_DTYPES:
        return np.dtype(_NUMPY_DTYPES[code])
    if code == 15:
        try:
            import ml_dtypes
            return np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            return "bfloat16"
    return QUANTIZED_NAMES.get(code)


def get_packet_info(data) -> dict:
    """What a packet's header says, without decoding the body: ``version``, ``flags``,
    ``dtype_code``, ``dtype`` (numpy dtype, a quantized type's name, or None),
    ``shape``, ``ndim``, ``aligned``, ``integrity_protected``, ``total_elements``,
    ``data_size_bytes``, plus ``entry_count`` for bundles and ``quantized`` for
    quantized packets (tenso's keys)."""
    head = memoryview(data).cast("B")
    if len(head) < 8:
        raise _native.TruncatedError(f"a packet header needs 8 bytes, got {len(head)}")
    if bytes(head[:4]) != b"TNSO":
        raise _native.BadMagicError(f"not a tensor packet (magic {bytes(head[:4])!r})")
    version = head[4]
    if version == 4:
        if len(head) < 10:
            raise _native.TruncatedError("a v4 packet header needs 10 bytes")
        flags, code, ndim, pos = head[5] | head[6] << 8, head[7], head[8], 10
    elif version == 3:
        flags, code, ndim, pos = head[5], head[6], head[7], 8
    else:
        raise _native.UnsupportedError(f"tenso protocol version {version} (3 and 4 are read)")
    info = {"version": version, "flags": flags, "dtype_code": code, "ndim": ndim,
            "aligned": bool(flags & 0x01), "integrity_protected": bool(flags & 0x02)}
    if flags & 0x10:  # a bundle: ndim counts entries
        info.update(entry_count=ndim, shape=(), total_elements=0, dtype=None,
                    data_size_bytes=0)
        return info
    if ndim > 32:
        raise _native.LimitExceededError(f"number of dimensions is {ndim}, above the limit of 32")
    if len(head) < pos + 4 * ndim:
        raise _native.TruncatedError(f"the shape needs {pos + 4 * ndim} bytes")
    shape = tuple(np.frombuffer(head[pos:pos + 4 * ndim], dtype="<u4").tolist())
    count = math.prod(shape)
    dtype = _numpy_dtype(code) if not flags & 0x168 else None
    # Keys in tenso's order.
    info.update(total_elements=count, shape=shape, dtype=dtype)
    if code in QUANTIZED_NAMES:
        info["quantized"] = True
        size = (count + 1) // 2 if code in (QINT4, QUINT4) else count
    elif isinstance(dtype, np.dtype):
        size = count * dtype.itemsize
    else:
        size = 0
    info["data_size_bytes"] = size
    return info


def is_aligned(data, alignment: int = 64) -> bool:
    """True when ``data``'s first byte is at a multiple of ``alignment`` in memory."""
    view = memoryview(data)
    if view.nbytes == 0:
        return True
    return np.frombuffer(view, dtype=np.uint8).ctypes.data % alignment == 0
