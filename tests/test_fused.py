"""The fused float32 passes (attnlab.kernels.fused): our exponential against float64, the masks, offsets and row
sums against NumPy, bad input, and the kernels' behaviour without numba.

The compiled passes are built for the CPU they run on (numba compiles for the host: 512-bit vectors on AVX-512,
256-bit on AVX2, FMA where the CPU has it), so every assertion here is one that holds on any x86-64 CPU: our
``exp2`` against float64 (not against NumPy's, whose accuracy depends on its own dispatch: 2.74 ulp with its AVX-512
kernel, 0.50 with its baseline one), row sums against the exact sum of the same terms within a few roundings (the
order of a float32 sum is the compiler's), never bitwise equality of two code paths' sums. The tests marked
``cpu_sensitive`` are run a second time, in a fresh process with AVX-512 switched off for NumPy and numba
(:func:`test_cpu_sensitive_tests_pass_with_avx512_switched_off`), so an AVX-512 developer machine sees what an
AVX2-only CPU would.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from attnlab.errors import AttnlabWarning, DTypeError, MissingExtraError, OptionError, ShapeError
from attnlab.kernels import config as kernel_settings
from attnlab.kernels import exponential, fused, tiled

cpu_sensitive = pytest.mark.cpu_sensitive


@functools.cache
def _exp2_max_ulp() -> float:
    """The bound our ``exp2`` keeps on the target numba compiles for here: < 1 float32 ulp where ``a * b + c``
    becomes one FMA (every x86-64 CPU with AVX2: Intel since Haswell, AMD since Piledriver), < 1.25 where it does
    not (older x86-64 CPUs; measured 1.234 with ``NUMBA_CPU_NAME=x86-64 NUMBA_CPU_FEATURES=``)."""
    import numba

    def mul_add(a, b, c):  # pragma: no cover - compiled
        return a * b + c

    x = np.float32(1 + 2**-12)  # x * x = 1 + 2^-11 + 2^-24: rounded alone, the 2^-24 is lost
    fused_here = numba.njit(fastmath={"contract"})(mul_add)(x, x, np.float32(-(1 + 2**-11))) != 0
    return 1.0 if fused_here else 1.25


def _ulps(got: np.ndarray, x: np.ndarray) -> np.ndarray:
    """|got - 2**x| in units of the float32 spacing at the exact value (x in float32, exact value in float64)."""
    exact = np.exp2(x.astype(np.float64))
    return np.abs(got.astype(np.float64) - exact) / np.spacing(exact.astype(np.float32)).astype(np.float64)


def _exp2(x: np.ndarray, **kw) -> np.ndarray:
    s = np.ascontiguousarray(x, dtype=np.float32).reshape(1, -1).copy()
    fused.exp2_block(s, **kw)
    return s[0]


@cpu_sensitive
@pytest.mark.parametrize("bounded", [False, True])
def test_exp2_within_one_ulp_on_the_whole_normal_range(bounded):
    """Against float64 ``exp2`` on 4 million points: < 1 float32 ulp (measured 0.952 on AVX-512 and on AVX2)."""
    x = np.linspace(-126.0, 127.999, 1 << 22, dtype=np.float32)
    got = _exp2(x, bounded=bounded)
    worst = _ulps(got, x).max()
    assert worst < _exp2_max_ulp(), worst
    assert worst > 0.5  # a float32 result, not float64 in disguise


@cpu_sensitive
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


@cpu_sensitive
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
    assert _ulps(s[ok], arg[ok]).max() < _exp2_max_ulp()
    np.testing.assert_allclose(sums, want.sum(axis=1), rtol=2e-6, atol=0)
    assert sums[3] == 0 and sums[5] == 0
    np.testing.assert_array_equal(off, off_c)  # inputs other than s untouched
    np.testing.assert_array_equal(bad, bad_c)


#: Row sums of float32 terms against the exact (float64) sum of the same terms: 16 roundings. The order of the sum
#: is the compiler's (vector width and unrolling), so two loops, or two CPUs, may round differently: the bounded
#: and unbounded passes below give equal sums on AVX-512 and sums 1.6e-7 apart on AVX2. Measured worst: 3 roundings
#: (1.8e-7) on AVX-512, AVX2 and SSE2 targets; any order of 513 positive terms stays within 513 roundings.
SUM_RTOL = 16 * 2.0**-24


@cpu_sensitive
def test_bounded_equals_unbounded_where_the_bound_holds():
    """The two compiled loops the tiled kernel calls (``exp2_rows`` with the range checks, ``exp2_rows_bounded``
    without) compute the same powers, each within the ulp bound of float64, zeros where masked, and row sums within a
    few roundings of the exact sum of their terms; ``exp2_block`` is the checked entry to the same two."""
    rng = np.random.default_rng(1)
    s0 = rng.uniform(-100, 100, (64, 513)).astype(np.float32)
    bad = rng.random(s0.shape) < 0.5
    a, b, c = s0.copy(), s0.copy(), s0.copy()
    ra, rb, rc = (np.empty(64, np.float32) for _ in range(3))
    one, jit = np.float32(1), fused.kernels()
    jit.exp2_rows(a, one, None, one, np.zeros(64, np.float32), one, bad, ra)
    jit.exp2_rows_bounded(b, one, None, one, bad, rb)
    fused.exp2_block(c, None, bad, rc, bounded=True)
    np.testing.assert_array_equal(b, c)
    np.testing.assert_array_equal(rb, rc)
    for got, sums in ((a, ra), (b, rb)):
        assert np.all(got[bad] == 0)
        assert _ulps(got[~bad], s0[~bad]).max() < _exp2_max_ulp()
        exact = got.astype(np.float64).sum(axis=1)
        np.testing.assert_allclose(sums, exact, rtol=SUM_RTOL, atol=0)
    np.testing.assert_allclose(ra, rb, rtol=2 * SUM_RTOL, atol=0)


@cpu_sensitive
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
        assert _ulps(s[ok], arg[ok]).max() < _exp2_max_ulp()
    if not big.any():  # finite terms; their float32 sum overflows where the exact one is past float32's largest
        total, top = want.sum(axis=1), float(np.finfo(np.float32).max)
        fits, over = total <= top * (1 - 1e-5), total >= top * (1 + 1e-5)
        np.testing.assert_allclose(sums[fits], total[fits], rtol=1e-5, atol=0)
        assert np.all(np.isinf(sums[over]))


@cpu_sensitive
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
    with pytest.raises(OptionError, match=r"off: must be None with bounded=True"):
        fused.exp2_block(s, np.zeros(4, np.float32), bounded=True)
    with pytest.raises(ShapeError, match=r"p: shape \(4, 4\), expected \(4, 5\)"):
        fused.ds_block(s, np.zeros(4, np.float32), np.zeros((4, 4), np.float32))


def test_the_tiled_kernel_uses_the_fused_passes_for_float32_only():
    e32, e64 = exponential("float32"), exponential(np.float64)
    assert e32.fused and e32.name == "fused" and e32.reason.startswith("float32 with numba")
    assert not e64.fused and e64.name in ("exp2", "exp") and "float32 only" in e64.reason
    with kernel_settings.override(use_numba=False):
        e = exponential("float32")
        assert not e.fused and "use_numba=False" in e.reason
    with kernel_settings.override(exp="fused"):
        assert exponential("float64").reason.endswith("as fused needs float32 and numba")
    with pytest.raises(DTypeError, match="dtype: expected float32 or float64"):
        exponential("int8")


def test_without_numba(monkeypatch):
    """Where numba is missing the kernels fall back to NumPy's exponential and the passes say what to install."""
    monkeypatch.setattr(fused, "AVAILABLE", False)
    with pytest.raises(MissingExtraError, match=r"numba is not installed; it comes with: pip install 'attnlab\[fast\]"):
        fused.exp2_block(np.zeros((2, 2), np.float32))
    assert fused.version() is None
    e = exponential("float32")
    assert not e.fused and e.name in ("exp2", "exp") and "no numba: pip install 'attnlab[fast]'" in e.reason
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

    monkeypatch.setattr(fused, "kernels", broken)  # a loader of its own: usable() tries it afresh
    with pytest.warns(AttnlabWarning, match=r"numba is installed but does not load \(ImportError: Numba needs NumPy"):
        e = exponential("float32")
    assert not e.fused and e.reason.endswith("numba is installed but does not load")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        assert not exponential("float32").fused
        rng = np.random.default_rng(4)
        q, k, v = (rng.standard_normal((2, 50, 8)).astype(np.float32) for _ in range(3))
        r = tiled.flash_attention(q, k, v, causal=True, block_q=16, block_k=16)
    np.testing.assert_allclose(
        r.output, tiled.flash_attention(*(x.astype(np.float64) for x in (q, k, v)), causal=True).output, atol=2e-6
    )


@cpu_sensitive
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
        # the float32 argument carries one rounding with FMA (~|arg|·2^-24 absolute), two without (the product's
        # ~|c·bias|·2^-24, then the sum's), which exp2 turns into a relative error of ln 2 times that; plus the
        # exponential's own ulp
        assert np.all(np.abs(s - want) / want <= 2.0**-23 * (_exp2_max_ulp() + np.abs(arg) + np.abs(1.5 * bias)))
        np.testing.assert_allclose(sums, want.sum(axis=1), rtol=2.0**-23 * (1 + np.abs(arg).max()))
    with pytest.raises(ShapeError, match=r"bias: shape \(24, 39\), expected \(24, 40\)"):
        fused.exp2_block(s0.copy(), bias=big[:24, :39])
    with pytest.raises(OptionError, match="bias_scale: expected a finite number"):
        fused.exp2_block(s0.copy(), bias=big[:24, :40], bias_scale=float("inf"))


#: AVX-512 off: NumPy's X86_V4 dispatch targets (its AVX-512 kernels) disabled, numba compiling for Haswell (AVX2,
#: FMA) with no feature added to it: ``NUMBA_CPU_NAME`` alone keeps the host's feature list, AVX-512 included.
NO_AVX512 = {
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
    "NUMBA_CPU_NAME": "haswell",
    "NUMBA_CPU_FEATURES": "",
}

# Runs in the child: says what NumPy dispatches to and what numba compiled attnlab's pass into, then runs the tests.
_CHILD = r"""
import json, sys, warnings
import numba, numpy as np
from numpy.lib.introspect import opt_func_info
from attnlab.kernels import fused
warnings.simplefilter("error")  # a pass loaded from a cache cannot be inspected: numba warns, and this fails
s = np.zeros((4, 20), np.float32)
fused.exp2_block(s, rowsum=np.empty(4, np.float32))
asm = "\n".join(fused.kernels().exp2_rows.inspect_asm().values())
print("TARGET " + json.dumps({
    "numba_cpu_name": numba.config.CPU_NAME, "numba_cpu_features": numba.config.CPU_FEATURES,
    "numba_cache_dir": numba.config.CACHE_DIR, "zmm": "zmm" in asm, "ymm": "ymm" in asm,
    "numpy_exp2_float32": opt_func_info(func_name="^exp2$", signature="float32")["exp2"]["ff"]["current"],
}), flush=True)
warnings.resetwarnings()
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def _cpu_has(*features: str) -> bool:
    from numpy._core._multiarray_umath import __cpu_features__

    return all(__cpu_features__.get(f, False) for f in features)


def test_cpu_sensitive_tests_pass_with_avx512_switched_off(tmp_path):
    """The tests marked ``cpu_sensitive`` (in this file), again in a fresh process where neither NumPy nor numba
    uses AVX-512 (:data:`NO_AVX512`, and an empty numba cache directory, so no pass compiled earlier for AVX-512 is
    loaded): what an AVX2-only CPU runs. The child first proves its target: NumPy's float32 ``exp2`` runs its
    baseline kernel, and attnlab's compiled pass uses 256-bit registers and no 512-bit ones."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not _cpu_has("AVX2", "FMA3"):
        pytest.skip("emulating an AVX2 CPU needs an x86-64 CPU with AVX2 and FMA")
    marked = sorted(
        name
        for name, fn in globals().items()
        if name.startswith("test_") and any(m.name == "cpu_sensitive" for m in getattr(fn, "pytestmark", []))
    )
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, **NO_AVX512, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    args = ["-q", "-rA", "-p", "no:cacheprovider", "-m", "cpu_sensitive", str(Path(__file__).resolve())]
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, *args], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    out = proc.stdout + proc.stderr
    line = next((x for x in proc.stdout.splitlines() if x.startswith("TARGET ")), None)
    assert line is not None, out[-3000:]
    target = json.loads(line[len("TARGET ") :])
    assert target["numba_cpu_name"] == "haswell" and target["numba_cpu_features"] == "", target
    assert target["numba_cache_dir"] == str(tmp_path / "numba-cache"), target
    assert target["ymm"] and not target["zmm"], target  # compiled here, for AVX2: 256-bit vectors only
    assert not target["numpy_exp2_float32"].startswith(("X86_V4", "AVX512")), target
    assert proc.returncode == 0, out[-6000:]
    passed = {m.group(1).split("[")[0] for m in re.finditer(r"^PASSED \S+::(\S+)", proc.stdout, re.M)}
    assert passed == set(marked), (sorted(passed), marked, out[-3000:])
