#!/usr/bin/env python3
"""Side-by-side shared-memory benchmark: put and get (hit) of float32 arrays (4 KiB,
1 MiB, 64 MiB) with tensorwire's TensorCache and SharedTensor and tenso 0.24's
TensoCache and TensoShm, in one run.

    python benches/python/bench_cache.py [--reps 41] [--json out.json]

Each cell is the median of --reps timed runs after one warm-up. ``put`` stores the
same key again each run (so both caches may reuse the entry's block); ``get`` reads a
key that is there. The floors: "memcpy" is one ``np.copyto`` of the array into a
buffer of the same size that is already written (so no page faults are timed), and
"view" is ``np.frombuffer`` over that buffer (the zero-copy floor of a get).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np

import tensorwire
from tensorwire.cache import TensorCache
from tensorwire.shm import SharedTensor

from bench_packet import timed  # median of reps after a warm-up, GC off

try:
    import tenso
    from tenso import TensoCache, TensoShm
except ImportError:  # pragma: no cover
    tenso = None

SIZES = [("4 KiB", 4 << 10), ("1 MiB", 1 << 20), ("64 MiB", 64 << 20)]


def fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} µs"
    return f"{seconds * 1e3:.2f} ms"


def bench_size(label: str, nbytes: int, reps: int) -> dict:
    arr = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)
    dst = np.empty_like(arr)
    dst[...] = 1.0
    raw = dst.view(np.uint8)
    row = {
        "memcpy": timed(lambda: np.copyto(dst, arr), reps),
        "view": timed(lambda: np.frombuffer(raw, dtype=np.float32), reps),
    }
    pool = max(8 << 20, nbytes * 3)

    with TensorCache(pool) as cache:
        row["tw cache put"] = timed(lambda: cache.put("k", arr), reps)
        row["tw cache get"] = timed(lambda: cache.get("k"), reps)
        assert np.array_equal(cache.get("k"), arr)

    name = f"twbench_{label.replace(' ', '')}"
    with SharedTensor.create_from(name, arr) as shm:
        row["tw shm put"] = timed(lambda: shm.put(arr), reps)
        row["tw shm get"] = timed(lambda: shm.get(), reps)
        assert np.array_equal(shm.get(), arr)
        shm.unlink()

    if tenso is not None:
        with TensoCache(pool) as cache:
            row["tenso cache put"] = timed(lambda: cache.put("k", arr), reps)
            row["tenso cache get"] = timed(lambda: cache.get("k"), reps)
            assert np.array_equal(cache.get("k"), arr)
        tname = f"tensobench_{label.replace(' ', '')}"
        shm = TensoShm.create_from(tname, arr)
        try:
            row["tenso shm put"] = timed(lambda: shm.put(arr), reps)
            row["tenso shm get"] = timed(lambda: shm.get(), reps)
        finally:
            shm.close()
            shm.unlink()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=41)
    ap.add_argument("--json", help="also write the results as JSON")
    args = ap.parse_args()

    results = {label: bench_size(label, n, args.reps) for label, n in SIZES}
    cols = ["memcpy", "view", "tw cache put", "tw cache get", "tw shm put", "tw shm get",
            "tenso cache put", "tenso cache get", "tenso shm put", "tenso shm get"]
    print(f"# shm/cache benchmark — median of {args.reps}, {platform.machine()}, "
          f"python {sys.version.split()[0]}, numpy {np.__version__}, tensorwire "
          f"{tensorwire.__version__}, tenso {getattr(tenso, '__version__', 'absent')}\n")
    print("| operation | " + " | ".join(label for label, _ in SIZES) + " |")
    print("| --- |" + " --- |" * len(SIZES))
    for col in cols:
        cells = [fmt(results[label][col]) if col in results[label] else "—" for label, _ in SIZES]
        print(f"| {col} | " + " | ".join(cells) + " |")
    print()
    print("| ratio | " + " | ".join(label for label, _ in SIZES) + " |")
    print("| --- |" + " --- |" * len(SIZES))
    ratios = [
        ("tw cache put / memcpy", "tw cache put", "memcpy"),
        ("tw shm put / memcpy", "tw shm put", "memcpy"),
        ("tenso cache put / tw cache put", "tenso cache put", "tw cache put"),
        ("tenso cache get / tw cache get", "tenso cache get", "tw cache get"),
        ("tenso shm get / tw shm get", "tenso shm get", "tw shm get"),
    ]
    for name, num, den in ratios:
        cells = []
        for label, _ in SIZES:
            r = results[label]
            cells.append(f"{r[num] / r[den]:.2f}×" if num in r and den in r else "—")
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
