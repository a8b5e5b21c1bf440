"""A tensor cache in shared memory that many processes use at once (tenso's
``TensoCache`` API).

::

    from tensorwire.cache import TensorCache

    with TensorCache("256MB", name="features") as cache:      # creates the segment
        cache.put("user:42", np.random.rand(512).astype(np.float32), ttl=60)
        emb = cache.get("user:42")      # zero-copy, read-only view of shared memory
        cache.info("user:42")           # shape, dtype, size, age, ttl — no decoding

    # another process
    cache = TensorCache(name="features", create=False)
    emb = cache.get("user:42")

Values are anything :func:`tensorwire.packet.dumps` takes (arrays, dicts of arrays,
scipy sparse matrices, strings, ragged and quantized tensors) and torch tensors
(stored from their CPU numpy view). Entries are evicted least-recently-used first
when the pool is full, expire after their ``ttl``, and are updated in place when a
new value of the same size replaces one nobody is reading.

Better than the reference:

* ``get(copy=False)`` returns a view of the shared memory itself (tenso copies the
  packet under the lock). The entry is pinned while the array (or anything derived
  from it) lives: if another process deletes, evicts or overwrites the key, the new
  value goes to a new block and the view keeps showing exactly what it showed.
* A process killed while holding the lock, or in the middle of a ``put``, never
  leaves a half-written value visible, and the repair keeps every healthy entry
  (tenso wipes the pool). See ``docs/shm-cache.md``.
* Keys are found through a hash index in the segment, not a per-process dict that
  is rebuilt whenever another process writes.
"""

from __future__ import annotations

import atexit
import os
import re
from typing import Any, List, Optional

import numpy as np

from . import _native
from ._reader import _is_torch_tensor
from .packet import _FACTORIES, QuantizedTensor, _spec

__all__ = ["TensorCache", "TensoCache"]

# Views inherited through fork stay pinned in the child: before the fork, each cache
# this process views (through open or closed handles) gets a registry slot for the
# child with every viewed entry pinned in it, and the child takes the slots over at
# once; so the parent may drop its views right after the fork. The process-local
# locks of the cache and shared-memory code are held across the fork, so a child
# never finds one locked by a thread it does not have. (`import tensorwire` imports
# this module, so the hooks are there for SharedTensor alone too.)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_native.prepare_fork,
                        after_in_parent=_native.parent_after_fork,
                        after_in_child=_native.child_after_fork)

_UNITS = {"": 1, "B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40,
          "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}


def _parse_size(size) -> int:
    """Bytes from an int or a string like ``"256MB"``, ``"1G"``, ``"1.5 GiB"`` (powers
    of 1024, as tenso reads them)."""
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        return int(size)
    if not isinstance(size, str):
        raise TypeError(f"max_memory must be an int or a string like '256MB', not {size!r}")
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", size)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"cannot parse size {size!r} (try '256MB' or '1GB')")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _to_storable(tensor):
    """Arrays and packet values pass through; torch tensors become their CPU numpy
    arrays (after ``detach``); anything with ``__array__``, and lists, tuples and
    numbers, become arrays (``np.asarray``, as tenso stores them)."""
    if isinstance(tensor, (np.ndarray, dict, QuantizedTensor)) or hasattr(tensor, "tocoo"):
        return tensor
    if _is_torch_tensor(tensor):
        import torch

        t = tensor.detach().resolve_conj().resolve_neg()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16: ml_dtypes' over the bits
            return t.contiguous().view(torch.int16).numpy().view(_bfloat16("store"))
        return t.numpy()
    if isinstance(tensor, (list, tuple, int, float, complex)) or (  # bool is an int
            hasattr(tensor, "__array__") and not isinstance(tensor, str)):
        return np.asarray(tensor)
    return tensor


def _bfloat16(what: str):
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError(f"to {what} a torch.bfloat16 tensor, install ml_dtypes "
                        "(numpy has no bfloat16)") from None
    return np.dtype(ml_dtypes.bfloat16)


def _to_device(value, device: str):
    """``device`` is "numpy", "torch", "torch:<device>" (e.g. "torch:cuda:0"), "jax" or
    "cupy[:<id>]". The array handed to the framework is a copy (a framework tensor
    must own writable memory)."""
    framework, _, spec = device.partition(":")
    framework = framework.lower()  # "Torch" too, as tenso reads it
    if framework == "numpy":
        return value
    if not isinstance(value, np.ndarray):
        raise TypeError(f"device={device!r} needs an array value, not {type(value).__name__}")
    if framework == "torch":
        from . import _staging, _torch

        if spec and _staging.cuda_device(_torch.torch, spec) is not None:
            return _staging.numpy_to(_torch, value, spec)  # no host copy on the way
        t = _torch.numpy_to_torch(np.array(value, copy=True))
        return t.to(spec) if spec else t
    if framework == "jax":
        import jax.numpy as jnp

        return jnp.asarray(value)
    if framework == "cupy":
        import cupy as cp

        with cp.cuda.Device(int(spec) if spec else 0):
            return cp.asarray(value)
    raise ValueError(f"unknown device {device!r} (numpy, torch[:dev], jax, cupy[:id])")


#: Pools this process created under a generated name (``name=None``), by name, with
#: the creating process's id: nothing else knows such a name unless told, so this
#: process removes it at exit if no one has (as tenso's pools are, through Python's
#: resource tracker). Named pools stay until ``unlink()``.
_GENERATED = {}


@atexit.register
def _unlink_generated() -> None:
    for name, pid in list(_GENERATED.items()):
        if pid == os.getpid():  # not in a forked child that inherited the table
            try:
                _native.ShmSegment.unlink(name)
            except OSError:
                pass  # unlinked already by another process
    _GENERATED.clear()


class TensorCache:
    """A shared-memory tensor cache (tenso's ``TensoCache``).

    ``TensorCache(max_memory="256MB", name=None, create=True)`` creates a pool of that
    size (a fresh unique name when ``name`` is None; ``FileExistsError`` when the name
    is taken). ``TensorCache(name="x", create=False)`` attaches to a pool another
    process created (``max_memory`` is then ignored). ``max_entries`` sets the number
    of entry slots (default: one per 16 KiB of pool, 16 to 65 536), ``lock_timeout``
    the longest wait for the pool's lock in seconds (then ``TimeoutError``).

    Used as a context manager, exiting closes the handle and, if this handle created
    the pool, unlinks its name (processes still attached keep working). A pool created
    under a generated name (``name=None``) is unlinked when its creating process
    exits, if not before; a named one stays until :meth:`unlink`.
    """

    def __init__(self, max_memory="256MB", name: Optional[str] = None, create: bool = True,
                 *, max_entries: Optional[int] = None, lock_timeout: float = 10.0,
                 _pause_at: Optional[str] = None):
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be str or None, not {type(name).__name__}")
        timeout = float(lock_timeout)
        if create:
            size = _parse_size(max_memory)
            self._h = _native.CacheHandle.create(name, size, max_entries, timeout, _pause_at)
            if name is None:
                _GENERATED[self._h.name] = os.getpid()
        else:
            if name is None:
                raise ValueError("name is required when create=False")
            self._h = _native.CacheHandle.attach(name, timeout, _pause_at)
        self._owns = bool(create)

    @property
    def name(self) -> str:
        """The segment name other processes attach by."""
        return self._h.name

    def put(self, key: str, tensor: Any, ttl: Optional[float] = None,
            quantize: Optional[str] = None) -> int:
        """Store ``tensor`` under ``key`` (≤ 128 bytes of UTF-8), replacing what was
        there; ``ttl`` in seconds (None, 0, a negative number or infinity: no expiry, as
        with tenso); ``quantize`` one of "qint8",
        "quint8", "qint4", "quint4" to store a per-tensor quantized copy. Returns the
        bytes stored. ``MemoryError`` when the value cannot fit even after evicting
        (larger than the pool, or the pool is held by readers' views)."""
        value = _to_storable(tensor)
        if quantize is not None:
            if not isinstance(value, np.ndarray):
                raise TypeError("quantize= needs an array value")
            value = QuantizedTensor.quantize(value, quantize)
        if ttl is not None:
            ttl = float(ttl)
            if ttl != ttl:
                raise ValueError("ttl must be seconds or None, not nan")
            if ttl <= 0 or ttl == float("inf"):
                ttl = None  # as tenso: no expiry
        return self._h.put(key, _spec(value, False), ttl)

    def get(self, key: str, copy: bool = False, device: Optional[str] = None):
        """The value under ``key``, or None when absent or expired. By default a
        zero-copy read-only view that pins the entry while it lives; ``copy=True``
        gives a writable copy (and pins nothing); ``device`` ("torch",
        "torch:cuda:0", "jax", "cupy:0") converts it."""
        value = self._h.get(key, bool(copy), _FACTORIES)
        if value is not None and device is not None:
            value = _to_device(value, device)
        return value

    def delete(self, key: str) -> bool:
        """Remove ``key``; True when it was there. Views of it stay valid."""
        return self._h.delete(key)

    def info(self, key: str) -> Optional[dict]:
        """``{'shape', 'dtype', 'ndim', 'size_bytes', 'alloc_bytes', 'ttl', 'age'}`` of
        ``key`` without decoding its value (None when absent or expired). ``dtype``
        is a numpy dtype for plain arrays, the quantized type's name for quantized
        ones, None for bundles, sparse and string values."""
        return self._h.info(key)

    def keys(self) -> List[str]:
        """The live keys, most recently used first."""
        return self._h.keys()

    def clear(self) -> None:
        """Remove every entry (views stay valid)."""
        self._h.clear()

    @property
    def stats(self) -> dict:
        """``entries, max_entries, pool_size, used_bytes, free_bytes,
        data_region_size, hits, misses, hit_rate`` (tenso's keys) plus
        ``pinned_bytes, evictions, expirations, recoveries, processes``."""
        return self._h.stats()

    def check(self) -> None:
        """Verify the pool's internal structures (index, LRU list, free space,
        counters, pins); raises ``MalformedError`` naming the first inconsistency."""
        self._h.check()

    def __len__(self) -> int:
        return len(self._h)

    def __contains__(self, key: str) -> bool:
        return self._h.contains(key)

    def close(self) -> None:
        """Detach this handle. Views already taken stay valid (they hold the
        mapping); further calls on the handle raise ``InvalidArgumentError``."""
        self._h.close()

    def unlink(self) -> None:
        """Remove the pool's name; attached processes keep working. A name already
        gone (unlinked before, by this or another handle) is no error, as with tenso."""
        _GENERATED.pop(self.name, None)
        try:
            self._h.unlink()
        except FileNotFoundError:
            pass

    @property
    def closed(self) -> bool:
        return self._h.closed

    def __enter__(self) -> "TensorCache":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self._owns:
                _GENERATED.pop(self.name, None)
                self._h.unlink_quietly()
        finally:
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"TensorCache(name={self.name!r}, {state})"


#: tenso's name for the same class, so code written for ``tenso.TensoCache`` runs
#: unchanged after ``from tensorwire.cache import TensoCache``.
TensoCache = TensorCache
