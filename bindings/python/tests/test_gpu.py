"""Every path that touches a CUDA device, checked against torch on a real GPU: readers
and loaders moving tensors to ``cuda``, writers and the cache taking CUDA tensors, and
tensorwire.ipc sharing CUDA tensors between processes (views of one storage, dtypes,
empty and 0-d tensors, stream ordering, writes seen by both sides, echoes, leases and
mappings given back). Each test skips without torch and a CUDA device; the script
``scripts/device-check.sh`` runs them on a GPU machine."""

import os
import subprocess
import sys

import numpy as np
import pytest

import tensorwire as tw
from tensorwire import _staging, formats, ipc, pytorch
from tensorwire.cache import TensorCache

from conftest import REPO
from test_ipc import CHILD_HEAD, CHILD_SERVE, kill, start_server_process
from test_pytorch_load import _fixtures, compare_trees, same_as_loaded
from test_staging import count_ring_runs

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

PT = os.path.join(REPO, "fixtures", "pytorch")
ST = os.path.join(REPO, "fixtures", "safetensors")


@pytest.fixture
def sock(tmp_path):
    return str(tmp_path / "ipc.sock")


def _bits(t):
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _assert_same(got, want):
    """Same dtype, shape and bytes (NaNs and the dtypes torch.equal lacks included)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(_bits(got), _bits(want))


# ------------------------------------------------------------------ readers and loaders

@pytest.fixture(params=["default", "staged"])
def staging(request, monkeypatch):
    """As shipped (the fixtures are too small to stage: plain copies), or
    every CUDA copy through pinned buffers of an odd size, pieces ending anywhere."""
    if request.param == "staged":
        monkeypatch.setattr(_staging, "MIN_BYTES", 0)
        monkeypatch.setattr(_staging, "PIN_AFTER_BYTES", 0)
        monkeypatch.setattr(_staging, "SLOT_BYTES", 1000)
    return request.param


@pytest.mark.parametrize("fixture", [
    "pytorch/dtypes.pt", "pytorch/views.pt", "pytorch/dtypes.legacy.pt",
    "pytorch/big_endian.pt", "pytorch/torch_only.pt", "pytorch/torch_only.legacy.pt",
    "numpy/arrays.npz", "numpy/compressed.npz", "safetensors/dtypes.safetensors",
    "safetensors/raw_types.safetensors", "gguf/quantized.gguf", "zt/dtypes.zt",
    "zt/compressed.zt", "zt/v2/dtypes.zt", "packet/quant_qint8_per_tensor.tnso",
    "sharded/safetensors/model.safetensors.index.json",
])
def test_reader_read_torch_to_cuda(fixture, staging):
    """Every tensor read_torch gives on the CPU, on the GPU: same dtype (the torch-only
    float8_e8m0fnu and float4_e2m1fn_x2 included), shape and bytes; or the same error."""
    path = os.path.join(REPO, "fixtures", fixture)
    with tw.Reader(path) as r:
        readable = []
        for name in r.keys():
            try:
                cpu = r.read_torch(name)
            except (tw.TensorwireError, TypeError) as e:
                with pytest.raises(type(e)):
                    r.read_torch(name, device="cuda")
                continue
            readable.append(name)
            for copy in (False, True):
                t = r.read_torch(name, device="cuda", copy=copy)
                assert t.is_cuda
                _assert_same(t, cpu)
                if not copy and _staging.fills_span(cpu.shape, cpu.stride()):
                    # Fortran-order and transposed tensors keep their strides (views
                    # with gaps become contiguous, as torch's .to makes them).
                    assert t.stride() == cpu.stride(), name
        assert readable
        moved = r.read_torch(readable, device="cuda:0")
        assert all(t.device == torch.device("cuda", 0) for t in moved.values())


@pytest.mark.parametrize("fixture", ["shared.pt", "views.pt", "module.pt", "shared.legacy.pt"])
def test_pytorch_load_to_cuda_matches_torch(fixture, staging):
    path = os.path.join(PT, fixture)
    want = torch.load(path, map_location="cuda", weights_only=True)
    for location in ("cuda", "cuda:0", torch.device("cuda", 0), {"cpu": "cuda:0"}):
        got = pytorch.load(path, map_location=location)
        for name, t in got.items():
            assert t.is_cuda, (location, name)
        # Same tensors, and tensors that share a storage in the file share it on the GPU.
        ours = pytorch.load(path, map_location=location, flat=False)
        _compare_structures(ours, want)


def _compare_structures(ours, want):
    if isinstance(want, torch.Tensor):
        assert isinstance(ours, torch.Tensor) and ours.device == want.device
        assert ours.stride() == want.stride() and ours.storage_offset() == want.storage_offset()
        _assert_same(ours, want)
        return
    if isinstance(want, dict):
        assert list(ours) == list(want)
        for k in want:
            _compare_structures(ours[k], want[k])
        return
    if isinstance(want, (list, tuple)):
        assert len(ours) == len(want)
        for a, b in zip(ours, want):
            _compare_structures(a, b)
        return
    assert ours == want


@pytest.mark.parametrize("path,spec", _fixtures())
def test_pytorch_load_of_every_fixture_to_cuda_is_torch_load(path, spec, staging):
    """Every checkpoint fixture that reads (quantized tensors, empty tensors past their
    storage's end, torch values, ...), sent to the GPU: the same objects as torch's,
    down to strides and storage offsets, or the error torch raises."""
    import warnings

    name = os.path.basename(path)
    if name == "big_endian.pt":
        pytest.skip("torch leaves uint16/32/64 of big-endian files unswapped; we swap")
    want = refused = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's quantized dtypes are deprecated
        # Our own fixtures, safe to unpickle: weights_only=False where torch's weights-only
        # loader cannot read the framing (protocols 4 and 5) or the legacy v3 storages.
        for weights_only in (True, False):
            try:
                want = torch.load(path, map_location="cuda", weights_only=weights_only)
                break
            except Exception as e:  # noqa: BLE001 - its type is what we compare
                refused = e
        if want is None:
            try:
                torch.load(path, map_location="cpu", weights_only=False)
            except Exception:  # noqa: BLE001
                pytest.skip(f"torch cannot read this file: {type(refused).__name__}")
            # torch cannot build these tensors on the GPU: neither can we, with its error.
            with pytest.raises(type(refused)):
                pytorch.load(path, map_location="cuda", flat=False)
            return
        got = pytorch.load(path, map_location="cuda", flat=False)
    compare_trees(got, want, same_as_loaded, name)


@pytest.mark.parametrize("fixture", ["shared.pt", "shared.legacy.pt", "views.pt"])
def test_pytorch_load_keeps_shared_storages_on_cuda(fixture, staging):
    path = os.path.join(PT, fixture)
    got = pytorch.load(path, map_location="cuda")
    want = torch.load(path, map_location="cuda", weights_only=True)
    assert _storage_groups(got.values()) == _storage_groups(_leaves(want))
    assert len(_storage_groups(got.values())) < len(got), "the fixture shares storages"


def _leaves(obj):
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [leaf for item in obj for leaf in _leaves(item)]
    return []


def _storage_groups(tensors):
    """Sizes of the groups of tensors sharing one storage."""
    by_ptr = {}
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        by_ptr[key] = by_ptr.get(key, 0) + 1
    return sorted(by_ptr.values())


def _big_state_dict():
    """About 70 MiB of tensors of several dtypes, a tied pair, a transposed view and
    an empty tensor: over ``_staging.MIN_BYTES``, in several 16 MiB buffers."""
    g = torch.Generator().manual_seed(7)
    sd = {f"layer{i}.weight": torch.randn(1000 + 13 * i, 1024, generator=g) for i in range(12)}
    sd["embed"] = torch.randn(3001, 517, generator=g).to(torch.bfloat16)
    sd["codes"] = torch.randint(-128, 127, (4_000_001,), dtype=torch.int8, generator=g)
    sd["mask"] = torch.rand(333, 77, generator=g) > 0.5
    sd["lm_head"] = sd["embed"]  # tied: one storage
    sd["transposed"] = torch.randn(700, 300, generator=g).t()
    sd["slice"] = sd["layer3.weight"][5:905:3]
    sd["empty"] = torch.empty(0, 4)
    return sd


@pytest.mark.parametrize("zip_format", [True, False])
def test_large_checkpoint_through_the_ring_is_torch_load(tmp_path, monkeypatch, zip_format):
    import warnings

    monkeypatch.setattr(_staging, "SLOT_BYTES", 16 << 20)
    monkeypatch.setattr(_staging, "PIN_AFTER_BYTES", 0)
    monkeypatch.setattr(_staging, "BATCH_BYTES", 24 << 20)  # about three batches
    rings = count_ring_runs(monkeypatch)
    path = str(tmp_path / "big.pt")
    torch.save(_big_state_dict(), path, _use_new_zipfile_serialization=zip_format)
    with open(path, "rb") as f:
        data = f.read()
    for location in ("cuda", "cuda:0", torch.device("cuda"), {"cpu": "cuda:0"}, "bytes"):
        want = torch.load(path, map_location=location if location != "bytes" else "cuda",
                          weights_only=True)
        if location == "bytes":  # read-only host bytes: no warning from torch either
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                got = pytorch.load(data, map_location="cuda")
        else:
            got = pytorch.load(path, map_location=location)
        assert list(got) == list(want)
        for name in want:
            same_as_loaded(got[name], want[name], name)
        assert got["lm_head"].untyped_storage().data_ptr() == got["embed"].untyped_storage().data_ptr()
        # The bytes are there when load returns, for any stream.
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            total = got["layer11.weight"].double().sum()
        side.synchronize()
        assert total.item() == want["layer11.weight"].double().sum().item()
    assert len(rings) >= 5 * 2


def test_large_safetensors_through_the_ring(tmp_path, monkeypatch):
    monkeypatch.setattr(_staging, "SLOT_BYTES", 16 << 20)
    monkeypatch.setattr(_staging, "MIN_BYTES", 1 << 20)
    monkeypatch.setattr(_staging, "PIN_AFTER_BYTES", 0)
    rings = count_ring_runs(monkeypatch)
    sd = {k: v.contiguous() for k, v in _big_state_dict().items() if k not in ("lm_head", "slice")}
    path = str(tmp_path / "big.safetensors")
    formats.torch.save_file(sd, path)
    got = formats.load_file(path, framework="pt", device="cuda:0")
    with tw.Reader(path) as r:
        some = r.read_torch(["embed", "codes"], device="cuda")
        one = r.read_torch("layer0.weight", device=torch.device("cuda", 0))
    for name, t in sd.items():
        assert got[name].device == torch.device("cuda", 0)
        _assert_same(got[name], t)
    _assert_same(some["embed"], sd["embed"])
    _assert_same(some["codes"], sd["codes"])
    _assert_same(one, sd["layer0.weight"])
    assert len(rings) == 3


def test_checkpoint_saved_from_cuda(tmp_path):
    """A checkpoint torch saved from GPU tensors: saved locations are "cuda:0"; tensors
    stay on the CPU unless asked (documented), and go back to the GPU when mapped."""
    torch.manual_seed(0)
    state = {"w": torch.randn(64, 32, device="cuda"), "b": torch.arange(8, device="cuda"),
             "h": torch.randn(4, device="cuda").half()}
    state["wt"] = state["w"].t()
    path = str(tmp_path / "gpu.pt")
    torch.save(state, path)
    on_cpu = pytorch.load(path)
    assert all(t.device.type == "cpu" for t in on_cpu.values())
    for name, t in state.items():
        _assert_same(on_cpu[name], t)
    back = pytorch.load(path, map_location={"cuda:0": "cuda:0"})
    want = torch.load(path, weights_only=True)
    _compare_structures(back, want)
    assert back["wt"].untyped_storage().data_ptr() == back["w"].untyped_storage().data_ptr()
    kept = pytorch.load(path, map_location=lambda storage, loc: storage)
    assert all(t.device.type == "cpu" for t in kept.values())


def test_safetensors_api_on_cuda(tmp_path, staging):
    path = os.path.join(ST, "dtypes.safetensors")
    with formats.safe_open(path, framework="pt", device="cuda:0") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            assert t.device == torch.device("cuda", 0)
            if t.dim():
                first = f.get_slice(name)[:1]
                assert first.device == torch.device("cuda", 0)
                assert torch.equal(first.cpu(), t[:1].cpu())
                if t.dim() > 1:  # not contiguous (unless one row): moved by torch itself
                    assert torch.equal(f.get_slice(name)[:, 1:].cpu(), t[:, 1:].cpu())
    ours = formats.load_file(path, framework="pt", device="cuda:0")
    st = pytest.importorskip("safetensors.torch")
    theirs = st.load_file(path, device="cuda:0")
    assert list(ours) == list(theirs) or sorted(ours) == sorted(theirs)
    for name in theirs:
        assert ours[name].device == theirs[name].device
        _assert_same(ours[name], theirs[name])

    # Saving GPU tensors, as safetensors.torch does.
    out = str(tmp_path / "gpu.safetensors")
    torch.manual_seed(1)
    state = {"a": torch.randn(3, 5, device="cuda"), "b": torch.ones(2, device="cuda").bfloat16()}
    formats.torch.save_file(state, out)
    for name, t in st.load_file(out).items():
        _assert_same(t, state[name])


def test_writer_takes_cuda_tensors(tmp_path):
    path = str(tmp_path / "gpu.zt")
    torch.manual_seed(2)
    t = torch.randn(7, 3, device="cuda")
    with tw.Writer(path) as w:
        w.write_torch("t", t)
        w.write_torch("tt", t.t())
        w.write_torch("bf", t.bfloat16())
    with tw.Reader(path) as r:
        _assert_same(r.read_torch("t"), t)
        _assert_same(r.read_torch("tt"), t.t().contiguous())
        _assert_same(r.read_torch("bf"), t.bfloat16())
        dst = torch.empty(7, 3, device="cuda")
        r.read_into("t", dst)
        _assert_same(dst, t)


def test_cache_takes_and_gives_cuda_tensors(staging):
    torch.manual_seed(3)
    t = torch.randn(16, 16, device="cuda")
    with TensorCache("8MB") as cache:
        cache.put("t", t)
        cache.put("bf", t.bfloat16())
        got = cache.get("t", device="torch:cuda:0")
        assert got.device == torch.device("cuda", 0)
        _assert_same(got, t)
        bf = cache.get("bf", device="torch:cuda")
        _assert_same(bf, t.bfloat16())
        _assert_same(tw.Tensor({"data": cache.get("t")}).torch(device="cuda"), t)
        try:
            import cupy  # noqa: F401 - only whether it is there
        except ImportError:
            return
        c = cache.get("t", device="cupy:0")
        np.testing.assert_array_equal(c.get(), t.cpu().numpy())


# ------------------------------------------------------------------ ipc

CHILD_CUDA = CHILD_HEAD + """

@p.share(managed=True)
def views():
    torch.manual_seed(0)
    big = torch.randn(64, 32, device="cuda")
    return {"big": big, "row": big[3], "t": big.t(), "tail": big[60:, 8:],
            "small_a": torch.arange(5, device="cuda"), "small_b": torch.ones(3, device="cuda")}

@p.share(cache=False)
def dtypes():
    out = {}
    for dt in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
               torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
               torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2):
        out[str(dt)] = (torch.arange(12, device="cuda") % 5).to(dt).reshape(3, 4)
    return out

@p.share(cache=False)
def odd():
    return {"empty": torch.empty(0, 3, device="cuda"), "scalar": torch.tensor(2.5, device="cuda")}

@p.share(cache=False)
def slow_fill(n: int):
    x = torch.zeros(n, device="cuda")
    y = torch.zeros(n, device="cuda", dtype=torch.int32)
    torch.cuda._sleep(1_500_000_000)   # about a second of GPU time before the fills
    x.fill_(7.0)
    y.fill_(9)
    return {"x": x, "y": y}

@p.share(managed=True)
def board():
    return torch.zeros(16, device="cuda")

@p.share(cache=False)
def echo(x):
    return x

@p.share(cache=False)
def add_one(t):
    return t + 1

@p.share(cache=False)
def total(t):
    return float(t.sum())

_kept = {}

@p.share(cache=False)
def keep(x):
    _kept["x"] = x

@p.share(cache=False)
def kept():
    return _kept["x"]

""" + CHILD_SERVE


@pytest.fixture
def cuda_server(sock):
    if not ipc.cuda_available():
        pytest.skip("tensorwire found no CUDA driver")
    proc, _ = start_server_process(sock, code=CHILD_CUDA)
    yield proc
    if proc.poll() is None:
        kill(proc)


def _want_views():
    torch.manual_seed(0)
    big = torch.randn(64, 32, device="cuda")
    return {"big": big, "row": big[3], "t": big.t(), "tail": big[60:, 8:],
            "small_a": torch.arange(5, device="cuda"), "small_b": torch.ones(3, device="cuda")}


def test_ipc_views_of_one_storage(sock, cuda_server):
    with ipc.Client(sock, timeout=60) as c:
        before = ipc.cuda_import_stats()
        with c.call("views") as h:
            got, want = h.value, _want_views()
            for name, t in want.items():
                assert got[name].is_cuda
                assert got[name].stride() == t.stride(), name
                _assert_same(got[name], t)
            base = got["big"].untyped_storage().data_ptr()
            for name in ("row", "t", "tail"):
                assert got[name].untyped_storage().data_ptr() == base, name
            assert got["row"].data_ptr() == got["big"][3].data_ptr()
            opened = ipc.cuda_import_stats()[0] - before[0]
            # The small tensors live in blocks of torch's caching allocator: one open
            # per allocation, not per tensor.
            assert 1 <= opened <= 3, opened
        del got, h
        import gc

        gc.collect()
        assert ipc.cuda_import_stats()[1] == before[1], "mappings closed with the views"


def test_ipc_every_cuda_dtype(sock, cuda_server):
    with ipc.Client(sock, timeout=60) as c:
        got = c.call("dtypes")
        for name, t in got.items():
            want_dtype = getattr(torch, name.split(".")[1])
            want = (torch.arange(12) % 5).to(want_dtype).reshape(3, 4)
            assert t.is_cuda and t.dtype == want_dtype
            assert torch.equal(_bits(t), _bits(want)), name


def test_ipc_empty_and_scalar_cuda_tensors(sock, cuda_server):
    with ipc.Client(sock, timeout=60) as c:
        got = c.call("odd")
        assert got["empty"].shape == (0, 3) and got["empty"].is_cuda
        assert got["scalar"].shape == () and float(got["scalar"]) == 2.5
        back = c.call("echo", torch.empty(0, 2, device="cuda"))
        assert back.shape == (0, 2) and back.is_cuda


def test_ipc_waits_for_the_producers_stream(sock, cuda_server):
    with ipc.Client(sock, timeout=60) as c:
        got = c.call("slow_fill", n=1 << 22)
        # Two storages, one producer event: each is read after the fills.
        assert bool((got["x"] == 7).all()), "read before the producer's kernels finished"
        assert bool((got["y"] == 9).all()), "read before the producer's kernels finished"


def test_ipc_writes_seen_by_both_sides(sock, cuda_server):
    with ipc.Client(sock, timeout=60) as c, ipc.Client(sock, timeout=60) as c2:
        with c.call("board") as h:
            h.value[3] = 5.0
            torch.cuda.synchronize()
            with c2.call("board") as h2:
                assert float(h2.value[3]) == 5.0
            assert c.call("total", h.value) == 5.0
            # The server's own memory, back from us, is rebuilt on its own storage.
            assert c.call("total", h.value[2:5]) == 5.0


def test_ipc_client_tensors_to_server(sock, cuda_server):
    torch.manual_seed(4)
    with ipc.Client(sock, timeout=60) as c:
        t = torch.randn(1000, device="cuda")
        _assert_same(c.call("add_one", t), t + 1)
        view = torch.randn(40, 50, device="cuda")[5:, ::2]
        _assert_same(c.call("add_one", view), view + 1)
        pending = torch.zeros(1 << 22, device="cuda")
        torch.cuda._sleep(1_500_000_000)
        pending.fill_(3.0)
        assert c.call("total", pending) == 3.0 * (1 << 22), "server read before our fill"


def test_ipc_echo_of_a_received_cuda_tensor(sock, cuda_server):
    """The server returns the tensor it received: memory it imported, not its own."""
    torch.manual_seed(5)
    with ipc.Client(sock, timeout=60) as c:
        t = torch.randn(33, device="cuda")
        back = c.call("echo", t)
        _assert_same(back, t)
        assert back.data_ptr() == t.data_ptr(), "our own memory comes back as itself"
        view = t[5:20:3]
        back = c.call("echo", {"v": view, "t": t})
        assert back["v"].data_ptr() == view.data_ptr() and back["v"].stride() == (3,)
        assert back["t"].untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        back["t"][0] = 42.0
        assert float(t[0]) == 42.0


def test_ipc_memory_passed_on_to_a_third_process(sock, cuda_server):
    """The server keeps a tensor it got from us and hands it to another client: it goes
    out as our export (the server's mapping has no handle of its own), and comes back to
    us as our own memory."""
    torch.manual_seed(6)
    t = torch.randn(1000, device="cuda", dtype=torch.float64)
    with ipc.Client(sock, timeout=60) as c:
        c.call("keep", t[100:])
        reader = ("import sys, torch\nfrom tensorwire import ipc\n"
                  "x = ipc.Client(sys.argv[1], timeout=60).call('kept')\n"
                  "print(repr(float(x.sum())), x.shape[0])\n")
        out = subprocess.run([sys.executable, "-c", reader, sock], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        total, n = out.stdout.split()
        assert int(n) == 900 and float(total) == float(t[100:].sum())
        back = c.call("kept")
        assert back.data_ptr() == t[100:].data_ptr()
        c.call("keep", None)


def test_ipc_own_memory_no_tensor_holds_any_more_is_refused(sock, cuda_server):
    """The server kept a tensor of ours; we dropped ours. Sent back, that memory is
    still allocated in torch's cache (the handle resolves) but no storage here owns it:
    a ValueError, never a tensor over memory torch may hand to someone else."""
    import gc

    with ipc.Client(sock, timeout=60) as c:
        t = torch.randn(1000, device="cuda")
        c.call("keep", t)
        del t
        gc.collect()
        with pytest.raises(ValueError, match="no tensor here holds"):
            c.call("kept")
        c.call("keep", None)


def test_ipc_server_killed_while_client_holds_cuda_view(sock, cuda_server):
    with ipc.Client(sock, timeout=60) as c:
        got = c.call("views")
        value = got.value["big"].clone()
        kill(cuda_server)
        with pytest.raises(ipc.ServerGoneError):
            c.call("views")
        # What a view reads after its exporter died is the driver's business; it must
        # not crash this process, and the copy made before stays right.
        assert torch.equal(value, _want_views()["big"])
        del got


def test_ipc_refuses_memory_it_cannot_export(sock, tmp_path):
    """Tensors from torch's expandable segments (cuMemCreate) have no legacy IPC handle:
    sharing one is a typed error, not a crash."""
    code = CHILD_HEAD + """
@p.share(cache=False)
def grown():
    return torch.ones(1 << 20, device="cuda")
""" + CHILD_SERVE
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    proc, _ = start_server_process(sock, code=code, env=env)
    try:
        with ipc.Client(sock, timeout=60) as c:
            try:
                t = c.call("grown")
            except ipc.RemoteError as err:
                assert "cuIpcGetMemHandle" in str(err) or "export" in str(err), err
            else:
                assert float(t.sum()) == float(1 << 20)
    finally:
        kill(proc)
