"""The tiled forward's result: what :func:`~attnlab.kernels.tiled.flash_attention` returns and
:func:`~attnlab.kernels.tiled.flash_attention_backward` takes (shared by the forward and the backward loops)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .plan import TiledOptions

__all__ = ["FlashResult"]


@dataclass(frozen=True)
class FlashResult:
    """The tiled forward's result, and what its backward needs: ``flash_attention_backward(result, d_out)``.

    Shapes: ``output [..., n_q, d_v]`` (the caller's library and dtype), ``lse [..., n_q]`` (the caller's library,
    compute dtype: float32 or float64): the row log-sum-exp of the logits ``Q Kᵀ · scale / temperature`` with masked
    entries left out (the core's ``AttentionTrace.lse``), ``-inf`` on fully masked rows. ``inputs`` is the forward's
    ``(q, k, v, bias)`` as given (references, not copies), ``options`` its :class:`TiledOptions` (the mask as a
    :class:`~attnlab.masks.MaskSpec`, scale, temperature, policy, blocks, threads).
    """

    output: Any
    lse: Any
    inputs: tuple[Any, Any, Any, Any] | None = field(default=None, repr=False, compare=False)
    options: TiledOptions = field(default_factory=TiledOptions, repr=False, compare=False)
