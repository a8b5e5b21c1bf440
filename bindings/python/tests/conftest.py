import os

import numpy as np
import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

# name -> numpy dtype (or a callable returning it, for ml_dtypes types)
PLAIN_DTYPES = [
    "float64", "float32", "float16", "int64", "int32", "int16", "int8",
    "uint64", "uint32", "uint16", "uint8", "bool", "complex64", "complex128",
]
ML_DTYPES = ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"]


def np_dtype(name):
    if name in ML_DTYPES:
        ml = pytest.importorskip("ml_dtypes")
        return np.dtype(getattr(ml, name))
    return np.dtype(name)


def sample(dtype, shape, seed=0):
    """Deterministic sample data of any supported dtype."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    if dtype == np.bool_:
        return (rng.integers(0, 2, n) == 1).reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True).reshape(shape)
    if dtype.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype).reshape(shape)
    return rng.uniform(-4, 4, n).astype(np.float32).astype(dtype).reshape(shape)


@pytest.fixture
def zt_path(tmp_path):
    return str(tmp_path / "t.zt")
