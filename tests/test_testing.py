"""attnlab.testing: assert_attention_close (the FlashAttention/PyTorch tolerance rule), assert_attention_correct."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from zoo import numpy_zoo as npz

from attnlab import scaled_dot_product_attention as sdpa
from attnlab.testing import assert_attention_close, assert_attention_correct, assert_grads_close


def _inputs(dtype, seed=0, shape=(2, 3, 17, 8)):
    rng = np.random.default_rng(seed)
    return [torch.from_numpy(rng.normal(0, 1, shape)).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_torch_sdpa_passes_the_rule_against_a_float64_golden(dtype):
    q, k, v = _inputs(dtype)
    golden = sdpa(*(x.double() for x in (q, k, v)))
    with sdpa_kernel(SDPBackend.MATH):  # the same-precision reference: math backend, no upcast
        reference = F.scaled_dot_product_attention(q, k, v)
    assert_attention_close(F.scaled_dot_product_attention(q, k, v), golden, reference=reference)


def test_an_error_beyond_the_rule_is_named_with_position_and_bound():
    q, k, v = _inputs(torch.float16)
    golden = sdpa(*(x.double() for x in (q, k, v)))
    reference = F.scaled_dot_product_attention(q, k, v)
    bad = reference.clone()
    bad[1, 2, 5, 3] += 0.5
    with pytest.raises(
        AssertionError,
        match=r"output: max \|actual - expected\| = 0\.5\d* at \(1, 2, 5, 3\) "
        r"exceeds the tolerance .* \(float16: 2 x reference error .* \+ floor 0\.001 x",
    ):
        assert_attention_close(bad, golden, reference=reference)


def test_factor_and_floor_are_honoured():
    expected = np.zeros((2, 3))
    actual = np.full((2, 3), 3e-5)
    reference = np.full((2, 3), 1e-5)
    assert_attention_close(actual, expected, reference=reference, dtype="float32", factor=2.0)  # 2e-5 + 1e-5
    with pytest.raises(AssertionError):
        assert_attention_close(actual, expected, reference=reference, dtype="float32", factor=1.0)
    assert_attention_close(actual, expected, dtype="float32", floor=1e-4)


def test_shape_and_nan_are_refused():
    with pytest.raises(AssertionError, match=r"output: shape \(2, 3\) does not match expected \(3, 2\)"):
        assert_attention_close(np.zeros((2, 3)), np.zeros((3, 2)))
    a = np.zeros((2, 3))
    a[1, 2] = np.nan
    with pytest.raises(AssertionError, match=r"1 non-finite value\(s\) where expected is finite, first at \(1, 2\)"):
        assert_attention_close(a, np.zeros((2, 3)))


def test_inputs_are_not_modified():
    actual, expected = np.ones((2, 2), np.float32), np.ones((2, 2))
    before = actual.copy(), expected.copy()
    assert_attention_close(actual, expected)
    np.testing.assert_array_equal(actual, before[0])
    np.testing.assert_array_equal(expected, before[1])


def test_assert_attention_correct_passes_clean_and_fails_with_the_report():
    report = assert_attention_correct(npz.correct)
    assert report.ok
    with pytest.raises(AssertionError, match="1 bug found: softmax-axis") as info:
        assert_attention_correct(npz.softmax_axis, probes=("reference",))
    assert "fix: take the softmax over the last axis" in str(info.value)


def test_assert_attention_correct_fails_an_incomplete_battery():
    with pytest.raises(AssertionError, match="no bug found, but not run: causal, padding, masked-rows"):
        assert_attention_correct(npz.correct, probes=("reference",))


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("floor", float("nan"), r"^floor: expected a finite number >= 0, got nan$"),
        ("floor", float("inf"), r"^floor: expected a finite number >= 0, got inf$"),
        ("floor", -1e-5, r"^floor: expected a finite number >= 0, got -1e-05$"),
        ("factor", float("inf"), r"^factor: expected a finite number >= 0, got inf$"),
        ("factor", float("nan"), r"^factor: expected a finite number >= 0, got nan$"),
        ("factor", -2.0, r"^factor: expected a finite number >= 0, got -2.0$"),
        ("factor", "2", r"^factor: expected a finite number >= 0, got '2'$"),
        ("dtype", "float8", r"^dtype: expected one of 'float64', 'float32', 'float16', 'bfloat16', got 'float8'$"),
    ],
)
def test_options_that_would_pass_anything_are_refused(option, value, message):
    """issue 23.6: floor=nan or factor=inf made every comparison pass; such bounds are an OptionError."""
    from attnlab.errors import OptionError

    far_off = np.full((2, 3), 1e6)
    with pytest.raises(OptionError, match=message):
        assert_attention_close(far_off, np.zeros((2, 3)), reference=np.zeros((2, 3)), **{option: value})
    grads = (np.zeros(3), np.zeros(3), np.zeros(3))
    with pytest.raises(OptionError, match=message):
        assert_grads_close(grads, grads, **{option: value})


@pytest.mark.parametrize("which", ["actual", "expected", "reference"])
def test_complex_arrays_are_refused(which):
    """issue 23.6: the imaginary part used to be dropped (1+5j compared equal to 1)."""
    from attnlab.errors import DTypeError

    arrays = {"actual": np.ones((2, 3)), "expected": np.ones((2, 3)), "reference": np.ones((2, 3))}
    arrays[which] = arrays[which] + 5j
    name = "output" if which == "actual" else which
    with pytest.raises(DTypeError, match=rf"^{name}: complex dtype complex128 \(shape \(2, 3\)\); attention outputs"):
        assert_attention_close(arrays["actual"], arrays["expected"], reference=arrays["reference"])
    with pytest.raises(DTypeError, match=r"^output: complex dtype complex64"):
        assert_attention_close(torch.ones(2, 3, dtype=torch.complex64), np.ones((2, 3)))


def test_zero_factor_and_floor_are_a_strict_bound():
    assert_attention_close(np.ones(3), np.ones(3), factor=0, floor=0.0)
    with pytest.raises(AssertionError, match="exceeds the tolerance 0"):
        assert_attention_close(np.ones(3) + 1e-12, np.ones(3), factor=0, floor=0.0)


FAILING_TESTS = """
import numpy as np
from attnlab.testing import (
    assert_attention_close, assert_attention_correct, assert_attention_grads_correct, assert_grads_close,
)

def wrong_scale(q, k, v, mask=None):
    s = q @ np.swapaxes(k, -1, -2)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True) @ v

def bwd_no_scale(q, k, v, d_out, mask=None):
    return np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)

def test_close():
    assert_attention_close(np.ones((2, 2)) + 0.5, np.ones((2, 2)))

def test_grads_close():
    assert_grads_close((np.ones(2), np.ones(2) + 1, np.ones(2)), (np.ones(2),) * 3)

def test_bad_floor():
    assert_attention_close(np.ones(2), np.ones(2), floor=float("nan"))

def test_complex():
    assert_attention_close(np.ones(2) + 1j, np.ones(2))

def test_correct():
    assert_attention_correct(wrong_scale, probes=("reference", "normalization"))

def test_grads_correct():
    assert_attention_grads_correct(bwd_no_scale, probes=("grad-reference",))

def test_usage_error():
    assert_attention_grads_correct(bwd_no_scale, probes=("reference",))
"""


def test_a_failing_helper_shows_the_message_not_attnlabs_source(tmp_path):
    """The helpers hide their frames (``__tracebackhide__``, as pytest's own helpers do): a failure shows the line of
    the user's test and the message, and no line of attnlab's source (it used to print ~25)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    import attnlab

    (tmp_path / "test_mine.py").write_text(FAILING_TESTS)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_mine.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    text = out.stdout + out.stderr
    assert "7 failed" in text, text[-3000:]
    for message in (
        "AssertionError: output: max |actual - expected| = 0.5 at (0, 0) exceeds the tolerance 1e-10",
        "AssertionError: dk: max |actual - expected| = 1 at (0,) exceeds the tolerance 1e-10",
        "OptionError: floor: expected a finite number >= 0, got nan",
        "DTypeError: output: complex dtype complex128",
        "AssertionError: 1 bug found: scale-missing",
        "AssertionError: 1 bug found: grad-",
        "UsageError: probes: unknown gradient probe 'reference'",
    ):
        assert message in text, (message, text[-3000:])
    src = Path(attnlab.__file__).parent
    source_lines = {
        line.strip() for f in src.rglob("*.py") for line in f.read_text().splitlines() if len(line.strip()) > 12
    }
    # the frames' source lines (pytest's "E" lines are the message: a report's reproduction script quotes code)
    tb = [re.sub(r"^>?\s+", "", line) for line in text.splitlines() if not line.startswith("E")]
    # a finding's reproduction script (attnlab.checker.reproduction's templates) is printed text, not a frame
    import ast

    script = {
        ln.strip()
        for node in ast.walk(ast.parse((src / "checker" / "reproduction.py").read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        for ln in node.value.splitlines()
    }
    leaked = [line for line in tb if line in source_lines and line not in FAILING_TESTS and line not in script]
    assert not leaked, leaked
    assert "attnlab/" not in text.replace("attnlab.", "")  # no frame of attnlab's files (src/attnlab/...py:LINE)
    assert text.count("test_mine.py:") >= 7  # each failure points at the user's own line
