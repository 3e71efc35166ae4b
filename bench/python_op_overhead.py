#!/usr/bin/env python3
"""Per-call cost of the tovl torch ops above the C hooks they call.

For each op and device it times, side by side in one run:
  ctypes floor   a trivial C call through ctypes (tovl_token_overlay_set_any_active)
  C hook         tovl_embed_hook / tovl_lmhead_hook through ctypes, arguments prebuilt
  set method     OverlaySet.embed_hook / lmhead_hook (raw pointers)
  torch no-op op an op of the same schema whose Python kernel does nothing: torch's dispatch floor
  torch op       torch.ops.tovl.embed_overlay_ / lmhead_overlay_ (checks, dispatch, pointers, stream)
  wrapper        tovl.embed_overlay_ / tovl.lmhead_overlay_ (slot and shape handling, then the op)
and prints the median microseconds per call over repeated batches, and each line's
overhead above the C hook: the median over batches of (its time - the C hook's), the
variants taking turns within each batch. On CUDA tensors (when torch sees a GPU) the same batches
end with a synchronize, and a third table times both inside a captured torch.cuda.graph
(replay time / calls, CUDA events): there the op's Python cost is gone by construction.

Usage: python bench/python_op_overhead.py [--T 1,8] [--calls 2000] [--repeats 15] [--device cpu,cuda]
                                         [--clock wall|thread]
Pin it for quieter figures: taskset -c 1 python bench/python_op_overhead.py. On a shared
machine, --clock thread (this thread's CPU time, CPU tensors only) leaves out the time the
process waits for a core; the GPU rows always use the wall clock.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import numpy as np
import torch

import tovl
from tovl._lib import lib

VOCAB, HIDDEN, IDS, SLOTS = 32000, 512, 4, 8

# torch's own floor for a Python kernel behind torch.ops: an op of the same schema that does nothing.
_noop_lib = torch.library.Library("tovl_bench", "DEF")
_noop_lib.define("noop_(Tensor(a!) out, Tensor rows, Tensor? slots, int active_slot, int set_handle) -> ()")
for _key in ("CPU", "CUDA"):
    _noop_lib.impl("noop_", lambda *args: None, _key)


def build(device: torch.device, g: np.random.Generator) -> tuple[tovl.Backend, tovl.OverlaySet]:
    name = tovl.ops.backend_name_for(device)
    be = tovl.Backend("cpu") if name == "cpu" else tovl.Backend.for_device(name, device.index or 0)
    overlays = []
    for _ in range(SLOTS):
        ids = g.choice(VOCAB, size=IDS, replace=False)
        rows = (g.normal(size=(IDS, HIDDEN)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        overlays.append(tovl.Overlay.from_rows(be, VOCAB, HIDDEN, ids, rows, ids, rows))
    s = tovl.OverlaySet(be, overlays, tied=False)
    for ov in overlays:
        ov.close()
    return be, s


def per_call_us(fns: dict[str, Callable[[], None]], calls: int, repeats: int, sync: Callable[[], None],
                clock: Callable[[], int] = time.perf_counter_ns) -> dict[str, list[float]]:
    """Microseconds per call of each function, one sample per repeat: the functions take turns
    within every repeat, so a slow stretch of the host falls on all of them alike."""
    for fn in fns.values():
        for _ in range(max(calls // 10, 10)):
            fn()
    sync()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = clock()
            for _ in range(calls):
                fn()
            sync()
            samples[k].append((clock() - t0) / calls / 1000)
    return samples


def over(samples: dict[str, list[float]], k: str, base: str) -> float:
    """The median over repeats of k's time minus base's in the same repeat."""
    return statistics.median(a - b for a, b in zip(samples[k], samples[base]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", default="1,8", help="batch rows, comma-separated")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--device", default="cpu,cuda")
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall")
    a = ap.parse_args()
    g = np.random.default_rng(1)
    devices = [torch.device(d if d != "cuda" else "cuda:0") for d in a.device.split(",")]
    devices = [d for d in devices if d.type == "cpu" or torch.cuda.is_available()]
    print(f"tovl {tovl.__version__}, torch {torch.__version__}; vocab {VOCAB}, hidden {HIDDEN}, "
          f"{SLOTS} slots x {IDS} ids; median of {a.repeats} batches of {a.calls} calls, us per call "
          f"({a.clock} clock on CPU tensors)")
    for device in devices:
        be, s = build(device, g)
        sync = (lambda: None) if device.type == "cpu" else (lambda: torch.cuda.synchronize(device))
        clock = time.thread_time_ns if a.clock == "thread" and device.type == "cpu" else time.perf_counter_ns
        for T in (int(t) for t in a.T.split(",")):
            ids = torch.from_numpy(g.integers(VOCAB, size=T).astype(np.int32)).to(device)
            slots = torch.from_numpy(g.integers(-1, SLOTS, size=T).astype(np.int32)).to(device)
            hidden = torch.randn(T, HIDDEN, device=device).to(torch.bfloat16)
            final = torch.randn(T, HIDDEN, device=device).to(torch.bfloat16)
            logits = torch.randn(T, VOCAB, device=device)
            stream = tovl.ops._launch(s).stream()
            h = s.handle
            kp = be._kernels_p
            s.embed_hook(hidden.data_ptr(), ids.data_ptr(), T, HIDDEN, slots.data_ptr(), -1, stream)
            s.lmhead_hook(logits.data_ptr(), "f32", VOCAB, final.data_ptr(), T, HIDDEN, slots.data_ptr(), -1,
                          stream)
            eargs, largs = s._embed_args_p, s._lmhead_args_p  # filled by the two calls above
            rows = {
                "ctypes floor": (lambda: lib.tovl_token_overlay_set_any_active(h),) * 2,
                "C hook": (lambda: lib.tovl_embed_hook(h, kp, eargs, stream),
                           lambda: lib.tovl_lmhead_hook(h, kp, largs, stream)),
                "set method": (
                    lambda: s.embed_hook(hidden.data_ptr(), ids.data_ptr(), T, HIDDEN, slots.data_ptr(), -1,
                                         stream),
                    lambda: s.lmhead_hook(logits.data_ptr(), "f32", VOCAB, final.data_ptr(), T, HIDDEN,
                                          slots.data_ptr(), -1, stream)),
                "torch no-op op": (lambda: torch.ops.tovl_bench.noop_(hidden, ids, slots, -1, h),
                                   lambda: torch.ops.tovl_bench.noop_(logits, final, slots, -1, h)),
                "torch op": (lambda: torch.ops.tovl.embed_overlay_(hidden, ids, slots, -1, h),
                             lambda: torch.ops.tovl.lmhead_overlay_(logits, final, slots, -1, h)),
                "wrapper": (lambda: tovl.embed_overlay_(hidden, ids, slots, s),
                            lambda: tovl.lmhead_overlay_(logits, final, slots, s)),
            }
            per_op = [per_call_us({k: fns[i] for k, fns in rows.items()}, a.calls, a.repeats, sync, clock)
                      for i in range(2)]
            print(f"\n{device} ({be.device}), T = {T}, eager")
            print(f"  {'':14s} {'embed':>9s} {'over hook':>10s} {'lm_head':>9s} {'over hook':>10s}")
            for k in rows:
                cells = [f"{statistics.median(t[k]):9.2f} {over(t, k, 'C hook'):10.2f}" for t in per_op]
                print(f"  {k:14s} {cells[0]} {cells[1]}")
            if device.type == "cuda":
                graph_rows(device, s, kp, h, hidden, ids, slots, logits, final, eargs, largs, a.calls)
        s.close()
        be.close()


def graph_rows(device: torch.device, s: tovl.OverlaySet, kp: object, h: int, hidden: torch.Tensor,
               ids: torch.Tensor, slots: torch.Tensor, logits: torch.Tensor, final: torch.Tensor,
               eargs: object, largs: object, calls: int) -> None:
    """Each variant captured `calls` times into one graph; replay time / calls (CUDA events)."""
    capture_stream = torch.cuda.Stream(device)
    n = max(calls // 10, 50)
    variants = {
        "C hook": (lambda st: lib.tovl_embed_hook(h, kp, eargs, st),
                   lambda st: lib.tovl_lmhead_hook(h, kp, largs, st)),
        "torch op": (lambda st: torch.ops.tovl.embed_overlay_(hidden, ids, slots, -1, h),
                     lambda st: torch.ops.tovl.lmhead_overlay_(logits, final, slots, -1, h)),
    }
    print(f"  in a captured graph ({n} calls per graph, replay time / calls):")
    for k, fns in variants.items():
        out = []
        for fn in fns:
            graph = torch.cuda.CUDAGraph()
            capture_stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(capture_stream):
                with torch.cuda.graph(graph, stream=capture_stream):
                    for _ in range(n):
                        fn(capture_stream.cuda_stream)
            torch.cuda.synchronize(device)
            samples = []
            for _ in range(15):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1000 / n)
            out.append(statistics.median(samples))
        print(f"  {k:14s} {out[0]:9.2f} {'':10s} {out[1]:9.2f}")


if __name__ == "__main__":
    main()
