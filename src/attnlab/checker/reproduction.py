"""A copy-paste Python reproduction of one (minimal) failing case.

:func:`reproduction` writes a script that needs only NumPy, attnlab and the function's own library: the inputs as
literals (``np.array([...])``, the mask drawn with :func:`attnlab.masks.to_string` in comments), the call made as
the checker made it (the same argument names, mask form and convention, layout, dtype and flags:
:class:`CallWords`), the expected output from :func:`attnlab.scaled_dot_product_attention`, and the comparison,
ending in an ``assert`` that fails as the check did. A crash becomes an ``AssertionError`` that names the
exception. Where the failure needs an earlier call (state carried between calls), the script makes one first.

>>> import numpy as np
>>> from attnlab.checker.runner import Case
>>> case = Case(np.ones((1, 1, 1, 2)), np.eye(2)[None, None], np.eye(2)[None, None])
>>> text = reproduction(case, CallWords(target="fn = lambda q, k, v: q"), tol=1e-9)
>>> exec(text, {})
Traceback (most recent call last):
    ...
AssertionError: max |out - expected| = 0.5 > 1e-09 at [0, 0, 0, 0]; out[0, 0, 0, 0] = 1 (expected 0.5)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from .. import masks as _masks
from .interfaces import CONVENTIONS
from .runner import Case

__all__ = ["GRAD_KINDS", "KINDS", "CallWords", "reproduction", "target_code"]


@dataclass(frozen=True)
class CallWords:
    """How the checker called the function, in the adapter's words.

    ``target``: Python code that binds ``fn`` (:func:`target_code`); ``framework`` (``numpy``, ``torch``,
    ``jax``) and ``device``; ``layout`` (``bhnd`` or ``bnhd``); the mask argument's name (``mask_positional``: it
    is the fourth positional argument), ``convention`` (``allow``, ``block``, ``keep``, ``additive``) and
    ``mask_form`` (``full``, ``batch``, ``key_padding``, ``valid_lens``, ``kv_cache``, ``varlen``, ``flex``); the
    causal, scale and GQA arguments' names; the GQA head mapping; ``returns`` (``output`` when the function returns the
    output alone); for the gradient side, ``backward`` (``plain``, ``flash`` or ``autograd``; ``""`` for a forward),
    ``lse_units``, the dropout keep mask's and the bias's argument names, and ``forward`` (code that binds ``fwd``,
    a flash backward's own forward; ``""``: the golden ``out`` and ``lse`` are passed)."""

    target: str = "fn = ...  # the function checked"
    framework: str = "numpy"
    device: str = ""
    layout: str = "bhnd"
    mask_arg: str | None = "mask"
    mask_positional: bool = False
    convention: str = "allow"
    mask_form: str = "full"
    causal_arg: str | None = None
    scale_arg: str | None = None
    gqa_arg: str | None = None
    gqa_map: str = "interleave"
    returns: str = "auto"
    backward: str = ""
    lse_units: str = "nats"
    keep_arg: str = "dropout_mask"
    bias_arg: str = "bias"
    forward: str = ""

    @classmethod
    def of(cls, resolved: Any, spec: Any, target: Any, forward: Any = None) -> CallWords:
        """The words of an :class:`~attnlab.checker.adapters.Adapter`'s ``resolved`` names and ``spec``, for the
        function named by ``target`` (a callable or a ``file.py:NAME`` string) and a flash backward's ``forward``."""
        mode = str(getattr(resolved, "mode", "") or "")
        return cls(
            target=target_code(target),
            framework=resolved.framework,
            device=resolved.device if resolved.device not in ("", "cpu") else "",
            layout=spec.layout if spec.layout in ("bhnd", "bnhd") else "bhnd",
            mask_arg=resolved.mask_arg,
            mask_positional=resolved.mask_positional,
            convention=spec.mask_convention,
            mask_form=spec.mask_form,
            causal_arg=resolved.causal_arg,
            scale_arg=resolved.scale_arg,
            gqa_arg=resolved.gqa_arg,
            gqa_map=getattr(spec, "gqa_mapping", "interleave"),
            returns=spec.returns,
            backward=mode.removeprefix("backward ").partition("+")[0] if mode.startswith("backward") else "",
            lse_units=getattr(spec, "lse_units", "nats"),
            keep_arg=getattr(spec, "dropout_arg", None) or "dropout_mask",
            forward="" if forward is None else target_code(forward, "fwd"),
        )


def target_code(target: Any, name: str = "fn") -> str:
    """Python code that binds ``name`` (``fn``) to the checked function: ``file.py:NAME`` through
    :func:`runpy.run_path`, ``package.module:NAME`` and an importable callable through an import; anything else (a
    lambda, a function defined in ``__main__`` or inside another, a name that holds another object) as a line to
    fill in."""
    if isinstance(target, str) and ":" in target:
        where, _, attr = target.rpartition(":")
        head, _, rest = attr.partition(".")
        tail = "".join(f".{p}" for p in rest.split(".") if p)
        if where.endswith(".py") or "/" in where or "\\" in where:
            return f"import runpy\n\n{name} = runpy.run_path({where!r})[{head!r}]{tail}"
        return f"from {where} import {head}\n\n{name} = {head}{tail}"
    module = getattr(target, "__module__", None)
    qual = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if module and qual and module != "__main__" and "<" not in qual and _importable(target, module, qual):
        head, _, rest = qual.partition(".")
        tail = "".join(f".{p}" for p in rest.split(".") if p)
        return f"from {module} import {head}\n\n{name} = {head}{tail}"
    return f"{name} = ...  # the function checked ({module}.{qual}): import or define it here"


def _importable(target: Any, module: str, qual: str) -> bool:
    """Whether ``module``'s attribute path ``qual`` is ``target`` (a module not imported yet is taken at its word)."""
    obj: Any = sys.modules.get(module)
    if obj is None:
        return True
    for part in qual.split("."):
        obj = getattr(obj, part, None)
    return obj is target or getattr(obj, "__func__", None) is getattr(target, "__func__", target)


# ---------------------------------------------------------------------------------------------------------------
# writing the script


def _literal(x: np.ndarray) -> str:
    """``x`` as a NumPy literal that round-trips exactly."""
    x = np.asarray(x)
    if x.dtype == np.bool_:
        body = np.array2string(x, separator=", ", threshold=sys.maxsize, max_line_width=116)
        return f"np.array({body}, dtype=bool)"
    x = x + 0.0  # -0.0 written as 0.0
    finite = np.isfinite(x).all()
    fmt: Any = None if finite else {"float_kind": lambda f: repr(float(f)) if np.isfinite(f) else f"float('{f}')"}
    body = np.array2string(
        x, separator=", ", threshold=sys.maxsize, max_line_width=116, floatmode="unique", formatter=fmt
    )
    return f"np.array({body})"


def _indented(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def _mask_literal(name: str, m: np.ndarray) -> list[str]:
    """``name = ...`` for a full mask ``[..., h, n_q, n_k]``, written once when every batch element and head
    shares it, with its drawing."""
    lead = m.shape[:-2]
    flat = m.reshape(-1, *m.shape[-2:])
    lines = []
    if all(np.array_equal(flat[0], f) for f in flat[1:]):
        lines.append(f"# {name}: True = may attend, the same for every batch element and head; drawn (■ may attend):")
        lines.append(_indented(_masks.to_string(flat[0]), "#   "))
        lines.append(f"{name} = np.broadcast_to({_literal(flat[0])}, {tuple(m.shape)}).copy()")
        return lines
    lines.append(f"# {name}: True = may attend {list(m.shape)}; drawn per batch element and head (■ may attend):")
    for i, f in enumerate(flat):
        idx = np.unravel_index(i, lead) if lead else ()
        lines.append(f"#   {name}[{', '.join(str(int(j)) for j in idx)}]:")
        lines.append(_indented(_masks.to_string(f), "#     "))
    lines.append(f"{name} = {_literal(m)}")
    return lines


class _Float64:
    """A framework strategy that keeps floats as float64 NumPy (to read the additive fill value once)."""

    @staticmethod
    def floats(x: np.ndarray, dtype: str) -> np.ndarray:
        return np.asarray(x, dtype=np.float64)

    @staticmethod
    def exact(x: np.ndarray) -> np.ndarray:
        return np.asarray(x)


def _framework_lines(w: CallWords, dtype: str) -> list[str]:
    dev = f', device="{w.device}"' if w.device else ""
    if w.framework == "torch":
        return [
            "import torch",
            "",
            f"def T(x):  # a {dtype} tensor, as the checker passes it",
            f"    return torch.from_numpy(np.array(x, dtype=np.float64)).to(dtype=torch.{dtype}{dev})",
            "",
            "def E(x):  # a bool / int tensor (masks, lengths)",
            f"    return torch.from_numpy(np.array(x)){f'.to(device={w.device!r})' if w.device else ''}",
            "",
            "def H(x):  # the output as float64 NumPy",
            "    return x.detach().cpu().double().numpy()",
        ]
    if w.framework == "jax":
        src = "np.float64" if dtype == "float64" else "np.float32"
        return [
            "import jax.numpy as jnp",
            "",
            f"def T(x):  # a {dtype} array, as the checker passes it",
            f'    return jnp.asarray(np.asarray(x, dtype={src}), dtype="{dtype}")',
            "",
            "def E(x):  # a bool / int array (masks, lengths)",
            "    return jnp.asarray(np.array(x))",
            "",
            "def H(x):  # the output as float64 NumPy",
            "    return np.asarray(x, dtype=np.float64)",
        ]
    return [
        f"def T(x):  # a {dtype} array, as the checker passes it",
        f'    return np.array(x, dtype="{dtype}")',
        "",
        "def E(x):  # a bool / int array (masks, lengths)",
        "    return np.array(x)",
        "",
        "def H(x):  # the output as float64 NumPy",
        "    return np.asarray(x, dtype=np.float64)",
    ]


def _mask_argument(w: CallWords, dtype: str) -> list[str]:
    """Lines that turn ``passed`` (canonical, True = may attend) into the mask argument ``m``."""
    reduce = {
        "full": "passed",
        "batch": "passed[:, :1]  # [B, 1, n_q, n_k]",
        "key_padding": "passed[:, 0, -1, :]  # [B, n_k]",
        "valid_lens": "passed[:, 0, -1, :].sum(axis=-1)  # [B] valid key lengths",
        "kv_cache": "passed[:, 0, -1, :].sum(axis=-1)  # [B] cache lengths",
        "flex": "passed",
    }[w.mask_form]
    if w.mask_form == "flex":
        return list(_FLEX_SCORE_MOD if w.mask_arg == "score_mod" else _FLEX_BLOCK_MASK)
    lines = [f"    m = {reduce}"]
    if w.mask_form in ("valid_lens", "kv_cache"):
        return [*lines, "    m = E(m.astype(np.int64))"]
    if w.convention == "block":
        lines.append("    m = E(~m)  # True = blocked")
    elif w.convention == "keep":
        lines.append("    m = E(m.astype(np.int64))  # 1 = keep")
    elif w.convention == "additive":
        fill = float(np.asarray(CONVENTIONS["additive"](np.zeros(1, bool), dtype, _Float64()))[0])
        lines.append(f"    m = T(np.where(m, 0.0, {fill!r}))  # additive: 0 = may attend")
    else:
        lines.append("    m = E(m)")
    return lines


#: The reproduction script's flex mask: ``passed`` (``[B, h, n_q, n_k]``, True = may attend) as a ``block_mask``
#: built from a ``mask_mod`` that reads it, or as a ``score_mod`` that sets blocked scores to -inf.
_FLEX_READ = (
    "    p = passed.reshape((1,) * (4 - passed.ndim) + passed.shape)",
    "    a = E(np.broadcast_to(p, (*p.shape[:2], q.shape[-2], k.shape[-2])))  # [B, h, n_q, n_k], True = may attend",
    "    nb, nh = a.shape[:2]  # 1: broadcast",
    "",
    "    def mask_mod(b, h, i, j):",
    "        return a[b % nb, h % nh, i, j]",
    "",
)
_FLEX_BLOCK_MASK = (
    "    from torch.nn.attention.flex_attention import create_block_mask",
    "",
    *_FLEX_READ,
    "    m = create_block_mask(mask_mod, *a.shape, device=a.device)",
)
_FLEX_SCORE_MOD = (
    *_FLEX_READ,
    "    def m(s, b, h, i, j):",
    "        return torch.where(mask_mod(b, h, i, j), s, -float('inf'))",
)
#: The reproduction script's varlen call, up to its ``max_seqlen`` arguments: the rows the mask lets through give
#: each sequence's query and key lengths, q, k, v ``[B, h, n, d]`` are packed to ``[sum(n), h, d]``.
_VARLEN_PACK = (
    "    lq = passed[:, 0].any(axis=-1).sum(axis=-1)  # each sequence's query and key lengths",
    "    lk = passed[:, 0].any(axis=-2).sum(axis=-1)",
    "    def pack(x, n):  # [B, h, n, d] -> [sum(n), h, d]",
    "        return np.concatenate([np.swapaxes(x[b, :, : n[b]], 0, 1) for b in range(len(n))])",
    "    cu = lambda n: E(np.concatenate([[0], np.cumsum(n)]).astype(np.int32))  # noqa: E731 (cu_seqlens)",
    "    out = fn(T(pack(q, lq)), T(pack(k, lk)), T(pack(v, lk)), cu_seqlens_q=cu(lq), cu_seqlens_k=cu(lk),",
)
#: ... and back: the packed output ``[sum(n), h, d_v]`` unpacked to ``[B, h, n, d_v]`` (zeros past each length).
_VARLEN_UNPACK = (
    "    out, full, start = H(out), np.zeros((*q.shape[:-1], v.shape[-1])), 0",
    "    for b, n in enumerate(lq):",
    "        full[b, :, :n] = np.swapaxes(out[start : start + n], 0, 1)",
    "        start += n",
    "    return full",
)


def _call_lines(w: CallWords, case: Case, flag: bool | str, has_mask: bool, kind: str) -> list[str]:
    lay = "np.swapaxes(x, -2, -3)" if w.layout == "bnhd" else "x"
    lines = ["def call(q, k, v):", '    """fn called as the checker called it; its output in [..., h, n_q, d_v]."""']
    lines.append(f"    L = lambda x: {lay}  # noqa: E731 (layout {w.layout})")
    kwargs = []
    if flag and w.causal_arg:
        kwargs.append(f"{w.causal_arg}={flag!r}")
    if case.scale is not None and w.scale_arg:
        kwargs.append(f"{w.scale_arg}={case.scale!r}")
    if case.gqa and w.gqa_arg and w.mask_form != "varlen":
        kwargs.append(f"{w.gqa_arg}=True")
    if w.mask_form == "varlen":
        lines += _VARLEN_PACK
        lines.append(
            f"             max_seqlen_q=int(lq.max()), max_seqlen_k=int(lk.max()){''.join(', ' + a for a in kwargs)})"
        )
    else:
        args = ["*args"]
        if has_mask and w.mask_arg:
            lines += _mask_argument(w, case.dtype)
            if w.mask_positional:
                args.append("m")
            else:
                kwargs.insert(0, f"{w.mask_arg}=m")
        lines.append("    args = [T(L(x)) for x in (q, k, v)]")
        if kind == "mutates":
            lines.append("    kept = [H(a).copy() for a in args]")
        lines.append(f"    out = fn({', '.join(args + kwargs)})")
        if kind == "mutates":
            lines.append(
                '    call.mutated = [n for n, a, b in zip("qkv", args, kept) if not np.array_equal(H(a), b, True)]'
            )
    if w.returns != "output":
        lines += [
            "    if isinstance(out, (tuple, list)):  # (out, weights) or (out, lse)",
            "        out = out[0]",
            '    out = getattr(out, "output", out)  # a result object',
        ]
    if kind == "dtype":
        lines.append('    call.dtype = str(out.dtype).replace("torch.", "")')
    if kind == "output-type":
        own = {"torch": "torch.Tensor", "jax": "jax.Array"}.get(w.framework, "np.ndarray")
        if w.framework == "jax":
            lines.append("    import jax")
        lines.append(f"    call.own = isinstance(out, {own})  # an array of the function's own library")
    if w.mask_form == "varlen":
        lines += _VARLEN_UNPACK
    else:
        lines.append("    return L(H(out))")
    return lines


def _compare(case: Case, tol: float) -> list[str]:
    return [
        "sel = np.broadcast_to(rows[..., None], out.shape)",
        "err = np.where(sel, np.abs(out - expected), 0.0)",
        "err = np.where(sel & ~np.isfinite(out), np.inf, err)",
        f"TOL = {tol!r}  # the checker's tolerance for this case",
        "worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(err)), err.shape))",
        "assert err.max() <= TOL, (",
        '    f"max |out - expected| = {err.max():.3g} > {TOL:.3g} at {list(worst)}; "',
        '    f"out{list(worst)} = {out[worst]:.6g} (expected {expected[worst]:.6g})"',
        ")",
    ]


def _masked_rows(policy: str) -> Callable[[Case, float], list[str]]:
    def lines(case: Case, tol: float) -> list[str]:
        head = [
            "empty = np.broadcast_to(~rows[..., None], out.shape)  # the rows with no key to attend",
            'assert empty.any(), "no fully masked row"',
        ]
        if policy == "nan":
            return [*head, 'assert np.isfinite(out[empty]).all(), f"fully masked rows hold {out[empty]}"']
        want = "0.0" if policy == "zeros" else "np.broadcast_to(expected_uniform, out.shape)[empty]"
        pre = [] if policy == "zeros" else ["expected_uniform = np.mean(kv_v, axis=-2, keepdims=True)"]
        return [
            *head,
            *pre,
            f"assert np.all(np.abs(out[empty] - {want}) <= {tol!r}), (",
            f'    f"fully masked rows hold {{out[empty]}}; the declared policy is {policy}"',
            ")",
        ]

    return lines


#: How each kind of failure ends its script: the assert that fails as the check did.
_ENDINGS: dict[str, Callable[[Case, float], list[str]]] = {
    "output": _compare,
    "dtype": lambda case, tol: [
        f'assert call.dtype == "{case.dtype}", f"output dtype {{call.dtype}} for {case.dtype} inputs"'
    ],
    "output-type": lambda case, tol: ['assert call.own, "the output is not an array of the function\'s own library"'],
    "mutates": lambda case, tol: ['assert not call.mutated, f"fn wrote into its inputs {call.mutated}"'],
    "nondeterministic": lambda case, tol: [
        "for _ in range(8):  # the same call again",
        "    again = call(q, k, v)",
        "    assert np.array_equal(out, again, equal_nan=True), (",
        '        f"two identical calls differ by {np.nanmax(np.abs(out - again)):.3g}"',
        "    )",
    ],
    "masked-rows-nan": _masked_rows("nan"),
    "masked-rows-zeros": _masked_rows("zeros"),
    "masked-rows-uniform": _masked_rows("uniform"),
}

#: The kinds of failure a gradient case's reproduction can show.
GRAD_KINDS = ("gradients", "gradients-dtype", "gradients-mutates")
#: The kinds of failure a reproduction can show (the ``kind`` argument of :func:`reproduction`).
KINDS = (*_ENDINGS, *GRAD_KINDS)


def reproduction(
    case: Case,
    words: CallWords,
    *,
    tol: float | dict[str, float],
    passed: Case | None = None,
    flag: bool | str = False,
    earlier_call: bool = False,
    title: str = "",
    kind: str = "output",
) -> str:
    """The reproduction script of ``case`` (see the module doc).

    Args:
        case: the (minimal) case: ``q [..., h, n_q, d_k]``, ``k``/``v [..., h_kv, n_k, *]``, ``mask [..., h, n_q,
            n_k]`` (True = may attend) or None, its causal alignment and scale.
        words: how the function is called (:class:`CallWords`).
        tol: the largest acceptable ``|out - expected|`` (the checker's bound for this case); for the gradient
            kinds, each gradient's (``{"dq": ..., "dk": ..., "dv": ...[, "dbias": ...]}``).
        passed: ``case`` as the function was given it (the causal part folded into the mask; default ``case``).
        flag: the value given to the causal argument (False: none).
        earlier_call: make one call with other values of the same shapes first (the failure needs it).
        title: the first comment line (what was found).
        kind: what the script asserts (:data:`KINDS`): ``output`` (equal to the reference within ``tol``; a raise
            fails too), ``dtype`` (the output dtype is the input's), ``output-type`` (an array of the function's
            library), ``mutates`` (no input written), ``nondeterministic`` (nine identical calls agree),
            ``masked-rows-nan`` / ``-zeros`` / ``-uniform`` (fully masked rows: finite, zeros, V's average);
            for a gradient case (``d_out``, and ``keep`` / ``bias`` when given), ``gradients`` (each gradient equal
            to attnlab's float64 backward within its bound; a raise fails too), ``gradients-dtype`` (each in its
            input's dtype), ``gradients-mutates`` (no input written).
    """
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    passed = passed or case
    shape_note = f"q {list(case.q.shape)}, k {list(case.k.shape)}, v {list(case.v.shape)}, {case.dtype}"
    lines = [f"# {title or 'A failing case found by attnlab check'}", f"# {shape_note}", "import numpy as np", ""]
    lines += ["import attnlab", "", words.target, "", *_framework_lines(words, case.dtype), ""]
    lines += _input_lines(case, passed)
    if kind in GRAD_KINDS:
        assert isinstance(tol, dict)  # a bound per gradient
        return "\n".join(lines + _grad_script(case, words, tol, passed, flag, kind)) + "\n"
    assert not isinstance(tol, dict)  # one bound for the output
    lines += _expected_lines(case, words, kind)
    lines += _call_lines(words, passed, flag, passed.mask is not None, kind)
    lines.append("")
    if earlier_call:
        lines += [
            "rng = np.random.default_rng(0)  # an earlier call, other values of the same shapes (the failure needs it)",
            "call(*(x + rng.integers(-2, 3, x.shape) for x in (q, k, v)))",
        ]
    lines += [
        "try:",
        "    out = call(q, k, v)",
        "except Exception as err:  # a crash is a failure too",
        '    raise AssertionError(f"fn raised {type(err).__name__}: {err}") from err',
        'assert out.shape == expected.shape, f"output shape {out.shape}, expected {expected.shape}"',
    ]
    lines += _ENDINGS[kind](case, tol)
    return "\n".join(lines) + "\n"


def _input_lines(case: Case, passed: Case) -> list[str]:
    """q, k, v, the mask (``allowed``) and the causal rule, drawn, and the mask the function is given (``passed``)."""
    exact = "" if case.dtype == "float64" else f" (values exact in {case.dtype})"
    lines = [
        f"q = {_literal(case.q)}  # [..., h, n_q, d_k]{exact}",
        f"k = {_literal(case.k)}  # [..., h_kv, n_k, d_k]",
        f"v = {_literal(case.v)}  # [..., h_kv, n_k, d_v]",
    ]
    full = (*case.q.shape[:-2], case.q.shape[-2], case.k.shape[-2])
    n_q, n_k = case.q.shape[-2], case.k.shape[-2]
    if case.mask is not None:
        lines += _mask_literal("allowed", np.broadcast_to(case.mask, full))
    else:
        lines.append("allowed = None  # no mask")
    if case.causal:
        lines.append(
            f"# causal, {case.causal.replace('_', '-')}: query i sees keys j <= i"
            + (f" + {n_k - n_q}" if case.causal == "bottom_right" and n_k != n_q else "")
        )
        drawing = _masks.to_string(_masks.causal(n_q, n_k, align=cast(_masks.Align, case.causal)))
        lines.append(_indented(drawing, "#   "))
    if passed.mask is not None:
        if passed.mask is case.mask:
            lines.append("passed = allowed  # the mask the function is given")
        elif case.causal and np.array_equal(
            np.broadcast_to(passed.mask, full),
            np.broadcast_to(case.mask if case.mask is not None else True, full)
            & _masks.causal(n_q, n_k, align=cast(_masks.Align, case.causal)),
        ):
            base = "allowed & " if case.mask is not None else f"np.ones({full}, bool) & "
            lines.append(
                f'passed = {base}attnlab.masks.causal({n_q}, {n_k}, align="{case.causal}")  # causal part in the mask'
            )
        else:
            lines += _mask_literal("passed", np.broadcast_to(passed.mask, full))
    return [*lines, ""]


def _expected_lines(case: Case, words: CallWords, kind: str) -> list[str]:
    """The expected output from attnlab and the query rows that are compared."""
    n_q, n_k = case.q.shape[-2], case.k.shape[-2]
    lines, kv = [], "k, v"
    if case.gqa:
        g = case.q.shape[-3] // case.k.shape[-3]
        rep = (
            "np.repeat(x, {g}, axis=-3)" if words.gqa_map != "tile" else "np.tile(x, (1,) * (x.ndim - 3) + ({g}, 1, 1))"
        )
        lines.append(f"kv_heads = lambda x: {rep.format(g=g)}  # noqa: E731 (GQA: K/V heads to q's, {words.gqa_map})")
        kv = "kv_heads(k), kv_heads(v)"
    if kind == "masked-rows-uniform":
        lines.append(f"kv_v = {kv.split(', ')[1]}  # V for every query head")
    causal = f'"{case.causal}"' if case.causal else "False"
    scale = "" if case.scale is None else f", scale={case.scale!r}"
    lines.append(
        f'expected = attnlab.scaled_dot_product_attention(q, {kv}, allowed, causal={causal}{scale}, masked_rows="zero")'
    )
    if case.causal:
        visible = "np.ones(expected.shape[:-1] + (k.shape[-2],), bool)" if case.mask is None else "allowed"
        lines.append(
            f'rows = ({visible} & attnlab.masks.causal({n_q}, {n_k}, align="{case.causal}")).any(axis=-1)'
            "  # query rows with a key to attend"
        )
    elif case.mask is not None:
        lines.append("rows = allowed.any(axis=-1)  # query rows with a key to attend (fully masked rows: any policy)")
    else:
        lines.append("rows = np.ones(expected.shape[:-1], bool)")
    return [*lines, ""]


# ---------------------------------------------------------------------------------------------------------------
# the gradient side's script: the backward (or the forward's autograd) against attnlab's float64 backward

#: A flash backward's call with the forward's ``o_in`` and ``l_in`` (a write into them is a mutation too).
_SAVED = (
    "    kept_f = [H(x).copy() for x in (o_in, l_in)]",
    "    grads = fn(*args, o_in, l_in, dO, **kw)",
    "    if call.mutated is not None:",
    '        saved = zip(("out", "lse"), (o_in, l_in), kept_f)',
    "        call.mutated += [n for n, a, b in saved if not np.array_equal(H(a), b, True)]",
)
#: How each kind of backward is called, after ``args`` (q, k, v) and ``dO`` are made: its lines in ``call``.
_GRAD_CALLS = {
    "plain": ["    grads = fn(*args, dO, **kw)"],
    "flash": [
        "    o_in, l_in = T(L(out)), LSE(lse)  # the golden out and lse, as the checker gave them",
        *_SAVED,
    ],
    "flash+forward": [
        "    fkw = {n: x for n, x in kw.items() if n in inspect.signature(fwd).parameters}",
        "    o_in, l_in = fwd(*args, **fkw)  # the function's own forward",
        *_SAVED,
    ],
    "torch": [
        "    leaves = [a.requires_grad_(True) for a in args] + ([kw[BIAS].requires_grad_(True)] if BIAS in kw else [])",
        "    res = fn(*args, **kw)",
        "    res = res[0] if isinstance(res, (tuple, list)) else getattr(res, 'output', res)",
        "    grads = torch.autograd.grad(res, leaves, dO, allow_unused=True)",
        "    grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves)]",
    ],
    "jax": [
        "    import jax",
        "",
        "    def f(*leaves):",
        "        res = fn(*leaves[:3], **dict(kw, **({BIAS: leaves[3]} if BIAS in kw else {})))",
        "        return res[0] if isinstance(res, (tuple, list)) else getattr(res, 'output', res)",
        "",
        "    res, vjp = jax.vjp(f, *args, *([kw[BIAS]] if BIAS in kw else []))",
        "    grads = vjp(dO.astype(res.dtype))",
    ],
}

_GRAD_COMPARE = [
    "for name, tol in TOL.items():",
    "    got, want = grads[name], expected[name]",
    "    if name == 'dbias' and got.shape != want.shape and got.size == want.size:",
    "        got = got.reshape(want.shape)",
    '    assert got.shape == want.shape, f"{name} shape {got.shape}, expected {want.shape}"',
    "    sel = np.broadcast_to(rows[..., None], got.shape) if name == 'dq' else np.ones(got.shape, bool)",
    "    with np.errstate(invalid='ignore'):",
    "        err = np.where(sel, np.abs(got - want), 0.0)",
    "    err = np.where(sel & ~np.isfinite(got), np.inf, err)",
    "    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(err)), err.shape))",
    "    assert err.max() <= tol, (",
    '        f"max |{name} - expected| = {err.max():.3g} > {tol:.3g} at {list(worst)}; "',
    '        f"{name}{list(worst)} = {got[worst]:.6g} (expected {want[worst]:.6g})"',
    "    )",
]


def _grad_script(
    case: Any, w: CallWords, tol: dict[str, float], passed: Case, flag: bool | str, kind: str
) -> list[str]:
    """The rest of a gradient case's script after its inputs: ``d_out`` (and keep, bias), attnlab's float64
    gradients, the call of the backward as the checker made it, and the assert of ``kind``."""
    n_q, n_k = case.q.shape[-2], case.k.shape[-2]
    kv, fold = "k, v", "x"
    if case.gqa:
        g, h_kv = case.q.shape[-3] // case.k.shape[-3], case.k.shape[-3]
        tile = w.gqa_map == "tile"
        kv = "kv_heads(k), kv_heads(v)"
        rep = f"np.tile(x, (1,) * (x.ndim - 3) + ({g}, 1, 1))" if tile else f"np.repeat(x, {g}, axis=-3)"
        split = f"({g}, {h_kv})" if tile else f"({h_kv}, {g})"
        fold = f"x.reshape(*x.shape[:-3], *{split}, *x.shape[-2:]).sum(axis={-4 if tile else -3})"
        lines = [f"kv_heads = lambda x: {rep}  # noqa: E731 (GQA: K/V heads to q's, {w.gqa_map})"]
    else:
        lines = []
    lines += [f"d_out = {_literal(case.d_out)}  # [..., h, n_q, d_v], the upstream gradient"]
    drop = ""
    if case.keep is not None:
        lines += [f"keep = {_literal(case.keep)}  # [..., h, n_q, n_k], the dropout keep mask (True = kept)"]
        lines += [f"p = {case.dropout_p!r}"]
        drop = ", dropout=attnlab.Dropout(p, keep)"
    bias = "None"
    if case.bias is not None:
        lines += [f"bias = {_literal(case.bias)}  # [..., h, n_q, n_k]"]
        bias = "bias"
    causal = f'"{case.causal}"' if case.causal else "False"
    scale = "" if case.scale is None else f", scale={case.scale!r}"
    lines += [
        "from attnlab.core import attention_trace",
        "",
        f'trace = attention_trace(q, {kv}, allowed, causal={causal}{scale}, bias={bias}, masked_rows="zero")',
        f"g = attnlab.attention_backward(trace, d_out{drop})",
        f"fold = lambda x: {fold}  # noqa: E731 (K/V gradients summed over each group's query heads)",
        'expected = {"dq": np.asarray(g.dq), "dk": fold(np.asarray(g.dk)), "dv": fold(np.asarray(g.dv))}',
    ]
    if case.bias is not None:
        lines.append('expected["dbias"] = np.asarray(g.dbias)')
    visible = "np.ones(q.shape[:-1] + (k.shape[-2],), bool)" if case.mask is None else "allowed"
    if case.causal:
        visible += f' & attnlab.masks.causal({n_q}, {n_k}, align="{case.causal}")'
    lines.append(f"rows = ({visible}).any(axis=-1)  # query rows with a key to attend")
    if w.backward == "flash" and not w.forward:
        weights = "np.asarray(trace.weights)" + (" * keep / (1 - p)" if case.keep is not None else "")
        v_heads = kv.split(", ")[1]
        lines += [
            f"out = H(T({weights} @ {v_heads}))  # the forward's output, rounded to {case.dtype}",
            "lg = np.asarray(trace.logits)",
            "with np.errstate(divide='ignore', invalid='ignore'):",
            "    m = np.max(lg, axis=-1, keepdims=True)",
            "    m = np.where(np.isfinite(m), m, 0.0)",
            "    lse = (m + np.log(np.sum(np.exp(lg - m), axis=-1, keepdims=True)))[..., 0]  # [..., h, n_q], nats",
        ]
        if w.lse_units == "log2":
            lines.append("lse = lse / np.log(2)  # the backward takes log2 units")
        lse_dt = "float64" if case.dtype == "float64" else "float32"
        lines += [
            f"def LSE(x):  # the lse as the checker passes it ({lse_dt})",
            f"    return E(np.asarray(x, dtype=np.{lse_dt}))",
        ]
    if w.forward:
        lines += ["import inspect", "", w.forward]
    lines += ["", *_grad_call(w, case, passed, flag, kind), ""]
    lines += [
        "try:",
        "    grads = call(q, k, v)",
        "except Exception as err:  # a crash is a failure too",
        '    raise AssertionError(f"fn raised {type(err).__name__}: {err}") from err',
    ]
    if kind == "gradients-dtype":
        want = case.dtype
        return [*lines, f'assert all(d == "{want}" for d in call.dtypes.values()), f"gradient dtypes {{call.dtypes}}"']
    if kind == "gradients-mutates":
        return [*lines, 'assert not call.mutated, f"fn wrote into its inputs {call.mutated}"']
    return [*lines, f"TOL = {tol!r}  # the checker's bound for each gradient in this case", *_GRAD_COMPARE]


def _grad_call(w: CallWords, case: Any, passed: Case, flag: bool | str, kind: str) -> list[str]:
    """``call(q, k, v)``: the backward called as the checker called it, its gradients as float64 NumPy."""
    lay = "np.swapaxes(x, -2, -3)" if w.layout == "bnhd" else "x"
    lines = ["def call(q, k, v):", '    """fn called as the checker called it; its gradients, as float64 NumPy."""']
    lines.append(f"    L = lambda x: {lay}  # noqa: E731 (layout {w.layout})")
    kwargs = []
    if passed.mask is not None and w.mask_arg:
        lines += _mask_argument(w, case.dtype)
        kwargs.append(f"{w.mask_arg}=m")
    if flag and w.causal_arg:
        kwargs.append(f"{w.causal_arg}={flag!r}")
    if case.scale is not None and w.scale_arg:
        kwargs.append(f"{w.scale_arg}={case.scale!r}")
    if case.gqa and w.gqa_arg:
        kwargs.append(f"{w.gqa_arg}=True")
    if case.keep is not None:
        kwargs += [f"{w.keep_arg}=E(keep)", "dropout_p=p"]
    if case.bias is not None:
        kwargs.append(f"{w.bias_arg}=T(bias)")
    lines += [
        f"    kw = dict({', '.join(kwargs)})",
        f"    BIAS = {w.bias_arg!r}",
        "    args = [T(L(x)) for x in (q, k, v)]",
        "    dO = T(L(d_out))",
    ]
    mutates = kind == "gradients-mutates"
    lines.append("    kept = [H(a).copy() for a in (*args, dO)]" if mutates else "    call.mutated = None")
    if mutates:
        lines.append("    call.mutated = []")
    how = w.backward if w.backward in ("plain", "flash") else ("jax" if w.framework == "jax" else "torch")
    lines += _GRAD_CALLS["flash+forward" if how == "flash" and w.forward else how]
    if mutates:
        lines.append(
            '    call.mutated += [n for n, a, b in zip(("q", "k", "v", "d_out"), (*args, dO), kept) '
            "if not np.array_equal(H(a), b, True)]"
        )
    lines += [
        "    if isinstance(grads, dict):  # {'dq': ..., 'dk': ..., 'dv': ...}",
        "        grads = [grads[n] for n in ('dq', 'dk', 'dv', 'dbias') if grads.get(n) is not None]",
        "    if hasattr(grads, 'dq'):  # a result object",
        "        extra = [x for x in [getattr(grads, 'dbias', None)] if x is not None]",
        "        grads = [grads.dq, grads.dk, grads.dv, *extra]",
        "    names = ('dq', 'dk', 'dv', 'dbias')",
        '    call.dtypes = {n: str(x.dtype).replace("torch.", "") for n, x in zip(names, grads)}',
        "    return {n: H(x) if n == 'dbias' else L(H(x)) for n, x in zip(names, grads)}",
    ]
    return lines
