"""Robustness of the dense core under generated inputs: extreme magnitudes, odd dtypes, wrong types, mixed libraries.

Every call either raises an :class:`~attnlab.AttnlabError` whose message names the argument (or the stage) at
fault, or returns a finite result that matches an independent float64 reference within a first-order error bound
(``C · eps · (1 + L)`` times the result's scale, where ``L`` bounds the magnitude of the logits: the softmax turns
an absolute error ``δ`` in a logit into a relative error ``δ`` in its weight). Inputs are never modified and no
internal exception (AttributeError, IndexError, NumPy's own errors) escapes.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import reference_attention
from test_multihead import reference_mha

import attnlab
from attnlab import AttnlabError, MaskedRowError, RangeError, invariants, masks
from attnlab.core.multihead import MultiHeadWeights, merge_heads, repeat_kv, split_heads

SETTINGS = settings(max_examples=30, deadline=None)
C = 64  # the constant of the first-order bounds

# decimal exponents of the magnitudes drawn for each dtype: tiny, ordinary, near the limit
EXPONENTS = {
    np.float16: [-4, -1, 0, 1, 2, 4],
    np.float32: [-37, -20, -1, 0, 1, 10, 19, 20, 37],
    np.float64: [-300, -150, -20, 0, 1, 20, 100, 154, 200, 300],
}
FLOATS = list(EXPONENTS)


def _tiny(dtype) -> float:
    """The smallest normal number of the compute dtype of an input of ``dtype`` (or of ``dtype`` itself)."""
    return float(np.finfo(np.float64 if dtype == np.float64 else np.float32).smallest_normal)


def _eps(dtype) -> float:
    """The unit roundoff of the compute dtype of an input of ``dtype``."""
    return float(np.finfo(np.float64 if dtype == np.float64 else np.float32).eps)


@st.composite
def arrays(draw, shape, dtype=None, exponent=None):
    """A finite array of ``shape``: standard normal entries times 10**exponent, in ``dtype``'s range."""
    dtype = draw(st.sampled_from(FLOATS)) if dtype is None else dtype
    e = draw(st.sampled_from(EXPONENTS[dtype])) if exponent is None else exponent
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    limit = float(np.finfo(dtype).max) / 4
    x = np.clip(rng.standard_normal(shape) * 10.0**e, -limit, limit)
    return x.astype(dtype)


def call(f, *args, names, **kwargs):
    """``f(*args, **kwargs)``: the result, or the AttnlabError it raised, after checking the contract:
    an AttnlabError naming one of ``names`` before its first colon (or, for libraries mixed, anywhere), never
    another exception, and no argument modified."""

    def snapshot(a):
        if isinstance(a, np.ndarray):
            return np.array(a, copy=True)
        if isinstance(a, torch.Tensor) and a.device.type != "meta":
            return a.clone()
        return None

    before = [snapshot(a) for a in (*args, *kwargs.values())]
    try:
        return f(*args, **kwargs)
    except AttnlabError as err:
        msg = str(err)
        head = msg.split(":")[0]
        named = any(n == head or n in head.split(", ") for n in names) or (
            msg.startswith("arrays of different") and any(n in msg for n in names)
        )
        assert named, f"{type(err).__name__} does not name any of {names}: {msg}"
        return err
    finally:
        for a, b in zip((*args, *kwargs.values()), before, strict=True):
            if isinstance(b, torch.Tensor):
                assert torch.equal(a, b), "an input was modified"
            elif b is not None:
                np.testing.assert_array_equal(a, b, err_msg="an input was modified")


def _product(*factors: float) -> float:
    """The product of non-negative factors without an intermediate underflow or overflow (a bound such as
    ``base * scale * max|k|`` with scale 1e-300 and max|k| 1e99 must not round to 0 halfway): summed in logs."""
    if any(f == 0 for f in factors):
        return 0.0
    if any(math.isinf(f) for f in factors):
        return math.inf
    return math.exp(min(709.0, sum(math.log(f) for f in factors)))


def _max(x) -> float:
    return 0.0 if x is None else float(np.max(np.abs(np.asarray(x, np.float64))))


def _logit_bound(q, k, bias, scale, temperature) -> float:
    """An upper bound of |logits|, in float64 without overflow (inf when it would overflow)."""
    d = q.shape[-1]
    with np.errstate(over="ignore"):
        return (abs(scale) * d * _max(q) * _max(k) + _max(bias)) / temperature


ATTENTION_NAMES = ["q", "k", "v", "mask", "bias", "scale", "temperature", "logits", "output", "masked_rows"]


@st.composite
def attention_problems(draw):
    n_q, n_k, d_k, d_v = (draw(st.integers(1, 4)) for _ in range(4))
    batch = draw(st.sampled_from([(), (2,)]))
    dtype = draw(st.sampled_from(FLOATS))
    q = draw(arrays((*batch, n_q, d_k), dtype))
    k = draw(arrays((n_k, d_k), dtype))
    v = draw(arrays((*batch, n_k, d_v), dtype))
    mask = None
    if draw(st.booleans()):
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        mask = rng.random((n_q, n_k)) < 0.7
    bias_shape = draw(st.sampled_from([(n_q, n_k), (n_k,), (1, n_k), (n_q, 1), (*batch, 1, n_k)]))
    bias = draw(arrays(bias_shape, draw(st.sampled_from(FLOATS)))) if draw(st.booleans()) else None
    scale = draw(st.sampled_from([None, 1.0, -0.5, 1e-300, 1e-40, 1e39, 1e150, 1e308]))
    temperature = draw(st.sampled_from([1.0, 0.1, 1e-310, 1e-300, 1e-40, 1e39, 1e300]))
    masked_rows = draw(st.sampled_from(["raise", "zero", "nan"]))
    return q, k, v, mask, bias, scale, temperature, masked_rows


def _numpy(x):
    """A torch tensor as NumPy (bool as bool, floats as float64); anything else as it is."""
    if not isinstance(x, torch.Tensor):
        return x
    return x.numpy() if x.dtype == torch.bool else x.double().numpy()


def _to_library(x, lib):
    """``x`` as a torch tensor (``lib`` "torch", or "bfloat16" for float32 inputs) and its exact float64 values."""
    if x is None or lib == "numpy":
        return x, x
    t = torch.as_tensor(x)
    if lib == "bfloat16" and x.dtype == np.float32:
        t = t.to(torch.bfloat16)
    return t, t.double().numpy()


@SETTINGS
@given(attention_problems(), st.sampled_from(["numpy", "numpy", "torch", "bfloat16"]))
def test_attention_is_exact_or_a_named_error(p, lib):
    q, k, v, mask, bias, scale, temperature, masked_rows = p
    in_dtype = q.dtype
    (tq, q), (tk, k), (tv, v) = (_to_library(x, lib) for x in (q, k, v))
    bf16 = isinstance(tq, torch.Tensor) and tq.dtype == torch.bfloat16
    kw = {"bias": bias, "scale": scale, "temperature": temperature, "masked_rows": masked_rows}
    got = trace = call(attnlab.attention_trace, tq, tk, tv, mask, names=ATTENTION_NAMES, **kw)
    if isinstance(got, attnlab.AttentionTrace) and lib != "numpy":
        assert isinstance(got.output, torch.Tensor)
        got = attnlab.AttentionTrace(**{f: _numpy(getattr(got, f)) for f in got.__dataclass_fields__})
    q_dtype = np.float32 if bf16 else in_dtype
    s = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    L = _logit_bound(q, k, bias, s, temperature)
    empty = None if mask is None else ~mask.any(-1)  # [n_q]
    if isinstance(got, Exception):
        if isinstance(got, MaskedRowError):
            assert masked_rows == "raise" and empty is not None and empty.any()
        else:
            assert isinstance(got, RangeError), got  # the only other reason finite, well-formed inputs may fail
            assert L > 1e300, f"a RangeError although the logits are at most {L:.3g}: {got}"
        return
    out = np.asarray(got.output, np.float64)
    with np.errstate(all="ignore"):
        ref, _ = reference_attention(q, k, v, mask, bias=bias, scale=s, temperature=temperature)
    live = np.ones(out.shape[:-1], bool) if empty is None else np.broadcast_to(~empty, out.shape[:-1])
    assert np.isfinite(out[live]).all()
    if empty is not None and empty.any():
        dead = out[~live]
        assert np.isnan(dead).all() if masked_rows == "nan" else (dead == 0).all()
    # a convex combination of the allowed values, whatever the conditioning
    vmax = _max(v)
    assert (np.abs(out[live]) <= vmax * (1 + 4 * _eps(q_dtype)) + 1e-300).all()
    if np.isfinite(ref[live]).all() and math.isfinite(L):
        out = np.asarray(got.output, np.float64)
        out_f = np.finfo(np.float32 if bf16 else in_dtype)
        out_eps = 2.0**-8 if bf16 else float(out_f.eps)
        # rounding of the logits (eps · L) and what underflows below the compute dtype's smallest normal number
        logit_err = C * (_eps(q_dtype) * (1 + L) + _tiny(q_dtype) * q.shape[-1] * (1 + _max(q) + _max(k)))
        tol = vmax * (min(2.0, logit_err) + C * out_eps) + C * float(out_f.smallest_normal) * (1 + vmax)
        assert np.max(np.abs(out[live] - ref[live]), initial=0.0) <= tol
    assert invariants.check(trace) == [] or (empty is not None and masked_rows == "nan")


@SETTINGS
@given(attention_problems(), st.data())
def test_attention_backward_matches_torch_or_is_a_named_error(p, data):
    q, k, v, mask, bias, scale, temperature, _ = p
    if mask is not None:
        mask[..., 0] = True  # no empty rows: their gradient is a policy, tested elsewhere
    t = call(
        attnlab.attention_trace, q, k, v, mask, bias=bias, scale=scale, temperature=temperature, names=ATTENTION_NAMES
    )
    if isinstance(t, Exception):
        return
    d_out = data.draw(arrays(t.output.shape, np.float64))
    g = call(attnlab.attention_backward, t, d_out, names=["dq", "dk", "dv", "ds", "dbias", "d_out"])
    if isinstance(g, Exception):
        assert isinstance(g, RangeError)
        return
    for x in (g.dq, g.dk, g.dv, g.ds):
        assert np.isfinite(x).all()
    # torch autograd in float64 on the same (rounded) inputs
    s = t.scale
    tq, tk, tv = (torch.tensor(np.asarray(x, np.float64), requires_grad=True) for x in (q, k, v))
    with np.errstate(all="ignore"):
        logits = tq @ tk.transpose(-1, -2) * s
        tb = None if bias is None else torch.tensor(bias.astype(np.float64), requires_grad=True)
        if tb is not None:
            logits = logits + tb
        logits = logits / temperature
        if mask is not None:
            logits = logits.masked_fill(~torch.tensor(mask), -torch.inf)
        out = torch.softmax(logits, dim=-1) @ tv
        (out * torch.tensor(d_out)).sum().backward()
    eps = _eps(q.dtype)
    tiny = float(np.finfo(np.float64 if q.dtype == np.float64 else np.float32).smallest_normal)
    L = _logit_bound(q, k, bias, s, temperature)
    rows = q.shape[-2] * (2 if q.ndim > 2 else 1)
    with np.errstate(over="ignore"):
        # error of dS: rounding (relative eps (1 + L)) and what underflows below the smallest normal (dP = d_out Vᵀ
        # and P ∘ (dP - delta) can be subnormal); dS is multiplied by scale / temperature on its way to dQ and dK,
        # so that absolute floor is divided by the temperature too
        base = (C * eps * (1 + L) * _max(d_out) + C * tiny) * _max(v) * v.shape[
            -1
        ] / temperature + C * tiny / temperature
        bounds = {
            "dq": _product(base, abs(s), _max(k), k.shape[-2]) + C * tiny,
            "dk": _product(base, abs(s), _max(q), rows) + C * tiny,
            "dv": (C * eps * (1 + L) * _max(d_out) + C * tiny) * rows,
            "dbias": base * g.ds.size,  # summed over the broadcast axes
        }
    pairs = [("dq", g.dq, tq.grad), ("dk", g.dk, tk.grad), ("dv", g.dv, tv.grad)]
    if bias is not None:
        assert g.dbias.shape == bias.shape
        pairs.append(("dbias", g.dbias, tb.grad))
    for name, got, ref in pairs:
        ref = ref.numpy()
        if np.isfinite(ref).all() and math.isfinite(bounds[name]):
            err = np.max(np.abs(np.asarray(got, np.float64) - ref))
            assert err <= bounds[name] + 1e-300, f"{name}: error {err:.3g} above {bounds[name]:.3g}"


# --------------------------------------------------------------------------------------------------------------
# arguments of the wrong kind


def _wrong(kind: str, like: np.ndarray):
    if kind == "none":
        return None
    if kind == "string":
        return "q"
    if kind == "dict":
        return {"shape": like.shape}
    if kind == "masked":
        return np.ma.masked_array(like, mask=np.zeros(like.shape, bool))
    if kind == "datetime":
        return np.zeros(like.shape, "datetime64[s]")
    if kind == "complex":
        return like.astype(complex)
    if kind == "object":
        return like.astype(object)
    if kind == "bytes":
        return np.zeros(like.shape, "S2")
    if kind == "torch":
        return torch.as_tensor(like)
    if kind == "meta":
        return torch.empty(like.shape, device="meta")
    if kind == "ragged":
        return [[1.0, 2.0], [3.0]]
    raise AssertionError(kind)


WRONG = ["none", "string", "dict", "masked", "datetime", "complex", "object", "bytes", "torch", "meta", "ragged"]


@SETTINGS
@given(st.sampled_from(["q", "k", "v", "mask", "bias"]), st.sampled_from(WRONG))
def test_wrong_arguments_are_named(arg, kind):
    q = np.ones((2, 3, 2))
    args = {"q": q, "k": q.copy(), "v": q.copy(), "mask": None, "bias": None}
    like = np.ones((3, 3), bool) if arg == "mask" else (np.zeros((3, 3)) if arg == "bias" else q)
    args[arg] = _wrong(kind, like)
    if args[arg] is None and arg in ("mask", "bias"):
        return  # None is the default there
    for f in (attnlab.scaled_dot_product_attention, attnlab.attention_trace):
        got = call(f, args["q"], args["k"], args["v"], mask=args["mask"], bias=args["bias"], names=[arg, "q"])
        assert isinstance(got, AttnlabError), (f.__name__, arg, kind, got)


@SETTINGS
@given(st.sampled_from(["x_q", "x_kv", "w_q", "b_o"]), st.sampled_from(WRONG))
def test_multi_head_wrong_arguments_are_named(arg, kind):
    rng = np.random.default_rng(0)
    w = attnlab.init_multi_head(4, 2, rng=rng)
    x = rng.standard_normal((1, 3, 4))
    if arg in ("x_q", "x_kv"):
        args = {"x_q": x, "x_kv": x.copy()}
        args[arg] = _wrong(kind, x)
        if arg == "x_kv" and args[arg] is None:
            return  # self attention
        got = call(attnlab.multi_head_attention, args["x_q"], args["x_kv"], w, names=[arg, "x_q"])
    else:
        if arg == "b_o" and kind == "none":
            return  # biases are optional
        arrays_ = w.arrays()
        arrays_[arg] = _wrong(kind, arrays_[arg])
        got = call(lambda: MultiHeadWeights(**arrays_, num_heads=2), names=[arg])
        if not isinstance(got, Exception):
            got = call(attnlab.multi_head_attention, x, None, got, names=[arg, "x_q"])
    assert isinstance(got, AttnlabError)


# --------------------------------------------------------------------------------------------------------------
# softmax family


def _softmax_ref(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x, dtype=np.float64)
    for idx in np.ndindex(*x.shape[:-1]):
        row = [float(a) for a in x[idx]]
        m = max(row)
        e = [math.exp(a - m) if a - m > -1e308 else 0.0 for a in row]
        total = math.fsum(e)
        out[idx] = [a / total for a in e]
    return out


@SETTINGS
@given(st.data(), st.sampled_from(FLOATS), st.sampled_from(["softmax", "log_softmax", "masked_softmax"]))
def test_softmax_family_is_exact_or_a_named_error(data, dtype, fn):
    x = data.draw(arrays((data.draw(st.integers(1, 3)), data.draw(st.integers(1, 5))), dtype))
    if fn == "masked_softmax":
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
        allowed = rng.random(x.shape) < 0.7
        got = call(attnlab.masked_softmax, x, allowed, names=["logits", "allowed"])
        assert not isinstance(got, Exception), got
        w, _, empty = got
        np.testing.assert_array_equal(empty, ~allowed.any(-1))
        assert np.isfinite(w).all() and (w[~allowed] == 0).all()
        ref = np.zeros(x.shape)
        for i in range(x.shape[0]):
            if allowed[i].any():
                ref[i, allowed[i]] = _softmax_ref(x[i, allowed[i]][None].astype(np.float64))[0]
    else:
        got = call(getattr(attnlab, fn), x, names=["x", "log_softmax(x)"])
        if isinstance(got, Exception):
            assert fn == "log_softmax" and isinstance(got, RangeError)
            spread = np.ptp(x.astype(np.float64), axis=-1).max()
            assert spread > 0.5 * np.finfo(np.float64 if dtype == np.float64 else np.float32).max or dtype == np.float16
            return
        w = got
        assert w.dtype == dtype and np.isfinite(w).all()
        ref = _softmax_ref(x.astype(np.float64))
        if fn == "log_softmax":
            with np.errstate(divide="ignore"):
                ref = np.log(ref)
            mask = np.isfinite(ref)
            tol = C * _eps(dtype) * (1 + _max(x)) + C * float(np.finfo(dtype).eps) * np.abs(ref[mask])
            assert (np.abs(np.asarray(w, np.float64)[mask] - ref[mask]) <= tol).all()
            return
    tol = min(1.0, C * _eps(dtype) * (1 + _max(x))) + C * float(np.finfo(w.dtype).eps)
    assert np.max(np.abs(np.asarray(w, np.float64) - ref)) <= tol


# --------------------------------------------------------------------------------------------------------------
# the multi-head layer


@SETTINGS
@given(st.data(), st.sampled_from(FLOATS), st.sampled_from([(2, 2), (2, 1), (4, 2)]))
def test_multi_head_is_exact_or_a_named_error(data, dtype, heads):
    h, h_kv = heads
    d_model, n = 4, data.draw(st.integers(1, 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    base = attnlab.init_multi_head(d_model, h, num_kv_heads=h_kv, rng=rng)
    e = data.draw(st.sampled_from(EXPONENTS[dtype]))
    scales = {n_: 10.0 ** data.draw(st.sampled_from([-e // 2, 0, e // 2])) for n_ in ("w_q", "w_k", "w_v", "w_o")}
    w = MultiHeadWeights(
        *(np.asarray(getattr(base, n_) * scales[n_], dtype) for n_ in ("w_q", "w_k", "w_v", "w_o")),
        num_heads=h,
        num_kv_heads=h_kv,
    )
    x = data.draw(arrays((1, n, d_model), dtype, exponent=e))
    names = ["x_q", "x_kv", "q", "k", "v", "heads", "output", "logits", *w.arrays()]
    r = call(attnlab.multi_head_attention, x, None, w, causal=True, names=names)
    w64 = MultiHeadWeights(*(a.astype(np.float64) for a in w.arrays().values()), num_heads=h, num_kv_heads=h_kv)
    with np.errstate(all="ignore"):
        ref, _ = reference_mha(x.astype(np.float64), None, w64, masks.causal(n))
    if isinstance(r, Exception):
        assert isinstance(r, RangeError)
        assert not np.isfinite(ref).all() or _max(ref) > float(np.finfo(dtype).max) / 8 or _max(x) * _max(w.w_v) > 1e300
        return
    out = np.asarray(r.output, np.float64)
    assert np.isfinite(out).all()
    if np.isfinite(ref).all():
        d = w.head_dim
        q_mag = _max(x) * _max(w.w_q) * d_model
        k_mag = _max(x) * _max(w.w_k) * d_model
        L = q_mag * k_mag * d / math.sqrt(d)
        v_mag = _max(x) * _max(w.w_v) * d_model
        eps, tiny = _eps(dtype), _tiny(dtype)
        # logits: rounding (eps · L) and underflow in Q, K; then V's own rounding and underflow, through W_O
        logit_err = C * (eps * (1 + L) + tiny * d * (1 + q_mag + k_mag))
        head_err = logit_err * v_mag + C * (eps * v_mag + tiny)
        out_f = np.finfo(dtype)
        tol = head_err * _max(w.w_o) * h * d + C * (float(out_f.eps) * _max(ref) + float(out_f.smallest_normal))
        if math.isfinite(tol):
            assert np.max(np.abs(out - ref)) <= tol
    g = call(attnlab.multi_head_backward, r, np.ones_like(x), names=["multi_head_backward", "dx_q", *names, "ds"])
    if not isinstance(g, Exception):
        assert all(np.isfinite(a).all() for a in (g.dx_q, *g.weights.arrays().values()))


# --------------------------------------------------------------------------------------------------------------
# heads, masks, invariants


@SETTINGS
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3), st.sampled_from([1, 2, 3, 0, -1, 2.0, "2", None]))
def test_split_merge_repeat_are_exact_or_named(b, n, d, h):
    x = np.arange(b * n * 6 * d, dtype=np.float64).reshape(b, n, 6 * d)
    got = call(split_heads, x, h, names=["num_heads", "x"])
    if isinstance(got, Exception):
        assert not (isinstance(h, int) and h >= 1 and (6 * d) % h == 0)
        return
    ref = np.stack([x[..., r * (6 * d // h) : (r + 1) * (6 * d // h)] for r in range(h)], axis=1)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(merge_heads(got), x)
    rep = call(repeat_kv, got, h, names=["n_rep", "x"])
    np.testing.assert_array_equal(rep, np.repeat(got, h, axis=1))


MASK_ARGS = st.one_of(st.integers(-1, 4), st.sampled_from([None, 2.5, "3", True, np.int64(2)]))


@SETTINGS
@given(MASK_ARGS, MASK_ARGS, st.sampled_from([None, "top_left", "bottom_right", "middle"]), MASK_ARGS, MASK_ARGS)
def test_mask_constructors_are_exact_or_named(n_q, n_k, align, left, right):
    c = call(masks.causal, n_q, n_k, align=align, names=["n_q", "n_k", "align", "causal"])
    if not isinstance(c, Exception):
        nk = n_q if n_k is None else n_k
        shift = nk - n_q if align == "bottom_right" else 0
        ref = np.array([[j <= i + shift for j in range(nk)] for i in range(n_q)])
        np.testing.assert_array_equal(c, ref)
    wdw = call(
        masks.window,
        n_q,
        n_k,
        left=left,
        right=right,
        align=align,
        names=["n_q", "n_k", "left", "right", "align", "window"],
    )
    if not isinstance(wdw, Exception):
        nk = n_q if n_k is None else n_k
        shift = nk - n_q if align == "bottom_right" else 0
        ref = np.array(
            [
                [
                    (left is None or j - i - shift >= -left) and (right is None or j - i - shift <= right)
                    for j in range(nk)
                ]
                for i in range(n_q)
            ]
        ).reshape(n_q, nk)
        np.testing.assert_array_equal(wdw, ref)


@SETTINGS
@given(st.lists(st.integers(-1, 5), min_size=1, max_size=3), st.integers(1, 4), st.sampled_from([2, 3, 4, 1, 2.0]))
def test_padding_and_segments_are_exact_or_named(lengths, n, ndim):
    kp = call(masks.key_padding, lengths, n, ndim=ndim, names=["lengths", "n_k", "ndim"])
    if not isinstance(kp, Exception):
        ref = np.array([[j < length for j in range(n)] for length in lengths])
        np.testing.assert_array_equal(kp.reshape(len(lengths), n), ref)
    qp = call(masks.query_padding, lengths, n, ndim=ndim, names=["lengths", "n_q", "ndim"])
    if not isinstance(qp, Exception):
        np.testing.assert_array_equal(
            qp.reshape(len(lengths), n), np.array([[i < ln for i in range(n)] for ln in lengths])
        )
    seg = call(masks.segments, lengths, names=["q_segments", "k_segments"])
    np.testing.assert_array_equal(seg, np.equal.outer(lengths, lengths))
    out = np.ones((len(lengths), 2, n, 3))
    z = call(masks.zero_padded_queries, out, lengths, names=["lengths", "output"])
    if not isinstance(z, Exception):
        for b, length in enumerate(lengths):
            assert (z[b, :, length:] == 0).all() and (z[b, :, :length] == 1).all()


@SETTINGS
@given(
    st.one_of(st.lists(st.integers(-2, 6), max_size=4), st.integers(0, 3), st.just([[1, 2]]), st.just([1.5])),
    st.sampled_from([0, 1, 4, 5, -1, 2.0, True]),
)
def test_real_tokens_is_exact_or_named(lengths, n):
    real = call(masks.real_tokens, lengths, n, size="t", names=["lengths", "t"])
    if not isinstance(real, Exception):
        ref = np.array([[i < length for i in range(n)] for length in lengths], dtype=bool).reshape(len(lengths), n)
        np.testing.assert_array_equal(real, ref)
        assert real.dtype == np.bool_


@SETTINGS
@given(
    st.sampled_from(FLOATS),
    st.sampled_from([-np.inf, -1e30, -1e9, -1e4, -65504.0, 0.0, -1.0, 3.0, np.nan]),
    st.sampled_from([-1e4, -1.0, -np.inf, 0, 5, float("nan"), "x"]),
)
def test_mask_converters_are_exact_or_named(dtype, fill, threshold):
    with np.errstate(over="ignore"):  # -1e30 in float16 is -inf: a blocking value too
        m = np.array([[0.0, fill], [fill, 0.0]]).astype(dtype)
    names = ["mask", "threshold", "attn_mask", "attention_mask", "key_padding_mask", "dtype", "fill"]
    got = call(masks.from_additive, m, threshold=threshold, names=names)
    t_ok = isinstance(threshold, (int, float)) and threshold < 0
    if not isinstance(got, Exception):
        assert t_ok
        blocked = np.array([[False, True], [True, False]]) & (m.astype(np.float64)[0, 1] <= threshold)
        np.testing.assert_array_equal(got, ~blocked)
    else:
        with np.errstate(invalid="ignore"):
            assert not t_ok or np.isnan(m).any() or not ((m == 0) | (m <= threshold)).all()
    for f in (masks.from_torch_sdpa, masks.from_hf):
        call(f, m[None, None] if f is masks.from_hf else m, names=names)
    call(masks.from_torch_mha, attn_mask=m, key_padding_mask=np.array([[False, True]]), names=names)
    b = np.array([[True, False], [False, True]])
    for dt in (dtype, np.int32, np.bool_, "float16", "nonsense"):
        add = call(masks.to_additive, b, dt, names=names)
        if not isinstance(add, Exception):
            assert np.dtype(dt).kind == "f" and add.dtype == np.dtype(dt)
            np.testing.assert_array_equal(masks.from_additive(add), b)
    np.testing.assert_array_equal(call(masks.to_blocked, b, names=names), ~b)
    np.testing.assert_array_equal(call(masks.from_blocked, b, names=names), ~b)
    np.testing.assert_array_equal(call(masks.from_jax, b, names=names), b)
    call(masks.from_keep, m, names=names)


@SETTINGS
@given(attention_problems(), st.sampled_from(["trace", "none", "weights", "output", "allowed", "v"]))
def test_invariants_check_is_a_verdict_or_a_named_error(p, corrupt):
    q, k, v, mask, bias, *_ = p
    if mask is not None:
        mask[..., 0] = True
    t = call(attnlab.attention_trace, q, k, v, mask, bias=bias, names=ATTENTION_NAMES)
    if isinstance(t, Exception):
        return
    if corrupt == "trace":
        assert invariants.check(t) == []
        return
    if corrupt == "none":
        assert isinstance(call(invariants.check, None, names=["trace"]), AttnlabError)
        return
    parts = {"q": t.q, "k": t.k, "v": t.v, "weights": t.weights, "output": t.output, "allowed": t.allowed}
    parts[corrupt] = {"weights": "w", "output": None, "allowed": np.ones((7, 7)), "v": np.ones(3)}[corrupt]
    got = call(invariants.check_arrays, *parts.values(), names=list(parts))
    assert isinstance(got, AttnlabError)


@SETTINGS
@given(st.sampled_from([np.int8, np.int64, np.uint8, np.bool_, np.longdouble]), st.integers(0, 2**32 - 1))
def test_integer_bool_and_long_double_inputs_are_float64(dtype, seed):
    rng = np.random.default_rng(seed)
    raw = [rng.integers(0 if dtype in (np.uint8, np.bool_) else -100, 100, size=s) for s in ((3, 2), (4, 2), (4, 3))]
    q, k, v = (x.astype(dtype) for x in raw)
    if dtype == np.longdouble:
        q, k, v = (x / np.longdouble(7) for x in (q, k, v))  # values long double holds beyond float64
    got = call(attnlab.attention_trace, q, k, v, names=ATTENTION_NAMES)
    assert not isinstance(got, Exception), got
    assert got.output.dtype == np.float64 and got.weights.dtype == np.float64
    ref, _ = reference_attention(*(x.astype(np.float64) for x in (q, k, v)))
    L = _logit_bound(q.astype(np.float64), k.astype(np.float64), None, 1 / math.sqrt(2), 1.0)
    np.testing.assert_allclose(got.output, ref, rtol=0, atol=C * _eps(np.float64) * (1 + L) * (1 + _max(v)))


@settings(max_examples=40, deadline=None)
@given(big=st.integers(100, 250), e_q=st.integers(100, 300), over=st.integers(0, 100), seed=st.integers(0, 2**16))
def test_huge_factors_that_cancel_are_computed_when_the_logits_fit(big, e_q, over, seed):
    """``Q Kᵀ`` overflows float64 (about 10**(e_q + e_k) > 10**308) while the logits ``Q Kᵀ · scale / T`` are finite
    (about 10**big): the dense core computes them, as flash_attention does (it raised RangeError, since
    ``scale · 2**(a + b)`` overflowed before the temperature was applied). Logits that large make each row one-hot
    at its largest ``q · k`` (exactly: the runner-up is 10**100 smaller in the exponent)."""
    e_k = min(310 + over, 307 + big) - e_q  # Q Kᵀ ~ 10**(e_q + e_k), beyond float64 when e_q + e_k >= 310
    if not 0 <= e_k <= 307 or e_q + e_k < 310:
        return
    rng = np.random.default_rng(seed)
    x, y, v = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    q, k = x * 10.0**e_q, y * 10.0**e_k
    temperature = 10.0 ** (e_q + e_k - big)
    want = v[np.argmax(x @ y.T, axis=-1)]  # [3, 2]
    np.testing.assert_array_equal(attnlab.scaled_dot_product_attention(q, k, v, temperature=temperature), want)
    np.testing.assert_array_equal(attnlab.flash_attention(q, k, v, temperature=temperature).output, want)


def test_the_reported_case_of_cancelling_factors():
    q = np.diag([1e200, 1e200])
    np.testing.assert_allclose(attnlab.scaled_dot_product_attention(q, q, np.eye(2), temperature=1e200), np.eye(2))
