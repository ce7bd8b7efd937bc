"""A PyTorch module that holds any :class:`~attnlab.MultiHeadWeights`: MHA, GQA, MQA, any head width, self or cross.

``nn.MultiheadAttention`` has no GQA and ties the head width to ``d_model / num_heads``;
:class:`TorchMultiHeadAttention` has neither limit. It is what :func:`attnlab.weights_io.to_torch_attention`
returns, and what :func:`attnlab.weights_io.from_torch_attention` reads back.

Its parameters are four ``nn.Linear`` layers named as in Hugging Face Llama (``q_proj [h*d, d_model]``,
``k_proj, v_proj [h_kv*d, d_kv]``, ``o_proj [d_model, h*d]``, each with or without a bias), so for self
attention its ``state_dict()`` also loads into ``transformers``' ``LlamaAttention`` (with ``attention_bias`` true
when all four biases are present; Llama then applies RoPE, which this module does not).

The forward is ``o_proj(SDPA(q_proj(x_q), k_proj(x_kv), v_proj(x_kv)))`` with PyTorch's
``scaled_dot_product_attention`` (``enable_gqa``: query head ``i`` reads kv head ``i // (h / h_kv)``, attnlab's
convention). Importing this module imports torch; ``import attnlab`` does not.
"""

from __future__ import annotations

from typing import Any

from ..errors import MaskError, OptionError, ShapeError, missing_extra
from ..validate import check_choice, check_int

try:
    import torch
    from torch import nn
except ImportError:  # pragma: no cover - exercised only without the extra
    raise missing_extra("torch", "torch") from None

__all__ = ["TorchMultiHeadAttention"]


class TorchMultiHeadAttention(nn.Module):
    """Multi-head attention (MHA, GQA or MQA, any ``head_dim``, self or cross) as a PyTorch module.

    Shapes: ``x_q [B, n_q, d_model]``, ``x_kv [B, n_k, d_kv]`` (``None`` for self attention),
    ``mask`` boolean (True = may attend) broadcastable to ``[B, h, n_q, n_k]``, output ``[B, n_q, d_model]``.

    Args:
        d_model: width of the queries' input and of the output.
        num_heads: query heads ``h``.
        num_kv_heads: key/value heads (default ``h``; 1 = MQA); must divide ``h``.
        head_dim: width of one head (default ``d_model / h``).
        d_kv: width of the keys'/values' input (default ``d_model``).
        bias: whether the projections have biases: one bool for all four, or a tuple ``(q, k, v, o)``.
        device, dtype: of the parameters, as for ``nn.Linear``.

    >>> m = TorchMultiHeadAttention(8, 4, num_kv_heads=2, head_dim=3, dtype=torch.float64)   # GQA, h*d != d_model
    >>> m(torch.ones(2, 5, 8, dtype=torch.float64), is_causal=True).shape
    torch.Size([2, 5, 8])
    >>> m.k_proj.weight.shape                                   # [h_kv * head_dim, d_kv], as nn.Linear stores it
    torch.Size([6, 8])
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        d_kv: int | None = None,
        bias: bool | tuple[bool, bool, bool, bool] = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        d_model = check_int("d_model", d_model, minimum=1)
        h = check_int("num_heads", num_heads, minimum=1)
        h_kv = h if num_kv_heads is None else check_int("num_kv_heads", num_kv_heads, minimum=1)
        if h % h_kv:
            raise ShapeError(f"num_kv_heads={h_kv} must divide num_heads={h} (GQA groups query heads evenly)")
        if head_dim is None:
            if d_model % h:
                raise ShapeError(f"head_dim: d_model={d_model} is not divisible by num_heads={h}; pass head_dim=")
            head_dim = d_model // h
        d = check_int("head_dim", head_dim, minimum=1)
        d_kv = d_model if d_kv is None else check_int("d_kv", d_kv, minimum=1)
        flags = (bias,) * 4 if isinstance(bias, bool) else tuple(bias) if isinstance(bias, (tuple, list)) else None
        if flags is None or len(flags) != 4:
            raise OptionError(f"bias: expected a bool or a tuple of 4 bools (q, k, v, o), got {bias!r}")
        for name, f in zip(("q", "k", "v", "o"), flags, strict=True):
            check_choice(f"bias[{name}]", f, (True, False))
        kw = {"device": device, "dtype": dtype}
        self.num_heads, self.num_kv_heads, self.head_dim = h, h_kv, d
        self.q_proj = nn.Linear(d_model, h * d, bias=flags[0], **kw)
        self.k_proj = nn.Linear(d_kv, h_kv * d, bias=flags[1], **kw)
        self.v_proj = nn.Linear(d_kv, h_kv * d, bias=flags[2], **kw)
        self.o_proj = nn.Linear(h * d, d_model, bias=flags[3], **kw)

    @property
    def d_model(self) -> int:
        """Width of the queries' input and of the output."""
        return self.q_proj.in_features

    @property
    def d_kv(self) -> int:
        """Width of the keys'/values' input."""
        return self.k_proj.in_features

    def extra_repr(self) -> str:
        """The sizes ``print(module)`` shows: heads, kv heads and head width."""
        return f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}"

    def forward(
        self,
        x_q: torch.Tensor,
        x_kv: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        *,
        is_causal: bool = False,
        scale: float | None = None,
    ) -> torch.Tensor:
        """``[B, n_q, d_model]``: attention of ``x_q`` over ``x_kv`` (itself when ``None``).

        Args:
            x_q: ``[B, n_q, d_model]``.
            x_kv: ``[B, n_k, d_kv]``, or ``None`` for self attention.
            mask: boolean, True = may attend, broadcastable to ``[B, h, n_q, n_k]`` (PyTorch SDPA's convention and
                attnlab's); convert others with :mod:`attnlab.masks`.
            is_causal: top-left causal mask (PyTorch's ``is_causal``); not together with ``mask``.
            scale: multiplies ``Q Kᵀ``; default ``1 / sqrt(head_dim)``.
        """
        src = x_q if x_kv is None else x_kv
        for name, x, width in (("x_q", x_q, self.d_model), ("x_kv", src, self.d_kv)):
            if x.ndim != 3 or x.shape[-1] != width:
                raise ShapeError(f"{name}: expected [B, n, {width}], got shape {tuple(x.shape)}")
        if src.shape[0] != x_q.shape[0]:
            raise ShapeError(f"x_kv: batch {src.shape[0]} does not match x_q's {x_q.shape[0]}")
        if mask is not None and mask.dtype != torch.bool:
            raise MaskError(f"mask: expected a boolean mask (True = may attend), got {mask.dtype}; see attnlab.masks")
        b, n_q, _ = x_q.shape
        n_k = src.shape[1]
        h, h_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(x_q).view(b, n_q, h, d).transpose(1, 2)  # [B, h, n_q, d]
        k = self.k_proj(src).view(b, n_k, h_kv, d).transpose(1, 2)  # [B, h_kv, n_k, d]
        v = self.v_proj(src).view(b, n_k, h_kv, d).transpose(1, 2)  # [B, h_kv, n_k, d]
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=h_kv != h
        )  # [B, h, n_q, d]
        y: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(b, n_q, h * d))  # [B, n_q, d_model]
        return y
