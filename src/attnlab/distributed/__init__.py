"""Context parallelism: exact attention over a sequence sharded across processes or machines.

Built on ``torch.distributed`` (gloo on CPUs, NCCL on GPUs, launched with ``torchrun``): :func:`ring_attention`
passes key/value shards around a ring of ranks and merges partial results with their log-sum-exps, forward and
backward. :class:`RingLayout` says which positions each rank holds (``"contiguous"`` or the causal-balanced
``"zigzag"``). Needs the ``torch`` extra: ``pip install 'attnlab[torch]'``; see ``docs/distributed.md``.
"""

from .layout import LAYOUTS, Layout, RingLayout
from .ring import (
    RingGrads,
    RingOptions,
    RingResult,
    RingStats,
    merge_partials,
    ring_attention,
    ring_attention_backward,
    ring_attention_forward,
)

__all__ = [
    "LAYOUTS",
    "Layout",
    "RingGrads",
    "RingLayout",
    "RingOptions",
    "RingResult",
    "RingStats",
    "merge_partials",
    "ring_attention",
    "ring_attention_backward",
    "ring_attention_forward",
]
