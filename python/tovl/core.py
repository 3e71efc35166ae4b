"""The C API as Python objects: backends, models, adapters, overlays, sets, rowdiff, the hooks.

Every handle closes deterministically (close(), or `with`) and at garbage
collection (weakref.finalize). Objects built on a backend (overlays, sets,
device buffers' users) keep the backend alive; closing a backend first closes
what was built on it, as tovl_backend_close requires.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

from . import _lib
from ._lib import lib
from .errors import check, invalid

PathLike = Union[str, "os.PathLike[str]"]
_keys = itertools.count()


def version() -> str:
    """tovl_version(): the C library's version."""
    return _lib.text(lib.tovl_version())


# --------------------------------------------------------------------------
# Handles
# --------------------------------------------------------------------------
class _Cell:
    """The C object's address, 0 once freed: what `handle` reads (a plain attribute, so
    torch.compile guards on a number rather than tracing into weakref.finalize)."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value


def _free(close: Callable[[int], None], cell: _Cell) -> None:
    handle, cell.value = cell.value, 0
    close(handle)


def _free_child(close: Callable[[int], None], cell: _Cell, key: int, children: dict[int, Any]) -> None:
    children.pop(key, None)
    _free(close, cell)


def _free_backend(cell: _Cell, children: dict[int, Any]) -> None:
    for finalizer in list(children.values()):
        finalizer()
    _free(lib.tovl_backend_close, cell)


class _Handle:
    """One C object: its address (in a _Cell) and a finalizer that frees it exactly once."""

    _cell: _Cell
    _finalizer: "weakref.finalize[..., Any]"
    _what = "object"

    def _own(self, handle: int, close: Callable[[int], None], parent: Optional["Backend"] = None) -> None:
        self._cell = _Cell(handle)
        if parent is None:
            self._finalizer = weakref.finalize(self, _free, close, self._cell)
        else:
            key = next(_keys)
            self._finalizer = weakref.finalize(self, _free_child, close, self._cell, key, parent._children)
            parent._children[key] = self._finalizer

    @property
    def closed(self) -> bool:
        return self._cell.value == 0

    @property
    def handle(self) -> int:
        """The C object's address (what the torch ops take as `set_handle`)."""
        h = self._cell.value
        if not h:
            raise invalid(f"this {self._what} is closed")
        return h

    def close(self) -> None:
        """Free the C object now; later calls do nothing."""
        self._finalizer()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _out() -> ctypes.c_void_p:
    return ctypes.c_void_p()


def _path(p: PathLike) -> bytes:
    return os.fsencode(os.fspath(p))


# --------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class BackendInfo:
    """One entry of tovl_backend_list: `reason` says why an unavailable backend does not open."""

    name: str
    compiled: bool
    available: bool
    reason: str
    device: str


def backends() -> list[BackendInfo]:
    """Every backend tovl knows, in "auto" preference order, each probed by opening it."""
    n = lib.tovl_backend_list(None, 0)
    arr = (_lib.BackendInfoC * n)()
    n = min(n, lib.tovl_backend_list(arr, n))
    return [
        BackendInfo(_lib.text(e.name), bool(e.compiled), bool(e.available), _lib.text(e.reason),
                    _lib.text(e.device))
        for e in arr[:n]
    ]


_env_lock = threading.Lock()


class Backend(_Handle):
    """An open backend: "auto", "cpu", "cuda", "hip" or "vulkan" (tovl_backend_open)."""

    _what = "backend"

    def __init__(self, name: str = "auto", *, _handle: Optional[int] = None, _device_index: Optional[int] = None):
        self._children: dict[int, Any] = {}
        if _handle is None:
            out = _out()
            check(lib.tovl_backend_open(name.encode(), ctypes.byref(out)))
            _handle = int(out.value or 0)
        self._cell = _Cell(_handle)
        self._finalizer = weakref.finalize(self, _free_backend, self._cell, self._children)
        self.name: str = _lib.text(lib.tovl_backend_name(_handle))
        self.device: str = _lib.text(lib.tovl_backend_device(_handle))
        if _device_index is None and self.name in ("cuda", "hip"):
            env = os.environ.get(f"TOVL_{self.name.upper()}_DEVICE", "")
            _device_index = int(env) if env.strip() else 0
        #: the GPU ordinal (CUDA/HIP) this backend runs on; None for cpu and vulkan
        self.device_index: Optional[int] = _device_index
        self._kernels = lib.tovl_overlay_kernels_resolve(_handle)
        self._kernels_p = ctypes.pointer(self._kernels)

    @classmethod
    def for_device(cls, name: str, index: int) -> "Backend":
        """The `name` ("cuda" or "hip") backend on GPU ordinal `index` (torch's device index)."""
        if index < 0:
            raise invalid(f"device index {index} is negative")
        if name == "hip" and _lib.has("tovl_hip_backend_open_device"):
            out = _out()
            check(lib.tovl_hip_backend_open_device(index, ctypes.byref(out)))
            return cls(_handle=int(out.value or 0), _device_index=index)
        if name not in ("cuda", "hip"):
            raise invalid(f"Backend.for_device: backend {name!r} has no device index (cuda or hip)")
        # tovl_backend_open reads the ordinal from TOVL_<NAME>_DEVICE.
        var = f"TOVL_{name.upper()}_DEVICE"
        with _env_lock:
            old = os.environ.get(var)
            os.environ[var] = str(index)
            try:
                return cls(name, _device_index=index)
            finally:
                if old is None:
                    del os.environ[var]
                else:
                    os.environ[var] = old

    def __repr__(self) -> str:
        return f"tovl.Backend({self.name!r}, device={self.device!r})"

    def get_property(self, key: str) -> Optional[str]:
        """tovl_backend_property: e.g. "subgroup_size", "f32_denormals", "driver"; None when unknown."""
        return _lib.opt_text(lib.tovl_backend_property(self.handle, key.encode()))

    def has_kernel(self, name: str) -> bool:
        """Whether tovl_try_kernel finds `name` ("rowdiff", "embed_overlay", "lmhead_overlay_bf16", ...)."""
        return bool(lib.tovl_try_kernel(self.handle, name.encode()) != 0)

    @property
    def kernels(self) -> dict[str, int]:
        """The four resolved overlay kernel handles (0 = missing)."""
        return {f[0]: int(getattr(self._kernels, f[0])) for f in _lib.OverlayKernelsC._fields_}

    # Device memory (synchronous; not for the forward path).
    def alloc(self, nbytes: int) -> int:
        out = _lib.devptr()
        check(lib.tovl_alloc(self.handle, nbytes, ctypes.byref(out)))
        return int(out.value)

    def free(self, ptr: int) -> None:
        lib.tovl_free(self.handle, ptr)

    def upload(self, dst: int, src: np.ndarray) -> None:
        src = np.ascontiguousarray(src)
        check(lib.tovl_upload(self.handle, dst, src.ctypes.data, src.nbytes))

    def download(self, out: np.ndarray, src: int) -> np.ndarray:
        if not out.flags.c_contiguous:
            raise invalid("download: `out` must be C-contiguous")
        check(lib.tovl_download(self.handle, out.ctypes.data, src, out.nbytes))
        return out

    def fill_u32(self, dst: int, pattern: int, nbytes: int) -> None:
        check(lib.tovl_fill_u32(self.handle, dst, pattern, nbytes))

    def synchronize(self, stream: Optional[int] = None) -> None:
        check(lib.tovl_synchronize(self.handle, stream))


# --------------------------------------------------------------------------
# safetensors files
# --------------------------------------------------------------------------
# File dtypes as numpy dtypes; bf16 reads as its uint16 bit patterns.
_NP_DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8,
              "U8": np.uint8, "I16": np.int16, "U16": np.uint16, "I32": np.int32, "U32": np.uint32,
              "I64": np.int64, "U64": np.uint64, "BOOL": np.bool_}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]


class SafetensorsFile(_Handle):
    """A safetensors file, mapped read-only with its whole header validated (tovl_safetensors_open);
    or `data`, bytes in memory (tovl_safetensors_open_memory, `path` then names it in messages)."""

    _what = "safetensors file"

    def __init__(self, path: PathLike, data: Optional[bytes] = None) -> None:
        out = _out()
        if data is None:
            check(lib.tovl_safetensors_open(_path(path), ctypes.byref(out)))
        else:
            self._data = bytes(data)  # must outlive the object: not copied by the C side
            check(lib.tovl_safetensors_open_memory(self._data, len(self._data), _path(path), ctypes.byref(out)))
        self._own(int(out.value or 0), lib.tovl_safetensors_close)
        self.path = _lib.text(lib.tovl_safetensors_path(self._cell.value))

    def _tensor(self, name: str) -> "_lib.TensorC":
        p = lib.tovl_safetensors_find(self.handle, name.encode())
        if not p:
            raise invalid(f"{self.path}: no tensor {name!r}")
        t: _lib.TensorC = p.contents
        return t

    @property
    def tensors(self) -> list[TensorInfo]:
        """Every tensor, in the order of their data offsets."""
        out = []
        for k in range(lib.tovl_safetensors_count(self.handle)):
            t = lib.tovl_safetensors_at(self.handle, k).contents
            out.append(TensorInfo(_lib.text(t.name), _lib.text(t.dtype), tuple(t.shape[: t.ndim])))
        return out

    def array(self, name: str) -> np.ndarray:
        """A copy of tensor `name` as a numpy array (bf16 as uint16 bit patterns)."""
        t = self._tensor(name)
        dtype = _NP_DTYPES.get(_lib.text(t.dtype))
        if dtype is None:
            raise invalid(f"{self.path}: tensor {name!r} has dtype {_lib.text(t.dtype)}, which numpy lacks")
        raw = ctypes.string_at(t.data, t.count * t.elem_size) if t.count else b""
        return np.frombuffer(raw, dtype=dtype).reshape(tuple(t.shape[: t.ndim])).copy()


def write_safetensors(path: PathLike, tensors: dict[str, tuple[str, np.ndarray]],
                      metadata: Optional[dict[str, str]] = None) -> None:
    """tovl_safetensors_write: {name: (file dtype, array)} (e.g. ("BF16", uint16 bits)), atomically."""
    keep: list[Any] = []
    arr = (_lib.TensorC * max(len(tensors), 1))()
    for k, (name, (dtype, data)) in enumerate(tensors.items()):
        a = np.require(data, requirements="C")  # keeps a 0-d array 0-d, unlike ascontiguousarray
        shape = (ctypes.c_uint64 * max(a.ndim, 1))(*a.shape)
        keep += [a, shape]
        arr[k].name, arr[k].dtype, arr[k].ndim = name.encode(), dtype.encode(), a.ndim
        arr[k].shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_uint64))
        arr[k].data = a.ctypes.data
    items = [x.encode() for kv in (metadata or {}).items() for x in kv]
    meta = (ctypes.c_char_p * max(len(items), 1))(*items)
    check(lib.tovl_safetensors_write(_path(path), arr, len(tensors), meta if items else None, len(items) // 2))


# --------------------------------------------------------------------------
# Base models and adapters (import)
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelInfo:
    dir: str
    vocab: int
    config_vocab: int
    hidden: int
    tied: bool
    tied_inferred: bool
    embed_file: str
    embed_dtype: str
    lmhead_file: Optional[str]
    lmhead_dtype: Optional[str]
    embed_tensor: str            # "model.embed_tokens.weight", "gpt_neox.embed_in.weight", ...
    lmhead_tensor: Optional[str]  # None when tied
    embed_module: str            # the module paths an adapter's tensors must sit on
    lmhead_module: str
    layout: str                  # the rule that found the tensors


class Model(_Handle):
    """A base model folder (tovl_model_open_named); `padded_vocab` 0 serves config vocab_size rows.

    The embedding and lm_head are found by the family's tensor names; `embed_tensor` and
    `lmhead_tensor` name them where that fails (an lm_head equal to the embedding: tied);
    `embed_module` and `lmhead_module` are the loaded model's module paths (as a PEFT adapter
    names them) where they differ from the tensors'."""

    _what = "model"

    def __init__(self, dir: PathLike, padded_vocab: int = 0, *, embed_tensor: Optional[str] = None,
                 lmhead_tensor: Optional[str] = None, embed_module: Optional[str] = None,
                 lmhead_module: Optional[str] = None) -> None:
        out = _out()
        names = _lib.ModelNamesC(*(v.encode() if v is not None else None
                                   for v in (embed_tensor, lmhead_tensor, embed_module, lmhead_module)))
        check(lib.tovl_model_open_named(_path(dir), padded_vocab, ctypes.byref(names), ctypes.byref(out)))
        self._own(int(out.value or 0), lib.tovl_model_close)
        self._read_info()

    def _read_info(self) -> None:
        i = lib.tovl_model_get_info(self.handle).contents
        self.info = ModelInfo(_lib.text(i.dir), i.vocab, i.config_vocab, i.hidden, bool(i.tied),
                              bool(i.tied_inferred), _lib.text(i.embed_file), _lib.text(i.embed_dtype),
                              _lib.opt_text(i.lmhead_file), _lib.opt_text(i.lmhead_dtype),
                              _lib.text(i.embed_tensor), _lib.opt_text(i.lmhead_tensor),
                              _lib.text(i.embed_module), _lib.text(i.lmhead_module), _lib.text(i.layout))

    def set_modules(self, embed_module: Optional[str] = None, lmhead_module: Optional[str] = None) -> None:
        """The loaded model's module paths, for adapters resolved from now on (None keeps one)."""
        check(lib.tovl_model_set_modules(self.handle, embed_module.encode() if embed_module else None,
                                         lmhead_module.encode() if lmhead_module else None))
        self._read_info()

    def _row(self, fn: Any, token_id: int) -> np.ndarray:
        if not 0 <= token_id < self.info.vocab:
            raise invalid(f"token id {token_id} is outside the model's vocab {self.info.vocab}")
        p = fn(self.handle, token_id)
        return np.ctypeslib.as_array(p, (self.info.hidden,)).copy()

    def embed_row(self, token_id: int) -> np.ndarray:
        """The base embedding row, bf16 bit patterns (uint16 [hidden])."""
        return self._row(lib.tovl_model_embed_row, token_id)

    def lmhead_row(self, token_id: int) -> np.ndarray:
        """The base lm_head row, bf16 bit patterns (uint16 [hidden])."""
        return self._row(lib.tovl_model_lmhead_row, token_id)

    def lmhead_product(self, hidden: np.ndarray) -> np.ndarray:
        """Base logits f32 [T, vocab] of bf16 hidden rows (uint16 [T, hidden]), in the spec's dot order."""
        h = np.ascontiguousarray(hidden, dtype=np.uint16)
        if h.ndim != 2 or h.shape[1] != self.info.hidden:
            raise invalid(f"lmhead_product: hidden has shape {h.shape}, expected [T, {self.info.hidden}]")
        logits = np.empty((h.shape[0], self.info.vocab), dtype=np.float32)
        check(lib.tovl_model_lmhead_product(
            self.handle, h.ctypes.data_as(ctypes.POINTER(ctypes.c_uint16)), h.shape[0],
            logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float))))
        return logits


SOURCE_KINDS = ("trainable_tokens", "modules_to_save", "saved_base", "vllm_extra_vocab")
MODULES = ("embed", "lmhead")


@dataclass(frozen=True)
class AdapterSource:
    kind: str            # one of SOURCE_KINDS
    module: str          # "embed" or "lmhead"
    file: str
    tensor: str
    dtype: str
    rows: int
    width: int
    ids: Optional[tuple[int, ...]]  # trainable tokens: the config's ids; else None
    config_field: Optional[str]
    module_path: Optional[str]      # the module it sits on ("gpt_neox.embed_in"); None for vLLM rows


@dataclass(frozen=True)
class AdapterInfo:
    dir: str
    format: str
    ensure_weight_tying: bool
    sources: list[AdapterSource]
    other_tensors: int


class Adapter(_Handle):
    """A PEFT or vLLM adapter folder, parsed and validated (tovl_adapter_open)."""

    _what = "adapter"

    def __init__(self, dir: PathLike) -> None:
        out = _out()
        check(lib.tovl_adapter_open(_path(dir), ctypes.byref(out)))
        self._own(int(out.value or 0), lib.tovl_adapter_close)
        i = lib.tovl_adapter_get_info(self.handle).contents
        sources = []
        for s in i.sources[: i.source_count]:
            ids = tuple(s.ids[: s.rows]) if s.ids else None
            sources.append(AdapterSource(SOURCE_KINDS[s.kind], MODULES[s.module], _lib.text(s.file),
                                         _lib.text(s.tensor), _lib.text(s.dtype), s.rows, s.width, ids,
                                         _lib.opt_text(s.config_field), _lib.opt_text(s.module_path)))
        self.info = AdapterInfo(_lib.text(i.dir), _lib.text(i.format), bool(i.ensure_weight_tying), sources,
                                i.other_tensors)


def _ids(rows: _lib.OverlayRowsC) -> np.ndarray:
    if rows.count == 0:
        return np.zeros(0, dtype=np.uint32)
    return np.ctypeslib.as_array(rows.ids, (rows.count,)).copy()


def _rows(rows: _lib.OverlayRowsC) -> np.ndarray:
    if rows.count == 0:
        return np.zeros((0, rows.width), dtype=np.uint16)
    return np.ctypeslib.as_array(rows.rows, (rows.count, rows.width)).copy()


class AdapterRows(_Handle):
    """An adapter resolved against a base model (tovl_adapter_resolve): the host rows of its overlay."""

    _what = "adapter rows"

    def __init__(self, backend: Backend, adapter: Adapter, model: Model) -> None:
        out = _out()
        check(lib.tovl_adapter_resolve(backend.handle, backend._kernels_p, adapter.handle, model.handle,
                                       ctypes.byref(out)))
        self._own(int(out.value or 0), lib.tovl_adapter_rows_free)
        self._refs = (adapter, model)
        i = lib.tovl_adapter_rows_get_info(self.handle).contents
        d = i.desc
        self.vocab: int = d.vocab
        self.hidden: int = d.hidden
        self.tied: bool = bool(d.tied)
        self.has_lmhead: bool = bool(d.has_lmhead)
        self.embed_ids = _ids(d.embed)
        self.lmhead_ids = _ids(d.lmhead) if d.has_lmhead else None
        self.embed_sources = _lib.text(i.embed_sources)
        self.lmhead_sources = _lib.text(i.lmhead_sources)
        self.lmhead_rule = _lib.text(i.lmhead_rule)
        self.warnings = [_lib.text(i.warnings[k]) for k in range(i.warning_count)]

    @property
    def embed_rows(self) -> np.ndarray:
        return _rows(self._info().desc.embed)

    @property
    def lmhead_rows(self) -> Optional[np.ndarray]:
        d = self._info().desc
        return _rows(d.lmhead) if d.has_lmhead else None

    @property
    def overlaid_lmhead_ids(self) -> np.ndarray:
        """The ids whose logits a set built from this overlay patches (own lm_head part, else tied embed)."""
        if self.lmhead_ids is not None:
            return self.lmhead_ids
        return self.embed_ids if self.tied else np.zeros(0, dtype=np.uint32)

    def _info(self) -> _lib.AdapterRowsInfoC:
        info: _lib.AdapterRowsInfoC = lib.tovl_adapter_rows_get_info(self.handle).contents
        return info


# --------------------------------------------------------------------------
# Overlays and sets
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class OverlayView:
    """tovl_embed_overlay_view: sizes and device pointers (0 when absent)."""

    vocab: int
    hidden: int
    embed_count: int
    embed_ids: int
    embed_rows: int
    slot_map: int
    has_lmhead: bool
    lmhead_count: int
    lmhead_ids: int
    lmhead_rows: int


def _rows_c(tensor: str, ids: Any, rows: Any, hidden: int, keep: list[Any]) -> _lib.OverlayRowsC:
    ids_a = np.ascontiguousarray(ids, dtype=np.uint32).reshape(-1)
    rows_a = np.ascontiguousarray(rows, dtype=np.uint16)
    if rows_a.ndim != 2 or rows_a.shape[0] != ids_a.shape[0]:
        raise invalid(f"{tensor}: rows have shape {rows_a.shape}, expected [{ids_a.shape[0]}, width]")
    keep += [ids_a, rows_a]
    return _lib.OverlayRowsC(tensor.encode(), ids_a.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)),
                             rows_a.ctypes.data_as(ctypes.POINTER(ctypes.c_uint16)), ids_a.shape[0],
                             rows_a.shape[1] if rows_a.shape[0] else hidden)


class Overlay(_Handle):
    """One adapter's overlay on a backend (tovl_embed_overlay). Build with from_rows / from_adapter."""

    _what = "overlay"

    def __init__(self, backend: Backend, handle: int) -> None:
        self.backend = backend
        self._own(handle, lib.tovl_embed_overlay_release, backend)

    @classmethod
    def from_rows(cls, backend: Backend, vocab: int, hidden: int, embed_ids: Any = (), embed_rows: Any = None,
                  lmhead_ids: Any = None, lmhead_rows: Any = None, *, tied: bool = False,
                  adapter: Optional[str] = None) -> "Overlay":
        """tovl_build_overlay from host rows: ids (uint32 [n]) and bf16 bit patterns (uint16 [n, hidden]).

        `lmhead_ids` None: no lm_head part (tied models then patch logits from the embed rows)."""
        keep: list[Any] = []
        if embed_rows is None:
            embed_rows = np.zeros((0, hidden), dtype=np.uint16)
        desc = _lib.OverlayDescC()
        desc.adapter = adapter.encode() if adapter else None
        desc.vocab, desc.hidden, desc.tied = vocab, hidden, tied
        desc.embed = _rows_c("embed", embed_ids, embed_rows, hidden, keep)
        desc.has_lmhead = lmhead_ids is not None
        if lmhead_ids is not None:
            if lmhead_rows is None:
                raise invalid("from_rows: lmhead_ids given without lmhead_rows")
            desc.lmhead = _rows_c("lmhead", lmhead_ids, lmhead_rows, hidden, keep)
        return cls._build(backend, lambda out: lib.tovl_build_overlay(
            backend.handle, backend._kernels_p, ctypes.byref(desc), out))

    @classmethod
    def from_resolved(cls, backend: Backend, rows: AdapterRows) -> "Overlay":
        """tovl_build_overlay from an adapter already resolved against a model."""
        desc = rows._info().desc
        return cls._build(backend, lambda out: lib.tovl_build_overlay(
            backend.handle, backend._kernels_p, ctypes.byref(desc), out))

    @classmethod
    def from_adapter(cls, backend: Backend, adapter: Adapter, model: Model) -> "Overlay":
        """tovl_adapter_build_overlay: resolve `adapter` against `model`, then build."""
        return cls._build(backend, lambda out: lib.tovl_adapter_build_overlay(
            backend.handle, backend._kernels_p, adapter.handle, model.handle, out))

    @classmethod
    def _build(cls, backend: Backend, call: Callable[[Any], int]) -> "Overlay":
        out = _out()
        check(call(ctypes.byref(out)))
        return cls(backend, int(out.value or 0))

    @property
    def view(self) -> OverlayView:
        v = lib.tovl_embed_overlay_get_view(self.handle)
        return OverlayView(v.vocab, v.hidden, v.embed_count, v.embed_ids, v.embed_rows, v.slot_map,
                           bool(v.has_lmhead), v.lmhead_count, v.lmhead_ids, v.lmhead_rows)


@dataclass(frozen=True)
class OverlayTables:
    """tovl_overlay_tables: the set's device tables, for engines that launch the kernels themselves."""

    embed_slot_map_table: int
    embed_rows_table: int
    embed_n_table: int
    lmhead_rows_table: int
    lmhead_ids_table: int
    n_override_table: int


# Live sets by address, so the torch ops (which take the address) find the
# Python object, its backend and its kernels.
_sets: "weakref.WeakValueDictionary[int, OverlaySet]" = weakref.WeakValueDictionary()


VOCAB_PAD_DEFAULT = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE (TOVL_VOCAB_PAD_DEFAULT)


def vocab_shard_range(vocab: int, world_size: int, rank: int, pad_multiple: int = VOCAB_PAD_DEFAULT) -> tuple[int, int]:
    """vLLM's vocab split (tovl_vocab_shard_range): `vocab` padded up to a multiple of
    `pad_multiple`, cut into `world_size` equal ranges; rank `rank`'s [start, end) of it.
    A range starting at or past `vocab` holds only padding: that rank builds no shard set."""
    start, end = ctypes.c_uint32(), ctypes.c_uint32()
    check(lib.tovl_vocab_shard_range(vocab, world_size, rank, pad_multiple, ctypes.byref(start),
                                     ctypes.byref(end)))
    return int(start.value), int(end.value)


class OverlaySet(_Handle):
    """The device tables of `max_loras` slots (tovl_token_overlay_set_from_slots); None = empty slot.

    `vocab_range=(start, end)` builds the set of one vocab shard under tensor parallelism
    (tovl_token_overlay_set_from_slots_shard): its lm_head op patches the rank's logits shard
    [T, >= end - start]; its embed op is the unsharded one.
    The set holds its own reference to each overlay: the Overlay objects may be closed after.

    OverlaySet.with_shape makes a fixed-shape set instead (tovl_token_overlay_set_create):
    every slot empty, then load/unload in place, ordered on a stream, for the set's whole life;
    its handle, tables and launches never change, so a captured graph keeps serving it."""

    _what = "overlay set"

    @classmethod
    def with_shape(cls, backend: Backend, *, max_loras: int, vocab: int, hidden: int, tied: bool,
                   embed_capacity: int, lmhead_capacity: int,
                   vocab_range: Optional[tuple[int, int]] = None) -> "OverlaySet":
        """A fixed-shape set: `max_loras` empty slots, each holding at most `embed_capacity`
        embedding rows and `lmhead_capacity` lm_head cells of overlays of this vocab and hidden.
        `vocab_range=(start, end)`: a tensor-parallel rank's shard set
        (tovl_token_overlay_set_create_shard; the capacity counts an adapter's whole lm_head)."""
        shape = _lib.SetShapeC(max_loras, vocab, hidden, tied, embed_capacity, lmhead_capacity)
        out = _out()
        if vocab_range is None:
            check(lib.tovl_token_overlay_set_create(backend.handle, ctypes.byref(shape), ctypes.byref(out)))
        else:
            start, end = vocab_range
            check(lib.tovl_token_overlay_set_create_shard(backend.handle, ctypes.byref(shape), start, end,
                                                          ctypes.byref(out)))
        self = cls.__new__(cls)
        self._finish(backend, int(out.value or 0), tied, sharded=vocab_range is not None)
        return self

    def __init__(self, backend: Backend, overlays: Sequence[Optional[Overlay]], *, tied: bool,
                 max_loras: Optional[int] = None, vocab_range: Optional[tuple[int, int]] = None) -> None:
        n = len(overlays) if max_loras is None else max_loras
        if n < len(overlays):
            raise invalid(f"OverlaySet: {len(overlays)} overlays for max_loras {n}")
        arr = (ctypes.c_void_p * max(n, 1))()
        for s, ov in enumerate(overlays):
            if ov is not None:
                if ov.backend is not backend:
                    raise invalid(f"OverlaySet: the overlay in slot {s} was built on another backend "
                                  f"({ov.backend.name}, {ov.backend.device})")
                arr[s] = ov.handle
        out = _out()
        if vocab_range is None:
            check(lib.tovl_token_overlay_set_from_slots(backend.handle, arr, n, tied, ctypes.byref(out)))
        else:
            start, end = vocab_range
            check(lib.tovl_token_overlay_set_from_slots_shard(backend.handle, arr, n, tied, start, end,
                                                               ctypes.byref(out)))
        self._finish(backend, int(out.value or 0), tied, sharded=vocab_range is not None)

    def _finish(self, backend: Backend, handle: int, tied: bool, *, sharded: bool) -> None:
        self.backend = backend
        self.tied = tied
        self._own(handle, lib.tovl_token_overlay_set_destroy, backend)
        h = self.handle
        self.max_loras: int = lib.tovl_token_overlay_set_max_loras(h)
        self.vocab: int = lib.tovl_token_overlay_set_vocab(h)
        self.hidden: int = lib.tovl_token_overlay_set_hidden(h)
        self.max_n_override: int = lib.tovl_token_overlay_set_max_n_override(h)
        #: the lm_head launch's logical grid.y (at most 64 for a fixed-shape set)
        self.lmhead_grid_y: int = lib.tovl_token_overlay_set_lmhead_grid_y(h)
        #: a fixed-shape set (with_shape): its slots load and unload in place
        self.fixed: bool = bool(lib.tovl_token_overlay_set_is_fixed(h))
        start_c, end_c = ctypes.c_uint32(), ctypes.c_uint32()
        lib.tovl_token_overlay_set_shard_range(h, ctypes.byref(start_c), ctypes.byref(end_c))
        #: the vocab range [start, end) the lm_head op patches: [0, vocab) for an unsharded set
        self.shard_range: tuple[int, int] = (int(start_c.value), int(end_c.value))
        #: whether the set was built for one vocab shard (vocab_range)
        self.sharded: bool = sharded
        # One argument struct per hook, reused by every call (the hooks copy it).
        self._embed_args = _lib.EmbedHookArgsC()
        self._embed_args_p = ctypes.pointer(self._embed_args)
        self._lmhead_args = _lib.LmheadHookArgsC()
        self._lmhead_args_p = ctypes.pointer(self._lmhead_args)
        # Plain addresses for the hooks' per-call path (_lib.embed_hook_at / lmhead_hook_at).
        self._hook_addrs = (ctypes.addressof(backend._kernels), ctypes.addressof(self._embed_args),
                            ctypes.addressof(self._lmhead_args))
        _sets[h] = self

    def __repr__(self) -> str:
        shard = f", shard_range={self.shard_range}" if self.sharded else ""
        fixed = f", fixed, lm_head capacity {self.max_n_override}" if self.fixed else ""
        return (f"tovl.OverlaySet(max_loras={self.max_loras}, vocab={self.vocab}, hidden={self.hidden}{shard}"
                f"{fixed}, backend={self.backend.name}, active={self.any_active})")

    @property
    def any_active(self) -> bool:
        """Whether any slot holds an overlay (a fixed-shape set's hooks launch either way)."""
        return bool(lib.tovl_token_overlay_set_any_active(self.handle))

    # Slots of a fixed-shape set (`stream`: a raw CUstream / hipStream_t / VkCommandBuffer, None:
    # the backend's own).
    def load(self, slot: int, overlay: Overlay, stream: Optional[int] = None) -> None:
        """tovl_token_overlay_set_load: `overlay` into `slot`, ordered on `stream`; the set keeps
        its own reference, and releases the replaced overlay once the stream has passed the swap."""
        if overlay.backend is not self.backend:
            raise invalid(f"OverlaySet.load: the overlay was built on another backend ({overlay.backend.name}, "
                          f"{overlay.backend.device})")
        check(lib.tovl_token_overlay_set_load(self.handle, slot, overlay.handle, stream))

    def unload(self, slot: int, stream: Optional[int] = None) -> None:
        """tovl_token_overlay_set_unload: empty `slot`, ordered on `stream`."""
        check(lib.tovl_token_overlay_set_unload(self.handle, slot, stream))

    def collect(self) -> int:
        """Release the replaced overlays the device has passed; how many are still held."""
        pending = ctypes.c_uint32()
        check(lib.tovl_token_overlay_set_collect(self.handle, ctypes.byref(pending)))
        return int(pending.value)

    @property
    def shard_width(self) -> int:
        """The logits columns the lm_head op needs at least: end - start of shard_range."""
        return self.shard_range[1] - self.shard_range[0]

    @property
    def tables(self) -> OverlayTables:
        t = lib.tovl_token_overlay_set_tables(self.handle)
        return OverlayTables(*(int(getattr(t, f[0])) for f in _lib.OverlayTablesC._fields_))

    # The two hooks on raw device pointers (`stream`: CUstream / hipStream_t / None).
    def embed_hook(self, hidden: int, token_ids: int, T: int, hidden_size: int, slots: int = 0,
                   active_slot: int = -1, stream: Optional[int] = None) -> None:
        """tovl_embed_hook: patch bf16 hidden [T, hidden_size] in place after the embedding gather."""
        a = self._embed_args
        a.hidden, a.token_ids, a.slots, a.active_slot, a.T, a.hidden_size = (
            hidden, token_ids, slots, active_slot, T, hidden_size)
        kernels, args, _ = self._hook_addrs
        status = _lib.embed_hook_at(self.handle, kernels, args, stream)
        if status:
            check(status)

    def lmhead_hook(self, logits: int, logits_dtype: str, ld: int, hidden: int, T: int, hidden_size: int,
                    slots: int = 0, active_slot: int = -1, stream: Optional[int] = None) -> None:
        """tovl_lmhead_hook: patch logits [T, ld] ("bf16" or "f32") in place after the lm_head projection."""
        a = self._lmhead_args
        a.logits, a.ld, a.hidden, a.slots, a.active_slot, a.T, a.hidden_size = (
            logits, ld, hidden, slots, active_slot, T, hidden_size)
        a.logits_dtype = _LOGITS_DTYPES[logits_dtype]
        kernels, _, args = self._hook_addrs
        status = _lib.lmhead_hook_at(self.handle, kernels, args, stream)
        if status:
            check(status)


_LOGITS_DTYPES = {"bf16": _lib.LOGITS_BF16, "f32": _lib.LOGITS_F32}


def set_for_handle(handle: int) -> OverlaySet:
    """The live OverlaySet at address `handle`."""
    s = _sets.get(handle)
    if s is None or s.closed:
        raise invalid(f"set_handle {handle:#x} is not a live tovl.OverlaySet (closed, or never built)")
    return s


def rowdiff(backend: Backend, a: int, b: int, rows: int, hidden: int, tol: float = 0.0) -> np.ndarray:
    """Indices (uint32, increasing) of the rows that differ between two device bf16 [rows, hidden] matrices.

    `tol` 0: any bit differs; > 0: |a-b| > tol or NaN on one side (tovl_rowdiff)."""
    changed = np.empty(max(rows, 1), dtype=np.uint32)
    n = ctypes.c_uint32()
    check(lib.tovl_rowdiff(backend.handle, backend._kernels_p, a, b, rows, hidden, tol,
                           changed.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)), ctypes.byref(n)))
    return changed[: n.value].copy()


def f32_to_bf16(value: float) -> int:
    """The spec's f32 -> bf16 (nearest-even; every NaN becomes 0x7FC0), as the bit pattern."""
    return int(lib.tovl_f32_to_bf16(value))


def bf16_to_f32(bits: int) -> float:
    return float(lib.tovl_bf16_to_f32(bits))
