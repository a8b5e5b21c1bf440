"""Interop with the real ztensor 1.x package (skipped when it is not installed)."""

import numpy as np
import pytest

import tensorwire as tw
from conftest import np_dtype, sample

ztensor = pytest.importorskip("ztensor")

# What ztensor 1.2.3's write_numpy/read_numpy handle.
ZT_DTYPES = ["float64", "float32", "float16", "int64", "int32", "int16", "int8",
             "uint64", "uint32", "uint16", "uint8", "bool", "bfloat16"]


@pytest.mark.parametrize("compress", [None, True, 7])
@pytest.mark.parametrize("checksum", ["none", "crc32c", "sha256"])
def test_ztensor_reads_what_we_write(zt_path, compress, checksum):
    data = {n: sample(np_dtype(n), (3, 5), seed=i) for i, n in enumerate(ZT_DTYPES)}
    data["empty"] = np.zeros((0, 4), np.float32)
    with tw.Writer(zt_path) as w:
        for k, v in data.items():
            w.write_numpy(k, v, compress=compress, checksum=checksum, attributes={"k": k})
        w.write("csr", tw.Tensor({"values": np.array([1.0, 2.0], np.float32),
                                  "indices": np.array([0, 1], np.uint64),
                                  "indptr": np.array([0, 1, 2], np.uint64)},
                                 shape=[2, 2], format="sparse_csr"),
                compress=compress, checksum=checksum)
    r = ztensor.Reader(zt_path)
    assert sorted(r.keys()) == sorted(list(data) + ["csr"])
    for k, v in data.items():
        got = r.read_numpy(k)
        assert got.dtype == v.dtype and got.shape == v.shape, k
        assert got.tobytes() == v.tobytes(), k
        assert r.metadata(k).attributes == {"k": k}
    t = r.read("csr")
    assert t.format == "sparse_csr" and list(t.shape) == [2, 2]
    np.testing.assert_array_equal(t.components["values"], [1.0, 2.0])


def test_ztensor_reads_integer_attributes_outside_int64_exactly(zt_path):
    attrs = {"a": 2**63, "b": 2**64 - 1, "c": -(2**63) - 1, "d": -(2**64)}
    with tw.Writer(zt_path) as w:
        w.write_numpy("x", np.zeros(2), attributes=attrs)
    assert ztensor.Reader(zt_path).metadata("x").attributes == attrs


def test_ztensor_reads_logical_types_we_write(zt_path):
    ml = pytest.importorskip("ml_dtypes")
    f8 = np.array([0, 1, -1, 0.5], dtype=ml.float8_e4m3fn)
    with tw.Writer(zt_path) as w:
        w.write_numpy("f8", f8)
        w.write_numpy("c", np.array([1 + 2j, 3 - 4j], np.complex64))
    r = ztensor.Reader(zt_path)
    m = r.metadata("f8")
    assert (m.dtype, m.type) == ("uint8", "f8_e4m3fn")
    assert r.read_numpy("f8").tobytes() == f8.tobytes()
    m = r.metadata("c")
    assert (m.dtype, m.type, list(m.shape)) == ("float32", "complex64", [2])


@pytest.mark.parametrize("compress", [None, True])
@pytest.mark.parametrize("checksum", ["none", "crc32c", "sha256"])
def test_we_read_what_ztensor_writes(zt_path, compress, checksum):
    data = {n: sample(np_dtype(n), (4, 3), seed=i) for i, n in enumerate(ZT_DTYPES)}
    with ztensor.Writer(zt_path) as w:
        for k, v in data.items():
            w.write_numpy(k, v, compress=compress, checksum=checksum)
        w.write("coo", ztensor.Tensor({"values": np.array([5, 6], np.int32),
                                       "coords": np.array([0, 1, 1, 2], np.uint64)},
                                      shape=[2, 3], format="sparse_coo"))
    with tw.Reader(zt_path) as r:
        if checksum != "none":
            assert r.verify() == len(data)
        for k, v in data.items():
            got = r[k]
            assert got.dtype == v.dtype and got.shape == v.shape, k
            assert got.tobytes() == v.tobytes(), k
            zm, m = ztensor.Reader(zt_path).metadata(k), r.metadata(k)
            assert (m.dtype, m.type, m.shape, m.format) == (zm.dtype, zm.type, list(zm.shape), zm.format)
            for field in ("dtype", "type", "offset", "length", "encoding"):
                assert m.components["data"][field] == zm.components["data"][field]
        t = r.read("coo")
        np.testing.assert_array_equal(t.components["values"], [5, 6])


def test_we_read_ztensor_files_with_scalar_dict_keys_and_an_empty_name(zt_path):
    """ztensor writes a Python dict's keys as they are (`id2label = {0: "cat"}`) and
    an empty tensor name; we read both (keys as JSON writes them)."""
    with ztensor.Writer(zt_path) as w:
        w.write_numpy("", np.arange(3, dtype=np.float32))
        attributes = {"id2label": {0: "cat", 1: "dog"}, "flags": {True: 1, None: 2}}
        w.write("logits", ztensor.Tensor({"data": np.zeros(2, np.float32)}, attributes=attributes))
    with tw.Reader(zt_path) as r:
        assert list(r.keys()) == ["", "logits"]
        np.testing.assert_array_equal(r[""], np.arange(3, dtype=np.float32))
        attrs = r.metadata("logits").attributes
    assert attrs == {"id2label": {"0": "cat", "1": "dog"}, "flags": {"true": 1, "null": 2}}
    # Appending would write those keys back as strings, changing what ztensor reads.
    with pytest.raises(tw.UnsupportedError, match="not strings"):
        tw.Writer.append(zt_path)
    assert ztensor.Reader(zt_path).metadata("logits").attributes["id2label"] == {0: "cat", 1: "dog"}


def test_dict_keys_that_read_as_the_same_text_are_refused(zt_path):
    """{0: a, "0": b} would lose a value once both keys are text: the file is refused."""
    with ztensor.Writer(zt_path) as w:
        w.write("t", ztensor.Tensor({"data": np.zeros(2, np.float32)},
                                    attributes={"m": {0: "int", "0": "str"}}))
    with pytest.raises(tw.MalformedError, match="same text"):
        tw.Reader(zt_path)


def test_numpy_scalars_as_attributes_and_compression_levels(tmp_path):
    """A numpy bool is a bool attribute (not the float 1.0) and numpy ints and bools
    are compression levels, as ztensor takes them: the same bytes."""
    ours, theirs = str(tmp_path / "ours.zt"), str(tmp_path / "theirs.zt")
    x = np.arange(64, dtype=np.float32)
    for path, module in ((ours, tw), (theirs, ztensor)):
        with module.Writer(path) as w:
            w.write("a", module.Tensor({"data": x}, attributes={"flag": np.bool_(True)}))
            w.write_numpy("b", x, compress=np.int64(3))
            w.write_numpy("c", x, compress=np.True_)
    assert open(ours, "rb").read() == open(theirs, "rb").read()
    with tw.Reader(ours) as r:
        assert r.metadata("a").attributes == {"flag": True}


def test_same_bytes_as_ztensor(tmp_path):
    """For the same calls, our files are byte-identical to ztensor's."""
    data = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(5, np.int64)}
    ours, theirs = str(tmp_path / "ours.zt"), str(tmp_path / "theirs.zt")
    for mod, path in ((tw, ours), (ztensor, theirs)):
        with mod.Writer(path) as w:
            w.write_numpy("w", data["w"], compress=True, checksum="crc32c")
            w.write_numpy("b", data["b"], checksum="sha256")
    assert open(ours, "rb").read() == open(theirs, "rb").read()
