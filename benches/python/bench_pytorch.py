#!/usr/bin/env python3
"""PyTorch checkpoints side by side: tensorwire vs torch.load vs ztensor 1.2.3, against
the numpy floor, on the ~500 MiB transformer-shaped state dict of make_checkpoint.py
saved by torch in the ZIP and the legacy format.

    python benches/python/bench_pytorch.py [--data bench-data] [--reps 9] [--rounds 3] [--layers 13]

Needs torch, numpy, tensorwire (maturin develop) and optionally ztensor==1.2.3. Writes
bench-data/model.pt and model.legacy.pt when missing. Every timed run opens the file
inside the timed region and returns {name: array or tensor}; the median of --reps runs
(page cache warm) is reported, the runs taken in --rounds rounds that visit every row
in turn (timing.py). Before timing, every method's result is checked equal to the
floor's arrays.

Floors: "zero-copy" = mmap the file and np.frombuffer each storage at its offset (the
offsets are taken from the ZIP directory outside the timed region: the floor parses
nothing); "copy" = the same plus .copy(). A reference row adds what no ZIP reader can skip:
reading each record's local header (through the map) to find where its data starts.
"""

from __future__ import annotations

import argparse
import mmap
import os
import struct
import sys
import zipfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from bench_packet import fmt  # µs below 1 ms, else ms  # noqa: E402
from timing import medians_ms  # noqa: E402
from make_checkpoint import make_tensors  # noqa: E402
from zip_local import data_start  # noqa: E402


def write_checkpoints(data: str, layers: int, vocab: int) -> tuple[str, str]:
    import torch

    zip_path = os.path.join(data, "model.pt")
    legacy_path = os.path.join(data, "model.legacy.pt")
    if not (os.path.exists(zip_path) and os.path.exists(legacy_path)):
        os.makedirs(data, exist_ok=True)
        sd = {k: torch.from_numpy(v) for k, v in make_tensors(layers, vocab, seed=0).items()}
        torch.save(sd, zip_path)
        torch.save(sd, legacy_path, _use_new_zipfile_serialization=False)
    return zip_path, legacy_path


def zip_floor_offsets(path: str, state=None):
    """(name, data offset, numpy dtype, shape) per tensor of a torch ZIP written from
    contiguous tensors (`state`, loaded from `path` when not given), each its own
    storage record `data/<i>` in order, with the offsets read from the local headers
    here. The numpy dtype holds the tensor's bytes: float32 as it is, bfloat16 as
    uint16, the one-byte types as uint8."""
    import torch

    if state is None:
        state = torch.load(path, mmap=True, weights_only=True)
    z = zipfile.ZipFile(path)
    by_key = {i.filename.rsplit("/", 1)[1]: i for i in z.infolist() if "/data/" in i.filename}
    out = []
    with open(path, "rb") as f:
        for i, (name, t) in enumerate(state.items()):
            info = by_key[str(i)]
            f.seek(info.header_offset + 26)
            n, e = struct.unpack("<HH", f.read(4))
            dt = {4: np.float32, 2: np.uint16, 1: np.uint8}[t.element_size()]
            out.append((name, info.header_offset + 30 + n + e, dt, tuple(t.shape)))
    return out


def floor_methods(path: str, entries):
    # Element counts computed here, outside the timed region: the floor does nothing
    # per tensor but one frombuffer and one reshape.
    plan = [(n, off, dt, int(np.prod(s)), s) for n, off, dt, s in entries]

    def zc():
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return {n: np.frombuffer(m, dt, count, off).reshape(s) for n, off, dt, count, s in plan}

    def cp():
        return {k: v.copy() for k, v in zc().items()}

    return zc, cp


def zip_header_floor(path: str, entries):
    """The floor plus the one read a ZIP reader cannot skip: each record's data starts
    where its local header says (the name and extra-field lengths at byte 26), so a
    correct reader looks there even when it knows the central directory. Header
    offsets are taken outside the timed region, as the floor's data offsets are;
    the headers are read through the map (page faults, no system call each)."""
    z = zipfile.ZipFile(path)
    by_key = {i.filename.rsplit("/", 1)[1]: i.header_offset for i in z.infolist() if "/data/" in i.filename}
    plan = [(n, by_key[str(i)], dt, int(np.prod(s)), s) for i, (n, _, dt, s) in enumerate(entries)]

    def zh():
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return {n: np.frombuffer(m, dt, count, data_start(m, head)).reshape(s)
                for n, head, dt, count, s in plan}

    return zh


def to_np(x):
    if hasattr(x, "numpy"):
        return x.numpy()
    return np.asarray(x)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="bench-data")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=3, help="rounds the reps are split into (see timing.py)")
    ap.add_argument("--layers", type=int, default=13)
    ap.add_argument("--vocab", type=int, default=32000)
    args = ap.parse_args(argv)

    import torch
    import tensorwire as tw

    try:
        import ztensor
    except ImportError:
        ztensor = None

    zip_path, legacy_path = write_checkpoints(args.data, args.layers, args.vocab)
    for p in (zip_path, legacy_path):
        with open(p, "rb") as f:  # warm the page cache
            while f.read(1 << 24):
                pass
    only = os.environ.get("BENCH_ONLY")
    entries = zip_floor_offsets(zip_path)
    floor_zc, floor_cp = floor_methods(zip_path, entries)
    ref = floor_zc()
    floor_headers = zip_header_floor(zip_path, entries)

    def tw_numpy(path, copy):
        def run():
            r = tw.Reader(path)
            return {k: r.read_numpy(k, copy=copy) for k in r.keys()}
        return run

    def tw_torch(path, copy):
        def run():
            r = tw.Reader(path)
            return {k: r.read_torch(k, copy=copy) for k in r.keys()}
        return run

    def torch_load(path, mmap_mode, map_location=None):
        def run():
            return torch.load(path, weights_only=True, mmap=mmap_mode, map_location=map_location)
        return run

    def keep_storage(storage, location):
        return storage

    def zt_numpy(path):
        def run():
            r = ztensor.Reader(path)
            return {k: r.read_numpy(k) for k in r.keys()}
        return run

    def tw_one_legacy():
        r = tw.Reader(legacy_path)
        name = r.keys()[-2]
        return {name: r.read_numpy(name)}

    rows = [
        ("zip", "numpy floor: mmap + frombuffer", floor_zc, "zc"),
        ("zip", "numpy floor: + .copy()", floor_cp, "cp"),
        ("zip", "reference: floor + each local header read from the map", floor_headers, "zc"),
        ("zip", "tensorwire read_numpy(k)", tw_numpy(zip_path, False), "zc"),
        ("zip", "tensorwire.pytorch.load_numpy (one call)", lambda: tw.pytorch.load_numpy(zip_path), "zc"),
        ("zip", "tensorwire read_numpy(k, copy=True)", tw_numpy(zip_path, True), "cp"),
        ("zip", "tensorwire read_torch(k)", tw_torch(zip_path, False), "zc"),
        ("zip", "tensorwire read_torch(k, copy=True)", tw_torch(zip_path, True), "cp"),
        ("zip", "torch.load(weights_only=True)", torch_load(zip_path, False), "cp"),
        ("zip", "tensorwire.pytorch.load", lambda: tw.pytorch.load(zip_path), "zc"),
        ("zip", "tensorwire.pytorch.load(flat=False)", lambda: tw.pytorch.load(zip_path, flat=False), "zc"),
        ("zip", "torch.load(weights_only=True, mmap=True)", torch_load(zip_path, True), "zc"),
        *([("zip", "ztensor 1.2.3 read_numpy(k)", zt_numpy(zip_path), "zc")]
          if ztensor is not None else []),
        # The `map_location=lambda storage, loc: storage` idiom: each storage is handed
        # to a function, and each tensor set on what it returns.
        ("zip", "tensorwire.pytorch.load(map_location=fn)",
         lambda: tw.pytorch.load(zip_path, map_location=keep_storage), "zc"),
        ("zip", "torch.load(weights_only=True, mmap=True, map_location=fn)",
         torch_load(zip_path, True, keep_storage), "zc"),
        # Legacy storages sit at unaligned offsets: numpy gets unaligned zero-copy
        # views, torch (which needs aligned data) copies. No floor reads this file.
        ("legacy", "tensorwire read_numpy(k) (unaligned zero-copy views)", tw_numpy(legacy_path, False), None),
        ("legacy", "tensorwire read_torch(k) (copies: unaligned storages)", tw_torch(legacy_path, False), "cp"),
        ("legacy", "tensorwire.pytorch.load(mmap=False)", lambda: tw.pytorch.load(legacy_path, mmap=False), "cp"),
        ("legacy", "torch.load(weights_only=True)", torch_load(legacy_path, False), "cp"),
        ("legacy", "tensorwire: open + read one 6 MiB tensor", tw_one_legacy, None),
    ]

    if only:  # e.g. BENCH_ONLY=zip: only rows of that file (floors included)
        rows = [r for r in rows if r[0] == only]
    # Every method returns the floor's arrays.
    for _, label, fn, _ in rows:
        got = fn()
        for k, v in got.items():
            assert np.array_equal(to_np(v), ref[k]), (label, k)
        del got

    print(f"# PyTorch checkpoint read, {len(entries)} float32 tensors, "
          f"{os.path.getsize(zip_path) / 2**20:.0f} MiB; torch {torch.__version__}; "
          f"median of {args.reps}\n")
    print("| file | method | time | vs floor (same kind) | vs floor + headers |")
    print("| --- | --- | ---: | ---: | ---: |")
    base = {}
    times = medians_ms([r[2] for r in rows], args.reps, args.rounds)
    with_headers = dict(zip([r[1] for r in rows], times)).get(
        "reference: floor + each local header read from the map")
    for (file, label, fn, kind), ms in zip(rows, times):
        if label.startswith("numpy floor"):
            base[kind] = ms
        ratio = f"{ms / base[kind]:.2f}" if kind in base else "–"
        vs_headers = f"{ms / with_headers:.2f}" if kind == "zc" and with_headers else "–"
        print(f"| {file} | {label} | {fmt(ms / 1e3)} | {ratio} | {vs_headers} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
