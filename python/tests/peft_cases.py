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
# Families whose checkpoints and module paths are not Llama's, and those with their own
# scale factors (the embedding multiplier of Granite, the logit scales of Granite and
# Cohere), with the tying their released models use; the two multimodal ones nest the
# text model (model.language_model.*). Value: a LoRA target module (not a token overlay).
FAMILY_ARCHS = {"gpt_neox": ("query_key_value", False), "gpt2": ("c_attn", True), "opt": ("q_proj", True),
                "falcon": ("query_key_value", False), "bloom": ("query_key_value", True),
                "mamba": ("in_proj", True), "granite": ("q_proj", False), "cohere": ("q_proj", True),
                "qwen2_vl": ("q_proj", False), "llava": ("q_proj", True)}


def _family_model(arch: str, common: dict):
    import transformers as tf
    tied = common["tie_word_embeddings"]
    no_ids = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if arch == "gpt_neox":
        return tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(
            vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, tie_word_embeddings=tied, attn_implementation="eager", **no_ids))
    if arch == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=V, n_embd=H, n_layer=2, n_head=4, n_positions=64,
                                                tie_word_embeddings=tied, attn_implementation="eager", **no_ids))
    if arch == "opt":
        return tf.OPTForCausalLM(tf.OPTConfig(vocab_size=V, hidden_size=H, num_hidden_layers=2, ffn_dim=64,
                                              num_attention_heads=4, word_embed_proj_dim=H,
                                              max_position_embeddings=64, tie_word_embeddings=tied,
                                              attn_implementation="eager", **no_ids))
    if arch == "falcon":
        return tf.FalconForCausalLM(tf.FalconConfig(vocab_size=V, hidden_size=H, num_hidden_layers=2,
                                                    num_attention_heads=4, tie_word_embeddings=tied,
                                                    attn_implementation="eager", **no_ids))
    if arch == "bloom":
        return tf.BloomForCausalLM(tf.BloomConfig(vocab_size=V, hidden_size=H, n_layer=2, n_head=4,
                                                  tie_word_embeddings=tied, attn_implementation="eager", **no_ids))
    if arch == "mamba":
        return tf.MambaForCausalLM(tf.MambaConfig(vocab_size=V, hidden_size=H, state_size=4, num_hidden_layers=2,
                                                  expand=2, conv_kernel=4, tie_word_embeddings=tied, **no_ids))
    if arch == "granite":
        return tf.GraniteForCausalLM(tf.GraniteConfig(**common, embedding_multiplier=12.0, logits_scaling=8.0))
    if arch == "cohere":
        return tf.CohereForCausalLM(tf.CohereConfig(**common, logit_scale=0.0625))
    text = {k: v for k, v in common.items() if k != "attn_implementation"}
    if arch == "qwen2_vl":
        text["rope_scaling"] = {"type": "mrope", "mrope_section": [10, 12, 12]}
        cfg = tf.Qwen2VLConfig(text_config=text, vision_config=dict(depth=1, embed_dim=16, num_heads=2, hidden_size=H,
                                                                     mlp_ratio=2, patch_size=4, spatial_merge_size=1,
                                                                     temporal_patch_size=1),
                               image_token_id=V - 3, video_token_id=V - 4, vision_start_token_id=V - 5,
                               vision_end_token_id=V - 6, tie_word_embeddings=tied, attn_implementation="eager")
        return tf.Qwen2VLForConditionalGeneration(cfg)
    if arch == "llava":
        cfg = tf.LlavaConfig(vision_config=dict(model_type="clip_vision_model", hidden_size=16, intermediate_size=16,
                                                num_hidden_layers=1, num_attention_heads=2, image_size=8,
                                                patch_size=4),
                             text_config=dict(model_type="llama", **text), image_token_index=LLAVA_IMAGE_TOKEN,
                             projector_hidden_act="gelu", tie_word_embeddings=tied, attn_implementation="eager")
        return tf.LlavaForConditionalGeneration(cfg)
    raise ValueError(f"unknown architecture {arch!r}")


LLAVA_IMAGE_TOKEN = V - 3   # LLaVA's image placeholder id in the tiny vocabulary


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
    elif arch in FAMILY_ARCHS:
        model = _family_model(arch, common)
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


def module_names(model, arch: str) -> tuple[str, str, str]:
    """PEFT's names of the input embedding and the lm_head (the loaded model's, e.g. GPT-NeoX's
    embed_in and lm_head) and a LoRA target."""
    paths = {m: n for n, m in model.named_modules()}
    embed = paths[model.get_input_embeddings()].split(".")[-1]
    lm = paths[model.get_output_embeddings()].split(".")[-1]
    return embed, lm, FAMILY_ARCHS[arch][0] if arch in FAMILY_ARCHS else "q_proj"


def _peft_config(kind: str, tied: bool, names: tuple[str, str, str] = ("embed_tokens", "lm_head", "q_proj")):
    embed, lm, target = names
    if kind == "tt_list":
        return LoraConfig(r=2, target_modules=[target], trainable_token_indices=list(EMBED_IDS))
    if kind == "tt_dict":
        return LoraConfig(r=2, target_modules=[target],
                          trainable_token_indices={embed: list(EMBED_IDS), lm: list(LMHEAD_IDS)})
    if kind == "mts_embed":
        return LoraConfig(r=2, target_modules=[target], modules_to_save=[embed])
    if kind == "mts_lm_head":
        return LoraConfig(r=2, target_modules=[target], modules_to_save=[lm])
    if kind == "tt_standalone":
        return TrainableTokensConfig(target_modules=[embed], token_indices=list(EMBED_IDS))
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
        names = module_names(model, arch)
        pm = get_peft_model(model, _peft_config(kind, tied, names))
    g = torch.Generator().manual_seed(seed + 1000 + KINDS.index(kind))
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "trainable_tokens_delta" in name:   # replacement rows, f32 as PEFT keeps them
                p.copy_(torch.randn(p.shape, generator=g) * ROW_STD)
            elif "modules_to_save" in name and (f"{names[0]}." in name or f"{names[1]}." in name):
                rows = EMBED_IDS if f"{names[0]}." in name else LMHEAD_IDS
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
