"""The bug zoo: every broken implementation is diagnosed by its code, every correct one comes out clean."""

from __future__ import annotations

import functools
import textwrap

import numpy as np
import pytest
from zoo import all_entries, one_step_smaller

from attnlab import attention_trace
from attnlab.checker import CODES, check

ENTRIES = all_entries()
BROKEN = [e for e in ENTRIES if e.expected]
CORRECT = [e for e in ENTRIES if not e.expected]


def _params(entries):
    """Each entry in an xdist group of its own: its report is made once per worker and read by every test."""
    return [pytest.param(e, id=e.name, marks=pytest.mark.xdist_group(f"zoo-{e.name}")) for e in entries]


@functools.cache
def _report(name):
    entry = next(e for e in ENTRIES if e.name == name)
    return check(entry.fn, **entry.options)


@pytest.mark.parametrize("entry", _params(ENTRIES))
def test_zoo_entry_is_diagnosed_by_its_code(entry):
    report = _report(entry.name)
    codes = set(report.codes)
    assert set(entry.expected) <= codes, report.to_text()
    assert codes <= set(entry.expected) | set(entry.also), report.to_text()
    assert report.ok == (not entry.expected)
    for f in report.findings:
        assert f.message and f.evidence and f.fix
        assert f.severity == "bug"


def test_zoo_is_big_enough_and_covers_every_code():
    assert len(BROKEN) >= 20
    assert len(CORRECT) >= 5
    assert sum(e.name.startswith("np-") for e in BROKEN) >= 10
    assert sum(e.name.startswith("torch-") for e in BROKEN) >= 5
    covered = {c for e in BROKEN for c in e.expected}
    assert covered == set(CODES), set(CODES) - covered
    assert sum(e.subtle for e in BROKEN) >= 8


def _smoke(fn, framework):
    """A naive smoke test: one head, no mask, small logits, float64, a few keys."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(0, 0.5, (1, 1, 4, 8)) for _ in range(3))
    expected = attention_trace(q, k, v).output
    args = (q, k, v)
    if framework == "torch":
        import torch

        args = tuple(torch.from_numpy(x.copy()) for x in args)
    out = fn(*args)
    out = out[0] if isinstance(out, tuple) else out
    out = out.numpy() if hasattr(out, "numpy") else np.asarray(out)
    return np.allclose(out, expected, atol=1e-6)


@pytest.mark.parametrize("entry", [e for e in BROKEN if e.subtle], ids=[e.name for e in BROKEN if e.subtle])
def test_subtle_bugs_pass_a_naive_smoke_test(entry):
    framework = "torch" if entry.name.startswith("torch") else "numpy"
    if entry.options.get("layout") == "bnhd":
        fn = entry.fn

        def transposed(q, k, v):
            out = fn(*(x.transpose(1, 2) if framework == "torch" else np.swapaxes(x, 1, 2) for x in (q, k, v)))
            return out.transpose(1, 2) if framework == "torch" else np.swapaxes(out, 1, 2)

        assert _smoke(transposed, framework)
    else:
        assert _smoke(entry.fn, framework)


def test_reduced_battery_still_names_the_bug():
    from zoo.numpy_zoo import mask_inverted, scale_missing

    assert check(scale_missing, probes=("reference",)).codes == ("scale-missing",)
    assert check(mask_inverted, probes=("reference",)).codes == ("mask-inverted",)


def _fails(text):
    """The AssertionError message of a reproduction script run on its own (in a fresh namespace), or None."""
    try:
        exec(compile(text, "<reproduction>", "exec"), {})
    except AssertionError as err:
        return str(err) or "AssertionError"
    return None


def _same_way(message, first):
    """Whether a failure message is the same kind of failure as ``first`` (the same exception raised, or a wrong
    output, or the same property)."""
    if message is None:
        return False
    if first.startswith("fn raised"):
        return message.split(":")[0] == first.split(":")[0]
    if first.startswith(("max |out - expected|", "output shape")):
        return message.startswith(("max |out - expected|", "output shape"))
    return message.split(" ")[:2] == first.split(" ")[:2]


@pytest.mark.parametrize("entry", _params(BROKEN))
def test_broken_entry_is_shrunk_to_a_minimal_case_with_a_reproduction(entry):
    """Acceptance (issue 20 §3): every finding of a broken entry carries its smallest failing case; its printed
    reproduction, run on its own, fails; removing any batch element, head, query or key makes it pass."""
    report = _report(entry.name)
    for f in report.findings:
        m = f.minimal
        if f.code == "timeout":  # a hanging call is not shrunk (each call may take the whole time limit)
            assert m is not None and not m.shrunk and "time limit" in m.reason
            continue
        if f.code == "mod-mismatch":  # about a declared mod, not a call: its evidence is the smallest geometry
            assert m is None and f.evidence.startswith("geometry B, h, n_q, n_k = ")
            continue
        assert m is not None and m.shrunk and not m.bounded, (f.code, report.to_text())
        assert textwrap.indent(m.reproduction, "    ").rstrip() in report.to_text()
        assert m.as_dict()["reproduction"] == m.reproduction
        first = _fails(m.reproduction) or _fails(m.reproduction) or _fails(m.reproduction)  # noise: up to 3 tries
        assert first is not None, (f.code, m.reproduction)
        if f.code == "nondeterministic":  # a smaller case may agree twice by chance: minimality is not testable
            continue
        for smaller in one_step_smaller(m.case, m.gqa):
            message = _fails(m.script(smaller))
            assert not _same_way(message, first), (f.code, smaller.shapes(), first, message)
