"""Tensors in shared memory: tenso's ``TensoShm`` API over named POSIX segments.

A :class:`SharedTensor` is a named shared-memory segment (``/dev/shm/<name>`` on
Linux) holding one tensor packet at offset 0, the layout tenso 0.24's ``TensoShm``
uses, so either side reads what the other wrote::

    # producer
    st = SharedTensor.create_from("frame", np.random.rand(1080, 1920, 3))

    # consumer (another process)
    with SharedTensor("frame") as st:
        frame = st.get()          # zero-copy, read-only view of the segment

    # producer, once consumers are done
    st.close(); st.unlink()

Anything :func:`tensorwire.packet.dumps` takes can be stored (arrays, dicts of
them, scipy sparse matrices, strings, ragged and quantized tensors); :meth:`get`
returns what :func:`tensorwire.packet.loads` returns.

Differences from tenso, all deliberate:

* Arrays from :meth:`get` keep the mapping alive through their ``base`` chain, so
  they stay valid after :meth:`close` and :meth:`unlink` (tenso's views break, or
  ``close`` raises ``BufferError``). Closing never fails because of live views.
* New segments are readable and writable by their owner only (mode 0600).
* A dense array is encoded straight into the segment (header, then its bytes, then
  the footer); nothing the size of the tensor is built in between.
* :meth:`create_from` sizes the segment to the packet exactly (tenso adds a 256-byte
  margin) and refuses a name with ``/`` (``InvalidArgumentError``, a ValueError).
* Extras: ``get(copy=True)`` for writeable copies, ``readonly=True`` to map an
  existing segment read-only, ``aligned_bundle=True`` (as in ``packet.dumps``) so
  bundle members are aligned and decode zero-copy, and a module-level
  :func:`unlink`.

As with tenso, nothing coordinates a writer and the readers of one segment: a
:meth:`put` while another process holds views of the segment changes what they see.
Use one segment per message, or a protocol of your own, when that matters. A packet
is written with its magic bytes last (and a :meth:`put` first clears the old ones),
so a reader that looks while it is being written gets ``BadMagicError`` — retry.
``get(copy=True)`` decodes a snapshot of the packet and checks it after taking it
(the magic still there, and the integrity hash over the snapshot when the packet has
one), so a :meth:`put` from another process during the copy is ``BadMagicError``,
``MalformedError`` (a header caught half-rewritten) or ``ChecksumError`` too, all
to retry, not arrays mixing two packets (without an integrity hash, a
put begun and finished within the copy can still go unseen). Zero-copy views
(``copy=False``) see what is written later, as with tenso. Within one process, every
handle of one segment shares one lock: a ``get`` and a ``put`` do not overlap (a
``put`` waits for running ``get`` calls, and new ones wait for it).

A segment pickles by name (for ``multiprocessing`` workers): unpickling opens it
again in the receiving process, read-only if it was mapped read-only here.

New segments have their pages allocated when they are made, so a full ``/dev/shm``
(64 MiB in a default Docker container) is a ``MemoryError`` from ``create``, not a
crash at the first write past the limit.
"""

from __future__ import annotations

from typing import Any

from . import _native
from .packet import _FACTORIES, _check_alignment, _spec

__all__ = ["SharedTensor", "TensoShm", "unlink"]


def _reopen(name: str, readonly: bool) -> "SharedTensor":
    return SharedTensor(name, readonly=readonly)


def _options(check_integrity, compress, alignment, aligned_bundle):
    _check_alignment(alignment)
    return bool(check_integrity), bool(compress), alignment, bool(aligned_bundle)


class SharedTensor:
    """A named shared-memory segment holding one tensor packet (tenso's ``TensoShm``).

    ``SharedTensor(name)`` opens an existing segment (``FileNotFoundError`` when there
    is none); ``SharedTensor(name, create=True, size=n)`` creates one of ``n`` bytes,
    zero-filled (``FileExistsError`` when the name is taken). Names are bare
    (``"frame"``, no ``/``), 1 to 254 bytes. ``readonly=True`` maps an existing segment
    read-only (``put`` then fails). Use as a context manager to close on exit; the
    segment is not unlinked then, since other processes may still need it.
    """

    def __init__(self, name: str, create: bool = False, size: int = 0, *,
                 readonly: bool = False):
        if not isinstance(name, str):
            raise TypeError(f"name must be str, not {type(name).__name__}")
        size = int(size)
        if size < 0:
            raise ValueError("'size' must be a positive number different from zero")
        self._seg = _native.ShmSegment(name, bool(create), size, bool(readonly))

    @classmethod
    def _wrap(cls, seg) -> "SharedTensor":
        self = cls.__new__(cls)
        self._seg = seg
        return self

    @classmethod
    def create_from(cls, name: str, obj: Any, check_integrity: bool = False,
                    compress: bool = False, alignment: int = 64, *,
                    aligned_bundle: bool = False) -> "SharedTensor":
        """Create the segment ``name`` sized to ``obj``'s packet and write it there.

        If ``name`` exists it is unlinked first and made again (tenso's behaviour: a
        leftover of an earlier run is assumed). The options are those of
        :meth:`put`. Returns the open segment; close it, and unlink it once every
        reader is done.
        """
        if not isinstance(name, str):
            raise TypeError(f"name must be str, not {type(name).__name__}")
        options = _options(check_integrity, compress, alignment, aligned_bundle)
        return cls._wrap(_native.ShmSegment.create_from(name, _spec(obj, False), *options))

    @property
    def name(self) -> str:
        """The segment's name, as given."""
        return self._seg.name

    @property
    def size(self) -> int:
        """The segment's size in bytes."""
        return self._seg.size

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._seg.closed

    @property
    def buffer(self) -> memoryview:
        """The whole segment as a memoryview (format ``B``), writable when the segment
        is mapped read-write. It keeps the mapping alive after :meth:`close`."""
        return memoryview(self._seg.buffer())

    def put(self, obj: Any, check_integrity: bool = False, compress: bool = False,
            alignment: int = 64, *, aligned_bundle: bool = False) -> int:
        """Write ``obj``'s packet at the start of the segment; returns its length.

        ``check_integrity`` appends an XXH3-64 footer, ``compress`` LZ4-compresses,
        ``alignment`` (a power of two) aligns the body; ``aligned_bundle`` aligns
        bundle members too. Raises ``MemoryError`` when the packet is larger than the
        segment (nothing is written then). Bytes after the packet are left as they
        were and ignored by :meth:`get`.
        """
        options = _options(check_integrity, compress, alignment, aligned_bundle)
        return self._seg.put(_spec(obj, False), *options)

    def get(self, copy: bool = False) -> Any:
        """Decode the packet at the start of the segment.

        Arrays are read-only views of the segment whenever their bodies are aligned
        (always for a dense tensor); their ``base`` chain keeps the mapping alive even
        after :meth:`close` and :meth:`unlink`. ``copy=True`` returns writeable
        copies. Bundles come back as dicts, sparse packets as scipy matrices, the other
        kinds as their classes (see :func:`tensorwire.packet.loads`).
        """
        return self._seg.get(bool(copy), _FACTORIES)

    def packet_length(self) -> int:
        """The length of the packet at the start of the segment."""
        return self._seg.packet_length()

    def close(self) -> None:
        """Release this handle's mapping (arrays and buffers taken from it keep their
        own). The segment itself stays until unlinked."""
        self._seg.close()

    def unlink(self) -> None:
        """Remove the segment's name; processes that have it mapped keep their maps
        and the memory is freed when the last one is gone. ``FileNotFoundError`` when
        the name is already gone."""
        _native.ShmSegment.unlink(self._seg.name)

    def __enter__(self) -> "SharedTensor":
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        # Like tenso: close, but do not unlink (another process may need the segment).
        self.close()

    def __reduce__(self):
        # Pickled by name, as tenso's TensoShm and multiprocessing's SharedMemory are:
        # the receiving process (a spawned worker, say) maps the segment again.
        if self._seg.closed:
            raise ValueError(f"cannot pickle closed shared-memory segment {self.name!r}")
        return (_reopen, (self.name, not self._seg.writable))

    def __repr__(self) -> str:
        state = " closed" if self._seg.closed else ("" if self._seg.writable else " read-only")
        return f"<tensorwire.shm.SharedTensor {self.name!r} {self.size} bytes{state}>"


def unlink(name: str) -> None:
    """Remove the shared-memory segment ``name`` (``FileNotFoundError`` when there is
    none). Processes that have it mapped keep their maps."""
    if not isinstance(name, str):
        raise TypeError(f"name must be str, not {type(name).__name__}")
    _native.ShmSegment.unlink(name)


#: tenso's name for the same class (``tenso.TensoShm``).
TensoShm = SharedTensor
