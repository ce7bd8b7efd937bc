"""The gradient oracle (issue 14): golden gradients, clean verdicts for correct backwards, named codes for broken
ones, the entry points (check(..., backward=), check_backward, the CLI, attnlab.testing) and the docs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import grad_impls as G
import jax
import numpy as np
import pytest
import torch

import attnlab
from attnlab import attention_trace
from attnlab.checker import UsageError, check, check_backward
from attnlab.checker.grad_hypotheses import Variant, attention_grads, hypotheses
from attnlab.checker.gradient_oracle import BACKWARD_CODES, GRAD_FIXES, GRAD_PROBES, GradCase, golden_grads
from attnlab.core.dropout import Dropout
from attnlab.core.gradients import attention_backward
from attnlab.testing import assert_attention_grads_correct, assert_grads_close

DOCS = Path(__file__).resolve().parents[1] / "docs" / "checker.md"


def _inputs(seed=0, b=2, h=4, h_kv=2, n_q=5, n_k=7, d_k=3, d_v=6):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, h, n_q, d_k))
    k = rng.standard_normal((b, h_kv, n_k, d_k))
    v = rng.standard_normal((b, h_kv, n_k, d_v))
    do = rng.standard_normal((b, h, n_q, d_v))
    m = rng.random((b, h, n_q, n_k)) < 0.6
    m[..., 0] = True
    return q, k, v, do, m


# ------------------------------------------------------------------------------------------------ the golden


def test_stepwise_gradients_equal_attention_backward_with_mask_gqa_bias_dropout():
    q, k, v, do, m = _inputs()
    rng = np.random.default_rng(1)
    bias = rng.standard_normal(m.shape)
    keep = rng.random(m.shape) < 0.7
    g = attention_grads(q, k, v, do, m, bias=bias, keep=keep, dropout_p=0.3)
    kx, vx = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
    t = attention_trace(q, kx, vx, m, bias=bias, masked_rows="zero")
    ref = attention_backward(t, do, dropout=Dropout(0.3, keep))
    fold = lambda x: x.reshape(2, 2, 2, *x.shape[-2:]).sum(axis=2)  # noqa: E731
    np.testing.assert_allclose(g["dq"], ref.dq, atol=1e-12)
    np.testing.assert_allclose(g["dk"], fold(np.asarray(ref.dk)), atol=1e-12)
    np.testing.assert_allclose(g["dv"], fold(np.asarray(ref.dv)), atol=1e-12)
    np.testing.assert_allclose(g["dbias"], ref.dbias, atol=1e-12)


def test_golden_gradients_match_torch_autograd_causal_cross_gqa():
    q, k, v, do, m = _inputs(2, n_q=4, n_k=9)
    case = GradCase(q, k, v, "float64", mask=m, causal="bottom_right", d_out=do)
    g = golden_grads(case)
    allowed = m & attnlab.masks.causal(4, 9, align="bottom_right")
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.tensor(allowed), enable_gqa=True)
    out.backward(torch.tensor(do))
    for name, t in (("dq", tq), ("dk", tk), ("dv", tv)):
        np.testing.assert_allclose(g[name], t.grad.numpy(), atol=1e-12)


def test_naive_same_precision_gradients_are_close_but_not_exact():
    q, k, v, do, m = _inputs(3)
    g64, g16 = attention_grads(q, k, v, do, m), attention_grads(q, k, v, do, m, dtype="float16")
    err = max(float(np.max(np.abs(g64[n] - g16[n]))) for n in ("dq", "dk", "dv"))
    assert 1e-5 < err < 0.1


def test_every_hypothesis_changes_some_gradient():
    """Each named mistake is a different function of the inputs than the golden (else it could never be told)."""
    q, k, v, do, m = _inputs(4, n_q=6, n_k=6)
    keep = np.random.default_rng(5).random(m.shape) < 0.7
    golden = attention_grads(q, k, v, do, m, causal="top_left", keep=keep, dropout_p=0.3)
    cands = hypotheses(6, 6, h=4, h_kv=2, masked=True, causal="top_left", dropout=True, flash=True)
    assert {c for c, _, _ in cands} == set(BACKWARD_CODES) - {"grad-mismatch", "grad-masked-row", "grad-batch-leak"}
    for code, text, var in cands:
        alt = attention_grads(q, k, v, do, m, causal="top_left", keep=keep, dropout_p=0.3, variant=var)
        diff = max(float(np.nanmax(np.abs(alt[n] - golden[n]))) for n in ("dq", "dk", "dv"))
        assert diff > 1e-6 or np.isnan(diff), (code, text)
    assert Variant() == Variant(delta="dodo")


# ------------------------------------------------------------------------------------------------ clean verdicts


def _attnlab_plain(q, k, v, d_out, mask=None, scale=None, causal=False):
    n_q, n_k = q.shape[-2], k.shape[-2]
    t = attention_trace(q, k, v, mask, scale=scale, causal="top_left" if causal else False, masked_rows="zero")
    g = attention_backward(t, d_out)
    del n_q, n_k
    return g.dq.astype(q.dtype), g.dk.astype(k.dtype), g.dv.astype(v.dtype)


def _attnlab_flash_fwd(q, k, v, mask=None, scale=None, causal=False):
    r = attnlab.flash_attention(
        q,
        k,
        v,
        mask=mask,
        scale=scale,
        causal="top_left" if causal else False,
        masked_rows="zero",
        block_q=4,
        block_k=3,
    )
    return r.output, r.lse


def _attnlab_flash_bwd(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
    from attnlab.kernels import FlashResult, TiledOptions

    opts = TiledOptions.of(
        mask=mask, scale=scale, causal="top_left" if causal else False, masked_rows="zero", block_q=4, block_k=3
    )
    return attnlab.flash_attention_backward(FlashResult(out, lse, inputs=(q, k, v, None), options=opts), d_out)


@pytest.mark.parametrize(
    "fn, options",
    [
        (G.plain(), {"gqa": True}),
        (G.plain_dropout(), {}),
        (G.flash(block=4), {"gqa": True}),
        (G.flash(block=5), {"forward": G.flash_forward(block=5), "gqa": True}),
        (G.flash("lse-log2", block=3), {"forward": G.flash_forward("log2", block=3), "lse_units": "log2"}),
        (G.flash("lse-log2", block=3), {"lse_units": "log2"}),
        (_attnlab_plain, {}),
        (_attnlab_flash_bwd, {}),
        (_attnlab_flash_bwd, {"forward": _attnlab_flash_fwd}),
    ],
    ids=["analytic", "dropout", "tiled", "tiled+fwd", "tiled-log2+fwd", "tiled-log2", "core", "flash", "flash+fwd"],
)
def test_correct_backwards_come_out_clean(fn, options):
    r = check_backward(fn, **options)
    assert r.ok, r.to_text()
    assert {p.name for p in r.probes} >= {"grad-preflight", *GRAD_PROBES}
    assert r.calls > 20


@pytest.mark.parametrize("backend", ["math", "flash"])
def test_torch_sdpa_autograd_is_clean(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kind = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
        with sdpa_kernel(kind):  # that backend only (PyTorch's CPU flash kernel takes masks and every dtype)
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale
            )

    # the CPU flash kernel has no d_v != d_k and no 3-D inputs: declared, so they are "not tested"
    unsupported = ("dv", "rank") if backend == "flash" else ()
    r = check(
        attention, backward=True, probes=("reference", "causal", "padding", "masked-rows"), unsupported=unsupported
    )
    assert r.ok, r.to_text()
    assert "grad-reference" in [p.name for p in r.probes]
    assert r.spec["backward"] == "autograd"


def test_torch_plain_ops_autograd_is_clean_and_a_custom_function_bug_is_named():
    import torch

    def attention(q, k, v, mask=None):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = torch.softmax(s, dim=-1)
        return torch.nan_to_num(w) @ v

    r = check(attention, backward=True, probes=("reference",))
    assert r.codes == () and r.spec["backward"] == "autograd", r.to_text()
    bad = check(G.torch_function("jacobian"), backward=True, probes=("reference",))
    assert "grad-jacobian" in bad.codes, bad.to_text()
    assert check(G.torch_function("scale-twice"), backward=True, probes=("reference",)).codes == ("grad-scale",)


def test_jax_gradients_by_vjp():
    jnp = jax.numpy

    def attention(q, k, v, mask=None):
        s = q @ jnp.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = jnp.where(mask, s, -jnp.inf)
        m = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
        e = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))
        d = e.sum(axis=-1, keepdims=True)
        return (e / jnp.where(d > 0, d, 1.0)) @ v

    # kind="autograd" is what check(fn, backward=True) runs after the forward battery (JAX compiles each new shape,
    # so this test keeps to few shapes)
    opts = {"dtypes": ("float32",), "unsupported": ("mask", "cross", "dv", "causal-cross"), "probes": ("grad-batch",)}
    r = check_backward(attention, kind="autograd", **opts)
    assert r.codes == () and r.framework == "jax", r.to_text()
    assert "jax.vjp" in r.signature and r.calls < 12


def test_a_wrong_forward_is_its_own_finding_and_explains_its_gradients():

    def wrong(q, k, v, mask=None):  # no 1/sqrt(d_k): its gradients are that forward's, not the golden's
        return G.torch_function()(q * math.sqrt(q.shape[-1]), k, v, mask)

    bad = check_backward(wrong, kind="autograd", probes=("grad-reference",))
    assert bad.codes == ("reference-mismatch",) and bad.explained == ("grad-mismatch",), bad.to_text()
    both = check(wrong, backward=True, probes=("reference",))
    assert both.codes == ("scale-missing",), both.to_text()
    assert [(f.code, f.explained_by) for f in both.explained_findings][-1] == ("grad-mismatch", "scale-missing")


# ------------------------------------------------------------------------------------------------ named bugs

BUGS = [
    ("jacobian", G.plain("jacobian"), {}, "grad-jacobian"),
    ("delta-dp", G.plain("delta-dp"), {}, "grad-delta"),
    ("delta-p", G.plain("delta-p"), {}, "grad-delta"),
    ("scale-missing", G.plain("scale-missing"), {}, "grad-scale"),
    ("scale-twice", G.plain("scale-twice"), {}, "grad-scale"),
    ("transposed-dv", G.plain("transposed-dv"), {}, "grad-transposed"),
    ("transposed-dk", G.plain("transposed-dk"), {}, "grad-transposed"),
    ("masked-leak", G.plain("masked-leak"), {}, "grad-masked-leak"),
    ("masked-row-nan", G.plain("masked-row-nan"), {}, "grad-masked-row"),
    ("causal-off", G.plain("causal-off"), {}, "grad-causal"),
    ("batch-leak", G.plain("batch-leak"), {}, "grad-batch-leak"),
    ("dtype", G.plain("dtype"), {}, "dtype"),
    ("mutate", G.plain("mutate"), {}, "mutates-input"),
    ("gqa-first", G.plain("gqa-first"), {"gqa": True}, "grad-gqa-sum"),
    ("gqa-mean", G.plain("gqa-mean"), {"gqa": True}, "grad-gqa-sum"),
    ("dropout-off", G.plain_dropout("dropout-off"), {}, "grad-dropout"),
    ("tiled-delta-dp", G.flash("delta-dp"), {}, "grad-delta"),
    ("tiled-masked-leak", G.flash("masked-leak"), {}, "grad-masked-leak"),
    ("tiled-causal-off", G.flash("causal-off"), {}, "grad-causal"),
    ("tiled-lse-log2", G.flash("lse-log2"), {}, "grad-lse"),
    ("tiled-accumulate-kv", G.flash("accumulate-kv", block=4), {}, "grad-accumulate"),
    ("tiled-accumulate-q", G.flash("accumulate-q", block=3), {}, "grad-accumulate"),
    ("tiled-scale-missing", G.flash("scale-missing"), {}, "grad-scale"),
    ("tiled-gqa-first", G.flash("gqa-first"), {"gqa": True}, "grad-gqa-sum"),
    ("tiled-lse-no-max", G.flash(), {"forward": G.flash_forward("nomax")}, "grad-lse"),
]


@pytest.mark.parametrize("fn, options, code", [b[1:] for b in BUGS], ids=[b[0] for b in BUGS])
def test_each_bug_is_named_with_evidence_and_fix(fn, options, code):
    r = check_backward(fn, **options)
    assert code in r.codes, r.to_text()
    f = next(f for f in r.findings if f.code == code)
    assert f.fix == GRAD_FIXES[code] and f.evidence
    assert r.exit_status == 1
    assert "grad-mismatch" not in r.codes, r.to_text()


@pytest.mark.parametrize(
    "fn, code",
    [
        (G.einsum_delta_do, "grad-delta"),
        (G.flash_lse_unmasked, "grad-lse"),
        (G.torch_plain_bwd_leak, "grad-masked-leak"),  # imports torch inside: detected NumPy, tried in torch
        (G.dropout_twice, "grad-dropout"),
    ],
    ids=["einsum-delta-rowsum-dO", "lse-over-masked-keys", "torch-import-inside", "dropout-twice-in-dP"],
)
def test_other_styles_are_named(fn, code):
    r = check_backward(fn)
    assert r.codes == (code,), r.to_text()


def test_torch_function_with_dk_unscaled_is_named():
    assert check(G.torch_dk_unscaled(), backward=True, probes=("reference",)).codes == ("grad-scale",)


def test_a_feature_whose_cases_alone_fail_is_named():
    def own_dropout_mask(q, k, v, d_out, mask=None, scale=None, causal=False, dropout_mask=None, dropout_p=0.0):
        if dropout_mask is not None:  # draws its own keep mask instead of the forward's
            dropout_mask = np.random.default_rng(0).random(dropout_mask.shape) >= dropout_p
        return G.analytic(q, k, v, d_out, mask, scale, causal, dropout_mask, dropout_p)

    def gqa_reversed(q, k, v, d_out, mask=None):  # the groups' K/V gradients land on the K/V heads reversed
        g = G.analytic(q, k, v, d_out, mask)
        if k.shape[1] == q.shape[1]:
            return g
        return g[0], g[1][:, ::-1].copy(), g[2][:, ::-1].copy()

    def causal_odd(q, k, v, d_out, mask=None, causal=False):  # causal handled by a rule of its own
        dq, dk, dv = G.analytic(q, k, v, d_out, mask, None, causal)
        return (dq * 1.5, dk, dv) if causal else (dq, dk, dv)

    r = check_backward(own_dropout_mask)
    assert r.codes == ("grad-dropout",) and r.explained == ("grad-mismatch",), r.to_text()
    assert check_backward(gqa_reversed, gqa=True).codes == ("grad-gqa-sum",)
    assert check_backward(causal_odd).codes == ("grad-causal",)


def test_a_masked_key_must_get_exactly_zero_gradient():
    def leaky(q, k, v, d_out, mask=None):
        dq, dk, dv = G.analytic(q, k, v, d_out, mask)
        return dq, dk, dv + 1e-12  # tiny, but masked keys must get exactly zero

    r = check_backward(leaky, probes=("grad-masked-keys",))
    assert "grad-masked-leak" in r.codes
    assert "exactly 0" in next(f for f in r.findings if f.code == "grad-masked-leak").message


def test_masked_rows_policy_uniform_is_accepted_when_declared_any():
    def uniform(q, k, v, d_out, mask=None):
        dq, dk, dv = G.analytic(q, k, v, d_out, mask)
        if mask is None:
            return dq, dk, dv
        rows = ~np.asarray(mask).any(axis=-1)
        add = np.einsum("...q,...qd->...d", rows.astype(float), d_out)[..., None, :] / k.shape[-2]
        return dq, dk, dv + add.astype(dv.dtype)

    assert check_backward(uniform, probes=("grad-masked-rows",)).codes == ()
    assert check_backward(uniform, probes=("grad-masked-rows",), masked_rows="zeros").codes == ("grad-masked-row",)


def test_bias_gradient_is_checked():
    r = check_backward(G.plain_bias(), probes=("grad-reference",))
    assert r.codes == (), r.to_text()
    assert "bias=" in r.signature
    assert "grad-mismatch" in check_backward(G.plain_bias("bias-ignored"), probes=("grad-reference",)).codes
    assert "bias" in [u.capability for u in check_backward(G.plain(), probes=("grad-reference",)).unsupported]


def test_causal_alignments():
    # a causal flag that takes the alignment: both alignments are checked, and ignoring it is named
    assert check_backward(G.plain_align(), causal_value="align", probes=("grad-reference",)).codes == ()
    bad = check_backward(G.plain_align("align-ignored"), causal_value="align", probes=("grad-reference",))
    assert "grad-causal" in bad.codes, bad.to_text()
    # a bool flag aligned bottom-right throughout: a note, unless top-left is declared
    r = check_backward(G.plain_align(bottom_right=True), probes=("grad-reference",))
    assert r.codes == () and "causal-alignment" in [n.code for n in r.notes], r.to_text()
    declared = check_backward(G.plain_align(bottom_right=True), causal_align="top_left", probes=("grad-reference",))
    assert "grad-causal" in declared.codes, declared.to_text()


def test_layout_bnhd():
    def bwd(q, k, v, d_out, mask=None):  # [B, n, h, d]
        t = lambda x: np.swapaxes(x, 1, 2)  # noqa: E731
        return tuple(t(g) for g in G.analytic(t(q), t(k), t(v), t(d_out), mask))

    assert check_backward(bwd, layout="bnhd", probes=("grad-reference", "grad-batch")).codes == ()
    assert "grad-mismatch" in check_backward(bwd, probes=("grad-reference",)).codes


def test_signatures_by_parameter_names_and_return_forms():
    def dict_bwd(q, k, v, grad_output, mask=None, scale=None):  # another name for d_out; a dict of gradients
        dq, dk, dv = G.analytic(q, k, v, grad_output, mask, scale)
        return {"dq": dq, "dk": dk, "dv": dv}

    def paper_names(q, k, v, o, L, dO, mask=None):  # FlashAttention-2's names: flash by its six positions
        return G.tiled_backward(q, k, v, o, L, dO, mask)

    def ignores_scale(q, k, v, grad_output, mask=None, scale=None):  # dQ/dK by 1/sqrt(d_k), not by scale
        dq, dk, dv = G.analytic(q, k, v, grad_output, mask, scale)
        f = 1.0 if scale is None else (1 / math.sqrt(q.shape[-1])) / scale
        return dq * f, dk * f, dv

    assert check_backward(dict_bwd).ok
    r = check_backward(paper_names)
    assert r.ok and r.spec["backward"] == "flash" and "lse [nats]" in r.signature
    assert check_backward(ignores_scale).codes == ("grad-scale",)


def test_an_additive_finfo_min_mask_gives_a_note_on_masked_rows_not_a_bug():

    def additive(q, k, v, attn_mask=None):  # Hugging Face's eager attention: s + finfo.min, then softmax
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        return torch.softmax(s if attn_mask is None else s + attn_mask, -1) @ v

    r = check(additive, backward=True, mask_convention="additive", probes=("reference", "masked-rows"))
    assert r.codes == () and "masked-row-additive" in [n.code for n in r.notes], r.to_text()


def test_inputs_unmodified_and_dtypes_checked_on_every_call():
    r = check_backward(G.plain("mutate"), probes=("grad-reference",))
    f = next(f for f in r.findings if f.code == "mutates-input")
    assert "d_out" in f.message


# ------------------------------------------------------------------------------------------------ entry points


def test_numpy_forward_with_backward_true_is_a_usage_error_naming_the_option():
    with pytest.raises(UsageError, match="backward=True"):
        check(G.tiled_forward, backward=True, framework="numpy")
    with pytest.raises(UsageError, match="lse_units"):
        check_backward(G.plain(), lse_units="bits")
    with pytest.raises(UsageError, match="backward"):
        check(G.tiled_forward, backward=3)


def test_check_with_a_backward_callable_runs_both_batteries():
    def fwd(q, k, v, mask=None):
        return G.tiled_forward(q, k, v, mask)[0]

    r = check(fwd, backward=G.plain("jacobian"), probes=("reference", "causal", "padding", "masked-rows"))
    assert r.codes == ("grad-jacobian",)
    names = [p.name for p in r.probes]
    assert names[0] == "preflight" and "grad-reference" in names
    assert r.command == "check --backward" and "backward: bwd(q, k, v, d_out" in r.signature


def test_top_level_names_and_json():
    assert attnlab.check_backward is check_backward
    d = json.loads(check_backward(G.plain(), probes=("grad-reference",)).to_json())
    assert d["command"] == "check --backward" and d["spec"]["backward"] == "plain"


def test_cli_backward_name_and_autograd_refusal(tmp_path, capsys):
    from attnlab.cli import main

    src = Path(G.__file__).read_text()
    (tmp_path / "impls.py").write_text(
        src + "\n\ndef fwd(q, k, v, mask=None):\n    return tiled_forward(q, k, v, mask)[0]\n\n"
        "bwd = plain('delta-p')\nlog2_bwd = flash('lse-log2')\nlog2_fwd = flash_forward('log2')\n"
    )
    target = f"{tmp_path / 'impls.py'}:fwd"
    assert main(["check", target, "--backward", "bwd", "--json", "--probes", "reference"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert [f["code"] for f in d["findings"]] == ["grad-delta"]
    assert main(["check", target, "--backward", "--probes", "reference"]) == 2
    assert "backward=True" in capsys.readouterr().err
    t2 = f"{tmp_path / 'impls.py'}:log2_fwd"
    assert main(["check", t2, "--backward", "log2_bwd", "--lse-units", "log2", "--probes", "reference"]) in (0, 3)


def test_a_target_string_runs_in_a_worker_process_killed_on_timeout(tmp_path):
    (tmp_path / "bad.py").write_text(
        "import os, time\nimport numpy as np\n\n\ndef hangs(q, k, v, d_out, mask=None):\n"
        "    if q.dtype == np.float32:\n        time.sleep(60)\n    return q, k, v\n\n\n"
        "def dies(q, k, v, d_out, mask=None):\n    os._exit(3)\n"
    )
    r = check_backward(f"{tmp_path / 'bad.py'}:hangs", timeout=1.5)
    assert r.codes == ("timeout",) and r.isolation == "worker process"
    assert "worker process was killed" in r.findings[0].evidence
    r = check_backward(f"{tmp_path / 'bad.py'}:dies")
    assert r.codes == ("crash",) and "status 3" in r.findings[0].message
    (tmp_path / "broken.py").write_text("raise RuntimeError('no import')\n")
    r = check_backward(f"{tmp_path / 'broken.py'}:bwd")
    assert r.codes == ("crash",) and "no import" in r.findings[0].message and r.exit_status == 1


def test_assertion_helpers():
    assert assert_attention_grads_correct(G.plain()).ok
    with pytest.raises(AssertionError, match="grad-scale"):
        assert_attention_grads_correct(G.plain("scale-missing"), probes=("grad-reference",))
    q, k, v, do, m = _inputs(6)
    golden = attention_grads(q, k, v, do, m)
    naive = attention_grads(q, k, v, do, m, dtype="float32")
    got = tuple(golden[n].astype(np.float32) for n in ("dq", "dk", "dv"))
    assert_grads_close(
        got, tuple(golden[n] for n in ("dq", "dk", "dv")), reference=tuple(naive[n] for n in ("dq", "dk", "dv"))
    )
    with pytest.raises(AssertionError, match="dv"):
        assert_grads_close((got[0], got[1], got[2] + 1e-3), tuple(golden[n] for n in ("dq", "dk", "dv")))


# ------------------------------------------------------------------------------------------------ docs


def test_every_backward_code_is_documented_with_its_fix():
    text = DOCS.read_text(encoding="utf-8")
    part = text.split("\n## Backward\n")[1]
    for code in BACKWARD_CODES:
        assert f"### `{code}`" in part, code
        assert code in GRAD_FIXES


def test_docs_backward_example_output_is_real(tmp_path, capsys, monkeypatch):
    from attnlab.cli import main

    part = DOCS.read_text(encoding="utf-8").split("\n## Backward\n")[1]
    source = part.split("```python\n")[1].split("```")[0]
    shown = part.split("$ attnlab check examples/my_backward.py:attention --backward attention_bwd\n")[1]
    shown = shown.split("```")[0].strip("\n").splitlines()
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "my_backward.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    target = "examples/my_backward.py:attention"
    assert main(["check", target, "--backward", "attention_bwd", "--no-color", "--width", "100"]) == 1
    out = capsys.readouterr().out.splitlines()
    for line in shown:
        if line.startswith(("FAILED", "probes:")):
            continue  # timings and wrapping
        assert line in out, line


def _zeros_plain(q, k, v, d_out, mask=None, scale=None):
    return np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)


@pytest.mark.parametrize("shape", ["numpy scalar", "0-d array", "1-d array"])
def test_a_gradient_of_the_wrong_rank_is_a_finding_not_a_checker_failure(shape):
    def bwd(q, k, v, d_out, mask=None, scale=None):
        g = attention_backward(attention_trace(q, k, v, mask, scale=scale, masked_rows="zero"), d_out)
        dq, dk, dv = g.dq, g.dk, g.dv
        wrong = {"numpy scalar": np.float64(0.0), "0-d array": np.array(1.0), "1-d array": np.ravel(dq)}[shape]
        return wrong, dk, dv

    r = check_backward(bwd, dtypes=("float64",))  # was: IndexError inside the grad-batch probe (exit 4)
    if shape == "1-d array":
        assert "grad-mismatch" in r.codes, r.to_text()  # "dq has the wrong shape"
    else:
        f = next(f for f in r.findings if f.code == "output-type")
        said = {"numpy scalar": "the dq is a numpy.float64", "0-d array": "the dq is a 0-d array (one number)"}[shape]
        assert said in f.message, r.to_text()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"timeout": -1}, "timeout: expected a positive number of seconds, got -1"),
        ({"timeout": float("inf")}, "timeout: expected a number of seconds at most"),
        ({"seed": -1}, "seed: expected an int >= 0"),
        ({"forward": 42}, "forward: expected None, a callable forward"),
    ],
)
def test_check_backward_refuses_what_check_refuses(options, message):
    with pytest.raises(UsageError, match=message):
        check_backward(_zeros_plain, **options)
    if "forward" not in options:
        with pytest.raises(UsageError, match=message):
            check(_zeros_plain, **options)
