"""Typed errors for malformed, truncated, corrupted and missing input."""

import subprocess
import sys

import numpy as np
import pytest

import tensorwire as tw


def test_hierarchy():
    for cls in (tw.BadMagicError, tw.TruncatedError, tw.MalformedError, tw.LimitExceededError,
                tw.ChecksumError, tw.DecodeError):
        assert issubclass(cls, tw.FormatError) and issubclass(cls, tw.TensorwireError)
    assert issubclass(tw.TensorNotFoundError, KeyError)
    assert issubclass(tw.TensorNotFoundError, tw.TensorwireError)
    assert issubclass(tw.InvalidArgumentError, ValueError)
    assert issubclass(tw.UnsupportedError, tw.TensorwireError)
    # ztensor and tenso raise ValueError for a dtype or packet they do not handle.
    assert issubclass(tw.UnsupportedError, ValueError)
    assert tw.TensorwireError.__module__ == "tensorwire"
    assert issubclass(tw.DuplicateNameError, tw.MalformedError)
    assert issubclass(tw.DuplicateNameError, tw.InvalidArgumentError)


def test_errors_are_runtime_errors_as_ztensor_raises_them(tmp_path):
    """ztensor 1.2.3 raises RuntimeError for a digest mismatch, a bad file, a
    duplicate name and a write after finish: code catching that catches ours."""
    assert issubclass(tw.TensorwireError, RuntimeError)
    path = str(tmp_path / "x.zt")
    w = tw.Writer(path)
    w.write_numpy("a", np.arange(64, dtype=np.float32), checksum="sha256")
    with pytest.raises(RuntimeError):
        w.write_numpy("a", np.zeros(1))
    w.finish()
    with pytest.raises(RuntimeError):
        w.write_numpy("b", np.zeros(1))
    data = bytearray(open(path, "rb").read())
    data[64 + 5] ^= 0xFF  # the first tensor's bytes start at 64 (the 64-byte alignment)
    open(path, "wb").write(bytes(data))
    with pytest.raises(RuntimeError):
        tw.Reader(path)["a"]
    open(path, "wb").write(b"not a tensor file at all")
    with pytest.raises(RuntimeError):
        tw.Reader(path)


def test_an_unsupported_dtype_is_a_value_error_as_in_ztensor(tmp_path):
    with tw.Writer(str(tmp_path / "x.zt")) as w:
        with pytest.raises(ValueError) as info:
            w.write_numpy("s", np.array(["a"]))
    assert isinstance(info.value, tw.UnsupportedError)


def test_a_name_listed_twice_in_a_file_is_a_format_error(tmp_path):
    """A duplicate in a file is bad data (FormatError); one given to a writer is a bad
    argument (InvalidArgumentError): DuplicateNameError is both."""
    import json
    import struct

    first = {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}
    second = {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}
    header = '{"a": %s, "a": %s}' % (json.dumps(first), json.dumps(second))
    p = tmp_path / "dup.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header.encode() + b"\0\0")
    with pytest.raises(tw.FormatError, match="duplicate") as e:
        tw.Reader(str(p))
    assert isinstance(e.value, tw.DuplicateNameError)
    with tw.Writer(str(tmp_path / "w.zt")) as w:
        w.add("x", np.arange(3))
        with pytest.raises(tw.DuplicateNameError, match="duplicate"):
            w.add("x", np.arange(3))


def _write(path, **kw):
    with tw.Writer(path) as w:
        w.write_numpy("a", np.arange(1000, dtype=np.int32), **kw)
        w.write_numpy("b", np.arange(10, dtype=np.float64))


def test_missing_file_is_oserror(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        tw.Reader(str(tmp_path / "nope.zt"))
    assert e.value.filename.endswith("nope.zt")


def test_bad_magic(tmp_path):
    p = tmp_path / "x.zt"
    p.write_bytes(b"NOTATENSORFILE" * 10)
    with pytest.raises(tw.BadMagicError):
        tw.Reader(str(p))
    p.write_bytes(b"")
    with pytest.raises(tw.FormatError):
        tw.Reader(str(p))


def test_bad_footer_magic(zt_path):
    _write(zt_path)
    data = bytearray(open(zt_path, "rb").read())
    data[-1] ^= 0xFF
    open(zt_path, "wb").write(bytes(data))
    with pytest.raises(tw.BadMagicError):
        tw.Reader(zt_path)


@pytest.mark.parametrize("keep", [8, 12, 100, -1])
def test_truncated(zt_path, keep):
    _write(zt_path)
    data = open(zt_path, "rb").read()
    cut = data[:keep] if keep > 0 else data[:keep] + b""
    open(zt_path, "wb").write(cut)
    with pytest.raises(tw.FormatError):
        tw.Reader(zt_path)


def test_truncated_manifest_is_typed(zt_path):
    _write(zt_path)
    data = open(zt_path, "rb").read()
    # Keep the header and footer but claim a manifest longer than the file.
    import struct
    bad = data[:-16] [:64] + struct.pack("<Q", 1 << 20) + b"ZTEN1000"
    open(zt_path, "wb").write(bad)
    with pytest.raises(tw.TruncatedError):
        tw.Reader(zt_path)


def test_manifest_over_limit(zt_path):
    import struct
    open(zt_path, "wb").write(b"ZTEN1000" + struct.pack("<Q", 1 << 40) + b"ZTEN1000")
    with pytest.raises(tw.LimitExceededError):
        tw.Reader(zt_path)


def test_garbage_manifest_is_malformed(zt_path):
    import struct
    manifest = b"\xff" * 10
    open(zt_path, "wb").write(b"ZTEN1000" + manifest + struct.pack("<Q", 10) + b"ZTEN1000")
    with pytest.raises(tw.FormatError):
        tw.Reader(zt_path)


@pytest.mark.parametrize("checksum", ["crc32c", "sha256"])
@pytest.mark.parametrize("compress", [False, True])
def test_corrupted_checksummed_tensor(zt_path, checksum, compress):
    _write(zt_path, checksum=checksum, compress=compress)
    with tw.Reader(zt_path) as r:
        off = r.metadata("a").components["data"]["offset"]
    data = bytearray(open(zt_path, "rb").read())
    data[off + 5] ^= 0x01
    open(zt_path, "wb").write(bytes(data))
    r = tw.Reader(zt_path)
    np.testing.assert_array_equal(r["b"], np.arange(10.0))  # the other tensor is fine
    for read in (lambda: r["a"], lambda: r.read_numpy("a", copy=True), lambda: r.read("a"),
                 lambda: r.read_into("a", np.empty(1000, np.int32)), r.verify):
        with pytest.raises(tw.ChecksumError, match=checksum):
            read()


def test_corrupted_compressed_blob_without_checksum(zt_path):
    _write(zt_path, compress=True)
    with tw.Reader(zt_path) as r:
        c = r.metadata("a").components["data"]
    data = bytearray(open(zt_path, "rb").read())
    for i in range(c["length"]):
        data[c["offset"] + i] = 0xAA
    open(zt_path, "wb").write(bytes(data))
    with tw.Reader(zt_path) as r:
        with pytest.raises(tw.FormatError):
            r["a"]


def test_not_found(zt_path):
    _write(zt_path)
    with tw.Reader(zt_path) as r:
        with pytest.raises(tw.TensorNotFoundError, match="nope"):
            r["nope"]
        with pytest.raises(KeyError):
            r.metadata("nope")
        with pytest.raises(KeyError):
            r.read_numpy(["a", "nope"])


def test_writer_bad_mode_and_missing_append_target(tmp_path):
    with pytest.raises(ValueError):
        tw.Writer(str(tmp_path / "x.zt"), mode="r")
    with pytest.raises(FileNotFoundError):
        tw.Writer.append(str(tmp_path / "missing.zt"))
    with pytest.raises(FileNotFoundError):
        tw.Writer(str(tmp_path / "no-such-dir" / "x.zt"))


def test_ml_dtypes_missing_gives_clear_error(zt_path):
    pytest.importorskip("ml_dtypes")
    import ml_dtypes

    with tw.Writer(zt_path) as w:
        w.write_numpy("bf", np.ones(3, ml_dtypes.bfloat16))
        w.write_numpy("f", np.ones(3, np.float32))
    code = f"""
import sys
sys.modules["ml_dtypes"] = None  # make `import ml_dtypes` fail
import tensorwire as tw
r = tw.Reader({zt_path!r})
assert r["f"].sum() == 3
assert r.metadata("bf").dtype == "bfloat16"
try:
    r["bf"]
except tw.UnsupportedError as e:
    assert "pip install ml_dtypes" in str(e), e
    print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_verify_checks_npz_member_crcs(tmp_path):
    """np.load checks each member's CRC-32 as it reads; zero-copy reads touch no byte,
    so Reader.verify() does it, as it does for every other stored digest."""
    path = tmp_path / "a.npz"
    np.savez(path, a=np.arange(100, dtype=np.int64), b=np.ones(3))
    with tw.Reader(str(path)) as r:
        assert r.verify() == 2
    data = bytearray(path.read_bytes())
    at = data.index(np.arange(100, dtype=np.int64).tobytes()) + 8 * 50
    data[at] ^= 1
    path.write_bytes(bytes(data))
    with tw.Reader(str(path)) as r:
        assert r.read_numpy("a")[50] == 51  # the read itself trusts the file
        with pytest.raises(tw.ChecksumError, match="a.npy"):
            r.verify()


def _gguf_nested(levels):
    """A GGUF file whose one key holds `levels` arrays nested in each other."""
    import struct

    value = struct.pack("<IQ", 4, 1) + struct.pack("<I", 7)      # innermost: [7] (UINT32)
    for _ in range(levels - 1):
        value = struct.pack("<IQ", 9, 1) + value                  # an array holding it
    kv = struct.pack("<Q", 1) + b"k" + struct.pack("<I", 9) + value
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv


def test_limits_are_raised_or_lowered_by_name(tmp_path):
    assert tw.DEFAULT_LIMITS["max_depth"] == 64
    with pytest.raises(TypeError):
        tw.DEFAULT_LIMITS["max_depth"] = 1                        # read-only
    deep = _gguf_nested(70)
    with pytest.raises(tw.LimitExceededError, match="nesting depth is 65, above the limit of 64"):
        tw.Reader(buffer=deep)
    r = tw.Reader(buffer=deep, limits={"max_depth": 70})
    value = r.attributes["k"]
    for _ in range(69):
        (value,) = value
    assert value == [7]
    # The ceiling holds whatever the limit asks: each level is a stack frame.
    with pytest.raises(tw.LimitExceededError, match="above the limit of 128"):
        tw.Reader(buffer=_gguf_nested(200), limits={"max_depth": 10**9})
    path = tmp_path / "deep.gguf"
    path.write_bytes(deep)
    assert tw.open(str(path), limits={"max_depth": 70}).attributes == r.attributes
    with pytest.raises(tw.LimitExceededError):
        tw.convert(str(path), str(tmp_path / "deep.zt"))
    assert not (tmp_path / "deep.zt").exists()
    tw.convert(str(path), str(tmp_path / "deep.zt"), limits={"max_depth": 70})
    # The manifest holds the attribute four levels down.
    assert tw.Reader(str(tmp_path / "deep.zt"), limits={"max_depth": 80}).attributes == r.attributes
    with pytest.raises(tw.LimitExceededError, match="header size is 109, above the limit of 100"):
        tw.Reader(str(path), limits={"max_metadata_bytes": 100})
    assert len(tw.Reader(buffer=_gguf_nested(3), limits=None).attributes) == 1


@pytest.mark.parametrize("limits, error, match", [
    ({"max_dpth": 1}, tw.InvalidArgumentError, "unknown limit 'max_dpth'|unknown limit \"max_dpth\""),
    ({"max_depth": -1}, tw.InvalidArgumentError, "must be an int"),
    ({"max_depth": 2**64}, tw.InvalidArgumentError, "must be an int"),
    ({"max_depth": 1.5}, tw.InvalidArgumentError, "must be an int"),
    ({"max_depth": True}, tw.InvalidArgumentError, "must be an int"),
    ({1: 2}, tw.InvalidArgumentError, "names are str"),
    ([("max_depth", 1)], TypeError, "must be a dict"),
])
def test_a_bad_limit_is_named(limits, error, match):
    with pytest.raises(error, match=match):
        tw.Reader(buffer=_gguf_nested(1), limits=limits)


def test_a_checkpoint_nested_deeper_than_the_default_loads_with_a_raised_limit(tmp_path):
    torch = pytest.importorskip("torch")
    sd = {"w": torch.arange(4.0)}
    for _ in range(69):
        sd = {"a": sd}
    path = str(tmp_path / "deep.pt")
    torch.save(sd, path)
    with pytest.raises(tw.LimitExceededError, match="limit of 64"):
        tw.pytorch.load(path)
    name = "a." * 69 + "w"
    flat = tw.pytorch.load(path, limits={"max_depth": 80})
    assert list(flat) == [name] and torch.equal(flat[name], torch.arange(4.0))
    assert tw.pytorch.load_numpy(path, limits={"max_depth": 80})[name].tolist() == [0, 1, 2, 3]
    obj = tw.pytorch.load(path, limits={"max_depth": 80}, flat=False)
    for _ in range(69):
        obj = obj["a"]
    assert torch.equal(obj["w"], torch.arange(4.0))
