"""tensorwire.cache.TensorCache: the tenso TensoCache API over a shared-memory pool,
with zero-copy gets that stay valid, shared by real processes."""

import contextlib
import errno
import os
import platform
import signal
import struct
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

import tensorwire
from tensorwire.cache import TensorCache, _parse_size
from tensorwire.packet import QuantizedTensor

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def cache():
    c = TensorCache("8MB", name=f"twtest_{os.getpid()}_{uuid.uuid4().hex[:8]}")
    yield c
    c.close()
    try:
        c.unlink()
    except FileNotFoundError:
        pass


def run_child(code: str, *args: str, **kw) -> subprocess.Popen:
    """A Python child running ``code`` with ``args`` in sys.argv."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_put_get_roundtrip_is_zero_copy_and_read_only(cache):
    arr = np.arange(1000, dtype=np.float32).reshape(10, 100)
    n = cache.put("w", arr)
    assert n >= arr.nbytes
    got = cache.get("w")
    assert np.array_equal(got, arr) and got.dtype == arr.dtype
    assert not got.flags.writeable
    with pytest.raises(ValueError):
        got[0, 0] = 1
    # Two gets view the same shared memory.
    again = cache.get("w")
    assert np.shares_memory(got, again)
    assert got.ctypes.data % 64 == 0
    copy = cache.get("w", copy=True)
    assert copy.flags.writeable and not np.shares_memory(copy, got)
    assert cache.get("missing") is None
    assert "w" in cache and "missing" not in cache
    assert len(cache) == 1 and cache.keys() == ["w"]


def test_views_outlive_delete_overwrite_close(cache):
    arr = np.full(5000, 7, dtype=np.int64)
    cache.put("k", arr)
    view = cache.get("k")
    cache.put("k", np.full(5000, 9, dtype=np.int64))   # same size, pinned: copy on write
    assert (view == 7).all()
    assert (cache.get("k") == 9).all()
    assert cache.delete("k") and not cache.delete("k")
    assert (view == 7).all()
    assert cache.stats["pinned_bytes"] >= arr.nbytes
    cache.close()
    assert (view == 7).all()           # the pin keeps the mapping
    with pytest.raises(tensorwire.InvalidArgumentError):
        cache.get("k")
    del view


def test_pins_are_released_when_views_go(cache):
    cache.put("k", np.ones(10000, dtype=np.float32))
    view = cache.get("k")
    part = view[10:20]                 # a derived array holds the pin too
    del view
    cache.delete("k")
    assert cache.stats["pinned_bytes"] > 0
    assert (part == 1).all()
    del part
    assert cache.stats["pinned_bytes"] == 0
    cache.check()


def test_every_packet_kind_round_trips(cache):
    scipy = pytest.importorskip("scipy.sparse")
    bundle = {"a": np.arange(5, dtype=np.int16), "b": {"c": np.eye(3)}}
    cache.put("bundle", bundle)
    got = cache.get("bundle")
    assert np.array_equal(got["a"], bundle["a"]) and np.array_equal(got["b"]["c"], np.eye(3))
    m = scipy.random(20, 30, density=0.1, format="csr", random_state=0)
    cache.put("sparse", m)
    assert (cache.get("sparse") != m).nnz == 0
    q = cache.put("q", np.linspace(-1, 1, 64, dtype=np.float32), quantize="qint8")
    assert q > 0
    got = cache.get("q")
    assert isinstance(got, QuantizedTensor)
    assert np.allclose(got.dequantize(), np.linspace(-1, 1, 64), atol=0.01)
    assert cache.info("q")["dtype"] == "qint8"


def test_info_without_decoding(cache):
    arr = np.zeros((4, 5, 6), dtype=np.float16)
    cache.put("t", arr, ttl=100)
    info = cache.info("t")
    assert info["shape"] == (4, 5, 6) and info["ndim"] == 3
    assert info["dtype"] == np.float16
    assert info["size_bytes"] >= arr.nbytes and info["alloc_bytes"] % 64 == 0
    assert info["ttl"] == pytest.approx(100) and 0 <= info["age"] < 5
    cache.put("d", {"x": arr})
    assert cache.info("d")["dtype"] is None
    assert cache.info("missing") is None


def test_ttl_expiry(cache):
    # A TTL a stalled test process still finds alive, then a sleep past it.
    cache.put("short", np.ones(3), ttl=1.0)
    cache.put("long", np.ones(3))
    assert cache.get("short") is not None
    time.sleep(1.1)
    assert cache.get("short") is None
    assert "short" not in cache and cache.keys() == ["long"]
    assert cache.stats["expirations"] == 1
    # As with tenso: 0, a negative ttl and infinity never expire; nor does one longer
    # than the cache can count (once a Rust panic).
    for ttl in (0, -1.0, float("inf"), 1e300):
        cache.put("forever", np.ones(3), ttl=ttl)
        kept = cache.info("forever")["ttl"]
        assert kept is None if ttl <= 0 or ttl == float("inf") else kept > 1e9, (ttl, kept)
    time.sleep(0.01)
    assert cache.get("forever") is not None
    with pytest.raises(ValueError):
        cache.put("bad", np.ones(3), ttl=float("nan"))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_view_inherited_through_fork_stays_pinned_in_the_child(cache):
    """A view taken before fork (a preloading server, DataLoader workers) stays
    valid in the child after the parent drops its own and the block could be reused:
    the child pins it for itself right after fork."""
    cache.put("weights", np.full(1000, 1.0, np.float32))
    view = cache.get("weights")
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(go_w)
            os.write(ready_w, b"x")
            os.read(go_r, 1)
            os._exit(0 if np.all(view == 1.0) else 1)
        finally:
            os._exit(2)
    os.close(ready_w)
    os.close(go_r)
    os.read(ready_r, 1)
    del view
    cache.delete("weights")
    cache.put("other", np.full(1000, 7.0, np.float32))  # the same size: first fit
    os.write(go_w, b"x")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's view changed"
    cache.check()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("closed", [False, True])
def test_views_inherited_through_fork_are_pinned_for_the_child_before_it_runs(closed):
    """The parent drops its view right after the fork, and another handle rewrites the
    entry (same size: in place, were nobody pinning it) before the child has run a
    line: the child's view is unchanged all the same, also for a view whose handle was
    closed before the fork (the view keeps the pool mapped and pinned)."""
    with TensorCache(1 << 20) as owner:
        writer = TensorCache(name=owner.name, create=False)
        owner.put("k", np.ones(1000))
        source = TensorCache(name=owner.name, create=False)
        view = source.get("k")
        if closed:
            source.close()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(go_w)
                os.read(go_r, 1)
                os._exit(0 if np.all(view == 1.0) else 1)
            finally:
                os._exit(2)
        os.close(go_r)
        del view
        writer.put("k", np.full(1000, 2.0))
        os.write(go_w, b"x")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child's view changed"
        np.testing.assert_array_equal(owner.get("k"), np.full(1000, 2.0))
        owner.check()
        writer.close()


def test_views_outliving_their_handles_do_not_fill_the_registry():
    """A helper that attaches per call and returns a view: 300 such views (more than
    the registry's 256 slots) share this process's one registration, so another
    process still attaches."""
    def load(name, key):
        with TensorCache(name=name, create=False) as c:
            return c.get(key)

    with TensorCache("4MB") as owner:
        owner.put("k", np.arange(10))
        views = [load(owner.name, "k") for _ in range(300)]
        assert owner.stats["processes"] == 1
        code = ("from tensorwire.cache import TensorCache; "
                f"print(TensorCache(name={owner.name!r}, create=False).stats['processes'])")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "2"
        assert all(np.array_equal(v, np.arange(10)) for v in views)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forks_while_another_thread_opens_handles_never_hang_the_child():
    """A thread opens and closes handles (their bookkeeping takes process-local locks,
    without the GIL) while the main thread forks: the locks are held across each fork,
    so no child finds one locked for ever by a thread it does not have."""
    import threading

    with TensorCache(1 << 16) as owner:
        owner.put("k", np.ones(4))
        views = []
        for _ in range(50):
            with TensorCache(name=owner.name, create=False) as c:
                views.append(c.get("k"))
        stop = threading.Event()

        def opener():
            while not stop.is_set():
                TensorCache(name=owner.name, create=False).close()

        thread = threading.Thread(target=opener)
        thread.start()
        try:
            for _ in range(150):
                pid = os.fork()
                if pid == 0:
                    os._exit(0 if np.all(views[0] == 1.0) else 1)
                deadline = time.monotonic() + 10
                while True:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        assert os.waitstatus_to_exitcode(status) == 0
                        break
                    if time.monotonic() > deadline:
                        os.kill(pid, signal.SIGKILL)
                        os.waitpid(pid, 0)
                        pytest.fail("a forked child hung")
                    time.sleep(0.001)
        finally:
            stop.set()
            thread.join()
        owner.check()


def test_lru_eviction_order():
    with TensorCache(256 << 10, max_entries=4) as c:
        for k in "abcd":
            c.put(k, np.ones(10))
        c.get("a")
        c.put("e", np.ones(10))
        assert c.keys() == ["e", "a", "d", "c"]
        assert c.stats["evictions"] == 1


def test_full_pool_and_too_large_values():
    with TensorCache("1MB") as c:
        c.put("keep", np.ones(10))
        with pytest.raises(MemoryError):
            c.put("huge", np.zeros(1 << 20, dtype=np.float32))   # 4 MiB > pool
        assert "keep" in c and c.stats["evictions"] == 0
        big = np.zeros(200_000, dtype=np.float32)                # 800 KB
        c.put("a", big)
        held = c.get("a")
        with pytest.raises(MemoryError, match="pinned"):
            c.put("b", big)                                      # a is pinned
        del held
        c.put("b", big)
        c.check()


def test_stats_keys_clear(cache):
    for i in range(5):
        cache.put(f"k{i}", np.full(100, i))
    cache.get("k1"), cache.get("nope")
    s = cache.stats
    for key in ("entries", "max_entries", "pool_size", "used_bytes", "free_bytes",
                "data_region_size", "hits", "misses", "hit_rate", "pinned_bytes",
                "evictions", "expirations", "recoveries", "processes"):
        assert key in s
    assert (s["entries"], s["hits"], s["misses"], s["hit_rate"]) == (5, 1, 1, 0.5)
    assert s["pool_size"] == 8 << 20 and s["used_bytes"] + s["free_bytes"] == s["data_region_size"]
    cache.clear()
    assert len(cache) == 0 and cache.stats["entries"] == 0


def test_tensos_spellings_work(cache):
    """What code written for tenso passes: its class names, sizes with a bare unit
    letter, lists and numbers as values (stored as np.asarray gives them), and a
    device name in any case."""
    from tensorwire.cache import TensoCache
    from tensorwire.shm import SharedTensor, TensoShm

    assert TensoCache is TensorCache and TensoShm is SharedTensor
    assert [_parse_size(s) for s in ("1G", "64M", "512K", "2T", "3 m", "1GiB")] == [
        1 << 30, 64 << 20, 512 << 10, 2 << 40, 3 << 20, 1 << 30]
    cache.put("list", [1.0, 2.0, 3.0])
    cache.put("scalar", 3.5)
    cache.put("nested", [[1, 2], [3, 4]])
    np.testing.assert_array_equal(cache.get("list"), np.array([1.0, 2.0, 3.0]))
    assert cache.get("scalar").shape == () and cache.get("scalar") == 3.5
    np.testing.assert_array_equal(cache.get("nested"), np.array([[1, 2], [3, 4]]))
    np.testing.assert_array_equal(cache.get("list", device="NumPy"), [1.0, 2.0, 3.0])
    # A closed cache raises what tenso raises (RuntimeError), and a ValueError as
    # before (an InvalidArgumentError).
    other = TensorCache("1MB")
    other.unlink()
    other.close()
    for call in (lambda: other.get("x"), lambda: other.put("x", np.ones(1))):
        with pytest.raises(RuntimeError, match="closed") as raised:
            call()
        assert isinstance(raised.value, (tensorwire.ClosedError, ValueError))


def test_bad_input_gives_clear_errors(cache):
    with pytest.raises(ValueError, match="128"):
        cache.put("k" * 129, np.ones(1))
    cache.put("ü" * 64, np.ones(1))                             # 128 bytes of UTF-8
    with pytest.raises(tensorwire.InvalidArgumentError):
        TensorCache("1MB", name="bad/name")
    with pytest.raises(FileNotFoundError):
        TensorCache(name=f"tw_missing_{uuid.uuid4().hex}", create=False)
    with pytest.raises(ValueError):
        TensorCache(create=False)
    with pytest.raises(FileExistsError):
        TensorCache("1MB", name=cache.name)
    with pytest.raises(ValueError):
        _parse_size("lots")
    assert _parse_size("1.5KB") == 1536 and _parse_size(4096) == 4096
    # A segment that is not a cache.
    from tensorwire.shm import SharedTensor
    name = f"twnotcache_{os.getpid()}"
    st = SharedTensor.create_from(name, np.zeros(10000))
    try:
        with pytest.raises(tensorwire.BadMagicError):
            TensorCache(name=name, create=False)
    finally:
        st.close()
        st.unlink()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or not os.path.isdir("/dev/shm"),
                    reason="forges glibc's pthread_mutex_t layout in /dev/shm")
def test_a_lock_left_unrecoverable_is_an_oserror_saying_so(cache):
    """A lock released unrepaired by another program after its holder died can never
    be taken again (ENOTRECOVERABLE); the cache says so instead of a format error."""
    cache.put("x", np.ones(3))
    # glibc marks such a mutex by its owner field (offset 8) = 0x7ffffffe; the
    # cache's mutex is at byte 256 of the segment.
    with open("/dev/shm/" + cache.name.lstrip("/"), "r+b") as f:
        f.seek(256 + 8)
        f.write(struct.pack("<i", 0x7FFFFFFE))
    with pytest.raises(OSError, match="never repaired") as info:
        cache.put("y", np.ones(3))
    assert info.value.errno == errno.ENOTRECOVERABLE


def test_context_manager_unlinks_only_its_own_pool():
    with TensorCache("1MB") as c:
        name = c.name
        with TensorCache(name=name, create=False) as other:
            other.put("x", np.ones(4))
        assert np.array_equal(c.get("x"), np.ones(4))   # other did not unlink
    with pytest.raises(FileNotFoundError):
        TensorCache(name=name, create=False)
    # Unlinking a pool already gone is no error, as with tenso.
    c.unlink()
    c.unlink()


def test_bfloat16_and_conjugated_torch_tensors_are_stored(cache):
    torch = pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).to(torch.bfloat16)
    cache.put("bf", t)
    assert cache.get("bf").dtype.name == "bfloat16"
    got = cache.get("bf", device="torch")
    assert got.dtype == torch.bfloat16 and torch.equal(got, t)
    z = torch.tensor([1 + 2j, 3 - 1j]).conj()  # a lazy conjugate: numpy() refuses it
    cache.put("z", z)
    assert np.array_equal(cache.get("z"), np.array([1 - 2j, 3 + 1j]))


def test_torch_values_and_device_conversion(cache):
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    cache.put("t", t)
    got = cache.get("t", device="torch")
    assert isinstance(got, torch.Tensor) and torch.equal(got, t)
    assert np.array_equal(cache.get("t"), t.numpy())


def test_another_process_reads_and_writes(cache):
    cache.put("from_parent", np.arange(100, dtype=np.int32))
    child = run_child("""
        import sys, numpy as np
        from tensorwire.cache import TensorCache
        c = TensorCache(name=sys.argv[1], create=False)
        got = c.get("from_parent")
        assert np.array_equal(got, np.arange(100, dtype=np.int32)), got
        c.put("from_child", np.full((2, 3), 5.5))
        print("ok")
    """, cache.name)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert np.array_equal(cache.get("from_child"), np.full((2, 3), 5.5))


def test_view_unchanged_while_another_process_overwrites(cache):
    original = np.arange(4096, dtype=np.float64)
    cache.put("watched", original)
    view = cache.get("watched")
    child = run_child("""
        import sys, numpy as np
        from tensorwire.cache import TensorCache
        c = TensorCache(name=sys.argv[1], create=False)
        for i in range(50):
            c.put("watched", np.full(4096, float(i)))
        c.delete("watched")
        c.put("watched", np.full(10, -1.0))
    """, cache.name)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert np.array_equal(view, original)
    assert np.array_equal(cache.get("watched"), np.full(10, -1.0))
    cache.check()


HAMMER = """
    import sys, time, zlib, numpy as np
    from tensorwire.cache import TensorCache
    name, role, seed, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    c = TensorCache(name=name, create=False)
    rng = np.random.default_rng(seed)
    end = time.monotonic() + seconds
    checked = 0
    while time.monotonic() < end:
        k = int(rng.integers(8))
        if role == "writer":
            n = int(rng.integers(1, 20000))
            body = rng.integers(0, 255, n, dtype=np.uint8)
            # The value carries its key and a checksum of its body.
            head = np.array([k, zlib.crc32(body.tobytes())], dtype=np.uint64).view(np.uint8)
            c.put(f"k{k}", np.concatenate([head, body]))
        else:
            v = c.get(f"k{k}")
            if v is not None:
                head = v[:16].view(np.uint64)
                assert int(head[0]) == k, (k, head)
                assert int(head[1]) == zlib.crc32(v[16:].tobytes()), "torn value"
                checked += 1
    print(checked)
"""


def test_writers_and_readers_hammer_one_cache(cache):
    procs = [run_child(HAMMER, cache.name, role, str(i), "2.0")
             for i, role in enumerate(["writer", "writer", "reader", "reader", "reader"])]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
    assert sum(int(out) for (out, _), p in zip(results, procs) if out.strip()) > 0
    cache.check()
    assert cache.stats["processes"] == 1


@pytest.mark.parametrize("stage", ["reserved", "filling", "publishing", "in-place"])
def test_writer_killed_mid_put_leaves_the_cache_consistent(cache, stage):
    healthy = {f"h{i}": np.full(100 + i, i, dtype=np.int32) for i in range(20)}
    for k, v in healthy.items():
        cache.put(k, v)
    old = np.full(1000, 1.0)
    cache.put("victim", old)
    new_len = 1000 if stage == "in-place" else 3000
    child = run_child("""
        import sys, numpy as np
        from tensorwire.cache import TensorCache
        c = TensorCache(name=sys.argv[1], create=False, _pause_at=sys.argv[2])
        c.put("victim", np.full(int(sys.argv[3]), 2.0))
    """, cache.name, stage, str(new_len))
    line = child.stderr.readline()
    assert "paused at" in line, line + child.stderr.read()
    child.send_signal(signal.SIGKILL)
    child.wait()
    for k, v in healthy.items():
        assert np.array_equal(cache.get(k), v), k
    got = cache.get("victim")
    if got is None:
        assert stage == "in-place"
    else:
        assert np.array_equal(got, old) or np.array_equal(got, np.full(new_len, 2.0))
    cache.check()
    if stage != "filling":
        assert cache.stats["recoveries"] >= 1


@contextlib.contextmanager
def _lock_held_by_a_stopped_child(name):
    """A child process that stops mid-put holding the pool lock of cache `name`, for
    the block; killed after it."""
    child = run_child("""
        import sys, numpy as np
        from tensorwire.cache import TensorCache
        c = TensorCache(name=sys.argv[1], create=False, _pause_at="reserved")
        c.put("x", np.ones(10))
    """, name)
    try:
        line = child.stderr.readline()
        assert "paused at" in line, line + child.stderr.read()
        yield
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def test_waiting_for_the_pool_lock_lets_other_threads_run():
    """Another process holds the pool's lock (stopped mid-put): a get waits for it up
    to lock_timeout without the GIL, so this process's other threads keep running
    (they stopped for the whole wait)."""
    import threading

    name = f"twtest_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with TensorCache("1MB", name=name, lock_timeout=1.0) as cache, \
            _lock_held_by_a_stopped_child(name):
        ticks, waiting = [], threading.Event()

        def tick():
            while not waiting.is_set():
                ticks.append(time.monotonic())
                time.sleep(0.01)

        ticker = threading.Thread(target=tick)
        ticker.start()
        try:
            with pytest.raises(TimeoutError):
                cache.get("x")
        finally:
            waiting.set()
            ticker.join()
        assert len(ticks) > 10 and max(np.diff(ticks)) < 0.5, max(np.diff(ticks))


class _Interrupted(Exception):
    pass


def test_a_signal_ends_a_wait_for_the_pool_lock():
    """Ctrl-C (here a SIGINT whose handler raises) ends a call waiting for a lock
    another process holds, raising what the handler raised, within a slice of the
    wait; it went unseen until lock_timeout ran out."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are handled on the main thread")

    def handler(*_):
        raise _Interrupted()

    name = f"twtest_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with TensorCache("1MB", name=name, lock_timeout=20.0) as cache, \
            _lock_held_by_a_stopped_child(name):
        previous = signal.signal(signal.SIGINT, handler)
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        started = time.monotonic()
        try:
            timer.start()
            with pytest.raises(_Interrupted):
                cache.get("x")
        finally:
            timer.cancel()
            signal.signal(signal.SIGINT, previous)
        assert time.monotonic() - started < 5


def test_a_view_dropped_while_another_process_holds_the_lock_is_unpinned_later():
    """Dropping a view takes the pool lock to release its pin; when another process
    holds the lock past lock_timeout, the release waits for the next operation (it
    was lost, leaving the entry pinned until this process exited)."""
    import gc

    name = f"twtest_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with TensorCache("1MB", name=name, lock_timeout=0.3) as cache:
        cache.put("a", np.ones(1000))
        view = cache.get("a")
        cache.put("a", np.ones(2000))  # the viewed value is retired, pinned by the view
        assert cache.stats["pinned_bytes"] > 0
        with _lock_held_by_a_stopped_child(name):
            del view
            gc.collect()  # the release times out: left for later
        assert cache.stats["pinned_bytes"] == 0  # the retired block is freed
        cache.check()
        assert np.array_equal(cache.get("a"), np.ones(2000))


def test_a_dead_readers_pins_are_reclaimed_before_healthy_entries_are_evicted():
    """A reader killed while holding views leaves their blocks retired once the keys
    are overwritten; the next put short of room reclaims them first, instead of
    evicting entries nobody touched."""
    name = f"twtest_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with TensorCache("1MB", name=name, max_entries=16) as cache:
        cache.put("golden", np.ones(16, np.float32))
        for i in range(4):
            cache.put(f"k{i}", np.full(50_000, float(i), np.float32))  # 200 KB each
        child = run_child("""
            import sys, time
            from tensorwire.cache import TensorCache
            c = TensorCache(name=sys.argv[1], create=False)
            views = [c.get(f"k{i}") for i in range(4)]
            print("holding", flush=True)
            time.sleep(60)
        """, name)
        assert child.stdout.readline().strip() == "holding"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        for i in range(4):  # the old values stay retired, pinned by the dead reader
            cache.put(f"k{i}", np.full(50_000, -float(i), np.float32))
        assert "golden" in cache
        assert cache.stats["evictions"] == 0
        cache.check()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm to look in")
def test_a_pool_under_a_generated_name_goes_when_its_creator_exits():
    """TensorCache() names its pool itself; nobody else knows the name unless told,
    so the creator unlinks it at exit if no one did (as tenso's pools are); it was
    left in /dev/shm. A named pool stays until unlink(); a forked child's exit
    leaves its parent's pool."""
    named = f"twtest_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    child = run_child("""
        import os, sys
        from tensorwire.cache import TensorCache
        closed, dropped, kept = TensorCache("1MB"), TensorCache("1MB"), TensorCache("1MB")
        closed.put("k", [1.0, 2.0])
        closed.close()
        del dropped
        TensorCache("1MB", name=sys.argv[1]).close()
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # runs atexit handlers in the child
        os.waitpid(pid, 0)
        print(closed.name, kept.name, os.path.exists("/dev/shm/" + closed.name))
    """, named)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    closed, kept, after_fork = out.split()
    try:
        assert after_fork == "True"  # the forked child left it
        assert not os.path.exists(f"/dev/shm/{closed}")
        assert not os.path.exists(f"/dev/shm/{kept}")
        assert os.path.exists(f"/dev/shm/{named}")
    finally:
        from tensorwire import shm

        shm.unlink(named)


def test_a_view_dropped_while_the_lock_is_busy_leaves_no_pin_after_close():
    """A view dropped while another process holds the pool lock past lock_timeout
    leaves its unpin pending; closing the last handle then released nothing, and the
    entry stayed pinned by no one: its block was never reused and a put that fit the
    empty pool failed."""
    name = f"twtest_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    c = TensorCache(256 * 1024, name=name, max_entries=16, lock_timeout=0.3)
    try:
        c.put("k1", np.arange(4000, dtype=np.float64))
        view = c.get("k1")
        with _lock_held_by_a_stopped_child(name):
            del view                                  # the unpin times out: pending
        c.close()
        c = TensorCache(name=name, create=False, lock_timeout=5)
        assert c.stats["pinned_bytes"] == 0
        c.put("k1", np.ones(4000, dtype=np.float64))
        c.delete("k1")
        c.put("big", np.zeros(c.stats["data_region_size"] - 1024, np.uint8))
        c.check()
    finally:
        c.close()
        tensorwire.shm.unlink(name)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_late_registered_child_dropping_a_stale_inherited_view_keeps_its_new_view_pinned():
    """No registry slot could be taken for the child before the fork (another
    process held the lock), and the parent rewrote the entry before the child first
    used the cache: the child's inherited view is stale. Dropping it must not release
    the pin of a fresh view the child took of the same (reused) slot, or the parent's
    next in-place rewrite changed that fresh view under the child."""
    name = f"twtest_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    c = TensorCache(1 << 20, name=name, lock_timeout=20)
    try:
        c.put("K", np.full(10000, 1.0))
        views = [c.get("K")]
        to_child_r, to_child_w = os.pipe()
        to_parent_r, to_parent_w = os.pipe()
        with _lock_held_by_a_stopped_child(name):
            pid = os.fork()                           # no slot reserved for the child
            if pid == 0:
                try:
                    os.read(to_child_r, 1)            # the parent rewrote K in place
                    fresh = c.get("K")
                    before = fresh.copy()
                    views.clear()                     # the stale inherited view goes
                    os.write(to_parent_w, b"x")
                    os.read(to_child_r, 1)            # the parent rewrote K again
                    os._exit(0 if np.array_equal(fresh, before) else 1)
                finally:
                    os._exit(2)
            time.sleep(0.3)                           # the child's after-fork hook gives up
        views.clear()
        c.put("K", np.full(10000, 2.0))               # unpinned, same size: in place
        os.write(to_child_w, b"x")
        os.read(to_parent_r, 1)
        c.put("K", np.full(10000, 3.0))               # the child's fresh view pins it
        os.write(to_child_w, b"x")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child's fresh view changed"
        c.check()
    finally:
        c.close()
        tensorwire.shm.unlink(name)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_attach_waits_for_a_creator_that_has_not_sized_the_segment():
    """Between a creator's shm_open and its ftruncate the object is empty: attach
    waits for it (up to a second, as for the header) instead of failing. The creator
    is played by hand: an empty object, then a real cache's bytes with the magic
    (its first 8 bytes) written last."""
    import threading

    model = f"twtest_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    name = f"twtest_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with TensorCache(1 << 20, name=model):
        with open(f"/dev/shm/{model}", "rb") as f:
            image = f.read()
    with contextlib.suppress(FileNotFoundError):
        tensorwire.shm.unlink(model)
    path = f"/dev/shm/{name}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)

    def create():
        # Short pauses, far inside attach's one second: a late start of this thread
        # on a loaded machine must not run past it.
        time.sleep(0.05)
        os.ftruncate(fd, len(image))
        time.sleep(0.02)
        os.pwrite(fd, image[8:], 8)
        os.pwrite(fd, image[:8], 0)

    creator = threading.Thread(target=create)
    creator.start()
    try:
        with TensorCache(name=name, create=False, lock_timeout=5) as c:
            c.put("k", np.arange(3))
            assert c.get("k").tolist() == [0, 1, 2]
    finally:
        creator.join()
        os.close(fd)
        tensorwire.shm.unlink(name)
