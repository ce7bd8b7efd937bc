"""``attnlab check``: run an attention function through the articles' tests and name the bug.

The target's module is imported, and the function called, in a worker process (:mod:`attnlab.check.isolation`):
what it prints, how it exits and whatever it leaves running cannot reach this process's output or outlive it.

Exit status (:class:`attnlab.check.ExitStatus`): 0 clean, 1 bug found, 2 usage error (bad target or option),
3 incomplete (no bug, but a core probe could not run), 4 checker failure (a bug in attnlab).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import Any

from ..argtypes import float_type, int_type
from ..check.target import TargetError
from ..check.target import load_target as _load
from ..cli import one_line

NAME = "check"
HELP = "check an attention function (file.py:func or package.module:func) and name its bugs"

_FRAMEWORKS = ("auto", "numpy", "torch", "jax")
_SIGNATURES = ("auto", "plain", "sdpa", "jax", "qkv")
_CONVENTIONS = ("allow", "block", "additive", "keep")

#: ``--timeout`` and ``--import-timeout`` at most, in seconds (a day).
MAX_TIMEOUT = 86400.0


def load_target(target: str) -> Any:
    """The callable named by ``path/to/file.py:func`` or ``package.module:func``, imported in this process
    (``check-model`` uses it); any failure while importing is a :class:`TargetError`."""
    try:
        return _load(target)
    except TargetError:
        raise
    except Exception as err:
        where = target.rpartition(":")[0]
        raise TargetError(f"target {target!r}: importing {where} failed: {type(err).__name__}: {err}") from err


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
    parser.add_argument(
        "--gqa-mapping",
        choices=("interleave", "tile"),
        default=None,
        help="with --gqa: query head i uses K/V head i // (h/h_kv) (interleave, the default) or i %% h_kv (tile)",
    )
    parser.add_argument(
        "--compute-dtype",
        choices=("auto", "input", "float64", "float32", "float16", "bfloat16"),
        default="auto",
        help="the precision the function documents computing in (auto: float32 computation of float64 inputs is a "
        "note; input: every dtype under its own rule)",
    )
    parser.add_argument(
        "--masked-rows",
        choices=("any", "raise", "zeros", "uniform", "nan"),
        default="any",
        help="the fully-masked-row policy the function promises (any: an error, zeros or the uniform average)",
    )
    parser.add_argument(
        "--causal-when-no-mask", action="store_true", help="the function is causal whenever it is given no mask"
    )
    parser.add_argument(
        "--mask-form",
        choices=("full", "batch", "key_padding", "valid_lens", "kv_cache", "varlen"),
        default="full",
        help="mask interface: [B, h, n_q, n_k] (full), [B, 1, n_q, n_k] (batch), [B, n_k] (key_padding), [B] "
        "lengths (valid_lens), [B] cache lengths of a decode kernel (kv_cache), packed cu_seqlens (varlen)",
    )
    parser.add_argument(
        "--ranks", choices=("3,4", "4"), default="3,4", help="input ranks the function takes (4: never 3-D inputs)"
    )
    parser.add_argument("--dtypes", type=_csv, default=None, help="comma-separated dtypes to try")
    parser.add_argument("--unsupported", type=_csv, default=(), help="comma-separated capabilities not supported")
    parser.add_argument("--mask-arg", default=None, help="name of the mask parameter")
    parser.add_argument("--causal-arg", default=None, help="name of the causal flag parameter")
    parser.add_argument("--scale-arg", default=None, help="name of the scale parameter")
    parser.add_argument("--probes", type=_csv, default=None, help="comma-separated probes to run (default all)")
    seconds = float_type(positive=True, maximum=MAX_TIMEOUT, expected=f"a number of seconds in (0, {MAX_TIMEOUT}]")
    parser.add_argument(
        "--timeout", type=seconds, default=10.0, help=f"seconds one call may take, at most {MAX_TIMEOUT} (default 10)"
    )
    parser.add_argument(
        "--import-timeout", type=seconds, default=60.0, help="seconds importing the target may take (default 60)"
    )
    parser.add_argument("--seed", type=int_type(minimum=0), default=0, help="random seed, >= 0 (default 0)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--width", type=int_type(minimum=20), default=None, help="columns of the text report (default: terminal)"
    )
    parser.add_argument("--no-color", action="store_true", help="plain text without colour")
    # --- backward (issue 14, attnlab.check.backward) -------------------------------------------------------------
    parser.add_argument(
        "--backward",
        nargs="?",
        const=True,
        default=None,
        metavar="NAME",
        help="also check the gradients: alone, by autograd/jax.vjp through the function; with NAME (a function in "
        "the same file, or file.py:NAME), that hand-written backward, bwd(q, k, v, d_out, ...) or "
        "bwd(q, k, v, out, lse, d_out, ...)",
    )
    parser.add_argument(
        "--lse-units", choices=("nats", "log2"), default="nats", help="units of the lse a flash backward takes"
    )


def run(args: argparse.Namespace) -> int:
    from ..check import DTYPES, ExitStatus, UsageError, check

    try:
        report = check(
            args.target,
            framework=args.framework,
            signature=args.signature,
            mask_convention=args.mask_convention,
            layout=args.layout,
            returns=args.returns,
            causal_only=args.causal_only,
            causal_align=args.causal_align,
            causal_value=args.causal_value,
            gqa=(args.gqa_mapping or "interleave") if args.gqa else False,
            compute_dtype=args.compute_dtype,
            masked_rows=args.masked_rows,
            causal_when_no_mask=args.causal_when_no_mask,
            ranks=tuple(int(r) for r in args.ranks.split(",")),
            mask_form=args.mask_form,
            dtypes=args.dtypes or DTYPES,
            unsupported=args.unsupported,
            mask_arg=args.mask_arg,
            causal_arg=args.causal_arg,
            scale_arg=args.scale_arg,
            timeout=args.timeout,
            import_timeout=args.import_timeout,
            probes=args.probes,
            seed=args.seed,
            name=args.target,
            **_backward_options(args),
        )
    except UsageError as err:
        sys.stderr.write(f"attnlab check: error: {one_line(err)}\n")
        return ExitStatus.USAGE
    except Exception as err:  # a bug in the checker itself: say so, with a distinct status
        import traceback

        sys.stderr.write(f"attnlab check: checker failure (a bug in attnlab): {type(err).__name__}: {err}\n")
        sys.stderr.write(traceback.format_exc(limit=-4))
        if args.json:
            _write(_failure_json(args.target, err) + "\n")
        return ExitStatus.CHECKER_FAILURE
    if args.json:
        text = report.to_json() + "\n"  # built whole, then written once: stdout holds one JSON document
    else:
        color = not args.no_color and sys.stdout.isatty()
        width = args.width or (shutil.get_terminal_size().columns if color else 100)
        try:
            text = report.render(width=width, color=color)
        except ImportError:
            text = report.to_text()
    if not _write(text):
        return ExitStatus.CHECKER_FAILURE
    return report.exit_status


def _backward_options(args: argparse.Namespace) -> dict[str, Any]:
    """``backward=`` and ``lse_units=`` from ``--backward [NAME]`` and ``--lse-units`` (NAME alone names a function
    in the target's file or module)."""
    b = getattr(args, "backward", None)
    if b is None:
        return {}
    if isinstance(b, str) and ":" not in b:
        b = f"{args.target.rpartition(':')[0]}:{b}"
    return {"backward": b, "lse_units": args.lse_units}


def _write(text: str) -> bool:
    """Write the report to stdout; False (and a line on stderr) when stdout is closed or broken."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except (OSError, ValueError) as err:
        try:
            sys.stderr.write(f"attnlab check: could not write the report to stdout: {err}\n")
        except (OSError, ValueError):
            pass
        return False
    return True


def _failure_json(target: str, err: BaseException) -> str:
    import json

    from ..check import ExitStatus

    return json.dumps(
        {
            "command": "check",
            "target": target,
            "ok": False,
            "verdict": "checker-failure",
            "exit_status": int(ExitStatus.CHECKER_FAILURE),
            "error": f"{type(err).__name__}: {err}",
        },
        indent=2,
    )
