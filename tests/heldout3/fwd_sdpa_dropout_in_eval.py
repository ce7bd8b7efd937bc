"""An attention core that passes its configured `attn_dropout` to SDPA whether or not it is training. Source:
https://github.com/meta-pytorch/torchtune/issues/1791 (the docstring says dropout is ignored outside training, but
the code passes `dropout_p=self.attn_dropout` to `scaled_dot_product_attention`, which applies it whenever p > 0;
fixed in torchtune#1803). Bug: inference outputs are random (dropped weights, the rest scaled by 1/(1-p))."""

import torch.nn.functional as F

SOURCE = "https://github.com/meta-pytorch/torchtune/issues/1791"
KIND = "forward"
EXPECTED = "nondeterministic"
ALSO_OK = ("not-normalized",)
CHECK = {"mask_arg": "mask"}
TARGET = "attention"


class AttentionCore:
    """The attention call of a multi-head layer built with `attn_dropout=0.1`, used for inference."""

    def __init__(self, attn_dropout=0.1):
        self.attn_dropout = attn_dropout
        self.training = False  # the module was put in eval mode

    def __call__(self, q, k, v, mask=None):
        """q `[B, h, n_q, d]`, k/v `[B, h, n_k, d]`; `mask` bool, True = attend."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.attn_dropout)


attention = AttentionCore(attn_dropout=0.1)
