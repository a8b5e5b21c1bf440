"""Writing .zt version 2 (the ztensor 2.x format) from Python: Writer(version=2) and
convert(zt_version=2), read back by tensorwire (ztensor 2.x reads these files too:
fixtures/zt/v2/check_ours.py checks that with a ztensor 2.x install)."""

import numpy as np
import pytest

import tensorwire

V2_MAGIC = bytes([0x89, 0x5A, 0x54, 0x32, 0x0D, 0x0A, 0x1A, 0x0A])


def test_writer_version_2_round_trips(tmp_path):
    path = str(tmp_path / "v2.zt")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.random.default_rng(0).integers(0, 100, 1000).astype(np.int64)
    with tensorwire.Writer(path, version=2) as w:
        w.write_numpy("a", a)
        w.write_numpy("b", b, compress=True, checksum="xxh3")
        w.write_numpy("c", np.array([True, False]), checksum="sha256")
    data = open(path, "rb").read()
    assert data[:8] == V2_MAGIC and data[-8:] == V2_MAGIC
    with tensorwire.open(path) as r:
        assert sorted(r.keys()) == ["a", "b", "c"]
        np.testing.assert_array_equal(r["a"], a)
        np.testing.assert_array_equal(r["b"], b)
        np.testing.assert_array_equal(r["c"], [True, False])


def test_version_2_refuses_what_it_cannot_record(tmp_path):
    path = str(tmp_path / "v2.zt")
    with pytest.raises(tensorwire.TensorwireError, match="crc32c"):
        with tensorwire.Writer(path, version=2) as w:
            w.write_numpy("a", np.zeros(3), checksum="crc32c")
    with pytest.raises(tensorwire.InvalidArgumentError, match="version"):
        tensorwire.Writer(path, version=3)
    with tensorwire.Writer(path, version=2) as w:
        w.write_numpy("a", np.zeros(3))
    with pytest.raises(tensorwire.UnsupportedError, match="version 2"):
        tensorwire.Writer(path, "a", version=2)


def test_convert_to_version_2(tmp_path):
    src = str(tmp_path / "v1.zt")
    dst = str(tmp_path / "v2.zt")
    arrays = {"w": np.linspace(0, 1, 64, dtype=np.float32), "i": np.arange(5, dtype=np.int16)}
    with tensorwire.Writer(src) as w:
        for k, v in arrays.items():
            w.write_numpy(k, v)
    assert tensorwire.convert(src, dst, zt_version=2, compress=True, checksum="xxh3") == 2
    assert open(dst, "rb").read(8) == V2_MAGIC
    with tensorwire.open(dst) as r:
        for k, v in arrays.items():
            np.testing.assert_array_equal(r[k], v)
