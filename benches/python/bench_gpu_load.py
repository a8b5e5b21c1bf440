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
* a prototype that is not in the library: tensorwire's zero-copy host views staged
  through two pinned 64 MiB buffers into one device allocation, copies overlapped
  with the next buffer's fill, tensors as views of that allocation.

Every row's result is checked equal to the saved tensors once, outside the timing.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_checkpoint import make_tensors  # noqa: E402
from timing import medians_ms  # noqa: E402

STAGE_BYTES = 64 << 20


def staged_to_cuda(torch, views: dict, device) -> dict:
    """Host views -> one device allocation, through two pinned staging buffers."""
    total = sum(v.nbytes for v in views.values())
    dst = torch.empty(total, dtype=torch.uint8, device=device)
    stages = [torch.empty(STAGE_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    done = [None, None]
    stream = torch.cuda.current_stream(device)
    which, fill, start = 0, 0, 0

    def flush():
        nonlocal which, fill, start
        if fill:
            dst[start:start + fill].copy_(stages[which][:fill], non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
            done[which] = event
            start += fill
            which, fill = 1 - which, 0
            if done[which] is not None:
                done[which].synchronize()

    for arr in views.values():
        raw = arr.reshape(-1).view(np.uint8)
        at = 0
        while at < raw.nbytes:
            n = min(raw.nbytes - at, STAGE_BYTES - fill)
            stages[which][fill:fill + n].numpy()[:] = raw[at:at + n]
            fill += n
            at += n
            if fill == STAGE_BYTES:
                flush()
    flush()
    out, at = {}, 0
    for name, arr in views.items():
        dtype = {np.dtype(np.float32): torch.float32}[arr.dtype]
        out[name] = dst[at:at + arr.nbytes].view(dtype).view(arr.shape)
        at += arr.nbytes
    return out


def pinned_read_into(torch, reader, names, device, group_bytes=None) -> dict:
    """Every tensor copied natively (in parallel, without the GIL) into pinned host
    memory, then to one device allocation; with ``group_bytes``, in groups of about
    that many bytes, each group's device copy overlapping the next group's fill."""
    arrays = reader.read_numpy(names)
    total = sum(a.nbytes for a in arrays.values())
    host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(total, dtype=torch.uint8, device=device)
    host_np = host.numpy()
    groups, current, size = [], [], 0
    for name, arr in arrays.items():
        current.append(name)
        size += arr.nbytes
        if group_bytes and size >= group_bytes:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    out, at = {}, 0
    for group in groups:
        start = at
        targets = {}
        for name in group:
            arr = arrays[name]
            targets[name] = host_np[at:at + arr.nbytes].view(arr.dtype).reshape(arr.shape)
            out[name] = dst[at:at + arr.nbytes].view(torch.float32).view(arr.shape)
            at += arr.nbytes
        reader.read_into(targets)
        dst[start:at].copy_(host[start:at], non_blocking=True)
    return out


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
        ("tensorwire.pytorch.load(.pt, map_location='cuda')",
         loaded(lambda: pytorch.load(pt_path, map_location="cuda")), "pt"),
        ("safetensors.torch.load_file(device='cuda:0')",
         loaded(lambda: st.load_file(st_path, device="cuda:0")), "st"),
        ("tensorwire.formats.load_file(framework='pt', device='cuda:0')",
         loaded(lambda: formats.load_file(st_path, framework="pt", device="cuda:0")), "st"),
        ("tensorwire Reader.read_torch(names, device='cuda')",
         loaded(lambda: tw.Reader(st_path).read_torch(names, device="cuda")), "st"),
        ("prototype: zero-copy views staged through pinned buffers",
         loaded(lambda: staged_to_cuda(torch, tw.Reader(st_path).read_numpy(names), device)),
         "st"),
        ("prototype: native read_into pinned memory, then one copy",
         loaded(lambda: pinned_read_into(torch, tw.Reader(st_path), names, device)), "st"),
        ("prototype: the same in 64 MiB groups, copies overlapped",
         loaded(lambda: pinned_read_into(torch, tw.Reader(st_path), names, device, 64 << 20)),
         "st"),
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
