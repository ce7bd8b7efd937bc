"""``attnlab demo``: the articles' 2×2 example, full and causal, every step from scores to output."""

from __future__ import annotations

import argparse
import sys

import numpy as np

__all__ = ["add_arguments", "demo_text", "run"]

NAME = "demo"
HELP = "the articles' 2×2 example, full and causal, step by step"


def _fmt(a: np.ndarray, digits: int = 4) -> str:
    return np.array2string(np.asarray(a, dtype=np.float64), precision=digits, floatmode="maxprec", suppress_small=True)


def demo_text() -> str:
    """The demo's text: Q, K, V, scores, logits, mask, weights, row sums and output of both examples."""
    from .. import masks
    from ..articles import example
    from ..core import attention_trace

    lines = []
    for name in ("2x2", "2x2-causal"):
        ex = example(name)
        assert ex.q is not None and ex.k is not None and ex.v is not None  # the two examples have arrays
        t = attention_trace(ex.q, ex.k, ex.v, causal=ex.causal)
        lines += [
            f"{ex.title}  [article {ex.source}]",
            f"Q =\n{_fmt(ex.q)}",
            f"K =\n{_fmt(ex.k)}",
            f"V =\n{_fmt(ex.v)}",
            f"scores = Q Kᵀ =\n{_fmt(t.scores)}",
            f"logits = scores / sqrt(d_k={ex.q.shape[-1]}) =\n{_fmt(t.logits)}",
        ]
        if ex.causal:
            lines.append(f"mask (■ may attend, ⬚ blocked) =\n{masks.to_string(t.allowed)}")
        lines += [
            f"weights = softmax(logits) per row =\n{_fmt(t.weights)}",
            f"row sums = {_fmt(t.weights.sum(axis=-1))}",
            f"output = weights @ V =\n{_fmt(t.output, 4)}",
            "",
        ]
    lines.append("(The article prints 6.604 and 13.396: it multiplies V by the weights rounded to 0.3302, 0.6698.)")
    return "\n".join(lines).rstrip() + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``demo`` takes no options."""


def run(args: argparse.Namespace) -> int:
    """Print :func:`demo_text`; returns 0."""
    sys.stdout.write(demo_text())
    return 0
