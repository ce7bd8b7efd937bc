"""attnlab.check (attnlab.checker): options, adapters, report rendering and JSON, timeouts, properties."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zoo import numpy_zoo as npz

import attnlab
from attnlab.checker import CODES, FIXES, PROBES, Finding, Report, UsageError, check
from attnlab.checker.adapters import Spec, bfloat16_round, detect_framework
from attnlab.checker.tolerance import bound, golden_output, naive_output


def test_check_is_exported_from_attnlab():
    import attnlab.checker

    assert callable(attnlab.check) and attnlab.check is check
    assert attnlab.checker.check is check  # importing the subpackage leaves the function in place
    assert attnlab.check(npz.scale_missing, probes=("reference",)).codes == ("scale-missing",)
    assert attnlab.Report is Report and attnlab.Finding is Finding


def test_every_code_has_a_meaning_and_a_fix_and_docs():
    assert set(CODES) == set(FIXES)
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "checker.md").read_text(encoding="utf-8")
    for code in CODES:
        assert f"`{code}`" in doc, code


def test_every_option_has_a_row_in_the_docs_table():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "checker.md").read_text(encoding="utf-8")
    first_cells = [line.split("|")[1] for line in doc.splitlines() if line.startswith("| `")]
    for f in dataclasses.fields(Spec):
        assert any(f"`{f.name}`" in cell for cell in first_cells), f.name


def test_report_is_frozen_and_round_trips_through_json():
    r = check(npz.scale_missing, probes=("reference", "determinism"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.findings = ()
    d = json.loads(r.to_json())
    assert d["ok"] is False and d["command"] == "check"
    assert [f["code"] for f in d["findings"]] == ["scale-missing"]
    f = d["findings"][0]
    assert set(f) == {"code", "severity", "message", "evidence", "fix", "probe", "minimal"}
    assert "q (2, 2, 5, 8)" in f["evidence"] and "max |out - reference|" in f["evidence"]
    assert [p["name"] for p in d["probes"]] == ["preflight", "reference", "determinism"]
    assert d["spec"]["mask_convention"] == "allow"


def test_text_and_rich_rendering_agree_at_a_fixed_width():
    r = check(npz.mask_inverted, probes=("reference",))
    text = r.to_text().splitlines()
    rich = r.render(width=200, color=False).splitlines()
    assert [line.rstrip() for line in rich] == [line.rstrip() for line in text]
    assert text[0] == "attnlab check: zoo.numpy_zoo:mask_inverted"
    assert text[1] == "  numpy, called as fn(q, k, v, mask=)"
    assert text[2] == (
        "BUG mask-inverted: your function treats True as 'blocked' (the mask is read inverted; declared True = may "
        "attend)"
    )
    assert text[-1].startswith("FAILED 1 bug found: mask-inverted")
    coloured = r.render(width=80, color=True)
    assert "\x1b[" in coloured
    assert all(len(line) <= 80 for line in r.render(width=80, color=False).splitlines())


def test_scale_wrong_names_the_wrong_dimension():
    r = check(npz.scale_d_model, probes=("reference",))
    f = r.findings[0]
    assert f.code == "scale-wrong"
    assert "d_model" in f.message and "h·d_k" in f.message


def test_declared_unsupported_capabilities_are_not_tested():
    r = check(npz.correct, unsupported=("mask", "float16"))
    assert r.ok
    caps = {u.capability: u.reason for u in r.unsupported}
    assert caps["mask"] == "declared unsupported" and caps["float16"] == "declared unsupported"
    assert {p.name: p.status for p in r.probes}["padding"] == "skipped"


def test_clean_refusal_is_unsupported_not_a_bug():
    r = check(npz.refuses_half)
    assert r.ok
    reason = {u.capability: u.reason for u in r.unsupported}["float16"]
    assert reason.startswith("refused on every attempt: NotImplementedError: float16 is not supported")


def test_timeout_stops_the_battery_and_names_the_case():
    r = check(npz.hangs_on_cross, timeout=1.0)  # per call; the hang is 5 s, a normal call ms even under load
    assert r.codes == ("timeout",)
    assert "cross" in r.findings[0].evidence
    assert any(p.status == "not run" for p in r.probes)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mask_convention": "inverted"}, "mask_convention: expected one of 'allow', 'block', 'additive', 'keep'"),
        ({"layout": "nhd"}, "layout: expected one of 'auto', 'bhnd', 'bnhd', got 'nhd'"),
        ({"dtypes": ("float8",)}, "dtypes: expected one of"),
        ({"unsupported": ("flash",)}, "unsupported: expected one of"),
        ({"probes": ("speed",)}, "probes: unknown probe 'speed'"),
        ({"timeout": 0}, "timeout: expected a positive number of seconds, got 0"),
        ({"timeout": 1e6}, "timeout: expected a number of seconds at most 86400 (a day), got 1000000.0"),
        ({"import_timeout": "soon"}, "import_timeout: expected a positive number of seconds, got 'soon'"),
        ({"seed": -1}, "seed: expected an int >= 0, got -1"),
        ({"isolate": "yes"}, "isolate: expected one of None, True, False, got 'yes'"),
        ({"causal_only": "no"}, "causal_only: expected True or False, got 'no'"),
        ({"gqa": "repeat"}, "gqa: expected one of False, True, 'interleave', 'tile', got 'repeat'"),
        ({"ranks": (3,)}, "ranks: the checker calls with 4-D inputs [B, h, n, d]; got ranks=(3,)"),
        ({"mask_arg": 3}, "mask_arg: expected a string or None, got 3"),
    ],
)
def test_bad_options_are_usage_errors(options, message):
    with pytest.raises(UsageError, match="^" + re.escape(message)):
        check(npz.correct, **options)


def test_check_keywords_are_specs_fields_with_their_defaults_and_docs():
    import inspect

    from attnlab.checker.spec import options

    params = list(inspect.signature(check).parameters.values())
    assert params[0].name == "fn"
    assert (params[-1].name, params[-1].default) == ("progress", None)  # not an option: how the run is shown
    params = params[:-1]
    fields = {f.name: f.default for f in dataclasses.fields(Spec)}
    assert {p.name: p.default for p in params[1:]} == fields
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:])
    for name, default, opt in options():
        assert opt.doc and f"        {name}: " in check.__doc__ and f"        {name}: " in Spec.__doc__, name
        assert opt.group in ("function", "run")
        assert Spec(**{name: default}) == Spec()  # every default is valid as given
    assert set(Spec().as_dict()) == {n for n, _, o in options() if o.group == "function"}


def test_unknown_keywords_are_type_errors_that_suggest_the_option():
    with pytest.raises(
        TypeError, match="check\\(\\) got an unexpected keyword argument 'maskform'; did you mean 'mask_form'"
    ):
        check(npz.correct, maskform="batch")


def test_spec_accepts_the_command_lines_spellings():
    s = Spec(dtypes="float64, float32", unsupported="mask,gqa", ranks="4", probes="reference", gqa="tile")
    assert s.dtypes == ("float64", "float32") and s.unsupported == frozenset({"mask", "gqa"})
    assert s.ranks == (4,) and s.probes == ("reference",) and (s.gqa, s.gqa_mapping) == (True, "tile")
    assert Spec(device=torch_device("cpu")).device == "cpu"


def torch_device(name):
    import torch

    return torch.device(name)


def test_not_callable_is_a_usage_error():
    with pytest.raises(UsageError, match="fn: expected a callable attention function, got int"):
        check(3)


def test_framework_detection_follows_helpers():
    from zoo import torch_zoo

    assert detect_framework(npz.correct) == "numpy"
    assert detect_framework(torch_zoo.returns_float32) == "torch"  # only via the helper _manual
    assert detect_framework(torch_zoo.MHAWrapper()) == "torch"


def test_spec_is_frozen_and_validates():
    s = Spec(mask_convention="additive", unsupported={"gqa"})
    assert s.unsupported == frozenset({"gqa"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.layout = "bnhd"


def test_inputs_are_not_modified_by_the_checker_and_reports_are_reproducible():
    a = check(npz.shuffled_keys, probes=("reference",), seed=3)
    b = check(npz.correct, seed=3)
    c = check(npz.correct, seed=3)
    # shuffling keys is exact enough for the tolerance rule; only determinism catches it. With the reference probe
    # alone no bug is found, but the causal, padding and masked-rows probes did not run: incomplete, not OK
    assert a.findings == () and a.verdict == "incomplete" and not a.ok
    assert [u.capability for u in a.incomplete] == ["causal", "padding", "masked-rows"]
    assert b.to_json().replace(str(b.seconds), "").count('"ok": true') == 1
    assert [p.calls for p in b.probes] == [p.calls for p in c.probes]


def test_signature_styles_and_conventions():
    def kw_only(query, key, value, *, attention_mask=None, causal=False, softmax_scale=None):
        allowed = attention_mask == 1 if attention_mask is not None else None
        if causal:
            c = np.tril(np.ones((query.shape[-2], key.shape[-2]), bool))
            allowed = c if allowed is None else allowed & c
        scale = softmax_scale if softmax_scale is not None else 1 / math.sqrt(query.shape[-1])
        return npz._softmax(query @ np.swapaxes(key, -1, -2) * query.dtype.type(scale), allowed) @ value

    r = check(kw_only, mask_convention="keep", causal_align="top_left")
    assert r.ok, r.to_text()
    assert r.signature == "fn(q, k, v, attention_mask=, causal=, softmax_scale=)"
    assert not {"mask", "causal", "scale"} & {u.capability for u in r.unsupported}

    def qkv_only(q, k, v):
        return npz.correct(q, k, v)

    r = check(qkv_only)
    assert r.ok
    assert {"mask", "scale"} <= {u.capability for u in r.unsupported}


def test_bfloat16_rounding_matches_torch():
    import torch

    x = np.random.default_rng(0).normal(0, 100, 1000).astype(np.float32)
    expected = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(bfloat16_round(x), expected)


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 2),
    h=st.integers(1, 3),
    n_q=st.integers(1, 9),
    n_k=st.integers(1, 9),
    d_k=st.integers(1, 8),
    d_v=st.integers(1, 8),
    dtype=st.sampled_from(["float64", "float32", "float16", "bfloat16"]),
    seed=st.integers(0, 10_000),
)
def test_tolerance_rule_accepts_attnlab_and_rejects_a_missing_scale(b, h, n_q, n_k, d_k, d_v, dtype, seed):
    import torch

    rng = np.random.default_rng(seed)
    q, k, v = (
        bfloat16_round(rng.normal(0, 1, s)).astype(dtype if dtype != "bfloat16" else np.float32)
        for s in ((b, h, n_q, d_k), (b, h, n_k, d_k), (b, h, n_k, d_v))
    )
    golden = golden_output(q, k, v)
    tol = bound(dtype, golden, naive_output(q, k, v, dtype=dtype))
    if dtype == "bfloat16":
        t = [torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v)]
        out = attnlab.scaled_dot_product_attention(*t).float().numpy()
    else:
        out = attnlab.scaled_dot_product_attention(q, k, v)
    assert np.max(np.abs(out - golden)) <= tol
    wrong = golden_output(q, k, v, scale=1.0)
    if d_k >= 4 and n_k >= 2 and np.max(np.abs(wrong - golden)) > 0.05:
        assert np.max(np.abs(wrong - golden)) > tol


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_correct_implementations_are_clean_for_any_seed(seed):
    assert check(npz.correct, seed=seed).ok
    assert check(npz.correct_additive, mask_convention="additive", seed=seed).ok


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_diagnoses_do_not_depend_on_the_seed(seed):
    assert check(npz.softmax_axis, seed=seed, probes=("reference",)).codes == ("softmax-axis",)
    assert check(npz.mask_after_softmax, seed=seed).codes == ("mask-after-softmax",)
    # plus reference-mismatch: the rectangular causal case matches neither alignment (see the zoo entry)
    assert check(npz.causal_off_by_one, seed=seed).codes == ("reference-mismatch", "causal-leak")


def test_probe_list_is_documented():
    import attnlab.checker.probes as probes_mod

    for name in PROBES:
        assert f"``{name}``" in probes_mod.__doc__


def test_import_attnlab_stays_light():
    import subprocess
    import sys

    code = (
        "import sys, attnlab, attnlab.checker, attnlab.testing; "
        "print(sorted(m for m in ('rich', 'torch', 'jax', 'matplotlib', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_survives_nan_garbage_and_exits():
    def all_nan(q, k, v, mask=None):
        return np.full((*q.shape[:-1], v.shape[-1]), np.nan, dtype=q.dtype)

    r = check(all_nan, probes=("reference",))
    assert r.codes == ("reference-mismatch",)
    assert "non-finite value(s)" in r.findings[0].evidence

    def three(q, k, v, mask=None):
        return q, k, v

    r = check(three)
    assert r.codes == ("crash",)
    assert (
        r.findings[0].message
        == "your function returned a tuple of 3 items; expected an array, or a pair (out, weights)"
    )

    def leaves(q, k, v, mask=None):
        raise SystemExit(3)

    r = check(leaves)
    assert r.codes == ("crash",)
    assert "SystemExit: 3" in r.findings[0].evidence


def test_declared_alignment_differs_from_a_causal_only_function():
    # the caller relies on top-left; the function's built-in mask is bottom-right: queries see their future
    r = check(npz.causal_only, causal_only=True, causal_align="top_left")
    assert r.codes == ("causal-alignment",), r.to_text()
    f = r.findings[0]
    assert f.message.startswith("your function aligns its causal mask bottom-right")
    assert "queries see keys in their declared future" in f.message


def test_additive_and_keep_conventions_catch_inversion():
    def additive_inverted(q, k, v, mask=None):
        allowed = None if mask is None else mask < -1
        return npz.correct(q, k, v, allowed)

    r = check(additive_inverted, mask_convention="additive", probes=("reference",))
    assert r.codes == ("mask-inverted",)
    assert "additive mask inverted" in r.findings[0].message

    def keep_inverted(q, k, v, mask=None):
        return npz.correct(q, k, v, None if mask is None else mask == 0)

    assert check(keep_inverted, mask_convention="keep", probes=("reference",)).codes == ("mask-inverted",)
