"""``attnlab heatmap``: draw attention weights (rows = queries, columns = keys) to a PNG, SVG or PDF file.

Where the weights come from is a *source*: a function ``(args) -> HeatmapData``. Today: the inputs of
``attnlab explain`` (a named example or your Q, K, V) and ``--weights FILE`` (saved weights ``[n_q, n_k]`` or
``[h, n_q, n_k]``). A new source (e.g. a real model) adds its options in :func:`add_arguments`, a loader, an entry
in :data:`SOURCES` and a line in :func:`source_name`.

Examples::

    attnlab heatmap causal-4 -o causal4.png
    attnlab heatmap --q q.npy --k k.npy --v v.npy --causal --tokens "the cat sat" -o cat.svg
    attnlab heatmap 2x2-causal --kind last-row -o last.png
    attnlab heatmap --kind growth -o growth.pdf
    attnlab heatmap --model smollm2 --text "The capital of France is" --layer 3 --head 0 -o smol.png
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..explain.args import add_input_arguments, examples_listing

NAME = "heatmap"
HELP = "draw attention weights as a heatmap (PNG, SVG or PDF)"

KINDS = ("weights", "last-row", "mask", "growth")


@dataclass(frozen=True)
class HeatmapData:
    """What a source hands to the drawing: ``weights [n_q, n_k]`` or ``[h, n_q, n_k]``, the mask ``allowed``
    (bool, broadcastable to the weights, or None) and the labels."""

    weights: np.ndarray
    allowed: np.ndarray | None
    query_labels: tuple[str, ...] | None
    key_labels: tuple[str, ...] | None
    title: str
    head_names: tuple[str, ...] | None = None


def from_inputs(args: argparse.Namespace) -> HeatmapData:
    """Weights computed by attnlab's core from a named example or the user's Q, K, V (as ``explain`` reads them)."""
    from ..explain import explain_example
    from ..explain.args import setup_from_args

    setup = setup_from_args(args)
    if isinstance(setup, str):  # weighted-average, saturation: given weights / softmax rows
        e = explain_example(setup)
        last = e.steps[-1]  # the weights step (saturation: rows are the logit vectors) or the output step
        rows = last.rows if last.key == "weights" else None
        cols = last.cols if last.key == "weights" else None
        return HeatmapData(np.asarray(e.weights), None, rows, cols, e.title)
    t = setup.trace()
    return HeatmapData(np.asarray(t.weights), np.asarray(t.allowed), setup.query_labels, setup.key_labels, setup.title)


def from_weights_file(args: argparse.Namespace) -> HeatmapData:
    """Weights saved earlier (``.npy``/``.json``/``.csv``: ``[n_q, n_k]``, or ``.npy`` ``[h, n_q, n_k]``)."""
    from ..errors import ShapeError
    from ..explain.args import labels_from_args
    from ..explain.inputs import load_matrix

    path = args.weights
    if path.lower().endswith(".npy"):
        w = np.load(path, allow_pickle=False)
        if w.ndim not in (2, 3):
            raise ShapeError(f"--weights: expected [n_q, n_k] or [h, n_q, n_k], got shape {w.shape}")
        w = w.astype(np.float64)
    else:
        w = load_matrix(path, "--weights")
    n_q, n_k = w.shape[-2:]
    ql, kl = labels_from_args(args, n_q, n_k)
    allowed = None
    if args.mask is not None:
        from ..explain.inputs import load_mask

        allowed = load_mask(args.mask, "--mask", convention=args.mask_convention)
    return HeatmapData(w, allowed, ql, kl, f"weights from {path}")


def from_model(args: argparse.Namespace) -> HeatmapData:
    """A real model's attention on ``--text`` (SmolLM2 or MiniLM): one head, or every head of ``--layer``."""
    from ..models.interventions import attention_maps

    if not args.text:
        raise ValueError("--text: give the prompt/sentence whose attention --model should draw")
    m = attention_maps(args.model, args.text, layer=args.layer, head=args.head)
    return HeatmapData(m.weights, m.allowed, m.labels, m.labels, m.title, m.head_names)


#: source name -> loader. Add a source here (and in :func:`source_name`).
SOURCES: dict[str, Callable[[argparse.Namespace], HeatmapData]] = {
    "inputs": from_inputs,
    "weights": from_weights_file,
    "model": from_model,
}


def source_name(args: argparse.Namespace) -> str:
    """Which source the options ask for."""
    if getattr(args, "model", None):
        return "model"
    return "weights" if getattr(args, "weights", None) else "inputs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser)
    s = parser.add_argument_group("other sources")
    s.add_argument(
        "--weights", metavar="FILE", help="draw saved weights: .npy [n_q, n_k] or [h, n_q, n_k], .json, .csv"
    )
    s.add_argument("--model", choices=("smollm2", "minilm"), help="draw a real model's attention on --text")
    s.add_argument("--text", help="--model: the prompt (SmolLM2) or sentence (MiniLM); its tokens label the axes")
    s.add_argument("--layer", type=int, default=0, help="--model: layer (negative counts from the end; default 0)")
    s.add_argument("--head", type=int, default=None, help="--model: one head (default: a grid of every head)")
    o = parser.add_argument_group("picture")
    o.add_argument("-o", "--output", default="attention.png", help="file to write: .png, .svg or .pdf (attention.png)")
    o.add_argument(
        "--kind",
        choices=KINDS,
        default="weights",
        help="weights (heatmap; one panel per head for [h, n_q, n_k]), last-row (bar chart of the last query), "
        "mask, growth (the T² plot)",
    )
    o.add_argument("--title", help="figure title")
    o.add_argument("--values", action=argparse.BooleanOptionalAction, default=None, help="write weights in cells")
    o.add_argument("--dpi", type=int, default=150, help="resolution of PNGs (150)")


def _figure(kind: str, d: HeatmapData | None, args: argparse.Namespace) -> Any:
    from .. import plot

    if kind == "growth":
        return plot.growth_plot()
    assert d is not None
    w = d.weights
    if kind == "mask":
        if d.allowed is None:
            allowed = np.ones(w.shape[-2:], dtype=bool)
        else:
            allowed = np.broadcast_to(d.allowed, w.shape)[0] if w.ndim == 3 else np.broadcast_to(d.allowed, w.shape)
        return plot.mask_picture(allowed, query_labels=d.query_labels, key_labels=d.key_labels, title=args.title)
    if kind == "last-row":
        w2 = w[0] if w.ndim == 3 else w
        allowed = None if d.allowed is None else np.broadcast_to(d.allowed, w.shape)
        if allowed is not None and allowed.ndim == 3:
            allowed = allowed[0]
        ql = d.query_labels[-1] if d.query_labels else None
        return plot.last_row_bar(w2, allowed, key_labels=d.key_labels, query_label=ql, title=args.title)
    if w.ndim == 3:
        return plot.head_grid(
            w,
            d.allowed,
            query_labels=d.query_labels,
            key_labels=d.key_labels,
            head_names=d.head_names,
            title=args.title or d.title,
            values=args.values,
        )
    return plot.heatmap(
        w,
        d.allowed,
        query_labels=d.query_labels,
        key_labels=d.key_labels,
        title=args.title or d.title,
        values=args.values,
    )


def run(args: argparse.Namespace) -> int:
    from .. import plot
    from ..errors import AttnlabError, MaskedRowError

    if args.list:
        sys.stdout.write(examples_listing())
        return 0
    try:
        data = None
        if args.kind != "growth":
            src = source_name(args)
            if src == "inputs" and args.example is None and not any((args.q, args.k, args.v, args.inputs)):
                sys.stderr.write(
                    "attnlab heatmap: error: give a named example (see --list), --q/--k/--v or --weights\n"
                )
                return 2
            data = SOURCES[src](args)
        fig = _figure(args.kind, data, args)
        path = plot.save(fig, args.output, dpi=args.dpi)
    except (AttnlabError, ValueError, KeyError, FileNotFoundError) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        if isinstance(err, MaskedRowError):
            msg += " (on the command line: --masked-rows zero or --masked-rows nan)"
        sys.stderr.write(f"attnlab heatmap: error: {msg}\n")
        return 1
    sys.stdout.write(f"wrote {path}\n")
    return 0
