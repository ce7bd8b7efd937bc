"""Multi-head attention scaled by the embedding width C = n_head * head_size instead of the head size. Source:
https://github.com/Graylab/DL4Proteins-notebooks/issues/12 (`wei = q @ k.transpose(-2, -1) * C**-0.5` with C = 64
while each head has 16 dimensions). Bug: scores divided by sqrt(h * d_k); right with one head."""

import numpy as np

SOURCE = "https://github.com/Graylab/DL4Proteins-notebooks/issues/12"
KIND = "forward"
EXPECTED = "scale-wrong"
ALSO_OK = ()
CHECK = {}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q `[..., h, n_q, d]`, k/v `[..., h, n_k, d]`; `mask` bool `[..., h, n_q, n_k]`, True = attend."""
    n_embd = q.shape[-3] * q.shape[-1]  # C in the notebook
    wei = q @ np.swapaxes(k, -1, -2) * n_embd**-0.5
    if mask is not None:
        wei = np.where(mask, wei, -np.inf)
    m = wei.max(axis=-1, keepdims=True)
    e = np.exp(wei - np.where(np.isfinite(m), m, 0))
    d = e.sum(axis=-1, keepdims=True)
    return np.divide(e, d, out=np.zeros_like(e), where=d > 0) @ v
