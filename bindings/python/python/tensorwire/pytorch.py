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

import collections
import os
import sys

from ._native import InvalidArgumentError, MalformedError, UnsafePickleError, UnsupportedError
from . import _staging
from ._reader import Reader, _on_cpu, _shared_torch, _torch_interop

__all__ = ["UnsafePickleError", "FORMATS", "MetaTensor", "open", "load", "load_numpy"]

#: The ``Reader.format`` values of PyTorch checkpoints.
FORMATS = ("pytorch-zip", "pytorch-legacy")


def open(f, *, limits=None):
    """A ``tensorwire.Reader`` over a PyTorch checkpoint.

    Args:
        f: a path (str or ``os.PathLike``), the file's bytes (``bytes``,
            ``bytearray``, ``memoryview``, ``mmap``: viewed, not copied), or a binary
            file object (read whole).
        limits: parser limits by name, as for ``tensorwire.Reader``
            (``{"max_depth": 100}`` for containers nested deeper than 64 levels).

    Raises:
        UnsupportedError: the file is another tensor format (use ``tensorwire.open``).
        FormatError: the file is damaged; ``UnsafePickleError`` when its pickle asks
            for anything outside the allowlist.
    """
    reader = _reader(f, limits)
    if reader.format not in FORMATS:
        fmt = reader.format
        reader.close()
        raise UnsupportedError(
            f"not a PyTorch checkpoint: a {fmt} file (tensorwire.open reads it)")
    return reader


def _reader(f, limits=None):
    if isinstance(f, (str, os.PathLike)):
        return Reader(f, limits=limits)
    return Reader(buffer=f.read() if hasattr(f, "read") else f, limits=limits)


def load(f, map_location=None, *, mmap=None, weights_only=None, flat=True, limits=None):
    """Every tensor of a checkpoint as ``{dotted name: torch tensor}``, in the order
    the checkpoint lists them (a checkpoint that is one bare tensor gives
    ``{"tensor": t}``, a list ``{"0": ..., "1": ...}``); with ``flat=False``, the
    object ``torch.load`` returns.

    Args:
        f: as for :func:`open`.
        map_location: as for ``torch.load``, except that ``None`` keeps tensors on the
            CPU (saved devices are not restored: nothing touches a GPU unless asked).
            ``"cpu"`` does the same; a device (``"cuda:0"``, ``torch.device(...)``)
            moves every storage there; a dict ``{saved location: device}``
            (``{"cuda:1": "cuda:0"}``) maps each storage's saved location, and one it
            does not list goes back there; a function ``f(storage, location)`` gets
            each storage once, as a CPU ``torch.UntypedStorage``, with its saved
            location (``"cuda:0"``), and returns the storage to use, or ``None`` for
            that saved location (``lambda storage, loc: storage`` keeps everything on
            the CPU). Tensors that share a storage in the checkpoint share the moved
            one. Storages sent to ``"meta"`` by a device or a dict are not read.
        mmap: ``None`` or ``True``: tensors share a private copy-on-write map of the
            file (zero-copy; writable, and writes never reach the file). ``False``,
            and always when ``f`` is bytes or a file object: each storage is copied
            once, and its tensors share the copy (a legacy file's unaligned storages
            are copied that way too). The file stays mapped while its tensors live
            (``torch.load`` copies it): to save back over the same path
            (``torch.save(sd, path)``), load with ``mmap=False`` or save to a new path
            and rename, or the process dies of SIGBUS and leaves the file truncated.
        weights_only: True or None (torch's default); False is refused, since
            tensorwire never runs pickled code.
        flat: False gives the checkpoint's own object, as ``torch.load`` builds it:
            dicts (``OrderedDict`` where saved so), lists, tuples, int keys, and the
            non-tensor values in place (an optimizer's ``state_dict()``, a training
            checkpoint's ``epoch``), with these tensors at their places.
        limits: parser limits by name, as for :func:`open`.

    Zero-copy tensors keep their strides (transposes, slices), and those that share a
    storage in the checkpoint share memory here, as with ``torch.load``. Quantized
    tensors (``torch.qint8``, ``quint8``, ``qint32``; per tensor or per channel) come
    back quantized, on their storage as well. Lazy conjugate and negative views
    (``z.conj()``, ``z.conj().imag`` saved as such) come back with their conjugate or
    negative bit set over the stored elements (``is_conj()``, ``is_neg()``), as with
    ``torch.load``. Sparse tensors (COO, CSR, CSC, BSR,
    BSC) come back sparse, on their indices and values, with their index values
    checked as ``torch.load`` checks them (``MalformedError`` names a bad one).
    Tensors saved on torch's meta device (a model never given its weights) come back
    there, as with ``torch.load``: with their dtype, shape and strides, and no data.
    """
    if weights_only is False:
        raise InvalidArgumentError(
            "weights_only=False would run pickled code; tensorwire never does")
    restore, device_of = _restore_location(map_location)
    with open(f, limits=limits) as reader:
        if restore is None and mmap is not False and _views_share_storages(reader):
            # Every tensor a view of the map, as fast as it gets: a tensor with a
            # storage to itself is a view of just its bytes, which is all of its
            # storage. Tensors that share a storage or cover part of one are set on
            # that whole storage, so their storages and offsets are torch's too, and
            # so are those whose bytes cannot be lent to torch (a re-zipped file's
            # deflated or unaligned records): on a copy of their storage, they keep
            # their strides and storage size (an expanded tensor its one element).
            tt = _torch_interop()
            partial = reader._pytorch_partial_storages() + reader._pytorch_unlendable()
            if partial:
                on_storages = _restored_tensors(reader, _keep, None, copy=False, only=set(partial))
                tensors = {name: on_storages[name] if name in on_storages
                           else _shared_torch(reader, tt, name) for name in reader.keys()}
            else:
                tensors = {name: _shared_torch(reader, tt, name) for name in reader.keys()}
        else:
            tensors = _restored_tensors(reader, restore or _keep, device_of, copy=mmap is False)
        same = reader._pytorch_same_objects()
        quantized = reader._pytorch_quantized()
        if quantized:
            _quantize(tensors, quantized, skip={name for name, _ in same})
        autograd = reader._pytorch_autograd()
        if autograd:
            _set_autograd(tensors, autograd, skip={name for name, _ in same})
        _same_objects_once(same, tensors)
        for name, scale, zero_point, axis in quantized:
            if axis is not None:  # per channel: parts of the tensor, not entries
                del tensors[scale], tensors[zero_point]
        sparse = reader._pytorch_sparse()
        if sparse:
            tensors = _sparse_in_place_of_parts(tensors, sparse, same)
        meta = reader._pytorch_meta()
        if meta:
            tensors = _with_meta_tensors(reader, tensors, meta, sparse, _torch_meta_tensors(meta))
        if flat:
            return tensors
        import torch

        return reader._pytorch_structure(tensors.__getitem__, _torch_object, torch)


MetaTensor = collections.namedtuple("MetaTensor", "dtype shape stride requires_grad parameter")
MetaTensor.__doc__ = """A tensor on torch's meta device, as :func:`load_numpy` gives it: it has a
dtype (torch's name, ``"float32"``), a shape and strides, but no data, so numpy has no
array for it (:func:`load` gives it as a torch meta tensor)."""


def _meta_objects(meta, make):
    """``make(dtype, shape, stride, requires_grad, parameter)`` for each meta tensor
    (``reader._pytorch_meta()``), once per pickled object: the names of a tied one
    share it, as with ``torch.load``."""
    built = []
    for _, dtype, shape, stride, requires_grad, parameter, _, same_as in meta:
        built.append(built[same_as] if same_as is not None else
                     make(dtype, shape, stride, requires_grad, parameter))
    return built


def _torch_meta_tensors(meta):
    """Each meta tensor as ``torch.load`` rebuilds it: on "meta" whatever
    ``map_location`` says, an ``nn.Parameter`` where pickled as one."""
    import torch

    def make(dtype, shape, stride, requires_grad, parameter):
        t = torch.empty_strided(shape, stride, dtype=_torch_object(dtype), device="meta")
        if parameter:
            return torch.nn.Parameter(t, requires_grad=requires_grad)
        return t.requires_grad_(True) if requires_grad else t

    return _meta_objects(meta, make)


def _numpy_meta_tensors(meta):
    """Each meta tensor as a :class:`MetaTensor`."""
    return _meta_objects(meta, lambda dtype, shape, stride, requires_grad, parameter:
                         MetaTensor(dtype.removeprefix("torch."), tuple(shape), tuple(stride),
                                    requires_grad, parameter))


def _with_meta_tensors(reader, tensors, meta, sparse, built):
    """``tensors`` (by name, in ``keys()`` order, sparse tensors at their first part)
    with the meta tensors ``built`` from ``meta`` (``reader._pytorch_meta()``) at their
    places in the checkpoint's order."""
    position = {name: at for at, name in enumerate(reader.keys())}
    for name, _, _, _, parts, _ in sparse:
        position[name] = position[parts[0]]
    out = {}
    pending = iter(zip(meta, built))
    entry = next(pending, None)
    for name, t in tensors.items():
        at = position.get(name, len(position))
        while entry is not None and entry[0][6] <= at:
            out[entry[0][0]] = entry[1]
            entry = next(pending, None)
        out[name] = t
    while entry is not None:
        out[entry[0][0]] = entry[1]
        entry = next(pending, None)
    return out


def _set_autograd(tensors, autograd, skip):
    """Sets ``requires_grad``, and makes an ``nn.Parameter`` of each tensor pickled as
    one, as ``torch.load`` does (``autograd``: ``reader._pytorch_autograd()``; the
    names in ``skip`` get the object of an earlier name afterwards)."""
    import torch

    for name, requires_grad, parameter in autograd:
        if name in skip:
            continue
        if parameter:
            tensors[name] = torch.nn.Parameter(tensors[name], requires_grad=requires_grad)
        else:
            tensors[name].requires_grad_(True)


def _torch_object(name):
    """The torch object a checkpoint names (``"torch.float16"``,
    ``"torch.cuda.FloatTensor"``). The names come from the reader's allowlist (torch's
    ``weights_only`` one: dtypes, quantization schemes, classes, rebuild functions),
    never from the file's text; those outside torch are Python's own classes
    (``"collections.OrderedDict"``, ``"builtins.set"``). A legacy storage class
    (``torch.FloatStorage``) is the ``torch.serialization.StorageType`` that
    ``torch.load(weights_only=True)`` gives in its place."""
    import torch

    if not name.startswith("torch."):
        import importlib

        module, _, attribute = name.rpartition(".")
        return getattr(importlib.import_module(module), attribute)
    obj = torch
    for part in name.split(".")[1:]:
        obj = getattr(obj, part)
    if obj in torch._storage_classes and obj not in (torch.storage.TypedStorage,
                                                     torch.storage.UntypedStorage):
        return torch.serialization.StorageType(obj.__name__)
    return obj


def _quantize(tensors, quantized, skip):
    """Replaces the integer tensor of each quantized tensor (``reader._pytorch_quantized()``,
    those not in ``skip``) by the quantized tensor over the same storage, as
    ``torch._utils._rebuild_qtensor`` builds it."""
    import torch

    qdtypes = {torch.int8: torch.qint8, torch.uint8: torch.quint8, torch.int32: torch.qint32}
    for name, scale, zero_point, axis in quantized:
        if name in skip:
            continue
        ints = tensors[name]
        qdtype = qdtypes[ints.dtype]
        _check_zero_points(torch, name, ints.dtype,
                           zero_point if axis is None else tensors[zero_point])
        if axis is None:
            q = torch._empty_affine_quantized(
                ints.size(), scale=scale, zero_point=zero_point, dtype=qdtype, device=ints.device)
        else:  # the zero points' dtype picks per_channel_affine or its float_qparams form
            q = torch._empty_per_channel_affine_quantized(
                ints.size(), scales=tensors[scale], zero_points=tensors[zero_point], axis=axis,
                dtype=qdtype, device=ints.device)
        tensors[name] = q.set_(ints.untyped_storage(), ints.storage_offset(), ints.size(), ints.stride())


def _check_zero_points(torch, name, int_dtype, zero_points):
    """A ``MalformedError`` for a zero point outside the range of the quantized
    tensor's integers (``int_dtype``): torch builds such a tensor, but every
    ``dequantize`` of it raises (``torch.quantize_per_*`` never makes one). Float zero
    points (``per_channel_affine_float_qparams``) and those on "meta" (no values) are
    not checked."""
    if isinstance(zero_points, torch.Tensor):
        if (zero_points.is_floating_point() or zero_points.device.type == "meta"
                or not zero_points.numel()):
            return
        low, high = int(zero_points.min()), int(zero_points.max())
    else:
        low = high = int(zero_points)
    info = torch.iinfo(int_dtype)
    if low < info.min or high > info.max:
        bad = low if low < info.min else high
        raise MalformedError(
            f"quantized tensor `{name}`: zero point {bad} is outside the range of its "
            f"{str(int_dtype).removeprefix('torch.')} values [{info.min}, {info.max}]")


def _sparse_in_place_of_parts(tensors, sparse, same):
    """``tensors`` with each sparse tensor (``reader._pytorch_sparse()``) built on its
    parts, as ``torch._utils._rebuild_sparse_tensor`` builds it, under its own name in
    place of its parts. The index values are checked as ``torch.load`` checks them
    (``check_invariants``; a bad one is a ``MalformedError`` naming the tensor), except
    on "meta", where there are no values to check or to misread: there it is built
    unchecked, as torch 2.11's ``torch.load`` builds it (torch 2.15's refuses sparse
    tensors on "meta"); a sparse tensor pickled under two names is one object."""
    import torch

    first_of = dict(same)  # a part -> the same object's first name
    built = {}
    at_first_part = {}
    for name, layout, size, is_coalesced, parts, parameter in sparse:
        key = tuple(first_of.get(p, p) for p in parts)
        if key not in built:
            try:
                built[key] = _sparse_tensor(torch, _torch_object(layout), size, is_coalesced,
                                            [tensors[p] for p in parts])
            except NotImplementedError:
                raise  # a RuntimeError too, but torch's own limit, not a bad index
            except RuntimeError as e:  # torch's index checks
                raise MalformedError(f"sparse tensor `{name}`: {e}") from e
            if parameter is not None:  # pickled as an nn.Parameter
                built[key] = torch.nn.Parameter(built[key], requires_grad=parameter)
        at_first_part[parts[0]] = (name, built[key])
    parts = {p for _, _, _, _, names, _ in sparse for p in names}
    out = {}
    for name, t in tensors.items():
        if name in at_first_part:
            owner, s = at_first_part[name]
            out[owner] = s
        elif name not in parts:
            out[name] = t
    return out


def _sparse_tensor(torch, layout, size, is_coalesced, parts):
    # Index values are checked where they exist; "meta" parts have none.
    checked = not any(p.device.type == "meta" for p in parts)
    if layout == torch.sparse_coo:
        indices, values = parts
        return torch.sparse_coo_tensor(indices, values, size, check_invariants=checked,
                                       is_coalesced=is_coalesced)
    compressed, plain, values = parts
    return torch.sparse_compressed_tensor(compressed, plain, values, size, layout=layout,
                                          check_invariants=checked)


def _same_objects_once(same, values):
    """One object under every name of a tensor the checkpoint pickled once
    (``{"embed": t, "lm_head": t}``), as ``torch.load`` gives it; ``same`` is
    ``reader._pytorch_same_objects()``."""
    for name, first in same:
        values[name] = values[first]


def _views_share_storages(reader):
    """Whether zero-copy views of each tensor share what their storages share: a
    mapped ZIP checkpoint (aligned records). A buffer's bytes and a legacy file's
    unaligned storages are copied tensor by tensor for torch, so those go storage by
    storage instead."""
    return reader.path is not None and reader.format == "pytorch-zip"


def _keep(storage, location):
    return storage


def _restore_location(map_location):
    """``torch.load``'s ``restore_location(storage, saved location)`` for a
    ``map_location`` (None when every tensor stays on the CPU as read), and a function
    naming the device a storage saved at a location goes to, where that is known
    before the storage is read (None for a ``map_location`` function)."""
    if map_location is None:
        return None, None
    if isinstance(map_location, dict):
        devices = {str(k): str(v) for k, v in map_location.items()}

        def device_of(saved):
            return devices.get(saved, saved)
    elif isinstance(map_location, str) or not callable(map_location):
        torch = sys.modules.get("torch")  # not imported: no torch.device exists either
        if not isinstance(map_location, str) and (
                torch is None or not isinstance(map_location, torch.device)):
            raise InvalidArgumentError(
                f"map_location must be a device (str or torch.device), a dict of them "
                f"or a function, not {map_location!r}")
        if _on_cpu(map_location):
            return None, None
        device = str(map_location)

        def device_of(saved):
            return device
    else:
        def restore(storage, saved):
            moved = map_location(storage, saved)
            return _default_restore(storage, saved) if moved is None else moved

        return restore, None
    return lambda storage, saved: _default_restore(storage, device_of(saved)), device_of


def _default_restore(storage, location):
    from torch.serialization import default_restore_location

    return default_restore_location(storage, location)


def _restored_tensors(reader, restore, device_of, copy, only=None):
    """``{name: torch tensor}``, each storage passed once through ``restore`` (a
    zero-copy view of the map unless ``copy``, or unless the bytes cannot be lent to
    torch) and its tensors set on the result, as ``torch.load`` rebuilds them: legacy
    storage views are slices of their restored root storage. A storage that
    ``device_of`` sends to the "meta" device is not read (it holds no data there);
    those it sends to a CUDA device are copied there together, through reused
    pinned buffers (``_staging``), rather than one by one by ``restore``.
    ``only`` (a set of names) limits it to those tensors."""
    tt = _torch_interop()
    torch = tt.torch
    restored = {}
    views = {}
    on_storages = tt.StorageViews()
    tensors = {}
    # Lazy views are among the partial ones: only those need their attributes read.
    lazy = _lazy_signs(reader, only if only is not None else reader._pytorch_partial_storages())
    to_cuda = {}  # device_of's answer -> the CUDA device it names, or None
    staged = _staging.Batches(torch)  # the storages bound for a CUDA device
    for name, (key, nbytes, saved, view, offset, strides) in zip(
            reader.keys(), reader._pytorch_storages()):
        if only is not None and name not in only:
            continue
        storage = restored.get(key)
        where = None if storage is not None or device_of is None else device_of(saved)
        if where is not None and where not in to_cuda:
            to_cuda[where] = _staging.cuda_device(torch, where)
        if where == "meta":
            storage = restored[key] = torch.UntypedStorage(nbytes, device="meta")
        elif where is not None and to_cuda[where] is not None:
            # Rather than torch's restore, which copies each storage on its own
            # (from pageable memory, on one thread): one staged copy of them all.
            host = reader._pytorch_storage(name, False, to_copy=True)
            device_bytes = torch.empty(host.nbytes, dtype=torch.uint8, device=to_cuda[where])
            staged.add(host, device_bytes)
            storage = restored[key] = device_bytes.untyped_storage()
        elif storage is None:
            raw = tt.from_numpy(reader._pytorch_storage(name, copy)).untyped_storage()
            storage = restore(raw, saved)
            if isinstance(storage, torch.TypedStorage):
                storage = storage.untyped()
            if not isinstance(storage, torch.UntypedStorage):
                raise InvalidArgumentError(
                    f"map_location returned {type(storage).__name__} for storage "
                    f"`{key}`, not a torch storage")
            restored[key] = storage
        if view is not None:
            storage = views.get((key, view))
            if storage is None:
                storage = views[(key, view)] = restored[key][view[0]:view[1]]
        dtype, shape = tt.torch_type(*reader._dtype_and_shape(name))
        tensors[name] = on_storages.view(storage, dtype, offset, shape, strides)
        if name in lazy:  # its bits, on the stored elements, as torch.load sets them
            torch._utils.set_tensor_metadata(tensors[name], lazy[name])
    staged.flush()
    return tensors


#: torch's tensor metadata keys (``torch._utils.get_tensor_metadata``) and the
#: per-tensor attributes that say a checkpoint's tensor has those bits.
_SIGN_BITS = (("conj", "torch.is_conj"), ("neg", "torch.is_neg"))


def _lazy_signs(reader, names):
    """``{name: torch's tensor metadata}`` (``{"conj": True}``, ``{"neg": True}`` or
    both) for the lazy conjugate and negative views among ``names``: tensors torch
    keeps with their conjugate or negative bit set over the stored elements (``z.conj()``,
    ``z.conj().imag``), which ``reader._pytorch_partial_storages()`` lists."""
    out = {}
    for name in names:
        attributes = reader._metadata(name)["attributes"]
        bits = {bit: True for bit, attribute in _SIGN_BITS if attributes.get(attribute)}
        if bits:
            out[name] = bits
    return out


def load_numpy(f, *, mmap=True, flat=True, limits=None):
    """Every tensor of a checkpoint as ``{dotted name: numpy array}`` (no torch
    needed): views of a private copy-on-write map of the file (writable), or
    read-only views when ``f`` is bytes. ``mmap=False`` gives arrays that own their
    memory. ``flat=False`` gives the checkpoint's own object, as for :func:`load`.

    numpy has no quantized arrays: a quantized tensor comes as its integers (torch's
    ``int_repr()``), a per-channel one with its scales and zero points under
    ``<name>.q_per_channel_scales`` and ``<name>.q_per_channel_zero_points`` (flat
    only); the scheme and a per-tensor scale and zero point are the tensor's
    attributes (``Reader.metadata(name).attributes``: ``torch.qscheme``,
    ``torch.q_scale``, ``torch.q_zero_point``).

    Nor sparse arrays: a sparse tensor comes as its parts, named after the torch
    methods that return them (``adj.indices`` and ``adj.values``; ``m.crow_indices``,
    ``m.col_indices`` and ``m.values``), each with the attributes ``torch.layout``,
    ``torch.size`` and, for COO, ``torch.is_coalesced``; with ``flat=False``, a dict
    of those parts and ``layout``, ``size`` (and ``is_coalesced``) in its place.

    A lazy conjugate or negative view (``z.conj()`` saved as such; the attributes
    ``torch.is_conj``, ``torch.is_neg``) comes as a copy holding its values: numpy has
    no such bits.

    A tensor saved on torch's meta device has no data: it comes as a
    :class:`MetaTensor` (dtype, shape, stride, requires_grad, parameter) at its
    place. ``limits``: parser limits by name, as for :func:`open`."""
    with open(f, limits=limits) as reader:
        names = reader.keys()
        same = reader._pytorch_same_objects()
        if same:
            # A tensor pickled under several names is read (or copied) once.
            again = {name for name, _ in same}
            got = reader.read_numpy([n for n in names if n not in again], copy=not mmap)
            _same_objects_once(same, got)
        else:
            got = reader.read_numpy(names, copy=not mmap)
        meta = reader._pytorch_meta()
        if not flat:
            for name, layout, size, is_coalesced, parts, _ in reader._pytorch_sparse():
                got[name] = {"layout": layout, "size": tuple(size),
                             **({} if is_coalesced is None else {"is_coalesced": is_coalesced}),
                             **{p.rsplit(".", 1)[-1]: got[p] for p in parts}}
            for entry, m in zip(meta, _numpy_meta_tensors(meta)):
                got[entry[0]] = m
            return reader._pytorch_structure(got.__getitem__, str)  # torch objects by name
        ordered = {name: got[name] for name in names}
        if meta:
            ordered = _with_meta_tensors(reader, ordered, meta, [], _numpy_meta_tensors(meta))
        return ordered
