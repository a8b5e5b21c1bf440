"""Writing .zt version 2 (the ztensor 2.x format) from Python: Writer(version=2) and
convert(zt_version=2), read back by tensorwire and, where ztensor 2.x is installed,
by ztensor itself (skipped otherwise; fixtures/zt/v2/check_ours.py checks every
ZtWriter layout the same way)."""

import os
import shutil

import numpy as np
import pytest

import tensorwire

from conftest import REPO

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


@pytest.mark.parametrize("version,checksum", [(1, "crc32c"), (2, "xxh3"), (2, "sha256")])
def test_verify_after_a_private_write_checks_the_file_not_the_write(tmp_path, version,
                                                                    checksum):
    """A write into a zero-copy array stays in this process (copy-on-write): verify()
    does not report the intact file corrupt for it, in version 2 as in version 1."""
    path = str(tmp_path / "w.zt")
    with tensorwire.Writer(path, version=version) as w:
        w.write_numpy("x", np.arange(16, dtype=np.float32), checksum=checksum)
        w.write_numpy("flags", np.array([True, False, True]), checksum=checksum)
    r = tensorwire.Reader(path)
    assert r.verify() == 2
    a, flags = r["x"], r["flags"]
    assert a.flags.writeable
    a[0] = 123.0
    flags.view(np.uint8)[0] = 7  # not a bool byte: the file's is
    assert r.verify() == 2
    assert tensorwire.Reader(path).verify() == 2
    assert tensorwire.Reader(path)["x"][0] == 0.0
    # Without an earlier verify: the first read checks the digest, then the write.
    r = tensorwire.Reader(path)
    r["x"][1] = -1.0
    assert r.verify() == 2


def test_tensors_stored_once_share_their_checks(tmp_path):
    """A version 2 writer stores identical data once: both tensors' zero-copy views
    share those bytes, so a private write through one neither fails the other's
    first read nor verify()."""
    path = str(tmp_path / "dedup.zt")
    with tensorwire.Writer(path, version=2) as w:
        w.write_numpy("x", np.arange(16, dtype=np.float32), checksum="xxh3")
        w.write_numpy("m", np.arange(16, dtype=np.float32).reshape(4, 4), checksum="xxh3")
    r = tensorwire.Reader(path)
    assert np.shares_memory(r["x"], r["m"])  # stored once
    r = tensorwire.Reader(path)
    r["x"][3] = 99.0
    assert r["m"].shape == (4, 4)  # its digest was checked with x's, before the write
    assert r.verify() == 2
    r = tensorwire.Reader(path)
    r["x"][3] = 99.0
    assert r.verify() == 2
    assert tensorwire.Reader(path).verify() == 2


def test_tensors_of_two_dtypes_stored_once_share_their_digest_check(tmp_path):
    """ztensor 2 stores the same bytes once even for two dtypes (its fixture's
    f8_e5m2fnuz and f8_e4m3fnuz): one digest check serves both, so a private write
    through one tensor's view is no ChecksumError for the other (it was)."""
    pytest.importorskip("ml_dtypes")  # numpy's dtypes for the float8 types
    path = str(tmp_path / "dtypes.zt")
    shutil.copyfile(os.path.join(REPO, "fixtures", "zt", "v2", "dtypes.zt"), path)
    r = tensorwire.Reader(path)
    a = r["f8_e5m2fnuz"].view(np.uint8)
    want = a.copy()
    a[:] = 0x11
    assert (r["f8_e4m3fnuz"].view(np.uint8) == 0x11).all()  # the bytes are shared
    assert r.verify() == tensorwire.Reader(path).verify()
    np.testing.assert_array_equal(tensorwire.Reader(path)["f8_e4m3fnuz"].view(np.uint8), want)


@pytest.mark.parametrize("first,second", [("xxh3", "sha256"), ("none", "xxh3"),
                                          ("sha256", "none")])
def test_bytes_stored_once_under_different_digests_are_checked_before_any_view(
        tmp_path, first, second):
    """A version 2 writer stores identical data once even when the two tensors ask for
    different digests (or one for none): handing out either view first checks every
    digest over those bytes, so a private write through it is no ChecksumError for
    the other tensor (it was), and a real change on disk still is."""
    path = str(tmp_path / "mixed.zt")
    a = np.arange(10, dtype=np.float32)
    with tensorwire.Writer(path, version=2) as w:
        w.write_numpy("emb", a, checksum=first)
        w.write_numpy("head", a.copy(), checksum=second)
    r = tensorwire.Reader(path)
    emb = r["emb"]
    assert np.shares_memory(emb, r["head"])  # stored once
    r = tensorwire.Reader(path)
    r["emb"][:] *= 2
    np.testing.assert_array_equal(r["head"], a * 2)  # the same private bytes
    np.testing.assert_array_equal(r.read_numpy("head", copy=True), a * 2)
    assert r.verify() == (first != "none") + (second != "none")
    assert tensorwire.Reader(path).verify() == r.verify()
    # A change in the file itself is still found, through either tensor.
    with open(path, "r+b") as f:
        data = f.read()
        at = data.index(a.tobytes())
        f.seek(at)
        f.write(np.float32(7).tobytes())
    for name in ("emb", "head"):
        with pytest.raises(tensorwire.ChecksumError):
            tensorwire.Reader(path)[name]


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


def _ztensor_2():
    """The real ztensor package when version 2.x is installed (dev setups), else skip."""
    from importlib import metadata

    zt = pytest.importorskip("ztensor")
    version = metadata.version("ztensor")
    if int(version.split(".")[0]) < 2:
        pytest.skip(f"needs ztensor 2.x to read version 2 files (installed: {version})")
    return zt


def test_ztensor_2_reads_what_we_write(tmp_path):
    zt = _ztensor_2()
    rng = np.random.default_rng(3)
    arrays = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": rng.integers(-1000, 1000, 1000).astype(np.int64),
        "c": np.array([True, False, True]),
        "d": rng.standard_normal((5, 7)).astype(np.float16),
    }
    path = str(tmp_path / "ours.zt")
    with tensorwire.Writer(path, version=2) as w:
        w.write_numpy("a", arrays["a"])
        w.write_numpy("b", arrays["b"], compress=True, checksum="xxh3")
        w.write_numpy("c", arrays["c"], checksum="sha256")
        w.write_numpy("d", arrays["d"], checksum="xxh3")
    converted = str(tmp_path / "converted.zt")
    tensorwire.convert(path, converted, zt_version=2)
    for file in (path, converted):
        with zt.open(file) as src:
            assert sorted(src.keys()) == sorted(arrays)
            for name, want in arrays.items():
                t = src[name]
                assert t.layout == "dense" and list(t.shape) == list(want.shape)
                raw = t["data"].tobytes()
                got = np.frombuffer(raw, want.dtype).reshape(want.shape)
                np.testing.assert_array_equal(got, want, err_msg=f"{file}: {name}")
                if t.caps.map:
                    np.testing.assert_array_equal(np.from_dlpack(t), want)
            checked, _ = src.verify(deep=True)
            assert checked >= (3 if file == path else 0)


PACKED = {
    # name: (type, shape, stored bytes): f4_e2m1 packs two elements per byte.
    "f4_odd": ("f4_e2m1", [5], [0x21, 0x43, 0x05]),
    "f4_even": ("f4_e2m1", [2, 3], [0x21, 0x43, 0xF5]),
    "f4_rows": ("f4_e2m1", [3, 2], [0x21, 0x43, 0xF5]),
    "e8m0": ("f8_e8m0", [2, 2], [0, 1, 2, 0xFF]),
    "own": ("acme.f6", [2], [7, 9]),
}


def _write_packed(path, version, checksum="none"):
    """PACKED in name order (as ztensor's canonical layout wants), f4_e2m1 in v2 only."""
    with tensorwire.Writer(path, version=version) as w:
        for name, (kind, shape, stored) in sorted(PACKED.items()):
            if version == 1 and kind == "f4_e2m1":
                continue
            data = np.array(stored, np.uint8)
            w.write(name, tensorwire.Tensor({"data": data}, shape=shape, type=kind), checksum=checksum)


@pytest.mark.parametrize("version", [1, 2])
def test_types_without_a_dtype_are_written_and_read_as_stored_bytes(tmp_path, version):
    path = str(tmp_path / "packed.zt")
    _write_packed(path, version)
    with tensorwire.Reader(path) as r:
        r.verify()
        for name in r.keys():
            kind, shape, stored = PACKED[name]
            t = r.read(name)
            assert (t.type, list(t.shape)) == (kind, shape)
            data = t.components["data"]
            assert data.dtype == np.uint8 and data.tobytes() == bytes(stored)
            # One stored byte per element keeps the tensor's shape; packed ones are flat.
            assert list(data.shape) == (shape if data.size == np.prod(shape) else [len(stored)])
            if version == 2 and kind == "acme.f6":
                # Version 2 refuses to view a type it does not know; 1.x types are
                # labels, so a 1.x file's elements read as their stored dtype.
                with pytest.raises(tensorwire.UnsupportedError, match=kind):
                    r.read_numpy(name)
            else:
                # f8_e8m0 and f4_e2m1 read as their bytes (as ztensor 2.x gives them),
                # zero-copy: f8_e8m0 with its shape, f4_e2m1 (two per byte) flat.
                a = r.read_numpy(name)
                assert a.dtype == np.uint8 and a.tobytes() == bytes(stored)
                assert list(a.shape) == list(data.shape)
                assert np.shares_memory(a, r.read_numpy(name))
                assert r.metadata(name).shape == shape


def test_get_slice_names_f8_e8m0_and_f4_e2m1_as_safetensors_does(tmp_path):
    """safe_open over a .zt file: f8_e8m0 is F8_E8M0, a version 2 f4_e2m1 tensor F4
    with its logical shape (a 1.x one, one value per byte, stays U8), whose slices
    numpy cannot take within a byte."""
    from tensorwire.formats import safe_open
    for version in (1, 2):
        path = str(tmp_path / f"v{version}.zt")
        _write_packed(path, version)
        with safe_open(path, "np") as f:
            assert (f.get_slice("e8m0").get_dtype(), f.get_slice("e8m0").get_shape()) == \
                ("F8_E8M0", [2, 2])
            if version == 2:
                s = f.get_slice("f4_odd")
                assert (s.get_dtype(), s.get_shape()) == ("F4", [5])
                # numpy reads its 3 bytes: an index into its 5 values would split them
                with pytest.raises(tensorwire.UnsupportedError, match="before the last"):
                    s[1:]
    with safe_open(str(tmp_path / "v1.zt"), "np") as f:
        assert f.get_slice("own").get_dtype() == "U8"


@pytest.mark.parametrize("version", [1, 2])
def test_read_torch_gives_torch_dtypes_for_f8_e8m0_and_f4_e2m1(tmp_path, version):
    """f8_e8m0 is float8_e8m0fnu; a version 2 f4_e2m1 tensor whose rows fill whole
    bytes is float4_e2m1fn_x2 (pairs along the last dimension, as safetensors' F4
    reads), any other its bytes."""
    torch = pytest.importorskip("torch")
    path = str(tmp_path / "packed.zt")
    _write_packed(path, version)
    want = {"e8m0": (torch.float8_e8m0fnu, (2, 2)), "own": (torch.uint8, (2,))}
    if version == 2:
        want.update({"f4_rows": (torch.float4_e2m1fn_x2, (3, 1)),
                     "f4_even": (torch.uint8, (3,)), "f4_odd": (torch.uint8, (3,))})
    with tensorwire.Reader(path) as r:
        if version == 2:
            with pytest.raises(tensorwire.UnsupportedError, match="acme.f6"):
                r.read_torch("own")
            del want["own"]
        for name, (dtype, shape) in want.items():
            t = r.read_torch(name)
            assert (t.dtype, tuple(t.shape)) == (dtype, shape), name
            assert t.view(torch.uint8).flatten().tolist() == PACKED[name][2], name
        e8m0 = r.read_torch("e8m0")
        assert e8m0.data_ptr() == r.read_numpy("e8m0").ctypes.data
        values = e8m0.float().flatten().tolist()  # 2 ** (byte - 127); 0xFF is NaN
        assert values[:3] == [2.0 ** -127, 2.0 ** -126, 2.0 ** -125]
        assert values[3] != values[3]


def test_f4_e2m1_goes_to_version_1_as_torch_pairs(tmp_path):
    """.zt 1.x stores one value per byte: a version 2 f4_e2m1 tensor converts to it as
    torch's float4_e2m1fn_x2 pairs along the last dimension (the same bytes, u8 holders
    with that layout recorded), and back to version 2 as itself; an odd last dimension
    has no pairs and is refused, leaving no file."""
    v2, v1, again = (str(tmp_path / n) for n in ("v2.zt", "v1.zt", "again.zt"))
    with tensorwire.Writer(v2, version=2) as w:
        kind, shape, stored = PACKED["f4_rows"]
        w.write("f4", tensorwire.Tensor({"data": np.array(stored, np.uint8)}, shape=shape,
                                        type=kind))
    tensorwire.convert(v2, v1)
    with tensorwire.Reader(v1) as r:
        a = r.read_numpy("f4")
        assert (a.dtype, a.shape, a.tobytes()) == (np.uint8, (3, 1), bytes(stored))
        assert r.metadata("f4").attributes["tensorwire.layout"] == "pytorch:float4_e2m1fn_x2"
    tensorwire.convert(v1, again, zt_version=2)
    with tensorwire.Reader(again) as r:
        obj = r.read("f4")
        assert (obj.type, list(obj.shape)) == ("f4_e2m1", shape)
        assert r.read_numpy("f4").tobytes() == bytes(stored)

    odd = str(tmp_path / "odd.zt")
    _write_packed(odd, 2)
    with pytest.raises(tensorwire.UnsupportedError,
                       match=r"f4_e2m1 tensor `f4_(even|odd)` of shape \[[\d, ]+\] to \.zt 1\.x"):
        tensorwire.convert(odd, str(tmp_path / "odd1.zt"))
    assert not (tmp_path / "odd1.zt").exists()


def test_torch_only_dtypes_read_alike_through_version_2_and_back(tmp_path):
    """A .pt file's float8_e8m0fnu, float4_e2m1fn_x2 and complex32 tensors, converted
    to .zt version 2 and from there to 1.x, read as torch.load reads them."""
    import os
    torch = pytest.importorskip("torch")
    src = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "pytorch",
                       "torch_only.pt")
    v2, v1 = str(tmp_path / "mx2.zt"), str(tmp_path / "mx1.zt")
    tensorwire.convert(src, v2, zt_version=2)
    tensorwire.convert(v2, v1)
    want = torch.load(src, weights_only=True)
    with tensorwire.Reader(v1) as r:
        assert sorted(r.keys()) == sorted(want)
        for name, w in want.items():
            t = r.read_torch(name)
            assert (t.dtype, t.shape) == (w.dtype, w.shape), name
            assert torch.equal(t.contiguous().reshape(-1).view(torch.uint8),
                               w.contiguous().reshape(-1).view(torch.uint8)), name


def test_writer_refuses_packed_bytes_a_reader_would_refuse(tmp_path):
    path = str(tmp_path / "bad.zt")
    cases = [
        ("f4_e2m1", [7], [0x21, 0x43, 0x05], "needs 4 bytes"),
        ("f4_e2m1", [5], [0x21, 0x43, 0x15], "high nibble"),
        ("bool", [3], [0, 1, 2], "bool bytes"),
    ]
    for kind, shape, stored, message in cases:
        with tensorwire.Writer(path, version=2) as w:
            with pytest.raises(tensorwire.InvalidArgumentError, match=message):
                w.write("x", tensorwire.Tensor({"data": np.array(stored, np.uint8)}, shape=shape, type=kind))
    with tensorwire.Writer(path, version=2) as w:
        w.write("b", tensorwire.Tensor({"data": np.array([1, 0], np.uint8)}, type="bool"))
    with tensorwire.Reader(path) as r:
        np.testing.assert_array_equal(r["b"], [True, False])
    with pytest.raises(tensorwire.InvalidArgumentError, match="stored as f32"):
        with tensorwire.Writer(path, version=2) as w:
            w.write("x", tensorwire.Tensor({"data": np.zeros(4, np.uint8)}, type="float32"))


def test_ztensor_2_reads_packed_types_we_write(tmp_path):
    zt = _ztensor_2()
    path = str(tmp_path / "packed.zt")
    _write_packed(path, 2)
    with zt.open(path) as src:
        assert sorted(src.keys()) == sorted(PACKED)
        for name, (kind, shape, stored) in PACKED.items():
            assert list(src[name].shape) == shape
            assert src[name]["data"].tobytes() == bytes(stored)
        src.verify(deep=True)
    # The same tensors written by ztensor 2.x and by us (xxh3, its default): same bytes.
    # (ztensor's canonical layout wants names in sorted order.)
    theirs, ours = str(tmp_path / "theirs.zt"), str(tmp_path / "ours.zt")
    with zt.Writer(theirs) as w:
        for name, (kind, shape, stored) in sorted(PACKED.items()):
            w.add(name, np.array(stored, np.uint8), shape=shape, dtype="u8", logical=kind)
    _write_packed(ours, 2, checksum="xxh3")
    assert open(ours, "rb").read() == open(theirs, "rb").read()


def test_ztensor_2_reads_e8m0_and_float4_converted_from_a_pytorch_checkpoint(tmp_path):
    """convert(zt_version=2) of a .pt file's float8_e8m0fnu and float4_e2m1fn_x2
    tensors: ztensor 2.x reads them as f8_e8m0 and f4_e2m1 of torch's values."""
    import os
    zt = _ztensor_2()
    src = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "pytorch",
                       "torch_only.pt")
    out = str(tmp_path / "mx.zt")
    tensorwire.convert(src, out, zt_version=2)
    r = tensorwire.Reader(src)
    with zt.open(out) as theirs:
        theirs.verify(deep=True)
        for name in ("e8m0", "e8m0_grid", "f4", "f4_row", "f4_transposed"):
            t = theirs[name]
            holder = np.ascontiguousarray(r[name])
            shape = list(holder.shape)
            if name.startswith("f4"):
                shape[-1] *= 2
            assert (t.logical, list(t.shape)) == (
                "f4_e2m1" if name.startswith("f4") else "f8_e8m0", shape), name
            assert t.tobytes() == holder.tobytes(), name


@pytest.mark.parametrize("version", [1, 2])
def test_writer_refuses_types_it_would_have_to_drop(tmp_path, version):
    ml = pytest.importorskip("ml_dtypes")
    path = str(tmp_path / "refused.zt")
    with tensorwire.Writer(path, version=version) as w:
        # Data with a logical type of its own cannot take another one.
        for data in (np.zeros(4, ml.float8_e4m3fn), np.zeros(2, np.complex64)):
            with pytest.raises(tensorwire.InvalidArgumentError, match="stored elements"):
                w.write("x", tensorwire.Tensor({"data": data}, type="f8_e8m0"))
        # A dense tensor has one component, whatever its type.
        parts = {"data": np.zeros(2, np.uint8), "scale": np.ones(1, np.float32)}
        with pytest.raises(tensorwire.InvalidArgumentError, match="exactly one component"):
            w.write("x", tensorwire.Tensor(parts, shape=[2], type="acme.f6"))
        # 1.x holds one stored element per tensor element, so 3 bytes are not 5 f4_e2m1.
        if version == 1:
            data = np.array([0x21, 0x43, 0x05], np.uint8)
            with pytest.raises(tensorwire.InvalidArgumentError, match="needs 5 bytes"):
                w.write("x", tensorwire.Tensor({"data": data}, shape=[5], type="f4_e2m1"))
        # A huge integer is named by its size (printing it would take seconds).
        with pytest.raises(tensorwire.InvalidArgumentError, match="16610 bits"):
            w.write_numpy("x", np.zeros(1), attributes={"v": 10**5000})
        w.write_numpy("ok", np.zeros(1))
    with tensorwire.Reader(path) as r:
        assert r.keys() == ["ok"]


def _labelled(path, tensors):
    """A .zt 1.x file of uint8 tensors carrying another format's listing attributes:
    {name: (bytes, tensorwire.layout, safetensors.shape)}."""
    with tensorwire.Writer(path) as w:
        for name, (stored, layout, shape) in tensors.items():
            attrs = {"tensorwire.layout": layout}
            if shape is not None:
                attrs["safetensors.shape"] = shape
            w.write_numpy(name, np.array(stored, np.uint8), attributes=attrs)


def test_f4_and_e8m0_from_safetensors_take_version_2_types_only_where_they_fit(tmp_path):
    """F4 of an odd last dimension (which has no way back from f4_e2m1) and listings
    whose recorded shape does not count the bytes travel as their bytes, and every
    tensor comes back to safetensors as it was."""
    zt1, st = str(tmp_path / "a.zt"), str(tmp_path / "a.safetensors")
    _labelled(zt1, {"f4_odd": ([0x21, 0x43, 0x65], "safetensors:F4", [2, 3]),
                    "f4_rows": ([0x21, 0x43, 0x65], "safetensors:F4", [3, 2]),
                    "e8": ([1, 2, 3, 4], "safetensors:F8_E8M0", [2, 2])})
    tensorwire.convert(zt1, st)
    v2, back = str(tmp_path / "a2.zt"), str(tmp_path / "back.safetensors")
    tensorwire.convert(st, v2, zt_version=2)
    r = tensorwire.Reader(v2)
    assert {k: (r.metadata(k).type, r.metadata(k).shape) for k in r.keys()} == {
        "f4_odd": (None, [3]), "f4_rows": ("f4_e2m1", [3, 2]), "e8": ("f8_e8m0", [2, 2])}
    tensorwire.convert(v2, back)
    assert open(back, "rb").read() == open(st, "rb").read()
    # A listing whose shape does not count the bytes is not taken.
    bad = str(tmp_path / "bad.zt")
    _labelled(bad, {"long": ([1, 2, 3], "safetensors:F4", [5]),
                    "junk": ([1, 2, 3], "safetensors:F8_E8M0", ["x"]),
                    "e8_short": ([1, 2, 3], "safetensors:F8_E8M0", [4])})
    tensorwire.convert(bad, str(tmp_path / "bad2.zt"), zt_version=2)
    r = tensorwire.Reader(str(tmp_path / "bad2.zt"))
    for k in r.keys():
        assert (r.metadata(k).type, r.read_numpy(k).tolist()) == (None, [1, 2, 3]), k


def test_get_slice_follows_read_torch_s_rules(tmp_path):
    """get_dtype and get_shape name what read_torch reads: a 1.x label over another
    dtype is that dtype; a listing a 1.x file records is taken where it fits."""
    from tensorwire.formats import safe_open
    path = str(tmp_path / "labels.zt")
    with tensorwire.Writer(path) as w:
        w.write("e8_f32", tensorwire.Tensor({"data": np.arange(4, dtype=np.float32)},
                                            type="f8_e8m0"))
    _labelled(str(tmp_path / "listed.zt"),
              {"f4": ([0x21, 0x43, 0x65], "safetensors:F4", [3, 2]),
               "f4_long": ([0x21, 0x43, 0x65], "safetensors:F4", [7, 2])})
    with safe_open(path, "np") as f:
        assert (f.get_slice("e8_f32").get_dtype(), f.get_slice("e8_f32").get_shape()) == \
            ("F32", [4])
    with safe_open(str(tmp_path / "listed.zt"), "np") as f:
        assert (f.get_slice("f4").get_dtype(), f.get_slice("f4").get_shape()) == ("F4", [3, 2])
        assert (f.get_slice("f4_long").get_dtype(), f.get_slice("f4_long").get_shape()) == \
            ("U8", [3])


@pytest.mark.parametrize("version", [1, 2])
def test_get_slice_names_float6_converted_to_zt_as_the_source(tmp_path, version):
    """A safetensors F6_* tensor (read as raw bytes) converted to .zt keeps its
    listing: get_slice names its type and logical shape as over the source file;
    a recorded shape that does not count the bytes is not taken."""
    import json
    import struct

    from tensorwire import formats

    header = json.dumps({"f6": {"dtype": "F6_E3M2", "shape": [2, 4],
                                "data_offsets": [0, 6]}}).encode()
    header += b" " * (-len(header) % 8)
    src = tmp_path / "f6.safetensors"
    src.write_bytes(struct.pack("<Q", len(header)) + header + bytes(range(6)))
    out = str(tmp_path / "f6.zt")
    tensorwire.convert(str(src), out, zt_version=version)
    for path in (str(src), out):
        with formats.safe_open(path, "np") as f:
            part = f.get_slice("f6")
            assert (part.get_dtype(), part.get_shape()) == ("F6_E3M2", [2, 4]), path
            assert part[:].tobytes() == bytes(range(6))
    # A .zt tensor recording a shape its bytes do not hold: its own listing.
    bad = str(tmp_path / "bad.zt")
    with tensorwire.Writer(bad, version=version) as w:
        w.write_numpy("f6", np.arange(6, dtype=np.uint8), attributes={
            "tensorwire.layout": "safetensors:F6_E3M2", "safetensors.dtype": "F6_E3M2",
            "safetensors.shape": [3, 4]})
    with formats.safe_open(bad, "np") as f:
        assert (f.get_slice("f6").get_dtype(), f.get_slice("f6").get_shape()) == ("U8", [6])


def test_byte_types_read_the_same_through_a_shard_index(tmp_path):
    """f8_e8m0 and f4_e2m1 tensors of version 2 shards, read through an index: the
    same metadata, numpy and torch tensors as from the shard itself."""
    import json
    _write_packed(str(tmp_path / "s.zt"), 2)
    with open(tmp_path / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {}, "weight_map": {k: "s.zt" for k in PACKED}}, f)
    index = tensorwire.Reader(str(tmp_path / "model.safetensors.index.json"))
    shard = tensorwire.Reader(str(tmp_path / "s.zt"))
    for name in ("e8m0", "f4_rows", "f4_odd"):
        assert index.metadata(name).shape == shard.metadata(name).shape == PACKED[name][1]
        assert index.read_numpy(name).tobytes() == shard.read_numpy(name).tobytes()
    torch = pytest.importorskip("torch")
    for name in ("e8m0", "f4_rows", "f4_odd"):
        a, b = index.read_torch(name), shard.read_torch(name)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), name
    assert index.read_torch("f4_rows").dtype == torch.float4_e2m1fn_x2


def test_gguf_block_objects_are_described_as_they_read():
    """A `gguf.<type>/1` object is listed and read as its `u8` rows of blocks: its
    metadata gives that shape and the GGUF reader's attributes, as the same tensor
    read from the GGUF file (it gave the object's logical shape, which its bytes do
    not fill)."""
    v2 = os.path.join(REPO, "fixtures", "zt", "v2", "gguf_blocks.zt")
    gguf = os.path.join(REPO, "fixtures", "gguf", "quantized.gguf")
    with tensorwire.Reader(v2) as r, tensorwire.Reader(gguf) as g:
        blocks = [n for n in r.keys() if (r.metadata(n).attributes or {}).get("gguf.type") not in (None, "F32")]
        assert blocks
        for name in blocks:
            meta, array = r.metadata(name), r.read_numpy(name)
            assert tuple(meta.shape) == array.shape == g.read_numpy(name).shape, name
            assert meta.dtype == "uint8"
            want = g.metadata(name).attributes
            assert {k: meta.attributes[k] for k in ("gguf.type", "gguf.shape")} == want, name
            assert meta.attributes["tensorwire.layout"] == "gguf:" + want["gguf.type"]
            assert meta.components["data"]["length"] == array.nbytes


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_signed_csr_indices_are_written_unsigned_in_version_2(tmp_path, index_dtype):
    """scipy and ztensor 1.x give CSR indices as int32/int64; zt.sparse_csr/1 stores
    them unsigned. Non-negative ones have the same bytes, so a version 2 file takes
    them (listed u32/u64), from Python and through convert; a negative one is refused."""
    values = np.array([1.0, 2.0, 3.0], np.float32)
    indices = np.array([0, 2, 1], index_dtype)
    indptr = np.array([0, 2, 2, 3], index_dtype)
    unsigned = np.uint32 if index_dtype == np.int32 else np.uint64

    def csr(ix):
        return tensorwire.Tensor({"values": values, "indices": ix, "indptr": indptr},
                                 shape=[3, 3], format="sparse_csr")

    v1, v2 = str(tmp_path / "v1.zt"), str(tmp_path / "v2.zt")
    with tensorwire.Writer(v2, version=2) as w:
        w.write("csr", csr(indices), checksum="xxh3")
    with tensorwire.Writer(v1) as w:
        w.write("csr", csr(indices))
    converted = str(tmp_path / "converted.zt")
    tensorwire.convert(v1, converted, zt_version=2)
    for path in (v2, converted):
        got = tensorwire.Reader(path).read("csr")
        assert got.components["indices"].dtype == unsigned
        np.testing.assert_array_equal(got.components["indices"], indices)
        np.testing.assert_array_equal(got.components["indptr"], indptr)
        np.testing.assert_array_equal(got.components["values"], values)
    with pytest.raises(tensorwire.TensorwireError, match="u32 or u64"):
        with tensorwire.Writer(str(tmp_path / "neg.zt"), version=2) as w:
            w.write("csr", csr(np.array([0, -2, 1], index_dtype)))
