"""Gradients of attention under named wrong backward passes: the hypotheses the gradient battery tests.

:func:`attention_grads` computes ``dq, dk, dv, dbias`` of ``O = softmax(Q Kᵀ · scale + bias, masked) V`` (with an
optional dropout keep mask) step by step, FlashAttention-2's way (``P``, ``dV = Pᵀ dO``, ``dP = dO Vᵀ``,
``delta = rowsum(dO ∘ O)``, ``dS = P ∘ (dP - delta)``, ``dQ = dS K · scale``, ``dK = dSᵀ Q · scale``). Every step
can be rounded to a dtype (``dtype=``: the same-precision naive baseline of the tolerance rule) or replaced by a
known mistake (``variant=``: a :class:`Variant`). :func:`hypotheses` lists the named mistakes of a case, each with
its finding code and a sentence; the battery recomputes the gradients under each one and names the one that
matches what the function returned.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> q, k, v, do = (rng.standard_normal((1, 1, 3, 2)) for _ in range(4))
>>> g = attention_grads(q, k, v, do)
>>> bad = attention_grads(q, k, v, do, variant=Variant(jacobian="none"))
>>> bool(np.allclose(g["dv"], bad["dv"])), bool(np.allclose(g["dq"], bad["dq"]))
(True, False)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from .. import masks as _masks
from .adapters import round_to
from .tolerance import expand_kv

__all__ = ["BLOCKS", "Variant", "attention_grads", "fitted_dv_lse", "fitted_lse", "hypotheses", "reduce_kv"]

#: Block sizes a tiled backward may use (the accumulate hypotheses try each one smaller than the sequence).
BLOCKS = (*range(1, 17), 20, 24, 32, 48, 64, 96, 128)
#: Codes whose mistakes change P or the dropout (their delta may come from the real O or the backward's own P).
_SELF_DELTA = ("grad-masked-leak", "grad-causal", "grad-lse", "grad-dropout", "grad-transposed")


@dataclass(frozen=True)
class Variant:
    """One wrong (or, with the defaults, the right) backward pass.

    Attributes:
        jacobian: the softmax Jacobian in dS: ``"full"`` (right, ``dS = P ∘ (dP - delta)``), ``"none"`` (``dS = P ∘
            dP``: the ``- delta`` term dropped), ``"diagonal"`` (``dS = P ∘ (1 - P) ∘ dP``: each weight
            differentiated as if it depended on its own score only).
        delta: ``"dodo"`` ``rowsum(dO ∘ O)`` (right), ``"dp"`` ``rowsum(dP)``, ``"p"`` ``rowsum(P)``, ``"do"``
            ``rowsum(dO)``, ``"dp-allowed"`` (``rowsum(dP)`` over the allowed keys), ``"self"``
            ``rowsum(dP ∘ P)`` from the backward's own (possibly wrong) P and dP: the same as ``"dodo"`` unless P or
            the dropout is wrong, as in a backward that recomputes its own forward.
        scale_dq, scale_dk: the power of ``scale`` in dQ and dK (1 right, 0 missing, 2 applied twice).
        transposed: factors used transposed: ``"dv"`` (``P dO``), ``"dk"`` (``dS Q``), ``"dq"`` (``dSᵀ K``),
            ``"dp"`` (``(dO Vᵀ)ᵀ``); square cases only.
        p_mask: ``"mask"`` (right), ``"none"``: the backward recomputes P from the unmasked logits with the
            forward's lse (``exp(s - lse)`` on every key); ``"softmax"``: a softmax of the unmasked logits.
        p_causal: ``(alignment, shift)``: the backward recomputes P under another causal mask than the forward's
            (key j allowed for query i when ``j <= i + offset + shift``, offset 0 top-left, ``n_k - n_q``
            bottom-right; alignment ``"none"``: no causal mask at all, the user mask only), with ``p_norm``
            ``"lse"`` (``exp(s - lse)``, the forward's lse) or ``"softmax"``.
        causal_added: with ``p_causal``, the forward has no causal mask and the backward adds this one (a causal
            flag the backward does not read, or reads as always on).
        p_where: where the wrong P is used: ``"all"``, ``"dv"`` (only in dV = Pᵀ dO) or ``"ds"`` (only in dS).
        lse: the lse the backward's P comes from: ``"right"``, ``"nomax"`` (``log(sum exp(s - m))``, the max not
            added back), ``"log2"`` (a log2-units lse read as nats), ``"nats-as-log2"`` (the reverse), ``"axis"``
            (logsumexp over the queries), ``"unmasked"`` (logsumexp over every key, masked ones too), ``"shifted"``
            (``lse + lse_shift``: any other per-row error, fitted by :func:`fitted_lse`).
        lse_shift: with ``lse="shifted"``, the per-row error of the lse (nested tuples shaped ``[..., n_q, 1]``,
            so that a variant stays a hashable value).
        gqa: how dK/dV of a K/V head come from its query heads: ``"sum"`` (right), ``"first"`` (one head's),
            ``"mean"``, ``"tile"`` (the other head mapping).
        accumulate: ``(tensor, block, which)``: ``tensor`` ``"kv"``, ``"k"`` or ``"v"`` (dK and dV, or one of
            them, keep only one query block's contribution) or ``"q"`` (dQ keeps one key block's), ``which``
            ``"last"`` or ``"first"``.
        dropout: ``"same"`` (right), ``"off"`` (the backward ignores the keep mask), ``"noscale"`` (keep mask
            without ``1/(1-p)``), ``"twice"`` (``1/(1-p)²``), ``"dv"`` (only dV drops), ``"dp"`` (only dP drops),
            ``"transposed"`` (the keep mask transposed, square cases).
        default_scale: dQ and dK use 1/sqrt(d_k) where the forward was given another ``scale``.
    """

    jacobian: str = "full"
    delta: str = "dodo"
    scale_dq: int = 1
    scale_dk: int = 1
    transposed: frozenset[str] = frozenset()
    p_mask: str = "mask"
    p_causal: tuple[str, int] | None = None
    causal_added: bool = False
    p_norm: str = "lse"
    p_where: str = "all"
    lse: str = "right"
    gqa: str = "sum"
    accumulate: tuple[str, int, str] | None = None
    dropout: str = "same"
    default_scale: bool = False
    lse_shift: tuple = ()


def reduce_kv(x: np.ndarray, h_kv: int, mapping: str = "interleave", how: str = "sum") -> np.ndarray:
    """GQA: per-query-head gradients ``[..., h, n, d]`` summed back to ``h_kv`` K/V heads (the adjoint of
    :func:`~attnlab.checker.tolerance.expand_kv` with the same ``mapping``); ``how="mean"`` or ``"first"`` are the
    wrong reductions a backward may use."""
    h = x.shape[-3]
    if h == h_kv:
        return x
    g = h // h_kv
    lead = x.shape[:-3]
    if mapping == "tile":  # head i reads K/V head i % h_kv: [g, h_kv]
        grouped = x.reshape(*lead, g, h_kv, *x.shape[-2:])
        axis = -4
    else:  # head i reads K/V head i // g: [h_kv, g]
        grouped = x.reshape(*lead, h_kv, g, *x.shape[-2:])
        axis = -3
    if how == "first":
        return np.take(grouped, 0, axis=axis)
    if how == "mean":
        return grouped.mean(axis=axis)
    return grouped.sum(axis=axis)


def _softmax(s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``P``, the row max and the row sum of ``exp(s - max)`` (``-inf`` entries 0; empty rows all 0)."""
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    den = np.sum(e, axis=-1, keepdims=True)
    return np.divide(e, den, out=np.zeros_like(e), where=den > 0), m, den


def _dropout(keep: Any, keep_f: Any, dropout_p: float, full: tuple[int, ...], work: Any, how: str) -> tuple[Any, Any]:
    """The dropout factors the backward applies to P for dV and to dP: the forward's ``keep_f`` (``how="same"``),
    none, unscaled, scaled twice, transposed, or only on one side (``"dv"``, ``"dp"``)."""
    if keep is None or how == "same":
        return keep_f, keep_f
    kb = np.broadcast_to(np.asarray(keep, bool), full).astype(work)
    alt = {
        "off": None,
        "noscale": kb,
        "twice": kb / work((1.0 - dropout_p) ** 2),
        "transposed": np.swapaxes(kb, -1, -2) / work(1.0 - dropout_p) if full[-2] == full[-1] else keep_f,
    }
    if how in alt:
        return alt[how], alt[how]
    return (keep_f, None) if how == "dv" else (None, keep_f) if how == "dp" else (keep_f, keep_f)


def _delta(how: str, dp: Any, p_ds: Any, ok: Any, do: Any, out: Any) -> Any:
    """delta per query row: rowsum(dO ∘ O) (right), or from the backward's own P and dP (``"self"``, as a backward
    that recomputes O does), rowsum(dP), rowsum(dP) over the allowed keys, rowsum(P) or rowsum(dO)."""
    if how == "self":
        return np.sum(dp * p_ds, axis=-1, keepdims=True)
    if how == "dp":
        return np.sum(dp, axis=-1, keepdims=True)
    if how == "dp-allowed":
        return np.sum(np.where(ok, dp, 0.0), axis=-1, keepdims=True)
    if how == "p":
        return np.sum(p_ds, axis=-1, keepdims=True)
    if how == "do":
        return np.sum(do, axis=-1, keepdims=True)
    return np.sum(do * out, axis=-1, keepdims=True)


def _input_grads(
    ds_q: Any, ds_k: Any, dv_x: Any, q: Any, kx: Any, sc: Any, var: Variant, h_kv: int, mapping: str, r: Any
) -> tuple[Any, Any, Any]:
    """dQ = dS K and dK = dSᵀ Q (each scaled, transposed as ``var`` says), and dK, dV summed over GQA groups."""
    dq = r(ds_q @ kx) if "dq" not in var.transposed else r(np.swapaxes(ds_q, -1, -2) @ kx)
    dk_x = r(np.swapaxes(ds_k, -1, -2) @ q) if "dk" not in var.transposed else r(ds_k @ q)
    sg = q.dtype.type(1.0 / math.sqrt(q.shape[-1])) if var.default_scale else sc
    dq = r(dq * sg**var.scale_dq)
    dk_x = r(dk_x * sg**var.scale_dk)
    how, mp = var.gqa, mapping
    if how == "tile":
        how, mp = "sum", ("tile" if mapping == "interleave" else "interleave")
    dk = reduce_kv(dk_x, h_kv, mp, how)
    dv = reduce_kv(dv_x, h_kv, mp, how)
    return dq, dk, dv


def attention_grads(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    d_out: np.ndarray,
    allowed: np.ndarray | None = None,
    *,
    causal: str | None = None,
    scale: float | None = None,
    bias: np.ndarray | None = None,
    keep: np.ndarray | None = None,
    dropout_p: float = 0.0,
    mapping: str = "interleave",
    dtype: str = "float64",
    variant: Variant | None = None,
) -> dict[str, Any]:
    """Gradients ``{"dq", "dk", "dv", "dbias", "out", "p"}`` (``p``: the forward's weights) for ``d_out``.

    Shapes: ``q [..., h, n_q, d_k]``, ``k [..., h_kv, n_k, d_k]``, ``v [..., h_kv, n_k, d_v]``,
    ``d_out [..., h, n_q, d_v]``, ``allowed``/``bias``/``keep`` broadcastable to ``[..., h, n_q, n_k]``
    (``allowed`` True = may attend; ``keep`` True = kept by dropout); ``causal``: ``"top_left"`` or
    ``"bottom_right"`` ANDed with ``allowed`` (None: not causal). Fully masked rows have zero output and zero
    gradient. ``dtype`` rounds every intermediate to that precision (computed in float32 below float64);
    ``variant`` makes one step wrong (see :class:`Variant`). ``dbias`` is None without a bias.
    """
    var = variant or Variant()
    work: Any = np.float64 if dtype == "float64" else np.float32

    def r(x: np.ndarray) -> np.ndarray:
        return x if dtype == "float64" else round_to(np.asarray(x, dtype=work), dtype).astype(work)

    q, k, v, do = (np.asarray(x, dtype=work) for x in (q, k, v, d_out))
    kx, vx = expand_kv(q, k, mapping), expand_kv(q, v, mapping)
    sc = work(1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    n_q, n_k = q.shape[-2], k.shape[-2]
    full = (*np.broadcast_shapes(q.shape[:-2], kx.shape[:-2]), n_q, n_k)
    user = np.ones(full, bool) if allowed is None else np.broadcast_to(np.asarray(allowed, bool), full)
    ok = user if causal is None else user & _masks.causal(n_q, n_k, align=cast(_masks.Align, causal))
    s = r(r(q @ np.swapaxes(kx, -1, -2)) * sc)
    if bias is not None:
        s = r(s + np.asarray(bias, dtype=work))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        p, m, den = _softmax(np.where(ok, s, -np.inf))
        p = r(p)
        lse = m + np.log(np.where(den > 0, den, 1.0))
        p_ds = p  # the P that dS (and delta) use; ``p`` is the one dV uses
        if var.lse != "right" or var.p_mask != "mask" or var.p_causal is not None:
            wrong = _recomputed(s, ok, user, lse, m, var)
            p = wrong if var.p_where in ("all", "dv") else p
            p_ds = wrong if var.p_where in ("all", "ds") else p_ds
        keep_f = None
        if keep is not None:
            keep_f = np.broadcast_to(np.asarray(keep, bool), full).astype(work) / work(1.0 - dropout_p)
        fwd_drop = keep_f
        p_fwd, _, _ = _softmax(np.where(ok, s, -np.inf))
        out = r((p_fwd if fwd_drop is None else r(p_fwd * fwd_drop)) @ vx)
        kv_drop, dp_drop = _dropout(keep, keep_f, dropout_p, full, work, var.dropout)
        pd = p if kv_drop is None else r(p * kv_drop)
        dv_x = r(pd @ do) if "dv" in var.transposed else r(np.swapaxes(pd, -1, -2) @ do)
        dp = r(do @ np.swapaxes(vx, -1, -2))
        if "dp" in var.transposed:
            dp = np.swapaxes(dp, -1, -2)
        if dp_drop is not None:
            dp = r(dp * dp_drop)
        delta = r(_delta(var.delta, dp, p_ds, ok, do, out))
        ds = _jacobian(var.jacobian, p_ds, dp, delta, r)
        ds = np.where(np.isfinite(ds), ds, np.nan)
    ds_q, ds_k = ds, ds
    if var.accumulate is not None:
        tensor = var.accumulate[0]
        ds_q, ds_k = _accumulated(ds, var.accumulate)
        if tensor == "v":  # only dV overwritten: dK accumulates
            ds_k = ds
        if tensor in ("kv", "v"):
            dv_x = r(np.swapaxes(_rows_of_block(pd, var.accumulate), -1, -2) @ do)
    dq, dk, dv = _input_grads(ds_q, ds_k, dv_x, q, kx, sc, var, k.shape[-3], mapping, r)
    dbias = None
    if bias is not None:
        dbias = _sum_to(ds, np.shape(bias))
    return {"dq": dq, "dk": dk, "dv": dv, "dbias": dbias, "out": out, "p": p_fwd}


def _sum_to(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    extra = x.ndim - len(shape)
    if extra > 0:
        x = x.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, (a, b) in enumerate(zip(x.shape, shape, strict=True)) if b == 1 and a != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def _recomputed(
    s: np.ndarray, ok: np.ndarray, user: np.ndarray, lse: np.ndarray, m: np.ndarray, var: Variant
) -> np.ndarray:
    """The backward's P recomputed under a wrong mask or a wrong lse."""
    fin = np.isfinite(lse) & ok.any(axis=-1, keepdims=True)
    lse_used = lse
    if var.lse == "nomax":
        lse_used = lse - m
    elif var.lse == "log2":  # the lse handed over in log2 units, read as nats
        lse_used = lse / math.log(2)
    elif var.lse == "nats-as-log2":  # a nats lse read as log2 units
        lse_used = lse * math.log(2)
    elif var.lse == "unmasked":  # logsumexp over every key, the masked ones too
        mu = np.max(s, axis=-1, keepdims=True)
        lse_used = mu + np.log(np.sum(np.exp(s - mu), axis=-1, keepdims=True))
    elif var.lse == "shifted":  # any other wrong lse: off by a per-row amount (fitted from the gradients)
        lse_used = lse + np.asarray(var.lse_shift)
    elif var.lse == "axis":
        sm = np.where(ok, s, -np.inf)
        mc = np.max(sm, axis=-2, keepdims=True)
        mc = np.where(np.isfinite(mc), mc, 0.0)
        lse_used = mc + np.log(np.maximum(np.sum(np.exp(sm - mc), axis=-2, keepdims=True), 1e-300))
    mask = ok
    if var.p_mask in ("none", "softmax"):
        mask = np.ones_like(ok)
    if var.p_causal is not None:
        align, shift = var.p_causal
        n_q, n_k = s.shape[-2], s.shape[-1]
        i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
        off = 0 if align == "top_left" else n_k - n_q
        mask = user if align == "none" else user & (j <= i + off + shift)
    if var.p_mask == "softmax" or (var.p_causal is not None and var.p_norm == "softmax"):
        p, _, _ = _softmax(np.where(mask, s, -np.inf))
        return p
    with np.errstate(over="ignore", invalid="ignore"):
        p = np.where(mask & fin, np.exp(np.where(mask, s, 0.0) - np.where(fin, lse_used, 0.0)), 0.0)
    return p


def _jacobian(how: str, p: np.ndarray, dp: np.ndarray, delta: np.ndarray, r: Callable) -> np.ndarray:
    """dS from P and dP ``[..., n_q, n_k]`` and delta ``[..., n_q, 1]`` under :attr:`Variant.jacobian` ``how``; ``r``
    rounds each step to the working dtype."""
    if how == "full":
        return r(p * (dp - delta))
    if how == "diagonal":
        return r(r(p * (1 - p)) * dp)
    return r(p * dp)


def _block_range(n: int, block: int, which: str) -> slice:
    starts = list(range(0, n, block))
    start = starts[-1] if which == "last" else 0
    return slice(start, min(start + block, n))


def _rows_of_block(x: np.ndarray, acc: tuple[str, int, str]) -> np.ndarray:
    """``x [..., n_q, n_k]`` with only one query block's rows kept (dK/dV overwritten per query block)."""
    out = np.zeros_like(x)
    sl = _block_range(x.shape[-2], acc[1], acc[2])
    out[..., sl, :] = x[..., sl, :]
    return out


def _accumulated(ds: np.ndarray, acc: tuple[str, int, str]) -> tuple[np.ndarray, np.ndarray]:
    """``dS`` as the dQ and the dK computations see it when one accumulator is overwritten per block."""
    tensor, block, which = acc
    if tensor in ("kv", "k", "v"):
        return ds, _rows_of_block(ds, acc)
    out = np.zeros_like(ds)
    sl = _block_range(ds.shape[-1], block, which)
    out[..., sl] = ds[..., sl]
    return out, ds


def hypotheses(
    n_q: int,
    n_k: int,
    *,
    h: int,
    h_kv: int,
    masked: bool,
    causal: str | None,
    dropout: bool,
    flash: bool,
    explicit_scale: bool = False,
) -> list[tuple[str, str, Variant]]:
    """The named wrong backward passes worth testing on a case: ``(code, what it does, variant)``.

    ``masked``: the case has masked entries (mask or causal); ``causal``: its alignment; ``dropout``: a keep mask
    is given; ``flash``: the backward takes the forward's lse (FlashAttention-2's signature; the same mistakes
    apply, since a plain backward that recomputes its own lse can make them too); ``explicit_scale``: a ``scale``
    argument is passed.
    """
    out = _scores_and_causal(n_q, n_k, masked=masked, causal=causal, explicit_scale=explicit_scale)
    out += _masks_and_heads(h=h, h_kv=h_kv, masked=masked)
    out += _lse_blocks_and_dropout(n_q, n_k, masked=masked, dropout=dropout)
    del flash  # the lse mistakes are tried for every kind of backward (see above)
    # a backward that recomputes its own forward takes delta from its own (wrong) P: both versions of each
    own = [(c, t, replace(v, delta="self")) for c, t, v in out if c in _SELF_DELTA and v.delta == "dodo"]
    return out + own


def _scores_and_causal(
    n_q: int, n_k: int, *, masked: bool, causal: str | None, explicit_scale: bool
) -> list[tuple[str, str, Variant]]:
    """The hypotheses on the Jacobian, delta, the scale, transposed factors and the causal mask."""
    out = [
        (
            "grad-jacobian",
            "the softmax-Jacobian term is missing: dS = P ∘ dP, without - delta",
            Variant(jacobian="none"),
        ),
        (
            "grad-jacobian",
            "only the softmax Jacobian's diagonal is used: dS = P ∘ (1 - P) ∘ dP, as if each weight depended on its "
            "own score alone (the -P_ij P_ik terms dropped)",
            Variant(jacobian="diagonal"),
        ),
    ]
    wrong = [("dp", "rowsum(dP)"), ("p", "rowsum(P) (= 1)"), ("do", "rowsum(dO)")]
    for d, what in wrong + ([("dp-allowed", "rowsum(dP) over the allowed keys")] if masked else []):
        text = f"delta is computed from the wrong quantity: {what} instead of rowsum(dO ∘ O)"
        out.append(("grad-delta", text, Variant(delta=d)))
    for sq, sk, text in (
        (0, 0, "the 1/sqrt(d_k) scale is missing from dQ and dK"),
        (0, 1, "the 1/sqrt(d_k) scale is missing from dQ"),
        (1, 0, "the 1/sqrt(d_k) scale is missing from dK"),
        (2, 2, "the 1/sqrt(d_k) scale is applied twice in dQ and dK"),
        (2, 1, "the 1/sqrt(d_k) scale is applied twice in dQ"),
        (1, 2, "the 1/sqrt(d_k) scale is applied twice in dK"),
    ):
        out.append(("grad-scale", text, Variant(scale_dq=sq, scale_dk=sk)))
    if explicit_scale:
        out.append(
            (
                "grad-scale",
                "dQ and dK are scaled by 1/sqrt(d_k), not by the scale argument the forward used",
                Variant(default_scale=True),
            )
        )
    if n_q == n_k:
        for which, text in (
            ("dv", "dV = P dO: P is used where Pᵀ belongs"),
            ("dk", "dK = dS Q: dS is used where dSᵀ belongs"),
            ("dq", "dQ = dSᵀ K: dSᵀ is used where dS belongs"),
            ("dp", "dP = (dO Vᵀ)ᵀ: the transposed product"),
        ):
            out.append(("grad-transposed", text, Variant(transposed=frozenset({which}))))
        out.append(
            (
                "grad-transposed",
                "dV and dK use P and dS where Pᵀ and dSᵀ belong",
                Variant(transposed=frozenset({"dv", "dk"})),
            )
        )
    if causal is None:
        out += _added_causal(n_q, n_k)
    if causal is not None:  # before the mask's: a causal case's P without its causal mask is grad-causal
        other = "bottom_right" if causal == "top_left" else "top_left"
        shifts = [
            ((causal, -1), "off by one: query i sees keys j < i (the diagonal excluded)"),
            ((causal, 1), "off by one: query i also sees key i + 1"),
            (("none", 0), "missing (P recomputed on every key the user mask allows)"),
        ]
        if n_q != n_k:
            shifts.append(((other, 0), f"aligned {other.replace('_', '-')}"))
        for pc, text in shifts:
            for norm in ("lse", "softmax"):
                out.append(
                    (
                        "grad-causal",
                        f"the backward's causal mask is {text}, unlike the forward's",
                        Variant(p_causal=pc, p_norm=norm),
                    )
                )
    return out


def _added_causal(n_q: int, n_k: int) -> list[tuple[str, str, Variant]]:
    """The hypotheses on a causal mask in the backward that the forward does not have (either alignment)."""
    if n_q == 1:
        return []
    out = []
    for align in ["top_left", "bottom_right"] if n_q != n_k else ["top_left"]:
        where = f" ({align.replace('_', '-')})" if n_q != n_k else ""
        text = f"the backward recomputes P under a causal mask{where} the forward does not have: its causal flag is "
        for norm in ("lse", "softmax"):
            var = Variant(p_causal=(align, 0), causal_added=True, p_norm=norm)
            out.append(("grad-causal", text + "not read, or read as always on", var))
    return out


def _masks_and_heads(*, h: int, h_kv: int, masked: bool) -> list[tuple[str, str, Variant]]:
    """The hypotheses on a P recomputed without the mask, and on GQA's group sums."""
    out: list[tuple[str, str, Variant]] = []
    if masked:
        out += [
            (
                "grad-masked-leak",
                "the backward recomputes P without the mask (exp(s - lse) on every key), so masked keys get gradient",
                Variant(p_mask="none"),
            ),
            (
                "grad-masked-leak",
                "the backward recomputes P as a softmax of the unmasked scores, so masked keys get gradient",
                Variant(p_mask="softmax"),
            ),
        ]
        for where, what in (("dv", "dV = Pᵀ dO"), ("ds", "dS = P ∘ (dP - delta)")):
            for pm, how in (("none", "exp(s - lse) on every key"), ("softmax", "a softmax of the unmasked scores")):
                out.append(
                    (
                        "grad-masked-leak",
                        f"{what} uses P without the mask ({how}), so masked keys get gradient",
                        Variant(p_mask=pm, p_where=where),
                    )
                )
    if h_kv != h:
        out += [
            (
                "grad-gqa-sum",
                "GQA: dK/dV take one query head's gradient instead of the group's sum",
                Variant(gqa="first"),
            ),
            (
                "grad-gqa-sum",
                "GQA: dK/dV are the mean over the query heads of a group, not the sum",
                Variant(gqa="mean"),
            ),
            (
                "grad-gqa-sum",
                "GQA: dK/dV are summed over the wrong query heads (the other head mapping, i % h_kv vs i // group)",
                Variant(gqa="tile"),
            ),
        ]
    return out


def _lse_blocks_and_dropout(n_q: int, n_k: int, *, masked: bool, dropout: bool) -> list[tuple[str, str, Variant]]:
    """The hypotheses on a wrong lse, block accumulators that overwrite, and the dropout mask."""
    out: list[tuple[str, str, Variant]] = []
    lse_variants = [
        ("nomax", "the lse has no max: log(sum exp(s - m)) without + m"),
        ("log2", "the lse is in log2 units where nats are expected"),
        ("nats-as-log2", "the lse is read as log2 units where it is in nats"),
    ]
    if n_q == n_k:
        lse_variants.append(("axis", "the lse is taken over the wrong axis (the queries)"))
    if masked:
        lse_variants.append(("unmasked", "the lse is taken over every key, the masked ones too"))
    for name, text in lse_variants:
        out.append(("grad-lse", f"the backward's P comes from a wrong lse: {text}", Variant(lse=name)))
    for tensor, what in (
        ("kv", "dK/dV keep only one query block's contribution"),
        ("k", "dK keeps only one query block's contribution (dV accumulates)"),
        ("v", "dV keeps only one query block's contribution (dK accumulates)"),
        ("q", "dQ keeps only one key block's contribution"),
    ):
        n = n_k if tensor == "q" else n_q
        kept: set[tuple[int, int]] = set()  # block sizes that keep the same rows are one hypothesis
        for block in BLOCKS:
            if block >= n:
                continue
            for which in ("last", "first"):
                sl = _block_range(n, block, which)
                if (sl.start, sl.stop) in kept:
                    continue
                kept.add((sl.start, sl.stop))
                out.append(
                    (
                        "grad-accumulate",
                        f"per-block accumulators are overwritten, not accumulated: {what} (the {which} block of "
                        f"{block})",
                        Variant(accumulate=(tensor, block, which)),
                    )
                )
    if dropout:
        for name, text in (
            ("off", "the backward ignores the dropout mask"),
            ("noscale", "the backward applies the keep mask without 1/(1-p)"),
            ("twice", "the backward divides by (1-p) twice"),
            ("dv", "dP = dO Vᵀ is not multiplied by the keep mask / (1-p)"),
            ("dp", "dV uses the weights without dropout"),
            ("transposed", "the backward's keep mask is transposed"),
        ):
            out.append(
                ("grad-dropout", f"the backward's dropout differs from the forward's: {text}", Variant(dropout=name))
            )
    return out


def fitted_lse(golden_dq: np.ndarray, dq: np.ndarray, rows: np.ndarray) -> list[tuple[str, str, Variant]]:
    """The wrong-lse hypothesis fitted to a function's ``dq``: a backward whose P is ``exp(s - lse')`` with any
    wrong ``lse'`` (the tile's max only, the max without the log-sum, a stale lse) has every row of ``P``, and so
    of ``dS`` and ``dQ``, scaled by ``c = exp(lse - lse')``; ``c`` is read per row from ``dq ≈ c · golden_dq``
    (least squares over the features), and the hypothesis (with delta from the real O, and from the backward's own
    P) is then tested on dK and dV like every other. Empty when the rows are not scaled copies (``c`` <= 0, or 1
    everywhere). Shapes: ``golden_dq``, ``dq [..., h, n_q, d_k]``; ``rows [..., h, n_q]`` the rows that may
    attend."""
    g = np.asarray(golden_dq, dtype=np.float64)
    a = np.asarray(dq, dtype=np.float64)
    if a.shape != g.shape or not np.all(np.isfinite(a)):
        return []
    norm = np.sum(g * g, axis=-1)
    usable = rows & (norm > 1e-20 * max(1.0, float(norm.max(initial=0.0))))
    c = np.where(usable, np.sum(a * g, axis=-1) / np.where(usable, norm, 1.0), 1.0)
    if np.any(c[usable] <= 0) or np.allclose(c, 1.0, rtol=1e-6, atol=0):
        return []
    var = Variant(lse="shifted", lse_shift=_nested(-np.log(c)[..., None]))
    text = "the backward's P comes from a wrong lse: each row of P is off by a factor (fitted per row from dQ)"
    return [("grad-lse", text, var), ("grad-lse", text, replace(var, delta="self"))]


def fitted_dv_lse(p: np.ndarray, d_out: np.ndarray, dv: np.ndarray, rows: np.ndarray) -> list[tuple[str, str, Variant]]:
    """The wrong-lse hypothesis fitted to a function's ``dv`` alone, for a backward whose dQ and dK are right: the P
    of ``dV = Pᵀ dO`` is ``exp(s - lse')`` (unnormalised ``exp(s - m)``, a stale lse) while dS uses the right P.
    Each row of that P is off by ``c_i = exp(lse_i - lse'_i)``, so ``dV_j = Σ_i c_i P_ij dO_i``: ``c`` is fitted by
    least squares per batch element and head, and the hypothesis then tested like every other. Empty when the
    rows are not scaled copies (``c`` <= 0, 1 everywhere, or more rows than equations) or with GQA (K/V heads
    shared). Shapes: ``p [..., h, n_q, n_k]``, ``d_out [..., h, n_q, d_v]``, ``dv [..., h, n_k, d_v]``, ``rows
    [..., h, n_q]`` the rows that may attend."""
    p, do, a = (np.asarray(x, dtype=np.float64) for x in (p, d_out, dv))
    n_q, n_k, d_v = p.shape[-2], p.shape[-1], do.shape[-1]
    lead = np.broadcast_shapes(p.shape[:-2], do.shape[:-2])
    if a.shape != (*lead, n_k, d_v) or not np.all(np.isfinite(a)) or n_k * d_v < 2 * n_q:
        return []
    cols = np.einsum(
        "...ij,...ie->...jei", np.broadcast_to(p, (*lead, n_q, n_k)), np.broadcast_to(do, (*lead, n_q, d_v))
    )
    cols = cols.reshape(-1, n_k * d_v, n_q)
    want = a.reshape(-1, n_k * d_v)
    use = np.broadcast_to(rows, (*lead, n_q)).reshape(-1, n_q)
    c = np.ones_like(use, dtype=np.float64)
    for i in range(cols.shape[0]):  # one small least-squares problem per batch element and head
        sel = use[i] & (np.abs(cols[i]).max(axis=0) > 0)
        if sel.any():
            c[i, sel] = np.linalg.lstsq(cols[i][:, sel], want[i], rcond=None)[0]
    c = c.reshape(*lead, n_q)
    usable = np.broadcast_to(rows, c.shape)
    if np.any(c[usable] <= 0) or np.allclose(c, 1.0, rtol=1e-6, atol=0):
        return []
    var = Variant(lse="shifted", lse_shift=_nested(-np.log(np.where(usable, c, 1.0))[..., None]), p_where="dv")
    text = (
        "the P of dV = Pᵀ dO comes from a wrong lse (not normalised, as exp(s - m), or stale): each of its rows is "
        "off by a factor (fitted per row from dV); dQ and dK are right"
    )
    return [("grad-lse", text, var)]


def _nested(x: np.ndarray) -> tuple:
    """``x`` as nested tuples (hashable), shape kept."""
    return x.tolist() if x.ndim == 0 else tuple(_nested(y) for y in x)
