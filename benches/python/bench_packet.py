#!/usr/bin/env python3
"""Side-by-side packet benchmark: dumps and loads of float32 arrays (1 KiB, 1 MiB,
64 MiB) and of a ~200-tensor bundle, with tensorwire.packet, tenso 0.24 and pickle
protocol 5 (in-band, and out-of-band with buffer_callback), in one run.

    python benches/python/bench_packet.py [--reps 15] [--json out.json]

Each cell is the median of --reps timed runs after one warm-up. ``dumps`` returns a
fresh packet each run; ``loads`` decodes one packet made beforehand (zero-copy where
the library allows it: tensorwire returns views of the packet's buffer, tenso copies
unless the body happens to be 64-aligned, in-band pickle always copies; in the
default, tenso-compatible bundle layout most member bodies are not element-aligned,
so tensorwire copies those into one aligned buffer, and the "aligned_bundle" row shows
the opt-in layout that needs no copy). The floors:
"memcpy" is one copy of the array into a freshly allocated buffer (what any dumps
must at least do), and "view" is np.frombuffer of the body (the zero-copy floor).
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import platform
import statistics
import sys
import time

import numpy as np

from tensorwire import packet

try:
    import tenso
except ImportError:  # pragma: no cover
    tenso = None


def timed(fn, reps: int) -> float:
    """Median seconds of ``reps`` runs of ``fn`` (after one warm-up)."""
    fn()
    samples = []
    gc.disable()
    try:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return statistics.median(samples)


def pickle_oob_dumps(obj):
    buffers = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return head, [b.raw() for b in buffers]


def pickle_oob_loads(parts):
    head, buffers = parts
    return pickle.loads(head, buffers=buffers)


def cases():
    rng = np.random.default_rng(0)
    for label, n in (("1 KiB", 256), ("1 MiB", 1 << 18), ("64 MiB", 1 << 24)):
        yield label, rng.standard_normal(n).astype(np.float32)
    # ~200 tensors shaped like a small transformer's state dict (~24 MiB in all).
    bundle = {}
    for layer in range(25):
        for name, shape in (("attn.q", (128, 128)), ("attn.k", (128, 128)),
                            ("attn.v", (128, 128)), ("attn.o", (128, 128)),
                            ("mlp.up", (512, 128)), ("mlp.down", (128, 512)),
                            ("norm1", (128,)), ("norm2", (128,))):
            bundle[f"l{layer}.{name}"] = rng.standard_normal(shape).astype(np.float32)
    yield f"bundle ({len(bundle)} tensors)", bundle


def floors(value, reps):
    if isinstance(value, dict):
        arrays = list(value.values())
        memcpy = timed(lambda: [a.copy() for a in arrays], reps)
        blobs = [(a.tobytes(), a.dtype, a.shape) for a in arrays]
        view = timed(lambda: [np.frombuffer(b, d).reshape(s) for b, d, s in blobs], reps)
    else:
        memcpy = timed(lambda: value.copy(), reps)
        blob = value.tobytes()
        view = timed(lambda: np.frombuffer(blob, value.dtype), reps)
    return memcpy, view


def libraries(value):
    libs = [("tensorwire", packet.dumps, packet.loads)]
    if isinstance(value, dict):
        # The opt-in layout with every member body aligned: loads copies nothing.
        libs.append(("tensorwire aligned_bundle",
                     lambda o: packet.dumps(o, aligned_bundle=True), packet.loads))
    if tenso is not None:
        libs.append(("tenso 0.24", tenso.dumps, tenso.loads))
    libs.append(("pickle 5", lambda o: pickle.dumps(o, protocol=5), pickle.loads))
    libs.append(("pickle 5 oob", pickle_oob_dumps, pickle_oob_loads))
    return libs


def check(value, loaded):
    if isinstance(value, dict):
        assert list(loaded) == list(value)
        for k in value:
            assert np.array_equal(loaded[k], value[k]), k
    else:
        assert np.array_equal(loaded, value)


def fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.2f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    print(f"# packet benchmark — {platform.machine()}, {platform.python_version()}, "
          f"numpy {np.__version__}, tenso {getattr(tenso, '__version__', 'absent')}")
    results = []
    for label, value in cases():
        memcpy, view = floors(value, args.reps)
        print(f"\n## {label}  (floors: memcpy {fmt(memcpy)}, view {fmt(view)})\n")
        print("| library | dumps | dumps / memcpy | loads | loads / view "
              "| tensorwire faster (dumps, loads) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        ours = {}
        for name, dumps, loads in libraries(value):
            blob = dumps(value)
            check(value, loads(blob))
            t_dumps = timed(lambda: dumps(value), args.reps)
            t_loads = timed(lambda: loads(blob), args.reps)
            del blob
            if name == "tensorwire":
                ours = {"dumps": t_dumps, "loads": t_loads}
            vs = "—"
            if name != "tensorwire" and ours:
                vs = f"{t_dumps / ours['dumps']:.1f}×, {t_loads / ours['loads']:.1f}×"
            print(f"| {name} | {fmt(t_dumps)} | {t_dumps / memcpy:.2f} | {fmt(t_loads)} | "
                  f"{t_loads / view:.2f} | {vs} |")
            results.append({"case": label, "library": name, "dumps_s": t_dumps,
                            "loads_s": t_loads, "memcpy_s": memcpy, "view_s": view})
        gc.collect()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
