"""Zero-copy arrays: ownership chain, lifetime, writability, copies, read_into, leaks."""

import gc
import os

import numpy as np
import pytest

import tensorwire as tw


def _owner(arr):
    """Walk the numpy base chain to its end."""
    b = arr
    while isinstance(b, np.ndarray) and b.base is not None:
        b = b.base
    return b


@pytest.fixture
def small(zt_path):
    data = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.arange(5, dtype=np.int64),
            "z": np.arange(50, dtype=np.int16)}
    with tw.Writer(zt_path) as w:
        w.write_numpy("w", data["w"], checksum="crc32c")
        w.write_numpy("b", data["b"])
        w.write_numpy("z", data["z"], compress=True)
    return zt_path, data


def test_base_chain_reaches_native_owner(small):
    path, data = small
    r = tw.Reader(path)
    a = r["w"]
    assert isinstance(a.base, tw.BytesOwner)
    # One owner (holding the whole file map) is the base of every zero-copy array
    # of a reader.
    assert a.base.nbytes == os.path.getsize(path) and a.base.writable
    assert r["b"].base is a.base and r.read_numpy("w").base is a.base
    assert not a.flags.owndata and a.flags.c_contiguous and a.flags.aligned
    view = a[1:, ::2].T
    assert isinstance(_owner(view), tw.BytesOwner)


def test_arrays_outlive_reader_and_file(small):
    path, data = small
    r = tw.Reader(path)
    a = r["w"]
    sl = a[1:]
    tr = a.T
    lst = r.read_numpy(["w", "b"])
    del r
    gc.collect()
    os.remove(path)
    gc.collect()
    np.testing.assert_array_equal(a, data["w"])
    np.testing.assert_array_equal(sl, data["w"][1:])
    np.testing.assert_array_equal(tr, data["w"].T)
    np.testing.assert_array_equal(lst["b"], data["b"])
    assert float(a.sum()) == float(data["w"].sum())


def test_arrays_outlive_closed_reader(small):
    path, data = small
    with tw.Reader(path) as r:
        a = r["b"]
    assert r.closed
    np.testing.assert_array_equal(a, data["b"])


def test_writes_stay_private(small):
    path, data = small
    before = open(path, "rb").read()
    r1 = tw.Reader(path)
    r2 = tw.Reader(path)
    a = r1["w"]
    b2 = r2["w"]
    assert a.flags.writeable
    a[:] = -1
    a.T[0, 0] = 99
    assert (b2 == data["w"]).all()
    assert open(path, "rb").read() == before
    with tw.Reader(path) as r3:
        np.testing.assert_array_equal(r3["w"], data["w"])


def test_copy_true_is_independent(small):
    path, data = small
    r = tw.Reader(path)
    c = r.read_numpy("w", copy=True)
    v = r["w"]
    assert c.flags.owndata and c.base is None and c.flags.writeable
    assert not np.shares_memory(c, v)
    c[:] = 0
    np.testing.assert_array_equal(v, data["w"])
    v[:] = 5
    assert (c == 0).all()
    many = r.read_numpy(["w", "b", "z"], copy=True)
    assert all(x.flags.owndata for x in many.values())
    np.testing.assert_array_equal(many["z"], data["z"])


def test_compressed_tensors_decode_into_fresh_writable_arrays(small):
    path, data = small
    with tw.Reader(path) as r:
        z = r["z"]
        assert z.flags.owndata and z.flags.writeable
        z[:] = 0
        np.testing.assert_array_equal(r["z"], data["z"])


def test_read_component_arrays_zero_copy_and_copy(small):
    path, data = small
    with tw.Reader(path) as r:
        t = r.read("w")
        assert isinstance(_owner(t.numpy()), tw.BytesOwner)
        t2 = r.read("w", copy=True)
        assert t2.numpy().flags.owndata
        np.testing.assert_array_equal(t2.numpy(), data["w"])


def test_read_into_numpy_and_dict(small):
    path, data = small
    with tw.Reader(path) as r:
        dst = np.empty((3, 4), np.float32)
        r.read_into("w", dst)
        np.testing.assert_array_equal(dst, data["w"])
        targets = {"z": np.empty(50, np.int16), "b": np.empty(5, np.int64)}
        r.read_into(targets)
        np.testing.assert_array_equal(targets["z"], data["z"])
        np.testing.assert_array_equal(targets["b"], data["b"])
        with pytest.raises(ValueError):
            r.read_into("w", np.empty((4, 3), np.float32))
        # Other dtypes and layouts as ztensor's read_into fills them (np.copyto):
        # same-kind casts, any strides; a cast numpy refuses is refused.
        wide = np.empty((3, 4), np.float64)
        r.read_into("w", wide)
        np.testing.assert_array_equal(wide, data["w"])
        strided = np.zeros((4, 3), np.float32).T
        r.read_into("w", strided)
        np.testing.assert_array_equal(strided, data["w"])
        both = {"w": np.zeros((3, 8), np.float32)[:, ::2], "b": np.empty(5, np.int64)}
        r.read_into(both)
        np.testing.assert_array_equal(both["w"], data["w"])
        with pytest.raises(TypeError):
            r.read_into("w", np.empty((3, 4), np.int32))
        ro = np.empty((3, 4), np.float32)
        ro.flags.writeable = False
        with pytest.raises(ValueError):
            r.read_into("w", ro)
        with pytest.raises(TypeError):
            r.read_into("w")
        with pytest.raises(KeyError):
            r.read_into("nope", dst)


def test_read_into_own_zero_copy_view(small):
    path, data = small
    with tw.Reader(path) as r:
        v = r["w"]
        v[:] = 0
        r.read_into("w", v)  # source and destination are the same memory
        assert (v == 0).all()


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_no_leak_reading_a_32mib_file_20_times(tmp_path):
    path = str(tmp_path / "big.zt")
    size = 32 << 20
    with tw.Writer(path) as w:
        for i in range(8):
            w.write_numpy(f"t{i}", np.full(size // 8 // 4, i, np.float32))
    gc.collect()
    for copy in (False, True):
        start = _rss_bytes()
        for _ in range(20):
            r = tw.Reader(path)
            arrays = r.read_numpy(r.keys(), copy=copy)
            assert sum(float(a[0]) for a in arrays.values()) == sum(range(8))
            for a in arrays.values():
                a.sum()  # touch every page
            del r, arrays
            gc.collect()
        grown = _rss_bytes() - start
        assert grown <= size * 1.1, f"RSS grew by {grown >> 20} MiB (copy={copy})"


def test_threads_can_read_concurrently(small):
    import threading

    path, data = small
    r = tw.Reader(path)
    errors = []

    def work():
        try:
            for _ in range(200):
                np.testing.assert_array_equal(r.read_numpy("b", copy=True), data["b"])
                np.testing.assert_array_equal(r["z"], data["z"])
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_ztensor_names_read_tensors_and_ztensor_error(small):
    path, data = small
    with tw.Reader(path) as r:
        got = r.read_tensors(("w", "b"))
        assert sorted(got) == ["b", "w"]
        np.testing.assert_array_equal(got["w"], data["w"])
        assert np.shares_memory(got["w"], r.read_numpy("w"))
        assert r.read_tensors(["b"], copy=True)["b"].flags.writeable
        with pytest.raises(tw.ZTensorError):
            r.read_tensors(["nope"])
        with pytest.raises(TypeError):
            r.read_tensors("w")
