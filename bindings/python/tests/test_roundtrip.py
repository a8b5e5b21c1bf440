"""Writing and reading back: every dtype, shapes, compression, checksums, formats."""

import numpy as np
import pytest

import tensorwire as tw
from conftest import ML_DTYPES, PLAIN_DTYPES, np_dtype, sample

SHAPES = [(), (0,), (0, 3), (7,), (2, 3), (2, 3, 4)]


@pytest.mark.parametrize("name", PLAIN_DTYPES + ML_DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_dtype_and_shape(zt_path, name, shape):
    dt = np_dtype(name)
    arr = sample(dt, shape)
    with tw.Writer(zt_path) as w:
        w.write_numpy("x", arr)
    with tw.Reader(zt_path) as r:
        got = r["x"]
        assert got.dtype == dt and got.shape == shape
        assert got.tobytes() == arr.tobytes()
        copied = r.read_numpy("x", copy=True)
        assert copied.tobytes() == arr.tobytes() and copied.shape == shape


@pytest.mark.parametrize("compress", [True, 1, 9, 19, 30])
@pytest.mark.parametrize("checksum", ["none", "crc32c", "sha256"])
def test_compressed_and_checksummed(zt_path, compress, checksum):
    data = {n: sample(np_dtype(n), (50, 3), seed=i) for i, n in enumerate(PLAIN_DTYPES)}
    data["zeros"] = np.zeros(100_000, np.float32)
    with tw.Writer(zt_path) as w:
        for k, v in data.items():
            w.write_numpy(k, v, compress=compress, checksum=checksum)
    with tw.Reader(zt_path) as r:
        assert r.verify() == (0 if checksum == "none" else len(data))
        for k, v in data.items():
            meta = r.metadata(k)
            assert meta.components["data"]["encoding"] == "zstd"
            assert meta.components["data"]["digest"] == (None if checksum == "none" else checksum)
            got = r[k]
            assert got.flags.writeable and got.flags.owndata or got.base is not None
            np.testing.assert_array_equal(got, v)
    assert data["zeros"].nbytes > 100 * 1024  # and the file is tiny
    import os
    assert os.path.getsize(zt_path) < 64 * 1024


@pytest.mark.parametrize("compress,encoding", [
    (None, "raw"), (False, "raw"), (0, "raw"), (-1, "raw"), (True, "zstd"), (5, "zstd")])
def test_compress_rules_follow_ztensor(zt_path, compress, encoding):
    with tw.Writer(zt_path) as w:
        w.add("x", np.arange(10), compress)
    with tw.Reader(zt_path) as r:
        assert r.metadata("x").components["data"]["encoding"] == encoding


def test_bad_compress_and_checksum_arguments(zt_path):
    with tw.Writer(zt_path) as w:
        with pytest.raises(TypeError):
            w.add("x", np.arange(3), compress=1.5)
        with pytest.raises(ValueError):
            w.add("x", np.arange(3), checksum="md5")
        with pytest.raises(tw.InvalidArgumentError):
            w.add("x", np.arange(3), checksum="md5")
        w.add("x", np.arange(3))
        with pytest.raises(tw.InvalidArgumentError, match="duplicate"):
            w.add("x", np.arange(3))
        with pytest.raises(tw.UnsupportedError):
            w.add("obj", np.array(["a", None], dtype=object))
        with pytest.raises(tw.UnsupportedError):
            w.add("str", np.array(["abc"]))


def test_big_endian_input_is_swapped(zt_path):
    values = np.arange(-5, 5)
    with tw.Writer(zt_path) as w:
        for code in ("i2", "i4", "i8", "u2", "f2", "f4", "f8", "c8", "c16"):
            w.write_numpy(code, values.astype(">" + code))
    with open(zt_path, "rb") as f:
        raw = f.read()
    assert np.arange(-5, 5, dtype="<i4").tobytes() in raw
    with tw.Reader(zt_path) as r:
        for code in ("i2", "i4", "i8", "u2", "f2", "f4", "f8", "c8", "c16"):
            got = r[code]
            assert got.dtype == np.dtype("<" + code)
            np.testing.assert_array_equal(got, values.astype("<" + code))


def test_non_contiguous_inputs(zt_path):
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    inputs = {"t": base.T, "s": base[:, ::2], "f": np.asfortranarray(base), "list": [[1, 2], [3, 4]]}
    with tw.Writer(zt_path) as w:
        for k, v in inputs.items():
            w.write_numpy(k, v)
    with tw.Reader(zt_path) as r:
        for k, v in inputs.items():
            np.testing.assert_array_equal(r[k], np.asarray(v))
            assert r[k].flags.c_contiguous


def test_attributes_round_trip(zt_path):
    attrs = {"s": "x", "u": "héllo", "i": -(2**63), "big": 2**64 - 1, "f": 1.5, "b": True,
             "n": None, "l": [1, "two", [3.0]], "m": {"z": 1, "a": {"b": []}}, "bytes": b"\x00\x01"}
    with tw.Writer(zt_path) as w:
        w.write_numpy("x", np.zeros(2), attributes=attrs)
        w.write_numpy("y", np.zeros(2))
    with tw.Reader(zt_path) as r:
        assert r.metadata("x").attributes == attrs
        assert type(r.metadata("x").attributes["b"]) is bool
        assert r.metadata("y").attributes is None
        assert r.read("x").attributes == attrs


def test_bad_attributes(zt_path):
    with tw.Writer(zt_path) as w:
        with pytest.raises(ValueError):
            w.write_numpy("x", np.zeros(2), attributes={1: "int key"})
        with pytest.raises(ValueError):
            w.write_numpy("x", np.zeros(2), attributes={"o": object()})


@pytest.mark.parametrize("version", [1, 2])
def test_integer_attributes_are_exact_or_refused(tmp_path, version):
    # CBOR holds integers in [-2**64, 2**64) exactly (ztensor rounds those outside
    # int64 to floats); beyond that a clear error, never a silent rounding.
    path = str(tmp_path / "ints.zt")
    exact = {"a": 2**63, "b": 2**64 - 1, "c": -(2**63) - 1, "d": -(2**64), "l": [2**64 - 1]}
    with tw.Writer(path, version=version) as w:
        w.write_numpy("x", np.zeros(2), attributes=exact)
        for v in (2**64, -(2**64) - 1, 2**200, -(2**200)):
            with pytest.raises(tw.InvalidArgumentError, match="outside CBOR's 64-bit integers"):
                w.write_numpy("y", np.zeros(2), attributes={"v": [v]})
    with tw.Reader(path) as r:
        got = r.metadata("x").attributes
        assert got == exact and all(type(v) is int for k, v in got.items() if k != "l")
        assert r.keys() == ["x"]


def test_metadata(zt_path):
    with tw.Writer(zt_path) as w:
        w.write_numpy("a", np.zeros((2, 3), np.float32), compress=True, checksum="sha256")
        w.write_numpy("c", np.zeros(4, np.complex64))
    with tw.Reader(zt_path) as r:
        m = r.metadata("a")
        assert isinstance(m, tw.TensorMetadata)
        assert (m.name, m.dtype, m.type, m.shape, m.format) == ("a", "float32", None, [2, 3], "dense")
        comp = m.components["data"]
        assert comp["offset"] == 64 and comp["encoding"] == "zstd" and comp["digest"] == "sha256"
        assert comp["uncompressed_length"] == 24
        c = r.metadata("c")
        assert (c.dtype, c.type, c.shape) == ("float32", "complex64", [4])
        assert [x.name for x in r.metadata(["c", "a"])] == ["c", "a"]
        assert "type='complex64'" in repr(c)


def test_reader_mapping_protocol(zt_path):
    with tw.Writer(zt_path) as w:
        for k in ("b", "a", "c"):
            w.write_numpy(k, np.arange(3))
    r = tw.open(zt_path)
    assert r.keys() == ["a", "b", "c"] and list(r) == ["a", "b", "c"] and len(r) == 3
    assert "a" in r and "z" not in r and 3 not in r
    assert r.format == "zt"
    assert "3 tensor(s)" in repr(r)
    with pytest.raises(KeyError):
        r["z"]
    with pytest.raises(TypeError):
        r.read_numpy(3)
    r.close()
    assert r.closed and "closed" in repr(r)
    with pytest.raises(ValueError):
        r.keys()


def test_read_numpy_list_is_in_file_offset_order(zt_path):
    with tw.Writer(zt_path) as w:
        for k in ("z", "m", "a"):  # written z, m, a: offsets increase in that order
            w.write_numpy(k, np.full(3, ord(k)))
    with tw.Reader(zt_path) as r:
        got = r.read_numpy(["a", "m", "z"])
        assert list(got) == ["z", "m", "a"]
        assert all((v == ord(k)).all() for k, v in got.items())
        assert list(r.read_numpy(["a", "z"], copy=True)) == ["z", "a"]
        assert list(r.read(["a", "z"])) == ["z", "a"]


def _sparse_and_quantized():
    csr = tw.Tensor({"values": np.array([1.0, 2.0, 3.0], np.float32),
                     "indices": np.array([0, 2, 1], np.uint64),
                     "indptr": np.array([0, 2, 2, 3], np.uint64)},
                    shape=[3, 3], format="sparse_csr", attributes={"note": "csr"})
    coo = tw.Tensor({"values": np.array([5, 6], np.int32),
                     "coords": np.array([0, 1, 1, 2], np.uint64)},
                    shape=[2, 3], format="sparse_coo")
    q = tw.Tensor({"packed_weight": np.arange(32, dtype=np.int32).reshape(4, 8),
                   "scales": np.ones((4, 2), np.float16), "zeros": np.zeros((4, 2), np.float16)},
                  shape=[4, 64], format="quantized_group",
                  attributes={"bits": 4, "group_size": 32})
    return {"csr": csr, "coo": coo, "q": q}


@pytest.mark.parametrize("compress", [None, True])
def test_write_and_read_tensors_of_every_format(zt_path, compress):
    objs = _sparse_and_quantized()
    objs["dense"] = tw.Tensor({"data": np.arange(6, dtype=np.int16).reshape(2, 3)})
    objs["scalar"] = tw.Tensor({"data": np.array(7, np.int64)})
    try:
        import ml_dtypes  # noqa: F401  (f8 arrays need it on the way back)
        objs["f8"] = tw.Tensor({"data": np.arange(4, dtype=np.uint8)}, type="f8_e4m3fn")
    except ImportError:
        pass
    with tw.Writer(zt_path) as w:
        for k, t in objs.items():
            w.write(k, t, compress=compress, checksum="crc32c")
    with tw.Reader(zt_path) as r:
        assert r.verify() == sum(len(t.components) for t in objs.values())
        for k, t in objs.items():
            got = r.read(k)
            assert isinstance(got, tw.Tensor)
            assert got.format == t.format and got.shape == t.shape
            assert got.attributes == t.attributes
            for role, arr in t.components.items():
                assert got.components[role].tobytes() == np.ascontiguousarray(arr).tobytes()
        assert r.read("dense").numpy().shape == (2, 3)
        assert r.read("scalar").numpy().shape == ()
        if "f8" in objs:
            assert r.metadata("f8").type == "f8_e4m3fn"
        assert r.metadata("csr").dtype == "float32"
        with pytest.raises(tw.UnsupportedError, match="sparse_csr"):
            r["csr"]
        with pytest.raises(TypeError):
            r.read("csr").numpy()


def test_write_rejects_inconsistent_dense_tensor(zt_path):
    with tw.Writer(zt_path) as w:
        with pytest.raises(ValueError):
            w.write("x", tw.Tensor({"data": np.zeros(6)}, shape=[2, 2]))
        with pytest.raises(ValueError):
            w.write("y", tw.Tensor({"values": np.zeros(6)}, shape=[6], format="dense"))
        with pytest.raises(ValueError):
            w.write("z", tw.Tensor({"data": np.zeros(6, np.float32)}, type="complex128"))


def test_append(zt_path):
    with tw.Writer(zt_path) as w:
        w.write_numpy("m", np.arange(3))
    with tw.Writer.append(zt_path) as w:
        assert isinstance(w, tw.Writer)
        w.write_numpy("a", np.arange(4.0), compress=True)
        w.write_numpy("z", np.ones(2, bool))
    with tw.Reader(zt_path) as r:
        assert r.keys() == ["a", "m", "z"]
        np.testing.assert_array_equal(r["m"], np.arange(3))
        np.testing.assert_array_equal(r["a"], np.arange(4.0))
    # A failed append leaves the file as it was.
    before = open(zt_path, "rb").read()
    with pytest.raises(RuntimeError):
        with tw.Writer(zt_path, mode="a") as w:
            w.write_numpy("extra", np.arange(1000))
            raise RuntimeError("boom")
    assert open(zt_path, "rb").read() == before


def test_discard_on_exception_leaves_no_file(tmp_path):
    path = tmp_path / "gone.zt"
    with pytest.raises(RuntimeError):
        with tw.Writer(str(path)) as w:
            w.write_numpy("x", np.arange(100_000))
            raise RuntimeError("boom")
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []
    assert w.finished and "finished" in repr(w)


def test_finish_returns_size_and_only_once(tmp_path):
    path = tmp_path / "f.zt"
    w = tw.Writer(path)  # os.PathLike works
    w.add("x", np.arange(10))
    assert not path.exists()  # written under a temporary name until finish
    size = w.finish()
    assert size == path.stat().st_size
    with pytest.raises(ValueError):
        w.finish()
    with pytest.raises(ValueError):
        w.add("y", np.arange(3))


def test_large_tensor_round_trip_releases_gil(zt_path):
    big = np.random.default_rng(1).standard_normal((3000, 3000)).astype(np.float32)  # 36 MB
    with tw.Writer(zt_path) as w:
        w.write_numpy("big", big, checksum="crc32c")
        w.write_numpy("bigz", big[:1000], compress=1)
    with tw.Reader(zt_path) as r:
        np.testing.assert_array_equal(r["big"], big)
        np.testing.assert_array_equal(r.read_numpy("big", copy=True), big)
        np.testing.assert_array_equal(r["bigz"], big[:1000])
