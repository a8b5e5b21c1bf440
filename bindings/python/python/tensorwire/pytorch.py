"""PyTorch checkpoints read with no pickle code run (the ``tensorwire-pytorch`` crate).

``load`` stands in for ``torch.load(f, weights_only=True, mmap=True)`` on the files
``torch.save`` writes (``.pt``, ``.pth``, ``.bin``; ZIP and legacy formats)::

    from tensorwire import pytorch

    state = pytorch.load("model.pt")                # {name: torch tensor}, zero-copy
    model.load_state_dict(state)
    arrays = pytorch.load_numpy("model.pt")         # the same as numpy, no torch needed
    with pytorch.open("model.pt") as r:             # a tensorwire.Reader
        epoch = r.attributes.get("epoch")

The pickle runs on a machine that only builds values: a global outside torch's
tensor-rebuild allowlist raises ``UnsafePickleError`` before anything runs (torch's
``weights_only=True`` rule). Nested containers come back flat, under dotted names
(``{"model": {"fc.weight": w}}`` gives ``"model.fc.weight"``); non-tensor values
(``epoch``, optimizer hyperparameters...) are the reader's ``attributes``.
Layout and checks: ``docs/formats/pytorch.md``.
"""

from __future__ import annotations

import os

from ._native import InvalidArgumentError, UnsafePickleError, UnsupportedError
from ._reader import Reader, _on_cpu, _shared_torch, _torch_interop

__all__ = ["UnsafePickleError", "FORMATS", "open", "load", "load_numpy"]

#: The ``Reader.format`` values of PyTorch checkpoints.
FORMATS = ("pytorch-zip", "pytorch-legacy")


def open(f):
    """A ``tensorwire.Reader`` over a PyTorch checkpoint.

    Args:
        f: a path (str or ``os.PathLike``), the file's bytes (``bytes``,
            ``bytearray``, ``memoryview``, ``mmap``: viewed, not copied), or a binary
            file object (read whole).

    Raises:
        UnsupportedError: the file is another tensor format (use ``tensorwire.open``).
        FormatError: the file is damaged; ``UnsafePickleError`` when its pickle asks
            for anything outside the allowlist.
    """
    reader = _reader(f)
    if reader.format not in FORMATS:
        fmt = reader.format
        reader.close()
        raise UnsupportedError(
            f"not a PyTorch checkpoint: a {fmt} file (tensorwire.open reads it)")
    return reader


def _reader(f):
    if isinstance(f, (str, os.PathLike)):
        return Reader(f)
    return Reader(buffer=f.read() if hasattr(f, "read") else f)


def load(f, map_location=None, *, mmap=None, weights_only=None, flat=True):
    """Every tensor of a checkpoint as ``{dotted name: torch tensor}``, in the order
    the checkpoint lists them (a checkpoint that is one bare tensor gives
    ``{"tensor": t}``, a list ``{"0": ..., "1": ...}``); with ``flat=False``, the
    object ``torch.load`` returns.

    Args:
        f: as for :func:`open`.
        map_location: ``None`` or ``"cpu"`` keeps tensors on the CPU; a device
            (``"cuda:0"``, ``torch.device(...)``) moves every tensor there; a dict
            ``{saved location: device}`` (``{"cuda:1": "cuda:0"}``) maps each
            tensor's saved location, and one it does not list goes back there, as
            with torch (tensors that shared a storage are moved one by one, so they
            no longer share it). Without a dict saved devices are not restored:
            nothing touches a GPU unless asked. A function (which torch also takes)
            is refused.
        mmap: ``None`` or ``True``: tensors share a private copy-on-write map of the
            file (zero-copy; writable, and writes never reach the file). ``False``,
            and always when ``f`` is bytes or a file object: every tensor owns its
            memory (tensors that shared a storage become separate copies).
        weights_only: True or None (torch's default); False is refused, since
            tensorwire never runs pickled code.
        flat: False gives the checkpoint's own object, as ``torch.load`` builds it:
            dicts (``OrderedDict`` where saved so), lists, tuples, int keys, and the
            non-tensor values in place (an optimizer's ``state_dict()``, a training
            checkpoint's ``epoch``), with these tensors at their places.

    Zero-copy tensors keep their strides (transposes, slices), and those that share a
    storage in the checkpoint share memory here, as with ``torch.load``.
    """
    if weights_only is False:
        raise InvalidArgumentError(
            "weights_only=False would run pickled code; tensorwire never does")
    if isinstance(map_location, dict):
        devices = {str(k): v for k, v in map_location.items()}
    elif map_location is None or isinstance(map_location, str) or hasattr(map_location, "type"):
        devices = None
    else:
        raise InvalidArgumentError(
            f"map_location must be a device (str or torch.device) or a dict of them, "
            f"not {map_location!r}")
    device = "cpu" if map_location is None or devices is not None else map_location
    with open(f) as reader:
        tensors = _torch_tensors(reader, device, mmap)
        if devices:
            _move_by_location(reader, tensors, devices)
        if flat:
            return tensors
        import torch

        return reader._pytorch_structure(
            tensors.__getitem__, lambda name: getattr(torch, name[len("torch."):]))


def _move_by_location(reader, tensors, devices):
    """Moves each tensor to ``devices[its saved location]``, or back to that location
    when ``devices`` does not list it (torch's dict ``map_location``)."""
    for (name, t), saved in zip(list(tensors.items()), reader._pytorch_locations()):
        target = devices.get(saved, saved)
        if str(target) != "cpu":
            tensors[name] = t.to(target)


def _torch_tensors(reader, device, mmap):
    """``{name: torch tensor}`` of an open checkpoint, in the checkpoint's order."""
    names = reader.keys()
    if mmap is not False and _on_cpu(device):
        # Zero-copy on the CPU reads nothing, so no file order to follow: straight
        # from the shared views (over a caller's read-only bytes these are copies:
        # torch has no read-only tensors).
        tt = _torch_interop()
        return {name: _shared_torch(reader, tt, name) for name in names}
    got = reader.read_torch(names, copy=mmap is False, device=device)
    return {name: got[name] for name in names}


def load_numpy(f, *, mmap=True, flat=True):
    """Every tensor of a checkpoint as ``{dotted name: numpy array}`` (no torch
    needed): views of a private copy-on-write map of the file (writable), or
    read-only views when ``f`` is bytes. ``mmap=False`` gives arrays that own their
    memory. ``flat=False`` gives the checkpoint's own object, as for :func:`load`."""
    with open(f) as reader:
        names = reader.keys()
        got = reader.read_numpy(names, copy=not mmap)
        if not flat:
            return reader._pytorch_structure(got.__getitem__, str)  # dtypes by name
        return {name: got[name] for name in names}
