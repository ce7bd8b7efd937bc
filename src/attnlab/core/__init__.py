"""The pure core: softmax, scaled dot-product attention and its trace, input validation."""

from .attention import AttentionTrace, attention_trace, scaled_dot_product_attention
from .softmax import log_softmax, masked_softmax, softmax

__all__ = [
    "AttentionTrace",
    "attention_trace",
    "log_softmax",
    "masked_softmax",
    "scaled_dot_product_attention",
    "softmax",
]
