import numpy as np


def attn(q, k, v, mask=None):
    s = q @ k.swapaxes(-1, -2)  # forgot the 1/sqrt(d_k)
    if mask is not None:
        s = np.where(mask, s, -1e9)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v
