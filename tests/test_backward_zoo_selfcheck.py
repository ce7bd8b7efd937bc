"""The backward zoo checked without the checker: every entry against torch autograd in float64.

Correct entries match autograd to 1e-10 on every shape they take (self and cross attention, several tiles, a
padding mask, a fully masked row, GQA, causal, dropout, 3-D inputs). Each broken entry differs exactly where its
doc says (the GQA bug only with GQA, the masked-row bug only with a fully masked row, an overwritten accumulator
only with several blocks along its axis, ...) and matches where it should.
"""

from __future__ import annotations

import inspect
import math
import zlib

import numpy as np
import pytest
import torch
from zoo.backward_zoo import BLOCK_K, BLOCK_Q, BROKEN, CORRECT, ENTRIES, LOG2E, kind

TOL = 1e-10


# ---------------------------------------------------------------------------------------------------------------
# cases: float64 NumPy inputs and what the checker would pass


def _case(name, *, B=2, h=2, h_kv=None, n_q=6, n_k=6, d_k=4, d_v=5, mask=None, causal=False, p=0.0, rank=4):
    rng = np.random.default_rng(zlib.crc32(name.encode()))  # not hash(): str hashes change with every process
    h_kv = h if h_kv is None else h_kv
    lead_q, lead_kv = ((B, h), (B, h_kv)) if rank == 4 else ((h,), (h_kv,))
    q = rng.normal(0, 1, (*lead_q, n_q, d_k))
    k = rng.normal(0, 1, (*lead_kv, n_k, d_k))
    v = rng.normal(0, 1, (*lead_kv, n_k, d_v))
    d_out = rng.normal(0, 1, (*lead_q, n_q, d_v))
    m = None
    if mask is not None:
        m = np.ones((*lead_q, n_q, n_k), bool)
        m[1, ..., n_k - 3 :] = False  # padding in batch element 1
        m[0, 1, :, 0] = False  # key 0 hidden from head 1 of batch element 0
        if mask == "row":
            m[0, 0, 2, :] = False  # a fully masked row
    keep = None
    if p:
        keep = rng.random((*lead_q, n_q, n_k)) >= p
    return {"name": name, "q": q, "k": k, "v": v, "d_out": d_out, "mask": m, "causal": causal, "keep": keep, "p": p}


CASES = {
    "self": _case("self"),
    "cross": _case("cross", n_q=5, n_k=7),  # several blocks both ways (4 x 3 tiles)
    "pad": _case("pad", n_q=5, n_k=7, mask="pad"),
    "row": _case("row", n_q=5, n_k=7, mask="row"),
    "gqa": _case("gqa", h=4, h_kv=2, n_q=5, n_k=7),
    "causal": _case("causal", n_q=7, n_k=7, causal=True),
    "dropout": _case("dropout", n_q=5, n_k=7, p=0.3),
    "tiny": _case("tiny", n_q=BLOCK_Q - 1, n_k=BLOCK_K),  # one tile
    "one": _case("one", B=1, h=1, n_q=5, n_k=7),  # one batch element, one head
    "rank3": _case("rank3", h=3, n_q=5, n_k=7, rank=3),
}


def _allowed(c):
    shape = (*c["q"].shape[:-2], c["q"].shape[-2], c["k"].shape[-2])
    allowed = np.ones(shape, bool) if c["mask"] is None else c["mask"].copy()
    if c["causal"]:
        allowed &= np.tril(np.ones(shape[-2:], bool))
    return allowed


def reference(c):
    """(out, lse, dq, dk, dv) from torch autograd in float64 (fully masked rows: zero output, zero gradient)."""
    q, k, v = (torch.tensor(c[x], requires_grad=True) for x in "qkv")
    h = q.shape[-3]
    k_, v_ = (x.repeat_interleave(h // x.shape[-3], dim=-3) for x in (k, v))
    s = q @ k_.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~torch.from_numpy(_allowed(c)), -math.inf)
    m = s.detach().amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    den = e.sum(dim=-1, keepdim=True)
    w = e / torch.where(den > 0, den, torch.ones_like(den))
    lse = torch.where(den > 0, m + torch.log(den), torch.full_like(den, -math.inf))[..., 0]
    if c["keep"] is not None:
        w = w * torch.from_numpy(c["keep"]) / (1 - c["p"])
    out = w @ v_
    (out * torch.from_numpy(c["d_out"])).sum().backward()
    return out.detach().numpy(), lse.detach().numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()


def _params(fn):
    return set(inspect.signature(fn).parameters)


def _keywords(fn, c):
    """The keywords the checker would pass ``fn`` for case ``c``, or None when ``fn`` cannot take the case."""
    names = _params(fn)
    kw = {}
    mask = c["mask"]
    if c["causal"]:
        if "causal" in names:
            kw["causal"] = True
        else:
            mask = _allowed(c)
    if mask is not None:
        kw["mask"] = mask
    if c["keep"] is not None:
        if "dropout_mask" not in names:
            return None
        kw["dropout_mask"], kw["dropout_p"] = c["keep"], c["p"]
    return kw


def run_entry(entry, c, *, dtype=np.float64, inputs=None):
    """The entry's (dq, dk, dv) as NumPy arrays for case ``c`` (None when the entry cannot take the case)."""
    q, k, v, d_out = inputs if inputs is not None else (c[x].astype(dtype) for x in ("q", "k", "v", "d_out"))
    how = kind(entry)
    if how == "autograd":
        kw = _keywords(entry.fn, c)
        if kw is None:
            return None
        kw = {n: torch.from_numpy(np.asarray(x)) if isinstance(x, np.ndarray) else x for n, x in kw.items()}
        leaves = [x if isinstance(x, torch.Tensor) else torch.from_numpy(x) for x in (q, k, v)]
        leaves = [x.requires_grad_(True) for x in leaves]
        out = entry.fn(*leaves, **kw)
        out.backward(torch.from_numpy(np.asarray(d_out)))
        return tuple(x.grad for x in leaves)
    kw = _keywords(entry.fn, c)
    if kw is None:
        return None
    if how == "flash":
        fwd = entry.options.get("forward")
        if fwd is not None:
            out, lse = fwd(q, k, v, **kw)
        else:
            out, lse, *_ = reference(c)
            out = out.astype(q.dtype)
            if entry.options.get("lse_units") == "log2":
                lse = lse * LOG2E
        return entry.fn(q, k, v, out, lse, d_out, **kw)
    if entry.options.get("framework") == "torch":
        tkw = {n: torch.from_numpy(x) if isinstance(x, np.ndarray) else x for n, x in kw.items()}
        return entry.fn(*(torch.from_numpy(x) for x in (q, k, v, d_out)), **tkw)
    return entry.fn(q, k, v, d_out, **kw)


def _np(x):
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def errors(entry, c):
    """max |entry - autograd| for dq, dk, dv (None when the entry cannot take the case)."""
    got = run_entry(entry, c)
    if got is None:
        return None
    _, _, *want = reference(c)
    assert len(got) == 3
    out = {}
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        g = _np(g)
        assert g.shape == w.shape, (name, g.shape, w.shape)
        out[name] = float(np.max(np.abs(g - w))) if np.all(np.isfinite(g)) else math.inf
    return out


# ---------------------------------------------------------------------------------------------------------------
# correct entries: 1e-10 everywhere


@pytest.mark.parametrize("entry", CORRECT, ids=[e.name for e in CORRECT])
def test_correct_entry_matches_autograd_everywhere(entry):
    ran = []
    for name, c in CASES.items():
        err = errors(entry, c)
        if err is None:
            continue
        ran.append(name)
        assert max(err.values()) < TOL, (name, err)
    assert {"self", "cross", "pad", "row", "gqa", "causal", "rank3"} <= set(ran), ran
    if "dropout" in entry.name:
        assert "dropout" in ran


# ---------------------------------------------------------------------------------------------------------------
# broken entries: where they match, and which gradients differ where they do not

# name -> (cases where all three gradients match, {case: gradients that differ (others match)})
# "raises" = the entry raises on that case; "nan" = non-finite gradients there
BEHAVIOUR: dict[str, tuple[tuple[str, ...], dict[str, object]]] = {
    "bwd-np-jacobian-missing": ((), {"self": "dq dk"}),
    "bwd-np-jacobian-diagonal": ((), {"self": "dq dk", "cross": "dq dk"}),
    "bwd-np-dv-weights-unnormalised": ((), {"self": "dv", "cross": "dv"}),
    "bwd-fa2-no-delta": ((), {"cross": "dq dk"}),
    "bwd-torch-jacobian-missing": ((), {"cross": "dq dk"}),
    "bwd-np-delta-rowsum-dp": ((), {"self": "dq dk"}),
    "bwd-np-delta-rowsum-p": ((), {"cross": "dq dk"}),
    "bwd-fa2-delta-rowsum-dp": ((), {"cross": "dq dk"}),
    "bwd-torch-delta-rowsum-p": ((), {"self": "dq dk"}),
    "bwd-np-scale-missing": ((), {"self": "dq dk"}),
    "bwd-fa2-dk-unscaled": ((), {"cross": "dk"}),
    "bwd-torch-scale-twice": ((), {"self": "dq dk"}),
    "bwd-np-dv-transposed": ((), {"self": "dv", "cross": "raises"}),
    "bwd-torch-dk-transposed": ((), {"self": "dk", "cross": "raises"}),
    "bwd-np-dv-unmasked": (("self", "cross"), {"pad": "dv", "causal": "dv"}),
    "bwd-fa2-ignores-mask": (("self", "cross"), {"pad": "dq dk dv", "causal": "dq dk dv"}),
    "bwd-np-naive-softmax": (("self", "pad", "causal"), {"row": "nan"}),
    "bwd-fa2-lse-unguarded": (("self", "pad", "causal"), {"row": "nan"}),
    "bwd-torch-lse-unguarded": (("self", "pad", "causal"), {"row": "nan"}),
    "bwd-np-gqa-first-head": (("self", "cross", "pad", "row"), {"gqa": "dk dv"}),
    "bwd-np-gqa-mean": (("self", "cross", "pad", "row"), {"gqa": "dk dv"}),
    "bwd-fa2-gqa-tile-fold": (("self", "cross", "pad", "row"), {"gqa": "dk dv"}),
    "bwd-torch-gqa-one-head": (("self", "cross", "pad", "row"), {"gqa": "dk dv"}),
    "bwd-fa2-lse-no-max": ((), {"cross": "dq dk dv"}),
    "bwd-fa2-lse-max-only": ((), {"cross": "dq dk dv"}),
    "bwd-fa2-only-dk-assigned": (("tiny",), {"cross": "dk"}),
    "bwd-fa2-recomputes-lse": ((), {"cross": "dq dk dv"}),
    "bwd-fa2-log2-undeclared": ((), {"cross": "dq dk dv"}),
    "bwd-fa2-dk-overwritten": (("tiny",), {"cross": "dk dv"}),
    "bwd-fa2-dq-overwritten": (("tiny",), {"cross": "dq"}),
    "bwd-torch-chunked-dq-overwritten": (("tiny",), {"cross": "dq"}),
    "bwd-np-causal-off-by-one": (("self", "cross", "pad", "row"), {"causal": "dq dk dv"}),
    "bwd-np-causal-flag-not-read": (("causal",), {"self": "dq dk dv", "cross": "dq dk dv", "pad": "dq dk dv"}),
    "bwd-fa2-causal-strict": (("self", "cross", "pad", "row"), {"causal": "dq dk dv"}),
    "bwd-torch-causal-triu0": (("self", "cross", "pad", "row"), {"causal": "dq dk dv"}),
    "bwd-np-dropout-dp-forgotten": (("self", "cross", "pad", "row"), {"dropout": "dq dk"}),
    "bwd-fa2-dropout-dv-undropped": (("self", "cross", "pad", "row"), {"dropout": "dv"}),
    "bwd-torch-dropout-unscaled": (("self", "cross", "pad", "row"), {"dropout": "dq dk dv"}),
    "bwd-np-flattened-dk": (("one",), {"self": "dk"}),
    "bwd-torch-first-batch-k": (("one",), {"self": "dq"}),
    # dtype and mutation entries: right values in float64 (their bug is checked below)
    "bwd-np-numpy-scalar-scale": (("self", "cross", "pad", "row", "gqa"), {}),
    "bwd-fa2-float64-accumulators": (("self", "cross", "pad", "row", "gqa", "causal"), {}),
    "bwd-torch-default-dtype": ((), {}),
    "bwd-np-scales-q-in-place": (("self", "cross", "pad", "row", "gqa"), {}),
    "bwd-fa2-lse-in-place": (("self", "cross", "pad", "row", "gqa", "causal"), {}),
    "bwd-torch-scales-saved-q": (("self", "cross", "pad", "row", "gqa"), {}),
}


def test_every_entry_is_described_and_the_zoo_covers_every_backward_code():
    assert {e.name for e in BROKEN} == set(BEHAVIOUR)
    assert len({e.name for e in ENTRIES}) == len(ENTRIES)
    assert len(BROKEN) >= 18
    codes = {
        "grad-jacobian",
        "grad-delta",
        "grad-scale",
        "grad-transposed",
        "grad-masked-leak",
        "grad-masked-row",
        "grad-gqa-sum",
        "grad-lse",
        "grad-accumulate",
        "grad-causal",
        "grad-dropout",
        "grad-batch-leak",
        "dtype",
        "mutates-input",
    }
    count = {c: sum(c in e.expected for e in BROKEN) for c in codes}
    assert all(n >= 2 for n in count.values()), count
    assert {kind(e) for e in BROKEN} == {"plain", "flash", "autograd"}
    for e in ENTRIES:
        assert e.doc, e.name
        assert len(e.expected) <= 1


@pytest.mark.parametrize("entry", BROKEN, ids=[e.name for e in BROKEN])
def test_broken_entry_differs_where_its_doc_says(entry):
    same, differs = BEHAVIOUR[entry.name]
    for name in same:
        err = errors(entry, CASES[name])
        assert err is not None and max(err.values()) < TOL, (name, err)
    for name, how in differs.items():
        c = CASES[name]
        if how == "raises":
            with pytest.raises((ValueError, RuntimeError)):
                run_entry(entry, c)
            continue
        err = errors(entry, c)
        assert err is not None, name
        if how == "nan":
            assert math.inf in err.values(), (name, err)
            continue
        wrong = set(how.split())
        for g, e in err.items():
            if g in wrong:
                assert e > 1e-3, (name, g, err)
            else:
                assert e < TOL, (name, g, err)


# ---------------------------------------------------------------------------------------------------------------
# the non-numerical bugs


def _entry(name):
    return next(e for e in ENTRIES if e.name == name)


@pytest.mark.parametrize("name", ["bwd-np-numpy-scalar-scale", "bwd-fa2-float64-accumulators"])
def test_numpy_dtype_entries_return_float64_for_float32(name):
    entry = _entry(name)
    for c in (CASES["self"], CASES["pad"]):
        got = run_entry(entry, c, dtype=np.float32)
        assert {g.dtype for g in got} == {np.dtype(np.float64)}
        _, _, *want = reference(c)
        assert max(float(np.max(np.abs(g - w))) for g, w in zip(got, want, strict=True)) < 1e-4
    correct = run_entry(_entry("bwd-np-analytic"), CASES["self"], dtype=np.float32)
    assert {g.dtype for g in correct} == {np.dtype(np.float32)}


def test_torch_default_dtype_entry_returns_float32_for_float64_and_float16():
    entry = _entry("bwd-torch-default-dtype")
    c = CASES["pad"]
    _, _, *want = reference(c)
    got = run_entry(entry, c)
    assert {g.dtype for g in got} == {torch.float32}
    assert max(float(np.max(np.abs(g.numpy() - w))) for g, w in zip(got, want, strict=True)) < 1e-5
    assert {g.dtype for g in run_entry(entry, c, dtype=np.float16)} == {torch.float32}
    assert {g.dtype for g in run_entry(entry, c, dtype=np.float32)} == {torch.float32}


def test_mutation_entries_change_the_callers_arrays_and_correct_ones_do_not():
    c = CASES["pad"]
    # NumPy plain: q scaled in place
    q, k, v, d_out = (c[x].copy() for x in ("q", "k", "v", "d_out"))
    run_entry(_entry("bwd-np-scales-q-in-place"), c, inputs=(q, k, v, d_out))
    np.testing.assert_allclose(q, c["q"] / 2)  # d_k = 4
    # flash: the golden lse converted to log2 in place
    entry = _entry("bwd-fa2-lse-in-place")
    kw = _keywords(entry.fn, c)
    out, lse, *_ = reference(c)  # the golden out and lse, as the checker passes them
    before = lse.copy()
    entry.fn(c["q"], c["k"], c["v"], out, lse, c["d_out"], **kw)
    finite = np.isfinite(before)
    np.testing.assert_allclose(lse[finite], before[finite] * LOG2E)
    # torch Function: the saved q scaled in place during backward
    q = torch.from_numpy(c["q"].copy()).requires_grad_(True)
    k, v = (torch.from_numpy(c[x]).requires_grad_(True) for x in "kv")
    out = _entry("bwd-torch-scales-saved-q").fn(q, k, v, mask=torch.from_numpy(c["mask"]))
    np.testing.assert_array_equal(q.detach().numpy(), c["q"])  # forward leaves it alone
    out.backward(torch.from_numpy(c["d_out"]))
    np.testing.assert_allclose(q.detach().numpy(), c["q"] / 2)
    # correct entries leave every argument alone
    for entry in CORRECT:
        if kind(entry) == "autograd":
            continue
        args = tuple(c[x].copy() for x in ("q", "k", "v", "d_out"))
        run_entry(entry, c, inputs=args)
        for a, name in zip(args, ("q", "k", "v", "d_out"), strict=True):
            np.testing.assert_array_equal(a, c[name])


def test_masked_leak_entries_leak_only_into_masked_keys():
    c = CASES["pad"]
    _, _, *want = reference(c)
    dv = _np(run_entry(_entry("bwd-np-dv-unmasked"), c)[2])
    hidden = ~c["mask"].any(axis=-2)  # [B, h, n_k]: keys no query of that head may see
    assert np.all(np.abs(want[2][hidden]) == 0)
    assert np.all(np.abs(dv[hidden]) > 1e-3)
