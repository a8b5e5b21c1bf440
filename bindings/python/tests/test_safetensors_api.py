"""tensorwire.formats: the safetensors package's API (safe_open, save_file, load_file,
save, load) over tensorwire. Byte-identity is checked against the fixtures the real
package wrote (so CI needs no safetensors), and against the package itself when it is
installed."""

import gc
import json
import os

import numpy as np
import pytest

import tensorwire as tw
from tensorwire import formats

from conftest import REPO, np_dtype, sample

FIXTURES = os.path.join(REPO, "fixtures", "safetensors")

try:
    import torch
except ImportError:  # the torch halves are skipped
    torch = None


def _fixture(name):
    return os.path.join(FIXTURES, name + ".safetensors")


def _header(data):
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n])


@pytest.mark.parametrize("name", ["numpy", "dtypes", "empty"])
def test_save_rewrites_package_fixtures_byte_for_byte(name, tmp_path):
    """Reading a file the package wrote and saving its tensors again gives the same
    bytes: same header order, spacing, padding and data order."""
    if name == "dtypes":
        pytest.importorskip("ml_dtypes")
    path = _fixture(name)
    with open(path, "rb") as f:
        want = f.read()
    with formats.safe_open(path, "np") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        metadata = f.metadata()
    assert formats.save(tensors, metadata=metadata) == want
    out = tmp_path / "again.safetensors"
    assert formats.save_file(tensors, out, metadata=metadata) == len(want)
    assert out.read_bytes() == want
    assert [p.name for p in tmp_path.iterdir()] == ["again.safetensors"]


def test_roundtrip_every_numpy_dtype(tmp_path):
    names = ["float64", "float32", "float16", "int64", "int32", "int16", "int8",
             "uint64", "uint32", "uint16", "uint8", "bool", "complex64"]
    tensors = {n: sample(np.dtype(n), (3, 5), seed=i) for i, n in enumerate(names)}
    tensors["scalar"] = np.array(2.5, np.float32)
    tensors["empty"] = np.zeros((0, 4), np.int32)
    tensors["transposed"] = np.arange(12, dtype=np.float32).reshape(3, 4).T
    tensors["big_endian"] = np.arange(6, dtype=">i4")
    path = tmp_path / "all.safetensors"
    formats.save_file(tensors, path, metadata={"format": "np", "ünï": "cödé"})
    back = formats.load_file(path)
    with formats.safe_open(path, "np") as f:
        assert list(back) == f.offset_keys()
        assert sorted(back) == sorted(tensors) == f.keys()
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype.newbyteorder("<"), k
        assert back[k].shape == v.shape, k
        np.testing.assert_array_equal(back[k], v, err_msg=k)
    with formats.safe_open(path, framework="numpy") as f:
        assert f.metadata() == {"format": "np", "ünï": "cödé"}
        assert f.get_slice("complex64").get_dtype() == "C64"
        assert f.get_slice("bool").get_dtype() == "BOOL"


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_roundtrip_ml_dtypes(dtype):
    dt = np_dtype(dtype)
    arr = sample(dt, (4, 3))
    back = formats.load(formats.save({"x": arr}))["x"]
    assert back.dtype == dt and back.tobytes() == arr.tobytes()


def test_safe_open_reads_like_the_package():
    path = _fixture("dtypes")
    want = json.load(open(os.path.join(FIXTURES, "dtypes.expected.json")))
    with formats.safe_open(path, "np") as f:
        assert f.keys() == sorted(want["tensors"])
        by_offset = sorted(want["tensors"], key=lambda k: want["tensors"][k]["data_offsets"])
        assert f.offset_keys() == by_offset
        assert f.metadata() == want["metadata"]
        for name, t in want["tensors"].items():
            s = f.get_slice(name)
            assert s.get_shape() == t["shape"], name
            assert s.get_dtype() == t["dtype"], name
    with formats.safe_open(_fixture("empty"), "np") as f:
        assert f.keys() == [] and f.metadata() is None
    with formats.safe_open(_fixture("raw_types"), "np") as f:
        assert f.get_slice("packed").get_dtype() == "F4"
        assert f.get_slice("scales").get_dtype() == "F8_E8M0"


def test_get_tensor_and_slices_are_views_of_the_map():
    with formats.safe_open(_fixture("numpy"), "np") as f:
        embed = f.get_tensor("embed")
        s = f.get_slice("embed")
        assert s.get_shape() == [6, 4] and len(s) == 6
        rows = s[1:4]
        cols = s[:, ::2]
        one = s[2, 3]
    np.testing.assert_array_equal(rows, embed[1:4])
    np.testing.assert_array_equal(cols, embed[:, ::2])
    # An int for every dimension gives a 0-d array, as the package does (not a numpy
    # scalar), still a view.
    assert isinstance(one, np.ndarray) and one.shape == () and one == embed[2, 3]
    assert np.shares_memory(rows, embed) and np.shares_memory(cols, embed)
    assert np.shares_memory(one, embed)
    # Private copy-on-write: writable, and the file is unchanged.
    rows[0, 0] = 1234.0
    again = formats.load_file(_fixture("numpy"))["embed"]
    assert again[1, 0] != 1234.0


def test_load_views_the_buffer_and_keeps_it_alive():
    import array
    import weakref

    arr = np.arange(10, dtype=np.float32)
    buf = array.array("B", formats.save({"a": arr}))
    alive = weakref.ref(buf)
    got = formats.load(buf)["a"]
    assert not got.flags.writeable
    assert np.shares_memory(got, np.frombuffer(buf, np.uint8))
    del buf
    gc.collect()
    assert alive() is not None  # the array's base chain holds it
    np.testing.assert_array_equal(got, arr)
    del got
    gc.collect()
    assert alive() is None  # and lets it go with the array


def test_load_reads_other_formats_from_memory():
    with open(os.path.join(REPO, "fixtures", "zt", "dtypes.zt"), "rb") as f:
        zt = formats.load(f.read())
    with tw.Reader(os.path.join(REPO, "fixtures", "zt", "dtypes.zt")) as r:
        assert sorted(zt) == sorted(r.keys())
        for k in r.keys():
            assert zt[k].tobytes() == r.read_numpy(k).tobytes(), k


def test_load_file_reads_any_format():
    npz = os.path.join(REPO, "fixtures", "numpy")
    path = next(os.path.join(npz, p) for p in sorted(os.listdir(npz)) if p.endswith(".npz"))
    got = formats.load_file(path)
    with tw.Reader(path) as r:
        assert sorted(got) == sorted(r.keys())
        for k in r.keys():
            np.testing.assert_array_equal(got[k], r.read_numpy(k, copy=True))


def test_bad_calls_raise_clear_errors(tmp_path):
    with pytest.raises(tw.InvalidArgumentError, match="framework"):
        formats.safe_open(_fixture("numpy"), "flax")
    with pytest.raises(tw.InvalidArgumentError, match="CPU"):
        formats.safe_open(_fixture("numpy"), "np", device="cuda:0")
    with pytest.raises(tw.TensorNotFoundError):
        formats.safe_open(_fixture("numpy"), "np").get_tensor("missing")
    with pytest.raises(TypeError):
        formats.save([np.zeros(2)])
    with pytest.raises(TypeError):
        formats.save({"a": np.zeros(2)}, metadata={"n": 1})
    with pytest.raises(tw.InvalidArgumentError, match="__metadata__"):
        formats.save({"__metadata__": np.zeros(2)})
    with pytest.raises(tw.TensorwireError):
        formats.save({"a": np.array(["x"], dtype=object)})
    with pytest.raises(tw.FormatError):
        formats.load(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    # A failed save leaves nothing behind.
    out = tmp_path / "bad.safetensors"
    with pytest.raises(tw.TensorwireError):
        formats.save_file({"a": np.zeros(2), "b": np.array([{}], dtype=object)}, out)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError):
        formats.safe_open(tmp_path / "missing.safetensors", "np")


def test_closed_file_refuses_reads():
    f = formats.safe_open(_fixture("numpy"), "np")
    with f:
        pass
    with pytest.raises(tw.TensorwireError, match="closed"):
        f.get_tensor("embed")


def test_slices_taken_while_open_read_after_close():
    """As with the package: a lazy loader keeps get_slice handles past the with."""
    with formats.safe_open(_fixture("numpy"), "np") as f:
        lazy = {k: f.get_slice(k) for k in f.keys()}
        whole = {k: np.array(f.get_tensor(k)) for k in f.keys()}
    for k, s in lazy.items():
        if whole[k].ndim:
            np.testing.assert_array_equal(s[:1], whole[k][:1])
    with pytest.raises(tw.TensorwireError, match="closed"):
        f.get_tensor(next(iter(whole)))


def test_device_none_means_the_cpu():
    with formats.safe_open(_fixture("numpy"), "np", device=None) as f:
        assert f.get_tensor(f.keys()[0]) is not None
    assert formats.load_file(_fixture("numpy"), "np", device=None)
    with pytest.raises(tw.InvalidArgumentError, match="CPU"):
        formats.safe_open(_fixture("numpy"), "np", device="meta")


def test_safetensor_error_is_the_base_error_class():
    assert formats.SafetensorError is tw.TensorwireError
    with pytest.raises(formats.SafetensorError):
        formats.load(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")


def test_a_header_length_past_the_limit_is_named(tmp_path):
    path = tmp_path / "huge.safetensors"
    path.write_bytes((100_000_001).to_bytes(8, "little") + b"{}")
    with pytest.raises(tw.LimitExceededError):
        formats.safe_open(path, "np")


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_lazily_conjugated_and_negated_tensors_save_their_values(tmp_path):
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    x = torch.tensor([1.0, -2.0])
    tensors = {"conj": z.conj(), "neg": torch._neg_view(x)}
    got = formats.torch.load(formats.torch.save(tensors))
    assert torch.equal(got["conj"], z.conj().resolve_conj())
    assert torch.equal(got["neg"], -x)
    with tw.Writer(str(tmp_path / "c.zt")) as w:
        w.write_torch("conj", z.conj())
    with tw.Reader(str(tmp_path / "c.zt")) as r:
        assert torch.equal(r.read_torch("conj"), z.conj().resolve_conj())
    # As the package: sparse tensors and non-tensors are a ValueError naming them.
    for sparse in (torch.eye(3).to_sparse(), torch.eye(3).to_sparse_csr()):
        with pytest.raises(ValueError, match=r"sparse tensors: `\['s'\]`.*to_dense"):
            formats.torch.save({"w": x, "s": sparse})
        with pytest.raises(ValueError, match="sparse"):
            formats.torch.save_file({"s": sparse}, str(tmp_path / "s.safetensors"))
    assert not (tmp_path / "s.safetensors").exists()
    for value in ([1.0], np.ones(2, np.float32), 3):
        with pytest.raises(ValueError, match="Key `v` is invalid, expected torch.Tensor"):
            formats.torch.save({"v": value})
    with pytest.raises(ValueError, match="Expected a dict of"):
        formats.torch.save([x])


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_tensors_save_and_load():
    tensors = {
        "w": torch.randn(5, 3, dtype=torch.bfloat16),
        "t": torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),
        "c": torch.randn(4, dtype=torch.complex64),
        "f8": torch.randn(6).to(torch.float8_e5m2),
        "i": torch.arange(7, dtype=torch.int64),
        "b": torch.tensor([True, False]),
    }
    data = formats.save(tensors, metadata={"format": "pt"})
    back = formats.load(data, framework="pt")
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
        assert torch.equal(back[k].view(torch.uint8), v.contiguous().view(torch.uint8)), k
    # torch tensors over a read-only buffer are copies (torch cannot mark them read-only)
    back["i"][0] = 99
    assert formats.load(data, framework="pt")["i"][0] == 0


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_safe_open_torch_views_and_slices(tmp_path):
    path = tmp_path / "m.safetensors"
    formats.save_file({"w": np.arange(20, dtype=np.float32).reshape(4, 5)}, path)
    with formats.safe_open(path, framework="pt") as f:
        w = f.get_tensor("w")
        part = f.get_slice("w")[1:3, 2:]
    assert isinstance(w, torch.Tensor) and isinstance(part, torch.Tensor)
    assert torch.equal(part, w[1:3, 2:])
    assert part.data_ptr() == w[1:3, 2:].data_ptr()


def test_matches_the_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    tensors = {"embed": sample(np.dtype("float32"), (7, 3)),
               "bias": sample(np.dtype("float16"), (3,)),
               "ids": sample(np.dtype("int64"), (2, 2)),
               "mask": sample(np.dtype("bool"), (5,))}
    assert formats.save(tensors, metadata={"format": "np"}) == st.save(
        tensors, metadata={"format": "np"})
    ours = tmp_path / "ours.safetensors"
    formats.save_file(tensors, ours)
    back = st.load_file(str(ours))
    for k, v in tensors.items():
        np.testing.assert_array_equal(back[k], v)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_matches_the_safetensors_package_for_torch():
    stt = pytest.importorskip("safetensors.torch")
    tensors = {"w": torch.randn(4, 4, dtype=torch.bfloat16),
               "f8": torch.zeros(3, dtype=torch.float8_e4m3fn),
               "fnuz": torch.randn(5).to(torch.float8_e4m3fnuz),
               "fnuz2": torch.randn(2).to(torch.float8_e5m2fnuz),
               "i8": torch.arange(3, dtype=torch.int8),
               "c": torch.randn(2, dtype=torch.complex64)}
    assert formats.save(tensors) == stt.save(tensors)
    back = stt.load(formats.save(tensors))
    for k, v in tensors.items():
        assert torch.equal(back[k].view(torch.uint8), v.view(torch.uint8))


def test_submodules_have_the_package_signatures(tmp_path):
    import inspect

    from tensorwire.formats import numpy as fnp
    from tensorwire.formats import torch as fpt

    assert list(inspect.signature(fnp.save_file).parameters) == ["tensor_dict", "filename", "metadata"]
    assert list(inspect.signature(fnp.load_file).parameters) == ["filename", "backend"]
    assert list(inspect.signature(fpt.save_file).parameters) == ["tensors", "filename", "metadata"]
    assert list(inspect.signature(fpt.load_file).parameters) == ["filename", "device", "backend"]
    try:  # where the package is installed, the very same parameter names
        import safetensors.numpy as pnp
        import safetensors.torch as ppt
    except ImportError:
        pass
    else:
        for ours, theirs in [(fnp.load_file, pnp.load_file), (fnp.save_file, pnp.save_file),
                             (fpt.load_file, ppt.load_file), (fpt.save_file, ppt.save_file),
                             (fpt.load_model, ppt.load_model)]:
            assert (list(inspect.signature(ours).parameters)
                    == list(inspect.signature(theirs).parameters)), ours.__name__
    tensors = {"w": sample(np.dtype("float32"), (3, 2)), "b": sample(np.dtype("int16"), (4,))}
    path = tmp_path / "m.safetensors"
    assert fnp.save_file(tensors, path, metadata={"k": "v"}) is None  # as the package
    assert path.read_bytes() == fnp.save(tensors, metadata={"k": "v"})
    for got in (fnp.load_file(path), fnp.load(path.read_bytes())):
        assert sorted(got) == ["b", "w"]
        for k, v in tensors.items():
            np.testing.assert_array_equal(got[k], v)


@pytest.mark.parametrize("framework", ["np", "pt"])
def test_the_pread_backend_gives_tensors_of_their_own(tmp_path, framework):
    """backend="pread" (the package's positional reads): tensors that own their
    memory, equal to the mapped ones; an unknown backend is the package's error."""
    if framework == "pt":
        torch = pytest.importorskip("torch")
    path = tmp_path / "m.safetensors"
    formats.save_file({"w": np.arange(12, dtype=np.float32).reshape(3, 4)}, path)
    with formats.safe_open(path, framework, backend="pread") as f, \
            formats.safe_open(path, framework) as mapped:
        for got, want in [(f.get_tensor("w"), mapped.get_tensor("w")),
                          (f.get_slice("w")[1:, ::2], mapped.get_slice("w")[1:, ::2]),
                          (f.get_tensors()["w"], mapped.get_tensors()["w"])]:
            if framework == "np":
                assert got.flags.owndata or got.base is None or not np.shares_memory(
                    got, want)
                np.testing.assert_array_equal(got, want)
            else:
                assert got.untyped_storage().data_ptr() != want.untyped_storage().data_ptr()
                assert torch.equal(got, want)
    loaded = formats.load_file(path, framework, backend="pread")["w"]
    assert loaded.sum() == 66
    for bad in ("io_uring", None):
        with pytest.raises(formats.SafetensorError, match="backend"):
            formats.safe_open(path, framework, backend=bad)


def test_a_bad_torch_device_fails_at_open_with_the_packages_error(tmp_path):
    pytest.importorskip("torch")
    path = tmp_path / "m.safetensors"
    formats.save_file({"w": np.ones(2, np.float32)}, path)
    for device in ("bogus", "CPU", -1):
        with pytest.raises(formats.SafetensorError, match="device"):
            formats.safe_open(path, "pt", device=device)
        with pytest.raises(formats.SafetensorError, match="device"):
            formats.torch.load_file(path, device=device)
    with formats.safe_open(path, "pt", device=None) as f:
        assert f.get_tensor("w").device.type == "cpu"


def test_torch_subclasses_and_ml_dtypes_e8m0_are_written_as_the_package_writes_them(
        tmp_path):
    """A torch tensor of any subclass (a library's own Parameter) goes through torch
    (bf16, float8 and requires_grad included), and an ml_dtypes float8_e8m0fnu array
    is F8_E8M0: the package's bytes."""
    torch = pytest.importorskip("torch")

    class MyParameter(torch.nn.Parameter):
        pass

    class MyTensor(torch.Tensor):
        pass

    tensors = {
        "p": MyParameter(torch.arange(4, dtype=torch.float32)),
        "bf": torch.arange(3, dtype=torch.bfloat16).as_subclass(MyTensor),
        "f8": torch.ones(2).to(torch.float8_e4m3fn).as_subclass(MyTensor),
    }
    data = formats.save(tensors)
    got = formats.torch.load(data)
    for k, v in tensors.items():
        assert torch.equal(got[k].view(torch.uint8), v.detach().view(torch.uint8)), k
    try:
        from safetensors.torch import save as package_save
    except ImportError:
        pass
    else:
        assert data == package_save({k: torch.Tensor(v.detach()) for k, v in tensors.items()})
    ml_dtypes = pytest.importorskip("ml_dtypes")
    scales = np.array([1.0, 2.0, 0.5], dtype=ml_dtypes.float8_e8m0fnu)
    data = formats.save({"s": scales})
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
    assert header["s"]["dtype"] == "F8_E8M0" and header["s"]["shape"] == [3]
    assert data[-3:] == scales.view(np.uint8).tobytes()
    try:
        from safetensors.numpy import save as package_np_save
    except ImportError:
        return
    assert data == package_np_save({"s": scales})


def test_get_tensors_in_file_order():
    with formats.safe_open(_fixture("dtypes"), "np") as f:
        pytest.importorskip("ml_dtypes")
        got = f.get_tensors()
        assert list(got) == f.offset_keys()
        for k, v in got.items():
            assert v.tobytes() == f.get_tensor(k).tobytes(), k


def test_reader_over_a_buffer_takes_any_buffer_object():
    data = formats.save({"a": np.arange(4, dtype=np.int32)})
    for buf in (data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        with tw.Reader(buffer=buf) as r:
            assert r.path is None and "<buffer>" in repr(r)
            np.testing.assert_array_equal(r["a"], np.arange(4))
    with pytest.raises(TypeError, match="path or a buffer"):
        tw.Reader()
    with pytest.raises(TypeError, match="not both"):
        tw.Reader(_fixture("numpy"), buffer=data)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_tensors_never_view_read_only_memory(tmp_path):
    """torch has no read-only tensors: over a caller's bytes or a read-only mmap,
    read_torch copies, so writing to the tensor cannot corrupt the bytes (or crash)."""
    import mmap

    data = formats.save({"a": np.arange(8, dtype=np.float32)})
    before = bytes(data)
    r = tw.Reader(buffer=data)
    for t in (r.read_torch("a"), r.read_torch(["a"])["a"]):
        t[0] = 99.0
    assert data == before
    path = tmp_path / "a.safetensors"
    path.write_bytes(data)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    r = tw.Reader(buffer=m)
    t = r.read_torch("a")
    t[1] = 5.0  # a view would segfault here
    assert r.read_numpy("a")[1] == 1.0
    del t, r
    gc.collect()
    # A file reader's tensors do share its (private, writable) map.
    with tw.Reader(path) as fr:
        a, b = fr.read_torch("a"), fr.read_torch("a")
        assert a.data_ptr() == b.data_ptr()


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_fnuz_float8_round_trip_and_package_file():
    want = json.load(open(os.path.join(FIXTURES, "fnuz.expected.json")))
    with formats.safe_open(_fixture("fnuz"), "pt") as f:
        for name, t in want["tensors"].items():
            assert f.get_slice(name).get_dtype() == t["dtype"], name
        got = f.get_tensors()
    assert got["a_e4m3fnuz"].dtype == torch.float8_e4m3fnuz
    assert got["b_e5m2fnuz"].dtype == torch.float8_e5m2fnuz
    tensors = {k: v for k, v in got.items() if k != "h_e8m0"}  # raw bytes: saved as U8
    again = formats.load(formats.save(tensors), framework="pt")
    for k, v in tensors.items():
        assert again[k].dtype == v.dtype and torch.equal(again[k].view(torch.uint8), v.view(torch.uint8)), k


@pytest.mark.skipif(torch is None or not hasattr(torch, "float4_e2m1fn_x2"),
                    reason="torch without float4_e2m1fn_x2")
def test_torch_reads_and_writes_the_mx_types():
    """F8_E8M0 and F4 (which numpy cannot hold) are torch's float8_e8m0fnu and
    float4_e2m1fn_x2, as the package gives them; saved again they are the same file."""
    path = _fixture("raw_types")
    want = json.load(open(os.path.join(FIXTURES, "raw_types.expected.json")))["tensors"]
    with formats.safe_open(path, "pt") as f:
        got = f.get_tensors()
    assert got["scales"].dtype == torch.float8_e8m0fnu
    assert list(got["scales"].shape) == want["scales"]["shape"]
    assert got["packed"].dtype == torch.float4_e2m1fn_x2
    shape = want["packed"]["shape"]
    assert list(got["packed"].shape) == shape[:-1] + [shape[-1] // 2]
    with open(path, "rb") as f:
        assert formats.save(got) == f.read()
    with tw.Reader(path) as r:
        copies = r.read_torch(["packed", "scales"], copy=True)
        dst = torch.empty_like(got["packed"])
        r.read_into("packed", dst)
        with pytest.raises(tw.InvalidArgumentError, match="dst"):
            r.read_into("packed", torch.empty(6, dtype=torch.uint8))
    for k, v in copies.items():
        assert v.dtype == got[k].dtype and torch.equal(v.view(torch.uint8), got[k].view(torch.uint8))
    assert torch.equal(dst.view(torch.uint8), got["packed"].view(torch.uint8))
    # numpy has no such dtypes: there they stay raw bytes.
    assert formats.load_file(path)["packed"].dtype == np.uint8


def test_empty_metadata_is_not_none(tmp_path):
    """As the package: ``metadata={}`` writes an empty ``__metadata__`` that reads back
    as ``{}``; no metadata reads back as None; either way a rewrite is byte-identical."""
    tensors = {"x": np.arange(3, dtype=np.int8)}
    for i, (given, want) in enumerate((({}, {}), (None, None), ({"a": "b"}, {"a": "b"}))):
        data = formats.save(tensors, metadata=given)
        assert (b"__metadata__" in data) == (given is not None)
        path = tmp_path / f"{i}.safetensors"
        path.write_bytes(data)
        with formats.safe_open(path, "np") as f:
            assert f.metadata() == want
            assert formats.save(f.get_tensors(), metadata=f.metadata()) == data
        out = tmp_path / f"{i}.converted.safetensors"
        tw.convert(str(path), str(out))
        assert out.read_bytes() == data


def _tied_model():
    nn = torch.nn

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.proj = nn.Linear(4, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight
            self.register_buffer("whole", torch.arange(8.0))
            self.register_buffer("part", self.whole[2:6])

        def forward(self, ids):
            return self.head(self.proj(self.emb(ids))) + self.part.sum()

    return Tied()


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_save_model_stores_tied_tensors_once_and_load_model_restores_them(tmp_path):
    from tensorwire.formats import torch as fpt

    torch.manual_seed(0)
    model = _tied_model()
    path = tmp_path / "tied.safetensors"
    fpt.save_model(model, path, metadata={"format": "pt"})
    header = _header(path.read_bytes())
    # emb.weight and head.weight share memory: kept under the first name in sorted
    # order; `part` is a view into `whole`, which holds all of it.
    assert sorted(k for k in header if k != "__metadata__") == [
        "emb.weight", "proj.bias", "proj.weight", "whole"]
    assert header["__metadata__"] == {"format": "pt", "head.weight": "emb.weight",
                                      "part": "whole"}
    fresh = _tied_model()
    assert fpt.load_model(fresh, path) == (set(), [])
    ids = torch.tensor([1, 5, 9])
    assert torch.equal(fresh(ids), model(ids))
    assert fresh.head.weight is fresh.emb.weight
    # A model that does not match: strict raises as load_state_dict does, else reports.
    other = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(RuntimeError, match="Missing key"):
        fpt.load_model(other, path)
    missing, unexpected = fpt.load_model(other, path, strict=False)
    assert missing == {"0.weight", "0.bias"}
    assert "emb.weight" in unexpected and "whole" in unexpected


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_save_model_refuses_shared_memory_no_tensor_covers(tmp_path):
    from tensorwire.formats import torch as fpt

    model = torch.nn.Module()
    base = torch.zeros(8)
    model.register_buffer("a", base[:4])
    model.register_buffer("b", base[4:])
    with pytest.raises(fpt.SharedTensorsError, match="share memory") as err:
        fpt.save_model(model, tmp_path / "x.safetensors")
    # The package raises RuntimeError here; ours is that and a tensorwire error.
    assert isinstance(err.value, RuntimeError) and isinstance(err.value, tw.InvalidArgumentError)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_save_model_handles_strided_ties(tmp_path):
    """A tie whose members are a tensor and its transpose keeps the contiguous one; a
    tie of strided tensors only (the package refuses both) keeps one in C order; and
    a file holding the transposed member loads into the model too."""
    from tensorwire.formats import torch as fpt

    model = torch.nn.Module()
    model.b = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))
    model.register_buffer("a", model.b.data.t())
    path = tmp_path / "t.safetensors"
    fpt.save_model(model, path)
    header = _header(path.read_bytes())
    assert header["__metadata__"] == {"a": "b"} and "b" in header
    fresh = torch.nn.Module()
    fresh.b = torch.nn.Parameter(torch.zeros(2, 3))
    fresh.register_buffer("a", fresh.b.data.t())
    assert fpt.load_model(fresh, path) == (set(), [])
    assert torch.equal(fresh.b, model.b)
    only_a = tmp_path / "a.safetensors"
    formats.save_file({"a": model.a}, only_a)
    fresh.b.data.zero_()
    assert fpt.load_model(fresh, only_a) == (set(), [])
    assert torch.equal(fresh.b, model.b)

    strided = torch.nn.Module()
    x = torch.arange(24.0).reshape(1, 2, 3, 4).to(memory_format=torch.channels_last)
    strided.register_buffer("p", x)
    strided.register_buffer("q", x.view_as(x))
    fpt.save_model(strided, path)
    back = fpt.load_file(path)
    assert list(back) == ["p"] and torch.equal(back["p"], x)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_save_model_matches_the_package(tmp_path):
    stt = pytest.importorskip("safetensors.torch")
    from tensorwire.formats import torch as fpt

    model = torch.nn.Module()
    model.emb = torch.nn.Embedding(6, 3)
    model.out = torch.nn.Linear(3, 6, bias=False)
    model.out.weight = model.emb.weight
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    fpt.save_model(model, ours)
    stt.save_model(model, str(theirs))
    assert ours.read_bytes() == theirs.read_bytes()  # one metadata entry: same bytes
    for mod in (fpt, stt):
        for path in (ours, theirs):
            fresh = torch.nn.Module()
            fresh.emb = torch.nn.Embedding(6, 3)
            fresh.out = torch.nn.Linear(3, 6, bias=False)
            fresh.out.weight = fresh.emb.weight
            assert mod.load_model(fresh, str(path)) == (set(), [])
            assert torch.equal(fresh.out.weight, model.out.weight)



def test_slices_of_raw_types_report_and_index_their_logical_shape():
    """numpy reads F8_E8M0 and F4 as their bytes; a slice indexes the dimensions it
    reports: an E8M0 value is a byte, an F4 row 3 bytes (of 6 values), and an index
    into F4's last dimension would split bytes, so it is refused, not misread."""
    with formats.safe_open(_fixture("raw_types"), "np") as f:
        packed, scales = f.get_slice("packed"), f.get_slice("scales")
        assert packed.get_shape() == [2, 6] and len(packed) == 2
        assert scales.get_shape() == [4] and len(scales) == 4
        packed_bytes, scale_bytes = f.get_tensor("packed"), f.get_tensor("scales")
    assert packed_bytes.shape == (6,) and scale_bytes.shape == (4,)
    np.testing.assert_array_equal(scales[1:3], scale_bytes[1:3])
    assert scales[2].shape == () and scales[2] == scale_bytes[2]
    np.testing.assert_array_equal(packed[1], packed_bytes[3:])
    np.testing.assert_array_equal(packed[:1], packed_bytes[None, :3])
    np.testing.assert_array_equal(packed[::-1], packed_bytes.reshape(2, 3)[::-1])
    for index in [(0, 1), (slice(None), slice(0, 2)), Ellipsis, (None, 0)]:
        with pytest.raises(tw.UnsupportedError, match="before the last"):
            packed[index]


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_tensor_objects_over_read_only_buffers_give_copies_to_torch():
    data = formats.save({"a": np.arange(4, dtype=np.float32)})
    before = bytes(data)
    r = tw.Reader(buffer=data)
    for t in (r.read("a").torch(), r.read(["a"])["a"].torch()):
        t.add_(100)
    assert data == before


@pytest.mark.skipif(torch is None or not hasattr(torch, "float8_e8m0fnu"),
                    reason="torch without float8_e8m0fnu")
def test_zt_writer_keeps_safetensors_only_torch_types_for_safetensors(tmp_path):
    """write_torch of float8_e8m0fnu and float4_e2m1fn_x2 into either .zt version,
    then convert: the safetensors file has F8_E8M0 and F4, as the package saves them."""
    want = {"s": torch.ones(2).to(torch.float8_e8m0fnu),
            "p": torch.arange(6, dtype=torch.uint8).reshape(3, 2).view(torch.float4_e2m1fn_x2)}
    for version in (1, 2):
        zt, st = str(tmp_path / f"x{version}.zt"), str(tmp_path / f"x{version}.safetensors")
        with tw.Writer(zt, version=version) as w:
            for k, v in want.items():
                w.write_torch(k, v)
        tw.convert(zt, st)
        with formats.safe_open(st, "pt") as f:
            assert (f.get_slice("s").get_dtype(), f.get_slice("p").get_dtype()) == ("F8_E8M0", "F4")
            assert f.get_slice("p").get_shape() == [3, 4]
            for k, v in want.items():
                got = f.get_tensor(k)
                assert got.dtype == v.dtype and torch.equal(got.view(torch.uint8), v.view(torch.uint8))


def test_slices_of_0d_tensors_and_full_int_indices_are_0d_arrays(tmp_path):
    path = str(tmp_path / "s.safetensors")
    formats.numpy.save_file({"s": np.array(7.5, np.float32),
                             "m": np.arange(6, dtype=np.int16).reshape(2, 3)}, path)
    with formats.safe_open(path, "np") as f:
        for name, index, want in (("s", (), 7.5), ("s", ..., 7.5), ("m", (1, 2), 5),
                                  ("m", (np.int64(-1), -3), 3), ("m", (0, ..., 1), 1)):
            got = f.get_slice(name)[index]
            assert isinstance(got, np.ndarray) and got.shape == () and got == want, index


@pytest.mark.parametrize("framework", ["np", "pt"])
def test_slice_errors_are_safetensor_errors_and_the_frameworks_own(tmp_path, framework):
    if framework == "pt":
        pytest.importorskip("torch")
    path = str(tmp_path / "e.safetensors")
    formats.numpy.save_file({"x": np.arange(6, dtype=np.float32).reshape(2, 3)}, path)
    with formats.safe_open(path, framework) as f:
        part = f.get_slice("x")
        for index in (5, (0, 0, 0), (slice(None), -4)):
            with pytest.raises(formats.SafetensorError) as e:
                part[index]
            assert isinstance(e.value, IndexError) and "x" in str(e.value), index
        with pytest.raises(formats.SafetensorError) as e:
            part[::0]
        assert isinstance(e.value, ValueError)
