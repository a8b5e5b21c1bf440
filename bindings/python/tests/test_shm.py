"""tensorwire.shm.SharedTensor: tensor packets in named shared memory (tenso's TensoShm
API and segment layout), zero-copy reads that outlive the segment's handle and name,
other processes, and tenso itself in both directions (skipped without tenso)."""

import gc
import itertools
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import tensorwire
from tensorwire import packet
from tensorwire.packet import QuantizedTensor, RaggedArray, StringTensor
from tensorwire.shm import SharedTensor, unlink

from conftest import PLAIN_DTYPES, sample

try:
    import scipy.sparse as sparse
except ImportError:  # pragma: no cover - depends on the environment
    sparse = None

try:
    import tenso
except ImportError:  # pragma: no cover - depends on the environment
    tenso = None

needs_tenso = pytest.mark.skipif(tenso is None, reason="tenso not installed")
needs_scipy = pytest.mark.skipif(sparse is None, reason="scipy not installed")

_counter = itertools.count()


def _exists(name):
    try:
        SharedTensor(name, readonly=True).close()
        return True
    except FileNotFoundError:
        return False
    except tensorwire.InvalidArgumentError:  # exists but empty
        return True


@pytest.fixture
def name():
    """A fresh segment name, unlinked after the test whatever happened."""
    n = f"tw_test_{os.getpid()}_{next(_counter)}"
    yield n
    try:
        unlink(n)
    except FileNotFoundError:
        pass
    assert not _exists(n)


def _segment_bytes(st):
    """The segment's whole content, as one numpy uint8 array over the map."""
    return np.frombuffer(st.buffer, dtype=np.uint8)


def _base_chain(arr):
    chain = []
    obj = arr
    while obj is not None:
        chain.append(obj)
        obj = getattr(obj, "base", None)
    return chain


# -- layout and zero-copy -------------------------------------------------------------

@pytest.mark.parametrize("dtype", PLAIN_DTYPES)
def test_dense_round_trip_is_zero_copy_and_read_only(name, dtype):
    arr = sample(np.dtype(dtype), (7, 5), seed=3)
    st = SharedTensor.create_from(name, arr)
    try:
        got = st.get()
        np.testing.assert_array_equal(got, arr)
        assert got.dtype == arr.dtype and got.shape == arr.shape
        assert not got.flags.writeable
        with pytest.raises(ValueError):
            got[0, 0] = got[0, 1]
        # A view of the segment itself: the body sits at offset 64.
        seg = _segment_bytes(st)
        assert np.shares_memory(got, seg)
        assert got.ctypes.data == seg.ctypes.data + 64
        assert type(_base_chain(got)[-1]).__name__ == "BytesOwner"
        # A copy is writeable and owns its memory.
        copy = st.get(copy=True)
        np.testing.assert_array_equal(copy, arr)
        assert copy.flags.writeable and not np.shares_memory(copy, seg)
    finally:
        st.close()


def test_segment_holds_exactly_the_packet(name):
    arr = np.arange(1000, dtype=np.float32).reshape(10, 100)
    for opts in [{}, {"check_integrity": True}, {"alignment": 256}, {"compress": True}]:
        expected = bytes(packet.dumps(arr, **opts))
        with SharedTensor.create_from(name, arr, **opts) as st:
            assert st.size == len(expected) == st.packet_length()
            assert bytes(st.buffer) == expected
            np.testing.assert_array_equal(st.get(), arr)
            assert st.name == name
        # create_from reclaims the name the previous round left behind.


def test_large_tensor(name):
    # Above the parallel-copy threshold (4 MiB), dense and in a bundle.
    arr = np.random.default_rng(2).integers(0, 1 << 30, (3, 1 << 20 | 5), dtype=np.int32)
    with SharedTensor.create_from(name, arr, check_integrity=True) as st:
        np.testing.assert_array_equal(st.get(), arr)
        assert st.size == arr.nbytes + 64 + 8
        # The segment is sized exactly: a bundle of nearly the same bytes fits when a
        # little smaller.
        assert st.put({"x": arr[:2], "y": arr[2, :-100]}) > arr.nbytes * 2 // 3
        got = st.get()
        np.testing.assert_array_equal(got["x"], arr[:2])
        np.testing.assert_array_equal(got["y"], arr[2, :-100])
        with pytest.raises(MemoryError):
            st.put({"x": arr[:2], "y": arr[2]})


def test_views_outlive_close_and_unlink(name):
    arr = np.random.default_rng(0).standard_normal((256, 300))  # > 64 KiB
    st = SharedTensor.create_from(name, arr, check_integrity=True)
    view = st.get()
    buf = st.buffer
    st.close()
    assert st.closed
    assert st.size == arr.nbytes + 64 + 8 and st.name == name  # still known when closed
    st.unlink()
    assert not _exists(name)
    del st
    gc.collect()
    # The map lives on through the arrays' base chain and the memoryview.
    np.testing.assert_array_equal(view, arr)
    assert float(view.sum()) == pytest.approx(float(arr.sum()))
    assert bytes(buf[:4]) == b"TNSO"


def test_buffer_is_writable_and_shared_between_handles(name):
    with SharedTensor(name, create=True, size=4096) as writer, SharedTensor(name) as reader:
        assert writer.size == reader.size == 4096
        buf = writer.buffer
        assert isinstance(buf, memoryview) and not buf.readonly
        assert buf.format == "B" and buf.nbytes == 4096
        buf[100:104] = b"abcd"
        assert bytes(reader.buffer[100:104]) == b"abcd"
        # A put through one handle is read through the other.
        arr = np.arange(10, dtype=np.int64)
        n = writer.put(arr)
        assert n == len(bytes(packet.dumps(arr)))
        np.testing.assert_array_equal(reader.get(), arr)


def test_readonly_mapping(name):
    arr = np.arange(6, dtype=np.uint16)
    SharedTensor.create_from(name, arr).close()
    with SharedTensor(name, readonly=True) as st:
        assert st.buffer.readonly
        np.testing.assert_array_equal(st.get(), arr)
        with pytest.raises(tensorwire.InvalidArgumentError, match="read-only"):
            st.put(arr)
        raw = _segment_bytes(st)
        assert not raw.flags.writeable
        with pytest.raises(ValueError):
            raw.flags.writeable = True
    with pytest.raises(tensorwire.InvalidArgumentError):
        SharedTensor(name, create=True, size=10, readonly=True)


def test_put_reports_length_and_ignores_trailing_bytes(name):
    with SharedTensor(name, create=True, size=1 << 16) as st:
        big = np.arange(4000, dtype=np.float64)
        assert st.put(big) == big.nbytes + 64
        small = np.array([1.5, 2.5], dtype=np.float32)
        n = st.put(small, check_integrity=True)
        assert n == 64 + 8 + 8 == st.packet_length()
        # The rest of the old packet is still in the segment, after the new one.
        assert bytes(st.buffer[n:n + 8]) != b"\0" * 8
        got = st.get()
        np.testing.assert_array_equal(got, small)
        assert np.shares_memory(got, _segment_bytes(st))


def test_put_too_large_raises_memory_error_and_writes_nothing(name):
    with SharedTensor(name, create=True, size=200) as st:
        first = np.arange(4, dtype=np.int32)
        st.put(first)
        before = bytes(st.buffer)
        with pytest.raises(MemoryError, match="needs 8064 bytes, 200 available"):
            st.put(np.zeros(1000))
        with pytest.raises(MemoryError):
            st.put({"a": np.zeros(1000), "b": np.ones(3)})
        with pytest.raises(MemoryError):
            st.put(np.zeros(1000), compress=False, check_integrity=True)
        assert bytes(st.buffer) == before
        np.testing.assert_array_equal(st.get(), first)
        # Exactly the segment's size fits.
        assert st.put(np.zeros((200 - 64) // 8)) == 200


def test_put_of_a_view_through_another_handle_of_the_same_segment(name):
    """A second handle of one name maps the segment at another address: a view taken
    through it is the segment's memory all the same, copied out before the write
    (small, and large enough for the parallel copy, source just past the target)."""
    arr = (np.arange(4096) % 251 + 1).astype(np.uint8)
    with SharedTensor(name, create=True, size=1 << 16) as w, SharedTensor(name) as r:
        w.put(arr)
        w.put(r.get(), alignment=256)
        np.testing.assert_array_equal(w.get(), arr)
        np.testing.assert_array_equal(r.get(), arr)
    unlink(name)
    big = (np.arange(6 << 20) % 251 + 1).astype(np.uint8)
    with SharedTensor(name, create=True, size=(6 << 20) + 4096) as w, SharedTensor(name) as r:
        w.put(big)
        w.put(r.get()[8:])
        np.testing.assert_array_equal(w.get(), big[8:])


def test_put_of_a_view_of_the_same_segment(name):
    arr = np.arange(1000, dtype=np.float64)
    with SharedTensor(name, create=True, size=1 << 15) as st:
        st.put(arr)
        # The source is the segment itself; the body moves (alignment 4096).
        st.put(st.get(), alignment=4096)
        np.testing.assert_array_equal(st.get(), arr)
        st.put(st.get(), check_integrity=True)
        np.testing.assert_array_equal(st.get(), arr)
        # A source that the new header overwrites.
        st.put(np.frombuffer(st.buffer, dtype=np.uint8)[:256].copy())
        raw = np.frombuffer(st.buffer, dtype=np.uint8)[:32]
        st.put(raw)
        assert st.get().shape == (32,)


# -- every packet kind ---------------------------------------------------------------

def test_bundle(name):
    state = {
        "w": np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32),
        "b": np.arange(32, dtype=np.int16),
        "nested": {"mask": np.array([True, False, True]), "s": np.float64(3.5)},
    }
    with SharedTensor.create_from(name, state, check_integrity=True) as st:
        assert bytes(st.buffer) == bytes(packet.dumps(state, check_integrity=True))
        got = st.get()
        assert list(got) == ["w", "b", "nested"]
        np.testing.assert_array_equal(got["w"], state["w"])
        np.testing.assert_array_equal(got["b"], state["b"])
        np.testing.assert_array_equal(got["nested"]["mask"], state["nested"]["mask"])
        assert got["nested"]["s"] == 3.5
        copy = st.get(copy=True)
        assert all(v.flags.writeable for k, v in copy.items() if k != "nested")


@pytest.mark.parametrize("aligned_bundle", [False, True])
def test_copies_are_writable_aligned_and_independent(name, aligned_bundle):
    """get(copy=True) decodes one private snapshot: every array writable and aligned
    (misaligned members copied again), none sharing memory with another, the segment,
    or a later copy; writing one changes nothing else, and a later put leaves it."""
    state = {"tokens": np.arange(5, dtype=np.uint8), "w": np.arange(100, dtype=np.float64),
             "i": np.arange(7, dtype=np.int32), "z": np.ones((3, 3), np.complex128)}
    with SharedTensor.create_from(name, state, aligned_bundle=aligned_bundle) as st:
        seg = _segment_bytes(st)
        first, second = st.get(copy=True), st.get(copy=True)
        arrays = list(first.values()) + list(second.values())
        for a in arrays:
            assert a.flags.writeable and a.flags.aligned and not np.shares_memory(a, seg)
        for i, a in enumerate(arrays):
            for b in arrays[i + 1:]:
                assert not np.shares_memory(a, b)
        before = bytes(st.buffer)
        for a in first.values():
            a[...] = 0
        assert bytes(st.buffer) == before
        for k, v in state.items():
            np.testing.assert_array_equal(second[k], v)
        st.put({k: v + 1 for k, v in state.items()})
        for k, v in state.items():
            np.testing.assert_array_equal(second[k], v)
        del first, seg


def test_aligned_bundle_members_are_zero_copy(name):
    # The first body's place is fixed by the framing (docs/formats/packet.md); a uint8
    # member there is aligned whatever it is. Every later member is padded into place.
    state = {"tokens": np.arange(100, dtype=np.uint8), "w": np.arange(100, dtype=np.float64),
             "bb": np.ones((5, 5), np.complex128), "i": np.arange(7, dtype=np.int32)}
    with SharedTensor.create_from(name, state, aligned_bundle=True) as st:
        seg = _segment_bytes(st)
        got = st.get()
        for i, (key, value) in enumerate(state.items()):
            np.testing.assert_array_equal(got[key], value)
            assert np.shares_memory(got[key], seg), key
            assert type(_base_chain(got[key])[-1]).__name__ == "BytesOwner"
            if i:
                assert (got[key].ctypes.data - seg.ctypes.data) % 64 == 0, key
    # tenso's own layout: members whose bodies happen to be element-aligned are views.
    with SharedTensor.create_from(name, {"k": np.arange(9, dtype=np.uint8)}) as st:
        assert np.shares_memory(st.get()["k"], _segment_bytes(st))


@needs_scipy
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_sparse(name, fmt):
    m = sparse.random(40, 30, density=0.2, format=fmt, random_state=4, dtype=np.float32)
    with SharedTensor.create_from(name, m) as st:
        got = st.get()
        assert got.format == fmt and got.shape == m.shape
        np.testing.assert_array_equal(got.toarray(), m.toarray())


def test_strings_ragged_quantized(name):
    words = ["zero", "", "naïve", "日本語", "x" * 300]
    with SharedTensor(name, create=True, size=1 << 14) as st:
        st.put(StringTensor(words))
        got = st.get()
        assert isinstance(got, StringTensor) and got.to_list() == words

        rows = [np.arange(3, dtype=np.int32), np.arange(0, dtype=np.int32),
                np.arange(5, dtype=np.int32)]
        st.put(RaggedArray(rows))
        back = RaggedArray.loads(st.buffer[:st.packet_length()])
        assert [list(r) for r in back] == [list(r) for r in rows]

        x = np.random.default_rng(5).standard_normal((16, 8)).astype(np.float32)
        q = QuantizedTensor.quantize(x, "qint8", "per_tensor")
        st.put(q, check_integrity=True)
        got = st.get()
        assert isinstance(got, QuantizedTensor)
        np.testing.assert_allclose(got.dequantize(), q.dequantize())


def test_compressed_and_custom_alignment(name):
    arr = np.zeros((300, 300), dtype=np.float32)
    arr[::7] = 1
    with SharedTensor.create_from(name, arr, compress=True, check_integrity=True) as st:
        assert st.size < arr.nbytes // 4
        np.testing.assert_array_equal(st.get(), arr)
    with SharedTensor.create_from(name, arr, alignment=4096) as st:
        got = st.get()
        assert got.ctypes.data == _segment_bytes(st).ctypes.data + 4096
    with pytest.raises(ValueError, match="power of two"):
        SharedTensor.create_from(name, arr, alignment=48)


def test_corruption_is_detected(name):
    arr = np.arange(64, dtype=np.float32)
    with SharedTensor.create_from(name, arr, check_integrity=True) as st:
        st.buffer[64 + 10] ^= 0xFF
        with pytest.raises(tensorwire.ChecksumError):
            st.get()
    with SharedTensor(name) as st:
        st.buffer[:4] = b"XXXX"
        with pytest.raises(tensorwire.BadMagicError):
            st.get()


def test_an_empty_segment_holds_no_packet(name):
    with SharedTensor(name, create=True, size=128) as st:
        with pytest.raises(tensorwire.FormatError):
            st.get()


# -- names and errors ----------------------------------------------------------------

@pytest.mark.parametrize("bad", ["", "a/b", "/lead", "x" * 255, ".", ".."])
def test_bad_names(bad):
    with pytest.raises(tensorwire.InvalidArgumentError) as info:
        SharedTensor(bad)
    assert isinstance(info.value, ValueError)
    with pytest.raises(tensorwire.InvalidArgumentError):
        SharedTensor(bad, create=True, size=64)
    with pytest.raises(tensorwire.InvalidArgumentError):
        SharedTensor.create_from(bad, np.zeros(3))
    with pytest.raises(tensorwire.InvalidArgumentError):
        unlink(bad)
    with pytest.raises(TypeError):
        SharedTensor(b"bytes-name")


def test_missing_segment(name):
    with pytest.raises(FileNotFoundError) as info:
        SharedTensor(name)
    assert name in str(info.value)
    with pytest.raises(FileNotFoundError):
        unlink(name)


def test_create_size_and_exists(name):
    with pytest.raises(ValueError):
        SharedTensor(name, create=True, size=0)
    with pytest.raises(ValueError):
        SharedTensor(name, create=True, size=-5)
    assert not _exists(name)
    st = SharedTensor(name, create=True, size=64)
    with pytest.raises(FileExistsError):
        SharedTensor(name, create=True, size=64)
    # create_from reclaims a taken name, as tenso does.
    arr = np.arange(3, dtype=np.int8)
    with SharedTensor.create_from(name, arr) as again:
        np.testing.assert_array_equal(again.get(), arr)
    st.close()


def test_new_segments_are_private(name):
    SharedTensor.create_from(name, np.zeros(4)).close()
    path = f"/dev/shm/{name}"
    if not os.path.exists(path):
        pytest.skip("no /dev/shm")
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_context_manager_closes_but_does_not_unlink(name):
    arr = np.arange(5, dtype=np.int32)
    with SharedTensor.create_from(name, arr) as st:
        pass
    assert st.closed
    with pytest.raises(tensorwire.ClosedError, match="closed"):
        st.get()
    with pytest.raises(tensorwire.InvalidArgumentError):
        st.buffer
    with pytest.raises(tensorwire.InvalidArgumentError):
        st.put(arr)
    st.close()  # twice is fine
    assert "closed" in repr(st)
    with SharedTensor(name) as other:
        np.testing.assert_array_equal(other.get(), arr)
    st.unlink()
    with pytest.raises(FileNotFoundError):
        st.unlink()


def test_unsupported_objects(name):
    with SharedTensor(name, create=True, size=1024) as st:
        with pytest.raises(TypeError):
            st.put(object())
        with pytest.raises(TypeError):
            SharedTensor.create_from(name + "_x", [object()])
    assert not _exists(name + "_x")


# -- other processes -----------------------------------------------------------------

def _python(code, *args):
    """Runs `code` in a fresh interpreter; returns its stdout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_copy_taken_while_another_process_puts_is_never_torn(name):
    """A writer process alternates two 4 MiB packets (all zeros, all 0xFF, with
    integrity hashes) while this one takes copies: each copy is one packet whole, or
    BadMagicError / ChecksumError (retry). Copies were decoded from the segment
    itself, so a put that began meanwhile could tear them with no error."""
    n = 4 << 20
    st = SharedTensor.create_from(name, np.zeros(n, np.uint8), check_integrity=True)
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        import numpy as np
        from tensorwire.shm import SharedTensor
        st = SharedTensor(sys.argv[1])
        a, b = np.zeros(%d, np.uint8), np.full(%d, 255, np.uint8)
        end = time.monotonic() + 2.0
        i = 0
        while time.monotonic() < end:
            st.put(a if i %% 2 else b, check_integrity=True)
            i += 1
            time.sleep(0.002)
    """ % (n, n)), name], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        whole = retried = 0
        while writer.poll() is None:
            try:
                got = st.get(copy=True)
            except (tensorwire.BadMagicError, tensorwire.ChecksumError):
                retried += 1
                continue
            assert got.min() == got.max(), "a copy mixes two packets"
            whole += 1
        assert writer.returncode == 0
        assert whole > 0
    finally:
        writer.kill()
        writer.wait()
        st.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_child_forked_during_a_put_opens_the_segment_again(name):
    """A thread keeps putting 64 MiB into the segment while the main thread forks:
    the child inherits the segment's access lock held by a thread it does not
    have, and a handle it opens after the fork must not wait on that lock (the
    handles of one process share one lock, so it did, for ever)."""
    import signal
    import threading

    big = np.ones(64 << 20, np.uint8)
    st = SharedTensor.create_from(name, big)
    stop = threading.Event()

    def keep_putting():
        while not stop.is_set():
            st.put(big)
            time.sleep(0.005)  # a moment with the packet whole, for the child's get

    writer = threading.Thread(target=keep_putting)
    writer.start()
    try:
        time.sleep(0.05)
        pid = os.fork()
        if pid == 0:  # the child: exit 0 once a new handle reads, 1 on error
            signal.alarm(20)  # the hang this test is about ends the child (SIGALRM)
            code = 1
            try:
                again = SharedTensor(name)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    try:
                        code = 0 if again.get(copy=True).shape == big.shape else 1
                        break
                    except tensorwire.BadMagicError:  # caught mid-put: retry
                        time.sleep(0.001)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    finally:
        stop.set()
        writer.join()
        st.close()


def test_child_process_writes_parent_reads(name):
    _python("""
        import sys
        import numpy as np
        from tensorwire.shm import SharedTensor
        arr = np.arange(200_000, dtype=np.float32).reshape(400, 500)
        st = SharedTensor.create_from(sys.argv[1], {"id": np.int64(7), "frame": arr},
                                      check_integrity=True, aligned_bundle=True)
        st.close()  # and exit: the segment outlives its creator
    """, name)
    with SharedTensor(name) as st:
        got = st.get()
        np.testing.assert_array_equal(
            got["frame"], np.arange(200_000, dtype=np.float32).reshape(400, 500))
        assert got["id"] == 7
        assert np.shares_memory(got["frame"], _segment_bytes(st))


def test_parent_writes_children_read_and_update(name):
    arr = np.random.default_rng(9).standard_normal((128, 128))
    with SharedTensor(name, create=True, size=arr.nbytes + 4096) as st:
        st.put(arr)
        out = _python("""
            import sys
            import numpy as np
            from tensorwire.shm import SharedTensor
            with SharedTensor(sys.argv[1]) as st:
                got = st.get()
                print(repr(float(got.sum())), got.shape)
                st.put(got * 2)  # written back in place for the parent
        """, name)
        total, shape = out.split(" ", 1)
        assert float(total) == float(arr.sum()) and shape.strip() == "(128, 128)"
        np.testing.assert_array_equal(st.get(), arr * 2)


# -- tenso, both ways ----------------------------------------------------------------

def _tenso_objects():
    objs = {
        "dense": np.arange(120, dtype=np.float64).reshape(4, 5, 6),
        "bundle": {"a": np.arange(10, dtype=np.int16), "b": np.ones((3, 3), np.float32)},
        "empty": np.zeros((0, 3), np.float32),
    }
    if sparse is not None:
        objs["csr"] = sparse.random(20, 30, density=0.1, format="csr", random_state=0)
    return objs


def _same(a, b):
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif hasattr(a, "toarray"):
        np.testing.assert_array_equal(a.toarray(), b.toarray())
    else:
        np.testing.assert_array_equal(a, b)


@needs_tenso
@pytest.mark.parametrize("kind", list(_tenso_objects()))
@pytest.mark.parametrize("opts", [{}, {"check_integrity": True}, {"alignment": 128},
                                  {"compress": True}])
def test_tenso_reads_our_segment(name, kind, opts):
    obj = _tenso_objects()[kind]
    ours = SharedTensor.create_from(name, obj, **opts)
    theirs = tenso.TensoShm(name)
    try:
        assert bytes(ours.buffer) == bytes(tenso.dumps(obj, **opts))
        if kind != "bundle" or not opts.get("compress"):
            # (tenso 0.24 cannot read its own compressed bundles, in shm or not.)
            _same(theirs.get(), obj)
    finally:
        gc.collect()
        theirs.close()
        theirs.unlink()  # through tenso, so Python's resource tracker forgets the name
        ours.close()


@needs_tenso
@pytest.mark.parametrize("kind", list(_tenso_objects()))
@pytest.mark.parametrize("opts", [{}, {"check_integrity": True}, {"alignment": 128},
                                  {"compress": True}])
def test_we_read_a_tenso_segment(name, kind, opts):
    obj = _tenso_objects()[kind]
    theirs = tenso.TensoShm.create_from(name, obj, **opts)
    try:
        assert theirs.size > len(bytes(tenso.dumps(obj, **opts)))  # tenso's margin
        with SharedTensor(name) as ours:
            got = ours.get()
            _same(got, obj)
            if kind == "dense" and not opts.get("compress"):
                assert np.shares_memory(got, _segment_bytes(ours))
        del got
        # And a put of ours into tenso's segment, read back by tenso.
        with SharedTensor(name) as ours:
            ours.put(obj, **opts)
        if kind != "bundle" or not opts.get("compress"):
            _same(theirs.get(), obj)
    finally:
        gc.collect()
        theirs.close()
        theirs.unlink()


@needs_tenso
def test_tenso_put_into_our_segment(name):
    arr = np.arange(50, dtype=np.int32)
    with SharedTensor(name, create=True, size=4096) as ours:
        theirs = tenso.TensoShm(name)
        try:
            n = theirs.put(arr, check_integrity=True)
            assert n == ours.packet_length()
            np.testing.assert_array_equal(ours.get(), arr)
        finally:
            theirs.close()
            theirs.unlink()


def test_a_segment_pickles_by_name_to_a_spawned_worker(name):
    import multiprocessing
    import pickle

    arr = np.arange(45, dtype=np.int64)
    with SharedTensor.create_from(name, arr) as st:
        again = pickle.loads(pickle.dumps(st))
        assert again.name == name and not np.shares_memory(
            _segment_bytes(again), _segment_bytes(st))
        np.testing.assert_array_equal(again.get(), arr)
        again.close()
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            assert pool.apply(_sum_of_segment, (st,)) == int(arr.sum())
        readonly = SharedTensor(name, readonly=True)
        assert pickle.loads(pickle.dumps(readonly)).buffer.readonly
        readonly.close()
        st.close()
        with pytest.raises(ValueError, match="closed"):
            pickle.dumps(st)


def _sum_of_segment(st):
    return int(st.get().sum())


def test_readers_never_see_a_valid_header_over_a_half_written_body(name):
    """The magic bytes are written last: a reader that opens a segment while its packet
    is being written gets BadMagicError (or finds nothing yet), never a valid header over
    a half-written body. Each round writes a new segment, so no read of an older packet
    can be torn by the write (that tearing is the documented cost of a put over a
    packet someone is still reading)."""
    rounds, size = 8, 16 << 20
    reader = textwrap.dedent("""
        import sys, time
        import tensorwire
        from tensorwire.shm import SharedTensor
        torn = 0
        for value in range(1, int(sys.argv[2]) + 1):
            print("ready", flush=True)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    st = SharedTensor(f"{sys.argv[1]}_{value}", readonly=True)
                except (FileNotFoundError, tensorwire.TensorwireError):
                    continue
                try:
                    got = st.get(copy=True)
                except tensorwire.BadMagicError:
                    continue
                finally:
                    st.close()
                if (got == value).all():
                    break
                torn += 1
        print(torn, flush=True)
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    child = subprocess.Popen([sys.executable, "-c", reader, name, str(rounds)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    made = []
    try:
        for value in range(1, rounds + 1):
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
            made.append(SharedTensor.create_from(f"{name}_{value}",
                                                 np.full(size, value, dtype=np.uint8)))
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
        for st in made:
            st.close()
            st.unlink()
    assert child.returncode == 0 and out.split() == ["0"], (out, err)


def test_a_reader_polling_in_a_loop_does_not_keep_a_put_out(name):
    import threading
    import time

    arr = np.ones(1 << 20, dtype=np.float32)
    with SharedTensor(name, create=True, size=arr.nbytes + 4096) as st:
        st.put(arr)
        stop = threading.Event()

        def poll():
            while not stop.is_set():
                st.get()

        readers = [threading.Thread(target=poll) for _ in range(2)]
        for t in readers:
            t.start()
        try:
            time.sleep(0.2)
            t0 = time.monotonic()
            for _ in range(5):
                st.put(arr)
            took = time.monotonic() - t0
        finally:
            stop.set()
            for t in readers:
                t.join()
        assert took < 3.0, f"5 puts took {took:.1f} s beside polling readers"
