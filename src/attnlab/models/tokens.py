"""Byte-level tokens shown as the characters they form, with attention summed over the merged tokens.

A byte-level BPE tokenizer (GPT-2's, SmolLM2's) splits a Chinese character (3 bytes in UTF-8) over several tokens:
``我喜欢猫`` is 11 tokens, none of them a whole character. :func:`merge_bytes` groups consecutive tokens whose bytes
together decode to whole UTF-8 characters and merges the attention weights over the groups:

* **keys**: a query's weights on the tokens of one group are **added** (the row stays a distribution: it sums to
  what it summed to before, and a group every token of which is masked keeps weight exactly 0);
* **queries**: a group's row is the row of its **last** token, the position that has read the whole character (a
  causal model's earlier byte tokens have not seen the character's last bytes yet).

Shapes: ``weights [..., n, n]`` (queries and keys are the same ``n`` tokens), ``allowed [n, n]`` (True = may
attend); the merged ``weights [..., g, g]``, ``allowed [g, g]`` with ``g`` the number of groups.

>>> m = merge_bytes([b"I", b" \\xe5", b"\\x96\\x9c"])          # "I 喜": the character's bytes over two tokens
>>> m.labels, m.groups
(('I', '·喜'), ((0,), (1, 2)))
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DTypeError, ShapeError

__all__ = ["MergedTokens", "merge_bytes", "readable"]


@dataclass(frozen=True)
class MergedTokens:
    """What :func:`merge_bytes` returns.

    Attributes:
        labels: one readable label per group (its characters; a space shown as ``·``, a newline as ``↵``; a group
            cut short inside a character, at the end of the text, shows its bytes as ``\\xe5``).
        groups: the token positions of each group, in order (every position in exactly one group).
        weights: ``[..., g, g]`` merged weights (keys summed, each query group's row from its last token), or None.
        allowed: ``[g, g]`` merged mask (a key group may be attended when any of its tokens may), or None.
        complete: per group, whether its bytes are whole UTF-8 characters.
    """

    labels: tuple[str, ...]
    groups: tuple[tuple[int, ...], ...]
    weights: np.ndarray | None
    allowed: np.ndarray | None
    complete: tuple[bool, ...]

    @property
    def last(self) -> tuple[int, ...]:
        """The last token position of each group (the position whose query row the group shows)."""
        return tuple(g[-1] for g in self.groups)

    @property
    def merged(self) -> bool:
        """Whether any group holds more than one token."""
        return any(len(g) > 1 for g in self.groups)


def readable(text: str) -> str:
    """A token's text as an axis label: a space as ``·``, a newline as ``↵``."""
    return text.replace(" ", "·").replace("\n", "↵")


def _group(pieces: Sequence[bytes]) -> tuple[list[list[int]], list[str], list[bool]]:
    groups: list[list[int]] = []
    labels: list[str] = []
    complete: list[bool] = []
    cur: list[int] = []
    buf = b""
    for i, p in enumerate(pieces):
        if not isinstance(p, bytes | bytearray):
            raise DTypeError(f"pieces[{i}]: expected the bytes of one token, got {type(p).__name__}")
        cur.append(i)
        buf += bytes(p)
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = dec.decode(buf, final=False)
        if dec.getstate()[0] == b"":  # no bytes waiting for the rest of a character
            groups.append(cur)
            labels.append(readable(text) if text else "∅")
            complete.append(True)
            cur, buf = [], b""
    if cur:  # the text ends (or was cut) inside a character
        groups.append(cur)
        labels.append("".join(f"\\x{b:02x}" for b in buf))
        complete.append(False)
    return groups, labels, complete


def merge_bytes(pieces: Sequence[bytes], weights: Any = None, allowed: Any = None) -> MergedTokens:
    """Group byte-level tokens into the characters they form and merge attention over the groups.

    Args:
        pieces: the bytes of each of the ``n`` tokens (e.g. ``Tokenizer.token_bytes(ids)`` of a GGUF model).
        weights: ``[..., n, n]`` attention weights over these tokens (queries and keys), or None.
        allowed: ``[n, n]`` boolean mask (True = may attend), or None.

    Returns:
        a :class:`MergedTokens`; ``weights[..., a, b] = Σ_{j in group b} weights[..., last(a), j]``,
        ``allowed[a, b] = any_{j in group b} allowed[last(a), j]``. Tokens that are whole characters (all of ASCII)
        stay single groups, and their weights are returned unchanged.

    >>> w = np.array([[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]])   # causal, 3 tokens
    >>> merge_bytes([b"a", b"\\xe7\\x8c", b"\\xab"], w).weights.tolist()  # "a猫": queries 0 and 2, keys {0}, {1, 2}
    [[1.0, 0.0], [0.2, 0.8]]
    """
    pieces = list(pieces)
    n = len(pieces)
    if n == 0:
        raise ShapeError("pieces: expected the bytes of at least one token, got none")
    groups, labels, complete = _group(pieces)
    last = np.array([g[-1] for g in groups], dtype=np.intp)

    w_out: np.ndarray | None = None
    if weights is not None:
        w = np.asarray(weights)
        if w.ndim < 2 or w.shape[-2:] != (n, n):
            raise ShapeError(f"weights: expected [..., {n}, {n}] for {n} pieces, got shape {w.shape}")
        if w.dtype.kind != "f":
            raise DTypeError(f"weights: expected floats, got dtype {w.dtype}")
        rows = w[..., last, :]  # [..., g, n]
        w_out = np.zeros((*rows.shape[:-1], len(groups)), dtype=w.dtype)  # [..., g, g]
        for gi, g in enumerate(groups):
            w_out[..., gi] = rows[..., g].sum(axis=-1) if len(g) > 1 else rows[..., g[0]]
        w_out.setflags(write=False)
    a_out: np.ndarray | None = None
    if allowed is not None:
        a = np.asarray(allowed)
        if a.shape != (n, n) or a.dtype != bool:
            raise ShapeError(f"allowed: expected a boolean [{n}, {n}] mask, got shape {a.shape} dtype {a.dtype}")
        rows_a = a[last]  # [g, n]
        a_out = np.stack([rows_a[:, g].any(axis=-1) for g in groups], axis=-1)  # [g, g]
        a_out.setflags(write=False)
    return MergedTokens(
        labels=tuple(labels),
        groups=tuple(tuple(g) for g in groups),
        weights=w_out,
        allowed=a_out,
        complete=tuple(complete),
    )
