#!/usr/bin/env python3
"""Loading the ~500 MiB benchmark checkpoint onto a CUDA device, side by side, in one run:

    python benches/python/bench_gpu_load.py [--data DIR] [--reps 9] [--layers 13]

Rows (each ends with every tensor on ``cuda:0`` and ``torch.cuda.synchronize()``; the
files are in the page cache; the caching allocator is warm):

* floors: the file's tensor bytes copied to the GPU in one call, from a pageable map of
  the file and from pinned memory (the PCIe floor);
* ``model.pt`` (torch.save, ZIP): ``torch.load(map_location="cuda")``, the same with
  ``mmap=True``, and ``tensorwire.pytorch.load(map_location="cuda")``;
* ``model.safetensors``: ``safetensors.torch.load_file(device="cuda:0")``,
  ``tensorwire.formats.load_file(framework="pt", device="cuda:0")`` and
  ``tensorwire.Reader.read_torch(names, device="cuda")``;
* tensorwire's loaders twice: as shipped (CUDA copies staged through reused pinned
  buffers, ``tensorwire._staging``) and with staging switched off (each tensor or
  storage copied by torch from its pageable host view, as before staging existed);
* the first staged load of the process, timed once before anything else pins host
  memory: it pays for pinning the staging buffers.

Every row's result is checked equal to the saved tensors once, outside the timing.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_checkpoint import make_tensors  # noqa: E402
from timing import medians_ms  # noqa: E402

def plain_copies(fn):
    """``fn`` run with staging switched off: every CUDA copy made by torch from the
    pageable host view, one tensor (or storage) at a time."""
    from tensorwire import _staging

    def run():
        saved = _staging.MIN_BYTES
        _staging.MIN_BYTES = 1 << 62
        try:
            return fn()
        finally:
            _staging.MIN_BYTES = saved
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="/tmp/tw-gpu-bench")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--layers", type=int, default=13)
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure", file=sys.stderr)
        return 2
    import safetensors.torch as st
    from safetensors.numpy import save_file

    import tensorwire as tw
    from tensorwire import formats, pytorch

    os.makedirs(args.data, exist_ok=True)
    pt_path = os.path.join(args.data, f"model-{args.layers}.pt")
    st_path = os.path.join(args.data, f"model-{args.layers}.safetensors")
    source = make_tensors(args.layers, 32000, 0)
    if not os.path.exists(pt_path):
        torch.save({k: torch.from_numpy(v) for k, v in source.items()}, pt_path)
    if not os.path.exists(st_path):
        save_file(source, st_path)
    total = sum(v.nbytes for v in source.values())
    for path in (pt_path, st_path):   # into the page cache
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass

    device = torch.device("cuda", 0)
    sync = torch.cuda.synchronize
    torch.zeros(1, device=device)  # the CUDA context, outside the first-call timing
    sync()
    started = time.perf_counter()
    pytorch.load(pt_path, map_location="cuda")
    sync()
    first_ms = (time.perf_counter() - started) * 1e3
    mapped = np.memmap(st_path, dtype=np.uint8, mode="c")
    pinned = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    on_device = torch.empty(total, dtype=torch.uint8, device=device)

    def floor_pageable():
        out = torch.from_numpy(mapped[-total:]).to(device)
        sync()
        return out

    def floor_pinned():
        on_device.copy_(pinned, non_blocking=True)
        sync()

    def loaded(fn):
        def run():
            out = fn()
            sync()
            return out
        return run

    names = list(source)
    rows = [
        ("floor: tensor bytes in one pageable copy", floor_pageable, None),
        ("floor: tensor bytes in one pinned copy", floor_pinned, None),
        ("torch.load(.pt, map_location='cuda')",
         loaded(lambda: torch.load(pt_path, map_location="cuda", weights_only=True)), "pt"),
        ("torch.load(.pt, map_location='cuda', mmap=True)",
         loaded(lambda: torch.load(pt_path, map_location="cuda", weights_only=True, mmap=True)),
         "pt"),
        ("tensorwire.pytorch.load(.pt, map_location='cuda'), staging off",
         loaded(plain_copies(lambda: pytorch.load(pt_path, map_location="cuda"))), "pt"),
        ("tensorwire.pytorch.load(.pt, map_location='cuda')",
         loaded(lambda: pytorch.load(pt_path, map_location="cuda")), "pt"),
        ("safetensors.torch.load_file(device='cuda:0')",
         loaded(lambda: st.load_file(st_path, device="cuda:0")), "st"),
        ("tensorwire.formats.load_file(framework='pt', device='cuda:0'), staging off",
         loaded(plain_copies(
             lambda: formats.load_file(st_path, framework="pt", device="cuda:0"))), "st"),
        ("tensorwire.formats.load_file(framework='pt', device='cuda:0')",
         loaded(lambda: formats.load_file(st_path, framework="pt", device="cuda:0")), "st"),
        ("tensorwire Reader.read_torch(names, device='cuda')",
         loaded(lambda: tw.Reader(st_path).read_torch(names, device="cuda")), "st"),
    ]

    for label, fn, kind in rows:
        if kind is None:
            continue
        out = fn()
        for name, want in source.items():
            got = out[name]
            if got.device != device or not torch.equal(got.cpu(), torch.from_numpy(want)):
                raise SystemExit(f"{label}: tensor {name} is wrong")
        del out

    times = medians_ms([fn for _, fn, _ in rows], args.reps, rounds=3)
    floor = times[0]
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, numpy {np.__version__}, "
          f"Python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f}; {len(source)} tensors, {total / 2**20:.0f} MiB; "
          f"median of {args.reps}\n")
    print("| to cuda:0 | ms | GB/s | × pageable floor |")
    print("|---|---|---|---|")
    for (label, _, _), ms in zip(rows, times):
        print(f"| {label} | {ms:.1f} | {total / ms / 1e6:.1f} | {ms / floor:.2f} |")
    print(f"| first tensorwire.pytorch.load(.pt, map_location='cuda') of the process "
          f"(pins its staging buffers), once | {first_ms:.1f} | {total / first_ms / 1e6:.1f} "
          f"| {first_ms / floor:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
