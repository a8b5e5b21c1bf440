"""Hostile input at the Python level: a bounded run of scripts/hostile_sweep.py (every
fixture, mutated with a fixed seed, through the Python entry points in a worker
process that may crash), and regression tests for what the full sweep found."""

import importlib.util
import io
import os

import numpy as np
import pytest

import tensorwire as tw
from tensorwire import formats, packet, pytorch

from conftest import REPO

try:
    import torch
except ImportError:  # the torch halves are skipped
    torch = None


def _sweep_module():
    path = os.path.join(REPO, "scripts", "hostile_sweep.py")
    spec = importlib.util.spec_from_file_location("hostile_sweep", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sweep_tells_typed_errors_from_the_rest():
    sweep = _sweep_module()
    assert sweep.classify(tw.MalformedError("x"))[0] == "typed"
    assert sweep.classify(tw.TensorNotFoundError("x"))[0] == "typed"
    assert sweep.classify(FileNotFoundError("x"))[0] == "typed"
    assert sweep.classify(TypeError("x"))[0] == "untyped"
    assert sweep.classify(ValueError("x"))[0] == "untyped"
    assert sweep.classify(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "x"))[0] == "untyped"
    assert sweep.classify(MemoryError())[0] == "memory"
    assert sweep.classify(sweep.Invariant("x"))[0] == "invariant"


def test_mutations_are_deterministic():
    sweep = _sweep_module()
    seeds = sweep.seeds()
    assert len(seeds) > 100
    for i in (0, 1, 17, 999):
        assert sweep.make_case(7, i, seeds) == sweep.make_case(7, i, seeds)


def test_bounded_hostile_sweep():
    """4,000 mutated fixtures through every Python entry point (and, when it is built,
    every 40th through the CLI): each must read, or raise a typed error; no panic,
    crash, hang, unbounded allocation, untyped exception or inconsistent result."""
    sweep = _sweep_module()
    summary = sweep.sweep(seed=20261127, cases=4000, timeout=20.0, progress=False,
                          cli_every=40)
    counts = summary["counts"]
    # The sweep reached the readers: many inputs read, many were refused.
    assert counts["reader"].get("ok", 0) > 500, counts
    assert counts["reader"].get("typed", 0) > 500, counts
    assert counts["packet"].get("ok", 0) > 200, counts
    assert counts["pytorch"].get("ok", 0) > 50, counts
    problems = [f"{p['op']} {p['outcome']} {p['type']} at {p['where']} x{p['count']} "
                f"(replay: python scripts/hostile_sweep.py --seed 20261127 --replay "
                f"{p['first']}): {p['message'][:300]}" for p in summary["problems"]]
    assert not problems, "\n".join(problems)


# Regressions the full sweep found.


def test_string_packet_that_is_not_utf8_raises_malformed():
    """A string packet's payload is checked on access: bytes that are not UTF-8 are a
    MalformedError (a ValueError, as tenso's UnicodeDecodeError is), not a bare
    UnicodeDecodeError."""
    got = packet.loads(packet.StringTensor([b"ok", b"\xa9\xff", "\u00e9"]).dumps())
    assert got[0] == "ok" and got[2] == "\u00e9"
    with pytest.raises(tw.MalformedError, match="string 1 is not valid UTF-8") as e:
        got[1]
    assert isinstance(e.value, ValueError)
    with pytest.raises(tw.MalformedError):
        got.to_list()
    with pytest.raises(tw.MalformedError):
        list(got)


@pytest.mark.skipif(torch is None, reason="needs torch")
@pytest.mark.parametrize("name", ["quant_qint4_per_group.tnso", "quant_quint4_per_channel.tnso"])
def test_read_torch_of_a_4bit_packet_is_unsupported(name):
    """torch has no 4-bit dtype: read_torch of a qint4/quint4 packet is an
    UnsupportedError (as read_numpy's is), not a TypeError."""
    path = os.path.join(REPO, "fixtures", "packet", name)
    with tw.Reader(path) as r:
        with pytest.raises(tw.UnsupportedError, match="no dtype for q(u)?int4"):
            r.read_torch("tensor")
        with pytest.raises(tw.UnsupportedError):
            r.read_torch("tensor", copy=True)
        with pytest.raises(tw.UnsupportedError):
            r.read_into("tensor", torch.empty(4, dtype=torch.uint8))
        with pytest.raises(tw.UnsupportedError):
            r.read_numpy("tensor")
    with pytest.raises(tw.UnsupportedError):
        formats.load_file(path, framework="pt")
    with formats.safe_open(path, framework="pt") as f:
        with pytest.raises(tw.UnsupportedError):
            f.get_slice("tensor")[:1]


def _legacy_checkpoint(obj):
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=False)
    return buf.getvalue()


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_quantized_zero_point_out_of_range_is_malformed():
    """A per-tensor zero point outside the quantized dtype's range: torch builds the
    tensor, then every dequantize raises a RuntimeError. load refuses it."""
    q = torch.quantize_per_tensor(torch.zeros(4), 0.5, 77, torch.qint8)
    data = _legacy_checkpoint({"q": q})
    assert data.count(b"K\x4d") == 1  # BININT1 77: the zero point
    assert pytorch.load(data)["q"].q_zero_point() == 77
    bad = data.replace(b"K\x4d", b"K\xc8")  # 200, past qint8's 127
    with pytest.raises(tw.MalformedError, match=r"`q`: zero point 200 is outside .*\[-128, 127\]"):
        pytorch.load(bad)
    with pytest.raises(tw.MalformedError):
        pytorch.load(bad, flat=False)
    # numpy has no quantized arrays: the integers and the attributes, as before.
    assert pytorch.load_numpy(bad)["q"].dtype == np.int8


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_quantized_per_channel_zero_point_out_of_range_is_malformed():
    zero_points = torch.tensor([101, 102, 103])
    q = torch.quantize_per_channel(torch.zeros(3, 2), torch.tensor([0.5, 0.5, 0.5]),
                                   zero_points, 0, torch.qint8)
    data = _legacy_checkpoint({"q": q})
    raw = zero_points.numpy().astype("<i8").tobytes()
    assert data.count(raw) == 1
    torch.testing.assert_close(pytorch.load(data)["q"].dequantize(), q.dequantize())
    bad = data.replace(raw, np.array([101, -1000, 103], "<i8").tobytes())
    with pytest.raises(tw.MalformedError, match="zero point -1000 is outside"):
        pytorch.load(bad)
    with pytest.raises(tw.MalformedError):
        pytorch.load(bad, mmap=False)
    # Float zero points (per_channel_affine_float_qparams) are not range-checked.
    fq = torch.quantize_per_channel(torch.zeros(3, 2), torch.tensor([0.5, 0.5, 0.5]),
                                    torch.tensor([-300.5, 0.0, 900.0]), 0, torch.quint8)
    got = pytorch.load(_legacy_checkpoint({"q": fq}))["q"]
    assert got.qscheme() == torch.per_channel_affine_float_qparams


@pytest.mark.parametrize("value", [5, "ab", [1, "x"], [2, 2], [1 << 40], None])
def test_slice_shape_of_a_zt_tensor_ignores_its_safetensors_shape_attribute(tmp_path, value):
    """A `.zt` tensor's attributes are its writer's: one named `safetensors.shape` is
    not the shape of what get_slice gives (it raised TypeError, or gave that value)."""
    path = str(tmp_path / "a.zt")
    with tw.Writer(path) as w:
        w.write_numpy("x", np.arange(6, dtype=np.uint8).reshape(2, 3),
                      attributes={"safetensors.shape": value, "safetensors.dtype": "F4"})
    with formats.safe_open(path, "np") as f:
        s = f.get_slice("x")
        assert s.get_shape() == [2, 3] and len(s) == 2
        assert s.get_dtype() == "U8"
        assert s[:1].shape == (1, 3)


def test_slice_shape_of_a_raw_type_is_checked(tmp_path):
    """A tensor listed as a raw safetensors type has its logical shape; a `.zt` tensor
    recording one (a layout and `safetensors.shape`) only where the recorded shape is
    a list of dimensions that counts its bytes: anything else a hostile file records
    leaves the listed shape."""
    import struct
    import json

    header = json.dumps({"x": {"dtype": "F6_E2M3", "shape": [2, 4], "data_offsets": [0, 6]}})
    header += " " * (-len(header) % 8)
    path = tmp_path / "f6.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + bytes(6))
    with formats.safe_open(str(path), "np") as f:
        assert f.get_slice("x").get_shape() == [2, 4] and len(f.get_slice("x")) == 2
    for bad in (5, ["a"], [-1], [True], [2, 5], [2 ** 62, 2 ** 62], "[2, 4]"):
        zt = str(tmp_path / "bad.zt")
        with tw.Writer(zt) as w:
            w.write_numpy("x", np.zeros(6, np.uint8), attributes={
                "tensorwire.layout": "safetensors:F6_E2M3", "safetensors.shape": bad})
        with formats.safe_open(zt, "np") as f:
            s = f.get_slice("x")
            assert (s.get_dtype(), s.get_shape(), len(s)) == ("U8", [6], 6), bad


def test_packet_load_of_an_empty_file_with_mmap_is_eof(tmp_path):
    """``load(fp, mmap_mode=True)`` of an empty file: EOFError, as without mmap_mode
    (mmap's ValueError "cannot mmap an empty file" escaped)."""
    path = tmp_path / "empty.tnso"
    path.write_bytes(b"")
    for mmap_mode in (False, True):
        with open(path, "rb") as f:
            with pytest.raises(EOFError, match="Empty"):
                packet.load(f, mmap_mode=mmap_mode)


@pytest.mark.parametrize("shape", [[3], [100, 100], 5])
def test_convert_refuses_a_raw_type_shape_that_does_not_fit_its_bytes(tmp_path, shape):
    """A `.zt` tensor marked as a safetensors raw type (as convert marks one) whose
    `safetensors.shape` does not describe its bytes: convert to safetensors wrote a
    header no reader accepts; now it refuses, leaving no file."""
    src, dst = str(tmp_path / "a.zt"), str(tmp_path / "a.safetensors")
    with tw.Writer(src) as w:
        w.write_numpy("x", np.arange(4, dtype=np.uint8),
                      attributes={"tensorwire.layout": "safetensors:F4",
                                  "safetensors.shape": shape})
    with pytest.raises(tw.InvalidArgumentError, match="does not describe its 4 bytes"):
        tw.convert(src, dst)
    assert not os.path.exists(dst)
    # One that fits converts, and reads back as F4 of that shape.
    with tw.Writer(src) as w:
        w.write_numpy("x", np.arange(4, dtype=np.uint8),
                      attributes={"tensorwire.layout": "safetensors:F4",
                                  "safetensors.shape": [2, 4]})
    assert tw.convert(src, dst) == 1
    with formats.safe_open(dst, "np") as f:
        assert f.get_slice("x").get_dtype() == "F4"
        assert f.get_slice("x").get_shape() == [2, 4]


@pytest.mark.parametrize("shape, axis", [((0, 3), 0), ((2, 0, 3), 1), ((0,), 0), ((3, 0), 0)])
def test_per_channel_quantized_packet_with_an_empty_dimension_dequantizes(shape, axis):
    """A per-channel packet with no elements (no channels, or empty channels):
    dequantize gave numpy's ValueError "cannot reshape array of size 0 into shape
    (0,newaxis)" (and quantize the same for such an array)."""
    q = packet.QuantizedTensor.quantize(np.zeros(shape, np.float32), "qint8", "per_channel",
                                        axis=axis)
    got = packet.loads(packet.dumps(q))
    assert got.dequantize().shape == shape
    # As the sweep found it: a decoded 4-bit packet of shape (2**31, 0) on axis 1.
    wide = packet.QuantizedTensor(np.zeros(0, np.uint8), [], [], (1 << 31, 0), packet.QINT4,
                                  quant_scheme=1, axis=1)  # per channel
    again = packet.loads(packet.dumps(wide))
    assert again.shape == (1 << 31, 0) and again.dequantize().shape == (1 << 31, 0)


def test_a_slice_torch_cannot_view_is_an_invalid_argument(tmp_path):
    """An empty tensor with a dimension near 2**62 (a valid file of no bytes): a step
    over it overflows torch's strides, a RuntimeError of torch's, which comes out as
    the typed error (found by the sweep on a GGUF file, seed 20261213)."""
    torch = pytest.importorskip("torch")
    path = str(tmp_path / "huge.safetensors")
    formats.torch.save_file({"x": torch.empty_strided((0, 1 << 62), (1 << 62, 1),
                                                      dtype=torch.uint8)}, path)
    with formats.safe_open(path, "pt") as f:
        part = f.get_slice("x")
        assert part.get_shape() == [0, 1 << 62]
        with pytest.raises(tw.InvalidArgumentError, match="x"):
            part[::2]
