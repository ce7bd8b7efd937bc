"""The tiled kernels' exponentials: which one runs (numba's fused passes, NumPy's ``exp2`` or ``exp``), chosen once per
process and dtype, and how a score block becomes the exponential's argument with no more rounding than the naive
computation (:class:`Units`). :func:`exponential` (re-exported as :func:`attnlab.kernels.exponential`) says which
exponential runs here, and why.

Internal to :mod:`attnlab.kernels.tiled` apart from :class:`Exponential` and :func:`exponential`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import DTypeError
from .. import fused
from ..config import KernelConfig
from ..config import current as current_config

__all__ = ["KINDS", "LOG2E", "Exp", "Exponential", "Units", "choose", "exp_offset", "exponential", "units"]

#: log2(e): ``exp(x) == exp2(LOG2E · x)``.
LOG2E = 1.0 / math.log(2.0)


@dataclass(frozen=True)
class Exp:
    """The exponential the kernels use: logits are in nats, and ``exp(x) = fn(pre · x)`` (``exp2`` with ``pre =
    log2(e)``, or ``exp`` with ``pre = 1``), the offset subtracted before ``pre`` multiplies (see :class:`Units`).
    With ``fused``, score blocks go through :mod:`attnlab.kernels.fused` (exponential, mask and row sums in one
    compiled pass)."""

    name: str
    fn: Any
    pre: float
    fused: bool = False


#: Every exponential the kernels can use, by name (``fused`` needs numba).
KINDS = {
    "fused": Exp("fused", np.exp2, LOG2E, fused=True),
    "exp2": Exp("exp2", np.exp2, LOG2E),
    "exp": Exp("exp", np.exp, 1.0),
}
_choice: dict[str, Exp] = {}


def choose(dtype: np.dtype, cfg: KernelConfig) -> Exp:
    """How score blocks are exponentiated, chosen once per process and dtype (unless ``cfg.exp`` forces it; see
    :mod:`attnlab.kernels.config`).

    float32 with numba installed: the fused compiled passes (:mod:`attnlab.kernels.fused`, ~2× faster than
    NumPy's ``exp2`` plus a row sum). Otherwise ``exp2`` (in log2 units) or ``exp`` (in nats), whichever
    measures faster on a 128 KiB block: NumPy's vectorised float32 ``exp2`` usually costs ~0.5× ``exp`` on the
    project's machines, but in roughly a third of processes it runs ~4× slower than usual (~2× ``exp``) for
    the whole life of the process (it depends on the address-space layout: never seen with ASLR disabled).
    Measuring takes ~0.3 ms once; all choices are exact to about one float32 ulp.
    """
    fusable = np.dtype(dtype) == np.float32 and cfg.use_numba and fused.usable()
    if cfg.exp != "auto":
        return KINDS[cfg.exp if cfg.exp != "fused" or fusable else "exp2"]
    if fusable:
        return KINDS["fused"]
    key = np.dtype(dtype).str
    choice = _choice.get(key)
    if choice is None:
        x = np.linspace(-20.0, 20.0, 1 << 15, dtype=dtype)
        buf = np.empty_like(x)
        numpy_exps = {name: e for name, e in KINDS.items() if not e.fused}
        best = {name: math.inf for name in numpy_exps}
        for _ in range(5):
            for name, e in numpy_exps.items():
                t = time.perf_counter()
                e.fn(x, out=buf)
                best[name] = min(best[name], time.perf_counter() - t)
        choice = _choice[key] = KINDS[min(best, key=best.__getitem__)]
    return choice


@dataclass(frozen=True)
class Exponential:
    """Which exponential the tiled kernels use for one dtype on this machine, and why (see :func:`exponential`).

    Attributes:
        name: ``"fused"`` (numba's compiled pass: scale, offset, ``exp2``, mask and row sums in one pass),
            ``"exp2"`` (NumPy's ``exp2`` in log2 units) or ``"exp"`` (NumPy's ``exp`` in nats).
        dtype: the compute dtype, ``"float32"`` or ``"float64"``.
        reason: one line: why this one.
    """

    name: str
    dtype: str
    reason: str

    @property
    def fused(self) -> bool:
        """True for numba's fused passes."""
        return self.name == "fused"


def exponential(dtype: Any = "float32") -> Exponential:
    """The exponential the tiled kernels use for score blocks of ``dtype`` (float32 or float64) in this process, and
    why: numba's fused passes for float32 when numba is installed and loads, otherwise NumPy's ``exp2`` or ``exp``,
    whichever measured faster on the first call (NumPy's float32 ``exp2`` is usually ~0.5x ``exp`` but in some
    processes ~2x; all are exact to about one float32 ulp). ``attnlab bench`` prints it.

    >>> exponential("float64").name in ("exp2", "exp")
    True
    """
    dt = np.dtype(dtype)
    if dt not in (np.float32, np.float64):
        raise DTypeError(f"dtype: expected float32 or float64 (the kernels' compute dtypes), got {dt}")
    cfg = current_config()
    e = choose(dt, cfg)
    if cfg.exp != "auto":
        why = f"forced by attnlab.kernels.config.override(exp={cfg.exp!r})"
        if cfg.exp != e.name:
            why += f"; {e.name} instead, as fused needs float32 and numba"
    elif e.fused:
        why = f"float32 with numba {fused.version()}: scale, offset, exp2, mask and row sums in one compiled pass"
    else:
        if dt != np.float32:
            without = "the fused passes are float32 only"
        elif not cfg.use_numba:
            without = "numba turned off by attnlab.kernels.config.override(use_numba=False)"
        elif not fused.AVAILABLE:
            without = "no numba: pip install 'attnlab[fast]' for the fused passes"
        else:
            without = "numba is installed but does not load"
        other = "exp" if e.name == "exp2" else "exp2"
        why = f"measured faster than np.{other} in this process; {without}"
    return Exponential(e.name, dt.name, why)


@dataclass(frozen=True)
class Units:
    """How a score block becomes logits with the roundings of the naive computation, no more.

    Only a signed power of two of the factor ``scale / temperature`` is folded into Q (``Q · ±2**shift``: exact),
    and the rest, ``R`` in [1, 2), multiplies the block: ``logits = fl(R · (±2**shift Q) Kᵀ) + bias / T`` is the
    naive ``fl(fl(Q Kᵀ) · scale)`` (+ bias) bit for bit, up to the product's own rounding. The running maximum is
    then subtracted in nats, and only the difference is converted for ``exp2`` (``pre · (z - m)``): nearly exact
    where the weights matter. Folding all of the factor into Q rounds every element of ``factor · Q``, and
    converting to log2 units before subtracting rounds numbers as large as the logits: in float32 at |logits| ~
    1e3-1e4 either cost up to 6-18x the naive error, beyond FlashAttention's 2x rule in ~18 % of random cases.
    """

    E: Exp
    shift: int  # Q is scaled by sign · 2**shift
    sign: int  # the sign of the factor (folded into Q, so that R >= 0)
    R: Any  # logits = R · (folded Q) Kᵀ + c_bias · bias; a scalar of the compute dtype in [1, 2) (0 for scale 0)
    c_bias: Any  # 1 / temperature: the bias in nats
    pre: Any  # E.pre in the compute dtype

    def fold(self, q: np.ndarray) -> np.ndarray:
        """``q · sign · 2**shift`` (a new array; exact unless it leaves the dtype's normal range)."""
        dt = q.dtype
        with np.errstate(over="ignore", under="ignore"):  # an overflow here is caught as an overflow of the logits
            if -np.finfo(dt).maxexp + 2 < self.shift < np.finfo(dt).maxexp - 1:
                scaled: np.ndarray = q * dt.type(self.sign * 2.0**self.shift)
                return scaled
            out: np.ndarray = np.ldexp(q, self.shift)
        return -out if self.sign < 0 else out


def units(dt: np.dtype, factor: float, temperature: float, cfg: KernelConfig) -> Units:
    """The :class:`Units` of logits ``factor · q · k (+ bias / temperature)`` in the compute dtype ``dt``."""
    E = choose(dt, cfg)
    mant, exp = math.frexp(abs(factor))  # |factor| = mant · 2**exp, mant in [0.5, 1) (0 for 0)
    R = dt.type(2.0 * mant)
    with np.errstate(over="ignore"):  # 1 / temperature may not fit (checked by make_plan when there is a bias)
        c_bias = dt.type(1.0 / temperature)
    return Units(E=E, shift=exp - 1, sign=-1 if factor < 0 else 1, R=R, c_bias=c_bias, pre=dt.type(E.pre))


def exp_offset(u: Units, s: np.ndarray, off: np.ndarray) -> None:
    """``s <- exp(s - off[:, None])`` in place with NumPy's passes (``s`` in nats): the offset first, then
    ``pre``."""
    s -= off[:, None]
    if u.pre != 1:
        s *= u.pre
    u.E.fn(s, out=s)
