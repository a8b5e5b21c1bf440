#!/usr/bin/env python3
"""safetensors, NPZ and GGUF side by side: tensorwire vs each format's own library and
ztensor 1.2.3, against the numpy floor, on the ~500 MiB checkpoint of
make_checkpoint.py (185 float32 tensors) written by each format's own writer.

    python benches/python/make_checkpoint.py          # writes bench-data/model.*
    python benches/python/bench_formats.py [--data bench-data] [--reps 15] [--rounds 5]

Every timed run opens the file inside the timed region and returns {name: array}; the
median of --reps runs (page cache warm) is reported, the runs taken in --rounds rounds
that visit every row in turn (timing.py), so noise on a shared machine hits every row
alike. Before timing, every method's arrays are checked equal to the floor's.

Floor, per file: mmap the file and np.frombuffer each tensor at its data offset, with
the offsets, dtypes and shapes found outside the timed region (the floor parses
nothing). NPZ members sit at arbitrary offsets, so the floor's (and tensorwire's)
views of them may be unaligned, as np.frombuffer gives them. The NPZ "reference" row
adds the reads no NPZ reader can skip: each member's local header and .npy header
length, through the map (the "vs reference" column).

When make_checkpoint.py wrote model.safetensors.index.json, the "sharded" rows read
the same tensors from its 3 safetensors shards: the floor maps each shard, tensorwire
opens the index, safetensors opens each shard (as transformers does).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_packet import fmt  # µs below 1 ms, else ms  # noqa: E402
from timing import medians_ms  # noqa: E402
from zip_local import data_start  # noqa: E402


def floor(path: str, plan):
    """plan: [(name, offset, dtype, count, shape)] found outside the timed region."""

    def run():
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return {n: np.frombuffer(m, dt, c, off).reshape(s) for n, off, dt, c, s in plan}

    return run


def floors(paths_and_plans):
    """The floor over several files (shards): each mapped, then its plan."""
    runs = [floor(path, plan) for path, plan in paths_and_plans]

    def run():
        out = {}
        for r in runs:
            out.update(r())
        return out

    return run


def plan_safetensors(path: str):
    import json
    import struct

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    dt = {"F32": np.float32, "F16": np.float16, "F64": np.float64}
    return [
        (k, 8 + n + v["data_offsets"][0], dt[v["dtype"]], int(np.prod(v["shape"])), tuple(v["shape"]))
        for k, v in header.items()
    ]


def plan_npz(path: str):
    import struct
    import zipfile

    out = []
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            f.seek(info.header_offset + 26)
            n, e = struct.unpack("<HH", f.read(4))
            start = info.header_offset + 30 + n + e
            f.seek(start)
            version = np.lib.format.read_magic(f)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}[version]
            shape, fortran, dtype = read_header(f)
            assert not fortran
            out.append((info.filename[: -len(".npy")], f.tell(), dtype, int(np.prod(shape)), shape))
    return out


def npz_header_floor(path: str, plan):
    """The NPZ floor plus the reads no reader can skip: each member's local header
    (where its data starts) and its .npy header length (where the array starts),
    read through the map; dtypes and shapes come from the plan, found outside the
    timed region like the floor's offsets."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as z:
        heads = {i.filename[: -len(".npy")]: i.header_offset for i in z.infolist()}
    steps = [(n, heads[n], dt, c, s) for n, _, dt, c, s in plan]

    def run():
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        out = {}
        for n, head, dt, c, s in steps:
            npy = data_start(m, head)
            if m[npy + 6] == 1:
                (hlen,) = struct.unpack_from("<H", m, npy + 8)
                start = npy + 10 + hlen
            else:
                (hlen,) = struct.unpack_from("<I", m, npy + 8)
                start = npy + 12 + hlen
            out[n] = np.frombuffer(m, dt, c, start).reshape(s)
        return out

    return run


def plan_gguf(path: str):
    import gguf

    r = gguf.GGUFReader(path)
    return [(t.name, int(t.data_offset), t.data.dtype, t.data.size, t.data.shape) for t in r.tensors]


def plan_zt(path: str):
    import tensorwire as tw

    # The .zt manifest's component offsets, as tensorwire lists them (ztensor 1.2.3
    # has no offset API); the equality check below holds the floor to ztensor's arrays.
    r = tw.Reader(path)
    out = []
    for k in r.keys():
        m = r.metadata(k)
        c = m.components["data"]
        out.append((k, c["offset"], np.dtype(m.dtype), int(np.prod(m.shape)), tuple(m.shape)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="bench-data")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=5, help="rounds the reps are split into (see timing.py)")
    args = ap.parse_args(argv)

    import tensorwire as tw

    paths = {f: os.path.join(args.data, "model." + f) for f in ("safetensors", "npz", "gguf", "zt")}
    for p in paths.values():
        if not os.path.exists(p):
            sys.exit(f"missing {p}: run benches/python/make_checkpoint.py first")
        with open(p, "rb") as f:  # warm the page cache
            while f.read(1 << 24):
                pass

    def tw_numpy(path):
        def run():
            r = tw.Reader(path)
            return {k: r.read_numpy(k) for k in r.keys()}
        return run

    def tw_numpy_all(path):  # one call for every tensor (as load_file makes)
        def run():
            r = tw.Reader(path)
            return r.read_numpy(r.keys())
        return run

    rows = []
    # safetensors
    from safetensors import safe_open

    def st_safe_open():
        with safe_open(paths["safetensors"], framework="np") as f:
            return {k: f.get_tensor(k) for k in f.keys()}

    def tw_safe_open():  # the same code on tensorwire.formats
        with tw.formats.safe_open(paths["safetensors"], framework="np") as f:
            return {k: f.get_tensor(k) for k in f.keys()}

    rows += [
        ("safetensors", "numpy floor: mmap + frombuffer", floor(paths["safetensors"], plan_safetensors(paths["safetensors"]))),
        ("safetensors", "tensorwire read_numpy(k)", tw_numpy(paths["safetensors"])),
        ("safetensors", "tensorwire read_numpy(keys()), one call", tw_numpy_all(paths["safetensors"])),
        ("safetensors", "tensorwire.formats.safe_open(np).get_tensor(k)", tw_safe_open),
        ("safetensors", "tensorwire.formats.load_file", lambda: tw.formats.load_file(paths["safetensors"])),
        ("safetensors", "safetensors.safe_open(np).get_tensor(k)", st_safe_open),
    ]
    # The same tensors in 3 safetensors shards with their index (when made).
    index = os.path.join(args.data, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        shard_paths = [os.path.join(args.data, s) for s in shards]
        for p in shard_paths:  # warm the page cache
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass

        def st_safe_open_shards():
            out = {}
            for shard in shard_paths:
                with safe_open(shard, framework="np") as f:
                    out.update({k: f.get_tensor(k) for k in f.keys()})
            return out

        rows += [
            ("sharded", "numpy floor: mmap + frombuffer",
             floors([(p, plan_safetensors(p)) for p in shard_paths])),
            ("sharded", "tensorwire read_numpy(k) (index)", tw_numpy(index)),
            ("sharded", "tensorwire read_numpy(keys()) (index), one call", tw_numpy_all(index)),
            ("sharded", "safetensors.safe_open(np) per shard", st_safe_open_shards),
        ]
    # NPZ (stored)
    def np_load_npz():
        with np.load(paths["npz"]) as z:
            return {k: z[k] for k in z.files}

    npz_plan = plan_npz(paths["npz"])
    rows += [
        ("npz", "numpy floor: mmap + frombuffer", floor(paths["npz"], npz_plan)),
        ("npz", "reference: floor + local and .npy header lengths read from the map",
         npz_header_floor(paths["npz"], npz_plan)),
        ("npz", "tensorwire read_numpy(k)", tw_numpy(paths["npz"])),
        ("npz", "tensorwire read_numpy(keys()), one call", tw_numpy_all(paths["npz"])),
        ("npz", "np.load(npz)[k]", np_load_npz),
    ]
    # GGUF
    import gguf

    def gguf_reader():
        r = gguf.GGUFReader(paths["gguf"])
        return {t.name: t.data for t in r.tensors}

    rows += [
        ("gguf", "numpy floor: mmap + frombuffer", floor(paths["gguf"], plan_gguf(paths["gguf"]))),
        ("gguf", "tensorwire read_numpy(k)", tw_numpy(paths["gguf"])),
        ("gguf", "tensorwire read_numpy(keys()), one call", tw_numpy_all(paths["gguf"])),
        ("gguf", "gguf.GGUFReader(path).tensors[i].data", gguf_reader),
    ]
    # The same tensors behind a Llama 3-sized tokenizer vocabulary (real GGUF models
    # carry one). gguf.GGUFReader takes seconds on it: timed once, after the table.
    vocab_gguf = os.path.join(args.data, "model.vocab.gguf")
    if os.path.exists(vocab_gguf):
        with open(vocab_gguf, "rb") as f:
            while f.read(1 << 24):
                pass
        rows += [
            ("gguf+vocab", "numpy floor: mmap + frombuffer", floor(vocab_gguf, plan_gguf(vocab_gguf))),
            ("gguf+vocab", "tensorwire read_numpy(k)", tw_numpy(vocab_gguf)),
            ("gguf+vocab", "tensorwire read_numpy(keys()), one call", tw_numpy_all(vocab_gguf)),
        ]
    else:
        print(f"{vocab_gguf} missing (make_checkpoint.py writes it): its rows are skipped")
    try:
        import ztensor

        def zt_numpy():
            r = ztensor.Reader(paths["zt"])
            return {k: r.read_numpy(k) for k in r.keys()}

        rows += [
            ("zt", "numpy floor: mmap + frombuffer", floor(paths["zt"], plan_zt(paths["zt"]))),
            ("zt", "tensorwire read_numpy(k)", tw_numpy(paths["zt"])),
            ("zt", "tensorwire read_numpy(keys()), one call", tw_numpy_all(paths["zt"])),
            ("zt", "ztensor 1.2.3 read_numpy(k)", zt_numpy),
        ]
    except ImportError:
        print("ztensor not installed: its rows are skipped")

    # Every method returns the floor's arrays (GGUF stores dims innermost first; the
    # gguf package and tensorwire both give the numpy shape).
    ref = {}
    for kind, label, fn in rows:
        got = fn()
        if label.startswith("numpy floor"):
            ref[kind] = got
            continue
        assert sorted(got) == sorted(ref[kind]), (kind, label)
        for k, v in got.items():
            v = np.asarray(v)
            assert v.shape == ref[kind][k].shape and np.array_equal(v, ref[kind][k]), (kind, label, k)
        del got

    n = len(ref["safetensors"])
    size = os.path.getsize(paths["safetensors"]) / 2**20
    print(f"# Zero-copy read of every tensor, {n} float32 tensors, {size:.0f} MiB; "
          f"median of {args.reps}\n")
    print("| file | method | time | vs floor | vs reference |")
    print("| --- | --- | ---: | ---: | ---: |")
    base = {}
    times = medians_ms([r[2] for r in rows], args.reps, args.rounds)
    reference = {kind: ms for (kind, label, _), ms in zip(rows, times) if label.startswith("reference:")}
    for (kind, label, _), ms in zip(rows, times):
        if label.startswith("numpy floor"):
            base[kind] = ms
        vs_ref = f"{ms / reference[kind]:.2f}" if kind in reference else "–"
        print(f"| {kind} | {label} | {fmt(ms / 1e3)} | {ms / base[kind]:.2f} | {vs_ref} |", flush=True)
    if os.path.exists(vocab_gguf):
        import time

        start = time.perf_counter()
        r = gguf.GGUFReader(vocab_gguf)
        got = {t.name: t.data for t in r.tensors}
        took = time.perf_counter() - start
        assert sorted(got) == sorted(ref["gguf+vocab"])
        for k, v in got.items():
            assert np.array_equal(v, ref["gguf+vocab"][k]), k
        print(f"\ngguf+vocab: gguf.GGUFReader(path).tensors[i].data, one run: {fmt(took)} "
              f"({took * 1e3 / base['gguf+vocab']:.0f}× the floor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
