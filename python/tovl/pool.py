"""AdapterPool: one base model, `max_loras` adapter slots and their overlay set on one torch device.

The pool serves through one fixed-shape set for its whole life (OverlaySet.with_shape): a load or
an unload rewrites the slot's table entries in place, ordered on the device's current stream (or
the `stream` given), and the replaced adapter's rows are freed once the stream has passed the swap.
The set's handle, tables and launches never change, so a CUDA graph captured once with the pool's
ops, or a model compiled with torch.compile, keeps serving whatever is loaded later.

Each slot holds at most `capacity` embedding rows and `capacity` lm_head cells (it costs no memory and
little time: the lm_head launch is shaped for at most 64 rows a slot): the default fits PEFT's trainable
tokens; an adapter with more rows (a `modules_to_save` of a large vocab) is refused with the number
it needs. Under tensor parallelism (`tp`) the set is the rank's fixed-shape shard set: every rank
loads the same slot at the same step, and every rank's captured graphs keep serving.
"""

from __future__ import annotations

import functools
import os
import weakref
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from .core import (VOCAB_PAD_DEFAULT, Adapter, AdapterRows, Backend, Model, Overlay, OverlaySet, PathLike,
                   vocab_shard_range)
from .errors import TovlError, invalid, shape
from .ops import SlotsArg, backend_name_for, embed_overlay_, lmhead_overlay_


#: A slot's default capacity: PEFT's trainable tokens are tens to a few hundred rows.
DEFAULT_CAPACITY = 256
_STATUS_CAPACITY = 105  # TOVL_ERR_CAPACITY
_CU_STREAM_LEGACY = 1   # torch's default stream, as the CUDA backend reads it


@dataclass(frozen=True)
class SlotInfo:
    """What one slot holds: the adapter folder, its overlay format and the token ids it overlays."""

    slot: int
    dir: str
    name: str
    format: str
    embed_ids: tuple[int, ...]
    lmhead_ids: tuple[int, ...]
    lmhead_rule: str
    warnings: tuple[str, ...]


class _State:
    """Everything the pool frees, kept apart from the pool so its finalizer can run at GC."""

    def __init__(self, backend: Backend, model: Model) -> None:
        self.backend = backend
        self.model = model
        #: waits for the device's work before the set goes (None on the CPU, where it is done)
        self.device_sync: Optional[Any] = None
        self.set: Optional[OverlaySet] = None

    def close(self) -> None:
        if self.set is not None and self.device_sync is not None:
            self.device_sync()  # the set's tables and overlays may still be read by enqueued work
        if self.set is not None:
            self.set.close()
            self.set = None
        self.model.close()
        self.backend.close()


def tp_from_distributed(group: Optional[Any] = None) -> tuple[int, int]:
    """(rank, world_size) of `group` (default: the world) from torch.distributed, for
    AdapterPool(..., tp=...); (0, 1) when torch.distributed is not initialized."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return int(dist.get_rank(group)), int(dist.get_world_size(group))


class AdapterPool:
    """Adapters in `max_loras` slots over the base model at `base_dir`, served on `device`.

    Slot values in a batch: 0 .. max_loras-1, or -1 (any value outside) for the base model.

    `tp=(rank, world_size)` (e.g. tp_from_distributed()) serves one rank of a tensor-parallel
    model with vLLM's vocab split (padded to a multiple of `tp_pad`): lmhead_ patches the rank's
    logits shard [T, >= shard width]; embed_ patches the whole rows after the all-reduce.

    `capacity`: the most embedding rows and lm_head cells one slot may hold (module docstring);
    `embed_tensor`, `lmhead_tensor`, `embed_module`, `lmhead_module`: as tovl.Model."""

    def __init__(self, base_dir: PathLike, device: Union[torch.device, str] = "cpu", max_loras: int = 8,
                 padded_vocab: int = 0, *, tp: Optional[tuple[int, int]] = None,
                 tp_pad: int = VOCAB_PAD_DEFAULT, capacity: int = DEFAULT_CAPACITY,
                 embed_tensor: Optional[str] = None, lmhead_tensor: Optional[str] = None,
                 embed_module: Optional[str] = None, lmhead_module: Optional[str] = None) -> None:
        if max_loras < 1:
            raise invalid(f"AdapterPool: max_loras {max_loras} must be >= 1")
        if tp is not None and (len(tp) != 2 or not 0 <= tp[0] < tp[1]):
            raise invalid(f"AdapterPool: tp {tp!r} must be (rank, world_size) with 0 <= rank < world_size")
        device = torch.device(device)
        name = backend_name_for(device)
        if name != "cpu" and device.index is None:
            device = torch.device(device.type, torch.cuda.current_device())
        self.device: torch.device = device
        self.max_loras = max_loras
        backend = Backend("cpu") if name == "cpu" else Backend.for_device(name, device.index or 0)
        try:
            model = Model(base_dir, padded_vocab, embed_tensor=embed_tensor, lmhead_tensor=lmhead_tensor,
                          embed_module=embed_module, lmhead_module=lmhead_module)
        except BaseException:
            backend.close()
            raise
        self.model = model
        #: (rank, world_size) served; (0, 1) without tensor parallelism
        self.tp: tuple[int, int] = (0, 1) if tp is None else (int(tp[0]), int(tp[1]))
        try:
            start, end = (0, model.info.vocab) if tp is None else vocab_shard_range(
                model.info.vocab, self.tp[1], self.tp[0], tp_pad)
        except BaseException:
            model.close()
            backend.close()
            raise
        #: the rank's range [start, end) of the padded vocab (its logits shard's columns)
        self.shard_range: tuple[int, int] = (start, end)
        # A range of padding only holds no cell: no shard set, lmhead_ does nothing.
        self._has_lmhead_shard = start < model.info.vocab
        self._state = _State(backend, model)
        if device.type == "cuda":
            self._state.device_sync = functools.partial(torch.cuda.synchronize, device)
        self._finalizer = weakref.finalize(self, self._state.close)
        self._slots: list[Optional[SlotInfo]] = [None] * max_loras
        if capacity < 1:
            self._finalizer()
            raise invalid(f"AdapterPool: capacity {capacity} must be >= 1")
        #: the most embedding rows and lm_head cells one slot holds (a fixed-shape set's capacity;
        #: under tensor parallelism an adapter's whole lm_head counts, so every rank takes it alike)
        self.capacity = capacity
        #: the pool serves one fixed-shape set for its whole life (a rank's shard set under `tp`)
        self.fixed = True
        # The rank's shard set under tensor parallelism (its embed op is the unsharded one); on a
        # padding-only rank, and without tp, the unsharded set.
        shard = self.shard_range if self.tp[1] > 1 and self._has_lmhead_shard else None
        try:
            self._state.set = OverlaySet.with_shape(backend, max_loras=max_loras, vocab=model.info.vocab,
                                                    hidden=model.info.hidden, tied=model.info.tied,
                                                    embed_capacity=capacity, lmhead_capacity=capacity,
                                                    vocab_range=shard)
        except BaseException:
            self._finalizer()
            raise

    # -- the set --------------------------------------------------------------
    def _raw_stream(self, stream: Optional[Any]) -> Optional[int]:
        """The C stream argument for a load: the given torch stream, else the device's current one
        (torch's default stream is the legacy NULL stream: CU_STREAM_LEGACY for the CUDA backend)."""
        if self.device.type != "cuda":
            return None
        raw = int((stream if stream is not None else torch.cuda.current_stream(self.device)).cuda_stream)
        if raw == 0:
            return _CU_STREAM_LEGACY if self.backend.name == "cuda" else None
        return raw

    def _swap(self, slot: int, overlay: Optional[Overlay], info: Optional[SlotInfo],
              stream: Optional[Any]) -> None:
        s = self.overlay_set
        if overlay is None:
            s.unload(slot, self._raw_stream(stream))
        else:
            s.load(slot, overlay, self._raw_stream(stream))
            overlay.close()  # the set holds its own reference
        self._slots[slot] = info

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.max_loras:
            raise invalid(f"slot {slot} is outside 0 .. {self.max_loras - 1}")

    @property
    def backend(self) -> Backend:
        return self._state.backend

    @property
    def overlay_set(self) -> OverlaySet:
        """The pool's one set, for its whole life (its `handle` is what torch.ops.tovl.* take as
        set_handle)."""
        s = self._state.set
        if s is None:
            raise invalid("this AdapterPool is closed")
        return s

    # -- slots ------------------------------------------------------------------
    def load(self, slot: int, adapter_dir: PathLike, *, stream: Optional[Any] = None) -> SlotInfo:
        """Load a PEFT or vLLM adapter folder into `slot` (replacing what was there).

        The load is ordered on `stream` (default: the device's current stream): work enqueued
        before it sees the slot's old adapter, work after it the new one; the old adapter is freed
        once the stream has passed the swap (reap)."""
        self._check_slot(slot)
        with Adapter(adapter_dir) as adapter, AdapterRows(self.backend, adapter, self.model) as rows:
            overlay = Overlay.from_resolved(self.backend, rows)
            path = os.fspath(adapter_dir)
            info = SlotInfo(slot, path, os.path.basename(os.path.normpath(path)), adapter.info.format,
                            tuple(int(i) for i in rows.embed_ids),
                            tuple(int(i) for i in rows.overlaid_lmhead_ids), rows.lmhead_rule,
                            tuple(rows.warnings))
        try:
            self._swap(slot, overlay, info, stream)
        except TovlError as e:
            overlay.close()
            if e.status == _STATUS_CAPACITY:
                rows = max(len(info.embed_ids), len(info.lmhead_ids))
                raise type(e)(e.status, f"{e.detail}; AdapterPool(..., capacity={rows}) or more serves it") from None
            raise
        except BaseException:
            overlay.close()
            raise
        return info

    def unload(self, slot: int, *, stream: Optional[Any] = None) -> None:
        """Empty `slot`: its rows fall back to the base model."""
        self._check_slot(slot)
        if self._slots[slot] is not None:
            self._swap(slot, None, None, stream)

    def slots(self) -> list[Optional[SlotInfo]]:
        """Each slot's adapter and overlaid ids; None for an empty slot."""
        return list(self._slots)

    def reap(self) -> None:
        """Free the replaced adapters whose work has finished; load, unload and close do it too."""
        s = self._state.set
        if s is not None:
            s.collect()

    # -- forward ----------------------------------------------------------------
    def embed_(self, hidden: torch.Tensor, token_ids: torch.Tensor, slots: SlotsArg) -> torch.Tensor:
        """Patch the embedding gather `hidden` of `token_ids` in place (tovl.embed_overlay_)."""
        return embed_overlay_(hidden, token_ids, slots, self.overlay_set)

    def lmhead_(self, logits: torch.Tensor, hidden: torch.Tensor, slots: SlotsArg) -> torch.Tensor:
        """Patch the lm_head product `logits` of `hidden` in place (tovl.lmhead_overlay_); under
        tensor parallelism `logits` is the rank's shard [..., >= shard width] of the padded vocab."""
        if not self._has_lmhead_shard:
            width = self.shard_range[1] - self.shard_range[0]
            if logits.dim() < 1 or logits.shape[-1] < width:
                raise shape(f"lmhead_: logits has shape {list(logits.shape)}, fewer columns than the "
                            f"rank's shard width {width}")
            return logits  # the rank's shard is padding only: no cell to patch
        return lmhead_overlay_(logits, hidden, slots, self.overlay_set)

    # -- lifetime ---------------------------------------------------------------
    def close(self) -> None:
        """Wait for the device's work, then free the set, its adapters, the model and the backend."""
        self._finalizer()

    def __enter__(self) -> "AdapterPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        used = sum(s is not None for s in self._slots)
        tp = f", tp rank {self.tp[0]} of {self.tp[1]} {self.shard_range}" if self.tp[1] > 1 else ""
        return f"tovl.AdapterPool({self.model.info.dir!r}, {self.device}, {used}/{self.max_loras} slots{tp})"
