#!/usr/bin/env python3
"""Write the benchmark checkpoint: one transformer-shaped float32 state dict, ~500 MiB,
~185 tensors, fixed-seed random data, in several formats side by side.

    python benches/python/make_checkpoint.py [--out bench-data] [--force]

Files (each skipped when it already exists, unless --force):
  model.safetensors  written by `safetensors.numpy.save_file`
  model.zt           written by ztensor 1.2.3 (`ztensor.Writer(...).write_numpy`)
  model.npz          written by `np.savez` (stored members)
  model.gguf         written by `gguf.GGUFWriter` (float32 tensors)
  model.vocab.gguf   the same, plus the tokenizer metadata of a Llama 3-sized
                     vocabulary (128 256 tokens with scores and types, 280 147
                     merges), as real GGUF models carry
  model.tw.zt        written by tensorwire (`tensorwire.Writer(...).add`), only when
                     `import tensorwire` works
  model.safetensors.index.json
                     the same tensors split into 3 safetensors shards
                     (`model-0000N-of-00003.safetensors`, each by `save_file`) and
                     the index Hugging Face's `save_pretrained` writes beside them

Shapes are Llama/Qwen-like (hidden 768, GQA with 4 KV heads, q/k norms, q/k/v biases,
SwiGLU MLP 2048, vocab 32000, 13 layers, untied lm_head): 13 * 14 + 3 = 185 tensors,
~499 MiB. `--layers` / `--vocab` scale it (e.g. `--layers 2` for a quick smoke run).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HIDDEN = 768
HEAD_DIM = 64
KV_DIM = 4 * HEAD_DIM  # 4 KV heads
FFN = 2048


def state_dict_shapes(layers: int, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, HIDDEN))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (HIDDEN,)),
            (p + "self_attn.q_proj.weight", (HIDDEN, HIDDEN)),
            (p + "self_attn.q_proj.bias", (HIDDEN,)),
            (p + "self_attn.k_proj.weight", (KV_DIM, HIDDEN)),
            (p + "self_attn.k_proj.bias", (KV_DIM,)),
            (p + "self_attn.v_proj.weight", (KV_DIM, HIDDEN)),
            (p + "self_attn.v_proj.bias", (KV_DIM,)),
            (p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
            (p + "self_attn.q_norm.weight", (HEAD_DIM,)),
            (p + "self_attn.k_norm.weight", (HEAD_DIM,)),
            (p + "post_attention_layernorm.weight", (HIDDEN,)),
            (p + "mlp.gate_proj.weight", (FFN, HIDDEN)),
            (p + "mlp.up_proj.weight", (FFN, HIDDEN)),
            (p + "mlp.down_proj.weight", (HIDDEN, FFN)),
        ]
    shapes += [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (vocab, HIDDEN))]
    return shapes


def make_tensors(layers: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in state_dict_shapes(layers, vocab):
        if name.endswith("norm.weight"):
            arr = 1.0 + 0.02 * rng.standard_normal(shape, dtype=np.float32)
        else:
            arr = rng.standard_normal(shape, dtype=np.float32)
            arr *= np.float32(0.02)
        out[name] = np.ascontiguousarray(arr, dtype=np.float32)
    return out


def _write_atomically(path: str, write) -> None:
    tmp = path + ".partial"
    if os.path.exists(tmp):
        os.remove(tmp)
    t0 = time.perf_counter()
    write(tmp)
    os.replace(tmp, path)
    size = os.path.getsize(path)
    print(f"  wrote {path}  {size / 2**20:.1f} MiB  in {time.perf_counter() - t0:.1f} s")


def write_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file

    _write_atomically(path, lambda p: save_file(tensors, p))


SHARDS = 3


def write_sharded_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
    """Shards in tensor order, each closed once it holds a third of the bytes (as
    huggingface_hub's splitter fills shards up to `max_shard_size`), then the index."""
    import json

    from safetensors.numpy import save_file

    folder = os.path.dirname(path)
    budget = sum(a.nbytes for a in tensors.values()) / SHARDS
    groups: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, a in tensors.items():
        if size >= budget and len(groups) < SHARDS:
            groups.append({})
            size = 0
        groups[-1][name] = a
        size += a.nbytes
    weight_map = {}
    for i, group in enumerate(groups, 1):
        shard = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        _write_atomically(os.path.join(folder, shard), lambda p, g=group: save_file(g, p))
        weight_map.update({name: shard for name in group})
    index = {"metadata": {"total_size": sum(a.nbytes for a in tensors.values())}, "weight_map": weight_map}
    def write_index(p: str) -> None:
        with open(p, "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")

    _write_atomically(path, write_index)


def write_ztensor(path: str, tensors: dict[str, np.ndarray]) -> None:
    import ztensor

    def w(p: str) -> None:
        with ztensor.Writer(p) as wr:
            for name, arr in tensors.items():
                wr.write_numpy(name, arr)

    _write_atomically(path, w)


def write_npz(path: str, tensors: dict[str, np.ndarray]) -> None:
    # np.savez appends ".npz" to names without it; write through a file object.
    def w(p: str) -> None:
        with open(p, "wb") as f:
            np.savez(f, **tensors)

    _write_atomically(path, w)


def write_gguf(path: str, tensors: dict[str, np.ndarray], add_metadata=None) -> None:
    """`tensors` by `gguf.GGUFWriter`; `add_metadata(writer)` adds keys first."""
    import gguf

    def w(p: str) -> None:
        wr = gguf.GGUFWriter(p, "llama")
        if add_metadata is not None:
            add_metadata(wr)
        for name, arr in tensors.items():
            wr.add_tensor(name, arr)
        wr.write_header_to_file()
        wr.write_kv_data_to_file()
        wr.write_tensors_to_file()
        wr.close()

    _write_atomically(path, w)


def write_gguf_vocab(path: str, tensors: dict[str, np.ndarray]) -> None:
    """model.gguf plus Llama 3-sized tokenizer metadata: fixed-seed random tokens of
    1-12 letters, half of them starting with `Ġ` (U+0120, byte-level BPE's space, two
    bytes in UTF-8, as in GPT-2 and Llama 3 vocabularies), and as many merges as
    Llama 3 has."""
    import random
    import string

    n_tokens, n_merges = 128_256, 280_147
    rng = random.Random(0)
    tokens = [
        ("\u0120" if rng.random() < 0.5 else "") + "".join(rng.choices(string.ascii_letters, k=rng.randint(1, 12)))
        for _ in range(n_tokens)
    ]
    merges = [f"{tokens[rng.randrange(n_tokens)]} {tokens[rng.randrange(n_tokens)]}" for _ in range(n_merges)]

    def tokenizer(wr) -> None:
        wr.add_tokenizer_model("gpt2")
        wr.add_token_list(tokens)
        wr.add_token_scores([float(-i) for i in range(n_tokens)])
        wr.add_token_types([1] * n_tokens)
        wr.add_token_merges(merges)

    write_gguf(path, tensors, tokenizer)


def write_tensorwire(path: str, tensors: dict[str, np.ndarray]) -> None:
    import tensorwire

    def w(p: str) -> None:
        with tensorwire.Writer(p) as wr:
            for name, arr in tensors.items():
                wr.add(name, arr)

    _write_atomically(path, w)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-data", help="output directory (default: bench-data/)")
    ap.add_argument("--force", action="store_true", help="rewrite files that already exist")
    ap.add_argument("--layers", type=int, default=13, help="transformer layers (default 13)")
    ap.add_argument("--vocab", type=int, default=32000, help="vocabulary size (default 32000)")
    ap.add_argument("--seed", type=int, default=0, help="RNG seed (default 0)")
    args = ap.parse_args(argv)

    os.makedirs(args.out, exist_ok=True)
    targets = [
        ("model.safetensors", write_safetensors, "safetensors"),
        ("model.zt", write_ztensor, "ztensor"),
        ("model.npz", write_npz, "numpy"),
        ("model.gguf", write_gguf, "gguf"),
        ("model.vocab.gguf", write_gguf_vocab, "gguf"),
        ("model.safetensors.index.json", write_sharded_safetensors, "safetensors"),
    ]
    try:
        import tensorwire  # noqa: F401

        targets.append(("model.tw.zt", write_tensorwire, "tensorwire"))
    except ImportError as e:
        print(f"note: tensorwire not importable ({e}); model.tw.zt not written")

    todo = [(os.path.join(args.out, f), fn, pkg) for f, fn, pkg in targets]
    if not args.force:
        for path, _, _ in todo:
            if os.path.exists(path):
                print(f"  exists, skipped: {path} (use --force to rewrite)")
        todo = [t for t in todo if not os.path.exists(t[0])]
    if not todo:
        return 0

    t0 = time.perf_counter()
    tensors = make_tensors(args.layers, args.vocab, args.seed)
    total = sum(a.nbytes for a in tensors.values())
    print(
        f"generated {len(tensors)} float32 tensors, {total / 2**20:.1f} MiB "
        f"(layers={args.layers}, vocab={args.vocab}, seed={args.seed}) in {time.perf_counter() - t0:.1f} s"
    )
    failed = False
    for path, fn, pkg in todo:
        try:
            fn(path, tensors)
        except ImportError as e:
            print(f"  SKIPPED {path}: {pkg} not importable ({e})")
        except Exception as e:  # keep going with the other formats, but report failure
            print(f"  FAILED {path}: {type(e).__name__}: {e}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
