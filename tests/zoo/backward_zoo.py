"""The backward zoo (issue 14 §4): deliberately broken attention backward passes, and correct ones.

Every :class:`~zoo.Entry` here is checked with :func:`run_check`, which picks the entry point (documented in
docs/checker.md, "Backward") from the entry's options:

* ``options["backward"] is True``: ``attnlab.check(fn, **options)`` — ``fn`` is a PyTorch forward
  ``fn(q, k, v, mask=None, ...)`` whose gradients come from autograd (a custom ``torch.autograd.Function`` with a
  hand-written backward, torch SDPA, plain torch ops);
* otherwise ``attnlab.check_backward(fn, **options)`` — ``fn`` is a hand-written backward, in either signature:

  - plain: ``bwd(q, k, v, d_out, mask=None, scale=None) -> (dq, dk, dv)`` (NumPy, or PyTorch tensors with
    ``framework="torch"``);
  - flash: ``bwd(q, k, v, out, lse, d_out, ...) -> (dq, dk, dv)`` with ``options["forward"] = fwd``,
    ``fwd(q, k, v, ...) -> (out, lse)`` (lse ``[B, h, n_q]``, nats unless ``lse_units="log2"``); without
    ``forward`` the checker passes the golden ``out`` and ``lse`` (in the declared units).

Optional keywords, taken when a function has them: ``mask=`` (bool, True = may attend), ``scale=``, ``causal=``
(top-left), ``dropout_mask=`` (bool ``[B, h, n_q, n_k]``, True = kept) with ``dropout_p=`` (kept weights scaled
by ``1/(1-p)``). Shapes ``q [..., h, n_q, d_k]``, ``k [..., h_kv, n_k, d_k]``, ``v [..., h_kv, n_k, d_v]``, any
rank >= 2; with ``h_kv < h`` (GQA, ``gqa=True``) query head ``i`` reads K/V head ``i // (h / h_kv)``.

``expected`` is the backward finding code(s) each broken entry must produce (empty: the entry is correct and must
come out clean), ``also`` the codes its bug legitimately causes besides (a transposed ``dV`` that only has the
right shape when ``n_q == n_k`` also crashes on cross attention). Fully masked rows: every correct implementation
here follows the "zero" policy (zero output, zero gradient), as FlashAttention and torch SDPA (math and flash
backends) do.

The tiled NumPy FlashAttention-2 passes use tiny blocks (:data:`BLOCK_Q` x :data:`BLOCK_K` = 4 x 3, which divide
few sizes) so that every shape with more than 4 queries or 3 keys has several blocks: an accumulator that is
overwritten instead of accumulated only shows with several blocks along the axis it is accumulated over.
"""

from __future__ import annotations

import inspect
import math

import numpy as np

from . import Entry

BLOCK_Q = 4
BLOCK_K = 3
LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)


def run_check(entry: Entry):
    """The checker's report on ``entry``, through the entry point its options name (see the module docstring)."""
    import attnlab

    options = dict(entry.options)
    if options.get("backward") is True:
        return attnlab.check(entry.fn, **options)
    return attnlab.check_backward(entry.fn, **options)


def kind(entry: Entry) -> str:
    """``"autograd"`` (a torch forward), ``"flash"`` (a ``(q, k, v, out, lse, d_out)`` backward) or ``"plain"``."""
    if entry.options.get("backward") is True:
        return "autograd"
    names = list(inspect.signature(entry.fn).parameters)
    return "flash" if names[3:6] == ["out", "lse", "d_out"] else "plain"


# ---------------------------------------------------------------------------------------------------------------
# NumPy building blocks (q [..., h, n_q, d_k], k [..., h_kv, n_k, d_k], v [..., h_kv, n_k, d_v])


def _t(x):
    return np.swapaxes(x, -1, -2)


def _cdt(x):
    """The compute dtype: float64 for float64 inputs, float32 for float32 and float16."""
    return np.float64 if x.dtype == np.float64 else np.float32


def _scale(scale, d_k):
    return 1.0 / math.sqrt(d_k) if scale is None else float(scale)


def _expand(x, h):
    """K/V heads repeated for GQA (query head i reads K/V head i // group)."""
    if x.ndim < 3 or x.shape[-3] == h:
        return x
    return np.repeat(x, h // x.shape[-3], axis=-3)


def _fold(g, h_kv):
    """The adjoint of :func:`_expand`: a gradient over the query heads summed over each group."""
    if g.ndim < 3 or g.shape[-3] == h_kv:
        return g
    group = g.shape[-3] // h_kv
    return g.reshape(*g.shape[:-3], h_kv, group, *g.shape[-2:]).sum(axis=-3)


def _heads(x):
    return x.shape[-3] if x.ndim >= 3 else 1


def _allowed(mask, causal, shape, diagonal=0):
    """bool ``[..., n_q, n_k]``: the mask (True = may attend) and the top-left causal triangle."""
    allowed = np.ones(shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), shape)
    if causal:
        allowed = allowed & np.tril(np.ones(shape[-2:], bool), k=diagonal)
    return allowed


def _softmax(s, allowed):
    """Row softmax over the allowed keys; a row without any allowed key gives zeros."""
    s = np.where(allowed, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    den = np.sum(e, axis=-1, keepdims=True)
    return e / np.where(den > 0, den, 1)


def _keep(dropout_mask, dropout_p, shape, dt):
    """``keep / (1 - p)`` (or None without dropout)."""
    if dropout_mask is None:
        return None
    return np.broadcast_to(np.asarray(dropout_mask, bool), shape).astype(dt) / dt(1.0 - dropout_p)


def _setup(q, k, v, d_out, mask, scale, causal=False):
    """Inputs in the compute dtype with K/V expanded to the query heads; the scores' allowed pattern."""
    cdt = _cdt(q)
    h = _heads(q)
    qc, dc = q.astype(cdt), d_out.astype(cdt)
    kc, vc = _expand(k.astype(cdt), h), _expand(v.astype(cdt), h)
    shape = (*np.broadcast_shapes(qc.shape[:-2], kc.shape[:-2]), q.shape[-2], k.shape[-2])
    return cdt, qc, kc, vc, dc, _scale(scale, q.shape[-1]), _allowed(mask, causal, shape)


def _finish(q, k, v, dq, dk, dv):
    return dq.astype(q.dtype), _fold(dk, _heads(k)).astype(k.dtype), _fold(dv, _heads(v)).astype(v.dtype)


# ---------------------------------------------------------------------------------------------------------------
# NumPy analytic backward passes, plain signature bwd(q, k, v, d_out, mask=None, scale=None) -> (dq, dk, dv)


def np_analytic(q, k, v, d_out, mask=None, scale=None, causal=False):
    """Correct: the §9 backward, dS = P ∘ (dP - rowsum(dP ∘ P)), dQ = dS K · scale, dK = dSᵀ Q · scale."""
    _, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale, causal)
    p = _softmax(q_ @ _t(k_) * sc, allowed)
    dv = _t(p) @ do
    dp = do @ _t(v_)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    return _finish(q, k, v, ds @ k_ * sc, _t(ds) @ q_ * sc, dv)


def np_analytic_dropout(q, k, v, d_out, mask=None, scale=None, dropout_mask=None, dropout_p=0.0):
    """Correct with dropout: dV = P̃ᵀ dO, dP = (dO Vᵀ) ∘ keep / (1-p), delta = rowsum(dO ∘ O) (O recomputed)."""
    cdt, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale)
    p = _softmax(q_ @ _t(k_) * sc, allowed)
    mult = _keep(dropout_mask, dropout_p, p.shape, cdt)
    pd = p if mult is None else p * mult
    out = pd @ v_
    dp = do @ _t(v_)
    if mult is not None:
        dp = dp * mult
    delta = np.sum(do * out, axis=-1, keepdims=True)
    ds = p * (dp - delta)
    return _finish(q, k, v, ds @ k_ * sc, _t(ds) @ q_ * sc, _t(pd) @ do)


def np_einsum(q, k, v, d_out, mask=None, scale=None):
    """Correct, written with einsum: dA = dO Vᵀ, dS = P ∘ dA - P ∘ Σ_k(P ∘ dA) (the Jacobian diag(p) - p pᵀ
    applied row by row)."""
    _, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale)
    p = _softmax(np.einsum("...id,...jd->...ij", q_, k_) * sc, allowed)
    dv = np.einsum("...ij,...id->...jd", p, do)
    da = np.einsum("...id,...jd->...ij", do, v_)
    ds = p * da - p * np.einsum("...ik,...ik->...i", p, da)[..., None]
    dq = np.einsum("...ij,...jd->...id", ds, k_) * sc
    return _finish(q, k, v, dq, np.einsum("...ij,...id->...jd", ds, q_) * sc, dv)


def np_jacobian_missing(q, k, v, d_out, mask=None, scale=None):
    """grad-jacobian: dS = P ∘ dP, the "- delta" of the softmax Jacobian forgotten (dV is right)."""
    _, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale)
    p = _softmax(q_ @ _t(k_) * sc, allowed)
    ds = p * (do @ _t(v_))
    return _finish(q, k, v, ds @ k_ * sc, _t(ds) @ q_ * sc, _t(p) @ do)


def np_delta_rowsum_dp(q, k, v, d_out, mask=None, scale=None):
    """grad-delta: delta = rowsum(dP) instead of rowsum(dP ∘ P) = rowsum(dO ∘ O)."""
    _, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale)
    p = _softmax(q_ @ _t(k_) * sc, allowed)
    dp = do @ _t(v_)
    ds = p * (dp - dp.sum(axis=-1, keepdims=True))
    return _finish(q, k, v, ds @ k_ * sc, _t(ds) @ q_ * sc, _t(p) @ do)


def np_delta_rowsum_p(q, k, v, d_out, mask=None, scale=None):
    """grad-delta: delta = rowsum(P) (which is 1 on every row with a key) instead of rowsum(dO ∘ O)."""
    _, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale)
    p = _softmax(q_ @ _t(k_) * sc, allowed)
    ds = p * (do @ _t(v_) - p.sum(axis=-1, keepdims=True))
    return _finish(q, k, v, ds @ k_ * sc, _t(ds) @ q_ * sc, _t(p) @ do)


def np_scale_missing(q, k, v, d_out, mask=None, scale=None):
    """grad-scale: the forward's scale is used for P but left out of dQ and dK."""
    _, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale)
    p = _softmax(q_ @ _t(k_) * sc, allowed)
    dp = do @ _t(v_)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    return _finish(q, k, v, ds @ k_, _t(ds) @ q_, _t(p) @ do)


def np_dv_transposed(q, k, v, d_out, mask=None, scale=None):
    """grad-transposed: dV = P dO instead of Pᵀ dO (only the right shape when n_q == n_k: crashes otherwise)."""
    _, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale)
    p = _softmax(q_ @ _t(k_) * sc, allowed)
    dp = do @ _t(v_)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    return _finish(q, k, v, ds @ k_ * sc, _t(ds) @ q_ * sc, p @ do)


def np_dv_unmasked(q, k, v, d_out, mask=None, scale=None):
    """grad-masked-leak: dV is computed from the unmasked weights (the mask is applied for dQ/dK only), so
    masked keys' V gets gradient from rows that cannot see them."""
    _, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale)
    s = q_ @ _t(k_) * sc
    p = _softmax(s, allowed)
    p_all = _softmax(s, np.ones_like(allowed))
    dp = do @ _t(v_)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    return _finish(q, k, v, ds @ k_ * sc, _t(ds) @ q_ * sc, _t(np.where(allowed.any(-1, keepdims=True), p_all, p)) @ do)


def np_naive_softmax(q, k, v, d_out, mask=None, scale=None):
    """grad-masked-row: P recomputed with a plain softmax over -inf fills: a fully masked row is 0/0 = NaN, which
    spreads to every gradient (correct on any mask that leaves each row a key)."""
    _, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale)
    s = np.where(allowed, q_ @ _t(k_) * sc, -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
    dp = do @ _t(v_)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    return _finish(q, k, v, ds @ k_ * sc, _t(ds) @ q_ * sc, _t(p) @ do)


def np_gqa_first_head(q, k, v, d_out, mask=None, scale=None):
    """grad-gqa-sum: GQA dK/dV taken from the first query head of each group instead of summed over the group
    (correct without GQA)."""
    _, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale)
    p = _softmax(q_ @ _t(k_) * sc, allowed)
    dp = do @ _t(v_)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    dk, dv = _t(ds) @ q_ * sc, _t(p) @ do
    group = _heads(q) // _heads(k)
    if group > 1:
        dk, dv = dk[..., ::group, :, :], dv[..., ::group, :, :]
    return (ds @ k_ * sc).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


def np_gqa_mean(q, k, v, d_out, mask=None, scale=None):
    """grad-gqa-sum: GQA dK/dV averaged over the query heads of a group (``.mean``) instead of summed."""
    _, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale)
    p = _softmax(q_ @ _t(k_) * sc, allowed)
    dp = do @ _t(v_)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    h_kv, dk, dv = _heads(k), _t(ds) @ q_ * sc, _t(p) @ do
    if dk.ndim >= 3 and dk.shape[-3] != h_kv:
        dk, dv = (g.reshape(*g.shape[:-3], h_kv, -1, *g.shape[-2:]).mean(axis=-3) for g in (dk, dv))
    return (ds @ k_ * sc).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


def np_causal_off_by_one(q, k, v, d_out, mask=None, scale=None, causal=False):
    """grad-causal: the backward rebuilds the causal triangle with ``np.tril(..., k=1)`` (each query also sees the
    next key), while the forward used ``k=0``."""
    _, q_, k_, v_, do, sc, _ = _setup(q, k, v, d_out, mask, scale)
    shape = (*np.broadcast_shapes(q_.shape[:-2], k_.shape[:-2]), q.shape[-2], k.shape[-2])
    p = _softmax(q_ @ _t(k_) * sc, _allowed(mask, causal, shape, diagonal=1))
    dp = do @ _t(v_)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    return _finish(q, k, v, ds @ k_ * sc, _t(ds) @ q_ * sc, _t(p) @ do)


def np_causal_flag_not_read(q, k, v, d_out, mask=None, scale=None, causal=False):
    """grad-causal: the backward always rebuilds P under the causal triangle (its ``causal`` flag is never read),
    while the forward honours the flag: right for causal calls, wrong for every other one with n_q > 1."""
    _, q_, k_, v_, do, sc, _ = _setup(q, k, v, d_out, mask, scale)
    shape = (*np.broadcast_shapes(q_.shape[:-2], k_.shape[:-2]), q.shape[-2], k.shape[-2])
    p = _softmax(q_ @ _t(k_) * sc, _allowed(mask, True, shape))
    dp = do @ _t(v_)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    return _finish(q, k, v, ds @ k_ * sc, _t(ds) @ q_ * sc, _t(p) @ do)


def np_jacobian_diagonal(q, k, v, d_out, mask=None, scale=None):
    """grad-jacobian: each weight differentiated as if it depended on its own score only, ``dS = P (1 - P) dP``
    (the elementwise derivative of a sigmoid), the off-diagonal ``-P_ij P_ik`` terms of the softmax Jacobian lost."""
    _, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale)
    p = _softmax(q_ @ _t(k_) * sc, allowed)
    ds = p * (1 - p) * (do @ _t(v_))
    return _finish(q, k, v, ds @ k_ * sc, _t(ds) @ q_ * sc, _t(p) @ do)


def np_dv_weights_unnormalised(q, k, v, d_out, mask=None, scale=None):
    """grad-lse: dV is computed from the weights before the division by their row sum, ``exp(s - max)`` (a port of
    a kernel whose dO came pre-divided by the denominator); dQ and dK use the normalised P and are right."""
    _, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale)
    s = np.where(allowed, q_ @ _t(k_) * sc, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    p = _softmax(q_ @ _t(k_) * sc, allowed)
    dp = do @ _t(v_)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    return _finish(q, k, v, ds @ k_ * sc, _t(ds) @ q_ * sc, _t(e) @ do)


def np_dropout_dp_forgotten(q, k, v, d_out, mask=None, scale=None, dropout_mask=None, dropout_p=0.0):
    """grad-dropout: dV uses the dropped weights, but dP = dO Vᵀ is not multiplied by keep / (1-p)."""
    cdt, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale)
    p = _softmax(q_ @ _t(k_) * sc, allowed)
    mult = _keep(dropout_mask, dropout_p, p.shape, cdt)
    pd = p if mult is None else p * mult
    dp = do @ _t(v_)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    return _finish(q, k, v, ds @ k_ * sc, _t(ds) @ q_ * sc, _t(pd) @ do)


def np_flattened_dk(q, k, v, d_out, mask=None, scale=None):
    """grad-batch-leak: dK computed as one 2-D product over rows flattened across batch and heads,
    ``dS.reshape(-1, n_k).T @ Q.reshape(-1, d_k)``: every batch element and head gets the sum of all of them
    (correct with B = h = 1)."""
    _, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale)
    p = _softmax(q_ @ _t(k_) * sc, allowed)
    dp = do @ _t(v_)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    dk = (ds.reshape(-1, ds.shape[-1]).T @ q_.reshape(-1, q_.shape[-1])) * sc  # [n_k, d_k]
    return _finish(q, k, v, ds @ k_ * sc, np.broadcast_to(dk, k_.shape), _t(p) @ do)


def np_scales_q_in_place(q, k, v, d_out, mask=None, scale=None):
    """mutates-input: folds the scale into q with ``q *= scale`` (the caller's array), then uses the scaled q
    consistently: the gradients are right, the caller's q is not."""
    sc = _scale(scale, q.shape[-1])
    q *= q.dtype.type(sc)  # the caller's array
    qs = q.astype(_cdt(q))
    _, _, k_, v_, do, _, allowed = _setup(q, k, v, d_out, mask, scale)
    p = _softmax(qs @ _t(k_), allowed)
    dp = do @ _t(v_)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    return _finish(q, k, v, ds @ k_ * sc, _t(ds) @ qs, _t(p) @ do)


def np_numpy_scalar_scale(q, k, v, d_out, mask=None, scale=None):
    """dtype: ``scale = 1 / np.sqrt(d_k)`` is a NumPy float64 scalar, which NumPy 2 promotes every float32 (and
    float16) gradient to float64; the result is never cast back. Values are right."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else np.float64(scale)
    h = _heads(q)
    k_, v_ = _expand(k, h), _expand(v, h)
    p = _softmax(q @ _t(k_) * scale, _allowed(mask, False, (*q.shape[:-1], k.shape[-2])))
    dp = d_out @ _t(v_)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    return ds @ k_ * scale, _fold(_t(ds) @ q * scale, _heads(k)), _fold(_t(p) @ d_out, _heads(v))


# ---------------------------------------------------------------------------------------------------------------
# NumPy tiled FlashAttention-2: fwd(q, k, v, ...) -> (out, lse [..., n_q]) and bwd(q, k, v, out, lse, d_out, ...)


def _blocks(n, b):
    return [(i, min(i + b, n)) for i in range(0, n, b)]


def _tile_allowed(allowed, i0, i1, j0, j1):
    return allowed[..., i0:i1, j0:j1]


def fa2_forward(q, k, v, mask=None, scale=None, causal=False, dropout_mask=None, dropout_p=0.0):
    """Correct FlashAttention-2 forward: online softmax over key blocks; ``lse = m + log(l)`` in nats (-inf on a
    fully masked row, whose output is 0)."""
    cdt, q_, k_, v_, _, sc, allowed = _setup(q, k, v, q[..., :1], mask, scale, causal)
    n_q, n_k = q.shape[-2], k.shape[-2]
    lead = allowed.shape[:-2]
    mult = _keep(dropout_mask, dropout_p, allowed.shape, cdt)
    out = np.zeros((*lead, n_q, v.shape[-1]), cdt)
    lse = np.full((*lead, n_q), -np.inf, cdt)
    for i0, i1 in _blocks(n_q, BLOCK_Q):
        m = np.full((*lead, i1 - i0), -np.inf, cdt)
        l = np.zeros((*lead, i1 - i0), cdt)
        acc = np.zeros((*lead, i1 - i0, v.shape[-1]), cdt)
        for j0, j1 in _blocks(n_k, BLOCK_K):
            s = q_[..., i0:i1, :] @ _t(k_[..., j0:j1, :]) * sc
            s = np.where(_tile_allowed(allowed, i0, i1, j0, j1), s, -np.inf)
            m_new = np.maximum(m, s.max(axis=-1))
            m_safe = np.where(np.isfinite(m_new), m_new, 0)
            p = np.exp(s - m_safe[..., None])
            alpha = np.exp(m - m_safe)
            l = alpha * l + p.sum(axis=-1)
            if mult is not None:
                p = p * mult[..., i0:i1, j0:j1]
            acc = alpha[..., None] * acc + p @ v_[..., j0:j1, :]
            m = m_new
        out[..., i0:i1, :] = acc / np.where(l > 0, l, 1)[..., None]
        with np.errstate(divide="ignore"):
            lse[..., i0:i1] = np.where(l > 0, m + np.log(l), -np.inf)
    return out.astype(q.dtype), lse


def fa2_forward_plain(q, k, v, mask=None, scale=None, causal=False):
    """:func:`fa2_forward` without the dropout keywords: the forward of the backward passes that take none."""
    return fa2_forward(q, k, v, mask=mask, scale=scale, causal=causal)


def fa2_backward(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False, dropout_mask=None, dropout_p=0.0):
    """Correct FlashAttention-2 backward (Algorithm 2): delta = rowsum(dO ∘ O); for each key block, over the query
    blocks: P = exp(S - lse), dV += P̃ᵀ dO, dP = dO Vᵀ (∘ keep/(1-p)), dS = P ∘ (dP - delta), dQ += dS K·scale,
    dK += dSᵀ Q·scale. A row with lse = -inf (fully masked) gets P = 0."""
    cdt, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale, causal)
    n_q, n_k = q.shape[-2], k.shape[-2]
    lead = allowed.shape[:-2]
    mult = _keep(dropout_mask, dropout_p, allowed.shape, cdt)
    lse = np.asarray(lse, cdt)
    lse_safe = np.where(np.isfinite(lse), lse, np.inf)
    delta = np.sum(do * np.asarray(out, cdt), axis=-1)
    dq = np.zeros((*lead, n_q, q.shape[-1]), cdt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), cdt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), cdt)
    for j0, j1 in _blocks(n_k, BLOCK_K):
        kj, vj = k_[..., j0:j1, :], v_[..., j0:j1, :]
        dk_j = np.zeros((*lead, j1 - j0, k.shape[-1]), cdt)
        dv_j = np.zeros((*lead, j1 - j0, v.shape[-1]), cdt)
        for i0, i1 in _blocks(n_q, BLOCK_Q):
            qi, doi = q_[..., i0:i1, :], do[..., i0:i1, :]
            s = np.where(_tile_allowed(allowed, i0, i1, j0, j1), qi @ _t(kj) * sc, -np.inf)
            p = np.exp(s - lse_safe[..., i0:i1, None])
            dp = doi @ _t(vj)
            if mult is not None:
                pd = p * mult[..., i0:i1, j0:j1]
                dp = dp * mult[..., i0:i1, j0:j1]
            else:
                pd = p
            dv_j += _t(pd) @ doi
            ds = p * (dp - delta[..., i0:i1, None])
            dq[..., i0:i1, :] += ds @ kj * sc
            dk_j += _t(ds) @ qi * sc
        dk[..., j0:j1, :] = dk_j
        dv[..., j0:j1, :] = dv_j
    return _finish(q, k, v, dq, dk, dv)


def fa2_forward_log2(q, k, v, mask=None, scale=None, causal=False):
    """Correct FlashAttention-2 forward keeping the lse in log2 units (as the Triton kernels: ``exp2`` with the
    scale folded into ``scale * log2(e)``): returns ``lse2 = lse / ln 2``."""
    out, lse = fa2_forward(q, k, v, mask=mask, scale=scale, causal=causal)
    return out, lse * LOG2E


def fa2_backward_log2(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """FlashAttention-2 backward with lse in log2 units: P = exp2(S · log2(e) - lse2). Correct when declared
    ``lse_units="log2"``."""
    cdt, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale, causal)
    lead, n_q, n_k = allowed.shape[:-2], q.shape[-2], k.shape[-2]
    lse2 = np.asarray(lse, cdt)
    lse2 = np.where(np.isfinite(lse2), lse2, np.inf)
    delta = np.sum(do * np.asarray(out, cdt), axis=-1)
    dq = np.zeros((*lead, n_q, q.shape[-1]), cdt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), cdt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), cdt)
    qs = q_ * (sc * LOG2E)  # the scale folded into q once, in log2 units
    for i0, i1 in _blocks(n_q, BLOCK_Q):  # query blocks outside (FA2's dQ pass order), dK/dV += per block
        for j0, j1 in _blocks(n_k, BLOCK_K):
            s2 = np.where(_tile_allowed(allowed, i0, i1, j0, j1), qs[..., i0:i1, :] @ _t(k_[..., j0:j1, :]), -np.inf)
            p = np.exp2(s2 - lse2[..., i0:i1, None])
            dp = do[..., i0:i1, :] @ _t(v_[..., j0:j1, :])
            ds = p * (dp - delta[..., i0:i1, None])
            dv[..., j0:j1, :] += _t(p) @ do[..., i0:i1, :]
            dq[..., i0:i1, :] += ds @ k_[..., j0:j1, :] * sc
            dk[..., j0:j1, :] += _t(ds) @ q_[..., i0:i1, :] * sc
    return _finish(q, k, v, dq, dk, dv)


def fa2_bwd_dk_overwritten(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """grad-accumulate: the dK/dV block accumulators are assigned (``=``) in the loop over query blocks instead of
    accumulated (``+=``): only the last query block's contribution survives (correct when n_q <= 4)."""
    cdt, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale, causal)
    lead, n_q, n_k = allowed.shape[:-2], q.shape[-2], k.shape[-2]
    lse_safe = np.where(np.isfinite(lse), np.asarray(lse, cdt), np.inf)
    delta = np.sum(do * np.asarray(out, cdt), axis=-1)
    dq = np.zeros((*lead, n_q, q.shape[-1]), cdt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), cdt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), cdt)
    for j0, j1 in _blocks(n_k, BLOCK_K):
        kj, vj = k_[..., j0:j1, :], v_[..., j0:j1, :]
        for i0, i1 in _blocks(n_q, BLOCK_Q):
            qi, doi = q_[..., i0:i1, :], do[..., i0:i1, :]
            s = np.where(_tile_allowed(allowed, i0, i1, j0, j1), qi @ _t(kj) * sc, -np.inf)
            p = np.exp(s - lse_safe[..., i0:i1, None])
            ds = p * (doi @ _t(vj) - delta[..., i0:i1, None])
            dq[..., i0:i1, :] += ds @ kj * sc
            dk_j = _t(ds) @ qi * sc  # BUG: = instead of +=
            dv_j = _t(p) @ doi
        dk[..., j0:j1, :] = dk_j
        dv[..., j0:j1, :] = dv_j
    return _finish(q, k, v, dq, dk, dv)


def fa2_bwd_dq_overwritten(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """grad-accumulate: the dQ rows are written (``dq[i] = dS K``) by each key block instead of accumulated, so
    only the last key block's contribution survives (correct when n_k <= 3)."""
    cdt, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale, causal)
    lead, n_q, n_k = allowed.shape[:-2], q.shape[-2], k.shape[-2]
    lse_safe = np.where(np.isfinite(lse), np.asarray(lse, cdt), np.inf)
    delta = np.einsum("...id,...id->...i", do, np.asarray(out, cdt))
    dq = np.zeros((*lead, n_q, q.shape[-1]), cdt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), cdt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), cdt)
    for j0, j1 in _blocks(n_k, BLOCK_K):
        for i0, i1 in _blocks(n_q, BLOCK_Q):
            s = np.where(
                _tile_allowed(allowed, i0, i1, j0, j1), q_[..., i0:i1, :] @ _t(k_[..., j0:j1, :]) * sc, -np.inf
            )
            p = np.exp(s - lse_safe[..., i0:i1, None])
            ds = p * (do[..., i0:i1, :] @ _t(v_[..., j0:j1, :]) - delta[..., i0:i1, None])
            dv[..., j0:j1, :] += _t(p) @ do[..., i0:i1, :]
            dk[..., j0:j1, :] += _t(ds) @ q_[..., i0:i1, :] * sc
            dq[..., i0:i1, :] = ds @ k_[..., j0:j1, :] * sc  # BUG: = instead of +=
    return _finish(q, k, v, dq, dk, dv)


def fa2_bwd_no_delta(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """grad-jacobian: delta = rowsum(dO ∘ O) is computed, but dS = P ∘ dP does not subtract it."""
    cdt, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale, causal)
    lead, n_q, n_k = allowed.shape[:-2], q.shape[-2], k.shape[-2]
    lse_safe = np.where(np.isfinite(lse), np.asarray(lse, cdt), np.inf)
    delta = np.sum(do * np.asarray(out, cdt), axis=-1)  # noqa: F841 (computed, never used: the bug)
    dq = np.zeros((*lead, n_q, q.shape[-1]), cdt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), cdt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), cdt)
    for j0, j1 in _blocks(n_k, BLOCK_K):
        for i0, i1 in _blocks(n_q, BLOCK_Q):
            s = np.where(
                _tile_allowed(allowed, i0, i1, j0, j1), q_[..., i0:i1, :] @ _t(k_[..., j0:j1, :]) * sc, -np.inf
            )
            p = np.exp(s - lse_safe[..., i0:i1, None])
            ds = p * (do[..., i0:i1, :] @ _t(v_[..., j0:j1, :]))
            dv[..., j0:j1, :] += _t(p) @ do[..., i0:i1, :]
            dk[..., j0:j1, :] += _t(ds) @ q_[..., i0:i1, :] * sc
            dq[..., i0:i1, :] += ds @ k_[..., j0:j1, :] * sc
    return _finish(q, k, v, dq, dk, dv)


def fa2_bwd_delta_rowsum_dp(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """grad-delta: a first pass over the key blocks computes delta = rowsum(dP) = rowsum(dO Vᵀ) (over the allowed
    keys) instead of rowsum(dO ∘ O)."""
    cdt, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale, causal)
    lead, n_q, n_k = allowed.shape[:-2], q.shape[-2], k.shape[-2]
    lse_safe = np.where(np.isfinite(lse), np.asarray(lse, cdt), np.inf)
    delta = np.zeros((*lead, n_q), cdt)
    for j0, j1 in _blocks(n_k, BLOCK_K):
        dp = do @ _t(v_[..., j0:j1, :])
        delta += np.where(allowed[..., j0:j1], dp, 0).sum(axis=-1)
    dq = np.zeros((*lead, n_q, q.shape[-1]), cdt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), cdt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), cdt)
    for j0, j1 in _blocks(n_k, BLOCK_K):
        for i0, i1 in _blocks(n_q, BLOCK_Q):
            s = np.where(
                _tile_allowed(allowed, i0, i1, j0, j1), q_[..., i0:i1, :] @ _t(k_[..., j0:j1, :]) * sc, -np.inf
            )
            p = np.exp(s - lse_safe[..., i0:i1, None])
            ds = p * (do[..., i0:i1, :] @ _t(v_[..., j0:j1, :]) - delta[..., i0:i1, None])
            dv[..., j0:j1, :] += _t(p) @ do[..., i0:i1, :]
            dk[..., j0:j1, :] += _t(ds) @ q_[..., i0:i1, :] * sc
            dq[..., i0:i1, :] += ds @ k_[..., j0:j1, :] * sc
    return _finish(q, k, v, dq, dk, dv)


def fa2_forward_lse_no_max(q, k, v, mask=None, scale=None, causal=False):
    """grad-lse (the forward's lse): the online softmax is right, but the stored lse is ``log(l)`` without the
    running maximum ``m`` added back; the output is right, P = exp(S - lse) in the backward is not."""
    cdt, q_, k_, v_, _, sc, allowed = _setup(q, k, v, q[..., :1], mask, scale, causal)
    lead, n_q, n_k = allowed.shape[:-2], q.shape[-2], k.shape[-2]
    out = np.zeros((*lead, n_q, v.shape[-1]), cdt)
    lse = np.full((*lead, n_q), -np.inf, cdt)
    for i0, i1 in _blocks(n_q, BLOCK_Q):
        m = np.full((*lead, i1 - i0), -np.inf, cdt)
        l = np.zeros((*lead, i1 - i0), cdt)
        acc = np.zeros((*lead, i1 - i0, v.shape[-1]), cdt)
        for j0, j1 in _blocks(n_k, BLOCK_K):
            s = np.where(
                _tile_allowed(allowed, i0, i1, j0, j1), q_[..., i0:i1, :] @ _t(k_[..., j0:j1, :]) * sc, -np.inf
            )
            m_new = np.maximum(m, s.max(axis=-1))
            m_safe = np.where(np.isfinite(m_new), m_new, 0)
            p = np.exp(s - m_safe[..., None])
            alpha = np.exp(m - m_safe)
            l = alpha * l + p.sum(axis=-1)
            acc = alpha[..., None] * acc + p @ v_[..., j0:j1, :]
            m = m_new
        out[..., i0:i1, :] = acc / np.where(l > 0, l, 1)[..., None]
        with np.errstate(divide="ignore"):
            lse[..., i0:i1] = np.where(l > 0, np.log(l), -np.inf)  # BUG: m + log(l)
    return out.astype(q.dtype), lse


def fa2_forward_lse_max_only(q, k, v, mask=None, scale=None, causal=False):
    """grad-lse (the forward's lse): the stored lse is the running maximum ``m`` alone, the ``log(l)`` forgotten;
    the output is right, the backward's P = exp(S - lse) has every row scaled by its l."""
    out, lse = fa2_forward(q, k, v, mask=mask, scale=scale, causal=causal)
    _, q_, k_, _, _, sc, allowed = _setup(q, k, v, q[..., :1], mask, scale, causal)
    s = np.where(allowed, q_ @ _t(k_) * sc, -np.inf)
    return out, np.where(np.isfinite(lse), s.max(axis=-1), -np.inf).astype(lse.dtype)  # BUG: m + log(l)


def fa2_bwd_only_dk_assigned(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """grad-accumulate: in the loop over query blocks dV accumulates (``+=``) but dK is assigned (``=``): only the
    last query block's contribution to dK survives."""
    cdt, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale, causal)
    lead, n_q, n_k = allowed.shape[:-2], q.shape[-2], k.shape[-2]
    lse_safe = np.where(np.isfinite(lse), np.asarray(lse, cdt), np.inf)
    delta = np.sum(do * np.asarray(out, cdt), axis=-1)
    dq = np.zeros((*lead, n_q, q.shape[-1]), cdt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), cdt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), cdt)
    for j0, j1 in _blocks(n_k, BLOCK_K):
        kj, vj = k_[..., j0:j1, :], v_[..., j0:j1, :]
        for i0, i1 in _blocks(n_q, BLOCK_Q):
            qi, doi = q_[..., i0:i1, :], do[..., i0:i1, :]
            s = np.where(_tile_allowed(allowed, i0, i1, j0, j1), qi @ _t(kj) * sc, -np.inf)
            p = np.exp(s - lse_safe[..., i0:i1, None])
            ds = p * (doi @ _t(vj) - delta[..., i0:i1, None])
            dq[..., i0:i1, :] += ds @ kj * sc
            dk[..., j0:j1, :] = _t(ds) @ qi * sc  # BUG: = instead of +=
            dv[..., j0:j1, :] += _t(p) @ doi
    return _finish(q, k, v, dq, dk, dv)


def fa2_bwd_recomputes_lse(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """grad-lse: ignores the lse it is given and recomputes it per query block as ``log(sum(exp(S - m)))``,
    forgetting to add the block maximum ``m`` back."""
    cdt, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale, causal)
    lead, n_q, n_k = allowed.shape[:-2], q.shape[-2], k.shape[-2]
    delta = np.sum(do * np.asarray(out, cdt), axis=-1)
    dq = np.zeros((*lead, n_q, q.shape[-1]), cdt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), cdt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), cdt)
    for i0, i1 in _blocks(n_q, BLOCK_Q):
        s_row = np.where(allowed[..., i0:i1, :], q_[..., i0:i1, :] @ _t(k_) * sc, -np.inf)
        m = s_row.max(axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        tot = np.exp(s_row - m).sum(axis=-1)
        with np.errstate(divide="ignore"):
            my_lse = np.where(tot > 0, np.log(tot), np.inf)  # BUG: m[..., 0] + log(tot)
        for j0, j1 in _blocks(n_k, BLOCK_K):
            s = s_row[..., j0:j1]
            p = np.exp(s - my_lse[..., None])
            ds = p * (do[..., i0:i1, :] @ _t(v_[..., j0:j1, :]) - delta[..., i0:i1, None])
            dv[..., j0:j1, :] += _t(p) @ do[..., i0:i1, :]
            dk[..., j0:j1, :] += _t(ds) @ q_[..., i0:i1, :] * sc
            dq[..., i0:i1, :] += ds @ k_[..., j0:j1, :] * sc
    return _finish(q, k, v, dq, dk, dv)


def fa2_bwd_lse_unguarded(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """grad-masked-row: P = exp(S - lse) without a guard for lse = -inf: on a fully masked row that is
    exp(-inf + inf) = NaN (right on every row that has a key)."""
    cdt, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale, causal)
    lead, n_q, n_k = allowed.shape[:-2], q.shape[-2], k.shape[-2]
    lse = np.asarray(lse, cdt)
    delta = np.sum(do * np.asarray(out, cdt), axis=-1)
    dq = np.zeros((*lead, n_q, q.shape[-1]), cdt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), cdt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), cdt)
    for j0, j1 in _blocks(n_k, BLOCK_K):
        for i0, i1 in _blocks(n_q, BLOCK_Q):
            s = np.where(
                _tile_allowed(allowed, i0, i1, j0, j1), q_[..., i0:i1, :] @ _t(k_[..., j0:j1, :]) * sc, -np.inf
            )
            with np.errstate(invalid="ignore"):
                p = np.exp(s - lse[..., i0:i1, None])
            ds = p * (do[..., i0:i1, :] @ _t(v_[..., j0:j1, :]) - delta[..., i0:i1, None])
            dv[..., j0:j1, :] += _t(p) @ do[..., i0:i1, :]
            dk[..., j0:j1, :] += _t(ds) @ q_[..., i0:i1, :] * sc
            dq[..., i0:i1, :] += ds @ k_[..., j0:j1, :] * sc
    return _finish(q, k, v, dq, dk, dv)


def fa2_bwd_ignores_mask(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """grad-masked-leak: the backward recomputes P = exp(S - lse) over every key (the mask is only applied in the
    forward), so masked keys get gradient; fully masked rows (lse = -inf) are guarded to P = 0."""
    cdt, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale, causal)
    lead, n_q, n_k = allowed.shape[:-2], q.shape[-2], k.shape[-2]
    lse_safe = np.where(np.isfinite(lse), np.asarray(lse, cdt), np.inf)
    delta = np.sum(do * np.asarray(out, cdt), axis=-1)
    dq = np.zeros((*lead, n_q, q.shape[-1]), cdt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), cdt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), cdt)
    for j0, j1 in _blocks(n_k, BLOCK_K):
        for i0, i1 in _blocks(n_q, BLOCK_Q):
            s = q_[..., i0:i1, :] @ _t(k_[..., j0:j1, :]) * sc  # BUG: the mask is not applied
            with np.errstate(over="ignore"):
                p = np.exp(s - lse_safe[..., i0:i1, None])
            ds = p * (do[..., i0:i1, :] @ _t(v_[..., j0:j1, :]) - delta[..., i0:i1, None])
            dv[..., j0:j1, :] += _t(p) @ do[..., i0:i1, :]
            dk[..., j0:j1, :] += _t(ds) @ q_[..., i0:i1, :] * sc
            dq[..., i0:i1, :] += ds @ k_[..., j0:j1, :] * sc
    return _finish(q, k, v, dq, dk, dv)


def fa2_bwd_causal_shifted(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """grad-causal: the backward's block mask tests ``col < row`` (strict) while the forward used ``col <= row``:
    the diagonal is masked in the backward only."""
    cdt, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale, False)
    lead, n_q, n_k = allowed.shape[:-2], q.shape[-2], k.shape[-2]
    lse_safe = np.where(np.isfinite(lse), np.asarray(lse, cdt), np.inf)
    delta = np.sum(do * np.asarray(out, cdt), axis=-1)
    dq = np.zeros((*lead, n_q, q.shape[-1]), cdt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), cdt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), cdt)
    for j0, j1 in _blocks(n_k, BLOCK_K):
        for i0, i1 in _blocks(n_q, BLOCK_Q):
            ok = allowed[..., i0:i1, j0:j1]
            if causal:
                rows, cols = np.arange(i0, i1)[:, None], np.arange(j0, j1)[None, :]
                ok = ok & (cols < rows)  # BUG: cols <= rows
            s = np.where(ok, q_[..., i0:i1, :] @ _t(k_[..., j0:j1, :]) * sc, -np.inf)
            p = np.exp(s - lse_safe[..., i0:i1, None])
            ds = p * (do[..., i0:i1, :] @ _t(v_[..., j0:j1, :]) - delta[..., i0:i1, None])
            dv[..., j0:j1, :] += _t(p) @ do[..., i0:i1, :]
            dk[..., j0:j1, :] += _t(ds) @ q_[..., i0:i1, :] * sc
            dq[..., i0:i1, :] += ds @ k_[..., j0:j1, :] * sc
    return _finish(q, k, v, dq, dk, dv)


def fa2_bwd_dk_unscaled(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """grad-scale: dQ carries the scale, dK = dSᵀ Q does not."""
    cdt, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale, causal)
    lead, n_q, n_k = allowed.shape[:-2], q.shape[-2], k.shape[-2]
    lse_safe = np.where(np.isfinite(lse), np.asarray(lse, cdt), np.inf)
    delta = np.sum(do * np.asarray(out, cdt), axis=-1)
    dq = np.zeros((*lead, n_q, q.shape[-1]), cdt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), cdt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), cdt)
    for j0, j1 in _blocks(n_k, BLOCK_K):
        for i0, i1 in _blocks(n_q, BLOCK_Q):
            s = np.where(
                _tile_allowed(allowed, i0, i1, j0, j1), q_[..., i0:i1, :] @ _t(k_[..., j0:j1, :]) * sc, -np.inf
            )
            p = np.exp(s - lse_safe[..., i0:i1, None])
            ds = p * (do[..., i0:i1, :] @ _t(v_[..., j0:j1, :]) - delta[..., i0:i1, None])
            dv[..., j0:j1, :] += _t(p) @ do[..., i0:i1, :]
            dk[..., j0:j1, :] += _t(ds) @ q_[..., i0:i1, :]  # BUG: * sc missing
            dq[..., i0:i1, :] += ds @ k_[..., j0:j1, :] * sc
    return _finish(q, k, v, dq, dk, dv)


def fa2_bwd_dropout_dv_undropped(
    q, k, v, out, lse, d_out, mask=None, scale=None, causal=False, dropout_mask=None, dropout_p=0.0
):
    """grad-dropout: dP is multiplied by keep / (1-p), but dV accumulates the undropped Pᵀ dO."""
    cdt, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale, causal)
    lead, n_q, n_k = allowed.shape[:-2], q.shape[-2], k.shape[-2]
    mult = _keep(dropout_mask, dropout_p, allowed.shape, cdt)
    lse_safe = np.where(np.isfinite(lse), np.asarray(lse, cdt), np.inf)
    delta = np.sum(do * np.asarray(out, cdt), axis=-1)
    dq = np.zeros((*lead, n_q, q.shape[-1]), cdt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), cdt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), cdt)
    for j0, j1 in _blocks(n_k, BLOCK_K):
        for i0, i1 in _blocks(n_q, BLOCK_Q):
            s = np.where(
                _tile_allowed(allowed, i0, i1, j0, j1), q_[..., i0:i1, :] @ _t(k_[..., j0:j1, :]) * sc, -np.inf
            )
            p = np.exp(s - lse_safe[..., i0:i1, None])
            dp = do[..., i0:i1, :] @ _t(v_[..., j0:j1, :])
            if mult is not None:
                dp = dp * mult[..., i0:i1, j0:j1]
            ds = p * (dp - delta[..., i0:i1, None])
            dv[..., j0:j1, :] += _t(p) @ do[..., i0:i1, :]  # BUG: the dropped P̃ᵀ dO
            dk[..., j0:j1, :] += _t(ds) @ q_[..., i0:i1, :] * sc
            dq[..., i0:i1, :] += ds @ k_[..., j0:j1, :] * sc
    return _finish(q, k, v, dq, dk, dv)


def fa2_bwd_lse_to_log2_in_place(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """mutates-input: converts the caller's lse to log2 units in place (``lse *= LOG2E``) to use ``exp2``; the
    gradients are right (with NumPy float lse; another library's lse is converted to NumPy first)."""
    if isinstance(lse, np.ndarray) and lse.dtype.kind == "f":
        lse *= LOG2E  # the caller's array
        lse2 = lse
    else:
        lse2 = np.asarray(lse, np.float64) * LOG2E
    cdt, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale, causal)
    lead, n_q, n_k = allowed.shape[:-2], q.shape[-2], k.shape[-2]
    lse2 = np.where(np.isfinite(lse2), lse2, np.inf).astype(cdt)
    delta = np.sum(do * np.asarray(out, cdt), axis=-1)
    dq = np.zeros((*lead, n_q, q.shape[-1]), cdt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), cdt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), cdt)
    for j0, j1 in _blocks(n_k, BLOCK_K):
        for i0, i1 in _blocks(n_q, BLOCK_Q):
            s = np.where(
                _tile_allowed(allowed, i0, i1, j0, j1), q_[..., i0:i1, :] @ _t(k_[..., j0:j1, :]) * sc, -np.inf
            )
            p = np.exp2(s * LOG2E - lse2[..., i0:i1, None])
            ds = p * (do[..., i0:i1, :] @ _t(v_[..., j0:j1, :]) - delta[..., i0:i1, None])
            dv[..., j0:j1, :] += _t(p) @ do[..., i0:i1, :]
            dk[..., j0:j1, :] += _t(ds) @ q_[..., i0:i1, :] * sc
            dq[..., i0:i1, :] += ds @ k_[..., j0:j1, :] * sc
    return _finish(q, k, v, dq, dk, dv)


def fa2_bwd_float64_accumulators(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """dtype: the accumulators are ``np.zeros(shape)`` (float64) and returned as they are, so float32 and float16
    inputs get float64 gradients (the values are right, more precise even)."""
    _, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale, causal)
    lead, n_q, n_k = allowed.shape[:-2], q.shape[-2], k.shape[-2]
    lse_safe = np.where(np.isfinite(lse), np.asarray(lse, np.float64), np.inf)
    delta = np.sum(do * np.asarray(out, np.float64), axis=-1)
    dq, dk, dv = (
        np.zeros((*lead, n_q, q.shape[-1])),
        np.zeros((*lead, n_k, k.shape[-1])),
        np.zeros((*lead, n_k, v.shape[-1])),
    )
    for j0, j1 in _blocks(n_k, BLOCK_K):
        for i0, i1 in _blocks(n_q, BLOCK_Q):
            s = np.where(
                _tile_allowed(allowed, i0, i1, j0, j1), q_[..., i0:i1, :] @ _t(k_[..., j0:j1, :]) * sc, -np.inf
            )
            p = np.exp(s - lse_safe[..., i0:i1, None])
            ds = p * (do[..., i0:i1, :] @ _t(v_[..., j0:j1, :]) - delta[..., i0:i1, None])
            dv[..., j0:j1, :] += _t(p) @ do[..., i0:i1, :]
            dk[..., j0:j1, :] += _t(ds) @ q_[..., i0:i1, :] * sc
            dq[..., i0:i1, :] += ds @ k_[..., j0:j1, :] * sc
    return dq, _fold(dk, _heads(k)), _fold(dv, _heads(v))


def fa2_bwd_gqa_tiled_fold(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """grad-gqa-sum (wrong group): the forward reads K/V head ``i // group`` (interleave), but the backward sums
    query head gradients into K/V head ``i % h_kv`` (the tile mapping): correct without GQA and with h_kv = 1."""
    cdt, q_, k_, v_, do, sc, allowed = _setup(q, k, v, d_out, mask, scale, causal)
    lead, n_q, n_k = allowed.shape[:-2], q.shape[-2], k.shape[-2]
    lse_safe = np.where(np.isfinite(lse), np.asarray(lse, cdt), np.inf)
    delta = np.sum(do * np.asarray(out, cdt), axis=-1)
    dq = np.zeros((*lead, n_q, q.shape[-1]), cdt)
    dk = np.zeros((*lead, n_k, k.shape[-1]), cdt)
    dv = np.zeros((*lead, n_k, v.shape[-1]), cdt)
    for j0, j1 in _blocks(n_k, BLOCK_K):
        for i0, i1 in _blocks(n_q, BLOCK_Q):
            s = np.where(
                _tile_allowed(allowed, i0, i1, j0, j1), q_[..., i0:i1, :] @ _t(k_[..., j0:j1, :]) * sc, -np.inf
            )
            p = np.exp(s - lse_safe[..., i0:i1, None])
            ds = p * (do[..., i0:i1, :] @ _t(v_[..., j0:j1, :]) - delta[..., i0:i1, None])
            dv[..., j0:j1, :] += _t(p) @ do[..., i0:i1, :]
            dk[..., j0:j1, :] += _t(ds) @ q_[..., i0:i1, :] * sc
            dq[..., i0:i1, :] += ds @ k_[..., j0:j1, :] * sc
    h_kv = _heads(k)
    if dk.ndim >= 3 and dk.shape[-3] != h_kv:
        dk, dv = (g.reshape(*g.shape[:-3], -1, h_kv, *g.shape[-2:]).sum(axis=-4) for g in (dk, dv))
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


# ---------------------------------------------------------------------------------------------------------------
# attnlab's own backward passes wrapped in the two signatures (correct)


def attnlab_core_backward(q, k, v, d_out, mask=None, scale=None, causal=False):
    """Correct: ``attnlab.attention_trace`` (masked_rows="zero") + ``attnlab.core.gradients.attention_backward``
    (K/V repeated over the query heads for GQA, their gradients summed back)."""
    from attnlab import attention_trace
    from attnlab.core.gradients import attention_backward

    h = _heads(q)
    trace = attention_trace(q, _expand(k, h), _expand(v, h), mask, causal=causal, scale=scale, masked_rows="zero")
    g = attention_backward(trace, d_out)
    return _finish(q, k, v, g.dq, g.dk, g.dv)


def attnlab_flash_forward(q, k, v, mask=None, scale=None, causal=False):
    """Correct: ``attnlab.kernels.flash_attention`` (masked_rows="zero") -> (output, lse in nats)."""
    from attnlab.kernels import flash_attention

    r = flash_attention(q, k, v, mask=mask, scale=scale, causal=causal, masked_rows="zero")
    return r.output, r.lse


def attnlab_flash_backward(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """Correct: ``attnlab.kernels.flash_attention_backward`` (masked_rows="zero") on the out and lse it is given."""
    from attnlab.kernels import FlashResult, TiledOptions, flash_attention_backward

    opts = TiledOptions.of(mask=mask, scale=scale, causal=causal, masked_rows="zero")
    g = flash_attention_backward(FlashResult(out, lse, inputs=(q, k, v, None), options=opts), d_out)
    return g.dq, g.dk, g.dv


def attnlab_flash_plain(q, k, v, d_out, mask=None, scale=None, causal=False):
    """Correct: ``flash_attention`` + ``flash_attention_backward`` (masked_rows="zero") behind the plain signature."""
    from attnlab.kernels import flash_attention, flash_attention_backward

    r = flash_attention(q, k, v, mask=mask, scale=scale, causal=causal, masked_rows="zero")
    g = flash_attention_backward(r, d_out)  # the forward's result holds its inputs, options and lse
    return g.dq, g.dk, g.dv


def attnlab_core_flash(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    """Correct: the core's ``attention_backward`` behind the flash signature (``out`` and ``lse`` unused: the trace
    recomputes the weights)."""
    return attnlab_core_backward(q, k, v, d_out, mask=mask, scale=scale, causal=causal)


# ---------------------------------------------------------------------------------------------------------------
# PyTorch: custom autograd.Functions (checked with backward=True), SDPA, plain ops, a torch plain-signature bwd


def _torch():
    import torch

    return torch


def _tcdt(torch, x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _texpand(x, h):
    if x.dim() < 3 or x.shape[-3] == h:
        return x
    return x.repeat_interleave(h // x.shape[-3], dim=-3)


def _tfold(g, h_kv):
    if g.dim() < 3 or g.shape[-3] == h_kv:
        return g
    return g.reshape(*g.shape[:-3], h_kv, -1, *g.shape[-2:]).sum(dim=-3)


def _tallowed(torch, mask, causal, q, k, diagonal=0):
    n_q, n_k = q.shape[-2], k.shape[-2]
    allowed = None if mask is None else torch.as_tensor(mask, dtype=torch.bool, device=q.device)
    if causal:
        tri = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(diagonal)
        allowed = tri if allowed is None else allowed & tri
    return allowed


def _function_class(backward):
    """A ``torch.autograd.Function`` with the correct forward (saves q, k, v, out, lse) and ``backward`` given."""
    torch = _torch()

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, allowed, keep, p):
            cdt = _tcdt(torch, q)
            h = q.shape[-3] if q.dim() >= 3 else 1
            qc, kc, vc = q.to(cdt), _texpand(k.to(cdt), h), _texpand(v.to(cdt), h)
            scale = 1.0 / math.sqrt(q.shape[-1])
            s = qc @ kc.transpose(-1, -2) * scale
            if allowed is not None:
                s = s.masked_fill(~allowed, -math.inf)
            m = s.amax(dim=-1, keepdim=True)
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            e = torch.exp(s - m)
            den = e.sum(dim=-1, keepdim=True)
            w = e / torch.where(den > 0, den, torch.ones_like(den))
            lse = torch.where(den > 0, m + torch.log(den), torch.full_like(den, -math.inf))[..., 0]
            if keep is not None:
                w = w * keep.to(cdt) / (1.0 - p)
            out = w @ vc
            ctx.save_for_backward(q, k, v, out, lse, allowed, keep)
            ctx.p, ctx.scale = p, scale
            return out.to(q.dtype)

    Attention.backward = staticmethod(backward)
    Attention.__name__ = Attention.__qualname__ = backward.__name__.replace("_backward", "").title().replace("_", "")
    return Attention


def _recompute(ctx, grad_out):
    """Saved tensors in the compute dtype, K/V expanded, and P recomputed from the saved lse."""
    torch = _torch()
    q, k, v, out, lse, allowed, keep = ctx.saved_tensors
    cdt = out.dtype
    h = q.shape[-3] if q.dim() >= 3 else 1
    qc, kc, vc, do = q.to(cdt), _texpand(k.to(cdt), h), _texpand(v.to(cdt), h), grad_out.to(cdt)
    s = qc @ kc.transpose(-1, -2) * ctx.scale
    if allowed is not None:
        s = s.masked_fill(~allowed, -math.inf)
    lse_safe = torch.where(torch.isfinite(lse), lse, torch.full_like(lse, math.inf))
    p = torch.exp(s - lse_safe[..., None])
    return q, k, v, qc, kc, vc, do, out, p, keep


def _done(q, k, v, dq, dk, dv):
    return (
        dq.to(q.dtype),
        _tfold(dk, k.shape[-3] if k.dim() >= 3 else 1).to(k.dtype),
        _tfold(dv, v.shape[-3] if v.dim() >= 3 else 1).to(v.dtype),
        None,
        None,
        None,
    )


def correct_backward(ctx, grad_out):
    """Correct: P from the saved lse, dP (∘ keep/(1-p)), delta = rowsum(dO ∘ O), dS = P ∘ (dP - delta)."""
    q, k, v, qc, kc, vc, do, out, p, keep = _recompute(ctx, grad_out)
    mult = None if keep is None else keep.to(p.dtype) / (1.0 - ctx.p)
    pd = p if mult is None else p * mult
    dp = do @ vc.transpose(-1, -2)
    if mult is not None:
        dp = dp * mult
    ds = p * (dp - (do * out).sum(dim=-1, keepdim=True))
    return _done(q, k, v, ds @ kc * ctx.scale, ds.transpose(-1, -2) @ qc * ctx.scale, pd.transpose(-1, -2) @ do)


def jacobian_missing_backward(ctx, grad_out):
    """grad-jacobian: dS = P ∘ dP (no delta)."""
    q, k, v, qc, kc, vc, do, _out, p, _keep = _recompute(ctx, grad_out)
    ds = p * (do @ vc.transpose(-1, -2))
    return _done(q, k, v, ds @ kc * ctx.scale, ds.transpose(-1, -2) @ qc * ctx.scale, p.transpose(-1, -2) @ do)


def delta_rowsum_p_backward(ctx, grad_out):
    """grad-delta: delta = P.sum(-1) (= 1) instead of (dO ∘ O).sum(-1)."""
    q, k, v, qc, kc, vc, do, _out, p, _keep = _recompute(ctx, grad_out)
    ds = p * (do @ vc.transpose(-1, -2) - p.sum(dim=-1, keepdim=True))
    return _done(q, k, v, ds @ kc * ctx.scale, ds.transpose(-1, -2) @ qc * ctx.scale, p.transpose(-1, -2) @ do)


def scale_twice_backward(ctx, grad_out):
    """grad-scale: the scale is applied to dS ("the gradient of the scaled scores") and again to dQ and dK."""
    q, k, v, qc, kc, vc, do, out, p, _keep = _recompute(ctx, grad_out)
    dp = do @ vc.transpose(-1, -2)
    ds = p * (dp - (do * out).sum(dim=-1, keepdim=True)) * ctx.scale
    return _done(q, k, v, ds @ kc * ctx.scale, ds.transpose(-1, -2) @ qc * ctx.scale, p.transpose(-1, -2) @ do)


def dk_transposed_backward(ctx, grad_out):
    """grad-transposed: dK = dS Q instead of dSᵀ Q (right shape only when n_q == n_k: crashes otherwise)."""
    q, k, v, qc, kc, vc, do, out, p, _keep = _recompute(ctx, grad_out)
    ds = p * (do @ vc.transpose(-1, -2) - (do * out).sum(dim=-1, keepdim=True))
    return _done(q, k, v, ds @ kc * ctx.scale, ds @ qc * ctx.scale, p.transpose(-1, -2) @ do)


def lse_unguarded_backward(ctx, grad_out):
    """grad-masked-row: P = exp(S - lse) with the saved lse = -inf on a fully masked row: NaN gradients there
    (the forward returned a zero row)."""
    torch = _torch()
    q, k, v, out, lse, allowed, _keep = ctx.saved_tensors
    h = q.shape[-3] if q.dim() >= 3 else 1
    qc, kc, vc, do = q.to(out.dtype), _texpand(k.to(out.dtype), h), _texpand(v.to(out.dtype), h), grad_out.to(out.dtype)
    s = qc @ kc.transpose(-1, -2) * ctx.scale
    if allowed is not None:
        s = s.masked_fill(~allowed, -math.inf)
    p = torch.exp(s - lse[..., None])
    ds = p * (do @ vc.transpose(-1, -2) - (do * out).sum(dim=-1, keepdim=True))
    return _done(q, k, v, ds @ kc * ctx.scale, ds.transpose(-1, -2) @ qc * ctx.scale, p.transpose(-1, -2) @ do)


def one_head_backward(ctx, grad_out):
    """grad-gqa-sum: GQA dK/dV from one query head per group (``[:, ::group]``) instead of the group's sum."""
    q, k, v, qc, kc, vc, do, out, p, _keep = _recompute(ctx, grad_out)
    ds = p * (do @ vc.transpose(-1, -2) - (do * out).sum(dim=-1, keepdim=True))
    dk, dv = ds.transpose(-1, -2) @ qc * ctx.scale, p.transpose(-1, -2) @ do
    if q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        dk, dv = dk[..., ::group, :, :], dv[..., ::group, :, :]
    return _done(q, k, v, ds @ kc * ctx.scale, dk, dv)


def triu_causal_backward(ctx, grad_out):
    """grad-causal: the backward rebuilds the causal mask as ``triu(ones, diagonal=0)`` = blocked, which also
    blocks the diagonal (the forward's mask was ``triu(diagonal=1)``); P is renormalized over what is left."""
    torch = _torch()
    q, k, v, out, _lse, _allowed, _keep = ctx.saved_tensors
    h = q.shape[-3] if q.dim() >= 3 else 1
    qc, kc, vc, do = q.to(out.dtype), _texpand(k.to(out.dtype), h), _texpand(v.to(out.dtype), h), grad_out.to(out.dtype)
    s = qc @ kc.transpose(-1, -2) * ctx.scale
    if ctx.causal:
        blocked = torch.ones(s.shape[-2:], dtype=torch.bool).triu(0)
        s = s.masked_fill(blocked, -math.inf)
    if ctx.user_mask is not None:
        s = s.masked_fill(~ctx.user_mask, -math.inf)
    m = s.amax(dim=-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    den = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(den > 0, den, torch.ones_like(den))
    dp = do @ vc.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
    return _done(q, k, v, ds @ kc * ctx.scale, ds.transpose(-1, -2) @ qc * ctx.scale, p.transpose(-1, -2) @ do)


def dropout_unscaled_backward(ctx, grad_out):
    """grad-dropout: the backward applies the saved keep-mask but not its 1/(1-p) (to dV and dP)."""
    q, k, v, qc, kc, vc, do, out, p, keep = _recompute(ctx, grad_out)
    mult = None if keep is None else keep.to(p.dtype)
    pd = p if mult is None else p * mult
    dp = do @ vc.transpose(-1, -2)
    if mult is not None:
        dp = dp * mult
    ds = p * (dp - (do * out).sum(dim=-1, keepdim=True))
    return _done(q, k, v, ds @ kc * ctx.scale, ds.transpose(-1, -2) @ qc * ctx.scale, pd.transpose(-1, -2) @ do)


def first_batch_k_backward(ctx, grad_out):
    """grad-batch-leak: a per-batch-element loop computes dQ[b] = dS[b] K[0] (a ``0`` where ``b`` belongs);
    correct with B = 1. (3-D inputs have no batch axis: the loop runs over heads, with the same bug.)"""
    torch = _torch()
    q, k, v, qc, kc, vc, do, out, p, _keep = _recompute(ctx, grad_out)
    ds = p * (do @ vc.transpose(-1, -2) - (do * out).sum(dim=-1, keepdim=True))
    dq = torch.stack([ds[b] @ kc[0] * ctx.scale for b in range(ds.shape[0])]) if ds.dim() >= 3 else ds @ kc * ctx.scale
    return _done(q, k, v, dq, ds.transpose(-1, -2) @ qc * ctx.scale, p.transpose(-1, -2) @ do)


def scales_saved_q_backward(ctx, grad_out):
    """mutates-input: scales the saved q in place (``q.mul_(scale)``, the caller's tensor: saved tensors are not
    copies) and uses it consistently, so the gradients are right and the caller's q is changed."""
    torch = _torch()
    q, k, v, out, lse, allowed, _keep = ctx.saved_tensors
    with torch.no_grad():
        q.mul_(ctx.scale)  # the caller's tensor
    h = q.shape[-3] if q.dim() >= 3 else 1
    qs, kc, vc, do = q.to(out.dtype), _texpand(k.to(out.dtype), h), _texpand(v.to(out.dtype), h), grad_out.to(out.dtype)
    s = qs @ kc.transpose(-1, -2)
    if allowed is not None:
        s = s.masked_fill(~allowed, -math.inf)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, torch.full_like(lse, math.inf))[..., None])
    ds = p * (do @ vc.transpose(-1, -2) - (do * out).sum(dim=-1, keepdim=True))
    return _done(q, k, v, ds @ kc * ctx.scale, ds.transpose(-1, -2) @ qs, p.transpose(-1, -2) @ do)


def chunked_dq_overwritten_backward(ctx, grad_out):
    """grad-accumulate: a key-chunked backward (chunks of 3 keys, to bound memory) that assigns dQ per chunk
    (``dq = dS_c K_c``) instead of summing the chunks (correct when n_k <= 3)."""
    q, k, v, qc, kc, vc, do, out, p, _keep = _recompute(ctx, grad_out)
    delta = (do * out).sum(dim=-1, keepdim=True)
    dk, dv, dq = [], [], None
    for j0 in range(0, kc.shape[-2], BLOCK_K):
        pc, kcj, vcj = p[..., j0 : j0 + BLOCK_K], kc[..., j0 : j0 + BLOCK_K, :], vc[..., j0 : j0 + BLOCK_K, :]
        dsc = pc * (do @ vcj.transpose(-1, -2) - delta)
        dq = dsc @ kcj * ctx.scale  # BUG: dq = dq + ...
        dk.append(dsc.transpose(-1, -2) @ qc * ctx.scale)
        dv.append(pc.transpose(-1, -2) @ do)
    torch = _torch()
    return _done(q, k, v, dq, torch.cat(dk, dim=-2), torch.cat(dv, dim=-2))


_CLASSES: dict[str, object] = {}


def _cls(backward):
    if backward.__name__ not in _CLASSES:
        _CLASSES[backward.__name__] = _function_class(backward)
    return _CLASSES[backward.__name__]


def function_attention(backward):
    """``attention(q, k, v, mask=None)`` through the autograd.Function with ``backward``."""

    def attention(q, k, v, mask=None):
        torch = _torch()
        return _cls(backward).apply(q, k, v, _tallowed(torch, mask, False, q, k), None, 0.0)

    attention.__name__ = attention.__qualname__ = backward.__name__.replace("_backward", "_attention")
    attention.__doc__ = backward.__doc__
    return attention


def function_attention_dropout(backward):
    """``attention(q, k, v, mask=None, dropout_mask=None, dropout_p=0.0)`` through the Function with ``backward``."""

    def attention(q, k, v, mask=None, dropout_mask=None, dropout_p=0.0):
        torch = _torch()
        keep = None if dropout_mask is None else torch.as_tensor(dropout_mask, dtype=torch.bool)
        return _cls(backward).apply(q, k, v, _tallowed(torch, mask, False, q, k), keep, float(dropout_p))

    attention.__name__ = attention.__qualname__ = backward.__name__.replace("_backward", "_dropout_attention")
    attention.__doc__ = backward.__doc__
    return attention


def _causal_class():
    """The Function for :func:`triu_causal_backward`: it also keeps the caller's mask and the causal flag."""
    torch = _torch()
    base = _cls(triu_causal_backward)

    class CausalAttention(base):
        @staticmethod
        def forward(ctx, q, k, v, allowed, keep, p, user_mask=None, causal=False):
            ctx.user_mask, ctx.causal = user_mask, causal
            return base.forward(ctx, q, k, v, allowed, keep, p)

        @staticmethod
        def backward(ctx, grad_out):
            return (*triu_causal_backward(ctx, grad_out), None, None)

    del torch
    return CausalAttention


def causal_function_attention(q, k, v, mask=None, causal=False):
    """grad-causal: an autograd.Function whose forward masks with ``triu(diagonal=1)`` and whose backward with
    ``triu(diagonal=0)`` (see :func:`triu_causal_backward`)."""
    torch = _torch()
    if "CausalAttention" not in _CLASSES:
        _CLASSES["CausalAttention"] = _causal_class()
    user = None if mask is None else torch.as_tensor(mask, dtype=torch.bool)
    return _CLASSES["CausalAttention"].apply(q, k, v, _tallowed(torch, mask, causal, q, k), None, 0.0, user, causal)


def _pad_last(x, d):
    torch = _torch()
    if x.shape[-1] == d:
        return x
    return torch.nn.functional.pad(x, (0, d - x.shape[-1]))


def sdpa_math(q, k, v, mask=None):
    """Correct: torch SDPA, math backend (autograd)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gqa = q.dim() >= 3 and k.shape[-3] != q.shape[-3]
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def sdpa_flash(q, k, v, mask=None):
    """Correct: torch SDPA, flash backend (on CPU too). Its kernel needs 4-D inputs and d_v == d_k, so 3-D inputs
    get a batch axis, the head dims are padded with zeros to the larger one (the scale passed explicitly) and the
    output is sliced back, as FlashAttention users do."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rank, d_k, d_v = q.dim(), q.shape[-1], v.shape[-1]
    d = max(d_k, d_v)
    q, k, v = (_pad_last(x, d).reshape(*(1,) * (4 - rank), *x.shape[:-1], d) for x in (q, k, v))
    if mask is not None:
        mask = mask.reshape(*(1,) * (4 - mask.dim()), *mask.shape)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(d_k), enable_gqa=k.shape[-3] != q.shape[-3]
        )
    return out.reshape(*out.shape[4 - rank :])[..., :d_v]


def torch_ops(q, k, v, mask=None):
    """Correct: plain torch ops (autograd), softmax written out with a detached row maximum; fully masked rows
    give zeros (the denominator of a row with a key is at least 1, the max term being exp(0))."""
    torch = _torch()
    cdt = _tcdt(torch, q)
    h = q.shape[-3] if q.dim() >= 3 else 1
    qc, kc, vc = q.to(cdt), _texpand(k.to(cdt), h), _texpand(v.to(cdt), h)
    s = qc @ kc.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~torch.as_tensor(mask, dtype=torch.bool), -math.inf)
    m = s.detach().amax(dim=-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    return (e / e.sum(dim=-1, keepdim=True).clamp_min(1.0) @ vc).to(q.dtype)


def torch_vjp_backward(q, k, v, d_out, mask=None, scale=None):
    """Correct torch plain-signature backward: ``torch.autograd.grad`` through SDPA (math backend)."""
    torch = _torch()
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gqa = q.dim() >= 3 and k.shape[-3] != q.shape[-3]
    with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, attn_mask=mask, scale=scale, enable_gqa=gqa)
        return torch.autograd.grad(out, leaves, d_out)


def torch_default_dtype_grads(q, k, v, d_out, mask=None, scale=None):
    """dtype: a torch plain-signature backward that stores its gradients in ``torch.zeros(shape)`` (the default
    float32): float16 / bfloat16 inputs get float32 gradients, float64 inputs float32 (rounded) ones."""
    torch = _torch()
    cdt = _tcdt(torch, q)
    h = q.shape[-3] if q.dim() >= 3 else 1
    qc, kc, vc, do = q.to(cdt), _texpand(k.to(cdt), h), _texpand(v.to(cdt), h), d_out.to(cdt)
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    s = qc @ kc.transpose(-1, -2) * sc
    if mask is not None:
        s = s.masked_fill(~torch.as_tensor(mask, dtype=torch.bool), -math.inf)
    m = s.amax(dim=-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    den = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(den > 0, den, torch.ones_like(den))
    dp = do @ vc.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
    dq, dk, dv = torch.zeros(q.shape), torch.zeros(k.shape), torch.zeros(v.shape)
    dq += ds @ kc * sc
    dk += _tfold(ds.transpose(-1, -2) @ qc * sc, k.shape[-3] if k.dim() >= 3 else 1)
    dv += _tfold(p.transpose(-1, -2) @ do, v.shape[-3] if v.dim() >= 3 else 1)
    return dq, dk, dv


# ---------------------------------------------------------------------------------------------------------------
# the entries

_GQA = {"gqa": True}
_TORCH = {"framework": "torch"}
_AUTOGRAD = {"backward": True, "framework": "torch"}  # (torch is imported lazily here: declared)

CORRECT = [
    Entry("bwd-np-analytic", np_analytic, options=_GQA, doc=np_analytic.__doc__),
    Entry("bwd-np-analytic-dropout", np_analytic_dropout, options=_GQA, doc=np_analytic_dropout.__doc__),
    Entry("bwd-np-einsum-jacobian", np_einsum, doc=np_einsum.__doc__),
    Entry("bwd-attnlab-core", attnlab_core_backward, options=_GQA, doc=attnlab_core_backward.__doc__),
    Entry(
        "bwd-attnlab-flash",
        attnlab_flash_backward,
        options={"forward": attnlab_flash_forward, **_GQA},
        doc=attnlab_flash_backward.__doc__,
    ),
    Entry("bwd-attnlab-flash-golden-lse", attnlab_flash_backward, options=_GQA, doc="as bwd-attnlab-flash, golden lse"),
    Entry("bwd-attnlab-flash-plain", attnlab_flash_plain, options=_GQA, doc=attnlab_flash_plain.__doc__),
    Entry(
        "bwd-attnlab-core-flash",
        attnlab_core_flash,
        options={"forward": attnlab_flash_forward, **_GQA},
        doc=attnlab_core_flash.__doc__,
    ),
    Entry("bwd-fa2-nats", fa2_backward, options={"forward": fa2_forward, **_GQA}, doc=fa2_backward.__doc__),
    Entry("bwd-fa2-nats-golden-lse", fa2_backward, doc="fa2_backward given the checker's golden out and lse (nats)"),
    Entry(
        "bwd-fa2-log2",
        fa2_backward_log2,
        options={"forward": fa2_forward_log2, "lse_units": "log2", **_GQA},
        doc=fa2_backward_log2.__doc__,
    ),
    Entry("bwd-fa2-log2-golden-lse", fa2_backward_log2, options={"lse_units": "log2"}, doc="golden lse in log2"),
    Entry("bwd-torch-vjp-sdpa", torch_vjp_backward, options={**_TORCH, **_GQA}, doc=torch_vjp_backward.__doc__),
    Entry("bwd-torch-sdpa-math", sdpa_math, options={**_AUTOGRAD, **_GQA}, doc=sdpa_math.__doc__),
    Entry("bwd-torch-sdpa-flash", sdpa_flash, options={**_AUTOGRAD, **_GQA}, doc=sdpa_flash.__doc__),
    Entry("bwd-torch-plain-ops", torch_ops, options={**_AUTOGRAD, **_GQA}, doc=torch_ops.__doc__),
    Entry(
        "bwd-torch-function",
        function_attention(correct_backward),
        options={**_AUTOGRAD, **_GQA},
        doc=correct_backward.__doc__,
    ),
    Entry(
        "bwd-torch-function-dropout",
        function_attention_dropout(correct_backward),
        options=_AUTOGRAD,
        doc=correct_backward.__doc__,
    ),
]

BROKEN = [
    # softmax Jacobian
    Entry("bwd-np-jacobian-missing", np_jacobian_missing, ("grad-jacobian",), doc=np_jacobian_missing.__doc__),
    Entry("bwd-np-jacobian-diagonal", np_jacobian_diagonal, ("grad-jacobian",), doc=np_jacobian_diagonal.__doc__),
    Entry(
        "bwd-np-dv-weights-unnormalised",
        np_dv_weights_unnormalised,
        ("grad-lse",),
        doc=np_dv_weights_unnormalised.__doc__,
    ),
    Entry(
        "bwd-fa2-no-delta",
        fa2_bwd_no_delta,
        ("grad-jacobian",),
        {"forward": fa2_forward_plain},
        doc=fa2_bwd_no_delta.__doc__,
    ),
    Entry(
        "bwd-torch-jacobian-missing",
        function_attention(jacobian_missing_backward),
        ("grad-jacobian",),
        _AUTOGRAD,
        doc=jacobian_missing_backward.__doc__,
    ),
    # delta
    Entry("bwd-np-delta-rowsum-dp", np_delta_rowsum_dp, ("grad-delta",), doc=np_delta_rowsum_dp.__doc__),
    Entry("bwd-np-delta-rowsum-p", np_delta_rowsum_p, ("grad-delta",), doc=np_delta_rowsum_p.__doc__),
    Entry(
        "bwd-fa2-delta-rowsum-dp",
        fa2_bwd_delta_rowsum_dp,
        ("grad-delta",),
        {"forward": fa2_forward_plain},
        doc=fa2_bwd_delta_rowsum_dp.__doc__,
    ),
    Entry(
        "bwd-torch-delta-rowsum-p",
        function_attention(delta_rowsum_p_backward),
        ("grad-delta",),
        _AUTOGRAD,
        doc=delta_rowsum_p_backward.__doc__,
    ),
    # scale
    Entry("bwd-np-scale-missing", np_scale_missing, ("grad-scale",), doc=np_scale_missing.__doc__),
    Entry(
        "bwd-fa2-dk-unscaled",
        fa2_bwd_dk_unscaled,
        ("grad-scale",),
        {"forward": fa2_forward_plain},
        doc=fa2_bwd_dk_unscaled.__doc__,
    ),
    Entry(
        "bwd-torch-scale-twice",
        function_attention(scale_twice_backward),
        ("grad-scale",),
        _AUTOGRAD,
        doc=scale_twice_backward.__doc__,
    ),
    # transposed factors
    Entry(
        "bwd-np-dv-transposed", np_dv_transposed, ("grad-transposed",), also=("crash",), doc=np_dv_transposed.__doc__
    ),
    Entry(
        "bwd-torch-dk-transposed",
        function_attention(dk_transposed_backward),
        ("grad-transposed",),
        _AUTOGRAD,
        also=("crash",),
        doc=dk_transposed_backward.__doc__,
    ),
    # masked keys
    Entry("bwd-np-dv-unmasked", np_dv_unmasked, ("grad-masked-leak",), doc=np_dv_unmasked.__doc__),
    Entry(
        "bwd-fa2-ignores-mask",
        fa2_bwd_ignores_mask,
        ("grad-masked-leak",),
        {"forward": fa2_forward_plain},
        also=("grad-causal",),
        doc=fa2_bwd_ignores_mask.__doc__,
    ),
    # fully masked rows
    Entry("bwd-np-naive-softmax", np_naive_softmax, ("grad-masked-row",), doc=np_naive_softmax.__doc__),
    Entry(
        "bwd-fa2-lse-unguarded",
        fa2_bwd_lse_unguarded,
        ("grad-masked-row",),
        {"forward": fa2_forward_plain},
        doc=fa2_bwd_lse_unguarded.__doc__,
    ),
    Entry(
        "bwd-torch-lse-unguarded",
        function_attention(lse_unguarded_backward),
        ("grad-masked-row",),
        _AUTOGRAD,
        doc=lse_unguarded_backward.__doc__,
    ),
    # GQA
    Entry("bwd-np-gqa-first-head", np_gqa_first_head, ("grad-gqa-sum",), _GQA, doc=np_gqa_first_head.__doc__),
    Entry("bwd-np-gqa-mean", np_gqa_mean, ("grad-gqa-sum",), _GQA, doc=np_gqa_mean.__doc__),
    Entry(
        "bwd-fa2-gqa-tile-fold",
        fa2_bwd_gqa_tiled_fold,
        ("grad-gqa-sum",),
        {"forward": fa2_forward_plain, **_GQA},
        doc=fa2_bwd_gqa_tiled_fold.__doc__,
    ),
    Entry(
        "bwd-torch-gqa-one-head",
        function_attention(one_head_backward),
        ("grad-gqa-sum",),
        {**_AUTOGRAD, **_GQA},
        doc=one_head_backward.__doc__,
    ),
    # lse
    Entry(
        "bwd-fa2-lse-no-max",
        fa2_backward,
        ("grad-lse",),
        {"forward": fa2_forward_lse_no_max},
        doc=fa2_forward_lse_no_max.__doc__,
    ),
    Entry("bwd-fa2-recomputes-lse", fa2_bwd_recomputes_lse, ("grad-lse",), doc=fa2_bwd_recomputes_lse.__doc__),
    Entry(
        "bwd-fa2-log2-undeclared",
        fa2_backward_log2,
        ("grad-lse",),
        doc="grad-lse: fa2_backward_log2 (P = exp2(S·log2 e - lse)) given the golden lse in nats: lse_units='log2' "
        "is not declared",
    ),
    Entry(
        "bwd-fa2-lse-max-only",
        fa2_backward,
        ("grad-lse",),
        {"forward": fa2_forward_lse_max_only},
        also=("grad-mismatch",),  # in float16 the per-row factor fitted from dq is noisier than the rule allows
        doc=fa2_forward_lse_max_only.__doc__,
    ),
    # accumulators
    Entry(
        "bwd-fa2-only-dk-assigned",
        fa2_bwd_only_dk_assigned,
        ("grad-accumulate",),
        {"forward": fa2_forward_plain},
        doc=fa2_bwd_only_dk_assigned.__doc__,
    ),
    Entry(
        "bwd-fa2-dk-overwritten",
        fa2_bwd_dk_overwritten,
        ("grad-accumulate",),
        {"forward": fa2_forward_plain},
        doc=fa2_bwd_dk_overwritten.__doc__,
    ),
    Entry(
        "bwd-fa2-dq-overwritten",
        fa2_bwd_dq_overwritten,
        ("grad-accumulate",),
        {"forward": fa2_forward_plain},
        doc=fa2_bwd_dq_overwritten.__doc__,
    ),
    Entry(
        "bwd-torch-chunked-dq-overwritten",
        function_attention(chunked_dq_overwritten_backward),
        ("grad-accumulate",),
        _AUTOGRAD,
        doc=chunked_dq_overwritten_backward.__doc__,
    ),
    # causal in the backward only
    Entry("bwd-np-causal-off-by-one", np_causal_off_by_one, ("grad-causal",), doc=np_causal_off_by_one.__doc__),
    Entry(
        "bwd-np-causal-flag-not-read", np_causal_flag_not_read, ("grad-causal",), doc=np_causal_flag_not_read.__doc__
    ),
    Entry(
        "bwd-fa2-causal-strict",
        fa2_bwd_causal_shifted,
        ("grad-causal",),
        {"forward": fa2_forward_plain},
        doc=fa2_bwd_causal_shifted.__doc__,
    ),
    Entry(
        "bwd-torch-causal-triu0",
        causal_function_attention,
        ("grad-causal",),
        _AUTOGRAD,
        doc=causal_function_attention.__doc__,
    ),
    # dropout
    Entry(
        "bwd-np-dropout-dp-forgotten",
        np_dropout_dp_forgotten,
        ("grad-dropout",),
        doc=np_dropout_dp_forgotten.__doc__,
    ),
    Entry(
        "bwd-fa2-dropout-dv-undropped",
        fa2_bwd_dropout_dv_undropped,
        ("grad-dropout",),
        {"forward": fa2_forward},
        doc=fa2_bwd_dropout_dv_undropped.__doc__,
    ),
    Entry(
        "bwd-torch-dropout-unscaled",
        function_attention_dropout(dropout_unscaled_backward),
        ("grad-dropout",),
        _AUTOGRAD,
        doc=dropout_unscaled_backward.__doc__,
    ),
    # batch mixing
    Entry("bwd-np-flattened-dk", np_flattened_dk, ("grad-batch-leak",), doc=np_flattened_dk.__doc__),
    Entry(
        "bwd-torch-first-batch-k",
        function_attention(first_batch_k_backward),
        ("grad-batch-leak",),
        _AUTOGRAD,
        doc=first_batch_k_backward.__doc__,
    ),
    # dtype
    Entry("bwd-np-numpy-scalar-scale", np_numpy_scalar_scale, ("dtype",), doc=np_numpy_scalar_scale.__doc__),
    Entry(
        "bwd-fa2-float64-accumulators",
        fa2_bwd_float64_accumulators,
        ("dtype",),
        {"forward": fa2_forward_plain},
        doc=fa2_bwd_float64_accumulators.__doc__,
    ),
    Entry(
        "bwd-torch-default-dtype",
        torch_default_dtype_grads,
        ("dtype",),
        _TORCH,
        also=("grad-mismatch",),
        doc=torch_default_dtype_grads.__doc__,
    ),
    # input mutation
    Entry("bwd-np-scales-q-in-place", np_scales_q_in_place, ("mutates-input",), doc=np_scales_q_in_place.__doc__),
    Entry(
        "bwd-fa2-lse-in-place",
        fa2_bwd_lse_to_log2_in_place,
        ("mutates-input",),
        {},
        doc=fa2_bwd_lse_to_log2_in_place.__doc__,
    ),
    Entry(
        "bwd-torch-scales-saved-q",
        function_attention(scales_saved_q_backward),
        ("mutates-input",),
        _AUTOGRAD,
        doc=scales_saved_q_backward.__doc__,
    ),
]

ENTRIES = [*CORRECT, *BROKEN]
