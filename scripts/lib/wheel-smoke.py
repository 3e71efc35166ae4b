#!/usr/bin/env python3
"""What a user does first with the installed tovl wheel, run from outside the source tree:

    wheel-smoke.py FIXTURES_DIR [--device cpu|cuda] [--expect-dir SITE_PACKAGES]

import tovl (the package and its bundled libtovl must come from the environment,
not the tree: --expect-dir), tovl.backends(), then an AdapterPool on the device
serving one PEFT fixture adapter (tests/fixtures/peft_extra/tt_list_tied_ewt, a
tied base model): its embedding rows through pool.embed_ and through
torch.ops.tovl.embed_overlay_ bit-identical to PEFT's recorded output, and its
lm_head cells through pool.lmhead_ and torch.ops.tovl.lmhead_overlay_ within
2 bf16 units of PEFT's, every other logit untouched. Prints one line per check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

import tovl


def bits(t: torch.Tensor) -> np.ndarray:
    return t.cpu().view(torch.int16).numpy().view(np.uint16)


def bf16(b: np.ndarray, device: str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(b).view(np.int16)).view(torch.bfloat16).to(device)


def bf16_units(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    def ordered(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.int32)
        return np.where(x & 0x8000, 0x8000 - x, x)
    return np.abs(ordered(a) - ordered(b))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("fixtures", type=Path)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--expect-dir", type=Path)
    a = ap.parse_args()

    lib = tovl._lib.library_path()
    print(f"tovl {tovl.__version__} from {Path(tovl.__file__).parent}, library {lib.name}")
    if a.expect_dir is not None:
        for what, p in (("package", Path(tovl.__file__)), ("library", lib)):
            if a.expect_dir.resolve() not in p.resolve().parents:
                sys.exit(f"wheel-smoke: the {what} {p} is not under {a.expect_dir}")
    for b in tovl.backends():
        print(f"  backend {b.name}: compiled {b.compiled}, available {b.available}"
              f"{', ' + b.device if b.device else ''}{', ' + b.reason if b.reason and not b.available else ''}")

    case = a.fixtures / "peft_extra" / "tt_list_tied_ewt"
    base = a.fixtures / "peft_extra" / "bases" / "tied"
    with tovl.SafetensorsFile(case / "expected.safetensors") as f:
        e = {t.name: f.array(t.name) for t in f.tensors}
    dev = a.device
    with tovl.AdapterPool(base, dev, max_loras=4) as pool:
        info = pool.load(1, case / "adapter")
        print(f"pool on {dev} ({pool.backend.name}): slot 1 = {info.format}, "
              f"{len(info.embed_ids)} embed ids, {len(info.lmhead_ids)} lm_head ids")
        ids = e["ids"].astype(np.int32)
        n = len(ids)
        base_ids = np.array([0, 5, 9], dtype=np.int32)
        all_ids = np.concatenate([ids, base_ids])
        slots = np.concatenate([np.full(n, 1, np.int32), np.full(3, -1, np.int32)])
        gathered = np.stack([pool.model.embed_row(int(i)) for i in all_ids])
        want = np.concatenate([e["embed"].view(np.uint16), gathered[n:]])
        t_ids, t_slots = torch.from_numpy(all_ids).to(dev), torch.from_numpy(slots).to(dev)

        h = bf16(gathered, dev)
        pool.embed_(h, t_ids, t_slots)
        assert np.array_equal(bits(h), want), "pool.embed_ differs from PEFT's embedding rows"
        h2 = bf16(gathered, dev)
        torch.ops.tovl.embed_overlay_(h2, t_ids, t_slots, -1, pool.overlay_set.handle)
        assert np.array_equal(bits(h2), want), "torch.ops.tovl.embed_overlay_ differs from PEFT's rows"
        print(f"embed: {n} adapter rows bit-identical to PEFT's, 3 base rows untouched")

        final = np.concatenate([e["hidden"].view(np.uint16), gathered[n:]])
        base_logits = pool.model.lmhead_product(final)
        cells = np.array(info.lmhead_ids, dtype=np.int64)
        other = np.setdiff1d(np.arange(pool.model.info.vocab), cells)
        for name, run in (("pool.lmhead_", lambda lg: pool.lmhead_(lg, bf16(final, dev), t_slots)),
                          ("torch.ops.tovl.lmhead_overlay_", lambda lg: torch.ops.tovl.lmhead_overlay_(
                              lg, bf16(final, dev), t_slots, -1, pool.overlay_set.handle))):
            logits = torch.from_numpy(base_logits.copy()).to(dev)
            run(logits)
            got = logits.cpu().numpy()
            mine = bits(torch.from_numpy(got[:n][:, cells]).to(torch.bfloat16))
            dist = bf16_units(mine, e["logits_bf16"].view(np.uint16)[:, cells])
            assert dist.max(initial=0) <= 2, f"{name}: {dist.max()} bf16 units from PEFT's logits"
            assert np.array_equal(got[:n][:, other], base_logits[:n][:, other]), f"{name} touched other cells"
            assert np.array_equal(got[n:], base_logits[n:]), f"{name} touched the base rows"
        print(f"lm_head: {len(cells)} cells x {n} rows within {int(dist.max(initial=0))} bf16 units of PEFT's "
              "(pool and op), the rest untouched")
    print("wheel-smoke: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
