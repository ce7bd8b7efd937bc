"""Module mode: checking attention *layers* that take hidden states (or a module argument) instead of q, k, v.

A layer such as ``nn.MultiheadAttention`` computes ``out_proj(attention(W_q x, W_k x, W_v x))``. To test the
attention itself, the checker rebuilds the layer for each shape it tries (same class, same options: dropout,
bias, ``batch_first``, the attention implementation, the fused or manual path) and makes its projections
identities: for layers with separate inputs (``nn.MultiheadAttention``) the projection weights become identity
matrices; for self-attention layers (one ``x``) the Q/K/V projections are replaced by modules that return the
checker's q, k and v, and the output projection by ``nn.Identity``. Rotary embeddings get ``cos = 1, sin = 0``
(the identity rotation), QK norms become identities. The result is a function ``fn(q, k, v, mask=None)`` over
``[B, h, n, d]`` tensors with a True-means-attend mask, which the wrapper converts to the layer's own
convention.

Families (:func:`module_mode` detects them by class and attributes):

* ``torch.nn.MultiheadAttention``: boolean ``attn_mask`` (True = blocked) ``[B*h, n_q, n_k]``; cross-attention.
* Hugging Face attention with rotary ``position_embeddings`` (``LlamaAttention``, Mistral, Qwen2...): additive
  4-D mask, GQA (``num_key_value_heads``), eager or sdpa per ``config._attn_implementation``.
* Hugging Face BERT-style self-attention (``BertSelfAttention``: ``query``/``key``/``value``), and the block
  around it (``BertAttention``: ``self`` then ``output``, whose dense and LayerNorm become identities).
* Hugging Face layers taking ``hidden_states`` with named projections and no rotary embeddings: separate
  ``q_proj``/``k_proj``/``v_proj`` with ``out_proj`` (BART, Whisper, OPT, M2M100...) or ``o_proj``, T5's
  ``q``/``k``/``v``/``o``, GPT-2's fused ``c_attn`` (``[q | k | v]`` along the features) with ``c_proj``, GPT-NeoX's
  per-head fused ``query_key_value`` with ``dense`` (rotary on a share of each head: identity). A copy of
  the layer gets the shape's ``head_dim`` (and head counts), its projections fed, its output projection
  identity; cross-attention through ``key_value_states`` where the layer takes it.
* timm's ``Attention`` (``qkv``, ``proj``): boolean ``attn_mask``, fused (SDPA) or manual path.
* nanoGPT's ``CausalSelfAttention`` (``c_attn``, ``c_proj``): always causal, no mask.
* Hugging Face attention functions ``fn(module, query, key, value, attention_mask, scaling, ...)`` (
  ``eager_attention_forward``, any ``AttentionInterface`` function): called with a stand-in module.

Any other ``nn.Module`` whose ``forward`` takes q, k and v is called as it is, ``layer(q, k, v, ...)`` (its
``forward``'s parameters are read); one that takes hidden states of a family not listed here is refused with a
usage error that says how to check it (:func:`unknown_layer`), never called with q, k, v and blamed for crashing.
"""

from __future__ import annotations

import copy
import inspect
import math
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModuleMode", "function_mode", "module_mode", "unknown_layer"]


@dataclass
class ModuleMode:
    """How a layer is checked: ``fn(q, k, v, mask=None[, scale=None])`` and what the layer cannot express."""

    fn: Callable[..., Any]
    family: str
    unsupported: dict[str, str] = field(default_factory=dict)
    causal_only: bool = False
    gqa: bool = False
    notes: tuple[str, ...] = ()


_SELF = "a self-attention layer: queries and keys come from the same tokens"
_ONE_D = "the layer's heads have one size for queries, keys and values"
_RANK = "the layer takes [B, n, d_model] hidden states"


def _self_attention_limits(gqa: str | None = None, **first: str) -> dict[str, str]:
    """What a self-attention layer over ``[B, n, d_model]`` hidden states cannot express (``ModuleMode``'s
    ``unsupported``): ``first``'s entries, cross attention, d_v != d_k, ``gqa`` when it has one set of heads, and
    other ranks."""
    return {**first, "cross": _SELF, "dv": _ONE_D, **({"gqa": gqa} if gqa else {}), "rank": _RANK}


def _torch() -> Any:
    import torch

    return torch


def _feed_class() -> Any:
    from torch import nn

    class Feed(nn.Module):
        """Stands in for a projection: returns the tensor the checker set, whatever the input."""

        def __init__(self) -> None:
            super().__init__()
            self.value = None

        def forward(self, x: Any) -> Any:
            return self.value

    return Feed


def _heads_first(x: Any) -> Any:
    """``[B, h, n, d]`` -> ``[B, n, h*d]``."""
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b, n, h * d)


def _heads_back(x: Any, h: int) -> Any:
    """``[B, n, h*d]`` -> ``[B, h, n, d]``."""
    b, n, hd = x.shape
    return x.reshape(b, n, h, hd // h).transpose(1, 2)


def _forward(m: Any, h: int, *args: Any, **kwargs: Any) -> Any:
    """Call the stand-in layer ``m`` (on hidden states ``[B, n, d_model]`` whose feeds return the checker's q, k, v)
    and return its output, ``[B, n, h*d]`` or the first entry of a tuple, as ``[B, h, n, d]``. Autograd stays on:
    the output carries the graph back to the checker's q, k, v (``backward=True`` differentiates through the
    layer); the layer's own weights are frozen (:func:`_frozen`), so no weight gradient is computed."""
    out = m(*args, **kwargs)
    return _heads_back(out[0] if isinstance(out, tuple) else out, h)


def _own_defaults(forward: Callable[..., Any], passed: tuple[str, ...]) -> str:
    """The keyword defaults a call of ``forward`` leaves to the layer (those not in ``passed``, None left out), as
    ``"need_weights=True, average_attn_weights=True"``: module mode calls a layer as users do and says how."""
    try:
        params = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return "its signature cannot be read"
    shown = [
        f"{p.name}={p.default!r}"
        for p in params
        if p.default is not p.empty and p.default is not None and p.name not in passed
    ]
    return ", ".join(shown) or "no keyword defaults"


def _frozen(m: Any) -> Any:
    """``m`` with ``requires_grad`` off on its parameters (identity projections: only q, k, v are differentiated)."""
    return m.requires_grad_(False)


def _additive(torch: Any, mask: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """A Hugging Face additive mask: 0 where allowed, ``finfo(dtype).min`` where blocked (all 0 for None).

    For float64, ``finfo(float32).min``: Hugging Face's eager path upcasts the scores to float32 for the softmax,
    where float64's minimum would become ``-inf`` (and a fully masked row NaN) although float64 holds it.
    """
    fill = torch.finfo(torch.float32 if dtype == torch.float64 else dtype).min
    if mask is None:
        return torch.zeros(shape, dtype=dtype)
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, fill)


class _Cache:
    """Layers rebuilt per shape and dtype (construction is a few milliseconds; the battery uses ~30 shapes)."""

    def __init__(self, build: Callable[..., Any]):
        self.build = build
        self.made: dict[tuple, Any] = {}

    def get(self, *key: Any) -> Any:
        m = self.made.get(key)
        if m is None:
            m = self.made[key] = self.build(*key)
        return m


def _mha(layer: Any) -> ModuleMode:
    torch = _torch()

    def build(h: int, d: int, dtype: Any) -> Any:
        e = h * d
        m = type(layer)(
            e,
            h,
            dropout=layer.dropout,
            bias=layer.in_proj_bias is not None,
            batch_first=layer.batch_first,
            dtype=dtype,
        )
        with torch.no_grad():
            eye = torch.eye(e, dtype=dtype)
            m.in_proj_weight.copy_(torch.cat([eye, eye, eye]))
            m.out_proj.weight.copy_(eye)
            if m.in_proj_bias is not None:
                m.in_proj_bias.zero_()
                m.out_proj.bias.zero_()
        return _frozen(m.train(layer.training))

    cache = _Cache(build)

    def attention(q: Any, k: Any, v: Any, mask: Any = None) -> Any:
        b, h, n_q, d = q.shape
        m = cache.get(h, d, q.dtype)
        xs = [_heads_first(x) for x in (q, k, v)]
        if not m.batch_first:
            xs = [x.transpose(0, 1) for x in xs]
        blocked = None if mask is None else (~mask.expand(b, h, n_q, k.shape[-2])).reshape(b * h, n_q, -1)
        out, _ = m(*xs, attn_mask=blocked, need_weights=False)
        if not m.batch_first:
            out = out.transpose(0, 1)
        return _heads_back(out, h)

    return ModuleMode(
        attention,
        "torch.nn.MultiheadAttention: identity in_proj and out_proj, attn_mask True = blocked [B*h, n_q, n_k]; "
        "called with need_weights=False (the SDPA path; its other defaults: "
        f"{_own_defaults(layer.forward, ('attn_mask', 'need_weights'))}); with need_weights=True, its default, a fully "
        "masked row is NaN (pytorch/pytorch#41508)",
        {"dv": _ONE_D, "gqa": "nn.MultiheadAttention has one set of heads", "rank": _RANK},
    )


def _hf_rotary(layer: Any) -> ModuleMode:
    torch = _torch()
    nn = torch.nn
    feed = _feed_class()
    config = layer.config

    def build(h: int, h_kv: int, d: int, dtype: Any) -> Any:
        cfg = copy.deepcopy(config)
        cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size = h, h_kv, d, h * d
        m = type(layer)(cfg, layer_idx=getattr(layer, "layer_idx", 0) or 0)
        m.q_proj, m.k_proj, m.v_proj, m.o_proj = feed(), feed(), feed(), nn.Identity()
        for norm in ("q_norm", "k_norm"):
            if hasattr(m, norm):
                setattr(m, norm, nn.Identity())
        return _frozen(m.to(dtype).train(layer.training))

    cache = _Cache(build)

    def attention(q: Any, k: Any, v: Any, mask: Any = None) -> Any:
        b, h, n, d = q.shape
        m = cache.get(h, k.shape[1], d, q.dtype)
        m.q_proj.value, m.k_proj.value, m.v_proj.value = (_heads_first(x) for x in (q, k, v))
        rope = (q.new_ones(b, n, d), q.new_zeros(b, n, d))  # cos = 1, sin = 0: the identity rotation
        am = _additive(torch, mask, (b, 1, n, k.shape[-2]), q.dtype)
        return _forward(m, h, hidden_states=q.new_zeros(b, n, h * d), position_embeddings=rope, attention_mask=am)

    impl = getattr(config, "_attn_implementation", None) or "eager"
    return ModuleMode(
        attention,
        f"Hugging Face {type(layer).__name__} ({impl}): q/k/v_proj return the checker's q, k, v, o_proj identity, "
        "rotary cos = 1 and sin = 0, a 4-D additive attention_mask",
        _self_attention_limits(),
        gqa=True,
    )


def _hf_bert(layer: Any, block: bool = False) -> ModuleMode:
    """BERT-style self-attention; ``block``: the layer is the attention block around it (``BertAttention``: the
    self-attention as ``layer.self``, then ``layer.output``'s dense, dropout and LayerNorm over the residual),
    checked with that output's dense and LayerNorm identities and zero hidden states (the residual adds 0)."""
    torch = _torch()
    nn = torch.nn
    feed = _feed_class()
    core = layer.self if block else layer
    config = core.config

    def build(h: int, d: int, dtype: Any) -> Any:
        cfg = copy.deepcopy(config)
        cfg.num_attention_heads, cfg.hidden_size = h, h * d
        kwargs = {"is_causal": core.is_causal} if "is_causal" in inspect.signature(type(layer)).parameters else {}
        m = type(layer)(cfg, **kwargs)
        a = m.self if block else m
        a.query, a.key, a.value = feed(), feed(), feed()
        if block:
            m.output.dense, m.output.LayerNorm = nn.Identity(), nn.Identity()
        return _frozen(m.to(dtype).train(layer.training))

    cache = _Cache(build)

    def attention(q: Any, k: Any, v: Any, mask: Any = None) -> Any:
        b, h, n, d = q.shape
        m = cache.get(h, d, q.dtype)
        a = m.self if block else m
        a.query.value, a.key.value, a.value.value = (_heads_first(x) for x in (q, k, v))
        am = _additive(torch, mask, (b, 1, n, n), q.dtype)
        return _forward(m, h, q.new_zeros(b, n, h * d), attention_mask=am)

    impl = getattr(config, "_attn_implementation", None) or "eager"
    family = f"Hugging Face {type(layer).__name__} ({impl}): "
    if block:
        family += f"self ({type(core).__name__}): "
    family += "query/key/value return the checker's q, k, v, a 4-D additive attention_mask"
    if block:
        family += "; output.dense and output.LayerNorm identity, hidden states 0 (the residual adds nothing)"
    return ModuleMode(attention, family, _self_attention_limits("BERT-style attention has one set of heads"))


def _is_bert_self(m: Any) -> bool:
    """Whether ``m`` is a BERT-style self-attention module (``query``/``key``/``value`` and a ``config``)."""
    return all(hasattr(m, n) for n in ("query", "key", "value", "config"))


def _timm(layer: Any) -> ModuleMode:
    torch = _torch()
    nn = torch.nn
    feed = _feed_class()

    def build(h: int, d: int, dtype: Any) -> Any:
        m = type(layer)(h * d, num_heads=h, qkv_bias=layer.qkv.bias is not None, attn_drop=layer.attn_drop.p)
        m.fused_attn = getattr(layer, "fused_attn", True)
        m.qkv, m.proj = feed(), nn.Identity()
        for name in ("q_norm", "k_norm", "norm"):
            if hasattr(m, name):
                setattr(m, name, nn.Identity())
        return _frozen(m.to(dtype).train(layer.training))

    cache = _Cache(build)

    def attention(q: Any, k: Any, v: Any, mask: Any = None) -> Any:
        b, h, n, d = q.shape
        m = cache.get(h, d, q.dtype)
        m.qkv.value = torch.stack([x.transpose(1, 2) for x in (q, k, v)], dim=2).reshape(b, n, 3 * h * d)
        return _forward(m, h, q.new_zeros(b, n, h * d), attn_mask=mask)

    path = "fused SDPA" if getattr(layer, "fused_attn", True) else "manual"
    return ModuleMode(
        attention,
        f"timm {type(layer).__name__} ({path} path): qkv returns the checker's q, k, v, proj identity, attn_mask "
        "boolean True = attend",
        _self_attention_limits("timm's Attention has one set of heads"),
    )


def _nanogpt(layer: Any) -> ModuleMode:
    torch = _torch()
    nn = torch.nn
    feed = _feed_class()
    block = int(layer.bias.shape[-1]) if isinstance(getattr(layer, "bias", None), torch.Tensor) else 1024

    def build(h: int, d: int, n: int, dtype: Any) -> Any:
        cfg = types.SimpleNamespace(
            n_embd=h * d,
            n_head=h,
            bias=layer.c_attn.bias is not None,
            dropout=getattr(layer, "dropout", 0.0),
            block_size=max(block, n),
        )
        m = type(layer)(cfg)
        m.flash = getattr(layer, "flash", True)
        own = getattr(layer, "bias", None)
        if isinstance(own, torch.Tensor) and own.shape[-1] >= n:  # the layer's own causal buffer, as it is
            if hasattr(m, "bias"):
                del m.bias
            m.register_buffer("bias", own.clone())
        elif not m.flash and not hasattr(m, "bias"):
            m.register_buffer(
                "bias", torch.tril(torch.ones(cfg.block_size, cfg.block_size)).view(1, 1, *[cfg.block_size] * 2)
            )
        m.c_attn, m.c_proj = feed(), nn.Identity()
        return _frozen(m.to(dtype).train(layer.training))

    cache = _Cache(build)

    def attention(q: Any, k: Any, v: Any) -> Any:
        b, h, n, d = q.shape
        m = cache.get(h, d, n, q.dtype)
        m.c_attn.value = torch.cat([_heads_first(x) for x in (q, k, v)], dim=2)
        return _forward(m, h, q.new_zeros(b, n, h * d))

    path = "flash (SDPA is_causal)" if getattr(layer, "flash", True) else "manual"
    return ModuleMode(
        attention,
        f"nanoGPT {type(layer).__name__} ({path} path): c_attn returns the checker's q, k, v, c_proj identity; "
        "always causal",
        _self_attention_limits("nanoGPT has one set of heads", mask="nanoGPT's CausalSelfAttention takes no mask"),
        causal_only=True,
    )


#: Hugging Face projection names: (query, key, value, output), each a sub-module of the layer.
_HF_SEPARATE = (
    ("q_proj", "k_proj", "v_proj", "out_proj"),
    ("q_proj", "k_proj", "v_proj", "o_proj"),
    ("q", "k", "v", "o"),
)


def _hf_projections(layer: Any, params: set[str]) -> tuple[tuple[str, ...], str] | None:
    """The projection names of a Hugging Face layer module mode feeds directly, and how q, k, v are packed:
    ``"separate"``, ``"features"`` (GPT-2's ``c_attn``: ``[q | k | v]`` along the features) or ``"per-head"``
    (GPT-NeoX's ``query_key_value``: ``[q_h | k_h | v_h]`` for each head, with rotary ``position_embeddings``)."""
    if "hidden_states" not in params or getattr(layer, "config", None) is None:
        return None
    modules = dict(layer.named_children())
    if "position_embeddings" in params:  # (q_proj/k_proj/v_proj layers with rotary are the rebuilt family)
        if {"query_key_value", "dense"} <= set(modules) and hasattr(layer, "head_size"):
            return ("query_key_value", "dense"), "per-head"
        return None
    for names in _HF_SEPARATE:
        if all(n in modules for n in names):
            return names, "separate"
    if "c_attn" in modules and "c_proj" in modules and hasattr(layer, "split_size"):
        return ("c_attn", "c_proj"), "features"
    return None


def _hf_named(layer: Any, names: tuple[str, ...], packing: str, params: set[str]) -> ModuleMode:
    torch = _torch()
    nn = torch.nn
    feed = _feed_class()
    head_attr = next(a for a in ("key_value_proj_dim", "head_size", "head_dim") if hasattr(layer, a))  # T5, NeoX
    old_d = int(getattr(layer, head_attr))
    old_scale = getattr(layer, "scaling", None)
    standard = old_scale is None or math.isclose(float(old_scale), old_d**-0.5, rel_tol=1e-6)
    grouped = hasattr(layer, "num_key_value_groups")
    mask_param = "attention_mask" if "attention_mask" in params else "mask"  # T5 calls it mask
    cross = "key_value_states" in params and packing == "separate"
    rotary = "position_embeddings" in params
    rotary_share = getattr(layer, "rotary_ndims", old_d) / old_d  # GPT-NeoX rotates a share of each head

    def build(h: int, h_kv: int, d: int, dtype: Any) -> Any:
        m = copy.deepcopy(layer)
        sizes = {
            head_attr: d,
            "num_heads": h,
            "n_heads": h,
            "num_key_value_heads": h_kv,
            "num_key_value_groups": h // h_kv,
            "embed_dim": h * d,
            "inner_dim": h * d,
            "split_size": h * d,
            "rotary_ndims": int(d * rotary_share),
        }
        for attr, value in sizes.items():
            if hasattr(m, attr):
                setattr(m, attr, value)
        if old_scale is not None:
            m.scaling = d**-0.5
        for n in names[:-1]:
            setattr(m, n, feed())
        setattr(m, names[-1], nn.Identity())
        return _frozen(m.to(dtype).train(layer.training))

    cache = _Cache(build)

    def attention(q: Any, k: Any, v: Any, mask: Any = None) -> Any:
        b, h, n_q, d = q.shape
        n_k = k.shape[-2]
        m = cache.get(h, k.shape[1], d, q.dtype)
        if packing == "features":
            m.c_attn.value = torch.cat([_heads_first(x) for x in (q, k, v)], dim=2)
        elif packing == "per-head":
            m.query_key_value.value = torch.cat([q, k, v], dim=-1).transpose(1, 2).reshape(b, n_q, 3 * h * d)
        else:
            for n, x in zip(names[:3], (q, k, v), strict=True):
                getattr(m, n).value = _heads_first(x)
        kwargs = {mask_param: _additive(torch, mask, (b, 1, n_q, n_k), q.dtype)}
        if n_k != n_q:
            kwargs["key_value_states"] = q.new_zeros(b, n_k, k.shape[1] * d)
        if rotary:  # cos = 1, sin = 0 on the rotated share: the identity rotation
            r = int(d * rotary_share)
            kwargs["position_embeddings"] = (q.new_ones(b, n_q, r), q.new_zeros(b, n_q, r))
        return _forward(m, h, q.new_zeros(b, n_q, h * d), **kwargs)

    impl = getattr(layer.config, "_attn_implementation", None) or "eager"
    fed = {
        "features": "c_attn returns the checker's [q | k | v]",
        "per-head": "query_key_value returns the checker's [q_h | k_h | v_h] per head",
    }.get(packing, f"{'/'.join(names[:3])} return the checker's q, k, v")
    family = f"Hugging Face {type(layer).__name__} ({impl}): {fed}, {names[-1]} identity, a 4-D additive {mask_param}"
    if rotary:
        family += ", rotary cos = 1 and sin = 0"
    if not standard:
        assert old_scale is not None  # standard when the layer has no scaling
        family += (
            f"; the layer scales the scores by {float(old_scale):.6g}, not 1/sqrt(head_dim = {old_d}) (T5 folds "
            "1/sqrt(d_k) into its W_q): checked with its scaling set to 1/sqrt(d_k)"
        )
    unsupported = {"dv": _ONE_D, "rank": _RANK}
    if not cross:
        unsupported["cross"] = _SELF
    if not grouped:
        unsupported["gqa"] = f"{type(layer).__name__} has one set of heads"
    return ModuleMode(attention, family, unsupported, gqa=grouped)


#: Parameter names of a layer that takes hidden states (not q, k, v).
_HIDDEN = ("hidden_states", "x", "hidden", "inputs", "input", "inputs_embeds", "src", "tgt")
_QKV = ("q", "query", "queries", "k", "key", "keys", "v", "value", "values")


def unknown_layer(layer: Any) -> str | None:
    """Why ``layer`` (an ``nn.Module`` that :func:`module_mode` does not know) cannot be called as ``layer(q, k,
    v)``, or None when its ``forward`` takes q, k and v (or cannot be read)."""
    try:
        params = [p for p in inspect.signature(layer.forward).parameters.values() if p.kind is not p.VAR_KEYWORD]
    except (TypeError, ValueError):
        return None
    names = [p.name for p in params]
    if not names or names[0] not in _HIDDEN or any(n in _QKV for n in names):
        return None
    return (
        f"fn: {type(layer).__name__}.forward takes hidden states ({names[0]}, ...), not q, k, v, and module mode does "
        "not know this layer family (it knows nn.MultiheadAttention, Hugging Face attention layers with q_proj/k_proj/"
        "v_proj, query/key/value, q/k/v/o, c_attn or query_key_value projections, timm's Attention and nanoGPT's "
        "CausalSelfAttention); "
        "check the attention function the layer calls, or wrap it: def attention(q, k, v, mask=None): ... with q, k, "
        "v of shape [B, h, n, d] (docs/checker.md, 'Module mode')"
    )


def function_mode(fn: Any, params: dict[str, inspect.Parameter] | None) -> ModuleMode | None:
    """A Hugging Face attention function ``fn(module, query, key, value, attention_mask, scaling, ...)``."""
    if not params:
        return None
    names = list(params)
    if names[:4] != ["module", "query", "key", "value"] or "scaling" not in params:
        return None
    torch = _torch()

    def attention(q: Any, k: Any, v: Any, mask: Any = None, scale: float | None = None) -> Any:
        stand_in = torch.nn.Module()
        stand_in.num_key_value_groups = q.shape[1] // k.shape[1]
        stand_in.is_causal = False
        stand_in.eval()
        scaling = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        am = _additive(torch, mask, (q.shape[0], 1, q.shape[2], k.shape[2]), q.dtype)
        out = fn(stand_in, q, k, v, am, scaling=scaling, dropout=0.0)
        out = out[0] if isinstance(out, tuple) else out
        return out.transpose(1, 2)  # Hugging Face attention functions return [B, n, h, d]

    name = getattr(fn, "__name__", "?")
    unsupported = {"rank": "Hugging Face attention functions take [B, h, n, d]"}
    grouped = _expands_kv_heads(fn)
    if not grouped:  # GPT-2's, BART's, ViT's... eager functions: one set of heads, as their layers
        unsupported["gqa"] = f"{name} does not expand K/V heads (no num_key_value_groups, repeat_kv or enable_gqa)"
    return ModuleMode(
        attention,
        f"a Hugging Face attention function ({name}): called with a stand-in module "
        "(num_key_value_groups = h / h_kv), a 4-D additive attention_mask and scaling",
        unsupported,
        gqa=grouped,
    )


def _expands_kv_heads(fn: Any) -> bool:
    """Whether a Hugging Face attention function expands K/V heads to the query heads (its code, or what it calls,
    reads ``num_key_value_groups`` or uses ``repeat_kv`` / ``enable_gqa``); True when the code cannot be read."""
    try:
        code = inspect.getsource(inspect.unwrap(fn))
    except (OSError, TypeError):
        return True
    return any(word in code for word in ("num_key_value_groups", "repeat_kv", "enable_gqa"))


def module_mode(layer: Any) -> ModuleMode | None:
    """The module mode of ``layer`` (an ``nn.Module``), or None when it is called as it is: ``layer(q, k, v)``."""
    torch = _torch()
    nn = torch.nn
    if isinstance(layer, nn.MultiheadAttention):
        return _mha(layer)

    def has(*names: str) -> bool:
        return all(hasattr(layer, n) for n in names)

    try:
        params = set(inspect.signature(layer.forward).parameters)
    except (TypeError, ValueError):
        params = set()
    if has("q_proj", "k_proj", "v_proj", "o_proj", "config") and "position_embeddings" in params:
        return _hf_rotary(layer)
    if _is_bert_self(layer) and "hidden_states" in params:
        return _hf_bert(layer)
    output = getattr(layer, "output", None)
    if _is_bert_self(getattr(layer, "self", None)) and all(hasattr(output, n) for n in ("dense", "LayerNorm")):
        return _hf_bert(layer, block=True)  # BertAttention, RobertaAttention...: self-attention + output block
    named = _hf_projections(layer, params)
    if named is not None:
        return _hf_named(layer, *named, params)
    if has("c_attn", "c_proj", "n_head", "n_embd"):
        return _nanogpt(layer)
    if has("qkv", "proj", "num_heads") and isinstance(getattr(layer, "qkv", None), nn.Linear):
        return _timm(layer)
    return None
