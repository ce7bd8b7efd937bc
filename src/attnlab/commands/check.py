"""``attnlab check``: run an attention function through the articles' tests and name the bug.

Exit status: 0 when no bug is found, 1 when one is, 2 for usage errors (bad target or option).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import shutil
import sys
from pathlib import Path
from typing import Any

from ..argtypes import float_type, int_type
from ..errors import AttnlabError

NAME = "check"
HELP = "check an attention function (file.py:func or package.module:func) and name its bugs"

_FRAMEWORKS = ("auto", "numpy", "torch", "jax")
_SIGNATURES = ("auto", "plain", "sdpa", "jax", "qkv")
_CONVENTIONS = ("allow", "block", "additive", "keep")

#: ``--timeout`` at most, in seconds (a day).
MAX_TIMEOUT = 86400.0


class TargetError(AttnlabError):
    """The target could not be imported or is not callable."""


def _resolve_attr(obj: Any, dotted: str, where: str) -> Any:
    for part in dotted.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(f"{where} has no attribute {dotted!r}") from None
    return obj


def load_target(target: str) -> Any:
    """The callable named by ``path/to/file.py:func`` or ``package.module:func`` (``func`` may be dotted)."""
    if ":" not in target:
        raise TargetError(f"target {target!r}: expected path/to/file.py:func or package.module:func")
    where, _, attr = target.rpartition(":")
    if not where or not attr:
        raise TargetError(f"target {target!r}: expected path/to/file.py:func or package.module:func")
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where)
        if not path.is_file():
            raise TargetError(f"target {target!r}: file {where} does not exist")
        mod_name = f"_attnlab_check_{path.stem}_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise TargetError(f"target {target!r}: cannot import {where}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        sys.path.insert(0, str(path.resolve().parent))
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            sys.modules.pop(mod_name, None)
            raise TargetError(f"target {target!r}: importing {where} failed: {type(err).__name__}: {err}") from err
        finally:
            sys.path.remove(str(path.resolve().parent))
    else:
        try:
            module = importlib.import_module(where)
        except Exception as err:
            raise TargetError(f"target {target!r}: cannot import module {where}: {type(err).__name__}: {err}") from err
    fn = _resolve_attr(module, attr, where)
    if not callable(fn):
        raise TargetError(f"target {target!r}: {attr} is a {type(fn).__name__}, not a function")
    return fn


def _csv(value: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in value.split(",") if x.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options describing the function: what it is, how it is called, what it supports."""
    parser.add_argument("target", help="path/to/file.py:func or package.module:func")
    parser.add_argument("--framework", choices=_FRAMEWORKS, default="auto", help="array library (default: detect)")
    parser.add_argument(
        "--signature",
        choices=_SIGNATURES,
        default="auto",
        help="plain fn(q, k, v, mask=None); sdpa (attn_mask, is_causal, scale); jax (mask, is_causal, scale); "
        "qkv fn(q, k, v); auto reads the parameter names",
    )
    parser.add_argument(
        "--mask-convention",
        choices=_CONVENTIONS,
        default="allow",
        help="allow: bool True = may attend; block: bool True = blocked; additive: 0 / finfo.min; keep: 1 = keep",
    )
    parser.add_argument("--layout", choices=("bhnd", "bnhd"), default="bhnd", help="[B, h, n, d] or [B, n, h, d]")
    parser.add_argument("--returns", choices=("auto", "output", "output+weights"), default="auto")
    parser.add_argument("--causal-only", action="store_true", help="the function always applies a causal mask")
    parser.add_argument("--causal-align", choices=("top_left", "bottom_right"), default=None)
    parser.add_argument(
        "--causal-value",
        choices=("bool", "align"),
        default="bool",
        help="the causal argument gets True (bool) or the alignment string (align)",
    )
    parser.add_argument("--gqa", action="store_true", help="K and V may have fewer heads than Q")
    parser.add_argument("--dtypes", type=_csv, default=None, help="comma-separated dtypes to try")
    parser.add_argument("--unsupported", type=_csv, default=(), help="comma-separated capabilities not supported")
    parser.add_argument("--mask-arg", default=None, help="name of the mask parameter")
    parser.add_argument("--causal-arg", default=None, help="name of the causal flag parameter")
    parser.add_argument("--scale-arg", default=None, help="name of the scale parameter")
    parser.add_argument("--probes", type=_csv, default=None, help="comma-separated probes to run (default all)")
    parser.add_argument(
        "--timeout",
        type=float_type(positive=True, maximum=MAX_TIMEOUT, expected=f"a number of seconds in (0, {MAX_TIMEOUT}]"),
        default=10.0,
        help=f"seconds one call may take, at most {MAX_TIMEOUT} (default 10)",
    )
    parser.add_argument("--seed", type=int_type(minimum=0), default=0, help="random seed, >= 0 (default 0)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--width", type=int_type(minimum=20), default=None, help="columns of the text report (default: terminal)"
    )
    parser.add_argument("--no-color", action="store_true", help="plain text without colour")


def run(args: argparse.Namespace) -> int:
    from ..check import DTYPES, check

    fn = load_target(args.target)  # a TargetError, and the checker's UsageError, are usage errors (exit 2)
    report = check(
        fn,
        framework=args.framework,
        signature=args.signature,
        mask_convention=args.mask_convention,
        layout=args.layout,
        returns=args.returns,
        causal_only=args.causal_only,
        causal_align=args.causal_align,
        causal_value=args.causal_value,
        gqa=args.gqa,
        dtypes=args.dtypes or DTYPES,
        unsupported=args.unsupported,
        mask_arg=args.mask_arg,
        causal_arg=args.causal_arg,
        scale_arg=args.scale_arg,
        timeout=args.timeout,
        probes=args.probes,
        seed=args.seed,
        name=args.target,
    )
    if args.json:
        sys.stdout.write(report.to_json() + "\n")
    else:
        color = not args.no_color and sys.stdout.isatty()
        width = args.width or (shutil.get_terminal_size().columns if color else 100)
        try:
            sys.stdout.write(report.render(width=width, color=color))
        except ImportError:
            sys.stdout.write(report.to_text())
    return 0 if report.ok else 1
