"""A ``masked_softmax`` over valid key lengths that masks the scores before the softmax, with -inf.

Source: https://github.com/tensorflow/tensorflow/issues/43941 ("Masking scores before Softmax in Attention": mask the
padded positions with -inf so that the softmax sums to 1 over the actual sequence length only).
Correct: keys ``j >= valid_lens[b]`` get -inf before the softmax; a sequence of length 0 gets zeros.
"""

import math

import numpy as np

SOURCE = "https://github.com/tensorflow/tensorflow/issues/43941"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"mask_form": "valid_lens", "ranks": (4,)}
TARGET = "attention"


def masked_softmax(scores, valid_lens):
    """scores [B, h, n_q, n_k], valid_lens int [B] -> weights with zero weight on keys past each length."""
    keep = np.arange(scores.shape[-1])[None, :] < np.asarray(valid_lens)[:, None]  # [B, n_k]
    s = np.where(keep[:, None, None, :], scores, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    z = e.sum(axis=-1, keepdims=True)
    return np.divide(e, z, out=np.zeros_like(e), where=z > 0)


def attention(q, k, v, valid_lens=None):
    """q [B, h, n_q, d], k [B, h, n_k, d], v [B, h, n_k, d_v], valid_lens int [B]."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if valid_lens is None:
        valid_lens = np.full(q.shape[0], k.shape[-2])
    return masked_softmax(s, valid_lens) @ v
