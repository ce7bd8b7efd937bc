"""Command-line inputs shared by ``attnlab explain`` and ``attnlab heatmap``: a named example or your matrices.

Kept light (NumPy only) because the CLI builds its parser from it before any command runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ..argtypes import float_type, input_file, int_type
from ..articles import EXAMPLES, EXTRA_EXAMPLES, LESSONS
from ..errors import AttnlabError, OptionError, ShapeError

__all__ = [
    "EXAMPLE_NAMES",
    "TEMPERATURE",
    "add_input_arguments",
    "examples_listing",
    "labels_from_args",
    "read_source",
    "setup_from_args",
]

EXAMPLE_NAMES: tuple[str, ...] = (*EXAMPLES, *EXTRA_EXAMPLES, *LESSONS)


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


def add_input_arguments(p: argparse.ArgumentParser) -> None:
    """The options that say what to compute (shared by ``explain`` and ``heatmap``)."""
    p.add_argument(
        "example",
        nargs="?",
        metavar="EXAMPLE",
        help=f"a worked example of the articles: {', '.join(EXAMPLE_NAMES)} (or give --q, --k, --v)",
    )
    p.add_argument("--list", action="store_true", help="list the named examples and exit")
    g = p.add_argument_group(
        "your own matrices",
        "inline '1,0;0,1' or '[[1,0],[0,1]]', or a .json/.csv/.npy file; a matrix that starts with a minus sign "
        "needs '=': --q='-1,0;0,1'",
    )
    g.add_argument("-q", "--q", metavar="Q", help="queries [n_q, d_k]")
    g.add_argument("-k", "--k", metavar="K", help="keys [n_k, d_k]")
    g.add_argument("-v", "--v", metavar="V", help="values [n_k, d_v]")
    g.add_argument(
        "--inputs",
        type=input_file,
        metavar="FILE",
        help="one .json object {q, k, v, mask?, tokens?} or an .npz archive",
    )
    g.add_argument("--tokens", help="labels for the positions ('the cat sat' or 'the,cat,sat'); self-attention")
    g.add_argument("--query-tokens", help="labels for the queries (cross-attention)")
    g.add_argument("--key-tokens", help="labels for the keys (cross-attention)")
    m = p.add_argument_group("masks and options")
    m.add_argument("--mask", help="a boolean mask [n_q, n_k]: '1 0; 1 1' (■/⬚ and true/false work too)")
    m.add_argument(
        "--mask-convention",
        choices=("allow", "block"),
        default="allow",
        help="what 1/True means in --mask: allow (attnlab, PyTorch SDPA) or block (nn.MultiheadAttention)",
    )
    m.add_argument("--causal", action="store_true", help="query i sees keys j <= i")
    m.add_argument(
        "--causal-align",
        choices=("top_left", "bottom_right"),
        help="causal with n_q != n_k: top_left (PyTorch is_causal) or bottom_right (decoding: the last query is the "
        "newest token and sees every key); implies --causal",
    )
    m.add_argument("--no-causal", action="store_true", help="drop a named example's causal mask (see it without)")
    m.add_argument(
        "--bias",
        metavar="B",
        help="additive scores: one number per key '0,1,2,3' (a different bias per column) or a matrix [n_q, n_k]",
    )
    m.add_argument(
        "--padding",
        type=int_type(minimum=0),
        metavar="N",
        help="only N key positions are real tokens (0 <= N <= n_k); the rest is padding",
    )
    m.add_argument("--padding-side", choices=("right", "left"), default="right", help="where the padding sits")
    m.add_argument(
        "--temperature",
        type=TEMPERATURE,
        default=1.0,
        metavar="T",
        help="divide the logits by T: finite, >= 2.2250738585072014e-308 so that 1/T is finite (default 1)",
    )
    m.add_argument("--shift", type=float_type(), default=0.0, metavar="C", help="add C to every score after scaling")
    m.add_argument("--scale", type=float_type(), metavar="S", help="multiply Q Kᵀ by S instead of 1/sqrt(d_k)")
    m.add_argument(
        "--masked-rows",
        choices=("raise", "zero", "nan"),
        default="raise",
        help="a query row with no legal key: an error (default), zeros (as FlashAttention) or NaN (naive code)",
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
            raise ShapeError(f"tokens: {len(toks)} token(s) for n_q={n_q} queries and n_k={n_k} keys")
    if args.tokens is not None:
        if n_q != n_k:
            raise ShapeError(f"--tokens: n_q={n_q} != n_k={n_k}; use --query-tokens and --key-tokens")
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
    except FileNotFoundError as err:  # the loaders' own message names the flag and the file
        raise OptionError(str(err)) from None
    except OSError as err:
        raise OptionError(f"{flag}: cannot read {source!r}: {err.strerror or err}") from None
    except (ValueError, EOFError) as err:  # UnicodeDecodeError, NumPy's errors for a file that is not .npy
        raise OptionError(f"{flag}: cannot read {source!r}: {err}") from None


def _check_sizes(args: argparse.Namespace, n_q: int, n_k: int) -> None:
    if args.padding is not None and args.padding > n_k:
        raise OptionError(f"--padding: expected an int in [0, {n_k}] (n_k = {n_k} keys), got {args.padding}")


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
        raise ShapeError(
            f"give either an example ({args.example!r}) or your own matrices (--q/--k/--v/--inputs), not both"
        )
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
        except KeyError as err:
            raise OptionError(f"EXAMPLE: {err.args[0]}") from None
        if ex.q is None:
            return args.example
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
        raise ShapeError(
            f"missing {', '.join(missing)}: give a named example ({', '.join(EXAMPLE_NAMES)}) or all of --q, --k, --v"
        )
    q, k, v = data["q"], data["k"], data["v"]
    if q.shape[1] != k.shape[1]:
        raise ShapeError(f"--k: d_k={k.shape[1]} columns but --q has d_k={q.shape[1]}; Q and K need the same width")
    if v.shape[0] != k.shape[0]:
        raise ShapeError(f"--v: {v.shape[0]} rows but --k has n_k={k.shape[0]}; one value row per key")
    if mask is None and data.get("mask") is not None:
        mask = np.asarray(data["mask"], dtype=bool)
    _check_sizes(args, q.shape[0], k.shape[0])
    ql, kl = labels_from_args(args, q.shape[0], k.shape[0], data.get("tokens"))
    return Setup(q, k, v, mask, query_labels=ql, key_labels=kl, bias=bias, **options)
