"""The ``masked-values-rounding`` note (docs/checker.md, Notes): a correct function whose padded keys enter a
computation the softmax cancels (keys centred by their mean over every position) moves the valid outputs by
rounding only, far less than any weight on the padded keys would; it is a note, never ``finite-fill``, while the
same centring with a finite fill is still ``finite-fill``."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import attnlab


def _centred(q, k, v, mask=None, *, fill=-math.inf):
    """Keys centred by their mean over all n_k positions (masked ones included): the same shift of every score
    of a row, which the softmax cancels."""
    kc = k - k.mean(axis=-2, keepdims=True)
    s = q @ np.swapaxes(kc, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, fill)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    d = e.sum(axis=-1, keepdims=True)
    return np.divide(e, d, out=np.zeros_like(e), where=d > 0) @ v


def centred(q, k, v, mask=None):
    """Correct: centred keys, blocked scores at -inf."""
    return _centred(q, k, v, mask)


def centred_finite_fill(q, k, v, mask=None):
    """A bug: centred keys, blocked scores at -1e4 (which scores of ~1e10 outweigh)."""
    return _centred(q, k, v, mask, fill=-1e4)


def torch_centred(q, k, v, mask=None):
    """Correct, written in torch: keys minus their mean over the sequence axis."""
    import torch

    kc = k - k.mean(dim=-2, keepdim=True)
    s = q @ kc.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v


def _check(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return attnlab.check(fn, isolate=False, name=fn.__name__)


@pytest.mark.parametrize("fn", [centred, torch_centred], ids=["numpy", "torch"])
def test_centred_keys_are_clean_with_the_note(fn):
    r = _check(fn)
    assert r.verdict == "clean", [(f.code, f.message) for f in r.findings]
    assert "masked-values-rounding" in [n.code for n in r.notes]


def test_centred_keys_with_a_finite_fill_are_still_finite_fill():
    r = _check(centred_finite_fill)
    assert "finite-fill" in [f.code for f in r.findings]
