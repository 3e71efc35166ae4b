"""Tensor parallelism: 2 and 3 processes under torch.distributed (gloo, CPU) serve the committed PEFT
fixtures with the embedding and lm_head sharded as vLLM shards them (vocab padded to a multiple of
64, cut into equal ranges). Each rank gathers its own embedding rows (zeros elsewhere), the rows are
all-reduced, then the pool's embed op patches them; each rank computes its logits shard from the
same final hidden rows and patches it with its shard set; the shards are all-gathered. Both equal
one process with the full set, bit for bit, for tied and untied bases and mixed slots (-1 and out of
range). Also vLLM's split rule, the padding-only rank, and the shard width check. Where two or more
CUDA GPUs exist, the same run goes over NCCL with one process per GPU, each serving its shard on
its own device (test_tp_over_nccl_one_process_per_gpu; scripts/gpu/tp.sh runs it). The pools serve
through fixed-shape shard sets: every rank loads and unloads the same slots at the same step between
calls (CPU) or between replays of one torch.cuda.graph captured per rank (GPU 0), and the gathered
logits equal one process's after every swap."""

from __future__ import annotations

import os
import socket
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import tovl
from helpers_core import TIED, bf16_bits, cases, rng, spec_dot

MAX_LORAS = 4
T = 48
SYNTHETIC = [(1021, 40, True), (1021, 40, False), (257, 300, False)]  # (vocab, hidden, tied)
SENTINEL = 0x7F7F  # bf16 bits / f32 high half written into the columns past each shard


def groups() -> list[tuple[str, int, list[str]]]:
    """(base dir, padded vocab, up to MAX_LORAS adapter dirs) per fixture base, tied and untied."""
    by_base: dict[tuple[Path, int], list[str]] = defaultdict(list)
    for _label, case, base, padded in cases():
        if len(by_base[(base, padded)]) < MAX_LORAS:
            by_base[(base, padded)].append(str(case / "adapter"))
    return [(str(b), p, dirs) for (b, p), dirs in by_base.items()]


def vllm_range(vocab: int, world: int, rank: int, pad: int = 64) -> tuple[int, int]:
    """vLLM's pad_vocab_size and even split (the last range shorter when world does not divide)."""
    padded = -(-vocab // pad) * pad
    width = -(-padded // world)
    start = min(rank * width, padded)
    return start, min(start + width, padded)


def logits_of(hidden_bits: np.ndarray, weight_bits: np.ndarray) -> np.ndarray:
    """f32 [T, rows] of bf16 hidden x bf16 weight rows, each column in the spec's dot order (so a
    column's value does not depend on which shard computes it)."""
    return np.stack([spec_dot(hidden_bits, w) for w in weight_bits], axis=1).astype(np.float32)


def to_bf16(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.uint16).view(np.int16)).view(torch.bfloat16)


def bits_of(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


class _SetOps:
    """embed_ and lmhead_ of one OverlaySet, shaped like AdapterPool's."""

    def __init__(self, overlay_set: tovl.OverlaySet) -> None:
        self.set = overlay_set

    def embed_(self, hidden: torch.Tensor, ids: torch.Tensor, slots: torch.Tensor) -> None:
        tovl.embed_overlay_(hidden, ids, slots, self.set)

    def lmhead_(self, logits: torch.Tensor, hidden: torch.Tensor, slots: torch.Tensor) -> None:
        tovl.lmhead_overlay_(logits, hidden, slots, self.set)


def _check_group(rank: int, world: int, base: str, padded_arg: int, dirs: list[str], g: np.random.Generator,
                 device: torch.device) -> None:
    with tovl.AdapterPool(base, device, MAX_LORAS, padded_arg) as full, \
            tovl.AdapterPool(base, device, MAX_LORAS, padded_arg, tp=tovl.tp_from_distributed()) as pool:
        assert pool.tp == (rank, world)
        m = full.model.info
        start, end = pool.shard_range
        assert (start, end) == vllm_range(m.vocab, world, rank)
        overlaid: list[int] = []
        for slot, d in enumerate(dirs):
            info = full.load(slot, d)
            pool.load(slot, d)
            overlaid += list(info.embed_ids) + list(info.lmhead_ids)
        assert pool.overlay_set.shard_range == (start, end)
        embed = np.stack([full.model.embed_row(i) for i in range(m.vocab)])
        lm = np.stack([full.model.lmhead_row(i) for i in range(m.vocab)])
        _compare(rank, world, embed, lm, overlaid, full, pool, g, device)


def _check_synthetic(rank: int, world: int, vocab: int, hidden: int, tied: bool, g: np.random.Generator,
                     device: torch.device) -> None:
    """Random base tables and overlays on a vocab of `vocab` (every rank seeded alike), served
    through OverlaySet(vocab_range=) and the ops directly; ids on every shard's edges."""
    edges = sorted({e for r in range(world) for e in vllm_range(vocab, world, r) if e < vocab} |
                   {e - 1 for r in range(world) for e in vllm_range(vocab, world, r)[1:] if 0 < e <= vocab})
    embed, lm = bf16_bits(g, (vocab, hidden)), bf16_bits(g, (vocab, hidden))
    if tied:
        lm = embed
    be = tovl.Backend("cpu") if device.type == "cpu" else tovl.Backend.for_device("cuda", device.index or 0)
    overlays: list[tovl.Overlay] = []
    try:
        overlaid: list[int] = []
        for k in range(MAX_LORAS - 1):  # the last slot stays empty
            ids = np.unique(np.concatenate([g.choice(edges, size=3), g.integers(vocab, size=6)])).astype(np.uint32)
            lm_ids = None if tied else np.unique(g.integers(vocab, size=5 + k).astype(np.uint32))
            overlays.append(tovl.Overlay.from_rows(
                be, vocab, hidden, ids, bf16_bits(g, (len(ids), hidden)), lm_ids,
                None if lm_ids is None else bf16_bits(g, (len(lm_ids), hidden)), tied=tied))
            overlaid += [int(i) for i in ids] + ([] if lm_ids is None else [int(i) for i in lm_ids])
        slots: list[Optional[tovl.Overlay]] = [*overlays, None]
        start, end = tovl.vocab_shard_range(vocab, world, rank)
        with tovl.OverlaySet(be, slots, tied=tied) as full, \
                tovl.OverlaySet(be, slots, tied=tied, vocab_range=(start, end)) as shard:
            assert shard.sharded and shard.shard_range == (start, end) and full.shard_range == (0, vocab)
            _compare(rank, world, embed, lm, overlaid, _SetOps(full), _SetOps(shard), g, device)
    finally:
        for ov in overlays:
            ov.close()
        be.close()


def _compare(rank: int, world: int, embed_rows: np.ndarray, lm_rows: np.ndarray, overlaid: list[int],
             full: Any, tp: Any, g: np.random.Generator, device: torch.device) -> None:
    """One rank's embedding (masked gather, all-reduce, embed_) and lm_head (its logits shard,
    lmhead_, all_gather) against one process with the full set (`full`), bit for bit; the tensors
    and both sets on `device` (the rank's own GPU over NCCL)."""
    vocab, hidden = embed_rows.shape
    start, end = vllm_range(vocab, world, rank)
    padded = vllm_range(vocab, world, world - 1)[1]
    # Token ids: overlaid ones, every shard's edges, and random ones.
    edges = [e for r in range(world) for e in vllm_range(vocab, world, r) if e < vocab]
    edges += [e - 1 for r in range(world) for e in vllm_range(vocab, world, r)[1:] if 0 < e <= vocab]
    ids = np.concatenate([np.array(overlaid + edges, dtype=np.int64),
                          g.integers(vocab, size=T)])[g.permutation(T + len(overlaid) + len(edges))[:T]]
    ids = ids.astype(np.int64)
    slots = g.integers(-1, MAX_LORAS, size=T).astype(np.int32)
    slots[g.integers(T, size=4)] = np.array([-5, MAX_LORAS, MAX_LORAS + 3, -1], dtype=np.int32)
    ids_t, slots_t = torch.from_numpy(ids).to(device), torch.from_numpy(slots).to(device)

    # Embedding: the rank's rows of the padded table, zeros for ids outside its shard, all-reduced.
    embed = np.zeros((padded, hidden), dtype=np.uint16)
    embed[:vocab] = embed_rows
    own = (ids >= start) & (ids < end)
    local = np.where(own[:, None], embed[np.clip(ids, start, end - 1)], 0).astype(np.uint16)
    hidden_tp = to_bf16(local).float().to(device)
    dist.all_reduce(hidden_tp)  # exactly one rank holds each row: the f32 sum is exact
    hidden_tp = hidden_tp.to(torch.bfloat16)
    tp.embed_(hidden_tp, ids_t, slots_t)
    hidden_one = to_bf16(embed[ids]).to(device)
    full.embed_(hidden_one, ids_t, slots_t)
    assert np.array_equal(bits_of(hidden_tp.cpu()), bits_of(hidden_one.cpu())), f"rank {rank}: embedding rows differ"

    # lm_head: the same final rows on every rank (seeded alike), the rank's shard of the product.
    final = bf16_bits(g, (T, hidden))
    final_t = to_bf16(final).to(device)
    lm = np.zeros((padded, hidden), dtype=np.uint16)
    lm[:vocab] = lm_rows
    base_one = logits_of(final, lm)
    width = end - start
    wmax = vllm_range(vocab, world, 0)[1]
    for dtype in (torch.float32, torch.bfloat16):
        ld = wmax + 3  # a row stride past the shard: its extra columns must stay as poisoned
        buf = torch.full((T, ld), 0.0, dtype=dtype, device=device)
        buf.view(torch.int16 if dtype == torch.bfloat16 else torch.int32).fill_(
            SENTINEL if dtype == torch.bfloat16 else SENTINEL << 16)
        shard = buf[:, :width]
        shard.copy_(torch.from_numpy(base_one[:, start:end]).to(dtype))
        tp.lmhead_(shard, final_t, slots_t)
        raw = buf.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)
        assert bool((raw[:, width:] == (SENTINEL if dtype == torch.bfloat16 else SENTINEL << 16)).all()), \
            f"rank {rank}: written past its shard"
        # As int32 words (gloo has no int16): the bits travel unchanged.
        words = raw.clone().reshape(-1).view(torch.int32)
        gathered_words = [torch.empty_like(words) for _ in range(world)]
        dist.all_gather(gathered_words, words)
        gathered = [w.cpu().view(raw.dtype).view(T, ld) for w in gathered_words]
        cat = torch.cat([gathered[r][:, : vllm_range(vocab, world, r)[1] - vllm_range(vocab, world, r)[0]]
                         for r in range(world)], dim=1)
        one = torch.from_numpy(base_one.copy()).to(dtype).to(device)  # .to(float32) would alias base_one
        full.lmhead_(one, final_t, slots_t)
        want = one.cpu().view(torch.int16 if dtype == torch.bfloat16 else torch.int32)
        assert cat.shape == (T, padded)
        assert torch.equal(cat[:, : vocab], want[:, : vocab]), f"rank {rank} {dtype}: logits differ"
        assert torch.equal(cat, want), f"rank {rank} {dtype}: padding columns differ"
        assert not torch.equal(want, torch.from_numpy(base_one).to(dtype).view(want.dtype)), \
            "no lm_head cell was overlaid: the test would not see a wrong shard"


def _rank_main(rank: int, world: int, port: int, seed: int, work: list[tuple[str, int, list[str]]],
               comm: str = "gloo") -> None:
    """One rank: "gloo" on CPU tensors, "nccl" on the rank's own GPU (cuda:rank), or "gloo-cuda":
    gloo between ranks that share GPU 0 (NCCL takes one rank per GPU), the device path on one GPU."""
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if comm != "gloo":
        device = torch.device("cuda", rank if comm == "nccl" else 0)
        torch.cuda.set_device(device)
    dist.init_process_group(comm.removesuffix("-cuda"), init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        for k, (base, padded, dirs) in enumerate(work):
            _check_group(rank, world, base, padded, dirs, np.random.default_rng([seed, k]), device)
        for k, (vocab, hidden, tied) in enumerate(SYNTHETIC):
            _check_synthetic(rank, world, vocab, hidden, tied, np.random.default_rng([seed, len(work) + k]), device)
        dist.barrier()
        if rank == 0:
            print(f"test_tp: {world} ranks over {comm} on {device.type}: {len(work)} fixture groups and "
                  f"{len(SYNTHETIC)} synthetic vocabs equal one process, bit for bit")
    finally:
        dist.destroy_process_group()


def _swap_group(rank: int, world: int, base: str, padded_arg: int, dirs: list[str], g: np.random.Generator,
                device: torch.device, rounds: int) -> None:
    """`rounds` random loads and unloads, the same on every rank, into one pool per rank (its
    fixed-shape shard set) whose ops were captured once into a torch.cuda.graph on CUDA (called
    again on the CPU); after each, the embedding rows and the gathered logits shards (bf16 and f32)
    equal one process's full pool, bit for bit, and the set's handle never changes."""
    with tovl.AdapterPool(base, device, MAX_LORAS, padded_arg) as full, \
            tovl.AdapterPool(base, device, MAX_LORAS, padded_arg, tp=tovl.tp_from_distributed()) as pool:
        m = full.model.info
        start, end = pool.shard_range
        padded = vllm_range(m.vocab, world, world - 1)[1]
        handle = pool.overlay_set.handle
        assert pool.fixed and pool.overlay_set.fixed
        ids = torch.from_numpy(g.integers(0, m.vocab, T).astype(np.int32)).to(device)
        slots = torch.from_numpy(g.integers(-1, MAX_LORAS + 1, T).astype(np.int32)).to(device)
        rows0 = to_bf16(bf16_bits(g, (T, m.hidden))).to(device)
        final = to_bf16(bf16_bits(g, (T, m.hidden))).to(device)
        base_f32 = torch.from_numpy(g.standard_normal((T, padded)).astype(np.float32)).to(device)
        bases = {torch.float32: base_f32, torch.bfloat16: base_f32.to(torch.bfloat16)}
        rows = rows0.clone()
        shard = {dt: b[:, start:end].clone() for dt, b in bases.items()}

        def serve() -> None:
            rows.copy_(rows0)
            pool.embed_(rows, ids, slots)
            for dt, lg in shard.items():
                lg.copy_(bases[dt][:, start:end])
                pool.lmhead_(lg, final, slots)

        replay = serve
        if device.type == "cuda":
            stream = torch.cuda.Stream(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream):
                serve()  # warm the ops before capture, every slot empty
            torch.cuda.synchronize(device)
            with torch.cuda.graph(graph, stream=stream):
                serve()

            def replay() -> None:
                graph.replay()
                torch.cuda.synchronize(device)

        patched = 0
        for r in range(rounds):
            s = int(g.integers(MAX_LORAS))
            if g.integers(4) == 0:
                full.unload(s)
                pool.unload(s)
            else:
                d = dirs[int(g.integers(len(dirs)))]
                full.load(s, d)
                pool.load(s, d)
            replay()
            want_rows = rows0.clone()
            full.embed_(want_rows, ids, slots)
            assert torch.equal(rows.view(torch.int16), want_rows.view(torch.int16)), \
                f"rank {rank} round {r}: embedding rows differ from one process's"
            for dt, lg in shard.items():
                raw = lg.view(torch.int16 if dt == torch.bfloat16 else torch.int32)
                words = raw.contiguous().reshape(-1).view(torch.int32).cpu()
                wmax = vllm_range(m.vocab, world, 0)[1] - vllm_range(m.vocab, world, 0)[0]
                padded_words = torch.zeros(T * wmax * raw.element_size() // 4, dtype=torch.int32)
                padded_words[: words.numel()] = words
                gathered = [torch.empty_like(padded_words) for _ in range(world)]
                dist.all_gather(gathered, padded_words)
                parts = []
                for k in range(world):
                    a, b = vllm_range(m.vocab, world, k)
                    n = T * (b - a) * raw.element_size() // 4
                    parts.append(gathered[k][:n].view(raw.dtype).view(T, b - a))
                cat = torch.cat(parts, dim=1)
                one = bases[dt].clone()
                full.lmhead_(one, final, slots)
                want = one.cpu().view(raw.dtype)
                assert torch.equal(cat, want), f"rank {rank} round {r} {dt}: gathered logits differ"
                patched += not torch.equal(want, bases[dt].cpu().view(raw.dtype))
            assert pool.overlay_set.handle == handle, "the pool's set changed"
        assert patched > rounds // 2, f"only {patched} of {2 * rounds} logits patched anything"
    

def _swap_rank_main(rank: int, world: int, port: int, seed: int, work: list[tuple[str, int, list[str]]],
                    comm: str, rounds: int) -> None:
    """One rank of the swap check: "gloo" on CPU tensors, "gloo-cuda" with every rank on GPU 0."""
    torch.set_num_threads(1)
    device = torch.device("cpu") if comm == "gloo" else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for k, (base, padded, dirs) in enumerate(work):
            _swap_group(rank, world, base, padded, dirs, np.random.default_rng([seed, k]), device, rounds)
        dist.barrier()
        if rank == 0:
            print(f"test_tp swaps: {world} ranks on {device.type}{' under captured graphs' if device.type == 'cuda' else ''}: "
                  f"{rounds} rounds of loads and unloads per fixture group, gathered shards equal one process")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("world", [2, 3])
def test_tp_ranks_equal_one_process(world: int) -> None:
    seed = int(rng(f"test_tp_ranks_equal_one_process[{world}]").integers(2**32))
    work = groups()
    assert {Path(b).name for b, _, _ in work} >= {"tied", "untied"}
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_rank_main, args=(world, _free_port(), seed, work), nprocs=world, join=True)


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(_gpus() < 2, reason=f"needs 2 CUDA GPUs for NCCL (this machine has {_gpus()})")
def test_tp_over_nccl_one_process_per_gpu() -> None:
    """The run above over NCCL, one process per GPU (every GPU of the machine, up to 8); keep NVLink
    multicast off where the machine asks it (NCCL_NVLS_ENABLE=0)."""
    world = min(_gpus(), 8)
    seed = int(rng(f"test_tp_over_nccl_one_process_per_gpu[{world}]").integers(2**32))
    work = groups()
    mp.spawn(_rank_main, args=(world, _free_port(), seed, work, "nccl"), nprocs=world, join=True)


@pytest.mark.skipif(_gpus() < 1, reason="needs a CUDA GPU")
def test_tp_ranks_on_one_gpu() -> None:
    """Two ranks (gloo) with their sets and tensors on GPU 0: the NCCL run's device path where one
    GPU is all there is."""
    seed = int(rng("test_tp_ranks_on_one_gpu").integers(2**32))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_rank_main, args=(2, _free_port(), seed, groups(), "gloo-cuda"), nprocs=2, join=True)


@pytest.mark.parametrize("world", [2, 3])
def test_tp_ranks_swap_adapters_in_place(world: int) -> None:
    """Every rank's pool loads and unloads the same slots at the same step; its one set serves
    them all (CPU: the ops called again; the GPU test below replays captured graphs)."""
    seed = int(rng(f"test_tp_ranks_swap_adapters_in_place[{world}]").integers(2**32))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_swap_rank_main, args=(world, _free_port(), seed, groups(), "gloo", 40), nprocs=world, join=True)


@pytest.mark.skipif(_gpus() < 1, reason="needs a CUDA GPU")
def test_tp_ranks_swap_adapters_under_captured_graphs_on_one_gpu() -> None:
    """Two ranks (gloo) on GPU 0, each with one torch.cuda.graph captured while its slots were
    empty, replayed after every swap: the gathered logits equal one process's."""
    seed = int(rng("test_tp_ranks_swap_adapters_under_captured_graphs_on_one_gpu").integers(2**32))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_swap_rank_main, args=(2, _free_port(), seed, groups(), "gloo-cuda", 200), nprocs=2, join=True)


def test_vocab_shard_range_is_vllms_split() -> None:
    for vocab in (1, 63, 64, 65, 131, 136, 1021, 32000, 151936):
        for world in range(1, 9):
            for rank in range(world):
                assert tovl.vocab_shard_range(vocab, world, rank) == vllm_range(vocab, world, rank), (vocab, world, rank)
    assert tovl.vocab_shard_range(131, 2, 1, 128) == (128, 256)
    for bad in ((0, 2, 0), (131, 0, 0), (131, 2, 2)):
        with pytest.raises(tovl.InvalidInputError):
            tovl.vocab_shard_range(*bad)


def test_padding_only_rank_and_shard_width() -> None:
    """131 over 8 ranks: 192 / 8 = 24 columns each; ranks 6 and 7 hold only padding: their pool has
    no shard set, embed_ is the full one, lmhead_ writes nothing. A shard set's lm_head op needs
    its shard's width, and the error names logits."""
    g = rng("test_padding_only_rank_and_shard_width")
    case = next(c for label, c, b, p in cases() if b == TIED and p == 0 and "both" in label)
    with tovl.AdapterPool(TIED, "cpu", 2, tp=(6, 8)) as pad, tovl.AdapterPool(TIED, "cpu", 2) as full, \
            tovl.AdapterPool(TIED, "cpu", 2, tp=(1, 8)) as r1:
        assert pad.shard_range == (144, 168) and not pad.overlay_set.sharded
        for p in (pad, full, r1):
            info = p.load(1, case / "adapter")
        ids = torch.from_numpy(np.array(list(info.embed_ids) * 3, dtype=np.int32))
        slots = torch.from_numpy(g.integers(-1, 2, size=len(ids)).astype(np.int32))
        hidden = to_bf16(bf16_bits(g, (len(ids), full.model.info.hidden)))
        a, b = hidden.clone(), hidden.clone()
        pad.embed_(a, ids, slots)
        full.embed_(b, ids, slots)
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
        logits = torch.full((len(ids), 24), 3.5)
        pad.lmhead_(logits, hidden, slots)
        assert bool((logits == 3.5).all())
        with pytest.raises(tovl.InvalidInputError, match="logits"):
            pad.lmhead_(torch.zeros(len(ids), 23), hidden, slots)
        assert r1.overlay_set.shard_range == (24, 48) and r1.overlay_set.shard_width == 24
        r1.lmhead_(torch.zeros(len(ids), 24), hidden, slots)
        with pytest.raises(tovl.InvalidInputError, match="logits has 23 columns.*shard width 24"):
            r1.lmhead_(torch.zeros(len(ids), 23), hidden, slots)
    backend = tovl.Backend("cpu")
    try:
        with pytest.raises(tovl.InvalidInputError):
            tovl.OverlaySet(backend, [None], tied=True, vocab_range=(5, 5))
    finally:
        backend.close()
