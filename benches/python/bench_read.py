#!/usr/bin/env python3
"""Side-by-side read benchmark: read ALL tensors of the checkpoint made by
make_checkpoint.py with numpy (the floor), tensorwire, ztensor 1.2.3, safetensors and,
when importable, torch — in one run on one machine.

    python benches/python/bench_read.py [--data bench-data] [--reps 5] [--check]

Each row is timed as: one warm-up run, then --reps runs; the median is reported.
Every timed run starts from nothing (the open of the file is inside the timed region)
and ends once every tensor is held as an array; the arrays are dropped between runs.
The page cache is warm (every file is read once first; nothing drops caches), so this
measures library overhead + memory bandwidth, not the disk.

"zero-copy" runs return arrays that view the file mapping without touching the data;
"copy" runs return arrays that own fresh memory holding the bytes. The ratio column
compares each against the numpy floor of the same kind (1.00 = as fast as raw numpy).
"""

from __future__ import annotations

import argparse
import gc
import mmap
import os
import platform
import statistics
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

ZT_DTYPES = {
    "f64": "<f8", "float64": "<f8",
    "f32": "<f4", "float32": "<f4",
    "f16": "<f2", "float16": "<f2",
    "i64": "<i8", "int64": "<i8",
    "i32": "<i4", "int32": "<i4",
    "i16": "<i2", "int16": "<i2",
    "i8": "i1", "int8": "i1",
    "u64": "<u8", "uint64": "<u8",
    "u32": "<u4", "uint32": "<u4",
    "u16": "<u2", "uint16": "<u2",
    "u8": "u1", "uint8": "u1",
    "bool": "?",
}


# --------------------------------------------------------------------------- manifest

@dataclass
class Entry:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int
    count: int


def parse_zt_manifest(path: str) -> list[Entry]:
    """Parse a ztensor 1.2 (.zt, ZTEN1000) manifest with cbor2; done outside timing."""
    import cbor2

    with open(path, "rb") as f:
        if f.read(8) != b"ZTEN1000":
            raise SystemExit(f"{path}: not a ztensor 1.2 file (magic)")
        f.seek(-16, os.SEEK_END)
        (size,) = struct.unpack("<Q", f.read(8))
        if f.read(8) != b"ZTEN1000":
            raise SystemExit(f"{path}: bad footer magic")
        f.seek(-16 - size, os.SEEK_END)
        manifest = cbor2.loads(f.read(size))
    entries = []
    for name, obj in manifest["objects"].items():
        if obj.get("format", "dense") != "dense":
            raise SystemExit(f"{path}: {name} is {obj['format']}, the benchmark wants dense tensors")
        comp = obj["components"]["data"]
        if comp.get("encoding", "raw") != "raw":
            raise SystemExit(f"{path}: {name} is {comp['encoding']}-encoded; the benchmark wants raw")
        dt = np.dtype(ZT_DTYPES[comp["dtype"]])
        shape = tuple(int(s) for s in obj["shape"])
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if count * dt.itemsize != comp["length"]:
            raise SystemExit(f"{path}: {name}: length {comp['length']} != {count}*{dt.itemsize}")
        entries.append(Entry(name, dt, shape, int(comp["offset"]), count))
    return entries


# --------------------------------------------------------------------------- methods

@dataclass
class Method:
    label: str
    zero_copy: Callable[[], dict] | None = None
    copy: Callable[[], dict] | None = None
    note: str = ""
    floor: bool = False
    results: dict = field(default_factory=dict)  # kind -> (median_ms, all_ms) or error str


def numpy_methods(zt_path: str, entries: list[Entry]) -> list[Method]:
    def zc():
        with open(zt_path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return {
            e.name: np.frombuffer(m, e.dtype, e.count, e.offset).reshape(e.shape) for e in entries
        }

    def cp():
        with open(zt_path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        out = {
            e.name: np.frombuffer(m, e.dtype, e.count, e.offset).reshape(e.shape).copy()
            for e in entries
        }
        m.close()
        return out

    def readinto():
        out = {}
        with open(zt_path, "rb", buffering=0) as f:
            for e in entries:
                a = np.empty(e.shape, e.dtype)
                f.seek(e.offset)
                n = f.readinto(memoryview(a).cast("B"))
                if n != a.nbytes:
                    raise OSError(f"short read for {e.name}")
                out[e.name] = a
        return out

    return [
        Method(
            "numpy floor: mmap + frombuffer / .copy() (model.zt)",
            zc,
            cp,
            note="offsets from the manifest, parsed beforehand",
            floor=True,
        ),
        Method("numpy: f.readinto(np.empty) per tensor (model.zt)", None, readinto,
               note="copy without a mapping (read(2) into fresh arrays)"),
    ]


def reader_methods(label: str, make_reader: Callable, path: str, torch_too: bool) -> list[Method]:
    """Rows for a Reader with keys() and read_numpy(name | list, copy=...) (ztensor API)."""

    def per_key(copy: bool):
        def run():
            r = make_reader(path)
            return {k: r.read_numpy(k, copy=copy) for k in r.keys()}

        return run

    def as_list(copy: bool):
        def run():
            r = make_reader(path)
            return r.read_numpy(list(r.keys()), copy=copy)

        return run

    fname = os.path.basename(path)
    rows = [
        Method(f"{label}: read_numpy(k) for k in keys() ({fname})", per_key(False), per_key(True)),
        Method(f"{label}: read_numpy(list_of_all) ({fname})", as_list(False), as_list(True)),
    ]
    if torch_too:
        def torch_per_key(copy: bool):
            def run():
                r = make_reader(path)
                return {k: r.read_torch(k, copy=copy) for k in r.keys()}

            return run

        rows.append(Method(f"{label}: read_torch(k) for k in keys() ({fname})",
                           torch_per_key(False), torch_per_key(True), note="torch tensors"))
    return rows


def safetensors_methods(st_path: str, have_torch: bool) -> list[Method]:
    from safetensors import safe_open
    from safetensors.numpy import load_file

    def np_get():
        with safe_open(st_path, framework="np") as f:
            return {k: f.get_tensor(k) for k in f.keys()}

    def np_load():
        return load_file(st_path)

    fname = os.path.basename(st_path)
    rows = [
        # Filled into the zero-copy or copy column after probing what it returns.
        Method(f"safetensors: safe_open(np) + get_tensor ({fname})", None, np_get),
        Method(f"safetensors.numpy.load_file ({fname})", None, np_load),
    ]
    if have_torch:
        def pt_get():
            with safe_open(st_path, framework="pt") as f:
                return {k: f.get_tensor(k) for k in f.keys()}

        def pt_load():
            from safetensors.torch import load_file as pt_load_file

            return pt_load_file(st_path)

        rows += [
            Method(f"safetensors: safe_open(pt) + get_tensor ({fname})", None, pt_get, note="torch tensors"),
            Method(f"safetensors.torch.load_file ({fname})", None, pt_load, note="torch tensors"),
        ]
    return rows


# --------------------------------------------------------------------------- probing

def to_numpy(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    return x.detach().cpu().numpy()  # torch tensor


def owns_memory(x, ranges) -> bool:
    """True when the array's data lies outside every mapping of a benchmark file."""
    return mapping_of(x, ranges) is None


def mapped_ranges_of(paths: list[str]):
    """A callable listing (lo, hi, perms) of the current mappings of the given files."""
    real = {os.path.realpath(p) for p in paths}

    def ranges():
        out = []
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].strip() in real:
                    lo, hi = (int(v, 16) for v in parts[0].split("-"))
                    out.append((lo, hi, parts[1]))
        return out

    return ranges


def mapping_of(x, ranges):
    """The perms ('r--s', 'rw-p', ...) of the file mapping holding x's data, or None."""
    addr = to_numpy(x).__array_interface__["data"][0]
    for lo, hi, perms in ranges():
        if lo <= addr < hi:
            return perms
    return None


def describe(x, ranges) -> str:
    a = to_numpy(x)
    w = "writeable" if a.flags.writeable else "read-only"
    perms = mapping_of(x, ranges)
    if perms is None:
        return f"owned, {w}"
    kind = {"p": "private", "s": "shared"}.get(perms[3:4], "?")
    return f"file view, {w}, map {perms} ({kind})"


# --------------------------------------------------------------------------- timing

def time_run(fn: Callable[[], dict], reps: int) -> tuple[float, list[float]]:
    times = []
    for i in range(reps + 1):  # first run is the warm-up
        gc.collect()
        gc.disable()
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        gc.enable()
        del out
        if i:
            times.append((t1 - t0) * 1e3)
    return statistics.median(times), times


def warm_page_cache(paths: list[str]) -> None:
    buf = bytearray(16 << 20)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


# --------------------------------------------------------------------------- info

def machine_info(paths: list[str]) -> list[str]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    try:
        ncpu = len(os.sched_getaffinity(0))
    except AttributeError:
        ncpu = os.cpu_count()
    vers = [f"python {platform.python_version()}", f"numpy {np.__version__}"]
    for mod in ("tensorwire", "ztensor", "safetensors", "torch", "cbor2"):
        vers.append(f"{mod} {package_version(mod)}")
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    lines = [
        f"- load average at start: {load} (other work on the machine skews timings)",
        f"- machine: {platform.machine()}, {cpu}, nproc {ncpu}, memory {mem}, {platform.system()} {platform.release()}",
        f"- versions: {', '.join(vers)}",
    ]
    for p in paths:
        lines.append(f"- file: {p} ({os.path.getsize(p) / 2**20:.1f} MiB)")
    return lines


def package_version(mod: str) -> str:
    try:
        from importlib.metadata import version

        return version(mod)
    except Exception:
        try:
            return getattr(__import__(mod), "__version__", "?")
        except Exception:
            return "not installed"


# --------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="bench-data", help="directory written by make_checkpoint.py")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions per cell (median reported)")
    ap.add_argument("--check", action="store_true",
                    help="first verify every library returns the floor's arrays (shape, dtype, values)")
    ap.add_argument("--check-sample", type=int, default=24,
                    help="with --check: compare values of this many tensors, evenly spaced "
                         "plus the largest (0 = all); shapes and dtypes are always all checked")
    ap.add_argument("--only", default="", help="run only rows whose label contains this text")
    ap.add_argument("--no-torch", action="store_true", help="skip torch rows even if torch imports")
    args = ap.parse_args(argv)

    zt = os.path.join(args.data, "model.zt")
    st = os.path.join(args.data, "model.safetensors")
    twzt = os.path.join(args.data, "model.tw.zt")
    if not os.path.exists(zt):
        print(f"{zt} missing: run `python benches/python/make_checkpoint.py --out {args.data}` first", file=sys.stderr)
        return 2

    notes: list[str] = []
    entries = parse_zt_manifest(zt)
    total_bytes = sum(e.count * e.dtype.itemsize for e in entries)

    have_torch = False
    if not args.no_torch:
        try:
            import torch  # noqa: F401

            have_torch = True
        except ImportError:
            notes.append("torch not importable: torch rows skipped")

    methods = numpy_methods(zt, entries)
    try:
        import tensorwire

        methods += reader_methods("tensorwire", tensorwire.Reader, zt,
                                  have_torch and hasattr(tensorwire.Reader, "read_torch"))
        if os.path.exists(twzt):
            methods += reader_methods("tensorwire", tensorwire.Reader, twzt, False)[:1]
        methods += reader_methods("tensorwire", tensorwire.Reader, st, False)[:1]
    except ImportError as e:
        notes.append(f"tensorwire not importable ({e}): its rows skipped")
    try:
        import ztensor

        methods += reader_methods(f"ztensor {package_version('ztensor')}", ztensor.Reader, zt, have_torch)
        if os.path.exists(st):
            methods += reader_methods(f"ztensor {package_version('ztensor')}", ztensor.Reader, st, False)[:1]
    except ImportError as e:
        notes.append(f"ztensor not importable ({e}): its rows skipped")
    if os.path.exists(st):
        try:
            methods += safetensors_methods(st, have_torch)
        except ImportError as e:
            notes.append(f"safetensors not importable ({e}): its rows skipped")
    else:
        notes.append(f"{st} missing: safetensors rows skipped")
    if args.only:
        methods = [m for m in methods if m.floor or args.only in m.label]

    files = [p for p in (zt, twzt, st) if os.path.exists(p)]
    warm_page_cache(files)
    ranges = mapped_ranges_of(files)

    # Probe each callable once: does it work, does it really share or own memory,
    # and (with --check) does it return the floor's arrays?
    floor_ref = methods[0].zero_copy()
    names = [e.name for e in entries]
    if args.check_sample and args.check_sample < len(names):
        step = len(names) / args.check_sample
        sample = {names[int(i * step)] for i in range(args.check_sample)}
        sample.add(max(entries, key=lambda e: e.count).name)
    else:
        sample = set(names)
    check_failures = 0
    for m in methods:
        for kind in ("zero_copy", "copy"):
            fn = getattr(m, kind)
            if fn is None:
                continue
            try:
                out = fn()
            except Exception as e:  # a library that cannot do this: report, don't abort
                m.results[kind] = f"error: {type(e).__name__}: {e}"[:120]
                setattr(m, kind, None)
                continue
            first = out[names[0]] if names[0] in out else next(iter(out.values()))
            owns = owns_memory(first, ranges)
            big = out.get(max(entries, key=lambda e: e.count).name)
            owns_big = owns_memory(big, ranges) if big is not None else owns
            # Put the measurement in the column that matches what it returns.
            if kind == "copy" and not owns_big and m.zero_copy is None:
                m.zero_copy, m.copy = fn, None
                kind = "zero_copy"
            elif kind == "zero_copy" and owns_big:
                m.note = (m.note + "; " if m.note else "") + "'zero-copy' mode returned owned copies"
            m.note = (m.note + "; " if m.note else "") + f"{kind.replace('_', '-')}: {describe(first, ranges)}"
            if args.check:
                bad = []
                if set(out) != set(names):
                    bad.append(f"names differ ({len(out)} vs {len(names)})")
                for e in entries:
                    if e.name not in out:
                        continue
                    a = to_numpy(out[e.name])
                    if tuple(a.shape) != e.shape or a.dtype != e.dtype:
                        bad.append(f"{e.name}: {a.dtype}{tuple(a.shape)} != {e.dtype}{e.shape}")
                    elif e.name in sample and not np.array_equal(a, floor_ref[e.name]):
                        bad.append(f"{e.name}: values differ")
                status = "ok" if not bad else "MISMATCH " + "; ".join(bad[:3])
                check_failures += bool(bad)
                print(f"check {status:<8} {m.label} [{kind}]")
            del out, first, big
    if args.check:
        print(f"check: {len(sample)} of {len(names)} tensors compared by value, all by shape/dtype\n")
    del floor_ref

    for m in methods:
        for kind in ("zero_copy", "copy"):
            fn = getattr(m, kind)
            if fn is None:
                continue
            med, all_ms = time_run(fn, args.reps)
            m.results[kind] = (med, all_ms)
            print(f"  {m.label} [{kind}]: median {med:.2f} ms  (runs: {', '.join(f'{t:.1f}' for t in all_ms)})",
                  file=sys.stderr)

    floor = methods[0]
    fz = floor.results["zero_copy"][0]
    fc = floor.results["copy"][0]

    def cell(m: Method, kind: str) -> tuple[str, str]:
        r = m.results.get(kind)
        if r is None:
            return "n/a", ""
        if isinstance(r, str):
            return r, ""
        base = fz if kind == "zero_copy" else fc
        return f"{r[0]:.2f}", f"{r[0] / base:.2f}x"

    print("## Read all tensors of the checkpoint")
    print()
    print(f"{len(entries)} tensors, {total_bytes / 2**20:.1f} MiB float32; median of {args.reps} runs after "
          f"1 warm-up; page cache warm (files read once first, no cache drop); open inside the timed region.")
    print()
    for line in machine_info(files):
        print(line)
    print()
    print("| method | zero-copy ms | copy ms | ratio vs numpy floor (zero-copy / copy) | returns |")
    print("|---|---:|---:|---:|---|")
    for m in methods:
        zc, zr = cell(m, "zero_copy")
        cp, cr = cell(m, "copy")
        ratio = " / ".join(x if x else "-" for x in (zr, cr))
        print(f"| {m.label} | {zc} | {cp} | {ratio} | {m.note} |")
    print()
    if have_torch:
        print("Torch rows return torch tensors; their ratios are against the same numpy floor.")
    print(f"Floor bandwidth for copy: {total_bytes / 2**30 / (fc / 1e3):.2f} GiB/s.")
    for n in notes:
        print(f"note: {n}")
    if check_failures:
        print(f"CHECK FAILED for {check_failures} method/mode pairs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
