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

from ..argtypes import index_in, input_file, int_type, output_file, text_type
from ..explain.args import add_input_arguments, add_lang_argument, examples_listing

__all__ = [
    "LESSON_PICTURES",
    "HeatmapData",
    "add_arguments",
    "check_args",
    "from_inputs",
    "from_model",
    "from_weights_file",
    "run",
    "source_name",
]

NAME = "heatmap"
HELP = "draw attention weights as a heatmap (PNG, SVG or PDF)"

KINDS = ("weights", "last-row", "mask", "growth")

#: ``--dpi`` at least (below it FreeType cannot size the smallest labels) and at most (a 10-inch figure is then
#: 12000 pixels wide).
MIN_DPI, MAX_DPI = 10, 1200
#: A PNG may have at most this many pixels per side (matplotlib's limit is 2^16) and in all (256 MiB of RGBA).
MAX_SIDE, MAX_PIXELS = 2**16 - 1, 2**26

OUTPUT = output_file((".png", ".svg", ".pdf"))


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
    kind: str | None = None  # the picture a lesson asks for when it is not --kind's (growth, mask)


#: How a lesson without Q, K, V of its own (:data:`attnlab.articles.LESSONS`) is drawn: the steps of its explanation
#: that hold its weights (two: one picture per head), or another picture ("growth": the T² growth for the lessons
#: about sizes; "mask": the causal mask the leak test checks).
LESSON_PICTURES: dict[str, tuple[str, ...] | str] = {
    "variance": ("saturation",),
    "fp16-mask": ("causal",),
    "multi-head": ("head0", "head1"),
    "mask-not-access": ("weights",),
    "leak-test": "mask",
    "growth": "growth",
    "complexity": "growth",
    "long-context": "growth",
}


def from_inputs(args: argparse.Namespace) -> HeatmapData:
    """Weights computed by attnlab's core from a named example or the user's Q, K, V (as ``explain`` reads them)."""
    from ..explain import explain_example
    from ..explain.args import setup_from_args

    setup = setup_from_args(args)
    if isinstance(setup, str):  # weighted-average, saturation: given weights / softmax rows; the lessons
        e = explain_example(setup, lang=args.lang)
        picture = LESSON_PICTURES.get(setup)
        if picture == "growth":
            return HeatmapData(np.zeros((1, 1)), None, None, None, e.title, kind="growth")
        if picture == "mask":
            from .. import masks

            return HeatmapData(np.ones((3, 3)), masks.causal(3), None, None, e.title, kind="mask")
        if picture is not None:
            steps = [next(s for s in e.steps if s.key == key) for key in picture]
            w = np.stack([np.asarray(s.matrix, dtype=np.float64) for s in steps])  # [h, n_q, n_k]
            return HeatmapData(w if len(steps) > 1 else w[0], None, steps[0].rows, steps[0].cols, e.title)
        last = e.steps[-1]  # the weights step (saturation: rows are the logit vectors) or the output step
        rows = last.rows if last.key == "weights" else None
        cols = last.cols if last.key == "weights" else None
        return HeatmapData(np.asarray(e.weights), None, rows, cols, e.title)
    t = setup.trace()
    from ..i18n import tr

    title = setup.title if args.example is not None else tr("label.your_matrices", args.lang)
    return HeatmapData(np.asarray(t.weights), np.asarray(t.allowed), setup.query_labels, setup.key_labels, title)


def from_weights_file(args: argparse.Namespace) -> HeatmapData:
    """Weights saved earlier (``.npy``/``.json``/``.csv``: ``[n_q, n_k]``, or ``.npy`` ``[h, n_q, n_k]``)."""
    from ..errors import DTypeError, NonFiniteError, ShapeError
    from ..explain.args import labels_from_args, read_source
    from ..explain.inputs import load_matrix

    path = args.weights
    if path.lower().endswith(".npy"):
        w = read_source("--weights", path, np.load, allow_pickle=False)
        if w.ndim not in (2, 3):
            raise ShapeError(f"--weights: expected [n_q, n_k] or [h, n_q, n_k], got shape {w.shape}")
        if w.dtype == np.bool_ or not np.issubdtype(w.dtype, np.number) or np.iscomplexobj(w):
            raise DTypeError(f"--weights: expected real numbers, got dtype {w.dtype}")
        w = w.astype(np.float64)
    else:
        w = read_source("--weights", path, load_matrix, "--weights")
    if not np.isfinite(w).all():
        raise NonFiniteError(f"--weights: {int((~np.isfinite(w)).sum())} entries are NaN or infinite")
    n_q, n_k = w.shape[-2:]
    ql, kl = labels_from_args(args, n_q, n_k)
    allowed = None
    if args.mask is not None:
        from ..explain.inputs import load_mask

        allowed = read_source("--mask", args.mask, load_mask, "--mask", convention=args.mask_convention)
    from ..i18n import tr

    return HeatmapData(w, allowed, ql, kl, tr("plot.from_file", args.lang, path=path))


def from_model(args: argparse.Namespace) -> HeatmapData:
    """A real model's attention on ``--text`` (SmolLM2 or MiniLM): one head, or every head of ``--layer``."""
    from ..models.interventions import attention_maps

    if args.model == "smollm2":
        from ..models.gguf import load_smollm2

        model: Any = load_smollm2()
        name = "SmolLM2-135M"
    else:
        from ..models.minilm import MiniLM

        model = MiniLM.load()
        name = "all-MiniLM-L6-v2"
    # the ranges are known once the model is loaded: checked before its forward pass
    layer = index_in("--layer", args.layer, model.config.num_layers, f"layers of {name}")
    head = index_in("--head", args.head, model.config.num_heads, f"heads of {name}")
    m = attention_maps(args.model, args.text, layer=layer or 0, head=head, model_obj=model)
    from ..i18n import tr  # the title and head names in the figure's language (attention_maps writes English)

    n_layers, n_heads = model.config.num_layers, model.config.num_heads
    if head is None:
        title = tr("plot.title.model_layer", args.lang, name=name, layer=(layer or 0) % n_layers, h=n_heads)
    else:
        title = tr("plot.title.model_head", args.lang, name=name, layer=(layer or 0) % n_layers, head=head % n_heads)
    return HeatmapData(m.weights, m.allowed, m.labels, m.labels, title)  # head names: the figure's own "head i"


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


def add_arguments(parser: argparse.ArgumentParser, lang: str = "en") -> None:
    """heatmap's options, with their help in ``lang`` (the command line's language: :func:`attnlab.i18n.cli_lang`)."""
    from ..i18n import help_for, localize_type, tr

    h = help_for("help.heatmap", lang)

    def mv(key: str) -> str | None:  # argparse's default metavar (the option's name) in English
        return None if lang == "en" else tr(f"help.metavar.{key}", lang)

    add_input_arguments(parser, lang)
    s = parser.add_argument_group(h("group.sources"))
    file = localize_type(input_file, lang, "argtype.file")
    s.add_argument("--weights", type=file, metavar=tr("help.metavar.file", lang), help=h("weights"))
    models = ("smollm2", "minilm")
    s.add_argument(
        "--model", choices=models, type=localize_type(None, lang, "argtype.choice", choices=models), help=h("model")
    )
    s.add_argument("--text", type=localize_type(text_type, lang, "argtype.text"), metavar=mv("text"), help=h("text"))
    index = localize_type(int_type(minimum=0), lang, "argtype.int", lo=0)
    s.add_argument("--layer", type=index, default=None, metavar=mv("n"), help=h("layer"))
    s.add_argument("--head", type=index, default=None, metavar=mv("n"), help=h("head"))
    o = parser.add_argument_group(h("group.picture"))
    output = localize_type(OUTPUT, lang, "argtype.output", suffixes=".png, .svg, .pdf")
    o.add_argument("-o", "--output", type=output, default=None, metavar=mv("file"), help=h("output"))
    kind = localize_type(None, lang, "argtype.choice", choices=KINDS)
    o.add_argument("--kind", choices=KINDS, type=kind, default="weights", help=h("kind"))
    o.add_argument("--title", metavar=mv("title"), help=h("title"))
    o.add_argument("--values", action=argparse.BooleanOptionalAction, default=None, help=h("values"))
    o.add_argument(
        "--dpi",
        type=localize_type(
            int_type(minimum=MIN_DPI, maximum=MAX_DPI), lang, "argtype.int_range", lo=MIN_DPI, hi=MAX_DPI
        ),
        default=150,
        metavar=mv("n"),
        help=h("dpi", lo=MIN_DPI, hi=MAX_DPI),
    )
    add_lang_argument(o, lang)


def _figure(kind: str, d: HeatmapData | None, args: argparse.Namespace) -> Any:
    from .. import plot

    if kind == "growth":
        return plot.growth_plot(lang=args.lang)
    assert d is not None
    w = d.weights
    if kind == "mask":
        if d.allowed is None:
            allowed = np.ones(w.shape[-2:], dtype=bool)
        else:
            allowed = np.broadcast_to(d.allowed, w.shape)[0] if w.ndim == 3 else np.broadcast_to(d.allowed, w.shape)
        return plot.mask_picture(
            allowed, query_labels=d.query_labels, key_labels=d.key_labels, title=args.title, lang=args.lang
        )
    if kind == "last-row":
        w2 = w[0] if w.ndim == 3 else w
        row_allowed = None if d.allowed is None else np.broadcast_to(d.allowed, w.shape)
        if row_allowed is not None and row_allowed.ndim == 3:
            row_allowed = row_allowed[0]
        ql = d.query_labels[-1] if d.query_labels else None
        return plot.last_row_bar(
            w2, row_allowed, key_labels=d.key_labels, query_label=ql, title=args.title, lang=args.lang
        )
    if w.ndim == 3:
        return plot.head_grid(
            w,
            d.allowed,
            query_labels=d.query_labels,
            key_labels=d.key_labels,
            head_names=d.head_names,
            title=args.title or d.title,
            values=args.values,
            lang=args.lang,
        )
    return plot.heatmap(
        w,
        d.allowed,
        query_labels=d.query_labels,
        key_labels=d.key_labels,
        title=args.title or d.title,
        values=args.values,
        lang=args.lang,
    )


def check_args(args: argparse.Namespace) -> None:
    """One source, its options only with it, and a file to write, before anything is computed or drawn."""
    from ..errors import OptionError
    from ..i18n import localized

    if args.list:
        return
    if args.output is None:
        try:
            args.output = OUTPUT("attention.png")
        except argparse.ArgumentTypeError as err:
            raise OptionError(f"--output: {err}") from None
    inputs = [f for f, v in (("EXAMPLE", args.example), ("--q", args.q), ("--k", args.k), ("--v", args.v)) if v]
    inputs += ["--inputs"] if args.inputs else []
    given = [*inputs[:1], *(["--weights"] if args.weights else []), *(["--model"] if args.model else [])]
    if args.kind == "growth":
        if given:
            raise localized(OptionError, "heatmap.growth_input", flag=given[0])
        return
    if len(given) > 1:
        raise localized(OptionError, "heatmap.one_source", a=given[1], b=given[0])
    if not given:
        raise localized(OptionError, "heatmap.no_source")
    for flag, value in (("--text", args.text), ("--layer", args.layer), ("--head", args.head)):
        if value is not None and not args.model:
            raise localized(OptionError, "heatmap.model_only", flag=flag)
    if args.model and not args.text:
        raise localized(OptionError, "heatmap.need_text")


def _check_size(fig: Any, dpi: int) -> None:
    """The picture's pixels at ``dpi`` within :data:`MAX_SIDE` and :data:`MAX_PIXELS`, before it is drawn."""
    from ..errors import OptionError

    w_in, h_in = (float(x) for x in fig.get_size_inches())
    w, h = round(w_in * dpi), round(h_in * dpi)
    if max(w, h) > MAX_SIDE or w * h > MAX_PIXELS:
        most = int(min(MAX_SIDE / max(w_in, h_in), (MAX_PIXELS / (w_in * h_in)) ** 0.5))
        raise OptionError(
            f"--dpi: {dpi} dpi makes this {w_in:.3g} x {h_in:.3g} inch figure {w} x {h} pixels; at most "
            f"{MAX_SIDE} per side and {MAX_PIXELS} in all (use --dpi {most} or less)"
        )


def run(args: argparse.Namespace) -> int:
    """Compute the weights the parsed ``args`` name (an example, matrices, a weights file or a model's layer and
    head) and write the heatmap file; returns 0."""
    from .. import plot
    from ..errors import MaskedRowError, OptionError

    if args.list:
        sys.stdout.write(examples_listing(args.lang))
        return 0
    try:
        data = None if args.kind == "growth" else SOURCES[source_name(args)](args)
    except MaskedRowError as err:
        from ..i18n import error_message, localized, tr

        raise localized(
            MaskedRowError,
            "heatmap.masked_row",
            msg=error_message(err, args.lang),
            hint=tr("cli.masked_rows_hint", args.lang),
        ) from None
    fig = _figure(data.kind if data is not None and data.kind else args.kind, data, args)
    _check_size(fig, args.dpi)
    try:
        path = plot.save(fig, args.output, dpi=args.dpi)
    except OSError as err:  # the folder was checked when parsing; it can still refuse (full disk, read-only mount)
        raise OptionError(f"--output: cannot write {args.output!r}: {err.strerror or err}") from None
    from ..i18n import tr

    sys.stdout.write(tr("heatmap.wrote", args.lang, path=path) + "\n")
    return 0
