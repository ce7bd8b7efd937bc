"""Real implementations come out clean: PyTorch SDPA (default and math), nn.MultiheadAttention, JAX, attnlab."""

from __future__ import annotations

import torch.nn.functional as F
from zoo.torch_zoo import MHAWrapper, sdpa_math

import attnlab
from attnlab.checker import PROBES, check
from attnlab.kernels.tiled import flash_attention


def _notes(report):
    return {n.code for n in report.notes}


def test_torch_sdpa_default_backend_is_clean_in_every_dtype():
    r = check(F.scaled_dot_product_attention, gqa=True)
    assert r.ok, r.to_text()
    assert r.framework == "torch"
    assert "enable_gqa=" in r.signature
    assert r.unsupported == ()  # float64/32/16, bfloat16, masks, causal, scale, GQA, cross, d_v all tested
    assert "causal-alignment" in _notes(r)  # is_causal is top-left, said in the report


def test_torch_sdpa_is_causal_used_for_a_bottom_right_decode_is_named():
    # is_causal is top-left: a caller relying on bottom-right (a KV-cache decode step) gets queries that miss keys
    r = check(sdpa_math, gqa=True, causal_align="bottom_right")
    assert r.codes == ("causal-alignment",), r.to_text()
    f = r.findings[0]
    assert "top-left" in f.message and "queries miss keys the declared alignment lets them see" in f.message
    assert "■ ⬚" in f.evidence  # the function's alignment is drawn
    assert "align=" in f.fix


def test_multihead_attention_internals_are_clean_except_its_nan_on_fully_masked_rows():
    # nn.MultiheadAttention returns NaN for a query whose keys are all masked (pytorch/pytorch#41508): the
    # checker names it, and everything else is clean.
    r = check(MHAWrapper(), mask_convention="block", framework="torch")
    assert r.codes == ("masked-row-nan",), r.to_text()
    assert {p.name: p.status for p in r.probes}["invariants"] == "passed"  # it returns per-head weights
    r = check(
        MHAWrapper(), mask_convention="block", framework="torch", probes=[p for p in PROBES if p != "masked-rows"]
    )
    # no bug, but a core probe left out: incomplete, not OK
    assert r.findings == () and r.verdict == "incomplete", r.to_text()
    assert [(u.capability, u.reason) for u in r.incomplete] == [("masked-rows", "not selected (probes=...)")]


def test_jax_dot_product_attention_on_cpu_is_clean():
    import jax

    # jitted and float32 only: every new shape costs a JAX compilation (eager dispatch compiles each primitive,
    # ~3x slower), and float64 needs jax_enable_x64
    fn = jax.jit(jax.nn.dot_product_attention, static_argnames=("is_causal", "scale"))
    r = check(fn, layout="bnhd", gqa=True, dtypes=("float32",))
    assert r.ok, r.to_text()
    assert r.framework == "jax"
    assert {u.capability for u in r.unsupported} >= {"dv", "rank"}  # JAX refuses d_v != d_k; [B, n, h, d] is 4-D
    assert "causal-alignment" in _notes(r)


def test_attnlab_implementations_are_clean():
    for fn in (attnlab.scaled_dot_product_attention, attnlab.attention_trace, flash_attention):
        r = check(fn, gqa=fn is flash_attention)
        assert r.ok, r.to_text()
        assert "masked-row" in _notes(r)  # masked_rows="raise" by default: a documented policy
        # causal=True with n_q != n_k is refused on purpose (the alignment must be explicit): unsupported
        assert "causal-cross" in {u.capability for u in r.unsupported}


def test_attnlab_with_alignment_strings_is_clean_on_rectangular_causal():
    for fn in (attnlab.scaled_dot_product_attention, flash_attention):
        r = check(fn, causal_align="bottom_right", causal_value="align")
        assert r.ok, r.to_text()
        assert "causal-cross" not in {u.capability for u in r.unsupported}
        assert "causal-alignment" not in {n.code for n in r.notes}
