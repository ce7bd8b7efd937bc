"""The errors attnlab raises.

Every error names the argument at fault, its shape or value, and what was expected. They all derive from
:class:`AttnlabError`; the subclasses also derive from the built-in exception a caller would expect
(``ValueError`` for bad values and shapes, ``TypeError`` for bad types, ``ImportError`` for missing extras), so
``except ValueError`` keeps working.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "AttnlabError",
    "AttnlabWarning",
    "DTypeError",
    "MaskError",
    "MaskedRowError",
    "MemoryLimitError",
    "MissingExtraError",
    "NonFiniteError",
    "OptionError",
    "RangeError",
    "ShapeError",
    "logits_overflow_error",
    "masked_rows_error",
    "missing_extra",
    "one_line",
]


class AttnlabError(Exception):
    """Base class of every error attnlab raises on purpose."""

    # set on the errors made by attnlab.i18n.localized (the catalogue key and its fields), absent on the others
    i18n_key: str
    i18n_fields: dict[str, Any]


class AttnlabWarning(UserWarning):
    """Something attnlab could not do as asked and did another way (said once, with the reason and the fix)."""


class ShapeError(AttnlabError, ValueError):
    """An array has a shape that does not fit the others (``k: last dim d_k=3 does not match q's d_k=2 ...``)."""


class DTypeError(AttnlabError, TypeError):
    """An array has a dtype attnlab does not accept here (the message names the converter to use)."""


class MaskError(AttnlabError, ValueError):
    """A mask is ambiguous or malformed: non-boolean, not broadcastable, or a causal alignment left unsaid."""


class MaskedRowError(AttnlabError, ValueError):
    """A query row may attend to no key at all, under the ``masked_rows="raise"`` policy.

    Attributes:
        rows: the index of every fully masked row, each a tuple ``(*batch_index, query_index)``.
    """

    def __init__(self, message: str, rows: tuple[tuple[int, ...], ...] = ()):
        super().__init__(message)
        self.rows = rows


class NonFiniteError(AttnlabError, ValueError):
    """An input holds NaN or infinity where only finite numbers make sense."""


class RangeError(AttnlabError, ValueError):
    """Finite inputs give a value outside the range of the dtype it is computed or stored in.

    For example logits ``(Q Kᵀ · scale + bias) / temperature`` that overflow to infinity, or a value a float16 KV
    cache cannot hold. The message names what overflowed, its largest magnitude and the dtype's limit.
    """


class MemoryLimitError(AttnlabError, MemoryError):
    """A dense computation would need more memory than its limit (``max_bytes``) or than the machine has.

    The message says how many bytes it needs, what was counted, and points to :func:`attnlab.flash_attention`,
    which computes the same attention in O(n) memory.
    """


class OptionError(AttnlabError, ValueError):
    """A keyword option (not an array) has a bad value or type: ``block_k: expected an int >= 1, got 0``."""


class MissingExtraError(AttnlabError, ImportError):
    """An optional dependency is not installed; the message is the one-line ``pip install`` that fixes it."""


def masked_rows_error(
    rows: tuple[tuple[int, ...], ...],
    scores_shape: tuple[int, ...],
    *,
    index: str = "(*batch, query)",
    scores: str = "scores",
    fix: str = "the mask (padding AND causal often empties rows)",
    nan: bool = True,
) -> MaskedRowError:
    """The error for fully masked query ``rows`` under ``masked_rows="raise"``, shared by every attention variant.

    ``index`` names the layout of each row's index tuple, ``scores`` what ``scores_shape`` is the shape of, ``fix``
    what to mend; ``nan=False`` leaves the ``'nan'`` policy out (a backward cannot use it).
    """
    shown = ", ".join(str(r) for r in rows[:8]) + (", ..." if len(rows) > 8 else "")
    policies = "masked_rows='zero' (output 0, as FlashAttention)" + (" or 'nan'" if nan else "")
    return MaskedRowError(
        f"mask: {len(rows)} query row(s) may attend to no key at all, at {index} index {shown} "
        f"({scores} {tuple(scores_shape)}); softmax over an empty row is undefined. Fix {fix}, or choose {policies}",
        rows,
    )


def _g(x: float) -> str:
    return f"{x:.7g}"


def logits_overflow_error(
    index: tuple[int, ...],
    value: float,
    count: int,
    scores_shape: tuple[int, ...],
    dtype: str,
    *,
    q_max: float,
    k_max: float,
    bias_max: float | None,
    scale: float,
    temperature: float,
    index_layout: str = "(*batch, query, key)",
    note: str = "",
) -> RangeError:
    """The error for logits ``(scale · Q Kᵀ + bias) / temperature`` that are not finite although the inputs are.

    Shared by every attention variant (dense, tiled, cached): call it once the logits, computed in ``dtype``, hold
    an infinity or a NaN at an allowed (unmasked) entry while q, k, v and bias are all finite.

    Args:
        index: the first offending entry, in ``index_layout`` order (default ``(*batch, query, key)``), as ints.
        value: the value found there (``inf``, ``-inf`` or ``nan``; a NaN comes from ``inf - inf``).
        count: how many allowed entries of the logits are not finite (``-1`` if the caller did not count them).
        scores_shape: the shape of the (full, not per-block) logits ``[*batch, n_q, n_k]``.
        dtype: the name of the dtype the logits were computed in (``"float32"``, ``"float64"``).
        q_max, k_max: the largest magnitude of q and of k.
        bias_max: the largest magnitude of the bias, ``None`` without a bias.
        scale, temperature: the scale and the temperature as used.
        index_layout: what each position of ``index`` is.
        note: an extra sentence (for example, that float32 inputs were already recomputed in float64).

    The message names the dtype's largest finite value and the fixes: a smaller scale or smaller inputs, a larger
    temperature, and (when ``dtype`` is not float64) float64 inputs.

    >>> str(logits_overflow_error((0, 1), float("inf"), 4, (2, 2), "float64", q_max=1e200, k_max=1e200,
    ...     bias_max=None, scale=0.5, temperature=1.0)).split("; ")[0]
    'logits: (scale · Q Kᵀ + bias) / temperature overflow float64 (largest finite 1.797693e+308) from finite inputs'
    """
    try:
        limit = f"largest finite {_g(float(np.finfo(dtype).max))}"
    except (TypeError, ValueError):
        limit = "its largest finite value"
    many = "" if count < 0 else f"{count} of {math.prod(scores_shape)} entries, "
    bias = "no bias" if bias_max is None else f"max |bias| {_g(bias_max)}"
    fixes = "a smaller scale or smaller q/k/bias, a larger temperature"
    if str(dtype) != "float64":
        fixes += ", or float64 inputs"
    return RangeError(
        f"logits: (scale · Q Kᵀ + bias) / temperature overflow {dtype} ({limit}) from finite inputs; "
        f"{value} at {index_layout} index {tuple(int(i) for i in index)} ({many}logits {tuple(scores_shape)}); "
        f"inputs: max |q| {_g(q_max)}, max |k| {_g(k_max)}, {bias}, scale {_g(scale)}, temperature {_g(temperature)}."
        f"{' ' + note if note else ''} Fix: {fixes}"
    )


def missing_extra(module: str, extra: str) -> MissingExtraError:
    """The error for an optional ``module`` that comes with ``pip install 'attnlab[extra]'``."""
    return MissingExtraError(f"{module} is not installed; it comes with: pip install 'attnlab[{extra}]'")


def one_line(err: BaseException | str) -> str:
    """The message of ``err`` (an exception, or its text already translated) on one line (a library message that
    draws a mask has several), as the commands print it.

    >>> one_line(MaskError("mask: a row is empty:\\n■ ⬚\\n⬚ ⬚"))
    'mask: a row is empty: ■ ⬚ ⬚ ⬚'
    """
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip())
