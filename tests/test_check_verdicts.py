"""Honest verdicts: OK only when the core probes ran and passed; a crash is not 'unsupported'; explanations stay
within a case; a probe that saw a bug never says ok."""

from __future__ import annotations

import json
import math

import pytest
import torch
from zoo import numpy_zoo as npz

from attnlab.checker import CORE_PROBES, ExitStatus, check


def reference_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """PyTorch's documented reference implementation of scaled_dot_product_attention (its docs, verbatim): the
    bias is [L, S], so a boolean [B, h, L, S] mask cannot be filled into it in place."""
    L, S = query.size(-2), key.size(-2)
    scale_factor = 1 / math.sqrt(query.size(-1)) if scale is None else scale
    attn_bias = torch.zeros(L, S, dtype=query.dtype, device=query.device)
    if is_causal:
        assert attn_mask is None
        temp_mask = torch.ones(L, S, dtype=torch.bool).tril(diagonal=0)
        attn_bias.masked_fill_(temp_mask.logical_not(), float("-inf"))
        attn_bias.to(query.dtype)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_bias.masked_fill_(attn_mask.logical_not(), float("-inf"))
        else:
            attn_bias = attn_mask + attn_bias
    if enable_gqa:
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
    attn_weight = query @ key.transpose(-2, -1) * scale_factor
    attn_weight += attn_bias
    attn_weight = torch.softmax(attn_weight, dim=-1)
    attn_weight = torch.dropout(attn_weight, dropout_p, train=True)
    return attn_weight @ value


def test_reference_sdpa_raising_on_every_masked_call_is_a_crash_not_ok():
    r = check(reference_sdpa)
    assert r.codes == ("crash",) and not r.ok and r.exit_status == ExitStatus.BUG
    f = r.findings[0]
    assert f.message.startswith("your function raised RuntimeError on every call with a mask (it works without it)")
    # the call that raised and the exception
    assert "attn_mask=bool [2, 3, 9, 9]" in f.evidence
    assert "RuntimeError: output with shape [9, 9] doesn't match the broadcast shape [2, 3, 9, 9]" in f.evidence
    untested = {u.capability: u.reason for u in r.unsupported}
    assert untested["mask"].startswith("crashed on every attempt")  # not "refused"
    assert {u.capability for u in r.incomplete} == {"padding", "masked-rows"}


def test_a_masked_fill_typo_is_a_crash():
    def typo(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fil(~mask, float("-inf"))  # typo: AttributeError on every masked call
        return torch.softmax(s, dim=-1) @ v

    r = check(typo, dtypes=("float64", "float32"))
    assert r.codes == ("crash",)
    assert "AttributeError" in r.findings[0].message and "masked_fil" in r.findings[0].evidence


@pytest.mark.parametrize(
    ("error", "unsupported"),
    [
        (NotImplementedError("no"), True),
        (ValueError("masks are not supported"), True),  # names the argument
        (TypeError("attention() got an unexpected keyword argument 'mask'"), True),
        (RuntimeError("boom"), False),
        (IndexError("index 3 is out of bounds"), False),
    ],
)
def test_only_clean_refusals_are_unsupported(error, unsupported):
    def f(q, k, v, mask=None):
        if mask is not None:
            raise error
        return npz.correct(q, k, v)

    r = check(f)
    reasons = {u.capability: u.reason for u in r.unsupported}
    if unsupported:
        assert r.ok, r.to_text()
        assert reasons["mask"].startswith(f"refused on every attempt: {type(error).__name__}")
    else:
        assert r.codes == ("crash",), r.to_text()
        assert f"raised {type(error).__name__} on every call with a mask" in r.findings[0].message


def test_crash_without_a_mask_but_works_with_one():
    def needs_mask(q, k, v, mask=None):
        return npz.correct(q, k, v, mask.reshape(*q.shape[:-1], k.shape[-2]))  # None has no reshape

    def safe(q, k, v, mask=None):
        if mask is None:
            raise TypeError("mask is required")  # a clean refusal of calls without a mask would still crash:
        return npz.correct(q, k, v, mask)  # without a mask is not a capability one can refuse

    for fn in (needs_mask, safe):
        r = check(fn)
        assert "crash" in r.codes, r.to_text()
        crash = next(f for f in r.findings if f.code == "crash")
        assert "on every call without a mask (mask=None)" in crash.message and "it works with one" in crash.message
        probes = {p.name: p.status for p in r.probes}
        assert probes["padding"] == "passed" and probes["masked-rows"] == "passed"  # the masked path was tested


def test_crash_with_a_mask_but_works_without_one_is_a_crash():
    def f(q, k, v, mask=None):
        if mask is not None:
            mask = mask[0, 0, 0, 0, 0]  # IndexError: too many indices
        return npz.correct(q, k, v, mask)

    r = check(f)
    assert r.codes == ("crash",)
    assert r.findings[0].message.startswith("your function raised IndexError on every call with a mask")


def test_incomplete_when_every_dtype_is_refused_cleanly():
    def refuses(q, k, v, mask=None):
        raise NotImplementedError(f"{q.dtype} is not supported")

    r = check(refuses)
    assert r.findings == () and r.verdict == "incomplete" and r.exit_status == ExitStatus.INCOMPLETE
    assert [u.capability for u in r.incomplete] == list(CORE_PROBES)
    assert "no dtype could be tested" in r.incomplete[0].reason
    assert "float64: refused on every attempt: NotImplementedError: float64 is not supported" in r.incomplete[0].reason
    assert r.to_text().splitlines()[-1].startswith("INCOMPLETE no bug found, but not run: reference, causal")


def test_incomplete_when_a_core_probe_is_left_out_and_ok_only_when_all_ran():
    r = check(npz.correct, probes=("reference", "causal", "padding"))
    assert r.verdict == "incomplete" and [(u.capability, u.reason) for u in r.incomplete] == [
        ("masked-rows", "not selected (probes=...)")
    ]
    assert "NOT RUN masked-rows: not selected (probes=...)" in r.to_text()
    assert check(npz.correct).verdict == "clean"
    # a function without a mask argument is not required to pass the mask probes
    r = check(lambda q, k, v: npz.correct(q, k, v), probes=("reference", "causal"))
    assert r.verdict == "clean", r.to_text()


def test_explained_only_within_the_same_case():
    def inverted_and_batch_leak(q, k, v, mask=None):
        if mask is not None:
            return npz.correct(q, k, v, ~mask)  # mask-inverted, seen in the masked cases
        return npz.batch_reshape(q, k, v)  # an unrelated batch leak, seen in the unmasked cases

    r = check(inverted_and_batch_leak)
    # before: mask-inverted "explained" the batch leak found in other cases, and one bug surfaced
    assert {"mask-inverted", "batch-leak"} <= set(r.codes), r.to_text()
    assert "batch-leak" not in r.explained


def test_two_bugs_in_one_function_surface_as_two():
    def two_bugs(q, k, v, mask=None):
        return npz.scale_missing(q, k, v, None if mask is None else ~mask)

    r = check(two_bugs, probes=("reference",))
    assert {"scale-missing", "mask-inverted"} <= set(r.codes), r.to_text()


def test_json_keeps_every_explained_finding_with_its_evidence():
    r = check(npz.softmax_axis)
    assert r.codes == ("softmax-axis",)
    data = json.loads(r.to_json())
    explained = {f["code"]: f for f in data["explained_findings"]}
    assert set(explained) == set(data["explained"]) and explained
    for f in explained.values():
        assert f["explained_by"] == "softmax-axis" and f["evidence"] and f["message"]
    assert "also seen, explained by the above in the same case:" in r.to_text()


def test_a_probe_that_saw_a_bug_never_prints_ok():
    for fn in (npz.causal_off_by_one, npz.softmax_axis, npz.crash_odd, npz.global_normalizer):
        r = check(fn)
        seen = {f.probe for f in (*r.findings, *r.explained_findings)}
        line = next(x for x in r.to_text().splitlines() if x.startswith("probes: "))
        for p in r.probes:
            if p.codes:
                assert p.status == "failed" and f"{p.name} FAIL ({', '.join(p.codes)})" in line, line
            if p.name in seen:
                assert p.status == "failed", (fn.__name__, p)
            if p.status == "passed":
                assert not p.codes
    r = check(npz.causal_off_by_one)
    probes = {p.name: p for p in r.probes}
    assert probes["causal"].status == "failed" and "causal-leak" in probes["causal"].codes  # not "causal ok"


def test_a_crash_seen_again_later_still_fails_that_probe():
    r = check(npz.crash_odd)
    statuses = {p.name: p for p in r.probes}
    assert r.codes == ("crash",)
    failed = [p for p in statuses.values() if "crash" in p.codes]
    assert len(failed) >= 2 and all(p.status == "failed" for p in failed)  # not only the first probe


# ------------------------------------------------------------------------------------------- issue 13 §5 diagnoses
def test_registries_keep_the_public_names_and_every_code_has_a_fix():
    from attnlab.checker import FIXES, PROBES
    from attnlab.checker.hypotheses import HYPOTHESES
    from attnlab.checker.probes import PROBE_FUNCTIONS

    assert (
        PROBES == tuple(PROBE_FUNCTIONS)
        and PROBES[0] == "reference"
        and PROBES[-5:] == ("determinism", "call-order", "mask-space", "decode", "mods")
    )
    codes = {part for h in HYPOTHESES for part in h.code.split("+")}
    assert codes <= set(FIXES)
    assert {"scale-after-softmax", "fill-after-softmax", "finite-fill", "mask-wrong-heads", "gqa-mapping"} <= codes


def test_precision_declared_is_a_note_and_undeclared_a_bug():
    r = check(npz.weights_float16)
    assert r.codes == ("precision",), r.to_text()
    assert "float16" in r.findings[0].message
    r = check(npz.weights_float16, compute_dtype="float16")
    assert r.ok and any("as declared" in n.message for n in r.notes if n.code == "lower-precision"), r.to_text()
    # float32 for every dtype is the upcasting oracle's pattern: a note by default, a bug when held to the input
    assert check(npz.computes_in_float32).ok
    assert check(npz.computes_in_float32, compute_dtype="input").codes == ("precision",)


def test_a_finite_fill_is_caught_only_with_large_scores_and_finfo_min_stays_clean():
    assert check(npz.fill_1e4, probes=("reference", "causal", "padding", "masked-rows")).codes == ("finite-fill",)
    r = check(npz.fill_1e4)
    f = next(f for f in r.findings if f.code == "finite-fill")
    assert f.probe in ("causal", "padding") and "scores in [" in f.evidence  # whichever large-score case runs first
    for fn in (npz.fill_finfo_min, npz.additive_finfo_min):
        assert check(fn).ok

    def half_fill(q, k, v, mask=None):  # finfo(float16).min in float16 blocks: correct
        s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        if mask is not None:
            s = s.masked_fill(~mask, torch.finfo(torch.float16).min)
        return torch.softmax(s.float(), -1).to(q.dtype) @ v

    assert check(half_fill, dtypes=("float16",)).ok


def test_two_bugs_each_with_its_own_message():
    r = check(npz.two_bugs, probes=("reference",))
    msgs = {f.code: f.message for f in r.findings}
    assert msgs["scale-missing"] == "your function does not scale the scores by 1/sqrt(d_k)"
    assert msgs["mask-inverted"].startswith("your function treats True as 'blocked'")


def test_crash_only_without_a_mask_for_n_q_ne_n_k_and_output_like_q():
    r = check(npz.default_mask_square)
    assert r.codes == ("crash",) and "with n_q != n_k without a mask" in r.findings[0].message
    assert "cross" not in {u.capability for u in r.unsupported}
    r = check(npz.output_like_q)
    assert r.codes == ("crash",) and "could not broadcast" in r.findings[0].evidence
    assert {u.capability: u.reason for u in r.unsupported}["dv"].startswith("crashed on every attempt")


def test_mask_wrong_heads_names_the_expansion():
    r = check(npz.key_padding_tiled, ranks=(4,))
    assert r.codes == ("mask-wrong-heads",) and "repeat" in r.findings[0].message
    assert check(npz.key_padding_repeated, ranks=(4,)).ok
