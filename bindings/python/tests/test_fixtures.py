"""The conformance fixtures written by the real ztensor (fixtures/zt): every object,
component, dtype, attribute and byte must come out as the .expected.json says."""

import glob
import json
import os

import numpy as np
import pytest

import tensorwire as tw
from conftest import REPO

FIXTURES = os.path.join(REPO, "fixtures", "zt")
if not os.path.isdir(FIXTURES):
    pytest.skip("fixtures/zt is missing", allow_module_level=True)

CASES = sorted(glob.glob(os.path.join(FIXTURES, "*.expected.json")))
NUMPY_NAMES = {
    "f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
    "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8",
    "u64": "uint64", "u32": "uint32", "u16": "uint16", "u8": "uint8", "bool": "bool",
}
NEEDS_ML = {"bf16", "f8_e4m3fn", "f8_e5m2", "f8_e4m3fnuz", "f8_e5m2fnuz"}


def strict_equal(a, b):
    """== that also tells bool from int from float, recursively."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(strict_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(strict_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


def _have_ml_dtypes():
    try:
        import ml_dtypes  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.parametrize("expected_path", CASES, ids=lambda p: os.path.basename(p).split(".")[0])
@pytest.mark.parametrize("copy", [False, True])
def test_fixture(expected_path, copy):
    expected = json.load(open(expected_path, encoding="utf-8"))
    zt_path = expected_path.replace(".expected.json", ".zt")
    with tw.Reader(zt_path) as r:
        assert r.format == ("zt" if expected["magic"] == "ZTEN1000" else "zt-0.1")
        assert sorted(r.keys()) == sorted(expected["objects"])
        for name, obj in expected["objects"].items():
            meta = r.metadata(name)
            assert meta.format == obj["format"], name
            assert meta.shape == obj["shape"], name
            assert meta.dtype == NUMPY_NAMES[obj["dtype"]], name
            assert meta.type == obj["type"], name
            assert strict_equal(meta.attributes, obj["attributes"]), name
            assert list(meta.components) == sorted(obj["components"]), name
            logical = obj["type"] or obj["dtype"]
            if logical in NEEDS_ML and not _have_ml_dtypes():
                continue
            t = r.read(name, copy=copy)
            for role, comp in obj["components"].items():
                m = meta.components[role]
                assert m["dtype"] == NUMPY_NAMES[comp["dtype"]], (name, role)
                assert m["encoding"] == comp["encoding"], (name, role)
                assert m["digest"] == comp["digest"], (name, role)
                arr = t.components[role]
                assert arr.tobytes() == bytes.fromhex(comp["hex"]), (name, role)
            if obj["format"] == "dense":
                arr = r.read_numpy(name, copy=copy)
                assert list(arr.shape) == obj["shape"], name
                assert arr.tobytes() == bytes.fromhex(obj["components"]["data"]["hex"]), name
                dst = np.empty_like(arr)
                r.read_into(name, dst)
                assert dst.tobytes() == arr.tobytes()
        assert r.verify() == sum(
            1 for o in expected["objects"].values() for c in o["components"].values() if c["digest"])


def test_logical_values():
    pytest.importorskip("ml_dtypes")
    expected = json.load(open(os.path.join(FIXTURES, "logical.expected.json")))
    with tw.Reader(os.path.join(FIXTURES, "logical.zt")) as r:
        for name, values in expected["logical_values"].items():
            arr = r[name]
            flat = arr.reshape(-1)
            if arr.dtype.kind == "c":
                want = np.array([complex(re, im) for re, im in
                                 (v if isinstance(v, list) else [v, 0] for v in values)])
                np.testing.assert_array_equal(flat.astype(np.complex128), want.reshape(-1))
            else:
                want = np.array([float(v) for v in values])
                np.testing.assert_array_equal(flat.astype(np.float64), want)
