"""tensorwire.Reader: the native reader plus the ztensor-style conveniences."""

from __future__ import annotations

import sys

from . import _native, _staging
from ._types import Tensor, TensorMetadata


class Reader(_native.Reader):
    """Reads tensors from a file (recognised by its magic bytes, mapped privately).

    ``reader[name]`` / ``read_numpy(name)`` return zero-copy numpy arrays for raw
    tensors: their ``base`` keeps the file map alive, so they stay valid after the
    reader is closed or deleted (and after the file is deleted). They are writable;
    writes stay private to this process (copy-on-write) and never reach the file.

    ``Reader(buffer=data)`` reads a file held in memory (``bytes``, ``bytearray``,
    ``memoryview``, ``mmap``): arrays are read-only views of ``data`` and keep it
    alive; torch tensors are copies, as torch has no read-only tensors.

    ``limits={name: int}`` raises or lowers the parser limits by name, the others
    keeping ``tensorwire.DEFAULT_LIMITS``: ``Reader(path, limits={"max_depth": 100})``
    reads a checkpoint nested deeper than the default 64 levels.

    Usable as a context manager (``close()`` on exit; arrays stay valid).
    """

    def metadata(self, name):
        """TensorMetadata for a name, or a list of them for a list of names."""
        if isinstance(name, str):
            return TensorMetadata(**self._metadata(name))
        if isinstance(name, (list, tuple)):
            return [TensorMetadata(**self._metadata(n)) for n in name]
        raise TypeError("name must be a str or a list of str")

    def read(self, name, *, copy=False):
        """Tensor objects with all their components (any format): a name gives a
        Tensor, a list gives {name: Tensor} (read in file-offset order)."""
        if isinstance(name, str):
            return self._read_tensor(name, copy)
        if isinstance(name, (list, tuple)):
            return {n: self._read_tensor(n, copy) for n in self._sorted_by_offset(list(name))}
        raise TypeError("name must be a str or a list of str")

    def _read_tensor(self, name, copy):
        meta = self._metadata(name)
        return Tensor(
            self._read_components(name, copy=copy),
            shape=meta["shape"],
            dtype=meta["dtype"],
            format=meta["format"],
            type=meta["type"],
            attributes=meta["attributes"],
        )

    def read_torch(self, name, *, copy=False, device="cpu"):
        """Dense tensor(s) as torch tensors: a name gives a tensor, a list gives a dict
        (file-offset order). With copy=False on the CPU the tensors share the file map
        (zero-copy, like read_numpy); ``device`` moves them (e.g. "cuda:0"; to a CUDA
        device through reused pinned buffers filled by several threads, returning when
        the bytes are there). bfloat16 and float8 need no ml_dtypes here."""
        tt = _torch_interop()
        on_cpu = _on_cpu(device)
        if not copy and on_cpu:
            # The common calls, kept short: a state dict loader makes them once per
            # tensor, so every Python step here counts.
            if isinstance(name, str):
                return _shared_torch(self, tt, name)
            if isinstance(name, (list, tuple)):
                return {n: _shared_torch(self, tt, n) for n in self._sorted_by_offset(list(name))}

        target = None if on_cpu else _staging.cuda_device(tt.torch, device)
        if target is not None and isinstance(name, (str, list, tuple)):
            names = [name] if isinstance(name, str) else self._sorted_by_offset(list(name))
            got = _to_cuda(self, tt, names, target)
            return got[name] if isinstance(name, str) else got

        def one(n):
            if copy:
                # Fill a torch-allocated tensor natively (parallel, without the GIL).
                dtype, shape = tt.torch_type(*self._dtype_and_shape(n))
                t = tt.torch.empty(shape, dtype=dtype)
                if t.numel():
                    self._read_into_raw(n, tt.torch_dst_bytes(t), fresh=True)
            else:
                t = _shared_torch(self, tt, n)
            return t if on_cpu else t.to(device)

        if isinstance(name, str):
            return one(name)
        if isinstance(name, (list, tuple)):
            return {n: one(n) for n in self._sorted_by_offset(list(name))}
        raise TypeError("name must be a str or a list of str")

    def read_tensors(self, names, *, copy=False):
        """``{name: numpy array}`` for ``names`` (a list or tuple), as ztensor's
        ``read_tensors`` gives them (``read_numpy`` with a list)."""
        if isinstance(names, (str, bytes)):
            raise TypeError("read_tensors takes a list of names (read_numpy takes one)")
        return self.read_numpy(list(names), copy=copy)

    def read_into(self, name, dst=None):
        """Copy (or decode) tensor data straight into existing arrays, without the GIL
        for large tensors.

        Args:
            name: a tensor name (then ``dst`` is required) or a dict {name: dst},
                filled in file-offset order.
            dst: a writable numpy array or a torch tensor of the tensor's shape.
                One that is C-contiguous (for torch: on the CPU) and of the
                tensor's dtype is filled in place natively; any other as
                ``np.copyto(dst, read_numpy(name))`` or ``dst.copy_(read_torch(
                name))`` fill it (a cast by numpy's or torch's rules, as ztensor's
                ``read_into`` makes it).
        """
        if isinstance(name, dict):
            if all(_is_ndarray(d) for d in name.values()):
                try:
                    return _native.Reader.read_into(self, name)
                except _native.InvalidArgumentError:
                    if not all(d.flags.writeable for d in name.values()):
                        raise
            for n in self._sorted_by_offset(list(name)):
                self.read_into(n, name[n])
            return None
        if dst is None:
            raise TypeError("dst is required when name is a str")
        if _is_ndarray(dst):
            try:
                return _native.Reader.read_into(self, name, dst)
            except _native.InvalidArgumentError as refused:
                src = self.read_numpy(name) if dst.flags.writeable else None
                if src is None or src.shape != dst.shape:
                    raise refused
                self._check_record(name)  # every byte is copied: its CRC first
            import numpy as np

            np.copyto(dst, src)
            return None
        return self._read_into_torch(name, dst)

    def _read_into_torch(self, name, dst):
        tt = _torch_interop()
        dtype, shape = tt.torch_type(*self._dtype_and_shape(name))
        if tuple(dst.shape) != shape:
            raise _native.InvalidArgumentError(
                f"dst for `{name}` is {dst.dtype} {list(dst.shape)}, the tensor is "
                f"{dtype} {list(shape)}")
        # A tensor requiring grad, outside no_grad, is torch's to fill (a leaf refuses);
        # a lazily conjugated or negated view keeps its bits apart from its memory, so
        # copy_ must resolve them.
        tracked = dst.requires_grad and tt.torch.is_grad_enabled()
        lazy = dst.is_conj() or dst.is_neg()
        if (dst.dtype == dtype and dst.device.type == "cpu" and dst.is_contiguous()
                and not tracked and not lazy):
            self._read_into_raw(name, tt.torch_dst_bytes(dst))
        else:
            self._check_record(name)  # every byte is copied: its CRC first
            src = self.read_torch(name)
            try:
                dst.copy_(src)
            except NotImplementedError as e:  # torch has no cast between the two
                raise _native.UnsupportedError(
                    f"`{name}` is {src.dtype}, which torch cannot copy into a "
                    f"{dst.dtype} tensor ({e})") from e

    def __repr__(self):
        return _native.Reader.__repr__(self)


def _is_torch_tensor(value):
    """True for a torch tensor, of any subclass (``nn.Parameter``, a library's own),
    without importing torch: a process that has not imported it holds none."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _on_cpu(device):
    """True when a torch ``device`` argument names the CPU (``None``, as safetensors
    and torch take it, included)."""
    return device is None or device == "cpu" or str(device).partition(":")[0] == "cpu"


def _shared_torch(reader, tt, name):
    """A torch tensor sharing the reader's bytes: a typed numpy array for torch's
    ``from_numpy``, or for a dtype numpy lacks (bfloat16, float8, a checkpoint's
    complex32 …) the array of the elements holding it, then viewed as that dtype."""
    x = reader._read_for_torch(name)
    if type(x) is not tuple:
        return tt.from_numpy(x)
    return tt.holder_to_torch(*x) if len(x) == 2 else tt.bytes_to_torch(*x)


def _to_cuda(reader, tt, names, device):
    """``{name: tensor on the CUDA device}``, copied through pinned buffers
    (``_staging``) from the reader's bytes as they lie (unaligned or read-only ones
    too: no host copy first), strides kept. A strided view torch could not share
    (read-only or unaligned), a view with gaps between its elements or an empty
    tensor is the tensor read_torch gives on the CPU, moved."""
    torch = tt.torch
    staged = _staging.Batches(torch)
    out = {}
    for n in names:
        x = reader._read_for_torch(n, to_copy=True)
        dense = _dense_bytes(x)
        row_major = x[3] is None if isinstance(x, tuple) else x.flags.c_contiguous
        if dense is not None and not row_major and not _shareable(x, dense[0]):
            dense = None  # the CPU copy's layout is the format's to choose
        if dense is None or not dense[0].nbytes:
            out[n], job = _staging.device_job(tt, _shared_torch(reader, tt, n), device)
            if job is not None:
                staged.add(*job)
            continue
        raw, strides = dense
        # The tensor the CPU path would build over these bytes, on the device.
        if isinstance(x, tuple):  # a dtype numpy lacks
            dtype, shape = tt.torch_type(x[1], x[2])
        else:  # torch.from_numpy's dtype and strides (of size-1 dimensions too)
            dtype, shape = tt.dtype_of(x), x.shape
        if strides is None:
            dst = torch.empty(shape, dtype=dtype, device=device)
        else:
            dst = torch.empty_strided(shape, strides, dtype=dtype, device=device)
        staged.add(raw, tt.flat_bytes(dst))
        out[n] = dst
    staged.flush()
    return out


def _shareable(x, raw):
    """Whether read_torch on the CPU shares the bytes ``_read_for_torch(to_copy=True)``
    gave as ``x`` (``raw``: their span): writable, and each element aligned to its
    size, as torch's kernels assume."""
    lent = x[0] if isinstance(x, tuple) else x
    if not lent.flags.writeable:
        return False
    shape = x[2] if isinstance(x, tuple) else x.shape
    count = 1
    for d in shape:
        count *= d
    itemsize = raw.nbytes // count if count else 0
    return itemsize == 0 or raw.ctypes.data % itemsize == 0


def _dense_bytes(x):
    """What ``_read_for_torch`` gave, as ``(bytes, strides)`` when its elements fill
    their span with no gaps in some order of dimensions (row-major, Fortran order, a
    transposed tensor): a flat uint8 view of the span in memory order, and the element
    strides that lay it out (None: row-major bytes of a dtype numpy lacks). None for a
    view with gaps or overlaps."""
    if isinstance(x, tuple):  # strides None: row-major
        raw, _, shape, strides = x
        if strides is None or _staging.fills_span(shape, strides):
            return raw, strides
        return None
    if any(s < 0 or s % x.itemsize for s in x.strides):
        return None
    strides = tuple(s // x.itemsize for s in x.strides)
    if not _staging.fills_span(x.shape, strides):
        return None
    if x.flags.c_contiguous:
        return x.reshape(-1).view("uint8"), strides
    # Positive strides: the first element is the lowest address, where the span starts.
    from numpy.lib.stride_tricks import as_strided

    span = as_strided(x, (x.size,), (x.itemsize,), writeable=False)
    return span.view("uint8"), strides


_torch_module = None


def _torch_interop():
    """The torch interop module (importing it imports torch), loaded on first use and
    then kept: an import statement inside a per-tensor call costs a microsecond."""
    global _torch_module
    if _torch_module is None:
        from . import _torch

        _torch_module = _torch
    return _torch_module


def _is_ndarray(x):
    import numpy as np

    return isinstance(x, np.ndarray)


_STORAGE_NAMES = {
    "float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16",
    "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "uint64": "u64",
    "uint32": "u32", "uint16": "u16", "uint8": "u8", "bool": "bool",
}


def _logical_name(meta):
    """The tensorwire dtype name of a dense tensor from its metadata dict."""
    t = meta.get("type")
    known = {"f8_e4m3fn", "f8_e5m2", "f8_e4m3fnuz", "f8_e5m2fnuz", "complex64", "complex128"}
    if t in known:
        return t
    return _STORAGE_NAMES.get(meta["dtype"], meta["dtype"])
