"""Self-check of the second held-out backward set: our claims about each case, never the checker's output.

:func:`verify_all` calls every case the way docs/checker.md says the checker calls it (a plain
``bwd(q, k, v, d_out, ...)``, a flash ``bwd(q, k, v, out, lse, d_out, ...)`` with its forward or with golden ``out``
and ``lse``, or the forward differentiated by torch autograd / ``jax.vjp``) on random inputs with B = 2, h = 4,
n_q = 45 != n_k = 70, d_v != d_k, masks with a fully masked row and a key masked for every query, causal and
dropout keep masks where the function takes them, GQA 4 -> 2 where declared. The golden is torch autograd in
float64; a float64 NumPy analytic backward (checked against it) gives the gradients under each planted mistake.
Correct cases must match the golden; each buggy case must differ as its docstring says (and match where it says
the bug does not show).
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import torch

from heldout2_backward import CASES, LOG2E

B, H, NQ, NK, D, DV = 2, 4, 45, 70, 8, 6
SCALE = 0.37


# ---------------------------------------------------------------------------------------------------------------
# goldens


def autograd_golden(q, k, v, do, ok, scale, z=None):
    """torch autograd in float64 through a safe softmax (bhnd, K/V expanded to q's heads already)."""
    t = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v)]
    okt = torch.tensor(ok)
    s = (t[0] @ t[1].transpose(-1, -2)) * scale
    s = s.masked_fill(~okt, -math.inf)
    m = s.detach().amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    den = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(den > 0, den, torch.ones_like(den))
    if z is not None:
        p = p * torch.tensor(z)
    out = p @ t[2]
    grads = torch.autograd.grad(out, t, torch.tensor(do))
    return out.detach().numpy(), [g.numpy() for g in grads]


def analytic(q, k, v, do, ok, scale, z=None, *, p_override=None, delta="o", jacobian=True, z_dp=True, z_dv=True):
    """Float64 NumPy backward with switches for the planted mistakes (bhnd, K/V expanded)."""
    with np.errstate(all="ignore"):
        s = np.where(ok, q @ np.swapaxes(k, -1, -2) * scale, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isfinite(m), m, 0))
        den = e.sum(axis=-1, keepdims=True)
        p_true = e / np.where(den > 0, den, 1)
        p = p_true if p_override is None else p_override
        zz = np.ones_like(p) if z is None else z
        out = (p_true * zz) @ v
        dv = np.swapaxes(p * (zz if z_dv else 1), -1, -2) @ do
        dp = do @ np.swapaxes(v, -1, -2)
        if z_dp:
            dp = dp * zz
        if delta == "o":
            dl = (do * out).sum(axis=-1, keepdims=True)
        elif delta == "dp":
            dl = dp.sum(axis=-1, keepdims=True)
        elif delta == "p":
            dl = p.sum(axis=-1, keepdims=True)
        ds = p * (dp - dl) if jacobian else p * dp
        return {"p": p_true, "ds": ds, "dq": ds @ k * scale, "dk": np.swapaxes(ds, -1, -2) @ q * scale, "dv": dv}


# ---------------------------------------------------------------------------------------------------------------
# inputs and calls


class Inputs:
    """Float64 inputs in bhnd (and the case's layout), a mask, causal, dropout and GQA settings."""

    def __init__(
        self, seed=0, *, b=B, h=H, h_kv=None, n_q=NQ, n_k=NK, mask=True, causal=False, dropout=False, valid_lens=None
    ):
        rng = np.random.default_rng(seed)
        h_kv = h if h_kv is None else h_kv
        self.q = rng.standard_normal((b, h, n_q, D))
        self.k = rng.standard_normal((b, h_kv, n_k, D))
        self.v = rng.standard_normal((b, h_kv, n_k, DV))
        self.do = rng.standard_normal((b, h, n_q, DV))
        self.mask = None
        if mask:
            self.mask = rng.random((b, h, n_q, n_k)) < 0.7
            self.mask[:, :, :, 0] = True
            self.mask[0, h - 1, n_q // 2] = False  # a fully masked row
            self.mask[b - 1, :, :, n_k - 1] = False  # a key masked for every query
        self.valid_lens = None
        if valid_lens is not None:  # d2l's mask form: keys past each batch element's length are masked
            self.valid_lens = np.asarray(valid_lens)[:b]
            keys = np.arange(n_k)[None, :] < self.valid_lens[:, None]
            self.mask = np.broadcast_to(keys[:, None, None, :], (b, h, n_q, n_k)).copy()
        self.causal = causal
        self.dropout_p = 0.25 if dropout else 0.0
        self.keep = rng.random((b, h, n_q, n_k)) >= 0.25 if dropout else None
        self.group = h // h_kv

    def ok(self, *, bottom_right=False):
        ok = np.ones((*self.q.shape[:-1], self.k.shape[-2]), bool)
        if self.mask is not None:
            ok &= self.mask
        if self.causal:
            n_q, n_k = ok.shape[-2:]
            off = n_k - n_q if bottom_right else 0
            ok &= np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + off
        return ok

    def z(self):
        return None if self.keep is None else self.keep / (1 - self.dropout_p)

    def expanded(self):
        return self.q, np.repeat(self.k, self.group, 1), np.repeat(self.v, self.group, 1)

    def fold(self, g):
        b, h, n, d = g.shape
        return g.reshape(b, h // self.group, self.group, n, d).sum(2)

    def golden(self, scale=None):
        q, k, v = self.expanded()
        scale = 1 / math.sqrt(D) if scale is None else scale
        out, (dq, dk, dv) = autograd_golden(q, k, v, self.do, self.ok(), scale, self.z())
        return out, (dq, self.fold(dk), self.fold(dv))

    def hypothesis(self, scale=None, **kw):
        q, k, v = self.expanded()
        scale = 1 / math.sqrt(D) if scale is None else scale
        r = analytic(q, k, v, self.do, self.ok(), scale, self.z(), **kw)
        return r, (r["dq"], self.fold(r["dk"]), self.fold(r["dv"]))

    def lse(self, scale=None):
        q, k, _ = self.expanded()
        scale = 1 / math.sqrt(D) if scale is None else scale
        with np.errstate(all="ignore"):
            s = np.where(self.ok(), q @ np.swapaxes(k, -1, -2) * scale, -np.inf)
            m = s.max(axis=-1)
            mm = np.where(np.isfinite(m), m, 0)
            return mm + np.log(np.exp(s - mm[..., None]).sum(axis=-1))  # -inf on an empty row


def _params(fn):
    return set(inspect.signature(fn).parameters)


def _keywords(fn, x, dtype_conv):
    names = _params(fn)
    kw = {}
    if x.mask is not None and "mask" in names:
        kw["mask"] = dtype_conv(x.mask, bool)
    if x.causal and "causal" in names:
        kw["causal"] = True
    if x.keep is not None and "dropout_mask" in names:
        kw["dropout_mask"] = dtype_conv(x.keep, bool)
        kw["dropout_p"] = x.dropout_p
    if x.valid_lens is not None and "valid_lens" in names:
        kw["valid_lens"] = torch.tensor(x.valid_lens)
    return kw


def call(case, x, *, dtype="float64", layout_fix=True, scale=None):
    """The case's (dq, dk, dv) as float64 NumPy in bhnd, and the raw results (for dtypes)."""
    opts = case.options
    framework = opts.get("framework", "numpy")
    bnhd = opts.get("layout") == "bnhd"

    def lay(a):
        return np.ascontiguousarray(np.swapaxes(a, 1, 2)) if bnhd and a.ndim == 4 and layout_fix else a

    def unlay(a):
        return np.swapaxes(a, 1, 2) if bnhd else a

    if framework == "torch":
        tdt = getattr(torch, dtype)

        def conv(a, kind=None):
            if kind is bool:
                return torch.tensor(a)
            return torch.tensor(lay(a), dtype=tdt)

    elif framework == "jax":
        import jax.numpy as jnp

        def conv(a, kind=None):
            if kind is bool:
                return jnp.asarray(a)
            return jnp.asarray(lay(a), dtype=getattr(jnp, dtype))

    else:

        def conv(a, kind=None):
            if kind is bool:
                return a.copy()
            return lay(a).astype(dtype)

    q, k, v, do = (conv(a) for a in (x.q, x.k, x.v, x.do))
    kw = _keywords(case.fn, x, conv)
    if scale is not None:
        kw["scale"] = scale
    fn = case.fn
    if opts.get("backward") is True:
        if framework == "jax":
            import jax

            def grads(a, b, c, g, m):  # one compiled program per shape (the eager ops compile one by one)
                kw2 = dict(kw, mask=m) if "mask" in kw else kw
                return jax.vjp(lambda a, b, c: fn(a, b, c, **kw2), a, b, c)[1](g)

            raw = jax.jit(grads)(q, k, v, do, kw.get("mask"))
        else:
            ts = [t.clone().requires_grad_(True) for t in (q, k, v)]
            out = fn(*ts, **kw)
            raw = torch.autograd.grad(out, ts, do)
    elif "lse" in _params(fn):
        if "forward" in opts:
            fwd = opts["forward"]
            out, lse = fwd(q, k, v, **{n: a for n, a in kw.items() if n in _params(fwd)})
        else:
            out_g, _ = x.golden(scale)
            lse_g = x.lse(scale)
            if opts.get("lse_units") == "log2":
                lse_g = lse_g * LOG2E
            out = conv(out_g)
            lse = torch.tensor(lse_g, dtype=tdt) if framework == "torch" else lse_g.astype(dtype)
        raw = fn(q, k, v, out, lse, do, **kw)
    else:
        raw = fn(q, k, v, do, **kw)
    grads = tuple(unlay(np.asarray(g.detach() if hasattr(g, "detach") else g, dtype=np.float64)) for g in raw)
    return grads, raw


def rel(a, b):
    scale = max(1.0, float(np.nanmax(np.abs(b))))
    return float(np.max(np.abs(a - b))) / scale if np.all(np.isfinite(a)) else math.inf


TOL = {"float64": 1e-9, "jax": 5e-5}


def _tol(case):
    return TOL["jax"] if case.options.get("framework") == "jax" else TOL["float64"]


def close(case, got, want, which=(0, 1, 2)):
    return all(rel(got[i], want[i]) < _tol(case) for i in which)


def differs(case, got, want, which):
    return any(rel(got[i], want[i]) > 1e3 * _tol(case) for i in which)


# ---------------------------------------------------------------------------------------------------------------
# the correct cases


def configs(case):
    """The inputs a correct case must get right (what it takes: mask, causal, dropout, GQA)."""
    names = _params(case.fn)
    fwd = case.options.get("forward")
    takes = names | (_params(fwd) if fwd else set())
    gqa = bool(case.options.get("gqa"))
    if "valid_lens" in takes:
        return [Inputs(1, valid_lens=[50, 63]), Inputs(6, b=1, h=1, n_q=7, n_k=3, valid_lens=[2])]
    if case.options.get("framework") == "jax":  # (each new shape compiles: the configs that matter)
        return [Inputs(1, mask=True), Inputs(3, mask=True, causal=True), Inputs(4, n_q=33, n_k=33, causal=True)]
    has_mask = "mask" in takes
    out = [Inputs(1, mask=has_mask)]
    if gqa:
        out.append(Inputs(2, h_kv=2, mask=has_mask))
    if "causal" in takes:
        out.append(Inputs(3, mask=has_mask, causal=True))
        out.append(Inputs(4, n_q=33, n_k=33, mask=False, causal=True, h_kv=2 if gqa else None))
    if "dropout_mask" in takes:
        out.append(Inputs(5, mask=has_mask, causal="causal" in takes, dropout=True, h_kv=2 if gqa else None))
    out.append(Inputs(6, b=1, h=1, n_q=7, n_k=3, mask=False))
    return out


def _dtype(case):
    return "float32" if case.options.get("framework") == "jax" else "float64"


def _uniform_rows(case):
    """d2l: a batch element with valid length 0 has uniform rows (-1e6 everywhere), their d_out spread over V only."""
    x = Inputs(7, valid_lens=[50, 0])
    got, _ = call(case, x)
    want_dv1 = np.broadcast_to(x.do[1].sum(axis=-2, keepdims=True) / NK, x.v[1].shape)
    ok = all(np.isfinite(g).all() for g in got)
    ok = ok and not np.abs(got[0][1]).any() and not np.abs(got[1][1]).any() and rel(got[2][1], want_dv1) < 1e-12
    return [] if ok else [f"{case.name}: valid length 0 is not the uniform policy"]


def _masked_key_exact(case):
    """A key masked for every query, its K = 30 and V = 1e3: dK and dV exactly 0 there, in every dtype."""
    problems = []
    for dtype in ("float32",) if case.options.get("framework") == "jax" else ("float64", "float32", "float16"):
        x = Inputs(8, h_kv=2 if case.options.get("gqa") else None)
        x.k[B - 1, :, NK - 1] = 30.0
        x.v[B - 1, :, NK - 1] = 1e3
        got, _ = call(case, x, dtype=dtype)
        if not all(np.isfinite(g).all() for g in got) or np.abs(got[1][B - 1, :, NK - 1]).any():
            problems.append(f"{case.name}: {dtype} masked key: non-finite gradients or dK != 0")
        elif np.abs(got[2][B - 1, :, NK - 1]).any():
            problems.append(f"{case.name}: {dtype} masked key: dV != 0")
    return problems


def check_correct(case):
    problems = []
    scale = SCALE if "scale" in _params(case.fn) else None
    for i, x in enumerate(configs(case)):
        got, _ = call(case, x, dtype=_dtype(case), scale=scale)
        _, want = x.golden(scale)
        if not close(case, got, want):
            problems.append(f"{case.name}: config {i} errors {[rel(g, w) for g, w in zip(got, want, strict=True)]}")
    if "valid_lens" in _params(case.fn):
        problems += _uniform_rows(case)
    else:
        problems += _masked_key_exact(case)
    x = configs(case)[0]
    for dtype in ("float32",) if case.options.get("framework") == "jax" else ("float32", "float16"):
        got, raw = call(case, x, dtype=dtype, scale=scale)
        names = [str(g.dtype).replace("torch.", "") for g in raw]
        if any(n != dtype for n in names):
            problems.append(f"{case.name}: {dtype} inputs gave gradients {names}")
        if dtype == _dtype(case):
            continue  # (compared above)
        _, want = x.golden(scale)
        worst = max(rel(g, w) for g, w in zip(got, want, strict=True))
        if worst > (3e-2 if dtype == "float16" else 1e-4):
            problems.append(f"{case.name}: {dtype} gradients {worst:.2g} from the golden")
    return problems


# ---------------------------------------------------------------------------------------------------------------
# the buggy cases: each differs as its docstring says, and only there


def _grads(case, x, **kw):
    return call(case, x, dtype=_dtype(case), **kw)[0]


def _vs_golden(case, x, scale=None):
    got = _grads(case, x, scale=scale)
    return got, x.golden(scale)[1]


def _fa2_dq_assigned(case):
    x = Inputs(11)
    got, want = _vs_golden(case, x)
    r, _ = x.hypothesis()
    _, k, _ = x.expanded()
    last = r["ds"][..., 64:] @ k[..., 64:, :] / math.sqrt(D)  # the last 32-key block (keys 64..69)
    small = Inputs(12, n_k=30)
    return {
        "dk, dv right": close(case, got, want, (1, 2)),
        "dq wrong": differs(case, got, want, (0,)),
        "dq = the last key block's dS K": rel(got[0], last) < _tol(case),
        "one key block: right": close(case, *_vs_golden(case, small)),
    }


def _nan_on_empty_rows(case):
    x = Inputs(13)
    got, _ = _vs_golden(case, x, SCALE if "scale" in _params(case.fn) else None)
    clean = Inputs(14)
    clean.mask[0, H - 1, NQ // 2, 0] = True  # no fully masked row
    return {
        "NaN with a fully masked row": any(np.isnan(g).any() for g in got),
        "right without one": close(case, *_vs_golden(case, clean, SCALE if "scale" in _params(case.fn) else None)),
    }


def _fa2_f64(case):
    x = Inputs(15)
    _, raw = call(case, x, dtype="float32")
    got, want = _vs_golden(case, x)
    return {
        "float32 inputs: dq float32": raw[0].dtype == np.float32,
        "float32 inputs: dk, dv float64": raw[1].dtype == np.float64 and raw[2].dtype == np.float64,
        "float64 values right": close(case, got, want),
    }


def _dropout_claims(case, **hyp):
    x = Inputs(16, dropout=True, causal="causal" in _params(case.fn))
    got, want = _vs_golden(case, x)
    _, expect = x.hypothesis(**hyp)
    return {
        "no dropout: right": close(case, *_vs_golden(case, Inputs(17))),
        "dropout: wrong": differs(case, got, want, (0, 1, 2)),
        f"dropout: = the golden with {hyp}": close(case, got, expect),
    }


def _fa2_dropout_dv_only(case):
    out = _dropout_claims(case, z_dp=False)
    x = Inputs(16, dropout=True, causal=True)
    got, want = _vs_golden(case, x)
    out["dv right"] = close(case, got, want, (2,))
    return out


def _ring_keep_rescaled(case):
    x = Inputs(18, dropout=True, causal=True)
    got, want = _vs_golden(case, x)
    twice = Inputs(18, dropout=True, causal=True)
    twice.dropout_p = 1 - (1 - x.dropout_p) ** 2  # keep / (1-p)^2 everywhere: dV and dP
    q, k, v = twice.expanded()
    r = analytic(q, k, v, twice.do, twice.ok(), 1 / math.sqrt(D), twice.z())
    expect = (r["dq"], twice.fold(r["dk"]), twice.fold(r["dv"]))
    # delta stays rowsum(dO ∘ O) of the forward's O: only dV and dP see the double scale
    r2 = analytic(q, k, v, x.do, x.ok(), 1 / math.sqrt(D), twice.z(), delta="o")
    out_fwd = (r2["p"] * x.z()) @ v
    dp = (x.do @ np.swapaxes(v, -1, -2)) * twice.z()
    ds = r2["p"] * (dp - (x.do * out_fwd).sum(-1, keepdims=True))
    expect = (ds @ k / math.sqrt(D), x.fold(np.swapaxes(ds, -1, -2) @ q / math.sqrt(D)), expect[2])
    return {
        "no dropout: right": close(case, *_vs_golden(case, Inputs(19, h_kv=2))),
        "dropout: wrong": differs(case, got, want, (0, 1, 2)),
        "dropout: dV and dP with keep/(1-p)^2": close(case, got, expect),
    }


def _scale_claims(case, factors, scale=None):
    x = Inputs(20, causal="causal" in _params(case.fn))
    got, want = _vs_golden(case, x, scale)
    return {
        f"= golden times {factors}": all(rel(g, w * f) < _tol(case) for g, w, f in zip(got, want, factors, strict=True))
    }


def _lucid_causal_triu(case):
    x = Inputs(21, causal=True)
    got, want = _vs_golden(case, x)
    r, _ = x.hypothesis()
    p = r["p"] * (np.arange(NK)[None, :] != np.arange(NQ)[:, None])  # P of the forward, the diagonal dropped
    _, expect = x.hypothesis(p_override=p)
    return {
        "no causal: right": close(case, *_vs_golden(case, Inputs(22))),
        "causal: wrong": differs(case, got, want, (0, 1, 2)),
        "causal: P without its diagonal": close(case, got, expect),
    }


def _leak_claims(case, scale=None):
    x = Inputs(23)  # (no causal: it would mask keys 45.. itself)
    got, want = _vs_golden(case, x, scale)
    y = Inputs(23)
    y.v[B - 1, :, NK - 1] = 1e3  # the key masked for every query (batch element B-1)
    y.k[B - 1, :, NK - 1] = 30.0
    got_y = _grads(case, y, scale=scale)
    moved = rel(got_y[0][B - 1], got[0][B - 1]) > 1e-6
    leak_dkv = float(np.abs(got[1][B - 1, :, NK - 1]).max() + np.abs(got[2][B - 1, :, NK - 1]).max())
    return {
        "no mask: right": close(case, *_vs_golden(case, Inputs(24, mask=False), scale)),
        "mask: wrong": differs(case, got, want, (0, 1, 2)),
        "a masked key gets dK/dV or moves dQ": leak_dkv > 1e-6 or moved,
    }


def _lucid_dkdv_copy(case):
    x = Inputs(25)
    got, want = _vs_golden(case, x)
    r, _ = x.hypothesis()
    q, _, _ = x.expanded()
    last = slice(32, NQ)  # the last 16-query bucket (rows 32..44)
    dk = np.swapaxes(r["ds"][..., last, :], -1, -2) @ q[..., last, :] / math.sqrt(D)
    dv = np.swapaxes(r["p"][..., last, :], -1, -2) @ x.do[..., last, :]
    return {
        "dq right": close(case, got, want, (0,)),
        "dk, dv = the last query bucket's": rel(got[1], dk) < _tol(case) and rel(got[2], dv) < _tol(case),
    }


def _hyp_claims(case, **hyp):
    x = Inputs(26, causal="causal" in _params(case.fn))
    scale = SCALE if "scale" in _params(case.fn) else None
    got, want = _vs_golden(case, x, scale)
    _, expect = x.hypothesis(scale, **hyp)
    return {
        "dv right": close(case, got, want, (2,)),
        "dq, dk wrong": differs(case, got, want, (0, 1)),
        f"= the golden with {hyp}": close(case, got, expect),
    }


def _p_from_lse(x, allowed):
    """P recomputed from the forward's lse over ``allowed`` (another mask than the forward's)."""
    q, k, _ = x.expanded()
    with np.errstate(all="ignore"):
        s = q @ np.swapaxes(k, -1, -2) / math.sqrt(D)
        return np.where(allowed, np.exp(s - x.lse()[..., None]), 0)


def _pallas_bottom_right(case):
    x = Inputs(27, causal=True)
    got, want = _vs_golden(case, x)
    _, expect = x.hypothesis(p_override=_p_from_lse(x, x.ok(bottom_right=True)))
    return {
        "no causal: right": close(case, *_vs_golden(case, Inputs(28))),
        "causal square: right": close(case, *_vs_golden(case, Inputs(29, n_q=33, n_k=33, causal=True))),
        "causal 45 x 70: wrong": differs(case, got, want, (0, 1, 2)),
        "= P of the forward under the bottom-right mask": close(case, got, expect),
    }


def _jac_dq_transposed(case):
    x = Inputs(30, n_q=33, n_k=33)
    got, want = _vs_golden(case, x, SCALE)
    r, _ = x.hypothesis(SCALE)
    try:
        _grads(case, Inputs(31), scale=SCALE)
        raised = False
    except ValueError:
        raised = True
    return {
        "square: dk, dv right": close(case, got, want, (1, 2)),
        "square: dq = dSᵀ K": rel(got[0], np.swapaxes(r["ds"], -1, -2) @ x.k * SCALE) < _tol(case),
        "rectangular: raises": raised,
    }


def _bmk_do_reshaped(case):
    x = Inputs(32, h_kv=None)
    got, want = _vs_golden(case, x, SCALE)
    y = Inputs(32)
    y.do[:, 1] += 1.0  # change head 1's d_out only
    got_y = _grads(case, y, scale=SCALE)
    return {
        "h = 1: right": close(case, *_vs_golden(case, Inputs(33, h=1), SCALE)),
        "h = 4: wrong": differs(case, got, want, (0, 1, 2)),
        "head 1's d_out moves head 0's dV": rel(got_y[2][:, 0], got[2][:, 0]) > 1e-6,
    }


def _bmk_fold_assigned(case):
    x = Inputs(34, h_kv=2)
    got, want = _vs_golden(case, x, SCALE)
    r, _ = x.hypothesis(SCALE)
    last_dk = r["dk"][:, 1::2]  # query heads 1 and 3, the last of each group of 2
    last_dv = r["dv"][:, 1::2]
    return {
        "no GQA: right": close(case, *_vs_golden(case, Inputs(35), SCALE)),
        "GQA: dq right": close(case, got, want, (0,)),
        "GQA: dk, dv = each group's last head": rel(got[1], last_dk) < _tol(case) and rel(got[2], last_dv) < _tol(case),
    }


def _exp2_lse(case, p_of):
    x = Inputs(36, causal=True)
    got, want = _vs_golden(case, x)
    q, k, _ = x.expanded()
    with np.errstate(all="ignore"):
        s = np.where(x.ok(), q @ np.swapaxes(k, -1, -2) / math.sqrt(D), -np.inf)
        p = np.nan_to_num(p_of(s, x.lse()), nan=0.0, posinf=0.0)
    p = np.where(np.isfinite(x.lse())[..., None], p, 0)
    _, expect = x.hypothesis(p_override=p)
    return {
        "wrong": differs(case, got, want, (0, 1, 2)),
        "= the golden with the claimed P": close(case, got, expect),
    }


def _exp2_causal_ignored(case):
    x = Inputs(38, causal=True)
    got, want = _vs_golden(case, x)
    _, expect = x.hypothesis(p_override=_p_from_lse(x, x.mask))  # the forward's (causal) lse, no causal mask
    return {
        "no causal: right": close(case, *_vs_golden(case, Inputs(39))),
        "causal: wrong": differs(case, got, want, (0, 1, 2)),
        "causal: = P without the causal mask": close(case, got, expect),
    }


def _exp2_q_in_place(case):
    x = Inputs(37, causal=True)
    q = torch.tensor(x.q)
    before = q.clone()
    fwd = case.options["forward"]
    out, lse = fwd(q, torch.tensor(x.k), torch.tensor(x.v), mask=torch.tensor(x.mask), causal=True)
    raw = case.fn(
        q, torch.tensor(x.k), torch.tensor(x.v), out, lse, torch.tensor(x.do), mask=torch.tensor(x.mask), causal=True
    )
    _, want = x.golden()
    return {
        "q changed": not torch.equal(q, before),
        "gradients right": close(case, [g.numpy() for g in raw], want),
    }


def _d2l_finite_fill(case):
    """Right at ordinary scores; at scores below -1e6 the padded keys (filled with -1e6) outscore the valid ones."""
    q = torch.full((1, 1, 1, 4), 1e4, dtype=torch.float64)
    k = torch.full((1, 1, 3, 4), -1e2, dtype=torch.float64)
    v = torch.tensor([[[[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0]]]], dtype=torch.float64)
    out = case.fn(q, k, v, torch.tensor([2]))  # scores -2e6 on the two valid keys, -1e6 on the padded one
    return {"the padded key takes the weight once the scores are below -1e6": bool(out[0, 0, 0, 2] > 0.99)}


CLAIMS = {
    "d2l": _d2l_finite_fill,
    "fa2-dq-assigned": _fa2_dq_assigned,
    "fa2-lse-neg-inf": _nan_on_empty_rows,
    "fa2-f64-accumulators": _fa2_f64,
    "fa2-dropout-dv-only": _fa2_dropout_dv_only,
    "fa2-dq-scaled-twice": lambda c: _scale_claims(c, (1 / math.sqrt(D), 1, 1)),
    "lucid-causal-triu": _lucid_causal_triu,
    "lucid-mask-forgotten": _leak_claims,
    "lucid-dkdv-copy": _lucid_dkdv_copy,
    "pallas-delta-dp": lambda c: _hyp_claims(c, delta="dp"),
    "pallas-no-delta": lambda c: _hyp_claims(c, jacobian=False),
    "pallas-bottom-right": _pallas_bottom_right,
    "jac-diag-only": lambda c: _hyp_claims(c, jacobian=False),
    "jac-unguarded": _nan_on_empty_rows,
    "jac-dq-transposed": _jac_dq_transposed,
    "bmk-do-reshaped": _bmk_do_reshaped,
    "bmk-fold-assigned": _bmk_fold_assigned,
    "tape-mul-passthrough": lambda c: _scale_claims(c, (1 / SCALE, 1, 1), SCALE),
    "tape-delta-rowsum-p": lambda c: _hyp_claims(c, delta="p"),
    "tape-recompute-unmasked": lambda c: _leak_claims(c, SCALE),
    "ring-keep-rescaled": _ring_keep_rescaled,
    "exp2-read-as-nats": lambda c: _exp2_lse(c, lambda s, lse: np.exp(s - lse[..., None] * LOG2E)),
    "exp2-lse-no-max": lambda c: _exp2_lse(
        c, lambda s, lse: np.exp(s - (lse - np.where(np.isfinite(s.max(-1)), s.max(-1), 0))[..., None])
    ),
    "exp2-q-in-place": _exp2_q_in_place,
    "exp2-causal-ignored": _exp2_causal_ignored,
}


def check_golden():
    """The analytic NumPy backward agrees with torch autograd (masks, empty rows, causal, dropout, GQA)."""
    problems = []
    for x in (Inputs(40, h_kv=2, causal=True), Inputs(41, dropout=True), Inputs(42, mask=False)):
        _, want = x.golden()
        _, got = x.hypothesis()
        if max(rel(g, w) for g, w in zip(got, want, strict=True)) > 1e-12:
            problems.append("analytic backward != autograd")
    return problems


def verify_all():
    """Every claim about every case; returns the list of failed claims (empty when all hold)."""
    problems = check_golden()
    for case in CASES:
        if case.primary is None:
            problems += check_correct(case)
            continue
        claims = CLAIMS[case.name](case)
        problems += [f"{case.name}: {what}" for what, ok in claims.items() if not ok]
    return problems
