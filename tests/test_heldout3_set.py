"""The third held-out set (tests/heldout3) checks itself without the checker: its files are complete and well formed,
every correct case matches a float64 reference, and every buggy case differs from it on a stated input."""

import re
from collections import Counter

import numpy as np
import pytest
from heldout3 import PREFIXES, case_names, kind_of, load_cases, verify_set

pytestmark = pytest.mark.xdist_group("test_heldout3_set")

#: Every finding code docs/checker.md names (forward and backward sections).
CODES = {
    "reference-mismatch", "scale-missing", "scale-wrong", "scale-after-softmax", "softmax-axis", "mask-inverted",
    "mask-after-softmax", "fill-after-softmax", "finite-fill", "mask-wrong-heads", "causal-alignment", "causal-leak",
    "padding-leak", "masked-row-nan", "unstable-softmax", "not-normalized", "batch-leak", "gqa-mapping", "precision",
    "nondeterministic", "crash", "masked-row-policy", "dtype", "mutates-input", "timeout", "output-type",
    "grad-mismatch", "grad-jacobian", "grad-delta", "grad-scale", "grad-transposed", "grad-masked-leak",
    "grad-masked-row", "grad-gqa-sum", "grad-lse", "grad-accumulate", "grad-causal", "grad-dropout", "grad-batch-leak",
}  # fmt: skip

#: The options docs/checker.md's "Describing your function" table documents (the ones a case may declare).
OPTIONS = {
    "framework", "signature", "mask_convention", "layout", "returns", "causal_only", "causal_align", "causal_value",
    "gqa", "dtypes", "unsupported", "mask_arg", "causal_arg", "scale_arg", "compute_dtype", "masked_rows",
    "causal_when_no_mask", "mask_form", "ranks", "gqa_mapping", "backward", "lse_units",
}  # fmt: skip


@pytest.fixture(scope="module")
def cases():
    return load_cases()


def test_the_set_has_the_required_cases_of_each_kind(cases):
    counts = Counter((c.kind, c.buggy) for c in cases)
    assert counts[("forward", True)] >= 16
    assert counts[("forward", False)] >= 8
    assert counts[("backward", True)] >= 12
    assert counts[("backward", False)] >= 6
    assert len(cases) == len(case_names()) >= 44


def test_every_file_is_well_formed(cases):
    for case in cases:
        kind, correct = kind_of(case.name)
        assert (case.kind, case.expected is None) == (kind, correct), case.name
        assert re.match(r"https://\S+$", case.source), case.name
        assert case.expected is None or case.expected in CODES, (case.name, case.expected)
        assert set(case.also_ok) <= CODES and case.expected not in case.also_ok, case.name
        assert callable(case.target), case.name
        assert set(case.check) <= OPTIONS, (case.name, set(case.check) - OPTIONS)
        if case.kind == "backward":
            assert case.backward is True or callable(case.backward), case.name
        else:
            assert "backward" not in case.check and case.backward is None, case.name
        doc = case.path.read_text().split('"""')[1]
        assert case.source in doc, f"{case.name}: the docstring names its source"
        with pytest.raises(TypeError):
            case.check["x"] = 1  # read-only
    assert set(PREFIXES) == {"fwd_", "ok_", "bwd_", "okbwd_"}


def test_every_case_has_a_witness():
    assert set(verify_set.WITNESSES) == set(case_names())


@pytest.mark.parametrize("name", case_names())
def test_case_against_the_float64_reference(name):
    comparisons = verify_set.verify(name)
    assert comparisons, name
    for c in comparisons:
        assert c.holds(), (name, c.label, "must agree" if c.same else "must differ", c.actual, c.expected)
    if kind_of(name)[1]:
        assert all(c.same for c in comparisons), f"{name}: a correct case has no 'differ' comparison"
    else:
        assert any(not c.same for c in comparisons), f"{name}: a buggy case names an input that shows the bug"


def test_a_comparison_tells_equal_from_different():
    a = np.array([1.0, 2.0])
    assert verify_set.same("x", a, a + 1e-10).holds()
    assert not verify_set.same("x", a, a + 1e-3).holds()
    assert verify_set.differ("x", a, a + 1.0).holds()
    assert verify_set.differ("x", np.array([np.nan, 2.0]), a).holds()
    assert not verify_set.differ("x", a, a + 1e-9).holds()
    assert not verify_set.same("x", a, a[:1]).holds()
