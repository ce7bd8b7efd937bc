"""The ``mods`` probe: a flex_attention ``mask_mod`` / ``score_mod`` of yours against the dense rule it claims.

``check(fn, mask_mod=my_mod, claims="causal")`` (or ``score_mod=``, and ``claims`` a callable ``rule(n_q, n_k)``
returning the dense boolean mask ``[n_q, n_k]``, True = may attend) evaluates the mod as flex_attention does
(``torch.vmap`` over ``b, h, q_idx, kv_idx``, int32 indices) on every geometry of :data:`GEOMETRIES` (one query,
n_q < n_k and n_q > n_k, sizes below, at and above flex's 128-block, B = 2 and h = 3) and compares it entry by
entry with the rule. The first difference, in the smallest geometry that shows one, is a ``mod-mismatch`` finding
that says what kind of difference it is (:func:`describe`): the arguments swapped (the wrong causal direction),
the other causal alignment, one diagonal off (an off-by-one bound), the rule inverted, a batch element or head
apart, or a ``score_mod`` that also rescales or shifts the scores it keeps (flex applies ``scale`` itself).

The battery checks the function itself with masks as flex masks (a ``block_mask`` built from the dense mask); a
block mask depends only on its ``mask_mod``'s values, so a mod equal to its rule everywhere here and a clean
battery together say the kernel with your mod computes the rule.

>>> import numpy as np
>>> from attnlab import masks
>>> rule = masks.window(5, left=2)
>>> print(describe(masks.window(5, left=3)[None, None], rule)[:94])
the mask_mod allows 2 entries the claimed rule blocks, all on the diagonal kv_idx - q_idx = -3
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import masks as _masks
from ..registry import ProbeSkip, probe
from ..spec import CLAIMS, UsageError

if TYPE_CHECKING:
    from ..session import Session

__all__ = ["GEOMETRIES", "claimed_mask", "describe", "evaluate_mask_mod", "evaluate_score_mod", "mods"]

#: ``(B, h, n_q, n_k)`` of the cases a mod is evaluated on, in order: square first (where a difference is told
#: apart from the other causal alignment), then one query, n_q < n_k and n_q > n_k, sizes that do not divide flex's
#: 128-row blocks, and more than one block.
GEOMETRIES = (
    (2, 3, 1, 1),
    (2, 3, 5, 5),
    (2, 3, 130, 130),
    (2, 3, 1, 17),
    (2, 3, 3, 7),
    (2, 3, 7, 3),
    (2, 3, 17, 33),
    (2, 3, 33, 17),
    (2, 3, 113, 203),
    (2, 3, 203, 113),
)
#: The drawn rows of a difference, at most this many keys wide.
_DRAWN = 40


def _vmapped(torch: Any, fn: Callable[..., Any], prefix: tuple[int, ...] = ()) -> Callable[..., Any]:
    """``fn(*prefix_args, b, h, q_idx, kv_idx)`` mapped over every index, as flex_attention evaluates a mod."""
    for dims in ((None, None, None, 0), (None, None, 0, None), (None, 0, None, None), (0, None, None, None)):
        fn = torch.vmap(fn, in_dims=(*prefix, *dims))
    return fn


def _indices(torch: Any, shape: tuple[int, ...]) -> list[Any]:
    return [torch.arange(n, dtype=torch.int32) for n in shape]


def evaluate_mask_mod(mod: Callable[..., Any], shape: tuple[int, int, int, int]) -> np.ndarray:
    """``mod(b, h, q_idx, kv_idx)`` on every index of ``shape`` ``(B, h, n_q, n_k)``: bool ``[B, h, n_q, n_k]``."""
    import torch

    out = _vmapped(torch, mod)(*_indices(torch, shape))
    return np.broadcast_to(np.asarray(out.detach().cpu().numpy(), dtype=bool), shape)


def evaluate_score_mod(mod: Callable[..., Any], scores: np.ndarray) -> np.ndarray:
    """``mod(score, b, h, q_idx, kv_idx)`` on every entry of ``scores [B, h, n_q, n_k]`` (float64)."""
    import torch

    out = _vmapped(torch, mod, (0,))(torch.from_numpy(scores), *_indices(torch, scores.shape))
    return np.broadcast_to(np.asarray(out.detach().cpu().double().numpy()), scores.shape)


def claimed_mask(claims: Any, n_q: int, n_k: int) -> np.ndarray:
    """The dense mask ``[n_q, n_k]`` (or one broadcasting to ``[B, h, n_q, n_k]``) that ``claims`` names: one of
    :data:`~attnlab.checker.spec.CLAIMS` or a callable ``rule(n_q, n_k)``."""
    if isinstance(claims, str):
        align = claims.partition(":")[2] or "top_left"
        return _masks.causal(n_q, n_k, align=align)  # type: ignore[arg-type]  # CLAIMS names the alignments
    try:
        rule = np.asarray(claims(n_q, n_k))
        ok = rule.dtype == np.bool_ and rule.shape[-2:] == (n_q, n_k)
    except Exception as err:
        raise UsageError(
            f"claims: the rule raised {type(err).__name__} for n_q={n_q}, n_k={n_k} ({str(err).splitlines()[0]}); "
            "it must give the dense mask for every geometry (e.g. masks.window(..., align='top_left'))"
        ) from None
    if not ok:
        raise UsageError(
            f"claims: the rule returned {rule.dtype} {rule.shape} for n_q={n_q}, n_k={n_k}; expected a bool mask "
            f"[{n_q}, {n_k}] (True = may attend)"
        )
    return rule


def _diagonals(pos: np.ndarray) -> np.ndarray:
    return np.unique(pos[:, 3] - pos[:, 2])


def describe(mod: np.ndarray, rule: np.ndarray, what: str = "mask_mod", claims: Any = None) -> str:
    """What kind of difference there is between ``mod [B, h, n_q, n_k]`` and the claimed ``rule`` (broadcasting to
    it): the arguments swapped, the other causal alignment, one diagonal off, inverted, or otherwise."""
    rule = np.broadcast_to(rule, mod.shape)
    n_q, n_k = mod.shape[-2:]
    extra, missing = np.argwhere(mod & ~rule), np.argwhere(~mod & rule)
    first = (extra if len(extra) else missing)[0] if len(extra) or len(missing) else None
    at = "" if first is None else f"; first at b={first[0]}, h={first[1]}, q_idx={first[2]}, kv_idx={first[3]}"
    if first is None:
        return f"the {what} equals the claimed rule"
    same = (mod == mod[:1, :1]).all()
    if not same:
        return f"the {what} differs between batch elements or heads, the claimed rule does not{at}"
    m, r = mod[0, 0], rule[0, 0]
    if n_q == n_k and (m == r.T).all() and not (r == r.T).all():
        return (
            f"the {what} is the claimed rule transposed: q_idx and kv_idx swapped (for causal: the wrong direction, "
            f"query i sees the keys after it){at}"
        )
    if isinstance(claims, str) and n_q != n_k:
        other = "bottom_right" if claims.endswith("top_left") or claims == "causal" else "top_left"
        if (m == _masks.causal(n_q, n_k, align=other)).all():  # type: ignore[arg-type]  # one of CLAIMS' alignments
            return f"the {what} is causal with the {other} alignment, not the claimed one (n_q != n_k){at}"
    if (m == ~r).all():
        return f"the {what} is the claimed rule inverted (True where the rule blocks){at}"
    parts = []
    for pos, verb in ((extra, "allows {n} entries the claimed rule blocks"), (missing, "blocks {n} entries it allows")):
        if len(pos):
            d = _diagonals(pos)
            on = f", all on the diagonal kv_idx - q_idx = {d[0]}" if len(d) == 1 and len(pos) > 1 else ""
            parts.append(verb.format(n=len(pos)) + on)
    one_diagonal = all(len(_diagonals(p)) == 1 for p in (extra, missing) if len(p))
    why = (
        " (an off-by-one bound: `<` where `<=` is meant, or a window one key too wide or narrow)"
        if one_diagonal
        else ""
    )
    return f"the {what} {' and '.join(parts)}{why}{at}"


def _drawn(a: np.ndarray, q: int) -> str:
    return _masks.to_string(a[q : q + 1, :_DRAWN]).replace(" ", "")


def _kept_scores(s: Session, got: np.ndarray, scores: np.ndarray, keep: np.ndarray, shape: tuple) -> bool:
    """A ``mod-mismatch`` when the scores a score_mod keeps are not the scores it was given; True when they are."""
    if not keep.any():
        return True
    g, x = got[keep], scores[keep]
    if np.allclose(g, x, rtol=1e-12, atol=1e-12):
        return True
    c = float(g @ x / (x @ x))
    if np.allclose(g, c * x, rtol=1e-9, atol=1e-12):
        how = (
            f"multiplies the scores it keeps by {c:.6g} (flex_attention applies scale= itself before the score_mod: "
            "scaling again applies it twice)"
        )
    else:
        how = f"changes the scores it keeps by up to {float(np.max(np.abs(g - x))):.3g} (the claimed rule is a mask)"
    s.bug("mod-mismatch", f"your score_mod {how}", f"geometry B, h, n_q, n_k = {shape}; claims={_name(s)}", calls=False)
    return False


def _name(s: Session) -> str:
    c = s.spec.claims
    if isinstance(c, functools.partial):
        args = [repr(a) for a in c.args] + [f"{k}={v!r}" for k, v in c.keywords.items()]
        return f"{getattr(c.func, '__name__', '?')}(n_q, n_k, {', '.join(args)})"
    return repr(c) if isinstance(c, str) else getattr(c, "__name__", type(c).__name__)


def _mod_of(s: Session, key: str) -> Any:
    value = getattr(s.spec, key)
    if isinstance(value, str):
        from ..target import load_target

        value = load_target(value)
    return value


@probe("mods")
def mods(s: Session) -> None:
    """The ``mods`` probe: the declared ``mask_mod`` / ``score_mod`` equals the rule it ``claims`` (module doc)."""
    if s.spec.mask_mod is None and s.spec.score_mod is None:
        raise ProbeSkip("no mask_mod= or score_mod= declared")
    s.case_key = "mods: the declared mods against the claimed rule"
    claims = _mod_of(s, "claims") if s.spec.claims not in CLAIMS else s.spec.claims
    for what in ("mask_mod", "score_mod"):
        mod = _mod_of(s, what)
        if mod is None:
            continue
        for shape in GEOMETRIES:
            rule = np.broadcast_to(claimed_mask(claims, *shape[2:]), shape)
            try:
                if what == "mask_mod":
                    got, scores = evaluate_mask_mod(mod, shape), None
                else:
                    scores = s.rng.normal(0, 1, shape)
                    out = evaluate_score_mod(mod, scores)
                    got = ~np.isneginf(out)
            except Exception as err:
                s.bug(
                    "mod-mismatch",
                    f"your {what} cannot be evaluated as flex_attention evaluates it (torch.vmap over b, h, q_idx, "
                    f"kv_idx): {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}",
                    f"geometry B, h, n_q, n_k = {shape}",
                    calls=False,
                )
                break
            if (got != rule).any():
                b, h, q = (int(i) for i in np.argwhere(got != rule)[0][:3])
                s.bug(
                    "mod-mismatch",
                    f"your {what} differs from the rule it claims ({_name(s)}): {describe(got, rule, what, claims)}",
                    f"geometry B, h, n_q, n_k = {shape}; query {q} of b={b}, h={h}: {what} "
                    f"{_drawn(got[b, h], q)}, claimed {_drawn(rule[b, h], q)} (■ may attend)",
                    calls=False,
                )
                break
            if scores is not None and not _kept_scores(s, out, scores, got & rule, shape):
                break
