"""Context parallelism: exact attention over a sequence sharded across processes or machines.

Built on ``torch.distributed`` (gloo on CPUs, NCCL on GPUs, launched with ``torchrun``): :func:`ring_attention`
passes key/value shards around a ring of ranks and merges partial results with their log-sum-exps, forward and
backward. :class:`RingLayout` says which positions each rank holds (``"contiguous"`` or the causal-balanced
``"zigzag"``). Needs the ``torch`` extra: ``pip install 'attnlab[torch]'``; see ``docs/distributed.md``.
"""

from . import layout, ring
from .layout import LAYOUTS as LAYOUTS
from .layout import Layout as Layout
from .layout import RingLayout as RingLayout
from .ring import RingGrads as RingGrads
from .ring import RingOptions as RingOptions
from .ring import RingResult as RingResult
from .ring import RingStats as RingStats
from .ring import merge_partials as merge_partials
from .ring import ring_attention as ring_attention
from .ring import ring_attention_backward as ring_attention_backward
from .ring import ring_attention_forward as ring_attention_forward

# each module's public names are listed once, in its own __all__; the redundant aliases above mark the re-exports
__all__ = [*layout.__all__, *ring.__all__]
