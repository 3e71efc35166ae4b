#!/usr/bin/env python3
"""The PyTorch peer of `tovl bench`: the same work written with PyTorch ops,
timed the same way on the same GPU, so docs/PERFORMANCE.md can set each tovl
kernel beside what an engine would otherwise run.

  rowdiff   (a != b).any(1) over a 152064 x 4096 bf16 pair
  embed     embedding + boolean-indexed row replacement (the replacement alone,
            and with the embedding gather); also a torch.where form that a CUDA
            graph can hold
  lm_head   the overridden cells: gather of each row's overlay rows + bmm +
            scatter_ into the logits (bf16 and f32 logits)
  lm_head   the full F.linear projection a PEFT modules_to_save lm_head runs

Sizes as tovl bench: T = 512 and 64, h = 4096, vocab 152064, 8 slots x 64
overlay rows, each row's slot random (1 in 16 none), half the ids overlaid.
Each op: `batch` back-to-back calls captured in one CUDA graph, the median
per-call time of replays (ops that synchronize with the host cannot be
captured: they are timed as `batch` eager calls between two events instead,
marked "eager"); and the median of single calls between two events. Data is
fresh random (never zeros). The device copy bandwidth is measured in the same
run (read + written).

--tovl-json FILE (from `tovl bench --json`) adds a side-by-side table with the
goals the figures are held to.

Usage: python3 bench/torch_peer.py [--json FILE] [--tovl-json FILE]
                                   [--batch N] [--repeats N] [--seed N] [--quick]
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F


def event_ms(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_op(fn, batch, repeats, capturable=True):
    """(per-call us over `batch` calls, mode, single-call us), medians."""
    for _ in range(3):  # warm-up: kernels, allocator, autotuning
        fn()
    torch.cuda.synchronize()
    single = statistics.median(event_ms(fn) * 1e3 for _ in range(repeats))
    mode = "graph"
    try:
        if not capturable:
            raise RuntimeError("synchronizes with the host")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(batch):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        per_call = statistics.median(event_ms(graph.replay) * 1e3 / batch for _ in range(repeats))
        del graph
    except RuntimeError:  # the op synchronizes with the host (boolean indexing)
        torch.cuda.synchronize()
        mode = "eager"

        def calls():
            for _ in range(batch):
                fn()

        per_call = statistics.median(event_ms(calls) * 1e3 / batch for _ in range(repeats))
    torch.cuda.empty_cache()
    return per_call, mode, single


def random_bf16(shape, gen, device="cuda"):
    # magnitudes about 2^-8 .. 2^8, random sign; never exactly zero
    x = torch.empty(shape, device=device, dtype=torch.float32)
    x.uniform_(-8.0, 8.0, generator=gen)
    x = torch.exp2(x) * torch.where(torch.rand(shape, device=device, generator=gen) < 0.5, -1.0, 1.0)
    return x.to(torch.bfloat16)


def copy_bandwidth(nbytes, repeats):
    src = torch.empty(nbytes // 2, device="cuda", dtype=torch.bfloat16).fill_(1.5)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    ms = statistics.median(event_ms(lambda: dst.copy_(src)) for _ in range(repeats))
    return 2.0 * nbytes / (ms * 1e-3) / 1e9


class Overlays:
    """8 slots x 64 overlay rows, as dense per-slot tables (what a PyTorch
    engine keeps): embed slot maps [slots, vocab] (-1 = none), embed rows,
    lm_head ids and rows."""

    def __init__(self, slots, rows, vocab, h, gen, device="cuda"):
        self.slots, self.rows = slots, rows
        self.embed_ids = torch.stack([torch.randperm(vocab, device=device, generator=gen)[:rows] for _ in range(slots)])
        self.slot_map = torch.full((slots, vocab), -1, device=device, dtype=torch.int64)
        self.slot_map.scatter_(1, self.embed_ids, torch.arange(rows, device=device).expand(slots, rows).contiguous())
        self.embed_rows = random_bf16((slots, rows, h), gen, device)
        self.lm_ids = torch.stack([torch.randperm(vocab, device=device, generator=gen)[:rows] for _ in range(slots)])
        self.lm_rows = random_bf16((slots, rows, h), gen, device)


class Batch:
    def __init__(self, ov, T, vocab, h, gen, device="cuda"):
        s = torch.randint(0, ov.slots, (T,), device=device, generator=gen)
        none = torch.randint(0, 16, (T,), device=device, generator=gen) == 0
        self.slots = torch.where(none, -1, s)
        hit = (torch.rand(T, device=device, generator=gen) < 0.5) & ~none
        pick = ov.embed_ids[s, torch.randint(0, ov.rows, (T,), device=device, generator=gen)]
        self.ids = torch.where(hit, pick, torch.randint(0, vocab, (T,), device=device, generator=gen))
        self.hidden = random_bf16((T, h), gen, device)
        self.final_hidden = random_bf16((T, h), gen, device)
        self.logits_bf16 = torch.full((T, vocab), 1.0, device=device, dtype=torch.bfloat16)
        self.logits_f32 = torch.full((T, vocab), 1.0, device=device, dtype=torch.float32)


def embed_replace(ov, b):
    """Boolean-indexed row replacement (after the engine's gather)."""
    s = b.slots.clamp(min=0)
    j = ov.slot_map[s, b.ids]
    mask = (b.slots >= 0) & (j >= 0)
    b.hidden[mask] = ov.embed_rows[s[mask], j[mask]]


def embed_gather_replace(ov, b, weight):
    b.hidden = F.embedding(b.ids, weight)
    embed_replace(ov, b)


def embed_where(ov, b):
    """The same replacement without host sync: a CUDA graph can hold it."""
    s = b.slots.clamp(min=0)
    j = ov.slot_map[s, b.ids]
    mask = ((b.slots >= 0) & (j >= 0)).unsqueeze(1)
    b.hidden.copy_(torch.where(mask, ov.embed_rows[s, j.clamp(min=0)], b.hidden))


def lm_cells(ov, b, logits):
    """gather + bmm + scatter_: each row's overlay rows times its hidden row,
    scattered into its logits; rows without a slot keep theirs."""
    s = b.slots.clamp(min=0)
    w = ov.lm_rows[s]                                            # [T, n, h]
    vals = torch.bmm(w, b.final_hidden.unsqueeze(2)).squeeze(2)  # [T, n]
    idx = ov.lm_ids[s]                                           # [T, n]
    keep = logits.gather(1, idx)
    vals = torch.where((b.slots >= 0).unsqueeze(1), vals.to(logits.dtype), keep)
    logits.scatter_(1, idx, vals)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json")
    p.add_argument("--tovl-json", help="tovl bench --json output to compare with")
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("torch_peer: no CUDA device visible to PyTorch", file=sys.stderr)
        return 2
    rows_rd, h, vocab, slots, rows, ts = 152064, 4096, 152064, 8, 64, (512, 64)
    if a.quick:
        a.batch, a.repeats, rows_rd, ts = 4, 3, 2048, (64, 8)
    seed = a.seed if a.seed is not None else int(torch.seed() & 0x7FFFFFFF)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    dev = torch.cuda.get_device_name()
    print(f"torch_peer: torch {torch.__version__} on {dev}, seed {seed}, {a.batch} calls per graph, "
          f"medians of {a.repeats}")
    results = []

    def record(op, case, fn, nbytes, capturable=True):
        print(f"torch_peer: {op} {case} ...", file=sys.stderr)
        per_call, mode, single = time_op(fn, a.batch, a.repeats, capturable)
        results.append({"op": op, "case": case, "mode": mode, "per_call_us": per_call, "single_us": single,
                        "bytes": nbytes, "gbps": nbytes / (per_call * 1e-6) / 1e9})

    nbytes = rows_rd * h * 2
    copy_gbps = copy_bandwidth(nbytes, a.repeats)
    ra = random_bf16((rows_rd, h), gen)
    rb = ra.clone()
    changed = torch.randint(0, rows_rd, (rows_rd // 100 + 1,), device="cuda", generator=gen)
    rb[changed, torch.randint(0, h, changed.shape, device="cuda", generator=gen)] *= 1.5
    record("rowdiff (a != b).any(1)", f"{rows_rd}x{h} bf16", lambda: (ra != rb).any(1), 2 * nbytes)
    del ra, rb
    torch.cuda.empty_cache()

    ov = Overlays(slots, rows, vocab, h, gen)
    weight = random_bf16((vocab, h), gen)  # the base embedding / lm_head for the full paths
    for T in ts:
        b = Batch(ov, T, vocab, h, gen)
        case = f"T={T} h={h} {slots}x{rows}"
        hits = int(((b.slots >= 0) & (ov.slot_map[b.slots.clamp(min=0), b.ids] >= 0)).sum())
        live = int((b.slots >= 0).sum())
        # Boolean indexing sizes its result on the host: no graph can hold it.
        record("embed: boolean-indexed replace", case, lambda: embed_replace(ov, b), 4 * hits * h, False)
        record("embed: F.embedding + replace", case, lambda: embed_gather_replace(ov, b, weight),
               4 * hits * h + 4 * T * h, False)
        record("embed: torch.where replace", case, lambda: embed_where(ov, b), 4 * hits * h)
        lm_in = 2 * (T + slots * rows) * h
        record("lm_head cells bf16: gather+bmm+scatter_", case, lambda: lm_cells(ov, b, b.logits_bf16),
               lm_in + live * rows * 2)
        record("lm_head cells f32: gather+bmm+scatter_", case, lambda: lm_cells(ov, b, b.logits_f32),
               lm_in + live * rows * 4)
        record("lm_head full F.linear bf16 (PEFT)", case, lambda: F.linear(b.final_hidden, weight),
               2 * (T * h + vocab * h + T * vocab))
        del b
        torch.cuda.empty_cache()

    print(f"\n{'op':<42} {'case':<22} {'mode':<6} {'per call us':>12} {'single us':>10} {'GB/s':>9} "
          f"{'of copy':>8}")
    for r in results:
        print(f"{r['op']:<42} {r['case']:<22} {r['mode']:<6} {r['per_call_us']:>12.2f} {r['single_us']:>10.2f} "
              f"{r['gbps']:>9.1f} {100 * r['gbps'] / copy_gbps:>7.1f}%")
    print(f"\ndevice copy bandwidth (torch copy_): {copy_gbps:.1f} GB/s (read + written)")
    report = {"torch": torch.__version__, "device": dev, "seed": seed, "batch": a.batch, "repeats": a.repeats,
              "copy_gbps": copy_gbps, "results": results}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    if a.tovl_json:
        compare(report, a.tovl_json)
    return 0


# Absolute goals on the H200 (graph-replay per-launch times). The lm_head's are
# relative to the closest prior art instead (bench/triton_peer.py's table).
GOALS = {
    ("embed_overlay", 512): 2.0,
}

PEERS = {
    "rowdiff": "rowdiff (a != b).any(1)",
    "embed_overlay": "embed: boolean-indexed replace",
    "lmhead_overlay_bf16": "lm_head cells bf16: gather+bmm+scatter_",
    "lmhead_overlay_f32": "lm_head cells f32: gather+bmm+scatter_",
}


def compare(peer, tovl_path):
    with open(tovl_path) as f:
        tovl = json.load(f)
    print(f"\ntovl ({tovl['backend']}, copy {tovl['copy_gbps']:.0f} GB/s) against PyTorch "
          f"(copy {peer['copy_gbps']:.0f} GB/s), graph per-launch us:")
    print(f"{'kernel':<21} {'case':<22} {'tovl':>9} {'torch':>9} {'mode':<6} {'speed-up':>8}  goal")
    for r in tovl["results"]:
        kernel, case = r["kernel"], r["case"]
        t = int(case.split()[0][2:]) if case.startswith("T=") else None
        mine = r["graph_us"]
        other = next((x for x in peer["results"] if x["op"] == PEERS.get(kernel) and x["case"] == case
                      or (kernel == "rowdiff" and x["op"] == PEERS["rowdiff"])), None)
        goal = ""
        if kernel == "rowdiff":
            frac = r["copy_fraction"]
            goal = f"read rate {100 * frac:.0f}% of copy (goal >= 100%): {'met' if frac >= 1.0 else 'MISSED'}"
        elif (kernel, t) in GOALS:
            g = GOALS[(kernel, t)]
            goal = f"<= {g:g} us: {'met' if mine <= g else 'MISSED'}"
        if other:
            print(f"{kernel:<21} {case:<22} {mine:>9.2f} {other['per_call_us']:>9.2f} {other['mode']:<6} "
                  f"{other['per_call_us'] / mine:>7.1f}x  {goal}")
        else:
            print(f"{kernel:<21} {case:<22} {mine:>9.2f} {'-':>9} {'':<6} {'':>8}  {goal}")


if __name__ == "__main__":
    sys.exit(main())
