"""The backward zoo through the checker (issue 14): every broken backward named by its code, every correct one clean.

Entry points as documented in docs/checker.md ("Backward"), chosen by :func:`zoo.backward_zoo.run_check`:
``attnlab.check(fn, backward=True, ...)`` for torch forwards, ``attnlab.check_backward(bwd, forward=..., ...)``
for hand-written backward passes (plain and flash signatures).
"""

from __future__ import annotations

import functools

import pytest
from zoo import assert_findings_minimal
from zoo.backward_zoo import BROKEN, CORRECT, ENTRIES, fa2_backward, fa2_forward, np_jacobian_missing, run_check

import attnlab
from attnlab.checker import CODES

BACKWARD_CODES = (
    "grad-mismatch",
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
)


def test_every_backward_code_is_registered():
    """Each code has a meaning (in the forward's CODES or the backward's own registry) and a fix line."""
    from attnlab.checker import gradient_oracle as grad

    known = {**CODES, **getattr(grad, "BACKWARD_CODES", {})}
    for code in (*BACKWARD_CODES, "dtype", "mutates-input", "crash", "timeout", "output-type"):
        assert known.get(code), code


def _params(entries):
    """Each entry in an xdist group of its own: its report is made once per worker and read by every test."""
    return [pytest.param(e, id=e.name, marks=pytest.mark.xdist_group(f"bwd-zoo-{e.name}")) for e in entries]


@functools.cache
def _report(name):
    return run_check(next(e for e in ENTRIES if e.name == name))


@pytest.mark.parametrize("entry", _params(ENTRIES))
def test_backward_zoo_entry_is_diagnosed_by_its_code(entry):
    report = _report(entry.name)
    codes = set(report.codes)
    text = report.to_text()
    assert set(entry.expected) <= codes, text
    assert codes <= set(entry.expected) | set(entry.also), text
    assert report.ok == (not entry.expected), text
    for f in report.findings:
        assert f.message and f.evidence and f.fix, f
        assert f.severity == "bug"


def test_zoo_covers_every_named_backward_code():
    covered = {c for e in BROKEN for c in e.expected}
    named = set(BACKWARD_CODES) - {"grad-mismatch"} | {"dtype", "mutates-input"}
    assert named <= covered, named - covered
    assert len(BROKEN) >= 18 and len(CORRECT) >= 10


def test_check_with_a_backward_callable_names_the_bug():
    """``attnlab.check(fwd, backward=bwd)``: the forward battery and the hand-written backward together."""
    report = attnlab.check(fa2_forward, backward=fa2_backward)
    assert report.ok, report.to_text()


def test_check_backward_without_forward_uses_the_golden_lse():
    report = attnlab.check_backward(fa2_backward)
    assert report.ok, report.to_text()
    report = attnlab.check_backward(fa2_backward, lse_units="log2")
    assert "grad-lse" in report.codes, report.to_text()


def test_assert_attention_grads_correct_raises_on_a_broken_backward():
    from attnlab.testing import assert_attention_grads_correct

    assert_attention_grads_correct(CORRECT[0].fn)
    with pytest.raises(AssertionError, match="grad-jacobian"):
        assert_attention_grads_correct(np_jacobian_missing)


@pytest.mark.parametrize("entry", _params(BROKEN))
def test_backward_zoo_findings_are_shrunk_to_a_minimal_case_with_a_reproduction(entry):
    """Issue 20 §3 for gradients: every finding of a broken backward carries its smallest failing case; its printed
    reproduction, run on its own, fails; removing any batch element, head, query or key makes it pass."""
    assert_findings_minimal(_report(entry.name), entry.fn)
