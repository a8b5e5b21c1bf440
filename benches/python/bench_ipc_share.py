#!/usr/bin/env python3
"""First-share and repeated-share latency of tensorwire.ipc, for one tensor and for a
100-tensor state dict, on CPU or CUDA, and (CUDA only) the same with the
``shared-tensor`` package when it is installed, in one run.

    python benches/python/bench_ipc_share.py --device cuda [--reps 21]
    python benches/python/bench_ipc_share.py --device cpu

A server process holds the values (cached endpoints); this process is the client.
Each cell is the median client-side time of one ``call``:

* ``first share``: no view of the value is alive in the client, so it maps the memory
  again (CUDA: ``cuIpcOpenMemHandle`` per allocation; CPU: ``mmap`` of the memfd).
* ``repeated share``: a view from an earlier call is alive, so the mapping is reused
  (CUDA: no ``cuIpcOpenMemHandle``; tensorwire.ipc.cuda_import_stats() proves it).

Sizes: one float32 tensor of 4 MiB; a state dict of 100 float32 tensors of 256 KiB
(25 MiB). CUDA needs torch with a GPU; CPU uses torch when importable, else numpy.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_packet import fmt  # noqa: E402

SERVER = r"""
import os, sys, time
device = sys.argv[2]
try:
    import torch
except ImportError:
    torch = None
import numpy as np
from tensorwire import ipc

def make(n, count):
    if torch is None:
        return [np.random.default_rng(i).standard_normal(n).astype(np.float32) for i in range(count)]
    g = torch.Generator().manual_seed(0)
    return [torch.randn(n, generator=g).to(device) for _ in range(count)]

one = make(1 << 20, 1)[0]
state = {f"layers.{i}.weight": t for i, t in enumerate(make(1 << 16, 100))}
if torch is not None and device == "cuda":
    torch.cuda.synchronize()

p = ipc.Provider(execution_mode="server", socket_path=sys.argv[1])

@p.share()
def get_one():
    return one

@p.share()
def get_state():
    return state

s = ipc.Server(p).start()
print("ready", flush=True)
while s.running:
    time.sleep(0.2)
"""

SHARED_TENSOR_SERVER = r"""
import sys, torch, time
from shared_tensor import SharedTensorProvider, SharedTensorServer
g = torch.Generator().manual_seed(0)
one = torch.randn(1 << 20, generator=g).cuda()
state = {f"layers.{i}.weight": torch.randn(1 << 16, generator=g).cuda() for i in range(100)}
torch.cuda.synchronize()
provider = SharedTensorProvider(sys.argv[1], execution_mode="server", device_index=0,
                                verbose_debug=False)

@provider.share(execution="direct", cache=True)
def get_one():
    return one

@provider.share(execution="direct", cache=True)
def get_state():
    # shared-tensor returns tensors and modules only: send the dict's tensors as a module.
    m = torch.nn.Module()
    for i, t in enumerate(state.values()):
        m.register_buffer(f"b{i}", t)
    return m

server = SharedTensorServer(provider)
print("ready", flush=True)
server.start(blocking=True)
"""


def median_call(fn, reps, keep_alive, opened=lambda: 0):
    """Median seconds of ``fn()`` and how many handles ``opened()`` counts during the
    timed calls; with ``keep_alive`` the first result stays alive (repeated share), else
    every result is dropped (freed by its reference count, so its maps are gone) before
    the next call. The collector stays off meanwhile: a full collection between calls
    evicts the caches and times a cold call instead."""
    held = fn() if keep_alive else None
    samples = []
    opened_before = opened()
    gc.collect()
    gc.disable()
    try:
        for _ in range(reps):
            t0 = time.perf_counter()
            out = fn()
            sync()
            samples.append(time.perf_counter() - t0)
            del out
    finally:
        gc.enable()
    opened_during = opened() - opened_before
    del held
    gc.collect()
    return statistics.median(samples), opened_during


SYNC = []   # torch.cuda.synchronize once CUDA is in use (set in main)


def sync():
    for f in SYNC:
        f()


def start(cmd, env=None):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    time.sleep(0.5)
    return proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--reps", type=int, default=21)
    args = ap.parse_args()

    from tensorwire import ipc

    if args.device == "cuda":
        import torch

        if not (torch.cuda.is_available() and ipc.cuda_available()):
            print("no CUDA device: nothing to measure", file=sys.stderr)
            return 2
        torch.cuda.init()
        SYNC.append(torch.cuda.synchronize)

    tmp = tempfile.mkdtemp(prefix="tw-bench-share-")
    sock = os.path.join(tmp, "ipc.sock")
    server = start([sys.executable, "-c", SERVER, sock, args.device])
    rows = {}
    try:
        client = ipc.Client(sock)
        opened = (lambda: ipc.cuda_import_stats()[0]) if args.device == "cuda" else (lambda: 0)
        for name in ("get_one", "get_state"):
            first, opened_first = median_call(
                lambda: client.call(name), args.reps, keep_alive=False, opened=opened)
            repeated, opened_repeated = median_call(
                lambda: client.call(name), args.reps, keep_alive=True, opened=opened)
            if args.device != "cuda":
                opened_first = opened_repeated = None
            rows[("tensorwire", name)] = (first, repeated, opened_first, opened_repeated)
    finally:
        server.kill()

    if args.device == "cuda":
        try:
            import shared_tensor  # noqa: F401
        except ImportError:
            print("shared-tensor not installed: its rows are skipped", file=sys.stderr)
        else:
            base = os.path.join(tmp, "st")
            st = start([sys.executable, "-c", SHARED_TENSOR_SERVER, base])
            try:
                deadline = time.monotonic() + 30
                while not os.path.exists(base + "-0.sock") and time.monotonic() < deadline:
                    time.sleep(0.1)
                from shared_tensor import SharedTensorClient

                c = SharedTensorClient(base, device_index=0, verbose_debug=False)
                for name in ("get_one", "get_state"):
                    first, _ = median_call(lambda: c.call(name), args.reps, keep_alive=False)
                    repeated, _ = median_call(lambda: c.call(name), args.reps, keep_alive=True)
                    rows[("shared-tensor", name)] = (first, repeated, None, None)
            finally:
                st.kill()

    import numpy as np

    print(f"device {args.device}, numpy {np.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; median of {args.reps}\n")
    print("| library | value | first share | repeated share | handles opened (first / repeated, per call) |")
    print("|---|---|---|---|---|")
    labels = {"get_one": "one tensor (4 MiB)", "get_state": "state dict (100 × 256 KiB)"}
    for (lib, name), (first, repeated, of, orep) in rows.items():
        opened = "" if of is None else f"{of / args.reps:.1f} / {orep / args.reps:.1f}"
        print(f"| {lib} | {labels[name]} | {fmt(first)} | {fmt(repeated)} | {opened} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
