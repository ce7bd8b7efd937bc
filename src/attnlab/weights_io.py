"""Import and export of multi-head attention weights: PyTorch modules and Hugging Face layers.

Every library stores ``nn.Linear`` weights as ``[d_out, d_in]`` (``y = x Wᵀ + b``); attnlab uses the articles'
``x @ W`` with ``W [d_in, d_out]``, so every matrix is transposed on the way in and out. State dicts may hold
NumPy arrays (``safetensors.numpy``) or PyTorch tensors; what comes back is always a fresh copy, never a view of
the caller's arrays.

=============================  ===========================================================================
target                         names (``{p}`` = prefix, ``{i}`` = layer index) and what it can hold
=============================  ===========================================================================
:func:`to_torch_attention`     a :class:`~attnlab.core.torch_attention.TorchMultiHeadAttention` module:
                               ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (``nn.Linear``, any biases).
                               Holds everything: MHA, GQA, MQA, any ``head_dim``, cross attention
``nn.MultiheadAttention``      ``in_proj_weight [3E, E]`` packed q/k/v (or ``q_proj_weight``, ``k_proj_weight``,
                               ``v_proj_weight`` when kdim/vdim differ), ``in_proj_bias [3E]``,
                               ``out_proj.weight``, ``out_proj.bias``. Needs ``h * head_dim == d_model``; GQA only
                               as an equivalent MHA (``expand_kv=True``)
Hugging Face BERT              ``{p}encoder.layer.{i}.attention.self.{query,key,value}.{weight,bias}``,
                               ``{p}encoder.layer.{i}.attention.output.dense.{weight,bias}``. MHA self attention
                               with ``h * head_dim == d_model``
Hugging Face Llama / Mistral   ``{p}layers.{i}.self_attn.{q,k,v,o}_proj.weight`` (biases if present, as Qwen2).
                               Self attention; GQA, MQA and any ``head_dim`` (the config's ``head_dim``)
=============================  ===========================================================================

Each exporter refuses, with a :class:`~attnlab.errors.ShapeError` that names the exporter to use instead, only
weights its target cannot hold:

>>> import attnlab
>>> w = attnlab.init_multi_head(8, 4, num_kv_heads=2, head_dim=3, rng=np.random.default_rng(0))  # GQA, 4*3 != 8
>>> to_torch_mha(w)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
attnlab.errors.ShapeError: weights: num_kv_heads=2 != num_heads=4; ... use weights_io.to_torch_attention(weights), ...
>>> import torch
>>> m = to_torch_attention(w)                         # holds them; float64 stays float64
>>> x = np.random.default_rng(1).standard_normal((2, 5, 8))
>>> ours = attnlab.multi_head_attention(x, None, w, causal=True).output
>>> theirs = m(torch.from_numpy(x), is_causal=True).detach().numpy()
>>> bool(np.abs(ours - theirs).max() < 1e-12)
True
>>> sorted(m.state_dict())[:3]                        # Hugging Face Llama's names: loads into LlamaAttention too
['k_proj.bias', 'k_proj.weight', 'o_proj.bias']

Llama-style checkpoints store q/k in the half-split rotary layout Hugging Face's ``rotate_half`` expects; the
weights are imported as stored (no permutation), so apply RoPE the Hugging Face way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from ._arrays import to_numpy
from .core.multihead import MultiHeadWeights
from .errors import DTypeError, OptionError, ShapeError, missing_extra
from .validate import check_choice, check_int

__all__ = [
    "from_bert",
    "from_llama",
    "from_torch_attention",
    "from_torch_mha",
    "to_bert",
    "to_llama",
    "to_torch_attention",
    "to_torch_mha",
]

if TYPE_CHECKING:
    from .core.torch_attention import TorchMultiHeadAttention


def _state(state_dict: Any) -> Mapping[str, Any]:
    if hasattr(state_dict, "state_dict") and callable(state_dict.state_dict):
        state_dict = state_dict.state_dict()
    if not isinstance(state_dict, Mapping):
        raise DTypeError(f"state_dict: expected a mapping name -> array (or a module), got {type(state_dict).__name__}")
    return state_dict


def _arr(x: Any, dtype: Any, key: str) -> np.ndarray:
    try:
        a = np.array(to_numpy(x), copy=True)
    except (TypeError, ValueError, RuntimeError):
        raise DTypeError(f"{key}: expected an array (NumPy or a tensor), got {type(x).__name__}") from None
    if a.dtype.kind != "f" and "bfloat16" not in str(a.dtype):
        raise DTypeError(f"{key}: expected floating weights, got dtype {a.dtype} (shape {a.shape})")
    return a if dtype is None else a.astype(dtype)


@overload
def _get(sd: Mapping[str, Any], key: str, dtype: Any, *, required: Literal[True] = True) -> np.ndarray: ...


@overload
def _get(sd: Mapping[str, Any], key: str, dtype: Any, *, required: bool) -> np.ndarray | None: ...


def _get(sd: Mapping[str, Any], key: str, dtype: Any, *, required: bool = True) -> np.ndarray | None:
    if key in sd and sd[key] is not None:
        return _arr(sd[key], dtype, key)
    if not required:
        return None
    near = sorted(sd)[:6]
    raise ShapeError(f"state_dict: no entry {key!r} ({len(sd)} entries, e.g. {near})")


def _prefix(prefix: Any) -> str:
    if not isinstance(prefix, str):
        raise OptionError(f"prefix: expected a str (e.g. 'model.'), got {prefix!r}")
    return prefix


def _weights(weights: Any) -> MultiHeadWeights:
    if not isinstance(weights, MultiHeadWeights):
        raise DTypeError(f"weights: expected a MultiHeadWeights (see init_multi_head), got {type(weights).__name__}")
    return weights


def _torch_dtype(torch: Any, dtype: Any) -> Any:
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise DTypeError(f"dtype: expected None or a torch dtype (torch.float32 ...), got {dtype!r}")
    return dtype


def _tensor(torch: Any, a: Any, dtype: Any) -> Any:
    """A fresh torch tensor of ``a`` (NumPy or torch; bfloat16 kept bfloat16 unless ``dtype`` says otherwise)."""
    bf16 = "bfloat16" in str(getattr(a, "dtype", ""))
    n = to_numpy(a)
    if "bfloat16" in str(n.dtype):
        n = n.astype(np.float32)
    x = torch.from_numpy(np.array(n, copy=True))
    if dtype is not None:
        return x.to(dtype)
    return x.to(torch.bfloat16) if bf16 else x


def _find_prefix(sd: Mapping[str, Any], suffix: str, prefix: str | None, what: str) -> str:
    if prefix is not None:
        return _prefix(prefix)
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


def from_torch_mha(
    state_dict: Any, *, num_heads: int | None = None, prefix: str = "", dtype: Any = None
) -> MultiHeadWeights:
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
        raise OptionError("num_heads: required with a state dict (nn.MultiheadAttention does not store it)")
    num_heads = check_int("num_heads", num_heads, minimum=1)
    sd = _state(state_dict)
    p = _prefix(prefix)
    for extra in ("bias_k", "bias_v"):
        if p + extra in sd and sd[p + extra] is not None:
            raise ShapeError(
                f"state_dict: {p + extra!r} present (add_bias_kv=True), which attnlab's layer does not model"
            )
    if p + "q_proj.weight" in sd and p + "in_proj_weight" not in sd:
        raise ShapeError(
            f"state_dict: {p + 'q_proj.weight'!r} is the q_proj/k_proj/v_proj/o_proj layout, not "
            f"nn.MultiheadAttention's; use weights_io.from_torch_attention"
        )
    if p + "in_proj_weight" in sd and sd[p + "in_proj_weight"] is not None:
        w = _get(sd, p + "in_proj_weight", dtype)
        if w.ndim != 2 or w.shape[0] % 3:
            raise ShapeError(f"in_proj_weight: expected [3E, E], got shape {w.shape}")
        e = w.shape[0] // 3
        wq, wk, wv = w[:e].T, w[e : 2 * e].T, w[2 * e :].T
    else:
        wq, wk, wv = (_matrix(sd, p + f"{n}_proj_weight", dtype) for n in "qkv")
    b = _get(sd, p + "in_proj_bias", dtype, required=False)
    if b is not None and b.shape != (wq.shape[1] + wk.shape[1] + wv.shape[1],):
        raise ShapeError(f"in_proj_bias: shape {b.shape} does not match the q/k/v widths")
    bq, bk, bv = (None, None, None) if b is None else np.split(b, [wq.shape[1], wq.shape[1] + wk.shape[1]])
    wo = _matrix(sd, p + "out_proj.weight", dtype)
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


def _matrix(sd: Mapping[str, Any], key: str, dtype: Any) -> np.ndarray:
    """``sd[key]`` (``[d_out, d_in]``, as torch stores it) transposed to attnlab's ``[d_in, d_out]``."""
    w = _get(sd, key, dtype)
    if w.ndim != 2:
        raise ShapeError(f"{key}: expected a 2-D [d_out, d_in] matrix, got shape {w.shape}")
    return np.ascontiguousarray(w.T)


@overload
def _expand_kv(a: np.ndarray, h_kv: int, n_rep: int) -> np.ndarray: ...


@overload
def _expand_kv(a: None, h_kv: int, n_rep: int) -> None: ...


def _expand_kv(a: np.ndarray | None, h_kv: int, n_rep: int) -> np.ndarray | None:
    """Repeat each kv head's columns ``n_rep`` times: ``[..., h_kv * d] -> [..., h_kv * n_rep * d]``."""
    if a is None:
        return None
    s = a.shape
    heads = a.reshape(*s[:-1], h_kv, s[-1] // h_kv)  # [..., h_kv, d]
    return np.repeat(heads, n_rep, axis=-2).reshape(*s[:-1], s[-1] * n_rep)


def to_torch_mha(
    weights: MultiHeadWeights, *, prefix: str = "", dtype: Any = None, expand_kv: bool = False
) -> dict[str, Any]:
    """A state dict (PyTorch tensors) that ``nn.MultiheadAttention.load_state_dict`` accepts.

    Build the module as ``nn.MultiheadAttention(d_model, num_heads, bias=..., kdim=d_kv, vdim=d_kv)``; the q/k/v
    weights are packed into ``in_proj_weight`` when ``d_kv == d_model`` and kept separate otherwise, as PyTorch
    does. Missing biases become zeros when some are present.

    Args:
        weights: the layer. ``nn.MultiheadAttention`` needs ``num_heads * head_dim == d_model``; for any other
            head width use :func:`to_torch_attention`.
        prefix: prefix of every key (e.g. ``"attn."``).
        dtype: torch dtype of the tensors (default: the arrays' own).
        expand_kv: export GQA/MQA weights (``num_kv_heads < num_heads``) as the equivalent MHA layer, each kv
            head's columns of ``W_K``, ``W_V`` (and biases) repeated for the query heads that read it: the same
            outputs, ``n_rep`` times the kv parameters. Without it GQA is refused (nn.MultiheadAttention has no
            GQA); :func:`to_torch_attention` keeps it.
    """
    try:
        import torch
    except ImportError:
        raise missing_extra("torch", "torch") from None
    weights = _weights(weights)
    check_choice("expand_kv", expand_kv, (True, False))
    dtype = _torch_dtype(torch, dtype)
    p = _prefix(prefix)
    if weights.num_kv_heads != weights.num_heads and not expand_kv:
        raise ShapeError(
            f"weights: num_kv_heads={weights.num_kv_heads} != num_heads={weights.num_heads}; nn.MultiheadAttention "
            f"has no GQA: pass expand_kv=True for an equivalent MHA layer (each kv head's columns repeated), or use "
            f"weights_io.to_torch_attention(weights), a torch module that keeps GQA and any head width"
        )
    if weights.num_heads * weights.head_dim != weights.d_model:
        raise ShapeError(
            f"weights: num_heads * head_dim = {weights.num_heads * weights.head_dim} != d_model={weights.d_model}, "
            f"which nn.MultiheadAttention requires (its head width is d_model / num_heads); use "
            f"weights_io.to_torch_attention(weights), a torch module with any head width"
        )

    def t(a: Any) -> Any:
        return _tensor(torch, a, dtype)

    h_kv, n_rep = weights.num_kv_heads, weights.n_rep
    out: dict[str, Any] = {}
    wq = to_numpy(weights.w_q)
    wk, wv = (_expand_kv(to_numpy(w), h_kv, n_rep) for w in (weights.w_k, weights.w_v))
    if weights.d_kv == weights.d_model:
        out[p + "in_proj_weight"] = t(np.concatenate([wq.T, wk.T, wv.T], axis=0))
    else:
        out[p + "q_proj_weight"], out[p + "k_proj_weight"], out[p + "v_proj_weight"] = t(wq.T), t(wk.T), t(wv.T)
    biases = (
        weights.b_q,
        _expand_kv(None if weights.b_k is None else to_numpy(weights.b_k), h_kv, n_rep),
        _expand_kv(None if weights.b_v is None else to_numpy(weights.b_v), h_kv, n_rep),
        weights.b_o,
    )
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
# attnlab's own torch module: every MultiHeadWeights


def to_torch_attention(weights: MultiHeadWeights, *, dtype: Any = None, device: Any = None) -> TorchMultiHeadAttention:
    """A PyTorch module with these weights, for every layout: MHA, GQA, MQA, any ``head_dim``, self or cross.

    The module is :class:`~attnlab.core.torch_attention.TorchMultiHeadAttention` (in eval mode, parameters are
    copies): ``module(x_q, x_kv=None, mask=None, is_causal=False)`` computes what
    :func:`attnlab.multi_head_attention` computes (PyTorch's SDPA inside, ``enable_gqa`` for GQA). Its
    ``state_dict()`` has Hugging Face Llama's names (``q_proj.weight [h*d, d_model]`` ...), so self-attention
    weights also load into ``transformers``' ``LlamaAttention`` (``num_key_value_heads=num_kv_heads``,
    ``head_dim=head_dim``, ``attention_bias`` as the biases).

    Args:
        weights: the layer.
        dtype: torch dtype of the parameters (default: the weights' own, float64 stays float64).
        device: where to put them (default CPU).

    Shapes: ``q_proj.weight [h * head_dim, d_model]``, ``k_proj.weight, v_proj.weight [h_kv * head_dim, d_kv]``,
    ``o_proj.weight [d_model, h * head_dim]``; a bias ``[d_out]`` for each projection that has one.
    """
    try:
        import torch
    except ImportError:
        raise missing_extra("torch", "torch") from None
    from .core.torch_attention import TorchMultiHeadAttention

    w = _weights(weights)
    dtype = _torch_dtype(torch, dtype)
    tensors = {n: _tensor(torch, a, dtype) for n, a in w.arrays().items()}
    if dtype is None:  # one dtype for the module: the widest of the arrays'
        dtype = tensors["w_q"].dtype
        for x in tensors.values():
            dtype = torch.promote_types(dtype, x.dtype)
    flags = (w.b_q is not None, w.b_k is not None, w.b_v is not None, w.b_o is not None)
    m = TorchMultiHeadAttention(
        w.d_model,
        w.num_heads,
        num_kv_heads=w.num_kv_heads,
        head_dim=w.head_dim,
        d_kv=w.d_kv,
        bias=flags,
        device=device,
        dtype=dtype,
    )
    with torch.no_grad():
        for proj in ("q", "k", "v", "o"):
            lin, wn, bn = getattr(m, f"{proj}_proj"), f"w_{proj}", f"b_{proj}"
            lin.weight.copy_(tensors[wn].T)
            if bn in tensors:
                lin.bias.copy_(tensors[bn])
    return m.eval()


#: The names of a Llama-style attention block's q, k, v and o layers (``transformers``' ``LlamaAttention``).
LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")

#: The same for a BERT-style self-attention block, under ``encoder.layer.{i}.attention.``.
BERT_PROJECTIONS = ("self.query", "self.key", "self.value", "output.dense")


def _projections(sd: Mapping[str, Any], base: str, names: tuple[str, str, str, str], dtype: Any) -> dict[str, Any]:
    """``w_q ... w_o`` and ``b_q ... b_o`` (``None`` where absent) from the four layers ``base + name`` (q, k, v, o)."""
    out: dict[str, Any] = {}
    for part, name in zip("qkvo", names, strict=True):
        out[f"w_{part}"] = _matrix(sd, f"{base}{name}.weight", dtype)
        out[f"b_{part}"] = _get(sd, f"{base}{name}.bias", dtype, required=False)
    return out


def _by_name(w: MultiHeadWeights, base: str, names: tuple[str, str, str, str]) -> dict[str, tuple[Any, Any]]:
    """The inverse of :func:`_projections`: ``base + name`` -> ``(w_x, b_x)`` for the q, k, v and o layers."""
    return {
        f"{base}{name}": (getattr(w, f"w_{part}"), getattr(w, f"b_{part}"))
        for part, name in zip("qkvo", names, strict=True)
    }


def from_torch_attention(
    module: Any,
    *,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    prefix: str = "",
    dtype: Any = None,
) -> MultiHeadWeights:
    """Weights of a ``q_proj``/``k_proj``/``v_proj``/``o_proj`` attention module as :class:`MultiHeadWeights`.

    Reads :class:`~attnlab.core.torch_attention.TorchMultiHeadAttention` (the inverse of :func:`to_torch_attention`),
    ``transformers``' ``LlamaAttention`` / ``MistralAttention`` / ``Qwen2Attention`` (heads read from their config),
    or a state dict with those names.

    Args:
        module: the module, or a state dict (tensors or NumPy arrays).
        num_heads: query heads (read from the module when it has them; required with a state dict).
        num_kv_heads: key/value heads (default: from the module, else ``k_proj``'s width / ``head_dim``).
        head_dim: width of one head (default: from the module, else ``q_proj``'s width / ``num_heads``).
        prefix: prefix of the keys (e.g. ``"model.layers.0.self_attn."``).
        dtype: NumPy dtype of the result (default: as stored; bfloat16 comes back as float32).
    """
    cfg = getattr(module, "config", None)

    def found(given: Any, *names: tuple[Any, str]) -> Any:
        if given is not None:
            return given
        for obj, name in names:
            v = getattr(obj, name, None)
            if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
                return v
        return None

    h = found(num_heads, (module, "num_heads"), (cfg, "num_attention_heads"))
    if h is None:
        raise OptionError("num_heads: required with a state dict (pass num_heads=, and num_kv_heads= for GQA)")
    h = check_int("num_heads", h, minimum=1)
    h_kv = found(num_kv_heads, (module, "num_kv_heads"), (cfg, "num_key_value_heads"))
    d = found(head_dim, (module, "head_dim"), (cfg, "head_dim"))
    sd = _state(module)
    p = _prefix(prefix)
    if p + "q_proj.weight" not in sd and (p + "in_proj_weight" in sd or p + "q_proj_weight" in sd):
        raise ShapeError(
            f"state_dict: {p}in_proj_weight / q_proj_weight is nn.MultiheadAttention's layout; use "
            f"weights_io.from_torch_mha"
        )
    arrays = _projections(sd, p, LLAMA_PROJECTIONS, dtype)
    width_q, width_kv = arrays["w_q"].shape[1], arrays["w_k"].shape[1]
    if d is None and width_q % h == 0:
        d = width_q // h
    if h_kv is None and d and width_kv % d == 0:
        h_kv = width_kv // d
    try:
        return MultiHeadWeights(**arrays, num_heads=h, num_kv_heads=h_kv, head_dim=d)
    except ShapeError as err:
        raise ShapeError(
            f"state_dict: {err} (w_q = {p}q_proj.weight transposed, likewise k, v, o; q_proj.weight is [h * head_dim, "
            f"d_model], k_proj/v_proj [h_kv * head_dim, d_kv], o_proj [d_model, h * head_dim])"
        ) from None


# --------------------------------------------------------------------------------------------------------------
# Hugging Face


def _layer_index(layer: Any) -> int:
    return check_int("layer", layer, minimum=0)


#: Per family: the attention block of layer i (a format string), its query weight's name in it, the projections.
_LAYER_BLOCKS = {
    "BERT-style": ("encoder.layer.{i}.attention.", "self.query.weight", BERT_PROJECTIONS),
    "Llama-style": ("layers.{i}.self_attn.", "q_proj.weight", LLAMA_PROJECTIONS),
}


def _layer_projections(state_dict: Any, i: int, prefix: str | None, dtype: Any, family: str) -> dict[str, Any]:
    """The projections of layer ``i``'s attention block in a ``family`` checkpoint (prefix found unless given)."""
    block, query, names = _LAYER_BLOCKS[family]
    base = block.format(i=i)
    sd = _state(state_dict)
    return _projections(sd, _find_prefix(sd, base + query, prefix, family) + base, names, dtype)


def from_bert(
    state_dict: Any, layer: int, *, num_heads: int, prefix: str | None = None, dtype: Any = None
) -> MultiHeadWeights:
    """The self-attention block of BERT-style layer ``layer`` (BERT, MiniLM, RoBERTa) as :class:`MultiHeadWeights`.

    ``prefix`` is found automatically (``""``, ``"bert."``, ``"0.auto_model."`` ...) unless given.
    """
    i = _layer_index(layer)
    num_heads = check_int("num_heads", num_heads, minimum=1)
    arrays = _layer_projections(state_dict, i, prefix, dtype, "BERT-style")
    return MultiHeadWeights(**arrays, num_heads=num_heads)


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
    num_heads = check_int("num_heads", num_heads, minimum=1)
    arrays = _layer_projections(state_dict, i, prefix, dtype, "Llama-style")
    sizes = {"num_kv_heads": num_kv_heads, "head_dim": head_dim}  # None: MultiHeadWeights' defaults
    return MultiHeadWeights(**arrays, num_heads=num_heads, **{k: v for k, v in sizes.items() if v is not None})


def _export(pairs: dict[str, tuple[Any, Any]]) -> dict[str, np.ndarray]:
    out = {}
    for base, (w, b) in pairs.items():
        out[base + ".weight"] = np.ascontiguousarray(to_numpy(w).T).copy()
        if b is not None:
            out[base + ".bias"] = np.array(to_numpy(b), copy=True)
    return out


def to_bert(weights: MultiHeadWeights, layer: int, *, prefix: str = "") -> dict[str, np.ndarray]:
    """BERT-style names and ``[d_out, d_in]`` matrices for layer ``layer`` (the inverse of :func:`from_bert`).

    BERT's self-attention is MHA with ``num_heads * head_dim == d_model`` over its own input; other weights are
    refused (use :func:`to_llama` for GQA or another head width, :func:`to_torch_attention` for anything).
    """
    w = _weights(weights)
    base = f"{_prefix(prefix)}encoder.layer.{_layer_index(layer)}.attention."
    why = []
    if w.num_kv_heads != w.num_heads:
        why.append(f"num_kv_heads={w.num_kv_heads} != num_heads={w.num_heads} (BERT has no GQA)")
    if w.num_heads * w.head_dim != w.d_model:
        why.append(f"num_heads * head_dim = {w.num_heads * w.head_dim} != d_model={w.d_model}")
    if w.d_kv != w.d_model:
        why.append(f"d_kv={w.d_kv} != d_model={w.d_model} (BERT's keys read the layer's own input)")
    if why:
        raise ShapeError(
            f"weights: {'; '.join(why)}, which a BERT layer cannot hold; use weights_io.to_llama (GQA, any "
            f"head_dim) or weights_io.to_torch_attention (every layout)"
        )
    return _export(_by_name(w, base, BERT_PROJECTIONS))


def to_llama(weights: MultiHeadWeights, layer: int, *, prefix: str = "model.") -> dict[str, np.ndarray]:
    """Llama-style names and ``[d_out, d_in]`` matrices for layer ``layer`` (the inverse of :func:`from_llama`).

    Holds GQA, MQA and any ``head_dim`` (set the config's ``num_key_value_heads`` and ``head_dim``); a Llama layer
    is self attention, so ``d_kv != d_model`` (cross attention) is refused: use :func:`to_torch_attention`.
    """
    w = _weights(weights)
    if w.d_kv != w.d_model:
        raise ShapeError(
            f"weights: d_kv={w.d_kv} != d_model={w.d_model} (cross attention), which a Llama layer cannot hold "
            f"(k_proj and v_proj read the layer's own input); use weights_io.to_torch_attention"
        )
    base = f"{_prefix(prefix)}layers.{_layer_index(layer)}.self_attn."
    return _export(_by_name(w, base, LLAMA_PROJECTIONS))
