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

import weakref
from typing import Callable, Optional, Union

import torch

from . import _lib as _clib
from .core import OverlaySet, set_for_handle
from .errors import check, invalid, shape

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
    (None: no torch device, e.g. a Vulkan set), how to read that device's current stream, and the
    set's hook arguments. A call is then the checks, the argument fields and one C call (the
    eager overhead: docs/PERFORMANCE.md, Python op overhead). It holds no reference to the set,
    only its address cell (0 once the set is freed) and a weak reference for error messages."""

    __slots__ = ("cell", "set_ref", "device", "index", "legacy_null", "read_stream", "hidden", "min_width",
                 "kernels", "embed_args", "embed_addr", "lmhead_args", "lmhead_addr")

    def __init__(self, s: OverlaySet) -> None:
        be = s.backend
        self.cell = s._cell
        self.set_ref = weakref.ref(s)
        self.hidden = s.hidden
        self.min_width = s.shard_width if s.sharded else s.vocab  # the logits columns the lm_head op needs
        self.device: Optional[torch.device] = None
        self.index = 0
        self.legacy_null = be.name == "cuda"
        self.read_stream: Optional[Callable[[int], int]] = None
        if be.name == "cpu":
            self.device = torch.device("cpu")
        elif be.name in ("cuda", "hip") and backend_name_for("cuda") == be.name:
            self.index = be.device_index or 0
            self.device = torch.device("cuda", self.index)
            self.read_stream = _raw_stream_reader() or _stream_object_reader
        self.kernels, self.embed_addr, self.lmhead_addr = s._hook_addrs
        self.embed_args, self.lmhead_args = s._embed_args, s._lmhead_args

    def stream(self) -> Optional[int]:
        """The stream argument of the C hook: None on the CPU; else torch's current stream of the
        device, its default (legacy NULL) stream passed as CU_STREAM_LEGACY to the CUDA backend."""
        read = self.read_stream
        if read is None:
            return None
        raw = read(self.index)
        return _CU_STREAM_LEGACY if raw == 0 and self.legacy_null else raw

    def overlay_set(self) -> OverlaySet:
        """The live set (for the detailed checks' messages); raises if it is closed."""
        s = self.set_ref()
        if s is None or s.closed:
            raise invalid("this overlay set is closed")
        return s

    def embed(self, hidden: torch.Tensor, token_ids: torch.Tensor, slots: Optional[torch.Tensor],
              active_slot: int) -> None:
        """Check the arguments (a fast pass; anything it refuses goes through _check_embed), then launch."""
        handle = self.cell.value
        device = self.device
        size = hidden.shape
        ok = False
        if handle and hidden.dtype is _BF16 and len(size) == 2 and hidden.is_contiguous() and hidden.device == device:
            T, h = size
            dt = token_ids.dtype
            ok = ((h == self.hidden or not self.hidden) and (dt is _I32 or dt is _I64) and token_ids.dim() == 1
                  and token_ids.numel() == T and token_ids.is_contiguous() and token_ids.device == device
                  and (slots is None or slots.dtype is _I32 and slots.dim() == 1 and slots.numel() == T
                       and slots.is_contiguous() and slots.device == device))
        if not ok:
            T = _check_embed(self.overlay_set(), hidden, token_ids, slots)
            h, dt = hidden.shape[1], token_ids.dtype
        if T == 0:
            return
        if dt is _I64:
            # The kernel reads u32 ids; clamping keeps an id beyond 2^31 from wrapping onto a real one.
            token_ids = token_ids.clamp(-1, 2**31 - 1).to(_I32)
        a = self.embed_args
        a.hidden, a.token_ids, a.slots, a.active_slot, a.T, a.hidden_size = (
            hidden.data_ptr(), token_ids.data_ptr(), 0 if slots is None else slots.data_ptr(), active_slot, T, h)
        status = _clib.embed_hook_at(handle, self.kernels, self.embed_addr, self.stream())
        if status:
            check(status)

    def lmhead(self, logits: torch.Tensor, hidden: torch.Tensor, slots: Optional[torch.Tensor],
               active_slot: int) -> None:
        """Check the arguments (a fast pass; anything it refuses goes through _check_lmhead), then launch."""
        handle = self.cell.value
        device = self.device
        dt = logits.dtype
        size = logits.shape
        ok = False
        if handle and (dt is _BF16 or dt is _F32) and len(size) == 2 and logits.device == device:
            T, width = size
            st = logits.stride()  # one call: stride(0) alone costs twice as much
            ld = st[0] if T > 1 else width
            hs = hidden.shape
            ok = (width >= self.min_width and (width <= 1 or st[1] == 1) and ld >= width
                  and hidden.dtype is _BF16 and len(hs) == 2 and hidden.is_contiguous() and hidden.device == device
                  and hs[0] == T and (hs[1] == self.hidden or not self.hidden)
                  and (slots is None or slots.dtype is _I32 and slots.dim() == 1 and slots.numel() == T
                       and slots.is_contiguous() and slots.device == device))
        if not ok:
            T = _check_lmhead(self.overlay_set(), logits, hidden, slots)
            width = logits.shape[1]
            ld = logits.stride(0) if T > 1 else width
            hs = hidden.shape
        if T == 0:
            return
        a = self.lmhead_args
        a.logits, a.logits_dtype, a.ld, a.hidden, a.slots, a.active_slot, a.T, a.hidden_size = (
            logits.data_ptr(), _LOGITS_BF16 if dt is _BF16 else _LOGITS_F32, ld, hidden.data_ptr(),
            0 if slots is None else slots.data_ptr(), active_slot, T, hs[1])
        status = _clib.lmhead_hook_at(handle, self.kernels, self.lmhead_addr, self.stream())
        if status:
            check(status)


def _stream_object_reader(index: int) -> int:
    """The current raw stream through torch.cuda.current_stream, where torch lacks the raw reader."""
    return int(torch.cuda.current_stream(torch.device("cuda", index)).cuda_stream)


# Launch data by set address, for the ops (which take the address): a stale entry (its cell 0,
# or another set's) is rebuilt from the live set.
_launches: dict[int, _Launch] = {}


def _forget(handle: int, launch: _Launch) -> None:
    if _launches.get(handle) is launch:
        del _launches[handle]


def _launch(s: OverlaySet) -> _Launch:
    """The set's _Launch, made on first use and kept on the set."""
    try:
        return s._launch  # type: ignore[attr-defined,no-any-return]
    except AttributeError:
        launch = _Launch(s)
        s._launch = launch  # type: ignore[attr-defined]
        h = s.handle
        _launches[h] = launch
        weakref.finalize(s, _forget, h, launch)
        return launch


def _launch_for_handle(set_handle: int) -> _Launch:
    launch = _launches.get(set_handle)
    if launch is None or launch.cell.value != set_handle:
        launch = _launch(set_for_handle(set_handle))
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
_LOGITS_DTYPES = (torch.bfloat16, torch.float32)
_BF16, _F32, _I32, _I64 = torch.bfloat16, torch.float32, torch.int32, torch.int64


def _check_embed(s: OverlaySet, hidden: torch.Tensor, token_ids: torch.Tensor,
                 slots: Optional[torch.Tensor]) -> int:
    """Every check of the embed op's arguments, in order: T, or the error naming the first bad one."""
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
    """Every check of the lm_head op's arguments, in order: T, or the error naming the first bad one."""
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


_LOGITS_BF16, _LOGITS_F32 = _clib.LOGITS_BF16, _clib.LOGITS_F32


def _embed_impl(hidden: torch.Tensor, token_ids: torch.Tensor, slots: Optional[torch.Tensor],
                active_slot: int, set_handle: int) -> None:
    _launch_for_handle(set_handle).embed(hidden, token_ids, slots, active_slot)


def _lmhead_impl(logits: torch.Tensor, hidden: torch.Tensor, slots: Optional[torch.Tensor],
                 active_slot: int, set_handle: int) -> None:
    _launch_for_handle(set_handle).lmhead(logits, hidden, slots, active_slot)


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
        _launch(overlay_set).embed(rows, ids, slots, active)
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
        _launch(overlay_set).lmhead(rows, final, slots, active)
    else:
        torch.ops.tovl.lmhead_overlay_(rows, final, slots, active, overlay_set.handle)
    return logits
