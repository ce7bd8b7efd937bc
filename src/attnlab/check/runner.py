"""Calling user code safely: a per-call timeout, crash survival, and a record of every call.

Each call runs in a daemon thread and is abandoned after ``timeout`` seconds. Python cannot kill a thread: a
function that hangs keeps running in the background (and holds a CPU) until the process exits, so after the first
timeout the runner makes no further calls. From the command line, ``attnlab check`` imports the function by name
and the process exits at the end, which ends the hung thread too.
"""

from __future__ import annotations

import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .adapters import Adapter, Returned

__all__ = ["Case", "Outcome", "Runner"]


@dataclass(frozen=True)
class Case:
    """One call in canonical form: float64 values exactly representable in ``dtype``.

    Shapes: ``q [..., h, n_q, d_k]``, ``k [..., h_kv, n_k, d_k]``, ``v [..., h_kv, n_k, d_v]``;
    ``mask [..., h, n_q, n_k]`` (True = may attend) or None; ``causal`` is the alignment the checker expects
    (None = not causal); ``scale`` is passed only when not None.
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    dtype: str = "float64"
    mask: np.ndarray | None = None
    causal: str | None = None
    scale: float | None = None
    label: str = ""

    @property
    def gqa(self) -> bool:
        return self.q.ndim >= 3 and self.k.shape[-3] != self.q.shape[-3]

    def shapes(self) -> str:
        return f"q {self.q.shape}, k {self.k.shape}, v {self.v.shape}, {self.dtype}"


@dataclass
class Outcome:
    """What one call did."""

    case: Case
    returned: Returned = field(default_factory=Returned)
    error: BaseException | None = None
    error_text: str = ""
    timed_out: bool = False
    skipped: bool = False
    mutated: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out and not self.skipped and self.returned.problem is None

    @property
    def out(self) -> np.ndarray | None:
        return self.returned.out

    @property
    def weights(self) -> np.ndarray | None:
        return self.returned.weights


class Runner:
    """Run ``adapter.fn`` on cases with a per-call timeout; remember every outcome."""

    def __init__(self, adapter: Adapter, *, timeout: float = 10.0):
        self.adapter = adapter
        self.timeout = float(timeout)
        self.hung: Outcome | None = None
        self.calls = 0
        self.outcomes: list[Outcome] = []

    def call(self, case: Case, *, causal_flag: bool | str = False, gqa: bool = False) -> Outcome:
        """Call the function on ``case``. ``causal_flag`` (True or an alignment) goes to its causal argument."""
        if self.hung is not None:
            return Outcome(case, skipped=True)
        ad = self.adapter
        try:
            args, kwargs = ad.build_call(
                case.q, case.k, case.v, dtype=case.dtype, mask=case.mask, causal=causal_flag, scale=case.scale, gqa=gqa
            )
        except Exception as err:  # the library refused our inputs (e.g. a dtype it lacks)
            return Outcome(case, error=err, error_text=f"{type(err).__name__}: {err}")
        before = ad.snapshot(args, kwargs)
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = ad.fn(*args, **kwargs)
            except BaseException as err:  # user code may raise anything, even SystemExit
                box["error"] = err
                box["tb"] = traceback.format_exc(limit=-3)

        self.calls += 1
        t0 = time.perf_counter()
        th = threading.Thread(target=target, name="attnlab-check-call", daemon=True)
        with warnings.catch_warnings():  # the user's warnings (overflow, NaN) are evidence, not errors
            warnings.simplefilter("ignore")
            th.start()
            th.join(self.timeout)
        seconds = time.perf_counter() - t0
        if th.is_alive():
            out = Outcome(case, timed_out=True, seconds=seconds)
            self.hung = out
            self.outcomes.append(out)
            return out
        if "error" in box:
            err = box["error"]
            out = Outcome(case, error=err, error_text=f"{type(err).__name__}: {err}", seconds=seconds)
        else:
            out = Outcome(case, returned=ad.interpret(box.get("value")), seconds=seconds)
        try:
            out.mutated = tuple(ad.mutated(args, kwargs, before))
        except Exception:  # pragma: no cover - inputs replaced by something unreadable
            out.mutated = ("q",)
        self.outcomes.append(out)
        return out


def finite_rows(x: np.ndarray) -> np.ndarray:
    """Per row ``[..., n_q]``: every entry finite."""
    return np.all(np.isfinite(x), axis=-1)
