"""tensorwire.ipc between real processes: CPU tensors through memfds (zero-copy both
ways, writes shared), leases given back when a client is SIGKILLed, a dead server as a
typed error, refused peers, malformed and oversized frames, singleflight, the task
lifecycle, the environment gate, torch modules (skipped without torch) and CUDA
(skipped without a GPU)."""

import concurrent.futures
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tensorwire import ipc

from conftest import ML_DTYPES, PLAIN_DTYPES, np_dtype, sample

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER_SCRIPT = os.path.join(HERE, "ipc_server.py")


def start_server_process(path, env=None, code=None):
    """A server in another process: ipc_server.py, or ``code`` (which serves on
    ``sys.argv[1]``); returns it and its server id once it says ``ready``."""
    program = ["-c", code] if code is not None else [SERVER_SCRIPT]
    proc = subprocess.Popen(
        [sys.executable, *program, path],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})})
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r} {proc.stderr.read()}")
    return proc, line.split()[1]


def kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.fixture
def sock(tmp_path):
    return str(tmp_path / "ipc.sock")


@pytest.fixture
def server_proc(sock):
    proc, server_id = start_server_process(sock)
    yield proc, server_id
    if proc.poll() is None:
        kill(proc)


@pytest.fixture
def client(sock, server_proc):
    with ipc.Client(sock, timeout=20) as c:
        yield c


def in_process_server(path, **kwargs):
    """A provider + server in this process with the test endpoints."""
    sys.path.insert(0, HERE)
    try:
        import ipc_server
    finally:
        sys.path.remove(HERE)
    provider = ipc_server.endpoints(ipc.Provider(execution_mode="server", socket_path=path,
                                                 autostart=False))
    return ipc.Server(provider, **kwargs).start(), ipc_server


# ------------------------------------------------------------------ CPU tensors


@pytest.mark.parametrize("name", PLAIN_DTYPES + ML_DTYPES)
def test_every_dtype_round_trips_between_processes(client, name):
    dt = np_dtype(name)
    arr = sample(dt, (3, 5), seed=7)
    back = client.call("echo", arr)
    assert back.dtype == arr.dtype and back.shape == arr.shape
    assert back.tobytes() == arr.tobytes()


def test_structures_scalars_and_odd_arrays(client):
    big_endian = np.arange(6, dtype=">i4").reshape(2, 3)
    value = {
        "t": (1, 2.5, "s", b"\x00\x01", None, True),
        "nested": [{"a": np.float32(3.5)}, []],
        "zero_d": np.array(7.0),
        "empty": np.zeros((0, 4), np.int16),
        "transposed": np.arange(12.0).reshape(3, 4).T,
        "big_endian": big_endian,
    }
    back = client.call("echo", value)
    assert back["t"] == (1, 2.5, "s", b"\x00\x01", None, True)
    assert back["nested"] == [{"a": 3.5}, []]
    assert back["zero_d"].shape == () and back["zero_d"] == 7.0
    assert back["empty"].shape == (0, 4) and back["empty"].dtype == np.int16
    np.testing.assert_array_equal(back["transposed"], value["transposed"])
    np.testing.assert_array_equal(back["big_endian"], big_endian)
    assert back["big_endian"].dtype == np.dtype("<i4")
    args, kwargs = client.call("echo", 1, 2, k=np.ones(3))
    assert args == (1, 2) and np.array_equal(kwargs["k"], np.ones(3))


def test_echo_is_zero_copy_both_ways(client):
    arr = ipc.share_memory(np.random.default_rng(0).random((512, 512)))
    back = client.call("echo", arr)
    # The server received our memfd and sent the same range back: it maps to our memory.
    assert np.shares_memory(back, arr)
    again = client.call("echo", back)
    assert np.shares_memory(again, arr)
    # A heap array is copied into shared memory once; the echo comes back as that copy.
    heap = np.arange(1000, dtype=np.float64)
    echoed = client.call("echo", heap)
    assert not np.shares_memory(echoed, heap) and np.array_equal(echoed, heap)


def test_share_memory_resolves_conjugate_and_negative_views():
    torch = pytest.importorskip("torch")
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    for view in (z.conj(), z.conj().imag):
        shared = ipc.share_memory(view)
        assert not shared.is_conj() and not shared.is_neg()
        assert torch.equal(shared, view.resolve_conj().resolve_neg())


def test_clients_and_server_share_writes(sock, client):
    with client.call("shared", n=8) as handle:
        x = handle.value["x"]
        assert x.flags.writeable
        x[0] = 42.0
        assert client.call("peek_shared", n=8) == 42.0
        # A second client sees the same memory.
        with ipc.Client(sock) as other:
            with other.call("shared", n=8) as h2:
                assert h2.value["x"][0] == 42.0
                assert h2.object_id == handle.object_id


def test_managed_results_cache_and_leases(client):
    h1 = client.call("table", n=16)
    h2 = client.call("table", 16)   # same key through positional args
    assert isinstance(h1, ipc.SharedObjectHandle)
    assert h1.object_id == h2.object_id and h1.server_id == client.server_id
    np.testing.assert_array_equal(h1.value["x"], np.arange(16, dtype=np.float32))
    info = h1.get_object_info()
    assert info["refcount"] == 2 and info["endpoint"] == "table"
    assert info["cache_key"] == "table:16" and info["nbytes"] == 64
    assert h1.release() and not h1.release()
    h2.release()
    assert client.get_object_info(h1.object_id)["refcount"] == 0   # still cached
    assert client.invalidate_call_cache("table", n=16)
    assert client.get_object_info(h1.object_id) is None
    with pytest.raises(ipc.StaleHandleError):
        client.ensure_handle_live(h1)
    assert h1.is_stale()
    client.call("table", n=1).release()
    client.call("table", n=2).release()
    assert client.invalidate_endpoint_cache("table") == 2


def test_lease_given_back_when_client_is_killed(sock):
    server, _ = in_process_server(sock)
    try:
        code = (
            "import sys, time\n"
            "from tensorwire import ipc\n"
            "c = ipc.Client(sys.argv[1])\n"
            "h = c.call('table', n=1000)\n"
            "print('leased', flush=True)\n"
            "time.sleep(600)\n"
        )
        child = subprocess.Popen([sys.executable, "-c", code, sock],
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "leased"
        assert server.live() == (1, 1)
        kill(child)
        deadline = time.time() + 10
        while server.live()[1] != 0:
            assert time.time() < deadline, "the killed client's lease was not given back"
            time.sleep(0.02)
        assert server.live() == (1, 0)   # still cached for the next caller
        counters = server.info()["counters"]
        assert counters["leases_dropped_on_disconnect"] == 1
    finally:
        server.stop()


def test_dead_server_is_a_typed_error(sock):
    proc, server_id = start_server_process(sock)
    c = ipc.Client(sock)
    handle = c.call("table", n=4)
    assert c.ping()
    kill(proc)
    with pytest.raises(ipc.ServerGoneError) as info:
        c.call("table", n=4)
    assert info.value.server_id == server_id
    assert isinstance(info.value, ConnectionError)
    assert not c.ping()
    with pytest.raises(ipc.ServerGoneError):
        ipc.Client(sock)
    # Arrays already received stay readable: their memfd is mapped in this process.
    assert handle.value["x"][3] == 3.0
    # A new server on the same socket: the old handle is stale.
    proc, new_id = start_server_process(sock)
    try:
        c2 = ipc.Client(sock)
        assert c2.server_id == new_id != server_id
        with pytest.raises(ipc.StaleHandleError) as info:
            c2.ensure_handle_live(handle)
        assert info.value.server_id == server_id
        # The old client connects to the new server by itself; its handle stays stale.
        assert c.call("table", n=4).server_id == new_id == c.server_id
        assert handle.is_stale()
    finally:
        kill(proc)


def test_old_handles_after_a_restart_are_stale_through_their_own_client(sock):
    """The handle's own client finds the restarted server: the handle is stale, its
    release is False (its lease went with the old server), `with` exits quietly."""
    proc, _ = start_server_process(sock)
    c = ipc.Client(sock)
    handle = c.call("table", n=4)
    kill(proc)
    proc, _ = start_server_process(sock)
    try:
        with pytest.raises(ipc.StaleHandleError):
            c.ensure_handle_live(handle)
        assert c.get_object_info(handle.object_id) is None
        with handle:
            pass
        assert handle.released and not handle.release()
    finally:
        kill(proc)


def test_threads_reconnecting_one_client_keep_their_leases(sock):
    """Threads that find the server restarted together connect once: every handle
    they get is live, with its lease held."""
    proc, _ = start_server_process(sock)
    c = ipc.Client(sock)
    c.call("table", n=1).release()
    kill(proc)
    server, _ = in_process_server(sock)
    try:
        barrier = threading.Barrier(4)

        def call():
            barrier.wait()
            return c.call("table", n=8)

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            handles = list(pool.map(lambda _: call(), range(4)))
        assert server.live() == (1, 4)
        assert not any(h.is_stale() for h in handles)
        assert all(h.release() for h in handles)
    finally:
        c.close()
        server.stop()


def test_a_request_to_a_server_that_does_not_read_times_out(sock):
    """The timeout covers sending too: a large request to a server busy on this
    connection fails after about the timeout, not when the server gets to it."""
    provider = ipc.Provider(execution_mode="server", socket_path=sock, autostart=True)
    provider.register(time.sleep, name="nap", cache=False)
    provider.register(len, name="size", cache=False)
    try:
        # Connected with a long timeout (a loaded machine may answer the greeting
        # late); only the calls below have the short one.
        c = ipc.Client(sock, timeout=20)
        assert c.ping()
        with pytest.raises(ValueError, match="positive seconds"):
            c.timeout = -1
        assert c.timeout == 20
        c.timeout = 0.5   # the live connection's next requests wait no longer
        with pytest.raises(ipc.IpcTimeoutError):
            c.call("nap", 6)   # the server is now busy on this connection for 6 s
        start = time.monotonic()
        with pytest.raises(ipc.IpcTimeoutError):
            c.call("size", b"x" * (16 << 20))
        assert time.monotonic() - start < 4
        # The request was cut off mid-way, so that connection is closed: the client
        # connects again by itself.
        c.timeout = 20
        assert c.ping()
        assert c.call("size", b"xyz") == 3
    finally:
        provider.close()


def test_other_uids_are_refused(sock):
    server, _ = in_process_server(sock, allowed_uids=[os.geteuid() + 1])
    try:
        with pytest.raises(ipc.PeerRefusedError, match=f"uid {os.geteuid()}"):
            ipc.Client(sock)
        assert issubclass(ipc.PeerRefusedError, PermissionError)
        assert server.info()["counters"]["peers_refused"] == 1
        assert os.stat(sock).st_mode & 0o777 == 0o600
    finally:
        server.stop()


def _read_frame(s):
    header = b""
    while len(header) < 16:
        chunk = s.recv(16 - len(header))
        assert chunk, "connection closed before an answer"
        header += chunk
    magic, version, kind, nfds, rid, blen = struct.unpack("<4sHBBII", header)
    body = b""
    while len(body) < blen:
        body += s.recv(blen - len(body))
    return magic, rid, body


def test_malformed_and_oversized_frames(sock):
    server, _ = in_process_server(sock, max_request_bytes=4096)
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock)
        s.sendall(b"GET / HTTP/1.1\r\n\r\n")
        magic, rid, body = _read_frame(s)
        assert magic == b"TWIP" and rid == 0 and b"magic" in body
        s.close()

        s = socket.socket(socket.AF_UNIX)
        s.connect(sock)
        s.sendall(struct.pack("<4sHBBII", b"TWIP", 2, 1, 0, 7, 1 << 30))
        _, rid, body = _read_frame(s)
        assert b"above the limit" in body
        s.close()

        # A body that is not a message: an error for that request; the connection lives.
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock)
        s.sendall(struct.pack("<4sHBBII", b"TWIP", 2, 1, 0, 5, 3) + b"\xff\x00\x13")
        _, rid, body = _read_frame(s)
        assert rid == 5 and b"BadRequest" in body
        s.close()

        # Through the client: a request over the server's cap.
        c = ipc.Client(sock)
        with pytest.raises(ipc.RemoteError) as info:
            c.call("echo", b"x" * 10000)
        assert info.value.kind == "BadRequest"
        assert ipc.Client(sock).ping()
    finally:
        server.stop()


def test_close_gives_back_leases(sock):
    server, _ = in_process_server(sock)
    try:
        c = ipc.Client(sock)
        handle = c.call("table", n=3)
        assert server.live() == (1, 1)
        c.close()
        deadline = time.time() + 5
        while server.live()[1]:
            assert time.time() < deadline
            time.sleep(0.02)
        with pytest.raises(ipc.ProtocolError, match="closed"):
            c.call("table", n=3)
        assert handle.value["x"][2] == 2.0   # the memory itself stays mapped here
    finally:
        server.stop()


def test_endpoint_names_are_unique(sock):
    provider = ipc.Provider(execution_mode="local")
    provider.register(lambda: 1, name="one")
    with pytest.raises(ValueError, match="already registered"):
        provider.register(lambda: 2, name="one")


def test_unshareable_values_and_endpoint_errors(client):
    with pytest.raises(TypeError, match="cannot share a set"):
        client.call("echo", {1, 2})
    with pytest.raises(TypeError, match="str"):
        client.call("echo", {1: "int key"})
    with pytest.raises(ipc.RemoteError, match="KeyError") as info:
        client.call("fails")
    assert info.value.kind == "EndpointFailed"
    with pytest.raises(ipc.RemoteError, match="cannot share a set"):
        client.call("unshareable")
    # A cache_format_key naming no argument is the endpoint's fault, said once.
    with pytest.raises(ipc.RemoteError, match="cache key: KeyError: 'missing'") as info:
        client.call("badly_keyed", 3)
    assert info.value.kind == "EndpointFailed"
    assert str(info.value).count("from server") == 1, str(info.value)
    with pytest.raises(ipc.RemoteError) as info:
        client.call("no_such_endpoint")
    assert info.value.kind == "UnknownEndpoint"


def test_singleflight_builds_once(sock, server_proc):
    results = []

    def call():
        with ipc.Client(sock) as c:
            # The build lasts until the five other callers wait on it.
            results.append(c.call("slow", k=21, waiters=5))

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [42] * 6
    with ipc.Client(sock) as c:
        assert c.call("slow_builds") == 1
        assert c.get_server_info()["counters"]["singleflight_waits"] == 5


def test_task_lifecycle(sock, server_proc):
    c = ipc.AsyncClient(sock)
    # The one worker holds `long` until the gate opens: `queued` is still queued.
    long_id = c.submit("held", 300)
    queued = c.submit("build", 1)
    failing = c.submit("build", 13)
    assert c.cancel(queued)
    assert c.status(queued).status == ipc.TaskStatus.CANCELLED
    with pytest.raises(ipc.IpcTimeoutError):
        c.wait(long_id, timeout=0.01)
    c.call("open_gate")
    np.testing.assert_array_equal(c.wait(long_id, timeout=10), np.full(4, 300))
    info = c.status(long_id)
    assert info.status == ipc.TaskStatus.COMPLETED and info.completed_at >= info.started_at
    with pytest.raises(ipc.RemoteError, match="ValueError: unlucky thirteen") as e:
        c.wait(failing, timeout=10)
    assert e.value.kind == "EndpointFailed"
    with pytest.raises(ipc.RemoteError) as e:
        c.result(queued)
    assert e.value.kind == "Cancelled"
    assert set(c.list_tasks()) == {long_id, queued, failing}
    assert list(c.list_tasks("failed")) == [failing]
    with pytest.raises(ipc.RemoteError) as e:
        c.status("nope")
    assert e.value.kind == "UnknownTask"
    # A direct call of a task endpoint runs on the pool and waits.
    np.testing.assert_array_equal(c.call("build", 5), np.full(4, 5))


def test_environment_gate(sock, monkeypatch):
    monkeypatch.delenv(ipc.ENV_ENABLED, raising=False)
    monkeypatch.delenv(ipc.ENV_ROLE, raising=False)
    local = ipc.Provider(socket_path=sock)
    assert local.execution_mode == "local"
    ran = []

    @local.share()
    def add(a, b=1):
        ran.append(os.getpid())
        return a + b

    assert add(2) == 3 and ran == [os.getpid()]   # runs here, no server needed

    # The same code with the gate on: one process serves, this one calls.
    proc, _ = start_server_process(sock, env={ipc.ENV_ENABLED: "1", ipc.ENV_ROLE: "server"})
    try:
        monkeypatch.setenv(ipc.ENV_ENABLED, "1")
        remote = ipc.Provider(socket_path=sock)
        assert remote.execution_mode == "client"

        @remote.share(cache=False)
        def echo(x):
            raise AssertionError("runs on the server, not here")

        np.testing.assert_array_equal(echo(np.arange(3)), np.arange(3))
        assert "echo" in remote.get_runtime_info()["server"]["socket_path"] or True
        monkeypatch.setenv(ipc.ENV_ROLE, "server")
        assert ipc.Provider(socket_path=sock + ".2", autostart=False).execution_mode == "server"
    finally:
        kill(proc)


def test_provider_autostarts_a_server_when_the_environment_says_so(sock, monkeypatch):
    monkeypatch.setenv(ipc.ENV_ENABLED, "1")
    monkeypatch.setenv(ipc.ENV_ROLE, "server")
    provider = ipc.Provider(socket_path=sock)
    assert provider.execution_mode == "server" and provider.autostart
    assert not ipc.Provider(execution_mode="server", socket_path=sock).autostart

    @provider.share(cache=False)
    def double(x):
        return x * 2

    try:
        assert double(np.ones(2)).tolist() == [2.0, 2.0]   # local call in the server process
        with ipc.Client(sock) as c:
            np.testing.assert_array_equal(c.call("double", np.arange(3)), [0, 2, 4])
            assert c.list_endpoints()["double"]["cache"] is False
    finally:
        provider.close()


# ------------------------------------------------------------------ torch

# The start and the end of the servers the torch and CUDA tests run in a child process.
CHILD_HEAD = """
import sys, time, torch
from tensorwire import ipc
p = ipc.Provider(execution_mode="server", socket_path=sys.argv[1], autostart=False)
"""
CHILD_SERVE = """
s = ipc.Server(p).start()
print("ready", s.server_id, flush=True)
while s.running:
    time.sleep(0.1)
"""

CHILD_TORCH = CHILD_HEAD + """

@p.share(managed=True)
def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Conv1d(2, 2, 3, padding=1))

@p.share(managed=True)
def tied():
    torch.manual_seed(0)
    net = torch.nn.ModuleDict({
        "emb": torch.nn.Embedding(10, 4),
        "body": torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.LayerNorm(4)),
        "norm": torch.nn.BatchNorm1d(4),
        "head": torch.nn.Linear(4, 10, bias=False),
    })
    net["head"].weight = net["emb"].weight      # tied
    net["norm"].running_mean.fill_(2.0)
    return net

@p.share(cache=False)
def repeated():
    block = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    return torch.nn.Sequential(block, torch.nn.Tanh(), block)

@p.share(cache=False)
def state(n: int):
    torch.manual_seed(n)
    w = torch.randn(5, 3, dtype=torch.bfloat16)
    return {"w": w, "wt": w.t(), "half": torch.ones(2, dtype=torch.float16), "i": torch.arange(4)}

@p.share(cache=False)
def echo(x):
    return x

""" + CHILD_SERVE


@pytest.fixture
def torch_server(sock):
    pytest.importorskip("torch")
    proc, _ = start_server_process(sock, code=CHILD_TORCH)
    yield sock
    kill(proc)


def test_torch_tensors_and_state_dicts(torch_server):
    import torch

    c = ipc.Client(torch_server)
    st = c.call("state", 3)
    torch.manual_seed(3)
    w = torch.randn(5, 3, dtype=torch.bfloat16)
    assert st["w"].dtype == torch.bfloat16 and torch.equal(st["w"], w)
    assert torch.equal(st["wt"], w.t()) and st["wt"].stride() == (1, 3)
    assert st["w"].untyped_storage().data_ptr() == st["wt"].untyped_storage().data_ptr()
    assert torch.equal(st["i"], torch.arange(4))
    x = torch.randn(3, 4, requires_grad=True)
    back = c.call("echo", x)
    assert torch.equal(back, x.detach()) and back.requires_grad


def test_torch_modules_are_rebuilt_without_pickle(torch_server):
    import torch

    c = ipc.Client(torch_server)
    with c.call("model") as h:
        m = h.value
        torch.manual_seed(0)
        ref = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Conv1d(2, 2, 3, padding=1))
        assert type(m[0]) is torch.nn.Linear and type(m[1]) is torch.nn.Conv1d
        for (k, a), (k2, b) in zip(m.state_dict().items(), ref.state_dict().items()):
            assert k == k2 and torch.equal(a, b)
        x = torch.randn(2, 4)
        assert torch.allclose(m[0](x), ref[0](x))
        y = torch.randn(1, 2, 5)
        assert torch.allclose(m[1](y), ref[1](y))
    with c.call("tied") as h:
        net = h.value
        assert net["head"].weight is net["emb"].weight
        assert torch.equal(net["norm"].running_mean, torch.full((4,), 2.0))
        assert net["norm"].num_batches_tracked.dtype == torch.int64
        assert net["body"][2].normalized_shape == (4,)
        assert list(net.state_dict()) == list(net.state_dict())  # rebuilt registries work
        assert {k for k, _ in net.named_parameters()} == {
            "emb.weight", "body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias",
            "norm.weight", "norm.bias"}


try:
    import torch as _torch

    class CustomModule(_torch.nn.Module):
        """A module class outside torch.nn (rebuilt only when its module is allowed)."""

        def __init__(self):
            super().__init__()
            self.lin = _torch.nn.Linear(2, 2)
except ImportError:
    CustomModule = None


def test_a_torch_view_sends_only_the_bytes_it_reaches():
    torch = pytest.importorskip("torch")
    from tensorwire._ipc_codec import Encoder

    big = torch.arange(1_000_000, dtype=torch.float32)
    value = Encoder().encode_root({"a": big[100:110], "b": big[105:120:5]}).value()
    # Elements 100..110 and 105, 110, 115: bytes 400..464 of the 4 MB storage, shared by
    # both, sent from the 64-byte boundary below (384).
    assert value.nbytes == 80 and value.copied == 80


def test_empty_views_beside_views_of_one_storage(torch_server):
    """Empty views reach no byte; they travel with their view neighbours whatever their
    offsets (one below the sent range used to wrap around)."""
    import torch

    x = torch.arange(100, dtype=torch.float32)
    value = {"a": x[10:20], "before": x[0:0], "after": x[90:90], "inside": x[15:15]}
    with ipc.Client(torch_server) as c:
        back = c.call("echo", value)
    assert torch.equal(back["a"], x[10:20])
    for name in ("before", "after", "inside"):
        assert back[name].shape == (0,) and back[name].dtype == torch.float32
    assert back["inside"].untyped_storage().data_ptr() == back["a"].untyped_storage().data_ptr()


def test_views_of_one_storage_in_several_dtypes(torch_server):
    """Views of one storage with other element sizes keep offsets that are multiples
    of theirs: the bytes are sent from an aligned start."""
    import torch

    base = torch.arange(16, dtype=torch.float32)
    value = (base.view(torch.float16)[1:3], base[1:3], base.view(torch.uint8)[5:9],
             base.view(torch.float64)[3:4])
    with ipc.Client(torch_server) as c:
        back = c.call("echo", value)
    for got, sent in zip(back, value):
        assert got.dtype == sent.dtype and torch.equal(got, sent)
    # One storage still.
    assert len({t.untyped_storage().data_ptr() for t in back}) == 1


def _bare_decoder(allowed=()):
    from tensorwire._ipc_codec import Decoder

    d = Decoder.__new__(Decoder)
    d.allowed_modules = tuple(allowed)
    d._tensors, d._params, d._modules, d._torch_storages = {}, {}, {}, {}
    d._cuda_devices, d._waited, d._on_storages = {}, set(), None
    d.lease = None
    return d


def test_module_rebuild_refuses_detours_and_internals():
    pytest.importorskip("torch")
    d = _bare_decoder()
    for path in ("torch.nn.modules.module:torch.fx.GraphModule",   # walks through a module
                 "torch.nn.modules.linear:Identity.__class__",       # not the class it names
                 "torch.fx:GraphModule", "os:system", "torch.nn.nope_module:X"):
        with pytest.raises(TypeError, match="refusing"):
            d._module_class(path)
    assert d._module_class("torch.nn.modules.linear:Linear").__name__ == "Linear"
    spec = {"id": 1, "class": "torch.nn.modules.activation:ReLU", "training": True,
            "attrs": {"_forward_hooks": {}}, "parameters": {}, "buffers": {},
            "non_persistent": [], "children": {}}
    with pytest.raises(TypeError, match="_forward_hooks"):
        d._module(spec)
    spec["attrs"] = {"inplace": True}
    assert d._module(spec).inplace is True


def test_a_module_used_twice_comes_back_once(torch_server):
    m = ipc.Client(torch_server).call("repeated")
    assert m[0] is m[2] and type(m[1]).__name__ == "Tanh"
    assert m[0][0].weight is m[2][0].weight


def test_module_classes_outside_torch_nn_are_refused(sock):
    torch = pytest.importorskip("torch")
    provider = ipc.Provider(execution_mode="server", socket_path=sock, autostart=True)
    provider.register(CustomModule, name="custom", cache=False)
    provider.register(CustomModule, name="custom_managed", managed=True)
    try:
        with pytest.raises(TypeError, match="refusing to rebuild module class"):
            ipc.Client(sock).call("custom")
        # A managed result that cannot be rebuilt gives its lease back.
        with ipc.Client(sock) as c:
            for _ in range(3):
                with pytest.raises(TypeError, match="refusing to rebuild module class"):
                    c.call("custom_managed")
            c._flush_releases()   # what the next call would send first
            assert provider._servers[-1].live() == (1, 0)   # cached, no lease held
        m = ipc.Client(sock, allowed_modules=[__name__]).call("custom")
        assert type(m) is CustomModule and isinstance(m.lin, torch.nn.Linear)
    finally:
        provider.close()


# ------------------------------------------------------------------ CUDA

CHILD_CUDA = CHILD_HEAD + """

@p.share(managed=True)
def weights():
    torch.manual_seed(0)
    return {"w": torch.randn(256, 256, device="cuda"), "b": torch.arange(16, device="cuda")}

@p.share(managed=True)
def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).cuda()

@p.share(cache=False)
def add_one(t):
    return t + 1

""" + CHILD_SERVE


def _cuda_ready():
    torch = pytest.importorskip("torch")
    if not (torch.cuda.is_available() and ipc.cuda_available()):
        pytest.skip("no CUDA device")
    return torch


def test_cuda_tensors_and_modules_between_processes(sock):
    torch = _cuda_ready()
    proc, _ = start_server_process(sock, code=CHILD_CUDA)
    try:
        c = ipc.Client(sock)
        torch.manual_seed(0)
        w = torch.randn(256, 256, device="cuda")
        h = c.call("weights")
        assert h.value["w"].is_cuda and torch.equal(h.value["w"], w)
        assert torch.equal(h.value["b"], torch.arange(16, device="cuda"))
        opened = ipc.cuda_import_stats()[0]
        h2 = c.call("weights")
        assert ipc.cuda_import_stats()[0] == opened, "the mapping is reused"
        h.release(), h2.release()
        with c.call("model") as hm:
            torch.manual_seed(0)
            ref = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).cuda()
            x = torch.randn(4, 8, device="cuda")
            assert torch.allclose(hm.value(x), ref(x))
        t = torch.arange(10.0, device="cuda")
        assert torch.equal(c.call("add_one", t), t + 1)
    finally:
        kill(proc)
