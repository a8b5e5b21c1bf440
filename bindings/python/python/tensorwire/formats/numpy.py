"""``safetensors.numpy`` over tensorwire: the same functions and signatures.

``from tensorwire.formats.numpy import load_file, save_file`` in place of
``from safetensors.numpy import load_file, save_file``. Files are the package's bytes;
``load_file`` returns zero-copy views of a private copy-on-write map (writable),
``load`` read-only views of the bytes given. See ``tensorwire.formats``.
"""

from __future__ import annotations

from . import load as _load
from . import load_file as _load_file
from . import save as _save
from . import save_file as _save_file

__all__ = ["save", "save_file", "load", "load_file"]


def save(tensor_dict, metadata=None):
    """The safetensors file of ``{name: numpy array}`` as ``bytes``."""
    return _save(tensor_dict, metadata)


def save_file(tensor_dict, filename, metadata=None):
    """Writes ``{name: numpy array}`` to ``filename`` (atomically)."""
    _save_file(tensor_dict, filename, metadata)


def load(data):
    """``{name: numpy array}`` from a file's bytes (read-only views of them)."""
    return _load(data, framework="np")


def load_file(filename, *, backend="mmap"):
    """``{name: numpy array}`` from a file, in file order (zero-copy views; arrays of
    their own with ``backend="pread"``)."""
    return _load_file(filename, framework="np", backend=backend)
