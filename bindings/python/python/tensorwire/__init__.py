"""tensorwire: zero-copy, safe tensor I/O.

Read tensor files as numpy arrays that view the file's memory, or as torch tensors:
.zt (ztensor 1.x, 2.x and 0.1), safetensors, GGUF, NPY/NPZ, tenso packets and PyTorch
checkpoints (read safely, with no pickle code run), recognised by their magic bytes.
Write .zt files ztensor 1.2.3 (or, with ``version=2``, ztensor 2.x) reads; ``convert(src, dst)`` writes .zt or safetensors. The API follows
ztensor 1.x::

    import tensorwire
    with tensorwire.Writer("model.zt") as w:
        w.write_numpy("weight", arr, compress=True, checksum="crc32c")
    with tensorwire.open("model.zt") as r:
        weight = r["weight"]              # zero-copy numpy array
        state = r.read_numpy(r.keys())    # {name: array}, file-offset order

Tensor packets (the tenso wire format, with tenso's API) are in ``tensorwire.packet``;
``tensorwire.shm.SharedTensor`` (tenso's ``TensoShm`` API) keeps one in named shared
memory for other processes to read zero-copy, and ``tensorwire.cache.TensorCache``
(tenso's ``TensoCache`` API) is a multi-process shared-memory cache of them (LRU,
TTL, zero-copy gets that stay valid while held). ``tensorwire.ipc`` shares tensors
(CUDA or CPU) and torch modules between processes over a Unix socket, zero-copy.
``tensorwire.formats`` has the ``safetensors`` API (``safe_open``, ``save_file``,
``load_file``...), and ``tensorwire.pytorch.load`` stands in for
``torch.load(weights_only=True, mmap=True)``.

Errors derive from ``TensorwireError`` (``TensorNotFoundError`` is also a KeyError,
``InvalidArgumentError`` a ValueError); I/O errors are OSError.
"""

import types

from ._native import (
    BadMagicError,
    BytesOwner,
    ChecksumError,
    ClosedError,
    DecodeError,
    DuplicateNameError,
    FormatError,
    InvalidArgumentError,
    LimitExceededError,
    MalformedError,
    TensorNotFoundError,
    TensorwireError,
    TruncatedError,
    UnsafePickleError,
    UnsupportedError,
    __version__,
    convert,
    default_limits as _default_limits,
)
from ._reader import Reader

#: ztensor's error class: here, the base of tensorwire's errors.
ZTensorError = TensorwireError
from ._types import Tensor, TensorMetadata
from ._writer import Writer
from . import cache, formats, ipc, packet, pytorch, shm


def open(path, *, limits=None):
    """Open a tensor file for reading (the format is recognised by its magic bytes).

    ``limits`` raises or lowers the parser limits by name (see ``DEFAULT_LIMITS``):
    ``open(path, limits={"max_depth": 100})``."""
    return Reader(path, limits=limits)


#: The parser limits every reader applies unless given ``limits={name: int}``:
#: the largest header or manifest (``max_metadata_bytes``), the most tensors
#: (``max_tensors``), dimensions of one tensor (``max_ndim``, 64 at most), bytes of a
#: name (``max_name_bytes``), bytes one tensor decodes to (``max_decoded_bytes``) and
#: levels of nested containers or attribute values (``max_depth``, 128 at most).
DEFAULT_LIMITS = types.MappingProxyType(_default_limits())


__all__ = [
    "BadMagicError",
    "BytesOwner",
    "ChecksumError",
    "ClosedError",
    "DEFAULT_LIMITS",
    "DecodeError",
    "DuplicateNameError",
    "FormatError",
    "InvalidArgumentError",
    "LimitExceededError",
    "MalformedError",
    "Reader",
    "Tensor",
    "TensorMetadata",
    "TensorNotFoundError",
    "TensorwireError",
    "TruncatedError",
    "UnsafePickleError",
    "UnsupportedError",
    "Writer",
    "ZTensorError",
    "__version__",
    "convert",
    "open",
    "packet",
    "cache",
    "formats",
    "ipc",
    "pytorch",
    "shm",
]
