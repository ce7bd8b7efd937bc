"""The errors attnlab raises.

Every error names the argument at fault, its shape or value, and what was expected. They all derive from
:class:`AttnlabError`; the subclasses also derive from the built-in exception a caller would expect
(``ValueError`` for bad values and shapes, ``TypeError`` for bad types, ``ImportError`` for missing extras), so
``except ValueError`` keeps working.
"""

from __future__ import annotations

__all__ = [
    "AttnlabError",
    "AttnlabWarning",
    "DTypeError",
    "MaskError",
    "MaskedRowError",
    "MissingExtraError",
    "NonFiniteError",
    "OptionError",
    "RangeError",
    "ShapeError",
    "masked_rows_error",
    "missing_extra",
]


class AttnlabError(Exception):
    """Base class of every error attnlab raises on purpose."""


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


def missing_extra(module: str, extra: str) -> MissingExtraError:
    """The error for an optional ``module`` that comes with ``pip install 'attnlab[extra]'``."""
    return MissingExtraError(f"{module} is not installed; it comes with: pip install 'attnlab[{extra}]'")
