"""Held-out backward passes (issue 14 acceptance): implementations the checker's authors never read.

The checker is tuned on the zoo, never on this file. Each :class:`BackwardCase` is checked by :func:`run_check`
(the entry points documented in docs/checker.md, "Backward"): ``options["backward"] is True`` means
``attnlab.check(fn, **options)`` (a forward, gradients by autograd / ``jax.vjp``); otherwise
``attnlab.check_backward(fn, **options)`` (a hand-written backward; ``options["forward"]`` its forward).

The styles are re-written (in NumPy / PyTorch / JAX, never copied) after public backward code, each naming its
source:

* ``llmc``: karpathy/llm.c ``train_gpt2.c`` ``attention_backward`` — per query row, the softmax Jacobian as an
  explicit ``att[t2] * (indicator - att[t3])`` double loop (here over the allowed keys of any mask);
* ``t06``: triton-lang/triton ``python/tutorials/06-fused-attention.py`` ``_attn_bwd_preprocess``,
  ``_attn_bwd_dkdv``, ``_attn_bwd_dq`` — lse ``M = m + log2(l)`` in log2 units, K pre-scaled by
  ``sm_scale / ln 2``, ``pT = exp2(k qᵀ - M)``, ``dk *= sm_scale``, ``dq *= ln 2``;
* ``fatri``: Dao-AILab/flash-attention ``flash_attn/flash_attn_triton.py`` ``_bwd_kernel_one_col_block`` — lse in
  nats, ``p = exp(qk * softmax_scale - lse)``, the scale folded into ``ds``;
* ``cs336``: stanford-cs336 assignment 2 (FlashAttention-2 in PyTorch, e.g. mocibb/cs336
  ``flash_attention_torch.py``) — a ``torch.autograd.Function`` with a tiled forward saving ``L`` and a
  recomputing backward ``D = rowsum(O ∘ dO)``;
* ``faref``: Dao-AILab/flash-attention ``tests/test_flash_attn.py`` ``attention_ref`` — ``[b, s, h, d]`` layout,
  ``repeat(k, "b s h d -> b s (h g) d")`` for GQA, the dropout mask applied with ``v * dropout_scaling``;
* ``aten``: pytorch/pytorch ``torch._softmax_backward_data`` (the math backend's softmax backward);
* ``jax``: ``jax.vjp`` through a ``jax.numpy`` forward, and a ``jax.custom_vjp``.

About 2/3 carry one planted bug each, named by its ``primary`` code (None: correct, must come out clean).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

LN2 = 0.6931471805599453
RCP_LN2 = 1.4426950408889634


@dataclass(frozen=True)
class BackwardCase:
    name: str
    fn: Any
    primary: str | None
    options: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    doc: str = ""


def run_check(case: BackwardCase):
    import attnlab

    options = dict(case.options)
    if options.get("backward") is True:
        return attnlab.check(case.fn, **options)
    return attnlab.check_backward(case.fn, **options)


# ---------------------------------------------------------------------------------------------------------------
# small NumPy helpers (this file shares nothing with the zoo)


def _dt(x):
    return np.float64 if x.dtype == np.float64 else np.float32


def _tr(x):
    return np.swapaxes(x, -1, -2)


def _kv_heads(q, k, v):
    """K and V repeated to q's heads (axis -3) when they have fewer (GQA, interleaved groups)."""
    if q.ndim < 3 or k.shape[-3] == q.shape[-3]:
        return k, v
    g = q.shape[-3] // k.shape[-3]
    return np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)


def _group_sum(g, like):
    if g.ndim < 3 or g.shape[-3] == like.shape[-3]:
        return g
    return g.reshape(*g.shape[:-3], like.shape[-3], -1, *g.shape[-2:]).sum(axis=-3)


def _ok(mask, causal, n_q, n_k, lead, strict=False):
    ok = (
        np.ones((*lead, n_q, n_k), bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), (*lead, n_q, n_k))
    )
    if causal:
        r, c = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
        ok = ok & ((c < r) if strict else (c <= r))
    return ok


def _lead(q, k):
    return np.broadcast_shapes(q.shape[:-2], k.shape[:-2])


# ---------------------------------------------------------------------------------------------------------------
# llm.c style: per query row, the explicit Jacobian (plain signature)


def _llmc(q, k, v, d_out, mask, scale, *, indicator=True, dkey_scale=True):
    dt = _dt(q)
    qq, do = q.astype(dt), d_out.astype(dt)
    kk, vv = (x.astype(dt) for x in _kv_heads(q, k, v))
    n_q, n_k = q.shape[-2], k.shape[-2]
    lead = _lead(qq, kk)
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    ok = _ok(mask, False, n_q, n_k, lead)
    dq = np.zeros((*lead, n_q, q.shape[-1]), dt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), dt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), dt)
    eye = np.eye(n_k, dtype=dt)
    for t in range(n_q):
        preatt = np.einsum("...i,...ki->...k", qq[..., t, :], kk) * sc  # [..., n_k]
        preatt = np.where(ok[..., t, :], preatt, -np.inf)
        maxval = preatt.max(axis=-1, keepdims=True)
        e = np.exp(preatt - np.where(np.isfinite(maxval), maxval, 0))
        total = e.sum(axis=-1, keepdims=True)
        att = e / np.where(total > 0, total, 1)  # [..., n_k], 0 on masked keys
        # backward pass 4: through the value accumulation
        datt = np.einsum("...ki,...i->...k", vv, do[..., t, :])
        dv += att[..., :, None] * do[..., t, None, :]
        # backward pass 2 & 3: the softmax, local_derivative = att[t2] * (indicator - att[t3])
        if indicator:
            local = att[..., :, None] * (eye - att[..., None, :])
        else:
            local = att[..., :, None] * eye  # the "- att[t3]" term lost
        dpreatt = np.einsum("...ab,...a->...b", local, datt)
        # backward pass 1: the query @ key matmul
        dq[..., t, :] += np.einsum("...k,...ki->...i", dpreatt, kk) * sc
        dk += dpreatt[..., :, None] * qq[..., t, None, :] * (sc if dkey_scale else 1.0)
    return dq.astype(q.dtype), _group_sum(dk, k).astype(k.dtype), _group_sum(dv, v).astype(v.dtype)


def llmc_backward(q, k, v, d_out, mask=None, scale=None):
    """Correct: llm.c's loops (any mask, GQA)."""
    return _llmc(q, k, v, d_out, mask, scale)


def llmc_no_indicator_term(q, k, v, d_out, mask=None, scale=None):
    """Bug: the Jacobian's ``- att[t3]`` term lost: local_derivative = att[t2] * indicator."""
    return _llmc(q, k, v, d_out, mask, scale, indicator=False)


def llmc_dkey_unscaled(q, k, v, d_out, mask=None, scale=None):
    """Bug: ``dkey += query * dpreatt`` without ``* scale`` (dquery has it)."""
    return _llmc(q, k, v, d_out, mask, scale, dkey_scale=False)


# ---------------------------------------------------------------------------------------------------------------
# Triton tutorial 06 style: log2 units, separate dkdv and dq passes (flash signature)

M1, N1 = 3, 5  # dkdv pass: query rows per step, keys per program
M2, N2 = 5, 2  # dq pass: queries per program, keys per step


def t06_forward(q, k, v, mask=None, scale=None, causal=False, *, store_log2_l=True):
    """The tutorial's forward: qk_scale = sm_scale / ln 2, exp2, M = m_i + log2(l_i) (log2 units)."""
    dt = _dt(q)
    qq = q.astype(dt)
    kk, vv = (x.astype(dt) for x in _kv_heads(q, k, v))
    n_q, n_k = q.shape[-2], k.shape[-2]
    lead = _lead(qq, kk)
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    qk_scale = sm_scale * RCP_LN2
    ok = _ok(mask, causal, n_q, n_k, lead)
    qk = np.where(ok, qq @ _tr(kk) * qk_scale, -np.inf)
    m_i = qk.max(axis=-1)
    m_safe = np.where(np.isfinite(m_i), m_i, 0)
    p = np.exp2(qk - m_safe[..., None])
    l_i = p.sum(axis=-1)
    out = (p @ vv) / np.where(l_i > 0, l_i, 1)[..., None]
    with np.errstate(divide="ignore"):
        big_m = np.where(l_i > 0, m_safe + np.log2(l_i) if store_log2_l else m_safe, -np.inf)
    return out.astype(q.dtype), big_m


def t06_forward_m_only(q, k, v, mask=None, scale=None, causal=False):
    """Bug (forward): stores ``M = m_i`` (the ``+ log2(l_i)`` forgotten)."""
    return t06_forward(q, k, v, mask, scale, causal, store_log2_l=False)


def _t06_backward(
    q, k, v, out, lse, d_out, mask, scale, causal, *, delta="o", dk_acc=True, strict=False, in_place=False
):
    dt = _dt(q)
    qq, do = q.astype(dt), d_out.astype(dt)
    kk, vv = (x.astype(dt) for x in _kv_heads(q, k, v))
    n_q, n_k = q.shape[-2], k.shape[-2]
    lead = _lead(qq, kk)
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    big_m = np.asarray(lse, dt)
    big_m = np.where(np.isfinite(big_m), big_m, np.inf)
    ok_fwd = _ok(mask, causal, n_q, n_k, lead)
    ok = _ok(mask, causal, n_q, n_k, lead, strict=strict)
    # _attn_bwd_preprocess: Delta = rowsum(O * dO)
    if delta == "o":
        di = np.sum(np.asarray(out, dt) * do, axis=-1)
    else:  # rowsum(dP) over the keys a row may see
        di = np.sum(np.where(ok_fwd, do @ _tr(vv), 0), axis=-1)
    if in_place and k.dtype.kind == "f" and kk.shape == k.shape:
        k *= k.dtype.type(sm_scale * RCP_LN2)  # the caller's K, pre-scaled in place
        arg_k = k.astype(dt)
    else:
        arg_k = kk * (sm_scale * RCP_LN2)
    dk = np.zeros((*lead, n_k, k.shape[-1]), dt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), dt)
    for n0 in range(0, n_k, N1):  # _attn_bwd_dkdv: one key block per program
        n1 = min(n0 + N1, n_k)
        kb, vb = arg_k[..., n0:n1, :], vv[..., n0:n1, :]
        dk_b = np.zeros((*lead, n1 - n0, k.shape[-1]), dt)
        dv_b = np.zeros((*lead, n1 - n0, v.shape[-1]), dt)
        for m0 in range(0, n_q, M1):
            m1 = min(m0 + M1, n_q)
            q_t = _tr(qq[..., m0:m1, :])  # qT [d, BLOCK_M1]
            qk_t = np.where(_tr(ok[..., m0:m1, n0:n1]), kb @ q_t, -np.inf)
            p_t = np.exp2(qk_t - big_m[..., None, m0:m1])
            do_b = do[..., m0:m1, :]
            dv_b += p_t @ do_b
            dp_t = vb @ _tr(do_b)
            ds_t = p_t * (dp_t - di[..., None, m0:m1])
            if dk_acc:
                dk_b += ds_t @ _tr(q_t)
            else:
                dk_b = ds_t @ _tr(q_t)
        dk[..., n0:n1, :] = dk_b * sm_scale
        dv[..., n0:n1, :] = dv_b
    dq = np.zeros((*lead, n_q, q.shape[-1]), dt)
    for m0 in range(0, n_q, M2):  # _attn_bwd_dq: one query block per program
        m1 = min(m0 + M2, n_q)
        dq_b = np.zeros((*lead, m1 - m0, q.shape[-1]), dt)
        for n0 in range(0, n_k, N2):
            n1 = min(n0 + N2, n_k)
            qk = np.where(ok[..., m0:m1, n0:n1], qq[..., m0:m1, :] @ _tr(arg_k[..., n0:n1, :]), -np.inf)
            p = np.exp2(qk - big_m[..., m0:m1, None])
            dp = do[..., m0:m1, :] @ _tr(vv[..., n0:n1, :])
            ds = p * (dp - di[..., m0:m1, None])
            dq_b += ds @ arg_k[..., n0:n1, :]
        dq[..., m0:m1, :] = dq_b * LN2
    return dq.astype(q.dtype), _group_sum(dk, k).astype(k.dtype), _group_sum(dv, v).astype(v.dtype)


def t06_backward(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """Correct: the tutorial's backward (lse in log2 units, declared)."""
    return _t06_backward(q, k, v, out, lse, d_out, mask, scale, causal)


def t06_delta_from_dp(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """Bug: the preprocess computes Delta = rowsum(dO Vᵀ) instead of rowsum(O ∘ dO)."""
    return _t06_backward(q, k, v, out, lse, d_out, mask, scale, causal, delta="dp")


def t06_dk_assigned(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """Bug: ``dk = tl.dot(dsT, tl.trans(qT))`` instead of ``dk += ...`` in the dkdv loop over query rows."""
    return _t06_backward(q, k, v, out, lse, d_out, mask, scale, causal, dk_acc=False)


def t06_causal_strict(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """Bug: the backward's causal mask is ``offs_m > offs_n`` (the diagonal masked) while the forward used ``>=``."""
    return _t06_backward(q, k, v, out, lse, d_out, mask, scale, causal, strict=True)


def t06_k_prescaled_in_place(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """Bug: ``k *= sm_scale * RCP_LN2`` on the caller's K (the tutorial's ``arg_k`` is a new tensor)."""
    return _t06_backward(q, k, v, out, lse, d_out, mask, scale, causal, in_place=True)


# ---------------------------------------------------------------------------------------------------------------
# flash_attn_triton.py style: lse in nats, one column (key) block at a time (flash signature)

BM, BN = 4, 4


def fatri_forward(q, k, v, mask=None, scale=None, causal=False):
    """Online softmax over key blocks; ``lse_i = m_ij + log(l_i)`` in nats."""
    dt = _dt(q)
    qq = q.astype(dt)
    kk, vv = (x.astype(dt) for x in _kv_heads(q, k, v))
    n_q, n_k = q.shape[-2], k.shape[-2]
    lead = _lead(qq, kk)
    softmax_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    ok = _ok(mask, causal, n_q, n_k, lead)
    m_i = np.full((*lead, n_q), -np.inf, dt)
    lse_i = np.full((*lead, n_q), -np.inf, dt)
    acc_o = np.zeros((*lead, n_q, v.shape[-1]), dt)
    for n0 in range(0, n_k, BN):
        n1 = min(n0 + BN, n_k)
        qk = np.where(ok[..., n0:n1], qq @ _tr(kk[..., n0:n1, :]) * softmax_scale, -np.inf)
        m_ij = np.maximum(qk.max(axis=-1), lse_i)
        m_safe = np.where(np.isfinite(m_ij), m_ij, 0)
        p = np.exp(qk - m_safe[..., None])
        l_ij = p.sum(axis=-1)
        acc_o_scale = np.exp(m_i - m_safe)
        acc_o = acc_o * acc_o_scale[..., None] + p @ vv[..., n0:n1, :]
        m_i = m_ij
        with np.errstate(divide="ignore"):
            l_i_new = np.exp(lse_i - m_safe) + l_ij
            lse_i = np.where(l_i_new > 0, m_safe + np.log(l_i_new), -np.inf)
    o_scale = np.exp(m_i - np.where(np.isfinite(lse_i), lse_i, np.inf))
    return (acc_o * o_scale[..., None]).astype(q.dtype), lse_i


def _fatri_backward(q, k, v, out, lse, d_out, mask, scale, causal, *, guard=True, full_blocks_skip_mask=False):
    dt = _dt(q)
    qq, do = q.astype(dt), d_out.astype(dt)
    kk, vv = (x.astype(dt) for x in _kv_heads(q, k, v))
    n_q, n_k = q.shape[-2], k.shape[-2]
    lead = _lead(qq, kk)
    softmax_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    ok = _ok(mask, causal, n_q, n_k, lead)
    lse = np.asarray(lse, dt)
    if guard:
        lse = np.where(np.isfinite(lse), lse, np.inf)
    delta = np.sum(np.asarray(out, dt) * do, axis=-1)  # _bwd_preprocess_do_o_dot
    dq = np.zeros((*lead, n_q, q.shape[-1]), dt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), dt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), dt)
    for n0 in range(0, n_k, BN):  # _bwd_kernel_one_col_block
        n1 = min(n0 + BN, n_k)
        k_b, v_b = kk[..., n0:n1, :], vv[..., n0:n1, :]
        for m0 in range(0, n_q, BM):
            m1 = min(m0 + BM, n_q)
            qk = qq[..., m0:m1, :] @ _tr(k_b)
            tile_ok = ok[..., m0:m1, n0:n1]
            causal_full = causal and (n1 - 1 <= m0)  # every key of the tile is at or before every query
            if not (full_blocks_skip_mask and (causal_full or not causal)):
                qk = np.where(tile_ok, qk, -np.inf)
            with np.errstate(invalid="ignore", over="ignore"):
                p = np.exp(qk * softmax_scale - lse[..., m0:m1, None])
            do_b = do[..., m0:m1, :]
            dv[..., n0:n1, :] += _tr(p) @ do_b
            dp = do_b @ _tr(v_b)
            ds = p * (dp - delta[..., m0:m1, None]) * softmax_scale
            dk[..., n0:n1, :] += _tr(ds) @ qq[..., m0:m1, :]
            dq[..., m0:m1, :] += ds @ k_b
    return dq.astype(q.dtype), _group_sum(dk, k).astype(k.dtype), _group_sum(dv, v).astype(v.dtype)


def fatri_backward(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """Correct: flash_attn_triton's backward, with ``lse = -inf`` rows guarded to P = 0."""
    return _fatri_backward(q, k, v, out, lse, d_out, mask, scale, causal)


def fatri_lse_unguarded(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """Bug: no guard for fully masked rows: exp(-inf - (-inf)) = NaN there."""
    return _fatri_backward(q, k, v, out, lse, d_out, mask, scale, causal, guard=False)


def fatri_full_blocks_unmasked(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """Bug: the block-sparsity shortcut treats every tile that the causal pattern leaves fully visible (every tile
    without causal) as needing no mask, so a padding mask is dropped there: masked keys get gradient."""
    return _fatri_backward(q, k, v, out, lse, d_out, mask, scale, causal, full_blocks_skip_mask=True)


def nats_backward_declared_log2(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """Bug (declaration): a nats backward (flash_attn_triton's ``exp(qk * scale - lse)``) checked with
    ``lse_units="log2"``, i.e. given an lse in log2 units."""
    return _fatri_backward(q, k, v, out, lse, d_out, mask, scale, causal)


# ---------------------------------------------------------------------------------------------------------------
# CS336 style: torch.autograd.Function, tiled forward saving L, recomputing backward


def _cs336_class(variant):
    import torch

    class FlashAttention2(torch.autograd.Function):
        @staticmethod
        def forward(ctx, Q, K, V, allowed, is_causal):
            cdt = torch.float64 if Q.dtype == torch.float64 else torch.float32
            q, k, v = Q.to(cdt), K.to(cdt), V.to(cdt)
            n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
            scale = 1.0 / math.sqrt(d)
            ok = torch.ones(n_q, n_k, dtype=torch.bool)
            if is_causal:
                ok = ok & torch.ones(n_q, n_k, dtype=torch.bool).tril()
            if allowed is not None:
                ok = ok & allowed
            bq, bk = 8, 8
            O = torch.zeros(*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), n_q, v.shape[-1], dtype=cdt)
            L = torch.full(O.shape[:-1], -math.inf, dtype=cdt)
            for i in range(0, n_q, bq):
                qi = q[..., i : i + bq, :]
                m = torch.full(qi.shape[:-1], -math.inf, dtype=cdt)
                l = torch.zeros(qi.shape[:-1], dtype=cdt)
                o = torch.zeros(*qi.shape[:-1], v.shape[-1], dtype=cdt)
                for j in range(0, n_k, bk):
                    s = qi @ k[..., j : j + bk, :].transpose(-1, -2) * scale
                    s = s.masked_fill(~ok[..., i : i + bq, j : j + bk], -math.inf)
                    m_new = torch.maximum(m, s.amax(-1))
                    m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
                    p = torch.exp(s - m_safe[..., None])
                    corr = torch.exp(m - m_safe)
                    l = corr * l + p.sum(-1)
                    o = corr[..., None] * o + p @ v[..., j : j + bk, :]
                    m = m_new
                O[..., i : i + bq, :] = o / torch.where(l > 0, l, torch.ones_like(l))[..., None]
                L[..., i : i + bq] = torch.where(l > 0, m + torch.log(l), torch.full_like(l, -math.inf))
            ctx.save_for_backward(Q, K, V, O, L, ok)
            return O.to(Q.dtype)

        @staticmethod
        def backward(ctx, dO):
            Q, K, V, O, L, ok = ctx.saved_tensors
            cdt = O.dtype
            q, k, v, do = Q.to(cdt), K.to(cdt), V.to(cdt), dO.to(cdt)
            scale = 1.0 / math.sqrt(q.shape[-1])
            S = (q @ k.transpose(-1, -2) * scale).masked_fill(~ok, -math.inf)
            P = torch.exp(S - torch.where(torch.isfinite(L), L, torch.full_like(L, math.inf))[..., None])
            if variant == "dv-einsum-batch" and P.dim() >= 3:
                dV = torch.einsum("...qk,...qd->kd", P, do).expand_as(v)  # the batch (and head) letters dropped
            else:
                dV = P.transpose(-1, -2) @ do
            dP = do @ v.transpose(-1, -2)
            D = torch.sum(O * do, dim=-1, keepdim=True)
            dS = P * (dP - D)
            dQ = dS @ k * scale
            dK = (dS @ q if variant == "dk-transposed" else dS.transpose(-1, -2) @ q) * scale
            return dQ.to(Q.dtype), dK.to(K.dtype), dV.contiguous().to(V.dtype), None, None

    FlashAttention2.__qualname__ = f"FlashAttention2_{variant.replace('-', '_')}"
    return FlashAttention2


_CS336: dict[str, Any] = {}


def _cs336(variant):
    def attention(q, k, v, mask=None, is_causal=False):
        import torch

        if variant not in _CS336:
            _CS336[variant] = _cs336_class(variant)
        allowed = None if mask is None else torch.as_tensor(mask, dtype=torch.bool)
        return _CS336[variant].apply(q, k, v, allowed, bool(is_causal))

    attention.__name__ = attention.__qualname__ = f"cs336_{variant.replace('-', '_')}"
    return attention


cs336_attention = _cs336("correct")
cs336_dk_transposed = _cs336("dk-transposed")
cs336_dv_einsum_batch = _cs336("dv-einsum-batch")


# ---------------------------------------------------------------------------------------------------------------
# flash-attention's attention_ref style: [b, s, h, d], GQA by repeat, dropout on V


def faref_attention(q, k, v, mask=None, dropout_mask=None, dropout_p=0.0):
    """Correct (autograd): flash-attention's test reference, layout bnhd; fully masked rows zeroed."""
    import torch

    g = q.shape[-2] // k.shape[-2]
    if g > 1:
        k, v = k.repeat_interleave(g, dim=-2), v.repeat_interleave(g, dim=-2)
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    d = q.shape[-1]
    scores = torch.einsum("bthd,bshd->bhts", q.to(cdt) / math.sqrt(d), k.to(cdt))
    if mask is not None:
        allowed = torch.as_tensor(mask, dtype=torch.bool)
        scores = scores.masked_fill(~allowed, float("-inf"))
    attention = torch.softmax(scores, dim=-1)
    if mask is not None:
        attention = attention.masked_fill(torch.all(~allowed, dim=-1, keepdim=True), 0.0)
    dropout_scaling = 1.0 / (1 - dropout_p)
    if dropout_mask is not None:
        attention = attention.masked_fill(~torch.as_tensor(dropout_mask, dtype=torch.bool), 0.0)
    else:
        dropout_scaling = 1.0
    out = torch.einsum("bhts,bshd->bthd", attention, v.to(cdt) * dropout_scaling)
    return out.to(q.dtype)


def _bnhd_backward(q, k, v, d_out, mask, scale, *, fold="interleave"):
    """A NumPy backward in flash-attention's [b, s, h, d] layout; GQA gradients folded back
    ``dk_expanded.reshape(b, s, h_k, g, d).sum(3)``."""
    dt = _dt(q)
    qh, kh, vh, doh = (np.swapaxes(x.astype(dt), -2, -3) for x in (q, k, v, d_out))  # -> [b, h, s, d]
    kr, vr = _kv_heads(qh, kh, vh)
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    s = qh @ _tr(kr) * sc
    ok = _ok(mask, False, s.shape[-2], s.shape[-1], s.shape[:-2])
    s = np.where(ok, s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(mx), mx, 0))
    den = e.sum(axis=-1, keepdims=True)
    p = e / np.where(den > 0, den, 1)
    dv = _tr(p) @ doh
    dp = doh @ _tr(vr)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq, dk = ds @ kr * sc, _tr(ds) @ qh * sc
    dk, dv = (np.swapaxes(x, -2, -3) for x in (dk, dv))  # [b, s, h, d]
    h_k = k.shape[-2]
    g = q.shape[-2] // h_k
    if g > 1:
        shape = (*dk.shape[:-2], h_k, g) if fold == "interleave" else (*dk.shape[:-2], g, h_k)
        axis = -2 if fold == "interleave" else -3
        dk = dk.reshape(*shape, dk.shape[-1]).sum(axis=axis)
        dv = dv.reshape(*shape, dv.shape[-1]).sum(axis=axis)
    return np.swapaxes(dq, -2, -3).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


def bnhd_backward(q, k, v, d_out, mask=None, scale=None):
    """Correct: [b, s, h, d] NumPy backward, GQA summed over each group of h // h_k query heads."""
    return _bnhd_backward(q, k, v, d_out, mask, scale)


def bnhd_gqa_wrong_group(q, k, v, d_out, mask=None, scale=None):
    """Bug: the GQA fold reshapes to ``(g, h_k)`` instead of ``(h_k, g)``: query heads summed into the wrong K/V
    head (right without GQA)."""
    return _bnhd_backward(q, k, v, d_out, mask, scale, fold="tile")


# ---------------------------------------------------------------------------------------------------------------
# PyTorch aten's softmax backward, a plain-signature torch backward


def _aten_backward(q, k, v, d_out, mask, scale, *, upcast=False):
    import torch

    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    g = q.shape[-3] // k.shape[-3] if q.dim() >= 3 else 1
    qq, do = q.to(cdt), d_out.to(cdt)
    kk, vv = (x.to(cdt).repeat_interleave(g, dim=-3) if g > 1 else x.to(cdt) for x in (k, v))
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    s = qq @ kk.transpose(-1, -2) * sc
    if mask is not None:
        s = s.masked_fill(~torch.as_tensor(mask, dtype=torch.bool), -math.inf)
    mx = s.amax(-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx)))
    den = e.sum(-1, keepdim=True)
    p = e / torch.where(den > 0, den, torch.ones_like(den))
    dv = p.transpose(-1, -2) @ do
    dp = do @ vv.transpose(-1, -2)
    ds = torch._softmax_backward_data(dp, p, -1, cdt)  # p * (dp - sum(dp * p))
    dq, dk = ds @ kk * sc, ds.transpose(-1, -2) @ qq * sc
    if g > 1:
        dk, dv = (x.reshape(*x.shape[:-3], k.shape[-3], g, *x.shape[-2:]).sum(-3) for x in (dk, dv))
    if upcast:
        return dq, dk, dv  # computed in float32 for half inputs, never cast back
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def aten_backward(q, k, v, d_out, mask=None, scale=None):
    """Correct: torch._softmax_backward_data between the two matmuls."""
    return _aten_backward(q, k, v, d_out, mask, scale)


def aten_backward_upcast(q, k, v, d_out, mask=None, scale=None):
    """Bug: float16/bfloat16 inputs get float32 gradients (the compute dtype leaks out)."""
    return _aten_backward(q, k, v, d_out, mask, scale, upcast=True)


# ---------------------------------------------------------------------------------------------------------------
# NumPy dropout: a backward that draws its own keep-mask


def _np_dropout(q, k, v, d_out, mask, scale, dropout_mask, dropout_p, *, redraw=False):
    dt = _dt(q)
    qq, do = q.astype(dt), d_out.astype(dt)
    kk, vv = (x.astype(dt) for x in _kv_heads(q, k, v))
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    s = qq @ _tr(kk) * sc
    ok = _ok(mask, False, s.shape[-2], s.shape[-1], s.shape[:-2])
    s = np.where(ok, s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(mx), mx, 0))
    den = e.sum(axis=-1, keepdims=True)
    p = e / np.where(den > 0, den, 1)
    if dropout_mask is not None:
        keep = np.broadcast_to(np.asarray(dropout_mask, bool), p.shape)
        if redraw:
            keep = np.random.default_rng(0).random(p.shape) >= dropout_p  # "the same seed as the forward"
        mult = keep / dt(1.0 - dropout_p)
    else:
        mult = np.ones_like(p)
    dv = _tr(p * mult) @ do
    dp = (do @ _tr(vv)) * mult
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq, dk = ds @ kk * sc, _tr(ds) @ qq * sc
    return dq.astype(q.dtype), _group_sum(dk, k).astype(k.dtype), _group_sum(dv, v).astype(v.dtype)


def np_dropout_backward(q, k, v, d_out, mask=None, scale=None, dropout_mask=None, dropout_p=0.0):
    """Correct: dV = (P ∘ keep/(1-p))ᵀ dO, dP = (dO Vᵀ) ∘ keep/(1-p), delta = rowsum(P ∘ dP)."""
    return _np_dropout(q, k, v, d_out, mask, scale, dropout_mask, dropout_p)


def np_dropout_redrawn(q, k, v, d_out, mask=None, scale=None, dropout_mask=None, dropout_p=0.0):
    """Bug: the backward ignores the forward's keep-mask and redraws one from a fixed seed."""
    return _np_dropout(q, k, v, d_out, mask, scale, dropout_mask, dropout_p, redraw=True)


# ---------------------------------------------------------------------------------------------------------------
# JAX: jax.vjp through jax.numpy, and a jax.custom_vjp


_JAX: dict[str, Any] = {}


def jax_attention(q, k, v, mask=None):
    """Correct (jax.vjp): ``jax.jit`` of a jax.numpy attention with a where-guarded softmax (fully masked rows
    give 0)."""
    import jax

    if "fwd" not in _JAX:
        _JAX["fwd"] = jax.jit(_jax_attention)
    return _JAX["fwd"](q, k, v, mask)


def _jax_attention(q, k, v, mask):
    import jax.numpy as jnp

    s = jnp.einsum("...qd,...kd->...qk", q, k) / jnp.sqrt(jnp.asarray(q.shape[-1], q.dtype))
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)
    mx = jnp.max(s, axis=-1, keepdims=True)
    mx = jnp.where(jnp.isfinite(mx), mx, 0)
    e = jnp.exp(s - mx)
    if mask is not None:
        e = jnp.where(mask, e, 0)
    den = jnp.sum(e, axis=-1, keepdims=True)
    return jnp.einsum("...qk,...kd->...qd", e / jnp.where(den > 0, den, 1), v).astype(q.dtype)


def _jax_custom():
    import jax
    import jax.numpy as jnp

    def probs(q, k):
        s = jnp.einsum("...qd,...kd->...qk", q, k) / jnp.sqrt(jnp.asarray(q.shape[-1], q.dtype))
        return jax.nn.softmax(s, axis=-1)

    @jax.custom_vjp
    def attn(q, k, v):
        return jnp.einsum("...qk,...kd->...qd", probs(q, k), v)

    def fwd(q, k, v):
        p = probs(q, k)
        return jnp.einsum("...qk,...kd->...qd", p, v), (q, k, v, p)

    def bwd(res, g):
        q, k, v, p = res
        dv = jnp.einsum("...qk,...qd->...kd", p, g)
        dp = jnp.einsum("...qd,...kd->...qk", g, v)
        ds = p * (dp - jnp.sum(dp * p, axis=-1, keepdims=True))
        return jnp.einsum("...qk,...kd->...qd", ds, k), jnp.einsum("...qk,...qd->...kd", ds, q), dv  # no 1/sqrt(d)

    attn.defvjp(fwd, bwd)
    return attn


def jax_custom_vjp_unscaled(q, k, v):
    """Bug: a jax.custom_vjp whose backward leaves 1/sqrt(d_k) out of dq and dk (no mask argument)."""
    if "attn" not in _JAX:
        _JAX["attn"] = _jax_custom()
    return _JAX["attn"](q, k, v)


# ---------------------------------------------------------------------------------------------------------------
# FlashAttention (v1) style: Algorithm 1's outer loop over key blocks with O, l, m kept per query row in "HBM"
# (Dao et al. 2022, and Dao-AILab/flash-attention's early CUDA), Algorithm 4's backward (flash signature)

KB, QB = 3, 2


def _fa1_forward(q, k, v, mask, scale, causal, *, keep_tile_max=False):
    dt = _dt(q)
    qq = q.astype(dt)
    kk, vv = (x.astype(dt) for x in _kv_heads(q, k, v))
    n_q, n_k = q.shape[-2], k.shape[-2]
    lead = _lead(qq, kk)
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    ok = _ok(mask, causal, n_q, n_k, lead)
    o = np.zeros((*lead, n_q, v.shape[-1]), dt)
    l = np.zeros((*lead, n_q), dt)
    m = np.full((*lead, n_q), -np.inf, dt)
    stored = np.full((*lead, n_q), -np.inf, dt)  # the m written back to HBM
    for j0 in range(0, n_k, KB):
        j1 = min(j0 + KB, n_k)
        for i0 in range(0, n_q, QB):
            i1 = min(i0 + QB, n_q)
            s = np.where(ok[..., i0:i1, j0:j1], qq[..., i0:i1, :] @ _tr(kk[..., j0:j1, :]) * sc, -np.inf)
            m_t = s.max(axis=-1)
            p_t = np.exp(s - np.where(np.isfinite(m_t), m_t, 0)[..., None])
            l_t = p_t.sum(axis=-1)
            m_old, l_old = m[..., i0:i1], l[..., i0:i1]
            m_new = np.maximum(m_old, m_t)
            ms = np.where(np.isfinite(m_new), m_new, 0)
            a, b = np.exp(m_old - ms), np.exp(m_t - ms)
            l_new = a * l_old + b * l_t
            num = (a * l_old)[..., None] * o[..., i0:i1, :] + b[..., None] * (p_t @ vv[..., j0:j1, :])
            o[..., i0:i1, :] = num / np.where(l_new > 0, l_new, 1)[..., None]
            l[..., i0:i1], m[..., i0:i1] = l_new, m_new
            stored[..., i0:i1] = np.where(np.isfinite(m_t), m_t, stored[..., i0:i1]) if keep_tile_max else m_new
    with np.errstate(divide="ignore"):
        lse = np.where(l > 0, stored + np.log(np.where(l > 0, l, 1)), -np.inf)
    return o.astype(q.dtype), lse


def fa1_forward(q, k, v, mask=None, scale=None, causal=False):
    """FlashAttention v1 forward: O, l, m updated in place per query row as the key blocks stream by."""
    return _fa1_forward(q, k, v, mask, scale, causal)


def fa1_forward_tile_max(q, k, v, mask=None, scale=None, causal=False):
    """Bug (forward): the m written back is the tile's own max m̃_ij, not the running max m_new (the output is
    right, lse = m + log l is not)."""
    return _fa1_forward(q, k, v, mask, scale, causal, keep_tile_max=True)


def fa1_backward(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """FlashAttention v1 backward (Algorithm 4): outer loop over key blocks, D_i = rowsum(dO_i ∘ O_i) per tile,
    dQ_i read-modify-written in HBM."""
    dt = _dt(q)
    qq, do, oo = q.astype(dt), d_out.astype(dt), np.asarray(out, dt)
    kk, vv = (x.astype(dt) for x in _kv_heads(q, k, v))
    n_q, n_k = q.shape[-2], k.shape[-2]
    lead = _lead(qq, kk)
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    ok = _ok(mask, causal, n_q, n_k, lead)
    lse = np.asarray(lse, dt)
    lse = np.where(np.isfinite(lse), lse, np.inf)
    dq = np.zeros((*lead, n_q, q.shape[-1]), dt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), dt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), dt)
    for j0 in range(0, n_k, KB):
        j1 = min(j0 + KB, n_k)
        dk_j = np.zeros((*lead, j1 - j0, k.shape[-1]), dt)
        dv_j = np.zeros((*lead, j1 - j0, v.shape[-1]), dt)
        for i0 in range(0, n_q, QB):
            i1 = min(i0 + QB, n_q)
            s = np.where(ok[..., i0:i1, j0:j1], qq[..., i0:i1, :] @ _tr(kk[..., j0:j1, :]) * sc, -np.inf)
            p = np.exp(s - lse[..., i0:i1, None])
            dv_j = dv_j + _tr(p) @ do[..., i0:i1, :]
            dp = do[..., i0:i1, :] @ _tr(vv[..., j0:j1, :])
            d_i = np.sum(do[..., i0:i1, :] * oo[..., i0:i1, :], axis=-1, keepdims=True)
            ds = p * (dp - d_i)
            dq[..., i0:i1, :] = dq[..., i0:i1, :] + ds @ kk[..., j0:j1, :] * sc
            dk_j = dk_j + _tr(ds) @ qq[..., i0:i1, :] * sc
        dk[..., j0:j1, :], dv[..., j0:j1, :] = dk_j, dv_j
    return dq.astype(q.dtype), _group_sum(dk, k).astype(k.dtype), _group_sum(dv, v).astype(v.dtype)


# ---------------------------------------------------------------------------------------------------------------
# more PyTorch: torch.func.vjp, a d2l-style dropout Function, a logsumexp saved over the wrong axis, GQA by mean


def torch_func_vjp_backward(q, k, v, d_out, mask=None, scale=None):
    """Correct: ``torch.func.vjp`` through plain torch ops (GQA by repeat_interleave)."""
    import torch

    def forward(q_, k_, v_):
        g = q_.shape[-3] // k_.shape[-3]
        k_, v_ = k_.repeat_interleave(g, dim=-3), v_.repeat_interleave(g, dim=-3)
        sc = 1.0 / math.sqrt(q_.shape[-1]) if scale is None else float(scale)
        s = q_ @ k_.transpose(-1, -2) * sc
        if mask is not None:
            s = s.masked_fill(~torch.as_tensor(mask, dtype=torch.bool), -math.inf)
        mx = s.detach().amax(-1, keepdim=True)
        e = torch.exp(s - torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx)))
        return e / e.sum(-1, keepdim=True).clamp_min(1.0) @ v_

    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    _, pull = torch.func.vjp(forward, q.to(cdt), k.to(cdt), v.to(cdt))
    return tuple(g.to(x.dtype) for g, x in zip(pull(d_out.to(cdt)), (q, k, v), strict=True))


def torch_gqa_mean_backward(q, k, v, d_out, mask=None, scale=None):
    """Bug: GQA dK/dV reduced over each group with ``.mean(dim=...)`` (the expanded heads' average)."""
    import torch

    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    g = q.shape[-3] // k.shape[-3]
    qq, do = q.to(cdt), d_out.to(cdt)
    kk, vv = (x.to(cdt).repeat_interleave(g, dim=-3) for x in (k, v))
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    s = qq @ kk.transpose(-1, -2) * sc
    if mask is not None:
        s = s.masked_fill(~torch.as_tensor(mask, dtype=torch.bool), -math.inf)
    mx = s.amax(-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx)))
    p = e / e.sum(-1, keepdim=True).clamp_min(1.0)
    dp = do @ vv.transpose(-1, -2)
    ds = p * (dp - (p * dp).sum(-1, keepdim=True))
    dk, dv = ds.transpose(-1, -2) @ qq * sc, p.transpose(-1, -2) @ do
    dk, dv = (x.unflatten(-3, (k.shape[-3], g)).mean(dim=-3) for x in (dk, dv))
    return (ds @ kk * sc).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _saved_lse_class(variant):
    import torch

    class SavedLse(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, allowed, keep, p):
            cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
            qq, kk, vv = q.to(cdt), k.to(cdt), v.to(cdt)
            s = qq @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1])
            if allowed is not None:
                s = s.masked_fill(~allowed, -math.inf)
            w = torch.softmax(s, dim=-1).nan_to_num(0.0)  # fully masked rows: 0
            lse = torch.logsumexp(s, dim=-2 if variant == "lse-axis" else -1)
            if keep is not None:
                w = w * keep / (1.0 - p)
            ctx.save_for_backward(q, k, v, lse, allowed, keep)
            ctx.p = p
            return (w @ vv).to(q.dtype)

        @staticmethod
        def backward(ctx, grad):
            q, k, v, lse, allowed, keep = ctx.saved_tensors
            cdt = lse.dtype
            qq, kk, vv, do = q.to(cdt), k.to(cdt), v.to(cdt), grad.to(cdt)
            sc = 1.0 / math.sqrt(q.shape[-1])
            s = qq @ kk.transpose(-1, -2) * sc
            if allowed is not None:
                s = s.masked_fill(~allowed, -math.inf)
            lse_b = lse[..., None, :] if variant == "lse-axis" else lse[..., :, None]
            pr = torch.exp(s - torch.where(torch.isfinite(lse_b), lse_b, torch.full_like(lse_b, math.inf)))
            if keep is not None:
                factor = (1.0 - ctx.p) if variant == "dropout-1-p" else 1.0 / (1.0 - ctx.p)
                mult = keep.to(cdt) * factor
            else:
                mult = torch.ones_like(pr)
            dv = (pr * mult).transpose(-1, -2) @ do
            dp = (do @ vv.transpose(-1, -2)) * mult
            ds = pr * (dp - (pr * dp).sum(-1, keepdim=True))
            return (
                (ds @ kk * sc).to(q.dtype),
                (ds.transpose(-1, -2) @ qq * sc).to(k.dtype),
                dv.to(v.dtype),
                None,
                None,
                None,
            )

    SavedLse.__qualname__ = f"SavedLse_{variant.replace('-', '_')}"
    return SavedLse


_SAVED: dict[str, Any] = {}


def _saved_lse(variant):
    def attention(q, k, v, mask=None, dropout_mask=None, dropout_p=0.0):
        import torch

        if variant not in _SAVED:
            _SAVED[variant] = _saved_lse_class(variant)
        allowed = None if mask is None else torch.as_tensor(mask, dtype=torch.bool)
        keep = None if dropout_mask is None else torch.as_tensor(dropout_mask, dtype=torch.bool)
        return _SAVED[variant].apply(q, k, v, allowed, keep, float(dropout_p))

    attention.__name__ = attention.__qualname__ = f"saved_lse_{variant.replace('-', '_')}"
    return attention


saved_lse_dropout_1_minus_p = _saved_lse("dropout-1-p")
saved_lse_over_queries = _saved_lse("lse-axis")


# ---------------------------------------------------------------------------------------------------------------
# the cases

_T06 = {"forward": t06_forward, "lse_units": "log2"}
_TORCH = {"backward": True, "framework": "torch"}  # (torch and jax are imported lazily here: declared)
_JAXF = {"backward": True, "framework": "jax"}
_FATRI = {"forward": fatri_forward}

CASES: list[BackwardCase] = [
    # correct
    BackwardCase("llmc", llmc_backward, None, {"gqa": True}, "karpathy/llm.c train_gpt2.c attention_backward"),
    BackwardCase("t06", t06_backward, None, {**_T06, "gqa": True}, "triton tutorials/06-fused-attention.py"),
    BackwardCase("t06-golden", t06_backward, None, {"lse_units": "log2"}, "triton 06-fused-attention.py"),
    BackwardCase("fatri", fatri_backward, None, {**_FATRI, "gqa": True}, "flash_attn/flash_attn_triton.py"),
    BackwardCase("cs336", cs336_attention, None, _TORCH, "stanford-cs336 assignment 2 FlashAttention2"),
    BackwardCase(
        "faref",
        faref_attention,
        None,
        {**_TORCH, "layout": "bnhd", "gqa": True},
        "flash-attention tests/test_flash_attn.py attention_ref",
    ),
    BackwardCase("bnhd", bnhd_backward, None, {"layout": "bnhd", "gqa": True}, "flash-attention GQA dk fold"),
    BackwardCase(
        "aten", aten_backward, None, {"framework": "torch", "gqa": True}, "pytorch torch._softmax_backward_data"
    ),
    BackwardCase("np-dropout", np_dropout_backward, None, {}, "dropout keep-mask backward (FlashAttention paper §B)"),
    BackwardCase("jax-vjp", jax_attention, None, _JAXF, "jax.vjp through jax.numpy"),
    BackwardCase("fa1", fa1_backward, None, {"forward": fa1_forward, "gqa": True}, "FlashAttention v1 Alg. 1/4"),
    BackwardCase(
        "torch-func-vjp", torch_func_vjp_backward, None, {"framework": "torch", "gqa": True}, "torch.func.vjp"
    ),
    # buggy
    BackwardCase("llmc-no-indicator", llmc_no_indicator_term, "grad-jacobian", {}, "llm.c attention_backward"),
    BackwardCase("llmc-dkey-unscaled", llmc_dkey_unscaled, "grad-scale", {}, "llm.c attention_backward"),
    BackwardCase("t06-delta-dp", t06_delta_from_dp, "grad-delta", _T06, "triton 06 _attn_bwd_preprocess"),
    BackwardCase(
        "t06-m-only",
        t06_backward,
        "grad-lse",
        {"forward": t06_forward_m_only, "lse_units": "log2"},
        "triton 06 _attn_fwd (M = m_i + log2 l_i)",
    ),
    BackwardCase("t06-dk-assigned", t06_dk_assigned, "grad-accumulate", _T06, "triton 06 _attn_bwd_dkdv"),
    BackwardCase("t06-causal-strict", t06_causal_strict, "grad-causal", _T06, "triton 06 _attn_bwd_dkdv MASK"),
    BackwardCase("t06-k-in-place", t06_k_prescaled_in_place, "mutates-input", {"lse_units": "log2"}, "triton 06 arg_k"),
    BackwardCase("fatri-unguarded", fatri_lse_unguarded, "grad-masked-row", _FATRI, "flash_attn_triton.py"),
    BackwardCase(
        "fatri-full-blocks", fatri_full_blocks_unmasked, "grad-masked-leak", _FATRI, "flash_attn_triton.py EVEN_N"
    ),
    BackwardCase(
        "nats-declared-log2", nats_backward_declared_log2, "grad-lse", {"lse_units": "log2"}, "flash_attn_triton.py"
    ),
    BackwardCase("cs336-dk-transposed", cs336_dk_transposed, "grad-transposed", _TORCH, "cs336 a2"),
    BackwardCase("cs336-dv-einsum", cs336_dv_einsum_batch, "grad-batch-leak", _TORCH, "cs336 a2"),
    BackwardCase(
        "bnhd-gqa-wrong-group",
        bnhd_gqa_wrong_group,
        "grad-gqa-sum",
        {"layout": "bnhd", "gqa": True},
        "flash-attention GQA dk fold",
    ),
    BackwardCase("aten-upcast", aten_backward_upcast, "dtype", {"framework": "torch"}, "torch._softmax_backward_data"),
    BackwardCase(
        "fa1-tile-max", fa1_backward, "grad-lse", {"forward": fa1_forward_tile_max}, "FlashAttention v1 Alg. 1 m_i"
    ),
    BackwardCase(
        "torch-gqa-mean",
        torch_gqa_mean_backward,
        "grad-gqa-sum",
        {"framework": "torch", "gqa": True},
        "GQA backward, repeat_interleave adjoint",
    ),
    BackwardCase("saved-lse-dropout-1-p", saved_lse_dropout_1_minus_p, "grad-dropout", _TORCH, "d2l-style dropout"),
    BackwardCase("saved-lse-over-queries", saved_lse_over_queries, "grad-lse", _TORCH, "torch.logsumexp(dim=-2)"),
    BackwardCase("np-dropout-redrawn", np_dropout_redrawn, "grad-dropout", {}, "dropout keep-mask backward"),
    BackwardCase("jax-custom-vjp-unscaled", jax_custom_vjp_unscaled, "grad-scale", _JAXF, "jax custom_vjp"),
]

for _c in CASES:
    object.__setattr__(_c, "doc", _c.doc or (_c.fn.__doc__ or "").strip())
