"""Hugging Face transformers: token overlays inside a causal LM's forward pass.

    pool = tovl.AdapterPool(base_dir, "cpu", max_loras=4)
    pool.load(0, "adapters/a"); pool.load(1, "adapters/b")
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.bfloat16)
    with tovl.hf.attach(model, pool) as handle:
        handle.set_slots([0, 1, -1])          # one slot per batch row; -1 = the base model
        out = model.generate(input_ids, max_new_tokens=16, do_sample=False)

attach() finds the two modules through model.get_input_embeddings() and
model.get_output_embeddings(), so it needs nothing architecture-specific, and puts a
forward hook on each (the spec's placement, docs/SPEC.md). Their module paths in the
loaded model (what PEFT writes in an adapter, e.g. model.language_model.embed_tokens of
a multimodal model) go to the pool's base model where they differ from the ones its
checkpoint implies, for the adapters loaded after attach(). On a multimodal model the
overlays apply to the text tokens' ids: rows the model then replaces by image features
stay replaced, as in PEFT.

- the input embedding: its output rows are patched right after the gather, before any
  embedding scale. Where the module is a plain gather (Llama, Qwen, Mistral, ...; also a
  model that scales in its own forward after the module) its output is patched in place.
  A module that scales inside its forward (transformers' Gemma classes,
  ...ScaledWordEmbedding, keep the factor in `embed_scale`) is gathered again unscaled,
  patched, then scaled the way the module and PEFT scale it:
  `rows * embed_scale.to(rows.dtype)`.
- the output embedding (lm_head): the overridden logits cells are recomputed right after
  the projection, before any logit softcap (softcapping happens after the module).

Slots are per batch row; each row keeps its slot over all its positions, in prefill and
in every decode step of generate (the slot of row b is broadcast over the S positions of
[B, S, ...]). When generate expands the batch (num_beams, num_return_sequences) it
repeats each row in place, and so do the slots.

The overlays are for inference: they run under torch.no_grad() and carry no gradient.
"""
from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, Optional, Union, cast

import torch
import torch.nn.functional as F

__all__ = ["attach", "Attachment"]

SlotsLike = Union[int, Sequence[int], torch.Tensor, None]


def _same_module(a: str, b: str) -> bool:
    """The import's rule (core/import): equal once the wrappers "model" and "language_model" are skipped."""
    def core(p: str) -> list[str]:
        parts = p.split(".")
        return [c for c in parts[:-1] if c not in ("model", "language_model")] + parts[-1:]
    return core(a) == core(b)


def _module_path(model: torch.nn.Module, module: torch.nn.Module) -> str | None:
    return next((name for name, m in model.named_modules() if m is module), None)


def _embed_scale(module: torch.nn.Module) -> torch.Tensor | None:
    """The scalar a scaled embedding module multiplies its gather by, else None (as PEFT reads it)."""
    scale = getattr(module, "embed_scale", None)
    if isinstance(scale, (int, float)):
        weight = cast(torch.Tensor, module.weight)
        return torch.tensor(scale, device=weight.device, dtype=weight.dtype)
    if isinstance(scale, torch.Tensor) and scale.numel() == 1:
        return scale
    return None


class Attachment:
    """A pool attached to one model; made by attach(). detach() (or leaving the `with`) removes it."""

    def __init__(self, model: torch.nn.Module, pool: Any) -> None:
        hf_model = cast(Any, model)  # a transformers PreTrainedModel: typed as a plain Module here
        embed: torch.nn.Module | None = hf_model.get_input_embeddings()
        lmhead: torch.nn.Module | None = hf_model.get_output_embeddings()
        if embed is None:
            raise ValueError("tovl.hf.attach: model.get_input_embeddings() is None: no embedding to patch")
        weight = getattr(embed, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise ValueError(f"tovl.hf.attach: the input embedding {type(embed).__name__} has no 2-D weight")
        if weight.dtype != torch.bfloat16:
            raise ValueError(f"tovl.hf.attach: the input embedding is {weight.dtype}; overlay rows are bf16: "
                             "load the model with dtype=torch.bfloat16")
        if lmhead is None:
            raise ValueError("tovl.hf.attach: model.get_output_embeddings() is None: no lm_head to patch")
        info = getattr(getattr(pool, "model", None), "info", None)   # a tovl.AdapterPool's base model
        if info is not None and info.hidden != weight.shape[1]:
            raise ValueError(f"tovl.hf.attach: the pool's base model has hidden size {info.hidden}, "
                             f"the model's embedding {weight.shape[1]}")
        rows = getattr(getattr(lmhead, "weight", None), "shape", (None,))[0]
        if info is not None and rows is not None and rows < info.vocab:
            raise ValueError(f"tovl.hf.attach: the pool serves a vocab of {info.vocab} (padded), the model's "
                             f"lm_head has {rows} rows: resize the model's embeddings to {info.vocab}, "
                             "the new rows zero")
        pool_device = getattr(pool, "device", None)
        if pool_device is not None and torch.device(pool_device).type != weight.device.type:
            raise ValueError(f"tovl.hf.attach: the pool serves {pool_device}, the model is on {weight.device}")
        #: the two modules' paths in the loaded model
        self.module_paths = (_module_path(model, embed), _module_path(model, lmhead))
        base = getattr(pool, "model", None)
        if info is not None and base is not None and hasattr(base, "set_modules"):
            wanted = [p if p is not None and not _same_module(p, have) else None
                      for p, have in zip(self.module_paths, (info.embed_module, info.lmhead_module))]
            if any(wanted):
                base.set_modules(*wanted)
        self.model = model
        self.pool = pool
        self.hidden_size = int(weight.shape[1])
        self._embed_module = embed
        self._lmhead_module = lmhead
        self._slots: int | torch.Tensor | None = None
        self._expanded: dict[tuple[int, int, torch.device], torch.Tensor] = {}
        self._handles = [
            embed.register_forward_hook(self._embed_hook, with_kwargs=True),
            lmhead.register_forward_hook(self._lmhead_hook, with_kwargs=True),
        ]

    # ---- slots -----------------------------------------------------------------------
    def set_slots(self, slots: SlotsLike) -> None:
        """One slot per batch row (a list or an int32/int64 tensor [B]; -1 = the base model),
        an int for every row, or None: every row uses the base model (nothing is patched)."""
        if slots is None or isinstance(slots, numbers.Integral) and not isinstance(slots, bool):
            self._slots = None if slots is None else int(slots)
        else:
            t = torch.as_tensor(slots)
            if t.dim() != 1 or t.numel() == 0:
                raise ValueError(f"tovl.hf: slots must be a 1-D list or tensor with one entry per batch row, "
                                 f"got shape {tuple(t.shape)}")
            if t.dtype.is_floating_point or t.dtype == torch.bool:
                raise ValueError(f"tovl.hf: slots must be integers, got {t.dtype}")
            self._slots = t.to("cpu", torch.int32)
        self._expanded.clear()

    @property
    def slots(self) -> int | torch.Tensor | None:
        return self._slots

    def _row_slots(self, batch: int, seq: int, device: torch.device) -> int | torch.Tensor:
        """The per-row slot array the op takes for a [batch, seq] call, on `device`."""
        slots = self._slots
        if isinstance(slots, int) or slots is None:
            return -1 if slots is None else slots
        # Under torch.compile the expansion is traced into the graph: a look-up in the cache would
        # make the compiled code guard on the cache's contents and compile again once it fills.
        compiling = torch.compiler.is_compiling()
        key = (batch, seq, device)
        cached = None if compiling else self._expanded.get(key)
        if cached is not None:
            return cached
        n = slots.numel()
        if batch % n != 0:
            raise ValueError(f"tovl.hf: the batch has {batch} rows but set_slots() gave {n} slots "
                             f"(a batch expanded by generate must be a multiple of it)")
        per_row = slots.repeat_interleave(batch // n)          # generate repeats each row in place
        flat = per_row.repeat_interleave(seq).to(device)       # every position of row b: slot of row b
        if not compiling:
            self._expanded[key] = flat
        return flat

    # ---- hooks -----------------------------------------------------------------------
    def _inactive(self) -> bool:
        """No row has an adapter: both hooks leave the module's output as it is."""
        return self._slots is None or (isinstance(self._slots, int) and self._slots < 0)

    def _embed_hook(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                    output: torch.Tensor) -> torch.Tensor | None:
        if self._inactive():
            return None
        ids = args[0] if args else kwargs["input"]
        if ids.dim() != 2 or output.dim() != 3:
            raise ValueError(f"tovl.hf: the input embedding was called with ids of shape {tuple(ids.shape)}; "
                             "attach() handles batched [B, S] calls")
        batch, seq = ids.shape
        scale = _embed_scale(module)      # read per call: .to(device) replaces the buffer
        with torch.no_grad():
            if scale is not None:         # the module scales inside: patch the unscaled gather
                rows = F.embedding(ids, cast(torch.Tensor, module.weight),
                                   cast(Optional[int], getattr(module, "padding_idx", None)))
            else:
                rows = output if output.is_contiguous() else output.contiguous()
            self.pool.embed_(rows.view(batch * seq, self.hidden_size), ids.reshape(-1),
                             self._row_slots(batch, seq, rows.device))
            if scale is not None:
                rows = rows * scale.to(rows.dtype)
        return rows

    def _lmhead_hook(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                     output: torch.Tensor) -> torch.Tensor | None:
        if self._inactive():
            return None
        hidden = args[0] if args else kwargs["input"]
        if hidden.dim() != 3 or output.dim() != 3:
            raise ValueError(f"tovl.hf: the lm_head was called with hidden states of shape "
                             f"{tuple(hidden.shape)}; attach() handles batched [B, S, h] calls")
        batch, seq, width = output.shape
        with torch.no_grad():
            logits = output if output.is_contiguous() else output.contiguous()
            rows = hidden.reshape(batch * seq, hidden.shape[-1]).contiguous()
            self.pool.lmhead_(logits.view(batch * seq, width), rows, self._row_slots(batch, seq, logits.device))
        return logits

    # ---- lifetime --------------------------------------------------------------------
    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def detach(self) -> None:
        """Remove both hooks: the model computes exactly what it did before attach()."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self._expanded.clear()

    def __enter__(self) -> "Attachment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def __repr__(self) -> str:
        state = "attached" if self.attached else "detached"
        return f"<tovl.hf.Attachment {type(self.model).__name__} {state} slots={self._slots!r}>"


def attach(model: torch.nn.Module, pool: Any) -> Attachment:
    """Attach `pool` (a tovl.AdapterPool on the model's device) to a causal LM.

    Returns the Attachment: set_slots() before each batch, detach() when done. The
    model must be bf16 (the embedding's dtype); its lm_head may give bf16 or f32 logits.
    """
    return Attachment(model, pool)
