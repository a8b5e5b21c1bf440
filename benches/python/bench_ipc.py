#!/usr/bin/env python3
"""Sharing a CPU tensor between two processes: tensorwire.ipc (memfd over a Unix
socket) against sending it through a pipe with pickle protocol 5, in one run.

    python benches/python/bench_ipc.py [--reps 101] [--big-reps 11] [--json out.json]

Two float32 arrays, 1 MiB and 256 MiB. Each cell is the median round trip, measured
in the client, from sending the request to holding a numpy array of the answer (after
one warm-up):

* ``get (cached)``: the server returns an array it has shared before. tensorwire sends
  the same memfd again and the client reuses its map: no copy anywhere. The pipe
  server pickles and sends the array every time.
* ``get (first share)``: the server returns an array it has not shared yet (a cache-less
  endpoint). tensorwire copies it into a new memfd (in parallel, without the GIL) and the
  client maps it; the pipe is as above.
* ``echo``: the client sends the array and gets it back. tensorwire: an array that
  already lives in shared memory (``tensorwire.ipc.share_memory``) goes both ways as
  the same memfd range; a heap array is copied into shared memory once per call. Pipe:
  pickled both ways.

Pickle protocol 5 runs in-band (``pickle.dumps`` → ``send_bytes``) and out-of-band
(``buffer_callback``; the raw buffer sent as its own message, one copy fewer). The
floor is one ``np.copyto`` of the array into a written buffer.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_packet import fmt, timed  # timed: median of reps after a warm-up, GC off  # noqa: E402

import tensorwire  # noqa: E402
from tensorwire import ipc  # noqa: E402

SIZES = [("1 MiB", 1 << 20), ("256 MiB", 256 << 20)]

SERVER = """
import sys, time
import numpy as np
from tensorwire import ipc
sizes = {label: n for label, n in eval(sys.argv[2])}
arrays = {label: np.random.default_rng(1).standard_normal(n // 4).astype(np.float32)
          for label, n in sizes.items()}
p = ipc.Provider(execution_mode="server", socket_path=sys.argv[1], autostart=False)

@p.share(cache=True)
def get_cached(label):
    return arrays[label]

@p.share(cache=False)
def get_fresh(label):
    return arrays[label]

@p.share(cache=False)
def echo(x):
    return x

s = ipc.Server(p).start()
print("ready", flush=True)
while s.running:
    time.sleep(0.2)
"""


def pipe_server(conn, sizes):
    arrays = {label: np.random.default_rng(1).standard_normal(n // 4).astype(np.float32)
              for label, n in sizes}
    while True:
        try:
            cmd = conn.recv_bytes()
        except EOFError:
            return
        kind, _, arg = cmd.decode().partition(":")
        if kind == "get":
            conn.send_bytes(pickle.dumps(arrays[arg], protocol=5))
        elif kind == "get_oob":
            send_oob(conn, arrays[arg])
        elif kind == "echo":
            conn.send_bytes(pickle.dumps(pickle.loads(conn.recv_bytes()), protocol=5))
        elif kind == "echo_oob":
            send_oob(conn, recv_oob(conn))


def send_oob(conn, obj):
    buffers = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    conn.send_bytes(head)
    conn.send_bytes(str(len(buffers)).encode())
    for b in buffers:
        conn.send_bytes(b.raw())


def recv_oob(conn):
    head = conn.recv_bytes()
    count = int(conn.recv_bytes())
    return pickle.loads(head, buffers=[conn.recv_bytes() for _ in range(count)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=101, help="runs per 1 MiB cell")
    ap.add_argument("--big-reps", type=int, default=11, help="runs per 256 MiB cell")
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="tw-bench-ipc-")
    sock = os.path.join(tmp, "ipc.sock")
    server = subprocess.Popen([sys.executable, "-c", SERVER, sock, repr(SIZES)],
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().startswith("ready")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    piper = ctx.Process(target=pipe_server, args=(child, SIZES), daemon=True)
    piper.start()
    client = ipc.Client(sock, timeout=600)

    def pipe_get(label):
        parent.send_bytes(f"get:{label}".encode())
        return pickle.loads(parent.recv_bytes())

    def pipe_get_oob(label):
        parent.send_bytes(f"get_oob:{label}".encode())
        return recv_oob(parent)

    def pipe_echo(arr):
        parent.send_bytes(b"echo:")
        parent.send_bytes(pickle.dumps(arr, protocol=5))
        return pickle.loads(parent.recv_bytes())

    def pipe_echo_oob(arr):
        parent.send_bytes(b"echo_oob:")
        send_oob(parent, arr)
        return recv_oob(parent)

    results = {}
    try:
        for label, nbytes in SIZES:
            reps = args.reps if nbytes <= (1 << 20) else args.big_reps
            arr = np.random.default_rng(1).standard_normal(nbytes // 4).astype(np.float32)
            shared = ipc.share_memory(arr)
            dst = np.empty_like(arr)
            dst[...] = 1
            # Every path returns the server's values.
            for got in (client.call("get_cached", label), client.call("get_fresh", label),
                        pipe_get(label), pipe_get_oob(label)):
                assert np.array_equal(got, arr)
            assert np.shares_memory(client.call("echo", shared), shared)
            assert np.array_equal(pipe_echo_oob(arr), arr)
            row = {
                "memcpy floor": timed(lambda: np.copyto(dst, arr), reps),
                "tw get (cached)": timed(lambda: client.call("get_cached", label), reps),
                "tw get (first share)": timed(lambda: client.call("get_fresh", label), reps),
                "tw echo (shared array)": timed(lambda: client.call("echo", shared), reps),
                "tw echo (heap array)": timed(lambda: client.call("echo", arr), reps),
                "pickle5 pipe get": timed(lambda: pipe_get(label), reps),
                "pickle5 oob pipe get": timed(lambda: pipe_get_oob(label), reps),
                "pickle5 pipe echo": timed(lambda: pipe_echo(arr), reps),
                "pickle5 oob pipe echo": timed(lambda: pipe_echo_oob(arr), reps),
            }
            results[label] = row
            print(f"{label}: " + ", ".join(f"{k} {fmt(v)}" for k, v in row.items()),
                  file=sys.stderr)
    finally:
        parent.close()
        server.kill()
        piper.join(timeout=5)

    labels = [label for label, _ in SIZES]
    print(f"tensorwire {tensorwire.__version__}, numpy {np.__version__}, Python "
          f"{platform.python_version()}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.2f}; median of {args.reps} (1 MiB) / {args.big_reps} (256 MiB)\n")
    print("| | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for key in results[labels[0]]:
        print(f"| {key} | " + " | ".join(fmt(results[label][key]) for label in labels) + " |")
    print()
    for label in labels:
        r = results[label]
        print(f"- {label}: get (cached) {r['pickle5 pipe get'] / r['tw get (cached)']:.0f}× faster "
              f"than the pickle5 pipe ({r['pickle5 oob pipe get'] / r['tw get (cached)']:.0f}× "
              f"out-of-band); echo of a shared array "
              f"{r['pickle5 pipe echo'] / r['tw echo (shared array)']:.0f}× "
              f"({r['pickle5 oob pipe echo'] / r['tw echo (shared array)']:.0f}× oob); first share "
              f"{r['pickle5 pipe get'] / r['tw get (first share)']:.1f}×.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
