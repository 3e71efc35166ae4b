#!/usr/bin/env python3
"""A model folder, two adapters and a batch of the size `tovl run` meets in
serving, for timing it on the CPU backend: an untied base of vocab 152064 x
hidden 4096 (model.embed_tokens.weight and lm_head.weight, bf16, 2.5 GB in
all), two PEFT trainable-tokens adapters (64 embedding rows and 64 lm_head
rows each, F32 deltas as PEFT saves them) and a batch of T rows (ids, slots
0 / 1 / -1 mixed, hidden bf16). Random bf16 of magnitude 2^-8 .. 2^8, random
sign, never zero; the same seed gives the same files.

  python3 bench/make_run_model.py [--out DIR] [--vocab N] [--hidden N] [--tokens T] [--seed N]
  tovl run --base DIR/base --adapter DIR/adapter0 --adapter DIR/adapter1 \\
           --batch DIR/batch.safetensors --out DIR/out.safetensors

Needs numpy. Writes the files in row chunks, so it needs about 0.5 GB of memory.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def random_bf16(rng, n):
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32)
    sign = bits & 0x8000
    exponent = (119 + ((bits >> 7) & 15)) << 7
    return (sign | exponent | (bits & 0x7F)).astype(np.uint16)


def write_safetensors(path, tensors, chunked=None):
    """tensors: [(name, dtype, shape, array or None)]; None arrays come from
    chunked(name) as an iterator of byte chunks (written in order)."""
    sizes = {"BF16": 2, "F32": 4, "I32": 4}
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape, _ in tensors:
        n = sizes[dtype] * int(np.prod(shape))
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, _, _, array in tensors:
            if array is None:
                for chunk in chunked(name):
                    f.write(chunk)
            else:
                f.write(np.ascontiguousarray(array).tobytes())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/tovl-run-model")
    p.add_argument("--vocab", type=int, default=152064)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--rows", type=int, default=64, help="overlay rows per adapter, embedding and lm_head each")
    p.add_argument("--seed", type=int, default=29)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    V, H = a.vocab, a.hidden
    base = os.path.join(a.out, "base")
    os.makedirs(base, exist_ok=True)
    with open(os.path.join(base, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": H,
                   "tie_word_embeddings": False, "dtype": "bfloat16"}, f, indent=1)

    def matrix(name):
        step = max(1, (64 << 20) // (2 * H))  # 64 MB of rows at a time
        for r in range(0, V, step):
            yield random_bf16(rng, min(step, V - r) * H).tobytes()

    print(f"make_run_model: {base}: 2 x [{V}, {H}] bf16 ...", file=sys.stderr)
    write_safetensors(os.path.join(base, "model.safetensors"),
                      [("lm_head.weight", "BF16", (V, H), None), ("model.embed_tokens.weight", "BF16", (V, H), None)],
                      matrix)
    for k in range(2):
        d = os.path.join(a.out, f"adapter{k}")
        os.makedirs(d, exist_ok=True)
        embed_ids = sorted(int(i) for i in rng.choice(V, a.rows, replace=False))
        lm_ids = sorted(int(i) for i in rng.choice(V, a.rows, replace=False))
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", "r": 2, "lora_alpha": 8, "target_modules": ["q_proj"],
                       "modules_to_save": None,
                       "trainable_token_indices": {"embed_tokens": embed_ids, "lm_head": lm_ids}}, f, indent=1)
        delta = lambda n: (random_bf16(rng, n * H).astype(np.uint32) << 16).view(np.float32).reshape(n, H)
        write_safetensors(os.path.join(d, "adapter_model.safetensors"), [
            ("base_model.model.lm_head.token_adapter.trainable_tokens_delta", "F32", (a.rows, H), delta(a.rows)),
            ("base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta", "F32", (a.rows, H),
             delta(a.rows)),
        ])
    T = a.tokens
    ids = rng.integers(0, V, size=T, dtype=np.int32)
    slots = np.array([(0, 1, -1)[t % 3] for t in range(T)], dtype=np.int32)
    write_safetensors(os.path.join(a.out, "batch.safetensors"), [
        ("ids", "I32", (T,), ids), ("slots", "I32", (T,), slots),
        ("hidden", "BF16", (T, H), random_bf16(rng, T * H).reshape(T, H)),
    ])
    print(f"make_run_model: wrote {a.out}/base, adapter0, adapter1, batch.safetensors (T {T})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
