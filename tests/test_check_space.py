"""The case-space probes (mask-space, decode, call-order): each family catches a hand-written bug that the
probes before it (the grid's full-size masks, fresh single calls) report clean, and names it."""

from __future__ import annotations

import pytest
import space_impls as impls

from attnlab.checker import PROBES, check
from attnlab.checker.report import CODES

pytestmark = pytest.mark.xdist_group("test_check_space")

#: Every probe but the case-space ones: the checker as it was before them.
BEFORE = tuple(p for p in PROBES if p not in ("call-order", "mask-space", "decode"))

CASES = [
    # (function, the probe that alone sees it, the code it is named by)
    (impls.sink_key0, "mask-space", "padding-leak"),  # key 0 blocked: the first key is never blocked before
    (impls.tail_tile_unmasked, "mask-space", "padding-leak"),  # 33 keys: a masked ragged tile after full ones
    (impls.mask_tile_not_interleave, "mask-space", "mask-wrong-heads"),  # a [B, 1, n_q, n_k] mask, broadcast
    (impls.decode_fast_path, "decode", "padding-leak"),  # one query with key padding
    (impls.memo_by_shape, "call-order", "nondeterministic"),  # the second call of a shape
    (impls.kv_cache_never_reset, "call-order", "nondeterministic"),  # the same inputs again after others
]


@pytest.mark.parametrize(("fn", "probe", "code"), CASES, ids=[c[0].__name__ for c in CASES])
def test_a_case_space_bug_is_clean_before_and_named_after(fn, probe, code):
    impls.reset()
    before = check(fn, probes=BEFORE)
    assert before.ok, before.to_text()
    impls.reset()
    report = check(fn)
    assert report.codes == (code,), report.to_text()
    result = next(p for p in report.probes if p.name == probe)
    assert result.status == "failed" and code in result.codes, report.to_text()


def test_the_padding_patterns_block_the_first_and_last_key_and_pad_everywhere():
    from attnlab.checker.probes.space import key_patterns

    p = key_patterns(17)
    assert not p["first"][0] and p["first"][1:].all()
    assert not p["last"][-1] and p["last"][:-1].all()
    assert not p["start"][:3].any() and p["start"][3:].all()
    assert not p["end"][-3:].any() and p["end"][:-3].all()
    assert not p["both"][0] and not p["both"][-1] and p["both"][8]
    assert p["middle"][0] and p["middle"][-1] and not p["middle"][8]


def test_a_broadcast_mask_reaches_the_function_in_its_own_shape():
    seen = []

    def correct(q, k, v, mask=None):
        if mask is not None:
            seen.append(mask.shape)
        return impls.correct(q, k, v, mask)

    report = check(correct, probes=("reference", "mask-space"))
    assert not report.codes, report.to_text()
    assert {(11,), (7, 11), (2, 1, 1, 11), (2, 1, 7, 11), (1, 2, 7, 11)} <= set(seen)


def test_a_refused_broadcast_is_a_note_and_the_full_size_cases_still_run():
    def four_d_only(q, k, v, mask=None):
        if mask is not None and mask.ndim != 4:
            raise ValueError(f"mask must be 4-D, got {mask.ndim}-D")
        return impls.sink_key0(q, k, v, mask)

    report = check(four_d_only, probes=("reference", "mask-space"))
    assert "padding-leak" in report.codes, report.to_text()
    assert any(n.code == "mask-broadcast" for n in report.notes), report.to_text()


def test_a_correct_function_stays_clean_and_the_new_probes_are_cheap():
    before = check(impls.correct, probes=BEFORE)
    report = check(impls.correct)
    assert report.ok, report.to_text()
    assert report.calls - before.calls <= 40
    assert all(p.status == "passed" for p in report.probes if p.name in ("call-order", "mask-space", "decode"))
    assert set(report.codes) <= set(CODES)
