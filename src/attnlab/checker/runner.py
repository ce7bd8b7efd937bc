"""Calling user code safely: a per-call timeout, crash survival, captured output, and a record of every call.

A :class:`Runner` calls the function through a *backend*:

* :class:`InProcessBackend` (the Python API with a callable): each call runs in a daemon thread of this process
  and is abandoned after ``timeout`` seconds. Python cannot kill a thread: a function that hangs keeps running
  in the background until the process exits, so after the first timeout the runner makes no further calls.
  While a call runs, file descriptors 1 and 2 (and ``sys.stdout``/``sys.stderr``) point at capture files, so
  what the function prints, from Python or C, becomes evidence instead of output.
* :class:`~attnlab.checker.isolation.WorkerBackend` (``attnlab check file.py:NAME`` and ``check("file.py:NAME")``):
  the function lives in its own worker process, which is killed on a timeout.

Both run :func:`execute_call`, which converts one canonical case into the function's call and its return value
back (:class:`~attnlab.checker.adapters.Adapter`).
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .adapters import Adapter, Resolved, Returned

__all__ = [
    "CallError",
    "CallRequest",
    "CallResult",
    "Captured",
    "Case",
    "InProcessBackend",
    "Outcome",
    "Runner",
    "execute_call",
    "loaded_frameworks",
]

#: Bytes of each captured stream kept at its start and at its end (the middle is counted, not kept).
CAPTURE_KEEP = 4000


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
    flag: bool = False  #: pass the causal flag although ``causal`` is None (its causal part is in ``mask``)

    @property
    def gqa(self) -> bool:
        """Whether k and v have fewer heads than q (grouped-query attention)."""
        return self.q.ndim >= 3 and self.k.shape[-3] != self.q.shape[-3]

    def shapes(self) -> str:
        """The case's shapes and dtype in words (for evidence lines)."""
        return f"q {self.q.shape}, k {self.k.shape}, v {self.v.shape}, {self.dtype}"


@dataclass(frozen=True)
class CallError:
    """An exception raised by the function (or the end of its worker process), as plain picklable data.

    ``exit_status`` is ``SystemExit``'s code, or the worker's exit status when it ended during the call;
    ``signal`` names the signal that killed the worker; ``library`` marks an error of the array library while
    building the arguments (e.g. a dtype it lacks), before the function was called; ``bases`` are the names of
    the exception's classes (its MRO); ``warned`` the first lines of the warnings the call gave before raising
    (PyTorch's SDPA warns why no kernel can take the inputs, then raises "No available kernel").
    """

    type_name: str
    message: str
    traceback: str = ""
    not_implemented: bool = False
    exit_status: int | None = None
    signal: str | None = None
    died: bool = False
    library: bool = False
    bases: tuple[str, ...] = ()
    warned: tuple[str, ...] = ()  #: the warnings the call gave before it raised (a library saying why it refuses)

    @property
    def text(self) -> str:
        """``Type: message`` (or the type alone)."""
        return f"{self.type_name}: {self.message}" if self.message else self.type_name

    @classmethod
    def from_exception(cls, err: BaseException, *, tb: str = "", library: bool = False) -> CallError:
        """The error ``err`` as plain data, with the traceback text ``tb`` and ``SystemExit``'s status."""
        code = None
        if isinstance(err, SystemExit):
            code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
        try:
            message = str(err)
        except Exception:  # a hostile __str__
            message = f"<{type(err).__name__} whose str() raised>"
        return cls(
            type(err).__name__,
            message[:2000],
            tb[-4000:],
            isinstance(err, NotImplementedError),
            code,
            library=library,
            bases=tuple(c.__name__ for c in type(err).__mro__),
        )


@dataclass(frozen=True)
class CallRequest:
    """What the checker asks for: canonical arrays and flags (see :meth:`Adapter.build_request`); a gradient
    request also carries the upstream gradient ``d_out``, a dropout keep mask with ``dropout_p``, a ``bias``, and
    (a flash backward without a forward) the golden ``out`` and ``lse`` in the declared units."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    dtype: str
    mask: np.ndarray | None
    causal: bool | str
    scale: float | None
    gqa: bool
    d_out: np.ndarray | None = None
    keep: np.ndarray | None = None
    dropout_p: float = 0.0
    bias: np.ndarray | None = None
    out: np.ndarray | None = None
    lse: np.ndarray | None = None

    def shape_key(self) -> tuple[Any, ...]:
        """What a compiled function specialises on: every array's shape, the dtype and the flags (a new key is a
        first call of that shape, which may compile)."""
        arrays = (self.q, self.k, self.v, self.mask, self.d_out, self.keep, self.bias, self.out, self.lse)
        return (
            self.dtype,
            self.causal,
            self.scale is None,
            self.gqa,
            *(None if a is None else a.shape for a in arrays),
        )


@dataclass
class CallResult:
    """What one call did, as plain picklable data."""

    returned: Returned = field(default_factory=Returned)
    error: CallError | None = None
    timed_out: bool = False
    mutated: tuple[str, ...] = ()
    seconds: float = 0.0


@dataclass
class Outcome:
    """What one call did, with the case it was made for."""

    case: Case
    returned: Returned = field(default_factory=Returned)
    error: CallError | None = None
    timed_out: bool = False
    skipped: bool = False
    mutated: tuple[str, ...] = ()
    seconds: float = 0.0
    call: str = ""
    first: bool = False  #: the first call of its shape (it had the compile allowance too)

    @property
    def error_text(self) -> str:
        """The call's error as ``Type: message``, or ``""``."""
        return "" if self.error is None else self.error.text

    @property
    def ok(self) -> bool:
        """Whether the call returned a usable value (no error, timeout, skip or return problem)."""
        return self.error is None and not self.timed_out and not self.skipped and self.returned.problem is None

    @property
    def out(self) -> Any:
        """The output the call returned (host NumPy), or None when the call failed. Typed ``Any``: the probes read
        it only after checking :attr:`ok`, which a type checker cannot follow (a forward call that is ``ok``
        always returned one; the gradient battery reads ``returned.out``, which may be None, with its own check)."""
        return self.returned.out

    @property
    def weights(self) -> np.ndarray | None:
        """The attention weights the call returned (host NumPy), or None."""
        return self.returned.weights


def execute_call(adapter: Adapter, req: CallRequest) -> CallResult:
    """Build the call, call the function in this thread, translate its return value and look for input writes."""
    try:
        args, kwargs = adapter.build_request(req)
        before = adapter.snapshot(args, kwargs)
    except Exception as err:  # the library refused our inputs (e.g. a dtype it lacks)
        return CallResult(error=CallError.from_exception(err, library=True))
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as warned:  # the user's warnings are evidence, not errors
            warnings.simplefilter("always")
            value = adapter.fn(*args, **kwargs)
    except BaseException as err:  # user code may raise anything, even SystemExit or KeyboardInterrupt
        error = CallError.from_exception(err, tb=traceback.format_exc(limit=-3))
        lines = dict.fromkeys(str(w.message).splitlines()[0][:300] for w in warned[-8:] if str(w.message).strip())
        return CallResult(error=replace(error, warned=tuple(lines)), seconds=time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    try:
        returned = adapter.interpret(value)
    except Exception as err:  # a return value whose attributes raise
        returned = Returned(problem=f"returned something that could not be read ({type(err).__name__}: {err})")
    try:
        mutated = tuple(adapter.mutated(args, kwargs, before))
    except Exception:  # inputs replaced by something unreadable
        mutated = ("q",)
    return CallResult(returned=returned, mutated=mutated, seconds=seconds)


# ----------------------------------------------------------------------------------------------------------------
# captured output


@dataclass
class Captured:
    """The start and the end of what was written to one stream, and how many bytes in all."""

    name: str
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, data: bytes) -> None:
        """Count ``data`` and keep it if it falls in the first or the last ``CAPTURE_KEEP`` bytes."""
        self.total += len(data)
        room = CAPTURE_KEEP - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > CAPTURE_KEEP:
                del self.tail[: len(self.tail) - CAPTURE_KEEP]

    def text(self, limit: int = 1200) -> str:
        """What was written, at most ``limit`` characters from the start and from the end, the middle counted."""
        whole = bytes(self.head) + bytes(self.tail)
        if self.total <= len(whole) and len(whole) <= 2 * limit:
            return whole.decode("utf-8", "replace")
        start = bytes(self.head[:limit]).decode("utf-8", "replace")
        end = bytes((bytes(self.head) + bytes(self.tail))[-limit:]).decode("utf-8", "replace")
        return f"{start}\n[... {self.total - 2 * limit} bytes left out ...]\n{end}"

    def last_line(self, limit: int = 300) -> str:
        """The last non-empty line written, at most ``limit`` characters."""
        whole = (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace").strip().splitlines()
        return whole[-1][:limit] if whole else ""


class _FdCapture:
    """Point fds 1 and 2 and ``sys.stdout``/``sys.stderr`` at temporary files while the function runs."""

    def __init__(self) -> None:
        self.files = {"stdout": tempfile.TemporaryFile(), "stderr": tempfile.TemporaryFile()}
        self._saved: list[tuple[int, int]] = []
        self._streams: tuple[Any, Any] | None = None

    def __enter__(self) -> _FdCapture:
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except Exception:  # a closed or odd stream
                pass
        for fd, name in ((1, "stdout"), (2, "stderr")):
            try:
                self._saved.append((fd, os.dup(fd)))
                os.dup2(self.files[name].fileno(), fd)
            except OSError:  # fd not open in this process: nothing to redirect
                pass
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout = self._text(self.files["stdout"])
        sys.stderr = self._text(self.files["stderr"])
        return self

    @staticmethod
    def _text(f: Any) -> io.TextIOWrapper:
        return open(os.dup(f.fileno()), "w", buffering=1, encoding="utf-8", errors="backslashreplace")

    def __exit__(self, *exc: Any) -> None:
        assert self._streams is not None
        for s in (sys.stdout, sys.stderr):
            try:
                s.close()
            except Exception:  # the user replaced or broke it
                pass
        sys.stdout, sys.stderr = self._streams
        for fd, saved in self._saved:
            os.dup2(saved, fd)
            os.close(saved)
        self._saved = []

    def captured(self) -> dict[str, Captured]:
        out = {}
        for name, f in self.files.items():
            c = Captured(name)
            size = os.fstat(f.fileno()).st_size
            if size:
                f.seek(0)
                c.add(f.read(CAPTURE_KEEP))
                if size > CAPTURE_KEEP:
                    f.seek(max(CAPTURE_KEEP, size - CAPTURE_KEEP))
                    c.add(f.read())
                c.total = size
            out[name] = c
        return out

    def close(self) -> None:
        for f in self.files.values():
            f.close()


class InProcessBackend:
    """Call ``adapter.fn`` in a daemon thread of this process, with its output captured (see the module doc)."""

    isolated = False
    description = "in-process"
    import_failure = None  #: nothing is imported: the function is already here

    def __init__(self, adapter: Adapter):
        self.adapter = adapter
        self.spec = adapter.spec
        self.framework = adapter.framework
        self.resolved: Resolved = adapter.resolved
        self.structural = adapter.structural_unsupported()
        self.spec = adapter.spec
        self.loaded = loaded_frameworks()
        self._capture = _FdCapture()

    def call(self, req: CallRequest, timeout: float) -> CallResult:
        """Run one call in a daemon thread within ``timeout`` seconds, output captured (a hung call is left
        behind and reported as a timeout)."""
        box: dict[str, CallResult] = {}

        def target() -> None:
            box["result"] = execute_call(self.adapter, req)

        th = threading.Thread(target=target, name="attnlab-check-call", daemon=True)
        t0 = time.perf_counter()
        with self._capture:
            th.start()
            th.join(timeout)
        if th.is_alive():
            return CallResult(timed_out=True, seconds=time.perf_counter() - t0)
        return box["result"]

    def output(self) -> dict[str, Captured]:
        """What the calls wrote to stdout and stderr, by stream."""
        return self._capture.captured()

    def close(self) -> None:
        """Release the capture files."""
        self._capture.close()


class Runner:
    """Run the function on cases through ``backend`` with a per-call timeout; remember every outcome.

    ``request(case, causal_flag, gqa)`` builds what is sent (the session strategy's). The first call of each
    shape (:meth:`CallRequest.shape_key`) may take ``compile_timeout`` seconds more than ``timeout``: compilation
    (``jax.jit``, ``torch.compile``, ``flex_attention``) happens there, so a correct compiled function is never a
    timeout. After a timeout, or once the worker process has ended more often than it may be restarted,
    ``stopped`` says why and every further call is skipped.
    """

    def __init__(
        self,
        backend: Any,
        *,
        timeout: float = 10.0,
        request: Callable[[Case, bool | str, bool], CallRequest] | None = None,
        compile_timeout: float = 0.0,
    ):
        self.backend = backend
        self.timeout = float(timeout)
        self.compile_timeout = float(compile_timeout)
        self.request = request or _plain_request
        self.hung: Outcome | None = None
        self.stopped: str | None = None
        self.calls = 0
        self.outcomes: list[Outcome] = []
        self.seen: set[tuple[Any, ...]] = set()

    def describe(self, case: Case, causal_flag: bool | str, gqa: bool) -> str:
        """The call as the function saw it: ``fn(q [2, 2, 5, 8] float32, ..., attn_mask=bool [2, 2, 5, 5])``."""
        r: Resolved = self.backend.resolved

        def arr(x: np.ndarray) -> str:
            return f"[{', '.join(str(n) for n in x.shape)}]"

        parts = [f"{n} {arr(x)} {case.dtype}" for n, x in (("q", case.q), ("k", case.k), ("v", case.v))]
        if case.mask is not None and r.mask_arg is not None:
            conv = getattr(r.spec or getattr(self.backend, "spec", None), "mask_convention", "allow")
            kind = {"allow": "bool", "block": "bool", "keep": "int64"}.get(conv, case.dtype)
            form = getattr(r.spec or getattr(self.backend, "spec", None), "mask_form", "full")
            shape = arr(case.mask)
            if form == "flex":
                kind = "BlockMask" if r.mask_arg != "score_mod" else "score_mod of bool"
            elif form != "full" and case.mask.ndim >= 4:
                b, n_q, n_k = case.mask.shape[0], case.mask.shape[-2], case.mask.shape[-1]
                shape = {
                    "batch": f"[{b}, 1, {n_q}, {n_k}]",
                    "key_padding": f"[{b}, {n_k}]",
                    "varlen": f"[{b + 1}]",
                }.get(form, f"[{b}]")
                kind = {"valid_lens": "int64", "kv_cache": "int64", "varlen": "int32"}.get(form, kind)
            m = f"{kind} {shape}"
            parts.append(m if r.mask_positional else f"{r.mask_arg}={m}")
        if causal_flag and r.causal_arg is not None:
            parts.append(f"{r.causal_arg}={causal_flag!r}")
        if case.scale is not None and r.scale_arg is not None:
            parts.append(f"{r.scale_arg}={case.scale:g}")
        if gqa and r.gqa_arg is not None:
            parts.append(f"{r.gqa_arg}=True")
        return f"fn({', '.join(parts)})"

    def call(self, case: Case, *, causal_flag: bool | str = False, gqa: bool = False) -> Outcome:
        """Call the function on ``case``. ``causal_flag`` (True or an alignment) goes to its causal argument."""
        described = self.describe(case, causal_flag, gqa)
        if self.stopped is not None:
            return Outcome(case, skipped=True, call=described)
        req = self.request(case, causal_flag, gqa)
        self.calls += 1
        key = req.shape_key()
        first = key not in self.seen
        self.seen.add(key)
        res = self.backend.call(req, self.timeout + (self.compile_timeout if first else 0.0))
        out = Outcome(
            case,
            returned=res.returned,
            error=res.error,
            timed_out=res.timed_out,
            mutated=res.mutated,
            seconds=res.seconds,
            call=described,
            first=first,
        )
        if out.timed_out:
            self.hung = out
            self.stopped = "a call timed out"
        elif out.error is not None and out.error.died and not getattr(self.backend, "can_restart", False):
            self.stopped = "the worker process ended" + (
                f" {self.backend.deaths} times" if getattr(self.backend, "deaths", 0) > 1 else ""
            )
        self.outcomes.append(out)
        return out


def _plain_request(case: Case, causal_flag: bool | str, gqa: bool) -> CallRequest:
    return CallRequest(case.q, case.k, case.v, case.dtype, case.mask, causal_flag, case.scale, gqa)


def loaded_frameworks() -> tuple[str, ...]:
    """The array libraries (``torch``, ``jax``) this process has imported."""
    return tuple(f for f in ("torch", "jax") if f in sys.modules)
