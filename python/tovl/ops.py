"""The two hooks as in-place PyTorch ops (namespace "tovl"), with fake implementations for torch.compile.

    torch.ops.tovl.embed_overlay_(hidden, token_ids, slots, active_slot, set_handle)
    torch.ops.tovl.lmhead_overlay_(logits, hidden, slots, active_slot, set_handle)

CPU tensors run on a set built on the CPU backend; CUDA tensors on a set built
on the CUDA backend of the tensors' device (the HIP backend under a ROCm build
of PyTorch, where "cuda" tensors are HIP memory), enqueued on torch's current
stream of that device, never synchronizing, so both can be captured in a
torch.cuda.graph. Every argument is checked before anything is launched: a
wrong dtype, device, shape or stride, or a set built for another device,
raises tovl.InvalidInputError naming the argument and writes nothing.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch

from .core import OverlaySet, set_for_handle
from .errors import invalid, shape

# CU_STREAM_LEGACY: torch's default stream (cuda_stream 0) is the legacy NULL
# stream, while tovl reads a NULL stream as the backend's own stream.
_CU_STREAM_LEGACY = 1

_lib = torch.library.Library("tovl", "DEF")  # type: ignore[no-untyped-call]
_SCHEMAS = {
    "embed_overlay_": "(Tensor(a!) hidden, Tensor token_ids, Tensor? slots, int active_slot, int set_handle) -> ()",
    "lmhead_overlay_": "(Tensor(a!) logits, Tensor hidden, Tensor? slots, int active_slot, int set_handle) -> ()",
}
for _name, _schema in _SCHEMAS.items():
    _lib.define(_name + _schema)  # type: ignore[no-untyped-call]


def backend_name_for(device: Union[torch.device, str]) -> str:
    """The tovl backend that runs on tensors of `device`: "cpu", or for "cuda" tensors "cuda"
    (or "hip" under a ROCm build of PyTorch, where torch.version.hip is set)."""
    device = torch.device(device)
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return "hip" if getattr(torch.version, "hip", None) else "cuda"
    raise invalid(f"tovl has no backend for {device.type!r} tensors (cpu or cuda)")


def _raw_stream_reader() -> Optional[Callable[[int], int]]:
    """torch's own reader of a device's current raw stream (CUstream, or hipStream_t under ROCm):
    one C call, where torch.cuda.current_stream(device) builds a Stream object per call."""
    return getattr(torch._C, "_cuda_getCurrentRawStream", None)


class _Launch:
    """What the ops need per call about a set, looked up once: the torch device its tensors live on
    (None: no torch device, e.g. a Vulkan set) and how to read that device's current stream."""

    __slots__ = ("device", "index", "legacy_null", "read_stream", "hidden", "min_width")

    def __init__(self, s: OverlaySet) -> None:
        be = s.backend
        self.hidden = s.hidden
        self.min_width = s.shard_width if s.sharded else s.vocab  # the logits columns the lm_head op needs
        self.device: Optional[torch.device] = None
        self.index = 0
        self.legacy_null = be.name == "cuda"
        self.read_stream = _raw_stream_reader()
        if be.name == "cpu":
            self.device = torch.device("cpu")
        elif be.name in ("cuda", "hip") and backend_name_for("cuda") == be.name:
            self.index = be.device_index or 0
            self.device = torch.device("cuda", self.index)

    def stream(self) -> Optional[int]:
        """The stream argument of the C hook: None on the CPU; else torch's current stream of the
        device, its default (legacy NULL) stream passed as CU_STREAM_LEGACY to the CUDA backend."""
        if self.device is None or self.device.type == "cpu":
            return None
        read = self.read_stream
        raw = read(self.index) if read is not None else torch.cuda.current_stream(self.device).cuda_stream
        if raw == 0 and self.legacy_null:
            return _CU_STREAM_LEGACY
        return raw


def _launch(s: OverlaySet) -> _Launch:
    """The set's _Launch, made on first use and kept on the set."""
    try:
        return s._launch  # type: ignore[attr-defined,no-any-return]
    except AttributeError:
        launch = _Launch(s)
        s._launch = launch  # type: ignore[attr-defined]
        return launch


def _bad_set(s: OverlaySet, device: torch.device, op: str) -> Exception:
    be = s.backend
    where = be.name if be.device_index is None else f"{be.name}:{be.device_index}"
    try:
        need = f"they need the {backend_name_for(device)} backend of that device"
    except Exception:
        need = "tovl has no backend for them"
    return invalid(f"{op}: set_handle is a set built on the {where} backend, but the tensors are on "
                   f"{device} ({need})")


def _check_vector(t: torch.Tensor, name: str, op: str, T: int, device: torch.device,
                  dtypes: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in dtypes:
        raise invalid(f"{op}: {name} has dtype {t.dtype}, expected {' or '.join(str(d) for d in dtypes)}")
    if t.device != device:
        raise invalid(f"{op}: {name} is on {t.device}, the patched tensor on {device}")
    if t.shape != (T,):
        raise shape(f"{op}: {name} has shape {list(t.shape)}, expected [{T}]")
    if not t.is_contiguous():
        raise shape(f"{op}: {name} has stride {t.stride(0)}, expected 1 (contiguous)")


def _check_hidden(t: torch.Tensor, op: str, s: OverlaySet, device: torch.device) -> int:
    if t.dtype != torch.bfloat16:
        raise invalid(f"{op}: hidden has dtype {t.dtype}, expected torch.bfloat16")
    if t.device != device:
        raise invalid(f"{op}: hidden is on {t.device}, the patched tensor on {device}")
    size = t.shape
    if len(size) != 2:
        raise shape(f"{op}: hidden has shape {list(size)}, expected [T, hidden]")
    T, h = size
    if h != s.hidden and s.hidden:
        raise shape(f"{op}: hidden has shape {list(size)}, the set's hidden size is {s.hidden}")
    st = t.stride()
    if T > 1 and st[0] != h or h > 1 and st[1] != 1:
        raise shape(f"{op}: hidden has strides {list(st)}, expected [{h}, 1] (contiguous rows)")
    return int(T)


_EMBED, _LMHEAD = "tovl.embed_overlay_", "tovl.lmhead_overlay_"
_IDS_DTYPES, _SLOTS_DTYPES = (torch.int32, torch.int64), (torch.int32,)


_BF16, _F32, _I32, _I64 = torch.bfloat16, torch.float32, torch.int32, torch.int64


def _rows_ok(L: _Launch, t: torch.Tensor, device: torch.device) -> int:
    """The row count of `t` if it is hidden rows the set can take ([T, hidden] bf16, contiguous, on
    `device`), else -1. The fast path of the checks below: a failure is then named by them."""
    if t.dtype is not _BF16 or t.dim() != 2 or not t.is_contiguous() or t.device != device:
        return -1
    T, h = t.shape
    return -1 if L.hidden and h != L.hidden else T


def _vector_ok(t: Optional[torch.Tensor], T: int, device: torch.device, ids: bool) -> bool:
    """Whether `t` is None (slots only) or a contiguous [T] vector on `device` of the right dtype."""
    if t is None:
        return not ids
    dt = t.dtype
    return ((dt is _I32 or ids and dt is _I64) and t.dim() == 1 and t.shape[0] == T and t.is_contiguous()
            and t.device == device)


def _check_embed(s: OverlaySet, hidden: torch.Tensor, token_ids: torch.Tensor,
                 slots: Optional[torch.Tensor]) -> int:
    L = _launch(s)
    device = L.device
    if device is not None:
        T = _rows_ok(L, hidden, device)
        if T >= 0 and _vector_ok(token_ids, T, device, True) and _vector_ok(slots, T, device, False):
            return T
    return _name_embed_fault(s, hidden, token_ids, slots)


def _name_embed_fault(s: OverlaySet, hidden: torch.Tensor, token_ids: torch.Tensor,
                      slots: Optional[torch.Tensor]) -> int:
    device = hidden.device
    if device != _launch(s).device:
        raise _bad_set(s, device, _EMBED)
    T = _check_hidden(hidden, _EMBED, s, device)
    _check_vector(token_ids, "token_ids", _EMBED, T, device, _IDS_DTYPES)
    if slots is not None:
        _check_vector(slots, "slots", _EMBED, T, device, _SLOTS_DTYPES)
    return T


def _check_lmhead(s: OverlaySet, logits: torch.Tensor, hidden: torch.Tensor,
                  slots: Optional[torch.Tensor]) -> int:
    L = _launch(s)
    device = L.device
    if device is not None:
        dt = logits.dtype
        if (dt is _BF16 or dt is _F32) and logits.dim() == 2 and logits.device == device:
            T, width = logits.shape
            st = logits.stride()
            if (width >= L.min_width and (width <= 1 or st[1] == 1) and (T <= 1 or st[0] >= width)
                    and _rows_ok(L, hidden, device) == T and _vector_ok(slots, T, device, False)):
                return T
    return _name_lmhead_fault(s, logits, hidden, slots)


def _name_lmhead_fault(s: OverlaySet, logits: torch.Tensor, hidden: torch.Tensor,
                       slots: Optional[torch.Tensor]) -> int:
    op = _LMHEAD
    device = logits.device
    if device != _launch(s).device:
        raise _bad_set(s, device, op)
    if logits.dtype not in _LOGITS_DTYPES:
        raise invalid(f"{op}: logits has dtype {logits.dtype}, expected torch.bfloat16 or torch.float32")
    size = logits.shape
    if len(size) != 2:
        raise shape(f"{op}: logits has shape {list(size)}, expected [T, vocab]")
    T, width = size
    if s.sharded and width < s.shard_width:
        start, end = s.shard_range
        raise shape(f"{op}: logits has {width} columns, fewer than the set's shard width {s.shard_width} "
                    f"(vocab shard [{start}, {end}))")
    if not s.sharded and width < s.vocab:
        raise shape(f"{op}: logits has {width} columns, fewer than the set's vocab {s.vocab}")
    st = logits.stride()
    if width > 1 and st[1] != 1 or T > 1 and st[0] < width:
        raise shape(f"{op}: logits has strides {list(st)}, expected [ld >= {width}, 1]")
    if _check_hidden(hidden, op, s, device) != T:
        raise shape(f"{op}: hidden has {hidden.shape[0]} rows, logits {T}")
    if slots is not None:
        _check_vector(slots, "slots", op, T, device, _SLOTS_DTYPES)
    return T


_LOGITS_DTYPES = {torch.bfloat16: "bf16", torch.float32: "f32"}


def _embed_run(s: OverlaySet, hidden: torch.Tensor, token_ids: torch.Tensor, slots: Optional[torch.Tensor],
               active_slot: int) -> None:
    T = _check_embed(s, hidden, token_ids, slots)
    if T == 0:
        return
    if token_ids.dtype == torch.int64:
        # The kernel reads u32 ids; clamping keeps an id beyond 2^31 from wrapping onto a real one.
        token_ids = token_ids.clamp(-1, 2**31 - 1).to(torch.int32)
    s.embed_hook(hidden.data_ptr(), token_ids.data_ptr(), T, hidden.shape[1],
                 0 if slots is None else slots.data_ptr(), active_slot, _launch(s).stream())


def _lmhead_run(s: OverlaySet, logits: torch.Tensor, hidden: torch.Tensor, slots: Optional[torch.Tensor],
                active_slot: int) -> None:
    T = _check_lmhead(s, logits, hidden, slots)
    if T == 0:
        return
    s.lmhead_hook(logits.data_ptr(), _LOGITS_DTYPES[logits.dtype], logits.stride(0) if T > 1 else logits.shape[1],
                  hidden.data_ptr(), T, hidden.shape[1], 0 if slots is None else slots.data_ptr(), active_slot,
                  _launch(s).stream())


def _embed_impl(hidden: torch.Tensor, token_ids: torch.Tensor, slots: Optional[torch.Tensor],
                active_slot: int, set_handle: int) -> None:
    _embed_run(set_for_handle(set_handle), hidden, token_ids, slots, active_slot)


def _lmhead_impl(logits: torch.Tensor, hidden: torch.Tensor, slots: Optional[torch.Tensor],
                 active_slot: int, set_handle: int) -> None:
    _lmhead_run(set_for_handle(set_handle), logits, hidden, slots, active_slot)


def _embed_fake(hidden: torch.Tensor, token_ids: torch.Tensor, slots: Optional[torch.Tensor],
                active_slot: int, set_handle: int) -> None:
    _check_embed(set_for_handle(set_handle), hidden, token_ids, slots)


def _lmhead_fake(logits: torch.Tensor, hidden: torch.Tensor, slots: Optional[torch.Tensor],
                 active_slot: int, set_handle: int) -> None:
    _check_lmhead(set_for_handle(set_handle), logits, hidden, slots)


for _key in ("CPU", "CUDA"):
    _lib.impl("embed_overlay_", _embed_impl, _key)  # type: ignore[no-untyped-call]
    _lib.impl("lmhead_overlay_", _lmhead_impl, _key)  # type: ignore[no-untyped-call]
torch.library.register_fake("tovl::embed_overlay_", _embed_fake, lib=_lib)
torch.library.register_fake("tovl::lmhead_overlay_", _lmhead_fake, lib=_lib)


def _eager(t: torch.Tensor) -> bool:
    """Whether the wrappers may call the implementation directly, as the dispatcher would: a plain
    tensor, outside torch.compile and any dispatch mode, with no autograd to record."""
    return (type(t) is torch.Tensor and not torch.compiler.is_compiling()
            and not torch._C._len_torch_dispatch_stack() and not (t.requires_grad and torch.is_grad_enabled()))


SlotsArg = Union[torch.Tensor, int]


def _split_slots(slots_or_active: SlotsArg, rows_shape: torch.Size) -> tuple[Optional[torch.Tensor], int]:
    """One active slot (an int, < 0 = base for every row), or per-row slots: int32 of the rows'
    shape, or of their first dimension (one slot per sequence, broadcast over its positions)."""
    if isinstance(slots_or_active, int):
        return None, slots_or_active
    slots = slots_or_active
    if slots.dim() == 1 and len(rows_shape) == 1:
        return slots, -1  # shape checked by the op
    if len(rows_shape) > 1 and slots.dim() == 1 and slots.shape[0] == rows_shape[0]:
        slots = slots.view(-1, *([1] * (len(rows_shape) - 1))).expand(rows_shape)
    if tuple(slots.shape) != tuple(rows_shape):
        raise shape(f"slots has shape {list(slots.shape)}, expected {list(rows_shape)} or [{rows_shape[0]}]")
    return slots.reshape(-1), -1


def _rows(t: torch.Tensor, name: str) -> torch.Tensor:
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError as e:
        raise shape(f"{name} of shape {list(t.shape)} and strides {list(t.stride())} cannot be seen as "
                    f"rows [T, {t.shape[-1]}] without a copy") from e


def embed_overlay_(hidden: torch.Tensor, token_ids: torch.Tensor, slots_or_active: SlotsArg,
                   overlay_set: OverlaySet) -> torch.Tensor:
    """Patch `hidden` ([..., hidden] bf16, the embedding gather of `token_ids` [...]) in place with
    each row's adapter rows; returns `hidden`. Call before any embedding scale."""
    slots, active = _split_slots(slots_or_active, token_ids.shape)
    rows = hidden if hidden.dim() == 2 else _rows(hidden, "hidden")
    ids = token_ids if token_ids.dim() == 1 else token_ids.reshape(-1)
    if _eager(hidden):
        _embed_run(overlay_set, rows, ids, slots, active)
    else:
        torch.ops.tovl.embed_overlay_(rows, ids, slots, active, overlay_set.handle)
    return hidden


def lmhead_overlay_(logits: torch.Tensor, hidden: torch.Tensor, slots_or_active: SlotsArg,
                    overlay_set: OverlaySet) -> torch.Tensor:
    """Patch `logits` ([..., >= vocab] bf16 or f32, the lm_head product of `hidden` [..., hidden])
    in place with each row's adapter cells; returns `logits`. Call before any logit softcap."""
    slots, active = _split_slots(slots_or_active, logits.shape[:-1])
    rows = logits if logits.dim() == 2 else _rows(logits, "logits")
    final = hidden if hidden.dim() == 2 else _rows(hidden, "hidden")
    if _eager(logits):
        _lmhead_run(overlay_set, rows, final, slots, active)
    else:
        torch.ops.tovl.lmhead_overlay_(rows, final, slots, active, overlay_set.handle)
    return logits
