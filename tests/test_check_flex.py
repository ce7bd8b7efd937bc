"""PyTorch's flex_attention as a checker interface: its masks as a ``block_mask`` or a ``score_mod``, a user's own
``mask_mod`` / ``score_mod`` against the dense rule it claims, and Hugging Face's ``flex_attention_forward``.

flex_attention runs eagerly here (torch 2.13 on the CPU: its unfused path, which materializes the scores); a
compiled one costs a minute or more of inductor compilation per shape on 2 cores, which ``compile_timeout`` allows
for (asserted through ``Resolved.compiles``, not run). torch 2.13 refuses flex_attention's backward on the CPU
(``NotImplementedError``), so the gradient check says so as "not tested", never as a finding.
"""

from __future__ import annotations

import functools
import math
import textwrap

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from attnlab import masks
from attnlab.checker import UsageError, check
from attnlab.checker.adapters import Adapter, Spec
from attnlab.checker.probes.mods import describe
from attnlab.cli import main

CORE = ("reference", "causal", "padding", "masked-rows")


def test_flex_attention_with_a_block_mask_is_clean():
    report = check(flex_attention)
    assert report.ok, report.to_text()
    assert report.signature.startswith("fn(q, k, v, block_mask=, scale=")
    assert "masked-row" in [n.code for n in report.notes]  # flex returns zeros on a fully masked row
    assert any("zeros" in n.message for n in report.notes if n.code == "masked-row")
    assert {u.capability for u in report.unsupported} == {"gqa", "rank"}
    assert all(p.status in ("passed", "skipped") for p in report.probes)
    assert "mask-broadcast" not in [n.code for n in report.notes]  # broadcast masks stay broadcast block masks


def test_flex_attention_with_a_causal_score_mod_is_clean_with_gqa():
    report = check(flex_attention, mask_arg="score_mod", gqa=True, probes=CORE)
    assert report.ok, report.to_text()
    assert report.signature.startswith("fn(q, k, v, score_mod=, scale=, enable_gqa=")
    causal = next(p for p in report.probes if p.name == "causal")
    assert causal.status == "passed" and causal.calls > 0


def test_flex_attention_backward_on_the_cpu_is_not_tested_not_a_finding():
    report = check(flex_attention, backward=True, probes=("reference",))
    assert not report.findings, report.to_text()
    if report.verdict == "incomplete":  # torch 2.13 on the CPU: flex_attention refuses requires_grad inputs
        reasons = {u.capability: u.reason for u in report.unsupported}
        for dtype in ("float64", "float32"):
            assert "does not support backward on CPU" in reasons[dtype]
    else:
        assert report.ok, report.to_text()


def test_flex_compiles_so_its_first_calls_get_the_compile_allowance():
    from transformers.integrations.flex_attention import flex_attention_forward

    assert Adapter(flex_attention, Spec()).resolved.compiles
    hf = Adapter(flex_attention_forward, Spec())  # module mode wraps it: still the flex function that compiles
    assert hf.resolved.mode and hf.resolved.compiles


def test_flex_mask_form_needs_torch():
    def np_flex(query, key, value, score_mod=None, block_mask=None, scale=None):
        return np.asarray(query)

    with pytest.raises(UsageError, match="mask_form='flex' passes the mask as a torch BlockMask"):
        check(np_flex, framework="numpy")
    with pytest.raises(UsageError, match="mask_convention: a flex block_mask / score_mod is built from a mask_mod"):
        check(flex_attention, mask_form="flex", mask_convention="block")


# ---------------------------------------------------------------------------------------------------------------
# flex wrappers with a bug, named by the battery


def flex_scale_twice(query, key, value, score_mod=None, block_mask=None, scale=None):
    """Applies the scale in a score_mod although flex_attention applies it too."""
    s = 1 / math.sqrt(query.shape[-1]) if scale is None else scale

    def scaled(score, b, h, q_idx, kv_idx):
        return (score if score_mod is None else score_mod(score, b, h, q_idx, kv_idx)) * s

    return flex_attention(query, key, value, score_mod=scaled, block_mask=block_mask, scale=s)


def causal_flex_wrong_direction(query, key, value, block_mask=None, scale=None):
    """A causal flex kernel whose mask_mod reads the causal rule the wrong way round (kv_idx >= q_idx)."""
    n_q, n_k = query.shape[-2], key.shape[-2]
    allowed = None if block_mask is None else block_mask.to_dense()  # noqa: F841 (the given mask is dropped too)

    def causal(b, h, q_idx, kv_idx):
        return kv_idx >= q_idx

    bm = create_block_mask(causal, None, None, n_q, n_k, device=query.device)
    return flex_attention(query, key, value, block_mask=bm, scale=scale)


def test_a_score_mod_that_scales_again_is_scale_wrong():
    report = check(flex_scale_twice, probes=("reference",))
    assert "scale-wrong" in report.codes, report.to_text()
    f = next(f for f in report.findings if f.code == "scale-wrong")
    assert "1/d_k" in f.message


def flex_mask_dropped(query, key, value, score_mod=None, block_mask=None, scale=None):
    """Takes a block mask and never passes it on."""
    return flex_attention(query, key, value, score_mod=score_mod, scale=scale)


def test_a_dropped_block_mask_is_named_and_its_reproduction_builds_the_block_mask():
    report = check(flex_mask_dropped, probes=("reference",))
    f = report.findings[0]
    assert f.code in ("padding-leak", "causal-leak"), report.to_text()
    assert (
        f.minimal is not None and "m = create_block_mask(mask_mod, *a.shape, device=a.device)" in f.minimal.reproduction
    )
    with pytest.raises(AssertionError, match="max \\|out - expected\\|"):
        exec(compile(f.minimal.reproduction, "<reproduction>", "exec"), {})


def test_a_causal_mask_mod_in_the_wrong_direction_is_a_causal_leak():
    report = check(causal_flex_wrong_direction, causal_only=True, unsupported=("mask",), probes=("causal",))
    assert "causal-leak" in report.codes, report.to_text()


# ---------------------------------------------------------------------------------------------------------------
# a user's own mods against the rule they claim


def causal_mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def causal_mod_backwards(b, h, q_idx, kv_idx):
    return q_idx <= kv_idx


def window_mod_off_by_one(b, h, q_idx, kv_idx):  # meant: 3 keys back (masks.window(left=3)); sees 4
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= 4)


def masking_score_mod_scaled(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx >= kv_idx, score / math.sqrt(8), -float("inf"))


WINDOW_3 = functools.partial(masks.window, left=3, align="top_left")


def _mods(**kw):
    report = check(flex_attention, probes=("mods",), **kw)
    mods = next(p for p in report.probes if p.name == "mods")
    return report, mods


def test_a_mask_mod_that_matches_its_claim_has_no_finding():
    report, mods = _mods(mask_mod=causal_mod, claims="causal")
    assert mods.status == "passed" and not report.findings, report.to_text()
    report, mods = _mods(mask_mod=lambda b, h, q, kv: (q >= kv) & (q - kv <= 3), claims=WINDOW_3)
    assert mods.status == "passed" and not report.findings, report.to_text()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"mask_mod": causal_mod_backwards, "claims": "causal"}, "q_idx and kv_idx swapped"),
        ({"mask_mod": causal_mod, "claims": "causal:bottom_right"}, "the top_left alignment, not the claimed one"),
        ({"mask_mod": window_mod_off_by_one, "claims": WINDOW_3}, "all on the diagonal kv_idx - q_idx = -4"),
        ({"score_mod": masking_score_mod_scaled, "claims": "causal"}, "multiplies the scores it keeps by 0.353553"),
    ],
    ids=["causal-backwards", "other-alignment", "window-off-by-one", "score-mod-scales-again"],
)
def test_a_mod_that_differs_from_its_claim_is_named(options, words):
    report, _ = _mods(**options)
    assert report.codes == ("mod-mismatch",), report.to_text()
    f = report.findings[0]
    assert words in f.message, f.message
    assert f.evidence.startswith("geometry B, h, n_q, n_k = ") and f.fix


def test_the_off_by_one_window_is_drawn_at_its_first_wrong_row():
    report, _ = _mods(mask_mod=window_mod_off_by_one, claims=WINDOW_3)
    f = report.findings[0]
    assert "off-by-one" in f.message and "window(n_q, n_k, left=3, align='top_left')" in f.message
    assert "(2, 3, 5, 5); query 4 of b=0, h=0: mask_mod ■■■■■, claimed ⬚■■■■" in f.evidence


def test_describe_names_an_inverted_rule_and_per_head_differences():
    rule = masks.causal(4, 4)
    assert "inverted" in describe(~rule[None, None], rule)
    per_head = np.stack([rule, rule & ~np.eye(4, dtype=bool)])[None]  # [1, 2, 4, 4]
    assert "differs between batch elements or heads" in describe(per_head, rule)


def test_mods_need_a_claim_and_a_claim_must_be_a_rule():
    with pytest.raises(UsageError, match="claims: a mask_mod= or score_mod= is checked against the dense rule"):
        check(flex_attention, mask_mod=causal_mod)
    with pytest.raises(UsageError, match="claims: expected one of 'causal'"):
        check(flex_attention, mask_mod=causal_mod, claims="causal:diagonal")
    with pytest.raises(UsageError, match="claims: the rule raised MaskError for n_q=1, n_k=17"):
        window3 = functools.partial(masks.window, left=3)  # no alignment: raises for n_q != n_k
        check(flex_attention, mask_mod=lambda b, h, q, kv: (q >= kv) & (q - kv <= 3), claims=window3, probes=("mods",))


def test_the_command_line_takes_mods_from_the_targets_file(tmp_path, capsys):
    target = tmp_path / "my_flex.py"
    target.write_text(
        textwrap.dedent(
            """
            from torch.nn.attention.flex_attention import flex_attention as attention

            def window(b, h, q_idx, kv_idx):
                return (q_idx >= kv_idx) & (q_idx - kv_idx < 3)  # 3 keys back meant: < where <= is
            """
        )
    )
    claims = tmp_path / "rules.py"
    claims.write_text(
        "from attnlab import masks\n\n\ndef window3(n_q, n_k):\n"
        "    return masks.window(n_q, n_k, left=3, align='top_left')\n"
    )
    status = main(
        ["check", f"{target}:attention", "--mask-mod", "window", "--claims", f"{claims}:window3", "--probes", "mods"]
    )
    out = capsys.readouterr().out
    assert status == 1, out
    assert "mod-mismatch" in out and "blocks 127" not in out and "all on the diagonal kv_idx - q_idx = -3" in out


# ---------------------------------------------------------------------------------------------------------------
# Hugging Face


def test_hugging_face_flex_attention_forward_is_clean_eagerly():
    """HF's function compiles flex_attention (torch.compile) on its first call; the stance ``force_eager`` makes
    it run eagerly here (see the module doc); its module mode and the additive mask it reads are what is checked."""
    from transformers.integrations.flex_attention import flex_attention_forward

    with torch.compiler.set_stance("force_eager"):
        report = check(flex_attention_forward, gqa=True, mask_form="batch", probes=CORE)
    assert report.ok, report.to_text()
    assert report.mode
