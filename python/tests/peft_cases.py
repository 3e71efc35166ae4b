"""Tiny Llama-architecture base models and token-overlay adapters made with real PEFT.

Used by test_peft_e2e.py. Everything is built from a seed, so a failing case replays:
the base model of a given (tied, seed) is the same tensor for tensor every time it is
made, which lets each adapter's PEFT reference sit on its own fresh copy of the base
(get_peft_model wraps the model it is given in place).

The adapters are LoRA adapters whose LoRA matrices keep PEFT's initialisation
(lora_B = 0, so the LoRA path adds exact zeros): the engine applies LoRA, tovl only the
token overlays, and with a zero LoRA delta PEFT's output is exactly what the overlays
alone must reproduce.
"""
from __future__ import annotations

import dataclasses
import os
import random
import warnings
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, TrainableTokensConfig, get_peft_model
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

V = 131             # vocab_size (prime)
H = 272             # hidden_size: not a power of two, above the dot's 256 lanes (some lanes sum 2 products)
K_ADDED = 4         # tokens the "added_tokens" adapter adds: ids V .. V + K_ADDED - 1
PADDED_VOCAB = V + K_ADDED + 5   # the vocab the server allocates when an adapter adds tokens

EMBED_IDS = [3, 17, 60, 100, V - 1]        # trainable / edited embedding rows
LMHEAD_IDS = [5, 17, 44, 90]               # own lm_head rows (dict cases, modules_to_save lm_head)
ADDED_IDS = list(range(V, V + K_ADDED))    # the added tokens
ROW_STD = 0.08      # new rows: wider than the base's 0.02, so overlaid tokens win greedy steps

KINDS = ("tt_list", "tt_dict", "mts_embed", "mts_lm_head", "tt_standalone", "added_tokens")


ARCHS = ("llama", "gemma3")


def base_model(tied: bool, seed: int, vocab: int = V, arch: str = "llama"):
    """A 2-layer model with random bf16 weights; no bos/eos, so generation never stops early.

    "llama": Llama. "gemma3": Gemma 3, whose embedding module scales its gather by
    sqrt(hidden) inside its forward, and whose logits are softcapped after the lm_head:
    the spec's two placements (overlay rows before the scale, cells before the softcap)."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=H, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  tie_word_embeddings=tied, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                  # plain matmul + softmax attention: the same arithmetic for a batch and for one row
                  # on every device (fused attention kernels may choose their split by batch size)
                  attn_implementation="eager")
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "gemma3":
        cfg = Gemma3TextConfig(**common, head_dim=H // 4, sliding_window=4, final_logit_softcapping=2.0)
        model = Gemma3ForCausalLM(cfg)
    else:
        raise ValueError(f"unknown architecture {arch!r}")
    model = model.to(torch.bfloat16).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0, 0.02)
        if not tied:
            model.get_output_embeddings().weight.normal_(0, 0.02)
    return model


def resized(model, vocab: int, zero_tail: bool):
    """resize_token_embeddings(vocab); zero_tail: the new rows are zero, as a server pads its vocab."""
    old = model.get_input_embeddings().weight.shape[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.resize_token_embeddings(vocab, mean_resizing=False)
    if zero_tail:
        with torch.no_grad():
            model.get_input_embeddings().weight[old:] = 0
            model.get_output_embeddings().weight[old:] = 0
    return model.eval()


@dataclasses.dataclass
class Case:
    kind: str
    tied: bool
    arch: str
    adapter_dir: Path
    vocab: int                 # the vocab of the model PEFT runs it on
    prompt_ids: list[int]      # ids worth putting in this adapter's prompts (its overlaid rows)


def _peft_config(kind: str, tied: bool):
    if kind == "tt_list":
        return LoraConfig(r=2, target_modules=["q_proj"], trainable_token_indices=list(EMBED_IDS))
    if kind == "tt_dict":
        return LoraConfig(r=2, target_modules=["q_proj"],
                          trainable_token_indices={"embed_tokens": list(EMBED_IDS), "lm_head": list(LMHEAD_IDS)})
    if kind == "mts_embed":
        return LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["embed_tokens"])
    if kind == "mts_lm_head":
        return LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["lm_head"])
    if kind == "tt_standalone":
        return TrainableTokensConfig(target_modules=["embed_tokens"], token_indices=list(EMBED_IDS))
    if kind == "added_tokens":
        ids = [EMBED_IDS[0]] + ADDED_IDS
        if tied:   # the lm_head follows the embedding's token adapter
            return LoraConfig(r=2, target_modules=["q_proj"], trainable_token_indices=ids)
        return LoraConfig(r=2, target_modules=["q_proj"],
                          trainable_token_indices={"embed_tokens": ids, "lm_head": ADDED_IDS})
    raise ValueError(f"unknown adapter kind {kind!r}")


def make_adapter(kind: str, tied: bool, root: Path, seed: int, arch: str = "llama") -> Case:
    """Build the adapter with PEFT on a fresh base, give its token rows random values, save it."""
    vocab = V + K_ADDED if kind == "added_tokens" else V
    model = base_model(tied, seed, arch=arch)
    if kind == "added_tokens":
        torch.manual_seed(seed + 1)   # resize's own init of the new rows; trainable rows replace them
        resized(model, vocab, zero_tail=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = get_peft_model(model, _peft_config(kind, tied))
    g = torch.Generator().manual_seed(seed + 1000 + KINDS.index(kind))
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "trainable_tokens_delta" in name:   # replacement rows, f32 as PEFT keeps them
                p.copy_(torch.randn(p.shape, generator=g) * ROW_STD)
            elif "modules_to_save" in name and ("embed_tokens" in name or "lm_head" in name):
                rows = EMBED_IDS if "embed_tokens" in name else LMHEAD_IDS
                p[rows] = (torch.randn(len(rows), p.shape[1], generator=g) * ROW_STD).to(p.dtype)
    out = root / f"{arch}_{kind}_{'tied' if tied else 'untied'}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm.save_pretrained(out)
    (out / "README.md").unlink(missing_ok=True)
    prompt_ids = {"mts_lm_head": LMHEAD_IDS, "tt_dict": EMBED_IDS + LMHEAD_IDS,
                  "added_tokens": ADDED_IDS}.get(kind, EMBED_IDS)
    return Case(kind, tied, arch, out, vocab, list(prompt_ids))


def load_peft(case: Case, seed: int) -> PeftModel:
    """What PEFT serves: a fresh base (resized like the adapter's) with the adapter loaded from disk."""
    model = base_model(case.tied, seed, arch=case.arch)
    if case.vocab != V:
        torch.manual_seed(seed + 1)
        resized(model, case.vocab, zero_tail=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PeftModel.from_pretrained(model, str(case.adapter_dir)).eval()


def save_base(tied: bool, root: Path, seed: int, arch: str = "llama") -> Path:
    out = root / f"{arch}_base_{'tied' if tied else 'untied'}"
    if not (out / "config.json").exists():
        base_model(tied, seed, arch=arch).save_pretrained(out)
    return out


def served_model(tied: bool, seed: int, padded_vocab: int = 0, arch: str = "llama"):
    """The base model the server runs: vocab padded with zero rows when padded_vocab > V."""
    model = base_model(tied, seed, arch=arch)
    if padded_vocab > V:
        resized(model, padded_vocab, zero_tail=True)
    return model


def effective_rows(model, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The embedding and lm_head rows a model (PEFT or base) really uses, as bf16 [vocab, H]."""
    with torch.no_grad():
        emb = model.get_input_embeddings()(torch.arange(vocab))
        eye = torch.eye(H, dtype=torch.bfloat16)
        lm = model.get_output_embeddings()(eye).T.contiguous()
    return emb, lm[:vocab]


def seed_from_env() -> int:
    """TOVL_TEST_SEED when set (to replay a run), else a fresh random seed."""
    return int(os.environ.get("TOVL_TEST_SEED", random.SystemRandom().randrange(2**31)))
