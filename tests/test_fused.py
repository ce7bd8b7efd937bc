"""The fused float32 passes (attnlab.kernels.fused): our exponential against float64, the masks, offsets and row
sums against NumPy, bad input, and the kernels' behaviour without numba."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from attnlab.errors import AttnlabWarning, DTypeError, MissingExtraError, ShapeError
from attnlab.kernels import fused, tiled


def _ulps(got: np.ndarray, x: np.ndarray) -> np.ndarray:
    """|got - 2**x| in units of the float32 spacing at the exact value (x in float32, exact value in float64)."""
    exact = np.exp2(x.astype(np.float64))
    return np.abs(got.astype(np.float64) - exact) / np.spacing(exact.astype(np.float32)).astype(np.float64)


def _exp2(x: np.ndarray, **kw) -> np.ndarray:
    s = np.ascontiguousarray(x, dtype=np.float32).reshape(1, -1).copy()
    fused.exp2_block(s, **kw)
    return s[0]


@pytest.mark.parametrize("bounded", [False, True])
def test_exp2_within_one_ulp_on_the_whole_normal_range(bounded):
    x = np.linspace(-126.0, 127.999, 1 << 22, dtype=np.float32)
    got = _exp2(x, bounded=bounded)
    worst = _ulps(got, x).max()
    assert worst < 1.0, worst
    # NumPy's own float32 exp2, for the record: not better
    assert _ulps(np.exp2(x), x).max() >= worst


def test_exp2_exact_on_integers_and_special_values():
    ints = np.arange(-126, 128, dtype=np.float32)
    np.testing.assert_array_equal(_exp2(ints), np.ldexp(np.float32(1), ints.astype(int)))
    special = np.array([-np.inf, -1e30, -126.5, -126.0, 127.75, 128.0, 1e30, np.inf, np.nan], dtype=np.float32)
    got = _exp2(special)
    np.testing.assert_array_equal(got[:3], [0, 0, 0])  # below the smallest normal: flushed to 0
    assert got[3] == np.float32(2.0**-126)
    assert got[4] == np.float32(np.exp2(127.75)) and np.isfinite(got[4])
    np.testing.assert_array_equal(got[5:8], [np.inf] * 3)
    assert np.isnan(got[8])


def test_offsets_masks_and_row_sums_match_numpy():
    rng = np.random.default_rng(0)
    s0 = rng.uniform(-40, 40, (37, 300)).astype(np.float32)
    off = rng.uniform(-5, 45, 37).astype(np.float32)
    off[3] = np.inf  # a row with nothing: all zeros
    bad = rng.random((37, 300)) < 0.3
    bad[5] = True
    s0[7, :10] = -np.inf  # masked the other way: -inf scores
    off_c, bad_c = off.copy(), bad.copy()
    s, sums = s0.copy(), np.empty(37, np.float32)
    fused.exp2_block(s, off, bad, sums)
    arg = s0 - off[:, None]  # the same float32 subtraction
    want = np.where(bad, 0.0, np.exp2(arg.astype(np.float64)))
    assert np.all(s[bad] == 0) and np.all(s[3] == 0) and np.all(s[7, :10] == 0)
    ok = want > 0
    assert _ulps(s[ok], arg[ok]).max() < 1.0
    np.testing.assert_allclose(sums, want.sum(axis=1), rtol=2e-6, atol=0)
    assert sums[3] == 0 and sums[5] == 0
    np.testing.assert_array_equal(off, off_c)  # inputs other than s untouched
    np.testing.assert_array_equal(bad, bad_c)


def test_bounded_equals_unbounded_where_the_bound_holds():
    rng = np.random.default_rng(1)
    s0 = rng.uniform(-100, 100, (64, 513)).astype(np.float32)
    bad = rng.random(s0.shape) < 0.5
    a, b = s0.copy(), s0.copy()
    ra, rb = np.empty(64, np.float32), np.empty(64, np.float32)
    fused.exp2_block(a, None, bad, ra)
    fused.exp2_block(b, None, bad, rb, bounded=True)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ra, rb)


@given(
    hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 9), st.integers(1, 70)),
        elements=st.floats(-150, 150, width=32, allow_nan=False),
    ),
    st.data(),
)
def test_exp2_block_property(s0, data):
    bq, bk = s0.shape
    off = data.draw(hnp.arrays(np.float32, (bq,), elements=st.floats(-20, 20, width=32)))
    bad = data.draw(hnp.arrays(np.bool_, (bq, bk)))
    s, sums = s0.copy(), np.empty(bq, np.float32)
    fused.exp2_block(s, off, bad, sums)
    arg = s0 - off[:, None]
    exact = np.exp2(arg.astype(np.float64))
    want = np.where(bad | (arg < -126), 0.0, exact)
    big = ~bad & (arg >= 128)
    assert np.all(np.isinf(s[big]))
    ok = ~big & (want > 0)
    assert np.all(s[~big & (want == 0)] == 0)
    if ok.any():
        assert _ulps(s[ok], arg[ok]).max() < 1.0
    if not big.any():
        np.testing.assert_allclose(sums, want.sum(axis=1), rtol=1e-5, atol=0)


def test_ds_block():
    rng = np.random.default_rng(2)
    dp0 = rng.standard_normal((20, 33)).astype(np.float32)
    p = rng.random((20, 33)).astype(np.float32)
    delta = rng.standard_normal(20).astype(np.float32)
    dp = dp0.copy()
    fused.ds_block(dp, delta, p)
    np.testing.assert_array_equal(dp, p * (dp0 - delta[:, None]))


def test_bad_input_names_the_argument():
    s = np.zeros((4, 5), np.float32)
    with pytest.raises(DTypeError, match=r"s: expected a NumPy float32 array, got ndarray float64"):
        fused.exp2_block(np.zeros((4, 5)))
    with pytest.raises(DTypeError, match=r"s: expected a NumPy float32 array, got list"):
        fused.exp2_block([[0.0]])
    with pytest.raises(ShapeError, match=r"s: expected a writeable C-contiguous \[bq, bk\] block, got shape \(4, 5\)"):
        fused.exp2_block(np.zeros((5, 4), np.float32).T)
    with pytest.raises(ShapeError, match=r"s: .* got shape \(20,\)"):
        fused.exp2_block(np.zeros(20, np.float32))
    with pytest.raises(ShapeError, match=r"off: shape \(5,\), expected \(4,\)"):
        fused.exp2_block(s, np.zeros(5, np.float32))
    with pytest.raises(DTypeError, match=r"bad: expected a NumPy bool array, got ndarray int64"):
        fused.exp2_block(s, bad=np.zeros((4, 5), np.int64))
    with pytest.raises(ShapeError, match=r"rowsum: shape \(5,\), expected \(4,\)"):
        fused.exp2_block(s, rowsum=np.zeros(5, np.float32))
    with pytest.raises(ShapeError, match=r"off: must be None with bounded=True"):
        fused.exp2_block(s, np.zeros(4, np.float32), bounded=True)
    with pytest.raises(ShapeError, match=r"p: shape \(4, 4\), expected \(4, 5\)"):
        fused.ds_block(s, np.zeros(4, np.float32), np.zeros((4, 4), np.float32))


def test_the_tiled_kernel_uses_the_fused_passes_for_float32_only():
    assert tiled._exp(np.dtype(np.float32)).fused
    assert not tiled._exp(np.dtype(np.float64)).fused


def test_without_numba(monkeypatch):
    """Where numba is missing the kernels fall back to NumPy's exponential and the passes say what to install."""
    monkeypatch.setattr(fused, "AVAILABLE", False)
    with pytest.raises(MissingExtraError, match=r"numba is not installed; it comes with: pip install 'attnlab\[fast\]"):
        fused.exp2_block(np.zeros((2, 2), np.float32))
    assert fused.version() is None
    e = tiled._exp(np.dtype(np.float32))
    assert not e.fused and e.name in ("exp2", "exp")
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 70, 16)).astype(np.float32) for _ in range(3))
    r = tiled.flash_attention(q, k, v, causal=True, block_q=32, block_k=16)
    ref = tiled.flash_attention(q.astype(np.float64), k, v, causal=True).output
    np.testing.assert_allclose(r.output, ref, atol=2e-6, rtol=0)


def test_import_attnlab_does_not_import_numba():
    code = "import sys, attnlab, attnlab.kernels.fused; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_numba_that_does_not_load_is_said_once_and_numpy_takes_over(monkeypatch):
    """numba installed but broken (e.g. built for another NumPy): one warning with the reason and the fix, then the
    NumPy passes, with the same results."""

    def broken():
        raise ImportError("Numba needs NumPy 2.3 or less. Got NumPy 9.9.")

    monkeypatch.setattr(fused, "kernels", broken)
    monkeypatch.setattr(fused, "_loaded", None)
    with pytest.warns(AttnlabWarning, match=r"numba is installed but does not load \(ImportError: Numba needs NumPy"):
        e = tiled._exp(np.dtype(np.float32))
    assert not e.fused
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        assert not tiled._exp(np.dtype(np.float32)).fused
        rng = np.random.default_rng(4)
        q, k, v = (rng.standard_normal((2, 50, 8)).astype(np.float32) for _ in range(3))
        r = tiled.flash_attention(q, k, v, causal=True, block_q=16, block_k=16)
    np.testing.assert_allclose(
        r.output, tiled.flash_attention(*(x.astype(np.float64) for x in (q, k, v)), causal=True).output, atol=2e-6
    )


@pytest.mark.parametrize("bounded", [False, True])
def test_bias_inside_the_pass(bounded):
    """``s + bias_scale · bias`` in float32 inside the pass, from a contiguous block or a strided view."""
    rng = np.random.default_rng(5)
    s0 = rng.uniform(-20, 20, (24, 40)).astype(np.float32)
    big = rng.uniform(-20, 20, (50, 90)).astype(np.float32)
    for bias in (np.ascontiguousarray(big[:24, :40]), big[10:34, 30:70], np.broadcast_to(big[0, :40], (24, 40))):
        s, sums = s0.copy(), np.empty(24, np.float32)
        fused.exp2_block(s, rowsum=sums, bias=bias, bias_scale=1.5, bounded=bounded)
        arg = s0.astype(np.float64) + 1.5 * bias.astype(np.float64)  # exact
        want = np.exp2(arg)
        # the float32 argument carries one or two roundings (one with FMA), each ~|x|·2^-24 absolute, which exp2
        # turns into a relative error of ln 2 times that; plus the exponential's own ulp
        assert np.all(np.abs(s - want) / want <= 2.0**-23 * (1 + np.abs(arg)))
        np.testing.assert_allclose(sums, want.sum(axis=1), rtol=2.0**-23 * (1 + np.abs(arg).max()))
    with pytest.raises(ShapeError, match=r"bias: shape \(24, 39\), expected \(24, 40\)"):
        fused.exp2_block(s0.copy(), bias=big[:24, :39])
    with pytest.raises(ShapeError, match="bias_scale: expected a finite number"):
        fused.exp2_block(s0.copy(), bias=big[:24, :40], bias_scale=float("inf"))
