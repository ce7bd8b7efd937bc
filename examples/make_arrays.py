"""Writes the small arrays the docs' commands read (``python examples/make_arrays.py`` rewrites them, the same):

* ``q.npy``, ``k.npy``, ``v.npy``: 5 tokens, d = 2 (``attnlab explain --q examples/q.npy ...``);
* ``heads.npy``: the causal attention weights ``[h=4, n_q=6, n_k=6]`` of random q, k (``attnlab heatmap --weights``).
"""

from pathlib import Path

import numpy as np

import attnlab

HERE = Path(__file__).resolve().parent


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(5, 2)).round(2) for _ in range(3))
    hq, hk = rng.normal(size=(2, 4, 6, 8))
    heads = attnlab.attention_trace(hq, hk, hk, causal=True).weights.round(4)  # [4, 6, 6], rows sum to 1
    return {"q": q, "k": k, "v": v, "heads": heads}


if __name__ == "__main__":
    for name, a in arrays().items():
        np.save(HERE / f"{name}.npy", a)
