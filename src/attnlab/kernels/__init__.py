"""Kernels built on the core: tiled online-softmax attention and the KV cache (differentiable on PyTorch tensors
through :mod:`attnlab.kernels.autograd`; overflow is a :class:`~attnlab.errors.RangeError`, see
:mod:`attnlab.kernels.overflow`). :func:`exponential` says which exponential the tiled kernel uses here."""

from .kv_cache import KVCache, cached_attention, decode_step
from .tiled import (
    Exponential,
    FlashGrads,
    FlashResult,
    TiledOptions,
    exponential,
    flash_attention,
    flash_attention_backward,
)

__all__ = [
    "Exponential",
    "FlashGrads",
    "FlashResult",
    "KVCache",
    "TiledOptions",
    "cached_attention",
    "decode_step",
    "exponential",
    "flash_attention",
    "flash_attention_backward",
]
