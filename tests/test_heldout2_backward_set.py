"""The second held-out backward set is what it claims: correct cases match torch autograd in float64, each buggy
case differs the way its docstring says (tests/heldout2_backward/verify_set.py). This runs no checker."""

from __future__ import annotations

from heldout2_backward import CASES
from heldout2_backward.verify_set import CLAIMS, verify_all

from attnlab.checker.gradient_oracle import GRAD_FIXES
from attnlab.checker.probes import FIXES


def test_the_set_has_its_shape():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))
    buggy = [c for c in CASES if c.primary is not None]
    assert len(buggy) >= 16 and len(CASES) - len(buggy) >= 8
    # the codes docs/checker.md "Backward codes" defines, and the forward's (a forward bug seen through autograd)
    assert {c.primary for c in buggy} <= set(GRAD_FIXES) | set(FIXES)
    assert set(CLAIMS) == {c.name for c in buggy}
    assert all(c.source and c.doc for c in CASES)


def test_every_claim_about_the_set_holds():
    assert verify_all() == []
