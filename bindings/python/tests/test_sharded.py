"""Checkpoints split over several files by huggingface_hub (fixtures/sharded), opened
through their index as one Reader; and, when the packages are installed, the same
tensors as safetensors and torch load from the shards."""

import hashlib
import json
import os
import shutil

import numpy as np
import pytest

import tensorwire
from conftest import REPO

SHARDED = os.path.join(REPO, "fixtures", "sharded")
INDEXES = {
    "safetensors": "model.safetensors.index.json",
    "pytorch": "pytorch_model.bin.index.json",
}


def _expected():
    with open(os.path.join(SHARDED, "expected.json")) as f:
        return json.load(f)


def _index(flavor):
    return os.path.join(SHARDED, flavor, INDEXES[flavor])


@pytest.mark.parametrize("flavor", sorted(INDEXES))
def test_an_index_reads_as_one_checkpoint(flavor):
    exp = _expected()
    with tensorwire.open(_index(flavor)) as r:
        assert r.format == "sharded"
        assert sorted(r.keys()) == sorted(exp["tensors"])
        # The index's metadata, and what every shard's says alike (transformers
        # writes `format: pt` into each safetensors shard).
        shared = {"format": "pt"} if flavor == "safetensors" else {}
        assert r.attributes == {**exp["metadata"], **shared}
        for name, t in exp["tensors"].items():
            meta = r.metadata(name)
            assert meta.shape == t["shape"], name
            arr = r.read_numpy(name)
            assert hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest() == t["sha256"], name
        everything = r.read_numpy(r.keys())
        assert sorted(everything) == sorted(exp["tensors"])
        # Copies and reads into a caller's buffer go through the shards too.
        copied = r.read_numpy("embed.weight", copy=True)
        assert copied.flags.owndata or not isinstance(copied.base, tensorwire.BytesOwner)
        np.testing.assert_array_equal(copied, everything["embed.weight"])
        dst = np.zeros((1, 6), dtype=np.int64)
        r.read_into("position_ids", dst)
        np.testing.assert_array_equal(dst, np.arange(6).reshape(1, 6))
    # Arrays keep their shard's map alive after the reader is closed.
    r = tensorwire.open(_index(flavor))
    embed = r["embed.weight"]
    del r
    assert embed.shape == (10, 4) and embed.dtype == np.float32
    if flavor == "safetensors":
        assert isinstance(embed.base, tensorwire.BytesOwner)


def test_convert_merges_the_shards(tmp_path):
    dst = str(tmp_path / "merged.safetensors")
    tensorwire.convert(_index("safetensors"), dst)
    with tensorwire.open(dst) as merged, tensorwire.open(_index("pytorch")) as sharded:
        assert sorted(merged.keys()) == sorted(sharded.keys())
        for name in sharded.keys():
            np.testing.assert_array_equal(merged.read_numpy(name), sharded.read_numpy(name))


def test_a_broken_index_is_refused_with_the_file_named(tmp_path):
    for name in os.listdir(os.path.join(SHARDED, "safetensors")):
        shutil.copy(os.path.join(SHARDED, "safetensors", name), tmp_path / name)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"step": "model-00001-of-00003.safetensors"}}))
    with pytest.raises(tensorwire.MalformedError, match="has no such tensor"):
        tensorwire.open(str(index))
    index.write_text(json.dumps({"weight_map": {"step": "../elsewhere.safetensors"}}))
    with pytest.raises(tensorwire.MalformedError, match="not a file name"):
        tensorwire.open(str(index))
    index.write_text(json.dumps({"weight_map": {"step": "missing.safetensors"}}))
    with pytest.raises(OSError, match="missing.safetensors"):
        tensorwire.open(str(index))


def test_the_packages_read_the_same_tensors():
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    exp = _expected()
    with tensorwire.open(_index("safetensors")) as r:
        for name, t in exp["tensors"].items():
            shard = os.path.join(SHARDED, "safetensors", t["shard"]["safetensors"])
            want = st.load_file(shard)[name]
            assert torch.equal(r.read_torch(name), want), name
    with tensorwire.open(_index("pytorch")) as r:
        for name, t in exp["tensors"].items():
            shard = os.path.join(SHARDED, "pytorch", t["shard"]["pytorch"])
            want = torch.load(shard, weights_only=True)[name]
            assert torch.equal(r.read_torch(name), want), name


GGUF_SPLIT = os.path.join(REPO, "fixtures", "gguf", "split")


def test_the_first_gguf_split_opens_the_whole_model():
    first = os.path.join(GGUF_SPLIT, "model-00001-of-00003.gguf")
    with tensorwire.open(first) as r:
        assert r.format == "sharded"
        assert len(r) == 5
        assert r.attributes["general.name"] == "split-test"
        assert not any(k.startswith("split.") for k in r.attributes)
        for i in (1, 2, 3):
            with open(os.path.join(GGUF_SPLIT, f"model-0000{i}-of-00003.expected.json")) as f:
                exp = json.load(f)
            for t in exp["tensors"]:
                arr = r.read_numpy(t["name"])
                assert list(arr.shape) == t["shape"], t["name"]
                assert hashlib.sha256(arr.tobytes()).hexdigest() == t["sha256"], t["name"]
    # Another split alone is the one file it is.
    with tensorwire.open(os.path.join(GGUF_SPLIT, "model-00002-of-00003.gguf")) as r:
        assert r.format == "gguf" and len(r) == 2


def test_gguf_splits_match_the_package_reader():
    gguf = pytest.importorskip("gguf")
    with tensorwire.open(os.path.join(GGUF_SPLIT, "model-00001-of-00003.gguf")) as r:
        for i in (1, 2, 3):
            for t in gguf.GGUFReader(os.path.join(GGUF_SPLIT, f"model-0000{i}-of-00003.gguf")).tensors:
                np.testing.assert_array_equal(r.read_numpy(t.name), t.data)


def test_read_into_an_array_that_views_the_same_bytes():
    # dst is the reader's own zero-copy (private copy-on-write) view of the tensor.
    with tensorwire.open(_index("safetensors")) as r:
        view = r.read_numpy("embed.weight")
        want = view.copy()
        r.read_into("embed.weight", view)
        np.testing.assert_array_equal(view, want)


@pytest.mark.parametrize("shape", [(), (2,), (2, 3)])
def test_a_layout_named_like_a_torch_only_dtype_over_other_elements_is_unsupported(
        tmp_path, shape):
    """A .zt object a user labelled `pytorch:complex32` is no checkpoint's complex32
    (its elements are not float16 pairs): reading it through an index is a typed
    error, as for any layout tensorwire does not read (it once panicked)."""
    w = tensorwire.Writer(str(tmp_path / "a.zt"))
    w._write_components("x", {"data": np.zeros(shape, np.float16)}, [],
                        format="pytorch:complex32")
    w.finish()
    with open(tmp_path / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {}, "weight_map": {"x": "a.zt"}}, f)
    r = tensorwire.Reader(str(tmp_path / "model.safetensors.index.json"))
    assert r._dtype_and_shape("x")[0] == "f16"  # not taken for a complex32
    with pytest.raises(tensorwire.UnsupportedError, match="pytorch:complex32"):
        r.read_numpy("x")
    pytest.importorskip("torch")
    with pytest.raises(tensorwire.UnsupportedError, match="pytorch:complex32"):
        r.read_torch("x")


def test_convert_refuses_to_overwrite_its_source_or_a_shard(tmp_path):
    """As the CLI: the destination may not be the file converted, nor one of the
    shards an index reads (the set would lose it)."""
    folder = tmp_path / "set"
    shutil.copytree(os.path.join(SHARDED, "safetensors"), folder)
    index = str(folder / INDEXES["safetensors"])
    shard = folder / "model-00002-of-00003.safetensors"
    before = shard.read_bytes()
    with pytest.raises(tensorwire.InvalidArgumentError, match="refusing to overwrite the source"):
        tensorwire.convert(index, str(shard), format="zt")
    assert shard.read_bytes() == before
    with pytest.raises(tensorwire.InvalidArgumentError, match="are the same file"):
        tensorwire.convert(str(shard), str(shard))
    assert shard.read_bytes() == before
    assert tensorwire.convert(index, str(tmp_path / "merged.zt")) > 0
