"""attnlab: attention that is exact, checkable and visible.

The core is a small set of pure functions over arrays (NumPy, PyTorch or any array-API library):

>>> import attnlab
>>> attnlab.scaled_dot_product_attention([[1, 0]], [[1, 0], [0, 1]], [[10, 0], [0, 20]]).round(2).tolist()
[[6.7, 6.6]]

Shapes follow one legend everywhere: ``q [..., n_q, d_k]``, ``k [..., n_k, d_k]``, ``v [..., n_k, d_v]``,
``out [..., n_q, d_v]``, ``mask / bias / weights [..., n_q, n_k]``, ``lse [..., n_q]``. A mask is boolean and
True means "may attend"; :mod:`attnlab.masks` converts every other convention.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from . import masks
from .core import (
    AttentionTrace,
    attention_trace,
    log_softmax,
    masked_softmax,
    scaled_dot_product_attention,
    softmax,
)
from .core.dropout import Dropout, DropoutResult, dropout
from .core.gradients import AttentionGrads, attention_backward
from .core.multihead import (
    MultiHeadGrads,
    MultiHeadResult,
    MultiHeadWeights,
    init_multi_head,
    merge_heads,
    multi_head_attention,
    multi_head_backward,
    repeat_kv,
    split_heads,
)
from .core.rope import apply_rope, rope_tables
from .errors import (
    AttnlabError,
    AttnlabWarning,
    DTypeError,
    MaskedRowError,
    MaskError,
    MemoryLimitError,
    MissingExtraError,
    NonFiniteError,
    OptionError,
    RangeError,
    ShapeError,
)

#: attnlab's version (PEP 440), as ``attnlab --version`` prints it: the only place it is written (pyproject reads it).
__version__ = "0.2.0"

__all__ = [
    "AttentionGrads",
    "AttentionTrace",
    "AttnlabError",
    "AttnlabWarning",
    "DTypeError",
    "Dropout",
    "DropoutResult",
    "Finding",
    "FlashGrads",
    "FlashResult",
    "KVCache",
    "MaskError",
    "MaskedRowError",
    "MemoryLimitError",
    "MissingExtraError",
    "MultiHeadGrads",
    "MultiHeadResult",
    "MultiHeadWeights",
    "NonFiniteError",
    "OptionError",
    "PermutationDemo",
    "RangeError",
    "Report",
    "ShapeError",
    "__version__",
    "apply_rope",
    "attention_backward",
    "attention_trace",
    "cached_attention",
    "check",
    "check_backward",
    "cost",
    "dropout",
    "flash_attention",
    "flash_attention_backward",
    "init_multi_head",
    "invariants",
    "log_softmax",
    "masked_softmax",
    "masks",
    "merge_heads",
    "multi_head_attention",
    "multi_head_backward",
    "permutation_demo",
    "repeat_kv",
    "rope_tables",
    "scaled_dot_product_attention",
    "softmax",
    "split_heads",
    "weights_io",
]


if _TYPE_CHECKING:  # what the lazy names below are, for type checkers and editors
    from . import cost, invariants, weights_io
    from .checker import Finding, Report, check, check_backward
    from .explain.permutation import PermutationDemo, permutation_demo
    from .kernels import FlashGrads, FlashResult, KVCache, cached_attention, flash_attention, flash_attention_backward

#: Public names that live outside the core, imported on first use (PEP 562, as NumPy and SciPy do) so that
#: ``import attnlab`` loads the core only (NumPy, :mod:`attnlab.core`, :mod:`attnlab.masks`,
#: :mod:`attnlab.errors`): the kernels, the checker and the teaching demo.
_LAZY = {
    "FlashGrads": "kernels",
    "FlashResult": "kernels",
    "KVCache": "kernels",
    "cached_attention": "kernels",
    "flash_attention": "kernels",
    "flash_attention_backward": "kernels",
    "Finding": "checker",
    "Report": "checker",
    "check": "checker",
    "check_backward": "checker",
    "PermutationDemo": "explain.permutation",
    "permutation_demo": "explain.permutation",
}

#: Subpackages and modules reachable as attributes (``attnlab.kernels``, ``attnlab.invariants``, ...), imported on
#: first use; ``cost``, ``invariants`` and ``weights_io`` are also in ``__all__``.
_SUBMODULES = frozenset(
    {
        "bench",
        "checker",
        "cli",
        "commands",
        "cost",
        "distributed",
        "explain",
        "invariants",
        "kernels",
        "lab",
        "models",
        "plot",
        "testing",
        "validate",
        "weights_io",
    }
)


def __getattr__(name: str) -> object:
    """``attnlab.flash_attention``, ``attnlab.check``, ``attnlab.invariants``, ... loaded on first use (see
    ``_LAZY`` and ``_SUBMODULES``)."""
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")  # the import binds it as an attribute of attnlab
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)
