#!/usr/bin/env python3
"""The closest prior art for the lm_head hook, timed beside `tovl bench` on
the same workload: a Triton kernel of the design of the open vLLM PR #55796
(trainable tokens), written for this benchmark from the design alone.

The design: flat buffers weights[max_loras, max_tokens, h] (bf16) and
token_ids[max_loras, max_tokens] (int32, -1 unused), and one program of four
warps per (logits row, replacement row). A program loads the row's adapter
index, then the replacement's token id, then both rows with vector loads,
sums the f32 products with tl.sum (Triton's order, not the same on every
vendor) and stores one logit cell, bf16 or f32.

The workload is the one `tovl bench --dump FILE` wrote (the overlay set's
rows and ids as tovl's kernels read them, and per batch size the hidden
rows, the row slots and the cells tovl computed), so both time the same
work; the peer's cells are checked against tovl's (they differ in the last
bits because the orders differ: the largest absolute difference is printed).
Timing as tovl bench: `batch` launches captured in one CUDA graph, the
median per-launch time over `repeats` replays.

  python3 bench/triton_peer.py --workload FILE --tovl-json BENCH.json [--json OUT]
                               [--batch 100] [--repeats 20]

Prints, per batch size, tovl and the peer side by side with tovl / peer.
"""
import argparse
import json
import re
import struct
import sys

import torch
import triton
import triton.language as tl

from torch_peer import time_op

DTYPES = {"BF16": torch.bfloat16, "F32": torch.float32, "I32": torch.int32}


def read_safetensors(path):
    """{name: tensor (CPU)}, metadata: the plain format, no package needed."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        data = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        begin, end = t["data_offsets"]
        raw = bytearray(data[begin:end])
        tensors[name] = torch.frombuffer(raw, dtype=DTYPES[t["dtype"]]).reshape(t["shape"]) if raw else \
            torch.empty(t["shape"], dtype=DTYPES[t["dtype"]])
    return tensors, meta


@triton.jit
def replaced_cell(hidden, row_lora, token_ids, weights, logits, h, ld, vocab, max_tokens, BLOCK_H: tl.constexpr):
    """One logit cell: row t of the batch against replacement row j of its adapter."""
    t = tl.program_id(0)
    j = tl.program_id(1)
    lora = tl.load(row_lora + t)
    if lora < 0:
        return
    token = tl.load(token_ids + lora * max_tokens + j)
    if (token < 0) | (token >= vocab):
        return
    offs = tl.arange(0, BLOCK_H)
    inside = offs < h
    x = tl.load(hidden + t.to(tl.int64) * h + offs, mask=inside, other=0.0)
    w = tl.load(weights + (lora * max_tokens + j).to(tl.int64) * h + offs, mask=inside, other=0.0)
    cell = tl.sum(x.to(tl.float32) * w.to(tl.float32), axis=0)
    tl.store(logits + t.to(tl.int64) * ld + token, cell.to(logits.dtype.element_ty))


def peer_launch(hidden, row_lora, token_ids, weights, logits):
    T, h = hidden.shape
    max_tokens = token_ids.shape[1]
    grid = (T, max_tokens)
    replaced_cell[grid](hidden, row_lora, token_ids, weights, logits, h, logits.shape[1], logits.shape[1],
                        max_tokens, BLOCK_H=triton.next_power_of_2(h), num_warps=4)


def tovl_times(path):
    """{(kernel, T): graph us} from `tovl bench --json`."""
    with open(path) as f:
        bench = json.load(f)
    times = {}
    for r in bench["results"]:
        m = re.match(r"T=(\d+) ", r["case"])
        if m:
            times[(r["kernel"], int(m.group(1)))] = r["graph_us"]
    return bench, times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", required=True, help="the file `tovl bench --dump` wrote")
    ap.add_argument("--tovl-json", required=True, help="the same run's `tovl bench --json` file")
    ap.add_argument("--json", help="write the table here")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("triton_peer: no CUDA device", file=sys.stderr)
        return 2

    tensors, meta = read_safetensors(args.workload)
    vocab = int(meta["vocab"])
    dev = torch.device("cuda")
    weights = tensors["rows"].to(dev).contiguous()
    token_ids = tensors["ids"].to(dev).contiguous()
    sizes = sorted(int(m.group(1)) for name in tensors for m in [re.match(r"T(\d+)\.hidden$", name)] if m)
    bench, tovl = tovl_times(args.tovl_json)
    print(f"triton_peer: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"workload of tovl bench seed {meta.get('seed')}: {weights.shape[0]} slots x {weights.shape[1]} rows, "
          f"h {weights.shape[2]}, vocab {vocab}")

    rows, failures = [], 0
    for T in sizes:
        hidden = tensors[f"T{T}.hidden"].to(dev).contiguous()
        row_lora = tensors[f"T{T}.row_slots"].to(dev).contiguous()
        for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "f32")):
            logits = torch.full((T, vocab), float("nan"), dtype=dtype, device=dev)
            run = lambda: peer_launch(hidden, row_lora, token_ids, weights, logits)
            peer_us, mode, _ = time_op(run, args.batch, args.repeats)
            # The cells the peer wrote, where tovl's dump has them.
            want = tensors[f"T{T}.cells_{name}"].to(dev).float()
            live = ~torch.isnan(want)
            lora = row_lora.long().clamp(min=0)
            ids = token_ids[lora].long()  # [T, max_tokens]
            got = logits.gather(1, ids.clamp(min=0)).float()
            diff = (got - want).abs()[live]
            max_diff = diff.max().item() if diff.numel() else 0.0
            scale = want.abs()[live].max().item() if diff.numel() else 0.0
            bad = int(torch.isnan(got[live]).sum().item())
            failures += bad > 0 or max_diff > 1e-2 * max(scale, 1.0)
            tovl_us = tovl.get((f"lmhead_overlay_{name}", T))
            rows.append({"T": T, "logits": name, "tovl_us": tovl_us, "peer_us": peer_us, "peer_mode": mode,
                         "ratio": tovl_us / peer_us if tovl_us else None, "cells": int(live.sum().item()),
                         "max_abs_diff": max_diff, "max_abs_cell": scale, "peer_missing_cells": bad})

    print(f"\nlm_head, graph-replay per-launch medians (us): tovl bench (seed {bench.get('seed')}, "
          f"{bench.get('device')}) and the PR #55796 design in Triton; ratio = tovl / peer")
    print(f"{'T':>5} {'logits':>6} {'tovl us':>9} {'peer us':>9} {'ratio':>7} {'cells':>7} {'max |tovl - peer|':>18}"
          f" {'max |cell|':>11}")
    for r in rows:
        tovl_text = f"{r['tovl_us']:9.2f}" if r["tovl_us"] else f"{'n/a':>9}"
        ratio = f"{r['ratio']:7.2f}" if r["ratio"] else f"{'n/a':>7}"
        print(f"{r['T']:>5} {r['logits']:>6} {tovl_text} {r['peer_us']:9.2f} {ratio} {r['cells']:>7} "
              f"{r['max_abs_diff']:18.3g} {r['max_abs_cell']:11.3g}")
    for name in ("bf16", "f32"):
        line = [r for r in rows if r["logits"] == name]
        print(f"\n| T | " + " | ".join(str(r["T"]) for r in line) + " |")
        print("|---|" + "---|" * len(line))
        print(f"| tovl lmhead_overlay_{name} | " + " | ".join(f"{r['tovl_us']:.2f}" if r["tovl_us"] else "n/a"
                                                          for r in line) + " |")
        print(f"| PR #55796 design (Triton) | " + " | ".join(f"{r['peer_us']:.2f}" for r in line) + " |")
        print(f"| tovl / peer | " + " | ".join(f"{r['ratio']:.2f}" if r["ratio"] else "n/a" for r in line) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "tovl_seed": bench.get("seed"), "rows": rows}, f, indent=1)
    if failures:
        print(f"triton_peer: {failures} case(s) where the peer's cells do not match tovl's", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
