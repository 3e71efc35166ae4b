"""Shared pieces of the core, ops and pool tests: the committed PEFT fixtures, seeded randomness,
bf16 bit patterns, and the process's heap and descriptor counts for the leak checks."""

from __future__ import annotations

import ctypes
import gc
import os
import random
from pathlib import Path
from typing import Any, Callable

import numpy as np

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "peft_extra"
TIED = FIXTURES / "bases" / "tied"
UNTIED = FIXTURES / "bases" / "untied"


def cases() -> list[tuple[str, Path, Path, int]]:
    """cases.tsv: (label, case dir, base dir, padded vocab)."""
    out = []
    for line in (FIXTURES / "cases.tsv").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        label, case, base, padded = line.split("\t")
        out.append((label, FIXTURES / case, FIXTURES / base, int(padded)))
    return out


def rng(test: str) -> np.random.Generator:
    """A seeded generator; the seed is printed so a failure can be replayed (TOVL_TEST_SEED)."""
    seed = int(os.environ.get("TOVL_TEST_SEED", random.SystemRandom().randrange(2**32)))
    print(f"{test}: seed {seed} (TOVL_TEST_SEED={seed} replays it)")
    return np.random.default_rng(seed)


def bf16_bits(g: np.random.Generator, shape: Any) -> np.ndarray:
    """Random finite, nonzero bf16 bit patterns (normal values of either sign)."""
    f = g.normal(0.0, 1.0, size=shape).astype(np.float32)
    f[f == 0] = 0.5
    return (f.view(np.uint32) >> 16).astype(np.uint16)


def heap_in_use() -> int:
    """Bytes malloc has handed out and not had back (glibc mallinfo2), else the RSS."""
    libc = ctypes.CDLL(None)
    if hasattr(libc, "mallinfo2"):
        class MallInfo2(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in
                        ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                         "fordblks", "keepcost")]
        libc.mallinfo2.restype = MallInfo2
        m = libc.mallinfo2()
        return int(m.uordblks + m.hblkhd)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def assert_no_leak(cycle: Callable[[int], None], warm: int, runs: int, limit: int = 64 * 1024) -> None:
    """Run cycle(k) `warm` times, then `runs` more: the heap in use may grow by less than `limit`
    bytes (a leak of one object per cycle shows) and the open descriptors not at all."""
    for k in range(warm):
        cycle(k)
    gc.collect()
    heap, fds = heap_in_use(), open_fds()
    for k in range(runs):
        cycle(k)
    gc.collect()
    grown = heap_in_use() - heap
    assert open_fds() == fds
    assert grown < limit, f"heap grew by {grown} bytes over {runs} cycles"


def f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns as the f32 values they stand for (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def spec_dot(x_bits: np.ndarray, w_bits: np.ndarray) -> np.ndarray:
    """docs/SPEC.md's dot of each bf16 row of x [T, h] with the bf16 row w [h], in its order:
    256 lanes, lane l sums elements l, l+256, ... (each product and sum rounded to f32), then
    the pairwise tree of strides 128 .. 1. numpy's f32 arithmetic rounds every operation."""
    x, w = f32(x_bits), f32(w_bits)
    p = np.zeros((x.shape[0], 256), dtype=np.float32)
    for i in range(x.shape[1]):
        p[:, i % 256] = p[:, i % 256] + x[:, i] * w[i]
    stride = 128
    while stride:
        p[:, :stride] = p[:, :stride] + p[:, stride : 2 * stride]
        stride //= 2
    return p[:, 0].copy()
