"""The pool's one fixed-shape set: adapters loaded and unloaded in place under a captured graph and a
compiled forward, with no capture again and no recompilation.

- rounds of random loads and unloads of the committed PEFT fixtures, each followed by the ops,
  bit-identical to a from_slots set of the same adapters (CPU; CUDA under one torch.cuda.graph);
- an adapter over the capacity is refused, naming the capacity that serves it, and the slot keeps
  its adapter;
- a Hugging Face model with tovl.hf attached and compiled with torch.compile (default mode and
  "reduce-overhead") serves adapters loaded between generate calls with no recompilation, and
  gives what the same model gives eagerly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pytest
import torch

import tovl
from helpers_core import TIED, cases, rng

CUDA = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="no CUDA device (torch.cuda.is_available() is False)")
TIED_CASES = [c[1] / "adapter" for c in cases() if c[2] == TIED and c[3] == 0]


def reference_overlays(backend: tovl.Backend, model: tovl.Model, dirs: list[Path]) -> list[tovl.Overlay]:
    out = []
    for d in dirs:
        with tovl.Adapter(d) as a, tovl.AdapterRows(backend, a, model) as rows:
            out.append(tovl.Overlay.from_resolved(backend, rows))
    return out


class Batch:
    """One mixed batch on `device`: ids (overlaid ones and others), slots -1 .. max_loras, gathered
    rows, final hidden states and base logits, all random and non-zero."""

    def __init__(self, model: tovl.Model, max_loras: int, device: torch.device, g: np.random.Generator) -> None:
        vocab, hidden, T = model.info.vocab, model.info.hidden, 40
        self.ids = torch.from_numpy(g.integers(0, vocab, T).astype(np.int32)).to(device)
        self.slots = torch.from_numpy(g.integers(-1, max_loras + 1, T).astype(np.int32)).to(device)
        gathered = np.stack([model.embed_row(int(i)) for i in self.ids.cpu()])
        self.rows0 = torch.from_numpy(gathered.view(np.int16)).view(torch.bfloat16).to(device)
        self.final = torch.randn(T, hidden, generator=torch.Generator().manual_seed(int(g.integers(1 << 31)))
                                 ).to(torch.bfloat16).to(device)
        self.logits0 = (self.final.float() @ torch.randn(vocab, hidden).to(device).T).to(torch.bfloat16)
        self.rows = self.rows0.clone()
        self.logits = self.logits0.clone()

    def reset(self) -> None:
        self.rows.copy_(self.rows0)
        self.logits.copy_(self.logits0)

    def through(self, embed: Callable[..., Any], lmhead: Callable[..., Any]) -> None:
        embed(self.rows, self.ids, self.slots)
        lmhead(self.logits, self.final, self.slots)


def rounds(pool: tovl.AdapterPool, n: int, g: np.random.Generator, replay: Callable[[], None],
           batch: Batch, label: str) -> None:
    """n rounds: a random load, unload or reload, then `replay`, checked against a from_slots set."""
    ref_be = pool.backend
    refs = reference_overlays(ref_be, pool.model, TIED_CASES)
    current: list[Optional[int]] = [None] * pool.max_loras
    patched = 0
    try:
        for r in range(n):
            s = int(g.integers(pool.max_loras))
            if g.integers(4) == 0:
                pool.unload(s)
                current[s] = None
            else:
                a = int(g.integers(len(TIED_CASES)))
                pool.load(s, TIED_CASES[a])
                current[s] = a
            batch.reset()
            replay()
            got_rows, got_logits = batch.rows.clone(), batch.logits.clone()
            with tovl.OverlaySet(ref_be, [None if c is None else refs[c] for c in current], tied=True) as ref:
                batch.reset()
                batch.through(lambda h, i, sl: tovl.embed_overlay_(h, i, sl, ref),
                              lambda lg, h, sl: tovl.lmhead_overlay_(lg, h, sl, ref))
            assert torch.equal(got_rows.view(torch.int16), batch.rows.view(torch.int16)), \
                f"{label} round {r} (slots {current}): embedding rows differ from a from_slots set's"
            assert torch.equal(got_logits.view(torch.int16), batch.logits.view(torch.int16)), \
                f"{label} round {r} (slots {current}): logits differ from a from_slots set's"
            patched += not torch.equal(got_logits, batch.logits0)
        assert patched > n // 2, f"{label}: only {patched} of {n} rounds patched anything"
        print(f"{label}: {n} rounds, every replay equal to a from_slots set's")
    finally:
        for o in refs:
            o.close()


def test_rounds_on_cpu_against_from_slots() -> None:
    g = rng("test_rounds_on_cpu_against_from_slots")
    with tovl.AdapterPool(TIED, "cpu", max_loras=3) as pool:
        batch = Batch(pool.model, 3, pool.device, g)
        handle = pool.overlay_set.handle
        rounds(pool, 150, g, lambda: batch.through(pool.embed_, pool.lmhead_), batch, "cpu")
        assert pool.overlay_set.handle == handle


@CUDA
def test_one_captured_cuda_graph_serves_1000_rounds() -> None:
    g = rng("test_one_captured_cuda_graph_serves_1000_rounds")
    with tovl.AdapterPool(TIED, "cuda", max_loras=3) as pool:
        batch = Batch(pool.model, 3, pool.device, g)
        stream = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            batch.through(pool.embed_, pool.lmhead_)  # warm the ops before capture, every slot empty
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            batch.through(pool.embed_, pool.lmhead_)

        def replay() -> None:
            graph.replay()
            torch.cuda.synchronize()

        rounds(pool, 1000, g, replay, batch, "cuda graph")


def test_an_adapter_over_the_capacity_is_refused_and_the_slot_keeps_its_own() -> None:
    sizes = []
    for d in TIED_CASES:
        with tovl.AdapterPool(TIED, "cpu", max_loras=1) as probe:
            info = probe.load(0, d)
            sizes.append((max(len(info.embed_ids), len(info.lmhead_ids)), d))
    sizes.sort()
    small, big = sizes[0], sizes[-1]
    assert big[0] > small[0]
    with tovl.AdapterPool(TIED, "cpu", max_loras=2, capacity=small[0]) as pool:
        kept = pool.load(1, small[1])
        g = rng("test_an_adapter_over_the_capacity_is_refused")
        batch = Batch(pool.model, 2, pool.device, g)
        batch.through(pool.embed_, pool.lmhead_)
        before = (batch.rows.clone(), batch.logits.clone())
        assert not torch.equal(before[1], batch.logits0), "slot 1 patches nothing"
        with pytest.raises(tovl.InvalidInputError) as e:
            pool.load(1, big[1])
        assert e.value.status == 105 and f"capacity={big[0]}" in str(e.value) and f"at most {small[0]}" in str(e.value)
        assert pool.slots()[1] == kept
        batch.reset()
        batch.through(pool.embed_, pool.lmhead_)
        assert torch.equal(batch.rows, before[0]) and torch.equal(batch.logits, before[1]), "slot 1 lost its rows"
    with pytest.raises(tovl.InvalidInputError, match="capacity 0"):
        tovl.AdapterPool(TIED, "cpu", capacity=0)


# ---------------------------------------------------------------------------------------
# torch.compile: adapters loaded between generate calls, no recompilation
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_model_serves_new_adapters_without_recompiling(mode: str, device: str) -> None:
    """Inductor rounds the base model's bf16 arithmetic its own way, so the compiled logits are
    compared with the same model run eagerly within a tolerance far below what an adapter changes,
    and bit for bit with the compiled model's own earlier output for the same slots."""
    from torch._dynamo.utils import counters
    from transformers import AutoModelForCausalLM

    import tovl.hf

    model = AutoModelForCausalLM.from_pretrained(str(TIED), dtype=torch.bfloat16).eval().to(device)
    g = rng(f"test_compiled_model_serves_new_adapters_without_recompiling[{mode}-{device}]")
    ids = torch.from_numpy(g.integers(0, int(model.config.vocab_size), (3, 6)).astype(np.int64)).to(device)
    with torch.no_grad():
        base = model(ids).logits.float()
    a, b, c = TIED_CASES[0], TIED_CASES[1], TIED_CASES[-1]
    plan: list[dict[int, Optional[Path]]] = [{0: a, 1: b}, {0: c, 1: None}, {0: a, 1: b}, {0: None, 1: c}]
    torch._dynamo.reset()
    counters.clear()
    with tovl.AdapterPool(TIED, device, max_loras=2) as pool, tovl.hf.attach(model, pool) as handle:
        handle.set_slots([0, 1, -1])
        compiled = torch.compile(model, mode=None if mode == "default" else mode)
        graphs = None
        outputs = []
        for n, loads in enumerate(plan):
            for s, d in loads.items():
                pool.load(s, d) if d is not None else pool.unload(s)
            with torch.no_grad():
                got = compiled(ids).logits.float()
                want = model(ids).logits.float()
            off = (got - want).abs().max().item()
            served = (want - base).abs().max().item()
            assert off <= 0.02 and served > 10 * off, \
                f"{mode}: round {n}: compiled {off:.4g} from eager, the adapters move the logits {served:.4g}"
            outputs.append(got)
            if graphs is None:
                graphs = counters["stats"]["unique_graphs"]
                assert graphs >= 1, "nothing was compiled"
            assert counters["stats"]["unique_graphs"] == graphs, \
                f"{mode}: round {n}: loading adapters recompiled ({graphs} -> {counters['stats']['unique_graphs']})"
        assert torch.equal(outputs[2], outputs[0]), f"{mode}: the same slots again gave other bits"
        assert not torch.equal(outputs[1], outputs[0]), f"{mode}: a new adapter changed nothing"
        print(f"compile {mode} on {device}: {len(plan)} rounds of loads, {graphs} graph(s) compiled once, no recompilation")
