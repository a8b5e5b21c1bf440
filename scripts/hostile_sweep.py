#!/usr/bin/env python3
"""Hostile-input sweep over tensorwire's Python entry points.

Every file under ``fixtures/`` (all formats; sharded sets and GGUF splits as
groups), plus a few generated ``.zt`` files whose attributes misuse the names
tensorwire itself reads (``safetensors.shape``, ``tensorwire.layout``), is mutated
deterministically: truncations, bit flips, byte and integer writes at random and at
structurally interesting offsets (the first 4 KiB, the tail, ZIP records), range
zeroing, insertions, deletions, junk appended; header rewrites for safetensors' JSON
and NPY's dict; edits of a ZIP member (a checkpoint's pickle above all) with its
CRC-32 fixed, and of a pickle's integer, bool, tuple and string arguments. Each
mutated input goes through the Python API, one operation ("op") at a time:

    reader     Reader(path): keys, metadata, read, read_numpy (view and copy),
               read_into (numpy and torch), read_torch (view and copy), verify
    buffer     Reader(buffer=bytes / bytearray): the same reads
    pytorch    pytorch.open, load_numpy (flat=False, mmap=False, bytes), load (flat,
               flat=False, mmap=False, map_location cpu / function / "meta", bytes,
               a file object)
    torchdiff  pytorch.load(flat=False) against torch.load(weights_only=True) where
               both read the file: the same objects, dtypes, shapes, strides, values
    formats    formats.load_file / load (np and pt), safe_open: metadata, get_tensor,
               get_slice(name)[...] with several indices, get_shape, len
    convert    tensorwire.convert to .zt (v1, v2, compressed) and safetensors: the
               output must read back as the source reads
    packet     packet.get_packet_info, loads (copy or not, from numpy), read_stream,
               load (mmap_mode or not), and the decoded objects used
    cli        tensorwire inspect / verify (every --cli-every'th case)

A step inside an op that raises a typed error is the promised outcome and the op
goes on with its next step. Each case runs in a worker subprocess (restarted when it
dies) with a per-operation timeout and an address-space cap, and each op is
classified:

    ok        ran, and the invariants held (copy and view read the same bytes...)
    typed     raised a TensorwireError subclass or OSError (what the API promises;
              EOFError for packet.load of an empty file, as tenso)
    skip      not that op's kind of file
    lenient   torchdiff only: tensorwire read what torch.load refuses (not a bug by
              itself: torch.load fails on many damaged files; listed in results)
    untyped   raised anything else (TypeError, ValueError from numpy, ...): a bug
    panic     raised pyo3's PanicException (or the CLI reported a Rust panic): a bug
    memory    MemoryError under the address-space cap: an unbounded allocation
    crash     the worker died (segfault, abort): a bug
    timeout   an operation ran past the timeout: a hang
    invariant the result is inconsistent (a copy differs from the view, convert wrote
              a file that does not read back, torch.load reads other values): a bug
    harness   the sweep itself failed to build the case

Run it from the repository root with the dev venv (the extension built); 80,000
cases take about 2.5 minutes on 2 cores::

    python scripts/hostile_sweep.py --cases 20000 --seed 1 --out /tmp/sweep
    python scripts/hostile_sweep.py --cases 2000 --ops reader,packet   # some ops only
    python scripts/hostile_sweep.py --cases 5000 --only pytorch/torch_only   # some fixtures
    python scripts/hostile_sweep.py --replay 1234 --seed 1   # one case, in process
    python scripts/hostile_sweep.py --write 1234 --seed 1 --out /tmp/c   # its files

``--out`` gets ``results.jsonl`` (every problem and lenient outcome, with its case
recipe and traceback) and ``summary.json``; the summary (counts per operation and
the distinct problems, each with a case to replay) is printed at the end. Exit
status 1 when any problem was found. The CLI ops need ``target/release/tensorwire``
(``cargo build --release -p tensorwire-cli``); they are skipped without it.
``bindings/python/tests/test_hostile_sweep.py`` runs a bounded sweep in CI.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import math
import os
import random
import re
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FIXTURES = os.path.join(REPO, "fixtures")
CLI = os.path.join(REPO, "target", "release", "tensorwire")

ALL_OPS = ("reader", "buffer", "pytorch", "torchdiff", "formats", "convert", "packet", "cli")
PROBLEMS = ("untyped", "panic", "memory", "crash", "timeout", "invariant", "harness")
# Most tensors an op reads per case (a mutated count could be large).
MAX_NAMES = 48
# Address space a worker may add past what it holds once torch is imported.
EXTRA_ADDRESS_SPACE = 3 << 30

# ---------------------------------------------------------------------------
# Seeds


# Parseable files with hostile contents the fixtures lack (a `.zt` file's attributes
# are its writer's: the names tensorwire itself uses, holding anything), written once.
GENERATED = os.path.join(tempfile.gettempdir(), "tensorwire-hostile-seeds-2")


def _generate(out=GENERATED):
    if os.path.isdir(out):
        return out
    import numpy as np

    import tensorwire as tw

    tmp = tempfile.mkdtemp(prefix="tw-seeds-", dir=os.path.dirname(out))
    four = np.arange(1, 5, dtype=np.uint8)
    attrs = {
        "st_shape_int": {"safetensors.shape": 5},
        "st_shape_str": {"safetensors.shape": "ab", "safetensors.dtype": "F4"},
        "st_shape_mixed": {"safetensors.shape": [1, "x", None]},
        "st_shape_huge": {"safetensors.shape": [1 << 40, 1 << 40]},
        "f4_odd": {"tensorwire.layout": "safetensors:F4", "safetensors.shape": [3]},
        "f4_big": {"tensorwire.layout": "safetensors:F4", "safetensors.shape": [100, 100]},
        "f4_ok": {"tensorwire.layout": "safetensors:F4", "safetensors.shape": [2, 4]},
        "e8m0_ok": {"tensorwire.layout": "safetensors:F8_E8M0", "safetensors.shape": [2, 2]},
        "e8m0_bad": {"tensorwire.layout": "safetensors:F8_E8M0", "safetensors.shape": [-4]},
        "layout_sparse": {"tensorwire.layout": "sparse_csr"},
        "layout_junk": {"tensorwire.layout": 7, "safetensors.dtype": ["F4"]},
        "torch_attrs": {"torch.qscheme": "torch.per_tensor_affine", "torch.q_scale": "x",
                        "torch.layout": 3, "torch.size": [1 << 62]},
    }
    # One file of each (a conversion stops at its first refused tensor), and one of all.
    for name, a in attrs.items():
        with tw.Writer(os.path.join(tmp, f"{name}.zt")) as w:
            w.write_numpy(name, four, attributes=a)
            w.write_numpy("plain", np.arange(6, dtype=np.float32).reshape(2, 3))
    for version in (1, 2):
        with tw.Writer(os.path.join(tmp, f"all_v{version}.zt"), version=version) as w:
            for name, a in attrs.items():
                w.write_numpy(name, four, attributes=a)
    try:
        os.rename(tmp, out)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def seeds(fixtures=FIXTURES):
    """``[(seed id, mutated file, group dir or None, file to open)]``, sorted: every
    tensor file of ``fixtures`` (expected outputs and generators left out); the files
    of a sharded set or a GGUF split each mutated in turn, the set opened whole."""
    out = []
    groups = {os.path.join(fixtures, "sharded", "safetensors"):
              "model.safetensors.index.json",
              os.path.join(fixtures, "sharded", "pytorch"): "pytorch_model.bin.index.json",
              os.path.join(fixtures, "gguf", "split"): "model-00001-of-00003.gguf"}
    for root, dirs, files in os.walk(fixtures):
        dirs[:] = sorted(d for d in dirs if d != "expected")
        for f in sorted(files):
            path = os.path.join(root, f)
            if root in groups:
                if f.endswith((".py", ".md")) or (f.endswith(".json") and "index" not in f) \
                        or ".expected." in f:
                    continue
                out.append((os.path.relpath(path, fixtures), path, root, groups[root]))
                continue
            if f.endswith((".json", ".py", ".md", ".txt")):
                continue
            out.append((os.path.relpath(path, fixtures), path, None, f))
    generated = _generate()
    for f in sorted(os.listdir(generated)):
        out.append((f"generated/{f}", os.path.join(generated, f), None, f))
    out.sort()
    # `--only`, passed on to the workers in the environment.
    only = os.environ.get(ONLY_ENV)
    if only:
        out = [s for s in out if only in s[0]]
        if not out:
            raise SystemExit(f"--only {only!r}: no fixture's id contains it")
    return out


# The environment variable that carries `--only` to the worker processes.
ONLY_ENV = "TW_SWEEP_ONLY"


# ---------------------------------------------------------------------------
# Mutations (each a JSON-able recipe, applied by `mutate`)

_INTERESTING_BYTES = (0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF, 0x20, 0x30, 0x39, 0x22, 0x7B, 0x5D)
_INTERESTING_INTS = (0, 1, 2, 7, 8, 63, 64, 255, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000,
                     0xFFFFFFFF, 1 << 32, 1 << 40, (1 << 63) - 1, 1 << 63, (1 << 64) - 1)
_MAGICS = (b"PK\x01\x02", b"PK\x03\x04", b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07",
           b"TNSO", b"ZTEN", b"GGUF", b"\x93NUMPY", b"data.pkl", b"\x80\x02", b"\x80\x04")
_ST_DTYPES = ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32", "U16",
              "U8", "BOOL", "C64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3",
              "F6_E3M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "X", "")
_NPY_DESCRS = ("<f4", ">f4", "<f8", ">c16", "<c8", "|b1", "|u1", "<i2", ">u8", "<f2", "|V8",
               "<M8[s]", "<m8[D]", "|O", "<U3", "|S0", "|S5", "<V0", "bogus", "<f16")


def _position(rng, data):
    """An offset, drawn more often near the start and end and at format structures."""
    n = len(data)
    if n == 0:
        return 0
    r = rng.random()
    if r < 0.35:
        return rng.randrange(n)
    if r < 0.6:
        return rng.randrange(min(n, 4096))
    if r < 0.8:
        return n - 1 - rng.randrange(min(n, 256))
    hits = [m.start() for magic in _MAGICS for m in re.finditer(re.escape(magic), data)]
    if not hits:
        return rng.randrange(n)
    return min(n - 1, rng.choice(hits) + rng.randrange(48))


def _json_tokens(data):
    """Spans of numbers and short strings in a file's JSON or NPY header text."""
    head = data[:min(len(data), 1 << 16)]
    return [(m.start(), m.end()) for m in re.finditer(rb'-?\d+|"[^"\\]{0,40}"|\'[^\']{0,40}\'|True|False', head)]


def draw_mutation(rng, data, seed_id):
    """A random mutation recipe for ``data``."""
    n = len(data)
    kinds = ["truncate", "flip", "byte", "bytes", "int", "zero", "append", "insert",
             "delete"]
    weights = [14, 18, 12, 8, 14, 8, 6, 5, 5]
    if seed_id.endswith(".safetensors") and n >= 8:
        kinds.append("st_header"), weights.append(25)
    if seed_id.endswith(".npy") and data.startswith(b"\x93NUMPY"):
        kinds.append("npy_header"), weights.append(20)
    if seed_id.endswith((".pt", ".bin")) and _pickle_sites(data):
        kinds.append("pickle"), weights.append(40)
    if data[:4] == b"PK\x03\x04" and _zip_members(data):
        kinds.append("zip_member"), weights.append(40)
    tokens = _json_tokens(data) if (seed_id.endswith((".json", ".safetensors", ".npy"))) else []
    if tokens:
        kinds.append("token"), weights.append(15)
    kind = rng.choices(kinds, weights)[0]
    if kind == "truncate":
        r = rng.random()
        if r < 0.3:
            at = rng.randrange(min(n, 64) + 1)
        elif r < 0.6:
            at = max(0, n - 1 - rng.randrange(min(n, 256) + 1))
        else:
            at = rng.randrange(n + 1)
        return {"kind": "truncate", "at": at}
    if n == 0:
        return {"kind": "append", "junk": "random", "len": rng.randrange(1, 64), "rs": rng.randrange(1 << 30)}
    if kind == "flip":
        return {"kind": "flip", "pos": _position(rng, data), "bit": rng.randrange(8)}
    if kind == "byte":
        value = rng.choice(_INTERESTING_BYTES) if rng.random() < 0.6 else rng.randrange(256)
        return {"kind": "byte", "pos": _position(rng, data), "value": value}
    if kind == "bytes":
        return {"kind": "bytes", "edits": [[_position(rng, data), rng.randrange(256)]
                                           for _ in range(rng.randrange(2, 9))]}
    if kind == "int":
        width = rng.choice((1, 2, 4, 8, 8))
        value = rng.choice(_INTERESTING_INTS + (n, n + 1, n - 1, rng.randrange(1 << 16)))
        return {"kind": "int", "pos": _position(rng, data), "width": width,
                "value": value % (1 << (8 * width))}
    if kind == "zero":
        start = _position(rng, data)
        return {"kind": "zero", "start": start, "len": rng.choice((1, 4, 8, 16, 64, 512, n))}
    if kind == "append":
        return {"kind": "append", "junk": rng.choice(("random", "zeros", "tail", "self")),
                "len": rng.choice((1, 7, 64, 4096, n)), "rs": rng.randrange(1 << 30)}
    if kind == "insert":
        return {"kind": "insert", "pos": _position(rng, data), "len": rng.choice((1, 2, 4, 8, 64)),
                "rs": rng.randrange(1 << 30)}
    if kind == "delete":
        return {"kind": "delete", "pos": _position(rng, data), "len": rng.choice((1, 2, 4, 8, 64))}
    if kind == "token":
        start, end = rng.choice(tokens)
        repl = rng.choice(("0", "-1", "1", "18446744073709551615", "18446744073709551616",
                           "4294967296", "9223372036854775807", "-9223372036854775808",
                           "1e308", "1.5", "null", "[]", "{}", '""', '"F4"', '"BF16"',
                           '"C64"', '"BOOL"', "true", "[1,2]", "'<f4'", "'|O'", "()", "(0,)",
                           "(4294967296, 4294967296)", "None", "True", "(-1,)"))
        return {"kind": "token", "start": start, "end": end, "repl": repl}
    if kind == "st_header":
        return {"kind": "st_header", "rs": rng.randrange(1 << 30)}
    if kind == "pickle":
        member, sites = rng.choice(_pickle_sites(data))
        edits = []
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            at, code, width = rng.choice(sites)
            if code in (b"\x88", b"\x89"):  # NEWTRUE <-> NEWFALSE
                edits.append([at, 0x88 if code == b"\x89" else 0x89])
            elif code in (b"\x85", b"\x86", b"\x87", b")"):  # TUPLE1..3, EMPTY_TUPLE
                edits.append([at, rng.choice((0x85, 0x86, 0x87, 0x29))])
            elif code == b"X":  # a short string argument: another name of its length
                names = [n for n in _PICKLE_NAMES if len(n) == width]
                if names:
                    new = rng.choice(names).encode()
                    edits += [[at + i, c] for i, c in enumerate(new)]
            else:  # K, M, J: an integer argument
                value = rng.choice(_INTERESTING_INTS + (3, 4, 5, 16, 100, 1000))
                edits += [[at + 1 + i, c] for i, c in enumerate(
                    (value % (1 << (8 * width))).to_bytes(width, "little"))]
        return {"kind": "pickle", "member": member, "edits": edits}
    if kind == "zip_member":
        members = _zip_members(data)
        pickles = [m for m in members if m[0].endswith(".pkl")]
        name, start, size = rng.choice(pickles if pickles and rng.random() < 0.7 else members)
        if size == 0:
            return {"kind": "zip_member", "name": name, "edits": []}
        edits = []
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            pos = rng.randrange(size)
            if rng.random() < 0.5:
                edits.append([pos, rng.choice(_INTERESTING_BYTES) if rng.random() < 0.5
                              else rng.randrange(256)])
            else:
                for i, byte in enumerate(rng.choice(_INTERESTING_INTS).to_bytes(8, "little")[
                        :rng.choice((1, 2, 4))]):
                    if pos + i < size:
                        edits.append([pos + i, byte])
        return {"kind": "zip_member", "name": name, "edits": edits}
    return {"kind": "npy_header", "rs": rng.randrange(1 << 30)}


def _junk(kind, length, rs, data):
    r = random.Random(rs)
    if kind == "zeros":
        return bytes(length)
    if kind == "tail":
        return (data[-64:] or b"\0") * (length // max(1, len(data[-64:])) + 1)
    if kind == "self":
        return data[:length]
    return bytes(r.randrange(256) for _ in range(length))


def _st_header(data, rs):
    """The safetensors file with its JSON header rewritten (one entry's dtype, shape or
    offsets, or the metadata), its length prefix kept right."""
    r = random.Random(rs)
    if len(data) < 8:
        return data
    (hlen,) = struct.unpack_from("<Q", data)
    try:
        header = json.loads(data[8:8 + hlen])
    except ValueError:
        return data
    if not isinstance(header, dict):
        return data
    body = data[8 + hlen:]
    names = [k for k in header if k != "__metadata__"]
    what = r.choice(("dtype", "shape", "offsets", "metadata", "entry", "drop"))
    if what == "metadata" or not names:
        header["__metadata__"] = r.choice(({"a": 1}, {"a": None}, {"a": {"b": "c"}}, [], "x",
                                           {"": ""}, {"format": "pt" * 1000}))
    else:
        name = r.choice(names)
        entry = header[name]
        if not isinstance(entry, dict):
            entry = header[name] = {}
        if what == "dtype":
            entry["dtype"] = r.choice(_ST_DTYPES)
        elif what == "shape":
            shape = list(entry.get("shape") or [])
            op = r.randrange(6)
            if op == 0 and shape:
                shape[r.randrange(len(shape))] = r.choice((0, 1, 2, 3, 1 << 31, 1 << 40, -1))
            elif op == 1:
                shape.append(r.choice((1, 2, 0)))
            elif op == 2 and shape:
                shape.pop(r.randrange(len(shape)))
            elif op == 3:
                shape = list(reversed(shape))
            elif op == 4:
                shape = [1] * r.randrange(0, 70)
            else:
                shape = []
            entry["shape"] = shape
        elif what == "offsets":
            offs = list(entry.get("data_offsets") or [0, 0])
            if len(offs) != 2:
                offs = [0, 0]
            op = r.randrange(5)
            if op == 0:
                offs = [offs[1], offs[0]]
            elif op == 1:
                offs[1] += r.choice((1, -1, 2, 7, len(body)))
            elif op == 2:
                offs[0] += r.choice((1, -1, 2, 7))
            elif op == 3:
                offs = [0, len(body)]
            else:
                offs = [len(body), len(body)]
            entry["data_offsets"] = offs
        elif what == "entry":
            header[name + r.choice(("", ".x", "/", "\u00e9", "\0"))] = r.choice(
                ({"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, {}, [], None,
                 {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16], "x": 1}))
        else:
            del header[name]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + body


def _npy_header(data, rs):
    """The NPY file with its header dict rewritten, its length field kept right."""
    r = random.Random(rs)
    if len(data) < 12 or not data.startswith(b"\x93NUMPY"):
        return data
    major = data[6]
    if major == 1:
        (hlen,), start = struct.unpack_from("<H", data, 8), 10
    else:
        (hlen,), start = struct.unpack_from("<I", data, 8), 12
    body = data[start + hlen:]
    descr = r.choice(_NPY_DESCRS)
    fortran = r.choice(("True", "False"))
    dims = r.choice(((), (0,), (1,), (3,), (2, 3), (len(body),), (len(body) // 2, 2),
                     (1 << 40,), (2, 0, 5), (1,) * 40, (7, 7)))
    shape = "(" + "".join(f"{d}, " for d in dims) + ")"
    text = ("{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape)).encode()
    pad = -(start + len(text) + 1) % 64
    text += b" " * pad + b"\n"
    if major == 1:
        if len(text) > 0xFFFF:
            return data
        return data[:8] + struct.pack("<H", len(text)) + text + body
    return data[:8] + struct.pack("<I", len(text)) + text + body


def _zip_members(data):
    """``[(name, data offset, size)]`` of a ZIP's stored (uncompressed) members."""
    import zipfile

    try:
        infos = zipfile.ZipFile(io.BytesIO(data)).infolist()
    except Exception:  # noqa: BLE001 - any damage: not a ZIP to edit
        return []
    out = []
    for info in infos:
        at = info.header_offset
        if info.compress_type != 0 or data[at:at + 4] != b"PK\x03\x04":
            continue
        nlen, elen = struct.unpack_from("<HH", data, at + 26)
        start = at + 30 + nlen + elen
        if start + info.file_size <= len(data):
            out.append((info.filename, start, info.file_size))
    return out


_PICKLE_NAMES = ("FloatStorage", "ShortStorage", "FloatStorage", "HalfStorage", "ByteStorage",
                 "CharStorage", "BoolStorage", "LongStorage", "IntStorage", "DoubleStorage",
                 "BFloat16Storage", "ComplexFloatStorage", "QInt8Storage", "QUInt8Storage",
                 "QInt32Storage", "cpu", "cud", "meta", "cuda", "float16", "float32", "bfloat16",
                 "int8", "uint8", "qint8", "int32", "int64", "quint8", "float64", "0", "1", "2",
                 "data", "_rebuild_tensor_v2", "_rebuild_parameter", "_rebuild_qtensor",
                 "_rebuild_sparse_tensor", "sparse_coo", "sparse_csr", "sparse_csc",
                 "sparse_bsr", "sparse_bsc", "per_tensor_affine", "per_channel_affine",
                 "per_channel_affine_float_qparams", "OrderedDict", "strided")


def _pickle_sites(data):
    """``[(member, [(offset, opcode, argument width)])]``: the opcodes of a checkpoint's
    pickles (``data.pkl`` of a ZIP, the pickles a legacy file starts with) whose
    argument a same-length edit can change. ``member`` is None for a legacy file."""
    import pickletools

    def sites(raw, base):
        out = []
        pos = 0
        for _ in range(6):  # a legacy file: magic, protocol, sys info, object, keys
            try:
                ops = list(pickletools.genops(raw[pos:]))
            except Exception:  # noqa: BLE001 - the pickle ends or is damaged
                break
            for op, arg, at in ops:
                c = op.code.encode("latin-1")
                if c in (b"K", b"M", b"J"):
                    out.append((base + pos + at, c, {b"K": 1, b"M": 2, b"J": 4}[c]))
                elif c in (b"\x88", b"\x89", b"\x85", b"\x86", b"\x87", b")"):
                    out.append((base + pos + at, c, 0))
                elif c in (b"X", b"\x8c") and isinstance(arg, str):
                    # Kept as the offset of the string itself, under "X".
                    skip = 5 if c == b"X" else 2
                    out.append((base + pos + at + skip, b"X", len(arg.encode())))
            pos += ops[-1][2] + 1 if ops else len(raw)
            if pos >= len(raw):
                break
        return out

    if data[:4] == b"PK\x03\x04":
        for name, start, size in _zip_members(data):
            if name.endswith("data.pkl"):
                found = sites(data[start:start + size], 0)
                return [(name, found)] if found else []
        return []
    found = sites(data, 0)
    return [(None, found)] if found else []


def _zip_edit(data, name, edits):
    """The ZIP with bytes of stored member ``name`` changed and its CRC-32 fixed in
    the local header, the data descriptor and the central directory, so the change
    reaches the member's reader rather than the CRC check."""
    import zlib

    for member, start, size in _zip_members(data):
        if member != name:
            continue
        b = bytearray(data)
        for pos, value in edits:
            b[start + pos] = value
        crc = struct.pack("<I", zlib.crc32(bytes(b[start:start + size])))
        encoded = name.encode()
        for m in re.finditer(re.escape(b"PK\x03\x04"), data):
            at = m.start()
            if at + 30 <= len(b) and data[at + 30:at + 30 + len(encoded)] == encoded:
                if struct.unpack_from("<I", data, at + 14)[0]:
                    b[at + 14:at + 18] = crc
                if struct.unpack_from("<H", data, at + 6)[0] & 8:
                    d = start + size
                    d += 4 if data[d:d + 4] == b"PK\x07\x08" else 0
                    if struct.unpack_from("<I", data, d)[0]:
                        b[d:d + 4] = crc
        for m in re.finditer(re.escape(b"PK\x01\x02"), data):
            at = m.start()
            if data[at + 46:at + 46 + len(encoded)] == encoded and \
                    struct.unpack_from("<I", data, at + 16)[0]:
                b[at + 16:at + 20] = crc
        return bytes(b)
    return data


def mutate(data, m):
    """``data`` with the mutation recipe ``m`` applied."""
    b = bytearray(data)
    k = m["kind"]
    if k == "truncate":
        return bytes(b[:m["at"]])
    if k == "flip":
        b[m["pos"]] ^= 1 << m["bit"]
    elif k == "byte":
        b[m["pos"]] = m["value"]
    elif k == "bytes":
        for pos, value in m["edits"]:
            b[pos] = value
    elif k == "int":
        raw = m["value"].to_bytes(m["width"], "little")
        b[m["pos"]:m["pos"] + m["width"]] = raw[:max(0, len(b) - m["pos"])]
    elif k == "zero":
        end = min(len(b), m["start"] + m["len"])
        b[m["start"]:end] = bytes(end - m["start"])
    elif k == "append":
        b += _junk(m["junk"], m["len"], m["rs"], data)[:m["len"]]
    elif k == "insert":
        b[m["pos"]:m["pos"]] = _junk("random", m["len"], m["rs"], data)
    elif k == "delete":
        del b[m["pos"]:m["pos"] + m["len"]]
    elif k == "token":
        b[m["start"]:m["end"]] = m["repl"].encode()
    elif k == "st_header":
        return _st_header(bytes(b), m["rs"])
    elif k == "zip_member":
        return _zip_edit(bytes(b), m["name"], m["edits"])
    elif k == "pickle":
        if m["member"] is not None:
            return _zip_edit(bytes(b), m["member"], m["edits"])
        for pos, value in m["edits"]:
            if pos < len(b):
                b[pos] = value
    elif k == "npy_header":
        return _npy_header(bytes(b), m["rs"])
    return bytes(b)


def make_case(seed, index, seed_list):
    """Case ``index`` of the sweep with RNG seed ``seed``: its fixture and mutation."""
    rng = random.Random(f"{seed}:{index}")
    seed_id, path, group, open_name = rng.choice(seed_list)
    with open(path, "rb") as f:
        data = f.read()
    chain = [draw_mutation(rng, data, seed_id)]
    # Now and then a second mutation on top of the first.
    if rng.random() < 0.15:
        chain.append(draw_mutation(rng, mutate(data, chain[0]), seed_id))
    return {"id": index, "seed": seed_id, "mutations": chain}


def materialize(case, seed_list, workdir):
    """Writes the case's files under ``workdir``; returns (path to open, its bytes)."""
    by_id = {s[0]: s for s in seed_list}
    seed_id, path, group, open_name = by_id[case["seed"]]
    with open(path, "rb") as f:
        data = f.read()
    for m in case["mutations"]:
        data = mutate(data, m)
    os.makedirs(workdir, exist_ok=True)
    if group is not None:
        for f in os.listdir(group):
            if not f.endswith((".py", ".md")) and ".expected." not in f:
                shutil.copyfile(os.path.join(group, f), os.path.join(workdir, f))
    target = os.path.join(workdir, os.path.basename(path))
    with open(target, "wb") as f:
        f.write(data)
    opened = os.path.join(workdir, open_name)
    with open(opened, "rb") as f:
        return opened, f.read()


# ---------------------------------------------------------------------------
# Operations (run in the worker)


class Invariant(Exception):
    """A result that contradicts another (not raised by tensorwire itself)."""


def _names(reader):
    return list(reader.keys())[:MAX_NAMES]


def _same_bytes(a, b, what):
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        raise Invariant(f"{what}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}")
    if a.dtype == np.bool_:  # a byte other than 0 and 1 is True, however copied
        a, b = a.view(np.uint8) != 0, b.view(np.uint8) != 0
    if np.ascontiguousarray(a).tobytes() != np.ascontiguousarray(b).tobytes():
        raise Invariant(f"{what}: the bytes differ")


def _torch_bytes(t):
    import torch

    t = t.detach()
    if t.is_quantized:
        t = t.int_repr()
    if t.layout != torch.strided:
        return None
    # A fresh row-major copy (contiguous() keeps any stride of a size-1 dimension).
    t = torch.empty(t.shape, dtype=t.dtype).copy_(t)
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:  # a byte other than 0 and 1 is True, however copied
        t = t.view(torch.uint8) != 0
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def _touch_torch(t):
    """What a caller does with a tensor: look at it, sum it, copy it."""
    import torch

    if not isinstance(t, torch.Tensor):
        return
    if t.is_quantized:
        # torch copies a float_qparams tensor with gaps (clone) only in row-major order.
        if t.qscheme() != torch.per_channel_affine_float_qparams or t.is_contiguous():
            t.dequantize().sum()
    elif t.layout != torch.strided:
        t.to_dense().sum() if t.numel() < (1 << 24) else None
    elif t.device.type == "cpu":
        t.clone()
        if t.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64,
                       torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                       torch.bool, torch.complex64, torch.complex128):
            t.sum()


def _touch_numpy(a):
    import numpy as np

    if isinstance(a, np.ndarray):
        np.array(a, copy=True)
        if a.dtype.kind in "biuf":
            a.sum()


def _have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def _try(fn, *args, **kwargs):
    """``fn(...)``, or None when it raises a typed error (the promised outcome for bad
    input: the op goes on with the next step, so one refusal hides no later path)."""
    import tensorwire as tw

    try:
        return fn(*args, **kwargs)
    except (tw.TensorwireError, OSError):
        return None


def op_reader(path, data):
    import numpy as np

    import tensorwire as tw

    with tw.Reader(path) as r:
        r.format, r.attributes, r.path, repr(r)
        names = _names(r)
        _try(r.metadata, names)
        _try(r._sorted_by_offset, names)
        for n in names:
            meta = _try(r.metadata, n)
            repr(meta)
            t = _try(r.read, n)
            if t is not None and t.format == "dense":
                t.numpy()
            _try(r.read, n, copy=True)
            a = _read_numpy_both_ways(r, n, "read_numpy")
            if a is None:
                continue
            if isinstance(a, np.ndarray) and a.dtype.kind != "O":
                _try(r.read_into, n, np.empty(a.shape, a.dtype))
                _try(r.read_into, {n: np.empty(a.shape, a.dtype)})
        if names:
            _try(r.read_numpy, names)
            _try(r.read, names)
        if _have_torch():
            import torch

            for n in names:
                t = _try(r.read_torch, n)
                tc = _try(r.read_torch, n, copy=True)
                if t is None or tc is None:
                    continue
                if t.dtype != tc.dtype or t.shape != tc.shape:
                    raise Invariant(f"read_torch({n!r}) {t.dtype}{list(t.shape)} vs copy=True "
                                    f"{tc.dtype}{list(tc.shape)}")
                if _torch_bytes(t) != _torch_bytes(tc):
                    raise Invariant(f"read_torch({n!r}) vs copy=True: the bytes differ")
                _touch_torch(t)
                dst = torch.empty_like(tc)
                _try(r.read_into, n, dst)
            if names:
                _try(r.read_torch, names)
                _try(r.read_torch, names, copy=True)
        _try(r.verify)


def _read_numpy_both_ways(r, n, label):
    """``r.read_numpy(n)`` (None when it raised a typed error), checked equal to its
    ``copy=True`` read and touched end to end."""
    a = _try(r.read_numpy, n)
    if a is None:
        return None
    c = _try(r.read_numpy, n, copy=True)
    if c is not None:
        _same_bytes(a, c, f"{label}({n!r}) vs copy=True")
    _touch_numpy(a)
    return a


def op_buffer(path, data):
    import tensorwire as tw

    for buf in (data, bytearray(data)):
        with tw.Reader(buffer=buf) as r:
            names = _names(r)
            for n in names:
                _try(r.metadata, n)
                _try(r.read, n)
                a = _read_numpy_both_ways(r, n, "buffer read_numpy")
                if a is None:
                    continue
                if _have_torch():
                    _touch_torch(_try(r.read_torch, n))
            _try(r.verify)


def op_pytorch(path, data):
    import tensorwire as tw
    from tensorwire import pytorch

    try:
        pytorch.open(path).close()
    except tw.UnsupportedError:
        return "skip"
    got = _try(pytorch.load_numpy, path) or {}
    for a in got.values():
        _touch_numpy(a)
    _try(pytorch.load_numpy, path, flat=False)
    _try(pytorch.load_numpy, path, mmap=False)
    _try(pytorch.load_numpy, data)
    if not _have_torch():
        return None
    for kwargs in ({}, {"flat": False}, {"mmap": False}, {"map_location": "cpu"},
                   {"map_location": lambda s, loc: s}):
        out = _try(pytorch.load, path, **kwargs)
        if isinstance(out, dict):
            for t in out.values():
                _touch_torch(t)
    try:
        _try(pytorch.load, path, map_location="meta")
    except NotImplementedError:
        _torch_fails_on_meta_too(path)
    for t in (_try(pytorch.load, data) or {}).values():
        _touch_torch(t)
    _try(pytorch.load, io.BytesIO(data), flat=False)
    pytorch.load(path)  # the op's outcome: typed or ok
    return None


def _torch_fails_on_meta_too(path):
    """``pytorch.load(map_location="meta")`` raised torch's NotImplementedError (torch
    has no quantized tensors on "meta"; sparse ones are built there unchecked):
    promised only where ``torch.load`` does not build the same checkpoint on "meta"."""
    import torch

    try:
        torch.load(path, weights_only=True, map_location="meta")
    except Exception:  # noqa: BLE001 - NotImplementedError, or a file torch refuses
        return
    raise Invariant('pytorch.load(map_location="meta") raised NotImplementedError '
                    "where torch.load builds the checkpoint")


def op_formats(path, data):
    from tensorwire import formats

    for a in (_try(formats.load_file, path) or {}).values():
        _touch_numpy(a)
    _try(formats.load, data)
    frameworks = ["np", "pt"] if _have_torch() else ["np"]
    for fw in frameworks:
        if fw == "pt":
            _try(formats.load_file, path, framework="pt")
            _try(formats.load, data, framework="pt")
        with formats.safe_open(path, framework=fw) as f:
            f.metadata()
            names = f.keys()[:MAX_NAMES]
            f.offset_keys()
            for n in names:
                _try(f.get_tensor, n)
                s = _try(f.get_slice, n)
                if s is None:
                    continue
                shape = s.get_shape()
                s.get_dtype()
                for index in (Ellipsis, slice(None), slice(0, 1), slice(None, None, 2),
                              (slice(None),) * max(1, len(shape)), -1, 0, (0,) * len(shape)):
                    _try(s.__getitem__, index)
                if shape:
                    len(s)
            _try(f.get_tensors)


def op_convert(path, data):
    """``convert`` to each output format; what it writes must read back as the
    source reads."""
    out_dir = tempfile.mkdtemp(prefix="tw-convert-", dir=os.path.dirname(path))
    try:
        _convert_each(path, out_dir)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def _convert_each(path, out_dir):
    import numpy as np

    import tensorwire as tw

    for i, (ext, kwargs) in enumerate((("zt", {}), ("zt", {"zt_version": 2, "checksum": "xxh3"}),
                                       ("zt", {"compress": True, "checksum": "crc32c"}),
                                       ("safetensors", {}))):
        dst = os.path.join(out_dir, f"converted{i}.{ext}")
        if _try(tw.convert, path, dst, **kwargs) is None:
            continue
        try:
            with tw.Reader(path) as src, tw.Reader(dst) as back:
                for n in _names(back):
                    want = _try(src.read_numpy, n)
                    if want is None:  # (not a numpy array: a sparse one, an odd type)
                        _try(back.read_numpy, n)
                        continue
                    if back.metadata(n).type is not None:
                        # A logical type tensorwire has no dtype for (a user's own): a
                        # version 1 view gives the storage, version 2 refuses it.
                        got = _try(back.read_numpy, n)
                        if got is None:
                            continue
                    else:
                        got = back.read_numpy(n)
                    if ext == "safetensors":
                        continue  # safetensors keeps raw bytes of some types
                    if back.metadata(n).type in ("f4_e2m1", "f8_e8m0") and \
                            isinstance(want, np.ndarray):
                        # Read as their bytes: f4_e2m1 flat (two values per byte),
                        # f8_e8m0 with the logical shape a safetensors source lists
                        # flat. The bytes must agree, and the logical shapes.
                        want = np.ascontiguousarray(want).reshape(-1)
                        got = np.ascontiguousarray(got).reshape(-1)
                        from tensorwire.formats import safe_open

                        with safe_open(path) as a, safe_open(dst) as b:
                            shapes = a.get_slice(n).get_shape(), b.get_slice(n).get_shape()
                        if shapes[0] != shapes[1]:
                            raise Invariant(f"convert to {ext} {kwargs}: {n!r}: logical "
                                            f"shape {shapes[0]} became {shapes[1]}")
                    if isinstance(want, np.ndarray) and want.dtype == got.dtype:
                        _same_bytes(want, got, f"convert to {ext} {kwargs}: {n!r}")
                back.verify()
        except (tw.TensorwireError, OSError) as e:
            raise Invariant(f"convert to {ext} {kwargs} wrote a file that does not read "
                            f"back: {type(e).__name__}: {e}") from e


def _compare_torch(ours, theirs, where, values=True):
    """Raises Invariant where ``pytorch.load(flat=False)``'s object differs from
    ``torch.load``'s."""
    import torch

    if isinstance(theirs, torch.Tensor):
        if not isinstance(ours, torch.Tensor):
            raise Invariant(f"{where}: {type(ours).__name__}, torch.load a tensor")
        for attr in ("dtype", "shape", "layout", "is_quantized", "requires_grad"):
            if getattr(ours, attr) != getattr(theirs, attr):
                raise Invariant(f"{where}: {attr} {getattr(ours, attr)} vs torch.load's "
                                f"{getattr(theirs, attr)}")
        if isinstance(ours, torch.nn.Parameter) != isinstance(theirs, torch.nn.Parameter):
            raise Invariant(f"{where}: Parameter or not differs from torch.load")
        if theirs.layout == torch.strided:
            if ours.stride() != theirs.stride():
                raise Invariant(f"{where}: stride {ours.stride()} vs {theirs.stride()}")
            if ours.is_quantized:
                if ours.qscheme() != theirs.qscheme():
                    raise Invariant(f"{where}: qscheme differs")
                if ours.qscheme() == torch.per_tensor_affine:
                    # A NaN scale (a pickle may hold one, and torch keeps it) is not
                    # equal to itself.
                    a, b = ours.q_scale(), theirs.q_scale()
                    same_scale = a == b or (math.isnan(a) and math.isnan(b))
                    if not same_scale or ours.q_zero_point() != theirs.q_zero_point():
                        raise Invariant(f"{where}: scale/zero point differ")
            # (torch.load does not swap the bytes of a big-endian file's uint16, uint32
            # and uint64 tensors: values are compared for little-endian files only.)
            if values and theirs.device.type != "meta" and \
                    _torch_bytes(ours) != _torch_bytes(theirs):
                raise Invariant(f"{where}: values differ from torch.load's")
        return
    if isinstance(theirs, dict):
        if not isinstance(ours, dict) or list(ours) != list(theirs):
            raise Invariant(f"{where}: keys {list(ours)[:8] if isinstance(ours, dict) else ours!r}"
                            f" vs torch.load's {list(theirs)[:8]}")
        for k in theirs:
            _compare_torch(ours[k], theirs[k], f"{where}[{k!r}]", values)
        return
    if isinstance(theirs, (list, tuple)):
        if type(ours) is not type(theirs) or len(ours) != len(theirs):
            raise Invariant(f"{where}: {type(ours).__name__} vs torch.load's "
                            f"{type(theirs).__name__} of {len(theirs)}")
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _compare_torch(a, b, f"{where}[{i}]", values)
        return
    if isinstance(theirs, torch.serialization.StorageType):  # no __eq__: by dtype
        same = type(ours) is type(theirs) and ours.dtype == theirs.dtype
    else:
        same = ours == theirs or _both_nan(ours, theirs)
    if not isinstance(same, bool) or not same:
        raise Invariant(f"{where}: {ours!r:.80} vs torch.load's {theirs!r:.80}")


def _both_nan(ours, theirs):
    """Whether two floats, or two complex numbers part by part, are equal but for
    NaNs in the same places (a NaN is not equal to itself)."""
    def same(a, b):
        return a == b or (a != a and b != b)

    if isinstance(theirs, float) and isinstance(ours, float):
        return same(ours, theirs)
    if isinstance(theirs, complex) and isinstance(ours, complex):
        return same(ours.real, theirs.real) and same(ours.imag, theirs.imag)
    return False


def op_torchdiff(path, data):
    """``pytorch.load(flat=False)`` against ``torch.load(weights_only=True)`` where both
    read the file: the same objects, dtypes, shapes, strides and values."""
    if not _have_torch():
        return "skip"
    import warnings

    import torch

    import tensorwire as tw
    from tensorwire import pytorch

    # A big-endian checkpoint (a `byteorder` record saying "big", damaged or not).
    at = data.find(b"/byteorder")
    big = at >= 0 and b"big" in data[at:at + 200]
    # torch's ZIP reader (miniz) takes a record whose central directory entry has the
    # MS-DOS directory attribute for a directory, and reads other bytes for it.
    for m in re.finditer(re.escape(b"PK\x01\x02"), data):
        if m.start() + 42 <= len(data) and data[m.start() + 38] & 0x10:
            big = True  # (values not compared)
    try:
        ours = pytorch.load(path, flat=False)
    except (tw.TensorwireError, OSError):
        return "skip"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - torch refuses what tensorwire read
        return ("lenient", f"{type(e).__name__}: {str(e)[:300]}")
    _compare_torch(ours, theirs, "load", values=not big)
    return None


def op_packet(path, data):
    import numpy as np

    import tensorwire as tw
    from tensorwire import packet

    def touch(obj):
        if isinstance(obj, dict):
            for v in obj.values():
                touch(v)
        elif isinstance(obj, np.ndarray):
            _touch_numpy(obj)
        elif isinstance(obj, (packet.StringTensor, packet.RaggedArray)):
            obj.to_list()
            repr(obj)
        elif isinstance(obj, packet.QuantizedTensor):
            repr(obj)
            obj.dequantize()
        elif hasattr(obj, "tocoo"):
            obj.tocoo()
            # A copy: scipy canonicalizes a matrix in place, which a zero-copy (read-only)
            # one refuses, as tenso's do.
            obj.copy().sum()

    results = []
    for fn in (lambda: packet.get_packet_info(data),
               lambda: touch(packet.loads(data)),
               lambda: touch(packet.loads(data, copy=True)),
               lambda: touch(packet.loads(np.frombuffer(data, np.uint8)))):
        try:
            results.append(fn())
        except tw.TensorwireError:
            pass
    stream = io.BytesIO(data)
    for _ in range(64):  # a stream of packets, as stream.bin holds
        try:
            obj = packet.read_stream(stream)
        except tw.TensorwireError:
            break
        if obj is None:
            break
        touch(obj)
    with open(path, "rb") as f:
        try:
            touch(packet.load(f, mmap_mode=True))
        except (tw.TensorwireError, EOFError):
            pass
        f.seek(0)
        touch(packet.load(f))
    return None


def op_cli(path, data):
    if not os.path.exists(CLI):
        return "skip"
    for cmd in ("inspect", "verify"):
        p = subprocess.run([CLI, cmd, path], capture_output=True, timeout=20)
        err = p.stderr.decode(errors="replace")
        if "panicked" in err or "RUST_BACKTRACE" in err:
            raise CliPanic(f"{cmd}: {err[-800:]}")
        if p.returncode < 0:
            raise CliCrash(f"{cmd}: killed by signal {-p.returncode}: {err[-400:]}")
        if p.returncode not in (0, 1, 2):
            raise CliCrash(f"{cmd}: exit status {p.returncode}: {err[-400:]}")
        if p.returncode:
            return "typed"
    return None


class CliPanic(Exception):
    pass


class CliCrash(Exception):
    pass


OPS = {"reader": op_reader, "buffer": op_buffer, "pytorch": op_pytorch,
       "formats": op_formats, "convert": op_convert, "packet": op_packet, "cli": op_cli,
       "torchdiff": op_torchdiff}


def classify(exc):
    """(outcome, exception type name) for an exception an op raised."""
    import tensorwire as tw

    name = type(exc).__name__
    if isinstance(exc, Invariant):
        return "invariant", name
    if isinstance(exc, CliPanic) or name == "PanicException":
        return "panic", name
    if isinstance(exc, CliCrash):
        return "crash", name
    if isinstance(exc, subprocess.TimeoutExpired):
        return "timeout", name
    if isinstance(exc, MemoryError):
        return "memory", name
    if isinstance(exc, ImportError):  # an optional package (scipy for sparse packets)
        return "skip", name
    if isinstance(exc, (tw.TensorwireError, OSError)):
        return "typed", name
    if isinstance(exc, EOFError):  # packet.load on an empty file, as tenso
        return "typed", name
    return "untyped", name


def run_op(name, path, data):
    """Runs one op; returns the outcome record (without the case)."""
    try:
        got = OPS[name](path, data)
    except BaseException as e:  # noqa: BLE001 - classifying everything is the point
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        outcome, tname = classify(e)
        rec = {"op": name, "outcome": outcome, "type": tname}
        if outcome in PROBLEMS:
            rec["message"] = str(e)[:600]
            rec["traceback"] = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:]
            rec["where"] = _where(e)
        return rec
    if isinstance(got, tuple):
        return {"op": name, "outcome": got[0], "message": got[1]}
    if got in ("skip", "typed"):
        return {"op": name, "outcome": got, "type": "exit status"}
    return {"op": name, "outcome": "ok"}


def _where(exc):
    """The innermost traceback frame in tensorwire's code (or the innermost one)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "tensorwire" in f.filename and "hostile_sweep" not in f.filename]
    f = (ours or frames or [None])[-1]
    if f is None:
        return "?"
    return f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}"


def _cap_address_space():
    import resource

    with open("/proc/self/status") as f:
        vm = [int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize")][0]
    limit = vm + EXTRA_ADDRESS_SPACE
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def worker_main(seed, ops):
    """Reads case ids on stdin, writes an event per op start and per outcome."""
    import numpy  # noqa: F401

    import tensorwire  # noqa: F401

    if _have_torch():
        import torch  # noqa: F401
    try:
        import scipy.sparse  # noqa: F401
    except ImportError:
        pass
    seed_list = seeds()
    _cap_address_space()
    out = sys.stdout
    base = tempfile.mkdtemp(prefix="tw-sweep-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    out.write(json.dumps({"ready": True, "base": base}) + "\n")
    out.flush()
    for line in sys.stdin:
        index, case_ops = line.split()
        index = int(index)
        case = make_case(seed, index, seed_list)
        workdir = os.path.join(base, str(index))
        try:
            path, data = materialize(case, seed_list, workdir)
        except Exception as e:  # noqa: BLE001 - the harness's own failure
            path = None
            for name in case_ops.split(","):
                out.write(json.dumps({"op": name, "outcome": "harness", "id": index,
                                      "type": type(e).__name__, "message": str(e),
                                      "where": "materialize"}) + "\n")
        try:
            for name in case_ops.split(",") if path is not None else ():
                out.write(json.dumps({"start": name, "id": index}) + "\n")
                out.flush()
                rec = run_op(name, path, data)
                rec["id"] = index
                out.write(json.dumps(rec) + "\n")
                out.flush()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        out.write(json.dumps({"done": index}) + "\n")
        out.flush()
    shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------------------
# Driver


class Worker:
    def __init__(self, seed, ops):
        env = dict(os.environ, PYTHONFAULTHANDLER="1", RUST_BACKTRACE="0")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", "--seed", str(seed),
             "--ops", ",".join(ops)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, cwd=REPO)
        self.buf = b""
        self.err = collections.deque(maxlen=60)
        msg = self.read(120)
        if not (isinstance(msg, dict) and msg.get("ready")):
            raise RuntimeError(f"worker failed to start: {msg} {self.stderr_tail()}")
        self.base = msg["base"]  # the worker's scratch folder (a dead one leaves it)

    def read(self, timeout):
        """The next event, None at EOF, or "timeout"."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            ready, _, _ = select.select([self.proc.stdout, self.proc.stderr], [], [], left)
            if self.proc.stderr in ready:
                chunk = os.read(self.proc.stderr.fileno(), 65536)
                if chunk:
                    self.err.extend(chunk.decode(errors="replace").splitlines())
            if self.proc.stdout in ready:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    return None
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def stderr_tail(self):
        # Drain what is left.
        try:
            while select.select([self.proc.stderr], [], [], 0.2)[0]:
                chunk = os.read(self.proc.stderr.fileno(), 65536)
                if not chunk:
                    break
                self.err.extend(chunk.decode(errors="replace").splitlines())
        except (OSError, ValueError):
            pass
        return "\n".join(self.err)[-3000:]

    def send(self, index, ops):
        self.proc.stdin.write(f"{index} {','.join(ops)}\n".encode())
        self.proc.stdin.flush()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)


def sweep(seed=1, cases=1000, start=0, ops=ALL_OPS, timeout=10.0, out=None, progress=True,
          cli_every=10):
    """Runs cases ``start .. start + cases``; returns the summary dict."""
    ops = [o for o in ops if o in OPS]
    counts = {o: collections.Counter() for o in ops}
    typed = collections.Counter()
    problems = {}
    results = open(os.path.join(out, "results.jsonl"), "w") if out else None
    worker = None
    t0 = time.monotonic()

    def record(rec, case_id):
        counts[rec["op"]][rec["outcome"]] += 1
        if rec["outcome"] == "typed":
            typed[rec["type"]] += 1
        if rec["outcome"] == "lenient" and results:
            results.write(json.dumps(dict(rec, case=make_case(seed, case_id, seed_list))) + "\n")
        if rec["outcome"] in PROBLEMS:
            rec["case"] = make_case(seed, case_id, seed_list)
            key = (rec["op"], rec["outcome"], rec.get("type"), rec.get("where"))
            p = problems.setdefault(key, {"count": 0, "first": case_id,
                                          "message": rec.get("message", "")[:300]})
            p["count"] += 1
            if results:
                results.write(json.dumps(rec) + "\n")
                results.flush()

    seed_list = seeds()
    for index in range(start, start + cases):
        case_ops = [o for o in ops if o != "cli" or index % cli_every == 0]
        if worker is None or worker.proc.poll() is not None:
            worker = Worker(seed, ops)
        worker.send(index, case_ops)
        pending = None
        while True:
            msg = worker.read(timeout)
            if msg == "timeout" or msg is None:
                outcome = "timeout" if msg == "timeout" else "crash"
                worker.kill()
                tail = worker.stderr_tail()
                op = pending or "?"
                record({"op": op if op in counts else ops[0], "outcome": outcome,
                        "type": f"rc={worker.proc.returncode}", "where": _crash_where(tail),
                        "message": tail[-1500:]}, index)
                worker = None
                break
            if "start" in msg:
                pending = msg["start"]
                continue
            if "done" in msg:
                break
            pending = None
            record(msg, index)
        if progress and (index - start + 1) % 200 == 0:
            bad = sum(p["count"] for p in problems.values())
            print(f"[{time.monotonic() - t0:7.0f}s] {index - start + 1}/{cases} cases, "
                  f"{bad} problems ({len(problems)} distinct)", flush=True)
    if worker is not None:
        worker.proc.stdin.close()
        try:
            worker.proc.wait(timeout=10)  # it removes its scratch folder
        except subprocess.TimeoutExpired:
            pass
        worker.kill()
    summary = {"seed": seed, "start": start, "cases": cases,
               "counts": {o: dict(c) for o, c in counts.items()},
               "typed": dict(typed.most_common()),
               "problems": [{"op": k[0], "outcome": k[1], "type": k[2], "where": k[3], **v}
                            for k, v in sorted(problems.items(), key=lambda kv: -kv[1]["count"])]}
    if results:
        results.close()
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
    return summary


def _crash_where(tail):
    """The innermost Python frame faulthandler printed (or the signal line)."""
    for line in tail.splitlines():
        if line.strip().startswith("File ") and "tensorwire" in line:
            return line.strip()[:200]
    lines = [l for l in tail.splitlines() if "Fatal Python error" in l]
    return lines[0][:200] if lines else "?"


def print_summary(summary):
    print(f"seed {summary['seed']}, cases {summary['start']}..{summary['start'] + summary['cases']}")
    kinds = ("ok", "typed", "skip", "lenient") + PROBLEMS
    print("op        " + "".join(f"{k:>10}" for k in kinds))
    for op, c in summary["counts"].items():
        print(f"{op:10}" + "".join(f"{c.get(k, 0):>10}" for k in kinds))
    print("typed errors:", ", ".join(f"{k} {v}" for k, v in summary["typed"].items()))
    for p in summary["problems"]:
        print(f"- {p['op']} {p['outcome']} {p['type']} at {p['where']} x{p['count']} "
              f"(case {p['first']}): {p['message'][:200]}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--ops", default=",".join(ALL_OPS))
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--cli-every", type=int, default=10, help="run the CLI on every Nth case")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--replay", type=int, default=None, help="run one case in this process")
    ap.add_argument("--write", type=int, default=None, help="write one case's files to --out")
    ap.add_argument("--only", default=None,
                    help="mutate only the fixtures whose id (path under fixtures/) contains this")
    args = ap.parse_args(argv)
    if args.only:
        os.environ[ONLY_ENV] = args.only
    ops = [o for o in args.ops.split(",") if o]
    if args.worker:
        worker_main(args.seed, ops)
        return 0
    if args.replay is not None or args.write is not None:
        index = args.replay if args.replay is not None else args.write
        seed_list = seeds()
        case = make_case(args.seed, index, seed_list)
        print(json.dumps(case))
        workdir = args.out or tempfile.mkdtemp(prefix="tw-case-")
        path, data = materialize(case, seed_list, workdir)
        print("written:", path)
        if args.replay is not None:
            for name in ops:
                rec = run_op(name, path, data)
                print(name, rec["outcome"], rec.get("type", ""), rec.get("message", ""))
                if "traceback" in rec:
                    print(rec["traceback"])
        return 0
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    summary = sweep(args.seed, args.cases, args.start, ops, args.timeout, args.out,
                    cli_every=args.cli_every)
    print_summary(summary)
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
