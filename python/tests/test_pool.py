"""AdapterPool over the committed PEFT fixtures (made by tests/fixtures/make_fixtures.py with the
real PEFT): every case's embedding rows bit-identical to PEFT's and its overlaid logits cells
within 2 bf16 units of PEFT's in one mixed batch with base rows; slot reports; unload; hot swap
with the replaced set kept until its work is done; failures that leave the pool as it was."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import tovl
from helpers_core import TIED, UNTIED, assert_no_leak, cases, rng


def bf16(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16)


def bits(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).numpy().view(np.uint16)


def expected(case: Path) -> dict[str, np.ndarray]:
    """PEFT's own outputs for the case: ids, embed, hidden, logits_bf16 (bf16 as uint16 bits)."""
    return {k: (bits(v) if v.dtype == torch.bfloat16 else v.numpy())
            for k, v in load_file(str(case / "expected.safetensors")).items()}


def bf16_units(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in bf16 units (ulps) between two bf16 bit arrays of finite values."""
    def ordered(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.int32)
        return np.where(x & 0x8000, 0x8000 - x, x)
    return np.abs(ordered(a) - ordered(b))


GROUPS: dict[tuple[Path, int], list[tuple[str, Path]]] = defaultdict(list)
for _label, _case, _base, _padded in cases():
    GROUPS[(_base, _padded)].append((_label, _case))


@pytest.mark.parametrize("base,padded", list(GROUPS), ids=[f"{b.name}-{p}" for b, p in GROUPS])
def test_mixed_batch_matches_peft_per_row(base: Path, padded: int) -> None:
    """All cases of one base model in the pool's slots at once (several pools when there are more
    cases than slots), one batch with every case's rows and base rows, slots per row."""
    g = rng(f"test_mixed_batch_matches_peft_per_row[{base.name}-{padded}]")
    group = GROUPS[(base, padded)]
    max_loras = 6
    for start in range(0, len(group), max_loras):
        chunk = group[start : start + max_loras]
        with tovl.AdapterPool(base, "cpu", max_loras=max_loras, padded_vocab=padded) as pool:
            order = g.permutation(max_loras)[: len(chunk)]  # cases land in scattered slots
            ids, embed, hidden, logits_peft, slots, infos = [], [], [], [], [], []
            for (label, case), slot in zip(chunk, order):
                info = pool.load(int(slot), case / "adapter")
                assert info.slot == slot and info.format != "none", label
                e = expected(case)
                ids.append(e["ids"])
                embed.append(e["embed"])
                hidden.append(e["hidden"])
                logits_peft.append(e["logits_bf16"])
                slots.append(np.full(len(e["ids"]), slot, dtype=np.int32))
                infos.append((label, info, len(e["ids"])))
            m = pool.model
            base_ids = g.integers(m.info.vocab, size=5).astype(np.int32)
            all_ids = np.concatenate(ids + [base_ids])
            all_slots = np.concatenate(slots + [np.full(5, -1, dtype=np.int32)])
            perm = g.permutation(len(all_ids))
            all_ids, all_slots = all_ids[perm], all_slots[perm]
            gathered = np.stack([m.embed_row(int(i)) for i in all_ids])
            h = bf16(gathered.copy())
            pool.embed_(h, torch.from_numpy(all_ids), torch.from_numpy(all_slots))
            want_embed = np.concatenate(embed + [gathered[np.argsort(perm)][-5:]])[perm]
            assert np.array_equal(bits(h), want_embed)

            final = np.concatenate(hidden + [gathered[np.argsort(perm)][-5:]])[perm]
            base_logits = m.lmhead_product(final)
            logits = torch.from_numpy(base_logits.copy())
            pool.lmhead_(logits, bf16(final), torch.from_numpy(all_slots))
            got = torch.from_numpy(logits.numpy()).to(torch.bfloat16)
            inv = np.argsort(perm)
            row = 0
            for (label, info, n), peft in zip(infos, logits_peft):
                rows = inv[row : row + n]
                row += n
                cells = np.array(info.lmhead_ids, dtype=np.int64)
                mine = bits(got[rows][:, cells]) if cells.size else np.zeros((n, 0), np.uint16)
                dist = bf16_units(mine, peft[:, cells])
                assert dist.max(initial=0) <= 2, (label, dist.max())
                other = np.setdiff1d(np.arange(m.info.vocab), cells)
                assert np.array_equal(logits.numpy()[rows][:, other], base_logits[rows][:, other]), label
            base_rows = inv[row:]
            assert np.array_equal(logits.numpy()[base_rows], base_logits[base_rows])


def test_slots_report_unload_and_reload() -> None:
    label, case, base, padded = next(c for c in cases() if c[2] == TIED and c[3] == 0)
    with tovl.AdapterPool(base, "cpu", max_loras=3) as pool:
        assert pool.slots() == [None, None, None] and not pool.overlay_set.any_active
        info = pool.load(2, case / "adapter")
        assert pool.slots()[2] == info and pool.slots()[:2] == [None, None]
        assert info.dir == str(case / "adapter") and info.name == "adapter"
        assert info.embed_ids or info.lmhead_ids
        with tovl.Adapter(case / "adapter") as a:
            assert info.format == a.info.format
        e = expected(case)
        ids = torch.from_numpy(e["ids"])
        gathered = np.stack([pool.model.embed_row(int(i)) for i in e["ids"]])
        h = bf16(gathered.copy())
        pool.embed_(h, ids, 2)
        assert np.array_equal(bits(h), e["embed"])
        pool.unload(2)
        assert pool.slots() == [None, None, None] and not pool.overlay_set.any_active
        h = bf16(gathered.copy())
        pool.embed_(h, ids, 2)
        assert np.array_equal(bits(h), gathered)
        pool.unload(2)  # empty already: nothing
        pool.load(0, case / "adapter")
        h = bf16(gathered.copy())
        pool.embed_(h, ids, torch.zeros(len(ids), dtype=torch.int32))
        assert np.array_equal(bits(h), e["embed"])


def test_loads_rewrite_the_one_set_in_place_on_cpu() -> None:
    tied = [c for c in cases() if c[2] == TIED and c[3] == 0]
    with tovl.AdapterPool(TIED, "cpu", max_loras=2) as pool:
        s = pool.overlay_set
        assert s.fixed and pool.fixed and s.max_n_override == pool.capacity == tovl.pool.DEFAULT_CAPACITY
        assert s.lmhead_grid_y == 64  # the launch is shaped for 64 rows, whatever the capacity
        pool.load(0, tied[0][1] / "adapter")
        pool.load(0, tied[1][1] / "adapter")
        pool.unload(1)
        assert pool.overlay_set is s  # one set for the pool's life
        assert s.collect() == 0  # CPU work is done when the op returns: the replaced rows are gone
        assert pool.slots()[0].dir == str(tied[1][1] / "adapter")  # type: ignore[union-attr]


def test_failed_load_leaves_the_pool_as_it_was(tmp_path: Path) -> None:
    tied = [c for c in cases() if c[2] == TIED and c[3] == 0]
    untied = [c for c in cases() if c[2] == UNTIED and c[3] == 0]
    with tovl.AdapterPool(TIED, "cpu", max_loras=2) as pool:
        pool.load(1, tied[0][1] / "adapter")
        before, slots = pool.overlay_set, pool.slots()
        children = len(pool.backend._children)
        for bad in (tmp_path / "absent", untied[0][1] / "adapter" / "adapter_config.json"):
            with pytest.raises(tovl.TovlError):
                pool.load(0, bad)
        with pytest.raises(tovl.InvalidInputError, match="slot 2 is outside 0 .. 1"):
            pool.load(2, tied[0][1] / "adapter")
        with pytest.raises(tovl.InvalidInputError, match="slot -1"):
            pool.unload(-1)
        assert pool.overlay_set is before and not before.closed
        assert (pool.slots(), len(pool.backend._children)) == (slots, children)
    with pytest.raises(tovl.InvalidInputError, match="closed"):
        pool.overlay_set
    pool.close()


def test_pool_cycles_leak_nothing() -> None:
    tied = [c for c in cases() if c[2] == TIED and c[3] == 0][:3]

    def cycle(k: int) -> None:
        pool = tovl.AdapterPool(TIED, "cpu", max_loras=3)
        for s, (_, case, _, _) in enumerate(tied):
            pool.load(s, case / "adapter")
        pool.unload(1)
        pool.load(0, tied[2][1] / "adapter")
        h = torch.zeros(4, pool.model.info.hidden, dtype=torch.bfloat16)
        pool.embed_(h, torch.arange(4, dtype=torch.int32), 0)
        if k % 2:
            pool.close()  # else dropped: closed at GC

    assert_no_leak(cycle, warm=10, runs=100)


def test_pool_device_arguments() -> None:
    with pytest.raises(tovl.InvalidInputError, match="max_loras 0"):
        tovl.AdapterPool(TIED, "cpu", max_loras=0)
    with pytest.raises(tovl.FileFormatError):
        tovl.AdapterPool(TIED / "absent", "cpu")
    with tovl.AdapterPool(TIED, torch.device("cpu")) as pool:
        assert pool.device == torch.device("cpu") and pool.backend.name == "cpu"
        assert "0/8 slots" in repr(pool)


def test_the_readme_example_runs(monkeypatch: Any, capsys: Any) -> None:
    """The first Python example of README.md's "Python" section, run from the repository root."""
    from helpers_core import REPO

    text = (REPO / "README.md").read_text()
    section = text.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(REPO)
    exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "(3, 40, 130)"


# ---- other families: names given, module paths from the live model ----------------------
FAMILIES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "peft_families"


def test_model_reports_the_family_layout_and_takes_names():
    m = tovl.Model(FAMILIES / "bases" / "gpt_neox_untied")
    assert (m.info.embed_tensor, m.info.lmhead_tensor) == ("gpt_neox.embed_in.weight", "embed_out.weight")
    assert (m.info.embed_module, m.info.lmhead_module) == ("gpt_neox.embed_in", "lm_head")
    assert m.info.layout.startswith("GPT-NeoX")
    m.close()
    with pytest.raises(tovl.TovlError, match="'nope.weight'.*not there"):
        tovl.Model(FAMILIES / "bases" / "gpt_neox_untied", embed_tensor="nope.weight")
    src = tovl.Adapter(FAMILIES / "gpt_neox_untied_lora_tt" / "adapter").info.sources
    assert sorted(s.module_path or "" for s in src) == ["gpt_neox.embed_in", "lm_head"]


def test_attach_passes_the_live_module_paths(tmp_path):
    """A checkpoint whose tensor names are not the loaded model's: the pool opens it by the names
    given, refuses a PEFT adapter (it names the live model's modules) until attach() has told the
    pool's model those paths from get_input_embeddings()/get_output_embeddings()."""
    import tovl.hf
    from transformers import LlamaConfig, LlamaForCausalLM
    from safetensors.torch import save_file

    base = FAMILIES / "bases" / "granite_untied"   # Llama names and paths
    sd = load_file(base / "model.safetensors")
    renamed = tmp_path / "base"
    renamed.mkdir()
    (renamed / "config.json").write_text((base / "config.json").read_text())
    save_file({"enc.tok.weight": sd["model.embed_tokens.weight"], "dec.out.weight": sd["lm_head.weight"]},
              str(renamed / "model.safetensors"))
    adapter = FAMILIES / "granite_untied_lora_tt" / "adapter"
    with tovl.AdapterPool(renamed, "cpu", max_loras=2, embed_tensor="enc.tok.weight",
                          lmhead_tensor="dec.out.weight") as pool:
        assert pool.model.info.embed_module == "enc.tok"
        with pytest.raises(tovl.TovlError, match="sits on module 'model.embed_tokens'.*'enc.tok'"):
            pool.load(0, adapter)
        cfg = LlamaConfig(vocab_size=pool.model.info.vocab, hidden_size=pool.model.info.hidden,
                          intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=2, tie_word_embeddings=False)
        live = LlamaForCausalLM(cfg).to(torch.bfloat16)
        with tovl.hf.attach(live, pool) as handle:
            assert handle.module_paths == ("model.embed_tokens", "lm_head")
            assert (pool.model.info.embed_module, pool.model.info.lmhead_module) == ("model.embed_tokens", "lm_head")
            info = pool.load(0, adapter)
        assert info.embed_ids == (1, 5, 17, 100, 130) and info.lmhead_ids == (5, 44, 90)
