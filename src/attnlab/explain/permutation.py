"""Article 001, §16: attention alone is permutation-equivariant; RoPE breaks that (:func:`permutation_demo`).

>>> print(permutation_demo(n=4, d=4).text().splitlines()[0])
Tokens x [4, 4] are permuted by [2, 0, 1, 3] (self-attention, no mask, float64).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.attention import scaled_dot_product_attention
from ..core.rope import apply_rope, check_head_dim, rope_tables
from ..errors import OptionError
from ..validate import check_int

__all__ = ["PermutationDemo", "permutation_demo"]


@dataclass(frozen=True)
class PermutationDemo:
    """What :func:`permutation_demo` measured.

    Attributes:
        perm: the permutation applied to the tokens.
        without_rope: ``max |attn(P x) - P attn(x)|`` with no positions: ~1e-16, the outputs just move with the
            tokens (attention cannot tell the order).
        with_rope: the same with RoPE on queries and keys: far from 0, the outputs change, not just move.
        n, d: sequence length and width.
    """

    perm: tuple[int, ...]
    without_rope: float
    with_rope: float
    n: int
    d: int

    def text(self, lang: str = "en") -> str:
        """A few plain lines saying what was measured and what it means, in ``lang`` ("en" or "zh")."""
        from .i18n import tr

        return "\n".join(
            (
                tr("perm.tokens", lang, n=self.n, d=self.d, perm=list(self.perm)),
                tr("perm.without", lang, x=f"{self.without_rope:.1e}"),
                tr("perm.with", lang, x=f"{self.with_rope:.1e}"),
            )
        )


def permutation_demo(
    n: int = 6, d: int = 8, *, seed: int = 0, perm: Any = None, base: float = 10000.0
) -> PermutationDemo:
    """Show §16: permuting the tokens permutes attention's outputs, unless positions (RoPE) are added.

    Random tokens ``x [n, d]`` and projections ``W_Q, W_K, W_V [d, d]`` (seeded), full (non-causal)
    self-attention computed by :func:`attnlab.scaled_dot_product_attention` in float64.

    Args:
        n: number of tokens (>= 2).
        d: width (even, for RoPE).
        seed: seed of the random tokens, weights and (when ``perm`` is None) permutation.
        perm: a permutation of ``range(n)``; default a random one that moves every token it can.
        base: RoPE frequency base.

    >>> r = permutation_demo()
    >>> r.without_rope < 1e-12, r.with_rope > 1e-3
    (True, True)
    """
    n = check_int("n", n, minimum=2)  # one token cannot be permuted
    d = check_head_dim(d, "d")
    rng = np.random.default_rng(seed)
    if perm is None:
        p = rng.permutation(n)
        while n > 1 and np.array_equal(p, np.arange(n)):
            p = rng.permutation(n)
    else:
        p = np.asarray(perm)
        if p.shape != (n,) or not np.array_equal(np.sort(p), np.arange(n)):
            raise OptionError(f"perm: expected a permutation of range({n}), got {np.asarray(perm).tolist()}")
    x = rng.standard_normal((n, d))
    wq, wk, wv = (rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(3))
    tables = rope_tables(np.arange(n), d, base=base, dtype=np.float64)

    def attend(tokens: np.ndarray, rope: bool) -> np.ndarray:
        q, k, v = tokens @ wq, tokens @ wk, tokens @ wv  # [n, d]
        if rope:
            q, k = apply_rope(q, tables), apply_rope(k, tables)
        return scaled_dot_product_attention(q, k, v)  # [n, d]

    diffs = [float(np.max(np.abs(attend(x[p], r) - attend(x, r)[p]))) for r in (False, True)]
    return PermutationDemo(perm=tuple(int(i) for i in p), without_rope=diffs[0], with_rope=diffs[1], n=int(n), d=d)
