"""``safetensors.torch`` over tensorwire: the same functions and signatures.

``from tensorwire.formats.torch import load_file, save_file`` in place of
``from safetensors.torch import load_file, save_file``. Files are the package's bytes;
``load_file`` on the CPU returns tensors that share a private copy-on-write map of
the file (writable, writes never reach the file). See ``tensorwire.formats``.
"""

from __future__ import annotations

from . import load as _load
from . import load_file as _load_file
from . import save as _save
from . import save_file as _save_file

__all__ = ["save", "save_file", "load", "load_file"]


def save(tensors, metadata=None):
    """The safetensors file of ``{name: torch tensor}`` as ``bytes``."""
    return _save(tensors, metadata)


def save_file(tensors, filename, metadata=None):
    """Writes ``{name: torch tensor}`` to ``filename`` (atomically)."""
    _save_file(tensors, filename, metadata)


def load(data):
    """``{name: torch tensor}`` from a file's bytes (copies: torch has no read-only
    tensors)."""
    return _load(data, framework="pt")


def load_file(filename, device="cpu"):
    """``{name: torch tensor}`` from a file, in file order, on ``device`` (zero-copy
    on the CPU). ``device`` may be an int (a CUDA device index), as in the package."""
    if isinstance(device, int):
        device = f"cuda:{device}"
    return _load_file(filename, framework="pt", device=device)
