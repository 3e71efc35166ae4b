#!/usr/bin/env python3
"""Two `tovl bench --json` files of one run side by side, as docs/PERFORMANCE.md
(HIP) compares the HIP port's source with the CUDA port (rowdiff and its fraction of the copy bandwidth, the idle dispatch,
embed_overlay and lmhead_overlay_bf16 at each batch size), graph per-launch
medians in us, and the ratio, the second's time over the first's.

usage: bench_side_by_side.py FIRST.json LABEL SECOND.json LABEL
"""
import json
import re
import sys


def figures(path):
    with open(path) as f:
        run = json.load(f)
    out = {}
    for r in run["results"]:
        case = r["case"]
        if r["kernel"] == "rowdiff":
            out["rowdiff"] = (r["graph_us"], r["copy_fraction"])
        elif case.startswith("idle"):
            out["idle"] = (r["graph_us"], None)
        else:
            m = re.match(r"T=(\d+) ", case)
            if m and r["kernel"] in ("embed_overlay", "lmhead_overlay_bf16"):
                out[(r["kernel"], int(m.group(1)))] = (r["graph_us"], None)
    return run, out


def cell(fig):
    if fig is None:
        return "-"
    us, fraction = fig
    return f"{us:.2f} ({100 * fraction:.1f}% of copy)" if fraction else f"{us:.2f}"


def main(argv):
    if len(argv) != 5:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    (run_a, a), (run_b, b) = figures(argv[1]), figures(argv[3])
    label_a, label_b = argv[2], argv[4]
    sizes = sorted({k[1] for k in list(a) + list(b) if isinstance(k, tuple)})
    keys = ["rowdiff", "idle"] + [(k, t) for k in ("embed_overlay", "lmhead_overlay_bf16") for t in sizes]
    names = {"rowdiff": "rowdiff 152064 x 4096", "idle": "idle dispatch (1 row, slot -1)"}
    print(f"{label_a}: {run_a['device']} (seed {run_a['seed']})")
    print(f"{label_b}: {run_b['device']} (seed {run_b['seed']})")
    print(f"graph per-launch medians of {run_a['batch']} launches, {run_a['repeats']} replays, us\n")
    print(f"| | {label_a} | {label_b} | ratio |")
    print("|---|---|---|---|")
    for k in keys:
        name = names.get(k) or f"{k[0].replace('_overlay', '')} T = {k[1]}"
        fa, fb = a.get(k), b.get(k)
        ratio = f"{fb[0] / fa[0]:.2f}x" if fa and fb and fa[0] > 0 else "-"
        print(f"| {name} | {cell(fa)} | {cell(fb)} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
