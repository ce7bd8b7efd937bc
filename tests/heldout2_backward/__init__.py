"""A second held-out set of attention backward passes (issue 14 acceptance), written apart from the first.

Same contract as ``tests/heldout/backward_passes.py``: each :class:`~heldout.backward_passes.BackwardCase` is
run by :func:`~heldout.backward_passes.run_check` (``options["backward"] is True``: ``attnlab.check(fn,
**options)``, gradients by autograd / ``jax.vjp``; otherwise ``attnlab.check_backward(fn, **options)``). The
checker is never tuned on this package; ``verify_set.py`` checks, against torch autograd in float64, that the
correct cases are correct and that each buggy case differs the way its ``primary`` code says
(tests/test_heldout2_backward_set.py runs it).

The styles, re-written in our own words (never copied), each after public code:

* ``fa2``: FlashAttention-2 (Dao, arXiv 2307.08691) Algorithm 1 forward and Algorithm 2 backward as NumPy tiles, the
  backward with the key/value block loop outside and dQ accumulated across it (as
  Dao-AILab/flash-attention ``csrc/flash_attn/src/flash_bwd_kernel.h`` does with atomic adds); lse in nats, an empty
  row's lse +inf (``softmax.h``: ``lse = sum == 0 ? INFINITY : ...``);
* ``lucid``: lucidrains/memory-efficient-attention-pytorch ``memory_efficient_attention_pytorch/flash_attention.py``
  (commit 2c0fc02) ``FlashAttentionFunction``: a ``torch.autograd.Function`` over query and key buckets, the mask
  applied to ``p`` after ``exp`` in the backward, causal by ``triu(q_start - k_start + 1)``;
* ``pallas``: jax-ml/jax ``jax/experimental/pallas/ops/gpu/attention.py`` ``mha`` / ``_mha_forward`` /
  ``_mha_backward`` (``[batch, seq, heads, dim]``, a ``jax.custom_vjp``, ``_preprocess_backward``'s
  ``delta = sum(out * do)``, ``dp = -delta + do vᵀ``, ``ds = p * dp * sm_scale``);
* ``jac``: a CS231n-style backward with the per-row softmax Jacobian written out, ``diag(p) - p pᵀ``
  (cs231n.stanford.edu/handouts/derivatives.pdf; the einsum form of many assignment solutions);
* ``bmk``: facebookresearch/xformers' BMK reference (``tests/test_mem_eff_attention.py`` ``ref_attention_bmk``,
  ``bmhk2bmk``): ``[B, n, h, d]`` folded to ``[B*h, n, d]``, a NumPy backward per folded head;
* ``tape``: a micrograd-style tape (karpathy/micrograd ``micrograd/engine.py``, each op with its ``_backward``
  closure, run in reverse topological order) over array ops, q pre-scaled by the softmax scale;
* ``ring``: lucidrains/ring-attention-pytorch ``ring_attention_pytorch/ring_flash_attention.py`` (and
  zhuzilin/ring-flash-attention ``ring_flash_attn/utils.py`` ``_update_out_and_lse``): a ``torch.autograd.Function``
  whose key/value chunks pass round a ring of query chunks, block outputs merged by their lse, dK/dV buffers
  travelling with the chunk;
* ``exp2``: the newer pallas GPU kernel (``p = exp2(qk - lse)``, lse in log2 units, ``inner_loop_dq`` and the dK/dV
  kernel as two passes) ported to a PyTorch hand-written flash backward;
* ``d2l``: d2l-ai/d2l-en ``d2l/torch.py`` ``masked_softmax`` / ``DotProductAttention`` (``valid_lens``, masked
  scores replaced by ``-1e6``), differentiated by autograd.

About 2/3 carry one planted bug each, named by ``primary`` (None: correct, must come out clean).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from heldout.backward_passes import BackwardCase

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


# ---------------------------------------------------------------------------------------------------------------
# NumPy helpers (shared by nothing outside this package)


def _ct(x):
    """The dtype the NumPy styles compute in: float32 for float16 inputs (as the kernels' fp32 accumulators)."""
    return np.float32 if x.dtype == np.float16 else x.dtype.type


def _allowed(mask, causal, shape):
    """Bool ``[B, h, n_q, n_k]``: True where a query may attend (mask True = may attend; causal top-left)."""
    ok = np.ones(shape, bool)
    if mask is not None:
        ok = ok & np.broadcast_to(np.asarray(mask, bool), shape)
    if causal:
        n_q, n_k = shape[-2:]
        ok = ok & (np.arange(n_k)[None, :] <= np.arange(n_q)[:, None])
    return ok


def _fold_heads(g_full, h_kv, axis=1):
    """Sum the gradient of expanded K/V heads back onto their K/V head (query head i reads K/V head i // group)."""
    if g_full.shape[axis] == h_kv:
        return g_full
    shape = list(g_full.shape)
    group = shape[axis] // h_kv
    shape[axis : axis + 1] = [h_kv, group]
    return g_full.reshape(shape).sum(axis=axis + 1)


def _keep_scale(dropout_mask, dropout_p, ct):
    if dropout_mask is None:
        return None
    return np.asarray(dropout_mask, bool).astype(ct) / ct(1.0 - dropout_p)


# ---------------------------------------------------------------------------------------------------------------
# fa2: FlashAttention-2 Algorithms 1 and 2 as NumPy tiles

FA2_BR, FA2_BC = 16, 32


def _fa2_forward(q, k, v, mask, scale, causal, dropout_mask, dropout_p, *, empty_lse="inf"):
    with np.errstate(all="ignore"):
        ct = _ct(q)
        group = q.shape[1] // k.shape[1]
        qq = q.astype(ct)
        kk = np.repeat(k.astype(ct), group, axis=1)
        vv = np.repeat(v.astype(ct), group, axis=1)
        n_q, n_k = q.shape[-2], k.shape[-2]
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        ok = _allowed(mask, causal, (*q.shape[:2], n_q, n_k))
        z = _keep_scale(dropout_mask, dropout_p, ct)
        out = np.zeros((*q.shape[:-1], v.shape[-1]), ct)
        lse = np.zeros(q.shape[:-1], ct)
        for i0 in range(0, n_q, FA2_BR):
            rows = slice(i0, i0 + FA2_BR)
            qi = qq[..., rows, :]
            m = np.full(qi.shape[:-1], -np.inf, ct)
            ell = np.zeros(qi.shape[:-1], ct)
            acc = np.zeros((*qi.shape[:-1], v.shape[-1]), ct)
            for j0 in range(0, n_k, FA2_BC):
                cols = slice(j0, j0 + FA2_BC)
                s = (qi @ np.swapaxes(kk[..., cols, :], -1, -2)) * ct(scale)
                s = np.where(ok[..., rows, cols], s, -np.inf)
                m_new = np.maximum(m, s.max(axis=-1))
                m_ref = np.where(np.isfinite(m_new), m_new, 0).astype(ct)
                p = np.exp(s - m_ref[..., None])
                alpha = np.exp(m - m_ref)
                ell = alpha * ell + p.sum(axis=-1)
                pv = p if z is None else p * z[..., rows, cols]
                acc = alpha[..., None] * acc + pv @ vv[..., cols, :]
                m = m_new
            out[..., rows, :] = acc / np.where(ell > 0, ell, 1)[..., None]
            blk = m + np.log(ell)
            if empty_lse == "inf":
                blk = np.where(ell > 0, blk, np.inf)
            elif empty_lse == "no-max":
                blk = np.where(ell > 0, np.log(ell), np.inf)
            lse[..., rows] = blk
        return out.astype(q.dtype), lse.astype(np.float32 if q.dtype == np.float16 else q.dtype)


def _fa2_backward(
    q,
    k,
    v,
    out,
    lse,
    d_out,
    mask,
    scale,
    causal,
    dropout_mask,
    dropout_p,
    *,
    guard=True,
    dq_assign=False,
    f64_accumulators=False,
    dropout_in_dp=True,
    dq_rescaled=False,
):
    with np.errstate(all="ignore"):
        ct = _ct(q)
        h_kv = k.shape[1]
        group = q.shape[1] // h_kv
        qq = q.astype(ct)
        kk = np.repeat(k.astype(ct), group, axis=1)
        vv = np.repeat(v.astype(ct), group, axis=1)
        oo = np.asarray(out).astype(ct)
        do = np.asarray(d_out).astype(ct)
        ell = np.asarray(lse).astype(ct)
        if guard:  # an empty row (lse +inf, -inf or NaN): P = 0 there
            ell = np.where(np.isfinite(ell), ell, np.inf)
        n_q, n_k = q.shape[-2], k.shape[-2]
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        ok = _allowed(mask, causal, (*q.shape[:2], n_q, n_k))
        z = _keep_scale(dropout_mask, dropout_p, ct)
        delta = (do * oo).sum(axis=-1)  # D_i = rowsum(dO_i ∘ O_i), before the loops
        dq = np.zeros(qq.shape, ct)
        acc_dtype = np.float64 if f64_accumulators else ct
        if f64_accumulators:
            dk_all, dv_all = np.zeros(kk.shape), np.zeros(vv.shape)  # the bug: np.zeros defaults to float64
        else:
            dk_all, dv_all = np.zeros(kk.shape, acc_dtype), np.zeros(vv.shape, acc_dtype)
        for j0 in range(0, n_k, FA2_BC):  # outer loop over K/V blocks (a thread block each)
            cols = slice(j0, j0 + FA2_BC)
            kj, vj = kk[..., cols, :], vv[..., cols, :]
            dkj = np.zeros(kj.shape, acc_dtype)
            dvj = np.zeros(vj.shape, acc_dtype)
            for i0 in range(0, n_q, FA2_BR):
                rows = slice(i0, i0 + FA2_BR)
                qi, doi = qq[..., rows, :], do[..., rows, :]
                s = (qi @ np.swapaxes(kj, -1, -2)) * ct(scale)
                s = np.where(ok[..., rows, cols], s, -np.inf)
                p = np.exp(s - ell[..., rows, None])
                if z is None:
                    dvj += np.swapaxes(p, -1, -2) @ doi
                    dp = doi @ np.swapaxes(vj, -1, -2)
                else:
                    zij = z[..., rows, cols]
                    dvj += np.swapaxes(p * zij, -1, -2) @ doi
                    dp = doi @ np.swapaxes(vj, -1, -2)
                    if dropout_in_dp:
                        dp = dp * zij
                ds = p * (dp - delta[..., rows, None]) * ct(scale)
                if dq_assign:
                    dq[..., rows, :] = ds @ kj
                else:
                    dq[..., rows, :] += ds @ kj  # atomicAdd into dQaccum
                dkj += np.swapaxes(ds, -1, -2) @ qi
            dk_all[..., cols, :] = dkj
            dv_all[..., cols, :] = dvj
        if dq_rescaled:
            dq = dq * ct(scale)
        dk = _fold_heads(dk_all, h_kv)
        dv = _fold_heads(dv_all, h_kv)
        if f64_accumulators:
            return dq.astype(q.dtype), dk, dv
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


def fa2_forward(q, k, v, mask=None, scale=None, causal=False, dropout_mask=None, dropout_p=0.0):
    """FlashAttention-2 Algorithm 1 in NumPy tiles (16 x 32): out and lse (nats, +inf on an empty row)."""
    return _fa2_forward(q, k, v, mask, scale, causal, dropout_mask, dropout_p)


def fa2_forward_lse_neg_inf(q, k, v, mask=None, scale=None, causal=False, dropout_mask=None, dropout_p=0.0):
    """FlashAttention-2 Algorithm 1, an empty row's lse left at m + log(l) = -inf (no INFINITY convention)."""
    return _fa2_forward(q, k, v, mask, scale, causal, dropout_mask, dropout_p, empty_lse="raw")


def fa2_backward(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False, dropout_mask=None, dropout_p=0.0):
    """FlashAttention-2 Algorithm 2: K/V blocks outside, Q blocks inside, dQ accumulated across K/V blocks."""
    return _fa2_backward(q, k, v, out, lse, d_out, mask, scale, causal, dropout_mask, dropout_p)


def fa2_dq_assigned(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False, dropout_mask=None, dropout_p=0.0):
    """Algorithm 2 with ``dQ_i = dS_ij K_j`` stored instead of added: dQ keeps the last K/V block only."""
    return _fa2_backward(q, k, v, out, lse, d_out, mask, scale, causal, dropout_mask, dropout_p, dq_assign=True)


def fa2_unguarded(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False, dropout_mask=None, dropout_p=0.0):
    """Algorithm 2 trusting the lse: with an empty row's lse = -inf, ``exp(-inf - -inf)`` is NaN."""
    return _fa2_backward(q, k, v, out, lse, d_out, mask, scale, causal, dropout_mask, dropout_p, guard=False)


def fa2_f64_accumulators(
    q, k, v, out, lse, d_out, mask=None, scale=None, causal=False, dropout_mask=None, dropout_p=0.0
):
    """Algorithm 2 with dK/dV accumulators from ``np.zeros(shape)`` (float64) returned as they are."""
    return _fa2_backward(q, k, v, out, lse, d_out, mask, scale, causal, dropout_mask, dropout_p, f64_accumulators=True)


def fa2_dropout_dv_only(
    q, k, v, out, lse, d_out, mask=None, scale=None, causal=False, dropout_mask=None, dropout_p=0.0
):
    """Algorithm 2 applying the keep mask (and 1/(1-p)) to P for dV but forgetting it on dP."""
    return _fa2_backward(q, k, v, out, lse, d_out, mask, scale, causal, dropout_mask, dropout_p, dropout_in_dp=False)


def fa2_dq_scaled_twice(
    q, k, v, out, lse, d_out, mask=None, scale=None, causal=False, dropout_mask=None, dropout_p=0.0
):
    """Algorithm 2 with the scale in dS and dQ multiplied by it again at the end (the CUDA epilogue's rescale)."""
    return _fa2_backward(q, k, v, out, lse, d_out, mask, scale, causal, dropout_mask, dropout_p, dq_rescaled=True)


# ---------------------------------------------------------------------------------------------------------------
# jac: the softmax Jacobian written out (CS231n style), plain bwd(q, k, v, d_out, mask, scale)


def _jac(q, k, v, d_out, mask, scale, *, variant="ok"):
    with np.errstate(all="ignore"):
        ct = _ct(q)
        h_kv = k.shape[1]
        group = q.shape[1] // h_kv
        qq = q.astype(ct)
        kk = np.repeat(k.astype(ct), group, axis=1)
        vv = np.repeat(v.astype(ct), group, axis=1)
        do = np.asarray(d_out).astype(ct)
        scale = ct(1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
        ok = _allowed(mask, False, (*q.shape[:2], q.shape[-2], k.shape[-2]))
        scores = np.where(ok, np.einsum("bhid,bhjd->bhij", qq, kk) * scale, -np.inf)
        row_max = scores.max(axis=-1, keepdims=True)
        if variant != "unguarded":
            row_max = np.where(np.isfinite(row_max), row_max, 0)
        e = np.exp(scores - row_max)
        tot = e.sum(axis=-1, keepdims=True)
        p = e / tot if variant == "unguarded" else e / np.where(tot > 0, tot, 1)
        dv = np.einsum("bhij,bhid->bhjd", p, do)
        dp = np.einsum("bhid,bhjd->bhij", do, vv)
        eye = np.eye(p.shape[-1], dtype=ct)
        jac = p[..., :, None] * eye  # J_i[j, l] = p_ij (δ_jl - p_il)
        if variant != "diag-only":
            jac = jac - p[..., :, None] * p[..., None, :]
        ds = np.einsum("bhijl,bhil->bhij", jac, dp)
        if variant == "ds-transposed":
            dq = np.swapaxes(ds, -1, -2) @ kk * scale
        else:
            dq = ds @ kk * scale
        dk = np.swapaxes(ds, -1, -2) @ qq * scale
        return (
            dq.astype(q.dtype),
            _fold_heads(dk, h_kv).astype(k.dtype),
            _fold_heads(dv, h_kv).astype(v.dtype),
        )


def jac_backward(q, k, v, d_out, mask=None, scale=None):
    """Softmax backward through its full per-row Jacobian ``diag(p) - p pᵀ``."""
    return _jac(q, k, v, d_out, mask, scale)


def jac_diag_only(q, k, v, d_out, mask=None, scale=None):
    """The Jacobian kept to its diagonal ``diag(p)`` (the ``- p pᵀ`` term forgotten): dS = P ∘ dP."""
    return _jac(q, k, v, d_out, mask, scale, variant="diag-only")


def jac_unguarded(q, k, v, d_out, mask=None, scale=None):
    """The recomputed softmax without a guard: a fully masked row is ``exp(-inf - -inf) / 0`` = NaN."""
    return _jac(q, k, v, d_out, mask, scale, variant="unguarded")


def jac_dq_transposed(q, k, v, d_out, mask=None, scale=None):
    """``dQ = dSᵀ K`` (the transpose of the dK line kept in the dQ line)."""
    return _jac(q, k, v, d_out, mask, scale, variant="ds-transposed")


# ---------------------------------------------------------------------------------------------------------------
# bmk: xformers-style [B, n, h, d] -> [B*h, n, d] folding, plain bwd


def _bmk(q, k, v, d_out, mask, scale, *, variant="ok"):
    with np.errstate(all="ignore"):
        ct = _ct(q)
        b, n_q, h, d = q.shape
        n_k, h_kv, d_v = k.shape[1], k.shape[2], v.shape[-1]
        group = h // h_kv

        def to_bmk(x):  # bmhk2bmk
            return np.transpose(x, (0, 2, 1, 3)).reshape(b * x.shape[2], x.shape[1], x.shape[3]).astype(ct)

        qb = to_bmk(q)
        kb = to_bmk(np.repeat(k, group, axis=2))
        vb = to_bmk(np.repeat(v, group, axis=2))
        if variant == "do-reshaped":
            dob = np.asarray(d_out).reshape(b * h, n_q, d_v).astype(ct)
        else:
            dob = to_bmk(np.asarray(d_out))
        scale = ct(1.0 / math.sqrt(d) if scale is None else scale)
        ok = _allowed(mask, False, (b, h, n_q, n_k)).reshape(b * h, n_q, n_k)
        attn = np.where(ok, qb @ np.swapaxes(kb, 1, 2) * scale, -np.inf)
        mx = attn.max(axis=-1, keepdims=True)
        attn = np.exp(attn - np.where(np.isfinite(mx), mx, 0))
        den = attn.sum(axis=-1, keepdims=True)
        attn = attn / np.where(den > 0, den, 1)
        out = attn @ vb
        dvb = np.swapaxes(attn, 1, 2) @ dob
        dattn = dob @ np.swapaxes(vb, 1, 2)
        dsb = attn * (dattn - (dob * out).sum(axis=-1, keepdims=True)) * scale
        dqb = dsb @ kb
        dkb = np.swapaxes(dsb, 1, 2) @ qb

        def from_bmk(x):  # bmk2bmhk
            return np.transpose(x.reshape(b, h, x.shape[1], x.shape[2]), (0, 2, 1, 3))

        dq = from_bmk(dqb)
        dk_full, dv_full = from_bmk(dkb), from_bmk(dvb)
        dk = np.zeros((b, n_k, h_kv, d), ct)
        dv = np.zeros((b, n_k, h_kv, d_v), ct)
        for i in range(h):  # query head i read K/V head i // group
            if variant == "fold-assigned":
                dk[:, :, i // group] = dk_full[:, :, i]
                dv[:, :, i // group] = dv_full[:, :, i]
            else:
                dk[:, :, i // group] += dk_full[:, :, i]
                dv[:, :, i // group] += dv_full[:, :, i]
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


def bmk_backward(q, k, v, d_out, mask=None, scale=None):
    """``[B, n, h, d]`` folded to ``[B*h, n, d]`` (xformers' bmhk2bmk), backward per folded head."""
    return _bmk(q, k, v, d_out, mask, scale)


def bmk_do_reshaped(q, k, v, d_out, mask=None, scale=None):
    """``d_out.reshape(B*h, n, d)`` without the ``[B, n, h, d] -> [B, h, n, d]`` transpose: heads and rows mix."""
    return _bmk(q, k, v, d_out, mask, scale, variant="do-reshaped")


def bmk_fold_assigned(q, k, v, d_out, mask=None, scale=None):
    """The GQA fold loop stores each query head's dK/dV (``=``) instead of adding: the group's last head wins."""
    return _bmk(q, k, v, d_out, mask, scale, variant="fold-assigned")


# ---------------------------------------------------------------------------------------------------------------
# tape: a micrograd-style tape of array ops


class _Node:
    def __init__(self, value, parents=(), backward=None):
        self.value = value
        self.grad = np.zeros_like(value)
        self.parents = parents
        self.backward = backward or (lambda: None)


def _run_tape(root, d_root):
    order, seen = [], set()

    def visit(node):
        if id(node) in seen:
            return
        seen.add(id(node))
        for par in node.parents:
            visit(par)
        order.append(node)

    visit(root)
    root.grad = d_root
    for node in reversed(order):
        node.backward()


def _tape(q, k, v, d_out, mask, scale, causal, *, variant="ok"):
    with np.errstate(all="ignore"):
        ct = _ct(q)
        sc = ct(1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
        Q, K, V = _Node(q.astype(ct)), _Node(k.astype(ct)), _Node(v.astype(ct))

        qs = _Node(Q.value * sc, (Q,))  # q = q * scale, before the product

        def qs_back():
            Q.grad = Q.grad + (qs.grad if variant == "mul-passthrough" else qs.grad * sc)

        qs.backward = qs_back

        s = _Node(qs.value @ np.swapaxes(K.value, -1, -2), (qs, K))

        def s_back():
            qs.grad = qs.grad + s.grad @ K.value
            K.grad = K.grad + np.swapaxes(s.grad, -1, -2) @ qs.value

        s.backward = s_back

        ok = _allowed(mask, causal, s.value.shape)
        sm = _Node(np.where(ok, s.value, -np.inf), (s,))

        def sm_back():
            s.grad = s.grad + np.where(ok, sm.grad, 0)

        sm.backward = sm_back

        def softmax(x):
            mx = x.max(axis=-1, keepdims=True)
            e = np.exp(x - np.where(np.isfinite(mx), mx, 0))
            den = e.sum(axis=-1, keepdims=True)
            return e / np.where(den > 0, den, 1)

        p = _Node(softmax(sm.value), (sm,))

        def p_back():
            # saves memory: recompute the softmax in backward from the saved logits
            pp = softmax(s.value) if variant == "recompute-unmasked" else p.value
            if variant == "delta-rowsum-p":
                dot = pp.sum(axis=-1, keepdims=True)  # meant (grad * p).sum: the grad factor dropped
            else:
                dot = (p.grad * pp).sum(axis=-1, keepdims=True)
            sm.grad = sm.grad + pp * (p.grad - dot)

        p.backward = p_back

        o = _Node(p.value @ V.value, (p, V))

        def o_back():
            p.grad = p.grad + o.grad @ np.swapaxes(V.value, -1, -2)
            V.grad = V.grad + np.swapaxes(p.value, -1, -2) @ o.grad

        o.backward = o_back

        _run_tape(o, np.asarray(d_out).astype(ct))
        return Q.grad.astype(q.dtype), K.grad.astype(k.dtype), V.grad.astype(v.dtype)


def tape_backward(q, k, v, d_out, mask=None, scale=None, causal=False):
    """A micrograd-style tape: scale-q, q kᵀ, mask, softmax, p v, each with its backward closure."""
    return _tape(q, k, v, d_out, mask, scale, causal)


def tape_mul_passthrough(q, k, v, d_out, mask=None, scale=None, causal=False):
    """The scale-q node's backward passes the gradient through unscaled (``grad`` not ``grad * c``)."""
    return _tape(q, k, v, d_out, mask, scale, causal, variant="mul-passthrough")


def tape_delta_rowsum_p(q, k, v, d_out, mask=None, scale=None, causal=False):
    """The softmax node's backward subtracts ``p.sum(-1)`` (= 1) where ``(grad * p).sum(-1)`` belongs."""
    return _tape(q, k, v, d_out, mask, scale, causal, variant="delta-rowsum-p")


def tape_recompute_unmasked(q, k, v, d_out, mask=None, scale=None, causal=False):
    """The softmax node recomputes P in its backward from the logits before the mask node."""
    return _tape(q, k, v, d_out, mask, scale, causal, variant="recompute-unmasked")


# ---------------------------------------------------------------------------------------------------------------
# torch styles (torch imported when a case is first called)


def _torch():
    import torch

    return torch


def _tct(torch, x):
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _tallowed(torch, mask, causal, shape, device):
    ok = torch.ones(shape, dtype=torch.bool, device=device)
    if mask is not None:
        ok = ok & mask.to(torch.bool).broadcast_to(shape)
    if causal:
        n_q, n_k = shape[-2:]
        i = torch.arange(n_q, device=device)[:, None]
        j = torch.arange(n_k, device=device)[None, :]
        ok = ok & (j <= i)
    return ok


# lucid ---------------------------------------------------------------------------------------------------------

LUCID_QB, LUCID_KB = 16, 32


@functools.cache
def _lucid_function(variant):
    torch = _torch()

    class FlashAttentionFunction(torch.autograd.Function):
        @staticmethod
        @torch.no_grad()
        def forward(ctx, q, k, v, mask, causal, scale):
            n_q, n_k = q.shape[-2], k.shape[-2]
            o = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
            row_sums = torch.zeros((*q.shape[:-1], 1), dtype=q.dtype, device=q.device)
            row_maxes = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype, device=q.device)
            for qi in range(0, n_q, LUCID_QB):
                qc = q[..., qi : qi + LUCID_QB, :]
                for ki in range(0, n_k, LUCID_KB):
                    kc, vc = k[..., ki : ki + LUCID_KB, :], v[..., ki : ki + LUCID_KB, :]
                    w = torch.einsum("...id,...jd->...ij", qc, kc) * scale
                    if mask is not None:
                        w = w.masked_fill(~mask[..., qi : qi + LUCID_QB, ki : ki + LUCID_KB], -math.inf)
                    if causal:
                        cm = torch.ones(w.shape[-2:], dtype=torch.bool, device=q.device).triu(qi - ki + 1)
                        w = w.masked_fill(cm, -math.inf)
                    blk_max = w.amax(dim=-1, keepdim=True)
                    old_max = row_maxes[..., qi : qi + LUCID_QB, :]
                    new_max = torch.maximum(blk_max, old_max)
                    ref = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))
                    e = torch.exp(w - ref)
                    old_sum = row_sums[..., qi : qi + LUCID_QB, :]
                    alpha = torch.exp(old_max - ref)
                    new_sum = alpha * old_sum + e.sum(dim=-1, keepdim=True)
                    oc = o[..., qi : qi + LUCID_QB, :]
                    acc = oc * old_sum * alpha + torch.einsum("...ij,...jd->...id", e, vc)
                    oc.copy_(acc / torch.where(new_sum > 0, new_sum, torch.ones_like(new_sum)))
                    row_maxes[..., qi : qi + LUCID_QB, :] = new_max
                    row_sums[..., qi : qi + LUCID_QB, :] = new_sum
            lse = torch.where(row_sums > 0, row_sums.log() + row_maxes, torch.full_like(row_sums, math.inf))
            ctx.args = (causal, scale, mask)
            ctx.save_for_backward(q, k, v, o, lse)
            return o

        @staticmethod
        @torch.no_grad()
        def backward(ctx, do):
            causal, scale, mask = ctx.args
            q, k, v, o, lse = ctx.saved_tensors
            do = do.to(q.dtype)
            n_q, n_k = q.shape[-2], k.shape[-2]
            dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
            for qi in range(0, n_q, LUCID_QB):
                rows = slice(qi, qi + LUCID_QB)
                qc, oc, doc, lsec = q[..., rows, :], o[..., rows, :], do[..., rows, :], lse[..., rows, :]
                for ki in range(0, n_k, LUCID_KB):
                    cols = slice(ki, ki + LUCID_KB)
                    kc, vc = k[..., cols, :], v[..., cols, :]
                    w = torch.einsum("...id,...jd->...ij", qc, kc) * scale
                    if causal:
                        offset = qi - ki if variant == "causal-triu" else qi - ki + 1
                        cm = torch.ones(w.shape[-2:], dtype=torch.bool, device=q.device).triu(offset)
                        w = w.masked_fill(cm, -math.inf)
                    p = torch.exp(w - lsec)
                    if mask is not None and variant != "mask-forgotten":
                        p = p.masked_fill(~mask[..., rows, cols], 0.0)
                    dv_chunk = torch.einsum("...ij,...id->...jd", p, doc)
                    dp = torch.einsum("...id,...jd->...ij", doc, vc)
                    big_d = (doc * oc).sum(dim=-1, keepdim=True)
                    ds = p * scale * (dp - big_d)
                    dq[..., rows, :] += torch.einsum("...ij,...jd->...id", ds, kc)
                    dk_chunk = torch.einsum("...ij,...id->...jd", ds, qc)
                    if variant == "dkdv-copy":
                        dk[..., cols, :].copy_(dk_chunk)
                        dv[..., cols, :].copy_(dv_chunk)
                    else:
                        dk[..., cols, :].add_(dk_chunk)
                        dv[..., cols, :].add_(dv_chunk)
            return dq, dk, dv, None, None, None

    return FlashAttentionFunction


def _lucid(variant):
    def lucid_attention(q, k, v, mask=None, causal=False):
        torch = _torch()
        ct = _tct(torch, q)
        scale = q.shape[-1] ** -0.5
        m = None
        if mask is not None:
            m = mask.to(torch.bool).broadcast_to((*q.shape[:-1], k.shape[-2]))
        out = _lucid_function(variant).apply(q.to(ct), k.to(ct), v.to(ct), m, bool(causal), scale)
        return out.to(q.dtype)

    lucid_attention.__doc__ = {
        "ok": "lucidrains FlashAttentionFunction: buckets of 16 queries x 32 keys, lse saved, recomputed P.",
        "causal-triu": "The backward's causal mask ``triu(q_start - k_start)`` lost its ``+ 1``: diagonal masked.",
        "mask-forgotten": "The backward applies the causal mask but not ``mask`` to the recomputed P.",
        "dkdv-copy": "``dkc.copy_(dk_chunk)`` (and dv) instead of ``add_``: dK/dV keep the last query bucket.",
    }[variant]
    return lucid_attention


# ring ----------------------------------------------------------------------------------------------------------

RING_WORLD = 3


@functools.cache
def _ring_function(variant):
    torch = _torch()

    def chunks(n):
        size = -(-n // RING_WORLD)
        return [slice(r * size, min(n, (r + 1) * size)) for r in range(RING_WORLD) if r * size < n]

    def blocks(q, k, mask, causal, r, c):
        rows, cols = chunks(q.shape[-2])[r], chunks(k.shape[-2])[c]
        s = (q[..., rows, :] @ k[..., cols, :].transpose(-1, -2)) * ctx_scale(q)
        ok = torch.ones(s.shape, dtype=torch.bool, device=q.device)
        if mask is not None:
            ok = ok & mask[..., rows, cols]
        if causal:
            i = torch.arange(q.shape[-2], device=q.device)[rows, None]
            j = torch.arange(k.shape[-2], device=q.device)[None, cols]
            ok = ok & (j <= i)
        return rows, cols, s.masked_fill(~ok, -math.inf)

    def ctx_scale(q):
        return q.shape[-1] ** -0.5

    class RingFlashAttentionFunction(torch.autograd.Function):
        @staticmethod
        @torch.no_grad()
        def forward(ctx, q, k, v, mask, causal, keep, dropout_p):
            out = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
            lse = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype, device=q.device)
            n_dev = len(chunks(q.shape[-2]))
            n_kv = len(chunks(k.shape[-2]))
            for r in range(n_dev):  # the device holding query chunk r
                for step in range(n_kv):  # the K/V chunk that reaches it at this step of the ring
                    c = (r - step) % n_kv
                    rows, cols, s = blocks(q, k, mask, causal, r, c)
                    m = s.amax(dim=-1, keepdim=True)
                    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
                    e = torch.exp(s - m)
                    ell = e.sum(dim=-1, keepdim=True)
                    ev = e if keep is None else e * keep[..., rows, cols]
                    blk_out = (ev @ v[..., cols, :]) / torch.where(ell > 0, ell, torch.ones_like(ell))
                    blk_lse = torch.where(ell > 0, m + ell.log(), torch.full_like(ell, -math.inf))
                    old = lse[..., rows, :]
                    new = torch.logaddexp(old, blk_lse)
                    safe = torch.where(torch.isfinite(new), new, torch.zeros_like(new))
                    w_old = torch.where(torch.isfinite(old), torch.exp(old - safe), torch.zeros_like(old))
                    w_blk = torch.where(torch.isfinite(blk_lse), torch.exp(blk_lse - safe), torch.zeros_like(old))
                    out[..., rows, :] = w_old * out[..., rows, :] + w_blk * blk_out
                    lse[..., rows, :] = new
            ctx.causal = causal
            ctx.mask = mask
            ctx.keep = keep
            ctx.dropout_p = dropout_p
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        @torch.no_grad()
        def backward(ctx, do):
            q, k, v, out, lse = ctx.saved_tensors
            do = do.to(q.dtype)
            keep = ctx.keep
            if keep is not None and variant == "keep-rescaled":
                # keep already carries 1/(1-p) (it was built that way for the forward) and is rescaled here again
                keep = keep / (1.0 - ctx.dropout_p)
            delta = (do * out).sum(dim=-1, keepdim=True)
            lse_safe = torch.where(torch.isfinite(lse), lse, torch.full_like(lse, math.inf))
            dq = torch.zeros_like(q)
            dk, dv = torch.zeros_like(k), torch.zeros_like(v)
            n_dev, n_kv = len(chunks(q.shape[-2])), len(chunks(k.shape[-2]))
            for c in range(n_kv):  # follow K/V chunk c (with its dk/dv buffers) round the ring
                cols = chunks(k.shape[-2])[c]
                dk_buf = torch.zeros_like(k[..., cols, :])
                dv_buf = torch.zeros_like(v[..., cols, :])
                for step in range(n_dev):
                    r = (c + step) % n_dev
                    rows, _, s = blocks(q, k, ctx.mask, ctx.causal, r, c)
                    p = torch.exp(s - lse_safe[..., rows, :])
                    dp = do[..., rows, :] @ v[..., cols, :].transpose(-1, -2)
                    if keep is not None:
                        z = keep[..., rows, cols]
                        dv_buf += (p * z).transpose(-1, -2) @ do[..., rows, :]
                        dp = dp * z
                    else:
                        dv_buf += p.transpose(-1, -2) @ do[..., rows, :]
                    ds = p * (dp - delta[..., rows, :]) * ctx_scale(q)
                    dq[..., rows, :] += ds @ k[..., cols, :]
                    dk_buf += ds.transpose(-1, -2) @ q[..., rows, :]
                dk[..., cols, :] = dk_buf
                dv[..., cols, :] = dv_buf
            return dq, dk, dv, None, None, None, None

    return RingFlashAttentionFunction


def _ring(variant):
    def ring_attention(q, k, v, mask=None, causal=False, dropout_mask=None, dropout_p=0.0):
        torch = _torch()
        ct = _tct(torch, q)
        group = q.shape[-3] // k.shape[-3]  # (heads on axis -3: 3-D [h, n, d] inputs too)
        kk = k.to(ct).repeat_interleave(group, dim=-3)  # GQA: autograd sums the repeated heads back
        vv = v.to(ct).repeat_interleave(group, dim=-3)
        m = None if mask is None else mask.to(torch.bool).broadcast_to((*q.shape[:-1], k.shape[-2]))
        keep = None
        if dropout_mask is not None:
            keep = dropout_mask.to(ct) / (1.0 - dropout_p)
        out = _ring_function(variant).apply(q.to(ct), kk, vv, m, bool(causal), keep, float(dropout_p))
        return out.to(q.dtype)

    ring_attention.__doc__ = {
        "ok": "Ring attention: 3 query chunks, K/V chunks passed round the ring, outputs merged by lse.",
        "keep-rescaled": "The backward divides the (already 1/(1-p)-scaled) keep mask by (1-p) again.",
    }[variant]
    return ring_attention


# exp2: torch hand-written flash backward, lse in log2 units ----------------------------------------------------

EXP2_BLOCK = 32


def _exp2_forward(q, k, v, mask, scale, causal, *, lse_no_max=False):
    torch = _torch()
    ct = _tct(torch, q)
    group = q.shape[1] // k.shape[1]
    qq, kk, vv = q.to(ct), k.to(ct).repeat_interleave(group, 1), v.to(ct).repeat_interleave(group, 1)
    sm = q.shape[-1] ** -0.5 if scale is None else scale
    ok = _tallowed(torch, mask, causal, (*q.shape[:-1], k.shape[-2]), q.device)
    qk = (qq @ kk.transpose(-1, -2)) * (sm * LOG2E)
    qk = qk.masked_fill(~ok, -math.inf)
    m = qk.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp2(qk - m)
    ell = p.sum(dim=-1, keepdim=True)
    out = (p @ vv) / torch.where(ell > 0, ell, torch.ones_like(ell))
    lse = torch.log2(ell) if lse_no_max else m + torch.log2(ell)
    lse = torch.where(ell > 0, lse, torch.full_like(lse, math.inf))
    return out.to(q.dtype), lse[..., 0].to(torch.float32 if ct == torch.float32 else ct)


def exp2_forward(q, k, v, mask=None, scale=None, causal=False):
    """out and lse in log2 units (``m + log2(l)`` of the ``qk * sm_scale * log2(e)`` logits)."""
    return _exp2_forward(q, k, v, mask, scale, causal)


def exp2_forward_no_max(q, k, v, mask=None, scale=None, causal=False):
    """out right, but the lse written as ``log2(l)``: the row max m left out."""
    return _exp2_forward(q, k, v, mask, scale, causal, lse_no_max=True)


def _exp2_backward(q, k, v, out, lse, d_out, mask, scale, causal, *, variant="ok"):
    torch = _torch()
    ct = _tct(torch, q)
    h_kv = k.shape[1]
    group = q.shape[1] // h_kv
    sm = q.shape[-1] ** -0.5 if scale is None else scale
    if variant == "q-in-place":
        q.mul_(sm * LOG2E)  # pre-scaled once for both kernels, as the triton kernels do with their K
        qq = q.to(ct)
        pre = 1.0
    else:
        qq = q.to(ct)
        pre = sm * LOG2E
    kk, vv = k.to(ct).repeat_interleave(group, 1), v.to(ct).repeat_interleave(group, 1)
    oo, do = out.to(ct), d_out.to(ct)
    lse = lse.to(ct)
    lse = torch.where(torch.isfinite(lse), lse, torch.full_like(lse, math.inf))[..., None]
    ok = _tallowed(torch, mask, causal and variant != "causal-ignored", (*q.shape[:-1], k.shape[-2]), q.device)
    di = (oo * do).sum(dim=-1, keepdim=True)  # _preprocess_backward
    n_q, n_k = q.shape[-2], k.shape[-2]

    def probs(rows, cols):
        qk = (qq[..., rows, :] @ kk[..., cols, :].transpose(-1, -2)) * pre
        qk = qk.masked_fill(~ok[..., rows, cols], -math.inf)
        if variant == "exp-of-log2":
            return torch.exp(qk * LN2 - lse[..., rows, :])  # natural-log logits against a log2 lse
        return torch.exp2(qk - lse[..., rows, :])

    dk_full, dv_full = torch.zeros_like(kk), torch.zeros_like(vv)
    for c0 in range(0, n_k, EXP2_BLOCK):  # the dK/dV kernel
        cols = slice(c0, c0 + EXP2_BLOCK)
        for r0 in range(0, n_q, EXP2_BLOCK):
            rows = slice(r0, r0 + EXP2_BLOCK)
            p = probs(rows, cols)
            dv_full[..., cols, :] += p.transpose(-1, -2) @ do[..., rows, :]
            dp = -di[..., rows, :] + do[..., rows, :] @ vv[..., cols, :].transpose(-1, -2)
            ds = p * dp * sm
            q_rows = qq[..., rows, :] / (sm * LOG2E) if variant == "q-in-place" else qq[..., rows, :]
            dk_full[..., cols, :] += ds.transpose(-1, -2) @ q_rows
    dq = torch.zeros_like(qq)
    for r0 in range(0, n_q, EXP2_BLOCK):  # inner_loop_dq
        rows = slice(r0, r0 + EXP2_BLOCK)
        for c0 in range(0, n_k, EXP2_BLOCK):
            cols = slice(c0, c0 + EXP2_BLOCK)
            p = probs(rows, cols)
            dp = -di[..., rows, :] + do[..., rows, :] @ vv[..., cols, :].transpose(-1, -2)
            dq[..., rows, :] += (p * dp * sm) @ kk[..., cols, :]
    shape_k = (k.shape[0], h_kv, group, *k.shape[2:])
    shape_v = (v.shape[0], h_kv, group, *v.shape[2:])
    dk = dk_full.reshape(shape_k).sum(dim=2)
    dv = dv_full.reshape(shape_v).sum(dim=2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def exp2_backward(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """``p = exp2(qk · sm_scale · log2 e - lse)``; dK/dV pass and dQ pass in 32 x 32 blocks; GQA folded by sum."""
    return _exp2_backward(q, k, v, out, lse, d_out, mask, scale, causal)


def exp2_read_as_nats(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """P recomputed as ``exp(qk · sm_scale - lse)``: the log2 lse read as if it were in nats."""
    return _exp2_backward(q, k, v, out, lse, d_out, mask, scale, causal, variant="exp-of-log2")


def exp2_causal_ignored(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """The backward takes ``causal`` but never applies it (the forward does): P has the future keys."""
    return _exp2_backward(q, k, v, out, lse, d_out, mask, scale, causal, variant="causal-ignored")


def exp2_q_in_place(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """``q.mul_(sm_scale * log2 e)``: Q pre-scaled in place (the caller's q changed); gradients right."""
    return _exp2_backward(q, k, v, out, lse, d_out, mask, scale, causal, variant="q-in-place")


# d2l -----------------------------------------------------------------------------------------------------------


def d2l_attention(queries, keys, values, valid_lens=None):
    """d2l ``DotProductAttention`` with ``masked_softmax``: scores past ``valid_lens`` replaced by -1e6."""
    torch = _torch()
    ct = _tct(torch, queries)  # the softmax in float32 for half inputs, as autocast does
    d = queries.shape[-1]
    scores = (queries.to(ct) @ keys.to(ct).transpose(-1, -2)) / math.sqrt(d)
    if valid_lens is not None:
        shape = scores.shape
        lens = torch.repeat_interleave(valid_lens.to(torch.int64), shape[1] * shape[2])
        flat = scores.reshape(-1, shape[-1])
        keep = torch.arange(shape[-1], device=flat.device)[None, :] < lens[:, None]
        flat = flat.masked_fill(~keep, -1e6)  # sequence_mask(X, valid_len, value=-1e6)
        weights = torch.softmax(flat, dim=-1).reshape(shape)
    else:
        weights = torch.softmax(scores, dim=-1)
    return (weights @ values.to(ct)).to(queries.dtype)


# pallas: jax custom_vjp in [batch, seq, heads, dim] ------------------------------------------------------------


@functools.cache
def _pallas_mha(variant):
    import jax
    import jax.numpy as jnp

    def fct(x):
        return jnp.float32 if x.dtype in (jnp.float16, jnp.bfloat16) else x.dtype

    def scores(q, k, mask, causal, sm_scale, *, bottom_right=False):
        ct = fct(q)
        s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(ct), k.astype(ct)) * sm_scale
        ok = jnp.ones(s.shape, bool)
        if mask is not None:
            ok = ok & jnp.broadcast_to(mask.astype(bool), s.shape)
        if causal:
            n_q, n_k = s.shape[-2:]
            span_q = jnp.arange(n_q)[:, None] + ((n_k - n_q) if bottom_right else 0)
            span_k = jnp.arange(n_k)[None, :]
            ok = ok & (span_q >= span_k)
        return jnp.where(ok, s, -jnp.inf)

    def forward(q, k, v, mask, causal, sm_scale):
        s = scores(q, k, mask, causal, sm_scale)
        m = s.max(axis=-1, keepdims=True)
        m = jnp.where(jnp.isfinite(m), m, 0.0)
        p = jnp.exp(s - m)
        ell = p.sum(axis=-1, keepdims=True)
        o = jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(p.dtype)) / jnp.swapaxes(jnp.where(ell > 0, ell, 1.0), 1, 2)
        lse = jnp.where(ell > 0, m + jnp.log(ell), jnp.inf)[..., 0]  # [b, h, q]
        return o.astype(q.dtype), lse

    @functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
    def mha(q, k, v, mask, causal, sm_scale):
        return forward(q, k, v, mask, causal, sm_scale)[0]

    def mha_fwd(q, k, v, mask, causal, sm_scale):
        out, lse = forward(q, k, v, mask, causal, sm_scale)
        return out, (q, k, v, mask, out, lse)

    def mha_bwd(causal, sm_scale, res, do):
        q, k, v, mask, out, lse = res
        ct = fct(q)
        o32, do32 = out.astype(ct), do.astype(ct)
        s = scores(q, k, mask, causal, sm_scale, bottom_right=variant == "bwd-bottom-right")
        p = jnp.exp(s - lse[..., None])
        dp_raw = jnp.einsum("bqhd,bkhd->bhqk", do32, v.astype(ct))
        if variant == "delta-rowsum-dp":
            delta = dp_raw.sum(axis=-1)  # D from do vᵀ's row sums
        else:
            delta = jnp.swapaxes(jnp.sum(o32 * do32, axis=-1), 1, 2)  # _preprocess_backward: [b, h, q]
        if variant == "no-delta":
            dp = dp_raw  # dp's accumulator started at 0, not at -delta
        else:
            dp = jnp.zeros_like(dp_raw) - delta[..., None]
            dp = dp + dp_raw
        ds = p * dp * sm_scale
        dv = jnp.einsum("bhqk,bqhd->bkhd", p, do32)
        dq = jnp.einsum("bhqk,bkhd->bqhd", ds, k.astype(ct))
        dk = jnp.einsum("bhqk,bqhd->bkhd", ds, q.astype(ct))
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None

    mha.defvjp(mha_fwd, mha_bwd)
    return mha


def _pallas(variant):
    def pallas_attention(q, k, v, mask=None, causal=False):
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
        return _pallas_mha(variant)(q, k, v, mask, bool(causal), sm_scale)

    pallas_attention.__doc__ = {
        "ok": "jax custom_vjp after pallas ``mha``: lse residual, delta = sum(out * do), dp = -delta + do vᵀ.",
        "delta-rowsum-dp": "``delta`` taken as the row sums of ``do vᵀ`` (dP) instead of ``sum(out * do)``.",
        "no-delta": "``dp = do vᵀ``: the accumulator not started at ``-delta``, so dS = P ∘ dP.",
        "bwd-bottom-right": "The backward's causal mask aligned bottom-right while the forward's is top-left.",
    }[variant]
    return pallas_attention


# ---------------------------------------------------------------------------------------------------------------

_FA2 = {"forward": fa2_forward}
_TORCH = {"backward": True, "framework": "torch"}
_JAXF = {"backward": True, "framework": "jax", "layout": "bnhd", "ranks": (4,)}  # einsum "bqhd": 4-D only
_EXP2 = {"forward": exp2_forward, "lse_units": "log2", "framework": "torch"}
_FA2_SRC = "Dao-AILab/flash-attention csrc/flash_attn/src/flash_bwd_kernel.h; arXiv 2307.08691 Alg. 1-2"
_LUCID_SRC = "lucidrains/memory-efficient-attention-pytorch flash_attention.py @2c0fc02 FlashAttentionFunction"
_PALLAS_SRC = "jax-ml/jax jax/experimental/pallas/ops/gpu/attention.py mha/_mha_forward/_mha_backward"
_JAC_SRC = "CS231n softmax Jacobian (cs231n.stanford.edu/handouts/derivatives.pdf), einsum form"
_BMK_SRC = "facebookresearch/xformers tests/test_mem_eff_attention.py ref_attention_bmk, bmhk2bmk"
_TAPE_SRC = "karpathy/micrograd micrograd/engine.py (_backward closures, reverse topological order)"
_RING_SRC = "lucidrains/ring-attention-pytorch ring_flash_attention.py; zhuzilin/ring-flash-attention utils.py"
_EXP2_SRC = "jax-ml/jax pallas/ops/gpu/attention.py (exp2(qk - lse), inner_loop_dq), ported to torch"
_D2L_SRC = "d2l-ai/d2l-en d2l/torch.py masked_softmax, DotProductAttention"

CASES: list[BackwardCase] = [
    # correct
    BackwardCase("fa2", fa2_backward, None, {**_FA2, "gqa": True}, _FA2_SRC),
    BackwardCase("fa2-golden", fa2_backward, None, {"gqa": True}, _FA2_SRC + " (golden out and lse)"),
    BackwardCase("lucid", _lucid("ok"), None, _TORCH, _LUCID_SRC),
    BackwardCase("pallas", _pallas("ok"), None, _JAXF, _PALLAS_SRC),
    BackwardCase("jac", jac_backward, None, {"gqa": True}, _JAC_SRC),
    BackwardCase("bmk", bmk_backward, None, {"layout": "bnhd", "gqa": True}, _BMK_SRC),
    BackwardCase("tape", tape_backward, None, {}, _TAPE_SRC),
    BackwardCase("ring", _ring("ok"), None, {**_TORCH, "gqa": True}, _RING_SRC),
    BackwardCase("exp2", exp2_backward, None, {**_EXP2, "gqa": True}, _EXP2_SRC),
    BackwardCase(
        "exp2-golden",
        exp2_backward,
        None,
        {"lse_units": "log2", "framework": "torch"},
        _EXP2_SRC + " (golden out and lse)",
    ),
    # written as correct; the lead relabelled it: d2l's -1e6 fill is a finite fill (docs/checker.md `finite-fill`,
    # tests/zoo np-valid-lens-d2l), which scores below -1e6 exceed, and the forward battery names it
    BackwardCase("d2l", d2l_attention, "finite-fill", {**_TORCH, "mask_form": "valid_lens", "ranks": (4,)}, _D2L_SRC),
    # buggy
    BackwardCase("fa2-dq-assigned", fa2_dq_assigned, "grad-accumulate", _FA2, _FA2_SRC + " (dQaccum atomicAdd)"),
    BackwardCase(
        "fa2-lse-neg-inf",
        fa2_unguarded,
        "grad-masked-row",
        {"forward": fa2_forward_lse_neg_inf},
        _FA2_SRC + " (softmax.h INFINITY for an empty row; cf. NaN dQ in Dao-AILab/flash-attention#443)",
    ),
    BackwardCase("fa2-f64-accumulators", fa2_f64_accumulators, "dtype", _FA2, _FA2_SRC),
    BackwardCase("fa2-dropout-dv-only", fa2_dropout_dv_only, "grad-dropout", _FA2, _FA2_SRC + " (dropout, §B)"),
    BackwardCase("fa2-dq-scaled-twice", fa2_dq_scaled_twice, "grad-scale", _FA2, _FA2_SRC),
    BackwardCase("lucid-causal-triu", _lucid("causal-triu"), "grad-causal", _TORCH, _LUCID_SRC),
    BackwardCase("lucid-mask-forgotten", _lucid("mask-forgotten"), "grad-masked-leak", _TORCH, _LUCID_SRC),
    BackwardCase("lucid-dkdv-copy", _lucid("dkdv-copy"), "grad-accumulate", _TORCH, _LUCID_SRC),
    BackwardCase("pallas-delta-dp", _pallas("delta-rowsum-dp"), "grad-delta", _JAXF, _PALLAS_SRC),
    BackwardCase("pallas-no-delta", _pallas("no-delta"), "grad-jacobian", _JAXF, _PALLAS_SRC),
    BackwardCase("pallas-bottom-right", _pallas("bwd-bottom-right"), "grad-causal", _JAXF, _PALLAS_SRC),
    BackwardCase("jac-diag-only", jac_diag_only, "grad-jacobian", {}, _JAC_SRC),
    BackwardCase("jac-unguarded", jac_unguarded, "grad-masked-row", {}, _JAC_SRC),
    BackwardCase("jac-dq-transposed", jac_dq_transposed, "grad-transposed", {}, _JAC_SRC),
    BackwardCase("bmk-do-reshaped", bmk_do_reshaped, "grad-batch-leak", {"layout": "bnhd"}, _BMK_SRC),
    BackwardCase("bmk-fold-assigned", bmk_fold_assigned, "grad-gqa-sum", {"layout": "bnhd", "gqa": True}, _BMK_SRC),
    BackwardCase("tape-mul-passthrough", tape_mul_passthrough, "grad-scale", {}, _TAPE_SRC),
    BackwardCase("tape-delta-rowsum-p", tape_delta_rowsum_p, "grad-delta", {}, _TAPE_SRC),
    BackwardCase("tape-recompute-unmasked", tape_recompute_unmasked, "grad-masked-leak", {}, _TAPE_SRC),
    BackwardCase("ring-keep-rescaled", _ring("keep-rescaled"), "grad-dropout", _TORCH, _RING_SRC),
    BackwardCase("exp2-read-as-nats", exp2_read_as_nats, "grad-lse", _EXP2, _EXP2_SRC),
    BackwardCase(
        "exp2-lse-no-max",
        exp2_backward,
        "grad-lse",
        {"forward": exp2_forward_no_max, "lse_units": "log2", "framework": "torch"},
        _EXP2_SRC + " (M = m + log2 l)",
    ),
    BackwardCase(
        "exp2-causal-ignored",
        exp2_causal_ignored,
        "grad-causal",
        _EXP2,
        _EXP2_SRC + "; the bug of triton-lang/triton#4541 (the tutorial's bwd ignoring ctx.causal)",
    ),
    BackwardCase("exp2-q-in-place", exp2_q_in_place, "mutates-input", _EXP2, _EXP2_SRC),
]

for _c in CASES:
    object.__setattr__(_c, "doc", _c.doc or (_c.fn.__doc__ or "").strip())
