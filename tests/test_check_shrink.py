"""Shrinking a failure to its smallest case, what it depends on, its reproduction, and the evidence for a scale or
a precision: on small buggy NumPy implementations written here (each a bug class, not a zoo entry)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from attnlab import masks
from attnlab.checker.adapters import round_to
from attnlab.checker.depends import allowed_of, depends
from attnlab.checker.evidence import fit_scale, precision
from attnlab.checker.reproduction import CallWords, reproduction, target_code
from attnlab.checker.runner import Case
from attnlab.checker.shrink import form_valid, shrink
from attnlab.checker.tolerance import bound, golden_output, naive_output

pytestmark = pytest.mark.xdist_group("test_check_shrink")

# ---------------------------------------------------------------------------------------------------------------
# buggy implementations: fn(q [B, h, n_q, d_k], k, v, mask=None, causal=None)


def _attend(q, k, v, allowed, scale=None):
    s = (q @ np.swapaxes(k, -1, -2)) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    s = np.where(allowed, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    d = e.sum(axis=-1, keepdims=True)
    return np.divide(e, d, out=np.zeros_like(e), where=d > 0) @ v


def _allowed(q, k, mask, causal, extra=0):
    n_q, n_k = q.shape[-2], k.shape[-2]
    a = np.ones((*q.shape[:-2], n_q, n_k), bool) if mask is None else np.asarray(mask, bool)
    if causal:
        shift = n_k - n_q if causal == "bottom_right" else 0
        a = a & (np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + shift + extra)
    return a


def leaks_when_rectangular(q, k, v, mask=None, causal=None):
    """Causal: each query sees one key of its future, but only when n_q != n_k."""
    extra = 1 if q.shape[-2] != k.shape[-2] else 0
    return _attend(q, k, v, _allowed(q, k, mask, causal, extra))


def drops_last_key(q, k, v, mask=None, causal=None):
    """Never attends to the last key."""
    a = _allowed(q, k, mask, causal).copy()
    a[..., -1] = False
    return _attend(q, k, v, a)


def head1_unscaled(q, k, v, mask=None, causal=None):
    """Head 1 forgets the scale."""
    out = _attend(q, k, v, _allowed(q, k, mask, causal))
    if q.shape[-3] > 1:
        out[..., 1, :, :] = _attend(q[..., 1:2, :, :], k[..., 1:2, :, :], v[..., 1:2, :, :], True, 1.0)[..., 0, :, :]
    return out


def half_scale(q, k, v, mask=None, causal=None):
    """Scales by 0.5/sqrt(d_k)."""
    return _attend(q, k, v, _allowed(q, k, mask, causal), 0.5 / math.sqrt(q.shape[-1]))


def weights_bf16(q, k, v, mask=None, causal=None):
    """Rounds the weights to bfloat16 before @ V."""
    a = _allowed(q, k, mask, causal)
    w = _attend(q, k, np.broadcast_to(np.eye(k.shape[-2]), (*k.shape[:-1], k.shape[-2])), a)
    return round_to(w, "bfloat16").astype(np.float64) @ v


def slightly_scaled(q, k, v, mask=None, causal=None):
    """Scales by 1.002/sqrt(d_k): a 0.2 % scale error."""
    return _attend(q, k, v, _allowed(q, k, mask, causal), 1.002 / math.sqrt(q.shape[-1]))


_CACHE: dict = {}


def stale_cache(q, k, v, mask=None, causal=None):
    """Caches K by shape: a later call of a shape it has seen uses the first call's K."""
    k = _CACHE.setdefault(k.shape, k)
    return _attend(q, k, v, _allowed(q, k, mask, causal))


# ---------------------------------------------------------------------------------------------------------------
# the predicate: call fn on the canonical case, compare with the reference under the tolerance rule


def _tol(case):
    allowed = allowed_of(case)
    golden = golden_output(case.q, case.k, case.v, allowed, scale=case.scale)
    naive = naive_output(case.q, case.k, case.v, allowed, dtype=case.dtype, scale=case.scale)
    return golden, bound(case.dtype, golden, naive), allowed.any(axis=-1)


def _out(fn, case):
    return fn(case.q.copy(), case.k.copy(), case.v.copy(), mask=case.mask, causal=case.causal)


def predicate(fn):
    def fails(case):
        golden, tol, rows = _tol(case)
        out = _out(fn, case)
        if out.shape != golden.shape:
            return True
        d = np.abs(out - golden)[np.broadcast_to(rows[..., None], out.shape)]
        return bool(d.size) and not bool(np.all(d <= tol))

    return fails


def _case(seed=0, *, b=2, h=3, n_q=5, n_k=7, d=4, mask=True, causal=None, std=1.0):
    rng = np.random.default_rng(seed)
    q = rng.normal(0, std, (b, h, n_q, d))
    k = rng.normal(0, std, (b, h, n_k, d))
    v = rng.normal(0, 1, (b, h, n_k, d))
    m = None
    if mask:
        m = rng.random((b, h, n_q, n_k)) < 0.8
        m[..., 0] = True
    return Case(q, k, v, mask=m, causal=causal)


def _removals(case):
    """Every case with one batch element, head, query or key removed."""
    out = []
    for axis, n in ((0, case.q.shape[0]), (1, case.q.shape[1])):
        for i in range(n if n > 1 else 0):
            keep = [j for j in range(n) if j != i]
            out.append(
                replace(
                    case,
                    q=case.q.take(keep, axis),
                    k=case.k.take(keep, axis),
                    v=case.v.take(keep, axis),
                    mask=None if case.mask is None else case.mask.take(keep, axis),
                )
            )
    for i in range(case.q.shape[-2] if case.q.shape[-2] > 1 else 0):
        keep = [j for j in range(case.q.shape[-2]) if j != i]
        out.append(replace(case, q=case.q.take(keep, -2), mask=None if case.mask is None else case.mask.take(keep, -2)))
    for i in range(case.k.shape[-2] if case.k.shape[-2] > 1 else 0):
        keep = [j for j in range(case.k.shape[-2]) if j != i]
        out.append(
            replace(
                case,
                k=case.k.take(keep, -2),
                v=case.v.take(keep, -2),
                mask=None if case.mask is None else case.mask.take(keep, -1),
            )
        )
    return out


def _words(fn):
    return CallWords(target=target_code(fn), mask_arg="mask", causal_arg="causal")


def _repro(fn, case, **kw):
    _, tol, _ = _tol(case)
    return reproduction(case, _words(fn), tol=tol, flag=case.causal or False, **kw)


# ---------------------------------------------------------------------------------------------------------------
# the tests

SHRUNK_CASES = {
    "leak": (leaks_when_rectangular, _case(1, causal="bottom_right")),
    "drop": (drops_last_key, _case(2)),
    "head": (head1_unscaled, _case(3, mask=False)),
    "scale": (half_scale, _case(4)),
}


@pytest.fixture(scope="module")
def shrunk():
    return {name: shrink(case, predicate(fn)) for name, (fn, case) in SHRUNK_CASES.items()}


@pytest.mark.parametrize("name", list(SHRUNK_CASES))
def test_shrunk_case_fails_and_is_minimal(shrunk, name):
    fn, original = SHRUNK_CASES[name]
    s = shrunk[name]
    fails = predicate(fn)
    assert s.failed and not s.bounded and s.calls <= 300
    assert fails(s.case)
    assert s.case.q.size < original.q.size
    smaller = _removals(s.case)
    assert all(not fails(c) for c in smaller), [c.shapes() for c in smaller if fails(c)]


def test_leak_needs_a_rectangular_causal_case(shrunk):
    s = shrunk["leak"]
    c = s.case
    assert c.causal == "bottom_right" and (c.q.shape[-2], c.k.shape[-2]) == (2, 3)
    assert c.q.shape[:2] == (1, 1) and c.mask is None  # no batch, head or mask needed
    fn = leaks_when_rectangular
    d = depends(s, predicate(fn), out=_out(fn, c))
    assert "the causal rule (bottom-right)" in d.needs
    assert any(n.startswith("n_q != n_k") for n in d.needs), d.text
    assert d.rows == (0,)  # only the first query has a future key
    assert any("off by one" in k for k in d.keys), d.text


def test_dropped_key_is_named_by_the_key_story(shrunk):
    s = shrunk["drop"]
    fn = drops_last_key
    d = depends(s, predicate(fn), out=_out(fn, s.case))
    last = s.case.k.shape[-2] - 1
    assert f"the output is the reference with key {last} ignored" in d.keys, d.text
    assert "the dtype (fails in float32 too)" in d.independent


def test_wrong_head_is_named(shrunk):
    s = shrunk["head"]
    fn = head1_unscaled
    assert s.case.q.shape[1] == 2  # head 1 needs a head 0 before it
    d = depends(s, predicate(fn), out=_out(fn, s.case))
    assert d.heads == (1,), d.text
    assert "more than one head" in d.needs
    assert "head 1 of 2" in d.text


def test_reproductions_fail_with_an_assertion(shrunk):
    for name, (fn, _) in SHRUNK_CASES.items():
        text = _repro(fn, shrunk[name].case)
        with pytest.raises(AssertionError, match=r"max \|out - expected\|"):
            exec(compile(text, f"<repro {name}>", "exec"), {})


def test_reproduction_runs_on_its_own_and_draws_the_mask(shrunk, tmp_path):
    fn, original = SHRUNK_CASES["drop"]
    text = _repro(fn, original)  # the unshrunk case: a mask that differs per batch element and head
    assert "■" in text and "allowed[1, 2]:" in text
    script = tmp_path / "repro.py"
    script.write_text(text, encoding="utf-8")
    here = Path(__file__).parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here), str(here.parent / "src")]))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1 and "AssertionError: max |out - expected|" in r.stderr, r.stderr


def test_a_correct_function_gives_a_passing_reproduction():
    case = _case(5, causal="top_left", n_q=4, n_k=4)
    text = _repro(leaks_when_rectangular, case)  # square: the leak does not show
    exec(compile(text, "<repro>", "exec"), {})


def test_stateful_cache_depends_on_call_order():
    fn = stale_cache
    case = _case(6, b=1, h=1, n_q=3, n_k=4, mask=False)
    _CACHE.clear()
    fn(case.q, case.k[..., ::-1, :].copy(), case.v)  # an earlier call of the same shape
    s = shrink(case, predicate(fn))
    assert s.failed
    d = depends(s, predicate(fn), out=_out(fn, s.case))
    assert any("an earlier call of the same shape" in n for n in d.needs), d.text
    _CACHE.clear()
    text = _repro(fn, s.case, earlier_call=True)
    with pytest.raises(AssertionError):
        exec(compile(text, "<repro stale>", "exec"), {})


def test_a_crash_is_shrunk_only_as_a_crash():
    def crashes_on_three_keys(case):
        if case.k.shape[-2] >= 3:
            raise IndexError("boom")
        return False

    s = shrink(_case(7, mask=False), crashes_on_three_keys)
    assert s.crash and s.case.k.shape[-2] == 3 and s.case.q.shape[:3] == (1, 1, 1)
    # a predicate that fails on 5 keys or more and raises below: the raise counts as passing
    s = shrink(_case(7, mask=False), lambda c: c.k.shape[-2] >= 5 or 1 / 0)
    assert not s.crash and s.case.k.shape[-2] == 5


def test_bounds_stop_the_search():
    s = shrink(_case(8), lambda c: True, max_calls=10)
    assert s.bounded and s.calls == 10
    s = shrink(_case(8), lambda c: False)
    assert not s.failed and s.calls == 1 and s.case.q.shape == (2, 3, 5, 4)


def test_gqa_heads_are_removed_with_their_group():
    rng = np.random.default_rng(9)
    q, k, v = rng.normal(size=(1, 6, 3, 2)), rng.normal(size=(1, 3, 4, 2)), rng.normal(size=(1, 3, 4, 2))
    seen = []

    def fails(c):
        seen.append((c.q.shape[1], c.k.shape[1]))
        return c.q.shape[1] >= 2

    s = shrink(Case(q, k, v), fails)
    assert all(h % h_kv == 0 for h, h_kv in seen)
    assert (s.case.q.shape[1], s.case.k.shape[1]) in ((2, 1), (2, 2))


def test_mask_simplified_within_its_form():
    case = _case(10, b=2, h=2, n_q=3, n_k=5)
    kp = masks.key_padding(np.array([5, 2]), 5)  # [B, 1, 1, n_k]
    case = replace(case, mask=np.broadcast_to(kp, case.mask.shape).copy())
    valid = form_valid("valid_lens")
    seen = []

    def fails(c):
        if c.mask is not None:
            seen.append(valid(c.mask))
        return c.mask is not None and not c.mask.all() and c.mask.any()  # "fails" while a key is blocked, one not

    s = shrink(case, fails, valid=valid)
    assert all(seen)
    assert s.case.mask is not None and s.case.mask.shape[-1] == 2 and s.case.mask.sum() == 1


def test_fit_scale_finds_the_value_and_the_formula():
    case = _case(11, mask=False, d=8)
    fit = fit_scale(case, half_scale(case.q, case.k, case.v))
    assert fit.fits and fit.formula == "1/(2 sqrt(d_k))" and abs(fit.scale - 0.5 / math.sqrt(8)) < 1e-9
    fit = fit_scale(case, slightly_scaled(case.q, case.k, case.v))
    assert fit.fits and fit.formula == "" and abs(fit.scale / (1 / math.sqrt(8)) - 1.002) < 1e-6
    assert "matches no formula" in fit.text
    fit = fit_scale(case, drops_last_key(case.q, case.k, case.v))
    assert not fit.fits


def test_precision_names_the_dtype_only_when_the_pattern_fits():
    case = _case(12, b=1, h=2, n_q=16, n_k=64, mask=False, d=8)
    p = precision(case, weights_bf16(case.q, case.k, case.v))
    assert p.dtype == "bfloat16" and p.explained > 0.9, p.text
    # errors of bfloat16's size that are not rounding: a key dropped among 128, a 0.2 % scale error (outputs near 3)
    case = _case(13, b=1, h=2, n_q=8, n_k=128, mask=False, d=8)
    case = replace(case, v=case.v + 3.0)
    for fn, why in ((drops_last_key, "key 127 ignored explains it"), (slightly_scaled, "× the expected) explains")):
        p = precision(case, fn(case.q, case.k, case.v))
        assert p.dtype == "" and "bfloat16: error" in p.text and why in p.text, (fn.__name__, p.text)
        assert 1 / 16 <= float(p.text.split("bfloat16: error ")[1].split(" ")[0]) <= 4, p.text  # the right size


def test_a_check_report_shows_the_smallest_case_in_text_and_json():
    import json

    import jsonschema

    from attnlab.checker import check
    from attnlab.schemas import schema

    report = check(drops_last_key, probes=("reference",))
    f = report.findings[0]
    m = f.minimal
    assert m is not None and m.shrunk and m.case.k.shape[-2] <= 2, report.to_text()
    text = report.to_text()
    assert "smallest case: q (1, 1, 1, " in text and "  reproduction:" in text and "  depends: " in text
    doc = json.loads(report.to_json())
    jsonschema.validate(doc, schema(doc["schema"]))
    assert doc["findings"][0]["minimal"]["reproduction"] == m.reproduction
    with pytest.raises(AssertionError, match=r"max \|out - expected\|"):
        exec(compile(m.reproduction, "<report reproduction>", "exec"), {})
