"""tensorwire.pytorch: load / load_numpy / open over the checkpoints the real torch
wrote (fixtures/pytorch). Values are checked against the saved .npy expectations, so
CI needs no torch; with torch installed, load is compared with torch.load."""

import glob
import io
import json
import os
import zipfile

import numpy as np
import pytest

import tensorwire as tw
from tensorwire import pytorch

from conftest import REPO

try:
    import torch
except ImportError:  # the torch halves are skipped
    torch = None

FIXTURES = os.path.join(REPO, "fixtures", "pytorch")
EXPECTED = os.path.join(FIXTURES, "expected")


def _fixtures(error=None):
    """The fixtures that read, or with `error` those that fail with that error
    ("refused global": the malicious files)."""
    out = []
    for path in sorted(glob.glob(os.path.join(EXPECTED, "*.json"))):
        with open(path) as f:
            want = json.load(f)
        if want.get("error") == error:
            name = os.path.basename(path)[:-5]
            out.append(pytest.param(os.path.join(FIXTURES, name), want, id=name))
    return out


def _same_bytes(got, spec):
    want = np.load(os.path.join(EXPECTED, spec["npy"]))
    return got.shape == want.shape and got.tobytes() == want.tobytes()


def _as_bytes(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("path,want", _fixtures())
@pytest.mark.parametrize("source", ["path", "bytes", "file"])
def test_load_numpy_reads_what_torch_saved(path, want, source):
    f = {"path": lambda: path, "bytes": lambda: _as_bytes(path),
         "file": lambda: open(path, "rb")}[source]()
    got = pytorch.load_numpy(f)
    assert list(got) == _names(want, want["tensors"])
    for m in want.get("meta_tensors", []):
        assert got[m["name"]] == pytorch.MetaTensor(
            m["dtype"], tuple(m["shape"]), tuple(m["stride"]), m["requires_grad"],
            m["parameter"]), m["name"]
    for t in want["tensors"]:
        if t["npy_view"] is None:
            assert _same_bytes(got[t["name"]], t), t["name"]
    if source == "bytes":
        # Views of the caller's bytes are read-only (byte-swapped ones are copies).
        buffer = np.frombuffer(f, np.uint8)
        shared = [a for a in got.values()
                  if isinstance(a, np.ndarray) and np.shares_memory(a, buffer)]
        assert not any(a.flags.writeable for a in shared)
        assert shared or want.get("byteorder") == "big" or not any(
            a.size for a in got.values() if isinstance(a, np.ndarray))


def test_load_numpy_copies_own_their_memory():
    path = os.path.join(FIXTURES, "views.pt")
    views = pytorch.load_numpy(path)
    assert np.shares_memory(views["tied_a"], views["tied_b"])
    copies = pytorch.load_numpy(path, mmap=False)
    assert all(a.flags.owndata or a.base is None or a.size == 0 for a in copies.values())
    # tied_b is tied_a, pickled once: one array (copied once), as torch.load gives one
    # tensor; tensors that only share a storage get arrays of their own.
    assert copies["tied_a"] is copies["tied_b"] and views["tied_a"] is views["tied_b"]
    assert not np.shares_memory(copies["transposed"], copies["base"])
    for k in views:
        np.testing.assert_array_equal(copies[k], views[k])


@pytest.mark.parametrize("path,want", _fixtures("refused global"))
def test_malicious_checkpoints_are_refused(path, want):
    with pytest.raises(pytorch.UnsafePickleError, match=want["global"].replace(".", r"\.")):
        pytorch.load_numpy(path)
    with pytest.raises(pytorch.UnsafePickleError):
        pytorch.open(_as_bytes(path))


def test_open_refuses_other_formats_and_bad_arguments():
    st = os.path.join(REPO, "fixtures", "safetensors", "numpy.safetensors")
    with pytest.raises(tw.UnsupportedError, match="safetensors"):
        pytorch.open(st)
    with pytest.raises(tw.InvalidArgumentError, match="weights_only"):
        pytorch.load(st, weights_only=False)
    with pytest.raises(tw.InvalidArgumentError, match="map_location"):
        pytorch.load(st, map_location=42)
    with pytest.raises(tw.FormatError):
        pytorch.load_numpy(b"PK\x03\x04 not really a zip")
    with pytest.raises(FileNotFoundError):
        pytorch.load_numpy(os.path.join(FIXTURES, "missing.pt"))
    with pytorch.open(os.path.join(FIXTURES, "optimizer.pt")) as r:
        assert r.format in pytorch.FORMATS
        assert r.attributes  # the hyperparameters


def _torch_bytes(t):
    """A tensor's values as bytes, in C order (any dtype, 0-d too; a fresh tensor, as
    `contiguous()` keeps the free strides of size-1 dimensions); a quantized tensor's
    integers."""
    if t.is_quantized:
        t = t.int_repr()
    fresh = torch.empty(t.shape, dtype=t.dtype).copy_(t)
    return fresh.reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("path,want", _fixtures())
def test_load_reads_what_torch_saved(path, want):
    got = _with_parts(pytorch.load(path))
    copies = _with_parts(pytorch.load(path, mmap=False))
    assert list(got) == list(copies) == _names(want, _loaded(want, sparse=True))
    for t in _loaded(want):
        g, c = got[t["name"]], copies[t["name"]]
        shape, strides = _torch_layout(t)
        assert isinstance(g, torch.Tensor) and list(g.shape) == shape, t["name"]
        assert list(c.shape) == shape and c.stride() == tuple(strides), t["name"]
        assert _torch_bytes(c) == _torch_bytes(g), t["name"]
        assert _quantization(c) == _quantization(g), t["name"]
        if "torch.qscheme" in t.get("attributes", {}):
            assert str(g.qscheme()) == t["attributes"]["torch.qscheme"], t["name"]
        if t["npy_view"] is None:
            want_bytes = np.load(os.path.join(EXPECTED, t["npy"])).tobytes()
            assert _torch_bytes(g) == want_bytes, t["name"]


def _torch_layout(t):
    """(shape, strides) of a fixture's tensor as torch has them: a complex32 one is
    listed as its float16 pairs, with a last dimension of 2."""
    if t.get("layout") == "pytorch:complex32":
        return t["shape"][:-1], [s // 2 for s in t["strides"][:-1]]
    return t["shape"], t["strides"]


def _quantization(t):
    """A torch tensor's scheme and quantization parameters (None unless quantized)."""
    if not t.is_quantized:
        return None
    if t.qscheme() == torch.per_tensor_affine:
        return t.qscheme(), t.q_scale(), t.q_zero_point()
    return (t.qscheme(), t.q_per_channel_scales().tolist(),
            t.q_per_channel_zero_points().tolist(), t.q_per_channel_axis())


def _names(want, entries):
    """The names of `entries` (of `want["tensors"]`, in order) with the fixture's meta
    tensors at their places: the order of `load` and `load_numpy`."""
    at = {t["name"]: i for i, t in enumerate(want["tensors"])}
    meta = list(want.get("meta_tensors", []))
    out = []
    for t in entries:
        while meta and meta[0]["position"] <= at[t["name"]]:
            out.append(meta.pop(0)["name"])
        out.append(t["name"])
    return out + [m["name"] for m in meta]


def _loaded(want, sparse=False):
    """The fixture's tensors that `pytorch.load` gives as they are: all but the scales
    and zero points of per-channel quantized tensors, which are parts of their tensor,
    and, unless `sparse`, the parts of sparse tensors (see `_with_parts`)."""
    parts = {t["attributes"][k] for t in want["tensors"]
             for k in ("torch.q_per_channel_scales", "torch.q_per_channel_zero_points")
             if k in t.get("attributes", {})}
    return [t for t in want["tensors"] if t["name"] not in parts
            and (sparse or "torch.layout" not in t.get("attributes", {}))]


def sparse_parts(t):
    """[(part, tensor)] of a torch sparse tensor, named as tensorwire's flat view
    names them (after torch's methods); None for a dense tensor."""
    if t.layout == torch.strided:
        return None
    if t.layout == torch.sparse_coo:
        return [("indices", t._indices()), ("values", t._values())]
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [("crow_indices", t.crow_indices()), ("col_indices", t.col_indices()),
                ("values", t.values())]
    return [("ccol_indices", t.ccol_indices()), ("row_indices", t.row_indices()),
            ("values", t.values())]


def _with_parts(tensors):
    """A flat {name: tensor} with each sparse tensor replaced by its parts."""
    out = {}
    for name, t in tensors.items():
        parts = sparse_parts(t)
        if parts is None:
            out[name] = t
        else:
            out.update((f"{name}.{part}" if name else part, p) for part, p in parts)
    return out


def _torch_load_or_skip(path, **kwargs):
    """torch.load(weights_only=True), or a skip for the fixtures torch refuses
    (protocol 4/5 framing, v3 legacy storages)."""
    try:
        return torch.load(path, weights_only=True, **kwargs)
    except Exception as e:
        pytest.skip(f"torch.load cannot read it: {type(e).__name__}")


def _same_object_pairs(tree):
    """(name, first name) of every tensor reached again in a (flat) dict."""
    first = {}
    return [(k, first.setdefault(id(v), k)) for k, v in tree.items()
            if first.setdefault(id(v), k) != k]


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("path,want", _fixtures())
def test_a_tensor_pickled_under_two_names_is_one_object_as_in_torch(path, want):
    ref = _torch_load_or_skip(path, map_location="cpu")
    ref_flat = ref if isinstance(ref, dict) and all(
        isinstance(v, torch.Tensor) for v in ref.values()) else None
    for kwargs in ({}, {"mmap": False}, {"map_location": "cpu"},
                   {"map_location": lambda storage, loc: storage}):
        got = pytorch.load(path, **kwargs)
        if ref_flat is not None:
            assert _same_object_pairs(got) == _same_object_pairs(ref_flat), kwargs
        tree = pytorch.load(path, flat=False, **kwargs)
        if isinstance(ref, dict) and "tied_a" in ref:
            assert (tree["tied_a"] is tree["tied_b"]) == (ref["tied_a"] is ref["tied_b"])
    if ref_flat is not None:
        got = pytorch.load_numpy(path)
        assert _same_object_pairs(got) == _same_object_pairs(ref_flat)


@pytest.mark.parametrize("name", ["shared.pt", "shared.legacy.pt"])
def test_objects_pickled_once_are_one_object_in_every_place(name):
    # Without torch: load_numpy's tree has the identities torch.load gives (below).
    tree = pytorch.load_numpy(os.path.join(FIXTURES, name), flat=False)
    assert tree["a"] is tree["b"] is tree["pair"][0] is tree["pair"][1]
    assert tree["w"] is tree["a"][0] and tree["a"][1] is not tree["a"][0]
    assert tree["opt"]["group"] is tree["opt"]["again"]
    assert tree["opt"]["betas"] is tree["opt"]["group"]["betas"] == (0.9, 0.999)
    flat = pytorch.load_numpy(os.path.join(FIXTURES, name))
    assert flat["b.1"] is flat["a.1"] and flat["pair.1.0"] is flat["w"]


def _identity_classes(obj):
    """Every object (tensors and containers) of a tree, by place, grouped by identity:
    the sorted list of place groups that are one object."""
    places = {}

    def walk(o, path):
        places.setdefault(id(o), (o, []))[1].append(path)
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, path + (k,))
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, path + (i,))

    walk(obj, ())
    return sorted(sorted(p) for o, p in places.values()
                  if len(p) > 1 and not isinstance(o, (int, float, str, bool, type(None))))


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("name", ["shared.pt", "shared.legacy.pt", "views.pt", "nested.pt",
                                  "optimizer.pt", "module.legacy.pt"])
@pytest.mark.parametrize("kwargs", [{}, {"mmap": False}, {"map_location": "cpu"}])
def test_flat_false_has_torchs_identities(name, kwargs):
    path = os.path.join(FIXTURES, name)
    ref = torch.load(path, weights_only=True, **kwargs)
    got = pytorch.load(path, flat=False, **kwargs)
    assert _identity_classes(got) == _identity_classes(ref)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("path,want", _fixtures())
def test_storages_and_offsets_are_torchs(path, want):
    """Every tensor's storage (size, which tensors share it) and storage offset are
    torch's, on the zero-copy path too: tensors of one storage are set on one
    UntypedStorage, and a re-save writes each storage once."""
    ref = _torch_load_or_skip(path, mmap=want["format"] == "pytorch-zip")
    if not isinstance(ref, dict):
        ref = {"tensor": ref}
    ref = _with_parts(_flat_tensors(ref))
    got = _with_parts(pytorch.load(path))

    def layout(tensors):
        first = {}
        return [(name, t.storage_offset(), t.untyped_storage().nbytes(),
                 first.setdefault(t.untyped_storage().data_ptr(), name))
                for name, t in tensors.items()]

    assert layout(got) == layout(ref)


def _flat_tensors(obj, prefix=""):
    """torch's object as {dotted name: tensor}, named as tensorwire's flat view."""
    out = {}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(
        obj, (list, tuple)) else None
    if items is None:
        if isinstance(obj, torch.Tensor):
            out[prefix] = obj
        return out
    for k, v in items:
        out.update(_flat_tensors(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_load_keeps_strides_and_shared_storages_like_torch():
    path = os.path.join(FIXTURES, "views.pt")
    ref = torch.load(path, weights_only=True)
    got = pytorch.load(path)
    assert list(got) == list(ref)
    for k, v in ref.items():
        assert got[k].dtype == v.dtype and got[k].stride() == v.stride(), k
        assert torch.equal(got[k], v), k
    assert got["tied_a"].data_ptr() == got["tied_b"].data_ptr()
    assert got["transposed"].untyped_storage().data_ptr() == got["base"].untyped_storage().data_ptr()
    # From bytes or a file object: copies (torch has no read-only tensors), still equal,
    # and writing to them leaves the caller's bytes alone.
    # Copies (mmap=False, bytes, a file object; a legacy file's unaligned storages)
    # copy each storage once: what shared a storage still shares its copy, as with
    # torch.load.
    data = _as_bytes(path)
    legacy = path.replace(".pt", ".legacy.pt")
    for f in (data, io.BytesIO(data), path, legacy):
        again = pytorch.load(f, mmap=False) if f is path else pytorch.load(f)
        for k, v in ref.items():
            assert torch.equal(again[k], v) and again[k].stride() == v.stride(), k
        assert again["tied_a"].data_ptr() == again["tied_b"].data_ptr()
        assert (again["transposed"].untyped_storage().data_ptr()
                == again["base"].untyped_storage().data_ptr())
        again["base"][0, 0] = 42.0
        assert again["transposed"][0, 0] == 42.0
    assert data == _as_bytes(path)
    assert pytorch.load(path)["base"][0, 0] != 42.0  # the file is untouched
    # weights_only=None is torch's default and means the same here.
    assert torch.equal(pytorch.load(path, weights_only=None)["base"], ref["base"])


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_load_state_dict_into_a_module():
    """The fixture's TinyModel (fixtures/pytorch/make_fixtures.py), loaded from our
    dict, computes what the model loaded by torch computes."""
    nn = torch.nn

    class TinyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.proj = nn.Linear(4, 4)
            self.norm = nn.LayerNorm(4)
            self.out = nn.Linear(4, 10, bias=False)
            self.out.weight = self.emb.weight
            self.register_buffer("positions", torch.zeros(6, dtype=torch.int64))

        def forward(self, ids):
            return self.out(self.norm(torch.relu(self.proj(self.emb(ids)))))

    path = os.path.join(FIXTURES, "module.pt")
    ours, theirs = TinyModel(), TinyModel()
    ours.load_state_dict(pytorch.load(path))
    theirs.load_state_dict(torch.load(path, weights_only=True))
    ids = torch.tensor([0, 3, 9, 4])
    assert torch.equal(ours(ids), theirs(ids))
    assert torch.equal(ours.positions, torch.arange(6))


def test_load_numpy_nested_gives_the_checkpoint_object():
    """flat=False: the object torch.save was given (fixtures/pytorch/make_fixtures.py
    make_nested), with arrays where its tensors were."""
    import collections

    for name in ("nested.pt", "nested.legacy.pt"):
        path = os.path.join(FIXTURES, name)
        flat = pytorch.load_numpy(path)
        got = pytorch.load_numpy(path, flat=False)
        assert type(got) is dict
        assert list(got) == ["model", "step", "lr", "name", "flags", "sizes", "pair"]
        layers = got["model"]["layers"]
        assert type(layers) is list and len(layers) == 2
        assert list(layers[1]) == ["weight", "bias"]
        np.testing.assert_array_equal(layers[1]["weight"], flat["model.layers.1.weight"])
        assert type(got["model"]["head"]) is collections.OrderedDict
        assert got["step"] == 1200 and got["lr"] == 0.0005 and got["name"] == "run-7"
        assert got["flags"] == {"ema": True, "note": None}
        assert got["sizes"] == [3, 4, (5, 6)]
        assert type(got["pair"]) is tuple and got["pair"][1] == 7
        np.testing.assert_array_equal(got["pair"][0], np.arange(4, dtype=np.int32))


def test_load_numpy_nested_keeps_int_keys_of_an_optimizer_state():
    got = pytorch.load_numpy(os.path.join(FIXTURES, "optimizer.pt"), flat=False)
    state = got["optimizer"]["state"]
    assert state and all(type(k) is int for k in state)
    group = got["optimizer"]["param_groups"][0]
    assert type(group["betas"]) is tuple and group["lr"] == 1e-3
    assert pytorch.load_numpy(os.path.join(FIXTURES, "single.pt"), flat=False).shape == (5,)
    with pytest.raises(tw.UnsupportedError, match="one PyTorch checkpoint"):
        tw.Reader(os.path.join(REPO, "fixtures", "safetensors", "numpy.safetensors"))._pytorch_structure(str, str)


def compare_trees(got, want, same_tensor, where="root"):
    """Walks our object `got` and torch's `want` together: containers of the same
    type with the same keys and lengths, equal values, and dense tensors of the same
    class and requires_grad compared by `same_tensor(got, want, where)` (a sparse tensor's layout, size and coalesced
    flag here, then its parts)."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), where
        # An nn.Parameter is one, and requires_grad is torch's.
        assert type(got) is type(want), (where, type(got), type(want))
        assert got.requires_grad == want.requires_grad, where
        if want.device.type == "meta":  # no data: what it says of itself
            assert got.device.type == "meta", where
            assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape,
                                                            want.stride()), where
            return
        if want.layout == torch.strided:
            same_tensor(got, want, where)
            return
        assert (got.layout, got.shape, got.device) == (want.layout, want.shape, want.device), where
        if want.layout == torch.sparse_coo:
            assert got.is_coalesced() == want.is_coalesced(), where
        for (part, g), (_, w) in zip(sparse_parts(got), sparse_parts(want)):
            same_tensor(g, w, f"{where}.{part}")
        return
    assert type(got) is type(want), (where, type(got), type(want))
    if isinstance(want, dict):
        assert list(got) == list(want), where
        for k in want:
            compare_trees(got[k], want[k], same_tensor, f"{where}.{k}")
        # Attributes torch sets on an OrderedDict (a state dict's `_metadata`).
        got_attrs, want_attrs = getattr(got, "__dict__", {}), getattr(want, "__dict__", {})
        assert list(got_attrs) == list(want_attrs), where
        for k in want_attrs:
            compare_trees(got_attrs[k], want_attrs[k], same_tensor, f"{where}@{k}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            compare_trees(g, w, same_tensor, f"{where}.{i}")
    else:
        assert got == want, (where, got, want)


def _same_values(got, want, where):
    assert got.dtype == want.dtype and got.shape == want.shape, where
    assert _torch_bytes(got) == _torch_bytes(want), where
    assert _quantization(got) == _quantization(want), where


def same_as_loaded(got, want, where):
    """A dense tensor as torch loaded it: device, dtype, shape, strides, storage
    offset, values and quantization."""
    assert got.device == want.device, where
    assert got.stride() == want.stride(), where
    assert got.storage_offset() == want.storage_offset(), where
    _same_values(got, want, where)


def _same_object(got, want):
    compare_trees(got, want, _same_values)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("path,want", _fixtures())
def test_load_nested_equals_torch_load(path, want):
    import warnings

    if os.path.basename(path) == "big_endian.pt":
        pytest.skip("torch leaves uint16/32/64 of big-endian files unswapped; we swap")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ref = torch.load(path, weights_only=True)
        except Exception:  # a file torch's weights_only unpickler refuses
            pytest.skip("torch.load(weights_only=True) refuses this file")
    got = pytorch.load(path, flat=False)
    _same_object(got, ref)
    if not path.endswith(".legacy.pt"):  # legacy storages are unaligned: copies
        flat = pytorch.load(path)
        for t in _loaded(want):
            assert flat[t["name"]].stride() == tuple(_torch_layout(t)[1]), t["name"]


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("zipfile", [True, False])
def test_load_nested_training_checkpoint(tmp_path, zipfile):
    """What a training loop saves: a model, its optimizer and scheduler, dtypes, and a
    long history of repeated small values (many references, few objects)."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3)
    ckpt = {
        "model": model.state_dict(), "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(), "epoch": 7, "dtype": torch.bfloat16,
        "history": [{"epoch": i % 50, "loss": 0.5, "split": "train"} for i in range(20000)],
        "zeros": [0] * 40000, "tags": {"a", "b"}, "blob": b"\x00\x01",
    }
    path = tmp_path / "ckpt.pt"
    torch.save(ckpt, path, _use_new_zipfile_serialization=zipfile)
    got = pytorch.load(path, flat=False)
    _same_object(got, torch.load(path, weights_only=True))
    assert got["dtype"] is torch.bfloat16
    assert pytorch.load_numpy(path, flat=False)["dtype"] == "torch.bfloat16"
    fresh = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters(), lr=0.01)
    fresh.load_state_dict(got["optimizer"])
    assert fresh.state_dict()["param_groups"] == opt.state_dict()["param_groups"]


def _storage_keys(path):
    with pytorch.open(path) as r:
        return [key for key, *_ in r._pytorch_storages()]


def _torch_calls(path, mmap):
    """The (bytes, location) of each storage torch.load hands a map_location function,
    in order (the fixtures are trusted: any unpickler may read them), or None where
    torch cannot map the file (a legacy one) or fails on it (its legacy loader cannot
    read the untyped storages of `dtypes_v3.legacy.pt`)."""
    import warnings

    calls = []

    def keep(storage, location):
        calls.append((storage.nbytes(), location))
        return storage

    if mmap and path.endswith(".legacy.pt"):
        return None  # torch maps ZIP checkpoints only
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.load(path, map_location=keep, weights_only=False, mmap=mmap)
        except AttributeError:
            return None
    return calls


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("path,want", _fixtures())
@pytest.mark.parametrize("mmap", [True, False])
def test_map_location_function_gets_each_storage_once(path, want, mmap):
    """torch's `lambda storage, location: storage` idiom: called once per storage with
    its saved location, as torch calls it; the tensors set on the storages it returns
    are what torch saved, with torch's strides, and tensors of one storage share it."""
    calls = []

    def keep(storage, location):
        assert isinstance(storage, torch.UntypedStorage) and storage.device.type == "cpu"
        calls.append((storage.nbytes(), location))
        return storage

    got = _with_parts(pytorch.load(path, map_location=keep, mmap=mmap))
    assert list(got) == _names(want, _loaded(want, sparse=True))
    keys = _storage_keys(path)
    assert len(calls) == len(set(keys))
    assert {loc for _, loc in calls} == ({"cpu"} if keys else set())
    first = {}
    for t, key in zip(want["tensors"], keys):
        if t["name"] not in got:  # a quantized tensor's scales or zero points
            continue
        g = got[t["name"]]
        shape, strides = _torch_layout(t)
        assert list(g.shape) == shape and g.stride() == tuple(strides), t["name"]
        if t["npy_view"] is None:
            want_bytes = np.load(os.path.join(EXPECTED, t["npy"])).tobytes()
            assert _torch_bytes(g) == want_bytes, t["name"]
        storage = g.untyped_storage().data_ptr()
        assert first.setdefault(key, storage) == storage, t["name"]
    theirs = _torch_calls(path, mmap)
    if theirs is not None:
        assert calls == theirs


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_map_location_function_storages_share_the_map_unless_copied():
    path = os.path.join(FIXTURES, "views.pt")
    with pytorch.open(path) as r:
        view, copy = r._pytorch_storage("base", False), r._pytorch_storage("base", True)
        tensor = r.read_numpy("base")
        assert np.shares_memory(view, tensor) and not np.shares_memory(copy, tensor)
        assert view.tobytes() == copy.tobytes()
    shared = pytorch.load(path, map_location=lambda storage, location: storage)
    shared["tied_a"][0] = 7
    assert shared["tied_b"][0] == 7  # one storage, as in the checkpoint
    assert pytorch.load(path)["tied_a"][0] != 7  # a private map: nothing reached the file
    data = _as_bytes(path)
    for f in (data, io.BytesIO(data)):
        copies = pytorch.load(f, map_location=lambda storage, location: None)
        copies["base"][0, 0] = 42.0  # owns its memory: the caller's bytes stay intact
        assert torch.equal(copies["transposed"], copies["base"].t())
    assert data == _as_bytes(path)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("name", ["views.pt", "views.legacy.pt", "module.pt"])
def test_map_location_moves_storages_and_keeps_them_shared(name):
    """A device, a dict or a function moves each storage once (to torch's "meta"
    device here, which needs no GPU): tied tensors still share one storage there. A
    dict that does not list a saved location leaves its storages there, zero-copy."""
    path = os.path.join(FIXTURES, name)
    keys = _storage_keys(path)
    to_meta = lambda storage, location: torch.UntypedStorage(storage.nbytes(), device="meta")
    for map_location in ("meta", torch.device("meta"), {"cpu": "meta"}, to_meta):
        moved = pytorch.load(path, map_location=map_location)
        assert all(t.device.type == "meta" for t in moved.values()), map_location
        first = {}
        for t, key in zip(moved.values(), keys):
            cdata = t.untyped_storage()._cdata
            assert first.setdefault(key, cdata) == cdata
        nested = pytorch.load(path, map_location=map_location, flat=False)
        assert all(t.device.type == "meta" for t in _tensors_in(nested))
    kept = pytorch.load(path, map_location={"cuda:1": "meta"})
    plain = pytorch.load(path)
    for k, t in kept.items():
        assert t.device.type == "cpu" and _torch_bytes(t) == _torch_bytes(plain[k]), k
    with pytest.raises(tw.InvalidArgumentError, match="returned int"):
        pytorch.load(path, map_location=lambda storage, location: 42)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("name", ["views.pt", "views.legacy.pt"])
def test_map_location_meta_reads_no_storage(name, monkeypatch):
    """To the "meta" device (a device or a dict), as with torch, no storage is read:
    not even copied from a legacy file's unaligned storages or for mmap=False."""
    path = os.path.join(FIXTURES, name)
    want = pytorch.load(path)

    def no_reads(self, name, copy):
        raise AssertionError(f"storage of `{name}` read")

    monkeypatch.setattr(tw.Reader, "_pytorch_storage", no_reads)
    for map_location in ("meta", torch.device("meta"), {"cpu": "meta"}):
        for mmap in (None, False):
            got = pytorch.load(path, map_location=map_location, mmap=mmap)
            for k, t in want.items():
                g = got[k]
                assert g.device.type == "meta" and g.dtype == t.dtype, k
                assert g.shape == t.shape and g.stride() == t.stride(), k
            assert got["tied_a"].untyped_storage()._cdata == got["tied_b"].untyped_storage()._cdata
    with pytest.raises(AssertionError, match="read"):  # a function gets the data
        pytorch.load(path, map_location=lambda storage, location: storage)


def _tensors_in(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors_in(v)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            yield from _tensors_in(v)


def _write_legacy(path, obj, storage_ids, storages):
    """A legacy-format checkpoint of `obj`, pickled with `storage_ids` ({id(stand-in):
    persistent id tuple}) for its storage stand-ins, then `storages` [(key, numel,
    raw bytes)] in that order, as torch < 1.6 lays them out."""
    import pickle
    import struct

    class Pickler(pickle.Pickler):
        def persistent_id(self, stand_in):
            # ('storage', type, key, location, numel, (view key, first, count) or None)
            return storage_ids.get(id(stand_in))

    f = io.BytesIO()
    sys_info = dict(protocol_version=1001, little_endian=True,
                    type_sizes=dict(short=2, int=4, long=4))
    for header in (0x1950A86A20F9469CFC6C, 1001, sys_info):
        pickle.dump(header, f, protocol=2)
    Pickler(f, protocol=2).dump(obj)
    pickle.dump([key for key, _, _ in storages], f, protocol=2)
    for _, numel, raw in storages:
        f.write(struct.pack("<q", numel) + raw)
    path.write_bytes(f.getvalue())
    return path


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_legacy_storage_views_are_slices_of_their_root(tmp_path):
    """A legacy storage view that starts mid-element of the tensor's type (an int16
    tensor on a byte storage view at byte 1, which torch writes for no real model
    but reads) is read from that byte by every path, as torch reads it."""
    import collections

    storage = object()

    class Tensor:
        def __reduce__(self):
            return (torch._utils._rebuild_tensor_v3,
                    (storage, 0, (2,), (1,), False, collections.OrderedDict(), torch.int16))

    path = _write_legacy(
        tmp_path / "view.legacy.pt", {"t": Tensor()},
        {id(storage): ("storage", torch.ByteStorage, "0", "cpu", 8, ("1", 1, 4))},
        [("0", 8, bytes(range(8)))])
    want = torch.load(path, weights_only=True)["t"]
    assert want.tolist() == [0x0201, 0x0403]
    for map_location in (None, "cpu", {"cpu": "cpu"}, lambda s, loc: s):
        for mmap in (None, False):
            got = pytorch.load(path, map_location=map_location, mmap=mmap)["t"]
            assert torch.equal(got, want), (map_location, mmap)
    assert pytorch.load_numpy(path)["t"].tolist() == want.tolist()


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_a_legacy_storage_view_shares_its_root_storage(tmp_path):
    """A tensor on a legacy root storage and one on a view of it (elements 4..10)
    share a storage, as in torch; neither has a storage to itself."""
    import collections

    root, view = object(), object()

    class Tensor:
        def __init__(self, storage, size):
            self.args = (storage, 0, (size,), (1,), False, collections.OrderedDict())

        def __reduce__(self):
            return (torch._utils._rebuild_tensor_v2, self.args)

    path = _write_legacy(
        tmp_path / "views.legacy.pt", {"a": Tensor(root, 12), "b": Tensor(view, 6)},
        {id(root): ("storage", torch.FloatStorage, "0", "cpu", 12, None),
         id(view): ("storage", torch.FloatStorage, "0", "cpu", 12, ("5", 4, 6))},
        [("0", 12, np.arange(12, dtype=np.float32).tobytes())])
    ref = torch.load(path, weights_only=True)
    assert ref["b"].tolist() == list(range(4, 10))
    with pytorch.open(str(path)) as r:
        assert r._pytorch_partial_storages() == ["a", "b"]
    got = pytorch.load(path)
    assert got["b"].tolist() == list(range(4, 10))
    assert got["b"].untyped_storage().data_ptr() == got["a"].untyped_storage().data_ptr() + 16


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_load_keeps_torch_strides_and_sharing_for_every_dtype(tmp_path):
    """Zero-copy tensors of types numpy lacks (bfloat16, float8) keep their strides
    and shared storages too, and every tensor keeps torch's own strides, also the free
    ones of size-1 dimensions and of empty tensors."""
    state = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2fnuz):
        base = torch.arange(12.0).reshape(2, 6).to(dtype)
        state[f"{dtype}.base"] = base
        state[f"{dtype}.t"] = base.t()
        state[f"{dtype}.cols"] = base[:, ::2]
    column = torch.arange(3.0).reshape(1, 3).t()  # shape (3, 1), strides (1, 3)
    state.update(column=column, step=torch.arange(9.0)[::3][:1],
                 empty=torch.empty(2, 0, 5).permute(2, 0, 1),
                 empty_bf16=torch.empty(4, 0, dtype=torch.bfloat16).t(),
                 empty_f8=torch.empty(6, dtype=torch.float8_e4m3fn)[::2][:0])
    path = tmp_path / "strides.pt"
    torch.save(state, path)
    ref = torch.load(path, weights_only=True)
    for got in (pytorch.load(path), pytorch.load(path, mmap=False),
                pytorch.load(path, map_location=lambda storage, location: storage)):
        for k, v in ref.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            assert got[k].stride() == v.stride(), (k, got[k].stride(), v.stride())
            assert _torch_bytes(got[k]) == _torch_bytes(v), k
        for dtype in (torch.bfloat16, torch.float8_e4m3fn):
            base = got[f"{dtype}.base"]
            for view in ("t", "cols"):
                assert got[f"{dtype}.{view}"].data_ptr() == base.data_ptr(), (dtype, view)
    with tw.Reader(str(path)) as r:
        t = r.read_torch("torch.bfloat16.t")
        assert t.stride() == (1, 6) and torch.equal(t, ref["torch.bfloat16.t"])


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_complex_tensors_are_aligned_for_torch(tmp_path):
    """A complex128 storage 8 bytes past a 16-byte boundary (legacy storages and NPZ
    members sit anywhere) is copied for torch, whose complex kernels fault on it."""
    for pad in range(16):
        state = {"pad": "x" * pad, "c": torch.tensor([1 + 2j, -3j], dtype=torch.complex128)}
        path = tmp_path / f"c{pad}.legacy.pt"
        torch.save(state, path, _use_new_zipfile_serialization=False)
        want = torch.load(path, weights_only=True)["c"]
        with tw.Reader(str(path)) as r:
            tensors = [pytorch.load(path)["c"], r.read_torch("c"), r.read("c").torch(),
                       pytorch.load(path, map_location=lambda storage, location: storage)["c"]]
        for t in tensors:
            assert t.data_ptr() % 16 == 0, pad
            assert torch.equal(t.clone(), want), pad
        npz = tmp_path / f"c{pad}.npz"
        np.savez(npz, **{"x" * (pad + 1): np.zeros(1, np.uint8), "c": np.array([1 + 2j])})
        with tw.Reader(str(npz)) as r:
            t = r.read_torch("c")
            assert t.data_ptr() % 16 == 0 and t.clone().tolist() == [1 + 2j], pad


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_dotted_name_collisions_are_refused_naming_the_name(tmp_path):
    """torch loads {"fc": {"weight": a}, "fc.weight": b}; the flat view cannot hold
    both, so the file is refused as unsupported, naming the dotted name."""
    path = tmp_path / "clash.pt"
    for state in ({"fc": {"weight": torch.zeros(1)}, "fc.weight": torch.ones(1)},
                  {"": {"layer": 1, "w": torch.zeros(1)}, "layer": 2}):
        torch.save(state, path)
        name = "fc.weight" if "fc" in state else "layer"
        with pytest.raises(tw.UnsupportedError, match=f"dotted name `{name}`"):
            pytorch.load(path)


def _amplifying_zip(path, copies):
    """A ZIP checkpoint {"notes": [s] * copies} where s is one memoized 1 MiB str:
    about 1 MiB on disk, copies MiB once every reference is copied."""
    import struct

    text = b"x" * (1 << 20)
    pkl = (b"\x80\x02}(X\x05\x00\x00\x00notes](X" + struct.pack("<I", len(text)) + text
           + b"q\x00" + b"h\x00" * (copies - 1) + b"eu.")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("amp/data.pkl", pkl)
        z.writestr("amp/version", "3\n")


def test_a_small_pickle_cannot_ask_for_huge_copies(tmp_path):
    """One str referenced 50 000 times would be 50 GiB once copied: every entry
    point refuses it with a limit error instead of running out of memory."""
    path = tmp_path / "amp.pt"
    _amplifying_zip(path, 50_000)
    loads = [lambda: tw.Reader(str(path)), lambda: pytorch.open(path)]
    if torch is not None:  # load builds torch objects
        loads += [lambda: pytorch.load(path), lambda: pytorch.load(path, flat=False)]
    for load in loads:
        with pytest.raises(tw.LimitExceededError, match="text copied"):
            load()
    _amplifying_zip(path, 3)
    with tw.Reader(str(path)) as r:  # a root holding no tensor is one value
        assert r.attributes["value"]["notes"] == ["x" * (1 << 20)] * 3


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_a_long_list_shared_under_several_keys_loads_as_torch_loads_it(tmp_path):
    """A 20 000-float history kept under five keys: torch loads it, and so do we, as
    one list object in the nested view."""
    history = [float(i) for i in range(20_000)]
    state = {"w": torch.arange(4.0), **{f"loss_{k}": history for k in range(5)}}
    path = tmp_path / "history.pt"
    torch.save(state, path)
    with tw.Reader(str(path)) as r:
        assert all(r.attributes[f"loss_{k}"] == history for k in range(5))
    nested = pytorch.load(path, flat=False)
    want = torch.load(path, weights_only=True)
    assert nested["loss_0"] == want["loss_0"]
    assert all(nested[f"loss_{k}"] is nested["loss_0"] for k in range(5))
    assert torch.equal(nested["w"], want["w"])


def _rezipped(src, dst, method):
    """`src`'s records written again by Python's zipfile with `method`, as some tools
    re-pack checkpoints (no 64-byte alignment any more)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", method) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))


def test_deflated_records_read_as_the_stored_ones(tmp_path):
    """A checkpoint whose records were re-zipped with deflate (some tools do) reads
    back the same values, shapes and strides as the stored original, empty tensors
    included (numpy would give a fresh empty array zero strides)."""
    for name in ("views.pt", "dtypes.pt", "module.pt"):
        src = os.path.join(FIXTURES, name)
        dst = tmp_path / name
        _rezipped(src, dst, zipfile.ZIP_DEFLATED)
        with tw.Reader(src) as stored, tw.Reader(str(dst)) as deflated:
            for k in stored.keys():
                a, b = stored.read_numpy(k), deflated.read_numpy(k)
                assert a.dtype == b.dtype and a.shape == b.shape, k
                assert a.tobytes() == b.tobytes(), k
                if a.flags.c_contiguous:
                    assert a.strides == b.strides, (name, k, a.strides, b.strides)
        if torch is not None:
            want = torch.load(src, weights_only=True, mmap=True)
            for kw in ({}, {"mmap": False}, {"map_location": lambda s, loc: s}):
                got = pytorch.load(dst, **kw)
                for k, w in want.items():
                    assert got[k].stride() == w.stride(), (name, kw, k)
                    assert got[k].storage_offset() == w.storage_offset(), (name, kw, k)
                    raw = [t.contiguous().reshape(-1).view(torch.uint8) for t in (got[k], w)]
                    assert got[k].dtype == w.dtype and torch.equal(*raw), (name, kw, k)


def test_tensors_load_cannot_lend_in_place_are_found(tmp_path):
    """What load sets on storage copies rather than lending the map (no torch needed):
    none of a checkpoint torch wrote, every tensor once deflated, and once re-zipped
    stored exactly those whose bytes lost their element alignment."""
    src = os.path.join(FIXTURES, "module.pt")  # types numpy has (no ml_dtypes in CI)
    with tw.Reader(src) as r:
        assert r._pytorch_unlendable() == []
        keys = r.keys()
    for method in (zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED):
        dst = tmp_path / f"rezipped{method}.pt"
        _rezipped(src, dst, method)
        with tw.Reader(str(dst)) as r:
            unlent = r._pytorch_unlendable()
            if method == zipfile.ZIP_DEFLATED:
                assert unlent == keys
            else:
                misaligned = [k for k in keys
                              if not r.read_numpy(k).flags.aligned
                              or r.read_numpy(k).ctypes.data % r.read_numpy(k).itemsize]
                assert unlent == misaligned and unlent


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("layout", ["stored", "deflated", "alignment_1"])
def test_load_keeps_strides_and_storages_of_records_it_cannot_lend(tmp_path, layout):
    """Records torch cannot view in place (re-zipped by Python's zipfile, stored or
    deflated, or saved with storage_alignment=1) still give torch.load's tensors:
    strides, storage offsets and sizes, an expanded tensor its one element (2^40 of
    them would not fit a copy)."""
    import torch.utils.serialization.config as config

    state = {"t": torch.arange(6.0).view(2, 3).t(), "step": torch.arange(10.0)[::3],
             "cl": torch.randn(1, 2, 2, 3).to(memory_format=torch.channels_last),
             "c": torch.randn(3, dtype=torch.complex128)[1:],
             "e": torch.ones(1).expand(2**40), "z": torch.empty_strided((0, 3), (7, 100)),
             "w": torch.randn(4, 5)}
    state["tied"] = state["w"][1]
    path = tmp_path / "ckpt.pt"
    if layout == "alignment_1":
        saved = config.save.storage_alignment
        config.save.storage_alignment = 1
        try:
            torch.save(state, path)
        finally:
            config.save.storage_alignment = saved
    else:
        torch.save(state, tmp_path / "orig.pt")
        method = zipfile.ZIP_STORED if layout == "stored" else zipfile.ZIP_DEFLATED
        _rezipped(tmp_path / "orig.pt", path, method)
    want = torch.load(path, weights_only=True)
    for kw in ({}, {"mmap": False}):
        got = pytorch.load(path, **kw)
        assert list(got) == list(want)
        for k, w in want.items():
            g = got[k]
            assert (g.dtype, g.shape, g.stride()) == (w.dtype, w.shape, w.stride()), (kw, k)
            assert g.storage_offset() == w.storage_offset(), (kw, k)
            assert g.untyped_storage().nbytes() == w.untyped_storage().nbytes(), (kw, k)
            if k != "e":
                assert torch.equal(g, w), (kw, k)
        assert got["e"][12345].item() == 1.0
        assert got["tied"].untyped_storage().data_ptr() == got["w"].untyped_storage().data_ptr()


@pytest.mark.skipif(torch is None or not hasattr(torch, "float8_e8m0fnu"),
                    reason="torch with float8_e8m0fnu is not installed")
def test_torch_dtypes_tensorwire_does_not_read_are_unsupported(tmp_path):
    path = tmp_path / "bits.pt"
    torch.save({"flags": torch.zeros(4, dtype=torch.bits8)}, path)
    with pytest.raises(tw.UnsupportedError, match="torch.bits8"):
        pytorch.load(path)
    # A sparse tensor of a dtype tensorwire reads only as its holder elements.
    values = torch.tensor([1 + 1j, 2], dtype=torch.complex64).to(torch.complex32)
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), values, (2, 2))
    torch.save({"s": sparse}, path)
    with pytest.raises(tw.UnsupportedError, match="sparse tensors of torch.complex32"):
        pytorch.load(path)


SPARSE = ["sparse.pt", "sparse.legacy.pt"]


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("name", SPARSE)
@pytest.mark.parametrize("kwargs", [{}, {"mmap": False}, {"map_location": "cpu"},
                                    {"map_location": lambda storage, loc: storage}])
def test_sparse_tensors_load_as_torch_loads_them(name, kwargs):
    """Every layout comes back sparse, in torch's place and order, equal to torch's;
    a sparse tensor pickled under two names is one object."""
    path = os.path.join(FIXTURES, name)
    ref = torch.load(path, weights_only=True)
    got = pytorch.load(path, **kwargs)
    assert list(got) == list(_flat_tensors(ref))
    for key, want in _flat_tensors(ref).items():
        assert got[key].layout == want.layout and got[key].shape == want.shape, key
        assert torch.equal(got[key].to_dense(), want.to_dense()), key
    assert got["coo_again"] is got["coo"]
    assert not got["uncoalesced"].is_coalesced() and got["coo"].is_coalesced()
    assert got["csr_int32"].crow_indices().dtype == torch.int32
    tree = pytorch.load(path, flat=False, **kwargs)
    assert tree["coo_again"] is tree["coo"]
    assert tree["graph"]["adjacency"].layout == torch.sparse_coo


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_sparse_parts_are_views_of_the_map():
    path = os.path.join(FIXTURES, "sparse.pt")
    got = pytorch.load(path)
    with pytorch.open(path) as r:
        values = r.read_torch("csr.values")
    assert torch.equal(got["csr"].values(), values)
    # The parts are set on the mapped storages: a write shows in the values (the map
    # is private: the file stays as it was).
    got["csr"].values()[0] = 99.0
    assert got["csr"].to_dense()[0, 1] == 99.0
    assert pytorch.load(path)["csr"].values()[0] != 99.0


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("legacy", [False, True])
def test_sparse_index_values_are_checked_as_torch_checks_them(tmp_path, legacy):
    """An index out of range (torch saves what it is given unchecked): torch.load
    refuses the tensor, and pytorch.load too, with a MalformedError naming it; the
    parts still read as arrays."""
    bad = torch.sparse_coo_tensor(torch.tensor([[0, 7]]), torch.tensor([1.0, 2.0]), (3,),
                                  check_invariants=False)
    path = str(tmp_path / "bad.pt")
    torch.save({"bad": bad}, path, _use_new_zipfile_serialization=not legacy)
    if _torch_checks_sparse_indices():
        with pytest.raises(RuntimeError, match="index"):
            torch.load(path, weights_only=True)
    with pytest.raises(tw.MalformedError, match="sparse tensor `bad`: .*index"):
        pytorch.load(path)
    arrays = pytorch.load_numpy(path)
    assert arrays["bad.indices"].tolist() == [[0, 7]]


@pytest.mark.parametrize("name", SPARSE)
def test_load_numpy_gives_sparse_tensors_as_their_parts(name):
    path = os.path.join(FIXTURES, name)
    flat = pytorch.load_numpy(path)
    assert flat["coo.indices"].dtype == np.int64 and flat["coo.indices"].shape == (2, 4)
    with pytorch.open(path) as r:
        attributes = r.metadata("bsr.values").attributes
    assert attributes == {"torch.layout": "torch.sparse_bsr", "torch.size": [4, 6]}
    tree = pytorch.load_numpy(path, flat=False)
    coo = tree["coo"]
    assert (coo["layout"], coo["size"], coo["is_coalesced"]) == ("torch.sparse_coo", (4, 6), True)
    np.testing.assert_array_equal(coo["values"], flat["coo.values"])
    dense = np.zeros(coo["size"], dtype=coo["values"].dtype)
    dense[tuple(coo["indices"])] = coo["values"]
    np.testing.assert_array_equal(dense, np.load(os.path.join(EXPECTED, name, "dense.npy")))
    assert sorted(tree["csc"]) == ["ccol_indices", "layout", "row_indices", "size", "values"]


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("name", ["sparse.pt", "sparse.legacy.pt"])
@pytest.mark.parametrize("location", ["meta", {"cpu": "meta"}])
def test_sparse_tensors_sent_to_meta_are_built_unchecked(name, location):
    """On "meta" there are no index values to check: every sparse tensor is built there
    with torch's layout, size, dtype and parts' shapes, as a torch that does not check
    indices on load builds it (2.11); a torch that does (2.15) raises instead."""
    path = os.path.join(FIXTURES, name)
    if _torch_checks_sparse_indices():
        with pytest.raises(NotImplementedError):
            torch.load(path, weights_only=True, map_location=location)
        want = torch.load(path, weights_only=True)
    else:
        want = torch.load(path, weights_only=True, map_location=location)
    got = list(_tensors_in(pytorch.load(path, map_location=location, flat=False)))
    want = list(_tensors_in(want))
    assert len(got) == len(want)
    sparse = [(k, g, w) for k, (g, w) in enumerate(zip(got, want)) if w.layout != torch.strided]
    assert len(sparse) >= 8
    for k, g, w in sparse:
        assert g.device.type == "meta", k
        assert (g.layout, g.shape, g.dtype) == (w.layout, w.shape, w.dtype), k
        if g.layout == torch.sparse_coo:
            assert g.is_coalesced() == w.is_coalesced(), k
            parts = [(g._indices(), w._indices()), (g._values(), w._values())]
        else:
            parts = [(g.values(), w.values())]
        assert all(a.shape == b.shape and a.dtype == b.dtype for a, b in parts), k


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_bad_sparse_indices_are_still_refused_off_meta(tmp_path):
    """Building unchecked is for "meta" only: a bad index loaded to the CPU, or to a
    device map that keeps it there, is a MalformedError naming the tensor."""
    bad = torch.sparse_coo_tensor(torch.tensor([[3]]), torch.tensor([1.0]), (2,),
                                  check_invariants=False)
    path = tmp_path / "bad.pt"
    torch.save({"adj": bad}, path)
    for location in (None, "cpu", {"cuda:0": "meta"}):
        with pytest.raises(tw.MalformedError, match="`adj`"):
            pytorch.load(str(path), map_location=location)
    assert pytorch.load(str(path), map_location="meta")["adj"].shape == (2,)


def _torch_checks_sparse_indices():
    """Whether this torch checks the index values of the sparse tensors
    ``torch.load(weights_only=True)`` loads (torch 2.15 does, 2.11 does not; tensorwire
    always does)."""
    bad = torch.sparse_coo_tensor(torch.tensor([[3]]), torch.tensor([1.0]), (2,),
                                  check_invariants=False)
    buf = io.BytesIO()
    torch.save(bad, buf)
    buf.seek(0)
    try:
        torch.load(buf, weights_only=True)
    except RuntimeError:
        return True
    return False


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("legacy", [False, True])
def test_parameters_and_requires_grad_are_torch_loads(tmp_path, legacy):
    """nn.Parameters come back as parameters (frozen ones too, and one object under
    two names), tensors saved requiring grad require it, on every load path."""
    w = torch.nn.Parameter(torch.randn(3, 4))
    state = {
        "w": w,
        "frozen": torch.nn.Parameter(torch.ones(2), requires_grad=False),
        "steps": torch.nn.Parameter(torch.arange(3), requires_grad=False),  # an int one
        "grad": torch.linspace(0, 1, 5).requires_grad_(),
        "plain": torch.zeros(2),
        "tied": w,
        "nested": [w, {"g": torch.ones(1, dtype=torch.float64).requires_grad_()}],
        "sparse": torch.nn.Parameter(torch.eye(3).to_sparse()),
        "frozen_csr": torch.nn.Parameter(torch.eye(3).to_sparse_csr(), requires_grad=False),
    }
    path = str(tmp_path / "autograd.pt")
    torch.save(state, path, _use_new_zipfile_serialization=not legacy)
    want = torch.load(path, weights_only=True)
    for kwargs in ({}, {"mmap": False}, {"map_location": "cpu"},
                   {"map_location": lambda storage, loc: storage}):
        got = pytorch.load(path, flat=False, **kwargs)
        compare_trees(got, want, _same_values, str(kwargs))
        assert got["tied"] is got["w"] and got["nested"][0] is got["w"], kwargs
        flat = pytorch.load(path, **kwargs)
        assert type(flat["w"]) is torch.nn.Parameter and flat["tied"] is flat["w"]
        assert flat["grad"].requires_grad and not flat["plain"].requires_grad
        assert flat["nested.1.g"].requires_grad


def _zip_checkpoint(path, pkl):
    """A ZIP checkpoint whose data.pkl is the pickle `pkl` (bytes), stored."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("ck/data.pkl", pkl)
        z.writestr("ck/version", "3\n")


def _pickle_checkpoint(path, obj, protocol=2):
    """A ZIP checkpoint holding `obj` (no tensors), pickled by Python's pickle, as
    torch would pickle it: protocol 2 unless told."""
    import pickle

    _zip_checkpoint(path, pickle.dumps(obj, protocol=protocol))


# Dict keys of every kind a checkpoint's pickle can hold, as Python writes them with
# str(): floats in both notations and at the edges of each, and strs inside tuples
# with quotes, backslashes and control characters, which repr escapes.
_KEYS = [
    0, -7, 2**63 - 1, 2**64 - 1, -(2**100), True, False, None,
    1j, -2.5j, complex(-0.0, 0.0), complex(1, float("nan")), complex(1e16, -1e-7),
    0.0, -0.0, 1.5, 0.1, 1e-4, 9.999e-5, 1e-5, 1.5e-7, 123456789.125, 1e15, 1e16,
    9999999999999998.0, 1.7976931348623157e308, 5e-324, float("inf"), float("-inf"),
    float("nan"),
    (), (1,), (1, 2), ("a", 0), ((1, 2), (3, (4,))), (None, True, 2.5),
    ("it's",), ('say "hi"',), ("both ' and \"",), ("back\\slash",), ("tab\tnl\nrc\r",),
    ("\x00\x1f\x7f\x85",), ("ünïcode ✓",), ("",),
    # Assigned characters Python does not print, in each escape width.
    ("\xa0\xad\u200b\u2028\ufeff\u3000\ue000",), ("\U000e0001\U0010fffd",),
]


def test_dict_keys_name_their_values_as_str_names_them(tmp_path):
    """A tensor-free dict under any key kind opens, each key as Python's str(key),
    so a tuple-keyed dict (an optimizer state keyed by (group, index)) does too."""
    path = tmp_path / "keys.pt"
    # One dict per key: Python's dicts merge equal keys (0, False, 0.0, -0.0).
    _pickle_checkpoint(path, {"meta": [{k: i} for i, k in enumerate(_KEYS)]})
    with tw.Reader(str(path)) as r:
        got = r.attributes["value"]["meta"]  # a root holding no tensor is one value
    assert got == [{str(k): i} for i, k in enumerate(_KEYS)]
    # flat=False (load_numpy needs no torch) keeps the keys themselves: tuples stay
    # tuples (a list key would not be hashable).
    nested = pytorch.load_numpy(path, flat=False)["meta"]
    assert [list(d.values()) for d in nested] == [[i] for i in range(len(_KEYS))]
    for d, want_key in zip(nested, _KEYS):
        (got_key,) = d
        assert type(got_key) is type(want_key)
        assert str(got_key) == str(want_key)


def test_hostile_tuple_keys_are_bounded(tmp_path):
    """A key of tuples nested past 32 levels, or a tuple holding one shared tuple
    enough times to write megabytes of text (gigabytes, with a few more levels), is a
    limit error, not a hang."""
    deep = 0
    for _ in range(40):
        deep = (deep,)
    path = tmp_path / "deep.pt"
    _pickle_checkpoint(path, {"meta": {deep: 1}})
    with pytest.raises(tw.LimitExceededError, match="tuple nesting"):
        tw.Reader(str(path))
    wide = ("x" * 100,)
    for _ in range(16):  # pickled once each (memo): 2**16 copies of the str, 6.5 MB
        wide = (wide, wide)
    path = tmp_path / "wide.pt"
    _pickle_checkpoint(path, {"meta": {wide: 1}})
    with pytest.raises(tw.LimitExceededError):
        tw.Reader(str(path))


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("legacy", [False, True])
def test_sizes_and_devices_load_as_torch_loads_them(tmp_path, legacy):
    """A saved torch.Size or torch.device (an input shape, the device a run trained
    on) is that class again from load(flat=False), as torch.load gives it, also as a
    dict key, and one object wherever the checkpoint references it again; load_numpy
    (no torch) gives a tuple and a str, the flat view a list and the device's text,
    and keys are named as str() writes them."""
    t = torch.arange(6.0).reshape(2, 3)
    shape, dev = t.shape, torch.device("cuda", 1)
    obj = {"w": t, "shape": shape, "dev": dev,
           "cpu": torch.device("cpu"), "more": [torch.Size([]), (torch.device("meta"),)],
           "by_key": {torch.Size([4]): t[0], (torch.device("cuda:0"), 2): "x"},
           "again": [shape, dev]}
    path = tmp_path / "sizes.pt"
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
    want = torch.load(path, weights_only=True)
    assert want["again"][0] is want["shape"] and want["again"][1] is want["dev"]
    for mmap in (True, False):
        got = pytorch.load(path, flat=False, mmap=mmap)
        compare_trees(got, want, _same_values)
        assert _identity_classes(got) == _identity_classes(want)
        assert got["again"][0] is got["shape"] and got["again"][1] is got["dev"]
    assert type(pytorch.load(path, flat=False)["more"][0]) is torch.Size
    assert list(pytorch.load(path)) == ["w", "by_key.torch.Size([4])"]
    nested = pytorch.load_numpy(path, flat=False)
    assert (nested["shape"], nested["dev"], nested["cpu"]) == ((2, 3), "cuda:1", "cpu")
    assert type(nested["shape"]) is tuple
    assert nested["more"] == [(), ("meta",)]
    assert list(nested["by_key"]) == [(4,), ("cuda:0", 2)]
    with tw.Reader(str(path)) as r:
        assert {k: r.attributes[k] for k in ("shape", "dev", "cpu", "more")} == {
            "shape": [2, 3], "dev": "cuda:1", "cpu": "cpu", "more": [[], ["meta"]]}
        assert r.attributes["by_key.(device(type='cuda', index=0), 2)"] == "x"


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_python_classes_pickled_as_values_are_those_classes(tmp_path):
    """An allowlisted class saved as a value (not called) is that class again from
    load(flat=False), as torch.load gives it; load_numpy and the flat view name it."""
    import collections

    obj = {"w": torch.ones(2), "kinds": [collections.OrderedDict, collections.Counter, set,
                                         bytearray, complex, torch.float16]}
    path = tmp_path / "classes.pt"
    torch.save(obj, path)
    want = torch.load(path, weights_only=True)
    got = pytorch.load(path, flat=False)
    assert got["kinds"] == want["kinds"] == obj["kinds"]
    assert pytorch.load_numpy(path, flat=False)["kinds"] == [
        "collections.OrderedDict", "collections.Counter", "builtins.set", "builtins.bytearray",
        "builtins.complex", "torch.float16"]


class _PickledDevice:
    """Pickles as ``torch.device(*args)`` without building one (torch would refuse
    some of these args)."""

    def __init__(self, *args):
        self.args = args

    def __reduce__(self):
        return (torch.device, self.args)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_devices_torch_does_not_know_are_typed_errors(tmp_path):
    """A device type of another torch build (a renamed private backend) reads as its
    text; load(flat=False), which must build a torch.device, fails with a typed error
    where this torch refuses the type. What torch can never read is malformed."""
    path = tmp_path / "metal.pt"
    _pickle_checkpoint(path, {"dev": _PickledDevice("metal", 1), "idx": _PickledDevice(3)})
    assert pytorch.load_numpy(path, flat=False) == {"dev": "metal:1", "idx": "cuda:3"}
    with pytest.raises(tw.UnsupportedError, match="metal:1"):
        pytorch.load(path, flat=False)
    for args in [("cuda", -1), ("cuda:0", 1), ("cuda:0", None), ("not a device",)]:
        _pickle_checkpoint(path, {"dev": _PickledDevice(*args)})
        with pytest.raises(tw.MalformedError):
            tw.Reader(str(path))
        with pytest.raises(Exception):
            torch.load(path, weights_only=True)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_tuple_keys_next_to_tensors_load_as_torch_loads_them(tmp_path):
    t = torch.arange(6.0).reshape(2, 3)
    obj = {(0, "w"): t, "state": {(1, 2): {"exp_avg": t * 2}, 1e-7: t[0]}, 3: [t]}
    path = tmp_path / "tuple_keys.pt"
    torch.save(obj, path)
    flat = pytorch.load(path)
    assert list(flat) == ["(0, 'w')", "state.(1, 2).exp_avg", "state.1e-07", "3.0"]
    want = torch.load(path, weights_only=True)
    for mmap in (True, False):
        compare_trees(pytorch.load(path, flat=False, mmap=mmap), want, _same_values)


def test_frozensets_and_bytearrays_keep_their_class(tmp_path):
    """A frozenset and a bytearray come back as themselves from flat=False, pickled
    by REDUCE (protocol 2, as torch.save) or by their own opcodes (FROZENSET,
    BYTEARRAY8: protocol 4 and 5); the flat view's metadata has lists and bytes."""
    obj = {"tags": frozenset({"a", "b"}), "raw": bytearray(b"\x00\xffab"),
           "plain": {1, 2}, "b": b"xy", "empty": (frozenset(), bytearray())}
    for protocol in (2, 4, 5):
        path = tmp_path / f"p{protocol}.pt"
        _pickle_checkpoint(path, obj, protocol)
        nested = pytorch.load_numpy(path, flat=False)
        assert nested == obj, protocol
        assert {k: type(v) for k, v in nested.items()} == {k: type(v) for k, v in obj.items()}
        assert [type(v) for v in nested["empty"]] == [frozenset, bytearray]
        with tw.Reader(str(path)) as r:
            value = r.attributes["value"]
        assert sorted(value["tags"]) == ["a", "b"] and value["raw"] == b"\x00\xffab", protocol


def test_frozenset_keys_in_a_state_dicts_attributes_stay_hashable(tmp_path):
    """A key of an OrderedDict attribute (a state dict's `_metadata`) that is a
    frozenset, or a tuple holding one, comes back as one, as torch.load gives it."""
    from collections import OrderedDict

    state = OrderedDict(step=3)
    state._metadata = {frozenset({1}): "a", (frozenset({2}), 0): "b"}
    path = tmp_path / "attrs.pt"
    _pickle_checkpoint(path, {"sd": state})
    got = pytorch.load_numpy(path, flat=False)["sd"]
    assert got == state and got._metadata == state._metadata


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_top_level_tuple_keys_count_against_the_text_budget(tmp_path):
    """Top-level str keys are shared, not copied; a top-level tuple key's text is
    new, so 2 000 keys each holding one memoized 60 kB str (a 60 kB file) cannot
    make 120 MB of names."""
    text = "a" * 60_000
    t = torch.zeros(1)
    path = tmp_path / "wide_names.pt"
    torch.save({(text, i): t for i in range(2_000)}, path)
    for load in (lambda: tw.Reader(str(path)), lambda: pytorch.load(path),
                 lambda: pytorch.load(path, flat=False)):
        with pytest.raises(tw.LimitExceededError, match="text copied"):
            load()


@pytest.mark.parametrize("pkl,what", [
    (b"\x80\x02}(X\x01\x00\x00\x00m}(]K\x01uu.", "dict key is a list"),         # {"m": {[]: 1}}
    (b"\x80\x02}(X\x01\x00\x00\x00m}(]\x85K\x01uu.", "dict key holds a list"),  # {"m": {([],): 1}}
    (b"\x80\x04}(X\x01\x00\x00\x00m\x8f(]\x85\x90u.", "set item holds a list"),  # {"m": {([],)}}
])
def test_keys_python_cannot_hash_are_malformed(tmp_path, pkl, what):
    """A mutable container as a dict key or set item, directly or inside a tuple:
    Python's unpickler fails on it (TypeError: unhashable type), and so does
    torch.load; every entry point gives a MalformedError naming it."""
    path = tmp_path / "unhashable.pt"
    _zip_checkpoint(path, pkl)
    for load in (lambda: tw.Reader(str(path)),
                 lambda: pytorch.load_numpy(path, flat=False)):
        with pytest.raises(tw.MalformedError, match=what):
            load()


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_storage_classes_named_as_values_are_storage_types(tmp_path):
    """torch.load(weights_only=True) puts a `StorageType` where a pickle names a
    legacy storage class as a value; flat=False gives the same (other classes, a
    tensor type or UntypedStorage, are themselves)."""
    pkl = (b"\x80\x02}(X\x01\x00\x00\x00actorch\nFloatStorage\nX\x01\x00\x00\x00b"
           b"ctorch.cuda\nHalfStorage\nX\x01\x00\x00\x00cctorch.storage\nUntypedStorage\n"
           b"X\x01\x00\x00\x00dctorch\nFloatTensor\nu.")
    path = tmp_path / "classes.pt"
    _zip_checkpoint(path, pkl)
    want = torch.load(path, weights_only=True)
    got = pytorch.load(path, flat=False)
    assert list(got) == list(want) == ["a", "b", "c", "d"]
    for k in "ab":
        assert type(got[k]) is type(want[k]) is torch.serialization.StorageType
        assert got[k].dtype == want[k].dtype
    assert got["c"] is want["c"] is torch.UntypedStorage
    assert got["d"] is want["d"] is torch.FloatTensor


def test_a_bytearray_pickled_once_is_one_object(tmp_path):
    """A bytearray the pickle references twice is one (mutable) object in both
    places, as pickle.loads and torch.load give it; equal bytearrays pickled apart
    stay apart."""
    import pickle

    shared = bytearray(b"ab")
    obj = {"a": shared, "b": [shared], "c": bytearray(b"ab")}
    for protocol in (2, 5):
        path = tmp_path / f"shared{protocol}.pt"
        _pickle_checkpoint(path, obj, protocol)
        want = pickle.loads(pickle.dumps(obj, protocol=protocol))
        got = pytorch.load_numpy(path, flat=False)
        assert got == want
        assert got["a"] is got["b"][0] and want["a"] is want["b"][0]
        assert got["c"] is not got["a"]


@pytest.mark.parametrize("name", ["meta_tensors.pt", "meta_tensors.legacy.pt", "meta.pt"])
def test_meta_tensors_have_no_data_and_are_listed_apart(name):
    """Tensors saved on torch's meta device: not among the keys (there are no bytes
    to read; asking for one says why), in load_numpy as MetaTensor at their places,
    one object for the names of one pickled tensor."""
    path = os.path.join(FIXTURES, name)
    with open(os.path.join(EXPECTED, name + ".json")) as f:
        want = json.load(f)
    meta = want["meta_tensors"]
    with tw.Reader(path) as r:
        assert r.keys() == [t["name"] for t in want["tensors"]]
        for m in meta:
            assert m["name"] not in r
            with pytest.raises(tw.UnsupportedError, match="meta device"):
                r.read_numpy(m["name"])
    tree = pytorch.load_numpy(path, flat=False)
    if name != "meta.pt":
        assert tree["tied"] is tree["w"] and tree["t"].stride == (1, 3)
        assert tree["nested"]["scalar"] == pytorch.MetaTensor("int64", (), (), False, False)
        np.testing.assert_array_equal(tree["nested"]["real"], [1, 1])
        assert tree["epoch"] == 3
    else:
        assert tree == {"w": pytorch.MetaTensor("float32", (2, 3), (3, 1), False, False)}


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("name", ["meta_tensors.pt", "meta_tensors.legacy.pt"])
def test_meta_tensors_load_as_torch_loads_them(name):
    """pytorch.load gives meta tensors as torch.load does, wherever map_location sends
    the storages: on "meta", with dtype, shape, strides, requires_grad, nn.Parameter,
    tied names as one object, at their places in the order; nested too."""
    import warnings

    path = os.path.join(FIXTURES, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex32 is "experimental"
        for kwargs in ({}, {"mmap": False}, {"map_location": "cpu"},
                       {"map_location": {"cpu": "meta"}},
                       {"map_location": lambda storage, loc: storage}):
            ref = torch.load(path, weights_only=True,
                             map_location=kwargs.get("map_location"))
            flat_ref = {k: v for k, v in ref.items() if isinstance(v, torch.Tensor)}
            got = pytorch.load(path, **kwargs)
            # The flat view: nested ones under dotted names, at their places.
            assert list(got) == ["w", "b", "tied", "t", "p", "frozen", "grad", "c32", "e8",
                                 "nested.scalar", "nested.empty", "nested.real"], kwargs
            assert got["tied"] is got["w"], kwargs
            for k, w in flat_ref.items():
                compare_trees(got[k], w, _same_values, f"{k} {kwargs}")
            compare_trees(pytorch.load(path, flat=False, **kwargs), ref, _same_values,
                          str(kwargs))
        tree = pytorch.load(path, flat=False)
        assert tree["tied"] is tree["w"]
        assert isinstance(tree["frozen"], torch.nn.Parameter) and not tree["frozen"].requires_grad
        assert tree["grad"].requires_grad and not isinstance(tree["grad"], torch.nn.Parameter)
        with open(path, "rb") as f:
            from_bytes = pytorch.load(f.read())
        assert from_bytes["w"].device.type == "meta" and from_bytes["tied"] is from_bytes["w"]


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_meta_tensors_of_dtypes_tensorwire_lacks_load_as_torch_loads_them(tmp_path):
    """A tensor without data may have any torch dtype, one tensorwire neither has nor
    holds too (uint4, bits8): torch.load reads such a file, and so does pytorch.load;
    load_numpy names the dtype."""
    names = [n for n in ("uint4", "int1", "bits8", "bits16") if hasattr(torch, n)]
    state = {n: torch.empty(2, 3, dtype=getattr(torch, n), device="meta") for n in names}
    state["real"] = torch.arange(3)
    path = tmp_path / "odd_meta.pt"
    torch.save(state, path)
    want = torch.load(path, weights_only=True)
    got = pytorch.load(str(path))
    assert list(got) == list(want)
    for n in names:
        assert (got[n].device.type, got[n].dtype, got[n].shape) == ("meta", want[n].dtype,
                                                                   want[n].shape), n
    assert torch.equal(got["real"], want["real"])
    arrays = pytorch.load_numpy(str(path))
    assert arrays[names[0]] == pytorch.MetaTensor(names[0], (2, 3), (3, 1), False, False)


LAZY_VIEWS = ["conj_neg.pt", "conj_neg.legacy.pt"]


@pytest.mark.parametrize("name", LAZY_VIEWS)
def test_lazy_conjugate_and_negative_views_read_as_their_values(name):
    """`z.conj()` and `w.conj().imag` saved as such (torch writes their stored
    elements and {'conj': True} / {'neg': True}): every read gives torch's values, as
    copies, and the attributes say which bits the tensor has."""
    path = os.path.join(FIXTURES, name)
    arrays = pytorch.load_numpy(path)
    z = arrays["z"]
    assert np.array_equal(arrays["conj"], np.conj(z), equal_nan=True)
    assert np.array_equal(arrays["conj_t"], np.conj(z).T, equal_nan=True)
    assert np.array_equal(arrays["conj_row"], np.conj(z[1]), equal_nan=True)
    assert arrays["imag"].tolist() == [1.0, -4.0, 8.0]  # -imag(conj(w)) = imag(w)
    assert arrays["neg_i8"].tolist() == [-128, 1, 0, -5, -127]  # wraps, as in torch
    assert arrays["neg_u8"].tolist() == [0, 255, 128, 1]
    assert arrays["both"].tolist() == [-1 - 1j, 2.5 + 4j]  # -(conj(x))
    with tw.Reader(path) as r:
        for n in ("conj", "imag", "both"):
            got = r.read_numpy(n)
            assert np.array_equal(got, arrays[n], equal_nan=True)
            assert not np.shares_memory(got, r.read_numpy("z")), n
        assert dict(r.metadata("z").attributes) == {}
        assert dict(r.metadata("conj").attributes) == {"torch.is_conj": True}
        assert dict(r.metadata("imag").attributes) == {"torch.is_neg": True}
        assert dict(r.metadata("both").attributes) == {"torch.is_conj": True,
                                                       "torch.is_neg": True}
        assert r.metadata("conj").components["data"]["encoding"] == "conj"
        assert r.metadata("z").components["data"]["encoding"] == "raw"
        assert set(r._pytorch_partial_storages()) >= {"conj", "imag", "neg_i8", "both"}


def _same_value_bits(got, want):
    """Whether two tensors hold the same values bit for bit (NaN payloads and signs
    of zero included), whatever lazy bits either has."""
    a, b = (t.detach().resolve_conj().resolve_neg() for t in (got, want))
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    return a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8),
                                              b.contiguous().view(torch.uint8))


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("name", LAZY_VIEWS)
@pytest.mark.parametrize("kwargs", [{}, {"mmap": False}, {"map_location": "cpu"},
                                    {"map_location": lambda storage, loc: storage},
                                    {"flat": False}])
def test_lazy_views_load_with_torchs_bits_on_the_stored_elements(name, kwargs):
    """pytorch.load gives what torch.load gives: the conjugate and negative bits set
    over the stored elements (so `conj` shares `z`'s storage, as in torch), the
    values, strides, offsets and the nn.Parameter."""
    path = os.path.join(FIXTURES, name)
    want = torch.load(path, weights_only=True)
    got = pytorch.load(path, **kwargs)
    assert list(got) == list(want)
    for n, w in want.items():
        g = got[n]
        assert (g.is_conj(), g.is_neg()) == (w.is_conj(), w.is_neg()), n
        assert (g.dtype, g.shape, g.stride(), g.storage_offset()) == (
            w.dtype, w.shape, w.stride(), w.storage_offset()), n
        assert type(g) is type(w) and g.requires_grad == w.requires_grad, n
        assert _same_value_bits(g, w), n
    assert got["conj"].is_conj() and got["imag"].is_neg()
    for n in ("conj", "conj_t", "conj_row"):
        assert got[n].untyped_storage().data_ptr() == got["z"].untyped_storage().data_ptr(), n
    # torch's bits, so torch's own conj() of it is the stored elements again.
    back = got["conj"].conj()
    assert not back.is_conj() and back.data_ptr() == got["z"].data_ptr()
    # read_torch gives the values (a copy: a torch tensor of the format's reader has
    # no bits to set).
    with tw.Reader(path) as r:
        t = r.read_torch("conj")
        assert not t.is_conj() and _same_value_bits(t, want["conj"])


def _one_entry_checkpoint(path, key_op, value_op):
    """A ZIP checkpoint {key: value} whose key and value are the pickle opcodes
    given (no tensors)."""
    _zip_checkpoint(path, b"\x80\x02}" + key_op + value_op + b"s.")


def _short_binstring(data):
    return b"U" + bytes([len(data)]) + data


def test_python2_byte_strings_decode_as_utf8_as_torch_load_does(tmp_path):
    """Python 2 `str` (SHORT_BINSTRING, BINSTRING, STRING): torch.load decodes them as
    UTF-8 (its default encoding); bytes that are not UTF-8 as latin-1, as
    `torch.load(f, encoding="latin1")` gives them."""
    import struct

    path = tmp_path / "py2.pt"
    cafe = "café".encode()
    for value_op in (_short_binstring(cafe), b"T" + struct.pack("<i", len(cafe)) + cafe,
                     b"S'caf\\xc3\\xa9'\n"):
        _one_entry_checkpoint(path, _short_binstring(b"name"), value_op)
        assert pytorch.load_numpy(str(path), flat=False) == {"name": "café"}, value_op
        if torch is not None and value_op[:1] == b"U":  # weights_only reads only U
            assert torch.load(path, weights_only=True) == {"name": "café"}
    _one_entry_checkpoint(path, _short_binstring(b"name"), _short_binstring(b"caf\xe9"))
    assert pytorch.load_numpy(str(path), flat=False) == {"name": "café"}
    if torch is not None:
        with pytest.raises(UnicodeDecodeError):
            torch.load(path, weights_only=True)
        # A self-made file, with no globals: safe to unpickle.
        assert torch.load(path, weights_only=False, encoding="latin1") == {"name": "café"}


def test_integers_of_any_width_read_up_to_2040_bits(tmp_path):
    """Protocol 0/1 write ints as text (`I`, `L`): they are values of any width, as
    LONG1's are, up to the 2040 bits LONG1 holds (all torch.load(weights_only=True)
    reads: it refuses LONG4); wider ones are Unsupported."""
    path = tmp_path / "seed.pt"
    for value in (2**64 + 1, -(2**70), 2**127 - 1, -(2**127), 2**127, -(2**127) - 1,
                  2**200, -(3**1000), 2**2038, -(2**2039)):
        for line in (b"L%dL\n" % value, b"I%d\n" % value):
            _one_entry_checkpoint(path, _short_binstring(b"seed"), line)
            assert pytorch.load_numpy(str(path), flat=False) == {"seed": value}
            with tw.Reader(str(path)) as r:  # a root holding no tensor is one value
                assert r.attributes["value"] == {"seed": value}
            if torch is not None:
                assert pytorch.load(str(path), flat=False) == {"seed": value}
    for text in (b"%d" % 2**2039, b"-1" + b"0" * 614, b"1" * 5000):
        _one_entry_checkpoint(path, _short_binstring(b"seed"), b"I" + text + b"\n")
        with pytest.raises(tw.UnsupportedError, match="2040 bits"):
            pytorch.load_numpy(str(path))
    # LONG1 at its widest reads; LONG4 (which torch's weights_only unpickler does not
    # read) the same way up to the limit.
    for value, ok in ((2**2038, True), (-(2**2039), True), (2**2039, False)):
        raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
        for op in (b"\x8a" + bytes([len(raw)]) if len(raw) < 256 else None,
                   b"\x8b" + len(raw).to_bytes(4, "little")):
            if op is None:
                continue
            _one_entry_checkpoint(path, _short_binstring(b"seed"), op + raw)
            if ok:
                assert pytorch.load_numpy(str(path), flat=False) == {"seed": value}
                if torch is not None and op[0] == 0x8a:
                    assert pytorch.load(str(path), flat=False) == torch.load(
                        path, weights_only=True)
            else:
                with pytest.raises(tw.UnsupportedError, match="2040 bits"):
                    pytorch.load_numpy(str(path))


def test_python2_builtins_are_refused_by_their_python3_names(tmp_path):
    """Protocol 2 names `range` and `int` `__builtin__.xrange` and `__builtin__.long`
    (Python's fix_imports): the refusal names what Python 3 and torch resolve them
    to."""
    path = tmp_path / "py2_global.pt"
    for raw, resolved in [("xrange", "builtins.range"), ("long", "builtins.int"),
                          ("reduce", "functools.reduce"), ("unicode", "builtins.str")]:
        _one_entry_checkpoint(path, _short_binstring(b"v"),
                              b"c__builtin__\n" + raw.encode() + b"\n")
        with pytest.raises(tw.UnsafePickleError, match=f"`{resolved}`"):
            pytorch.load_numpy(str(path))
    if torch is not None:
        torch.save({"v": range(3)}, path)
        with pytest.raises(tw.UnsafePickleError, match="`builtins.range`"):
            pytorch.load(str(path))
