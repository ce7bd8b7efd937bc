"""The gradient side's case space (issue 20 §2): ranks 3 and 4, bias, large logits, every mask interface, a dropout
keep mask under the function's own name, declared unsupported capabilities, list options as comma strings; and
its findings shrunk like the forward's (§3). Each buggy backward of :mod:`grad_impls` here is caught only by the
new cases."""

from __future__ import annotations

import grad_impls as G
import numpy as np
import torch  # the test install's CPU build (constraints.txt): these tests check torch functions

import attnlab
from attnlab.checker import check_backward


def _probe(report, name):
    return next(p for p in report.probes if p.name == name)


def test_an_lse_without_the_max_is_caught_by_the_large_logit_gradient_case():
    r = check_backward(G.lse_without_max)
    assert r.codes == ("grad-lse",), r.to_text()
    f = r.findings[0]
    assert f.probe == "grad-large-logits" and "large logits" in f.message, r.to_text()
    assert _probe(r, "grad-reference").status == "passed"  # ordinary logits: the same backward is right


def test_a_backward_wrong_only_on_rank_3_inputs_is_checked_there():
    r = check_backward(G.rank3_head_dim)
    assert r.codes == ("grad-mismatch",), r.to_text()
    assert "rank" not in {u.capability for u in r.unsupported}
    m = r.findings[0].minimal
    assert m is not None and m.shrunk and m.case.q.ndim == 3, r.to_text()  # the smallest case is [h, n, d]


def test_a_backward_written_for_4d_inputs_alone_has_rank_not_tested_not_a_crash():
    r = check_backward(G.einsum_delta_do)
    assert r.codes == ("grad-delta",), r.to_text()
    assert "rank" in {u.capability for u in r.unsupported}


def test_a_missing_bias_gradient_is_caught_in_the_bias_case():
    r = check_backward(G.bias_grad_missing)
    assert r.codes == ("grad-mismatch",), r.to_text()
    assert "dbias" in r.findings[0].evidence
    assert "dbias[" in "\n".join(r.findings[0].minimal.first_wrong)
    clean = check_backward(G.bias_correct)
    assert clean.ok and "bias" not in {u.capability for u in clean.unsupported}, clean.to_text()


def test_a_keep_mask_under_another_name_is_checked_with_dropout_arg():
    unnamed = check_backward(G.keep_ignored)  # keep= is not a known name: dropout is not tested, and says why
    assert unnamed.ok and "dropout" in {u.capability for u in unnamed.unsupported}, unnamed.to_text()
    assert "dropout_arg=" in unnamed.to_text()
    r = check_backward(G.keep_ignored, dropout_arg="keep")
    assert r.codes == ("grad-dropout",), r.to_text()
    m = r.findings[0].minimal
    assert m is not None and m.shrunk and m.case.keep is not None and "keep=E(keep)" in m.reproduction
    clean = check_backward(G.keep_correct, dropout_arg="keep")
    assert clean.ok and "dropout" not in {u.capability for u in clean.unsupported}, clean.to_text()
    assert _probe(clean, "grad-dropout").status == "passed"


def test_check_with_a_backward_takes_dropout_arg_and_comma_strings():
    r = attnlab.check(
        attnlab.scaled_dot_product_attention, backward=G.keep_ignored, dropout_arg="keep", dtypes="float64,float32"
    )
    assert "grad-dropout" in r.codes, r.to_text()
    assert r.spec["dtypes"] == ["float64", "float32"] or tuple(r.spec["dtypes"]) == ("float64", "float32")


def test_check_backward_takes_comma_strings():
    options = {"dtypes": "float64,float32", "unsupported": "bias,dropout"}
    r = check_backward(G.plain(), probes="grad-reference,grad-masked-keys,grad-masked-rows", **options)
    assert r.ok, r.to_text()
    assert {"float16", "bias", "dropout"} <= {u.capability for u in r.unsupported}
    assert [p.name for p in r.probes] == ["grad-preflight", "grad-reference", "grad-masked-keys", "grad-masked-rows"]


def _sdpa_with_bias(q, k, v, attn_mask=None, is_causal=False, scale=None, bias=None):
    m = attn_mask
    if bias is not None:
        m = bias if attn_mask is None else bias.masked_fill(~attn_mask, float("-inf"))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=is_causal, scale=scale)


def test_check_backward_true_honours_declared_gradient_capabilities():
    """``unsupported="bias"`` in ``check(fn, backward=True)``: the gradient side's bias case is not called."""
    r = attnlab.check(_sdpa_with_bias, backward=True, unsupported="bias", dtypes="float64,float32", isolate=False)
    assert r.ok, r.to_text()
    said = {u.capability: u.reason for u in r.unsupported}
    assert said.get("bias") == "declared unsupported", said
    assert _probe(r, "grad-large-logits").status == "passed" and _probe(r, "grad-mask-space").status == "passed"


def test_the_cli_takes_dropout_arg(capsys):
    from attnlab.cli import main

    target = "tests/grad_impls.py:tiled_forward"
    args = ["check", target, "--backward", "tests/grad_impls.py:keep_ignored", "--dropout-arg", "keep"]
    assert main([*args, "--dtypes", "float64,float32", "--no-color", "--width", "100"]) == 1
    out = capsys.readouterr().out
    assert "BUG grad-dropout" in out and "smallest case" in out, out


def test_gradient_cases_with_a_broadcast_mask_reach_the_backward():
    """The mask-space probe serves the gradients: masks passed broadcast, padding at the start and in the middle."""
    seen = []

    def bwd(q, k, v, d_out, mask=None, scale=None):
        seen.append(None if mask is None else np.shape(mask))
        return G.analytic(q, k, v, d_out, mask, scale)

    r = check_backward(bwd, probes="grad-mask-space")
    assert not r.findings and _probe(r, "grad-mask-space").status == "passed", r.to_text()
    assert (11,) in seen and (2, 1, 1, 11) in seen, seen
