"""The mask interfaces a function may take, one strategy each: how the canonical case becomes the call's
arguments and the return value becomes the canonical output.

The checker's cases are canonical (``q [B, h, n_q, d_k]``, a boolean mask ``[B, h, n_q, n_k]``, True = may
attend); the probes draw masks the interface can express (:meth:`attnlab.checker.probes.Battery.random_mask`), and
an :class:`Interface` turns them into what the function takes (:meth:`Interface.inputs`):

* :class:`Full` ``[B, h, n_q, n_k]`` and :class:`PerBatch` ``[B, 1, n_q, n_k]`` (Hugging Face's 4-D masks), in
  the declared convention (:data:`CONVENTIONS`);
* :class:`KeyPadding` ``[B, n_k]`` (True = a real key with ``allow``; True = padding with ``block``);
* :class:`Lengths` ``[B]`` int: valid key lengths (``valid_lens``) or a KV cache's lengths (``kv_cache``);
* :class:`Varlen`: packed sequences, ``q [total_q, h, d]`` with ``cu_seqlens_q/k`` and ``max_seqlen_q/k``;
* :class:`Flex`: PyTorch's ``flex_attention``: the mask as a ``block_mask`` (or a ``score_mod``).

Arrays are made by the framework strategy (:class:`attnlab.checker.adapters.Framework`): on its library and device.

>>> import numpy as np
>>> Lengths("valid_lens").reduce(np.tril(np.ones((1, 1, 3, 3), bool)))
array([3])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import masks as _masks

__all__ = [
    "CONVENTIONS",
    "INTERFACES",
    "Flex",
    "Form",
    "Full",
    "Inputs",
    "Interface",
    "KeyPadding",
    "Lengths",
    "PerBatch",
    "Varlen",
    "drawn_form",
    "flex_mask_mod",
    "flex_score_mod",
    "interface",
]

#: The additive fill's dtype per input dtype: float64 gets float32's minimum, so that it survives a computation
#: upcast or cast down to float32 (as reference oracles and Hugging Face's eager softmax do), where float64's would
#: become -inf.
_ADDITIVE_FILL = {"float64": "float32", "float32": "float32", "float16": "float16"}
_BFLOAT16_MIN = -3.3895313892515355e38


def _additive(allowed: np.ndarray, dtype: str, fw: Any) -> Any:
    fill = _BFLOAT16_MIN if dtype == "bfloat16" else float(np.finfo(_ADDITIVE_FILL[dtype]).min)
    return fw.floats(np.where(allowed, 0.0, fill), dtype)


#: Mask conventions: attnlab's boolean mask (True = may attend) -> the array the function takes, through the
#: framework strategy ``fw`` (``fw.exact`` keeps bool/int dtypes, ``fw.floats`` makes floats of ``dtype``).
CONVENTIONS: dict[str, Callable[[np.ndarray, str, Any], Any]] = {
    "allow": lambda a, dtype, fw: fw.exact(np.array(a, dtype=bool)),
    "block": lambda a, dtype, fw: fw.exact(np.asarray(_masks.to_blocked(a))),
    "keep": lambda a, dtype, fw: fw.exact(np.asarray(a).astype(np.int64)),
    "additive": _additive,
}


def _same(x: np.ndarray) -> np.ndarray:
    return x


@dataclass
class Inputs:
    """One call's arrays in the function's library: ``tensors`` (q, k, v as passed), the ``mask`` argument (None:
    none is passed), ``extra`` keywords the interface itself needs (``cu_seqlens_q`` ...), and ``unpack``: the
    function's output (as NumPy) -> canonical ``[B, h, n_q, d_v]``, or a problem (a string)."""

    tensors: tuple
    mask: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    unpack: Callable[[np.ndarray], np.ndarray | str] = _same


@dataclass(frozen=True)
class Form:
    """How one call passes its arrays: in ``dtype``, in ``layout`` (``"bhnd"`` or ``"bnhd"``), the mask in
    ``convention`` (a key of :data:`CONVENTIONS`), as arrays of the library ``fw``."""

    dtype: str
    layout: str
    convention: str
    fw: Any


class Interface:
    """A mask interface. ``reduce`` turns the canonical mask into what the function takes (a boolean array in
    attnlab's convention, converted by :data:`CONVENTIONS`, or integer lengths, marked by ``lengths = True``);
    :meth:`inputs` builds one call's arrays."""

    name = "full"
    lengths = False
    packed = False

    def reduce(self, allowed: np.ndarray) -> np.ndarray:
        """The canonical mask ``allowed [B, h, n_q, n_k]`` as this interface holds it (here: unchanged)."""
        return allowed

    def mask_argument(self, allowed: np.ndarray, *, convention: str, dtype: str, fw: Any) -> Any:
        """The mask argument: ``allowed`` reduced to the interface, in ``convention``, as an array of ``fw``."""
        m = self.reduce(np.asarray(allowed))
        return fw.exact(m) if self.lengths else CONVENTIONS[convention](m, dtype, fw)

    def inputs(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, form: Form) -> Inputs:
        """One call's arrays: q, k, v in the form's layout and dtype, and the mask argument (when ``mask`` is
        given)."""
        swap = form.layout == "bnhd"

        def lay(x: np.ndarray) -> np.ndarray:
            return np.swapaxes(x, -2, -3) if swap else x

        tensors = tuple(form.fw.floats(lay(x), form.dtype) for x in (q, k, v))
        m = None if mask is None else self.mask_argument(mask, convention=form.convention, dtype=form.dtype, fw=form.fw)
        return Inputs(tensors, m, unpack=lay)

    def structural(self, *, has_causal_flag: bool, causal_only: bool) -> dict[str, str]:
        """Capabilities this interface cannot express, with the reason (an interface with a batch axis: 3-D
        inputs, and causal without a causal flag)."""
        out = {"rank": f"mask_form={self.name!r} has a batch axis: inputs are 4-D"}
        if not has_causal_flag and not causal_only:
            out["causal"] = f"no causal flag, and a {self.name} mask cannot express causal"
        return out


class Full(Interface):
    """``[B, h, n_q, n_k]`` (or ``[h, n_q, n_k]`` for 3-D inputs): expresses everything."""

    def structural(self, *, has_causal_flag: bool, causal_only: bool) -> dict[str, str]:
        return {}


class PerBatch(Interface):
    """``[B, 1, n_q, n_k]``, broadcast over heads."""

    name = "batch"

    def reduce(self, allowed: np.ndarray) -> np.ndarray:
        """``allowed`` with its head axis cut to 1: ``[B, 1, n_q, n_k]``."""
        return allowed[:, :1] if allowed.ndim >= 4 else allowed


class KeyPadding(Interface):
    """``[B, n_k]``: the keys the last query of each sequence may attend (every query, for a padding mask)."""

    name = "key_padding"

    def reduce(self, allowed: np.ndarray) -> np.ndarray:
        """The keys the last query of each sequence may attend: ``[B, n_k]``."""
        return allowed[:, 0, -1, :] if allowed.ndim >= 4 else allowed


class Lengths(KeyPadding):
    """``[B]`` int64: how many keys of each sequence are valid (the mask is a prefix)."""

    lengths = True

    def __init__(self, name: str):
        self.name = name

    def reduce(self, allowed: np.ndarray) -> np.ndarray:
        """How many keys of each sequence are valid: ``[B]`` int64."""
        return super().reduce(allowed).sum(axis=-1).astype(np.int64)


class Varlen(Interface):
    """Packed sequences (flash-attn's varlen functions): sequence b's first ``L_q`` queries and ``L_k`` keys
    (the rows and the keys its prefix mask allows) are concatenated into ``q [total_q, h, d]``, ``k, v [total_k,
    h_kv, d]``, passed with ``cu_seqlens_q/k`` (int32 ``[B + 1]``) and ``max_seqlen_q/k``; the output is unpacked,
    rows of no sequence 0. The layout does not apply (packed is ``[total, h, d]``)."""

    name = "varlen"
    packed = True

    def inputs(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, form: Form) -> Inputs:
        lq, lk = self.lengths_of(q, k, mask)
        rows, n_q, h = lq, q.shape[-2], q.shape[1]
        fw, dtype = form.fw, form.dtype
        extra = {
            "cu_seqlens_q": fw.exact(self.cu_seqlens(lq)),
            "cu_seqlens_k": fw.exact(self.cu_seqlens(lk)),
            "max_seqlen_q": int(lq.max(initial=0)),
            "max_seqlen_k": int(lk.max(initial=0)),
        }

        def unpack(out: np.ndarray) -> np.ndarray | str:
            if out.ndim != 3 or out.shape[0] != int(sum(rows)):
                return f"returned shape {out.shape}; expected [total_q, h, d_v] (packed)"
            return self.unpack(out, rows, n_q, h)

        tensors = (
            fw.floats(self.pack(q, lq), dtype),
            fw.floats(self.pack(k, lk), dtype),
            fw.floats(self.pack(v, lk), dtype),
        )
        return Inputs(tensors, None, extra, unpack)

    @staticmethod
    def lengths_of(q: np.ndarray, k: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Each sequence's query and key lengths ``([B], [B])`` under ``mask`` (full lengths without one)."""
        b, n_q, n_k = q.shape[0], q.shape[-2], k.shape[-2]
        if mask is None:
            return np.full(b, n_q), np.full(b, n_k)
        a = np.broadcast_to(mask, (b, q.shape[1], n_q, n_k))[:, 0]
        return a.any(axis=-1).sum(axis=-1), a.any(axis=-2).sum(axis=-1)

    @staticmethod
    def pack(x: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """``[B, h, n, d]`` -> ``[sum(lengths), h, d]``."""
        return np.concatenate([np.swapaxes(x[i, :, : lengths[i]], 0, 1) for i in range(x.shape[0])], axis=0)

    @staticmethod
    def cu_seqlens(lengths: np.ndarray) -> np.ndarray:
        """FlashAttention's cumulative lengths ``[B + 1]`` int32: ``0, l0, l0 + l1, ...``."""
        return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)

    @staticmethod
    def unpack(out: np.ndarray, lq: np.ndarray, n_q: int, h: int) -> np.ndarray:
        """``[total_q, h, d_v]`` -> ``[B, h, n_q, d_v]``."""
        full = np.zeros((len(lq), h, n_q, out.shape[-1]), dtype=out.dtype)
        start = 0
        for i, length in enumerate(lq):
            full[i, :, :length] = np.swapaxes(out[start : start + length], 0, 1)
            start += length
        return full


class Flex(Interface):
    """PyTorch's ``flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, ...)`` and
    wrappers with its parameter names: the canonical mask, its causal part included, reaches the function as a
    ``block_mask`` built by ``create_block_mask`` from a ``mask_mod`` that reads it (``arg="block_mask"``), or as a
    ``score_mod`` that sets blocked scores to -inf (``arg="score_mod"``). A mask broadcast over batch elements or
    heads (``[1, h, n_q, n_k]``, ``[B, 1, n_q, n_k]``) stays broadcast (a block mask with B or H = 1)."""

    name = "flex"

    def __init__(self, arg: str | None = None):
        self.arg = arg or "block_mask"

    def inputs(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, form: Form) -> Inputs:
        if mask is not None:  # a block mask is n_q x n_k; its batch and head axes may stay 1 (broadcast)
            m = np.asarray(mask, dtype=bool)
            m = m.reshape((1,) * (4 - m.ndim) + m.shape) if m.ndim < 4 else m
            mask = np.broadcast_to(m, (*m.shape[:-2], q.shape[-2], k.shape[-2]))
        return super().inputs(q, k, v, mask, form)

    def mask_argument(self, allowed: np.ndarray, *, convention: str, dtype: str, fw: Any) -> Any:
        """``allowed [B, h, n_q, n_k]`` (True = may attend) as a ``BlockMask`` or a ``score_mod``, on ``fw``'s
        device."""
        t = fw.exact(np.array(allowed, dtype=bool))
        if self.arg == "score_mod":
            return flex_score_mod(fw.torch, t)
        from torch.nn.attention.flex_attention import create_block_mask

        b, h, n_q, n_k = t.shape
        return create_block_mask(flex_mask_mod(t), b, h, n_q, n_k, device=fw.device)

    def structural(self, *, has_causal_flag: bool, causal_only: bool) -> dict[str, str]:
        return {"rank": "flex_attention takes 4-D inputs [B, h, n, d]"}


def flex_mask_mod(allowed: Any) -> Callable[..., Any]:
    """A flex ``mask_mod(b, h, q_idx, kv_idx)`` reading ``allowed [B, h, n_q, n_k]`` (a bool tensor, True = may
    attend; B or h may be 1, broadcast)."""
    nb, nh = allowed.shape[0], allowed.shape[1]

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return allowed[b % nb, h % nh, q_idx, kv_idx]

    return mask_mod


def flex_score_mod(torch: Any, allowed: Any) -> Callable[..., Any]:
    """A flex ``score_mod(score, b, h, q_idx, kv_idx)`` that keeps the scores :func:`flex_mask_mod` allows and sets
    the others to -inf."""
    allows = flex_mask_mod(allowed)

    def score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return torch.where(allows(b, h, q_idx, kv_idx), score, -float("inf"))

    return score_mod


#: Each mask interface by name (the values of the spec's ``mask_form``, :data:`attnlab.checker.spec.MASK_FORMS`), with
#: the strategy that builds its inputs and reads its output.
INTERFACES: dict[str, Callable[[], Interface]] = {
    "full": Full,
    "batch": PerBatch,
    "key_padding": KeyPadding,
    "valid_lens": lambda: Lengths("valid_lens"),
    "kv_cache": lambda: Lengths("kv_cache"),
    "varlen": Varlen,
    "flex": Flex,
}


def drawn_form(name: str) -> str:
    """The mask form whose masks the probes draw for mask form ``name``: its own, except ``flex`` (a block mask
    or score_mod holds any full mask ``[B, h, n_q, n_k]``: ``full``)."""
    return "full" if name == "flex" else name


def interface(name: str, mask_arg: str | None = None) -> Interface:
    """The strategy of mask form ``name`` (one of :data:`attnlab.checker.spec.MASK_FORMS`); a flex function's
    ``mask_arg`` (``block_mask`` or ``score_mod``) says which argument carries the mask."""
    return Flex(mask_arg) if name == "flex" else INTERFACES[name]()
