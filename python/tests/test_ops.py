"""The torch ops: eager results against a reference, the argument checks (named argument, nothing
written), torch.compile(fullgraph=True) on CPU, torch.cuda.graph capture (CUDA only), and the
backend choice on a ROCm build of PyTorch."""

from __future__ import annotations

import gc
import weakref
from typing import Any, Callable

import numpy as np
import pytest
import torch

import tovl
from tovl import ops
from helpers_core import TIED, bf16_bits, rng, spec_dot

V, H = 131, 24
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda)")


def bf16(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)


def bits(t: torch.Tensor) -> np.ndarray:
    return t.cpu().view(torch.int16).numpy().view(np.uint16)


class World:
    """A CPU backend, the tied fixture model and a set of 3 slots: slot 0 embed rows only (tied, so
    its logits come from them too), slot 1 empty, slot 2 embed rows and an own lm_head part."""

    def __init__(self, g: np.random.Generator, device: str = "cpu") -> None:
        self.device = torch.device(device)
        self.backend = tovl.Backend("cpu") if device == "cpu" else tovl.Backend.for_device(
            ops.backend_name_for(self.device), self.device.index or 0)
        self.model = tovl.Model(TIED)
        self.embed: dict[int, dict[int, np.ndarray]] = {}
        self.lmhead: dict[int, dict[int, np.ndarray]] = {}
        overlays: list[Any] = [None, None, None]
        for slot, with_lm in ((0, False), (2, True)):
            ids = g.choice(V, size=6, replace=False)
            rows = bf16_bits(g, (6, H))
            self.embed[slot] = dict(zip(ids.tolist(), rows))
            lm_ids = g.choice(V, size=4, replace=False) if with_lm else ids
            lm_rows = bf16_bits(g, (4, H)) if with_lm else rows
            self.lmhead[slot] = dict(zip(lm_ids.tolist(), lm_rows))
            overlays[slot] = tovl.Overlay.from_rows(self.backend, V, H, ids, rows,
                                                    lm_ids if with_lm else None, lm_rows if with_lm else None,
                                                    tied=True)
        self.set = tovl.OverlaySet(self.backend, overlays, tied=True)
        for ov in overlays:
            if ov is not None:
                ov.close()

    def ids(self, g: np.random.Generator, T: int) -> np.ndarray:
        pool = [i for d in self.embed.values() for i in d] + [i for d in self.lmhead.values() for i in d]
        ids = np.where(g.random(T) < 0.6, g.choice(pool, size=T), g.integers(V, size=T)).astype(np.int32)
        # Rows 0 and 1 (slots 0 and 2, see slots()) always hit an overlaid id.
        ids[:2] = [next(iter(self.embed[0])), next(iter(self.embed[2]))][: min(T, 2)]
        return ids

    def slots(self, g: np.random.Generator, T: int) -> np.ndarray:
        s = g.integers(-1, 4, size=T).astype(np.int32)  # -1 and 3 (>= max_loras): base
        s[: min(T, 2)] = (0, 2)[: min(T, 2)]
        return s

    def want_embed(self, hidden: np.ndarray, ids: np.ndarray, slots: np.ndarray) -> np.ndarray:
        out = hidden.copy()
        for t, (i, s) in enumerate(zip(ids.tolist(), slots.tolist())):
            if s in self.embed and i in self.embed[s]:
                out[t] = self.embed[s][i]
        return out

    def want_logits(self, logits: np.ndarray, hidden_bits: np.ndarray, slots: np.ndarray) -> np.ndarray:
        out = logits.copy()
        for t, s in enumerate(slots.tolist()):
            for v, row in self.lmhead.get(s, {}).items():
                out[t, v] = spec_dot(hidden_bits[t : t + 1], row)[0]
        return out

    def close(self) -> None:
        self.set.close()
        self.model.close()
        self.backend.close()


@pytest.fixture
def world(request: Any) -> Any:
    w = World(rng(request.node.name))
    yield w
    w.close()


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("T", [1, 2, 17])
def test_embed_per_row_slots(world: World, ids_dtype: torch.dtype, T: int) -> None:
    g = rng(f"test_embed_per_row_slots[{T}]")
    hb, ids, slots = bf16_bits(g, (T, H)), world.ids(g, T), world.slots(g, T)
    hidden = bf16(hb)
    torch.ops.tovl.embed_overlay_(hidden, torch.from_numpy(ids).to(ids_dtype), torch.from_numpy(slots), -1,
                                  world.set.handle)
    want = world.want_embed(hb, ids, slots)
    assert np.array_equal(bits(hidden), want)
    assert not np.array_equal(want[:2], hb[:2])


def test_embed_active_slot_and_odd_ids(world: World) -> None:
    g = rng("test_embed_active_slot_and_odd_ids")
    T = 12
    hb, ids = bf16_bits(g, (T, H)), world.ids(g, T).astype(np.int64)
    ids[0], ids[1], ids[2] = -1, V, 2**32 + next(iter(world.embed[2]))  # never a real id
    for active in (-1, 0, 1, 2, 3):
        hidden = bf16(hb)
        tovl.embed_overlay_(hidden, torch.from_numpy(ids), active, world.set)
        want = world.want_embed(hb, np.where(ids < V, ids, -1).astype(np.int64),
                                np.full(T, active, dtype=np.int32))
        assert np.array_equal(bits(hidden), want), active
        assert np.array_equal(bits(hidden)[:3], hb[:3])


def test_embed_wrapper_on_batch_and_sequence(world: World) -> None:
    g = rng("test_embed_wrapper_on_batch_and_sequence")
    B, S = 3, 5
    hb, ids = bf16_bits(g, (B * S, H)), world.ids(g, B * S)
    per_seq = np.array([2, -1, 0], dtype=np.int32)
    hidden = bf16(hb).view(B, S, H)
    out = tovl.embed_overlay_(hidden, torch.from_numpy(ids).view(B, S), torch.from_numpy(per_seq), world.set)
    assert out is hidden
    assert np.array_equal(bits(hidden).reshape(B * S, H), world.want_embed(hb, ids, np.repeat(per_seq, S)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 9])
def test_lmhead_per_row_slots_with_row_stride(world: World, dtype: torch.dtype, T: int) -> None:
    g = rng(f"test_lmhead_per_row_slots_with_row_stride[{T}]")
    ld, guard = V + 13, 2
    hb, slots = bf16_bits(g, (T, H)), world.slots(g, T)
    big = torch.full((T + guard, ld), float("nan"), dtype=dtype)
    logits = big[:T, :V]  # row stride ld > vocab, guard rows and columns after
    torch.ops.tovl.lmhead_overlay_(logits, bf16(hb), torch.from_numpy(slots), -1, world.set.handle)
    want = world.want_logits(np.full((T, V), np.nan, dtype=np.float32), hb, slots)
    if dtype == torch.bfloat16:
        want = torch.from_numpy(want).to(torch.bfloat16).float().numpy()
    got = logits.float().numpy()
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(got[~np.isnan(got)],
                                                                             want[~np.isnan(want)])
    assert (~np.isnan(got)).any()
    assert big[:, V:].isnan().all() and big[T:].isnan().all()


def test_lmhead_wrapper_active_slot(world: World) -> None:
    g = rng("test_lmhead_wrapper_active_slot")
    B, S = 2, 3
    hb = bf16_bits(g, (B * S, H))
    logits = torch.from_numpy(g.normal(size=(B, S, V)).astype(np.float32))
    before = logits.clone()
    tovl.lmhead_overlay_(logits, bf16(hb).view(B, S, H), 2, world.set)
    want = world.want_logits(before.view(B * S, V).numpy(), hb, np.full(B * S, 2, dtype=np.int32))
    assert np.array_equal(logits.view(B * S, V).numpy(), want) and not torch.equal(logits, before)


def _poison_cases(world: World) -> list[tuple[str, Callable[[], None], str]]:
    """(name, call, the text the error must contain); every call targets the tensors in `world.p_*`."""
    T = 4
    h, ids, s = world.p_hidden, world.p_ids, world.p_slots  # type: ignore[attr-defined]
    lg, lh = world.p_logits, world.p_lhidden  # type: ignore[attr-defined]
    e, l = torch.ops.tovl.embed_overlay_, torch.ops.tovl.lmhead_overlay_
    handle = world.set.handle
    with tovl.Backend("vulkan" if "vulkan" in {b.name for b in tovl.backends() if b.available}
                      else "cpu") as other_be:
        pass
    return [
        ("hidden dtype", lambda: e(h.view(torch.float16), ids, s, -1, handle), "hidden has dtype torch.float16"),
        ("hidden shape", lambda: e(h.view(T, 2, H // 2), ids, s, -1, handle), "hidden has shape"),
        ("hidden width", lambda: e(h[:, : H - 8], ids, s, -1, handle), "hidden size is 24"),
        ("hidden stride", lambda: e(world.p_hidden_t.t(), ids, s, -1, handle), "hidden has strides"),  # type: ignore[attr-defined]
        ("ids dtype", lambda: e(h, ids.to(torch.int16), s, -1, handle), "token_ids has dtype torch.int16"),
        ("ids length", lambda: e(h, ids[:3], s, -1, handle), "token_ids has shape [3]"),
        ("ids stride", lambda: e(h, world.p_ids2[:, 0], s, -1, handle), "token_ids has stride 2"),  # type: ignore[attr-defined]
        ("ids device", lambda: e(h, ids.to("meta"), s, -1, handle), "token_ids is on meta"),
        ("slots dtype", lambda: e(h, ids, s.to(torch.int64), -1, handle), "slots has dtype torch.int64"),
        ("slots length", lambda: e(h, ids, s[:2], -1, handle), "slots has shape [2]"),
        ("set handle", lambda: e(h, ids, s, -1, 12345), "not a live tovl.OverlaySet"),
        ("logits dtype", lambda: l(lg.half(), lh, s, -1, handle), "logits has dtype torch.float16"),
        ("logits width", lambda: l(lg[:, : V - 1], lh, s, -1, handle), "fewer than the set's vocab 131"),
        ("logits stride", lambda: l(world.p_logits_t.t(), lh, s, -1, handle), "logits has strides"),  # type: ignore[attr-defined]
        ("lm hidden rows", lambda: l(lg, lh[:3], s, -1, handle), "hidden has 3 rows, logits 4"),
        ("lm hidden dtype", lambda: l(lg, lh.float(), s, -1, handle), "hidden has dtype torch.float32"),
        ("lm slots", lambda: l(lg, lh, s.to(torch.int64), -1, handle), "slots has dtype"),
    ]


def test_bad_arguments_name_the_argument_and_write_nothing(world: World) -> None:
    g = rng("test_bad_arguments_name_the_argument_and_write_nothing")
    T = 4
    world.p_hidden = bf16(bf16_bits(g, (T, H)))  # type: ignore[attr-defined]
    world.p_hidden_t = bf16(bf16_bits(g, (H, T)))  # type: ignore[attr-defined]
    world.p_ids = torch.from_numpy(world.ids(g, T))  # type: ignore[attr-defined]
    world.p_ids2 = world.p_ids.repeat_interleave(2).view(T, 2)  # type: ignore[attr-defined]
    world.p_slots = torch.full((T,), 2, dtype=torch.int32)  # type: ignore[attr-defined]
    world.p_logits = torch.full((T, V), float("nan"))  # type: ignore[attr-defined]
    world.p_logits_t = torch.full((V, T), float("nan"))  # type: ignore[attr-defined]
    world.p_lhidden = bf16(bf16_bits(g, (T, H)))  # type: ignore[attr-defined]
    watched = [world.p_hidden, world.p_hidden_t, world.p_logits, world.p_logits_t]  # type: ignore[attr-defined]
    snapshot = [w.clone() for w in watched]
    for name, call, text in _poison_cases(world):
        with pytest.raises(tovl.InvalidInputError) as e:
            call()
        assert text in str(e.value), (name, str(e.value))
        for w, before in zip(watched, snapshot):
            assert torch.equal(w.view(torch.int16) if w.dtype == torch.bfloat16 else w.isnan(),
                               before.view(torch.int16) if w.dtype == torch.bfloat16 else before.isnan()), name
    # The same call with good arguments does write: the checks above are what stopped it.
    torch.ops.tovl.embed_overlay_(world.p_hidden, world.p_ids, world.p_slots, -1, world.set.handle)  # type: ignore[attr-defined]
    torch.ops.tovl.lmhead_overlay_(world.p_logits, world.p_lhidden, world.p_slots, -1, world.set.handle)  # type: ignore[attr-defined]
    assert not world.p_logits.isnan().all()  # type: ignore[attr-defined]


def test_a_closed_set_is_refused_and_no_set_is_kept_alive() -> None:
    """The ops keep per-set launch data by address: a call after the set is closed (or collected)
    must fail naming the handle, write nothing, and the data must not keep the set alive."""
    g = rng("test_a_closed_set_is_refused_and_no_set_is_kept_alive")
    with tovl.Backend("cpu") as be:
        rows = bf16_bits(g, (1, H))
        ov = tovl.Overlay.from_rows(be, V, H, [5], rows)
        s = tovl.OverlaySet(be, [ov], tied=True)
        ov.close()
        hb = bf16_bits(g, (2, H))
        hidden, ids = bf16(hb), torch.tensor([5, 7], dtype=torch.int32)
        handle = s.handle
        torch.ops.tovl.embed_overlay_(hidden, ids, None, 0, handle)  # caches the set's launch data
        assert np.array_equal(bits(hidden)[0], rows[0]) and np.array_equal(bits(hidden)[1], hb[1])
        tovl.embed_overlay_(hidden, ids, 0, s)
        set_ref = weakref.ref(s)
        s.close()
        hidden = bf16(hb)
        with pytest.raises(tovl.InvalidInputError, match="not a live tovl.OverlaySet"):
            torch.ops.tovl.embed_overlay_(hidden, ids, None, 0, handle)
        with pytest.raises(tovl.InvalidInputError, match="not a live tovl.OverlaySet"):
            torch.ops.tovl.lmhead_overlay_(torch.zeros(2, V), hidden, None, 0, handle)
        with pytest.raises(tovl.InvalidInputError, match="closed"):
            tovl.embed_overlay_(hidden, ids, 0, s)
        assert np.array_equal(bits(hidden), hb)
        del s
        gc.collect()
        assert set_ref() is None
        assert handle not in ops._launches


def test_set_built_for_another_backend_is_refused() -> None:
    g = rng("test_set_built_for_another_backend_is_refused")
    names = [b.name for b in tovl.backends() if b.available and b.name != "cpu"]
    # Without a second host backend, a set whose backend claims to be CUDA's device 0.
    with tovl.Backend(names[0] if names else "cpu") as be:
        ov = tovl.Overlay.from_rows(be, V, H, [5], bf16_bits(g, (1, H)))
        with tovl.OverlaySet(be, [ov], tied=True) as s:
            if not names:
                be.name, be.device_index = "cuda", 0
            hb = bf16_bits(g, (2, H))
            hidden = bf16(hb)
            with pytest.raises(tovl.InvalidInputError, match=r"set_handle is a set built on the [\w:]+ backend, "
                                                             r"but the tensors are on cpu"):
                torch.ops.tovl.embed_overlay_(hidden, torch.tensor([5, 5], dtype=torch.int32), None, 0, s.handle)
            assert np.array_equal(bits(hidden), hb)


def test_ops_under_torch_compile_fullgraph(world: World) -> None:
    g = rng("test_ops_under_torch_compile_fullgraph")
    T = 7
    hb, hb2, ids, slots = bf16_bits(g, (T, H)), bf16_bits(g, (T, H)), world.ids(g, T), world.slots(g, T)
    handle = world.set.handle

    def forward(hidden: torch.Tensor, ids: torch.Tensor, slots: torch.Tensor, final: torch.Tensor) -> Any:
        torch.ops.tovl.embed_overlay_(hidden, ids, slots, -1, handle)
        x = hidden * 2
        logits = final.float() @ torch.ones(H, V)
        torch.ops.tovl.lmhead_overlay_(logits, final, slots, -1, handle)
        return x, logits

    def run(fn: Any) -> Any:
        hidden = bf16(hb)
        x, logits = fn(hidden, torch.from_numpy(ids), torch.from_numpy(slots), bf16(hb2))
        return bits(hidden), bits(x), logits

    eager = run(forward)
    torch._dynamo.reset()
    compiled = run(torch.compile(forward, fullgraph=True))
    assert np.array_equal(eager[0], world.want_embed(hb, ids, slots)) and not np.array_equal(eager[0], hb)
    for a, b in zip(eager[:2], compiled[:2]):
        assert np.array_equal(a, b)
    assert torch.equal(eager[2], compiled[2])
    # The pool-style wrappers trace too.
    torch._dynamo.reset()
    wrapped = torch.compile(lambda h, i, s: tovl.embed_overlay_(h, i, s, world.set) * 1, fullgraph=True)
    hidden = bf16(hb)
    assert np.array_equal(bits(wrapped(hidden, torch.from_numpy(ids), torch.from_numpy(slots))), eager[0])


def test_backend_choice_follows_torch_version_hip(monkeypatch: Any) -> None:
    monkeypatch.setattr(torch.version, "hip", None)
    assert ops.backend_name_for("cuda:1") == "cuda" and ops.backend_name_for("cpu") == "cpu"
    monkeypatch.setattr(torch.version, "hip", "6.3.42131")
    assert ops.backend_name_for(torch.device("cuda", 0)) == "hip"
    with pytest.raises(tovl.InvalidInputError, match="'mps'"):
        ops.backend_name_for("mps")
    if not torch.cuda.is_available():
        # The pool asks for the HIP backend of device 0, which this machine does not have.
        with pytest.raises(tovl.UnavailableError, match="hip"):
            tovl.AdapterPool(TIED, "cuda:0")
        monkeypatch.setattr(torch.version, "hip", None)
        with pytest.raises(tovl.UnavailableError, match="cuda"):
            tovl.AdapterPool(TIED, "cuda:0")


def test_stream_is_torchs_current_one(monkeypatch: Any) -> None:
    """The op passes torch's current stream of the set's device, read by torch's raw-stream reader
    (or torch.cuda.current_stream where a build lacks it). torch's default stream (handle 0) is the
    legacy NULL stream: CUDA gets CU_STREAM_LEGACY, since tovl reads NULL as its own stream; HIP's
    NULL is the null stream already."""

    class FakeStream:
        def __init__(self, raw: int) -> None:
            self.cuda_stream = raw

    class FakeSet:
        def __init__(self, name: str, index: int) -> None:
            self.backend = type("B", (), {"name": name, "device_index": index})()
            self.hidden, self.vocab, self.sharded, self.shard_width = 8, 16, False, 16
            self._cell, self._hook_addrs, self._embed_args, self._lmhead_args = None, (0, 0, 0), None, None

    for raw, name, want in ((0, "cuda", 1), (0, "hip", 0), (0x7F00, "cuda", 0x7F00), (0x7F00, "hip", 0x7F00)):
        monkeypatch.setattr(torch.version, "hip", "6.2" if name == "hip" else None)
        asked: list[Any] = []

        def raw_reader(index: int, raw: int = raw) -> int:
            asked.append(index)
            return raw

        def current_stream(device: Any = None, raw: int = raw) -> FakeStream:
            asked.append(device)
            return FakeStream(raw)

        monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
        for reader in (raw_reader, None):
            monkeypatch.setattr(ops, "_raw_stream_reader", lambda reader=reader: reader)
            assert ops._Launch(FakeSet(name, 3)).stream() == want  # type: ignore[arg-type]
        assert asked == [3, torch.device("cuda", 3)]
    assert ops._Launch(FakeSet("cpu", None)).stream() is None  # type: ignore[arg-type]


@needs_cuda
def test_ops_on_cuda_eager_and_in_a_captured_graph() -> None:
    g = rng("test_ops_on_cuda_eager_and_in_a_captured_graph")
    w = World(g, "cuda:0")
    try:
        T = 33
        hb, hb2, ids, slots = bf16_bits(g, (T, H)), bf16_bits(g, (T, H)), w.ids(g, T), w.slots(g, T)
        dev = w.device
        hidden = bf16(hb).to(dev)
        ids_t, slots_t = torch.from_numpy(ids).to(dev), torch.from_numpy(slots).to(dev)
        torch.ops.tovl.embed_overlay_(hidden, ids_t, slots_t, -1, w.set.handle)
        assert np.array_equal(bits(hidden), w.want_embed(hb, ids, slots))
        final = bf16(hb2).to(dev)
        logits = torch.full((T, V), float("nan"), device=dev)
        torch.ops.tovl.lmhead_overlay_(logits, final, slots_t, -1, w.set.handle)
        want = w.want_logits(np.full((T, V), np.nan, dtype=np.float32), hb2, slots)
        assert np.array_equal(np.nan_to_num(logits.cpu().numpy(), nan=7.0), np.nan_to_num(want, nan=7.0))

        static_h = bf16(hb).to(dev)
        static_l = torch.full((T, V), float("nan"), device=dev)
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            torch.cuda.synchronize(dev)
            with torch.cuda.graph(graph, stream=stream):
                torch.ops.tovl.embed_overlay_(static_h, ids_t, slots_t, -1, w.set.handle)
                torch.ops.tovl.lmhead_overlay_(static_l, final, slots_t, -1, w.set.handle)
        for _ in range(3):
            static_h.copy_(bf16(hb).to(dev))
            static_l.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize(dev)
            assert torch.equal(static_h.view(torch.int16), hidden.view(torch.int16))
            assert torch.equal(static_l.nan_to_num(7.0), logits.nan_to_num(7.0))
    finally:
        w.close()
