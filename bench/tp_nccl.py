#!/usr/bin/env python3
"""Vocab-parallel lm_head shards over NCCL, one process per GPU: each rank's lm_head hook
time on its own GPU against one GPU's unsharded set, on the workload of `tovl bench`.

Every rank builds the same random pool (h 4096, vocab 152064, 8 slots x 64 overlay rows,
half the ids in the lm_head part; seeded alike), its shard set (vLLM's split of the vocab
padded to 64) and, on rank 0, the unsharded set. Per T in --tokens and per logits dtype:
the shard's lm_head op on a poisoned logits shard, the shards all-gathered over NCCL and
compared bit for bit with the unsharded set's output on rank 0; then each rank's op, 100
calls captured in one CUDA graph, timed by CUDA events over replays (median per call), and
rank 0's unsharded set the same way. Prints one table; exits non-zero on any difference.

Usage: python3 bench/tp_nccl.py [--tokens 512,64] [--world N] [--repeats 20] [--seed S]
Needs two or more CUDA GPUs (every GPU by default; --world 1 is a smoke test of the script on
one); keep NVLink multicast off where the machine asks it (NCCL_NVLS_ENABLE=0).
scripts/gpu/tp.sh runs it where two GPUs exist, and --world 1 where one does.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import tovl
from torch_peer import time_op  # the peers' timing: BATCH calls in one CUDA graph, median replay

VOCAB, HIDDEN, SLOTS, ROWS = 152064, 4096, 8, 64
BATCH = 100  # op calls per captured graph


def bf16_bits(g: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random normal bf16 bit patterns (never zeros)."""
    return (g.normal(size=shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def pool(be: tovl.Backend, g: np.random.Generator) -> list[tovl.Overlay]:
    overlays = []
    for _ in range(SLOTS):
        ids = np.sort(g.choice(VOCAB, size=ROWS, replace=False)).astype(np.uint32)
        overlays.append(tovl.Overlay.from_rows(be, VOCAB, HIDDEN, ids, bf16_bits(g, (ROWS, HIDDEN)),
                                               ids, bf16_bits(g, (ROWS, HIDDEN))))
    return overlays


def rank_main(rank: int, world: int, port: int, tokens: list[int], repeats: int, seed: int,
              results: "mp.Queue[object]") -> None:
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=device)
    be = tovl.Backend.for_device("cuda", rank)
    overlays = pool(be, np.random.default_rng(seed))
    start, end = tovl.vocab_shard_range(VOCAB, world, rank)
    width, wmax = end - start, tovl.vocab_shard_range(VOCAB, world, 0)[1]
    shard = tovl.OverlaySet(be, overlays, tied=False, vocab_range=(start, end))
    full = tovl.OverlaySet(be, overlays, tied=False) if rank == 0 else None
    rows: list[tuple[int, str, float, float, bool]] = []
    try:
        for T in tokens:
            g = np.random.default_rng([seed, T])
            hidden = torch.from_numpy(bf16_bits(g, (T, HIDDEN)).view(np.int16)).view(torch.bfloat16).to(device)
            slots_np = g.integers(0, SLOTS, size=T).astype(np.int32)
            slots_np[g.random(T) < 1 / 16] = -1
            slots = torch.from_numpy(slots_np).to(device)
            for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "f32")):
                # A shard of wmax columns on every rank (the last one shorter: its tail stays poisoned).
                logits = torch.full((T, wmax), 7.0, dtype=dtype, device=device)
                tovl.lmhead_overlay_(logits[:, :width], hidden, slots, shard)
                gathered = [torch.empty_like(logits) for _ in range(world)]
                dist.all_gather(gathered, logits)
                equal = True
                if full is not None:
                    widths = [b - a for a, b in (tovl.vocab_shard_range(VOCAB, world, r) for r in range(world))]
                    cat = torch.cat([gathered[r][:, :widths[r]] for r in range(world)], dim=1)[:, :VOCAB]
                    one = torch.full((T, VOCAB), 7.0, dtype=dtype, device=device)
                    tovl.lmhead_overlay_(one, hidden, slots, full)
                    equal = torch.equal(cat.view(torch.int16 if name == "bf16" else torch.int32),
                                        one.view(torch.int16 if name == "bf16" else torch.int32))
                    assert not torch.equal(one, torch.full_like(one, 7.0)), "no cell was overlaid"
                part = logits[:, :width]
                shard_us = time_op(lambda: tovl.lmhead_overlay_(part, hidden, slots, shard), BATCH, repeats)[0]
                full_us = float("nan")
                if full is not None:
                    whole = torch.zeros((T, VOCAB), dtype=dtype, device=device)
                    full_us = time_op(lambda: tovl.lmhead_overlay_(whole, hidden, slots, full), BATCH, repeats)[0]
                rows.append((T, name, shard_us, full_us, equal))
        results.put((rank, torch.cuda.get_device_name(device), (start, end), rows))
        dist.barrier()
    finally:
        shard.close()
        if full is not None:
            full.close()
        for ov in overlays:
            ov.close()
        be.close()
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="512,64")
    ap.add_argument("--world", type=int, default=0, help="ranks (default: every GPU)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "little"))
    a = ap.parse_args()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    world = a.world or gpus
    if not 1 <= world <= gpus or a.world == 0 and gpus < 2:
        print(f"tp_nccl: needs 2 or more CUDA GPUs, one per rank ({gpus} here, {world} ranks asked; "
              "--world 1 runs the script on one GPU as a smoke test)")
        return 2
    tokens = [int(t) for t in a.tokens.split(",")]
    print(f"tp_nccl: {world} ranks over NCCL, one per GPU; seed {a.seed}; h {HIDDEN}, vocab {VOCAB}, "
          f"{SLOTS} slots x {ROWS} rows; {BATCH} calls per graph, median of {a.repeats} replays, us per call")
    ctx = mp.get_context("spawn")
    results: "mp.Queue[object]" = ctx.Queue()
    mp.start_processes(rank_main, args=(world, free_port(), tokens, a.repeats, a.seed, results), nprocs=world,
                       join=True, start_method="spawn")
    by_rank = dict((r[0], r[1:]) for r in (results.get() for _ in range(world)))  # type: ignore[index]
    ok = True
    print(f"{'T':>5s} {'logits':>6s} {'unsharded':>10s} " + " ".join(f"{'rank ' + str(r):>14s}" for r in range(world))
          + "  gathered == unsharded")
    n_rows = len(by_rank[0][2])  # type: ignore[arg-type]
    for i in range(n_rows):
        T, name, _, full_us, equal = by_rank[0][2][i]  # type: ignore[index]
        cells = []
        for r in range(world):
            us = by_rank[r][2][i][2]  # type: ignore[index]
            cells.append(f"{us:6.2f} ({us / full_us:4.2f})")
        ok &= bool(equal)
        print(f"{T:5d} {name:>6s} {full_us:10.2f} " + " ".join(f"{c:>14s}" for c in cells)
              + f"  {'yes' if equal else 'NO'}")
    for r in range(world):
        print(f"rank {r}: {by_rank[r][0]}, vocab shard {by_rank[r][1]}")  # type: ignore[index]
    print("tp_nccl: ok" if ok else "tp_nccl: FAILED: a gathered output differs from the unsharded set")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
