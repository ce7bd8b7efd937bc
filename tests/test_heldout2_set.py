"""The second held-out set's own claims (tests/heldout2/verify_set.py), against a float64 NumPy reference.

This does not run the checker: it asserts that each correct case is correct and each buggy case has the planted
bug, so that the set measures the checker and not itself.
"""

from heldout2 import all_cases
from heldout2.verify_set import verify_all


def test_every_case_is_what_it_claims():
    done = verify_all()
    cases = all_cases()
    assert done == [c.name for c in cases]
    assert sum(c.buggy for c in cases) >= 30
    assert sum(not c.buggy for c in cases) >= 15


def test_case_names_are_unique_and_sourced():
    cases = all_cases()
    assert len({c.name for c in cases}) == len(cases)
    assert all(c.source for c in cases)
    assert all(c.second is None or c.buggy for c in cases)
