"""Python values <-> tensorwire.ipc payloads (trees of plain values + tensor tables).

Nothing is pickled. A value is walked once: numpy arrays and torch tensors become
tensor leaves (CPU storages are copied into shared memory once, unless they already
live there; CUDA storages are exported as IPC handles of their allocation),
``torch.nn.Module`` objects become a structure description (class path, plain
attributes, parameters, buffers, children), and containers and scalars stay as they
are. Tensors that share a storage share it on the other side too (tied weights), and
the same tensor or Parameter object met twice comes back as one object.
"""

from __future__ import annotations

import importlib
import sys
import threading
import weakref

import numpy as np

from . import _native

MODULE_TAG = "torch.nn.Module"

# Module attributes every nn.Module gets from Module.__init__ (hooks, bookkeeping):
# recreated on the receiving side, never sent.
_MODULE_INTERNALS = None


def _torch():
    return sys.modules.get("torch")


# The CUDA storages this process has shared, by (device index, data_ptr): weak
# references, so that memory a peer sends back (an echo, or a tensor it got from us) is
# rebuilt on the storage that owns it here, which keeps it alive. Dead entries are
# pruned when the table has doubled since the last pruning.
_EXPORTED_CUDA = {}
_EXPORTED_CUDA_LOCK = threading.Lock()
_EXPORTED_CUDA_PRUNE_AT = [1024]


def _remember_cuda_storage(device_index, storage):
    key = (device_index, storage.data_ptr())
    with _EXPORTED_CUDA_LOCK:
        known = _EXPORTED_CUDA.get(key)
        if known is not None and known() is storage:
            return
        if len(_EXPORTED_CUDA) >= _EXPORTED_CUDA_PRUNE_AT[0]:
            for dead in [k for k, ref in _EXPORTED_CUDA.items() if ref() is None]:
                del _EXPORTED_CUDA[dead]
            _EXPORTED_CUDA_PRUNE_AT[0] = max(1024, 2 * len(_EXPORTED_CUDA))
        _EXPORTED_CUDA[key] = weakref.ref(storage)


def _owning_cuda_storage(device_index, ptr, nbytes):
    """``(storage, ptr - its data_ptr)`` for the live storage of this process holding
    ``[ptr, ptr + nbytes)``, or None. A storage sent back whole (the usual case) is
    found by its address; a part of one by a scan."""
    def holding(ref):
        storage = ref() if ref is not None else None
        if storage is None:
            return None
        start = storage.data_ptr()  # read once: the checks and the offset agree
        if start <= ptr and ptr + nbytes <= start + storage.nbytes():
            return storage, ptr - start
        return None

    with _EXPORTED_CUDA_LOCK:
        exact = _EXPORTED_CUDA.get((device_index, ptr))
    found = holding(exact)
    if found is not None:
        return found
    with _EXPORTED_CUDA_LOCK:
        refs = [ref for (dev, start), ref in _EXPORTED_CUDA.items()
                if dev == device_index and start <= ptr]
    for ref in refs:
        found = holding(ref)
        if found is not None:
            return found
    return None


def _module_internals():
    global _MODULE_INTERNALS
    if _MODULE_INTERNALS is None:
        import torch

        _MODULE_INTERNALS = frozenset(vars(torch.nn.Module()).keys()) - {"training"}
    return _MODULE_INTERNALS


class Encoder:
    """Walks Python values into a tree plus tensor and storage tables."""

    def __init__(self):
        self.tensors = []
        self.storages = []
        self._storage_index = {}
        self._tensor_index = {}
        # Keeps every encoded object alive until the value is built, so ids are not
        # reused and storages stay valid while they are copied.
        self._held = []

    def value(self):
        """The native value to send, built from what was encoded (the native encoder
        sends only the bytes of each host storage that its tensors reach)."""
        return _native.ipc_encode(self._tree, self.tensors, self.storages)

    def encode_root(self, obj):
        self._tree = self.encode(obj)
        return self

    def encode(self, obj, depth=0):
        if depth > 40:
            raise ValueError("value nested deeper than 40 levels")
        if isinstance(obj, np.ndarray):
            return _native.TensorRef(self._numpy(obj))
        torch = _torch()
        if torch is not None:
            if isinstance(obj, torch.Tensor):
                return _native.TensorRef(self._torch_tensor(obj))
            if isinstance(obj, torch.nn.Module):
                return _native.Tagged(MODULE_TAG, self._module(obj, depth))
        if isinstance(obj, dict):
            return {k: self.encode(v, depth + 1) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.encode(v, depth + 1) for v in obj]
        if isinstance(obj, tuple):
            return tuple(self.encode(v, depth + 1) for v in obj)
        if isinstance(obj, np.generic):
            return obj.item()
        return obj

    def _storage(self, key, spec):
        index = self._storage_index.get(key)
        if index is None:
            index = len(self.storages)
            self.storages.append(spec)
            self._storage_index[key] = index
        return index

    def _numpy(self, arr):
        known = self._tensor_index.get(id(arr))
        if known is not None:
            return known
        self._held.append(arr)
        if arr.dtype.kind in "OUSMm" or arr.dtype.fields is not None:
            raise TypeError(f"cannot share numpy arrays of dtype {arr.dtype}")
        # The array is its own storage; the native encoder makes it C-contiguous and
        # little-endian and takes its dtype, shape and strides.
        storage = self._storage(("np", id(arr)), ("numpy", arr))
        index = len(self.tensors)
        self.tensors.append((storage, 0, None, None, None, "numpy", False))
        self._tensor_index[id(arr)] = index
        return index

    def _torch_tensor(self, t):
        import torch

        from ._torch import FROM_TORCH

        known = self._tensor_index.get(id(t))
        if known is not None:
            return known
        self._held.append(t)
        requires_grad = bool(t.requires_grad)
        d = t.detach()
        if d.layout != torch.strided or d.is_quantized:
            raise TypeError(f"cannot share {d.layout} / quantized torch tensors; only strided ones")
        if d.is_conj() or d.is_neg():
            d = d.resolve_conj().resolve_neg()
        name = FROM_TORCH.get(d.dtype)
        if name is None:
            raise TypeError(f"cannot share torch tensors of dtype {d.dtype}")
        storage = d.untyped_storage()
        elem = d.element_size()
        if d.device.type == "cuda":
            key = ("cuda", d.device.index, storage.data_ptr())
            if storage.nbytes():
                _remember_cuda_storage(d.device.index, storage)
            stream = torch.cuda.current_stream(d.device).cuda_stream
            spec = ("cuda", storage.data_ptr(), storage.nbytes(), d.device.index, stream, d)
        elif d.device.type == "cpu":
            key = ("cpu", storage.data_ptr(), storage.nbytes())
            if storage.nbytes():
                raw = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
            else:
                raw = np.empty(0, np.uint8)
            self._held.append(raw)
            spec = ("cpu", raw)
        else:
            raise TypeError(f"cannot share tensors on {d.device} (only CPU and CUDA)")
        index_of_storage = self._storage(key, spec)
        index = len(self.tensors)
        self.tensors.append((
            index_of_storage,
            d.storage_offset() * elem,
            name,
            list(d.shape),
            list(d.stride()),
            "torch",
            requires_grad,
        ))
        self._tensor_index[id(t)] = index
        return index

    def _module(self, m, depth):
        known = self._tensor_index.get(("module", id(m)))
        if known is not None:
            return {"ref": known}
        self._held.append(m)
        # The id is taken on entry, before the children: a module met again anywhere
        # below or after it comes back as this same module.
        module_id = len(self._held)
        self._tensor_index[("module", id(m))] = module_id
        cls = type(m)
        internals = _module_internals()
        attrs = {}
        for k, v in vars(m).items():
            if k in internals or k in ("_parameters", "_buffers", "_modules"):
                continue
            try:
                attrs[k] = self.encode(v, depth + 1)
            except TypeError as e:
                raise TypeError(
                    f"cannot share module {cls.__module__}.{cls.__qualname__}: attribute {k!r}: {e}"
                ) from None
        params = {}
        for k, p in m._parameters.items():
            if p is None:
                params[k] = None
            else:
                params[k] = {"tensor": _native.TensorRef(self._torch_tensor(p)),
                             "requires_grad": bool(p.requires_grad)}
        buffers = {k: None if b is None else _native.TensorRef(self._torch_tensor(b))
                   for k, b in m._buffers.items()}
        children = {k: None if c is None else _native.Tagged(MODULE_TAG, self._module(c, depth + 1))
                    for k, c in m._modules.items()}
        return {
            "id": module_id,
            "class": f"{cls.__module__}:{cls.__qualname__}",
            "training": bool(m.training),
            "attrs": attrs,
            "parameters": params,
            "buffers": buffers,
            "non_persistent": sorted(getattr(m, "_non_persistent_buffers_set", ())),
            "children": children,
        }


def encode(obj):
    """The native value for ``obj``."""
    return Encoder().encode_root(obj).value()


class Decoder:
    """Rebuilds Python values from a received payload."""

    def __init__(self, received, allowed_modules=()):
        self.tree, self.tensors, self.storages = received.decode()
        self.allowed_modules = tuple(allowed_modules)
        self._tensors = {}
        self._torch_storages = {}
        # Per CUDA device: (torch.device, current stream handle); the producer events
        # already waited on (one event covers every storage it was recorded for); the
        # maker of torch tensors over received storages (on first use: it needs torch).
        self._cuda_devices = {}
        self._waited = set()
        self._on_storages = None
        self._params = {}
        self._modules = {}
        # Kept alive by every CUDA buffer of the value (see ipc._Lease).
        self.lease = None

    def decode(self):
        return self._value(self.tree)

    def _value(self, node):
        if isinstance(node, _native.TensorRef):
            return self._tensor(node.index)
        if isinstance(node, _native.Tagged):
            if node.tag == MODULE_TAG:
                return self._module(node.value)
            raise ValueError(f"unknown tagged value {node.tag!r}")
        if isinstance(node, dict):
            return {k: self._value(v) for k, v in node.items()}
        if isinstance(node, list):
            return [self._value(v) for v in node]
        if isinstance(node, tuple):
            return tuple(self._value(v) for v in node)
        return node

    def _tensor(self, index):
        done = self._tensors.get(index)
        if done is not None:
            return done
        storage_index, offset, dtype, shape, strides, framework, requires_grad = self.tensors[index]
        storage = self.storages[storage_index]
        if isinstance(storage, np.ndarray) and framework == "numpy":
            out = self._numpy(storage, offset, dtype, shape, strides)
        else:
            out = self._torch_tensor(storage_index, storage, offset, dtype, shape, strides)
            if requires_grad and out.is_floating_point():
                out.requires_grad_(True)
        self._tensors[index] = out
        return out

    @staticmethod
    def _numpy(storage, offset, dtype, shape, strides):
        np_dtype = _native.numpy_dtype(dtype)
        if 0 in shape:
            return np.empty(shape, np_dtype)
        return np.ndarray(tuple(shape), np_dtype, buffer=storage, offset=offset,
                          strides=tuple(s * np_dtype.itemsize for s in strides))

    def _torch_storage(self, storage_index, storage):
        """``(untyped storage, byte offset of the received storage in it)``."""
        import torch

        done = self._torch_storages.get(storage_index)
        if done is not None:
            return done
        if isinstance(storage, np.ndarray):
            base = torch.from_numpy(storage) if storage.size else torch.empty(0, dtype=torch.uint8)
            done = (base.untyped_storage(), 0)
        elif storage.nbytes == 0:
            # An empty CUDA storage: nothing was shared, only its device.
            device = torch.device("cuda", storage.device)
            done = (torch.empty(0, dtype=torch.uint8, device=device).untyped_storage(), 0)
        else:
            # The buffer holds the mapping and the lease; torch holds the buffer for
            # as long as the storage (any view of it) lives.
            buf = storage.open(self.lease)
            device, stream = self._cuda_device(buf.device)
            event = buf.event
            if event is not None and (buf.device, event) not in self._waited:
                buf.wait(stream)
                self._waited.add((buf.device, event))
            if buf.local:
                # Our own memory, sent back: view it on the storage that owns it here.
                done = _owning_cuda_storage(buf.device, buf.ptr, buf.nbytes)
                if done is None:
                    raise ValueError(
                        "the peer sent back CUDA memory of this process that no tensor "
                        "here holds any more")
            else:
                done = (torch.as_tensor(buf, device=device).untyped_storage(), 0)
        self._torch_storages[storage_index] = done
        return done

    def _cuda_device(self, index):
        """``(torch.device, this thread's current stream handle)`` for CUDA device ``index``."""
        known = self._cuda_devices.get(index)
        if known is None:
            import torch

            device = torch.device("cuda", index)
            known = (device, torch.cuda.current_stream(device).cuda_stream)
            self._cuda_devices[index] = known
        return known

    def _torch_tensor(self, storage_index, storage, offset, dtype, shape, strides):
        from ._torch import StorageViews, torch_dtype  # imports torch

        dt = torch_dtype(dtype)
        base, start = self._torch_storage(storage_index, storage)
        offset += start
        elem = dt.itemsize
        if offset % elem:
            raise ValueError(f"tensor offset {offset} is not a multiple of its element size {elem}")
        if self._on_storages is None:
            self._on_storages = StorageViews()
        return self._on_storages.view(base, dt, offset // elem, shape, strides)

    def _module(self, spec):
        import torch

        if "ref" in spec:
            return self._modules[spec["ref"]]
        cls = self._module_class(spec["class"])
        obj = cls.__new__(cls)
        torch.nn.Module.__init__(obj)
        self._modules[spec["id"]] = obj
        internals = _module_internals()
        for k, v in spec["attrs"].items():
            if k in internals or k.startswith("__") or k in ("_parameters", "_buffers", "_modules"):
                raise TypeError(f"refusing to set module attribute {k!r} sent by a peer")
            obj.__dict__[k] = self._value(v)
        obj.training = spec["training"]
        for k, p in spec["parameters"].items():
            if p is None:
                obj._parameters[k] = None
                continue
            index = p["tensor"].index
            param = self._params.get(index)
            if param is None:
                param = torch.nn.Parameter(self._tensor(index), requires_grad=p["requires_grad"])
                self._params[index] = param
            obj._parameters[k] = param
        for k, b in spec["buffers"].items():
            obj._buffers[k] = None if b is None else self._tensor(b.index)
        obj._non_persistent_buffers_set = set(spec["non_persistent"])
        for k, c in spec["children"].items():
            obj._modules[k] = None if c is None else self._module(c.value)
        return obj

    def _module_class(self, path):
        """The class named ``module:qualname``, if rebuilding it is allowed: its module is
        ``torch.nn`` (or below) or named in ``allowed_modules``, the qualname walks only
        through classes, and the class found really is that module's ``nn.Module``
        subclass. Only exactly allowlisted modules are ever imported."""
        import torch

        module_name, _, qualname = path.partition(":")
        refused = TypeError(
            f"refusing to rebuild module class {module_name}.{qualname}: only torch.nn classes "
            f"and those named in allowed_modules are rebuilt"
        )
        if not self._allowed(module_name):
            raise refused
        module = sys.modules.get(module_name)
        if module is None:
            if module_name not in self.allowed_modules:
                raise refused
            module = importlib.import_module(module_name)
        cls = module
        for part in qualname.split("."):
            cls = getattr(cls, part, None)
            if not isinstance(cls, type):
                raise refused
        if not (issubclass(cls, torch.nn.Module) and cls.__module__ == module_name
                and cls.__qualname__ == qualname):
            raise refused
        return cls

    def _allowed(self, module_name):
        if module_name == "torch.nn" or module_name.startswith("torch.nn."):
            return True
        return any(module_name == m or module_name.startswith(m + ".") for m in self.allowed_modules)
