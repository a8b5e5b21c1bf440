"""PyTorch checkpoints (fixtures/pytorch, written by the real torch): tensorwire.Reader
reads them with the same API as .zt files, values equal to what torch saved (the .npy
expectations, so no torch is needed), strided tensors as strided zero-copy views,
non-tensor values as attributes, and malicious pickles refused without running them."""

import glob
import json
import math
import os
import pickle
import re

import numpy as np
import pytest

import tensorwire as tw

try:
    import torch
except ImportError:  # torch is optional: the torch half of a test is skipped
    torch = None
from conftest import REPO
from test_pytorch_load import _flat_tensors, _with_parts

FIXTURES = os.path.join(REPO, "fixtures", "pytorch")
EXPECTED = os.path.join(FIXTURES, "expected")
if not os.path.isdir(EXPECTED):
    pytest.skip("fixtures/pytorch is missing", allow_module_level=True)


def _cases(error=None):
    """The fixtures that read, or with `error` those that fail with that error
    ("refused global": the malicious files; "unsupported")."""
    out = []
    for path in sorted(glob.glob(os.path.join(EXPECTED, "*.json"))):
        with open(path) as f:
            want = json.load(f)
        if want.get("error") == error:
            out.append(pytest.param(os.path.join(FIXTURES, os.path.basename(path)[:-5]), want,
                                    id=os.path.basename(path)[:-5]))
    return out


def _expected_array(t):
    arr = np.load(os.path.join(EXPECTED, t["npy"]))
    return arr


def _raw_equal(got, t):
    """Compare by bytes: bf16/float8 expectations are stored as their raw bits."""
    want = _expected_array(t)
    # tobytes() is C-order for any layout (ascontiguousarray would make 0-d arrays 1-d).
    return got.shape == want.shape and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("path,want", _cases())
def test_fixture_reads_back(path, want):
    with tw.Reader(path) as r:
        assert r.format == want["format"]
        assert r.keys() == [t["name"] for t in want["tensors"]]
        for t in want["tensors"]:
            meta = r.metadata(t["name"])
            assert list(meta.shape) == t["shape"]
            assert dict(meta.attributes) == t.get("attributes", {}), t["name"]
            if t["npy_view"] is None:
                got = r.read_numpy(t["name"])
                assert got.shape == tuple(t["shape"])
                assert _raw_equal(got, t), t["name"]
                copy = r.read_numpy(t["name"], copy=True)
                assert copy.flags.c_contiguous and copy.flags.writeable
                assert _raw_equal(copy, t), t["name"]
            raw = r._read_raw(t["name"])[0]
            assert raw.tobytes() == _expected_array(t).tobytes(), t["name"]
        # Those pickled as nn.Parameters (and so requiring grad, as the fixtures'
        # parameters do), which pytorch.load gives back as parameters.
        autograd = {name: (rg, param) for name, rg, param in r._pytorch_autograd()}
        assert {n for n, (_, param) in autograd.items() if param} == {
            t["name"] for t in want["tensors"] if t["parameter"]}
        attrs = r.attributes
        assert set(attrs) == set(want["attributes"]), attrs
        for k, v in want["attributes"].items():
            assert _jsonish(attrs[k]) == v, k


def _jsonish(v):
    if isinstance(v, tuple):
        return [_jsonish(x) for x in v]
    if isinstance(v, list):
        return [_jsonish(x) for x in v]
    if isinstance(v, dict):
        return {k: _jsonish(x) for k, x in v.items()}
    return v


def test_strided_tensors_are_zero_copy_views_with_torch_strides():
    r = tw.Reader(os.path.join(FIXTURES, "views.pt"))
    base = r.read_numpy("base")
    t = r.read_numpy("transposed")
    assert t.shape == (6, 4) and t.strides == (4, 24)
    assert not t.flags.c_contiguous
    np.testing.assert_array_equal(t, base.T)
    # It views the same mapped storage as `base`: both chains end at the map's owner.
    assert np.shares_memory(t, base)
    s = r.read_numpy("slice")
    np.testing.assert_array_equal(s, base[1:3, 2:5])
    assert np.shares_memory(s, base)
    e = r.read_numpy("expanded")
    assert e.strides[0] == 0
    tied = r.read_numpy("tied_a"), r.read_numpy("tied_b")
    assert np.shares_memory(*tied)
    # Copies are contiguous and independent.
    c = r.read_numpy("transposed", copy=True)
    assert c.flags.c_contiguous and not np.shares_memory(c, base)


def test_views_outlive_the_reader_and_writes_stay_private(tmp_path):
    import shutil
    path = tmp_path / "m.pt"
    shutil.copy(os.path.join(FIXTURES, "module.pt"), path)
    r = tw.Reader(str(path))
    name = r.keys()[0]
    a = r.read_numpy(name)
    before = a.copy()
    r.close()
    del r
    os.remove(path)
    np.testing.assert_array_equal(a, before)
    assert a.flags.writeable
    a[...] = 0  # copy-on-write: the file (gone anyway) is never written


def test_legacy_storages_at_odd_offsets_are_lent_to_numpy_but_copied_for_torch():
    r = tw.Reader(os.path.join(FIXTURES, "dtypes.legacy.pt"))
    unaligned = 0
    for name in r.keys():
        if r.metadata(name).dtype in ("float64", "int64", "complex128", "float32", "int32"):
            a = r.read_numpy(name)
            # Zero-copy either way; numpy's flag tells whether it is aligned.
            assert isinstance(a.base, tw.BytesOwner), name
            unaligned += not a.flags.aligned
            np.testing.assert_array_equal(a, r.read_numpy(name, copy=True))
            if torch is not None:
                t = r.read_torch(name)
                assert t.data_ptr() % t.element_size() == 0, name
                np.testing.assert_array_equal(t.numpy(), a)
    assert unaligned, "the fixture should have storages at odd offsets"


@pytest.mark.parametrize("path,want", _cases("refused global"))
def test_malicious_pickles_are_refused(path, want):
    with pytest.raises(tw.UnsafePickleError) as info:
        tw.Reader(path)
    assert want["global"] in str(info.value)
    # As torch.load(weights_only=True) raises, and a FormatError (ValueError) too.
    assert isinstance(info.value, pickle.UnpicklingError)
    assert isinstance(info.value, tw.FormatError)


@pytest.mark.parametrize("path,want", _cases("unsupported"))
def test_what_torch_allows_but_tensorwire_cannot_build_is_unsupported(path, want):
    # torch.load(weights_only=True) reads these files (make_fixtures.py checks): no
    # UnsafePickleError, but a clear UnsupportedError naming what is missing.
    with pytest.raises(tw.UnsupportedError, match=want["builds"]) as info:
        tw.Reader(path)
    assert not isinstance(info.value, pickle.UnpicklingError)


def test_values_torch_allows_beside_tensors_read_as_names():
    with tw.Reader(os.path.join(FIXTURES, "torch_values.pt")) as r:
        assert r.attributes["config"] == {
            "dtype": "torch.float16", "qdtype": "torch.qint8", "int4": "torch.int4",
            "qscheme": "torch.per_channel_affine", "tensor_type": "torch.FloatTensor"}
        assert r.attributes["token_counts"] == {"a": 2, "b": 1}
        # complex numbers as Python's str() writes them; ints past 64 bits exactly
        assert r.attributes["phase"] == "(1+2j)"
        assert r.attributes["roots"] == ["1j", "(-0-1.5j)", "(1e+16+infj)"]
        assert r.attributes["seed"] == 2**64 - 1 and r.attributes["offset"] == -(2**70)


@pytest.mark.parametrize("name", ["torch_values.pt", "torch_values.legacy.pt"])
def test_complex_numbers_and_wide_ints_come_back_as_python_numbers(name):
    nested = tw.pytorch.load_numpy(os.path.join(FIXTURES, name), flat=False)
    assert nested["phase"] == 1 + 2j and type(nested["phase"]) is complex
    roots = nested["roots"]
    assert roots == [1j, complex(-0.0, -1.5), complex(1e16, float("inf"))]
    assert [math.copysign(1, z.real) for z in roots[:2]] == [1, -1]  # signed zeros kept
    assert nested["seed"] == 2**64 - 1 and nested["offset"] == -(2**70)


def _with_pickle_edit(src, dst, old, new):
    """`src` (a ZIP checkpoint) rewritten to `dst` with `old` replaced by `new` in its
    data.pkl (the other records as they were, stored)."""
    import zipfile

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("/data.pkl"):
                assert old in data
                data = data.replace(old, new)
            zout.writestr(info.filename, data)


def test_storage_records_must_hold_exactly_what_their_class_declares(tmp_path):
    # A pickle naming a narrower storage class than the one written: torch refuses
    # ("record size ... does not match expected size"); reading the first bytes
    # would give wrong values.
    p = str(tmp_path / "narrowed.pt")
    _with_pickle_edit(os.path.join(FIXTURES, "quantized.pt"), p,
                      b"ctorch\nQInt32Storage\n", b"ctorch\nQInt8Storage\n")
    with pytest.raises(tw.FormatError, match="acc|data/3"):
        tw.Reader(p)
    p = str(tmp_path / "plain.pt")
    _with_pickle_edit(os.path.join(FIXTURES, "module.pt"), p,
                      b"ctorch\nLongStorage\n", b"ctorch\nCharStorage\n")
    with pytest.raises(tw.FormatError):
        tw.Reader(p)


def test_truncated_checkpoints_raise_format_errors(tmp_path):
    data = open(os.path.join(FIXTURES, "module.pt"), "rb").read()
    for cut in (0, 10, len(data) // 2, len(data) - 1):
        p = tmp_path / f"cut{cut}.pt"
        p.write_bytes(data[:cut])
        with pytest.raises(tw.FormatError):
            r = tw.Reader(str(p))
            for k in r.keys():
                r.read_numpy(k)


def test_convert_pt_to_zt(tmp_path):
    src = tw.Reader(os.path.join(FIXTURES, "views.pt"))
    out = str(tmp_path / "views.zt")
    with tw.Writer(out) as w:
        for k in src.keys():
            w.add(k, src.read_numpy(k))
    dst = tw.Reader(out)
    for k in src.keys():
        np.testing.assert_array_equal(dst[k], src[k])


def test_torch_only_dtypes_read_as_their_holder_elements_zero_copy():
    """float8_e8m0fnu and float4_e2m1fn_x2 come to numpy as uint8, complex32 as
    float16 pairs (torch.view_as_real), each a view of the mapped file with its
    strides, and named by their layout."""
    r = tw.Reader(os.path.join(FIXTURES, "torch_only.pt"))
    assert r.metadata("e8m0").format == "pytorch:float8_e8m0fnu"
    assert r.metadata("f4").format == "pytorch:float4_e2m1fn_x2"
    assert r.metadata("c32").format == "pytorch:complex32"
    e8m0 = r.read_numpy("e8m0")
    assert e8m0.dtype == np.uint8 and list(e8m0) == [127, 128, 126, 129, 0, 255]
    c32 = r.read_numpy("c32")
    assert c32.dtype == np.float16 and c32.shape == (2, 3, 2)
    assert c32[0, 0].tolist() == [1.0, 2.0] and np.isinf(c32[0, 2, 0])
    t = r.read_numpy("c32_transposed")
    assert t.shape == (3, 2, 2) and t.strides == (4, 12, 2) and np.shares_memory(t, c32)
    np.testing.assert_array_equal(t, c32.transpose(1, 0, 2))
    row = r.read_numpy("c32_row")
    np.testing.assert_array_equal(row, c32[1])
    f4, f4t = r.read_numpy("f4"), r.read_numpy("f4_transposed")
    assert f4t.strides == (1, 4) and np.shares_memory(f4, f4t)
    np.testing.assert_array_equal(f4t, f4.T)
    assert r.read_numpy("c32_scalar").shape == (2,)
    assert r.read_numpy("c32_empty").shape == (0, 3, 2)


def test_get_slice_names_torch_only_dtypes_by_their_logical_type():
    """safe_open's get_slice describes the tensor torch saved, not its holder
    elements: e8m0 is F8_E8M0, float4 pairs are F4 counting single values (the shape
    they have once converted to safetensors), complex32 keeps torch's shape."""
    from tensorwire.formats import safe_open
    with safe_open(os.path.join(FIXTURES, "torch_only.pt"), "np") as f:
        want = {"e8m0": ("F8_E8M0", [6]), "e8m0_grid": ("F8_E8M0", [3, 2]),
                "f4": ("F4", [3, 8]), "f4_transposed": ("F4", [4, 6]), "f4_row": ("F4", [8]),
                "c32": ("complex32", [2, 3]), "c32_scalar": ("complex32", []),
                "c32_empty": ("complex32", [0, 3]), "c32_transposed": ("complex32", [3, 2])}
        for k, (dtype, shape) in want.items():
            s = f.get_slice(k)
            assert (s.get_dtype(), s.get_shape()) == (dtype, shape), k
        assert len(f.get_slice("c32")) == 2
        with pytest.raises(TypeError):
            len(f.get_slice("c32_scalar"))
        # numpy indexing still gives the holder elements.
        np.testing.assert_array_equal(f.get_slice("c32")[1], f.get_tensor("c32")[1])


def _safetensors_without_complex32(r, tmp_path):
    """The e8m0 and float4 tensors of reader ``r`` (torch_only.pt) converted to
    safetensors through a .zt that records their layouts; the file's path."""
    kept, st = str(tmp_path / "kept.zt"), str(tmp_path / "kept.safetensors")
    with tw.Writer(kept) as w:
        for k in r.keys():
            if not k.startswith("c32"):
                w.write_numpy(k, r.read_numpy(k),
                              attributes={"tensorwire.layout": r.metadata(k).format})
    tw.convert(kept, st)
    return st


def test_convert_keeps_torch_only_dtypes_where_the_format_has_them(tmp_path):
    """To safetensors: e8m0 as F8_E8M0 and the float4 pairs as F4 (two values per
    byte, so the last dimension doubles); complex32, which safetensors lacks, is
    refused. To .zt: the holder elements with the source's layout."""
    import shutil
    src = tmp_path / "fp4.pt"
    shutil.copy(os.path.join(FIXTURES, "torch_only.pt"), src)
    with pytest.raises(tw.UnsupportedError, match="complex32"):
        tw.convert(str(src), str(tmp_path / "all.safetensors"))
    assert not (tmp_path / "all.safetensors").exists()
    r = tw.Reader(str(src))
    out = str(tmp_path / "all.zt")
    tw.convert(str(src), out)
    z = tw.Reader(out)
    for k in r.keys():
        np.testing.assert_array_equal(z[k], r[k])
        assert z.metadata(k).attributes["tensorwire.layout"] == r.metadata(k).format
    # Without the complex32 tensors (a .zt of the others, then safetensors).
    s = tw.Reader(_safetensors_without_complex32(r, tmp_path))
    for k in ("e8m0", "e8m0_grid", "f4", "f4_transposed", "f4_row"):
        meta = s.metadata(k).attributes
        want_shape = list(r[k].shape)
        if k.startswith("f4"):
            assert meta["safetensors.dtype"] == "F4"
            want_shape[-1] *= 2
        else:
            assert meta["safetensors.dtype"] == "F8_E8M0"
        assert list(meta["safetensors.shape"]) == want_shape, k
        assert s[k].tobytes() == np.ascontiguousarray(r[k]).tobytes(), k


def test_convert_to_zt_version_2_writes_e8m0_and_float4_as_its_registered_types(tmp_path):
    """.pt float8_e8m0fnu becomes f8_e8m0 and float4_e2m1fn_x2 becomes f4_e2m1 (two
    values per byte, first in the low nibble, as torch packs them; the last dimension
    doubles), the bytes unchanged; safetensors' F8_E8M0 and F4 go the same way and
    come back. complex32, which version 2 lacks, keeps its holder elements."""
    r = tw.Reader(os.path.join(FIXTURES, "torch_only.pt"))
    out = str(tmp_path / "mx.zt")
    tw.convert(r.path, out, zt_version=2)
    z = tw.Reader(out)
    assert z.format == "zt-2"
    for k in r.keys():
        holder = np.ascontiguousarray(r[k])
        meta = z.metadata(k)
        if k.startswith("c32"):
            assert meta.attributes["tensorwire.layout"] == "pytorch:complex32"
            np.testing.assert_array_equal(z[k], r[k])
            continue
        packed = k.startswith("f4")
        shape = list(holder.shape)
        if packed:
            shape[-1] *= 2
        assert (meta.type, meta.shape) == ("f4_e2m1" if packed else "f8_e8m0", shape), k
        assert not meta.attributes, k  # the listing's layout is the type now
        assert z.read_numpy(k).tobytes() == holder.tobytes(), k
    # Through safetensors and back (F4 counts single values, as f4_e2m1 does).
    st = _safetensors_without_complex32(r, tmp_path)
    v2 = str(tmp_path / "from_st.zt")
    tw.convert(st, v2, zt_version=2)
    back = str(tmp_path / "back.safetensors")
    tw.convert(v2, back)
    assert open(back, "rb").read() == open(st, "rb").read()
    z2 = tw.Reader(v2)
    for k in z2.keys():
        assert (z2.metadata(k).type, z2.metadata(k).shape) == (z.metadata(k).type, z.metadata(k).shape)


def test_f4_e2m1_without_pairs_along_its_last_dimension_is_not_written_as_f4(tmp_path):
    path = str(tmp_path / "odd.zt")
    with tw.Writer(path, version=2) as w:
        w.write("odd", tw.Tensor({"data": np.array([0x21, 0x43, 0x05], np.uint8)},
                                 shape=[5], type="f4_e2m1"))
    with pytest.raises(tw.UnsupportedError, match="f4_e2m1"):
        tw.convert(path, str(tmp_path / "odd.safetensors"))
    assert not (tmp_path / "odd.safetensors").exists()


def V3_DTYPES(torch):
    return {torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2,
            torch.float8_e4m3fnuz, torch.float8_e5m2fnuz}


def _get(obj, dotted):
    """The object at a dotted name of a nested dict."""
    for key in dotted.split("."):
        obj = obj[key]
    return obj


class TestTorchInterop:
    @pytest.fixture(autouse=True)
    def _torch(self):
        self.torch = pytest.importorskip("torch")

    @pytest.mark.parametrize("path,want", _cases())
    def test_read_torch_equals_torch_load(self, path, want):
        torch = self.torch
        try:
            loaded = torch.load(path, weights_only=True)
        except Exception:
            # torch's weights-only unpickler lacks protocol 4's FRAME; these fixtures
            # are ours, so the full unpickler may read them.
            try:
                loaded = torch.load(path, weights_only=False)
            except Exception as e:  # torch cannot read its own file (dtypes_v3.legacy)
                pytest.skip(f"torch.load fails on this file: {e}")
        # Named as the flat view names them, sparse tensors as their parts.
        flat = _with_parts(_flat_tensors(
            loaded if isinstance(loaded, (dict, list, tuple)) else {"tensor": loaded}))
        for k, v in list(flat.items()):  # per-channel quantization parameters
            if v.is_quantized and v.qscheme() != torch.per_tensor_affine:
                flat[k + ".q_per_channel_scales"] = v.q_per_channel_scales()
                flat[k + ".q_per_channel_zero_points"] = v.q_per_channel_zero_points()
        # Tensors on the meta device have no data: listed apart from the keys.
        meta = sorted(k for k, v in flat.items() if v.device.type == "meta")
        flat = {k: v for k, v in flat.items() if v.device.type != "meta"}
        r = tw.Reader(path)
        assert sorted(r.keys()) == sorted(flat)
        assert sorted(m[0] for m in r._pytorch_meta()) == meta
        for k, v in flat.items():
            if k.endswith(("indices", "values")) and "torch.layout" in r.metadata(k).attributes:
                owner = k.rsplit(".", 1)[0]
                assert r.metadata(k).attributes["torch.size"] == list(_get(loaded, owner).shape), k
            if v.is_quantized:  # read as its integers, with its scheme beside
                assert r.metadata(k).attributes["torch.qscheme"] == str(v.qscheme()), k
                v = v.int_repr()
            if "big_endian" in path and v.dtype in V3_DTYPES(torch):
                # torch.load does not byte-swap tensors rebuilt from untyped storages
                # (_rebuild_tensor_v3); the .npy expectations check ours.
                continue
            got = r.read_torch(k)
            assert got.dtype == v.dtype and got.shape == v.shape, k
            # A lazy conjugate or negative view: read_torch gives its values, a copy.
            lazy = not v.is_quantized and (v.is_conj() or v.is_neg())
            if lazy:
                v = v.resolve_conj().resolve_neg()
            # Bytes, so NaNs and float8 compare too.
            as_bytes = lambda x: x.contiguous().flatten().view(torch.uint8)  # noqa: E731
            assert torch.equal(as_bytes(got), as_bytes(v)), k
            if (not v.is_contiguous() and v.numel() > 1 and "legacy" not in path
                    and "big_endian" not in path and not lazy):
                assert got.stride() == v.stride(), k

    def test_torch_only_dtypes_come_back_as_torch_saved_them_sharing_the_map(self, tmp_path):
        """read_torch and pytorch.load give float8_e8m0fnu, float4_e2m1fn_x2 and
        complex32 tensors with torch's shapes and strides, views of the mapped file
        (a storage the tensors share stays one), requires_grad kept."""
        torch = self.torch
        path = os.path.join(FIXTURES, "torch_only.pt")
        want = torch.load(path, weights_only=True)
        r = tw.Reader(path)
        for k, v in want.items():
            got = r.read_torch(k)
            assert (got.dtype, got.shape, got.stride()) == (v.dtype, v.shape, v.stride()), k
        c32 = r.read_torch("c32")
        assert c32.data_ptr() == r.read_numpy("c32").ctypes.data
        loaded = tw.pytorch.load(path)
        assert loaded["c32_transposed"].untyped_storage().data_ptr() == \
            loaded["c32"].untyped_storage().data_ptr()
        assert loaded["c32_row"].storage_offset() == want["c32_row"].storage_offset() == 3
        assert isinstance(loaded["c32_param"], torch.nn.Parameter)
        assert loaded["c32_param"].requires_grad
        # By bits: c32[1, 0] holds a NaN.
        bits = lambda t: torch.view_as_real(t.contiguous()).view(torch.int16)  # noqa: E731
        for k in ("c32", "c32_transposed", "c32_scalar"):
            assert torch.equal(bits(loaded[k]), bits(want[k])), k

    def test_safetensors_reads_torch_only_dtypes_tensorwire_converted(self, tmp_path):
        """A .pt file's e8m0 and float4 tensors, converted to safetensors, load in
        the safetensors package as torch saved them."""
        torch = self.torch
        st_torch = pytest.importorskip("safetensors.torch")
        src = str(tmp_path / "mx.pt")
        saved = torch.load(os.path.join(FIXTURES, "torch_only.pt"), weights_only=True)
        kept = {k: v for k, v in saved.items() if not k.startswith("c32")}
        torch.save(kept, src)
        dst = str(tmp_path / "mx.safetensors")
        tw.convert(src, dst)
        got = st_torch.load_file(dst)
        assert sorted(got) == sorted(kept)
        # safe_open over the .pt names and shapes them as the package does the
        # converted file, and its torch slices are torch's.
        from safetensors import safe_open as package_open
        from tensorwire.formats import safe_open
        with package_open(dst, "pt") as theirs, safe_open(src, "pt") as ours:
            for k in kept:
                a, b = theirs.get_slice(k), ours.get_slice(k)
                assert (b.get_dtype(), b.get_shape()) == (a.get_dtype(), a.get_shape()), k
                if kept[k].dim():
                    assert torch.equal(b[:1].view(torch.uint8), kept[k][:1].view(torch.uint8)), k
        for k, v in kept.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            assert torch.equal(got[k].contiguous().view(torch.uint8),
                               v.contiguous().view(torch.uint8)), k

    @pytest.mark.parametrize("version", [1, 2])
    def test_torch_reads_back_torch_only_dtypes_converted_to_zt(self, tmp_path, version):
        """.pt -> .zt -> read_torch gives the tensors torch saved, bit for bit: from
        version 2's f8_e8m0 and f4_e2m1 (float4 pairs, low nibble first), and from
        the holder elements with the layout they record (complex32 in both, all
        three in 1.x). Through safetensors and a 1.x .zt, F8_E8M0 and F4 too."""
        torch = self.torch
        path = os.path.join(FIXTURES, "torch_only.pt")
        want = torch.load(path, weights_only=True)
        out = str(tmp_path / "mx.zt")
        tw.convert(path, out, zt_version=version)
        z = tw.Reader(out)
        bits = lambda t: t.contiguous().view(torch.uint8)  # noqa: E731
        for k, v in want.items():
            got = z.read_torch(k)
            assert (got.dtype, got.shape) == (v.dtype, v.shape), k
            if v.dtype == torch.complex32:
                got, v = torch.view_as_real(got.contiguous()), torch.view_as_real(v.contiguous())
            assert torch.equal(bits(got), bits(v)), k
        if version == 2:
            return
        kept = {k: v for k, v in want.items() if v.dtype != torch.complex32}
        src = str(tmp_path / "kept.pt")
        torch.save(kept, src)
        st, zt1 = str(tmp_path / "kept.safetensors"), str(tmp_path / "st.zt")
        tw.convert(src, st)
        tw.convert(st, zt1)
        z = tw.Reader(zt1)
        for k, v in kept.items():
            got = z.read_torch(k)
            assert (got.dtype, got.shape) == (v.dtype, v.shape), k
            assert torch.equal(bits(got), bits(v)), k

    @pytest.mark.parametrize("version", [1, 2])
    def test_write_torch_keeps_torch_only_dtypes(self, tmp_path, version):
        """Writer.write_torch of float8_e8m0fnu, float4_e2m1fn_x2 and complex32 (a
        0-d float4 pair too): read_torch gives each back, bit for bit; version 2
        stores the first two as its f8_e8m0 and f4_e2m1."""
        torch = self.torch
        saved = torch.load(os.path.join(FIXTURES, "torch_only.pt"), weights_only=True)
        saved["f4_scalar"] = torch.tensor(0x21, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
        path = str(tmp_path / "w.zt")
        with tw.Writer(path, version=version) as w:
            assert w.version == version
            for k, t in saved.items():
                w.write_torch(k, t, attributes={"origin": "test"})
        r = tw.Reader(path)
        for k, t in saved.items():
            got = r.read_torch(k)
            assert (got.dtype, got.shape) == (t.dtype, t.shape), k
            if t.dtype == torch.complex32:
                got, t = torch.view_as_real(got.contiguous()), torch.view_as_real(t.contiguous())
            assert torch.equal(got.contiguous().view(torch.uint8),
                               t.contiguous().view(torch.uint8)), k
            assert r.metadata(k).attributes["origin"] == "test", k
        types = {k: r.metadata(k).type for k in ("e8m0", "f4", "f4_scalar", "c32")}
        if version == 2:
            assert types == {"e8m0": "f8_e8m0", "f4": "f4_e2m1", "f4_scalar": None, "c32": None}
            assert r.metadata("f4").shape == [3, 8]
        else:
            assert set(types.values()) == {None}

    def test_write_torch_edge_cases_of_torch_only_dtypes(self, tmp_path):
        """A 0-d float8_e8m0fnu is f8_e8m0 in version 2; lazily conjugated and negated
        complex32 views are written with their values; a version 2 f4_e2m1 tensor
        that carries another layout attribute reads as f4_e2m1, copied or not."""
        torch = self.torch
        c32 = torch.tensor([1 + 2j, -3 - 4j], dtype=torch.complex64).to(torch.complex32)
        path = str(tmp_path / "edge.zt")
        with tw.Writer(path, version=2) as w:
            w.write_torch("e0", torch.tensor(4.0).to(torch.float8_e8m0fnu))
            w.write_torch("conj", c32.conj())
            w.write_torch("neg", torch._neg_view(c32))
            w.write("f4", tw.Tensor({"data": np.array([1, 2, 3, 4], np.uint8)}, shape=[2, 4],
                                    type="f4_e2m1",
                                    attributes={"tensorwire.layout": "pytorch:float8_e8m0fnu"}))
        r = tw.Reader(path)
        assert (r.metadata("e0").type, r.metadata("e0").shape) == ("f8_e8m0", [])
        assert r.read_torch("e0").float().item() == 4.0
        for k, want in (("conj", [1 - 2j, -3 + 4j]), ("neg", [-1 - 2j, 3 + 4j])):
            assert r.read_torch(k).to(torch.complex64).tolist() == want, k
        shapes = {tuple(r.read_torch("f4").shape), tuple(r.read_torch("f4", copy=True).shape),
                  tuple(tw.Reader(buffer=open(path, "rb").read()).read_torch("f4").shape)}
        assert shapes == {(2, 2)}
        assert r.read_torch("f4").dtype == torch.float4_e2m1fn_x2

    def test_a_recorded_layout_that_does_not_describe_the_bytes_is_not_taken(self, tmp_path):
        """A .zt tensor's tensorwire.layout is its writer's word: taken only where the
        elements and shape fit it, else the tensor reads as what it holds."""
        torch = self.torch
        path = str(tmp_path / "labelled.zt")
        with tw.Writer(path) as w:
            w.write_numpy("f4_long", np.arange(3, dtype=np.uint8),
                          attributes={"tensorwire.layout": "safetensors:F4",
                                      "safetensors.shape": [100]})
            w.write_numpy("f4_bad", np.arange(3, dtype=np.uint8),
                          attributes={"tensorwire.layout": "safetensors:F4",
                                      "safetensors.shape": ["x"]})
            w.write_numpy("c32_f32", np.zeros((2, 2), np.float32),
                          attributes={"tensorwire.layout": "pytorch:complex32"})
            w.write_numpy("c32_no_lanes", np.zeros((2, 3), np.float16),
                          attributes={"tensorwire.layout": "pytorch:complex32"})
            w.write_numpy("e8m0", np.array([127, 128], np.uint8),
                          attributes={"tensorwire.layout": "pytorch:float8_e8m0fnu"})
            # An empty tensor "fits" any shape with a 0 in it: beyond 64 dimensions
            # it is no shape at all.
            w.write_numpy("e8_dims", np.zeros(0, np.uint8),
                          attributes={"tensorwire.layout": "safetensors:F8_E8M0",
                                      "safetensors.shape": [0] + [2] * 70})
        r = tw.Reader(path)
        got = {k: (r.read_torch(k).dtype, tuple(r.read_torch(k).shape)) for k in r.keys()}
        assert got == {"f4_long": (torch.uint8, (3,)), "f4_bad": (torch.uint8, (3,)),
                       "c32_f32": (torch.float32, (2, 2)),
                       "c32_no_lanes": (torch.float16, (2, 3)),
                       "e8m0": (torch.float8_e8m0fnu, (2,)),
                       "e8_dims": (torch.uint8, (0,))}
        assert tuple(r.read_torch("e8_dims", copy=True).shape) == (0,)
        tw.convert(path, str(tmp_path / "v2.zt"), zt_version=2)
        assert tw.Reader(str(tmp_path / "v2.zt")).metadata("e8_dims").type is None

    def test_bfloat16_and_float8_tensors_are_views_of_the_map_with_torch_strides(self, tmp_path):
        """Tensors of dtypes numpy lacks come to torch as views of the mapped file
        (viewed through a numpy array of their size), transposed ones keeping torch's
        strides, one storage staying one."""
        torch = self.torch
        base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        bf16 = base.to(torch.bfloat16)
        f8 = base.to(torch.float8_e4m3fn)
        saved = {"bf16": bf16, "bf16_t": bf16.t(), "f8": f8, "f8_t": f8.t(),
                 "bf16_scalar": torch.tensor(2.5, dtype=torch.bfloat16)}
        path = str(tmp_path / "half.pt")
        torch.save(saved, path)
        r = tw.Reader(path)
        for got in ({k: r.read_torch(k) for k in saved}, tw.pytorch.load(path)):
            for k, v in saved.items():
                assert (got[k].dtype, got[k].shape, got[k].stride()) == \
                    (v.dtype, v.shape, v.stride()), k
                assert torch.equal(got[k].float(), v.float()), k
            assert got["bf16_t"].data_ptr() == got["bf16"].data_ptr()
            assert got["f8_t"].data_ptr() == got["f8"].data_ptr()
        assert r.read_torch("bf16").data_ptr() == r.read_numpy("bf16").ctypes.data


def test_copies_and_convert_check_a_records_crc(tmp_path):
    """A `.pt` record whose bytes no longer match its CRC-32 (a damaged copy, which
    torch.load reads without noticing): zero-copy reads touch no byte and show the
    damage, as torch.load would; copies, read_into and convert refuse it."""
    data = bytearray(open(os.path.join(FIXTURES, "single.pt"), "rb").read())
    good = tw.Reader(os.path.join(FIXTURES, "single.pt"))
    name = max(good.keys(), key=lambda k: good[k].nbytes)
    want = good.read_numpy(name, copy=True)
    offset = bytes(data).find(want.tobytes())
    assert offset > 0
    data[offset] ^= 0x40
    path = tmp_path / "bad.pt"
    path.write_bytes(bytes(data))
    bad = tw.Reader(str(path))
    assert not np.array_equal(bad.read_numpy(name), want)
    # The error names the tensor and the record holding its storage.
    with pytest.raises(tw.ChecksumError, match=rf"tensor `{re.escape(name)} \(zip record .*/data/\d+\)`"):
        bad.read_numpy(name, copy=True)
    with pytest.raises(tw.ChecksumError):
        bad.read_into(name, np.empty_like(want))
    # Destinations numpy or torch fill by casting or strided copies read through a
    # zero-copy view: the CRC is checked first all the same.
    for dst in (np.empty(want.shape, np.float64), np.empty(want.shape, want.dtype, order="F")):
        with pytest.raises(tw.ChecksumError):
            bad.read_into(name, dst)
    if torch is not None:
        with pytest.raises(tw.ChecksumError):
            bad.read_into(name, torch.empty(want.shape, dtype=torch.float64))
    # Copies of the map's bytes that torch needs or load makes check too: a
    # Reader over bytes (read-only: torch gets a copy), pytorch.load(mmap=False).
    with pytest.raises(tw.ChecksumError):
        tw.Reader(buffer=bytes(data)).read_numpy(name, copy=True)
    if torch is not None:
        with pytest.raises(tw.ChecksumError):
            tw.Reader(buffer=bytes(data)).read_torch(name)
        with pytest.raises(tw.ChecksumError):
            tw.pytorch.load(str(path), mmap=False)
        assert not torch.equal(tw.pytorch.load(str(path))[name], torch.from_numpy(want))
    dst = str(tmp_path / "out.zt")
    with pytest.raises(tw.ChecksumError):
        tw.convert(str(path), dst)
    assert not os.path.exists(dst)
    with pytest.raises(tw.ChecksumError):
        bad.verify()


def test_writes_to_zero_copy_arrays_are_not_damage(tmp_path):
    """A zero-copy array of a `.pt` file is a writable view of a private map: writing
    to it changes what later copies of this reader read, never the file, and the
    record's CRC is checked against the file's bytes, so it still passes."""
    path = os.path.join(FIXTURES, "single.pt")
    r = tw.Reader(path)
    name = max(r.keys(), key=lambda k: r[k].nbytes)
    v = r.read_numpy(name)
    assert v.flags.writeable
    v.flat[0] = 42
    assert r.read_numpy(name, copy=True).flat[0] == 42
    out = np.empty_like(v)
    r.read_into(name, out)
    assert out.flat[0] == 42
    assert r.verify() >= 1
    assert tw.Reader(path).read_numpy(name).flat[0] != 42
