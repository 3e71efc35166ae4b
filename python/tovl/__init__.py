"""tovl: per-adapter token overlays (embedding rows, lm_head logits cells) for multi-LoRA serving.

A thin ctypes front end over the C library (include/tovl/tovl.h), with two
PyTorch ops (tovl.ops) and an adapter pool (tovl.pool). torch is imported only
by those two modules, on first use of their names here.
"""

from __future__ import annotations

from typing import Any

from .core import (
    Adapter,
    AdapterInfo,
    AdapterRows,
    AdapterSource,
    Backend,
    BackendInfo,
    Model,
    ModelInfo,
    Overlay,
    OverlaySet,
    OverlayTables,
    OverlayView,
    SafetensorsFile,
    TensorInfo,
    backends,
    bf16_to_f32,
    f32_to_bf16,
    rowdiff,
    version,
    vocab_shard_range,
    write_safetensors,
)
from .errors import (
    DeviceError,
    FileFormatError,
    InternalError,
    InvalidInputError,
    TovlError,
    UnavailableError,
)

__version__: str = version()

_TORCH_NAMES = {
    "embed_overlay_": "ops",
    "lmhead_overlay_": "ops",
    "backend_name_for": "ops",
    "AdapterPool": "pool",
    "SlotInfo": "pool",
    "tp_from_distributed": "pool",
}


def __getattr__(name: str) -> Any:
    # The torch-facing names load torch (and register the ops) on first use.
    # Each is then kept as a module attribute, so later lookups cost a dict lookup.
    import importlib

    if name in ("ops", "pool", "hf"):
        value = importlib.import_module(f".{name}", __name__)
    elif name in _TORCH_NAMES:
        value = getattr(importlib.import_module(f".{_TORCH_NAMES[name]}", __name__), name)
    else:
        raise AttributeError(f"module 'tovl' has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = [
    "Adapter", "AdapterInfo", "AdapterPool", "AdapterRows", "AdapterSource", "Backend", "BackendInfo",
    "DeviceError", "FileFormatError", "InternalError", "InvalidInputError", "Model", "ModelInfo", "Overlay",
    "OverlaySet", "OverlayTables", "OverlayView", "SafetensorsFile", "SlotInfo", "TensorInfo", "TovlError",
    "UnavailableError", "__version__", "backend_name_for", "backends", "bf16_to_f32", "embed_overlay_",
    "f32_to_bf16", "lmhead_overlay_", "rowdiff", "tp_from_distributed", "version", "vocab_shard_range",
    "write_safetensors",
]
