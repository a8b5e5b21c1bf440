"""The staged host-to-device copy (``tensorwire._staging``) and the native parallel
copy under it (``_native._copy_pairs``), on the CPU: the ring's cutting of arrays into
buffer-sized pieces is the same whatever device the pieces go to. test_gpu.py runs the
CUDA paths that use it against torch."""

import os
import warnings

import numpy as np
import pytest

import tensorwire as tw
from conftest import REPO
from tensorwire import _native, _staging, formats, pytorch
from tensorwire._reader import _dense_bytes
from test_pytorch_load import (_fixtures, _flat_tensors, _torch_bytes, _torch_load_or_skip,
                               compare_trees, same_as_loaded)


def _pattern(n, seed=0):
    return (np.arange(n, dtype=np.uint64) * 2654435761 + seed).astype(np.uint8)


# ------------------------------------------------------------------ _copy_pairs

def test_copy_pairs_copies_every_pair_exactly():
    # Small and large (parallel) pairs, other dtypes and shapes of the same byte length.
    sizes = [0, 1, 4095, 3 << 20, (1 << 20) + 7]
    srcs = [_pattern(n, i) for i, n in enumerate(sizes)]
    dsts = [np.zeros(n, np.uint8) for n in sizes]
    typed_src = np.arange(6 * 1024, dtype=np.float32).reshape(6, 1024)
    typed_dst = np.zeros(6 * 1024 * 4, np.uint8)
    _native._copy_pairs(list(zip(dsts, srcs)) + [(typed_dst, typed_src)])
    for d, s in zip(dsts, srcs):
        assert np.array_equal(d, s)
    assert np.array_equal(typed_dst.view(np.float32).reshape(6, 1024), typed_src)


def test_copy_pairs_reads_one_source_twice_and_read_only_sources():
    src = _pattern(5000)
    src.flags.writeable = False
    a, b = np.zeros(5000, np.uint8), np.zeros(5000, np.uint8)
    _native._copy_pairs([(a, src), (b, src)])
    assert np.array_equal(a, src) and np.array_equal(b, src)


def test_copy_pairs_refuses_bad_pairs_before_copying_anything():
    src = _pattern(100)
    good = np.zeros(100, np.uint8)
    read_only = np.zeros(100, np.uint8)
    read_only.flags.writeable = False
    buf = np.zeros(300, np.uint8)
    cases = {
        "lengths differ": (np.zeros(99, np.uint8), src),
        "read-only dst": (read_only, src),
        "strided dst": (np.zeros(200, np.uint8)[::2], src),
        "strided src": (good, np.zeros(200, np.uint8)[::2]),
        "dst overlaps its src": (buf[50:150], buf[:100]),
        "object dst": (np.empty(100 // np.dtype(object).itemsize, object), src[:96]),
        "object src": (good[:96], np.empty(96 // np.dtype(object).itemsize, object)),
        "object field": (np.zeros(6, [("a", "i8"), ("b", object)]), src[:96]),
    }
    for why, bad in cases.items():
        with pytest.raises(_native.InvalidArgumentError):
            _native._copy_pairs([(good, src), bad])
        assert not good.any(), why  # refused before the good pair was copied
    with pytest.raises(_native.InvalidArgumentError):  # two destinations overlap
        _native._copy_pairs([(buf[:100], src), (buf[99:199], src)])
    with pytest.raises(_native.InvalidArgumentError):  # a dst is another pair's src
        _native._copy_pairs([(buf[:100], src), (good, buf[:100])])
    with pytest.raises(TypeError):
        _native._copy_pairs([(bytearray(100), src)])
    assert not buf.any()
    # Sources may overlap each other; destinations may touch without overlapping.
    _native._copy_pairs([(buf[:100], src), (buf[100:200], src), (buf[200:300], src)])
    assert np.array_equal(buf, np.tile(src, 3))


def test_copy_pairs_refuses_exactly_the_pairs_whose_destinations_overlap():
    # Random pairs of slices of one buffer, against a brute-force overlap check.
    rng = np.random.default_rng(5)
    buf = np.zeros(64, np.uint8)
    for _ in range(3000):
        pairs = []
        for _ in range(rng.integers(1, 5)):
            n = int(rng.integers(0, 9))
            d, s = (int(x) for x in rng.integers(0, 64 - n + 1, 2))
            pairs.append(((d, d + n), (s, s + n)))
        spans = [(lo, hi, True) for (lo, hi), _ in pairs if hi > lo]
        spans += [(lo, hi, False) for (dlo, dhi), (lo, hi) in pairs if hi > lo and dhi > dlo]
        bad = any(a[0] < b[1] and b[0] < a[1] and (a[2] or b[2])
                  for i, a in enumerate(spans) for b in spans[i + 1:])
        buf[:] = np.arange(64, dtype=np.uint8)
        arrays = [(buf[dlo:dhi], buf[slo:shi]) for (dlo, dhi), (slo, shi) in pairs]
        if bad:
            with pytest.raises(_native.InvalidArgumentError):
                _native._copy_pairs(arrays)
            assert np.array_equal(buf, np.arange(64, dtype=np.uint8))
        else:
            want = buf.copy()
            for (dlo, dhi), (slo, shi) in pairs:
                want[dlo:dhi] = np.arange(64, dtype=np.uint8)[slo:shi]
            _native._copy_pairs(arrays)
            assert np.array_equal(buf, want), pairs


@pytest.mark.parametrize("fixture", [
    "pytorch/dtypes.legacy.pt", "pytorch/views.pt", "pytorch/torch_only.legacy.pt",
    "numpy/arrays.npz", "safetensors/dtypes.safetensors",
])
def test_bytes_bound_for_a_device_are_views_at_any_alignment(fixture):
    """What read_torch copies to a GPU is read where it lies, also when torch could not
    share it (unaligned legacy storages and NPZ members, a caller's read-only bytes):
    only byte-swapped tensors are copies; views with gaps are left to torch."""
    with open(os.path.join(REPO, "fixtures", fixture), "rb") as f:
        data = f.read()
    whole = np.frombuffer(data, np.uint8)
    viewed = 0
    with tw.Reader(buffer=data) as r:
        for name in r.keys():
            dense = _dense_bytes(r._read_for_torch(name, to_copy=True))
            if dense is None or not dense[0].nbytes:
                continue
            raw = dense[0]
            swapped = r.metadata(name).attributes.get("npy.descr", "").startswith(">")
            assert np.shares_memory(raw, whole) != swapped, name
            viewed += not swapped
    assert viewed


# ------------------------------------------------------------------ the ring, on the CPU

@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def small_ring(monkeypatch):
    """Buffers of an odd size, so that pieces end anywhere, and no lower bound."""
    monkeypatch.setattr(_staging, "SLOT_BYTES", 1000)
    monkeypatch.setattr(_staging, "MIN_BYTES", 0)
    monkeypatch.setattr(_staging, "PIN_AFTER_BYTES", 0)
    monkeypatch.setattr(_staging, "_pinned", _staging._pinned)  # restored afterwards


def _jobs(torch, sizes):
    srcs = [_pattern(n, i) for i, n in enumerate(sizes)]
    dsts = [torch.zeros(n, dtype=torch.uint8) for n in sizes]
    return srcs, dsts


@pytest.mark.parametrize("sizes", [
    [], [0], [0, 0], [1], [1000], [999, 1, 1000], [0, 1, 999, 1000, 1001, 5000, 3, 0], [12345],
    [1] * 2500,
])
def test_ring_fills_every_destination(torch, small_ring, sizes):
    srcs, dsts = _jobs(torch, sizes)
    _staging.copy_to_device(torch, list(zip(srcs, dsts)), pinned=False)
    for s, d in zip(srcs, dsts):
        assert np.array_equal(d.numpy(), s)


def count_ring_runs(monkeypatch):
    """A list that gets one item per ring run (``_staging._Ring.run``) while the test
    runs."""
    runs = []
    real_run = _staging._Ring.run
    monkeypatch.setattr(_staging._Ring, "run",
                        lambda self, jobs: (runs.append(1), real_run(self, jobs)))
    return runs


def test_small_totals_are_copied_directly(torch, monkeypatch):
    runs = count_ring_runs(monkeypatch)
    monkeypatch.setattr(_staging, "_pinned", True)
    monkeypatch.setattr(_staging, "MIN_BYTES", 5000)
    srcs, dsts = _jobs(torch, [10, 0, 4096])
    _staging.copy_to_device(torch, list(zip(srcs, dsts)), pinned=False)
    for s, d in zip(srcs, dsts):
        assert np.array_equal(d.numpy(), s)
    assert len(runs) == 0
    _staging.copy_to_device(torch, list(zip(*_jobs(torch, [5000]))), pinned=False)
    assert len(runs) == 1


def test_no_pinned_memory_means_plain_copies_from_then_on(torch, small_ring, monkeypatch):
    tries = []

    def refused(self, *args):
        tries.append(1)
        raise RuntimeError("CUDA error: out of memory")
    monkeypatch.setattr(_staging._Ring, "__init__", refused)
    monkeypatch.setattr(_staging, "_pin_failed", False)
    for _ in range(3):
        srcs, dsts = _jobs(torch, [5000, 3])
        _staging.copy_to_device(torch, list(zip(srcs, dsts)), pinned=False)
        for s, d in zip(srcs, dsts):
            assert np.array_equal(d.numpy(), s)
    assert tries == [1]  # tried once, not on every call


def test_plain_copies_of_read_only_sources_do_not_warn(torch, monkeypatch):
    monkeypatch.setattr(_staging, "MIN_BYTES", 1 << 40)
    srcs, dsts = _jobs(torch, [100, 7])
    for s in srcs:
        s.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _staging.copy_to_device(torch, list(zip(srcs, dsts)), pinned=False)
    for s, d in zip(srcs, dsts):
        assert np.array_equal(d.numpy(), s)


def test_batches_copy_each_time_enough_has_come_together(torch, monkeypatch):
    calls = []
    real = _staging.copy_to_device
    monkeypatch.setattr(_staging, "copy_to_device",
                        lambda torch, jobs: (calls.append([s.nbytes for s, _ in jobs]), real(torch, jobs)))
    monkeypatch.setattr(_staging, "BATCH_BYTES", 1000)
    batches = _staging.Batches(torch)
    srcs, dsts = _jobs(torch, [600, 300, 200, 1500, 10, 20])
    for s, d in zip(srcs, dsts):
        batches.add(s, d)
    assert calls == [[600, 300, 200], [1500]]
    batches.flush()
    batches.flush()
    assert calls == [[600, 300, 200], [1500], [10, 20], []]
    for s, d in zip(srcs, dsts):
        assert np.array_equal(d.numpy(), s)


def test_buffers_are_pinned_once_plain_copies_would_have_paid_for_them(torch, monkeypatch):
    ring_runs = count_ring_runs(monkeypatch)
    monkeypatch.setattr(_staging, "_pinned", False)
    monkeypatch.setattr(_staging, "_plain_bytes", 0)
    monkeypatch.setattr(_staging, "MIN_BYTES", 100)
    monkeypatch.setattr(_staging, "PIN_AFTER_BYTES", 10_000)
    monkeypatch.setattr(_staging, "SLOT_BYTES", 1000)
    runs = []
    for size in [4000, 50, 4000, 1999, 1, 100, 50]:
        srcs, dsts = _jobs(torch, [size])
        _staging.copy_to_device(torch, list(zip(srcs, dsts)), pinned=False)
        assert np.array_equal(dsts[0].numpy(), srcs[0])
        runs.append(len(ring_runs))
    # Plain until 10 000 bytes would have been copied plainly (the 1999 bytes make
    # 10 049); from then on staged at MIN_BYTES and more.
    assert runs == [0, 0, 0, 1, 1, 2, 2]


def test_ring_uses_at_most_slots_buffers_of_at_most_slot_bytes(torch, small_ring, monkeypatch):
    made = []
    real = _staging._Ring.__init__

    def counting(self, *args):
        real(self, *args)
        made.append([b.numel() for b in self.buffers])
    monkeypatch.setattr(_staging._Ring, "__init__", counting)
    for total, want in [(10, [1000]), (1500, [1000, 1000]), (10_000, [1000] * _staging.SLOTS)]:
        srcs, dsts = _jobs(torch, [total])
        _staging.copy_to_device(torch, list(zip(srcs, dsts)), pinned=False)
        assert made.pop() == want


def test_cuda_device_is_none_for_what_is_not_a_cuda_device_here(torch):
    for device in ("cpu", "meta", torch.device("cpu"), "no-such-device", 3.5):
        assert _staging.cuda_device(torch, device) is None
    if not torch.cuda.is_available():
        assert _staging.cuda_device(torch, "cuda") is None
        assert _staging.cuda_device(torch, "cuda:0") is None
    else:
        count = torch.cuda.device_count()
        assert _staging.cuda_device(torch, "cuda") == torch.device(
            "cuda", torch.cuda.current_device())
        assert _staging.cuda_device(torch, f"cuda:{count}") is None


# ------------------------------------------------------------------ the staged loaders, on the CPU

@pytest.fixture
def cpu_as_cuda(torch, monkeypatch):
    """The loaders' CUDA paths run on the CPU: a "cuda" device is taken for the CPU,
    and every copy goes through the ring (ordinary memory, 1000-byte buffers). Gives
    the list that each ring run appends to."""
    runs = count_ring_runs(monkeypatch)
    real_ring = _staging._Ring
    monkeypatch.setattr(_staging, "_Ring", lambda torch, total, pinned: real_ring(torch, total, False))
    monkeypatch.setattr(_staging, "cuda_device", lambda torch, device: (
        torch.device("cpu") if str(device).startswith("cuda") else None))
    monkeypatch.setattr(_staging, "SLOT_BYTES", 1000)
    monkeypatch.setattr(_staging, "MIN_BYTES", 0)
    monkeypatch.setattr(_staging, "PIN_AFTER_BYTES", 0)
    monkeypatch.setattr(_staging, "_pinned", _staging._pinned)
    return runs


@pytest.mark.parametrize("path,spec", _fixtures())
def test_pytorch_load_through_the_ring_is_torch_load(torch, path, spec, cpu_as_cuda):
    """Every checkpoint fixture moved "to the GPU" through the ring: torch's objects,
    down to strides, storage offsets and tied storages."""
    if os.path.basename(path) == "big_endian.pt":
        pytest.skip("torch leaves uint16/32/64 of big-endian files unswapped; we swap")
    want = _torch_load_or_skip(path, map_location="cpu")
    got = pytorch.load(path, map_location="cuda", flat=False)
    compare_trees(got, want, same_as_loaded, os.path.basename(path))
    dense_want, dense_got = (
        {n: t for n, t in _flat_tensors(obj).items()
         if t.layout == torch.strided and not t.is_quantized and t.device.type != "meta"}
        for obj in (want, got))
    if any(t.numel() for t in dense_want.values()):
        assert cpu_as_cuda, "nothing went through the ring"
    # Tensors that share a storage in torch's result share one in ours.
    assert _storage_groups(dense_got) == _storage_groups(dense_want)


def _storage_groups(tensors):
    by_storage = {}
    for name, t in tensors.items():
        if t.numel():
            by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(name)
    return sorted(sorted(names) for names in by_storage.values())


@pytest.mark.parametrize("fixture", [
    "pytorch/dtypes.pt", "pytorch/views.pt", "pytorch/dtypes.legacy.pt",
    "pytorch/big_endian.pt", "pytorch/torch_only.pt", "safetensors/dtypes.safetensors",
    "safetensors/raw_types.safetensors", "numpy/arrays.npz", "numpy/compressed.npz",
    "gguf/quantized.gguf", "gguf/plain.gguf", "zt/dtypes.zt", "zt/compressed.zt",
    "zt/v2/dtypes.zt", "packet/quant_qint8_per_tensor.tnso",
    "packet/quant_qint4_per_group.tnso", "sharded/safetensors/model.safetensors.index.json",
])
@pytest.mark.parametrize("source", ["file", "buffer"])
def test_read_torch_through_the_ring_is_read_torch(torch, fixture, source, cpu_as_cuda):
    """Reader.read_torch "to the GPU" through the ring, from a file or from read-only
    bytes, unaligned tensors included: read_torch's tensors (dtype, shape, strides,
    bytes), one at a time and as a list, or read_torch's own error; and no warning of
    read-only memory."""
    path = os.path.join(REPO, "fixtures", fixture)
    if source == "file":
        reader = tw.Reader(path)
    elif fixture.startswith("sharded/"):
        pytest.skip("a shard index opens by path only")
    else:
        with open(path, "rb") as f:
            reader = tw.Reader(buffer=f.read())
    with reader as r, warnings.catch_warnings():
        warnings.simplefilter("error")
        want, got = {}, {}
        for name in r.keys():
            try:
                want[name] = r.read_torch(name)
            except (tw.TensorwireError, TypeError) as e:
                with pytest.raises(type(e)):
                    r.read_torch(name, device="cuda")
                continue
            got[name] = r.read_torch(name, device="cuda:0")
        listed = r.read_torch(list(want), device="cuda")
    assert sorted(listed) == sorted(want)
    for name, w in want.items():
        for g in (got[name], listed[name]):
            assert (g.dtype, g.shape, g.stride()) == (w.dtype, w.shape, w.stride()), name
            assert _torch_bytes(g) == _torch_bytes(w), name
    if any(w.numel() for w in want.values()):
        assert cpu_as_cuda, "nothing went through the ring"


def test_slices_through_the_ring_are_slices(torch, cpu_as_cuda, tmp_path):
    """safe_open(device=...).get_slice(name)[index]: contiguous parts through the ring,
    others moved by torch, all equal to the slices of the whole tensor."""
    t = torch.arange(10 * 300, dtype=torch.float32).reshape(10, 300)
    path = str(tmp_path / "s.safetensors")
    formats.torch.save_file({"t": t, "b": t.to(torch.bfloat16)}, path)
    with formats.safe_open(path, framework="pt", device="cuda") as f:
        for name, whole in (("t", t), ("b", t.to(torch.bfloat16))):
            part = f.get_slice(name)
            for index in (slice(2, 7), 3, (slice(1, 3), 4), (slice(None), slice(5, 9)),
                          (slice(2, 3), 4), (slice(2, 3), slice(4, 5)), (3, 4), slice(3, 3)):
                runs = len(cpu_as_cuda)
                got, want = part[index], whole[index]
                assert (got.dtype, got.shape) == (want.dtype, want.shape), (name, index)
                assert torch.equal(got, want), (name, index)
                staged = len(cpu_as_cuda) > runs
                assert staged == (want.is_contiguous() and want.numel() > 0), (name, index)
            assert torch.equal(f.get_tensor(name), whole)


def test_read_torch_copies_of_packet_quantized_tensors_are_their_integers(torch):
    path = os.path.join(REPO, "fixtures", "packet", "quant_qint8_per_tensor.tnso")
    with tw.Reader(path) as r:
        shared = r.read_torch("tensor")
        copied = r.read_torch("tensor", copy=True)
        into = torch.zeros_like(shared)
        r.read_into("tensor", into)
    assert shared.dtype == copied.dtype == torch.int8
    assert torch.equal(shared, copied) and torch.equal(shared, into)


def test_cache_values_and_tensors_go_to_the_device_through_the_ring(torch, cpu_as_cuda):
    """TensorCache.get(device="torch:cuda…") and Tensor.torch(device="cuda") copy the
    shared bytes straight through the ring (no host copy first): equal values, the
    dtype torch gives (bfloat16 from ml_dtypes too), shapes down to 0-d and empty; a
    value that is not C-contiguous is moved by torch."""
    from tensorwire.cache import TensorCache

    values = {
        "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
        "i64_scalar": np.array(-7, dtype=np.int64),
        "empty": np.zeros((0, 5), np.float16),
        "bool": np.arange(9) % 2 == 0,
        "fortran": np.asfortranarray(np.arange(20, dtype=np.int32).reshape(4, 5)),
    }
    try:
        import ml_dtypes
        values["bf16"] = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16)
    except ImportError:
        pass
    with TensorCache("4MB") as cache:
        for name, value in values.items():
            cache.put(name, value)
        for name, value in values.items():
            stored = cache.get(name)  # C-contiguous, as the cache keeps every array
            for source, get in ((stored, lambda: cache.get(name, device="torch:cuda")),
                                (stored, lambda: tw.Tensor({"data": stored}).torch(device="cuda")),
                                (value, lambda: tw.Tensor({"data": value}).torch(device="cuda"))):
                runs = len(cpu_as_cuda)
                got = get()
                want = _numpy_as_torch(torch, value)
                assert (got.dtype, got.shape) == (want.dtype, want.shape), name
                assert torch.equal(got, want), name
                staged = len(cpu_as_cuda) > runs
                assert staged == (source.flags.c_contiguous and source.size > 0), name
        # The CPU forms stay copies of the shared bytes, not views of them.
        got = cache.get("f32", device="torch")
        got += 1
        assert np.array_equal(cache.get("f32"), values["f32"])


def _numpy_as_torch(torch, value):
    if value.dtype.name == "bfloat16":
        return torch.from_numpy(value.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(value.copy(order="C"))


def _count_reads_for_torch(monkeypatch):
    """The names `Reader._read_for_torch` is called with from now on, in a list."""
    calls = []
    real = tw.Reader._read_for_torch

    def counting(self, n, **kw):
        calls.append(n)
        return real(self, n, **kw)

    monkeypatch.setattr(tw.Reader, "_read_for_torch", counting)
    return calls


@pytest.mark.parametrize("fixture,name,staged,reads", [
    ("numpy/compressed.npz", "fortran", True, 1),   # decoded once, Fortran order kept
    ("pytorch/views.pt", "transposed", True, 1),    # the file's bytes, strides kept
    ("pytorch/views.pt", "slice", False, 2),        # gaps between rows: torch moves it
    ("pytorch/views.pt", "expanded", False, 2),     # overlapping rows: torch moves it
    ("numpy/arrays.npz", "fortran", True, 2),       # unaligned: read_torch's own copy
])
def test_strided_tensors_to_the_device(torch, cpu_as_cuda, monkeypatch, fixture, name,
                                       staged, reads):
    """read_torch(device=...) of a strided tensor: one whose elements fill their span
    (Fortran order, transposed) goes through the ring from the bytes read once, strides
    kept; others are read_torch's CPU tensor moved. Either way, read_torch's tensor."""
    calls = _count_reads_for_torch(monkeypatch)
    with tw.Reader(os.path.join(REPO, "fixtures", fixture)) as r:
        want = r.read_torch(name)
        assert not want.is_contiguous()
        calls.clear()
        runs = len(cpu_as_cuda)
        got = r.read_torch(name, device="cuda")
    assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    assert torch.equal(got, want)
    assert (len(cpu_as_cuda) > runs, len(calls)) == (staged, reads)


@pytest.mark.parametrize("fixture,source", [
    ("pytorch/dtypes.legacy.pt", "file"),        # unaligned storages
    ("safetensors/dtypes.safetensors", "buffer"),  # read-only bytes
    ("numpy/arrays.npz", "buffer"),               # both
])
def test_row_major_tensors_to_the_device_are_read_once(torch, cpu_as_cuda, monkeypatch,
                                                        fixture, source):
    """Row-major tensors torch could not share on the CPU (unaligned, read-only) go
    through the ring from the bytes as they lie: one read, no host copy first."""
    real = tw.Reader._read_for_torch  # reads made here are not counted
    calls = _count_reads_for_torch(monkeypatch)
    path = os.path.join(REPO, "fixtures", fixture)
    if source == "file":
        reader = tw.Reader(path)
    else:
        with open(path, "rb") as f:
            reader = tw.Reader(buffer=f.read())
    checked = 0
    with reader as r:
        for name in r.keys():
            try:
                x = real(r, name, to_copy=True)
            except (tw.TensorwireError, TypeError):
                continue
            data = x[0] if isinstance(x, tuple) else x
            row_major = x[3] is None if isinstance(x, tuple) else x.flags.c_contiguous
            if not row_major or not data.nbytes:
                continue
            calls.clear()
            got = r.read_torch(name, device="cuda")
            assert calls == [name], name
            assert _torch_bytes(got) == _torch_bytes(r.read_torch(name, copy=True)), name
            checked += 1
    assert checked > 5
