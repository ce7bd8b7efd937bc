"""A ViT attention block that passes its attention dropout to SDPA whether or not it is training.

Source: https://github.com/huggingface/pytorch-image-models/pull/1978 (timm: "scaled_dot_product_attention: don't
dropout in eval"; the same recurring bug as karpathy/nanoGPT#240).
Bug: ``F.scaled_dot_product_attention`` applies ``dropout_p`` on every call (it does not look at the module's
``training`` flag), so an instance in eval mode drops attention weights at random.
Shows on: every input (two calls with the same inputs differ; a call differs from the reference).
"""

import torch.nn.functional as F

SOURCE = "https://github.com/huggingface/pytorch-image-models/pull/1978"
KIND = "forward"
EXPECTED = "nondeterministic"
ALSO_OK = ("not-normalized",)
CHECK = {"mask_convention": "allow"}
TARGET = "attention"


class Attention:
    """The attention core of a block: ``attn_drop`` is the configured rate, ``training`` the module's mode."""

    def __init__(self, attn_drop: float = 0.1) -> None:
        self.attn_drop = attn_drop
        self.training = False

    def __call__(self, q, k, v, attn_mask=None):
        # the fix is ``dropout_p=self.attn_drop if self.training else 0.0``
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=self.attn_drop)


attention = Attention()
