#!/usr/bin/env python3
"""Serves one mixed batch of the small PEFT adapters in tests/fixtures through
`tovl run`, the way an engine would: one adapter per slot plus rows of the
base model, and prints what happened (which adapter in which slot, embedding
rows patched, logits cells recomputed, the backend, the time).

  python3 scripts/serve-demo.py TOVL [--out DIR] [--seed N] [tovl run options...]

TOVL is the built `tovl` binary; options it does not know (e.g. --backend
vulkan) go to `tovl run` (default backend: tovl run's, cpu). The batch
(DIR/batch.safetensors: ids, slots, hidden) is drawn from a printed seed;
--seed replays it. The adapters' overlaid ids come from `tovl inspect --json`.
Every row the batch does not patch is checked against the base model's
embedding row; exit 1 when one differs, 2 on bad usage or a failed command.
Standard library only (make run needs nothing else).
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures", "peft_extra")
BASE = os.path.join(FIXTURES, "bases", "untied")
# One adapter per slot, all on the untied base: trainable tokens (embed and
# lm_head, lm_head only, a bf16 delta) and modules_to_save (embed, lm_head, both).
ADAPTERS = ["tt_dict_both_untied", "tt_dict_lm_untied", "tt_bf16_delta_untied",
            "mts_embed_untied", "mts_lm_untied", "mts_both_untied"]
ROWS_PER_SLOT = 3  # of which up to 2 are ids the slot's adapter overlays
BASE_ROWS = 4      # rows of the base model (slot -1)


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}


def write_safetensors(path, tensors):
    """tensors: [(name, dtype, shape, bytes)] in order."""
    header, offset = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, _, data in tensors:
            f.write(data)


def random_bf16(rng, n):
    """n bf16 of magnitude 2^-8 .. 2^8, random sign, never zero (as tovl bench)."""
    return [(rng.getrandbits(1) << 15) | ((119 + rng.randrange(16)) << 7) | rng.getrandbits(7) for _ in range(n)]


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(f"serve-demo: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
        sys.exit(2)
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tovl")
    ap.add_argument("--out", default="build/serve-demo")
    ap.add_argument("--seed", type=int, default=None)
    args, run_options = ap.parse_known_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    rng = random.Random(seed)
    os.makedirs(args.out, exist_ok=True)

    config = json.load(open(os.path.join(BASE, "config.json")))
    vocab, hidden = config["vocab_size"], config["hidden_size"]
    infos = []
    for name in ADAPTERS:
        d = json.loads(run([args.tovl, "inspect", os.path.join(FIXTURES, name, "adapter"), "--base", BASE, "--json"]))
        infos.append({"name": name, "embed": set(d["embed"]["ids"]), "lm_head": d["lm_head"]["count"]})

    # The batch: each slot's rows (some of its overlaid ids, some not), then
    # the base rows, shuffled as an engine's batch would be.
    rows = []
    for s, info in enumerate(infos):
        hits = rng.sample(sorted(info["embed"]), min(2, len(info["embed"])))
        others = [i for i in range(vocab) if i not in info["embed"]]
        rows += [(i, s) for i in hits] + [(rng.choice(others), s) for _ in range(ROWS_PER_SLOT - len(hits))]
    rows += [(rng.randrange(vocab), -1) for _ in range(BASE_ROWS)]
    rng.shuffle(rows)
    T = len(rows)
    batch = os.path.join(args.out, "batch.safetensors")
    out = os.path.join(args.out, "out.safetensors")
    write_safetensors(batch, [
        ("ids", "I32", [T], struct.pack(f"<{T}i", *[i for i, _ in rows])),
        ("slots", "I32", [T], struct.pack(f"<{T}i", *[s for _, s in rows])),
        ("hidden", "BF16", [T, hidden], struct.pack(f"<{T * hidden}H", *random_bf16(rng, T * hidden))),
    ])

    cmd = [args.tovl, "run", "--base", BASE, "--batch", batch, "--out", out] + run_options
    for name in ADAPTERS:
        cmd += ["--adapter", os.path.join(FIXTURES, name, "adapter")]
    start = time.monotonic()
    run_line = run(cmd).strip()
    seconds = time.monotonic() - start
    backend = run_line.split("backend ", 1)[1].split(",", 1)[0] if "backend " in run_line else "?"

    # What the hooks did, per slot: embed rows whose id the slot overlays,
    # and the lm_head cells of the slot's overlay ids in each of its rows.
    print(f"\nserve-demo: one mixed batch of {T} rows, {len(ADAPTERS)} adapters, through `tovl run` "
          f"(backend {backend}, seed {seed}; replay with --seed {seed})")
    print(f"base model: {os.path.relpath(BASE)} (vocab {vocab}, hidden {hidden})")
    print(f"  {'slot':<5} {'adapter':<22} {'rows':>4} {'embed rows patched':>19} {'logits cells recomputed':>24}")
    patched = [False] * T
    total_rows = total_cells = 0
    for s, info in enumerate(infos + [None]):
        slot = s if info else -1
        mine = [t for t, (_, r) in enumerate(rows) if r == slot]
        hit = [t for t in mine if info and rows[t][0] in info["embed"]]
        cells = len(mine) * info["lm_head"] if info else 0
        for t in hit:
            patched[t] = True
        total_rows += len(hit)
        total_cells += cells
        print(f"  {slot if info else 'base':<5} {info['name'] if info else '(no adapter)':<22} {len(mine):>4} "
              f"{len(hit):>19} {cells:>24}")
    print(f"  {'all':<5} {'':<22} {T:>4} {total_rows:>19} {total_cells:>24}")

    # Every row not patched holds the base model's embedding row.
    model = read_safetensors(os.path.join(BASE, "model.safetensors"))
    _, _, table = next(v for k, v in model.items() if k.endswith("embed_tokens.weight"))
    _, _, embed = read_safetensors(out)["embed"]
    row_bytes = hidden * 2
    wrong = [t for t in range(T) if not patched[t]
             and embed[t * row_bytes:(t + 1) * row_bytes] != table[rows[t][0] * row_bytes:(rows[t][0] + 1) * row_bytes]]
    print(f"{T - total_rows} rows left as the base model's embedding: "
          f"{'all equal' if not wrong else f'{len(wrong)} DIFFER (rows {wrong})'}")
    print(f"tovl run took {seconds * 1e3:.0f} ms wall clock (process start, model and adapter loading, both hooks); "
          f"output {out}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
