"""End to end against PEFT: tovl attached to a Hugging Face model serves a batch that mixes
adapters and base rows, and each row gets what its own PEFT model computes alone.

Per row of the batch (tiny Llama models, random bf16 weights, tied and untied; adapters
made and saved by PEFT, loaded into a tovl.AdapterPool from disk):
- the input embeddings are bit-identical to the row's PEFT model's;
- the overridden logits cells are within 2 bf16 units of PEFT's lm_head on the same final
  hidden states, every other cell is bit-identical to the base projection;
- the final hidden states equal those of the PEFT model run on that request alone (on
  CPU, where the batched and the single-row products agree bit for bit; reported on CUDA);
- 16 greedy tokens equal that request generated alone by its PEFT model at every step
  where PEFT's top-2 logit margin is wider than 2 bf16 units of the top logit; a step
  where it is not is printed, and a divergence there ends that row's comparison.
Detaching restores the model: no hooks left, outputs bit-identical to a plain base model.
The same over the families whose tensor names and module paths are not Llama's (GPT-NeoX,
GPT-2, OPT, Falcon, BLOOM, Mamba, Qwen2-VL, LLaVA) or that scale (Granite, Cohere), and a
LLaVA batch with images.

TOVL_TEST_SEED replays a run; every test prints the seed it used.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

import peft_cases as pc

SEED = pc.seed_from_env()
PROMPT_LEN = 7
NEW_TOKENS = 16
TOL_UNITS = 2          # bf16 units (of the PEFT value) an overridden logits cell may differ by

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="no CUDA device (torch.cuda.is_available() is False)")),
]


# ---------------------------------------------------------------------------------------
# fixtures: adapters made once per module
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def one_thread_and_full_precision_reductions():
    """These matrices are tiny: with several threads, hand-offs dominate on a loaded machine
    (a [1, 1, 48] x [48, 64] bf16 linear took 30 ms with 2 threads, 7 us with one). On CUDA,
    bf16 GEMMs keep f32 reductions, so a batch and a single row are more likely to agree."""
    n = torch.get_num_threads()
    reduced = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    yield
    torch.set_num_threads(n)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("peft_e2e")


@pytest.fixture(scope="module")
def cases(workdir) -> dict[tuple[str, bool], pc.Case]:
    print(f"peft_e2e: seed {SEED} (TOVL_TEST_SEED replays it)")
    return {(k, t): pc.make_adapter(k, t, workdir, SEED) for t in (True, False) for k in pc.KINDS}


@dataclasses.dataclass
class Row:
    slot: int                  # -1: the base model
    case: pc.Case | None
    prompt: torch.Tensor       # int64 [PROMPT_LEN]


def make_prompt(case: pc.Case | None, g: torch.Generator) -> torch.Tensor:
    ids = torch.randint(0, pc.V, (PROMPT_LEN,), generator=g)
    special = case.prompt_ids if case is not None else pc.EMBED_IDS   # base rows see overlaid ids too
    pos = torch.randperm(PROMPT_LEN, generator=g)[:3]
    ids[pos] = torch.tensor(special)[torch.randint(0, len(special), (3,), generator=g)]
    return ids


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """One bf16 unit in the last place at the magnitude of x (f32 tensor)."""
    _, e = torch.frexp(x.float())
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), (e - 8).clamp(min=-133))


def open_pool(base_dir: Path, device: str, padded_vocab: int, slots: dict[int, pc.Case]):
    import tovl
    pool = tovl.AdapterPool(str(base_dir), torch.device(device), max_loras=8, padded_vocab=padded_vocab)
    try:
        for s, case in slots.items():
            pool.load(s, str(case.adapter_dir))
    except BaseException:
        pool.close()
        raise
    return pool


class Capture:
    """Forward hooks that keep a copy of a module's input and output."""

    def __init__(self, module: torch.nn.Module):
        self.inputs: list[torch.Tensor] = []
        self.outputs: list[torch.Tensor] = []
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        self.inputs.append(args[0].detach().clone())
        self.outputs.append(output.detach().clone())

    def remove(self):
        self.handle.remove()


def hook_counts(model) -> list[int]:
    return [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()]


# ---------------------------------------------------------------------------------------
# the checks
# ---------------------------------------------------------------------------------------
def run_batch(rows: list[Row], tied: bool, device: str, pool, padded_vocab: int, label: str,
              arch: str = "llama", batch_invariant: bool = True) -> list[str]:
    """Every check of the module docstring on one batch; returns the report lines.
    `batch_invariant` False: the base model itself computes a batch and a row alone
    differently on the CPU too (transformers' reference Mamba scan), so the hidden states
    are reported, not asserted, as on CUDA."""
    import tovl.hf

    dev = torch.device(device)
    served = pc.served_model(tied, SEED, padded_vocab, arch).to(dev)   # gets tovl attached
    plain = pc.served_model(tied, SEED, padded_vocab, arch).to(dev)    # the base model, never touched
    refs = {}
    for r in rows:
        if r.case is not None and r.slot not in refs:
            refs[r.slot] = pc.load_peft(r.case, SEED).to(dev)
    ref_of = lambda r: refs[r.slot] if r.case is not None else plain
    width = padded_vocab or pc.V
    _, base_W = pc.effective_rows(pc.served_model(tied, SEED, padded_vocab, arch), width)

    # The lm_head cells each slot overrides: the rows PEFT's lm_head really changes, and the
    # ids tovl's pool reports (the two agree when the overlay is right; a cell tovl overrides
    # that PEFT leaves alone must still match PEFT within the tolerance).
    overridden: dict[int, torch.Tensor] = {}
    for r in rows:
        if r.case is None or r.slot in overridden:
            continue
        _, W = pc.effective_rows(pc.load_peft(r.case, SEED), r.case.vocab)
        changed = set((W != base_W[: r.case.vocab]).any(dim=1).nonzero().flatten().tolist())
        info = pool.slots()[r.slot]
        changed |= set(int(i) for i in getattr(info, "lmhead_ids", ()))
        overridden[r.slot] = torch.tensor(sorted(changed), dtype=torch.long)

    ids = torch.stack([r.prompt for r in rows]).to(dev)
    report = [f"{label}: seed {SEED}, {len(rows)} rows, slots {[r.slot for r in rows]}, device {device}"]
    hooks_before = hook_counts(served)
    pre = Capture(served.get_output_embeddings())            # the base projection, before tovl
    handle = tovl.hf.attach(served, pool)
    post_embed = Capture(served.get_input_embeddings())      # after tovl's embed hook
    post = Capture(served.get_output_embeddings())           # after tovl's lm_head hook
    handle.set_slots([r.slot for r in rows])
    with torch.no_grad():
        final = served(ids).logits  # after whatever the model does to the lm_head's output (softcap)
    for c in (pre, post_embed, post):
        c.remove()
    hidden = pre.inputs[0]          # [B, S, h]: the final hidden states the lm_head saw
    base_logits = pre.outputs[0]    # [B, S, width]: the base projection
    logits = post.outputs[0]        # the same, patched by tovl

    for b, r in enumerate(rows):
        ref = ref_of(r)
        name = r.case.kind if r.case else "base"
        with torch.no_grad():
            ref_embed = ref.get_input_embeddings()(ids[b : b + 1])[0]
            ref_cap = Capture(ref.get_output_embeddings())
            ref_final = ref(ids[b : b + 1]).logits[0]
            ref_cap.remove()
            ref_same_hidden = ref.get_output_embeddings()(hidden[b : b + 1])[0]   # PEFT's lm_head, same rows
        # 1. embeddings, bit for bit
        assert torch.equal(post_embed.outputs[0][b], ref_embed), f"row {b} ({name}): embeddings differ from PEFT's"
        # 2. the final hidden states against the request run alone by its own model
        same_hidden = torch.equal(ref_cap.inputs[0][0], hidden[b])
        if device == "cpu" and batch_invariant:
            assert same_hidden, f"row {b} ({name}): final hidden states differ from the request run alone"
        # 3. logits: overridden cells within the tolerance, every other cell the base projection
        cells = overridden.get(r.slot, torch.empty(0, dtype=torch.long)).to(dev)
        other = torch.ones(width, dtype=torch.bool, device=dev)
        other[cells] = False
        assert torch.equal(logits[b][:, other], base_logits[b][:, other]), \
            f"row {b} ({name}): a logits cell tovl must leave alone was changed"
        worst = 0.0
        if cells.numel():
            got = logits[b][:, cells].float()
            want = ref_same_hidden[:, cells].float()
            units = ((got - want).abs() / bf16_ulp(want)).max().item()
            worst = units
            assert units <= TOL_UNITS, f"row {b} ({name}): overridden cells {units} bf16 units from PEFT's"
            assert not torch.equal(got, base_logits[b][:, cells].float()), \
                f"row {b} ({name}): the overridden cells were not patched"
        vw = ref_same_hidden.shape[-1]      # the PEFT model's vocab (the batch's may be padded wider)
        rest_peft = torch.equal(logits[b][:, :vw][:, other[:vw]], ref_same_hidden[:, other[:vw]])
        # 4. the model's own logits (after any softcap) against the request run alone by its PEFT model
        if same_hidden:
            got_rest, want_rest = final[b][:, :vw][:, other[:vw]], ref_final[:, other[:vw]]
            if device == "cpu":
                assert torch.equal(got_rest, want_rest), \
                    f"row {b} ({name}): the model's logits differ from PEFT's alone outside the overridden cells"
            else:
                # cuBLAS picks its GEMM by shape, so the base product of a batch and of one request
                # alone may round differently; tovl leaves those cells alone (checked in 3).
                units = ((got_rest.float() - want_rest.float()).abs() / bf16_ulp(want_rest.float())).max().item()
                assert units <= TOL_UNITS, \
                    f"row {b} ({name}): the model's logits are {units} bf16 units from PEFT's alone outside the overridden cells"
            if cells.numel():
                got, want = final[b][:, cells].float(), ref_final[:, cells].float()
                units = ((got - want).abs() / bf16_ulp(want)).max().item()
                assert units <= TOL_UNITS, f"row {b} ({name}): final overridden cells {units} bf16 units from PEFT's"
        report.append(f"  row {b} slot {r.slot:2d} {name:13s} embed exact; {cells.numel()} overridden ids, "
                      f"worst {worst:.2f} bf16 units; other cells == base"
                      f"{' == PEFT' if rest_peft else ' (differ from PEFT)'}; "
                      f"hidden == alone: {same_hidden}")

    # 5. greedy generation, the batch against each request alone
    gen_kw = dict(max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True, return_dict_in_generate=True,
                  pad_token_id=0)
    with torch.no_grad():
        batch_out = served.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **gen_kw)
    batch_tokens = batch_out.sequences[:, PROMPT_LEN:]
    for b, r in enumerate(rows):
        name = r.case.kind if r.case else "base"
        with torch.no_grad():
            alone = ref_of(r).generate(input_ids=ids[b : b + 1], attention_mask=torch.ones_like(ids[b : b + 1]),
                                       **gen_kw)
        want = alone.sequences[0, PROMPT_LEN:]
        narrow, verdict = [], "identical"
        for step in range(NEW_TOKENS):
            top2 = alone.logits[step][0].float().topk(2).values
            margin_ok = (top2[0] - top2[1]).item() > TOL_UNITS * bf16_ulp(top2[0]).item()
            if not margin_ok:
                narrow.append(step)
            if batch_tokens[b, step] != want[step]:
                assert not margin_ok, (f"row {b} ({name}): generated token {step} is {batch_tokens[b, step].item()}, "
                                       f"PEFT alone gives {want[step].item()} with a margin of "
                                       f"{(top2[0] - top2[1]).item():.4g}")
                verdict = f"diverged at step {step} (narrow margin), compared up to it"
                break
        hits = 0
        if r.case is not None:
            hits = sum(int(t) in set(overridden[r.slot].tolist()) for t in want.tolist())
        report.append(f"  row {b} slot {r.slot:2d} {name:13s} generation {verdict}; "
                      f"{hits}/{NEW_TOKENS} tokens are overridden ids; narrow-margin steps: {narrow or 'none'}")

    # 6. detach restores the model exactly
    handle.detach()
    assert hook_counts(served) == hooks_before, "hooks left on the model after detach()"
    with torch.no_grad():
        assert torch.equal(served(ids).logits, plain(ids).logits), "detached model differs from the base"
    report.append("  detach: no hooks left, logits bit-identical to the base model")
    print("\n".join(report))
    return report


# ---------------------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("kind", pc.KINDS)
def test_single_adapter(kind, tied, device, cases, workdir):
    """One adapter in slot 2 of the pool, its rows and base rows in one batch."""
    case = cases[(kind, tied)]
    padded = pc.PADDED_VOCAB if kind == "added_tokens" else 0
    g = torch.Generator().manual_seed(SEED + pc.KINDS.index(kind))
    rows = [Row(2, case, make_prompt(case, g)), Row(-1, None, make_prompt(None, g)),
            Row(2, case, make_prompt(case, g))]
    pool = open_pool(pc.save_base(tied, workdir, SEED), device, padded, {2: case})
    with pool:
        run_batch(rows, tied, device, pool, padded, f"{kind} {'tied' if tied else 'untied'}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_mixed_batch(tied, device, cases, workdir):
    """Every adapter kind in its own slot and base rows, interleaved, in one batch on a padded vocab."""
    slots = {s: cases[(k, tied)] for s, k in enumerate(pc.KINDS)}
    g = torch.Generator().manual_seed(SEED + 100)
    order = [0, -1, 1, 2, 5, -1, 3, 4, 5, 0]
    rows = [Row(s, slots.get(s), make_prompt(slots.get(s), g)) for s in order]
    pool = open_pool(pc.save_base(tied, workdir, SEED), device, pc.PADDED_VOCAB, slots)
    with pool:
        run_batch(rows, tied, device, pool, pc.PADDED_VOCAB, f"mixed {'tied' if tied else 'untied'}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_adapters_swapped_between_batches(tied, device, cases, workdir):
    """Two slots and every adapter kind: three batches, the slots loaded and unloaded in place
    between them (the pool's one fixed-shape set), each batch checked against PEFT."""
    g = torch.Generator().manual_seed(SEED + 200)
    base = pc.save_base(tied, workdir, SEED)
    pool = open_pool(base, device, pc.PADDED_VOCAB, {})
    handle = pool.overlay_set.handle
    with pool:
        rounds = [{0: "tt_list", 1: "mts_lm_head"}, {0: "added_tokens"}, {0: "tt_standalone", 1: "tt_dict"}]
        for n, wanted in enumerate(rounds):
            for s in range(2):
                if s in wanted:
                    pool.load(s, str(cases[(wanted[s], tied)].adapter_dir))
                else:
                    pool.unload(s)
            slots = {s: cases[(k, tied)] for s, k in wanted.items()}
            rows = [Row(s, slots.get(s), make_prompt(slots.get(s), g)) for s in (0, -1, 1, 0)]
            run_batch(rows, tied, device, pool, pc.PADDED_VOCAB, f"swap round {n} {'tied' if tied else 'untied'}")
        assert pool.overlay_set.handle == handle, "a load replaced the pool's set"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["tt_list", "tt_dict", "mts_embed"])
def test_gemma3_scale_and_softcap(kind, device, workdir):
    """Gemma 3 scales the gather inside its embedding module and softcaps the logits: the rows go
    in before the scale and the cells before the softcap, as PEFT puts them."""
    case = pc.make_adapter(kind, True, workdir, SEED, arch="gemma3")
    g = torch.Generator().manual_seed(SEED + 300 + len(kind))
    rows = [Row(1, case, make_prompt(case, g)), Row(-1, None, make_prompt(None, g)), Row(1, case, make_prompt(case, g))]
    with open_pool(pc.save_base(True, workdir, SEED, "gemma3"), device, 0, {1: case}) as pool:
        run_batch(rows, True, device, pool, 0, f"gemma3 {kind} tied", arch="gemma3")


@pytest.mark.parametrize("arch", list(pc.FAMILY_ARCHS))
def test_family_mixed_batch(arch, workdir):
    """Families with other checkpoint names and module paths (GPT-NeoX's embed_in, GPT-2's
    wte, OPT's decoder, Mamba's backbone, multimodal nesting) or their own scale factors
    (Granite, Cohere): three adapter kinds and base rows in one batch, each row against its
    own PEFT model alone."""
    tied = pc.FAMILY_ARCHS[arch][1]
    kinds = ("tt_list", "mts_embed", "tt_standalone") if tied else ("tt_dict", "mts_lm_head", "tt_standalone")
    slots = {s: pc.make_adapter(k, tied, workdir, SEED, arch=arch) for s, k in enumerate(kinds)}
    g = torch.Generator().manual_seed(SEED + 400)
    rows = [Row(s, slots.get(s), make_prompt(slots.get(s), g)) for s in (0, -1, 1, 2, 0)]
    pool = open_pool(pc.save_base(tied, workdir, SEED, arch=arch), "cpu", 0, slots)
    with pool:
        run_batch(rows, tied, "cpu", pool, 0, f"{arch} {'tied' if tied else 'untied'}", arch=arch,
                  batch_invariant=arch != "mamba")


def test_multimodal_batch_with_image_tokens(workdir):
    """A LLaVA batch with images: the overlays patch the text tokens' rows and the model puts the
    image features over the image tokens' rows afterwards, as with PEFT. Each row's logits against
    its own PEFT model run alone on the same ids and image."""
    import tovl.hf

    case = pc.make_adapter("tt_list", True, workdir, SEED, arch="llava")
    g = torch.Generator().manual_seed(SEED + 500)
    n_image = 4                                   # (8 / 4)^2 patches, the CLS feature dropped
    prompts = []
    for _ in range(3):
        ids = make_prompt(case, g)
        # LLaVA counts every placeholder id against the image features: the text keeps none.
        ids[ids == pc.LLAVA_IMAGE_TOKEN] = pc.LLAVA_IMAGE_TOKEN - 1
        prompts.append(torch.cat([torch.full((n_image,), pc.LLAVA_IMAGE_TOKEN), ids]))
    ids = torch.stack(prompts)
    pixels = torch.randn(3, 3, 8, 8, generator=g).to(torch.bfloat16)
    slots = [0, -1, 0]
    pool = open_pool(pc.save_base(True, workdir, SEED, arch="llava"), "cpu", 0, {0: case})
    served = pc.served_model(True, SEED, 0, "llava")
    plain = pc.served_model(True, SEED, 0, "llava")
    ref = pc.load_peft(case, SEED)
    _, base_W = pc.effective_rows(plain, pc.V)
    _, W = pc.effective_rows(ref, pc.V)
    cells = (W != base_W).any(dim=1)
    with pool, tovl.hf.attach(served, pool) as handle, torch.no_grad():
        handle.set_slots(slots)
        got = served(input_ids=ids, pixel_values=pixels).logits
    report = [f"llava with images: seed {SEED}, slots {slots}, {n_image} image tokens per row"]
    with torch.no_grad():
        for b, slot in enumerate(slots):
            alone = (ref if slot >= 0 else plain)(input_ids=ids[b : b + 1], pixel_values=pixels[b : b + 1]).logits[0]
            other = ~cells if slot >= 0 else torch.ones_like(cells)
            assert torch.equal(got[b][:, other], alone[:, other]), f"row {b}: logits differ from the row alone"
            units = 0.0
            if slot >= 0:
                want = alone[:, cells].float()
                units = ((got[b][:, cells].float() - want).abs() / bf16_ulp(want)).max().item()
                assert units <= TOL_UNITS, f"row {b}: overridden cells {units} bf16 units from PEFT's alone"
            report.append(f"  row {b} slot {slot:2d}: logits == alone outside {int(cells.sum()) if slot >= 0 else 0} "
                          f"overridden ids, those within {units:.2f} bf16 units")
    print("\n".join(report))


def test_slots_follow_rows_under_beam_expansion(cases, workdir):
    """generate(num_return_sequences=2) repeats each row in place; each copy keeps its row's slot."""
    import tovl.hf
    case = cases[("tt_dict", False)]
    g = torch.Generator().manual_seed(SEED + 200)
    ids = torch.stack([make_prompt(case, g), make_prompt(None, g)])
    served = pc.served_model(False, SEED)
    ref = pc.load_peft(case, SEED)
    with open_pool(pc.save_base(False, workdir, SEED), "cpu", 0, {1: case}) as pool, \
            tovl.hf.attach(served, pool) as handle:
        handle.set_slots(torch.tensor([1, -1], dtype=torch.int32))
        kw = dict(max_new_tokens=6, do_sample=False, num_beams=2, num_return_sequences=2, pad_token_id=0)
        with torch.no_grad():
            out = served.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
            want0 = ref.generate(input_ids=ids[:1], attention_mask=torch.ones_like(ids[:1]), **kw)
            want1 = pc.served_model(False, SEED).generate(input_ids=ids[1:], attention_mask=torch.ones_like(ids[1:]),
                                                          **kw)
    print(f"beam expansion: seed {SEED}")
    assert torch.equal(out[:2], want0) and torch.equal(out[2:], want1)


def test_one_slot_for_every_row_and_none(cases, workdir):
    """set_slots(int) takes the single-active-slot path of the ops; it must equal the per-row
    array with that slot everywhere; set_slots(None) and set_slots(-1) leave the base model alone."""
    import tovl.hf
    case = cases[("tt_dict", True)]
    g = torch.Generator().manual_seed(SEED + 400)
    ids = torch.stack([make_prompt(case, g) for _ in range(3)])
    served, plain = pc.served_model(True, SEED), pc.served_model(True, SEED)
    print(f"one slot for every row: seed {SEED}")
    with open_pool(pc.save_base(True, workdir, SEED), "cpu", 0, {3: case}) as pool, \
            tovl.hf.attach(served, pool) as handle, torch.no_grad():
        handle.set_slots([3, 3, 3])
        per_row = served(ids).logits
        for one in (3, np.int64(3)):
            handle.set_slots(one)
            assert torch.equal(served(ids).logits, per_row)
        assert not torch.equal(per_row, plain(ids).logits)
        for none in (None, -1):
            handle.set_slots(none)
            assert torch.equal(served(ids).logits, plain(ids).logits)


def test_attach_refuses_a_model_it_cannot_patch(cases, workdir):
    import tovl.hf
    with open_pool(pc.save_base(True, workdir, SEED), "cpu", 0, {}) as pool:
        with pytest.raises(ValueError, match="bf16"):
            tovl.hf.attach(pc.served_model(True, SEED).float(), pool)
        from transformers import LlamaConfig, LlamaForCausalLM
        narrow = LlamaForCausalLM(LlamaConfig(vocab_size=pc.V, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                              num_attention_heads=2, num_key_value_heads=2)).to(torch.bfloat16)
        with pytest.raises(ValueError, match="hidden size 272, the model's embedding 32"):
            tovl.hf.attach(narrow, pool)
    with open_pool(pc.save_base(True, workdir, SEED), "cpu", pc.PADDED_VOCAB, {}) as padded:
        with pytest.raises(ValueError, match=f"vocab of {pc.PADDED_VOCAB} .padded., the model's lm_head has {pc.V}"):
            tovl.hf.attach(pc.served_model(True, SEED), padded)
        tovl.hf.attach(pc.served_model(True, SEED, pc.PADDED_VOCAB), padded).detach()
        with tovl.hf.attach(pc.served_model(True, SEED), pool) as handle:
            with pytest.raises(ValueError, match="1-D"):
                handle.set_slots([[0, 1]])
            handle.set_slots([0, 1, -1])
            with pytest.raises(ValueError, match="batch has 2 rows but set_slots"):
                handle._row_slots(2, 5, torch.device("cpu"))
