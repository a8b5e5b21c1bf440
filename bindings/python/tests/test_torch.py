"""torch interop (skipped when torch is not installed)."""

import numpy as np
import pytest

import tensorwire as tw

torch = pytest.importorskip("torch")

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
          torch.complex64, torch.complex128]
for _n in ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2",
           "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _n):
        DTYPES.append(getattr(torch, _n))


def _sample(dtype, shape):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def _bytes(t):
    flat = t.contiguous().reshape(-1)
    if flat.dtype.is_complex:
        flat = torch.view_as_real(flat).reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0, 2), (3, 4)], ids=str)
def test_write_torch_read_torch(zt_path, dtype, shape):
    t = _sample(dtype, shape)
    with tw.Writer(zt_path) as w:
        w.write_torch("t", t)
        w.write_torch("tz", t, compress=True, checksum="crc32c")
    with tw.Reader(zt_path) as r:
        for name in ("t", "tz"):
            got = r.read_torch(name)
            assert got.dtype == dtype and tuple(got.shape) == shape
            assert _bytes(got) == _bytes(t)
        if dtype in (torch.float32, torch.int64, torch.bool):
            np.testing.assert_array_equal(r["t"], t.numpy())


def test_read_torch_is_zero_copy(zt_path):
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    with tw.Writer(zt_path) as w:
        w.write_numpy("w", data)
    r = tw.Reader(zt_path)
    t1 = r.read_torch("w")
    arr = r["w"]
    t2 = r.read_torch("w")
    t3 = r.read_torch("w", device=torch.device("cpu"))
    assert t1.data_ptr() == t2.data_ptr() == t3.data_ptr() == arr.ctypes.data
    c = r.read_torch("w", copy=True)
    assert c.data_ptr() != t1.data_ptr()
    del r
    import gc
    gc.collect()
    assert torch.equal(t1, torch.from_numpy(data))


def test_bf16_without_copy_and_device(zt_path):
    t = torch.arange(10, dtype=torch.bfloat16)
    with tw.Writer(zt_path) as w:
        w.write_torch("bf", t)
    with tw.Reader(zt_path) as r:
        assert r.metadata("bf").dtype == "bfloat16"
        got = r.read_torch("bf", device="cpu")
        assert got.dtype == torch.bfloat16 and torch.equal(got, t)
        got = r.read_torch(["bf"], device=torch.device("cpu"))["bf"]
        assert torch.equal(got, t)


def test_write_torch_non_contiguous_and_requires_grad(zt_path):
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4).requires_grad_()
    with tw.Writer(zt_path) as w:
        w.write_torch("t", base.T)
    with tw.Reader(zt_path) as r:
        assert torch.equal(r.read_torch("t"), base.detach().T)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_tensors_with_zero_strides_are_written(zt_path, dtype):
    """torch.from_numpy of a fresh empty numpy array has stride (0,), and torch cannot
    view such a tensor as bytes: writing it must not need to."""
    t = torch.empty(0, dtype=dtype).as_strided((0,), (0,))
    from tensorwire.formats import torch as st_torch
    with tw.Writer(zt_path) as w:
        w.write_torch("e", t)
    with tw.Reader(zt_path) as r:
        got = r.read_torch("e")
        assert got.dtype == dtype and got.shape == (0,)
    if dtype.is_complex and dtype == torch.complex128:
        return  # safetensors has no complex128
    data = st_torch.save({"e": t})
    assert st_torch.load(data)["e"].shape == (0,)


def test_read_into_torch(zt_path):
    data = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.arange(4, dtype=np.int64)}
    with tw.Writer(zt_path) as w:
        for k, v in data.items():
            w.write_numpy(k, v, compress=(k == "b"))
        w.write_torch("bf", torch.ones(3, dtype=torch.bfloat16))
    with tw.Reader(zt_path) as r:
        dst = torch.empty(2, 3)
        r.read_into("a", dst)
        assert torch.equal(dst, torch.from_numpy(data["a"]))
        targets = {"b": torch.empty(4, dtype=torch.int64), "a": np.empty((2, 3), np.float32),
                   "bf": torch.zeros(3, dtype=torch.bfloat16)}
        r.read_into(targets)
        assert torch.equal(targets["b"], torch.arange(4))
        assert torch.equal(targets["bf"], torch.ones(3, dtype=torch.bfloat16))
        with pytest.raises(ValueError):
            r.read_into("a", torch.empty(3, 2))
        wide = torch.empty(2, 3, dtype=torch.float64)  # cast by copy_, as ztensor does
        r.read_into("a", wide)
        assert torch.equal(wide, torch.from_numpy(data["a"]).double())
        nc = torch.empty(3, 2).T
        r.read_into("a", nc)  # not contiguous: filled through a copy
        assert torch.equal(nc, torch.from_numpy(data["a"]))
        # A parameter: filled under no_grad, refused by torch outside it.
        param = torch.nn.Parameter(torch.zeros(2, 3))
        with pytest.raises(RuntimeError, match="requires grad"):
            r.read_into("a", param)
        with torch.no_grad():
            r.read_into("a", param)
        assert torch.equal(param.detach(), torch.from_numpy(data["a"]))


def test_read_into_conjugate_and_negative_views(tmp_path):
    """A lazily conjugated or negated destination keeps its bits apart from its memory:
    read_into fills it as dst.copy_(read_torch(name)) does, not natively."""
    path = str(tmp_path / "c.zt")
    c = np.array([1 + 2j, 3 + 4j], np.complex64)
    with tw.Writer(path) as w:
        w.write_numpy("c", c)
        w.write_numpy("f", np.array([5.0], np.float32))
    with tw.Reader(path) as r:
        want = torch.from_numpy(c)
        base = torch.zeros(2, dtype=torch.complex64)
        dst = base.conj()
        assert dst.is_conj() and dst.is_contiguous()
        r.read_into("c", dst)
        assert torch.equal(dst, want)
        assert torch.equal(base, want.conj())
        ref = torch.zeros(2, dtype=torch.complex64)
        ref.conj().copy_(want)
        assert torch.equal(base, ref)
        # A conjugate view's imaginary part is a negative view.
        holder = torch.zeros(1, dtype=torch.complex64)
        neg = holder.conj().imag
        assert neg.is_neg()
        r.read_into("f", neg)
        assert torch.equal(neg, torch.tensor([5.0]))
        assert holder.imag.item() == -5.0
        # In a dict too.
        base = torch.zeros(2, dtype=torch.complex64)
        r.read_into({"c": base.conj()})
        assert torch.equal(base, want.conj())


def test_tensor_torch(zt_path):
    with tw.Writer(zt_path) as w:
        w.write_torch("bf", torch.ones(3, dtype=torch.bfloat16))
        w.write_numpy("f", np.ones(3, np.float32))
    with tw.Reader(zt_path) as r:
        assert torch.equal(r.read("f").torch(), torch.ones(3))
        if pytest.importorskip("ml_dtypes"):
            assert r.read("bf").torch().dtype == torch.bfloat16


def test_cuda_device_if_available(zt_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with tw.Writer(zt_path) as w:
        w.write_numpy("f", np.arange(5, dtype=np.float32))
    with tw.Reader(zt_path) as r:
        t = r.read_torch("f", device="cuda")
        assert t.is_cuda and torch.equal(t.cpu(), torch.arange(5, dtype=torch.float32))
        dst = torch.empty(5, device="cuda")
        r.read_into("f", dst)
        assert torch.equal(dst.cpu(), torch.arange(5, dtype=torch.float32))
        with tw.Writer(zt_path + "2") as w:
            w.write_torch("g", t)


def test_read_into_a_dtype_torch_cannot_cast_to_is_unsupported(tmp_path):
    """torch has no cast from float4_e2m1fn_x2 to uint8: a typed error, not torch's
    bare NotImplementedError."""
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("this torch has no float4_e2m1fn_x2")
    path = str(tmp_path / "f4.pt")
    torch.save({"f4": torch.arange(8, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)}, path)
    r = tw.open(path)
    dst = torch.empty(8, dtype=torch.uint8)
    with pytest.raises(tw.UnsupportedError, match="cannot copy"):
        r.read_into("f4", dst)
