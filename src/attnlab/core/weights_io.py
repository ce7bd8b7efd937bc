"""Import and export of multi-head attention weights: PyTorch ``nn.MultiheadAttention`` and Hugging Face layers.

Every library stores ``nn.Linear`` weights as ``[d_out, d_in]`` (``y = x Wᵀ + b``); attnlab uses the articles'
``x @ W`` with ``W [d_in, d_out]``, so every matrix is transposed on the way in and out. State dicts may hold
NumPy arrays (``safetensors.numpy``) or PyTorch tensors; what comes back is always a fresh NumPy copy, never a
view of the caller's tensors.

=============================  ===========================================================================
source                         names (``{p}`` = prefix, ``{i}`` = layer index)
=============================  ===========================================================================
``nn.MultiheadAttention``      ``in_proj_weight [3E, E]`` packed q/k/v (or ``q_proj_weight``, ``k_proj_weight``,
                               ``v_proj_weight`` when kdim/vdim differ), ``in_proj_bias [3E]``,
                               ``out_proj.weight``, ``out_proj.bias``
Hugging Face BERT              ``{p}encoder.layer.{i}.attention.self.{query,key,value}.{weight,bias}``,
                               ``{p}encoder.layer.{i}.attention.output.dense.{weight,bias}``
Hugging Face Llama / Mistral   ``{p}layers.{i}.self_attn.{q,k,v,o}_proj.weight`` (biases if present, as Qwen2)
=============================  ===========================================================================

Llama-style checkpoints store q/k in the half-split rotary layout Hugging Face's ``rotate_half`` expects; the
weights are imported as stored (no permutation), so apply RoPE the Hugging Face way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._arrays import to_numpy
from ..errors import DTypeError, ShapeError, missing_extra
from .multihead import MultiHeadWeights

__all__ = [
    "from_bert",
    "from_llama",
    "from_torch_mha",
    "to_bert",
    "to_llama",
    "to_torch_mha",
]


def _state(state_dict: Any) -> Mapping[str, Any]:
    if hasattr(state_dict, "state_dict") and callable(state_dict.state_dict):
        state_dict = state_dict.state_dict()
    if not isinstance(state_dict, Mapping):
        raise DTypeError(f"state_dict: expected a mapping name -> array (or a module), got {type(state_dict).__name__}")
    return state_dict


def _arr(x: Any, dtype: Any) -> np.ndarray:
    a = np.array(to_numpy(x), copy=True)
    return a if dtype is None else a.astype(dtype)


def _get(sd: Mapping[str, Any], key: str, dtype: Any, *, required: bool = True) -> np.ndarray | None:
    if key in sd:
        return _arr(sd[key], dtype)
    if not required:
        return None
    near = sorted(sd)[:6]
    raise ShapeError(f"state_dict: no entry {key!r} ({len(sd)} entries, e.g. {near})")


def _find_prefix(sd: Mapping[str, Any], suffix: str, prefix: str | None, what: str) -> str:
    if prefix is not None:
        return prefix
    hits = sorted(k[: -len(suffix)] for k in sd if k.endswith(suffix))
    if not hits:
        raise ShapeError(
            f"state_dict: no key ends with {suffix!r}, so these are not {what} weights (or the layer index is out "
            f"of range); keys look like {sorted(sd)[:4]}"
        )
    if len(hits) > 1:
        raise ShapeError(f"state_dict: several prefixes hold {suffix!r}: {hits}; pass prefix= to choose one")
    return hits[0]


# --------------------------------------------------------------------------------------------------------------
# PyTorch nn.MultiheadAttention


def from_torch_mha(state_dict: Any, *, num_heads: int | None = None, prefix: str = "", dtype: Any = None):
    """Weights of a PyTorch ``nn.MultiheadAttention`` (the module or its state dict) as :class:`MultiHeadWeights`.

    Args:
        state_dict: the module, or its ``state_dict()`` (tensors or NumPy arrays).
        num_heads: the module's heads (read from the module when one is given).
        prefix: prefix of the keys when the layer sits inside a bigger model (e.g. ``"attn."``).
        dtype: NumPy dtype of the result (default: as stored).

    ``add_bias_kv`` (``bias_k``/``bias_v``) has no equivalent here and is refused.
    """
    if num_heads is None and hasattr(state_dict, "num_heads"):
        num_heads = state_dict.num_heads
    if num_heads is None:
        raise ShapeError("num_heads: required with a state dict (nn.MultiheadAttention does not store it)")
    sd = _state(state_dict)
    p = prefix
    for extra in ("bias_k", "bias_v"):
        if p + extra in sd and sd[p + extra] is not None:
            raise ShapeError(
                f"state_dict: {p + extra!r} present (add_bias_kv=True), which attnlab's layer does not model"
            )
    if p + "in_proj_weight" in sd and sd[p + "in_proj_weight"] is not None:
        w = _get(sd, p + "in_proj_weight", dtype)
        if w.ndim != 2 or w.shape[0] % 3:
            raise ShapeError(f"in_proj_weight: expected [3E, E], got shape {w.shape}")
        e = w.shape[0] // 3
        wq, wk, wv = w[:e].T, w[e : 2 * e].T, w[2 * e :].T
    else:
        wq, wk, wv = (_get(sd, p + f"{n}_proj_weight", dtype).T for n in "qkv")
    b = _get(sd, p + "in_proj_bias", dtype, required=False)
    if b is not None and b.shape != (wq.shape[1] + wk.shape[1] + wv.shape[1],):
        raise ShapeError(f"in_proj_bias: shape {b.shape} does not match the q/k/v widths")
    bq, bk, bv = (None, None, None) if b is None else np.split(b, [wq.shape[1], wq.shape[1] + wk.shape[1]])
    wo = _get(sd, p + "out_proj.weight", dtype).T
    bo = _get(sd, p + "out_proj.bias", dtype, required=False)
    return MultiHeadWeights(
        np.ascontiguousarray(wq),
        np.ascontiguousarray(wk),
        np.ascontiguousarray(wv),
        np.ascontiguousarray(wo),
        bq,
        bk,
        bv,
        bo,
        num_heads=num_heads,
    )


def to_torch_mha(weights: MultiHeadWeights, *, prefix: str = "", dtype: Any = None) -> dict[str, Any]:
    """A state dict (PyTorch tensors) that ``nn.MultiheadAttention.load_state_dict`` accepts.

    Build the module as ``nn.MultiheadAttention(d_model, num_heads, bias=..., kdim=d_kv, vdim=d_kv)``; the q/k/v
    weights are packed into ``in_proj_weight`` when ``d_kv == d_model`` and kept separate otherwise, as PyTorch
    does. Needs ``num_kv_heads == num_heads`` and ``num_heads * head_dim == d_model`` (PyTorch's layer has no
    GQA and no free head width). Missing biases become zeros when some are present.
    """
    try:
        import torch
    except ImportError:
        raise missing_extra("torch", "torch") from None
    if weights.num_kv_heads != weights.num_heads:
        raise ShapeError(
            f"weights: num_kv_heads={weights.num_kv_heads} != num_heads={weights.num_heads}; nn.MultiheadAttention "
            f"has no GQA (repeat the kv heads' columns first if you want an equivalent MHA layer)"
        )
    if weights.num_heads * weights.head_dim != weights.d_model:
        raise ShapeError(
            f"weights: num_heads * head_dim = {weights.num_heads * weights.head_dim} != d_model={weights.d_model}, "
            f"which nn.MultiheadAttention requires"
        )

    def t(a: Any) -> Any:
        x = torch.from_numpy(np.ascontiguousarray(to_numpy(a)).copy())
        return x if dtype is None else x.to(dtype)

    p = prefix
    out: dict[str, Any] = {}
    wq, wk, wv = (to_numpy(w) for w in (weights.w_q, weights.w_k, weights.w_v))
    if weights.d_kv == weights.d_model:
        out[p + "in_proj_weight"] = t(np.concatenate([wq.T, wk.T, wv.T], axis=0))
    else:
        out[p + "q_proj_weight"], out[p + "k_proj_weight"], out[p + "v_proj_weight"] = t(wq.T), t(wk.T), t(wv.T)
    biases = (weights.b_q, weights.b_k, weights.b_v, weights.b_o)
    has_bias = any(b is not None for b in biases)
    if has_bias:
        widths = (wq.shape[1], wk.shape[1], wv.shape[1], weights.d_model)
        bq, bk, bv, bo = (
            np.zeros(n, wq.dtype) if b is None else to_numpy(b) for b, n in zip(biases, widths, strict=True)
        )
        out[p + "in_proj_bias"] = t(np.concatenate([bq, bk, bv]))
    out[p + "out_proj.weight"] = t(to_numpy(weights.w_o).T)
    if has_bias:
        out[p + "out_proj.bias"] = t(bo)
    return out


# --------------------------------------------------------------------------------------------------------------
# Hugging Face


def _layer_index(layer: Any) -> int:
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or layer < 0:
        raise ShapeError(f"layer: expected an int >= 0, got {layer!r}")
    return int(layer)


def _pair(sd: Mapping[str, Any], base: str, dtype: Any) -> tuple[np.ndarray, np.ndarray | None]:
    w = _get(sd, base + ".weight", dtype)
    if w.ndim != 2:
        raise ShapeError(f"{base}.weight: expected a 2-D [d_out, d_in] matrix, got shape {w.shape}")
    return np.ascontiguousarray(w.T), _get(sd, base + ".bias", dtype, required=False)


def from_bert(
    state_dict: Any, layer: int, *, num_heads: int, prefix: str | None = None, dtype: Any = None
) -> MultiHeadWeights:
    """The self-attention block of BERT-style layer ``layer`` (BERT, MiniLM, RoBERTa) as :class:`MultiHeadWeights`.

    ``prefix`` is found automatically (``""``, ``"bert."``, ``"0.auto_model."`` ...) unless given.
    """
    i = _layer_index(layer)
    tail = f"encoder.layer.{i}.attention.self.query.weight"
    p = _find_prefix(_state(state_dict), tail, prefix, "BERT-style")
    sd = _state(state_dict)
    base = f"{p}encoder.layer.{i}.attention."
    wq, bq = _pair(sd, base + "self.query", dtype)
    wk, bk = _pair(sd, base + "self.key", dtype)
    wv, bv = _pair(sd, base + "self.value", dtype)
    wo, bo = _pair(sd, base + "output.dense", dtype)
    return MultiHeadWeights(wq, wk, wv, wo, bq, bk, bv, bo, num_heads=num_heads)


def from_llama(
    state_dict: Any,
    layer: int,
    *,
    num_heads: int,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    prefix: str | None = None,
    dtype: Any = None,
) -> MultiHeadWeights:
    """The attention block of Llama-style layer ``layer`` (Llama, Mistral, Qwen2, SmolLM) as :class:`MultiHeadWeights`.

    Args:
        state_dict: name -> array (``safetensors.numpy.load_file``, ``model.state_dict()``...), or a module.
        layer: layer index ``i`` in ``layers.{i}.self_attn.*``.
        num_heads: ``num_attention_heads`` of the config.
        num_kv_heads: ``num_key_value_heads`` (default ``num_heads``).
        head_dim: the config's ``head_dim`` when it is not ``hidden_size / num_heads``.
        prefix: found automatically (``"model."`` usually) unless given.
        dtype: NumPy dtype of the result (bfloat16 checkpoints come back as float32 by default).
    """
    i = _layer_index(layer)
    tail = f"layers.{i}.self_attn.q_proj.weight"
    sd = _state(state_dict)
    p = _find_prefix(sd, tail, prefix, "Llama-style")
    base = f"{p}layers.{i}.self_attn."
    wq, bq = _pair(sd, base + "q_proj", dtype)
    wk, bk = _pair(sd, base + "k_proj", dtype)
    wv, bv = _pair(sd, base + "v_proj", dtype)
    wo, bo = _pair(sd, base + "o_proj", dtype)
    return MultiHeadWeights(
        wq, wk, wv, wo, bq, bk, bv, bo, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim
    )


def _export(pairs: dict[str, tuple[Any, Any]]) -> dict[str, np.ndarray]:
    out = {}
    for base, (w, b) in pairs.items():
        out[base + ".weight"] = np.ascontiguousarray(to_numpy(w).T).copy()
        if b is not None:
            out[base + ".bias"] = np.array(to_numpy(b), copy=True)
    return out


def to_bert(weights: MultiHeadWeights, layer: int, *, prefix: str = "") -> dict[str, np.ndarray]:
    """BERT-style names and ``[d_out, d_in]`` matrices for layer ``layer`` (the inverse of :func:`from_bert`)."""
    base = f"{prefix}encoder.layer.{_layer_index(layer)}.attention."
    w = weights
    return _export(
        {
            base + "self.query": (w.w_q, w.b_q),
            base + "self.key": (w.w_k, w.b_k),
            base + "self.value": (w.w_v, w.b_v),
            base + "output.dense": (w.w_o, w.b_o),
        }
    )


def to_llama(weights: MultiHeadWeights, layer: int, *, prefix: str = "model.") -> dict[str, np.ndarray]:
    """Llama-style names and ``[d_out, d_in]`` matrices for layer ``layer`` (the inverse of :func:`from_llama`)."""
    base = f"{prefix}layers.{_layer_index(layer)}.self_attn."
    w = weights
    return _export(
        {
            base + "q_proj": (w.w_q, w.b_q),
            base + "k_proj": (w.w_k, w.b_k),
            base + "v_proj": (w.w_v, w.b_v),
            base + "o_proj": (w.w_o, w.b_o),
        }
    )
