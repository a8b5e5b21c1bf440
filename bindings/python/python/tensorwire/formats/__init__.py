"""The safetensors API over tensorwire (the ``tensorwire-formats`` crate).

Code written for the ``safetensors`` package works with the same names:
``tensorwire.formats.safe_open`` for ``safetensors.safe_open``, and the submodules
``tensorwire.formats.numpy`` and ``tensorwire.formats.torch`` for
``safetensors.numpy`` and ``safetensors.torch`` (``save``, ``save_file``, ``load``,
``load_file``, same signatures)::

    from tensorwire.formats import safe_open
    from tensorwire.formats.torch import load_file, save_file

    save_file({"w": w, "b": b}, "model.safetensors", metadata={"format": "pt"})
    with safe_open("model.safetensors", framework="pt") as f:
        f.metadata()                      # {"format": "pt"}
        w = f.get_tensor("w")             # zero-copy view of the map
        rows = f.get_slice("w")[:128]     # only the rows asked for
    state = load_file("model.safetensors", device="cuda:0")

This module's own ``save``/``save_file`` take numpy arrays and torch tensors mixed in
one dict, and its ``load``/``load_file`` take a ``framework``.

Files are byte-identical to the package's for the same tensors, with at most one
metadata entry (the package writes several in hash order, which changes from one
process to the next; tensorwire sorts them). ``safe_open``, ``load_file`` and
``load`` read every format tensorwire reads, not just safetensors (the format is
recognised by its magic bytes).

Differences from the ``safetensors`` package:

- Reads are zero-copy: ``get_tensor`` and ``load_file`` return views of a private
  copy-on-write map of the file (writable; writes never reach the file), and ``load``
  returns read-only numpy views of the bytes passed in (torch tensors, which cannot be
  read-only, are copies there). ``get_slice(name)[...]`` is a view too, copied only
  when moved to another ``device``.
- Non-contiguous inputs are written in C order, and tensors that share memory are
  written once each (the package refuses both).
- With torch, ``F8_E8M0`` and ``F4`` are ``float8_e8m0fnu`` and ``float4_e2m1fn_x2``
  (as the package gives them). numpy has no such dtypes built in (the package's
  numpy reader fails on them): there they, and ``F6_*`` everywhere, come back as
  their raw bytes (``uint8``, also where ``ml_dtypes`` has the type: a saved
  ``ml_dtypes.float8_e8m0fnu`` array reads back as its bytes);
  ``get_slice(name).get_dtype()`` names them, and saving those bytes again writes
  ``U8``. Over a PyTorch checkpoint,
  ``get_slice`` names float8_e8m0fnu ``F8_E8M0``, float4_e2m1fn_x2 ``F4`` (with the
  shape safetensors gives it) and complex32 ``"complex32"`` with torch's shape.
- Frameworks are ``"np"`` (``"numpy"``) and ``"pt"`` (``"torch"``).
- With numpy, every ``get_tensor`` of one name returns a view of the same bytes (the
  package gives a fresh array each time): an in-place change to one shows in the
  others. Use ``np.array(...)`` for a private copy.
- Slices follow numpy's indexing rules with numpy (negative bounds and steps,
  ``None``, lists, and ``True``/``False`` as masks, where the package reads a bool as
  the index 1) and torch's with torch.
- ``SafetensorError`` is ``tensorwire.TensorwireError``, the base of tensorwire's
  errors (a missing tensor is also a ``KeyError``, a bad argument a ``ValueError``,
  an I/O error an ``OSError``, which is not a ``TensorwireError``). A slice index out
  of range raises ``SliceIndexError``, both a ``SafetensorError`` (as the package
  raises) and the ``IndexError`` numpy and torch raise; a step of 0 or a bad index
  value an ``InvalidArgumentError`` (a ``ValueError``).
"""

from __future__ import annotations

import numpy as np

from .. import _native, _staging
from .._reader import Reader, _is_torch_tensor, _logical_name, _on_cpu, _torch_interop

TensorwireError = _native.TensorwireError
#: The package's error class: here, the base of tensorwire's errors.
SafetensorError = TensorwireError



class SliceIndexError(TensorwireError, IndexError):
    """An index out of a tensor's range in ``get_slice(name)[index]``: the package's
    ``SafetensorError``, and the ``IndexError`` of numpy's and torch's indexing."""


__all__ = ["safe_open", "save_file", "save", "load_file", "load", "numpy", "torch",
           "SafetensorError"]

# tensorwire dtype names -> safetensors dtype names.
_SAFETENSORS_NAMES = {
    "f64": "F64", "f32": "F32", "f16": "F16", "bf16": "BF16",
    "i64": "I64", "i32": "I32", "i16": "I16", "i8": "I8",
    "u64": "U64", "u32": "U32", "u16": "U16", "u8": "U8", "bool": "BOOL",
    "f8_e4m3fn": "F8_E4M3", "f8_e5m2": "F8_E5M2", "complex64": "C64",
    "f8_e4m3fnuz": "F8_E4M3FNUZ", "f8_e5m2fnuz": "F8_E5M2FNUZ",
}


def _framework(framework):
    if framework in ("np", "numpy"):
        return "np"
    if framework in ("pt", "torch"):
        return "pt"
    raise _native.InvalidArgumentError(
        f"framework {framework!r} is not supported: use 'np' or 'pt' (for the "
        "package's load_file(filename, device), use tensorwire.formats.torch.load_file)")


# The package's storage backends: "mmap" serves views of the mapped file, "pread"
# tensors of their own (here: copies read from the map).
_BACKENDS = ("mmap", "pread")


def _torch_device(device):
    """``device`` as torch takes it (an int is a CUDA device index, None the CPU), or
    an ``InvalidArgumentError`` (the package's ``SafetensorError``) at open, not
    torch's ``RuntimeError`` at the first read."""
    if device is None:
        return "cpu"
    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise _native.InvalidArgumentError(f"device index {device} is negative")
        return f"cuda:{device}"
    import torch

    try:
        torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise _native.InvalidArgumentError(f"invalid device {device!r}: {e}") from None
    return device


class _Loader:
    """Reads tensors of one reader for one framework, device and backend."""

    def __init__(self, reader, framework, device, backend="mmap"):
        self.reader = reader
        self.framework = _framework(framework)
        if backend not in _BACKENDS:
            raise _native.InvalidArgumentError(
                f"backend {backend!r} is not supported: use 'mmap' or 'pread'")
        # "pread": tensors that own their memory, as the package's pread gives them.
        self.copy = backend == "pread"
        if self.framework == "np":
            if not _on_cpu(device):
                raise _native.InvalidArgumentError(
                    f"numpy arrays live on the CPU, not on {device!r}")
            self.device = device
        else:
            self.device = _torch_device(device)

    def tensor(self, name):
        if self.framework == "np":
            return self.reader.read_numpy(name, copy=self.copy)
        # Over a caller's read-only buffer read_torch copies (torch has no read-only
        # tensors); over a file's private map it shares.
        return self.reader.read_torch(name, device=self.device, copy=self.copy)

    def from_view(self, view):
        """A slice of a CPU view in this framework, on this device (to a CUDA device
        through the pinned buffers, as whole tensors go); a copy for "pread"."""
        if self.framework == "np" or _on_cpu(self.device):
            if not self.copy:
                return view
            return view.copy() if self.framework == "np" else view.clone()
        return _staging.to_device(_torch_interop(), view, self.device)

    def whole(self, name):
        """The tensor as a CPU view (a slice of it is taken next)."""
        if self.framework == "np":
            return self.reader.read_numpy(name)
        return self.reader.read_torch(name)

    def all(self):
        """Every tensor, in the order their data lies in the file (as the package)."""
        names = self.reader._sorted_by_offset(self.reader.keys())
        if self.framework == "np":
            return self.reader.read_numpy(names, copy=self.copy)
        return self.reader.read_torch(names, device=self.device, copy=self.copy)


class safe_open:
    """``safetensors.safe_open``: a file opened for reading tensors one at a time.

    Args:
        filename: the file (any format tensorwire reads).
        framework: ``"np"`` for numpy arrays, ``"pt"`` for torch tensors.
        device: where torch tensors go (``"cpu"``, ``"cuda:0"``, ``0``, ...).
        backend: ``"mmap"`` (views of the mapped file) or ``"pread"`` (tensors that
            own their memory), as the package takes it.
    """

    _reader = None  # until the file is open (a repr of a failed open then works)

    def __init__(self, filename, framework="np", device="cpu", *, backend="mmap"):
        self._reader = Reader(filename)
        try:
            self._loader = _Loader(self._reader, framework, device, backend)
        except BaseException:
            self._reader.close()
            raise
        if self._loader.framework == "np" and not self._loader.copy:
            # A loader calls this once per tensor: skip the Python frames.
            self.get_tensor = self._reader.read_numpy

    def keys(self):
        """Tensor names, sorted."""
        return sorted(self._reader.keys())

    def offset_keys(self):
        """Tensor names in the order their data lies in the file."""
        return self._reader._sorted_by_offset(self._reader.keys())

    def metadata(self):
        """The file's string metadata (safetensors' ``__metadata__``), or None when
        the file has none."""
        attrs = self._reader.attributes
        if not attrs:
            return {} if self._reader._safetensors_has_metadata() else None
        return {k: v if isinstance(v, str) else str(v) for k, v in attrs.items()}

    def get_tensor(self, name):
        """The tensor, zero-copy on the CPU."""
        return self._loader.tensor(name)

    def get_tensors(self):
        """Every tensor as ``{name: tensor}``, in the order of ``offset_keys()``."""
        return self._loader.all()

    def get_slice(self, name):
        """A handle that reads part of the tensor: ``get_slice(name)[0:128, :]``."""
        meta = self._reader.metadata(name)
        return TensorSlice(self._loader, name, meta)

    def close(self):
        self._reader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"<tensorwire.formats.safe_open {self._reader!r}>"


class TensorSlice:
    """Part of one tensor, read on indexing (safetensors' ``PySafeSlice``)."""

    def __init__(self, loader, name, meta):
        self._loader = loader
        self._name = name
        self._meta = meta
        # A view taken now, while the file is open, keeps the map: the slice still
        # reads after the file is closed, as the package's slices do. Only for bytes
        # stored as they are (a compressed tensor is decoded when indexed).
        self._view = None
        if all(c.get("encoding", "raw") == "raw" for c in (meta.components or {}).values()):
            try:
                self._view = loader.whole(name)
            except TensorwireError:
                pass  # not a dense tensor: indexing raises what it raises
        # A raw type numpy reads as bytes: (name, logical shape), found now, while
        # the file is open.
        self._raw = None
        if isinstance(self._view, np.ndarray):
            dtype = self.get_dtype()
            if dtype in _RAW_TYPE_BITS:
                self._raw = (dtype, self.get_shape())

    def get_shape(self):
        """The shape the file gives (for ``F4``/``F6_*``/``F8_E8M0`` tensors, read as
        raw bytes, their logical shape, as the package reports it, also once converted
        to ``.zt``; for a PyTorch checkpoint's dtypes numpy lacks, torch's shape, with
        a float4_e2m1fn_x2 tensor's last dimension counting single values, as it has
        once converted to safetensors ``F4``)."""
        # A logical shape recorded in a `.zt` tensor's `safetensors.shape` is its
        # writer's word: taken only where it counts the tensor's bytes (the native
        # side checks), else the listed shape.
        named = self._named_type() or self._loader.reader._raw_safetensors_type(self._name)
        if named is not None:
            return list(named[1])
        return list(self._meta.shape)

    def get_dtype(self):
        """The safetensors dtype name (``"F32"``, ``"BF16"``, ...; a PyTorch
        checkpoint's complex32, which safetensors lacks, is ``"complex32"``)."""
        named = self._named_type() or self._loader.reader._raw_safetensors_type(self._name)
        if named is not None:
            return named[0]
        fmt = self._meta.format
        if fmt.startswith("safetensors:"):
            return fmt[len("safetensors:"):]
        name = _logical_name({"type": self._meta.type, "dtype": self._meta.dtype})
        return _SAFETENSORS_NAMES.get(name, name)

    def _named_type(self):
        """(safetensors name, logical shape) of a tensor read_torch names by a layout
        rather than a dtype, by read_torch's own rules: a .zt file's f8_e8m0 and
        f4_e2m1, a PyTorch checkpoint's float8_e8m0fnu, float4_e2m1fn_x2 and complex32
        (or such a layout a .zt tensor records, where it fits). None for any other
        tensor, safetensors' raw types included (their listing names them)."""
        try:
            layout, dims = self._loader.reader._dtype_and_shape(self._name)
        except TensorwireError:
            return None
        named = _LAYOUT_NAMES.get(layout)
        if named is None:
            return None
        dims = list(dims)
        if layout == "pytorch:float4_e2m1fn_x2" and dims:
            dims = _native.float4_pairs_as_values(dims)  # F4 counts single values
        return named, dims

    def __getitem__(self, index):
        whole = self._view if self._view is not None else self._loader.whole(self._name)
        if self._raw is not None:
            whole = self._by_logical_dims(whole, index)
        try:
            part = whole[index]
        except IndexError as e:
            raise SliceIndexError(f"{self._name}: {e}") from None
        except ValueError as e:  # a step of 0, an index value numpy or torch refuses
            raise _native.InvalidArgumentError(f"{self._name}: {e}") from None
        except RuntimeError as e:  # torch: a view its sizes cannot hold (a step over a
            # dimension of ~2**62 overflows its strides)
            raise _native.InvalidArgumentError(f"{self._name}: {e}") from None
        if isinstance(part, np.generic):
            # Every dimension taken by an int: numpy gives a scalar, the package (and
            # a trailing `...`) a 0-d array, a view like every other part.
            part = whole[(index if isinstance(index, tuple) else (index,)) + (Ellipsis,)]
        return self._loader.from_view(part)

    def __len__(self):
        shape = self.get_shape()
        if not shape:
            raise TypeError("len() of a 0-d tensor")
        return shape[0]

    def _by_logical_dims(self, whole, index):
        """``whole`` ready for ``index`` over :meth:`get_shape`'s dimensions. numpy
        reads a raw type (``F8_E8M0``, ``F4``, ``F6_*``) as its flat bytes: those of
        a one-byte type reshaped to the logical shape; those of a packed one to the
        leading dimensions and each last-dimension row's bytes, which ``index`` may
        then not reach into (``UnsupportedError``: torch has ``F4``'s dtype)."""
        dtype, shape = self._raw
        bits = _RAW_TYPE_BITS[dtype]
        if whole.ndim != 1 or whole.dtype != np.uint8:
            return whole
        if bits == 8:
            return whole.reshape(shape)
        lead = shape[:-1]
        if shape and (shape[-1] * bits) % 8 == 0:
            rows = whole.reshape(lead + [shape[-1] * bits // 8])
            parts = index if isinstance(index, tuple) else (index,)
            if len(parts) < len(shape) and not any(p is Ellipsis or p is None for p in parts):
                return rows
        raise _native.UnsupportedError(
            f"{self._name}: {dtype} packs {bits}-bit values into bytes, which numpy reads "
            f"as they are: its slices can take only the dimensions before the last, and "
            f"whole rows (read it whole with get_tensor, or slice it with framework='pt')")


# Bits per value of the safetensors types numpy reads as raw bytes.
_RAW_TYPE_BITS = {"F8_E8M0": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}

# Layouts read_torch names a tensor's type by (its dtype cannot) -> safetensors names
# (complex32 has none). Safetensors' own raw types are named by their listing
# (`Reader._raw_safetensors_type`).
_LAYOUT_NAMES = {
    "zt:f8_e8m0": "F8_E8M0",
    "zt:f4_e2m1": "F4",
    "pytorch:float8_e8m0fnu": "F8_E8M0",
    "pytorch:float4_e2m1fn_x2": "F4",
    "pytorch:complex32": "complex32",
}


def load_file(filename, framework="np", device="cpu", *, backend="mmap"):
    """Every tensor of a file as ``{name: tensor}``, in file order (zero-copy views of
    the map for numpy, and for torch on the CPU; with ``backend="pread"`` tensors of
    their own)."""
    with Reader(filename) as reader:
        return _Loader(reader, framework, device, backend).all()


def load(data, framework="np", device="cpu"):
    """Every tensor of a file held in memory (``bytes``, ``bytearray``, ``memoryview``,
    ``mmap``...) as ``{name: tensor}``: numpy arrays are read-only views of ``data``,
    which they keep alive; torch tensors are copies."""
    with Reader(buffer=data) as reader:
        return _Loader(reader, framework, device).all()


def _entries(tensors):
    if not isinstance(tensors, dict):
        raise TypeError("tensors must be a dict {name: array or tensor}")
    entries = []
    for name, value in tensors.items():
        if isinstance(value, np.ndarray) and value.dtype.name == "float8_e8m0fnu":
            # ml_dtypes' MX block scales: safetensors' F8_E8M0, one byte each.
            entries.append((name, value.view(np.uint8), "safetensors:F8_E8M0",
                            list(value.shape)))
        elif isinstance(value, np.ndarray):
            entries.append((name, value, None, None))
        elif _is_torch_tensor(value):
            raw, dtype, shape = _torch_interop().torch_to_bytes(value)
            entries.append((name, raw, dtype, list(shape)))
        else:
            entries.append((name, np.asarray(value), None, None))
    return entries


def save_file(tensors, filename, metadata=None):
    """Writes ``{name: array or tensor}`` as a safetensors file (atomically: under a
    temporary name, renamed into place once complete); returns its size in bytes."""
    return _native.safetensors_save(_entries(tensors), filename, metadata)


def save(tensors, metadata=None):
    """The safetensors file of ``{name: array or tensor}`` as ``bytes``."""
    return _native.safetensors_save(_entries(tensors), None, metadata)


from . import numpy, torch  # noqa: E402  (they use the names above)
