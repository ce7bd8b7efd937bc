"""The preflight: which dtypes and capabilities the function supports, each tried on two cases.

A capability (``mask``, ``causal``, ``cross``, ...) is *supported* when some of its cases work, *unsupported* when
it is declared so or every attempt is a clean refusal (``NotImplementedError``, the library refusing the input, or
an error whose message names what is unsupported), and *crashed* otherwise (a ``crash`` finding). The same
preflight serves every strategy of the session.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from .cases import GRID
from .registry import ProbeAbort
from .runner import CallError, Outcome

if TYPE_CHECKING:
    from .session import Session

__all__ = ["preflight", "raised", "refusal"]

#: How a call of each capability is described, and the words that make an error a clean refusal of it.
_CAP_PHRASE = {
    "mask": "with a mask",
    "causal": "with the causal flag",
    "scale": "with a scale argument",
    "cross": "with n_q != n_k",
    "dv": "with d_v != d_k",
    "rank": "on 3-D inputs [h, n, d]",
    "gqa": "with fewer K/V heads than query heads",
    "causal-cross": "causal with n_q != n_k",
}
_SHAPE_CAPS = ("cross", "dv", "rank", "gqa", "causal-cross")
#: Messages of a shape error inside the function (NumPy, PyTorch): they name no unsupported argument.
_INTERNAL_SHAPE = (
    r"could not be broadcast|could not broadcast|must match the size of tensor|doesn't match the broadcast shape"
    r"|expanded size of the tensor|cannot reshape array|is invalid for input of size|shapes cannot be multiplied"
    r"|mismatch in its core dimension"
)
#: A library op called with arguments it cannot take: a bug in the function, whatever argument it names.
_MISUSED_OP = r"received an invalid combination of arguments|has no attribute|is not defined"
_REFUSAL_WORDS = {
    # f16, bf16...: also inside an XLA precision name ("The precision 'F16_F16_F32' is not supported")
    "float64": r"float64|double|(?<![a-z0-9])f64(?![0-9])|dtype",
    "float32": r"float32|\bsingle\b|'float'|(?<![a-z0-9])f32(?![0-9])|dtype",
    "float16": r"float16|\bhalf\b|(?<![a-z0-9])f16(?![0-9])|dtype",
    "bfloat16": r"bfloat16|(?<![a-z0-9])bf16(?![0-9])|dtype",
    "mask": r"\bmask(s|ing)?\b|\battn_mask\b|\bkey_padding_mask\b",  # not masked_fill / masked_softmax
    "causal": r"causal",
    "scale": r"scale",
    "cross": r"n_q|n_k|length|\bseq|square|same|cross|shape|size",
    "dv": r"d_v|\bdv\b|value|head.?dim|dimension|shape|size",
    "rank": r"rank|\bdim|ndim|[234]-?d\b|shape",
    "gqa": r"gqa|group|head|shape",
    "causal-cross": r"causal|align|n_q|n_k|square|shape",
}


def preflight(s: Session) -> None:
    """Find the dtypes and capabilities the function supports, with two attempts each."""
    s.unsupported = dict(s.backend.structural)
    base = [(lbl, g, req, ex) for lbl, g, req, ex in GRID if not req]
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        if dtype in s.unsupported:
            continue
        s.case_key = f"preflight {dtype}"
        outs = [s.call(s.make(g, dtype, label=f"{lbl} {dtype}")) for lbl, g, _, _ in base]
        classify(s, dtype, outs, is_dtype=True)
    if not s.dtypes:
        raise ProbeAbort
    s.primary = s.dtypes[0]
    for cap in ("mask", "causal", "scale", "cross", "dv", "rank", "gqa", "causal-cross"):
        if cap in s.unsupported:
            continue
        if cap == "causal" and s.causal_mode == "mask" and "mask" in s.crashed:
            s.crashed[cap] = "needs the mask argument, which crashed on every attempt"
            continue
        if cap == "causal" and s.causal_mode == "mask" and "mask" in s.unsupported:
            s.unsupported[cap] = "no causal flag, and the mask is not supported"
            continue
        cases = [(lbl, g, ex) for lbl, g, req, ex in GRID if req and req[0] == cap]
        if any(r not in s.caps for lbl, g, req, ex in GRID if req and req[0] == cap for r in req[1:]):
            continue
        s.case_key = f"preflight {cap}"
        outs = [s.call(s.make(g, s.primary, label=lbl, **ex)) for lbl, g, ex in cases]
        classify(s, cap, outs)
    s.case_key = None


def classify(s: Session, cap: str, outs: list[Outcome], *, is_dtype: bool = False) -> None:
    errs = [o for o in outs if o.error is not None]
    bad = [o for o in outs if o.returned.problem is not None]
    if not errs and not bad:
        supported(s, cap, outs, is_dtype)
        return
    if cap == "cross" and len(errs) == len(outs) and "mask" in s.caps and not s.crashed.get("mask"):
        # n_q != n_k fails without a mask: does it work with one (a default mask built (n_q, n_q))?
        g = next(g for lbl, g, req, _ in GRID if req == ("cross",))
        with_mask = s.call(s.make(g, s.primary, label="cross, with a mask", mask=np.ones((1,), bool)))
        if with_mask.ok:
            s.crash(
                errs[0],
                f"your function {raised(errs[0].error)} on every call with n_q != n_k without a mask "
                f"({s.backend.resolved.mask_arg or 'mask'}=None); it works with one",
            )
            supported(s, cap, [with_mask], is_dtype)
            return
    if len(errs) == len(outs) and all(refusal(s, cap, o.error) for o in errs):
        e = errs[0].error
        assert e is not None  # errs raised
        why = "".join(f" ({w[:200]})" for w in e.warned if re.search(_REFUSAL_WORDS[cap], w, flags=re.IGNORECASE))
        s.unsupported[cap] = f"refused on every attempt: {errs[0].error_text.splitlines()[0][:200]}{why[:300]}"
        return
    if len(errs) + len(bad) < len(outs):  # it works on some inputs of this capability: keep testing it
        for o in errs:
            s.crash(o)
        supported(s, cap, outs, is_dtype)
        return
    first = errs[0] if errs else bad[0]
    if is_dtype and errs and "mask" not in s.unsupported:
        # no call without a mask worked: does the function need one?
        probe = s.make(GRID[0][1], cap, label=f"base {cap}, with a mask", mask=np.ones((1, 1, 1, 1), bool))
        with_mask = s.call(probe)
        if with_mask.ok:
            s.crash(
                first,
                f"your function {raised(first.error)} on every call without a mask "
                f"({s.backend.resolved.mask_arg or 'mask'}=None) in {cap}; it works with one",
            )
            supported(s, cap, [with_mask], is_dtype)
            return
    what = f"in {cap}" if is_dtype else _CAP_PHRASE[cap]
    reason = "crashed on every attempt (see the crash finding)"
    if errs:
        works = "" if is_dtype else " (it works without it)"
        s.crash(
            first,
            f"your function {raised(first.error)} on every call {what}{works}; that is not a clean "
            "refusal (NotImplementedError, or an error whose message names what is unsupported)",
        )
    else:
        reason = "no usable return value on any attempt (see the crash finding)"
    s.crashed[cap] = reason


def supported(s: Session, cap: str, outs: list[Outcome], is_dtype: bool) -> None:
    if is_dtype:
        s.dtypes.append(cap)
    else:
        s.caps.add(cap)
    s.grid.extend(o for o in outs if o.error is None)


def refusal(s: Session, cap: str, e: CallError | None) -> bool:
    """A clean refusal: NotImplementedError, the library refusing the input, or a ValueError, TypeError or
    RuntimeError whose message, or a warning the call gave before it (``CallError.warned``), names ``cap`` (its
    argument, dtype or shape)."""
    assert e is not None  # called for outcomes that raised
    if e.died or e.type_name in ("SystemExit", "KeyboardInterrupt", "WorkerExit"):
        return False
    if e.not_implemented or e.library:
        return True
    if cap == "rank" and s.strategy.name == "gradients":
        return True  # a backward written for [B, h, n, d] alone (as most are): its 3-D inputs are not tested

    if not {"ValueError", "TypeError", "RuntimeError"} & set(e.bases):
        return False  # AttributeError, NameError, IndexError, AssertionError...: a bug, whatever it says
    if re.search(_MISUSED_OP, e.message, flags=re.IGNORECASE):
        return False  # torch.masked_fill(x, bad_args), a typo caught as TypeError: a crash, not a refusal
    if cap == "dv" and re.search(_INTERNAL_SHAPE, e.message, flags=re.IGNORECASE):
        return False  # an output allocated like q, a broadcast inside the function: a crash, not a refusal
    r = s.backend.resolved
    names = {"mask": r.mask_arg, "causal": r.causal_arg, "scale": r.scale_arg}
    words = _REFUSAL_WORDS[cap] + (f"|\\b{re.escape(names[cap])}\\b" if names.get(cap) else "")
    if cap in _SHAPE_CAPS:  # a shape written out names it: "expects [B, h, n, d]", "(1, 5, 2, 6)"
        words += r"|\[[\w\s,.]*\]|\(\d+(?:,\s*\d+)+\)"
    return any(re.search(words, text, flags=re.IGNORECASE) for text in (e.message, *e.warned))


def raised(e: CallError | None) -> str:
    """``raised ValueError``, ``called sys.exit(3) (SystemExit)``, ``ended its process: ...``."""
    assert e is not None  # called for outcomes that raised
    if e.died:
        return f"ended the process it ran in ({e.message.split(';')[0]})"
    if e.type_name == "SystemExit":
        return f"called sys.exit({e.exit_status!r}) (SystemExit)"
    return f"raised {e.type_name}"
