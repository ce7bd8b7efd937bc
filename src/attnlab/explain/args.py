"""Command-line inputs shared by ``attnlab explain`` and ``attnlab heatmap`` (a named example or your matrices), and
``attnlab explain``'s own options (:func:`add_explain_arguments`, :func:`parse_explain_args`).

Kept light (NumPy only) because the CLI builds its parser from it before any command runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ..argtypes import float_type, input_file, int_type, probability
from ..articles import EXAMPLES, EXTRA_EXAMPLES, LESSONS
from ..errors import AttnlabError, OptionError, ShapeError
from ..i18n import localize_type, localized

__all__ = [
    "EXAMPLE_NAMES",
    "MISTAKE_NAMES",
    "TEMPERATURE",
    "add_explain_arguments",
    "add_input_arguments",
    "add_lang_argument",
    "examples_listing",
    "labels_from_args",
    "parse_explain_args",
    "read_source",
    "setup_from_args",
]

#: Every name ``attnlab explain`` and ``attnlab heatmap`` accept: the examples, the extra examples, the lessons.
EXAMPLE_NAMES: tuple[str, ...] = (*EXAMPLES, *EXTRA_EXAMPLES, *LESSONS)

#: The classic mistakes ``attnlab explain --mistake`` shows next to the right computation
#: (:data:`attnlab.explain.MISTAKES` describes them).
MISTAKE_NAMES: tuple[str, ...] = ("softmax-then-mask", "no-scale", "sqrt-d-model", "query-axis", "inverted-mask")


def examples_listing(lang: str = "en") -> str:
    """One line per named example and lesson: name, title, source (in ``lang``)."""
    from .i18n import tr

    return (
        "\n".join(
            tr("list.line", lang, name=n, title=tr(f"title.{n}", lang), source=tr(f"source.{n}", lang))
            for n in EXAMPLE_NAMES
        )
        + "\n"
    )


#: ``--temperature``: finite and at least the smallest normal float64, so that ``1/T`` is finite (below it the
#: logits ``x / T`` would be infinite for every x != 0).
TEMPERATURE = float_type(minimum=sys.float_info.min)


def add_input_arguments(p: argparse.ArgumentParser, lang: str = "en") -> None:
    """The options that say what to compute (shared by ``explain`` and ``heatmap``); help and the messages about a
    bad value in ``lang``."""
    from ..i18n import help_for

    h = help_for("help", lang)

    def mv(key: str) -> str | None:  # argparse's default metavar (the option's name) in English
        return None if lang == "en" else h(f"metavar.{key}")

    def pick(*choices: str) -> Any:  # the choice checked with a message in ``lang`` (argparse's own in English)
        return localize_type(None, lang, "argtype.choice", choices=choices)

    p.add_argument(
        "example", nargs="?", metavar=h("metavar.example"), help=h("example", names=", ".join(EXAMPLE_NAMES))
    )
    p.add_argument("--list", action="store_true", help=h("list"))
    g = p.add_argument_group(h("group.own"), h("group.own_desc"))
    g.add_argument("-q", "--q", metavar="Q", help=h("q"))
    g.add_argument("-k", "--k", metavar="K", help=h("k"))
    g.add_argument("-v", "--v", metavar="V", help=h("v"))
    g.add_argument(
        "--inputs", type=localize_type(input_file, lang, "argtype.file"), metavar=h("metavar.file"), help=h("inputs")
    )
    g.add_argument("--tokens", metavar=mv("labels"), help=h("tokens"))
    g.add_argument("--query-tokens", metavar=mv("labels"), help=h("query_tokens"))
    g.add_argument("--key-tokens", metavar=mv("labels"), help=h("key_tokens"))
    m = p.add_argument_group(h("group.masks"))
    m.add_argument("--mask", metavar=mv("mask"), help=h("mask"))
    conventions = ("allow", "block")
    m.add_argument(
        "--mask-convention", choices=conventions, type=pick(*conventions), default="allow", help=h("mask_convention")
    )
    m.add_argument("--causal", action="store_true", help=h("causal"))
    aligns = ("top_left", "bottom_right")
    m.add_argument("--causal-align", choices=aligns, type=pick(*aligns), help=h("causal_align"))
    m.add_argument("--no-causal", action="store_true", help=h("no_causal"))
    m.add_argument("--bias", metavar="B", help=h("bias"))
    m.add_argument(
        "--padding", type=localize_type(int_type(minimum=0), lang, "argtype.int", lo=0), metavar="N", help=h("padding")
    )
    sides = ("right", "left")
    m.add_argument("--padding-side", choices=sides, type=pick(*sides), default="right", help=h("padding_side"))
    m.add_argument(
        "--temperature",
        type=localize_type(TEMPERATURE, lang, "argtype.temperature"),
        default=1.0,
        metavar="T",
        help=h("temperature"),
    )
    number = localize_type(float_type(), lang, "argtype.float")
    m.add_argument("--shift", type=number, default=0.0, metavar="C", help=h("shift"))
    m.add_argument("--scale", type=number, metavar="S", help=h("scale"))
    policies = ("raise", "zero", "nan")
    m.add_argument("--masked-rows", choices=policies, type=pick(*policies), default="raise", help=h("masked_rows"))


def add_lang_argument(p: Any, lang: str = "en") -> None:
    """``--lang en|zh`` (default: the command line's language, ``$ATTNLAB_LANG``; see :func:`attnlab.i18n.cli_lang`)."""
    from .i18n import tr

    langs = ("en", "zh")
    p.add_argument(
        "--lang",
        choices=langs,
        type=localize_type(None, lang, "argtype.choice", choices=langs),
        default=lang,
        help=tr("help.lang", lang, env="ATTNLAB_LANG"),
    )


def labels_from_args(
    args: argparse.Namespace, n_q: int, n_k: int, tokens: Any = None
) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
    """Query and key labels from ``--tokens``, ``--query-tokens`` and ``--key-tokens`` (these win over ``tokens``
    from an inputs file), checked against ``n_q`` and ``n_k``; None where none is given."""
    from .inputs import parse_tokens

    ql = kl = None
    if tokens is not None:
        toks = tuple(tokens)
        if n_q == n_k and len(toks) == n_q:
            ql = kl = toks
        elif len(toks) == n_k:
            kl = toks
        else:
            raise localized(ShapeError, "input.tokens_file", n=len(toks), n_q=n_q, n_k=n_k)
    if args.tokens is not None:
        if n_q != n_k:
            raise localized(ShapeError, "input.tokens_self", n_q=n_q, n_k=n_k)
        ql = kl = parse_tokens(args.tokens, n_q, "--tokens")
    if args.query_tokens is not None:
        ql = parse_tokens(args.query_tokens, n_q, "--query-tokens")
    if args.key_tokens is not None:
        kl = parse_tokens(args.key_tokens, n_k, "--key-tokens")
    return ql, kl


def read_source(flag: str, source: str, load: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``load(source, *args, **kwargs)``, with a file that cannot be read (missing, a folder, no permission, not
    text, a broken .npy) raised as an :class:`~attnlab.errors.OptionError` naming ``flag``."""
    try:
        return load(source, *args, **kwargs)
    except AttnlabError:
        raise
    except FileNotFoundError:
        raise localized(OptionError, "input.file_missing", name=flag, source=source) from None
    except OSError as err:
        raise localized(OptionError, "input.cannot_read", flag=flag, source=source, why=err.strerror or err) from None
    except (ValueError, EOFError) as err:  # UnicodeDecodeError, NumPy's errors for a file that is not .npy
        raise localized(OptionError, "input.cannot_read", flag=flag, source=source, why=err) from None


def _check_sizes(args: argparse.Namespace, n_q: int, n_k: int) -> None:
    if args.padding is not None and args.padding > n_k:
        raise localized(OptionError, "input.padding_range", n_k=n_k, got=args.padding)


def setup_from_args(args: argparse.Namespace) -> Any:
    """A :class:`~attnlab.explain.Setup`, or the name of an example that has none (weighted-average, saturation).

    Raises :class:`~attnlab.errors.AttnlabError` subclasses with a message naming the option at fault (a file
    that cannot be read too).
    """
    from ..articles import example
    from .inputs import load_inputs, load_mask, load_matrix
    from .steps import Setup, setup_from_example

    own = [a for a in ("q", "k", "v") if getattr(args, a) is not None]
    if args.example is not None and (own or args.inputs):
        raise localized(ShapeError, "input.both", name=args.example)
    align = getattr(args, "causal_align", None)
    causal: bool | str = align if align is not None else bool(args.causal)
    bias = None if getattr(args, "bias", None) is None else load_matrix(args.bias, "--bias")
    options: dict[str, Any] = {
        "causal": causal,
        "padding": args.padding,
        "padding_side": args.padding_side,
        "temperature": args.temperature,
        "shift": args.shift,
        "scale": args.scale,
        "masked_rows": args.masked_rows,
    }
    mask = None
    if args.mask is not None:
        mask = read_source("--mask", args.mask, load_mask, "--mask", convention=args.mask_convention)
    if args.example is not None:
        try:
            ex = example(args.example)
        except KeyError:
            raise localized(
                OptionError, "input.no_example", name=args.example, names=", ".join(EXAMPLE_NAMES)
            ) from None
        if ex.q is None:
            return args.example
        assert ex.k is not None  # an example with queries has keys
        _check_sizes(args, int(np.shape(ex.q)[0]), int(np.shape(ex.k)[0]))
        if bias is not None:
            options["bias"] = bias
        if options["masked_rows"] == "raise":  # the default: keep the example's own policy (all-masked: nan)
            options.pop("masked_rows")
        setup = setup_from_example(
            args.example, no_causal=bool(getattr(args, "no_causal", False)), lang=getattr(args, "lang", None), **options
        )
        if mask is not None:
            setup = setup.with_options(mask=mask)
        ql, kl = labels_from_args(args, setup.n_q, setup.n_k, None)
        return setup.with_options(query_labels=ql or setup.query_labels, key_labels=kl or setup.key_labels)
    data: dict[str, Any] = {}
    if args.inputs:
        data = read_source("--inputs", args.inputs, load_inputs)
    for a in ("q", "k", "v"):
        src = getattr(args, a)
        if src is not None:
            data[a] = read_source(f"--{a}", src, load_matrix, f"--{a}")
    missing = [f"--{a}" for a in ("q", "k", "v") if a not in data]
    if missing:
        raise localized(ShapeError, "input.missing", flags=", ".join(missing))
    q, k, v = data["q"], data["k"], data["v"]
    if q.shape[1] != k.shape[1]:
        raise localized(ShapeError, "input.k_width", dk=k.shape[1], dq=q.shape[1])
    if v.shape[0] != k.shape[0]:
        raise localized(ShapeError, "input.v_rows", nv=v.shape[0], nk=k.shape[0])
    if mask is None and data.get("mask") is not None:
        mask = np.asarray(data["mask"], dtype=bool)
    _check_sizes(args, q.shape[0], k.shape[0])
    ql, kl = labels_from_args(args, q.shape[0], k.shape[0], data.get("tokens"))
    return Setup(q, k, v, mask, query_labels=ql, key_labels=kl, bias=bias, **options)


def add_explain_arguments(parser: argparse.ArgumentParser, lang: str = "en") -> None:
    """``attnlab explain``'s options (the inputs of :func:`add_input_arguments`, then what to show and how), with
    their help in ``lang`` (the command line's language: :func:`attnlab.i18n.cli_lang`)."""
    from ..i18n import help_for

    h = help_for("help", lang)

    def mv(key: str) -> str | None:  # argparse's default metavar (the option's name) in English
        return None if lang == "en" else h(f"metavar.{key}")

    add_input_arguments(parser, lang)
    o = parser.add_argument_group(h("group.output"))
    names = (*MISTAKE_NAMES, "all")
    o.add_argument(
        "--mistake",
        action="append",
        choices=names,
        type=localize_type(None, lang, "argtype.choice", choices=names),
        metavar=h("metavar.name"),
        help=h("mistake", names=", ".join(MISTAKE_NAMES)),
    )
    heads = localize_type(int_type(minimum=1, maximum=2**20), lang, "argtype.int_range", lo=1, hi=2**20)
    o.add_argument("--heads", type=heads, default=8, metavar=mv("heads"), help=h("heads"))
    formats = ("auto", "rich", "text", "markdown", "json")
    fmt = localize_type(None, lang, "argtype.choice", choices=formats)
    o.add_argument("--format", choices=formats, type=fmt, default="auto", help=h("format"))
    width = localize_type(int_type(minimum=20), lang, "argtype.int", lo=20)
    o.add_argument("--width", type=width, default=100, metavar=mv("width"), help=h("width"))
    o.add_argument(
        "--tiled", type=localize_type(int_type(minimum=1), lang, "argtype.int", lo=1), metavar="B", help=h("tiled")
    )
    add_lang_argument(o, lang)
    o.add_argument("--backward", action="store_true", help=h("backward"))
    o.add_argument("--grad-out", metavar="G", help=h("grad_out"))
    o.add_argument(
        "--dropout", type=localize_type(probability, lang, "argtype.probability"), metavar="P", help=h("dropout")
    )
    seed = localize_type(int_type(minimum=0), lang, "argtype.int", lo=0)
    o.add_argument("--seed", type=seed, default=0, metavar=mv("seed"), help=h("seed"))
    o.add_argument("--positions", action="store_true", help=h("positions"))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # a library call raises; only the command line exits
        raise OptionError(message)


def parse_explain_args(argv: Any, lang: str = "en") -> argparse.Namespace:
    """``attnlab explain ARGV`` as the command line reads it (for callers other than the command line, such as
    the lab): a bad argument is an :class:`~attnlab.errors.OptionError` that says what argparse would print.

    >>> parse_explain_args(["2x2", "--tiled", "1"]).tiled
    1
    """
    parser = _Parser(prog="attnlab explain", add_help=False)
    add_explain_arguments(parser, lang)
    return parser.parse_args(list(argv))
