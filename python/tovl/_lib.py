"""ctypes binding of include/tovl/tovl.h: loading libtovl.so, struct mirrors, prototypes.

Each Structure lists the C struct's fields in the same order with the same
types, so ctypes lays it out as the C compiler does (tests/test_core_abi.py
compiles the header and compares every size and offset). Nothing here is
public API: tovl.core wraps it.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import (
    POINTER,
    Structure,
    c_bool,
    c_char,
    c_char_p,
    c_float,
    c_int,
    c_int32,
    c_size_t,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Any

devptr = c_uint64
kernel = c_uint64
status = c_int  # enum tovl_status

# enum values (tovl.h)
LOGITS_BF16 = 0
LOGITS_F32 = 1


class BackendInfoC(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("compiled", c_bool),
        ("available", c_bool),
        ("reason", c_char * 256),
        ("device", c_char * 256),
    ]


class OverlayKernelsC(Structure):
    _fields_ = [
        ("rowdiff", kernel),
        ("embed_overlay", kernel),
        ("lmhead_overlay_bf16", kernel),
        ("lmhead_overlay_f32", kernel),
    ]


class OverlayRowsC(Structure):
    _fields_ = [
        ("tensor", c_char_p),
        ("ids", POINTER(c_uint32)),
        ("rows", POINTER(c_uint16)),
        ("count", c_uint32),
        ("width", c_uint32),
    ]


class OverlayDescC(Structure):
    _fields_ = [
        ("adapter", c_char_p),
        ("vocab", c_uint32),
        ("hidden", c_uint32),
        ("embed", OverlayRowsC),
        ("has_lmhead", c_bool),
        ("lmhead", OverlayRowsC),
        ("tied", c_bool),
    ]


class EmbedOverlayViewC(Structure):
    _fields_ = [
        ("vocab", c_uint32),
        ("hidden", c_uint32),
        ("embed_count", c_uint32),
        ("embed_ids", devptr),
        ("embed_rows", devptr),
        ("slot_map", devptr),
        ("has_lmhead", c_bool),
        ("lmhead_count", c_uint32),
        ("lmhead_ids", devptr),
        ("lmhead_rows", devptr),
    ]


class OverlayTablesC(Structure):
    _fields_ = [
        ("embed_slot_map_table", devptr),
        ("embed_rows_table", devptr),
        ("embed_n_table", devptr),
        ("lmhead_rows_table", devptr),
        ("lmhead_ids_table", devptr),
        ("n_override_table", devptr),
    ]


class SetShapeC(Structure):
    _fields_ = [
        ("max_loras", c_uint32),
        ("vocab", c_uint32),
        ("hidden", c_uint32),
        ("tied", c_bool),
        ("embed_capacity", c_uint32),
        ("lmhead_capacity", c_uint32),
    ]


class EmbedHookArgsC(Structure):
    _fields_ = [
        ("hidden", devptr),
        ("token_ids", devptr),
        ("slots", devptr),
        ("active_slot", c_int32),
        ("T", c_uint32),
        ("hidden_size", c_uint32),
    ]


class LmheadHookArgsC(Structure):
    _fields_ = [
        ("logits", devptr),
        ("logits_dtype", c_int),
        ("ld", c_uint64),
        ("hidden", devptr),
        ("slots", devptr),
        ("active_slot", c_int32),
        ("T", c_uint32),
        ("hidden_size", c_uint32),
    ]


class TensorC(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("dtype", c_char_p),
        ("elem_size", c_uint32),
        ("ndim", c_uint32),
        ("shape", POINTER(c_uint64)),
        ("count", c_uint64),
        ("data", c_void_p),
    ]


class ModelInfoC(Structure):
    _fields_ = [
        ("dir", c_char_p),
        ("vocab", c_uint32),
        ("config_vocab", c_uint32),
        ("hidden", c_uint32),
        ("tied", c_bool),
        ("tied_inferred", c_bool),
        ("embed_file", c_char_p),
        ("embed_dtype", c_char_p),
        ("lmhead_file", c_char_p),
        ("lmhead_dtype", c_char_p),
        ("embed_tensor", c_char_p),
        ("lmhead_tensor", c_char_p),
        ("embed_module", c_char_p),
        ("lmhead_module", c_char_p),
        ("layout", c_char_p),
    ]


class ModelNamesC(Structure):
    _fields_ = [
        ("embed_tensor", c_char_p),
        ("lmhead_tensor", c_char_p),
        ("embed_module", c_char_p),
        ("lmhead_module", c_char_p),
    ]


class AdapterSourceC(Structure):
    _fields_ = [
        ("kind", c_int),
        ("module", c_int),
        ("file", c_char_p),
        ("tensor", c_char_p),
        ("dtype", c_char_p),
        ("rows", c_uint32),
        ("width", c_uint32),
        ("ids", POINTER(c_uint32)),
        ("config_field", c_char_p),
        ("module_path", c_char_p),
    ]


class AdapterInfoC(Structure):
    _fields_ = [
        ("dir", c_char_p),
        ("format", c_char_p),
        ("ensure_weight_tying", c_bool),
        ("source_count", c_size_t),
        ("sources", POINTER(AdapterSourceC)),
        ("other_tensors", c_size_t),
    ]


class AdapterRowsInfoC(Structure):
    _fields_ = [
        ("desc", OverlayDescC),
        ("embed_sources", c_char_p),
        ("lmhead_sources", c_char_p),
        ("lmhead_rule", c_char_p),
        ("warning_count", c_size_t),
        ("warnings", POINTER(c_char_p)),
    ]


# Every struct mirrored here, by its C name (the ABI test walks this table).
STRUCTS: dict[str, type[Structure]] = {
    "tovl_backend_info": BackendInfoC,
    "tovl_overlay_kernels": OverlayKernelsC,
    "tovl_overlay_rows": OverlayRowsC,
    "tovl_overlay_desc": OverlayDescC,
    "tovl_embed_overlay_view": EmbedOverlayViewC,
    "tovl_overlay_tables": OverlayTablesC,
    "tovl_set_shape": SetShapeC,
    "tovl_embed_hook_args": EmbedHookArgsC,
    "tovl_lmhead_hook_args": LmheadHookArgsC,
    "tovl_tensor": TensorC,
    "tovl_model_info": ModelInfoC,
    "tovl_adapter_source": AdapterSourceC,
    "tovl_model_names": ModelNamesC,
    "tovl_adapter_info": AdapterInfoC,
    "tovl_adapter_rows_info": AdapterRowsInfoC,
}

P = c_void_p  # every opaque handle (tovl_backend *, tovl_model *, ...)
_PROTOTYPES: dict[str, tuple[Any, list[Any]]] = {
    "tovl_version": (c_char_p, []),
    "tovl_status_str": (c_char_p, [status]),
    "tovl_last_error": (c_char_p, []),
    "tovl_backend_list": (c_size_t, [POINTER(BackendInfoC), c_size_t]),
    "tovl_backend_open": (status, [c_char_p, POINTER(P)]),
    "tovl_backend_close": (None, [P]),
    "tovl_backend_name": (c_char_p, [P]),
    "tovl_backend_device": (c_char_p, [P]),
    "tovl_backend_property": (c_char_p, [P, c_char_p]),
    "tovl_alloc": (status, [P, c_size_t, POINTER(devptr)]),
    "tovl_free": (None, [P, devptr]),
    "tovl_upload": (status, [P, devptr, c_void_p, c_size_t]),
    "tovl_download": (status, [P, c_void_p, devptr, c_size_t]),
    "tovl_fill_u32": (status, [P, devptr, c_uint32, c_size_t]),
    "tovl_synchronize": (status, [P, c_void_p]),
    "tovl_try_kernel": (kernel, [P, c_char_p]),
    "tovl_overlay_kernels_resolve": (OverlayKernelsC, [P]),
    "tovl_build_overlay": (status, [P, POINTER(OverlayKernelsC), POINTER(OverlayDescC), POINTER(P)]),
    "tovl_embed_overlay_retain": (None, [P]),
    "tovl_embed_overlay_release": (None, [P]),
    "tovl_embed_overlay_get_view": (EmbedOverlayViewC, [P]),
    "tovl_rowdiff": (
        status,
        [P, POINTER(OverlayKernelsC), devptr, devptr, c_uint32, c_uint32, c_float, POINTER(c_uint32),
         POINTER(c_uint32)],
    ),
    "tovl_token_overlay_set_from_slots": (status, [P, POINTER(P), c_uint32, c_bool, POINTER(P)]),
    "tovl_vocab_shard_range": (
        status, [c_uint32, c_uint32, c_uint32, c_uint32, POINTER(c_uint32), POINTER(c_uint32)]),
    "tovl_token_overlay_set_from_slots_shard": (
        status, [P, POINTER(P), c_uint32, c_bool, c_uint32, c_uint32, POINTER(P)]),
    "tovl_token_overlay_set_shard_range": (None, [P, POINTER(c_uint32), POINTER(c_uint32)]),
    "tovl_token_overlay_set_destroy": (None, [P]),
    "tovl_token_overlay_set_any_active": (c_bool, [P]),
    "tovl_token_overlay_set_vocab": (c_uint32, [P]),
    "tovl_token_overlay_set_hidden": (c_uint32, [P]),
    "tovl_token_overlay_set_max_n_override": (c_uint32, [P]),
    "tovl_token_overlay_set_lmhead_grid_y": (c_uint32, [P]),
    "tovl_token_overlay_set_max_loras": (c_uint32, [P]),
    "tovl_token_overlay_set_tables": (OverlayTablesC, [P]),
    "tovl_token_overlay_set_create": (status, [P, POINTER(SetShapeC), POINTER(P)]),
    "tovl_token_overlay_set_create_shard": (status, [P, POINTER(SetShapeC), ctypes.c_uint32, ctypes.c_uint32,
                                                     POINTER(P)]),
    "tovl_token_overlay_set_load": (status, [P, c_uint32, P, c_void_p]),
    "tovl_token_overlay_set_unload": (status, [P, c_uint32, c_void_p]),
    "tovl_token_overlay_set_collect": (status, [P, POINTER(c_uint32)]),
    "tovl_token_overlay_set_is_fixed": (c_bool, [P]),
    "tovl_token_overlay_set_slot": (P, [P, c_uint32]),
    "tovl_embed_hook": (status, [P, POINTER(OverlayKernelsC), POINTER(EmbedHookArgsC), c_void_p]),
    "tovl_lmhead_hook": (status, [P, POINTER(OverlayKernelsC), POINTER(LmheadHookArgsC), c_void_p]),
    "tovl_f32_to_bf16": (c_uint16, [c_float]),
    "tovl_bf16_to_f32": (c_float, [c_uint16]),
    "tovl_safetensors_open": (status, [c_char_p, POINTER(P)]),
    "tovl_safetensors_open_memory": (status, [c_void_p, c_size_t, c_char_p, POINTER(P)]),
    "tovl_safetensors_close": (None, [P]),
    "tovl_safetensors_path": (c_char_p, [P]),
    "tovl_safetensors_count": (c_size_t, [P]),
    "tovl_safetensors_at": (POINTER(TensorC), [P, c_size_t]),
    "tovl_safetensors_find": (POINTER(TensorC), [P, c_char_p]),
    "tovl_safetensors_write": (status, [c_char_p, POINTER(TensorC), c_size_t, POINTER(c_char_p), c_size_t]),
    "tovl_model_open": (status, [c_char_p, c_uint32, POINTER(P)]),
    "tovl_model_open_named": (status, [c_char_p, c_uint32, POINTER(ModelNamesC), POINTER(P)]),
    "tovl_model_set_modules": (status, [P, c_char_p, c_char_p]),
    "tovl_model_close": (None, [P]),
    "tovl_model_get_info": (POINTER(ModelInfoC), [P]),
    "tovl_model_embed_row": (POINTER(c_uint16), [P, c_uint32]),
    "tovl_model_lmhead_row": (POINTER(c_uint16), [P, c_uint32]),
    "tovl_model_lmhead_product": (status, [P, POINTER(c_uint16), c_uint32, POINTER(c_float)]),
    "tovl_adapter_open": (status, [c_char_p, POINTER(P)]),
    "tovl_adapter_close": (None, [P]),
    "tovl_adapter_get_info": (POINTER(AdapterInfoC), [P]),
    "tovl_adapter_resolve": (status, [P, POINTER(OverlayKernelsC), P, P, POINTER(P)]),
    "tovl_adapter_rows_free": (None, [P]),
    "tovl_adapter_rows_get_info": (POINTER(AdapterRowsInfoC), [P]),
    "tovl_adapter_build_overlay": (status, [P, POINTER(OverlayKernelsC), P, P, POINTER(P)]),
}
# Present only in builds with that backend (tovl_hip.h, tovl_cuda.h).
_OPTIONAL_PROTOTYPES: dict[str, tuple[Any, list[Any]]] = {
    "tovl_hip_backend_open_device": (status, [c_int, POINTER(P)]),
    "tovl_cuda_backend_wrap": (status, [c_void_p, POINTER(P)]),
}


def library_path() -> Path:
    """The libtovl.so to load: $TOVL_LIBRARY when set (a development build), else the bundled one.

    The package bundles the library under its SONAME, libtovl.so.<ABI>
    (python/tovl_wheel.cmake), the name its CLI asks the loader for.
    """
    override = os.environ.get("TOVL_LIBRARY")
    if override:
        return Path(override)
    here = Path(__file__).parent
    bundled = sorted(here.glob("libtovl.so.*"))
    return bundled[0] if bundled else here / "libtovl.so.<ABI>"


def _load() -> ctypes.CDLL:
    path = library_path()
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise ImportError(f"tovl: cannot load the C library {path}: {e}") from e
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    for name, (restype, argtypes) in _OPTIONAL_PROTOTYPES.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = restype
            fn.argtypes = argtypes
    return lib


lib = _load()

# The two hooks once more, typed on plain addresses: the torch ops' per-call path
# (a POINTER argument costs a type check on every call).
embed_hook_at = lib._FuncPtr(("tovl_embed_hook", lib))
lmhead_hook_at = lib._FuncPtr(("tovl_lmhead_hook", lib))
for _fn in (embed_hook_at, lmhead_hook_at):
    _fn.restype = status
    _fn.argtypes = [c_void_p, c_void_p, c_void_p, c_void_p]


def has(name: str) -> bool:
    """Whether this build of the library exports `name` (backend-specific entry points)."""
    return getattr(lib, name, None) is not None


def text(value: bytes | None) -> str:
    return "" if value is None else value.decode("utf-8", "replace")


def opt_text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "replace")
