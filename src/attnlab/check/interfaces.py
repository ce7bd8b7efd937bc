"""The mask interfaces a function may take, one strategy each: how the canonical case becomes the call's
arguments and the return value becomes the canonical output.

The checker's cases are canonical (``q [B, h, n_q, d_k]``, a boolean mask ``[B, h, n_q, n_k]``, True = may
attend); the probes draw masks the interface can express (:meth:`attnlab.check.probes.Battery.random_mask`), and
an :class:`Interface` reduces them to what the function takes:

* :class:`Full` ``[B, h, n_q, n_k]`` and :class:`PerBatch` ``[B, 1, n_q, n_k]`` (Hugging Face's 4-D masks), in
  the declared convention;
* :class:`KeyPadding` ``[B, n_k]`` (True = a real key with ``allow``; True = padding with ``block``);
* :class:`Lengths` ``[B]`` int: valid key lengths (``valid_lens``) or a KV cache's lengths (``kv_cache``);
* :class:`Varlen`: packed sequences, ``q [total_q, h, d]`` with ``cu_seqlens_q/k`` and ``max_seqlen_q/k``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["INTERFACES", "Full", "Interface", "KeyPadding", "Lengths", "PerBatch", "Varlen", "interface"]


class Interface:
    """A mask interface. ``reduce`` turns the canonical mask into what the function takes (a boolean array in
    attnlab's convention, which the adapter converts, or integer lengths, marked by ``lengths = True``)."""

    name = "full"
    lengths = False
    packed = False

    def reduce(self, allowed: np.ndarray) -> np.ndarray:
        return allowed


class Full(Interface):
    """``[B, h, n_q, n_k]`` (or ``[h, n_q, n_k]`` for 3-D inputs)."""


class PerBatch(Interface):
    """``[B, 1, n_q, n_k]``, broadcast over heads."""

    name = "batch"

    def reduce(self, allowed: np.ndarray) -> np.ndarray:
        return allowed[:, :1] if allowed.ndim >= 4 else allowed


class KeyPadding(Interface):
    """``[B, n_k]``: the keys the last query of each sequence may attend (every query, for a padding mask)."""

    name = "key_padding"

    def reduce(self, allowed: np.ndarray) -> np.ndarray:
        return allowed[:, 0, -1, :] if allowed.ndim >= 4 else allowed


class Lengths(KeyPadding):
    """``[B]`` int64: how many keys of each sequence are valid (the mask is a prefix)."""

    lengths = True

    def __init__(self, name: str):
        self.name = name

    def reduce(self, allowed: np.ndarray) -> np.ndarray:
        return super().reduce(allowed).sum(axis=-1).astype(np.int64)


class Varlen(Interface):
    """Packed sequences (flash-attn's varlen functions): sequence b's first ``L_q`` queries and ``L_k`` keys
    (the rows and the keys its prefix mask allows) are concatenated; the output is unpacked, rows of no sequence
    0."""

    name = "varlen"
    packed = True

    @staticmethod
    def lengths_of(q: np.ndarray, k: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
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


INTERFACES: dict[str, Any] = {
    "full": Full,
    "batch": PerBatch,
    "key_padding": KeyPadding,
    "valid_lens": lambda: Lengths("valid_lens"),
    "kv_cache": lambda: Lengths("kv_cache"),
    "varlen": Varlen,
}


def interface(name: str) -> Interface:
    """The strategy of mask form ``name`` (one of :data:`attnlab.check.adapters.MASK_FORMS`)."""
    return INTERFACES[name]()
