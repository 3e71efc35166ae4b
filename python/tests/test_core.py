"""The C API through tovl.core: version, backends, errors, models, adapters, overlays, sets,
rowdiff, the hooks on raw pointers, and handle lifetimes (deterministic, at GC, no leaks)."""

from __future__ import annotations

import gc
import importlib.metadata
import re

import numpy as np
import pytest

import tovl
from tovl import errors
from helpers_core import REPO, TIED, UNTIED, assert_no_leak, bf16_bits, cases, rng, spec_dot


def test_version_is_the_libraries_and_the_packages() -> None:
    header = (REPO / "include" / "tovl" / "tovl.h").read_text()
    parts = [re.search(rf"#define TOVL_VERSION_{p} (\d+)", header).group(1)  # type: ignore[union-attr]
             for p in ("MAJOR", "MINOR", "PATCH")]
    assert tovl.__version__ == tovl.version() == ".".join(parts)
    assert importlib.metadata.version("tovl") == tovl.__version__


def test_backends_list_every_backend_with_reasons() -> None:
    infos = tovl.backends()
    assert [b.name for b in infos] == ["cuda", "hip", "vulkan", "cpu"]
    for b in infos:
        assert isinstance(b, tovl.BackendInfo)
        assert b.available == (b.reason == ""), b
        assert b.available <= b.compiled
        assert bool(b.device) == b.available, b
    cpu = infos[-1]
    assert cpu.available and cpu.compiled


@pytest.mark.parametrize("name", [b.name for b in tovl.backends()])
def test_backend_opens_by_name_or_says_why(name: str) -> None:
    info = {b.name: b for b in tovl.backends()}[name]
    if info.available:
        with tovl.Backend(name) as be:
            assert be.name == name and be.device == info.device
            assert be.kernels["embed_overlay"] != 0
            assert be.has_kernel("rowdiff") and not be.has_kernel("no such kernel")
        assert be.closed
    else:
        with pytest.raises(tovl.UnavailableError) as e:
            tovl.Backend(name)
        assert e.value.status == 200 and e.value.detail


def test_unknown_backend_names_it() -> None:
    with pytest.raises(tovl.UnavailableError) as e:
        tovl.Backend("tpu")
    assert e.value.status == 203 and "'tpu'" in e.value.detail and "TOVL_ERR_UNKNOWN_BACKEND" in str(e.value)


@pytest.mark.parametrize("status,cls", [(100, tovl.InvalidInputError), (104, tovl.InvalidInputError),
                                        (200, tovl.UnavailableError), (203, tovl.UnavailableError),
                                        (300, tovl.DeviceError), (302, tovl.DeviceError),
                                        (400, tovl.FileFormatError), (401, tovl.FileFormatError),
                                        (900, tovl.InternalError)])
def test_each_status_group_has_its_class(status: int, cls: type) -> None:
    e = errors.error_for(status, "the detail")
    assert type(e) is cls and isinstance(e, tovl.TovlError)
    assert e.status == status and e.detail == "the detail" and str(e).endswith(": the detail")
    assert str(e).startswith("TOVL_ERR_")


def test_model_info_and_rows() -> None:
    with tovl.Model(TIED) as m:
        i = m.info
        assert isinstance(i, tovl.ModelInfo)
        assert (i.vocab, i.config_vocab, i.hidden, i.tied) == (131, 131, 24, True)
        assert i.embed_dtype == "BF16" and i.lmhead_file is None
        assert np.array_equal(m.embed_row(5), m.lmhead_row(5)) and m.embed_row(5).any()
        with pytest.raises(tovl.InvalidInputError):
            m.embed_row(131)
    with tovl.Model(UNTIED, padded_vocab=160) as m:
        assert (m.info.vocab, m.info.config_vocab, m.info.tied) == (160, 131, False)
        assert not m.embed_row(150).any()
        assert not np.array_equal(m.embed_row(5), m.lmhead_row(5))


def test_model_errors_name_the_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(tovl.FileFormatError) as e:
        tovl.Model(tmp_path / "absent")
    assert e.value.status == 400 and "absent" in e.value.detail
    (tmp_path / "config.json").write_text("{ not json")
    with pytest.raises(tovl.FileFormatError) as e:
        tovl.Model(tmp_path)
    assert e.value.status == 401 and "config.json" in e.value.detail


def test_adapter_info_for_every_fixture() -> None:
    for label, case, base, _ in cases():
        with tovl.Adapter(case / "adapter") as a:
            i = a.info
            assert isinstance(i, tovl.AdapterInfo) and i.format != "none", label
            assert i.sources and all(isinstance(s, tovl.AdapterSource) for s in i.sources)
            for s in i.sources:
                assert s.module in ("embed", "lmhead") and s.rows > 0 and s.width > 0
                assert (s.ids is not None) == (s.kind == "trainable_tokens"), (label, s)


def test_adapter_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(tovl.FileFormatError) as e:
        tovl.Adapter(tmp_path)
    assert str(tmp_path) in e.value.detail


def test_lmhead_product_matches_rows() -> None:
    g = rng("test_lmhead_product_matches_rows")
    with tovl.Model(UNTIED) as m:
        hidden = bf16_bits(g, (3, 24))
        logits = m.lmhead_product(hidden)
        assert logits.shape == (3, 131) and np.isfinite(logits).all()
        want = np.stack([spec_dot(hidden, m.lmhead_row(v)) for v in range(131)], axis=1)
        assert np.array_equal(logits, want)  # the spec's dot order, bit for bit


def test_bf16_conversions() -> None:
    assert tovl.f32_to_bf16(1.0) == 0x3F80 and tovl.bf16_to_f32(0x3F80) == 1.0
    assert tovl.f32_to_bf16(float("nan")) == 0x7FC0
    assert tovl.f32_to_bf16(1.00390625) == 0x3F80  # a tie rounds to even


def test_overlay_from_rows_view_and_errors() -> None:
    g = rng("test_overlay_from_rows_view_and_errors")
    with tovl.Backend("cpu") as be:
        ids = g.choice(131, size=5, replace=False)
        rows = bf16_bits(g, (5, 24))
        with tovl.Overlay.from_rows(be, 131, 24, ids, rows, adapter="a1") as ov:
            v = ov.view
            assert (v.vocab, v.hidden, v.embed_count, v.has_lmhead) == (131, 24, 5, False)
            assert v.embed_rows and v.slot_map and not v.lmhead_rows
            got = np.empty((5, 24), dtype=np.uint16)
            be.download(got, v.embed_rows)
            got_ids = np.empty(5, dtype=np.uint32)
            be.download(got_ids, v.embed_ids)
            order = np.argsort(got_ids)
            assert np.array_equal(got_ids[order], np.sort(ids))
            assert np.array_equal(got[order], rows[np.argsort(ids)])
        dup = ids.copy()
        dup[1] = dup[0]
        with pytest.raises(tovl.InvalidInputError) as e:
            tovl.Overlay.from_rows(be, 131, 24, dup, rows, adapter="a1")
        assert e.value.status == 101 and str(dup[0]) in e.value.detail
        big = ids.copy()
        big[2] = 131
        with pytest.raises(tovl.InvalidInputError) as e:
            tovl.Overlay.from_rows(be, 131, 24, big, rows)
        assert e.value.status == 102 and "131" in e.value.detail
        with pytest.raises(tovl.InvalidInputError) as e:
            tovl.Overlay.from_rows(be, 131, 16, ids, rows)
        assert e.value.status == 103
        assert not be._children  # nothing half-built is left on the backend


def test_set_properties_tables_and_mismatch() -> None:
    g = rng("test_set_properties_tables_and_mismatch")
    with tovl.Backend("cpu") as be:
        a = tovl.Overlay.from_rows(be, 131, 24, [3, 9], bf16_bits(g, (2, 24)), [4], bf16_bits(g, (1, 24)))
        b = tovl.Overlay.from_rows(be, 131, 24, [7], bf16_bits(g, (1, 24)))
        with tovl.OverlaySet(be, [None, a, b], tied=True, max_loras=4) as s:
            assert (s.max_loras, s.vocab, s.hidden, s.any_active) == (4, 131, 24, True)
            assert s.max_n_override == 1  # a: its own lm_head part (1 row); b: tied, its 1 embed row
            t = s.tables
            assert all(getattr(t, f) for f in t.__dataclass_fields__)
        with tovl.OverlaySet(be, [None, None], tied=False) as empty:
            assert not empty.any_active and empty.vocab == 0
        c = tovl.Overlay.from_rows(be, 140, 24, [7], bf16_bits(g, (1, 24)))
        with pytest.raises(tovl.InvalidInputError) as e:
            tovl.OverlaySet(be, [a, c], tied=False)
        assert e.value.status == 104 and "slot" in e.value.detail
        with tovl.Backend("cpu") as other:
            with pytest.raises(tovl.InvalidInputError, match="another backend"):
                tovl.OverlaySet(other, [a], tied=False)


def test_rowdiff_on_every_available_backend() -> None:
    g = rng("test_rowdiff_on_every_available_backend")
    rows, hidden = 37, 24
    a = bf16_bits(g, (rows, hidden))
    b = a.copy()
    changed = np.sort(g.choice(rows, size=6, replace=False))
    for r in changed:
        b[r, g.integers(hidden)] ^= 1 << int(g.integers(16))
    for name in [i.name for i in tovl.backends() if i.available]:
        with tovl.Backend(name) as be:
            pa, pb = be.alloc(a.nbytes), be.alloc(b.nbytes)
            be.upload(pa, a)
            be.upload(pb, b)
            assert np.array_equal(tovl.rowdiff(be, pa, pb, rows, hidden), changed), name
            assert tovl.rowdiff(be, pa, pa, rows, hidden).size == 0
            be.fill_u32(pb, 0x3F803F80, b.nbytes)
            back = np.empty_like(b)
            be.download(back, pb)
            assert (back == 0x3F80).all()
            be.free(pa)
            be.free(pb)


def test_hooks_on_raw_pointers() -> None:
    """Per-row slots on the CPU backend: embed rows replaced exactly; lm_head cells written only
    where the slot overlays an id (the rest keeps its NaN poison), guard cells around untouched."""
    g = rng("test_hooks_on_raw_pointers")
    T, h, V, ld = 9, 24, 131, 140
    with tovl.Backend("cpu") as be, tovl.Model(TIED) as m:
        ids_a = g.choice(V, size=4, replace=False).astype(np.uint32)
        rows_a = bf16_bits(g, (4, h))
        # lm_head rows equal to the base model's: the patched cells must equal the base product.
        lm_ids = g.choice(V, size=3, replace=False).astype(np.uint32)
        lm_rows = np.stack([m.lmhead_row(int(v)) for v in lm_ids])
        ov = tovl.Overlay.from_rows(be, V, h, ids_a, rows_a, lm_ids, lm_rows)
        s = tovl.OverlaySet(be, [None, ov], tied=True, max_loras=2)
        ov.close()  # the set holds its own reference
        token_ids = np.where(g.random(T) < 0.5, g.choice(ids_a, size=T), g.integers(V, size=T)).astype(np.int32)
        token_ids[0] = -1  # read as u32: >= vocab, left alone
        slots = g.integers(-1, 3, size=T).astype(np.int32)
        slots[1], token_ids[1] = 1, ids_a[0]
        guard = 2
        buf = bf16_bits(g, (T + 2 * guard, h))
        before = buf.copy()
        hidden = buf[guard:-guard]
        s.embed_hook(hidden.ctypes.data, token_ids.ctypes.data, T, h, slots.ctypes.data)
        want = before[guard:-guard].copy()
        for t in range(T):
            if slots[t] == 1 and token_ids[t] in ids_a:
                want[t] = rows_a[list(ids_a).index(token_ids[t])]
        assert np.array_equal(hidden, want) and (want != before[guard:-guard]).any()
        assert np.array_equal(buf[:guard], before[:guard]) and np.array_equal(buf[-guard:], before[-guard:])

        hid = bf16_bits(g, (T, h))
        logits = np.full((T + 1, ld), np.nan, dtype=np.float32)
        s.lmhead_hook(logits.ctypes.data, "f32", ld, hid.ctypes.data, T, h, slots.ctypes.data)
        base = m.lmhead_product(hid)
        for t in range(T):
            for v in range(ld):
                if slots[t] == 1 and v in lm_ids:
                    assert logits[t, v] == base[t, v], (t, v)
                else:
                    assert np.isnan(logits[t, v]), (t, v)
        assert np.isnan(logits[T]).all()
        # One active slot for every row; < 0: nothing at all.
        logits[:] = np.nan
        s.lmhead_hook(logits.ctypes.data, "f32", ld, hid.ctypes.data, T, h, active_slot=-1)
        assert np.isnan(logits).all()
        s.lmhead_hook(logits.ctypes.data, "f32", ld, hid.ctypes.data, T, h, active_slot=1)
        assert np.array_equal(logits[:T, lm_ids], base[:, lm_ids]) and np.isnan(logits[T]).all()
        with pytest.raises(tovl.InvalidInputError) as e:
            s.embed_hook(hidden.ctypes.data, token_ids.ctypes.data, T, h + 1, slots.ctypes.data)
        assert e.value.status == 103 and "hidden_size" in e.value.detail
        with pytest.raises(tovl.InvalidInputError) as e:
            s.lmhead_hook(logits.ctypes.data, "f32", V - 1, hid.ctypes.data, T, h, active_slot=1)
        assert "ld" in e.value.detail
        s.close()


def test_closing_a_backend_closes_what_was_built_on_it() -> None:
    be = tovl.Backend("cpu")
    ov = tovl.Overlay.from_rows(be, 131, 24, [1], np.ones((1, 24), dtype=np.uint16))
    s = tovl.OverlaySet(be, [ov], tied=False)
    handle = s.handle
    be.close()
    assert ov.closed and s.closed and be.closed
    with pytest.raises(tovl.InvalidInputError, match="closed"):
        s.handle
    with pytest.raises(tovl.InvalidInputError, match="not a live"):
        tovl.core.set_for_handle(handle)
    s.close()  # again: nothing
    be.close()


def test_handles_close_at_garbage_collection() -> None:
    be = tovl.Backend("cpu")
    ov = tovl.Overlay.from_rows(be, 131, 24, [1], np.ones((1, 24), dtype=np.uint16))
    cells = [be._cell, ov._cell]
    del be, ov
    gc.collect()
    assert [c.value for c in cells] == [0, 0]


def _cycle() -> None:
    label, case, base, padded = cases()[0]
    with tovl.Backend("cpu") as be, tovl.Model(base, padded) as m, tovl.Adapter(case / "adapter") as a:
        with tovl.AdapterRows(be, a, m) as rows:
            ov1 = tovl.Overlay.from_resolved(be, rows)
        ov2 = tovl.Overlay.from_adapter(be, a, m)
        s = tovl.OverlaySet(be, [ov1, None, ov2], tied=m.info.tied)
        hidden = np.zeros((2, m.info.hidden), dtype=np.uint16)
        ids = np.array(rows.embed_ids[:2], dtype=np.uint32) if rows.embed_ids.size >= 2 else np.zeros(2, np.uint32)
        s.embed_hook(hidden.ctypes.data, ids.ctypes.data, 2, m.info.hidden, active_slot=0)
        try:
            tovl.Overlay.from_rows(be, 131, 24, [1, 1], np.ones((2, 24), dtype=np.uint16))
        except tovl.InvalidInputError:
            pass
    # ov1, ov2 and s were closed by the backend; a dropped handle is closed by GC
    tovl.Backend("cpu")


def test_nothing_leaks_over_many_open_close_cycles() -> None:
    # Each cycle allocates far more than the limit: backend, model, adapter, rows, overlays, set.
    assert_no_leak(lambda k: _cycle(), warm=20, runs=300)


def test_safetensors_read_write_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    g = rng("test_safetensors_read_write_round_trip")
    tensors = {"w": ("BF16", bf16_bits(g, (3, 5))), "ids": ("I32", g.integers(-9, 9, size=7).astype(np.int32)),
               "s": ("F32", np.array(g.normal(), dtype=np.float32))}
    path = tmp_path / "t.safetensors"
    tovl.write_safetensors(path, tensors, {"format": "pt"})
    data = path.read_bytes()
    for f in (tovl.SafetensorsFile(path), tovl.SafetensorsFile("in memory", data=data)):
        with f:
            assert {t.name: (t.dtype, t.shape) for t in f.tensors} == {
                k: (d, a.shape) for k, (d, a) in tensors.items()}
            for k, (_, a) in tensors.items():
                got = f.array(k)
                assert got.dtype == a.dtype and np.array_equal(got, a), k
            with pytest.raises(tovl.InvalidInputError, match="no tensor 'x'"):
                f.array("x")
    with pytest.raises(tovl.FileFormatError) as e:
        tovl.SafetensorsFile("cut", data=data[: len(data) // 2])
    assert "cut" in e.value.detail
