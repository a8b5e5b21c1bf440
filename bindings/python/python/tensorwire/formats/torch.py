"""``safetensors.torch`` over tensorwire: the same functions and signatures
(``save``, ``save_file``, ``load``, ``load_file``, ``save_model``, ``load_model``).

``from tensorwire.formats.torch import load_file, save_file`` in place of
``from safetensors.torch import load_file, save_file``. Files are the package's bytes;
``load_file`` on the CPU returns tensors that share a private copy-on-write map of
the file (writable, writes never reach the file). See ``tensorwire.formats``.
"""

from __future__ import annotations

from .. import _native
from . import load as _load
from . import load_file as _load_file
from . import save as _save
from . import save_file as _save_file

__all__ = ["save", "save_file", "load", "load_file", "save_model", "load_model",
           "SharedTensorsError"]


def _check_torch_tensors(tensors):
    """The package's checks before writing: a dict of torch tensors, dense ones (each
    a ``ValueError``, worded as the package words them)."""
    import torch

    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    sparse = []
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"Key `{name}` is invalid, expected torch.Tensor but received {type(value)}")
        if value.layout != torch.strided:
            sparse.append(name)
    if sparse:
        raise ValueError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does "
            "not support. You can make it a dense tensor before saving with `.to_dense()` "
            "but be aware this might make a much larger file than needed.")


def save(tensors, metadata=None):
    """The safetensors file of ``{name: torch tensor}`` as ``bytes``."""
    _check_torch_tensors(tensors)
    return _save(tensors, metadata)


def save_file(tensors, filename, metadata=None):
    """Writes ``{name: torch tensor}`` to ``filename`` (atomically)."""
    _check_torch_tensors(tensors)
    _save_file(tensors, filename, metadata)


def load(data):
    """``{name: torch tensor}`` from a file's bytes (copies: torch has no read-only
    tensors)."""
    return _load(data, framework="pt")


def load_file(filename, device="cpu", *, backend="mmap"):
    """``{name: torch tensor}`` from a file, in file order, on ``device`` (zero-copy
    on the CPU; tensors of their own with ``backend="pread"``). ``device`` may be an
    int (a CUDA device index), as in the package."""
    return _load_file(filename, framework="pt", device=device, backend=backend)


class SharedTensorsError(_native.InvalidArgumentError, RuntimeError):
    """Tensors share memory and none of them holds all of it (a RuntimeError too, as
    the package raises)."""


def _covers_its_storage(t):
    """True when the tensor spans its whole storage (in any layout)."""
    storage = t.untyped_storage()
    return (t.data_ptr() == storage.data_ptr()
            and t.nelement() * t.element_size() == storage.nbytes())


def _tied_names(state_dict, preferred=()):
    """``{kept name: [other names]}`` for the tensors of ``state_dict`` that share
    memory. The kept name is one whose tensor spans the whole memory: the first in
    sorted order, looked for among ``preferred`` names before the others, and among
    contiguous tensors before strided ones (a transposed tie is written in C order)."""
    groups = {}
    for name, t in state_dict.items():
        if t.device.type == "meta" or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        groups.setdefault((t.device, storage.data_ptr(), storage.nbytes()), []).append(name)
    tied = {}
    for names in groups.values():
        if len(names) < 2:
            continue
        whole = sorted(n for n in names if _covers_its_storage(state_dict[n]))
        if not whole:
            raise SharedTensorsError(
                f"tensors {sorted(names)} share memory and none of them spans all of it: "
                "save a tensor that holds all of it, or copy them apart")
        contiguous = [n for n in whole if state_dict[n].is_contiguous()]
        for candidates in ([n for n in contiguous if n in preferred],
                           [n for n in whole if n in preferred], contiguous, whole):
            if candidates:
                kept = candidates[0]
                break
        tied[kept] = [n for n in sorted(names) if n != kept]
    return tied


def save_model(model, filename, metadata=None, force_contiguous=False):
    """Saves ``model.state_dict()`` with each set of tied tensors (sharing memory, as
    an embedding and an output layer often do) stored once, under the first of their
    names in sorted order that holds all the memory (a contiguous one if any); the
    metadata maps every name left out to it. Memory that no tensor holds whole raises
    ``SharedTensorsError``. ``force_contiguous`` is accepted for the package's
    signature: tensors are always written in C order."""
    del force_contiguous
    state = dict(model.state_dict())
    metadata = dict(metadata) if metadata is not None else None
    for kept, others in _tied_names(state).items():
        for name in others:
            if metadata is None:
                metadata = {}
            metadata.setdefault(name, kept)
            del state[name]
    save_file(state, filename, metadata)


def load_model(model, filename, strict=True, device="cpu", *, backend="mmap"):
    """Loads a file ``save_model`` wrote (or any file of the model's tensors) into
    ``model``; tied tensors the file holds once are filled through the one it has.

    Returns ``(missing, unexpected)``: names of the model the file lacks (a set) and
    names in the file the model lacks (a list). With ``strict``, either raises a
    RuntimeError, as ``model.load_state_dict`` does."""
    state = load_file(filename, device=device, backend=backend)
    tied = _tied_names(model.state_dict(), preferred=state)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing, unexpected = set(missing), list(unexpected)
    for others in tied.values():
        for name in others:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        lines = []
        if missing:
            lines.append("Missing key(s) in state_dict: "
                         + ", ".join(f'"{k}"' for k in sorted(missing)))
        if unexpected:
            lines.append("Unexpected key(s) in state_dict: "
                         + ", ".join(f'"{k}"' for k in sorted(unexpected)))
        raise RuntimeError(f"Error(s) in loading state_dict for {type(model).__name__}:\n    "
                           + "\n    ".join(lines))
    return missing, unexpected
