"""The one checker engine (issue 20 §1, §5): one session per check with a strategy of what is compared, one worker
for the outputs and the gradients, the first call of each shape with its own allowance, list options as comma
strings and declared-unsupported capabilities in every entry point."""

from __future__ import annotations

import textwrap

import numpy as np

from attnlab.checker import check, check_backward
from attnlab.checker.runner import CallResult, Case, Runner

_MODULE = textwrap.dedent(
    """
    import numpy as np
    from attnlab import attention_trace
    from attnlab.core.gradients import attention_backward

    with open(__file__ + ".imports", "a") as f:  # one line per import of this module
        f.write("imported\\n")


    def attention(q, k, v, mask=None):
        if q.shape[-2] != k.shape[-2]:
            raise NotImplementedError("self-attention only: n_q must equal n_k")
        return np.asarray(attention_trace(q, k, v, mask, masked_rows="zero").output, dtype=q.dtype)


    def bwd(q, k, v, d_out, mask=None):
        if q.shape[-2] != k.shape[-2]:
            raise NotImplementedError("self-attention only: n_q must equal n_k")
        g = attention_backward(attention_trace(q, k, v, mask, masked_rows="zero"), d_out)
        return tuple(np.asarray(x, dtype=q.dtype) for x in (g.dq, g.dk, g.dv))
    """
)


def test_one_worker_serves_the_outputs_and_the_gradients(tmp_path):
    path = tmp_path / "square.py"
    path.write_text(_MODULE)
    r = check(f"{path}:attention", backward=f"{path}:bwd", unsupported="cross", dtypes="float64", probes="reference")
    assert r.codes == () and r.isolation == "worker process", r.to_text()
    assert any(p.name == "grad-reference" and p.status == "passed" for p in r.probes), r.to_text()
    assert (tmp_path / "square.py.imports").read_text().splitlines() == ["imported"]  # imported once, one worker


def test_check_backward_takes_comma_lists_and_honours_a_declared_cross(tmp_path):
    path = tmp_path / "square.py"
    path.write_text(_MODULE)
    r = check_backward(
        f"{path}:bwd", dtypes="float64,float32", unsupported="cross,dropout", probes="grad-reference,grad-batch"
    )
    assert r.codes == (), r.to_text()  # the clean NotImplementedError for n_q != n_k is never asked for
    assert {u.capability for u in r.unsupported} >= {"cross", "dropout", "float16"}
    assert [p.name for p in r.probes] == ["grad-preflight", "grad-reference", "grad-batch"]


class _Backend:
    """A backend that records the time limit of each call."""

    resolved = None

    def __init__(self) -> None:
        self.limits: list[float] = []

    def call(self, req, timeout):
        self.limits.append(timeout)
        return CallResult()


def test_the_first_call_of_each_shape_has_the_compile_allowance():
    backend = _Backend()
    runner = Runner(backend, timeout=2.0, compile_timeout=30.0)
    runner.describe = lambda case, flag, gqa: ""  # type: ignore[method-assign]  # no resolved names needed
    a = Case(*(np.zeros((1, 2, 4, 8)) for _ in range(3)))
    b = Case(*(np.zeros((1, 2, 5, 8)) for _ in range(3)))
    outs = [runner.call(c) for c in (a, a, b, a, b)]
    assert backend.limits == [32.0, 2.0, 32.0, 2.0, 2.0]
    assert [o.first for o in outs] == [True, False, True, False, False]
