"""Host-to-GPU copies of many arrays through a few reused pinned buffers.

A copy from pageable memory (a file map, a numpy array) to a GPU runs through the
CUDA driver's own small pinned buffers, on one thread, one tensor at a time: about
7 GB/s on an H100 host whose link takes 54 GB/s from pinned memory. Here the host
side is tensorwire's parallel copy (the calling thread and its copy helpers, without
the GIL) into pinned buffers, while the GPU copies out of the buffer filled before.
The buffers come from torch's caching host allocator (as ``Tensor.pin_memory()``
does), so a process pins them once and later loads reuse them.
"""

from __future__ import annotations

from . import _native

#: Bytes per pinned buffer. Every buffer has this size, so that torch's cache hands
#: the same blocks back to every later copy.
SLOT_BYTES = 32 << 20
#: Pinned buffers in flight: one filling while the GPU copies out of the other.
SLOTS = 2
#: Below this many bytes in one call, plain copies.
MIN_BYTES = 4 << 20
#: Before the first staged copy of the process: bytes copied plainly first. Pinning
#: the buffers costs about as much as copying this many bytes plainly (rent until the
#: rent paid would have bought), so a process that loads a few small files never
#: pins anything, and one that loads more pays at most twice the best choice.
PIN_AFTER_BYTES = 256 << 20

#: Bytes of jobs a ``Batches`` collects before copying them: copies made on the way
#: to the device (decoded, byte-swapped or unaligned tensors) never pile up beyond it.
BATCH_BYTES = 256 << 20

_plain_bytes = 0      # bytes copied plainly so far, while no buffer has been pinned
_pinned = False       # a staged copy has run: torch's cache holds the buffers
_pin_failed = False   # pinning failed once (a locked-memory limit): plain from then on


def cuda_device(torch, device):
    """The ``torch.device("cuda", index)`` that ``device`` names, or None when it is
    not a CUDA device this process has (the caller's plain path then gives torch's
    own behaviour, errors included)."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        return None
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device() if device.index is None else device.index
    if not 0 <= index < torch.cuda.device_count():
        return None
    return torch.device("cuda", index)


def fills_span(shape, strides):
    """True when elements at these non-negative element ``strides`` cover the span
    from the first to the last exactly once (in row-major or any other order of
    dimensions): sorted, the strides of the dimensions longer than 1 are 1 and then
    each the product of the lengths before."""
    step = 1
    for stride, dim in sorted((s, d) for s, d in zip(strides, shape) if d != 1):
        if stride != step:
            return False
        step *= dim
    return True


def device_job(tt, tensor, device):
    """``(result, job)`` for moving a CPU ``tensor`` to the CUDA ``device`` (``tt``:
    the ``_torch`` interop module): an empty tensor there with the same strides and
    the ``(src, dst)`` job that fills it, or, for an empty tensor or a view with gaps
    between its elements, ``tensor.to(device)`` and no job."""
    if tensor.numel() == 0 or not fills_span(tensor.shape, tensor.stride()):
        return tensor.to(device), None
    # The same strides (of size-1 dimensions too, as torch's own copy keeps them), so
    # the destination's bytes are in the same order as the source's.
    dst = tt.torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype,
                                 device=device)
    return dst, (tt.flat_bytes(tensor).numpy(), tt.flat_bytes(dst))


def to_device(tt, tensor, device):
    """``tensor.to(device)`` for a CPU tensor, through the pinned buffers when
    ``device`` is a CUDA device and the tensor is contiguous."""
    target = cuda_device(tt.torch, device)
    if target is None:
        return tensor.to(device)
    result, job = device_job(tt, tensor, target)
    if job is not None:
        copy_to_device(tt.torch, [job])
    return result


def numpy_to(tt, array, device):
    """``numpy_to_torch(array).to(device)`` for a numpy ``array`` (ml_dtypes' too; a
    read-only one included, which torch cannot share): a C-contiguous array headed for
    a CUDA device goes straight from its own bytes through the pinned buffers, with no
    host copy first; any other through a CPU tensor (a copy when read-only)."""
    target = cuda_device(tt.torch, device)
    if target is not None and array.flags.c_contiguous:
        dst = tt.torch.empty(array.shape, dtype=tt.numpy_dtype_to_torch(array), device=target)
        copy_to_device(tt.torch, [(array.reshape(-1).view("u1"), tt.flat_bytes(dst))])
        return dst
    t = tt.numpy_to_torch(array if array.flags.writeable else array.copy())
    if target is not None:
        return t.to(target)
    return t if str(device) == "cpu" else t.to(device)


def copy_to_device(torch, jobs, pinned=True):
    """Copies each ``(src, dst)`` of ``jobs``: ``src`` a flat uint8 numpy array,
    ``dst`` a flat uint8 torch tensor of the same length on a CUDA device. Returns
    when every byte has arrived. Small copies (see ``MIN_BYTES`` and
    ``PIN_AFTER_BYTES``) are plain ``copy_`` calls. ``pinned=False`` stages through
    ordinary memory (for tests without a GPU)."""
    global _plain_bytes, _pinned, _pin_failed
    total = sum(src.nbytes for src, _ in jobs)
    ring = None
    if (total >= max(MIN_BYTES, 1) and not _pin_failed
            and (_pinned or _plain_bytes + total >= PIN_AFTER_BYTES)):
        try:
            ring = _Ring(torch, total, pinned)
        except RuntimeError:
            _pin_failed = True  # no pinned memory to be had: plain copies
    if ring is None:
        _plain_bytes += total
        for src, dst in jobs:
            if not src.nbytes:
                continue
            if src.flags.writeable:
                dst.copy_(torch.from_numpy(src))
            else:  # torch.from_numpy warns of read-only arrays: through a scratch copy
                scratch = torch.empty(src.nbytes, dtype=torch.uint8)
                _native._copy_pairs([(scratch.numpy(), src)])
                dst.copy_(scratch)
        return
    ring.run(jobs)
    _pinned = True


class Batches:
    """Collects ``(src, dst)`` jobs for :func:`copy_to_device` and copies them each
    time ``BATCH_BYTES`` have come together, and on :meth:`flush`."""

    def __init__(self, torch):
        self.torch = torch
        self.jobs = []
        self.bytes = 0

    def add(self, src, dst):
        self.jobs.append((src, dst))
        self.bytes += src.nbytes
        if self.bytes >= BATCH_BYTES:
            self.flush()

    def flush(self):
        """Copies what was added since the last flush; returns when it has arrived."""
        jobs, self.jobs, self.bytes = self.jobs, [], 0
        copy_to_device(self.torch, jobs)


class _Ring:
    """A few staging buffers used in turn: fill one (natively, in parallel), start
    its device copies, move on; before a buffer is filled again, wait for the copies
    out of it."""

    def __init__(self, torch, total, pinned):
        self.torch = torch
        self.size = SLOT_BYTES
        count = min(SLOTS, -(-total // self.size))
        self.buffers = [torch.empty(self.size, dtype=torch.uint8, pin_memory=pinned)
                        for _ in range(count)]
        self.host = [b.numpy() for b in self.buffers]
        self.done = [None] * count
        self.which = 0
        self.fill = 0
        self.pairs = []   # (buffer part, source part) to fill natively
        self.copies = []  # (destination part, buffer start, buffer end)

    def run(self, jobs):
        for src, dst in jobs:
            at, n = 0, src.nbytes
            while at < n:
                k = min(n - at, self.size - self.fill)
                self.pairs.append((self.host[self.which][self.fill:self.fill + k], src[at:at + k]))
                self.copies.append((dst[at:at + k], self.fill, self.fill + k))
                self.fill += k
                at += k
                if self.fill == self.size:
                    self._flush()
        if self.fill:
            self._flush()
        for which in range(len(self.buffers)):
            self._wait(which)

    def _flush(self):
        torch = self.torch
        _native._copy_pairs(self.pairs)
        buffer = self.buffers[self.which]
        devices = set()
        for dst, lo, hi in self.copies:
            dst.copy_(buffer[lo:hi], non_blocking=True)
            devices.add(dst.device)
        events = []
        for device in devices:
            if device.type == "cuda":
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(device))
                events.append(event)
        self.done[self.which] = events
        self.which = (self.which + 1) % len(self.buffers)
        self.fill, self.pairs, self.copies = 0, [], []
        self._wait(self.which)

    def _wait(self, which):
        """Waits for the device copies out of buffer ``which``."""
        for event in self.done[which] or ():
            event.synchronize()
        self.done[which] = None
