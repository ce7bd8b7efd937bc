"""A flex_attention kernel with a sliding-window mask_mod that claims 3 keys back and is off by one.

attnlab check examples/flex_window.py:attention --mask-mod window --claims window_3 --probes mods
"""

from torch.nn.attention.flex_attention import flex_attention as attention

from attnlab import masks

__all__ = ["attention", "window", "window_3"]


def window(b, h, q_idx, kv_idx):
    """Meant: each query sees itself and the 3 keys before it; ``<`` where ``<=`` is meant sees 2."""
    return (kv_idx <= q_idx) & (q_idx - kv_idx < 3)


def window_3(n_q, n_k):
    """The dense rule ``window`` claims: 3 keys back, causal, top-left (True = may attend)."""
    return masks.window(n_q, n_k, left=3, align="top_left")
