"""The fourth held-out set (tests/heldout4) checks itself without the checker: its files are complete and well formed,
every correct case matches a float64 reference, and every buggy case differs from it on a stated input."""

from collections import Counter

import heldout3
import numpy as np
import pytest
import test_heldout3_set as set3
from heldout4 import case_names, kind_of, load_cases, verify_set


@pytest.fixture(scope="module")
def cases():
    return load_cases()


def test_the_set_has_the_required_cases_of_each_kind(cases):
    counts = Counter((c.kind, c.buggy) for c in cases)
    assert counts[("forward", True)] >= 18
    assert counts[("forward", False)] >= 8
    assert counts[("backward", True)] >= 12
    assert counts[("backward", False)] >= 6
    assert len(cases) == len(case_names()) >= 44


def test_every_file_is_well_formed(cases):
    set3.test_every_file_is_well_formed(cases)  # set 3's checks, on this set's records
    for case in cases:
        assert case.target_string.endswith(f"{case.name}.py:{case.check_target_name}"), case.name


def test_every_source_is_new_to_the_held_out_sets(cases):
    heldout3_sources = {c.source for c in heldout3.load_cases()}
    assert not {c.source for c in cases} & heldout3_sources


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
    assert verify_set.same("x", np.array([np.nan]), np.array([np.nan])).holds()
    assert verify_set.raised(lambda: 1 / 0)[0] == 1.0 and verify_set.raised(lambda: 1)[0] == 0.0
