"""``attnlab train``: train a one-layer attention model in NumPy with attnlab's own forward and backward.

The task is retrieval from a key-value memory: each example holds a few (key, value) pairs of symbols and one
query key; the model must output the value stored at that key. A single multi-head cross-attention layer reads
the pairs (query from the query key, keys and values from the pairs, padding masked), a linear read-out turns
its output into value logits, and cross-entropy is minimised with Adam. Every gradient comes from
:func:`attnlab.multi_head_backward` (dropout on the attention weights included). Chance is ``ln(n_values)``; a
model that learned to retrieve drives the loss towards 0 and puts its attention on the matching key.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "RetrievalBatch",
    "TrainResult",
    "add_arguments",
    "check_args",
    "make_batch",
    "report_text",
    "run",
    "train_retrieval",
]

NAME = "train"
HELP = "train a one-layer attention model (NumPy, attnlab's own backward) on a key-value retrieval task"


@dataclass(frozen=True)
class RetrievalBatch:
    """A batch of the task. Shapes: ``x_q [B, 1, d]``, ``x_kv [B, n_pairs, d]``, ``mask [B, 1, 1, n_pairs]``,
    ``keys``/``values [B, n_pairs]`` symbol ids, ``target [B]`` the value to output, ``where [B]`` its pair."""

    x_q: np.ndarray
    x_kv: np.ndarray
    mask: np.ndarray
    keys: np.ndarray
    values: np.ndarray
    lengths: np.ndarray
    target: np.ndarray
    where: np.ndarray


def make_batch(rng: np.random.Generator, batch: int, n_pairs: int, n_keys: int, n_values: int) -> RetrievalBatch:
    """Random examples: 2..n_pairs distinct keys (the rest is padding), random values, one queried key.

    Each pair is encoded as ``[one_hot(key, n_keys), one_hot(value, n_values)]`` and the query as
    ``[one_hot(key, n_keys), 0]``, so ``d = n_keys + n_values``.
    """
    from .. import masks

    d = n_keys + n_values
    keys = np.stack([rng.permutation(n_keys)[:n_pairs] for _ in range(batch)])  # [B, n_pairs], distinct per row
    values = rng.integers(0, n_values, size=(batch, n_pairs))
    lengths = rng.integers(2, n_pairs + 1, size=batch)
    where = (rng.random(batch) * lengths).astype(np.int64)  # a real (unpadded) pair
    rows = np.arange(batch)
    x_kv = np.zeros((batch, n_pairs, d))
    x_kv[rows[:, None], np.arange(n_pairs)[None, :], keys] = 1.0
    x_kv[rows[:, None], np.arange(n_pairs)[None, :], n_keys + values] = 1.0
    x_q = np.zeros((batch, 1, d))
    x_q[rows, 0, keys[rows, where]] = 1.0
    return RetrievalBatch(
        x_q=x_q,
        x_kv=x_kv,
        mask=masks.key_padding(lengths, n_pairs),
        keys=keys,
        values=values,
        lengths=lengths,
        target=values[rows, where],
        where=where,
    )


@dataclass(frozen=True)
class TrainResult:
    """The training run: ``losses`` per step, the held-out loss/accuracy/attention on the right pair, a sample."""

    losses: tuple[float, ...]
    chance: float
    eval_loss: float
    eval_accuracy: float
    eval_attention_on_target: float
    sample: RetrievalBatch = field(repr=False)
    sample_weights: np.ndarray = field(repr=False)  # [1, h, 1, n_pairs]
    sample_prediction: int = 0


def _forward(params, batch, *, training, rng, dropout_p):
    from ..core.multihead import multi_head_attention

    r = multi_head_attention(
        batch.x_q,
        batch.x_kv,
        params["attn"],
        batch.mask,
        dropout_p=dropout_p,
        rng=rng,
        training=training,
    )
    logits = r.output[:, 0] @ params["w_r"] + params["b_r"]  # [B, n_values]
    logits = logits - logits.max(axis=-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    loss = -float(logp[np.arange(len(batch.target)), batch.target].mean())
    return r, logp, loss


def train_retrieval(
    *,
    steps: int = 600,
    batch: int = 64,
    n_pairs: int = 8,
    n_keys: int = 16,
    n_values: int = 16,
    num_heads: int = 2,
    head_dim: int = 8,
    lr: float = 0.02,
    dropout_p: float = 0.1,
    seed: int = 0,
) -> TrainResult:
    """Train the one-layer model with Adam and evaluate it on fresh examples (dropout off).

    >>> r = train_retrieval(steps=5, batch=8)
    >>> len(r.losses), round(r.chance, 4)
    (5, 2.7726)
    """
    from ..core.multihead import MultiHeadWeights, init_multi_head, multi_head_backward
    from ..errors import OptionError
    from ..validate import check_float, check_int

    steps, batch = check_int("steps", steps, minimum=1), check_int("batch", batch, minimum=1)
    n_pairs = check_int("n_pairs", n_pairs, minimum=2)
    n_keys = check_int("n_keys", n_keys, minimum=n_pairs)
    n_values = check_int("n_values", n_values, minimum=2)
    num_heads, head_dim = check_int("num_heads", num_heads, minimum=1), check_int("head_dim", head_dim, minimum=1)
    lr = check_float("lr", lr, positive=True)
    dropout_p = check_float("dropout_p", dropout_p, minimum=0.0)
    if dropout_p >= 1:
        raise OptionError(f"dropout_p: expected 0 <= dropout_p < 1, got {dropout_p!r} (1 would drop every weight)")
    seed = check_int("seed", seed, minimum=0)
    rng = np.random.default_rng(seed)
    d = n_keys + n_values
    attn = init_multi_head(d, num_heads, head_dim=head_dim, rng=rng)
    params: dict[str, Any] = {
        "attn": attn,
        "w_r": rng.normal(0, 1 / math.sqrt(d), (d, n_values)),
        "b_r": np.zeros(n_values),
    }
    names = list(attn.arrays())
    flat = {**{n: a.copy() for n, a in attn.arrays().items()}, "w_r": params["w_r"], "b_r": params["b_r"]}
    m = {n: np.zeros_like(a) for n, a in flat.items()}
    v = {n: np.zeros_like(a) for n, a in flat.items()}
    b1, b2, eps = 0.9, 0.999, 1e-8
    losses = []
    for step in range(1, steps + 1):
        data = make_batch(rng, batch, n_pairs, n_keys, n_values)
        r, logp, loss = _forward(params, data, training=True, rng=rng, dropout_p=dropout_p)
        losses.append(loss)
        dlogits = np.exp(logp)  # softmax - one_hot, averaged over the batch
        dlogits[np.arange(batch), data.target] -= 1.0
        dlogits /= batch
        d_out = np.zeros_like(r.output)
        d_out[:, 0] = dlogits @ params["w_r"].T
        g = multi_head_backward(r, d_out)
        grads = {
            **{n: getattr(g.weights, n) for n in names},
            "w_r": r.output[:, 0].T @ dlogits,
            "b_r": dlogits.sum(axis=0),
        }
        for n, gr in grads.items():
            m[n] = b1 * m[n] + (1 - b1) * gr
            v[n] = b2 * v[n] + (1 - b2) * gr**2
            flat[n] = flat[n] - lr * (m[n] / (1 - b1**step)) / (np.sqrt(v[n] / (1 - b2**step)) + eps)
        params = {
            "attn": MultiHeadWeights(**{n: flat[n] for n in names}, num_heads=num_heads, head_dim=head_dim),
            "w_r": flat["w_r"],
            "b_r": flat["b_r"],
        }

    test = make_batch(np.random.default_rng(seed + 1), 512, n_pairs, n_keys, n_values)
    r, logp, eval_loss = _forward(params, test, training=False, rng=None, dropout_p=dropout_p)
    acc = float((logp.argmax(axis=-1) == test.target).mean())
    on_target = float(r.weights[np.arange(512), :, 0, test.where].mean())  # mean over heads of the right pair's weight
    sample = make_batch(np.random.default_rng(seed + 2), 1, n_pairs, n_keys, n_values)
    rs, lps, _ = _forward(params, sample, training=False, rng=None, dropout_p=dropout_p)
    return TrainResult(
        losses=tuple(losses),
        chance=math.log(n_values),
        eval_loss=eval_loss,
        eval_accuracy=acc,
        eval_attention_on_target=on_target,
        sample=sample,
        sample_weights=rs.weights,
        sample_prediction=int(lps.argmax()),
    )


def _bar(w: float, width: int = 20) -> str:
    n = round(w * width)
    return "█" * n + "·" * (width - n)


def report_text(r: TrainResult, *, every: int = 50) -> str:
    """The run as text: the loss every ``every`` steps, the held-out numbers, one example's attention."""
    lines = [f"chance loss ln(n_values) = {r.chance:.3f}; loss at step 1: {r.losses[0]:.4f}"]
    for i in range(0, len(r.losses), every):
        chunk = r.losses[i : i + every]
        lines.append(f"steps {i + 1:5d}-{i + len(chunk):5d}  mean loss {np.mean(chunk):.4f}")
    lines += [
        f"held-out (dropout off): loss {r.eval_loss:.4f}, accuracy {r.eval_accuracy:.3f}, "
        f"attention on the queried pair {r.eval_attention_on_target:.3f}",
        "",
        "one held-out example: the query asks for key "
        f"k{r.sample.keys[0, r.sample.where[0]]}; the model answers v{r.sample_prediction} "
        f"(stored: v{r.sample.target[0]})",
    ]
    h = r.sample_weights.shape[1]
    header = "  pair  key  value  " + "  ".join(f"head {i}".ljust(26) for i in range(h))
    lines.append(header)
    for j in range(r.sample.keys.shape[1]):
        pad = j >= r.sample.lengths[0]
        mark = "◀ queried" if j == r.sample.where[0] else ("(padding)" if pad else "")
        cells = "  ".join(
            f"{_bar(float(r.sample_weights[0, i, 0, j]))} {r.sample_weights[0, i, 0, j]:.2f}  " for i in range(h)
        )
        lines.append(f"  {j:4d}  k{r.sample.keys[0, j]:<3d} v{r.sample.values[0, j]:<4d}  {cells}{mark}")
    return "\n".join(lines) + "\n"


#: The most numbers one batch of the task may hold (``max(B, 512) · pairs · (keys + values + 8·heads)``, the eval
#: batch is 512): 2^26, 512 MiB of float64 per array.
MAX_BATCH_NUMBERS = 2**26


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The retrieval task's sizes (``--pairs``, ``--keys``, ``--values``, ``--heads``) and the training run's
    options (``--steps``, ``--batch``, ``--seed``, ``--every``)."""
    from ..argtypes import float_type, int_type, probability

    count = int_type(minimum=1)
    two = int_type(minimum=2)
    parser.add_argument("--steps", type=count, default=600, help="training steps (default 600)")
    parser.add_argument("--batch", type=count, default=64, help="examples per step (default 64)")
    parser.add_argument("--pairs", type=two, default=8, help="key-value pairs per example (>= 2, default 8)")
    parser.add_argument("--keys", type=two, default=16, help="key symbols (>= pairs, default 16)")
    parser.add_argument("--values", type=two, default=16, help="value symbols (>= 2, default 16)")
    parser.add_argument("--heads", type=count, default=2, help="attention heads (default 2)")
    parser.add_argument(
        "--lr",
        type=float_type(positive=True, maximum=1.0, expected="a finite number in (0, 1]"),
        default=0.02,
        help="Adam learning rate, in (0, 1] (default 0.02)",
    )
    parser.add_argument(
        "--dropout", type=probability, default=0.1, help="dropout on attention weights, in [0, 1) (default 0.1)"
    )
    parser.add_argument("--seed", type=int_type(minimum=0), default=0, help="random seed, >= 0 (default 0)")
    parser.add_argument("--every", type=count, default=50, help="print the mean loss every N steps (default 50)")


def check_args(args: argparse.Namespace) -> None:
    """--pairs <= --keys (each example's keys are distinct) and a batch that fits in memory, before training."""
    from ..errors import OptionError

    if args.keys < args.pairs:
        raise OptionError(
            f"--keys: expected an int >= --pairs={args.pairs} (each example's keys differ), got {args.keys}"
        )
    numbers = max(args.batch, 512) * args.pairs * (args.keys + args.values + 8 * args.heads)
    if numbers > MAX_BATCH_NUMBERS:
        raise OptionError(
            f"--batch, --pairs, --keys, --values, --heads: one batch would hold max(batch, 512)·pairs·(keys + values "
            f"+ 8·heads) = {numbers} numbers; at most {MAX_BATCH_NUMBERS} (512 MiB of float64)"
        )


#: train_retrieval's keyword -> the option that sets it (``--every`` is the report's)
FLAGS = {"steps": "--steps", "batch": "--batch", "n_pairs": "--pairs", "n_keys": "--keys", "n_values": "--values",
         "num_heads": "--heads", "lr": "--lr", "dropout_p": "--dropout", "seed": "--seed"}  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Train with :func:`train_retrieval` and print :func:`report_text`; returns 0."""
    from ..argtypes import keywords

    result = train_retrieval(**keywords(args, FLAGS))
    sys.stdout.write(report_text(result, every=args.every))
    return 0
