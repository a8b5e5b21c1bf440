#!/usr/bin/env python3
"""PyTorch checkpoints of dtypes numpy lacks: tensorwire vs torch.load, against the numpy
floor, in one run.

- bf16: the ~500 MiB transformer-shaped state dict of make_checkpoint.py in bfloat16
  (~250 MiB), as most language models are saved;
- mx: a microscaled (MXFP4-style) checkpoint: torch.float4_e2m1fn_x2 weights (two
  float4 values per byte), each with torch.float8_e8m0fnu block scales (one per 32
  values), beside float32 norms (~210 MiB): dtypes only torch has, which tensorwire
  reads as the bytes holding them (uint8 for numpy, torch's dtypes for torch).

    python benches/python/bench_pytorch_dtypes.py [--data bench-data] [--reps 9] [--rounds 3]

Needs torch (with float4_e2m1fn_x2, 2.8 or later), numpy and tensorwire. Writes
bench-data/model_bf16.pt and mx.pt when missing. As in bench_pytorch.py: every timed
run opens the file inside the timed region; the median of --reps runs (page cache
warm) is reported; every method's result is checked byte for byte against the floor's
arrays first. The numpy floor maps the file and calls np.frombuffer at offsets found
outside the timed region (bfloat16 as uint16, the one-byte types as uint8); the
reference row adds the read of each record's local header. A row reads the same
tensors from a .zt version 2 copy (written by convert once, as bench-data/*.v2.zt).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from bench_packet import fmt  # noqa: E402
from bench_pytorch import floor_methods, zip_floor_offsets, zip_header_floor  # noqa: E402
from make_checkpoint import make_tensors  # noqa: E402
from timing import medians_ms  # noqa: E402


def bf16_state(torch):
    """make_checkpoint.py's state dict in bfloat16."""
    return {k: torch.from_numpy(v).to(torch.bfloat16)
            for k, v in make_tensors(13, 32000, seed=0).items()}


def mx_state(torch, layers: int = 8, hidden: int = 2048, inter: int = 5632):
    """{name: tensor}: per layer, 7 linear weights as float4 pairs [out, in / 2] with
    e8m0 scales [out, in / 32], and two float32 norms."""
    gen = torch.Generator().manual_seed(0)
    out = {}
    shapes = {"q": (hidden, hidden), "k": (hidden, hidden), "v": (hidden, hidden),
              "o": (hidden, hidden), "gate": (inter, hidden), "up": (inter, hidden),
              "down": (hidden, inter)}
    for i in range(layers):
        for name, (rows, cols) in shapes.items():
            packed = torch.randint(0, 256, (rows, cols // 2), dtype=torch.uint8, generator=gen)
            scales = torch.randint(100, 140, (rows, cols // 32), dtype=torch.uint8, generator=gen)
            out[f"layers.{i}.{name}.weight"] = packed.view(torch.float4_e2m1fn_x2)
            out[f"layers.{i}.{name}.weight_scale"] = scales.view(torch.float8_e8m0fnu)
        for norm in ("attn_norm", "mlp_norm"):
            out[f"layers.{i}.{norm}.weight"] = torch.rand(hidden, generator=gen)
    return out


def holder(torch, t):
    """The numpy array of a tensor's bytes as the floor reads them: float32 as it is,
    bfloat16 as uint16, the one-byte dtypes as uint8."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    if t.element_size() == 1:
        return t.view(torch.uint8).numpy()
    return t.numpy()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="bench-data")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)

    import torch

    print(f"# PyTorch checkpoints of dtypes numpy lacks; torch {torch.__version__}; "
          f"median of {args.reps}\n")
    print("| file | method | time | vs floor (same kind) | vs floor + headers |")
    print("| --- | --- | ---: | ---: | ---: |")
    for file, make in (("bf16", bf16_state), ("mx", mx_state)):
        path = os.path.join(args.data, "model_bf16.pt" if file == "bf16" else "mx.pt")
        state = make(torch)
        if not os.path.exists(path):
            os.makedirs(args.data, exist_ok=True)
            torch.save(state, path)
        bench_file(torch, file, path, state, args.reps, args.rounds)
    return 0


def bench_file(torch, file, path, state, reps, rounds):
    import tensorwire as tw

    with open(path, "rb") as f:  # warm the page cache
        while f.read(1 << 24):
            pass
    entries = zip_floor_offsets(path, state)
    floor, floor_copy = floor_methods(path, entries)

    def tw_numpy():
        r = tw.Reader(path)
        return {k: r.read_numpy(k) for k in r.keys()}

    def tw_torch():
        r = tw.Reader(path)
        return {k: r.read_torch(k) for k in r.keys()}

    # The same tensors converted to .zt version 2 (f8_e8m0 and f4_e2m1 types there),
    # in checkpoint order, as torch reads them back.
    zt2 = path[:-len(".pt")] + ".v2.zt"
    if not os.path.exists(zt2):
        tw.convert(path, zt2, zt_version=2)

    def tw_zt2_torch():
        r = tw.Reader(zt2)
        return {k: r.read_torch(k) for k in state}

    rows = [
        ("numpy floor: mmap + frombuffer", floor, "zc"),
        ("reference: floor + each local header read from the map",
         zip_header_floor(path, entries), "zc"),
        ("tensorwire read_numpy(k)", tw_numpy, "zc"),
        ("tensorwire read_torch(k)", tw_torch, "zc"),
        ("tensorwire.pytorch.load", lambda: tw.pytorch.load(path), "zc"),
        ("tensorwire read_torch(k) of the .zt version 2 copy", tw_zt2_torch, "zc"),
        ("torch.load(weights_only=True, mmap=True)",
         lambda: torch.load(path, weights_only=True, mmap=True), "zc"),
        ("numpy floor: + .copy()", floor_copy, "cp"),
        ("tensorwire.pytorch.load(mmap=False)", lambda: tw.pytorch.load(path, mmap=False), "cp"),
        ("torch.load(weights_only=True)", lambda: torch.load(path, weights_only=True), "cp"),
    ]
    ref = floor()
    for label, fn, _ in rows:
        got = fn()
        assert list(got) == list(ref), label
        for k, v in got.items():
            if isinstance(v, torch.Tensor):
                assert v.dtype == state[k].dtype, (label, k)
                v = holder(torch, v)
            elif v.dtype != ref[k].dtype:  # read_numpy's bfloat16 (ml_dtypes), if any
                v = v.view(ref[k].dtype)
            assert np.array_equal(v, ref[k]), (label, k)
        del got

    size = os.path.getsize(path) / 2**20
    what = f"{file}, {len(entries)} tensors, {size:.0f} MiB"
    times = medians_ms([r[1] for r in rows], reps, rounds)
    base, with_headers = {}, times[1]
    for (label, _, kind), ms in zip(rows, times):
        if label.startswith("numpy floor"):
            base[kind] = ms
        vs_headers = f"{ms / with_headers:.2f}" if kind == "zc" else "–"
        print(f"| {what} | {label} | {fmt(ms / 1e3)} | {ms / base[kind]:.2f} | {vs_headers} |",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
