"""A Llama-architecture causal language model in NumPy, with every attention computed by attnlab.

One decoder layer (pre-norm, as Hugging Face ``LlamaDecoderLayer``)::

    h = x + W_O · Attention(RoPE(RMSNorm(x) W_Q), RoPE(RMSNorm(x) W_K), RMSNorm(x) W_V)     # GQA, causal
    y = h + W_down (silu(RMSNorm(h) W_gate) ⊙ RMSNorm(h) W_up)                              # SwiGLU MLP

The attention step is attnlab's: :func:`attnlab.attention_trace` (dense; every layer's weights can be kept for
maps), :func:`attnlab.kernels.tiled.flash_attention` (tiled, online softmax) or, with a KV cache,
:func:`attnlab.kernels.kv_cache.cached_attention`. Weights follow the ``x @ W`` convention (``W [d_in, d_out]``).

Shapes: ``token_ids [B, n]`` (or ``[n]``), hidden states ``[B, n, d_model]``, per-head ``q [B, h, n, head_dim]``,
``k, v [B, h_kv, n, head_dim]``, attention weights ``[B, h, n_q, n_k]``, ``logits [B, n, vocab]``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..core import attention_trace
from ..core.multihead import MultiHeadWeights, merge_heads, repeat_kv, split_heads
from ..core.rope import RopeTables, apply_rope, rope_tables
from ..errors import DTypeError, OptionError, ShapeError
from ..masks import Align
from ..validate import check_choice, check_int

__all__ = [
    "Generation",
    "LlamaCapture",
    "LlamaConfig",
    "LlamaLayer",
    "LlamaModel",
    "LlamaOutput",
    "PositionCheck",
    "generate",
    "llama_forward",
    "logits_fn",
    "make_cache",
    "position_check",
    "rms_norm",
    "silu",
    "swiglu_mlp",
]

Attention = Literal["dense", "tiled"]


@dataclass(frozen=True)
class LlamaConfig:
    """The numbers that define a Llama model (names as in Hugging Face's ``LlamaConfig`` where they exist)."""

    vocab_size: int
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_base: float
    rms_eps: float
    context_length: int
    bos_id: int | None = None
    eos_id: int | None = None
    name: str = "llama"

    def __post_init__(self) -> None:
        for f in ("vocab_size", "d_model", "d_ff", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
            check_int(f, getattr(self, f), minimum=1)
        if self.num_heads % self.num_kv_heads:
            raise ShapeError(
                f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads} (GQA groups query heads)"
            )
        if self.head_dim % 2:
            raise ShapeError(f"head_dim: RoPE needs an even head_dim, got {self.head_dim}")


@dataclass(frozen=True)
class LlamaLayer:
    """One decoder layer's parameters (``x @ W`` convention).

    Shapes: ``attn_norm, mlp_norm [d_model]``; ``attn`` a :class:`~attnlab.core.multihead.MultiHeadWeights`
    without biases (``w_q [d_model, h*d]``, ``w_k, w_v [d_model, h_kv*d]``, ``w_o [h*d, d_model]``);
    ``w_gate, w_up [d_model, d_ff]``; ``w_down [d_ff, d_model]``.
    """

    attn_norm: np.ndarray
    attn: MultiHeadWeights
    mlp_norm: np.ndarray
    w_gate: np.ndarray
    w_up: np.ndarray
    w_down: np.ndarray


@dataclass(frozen=True)
class LlamaModel:
    """A complete Llama model: config, weights (read-only float32 arrays) and, when loaded from a file, tokenizer.

    Shapes: ``embed [vocab, d_model]``, ``final_norm [d_model]``, ``lm_head [d_model, vocab]`` (a view of
    ``embed.T`` when the embeddings are tied, as in SmolLM2).
    """

    config: LlamaConfig
    embed: np.ndarray
    layers: tuple[LlamaLayer, ...]
    final_norm: np.ndarray
    lm_head: np.ndarray
    tokenizer: Any = field(default=None, repr=False)
    source: str = ""

    def __post_init__(self) -> None:
        c = self.config
        if not isinstance(c, LlamaConfig):
            raise DTypeError(f"config: expected a LlamaConfig, got {type(c).__name__}")
        want = {
            "embed": (c.vocab_size, c.d_model),
            "final_norm": (c.d_model,),
            "lm_head": (c.d_model, c.vocab_size),
        }
        for name, shape in want.items():
            got = tuple(np.shape(getattr(self, name)))
            if got != shape:
                raise ShapeError(f"{name}: shape {got}, expected {shape} (vocab_size, d_model from the config)")
        if len(self.layers) != c.num_layers:
            raise ShapeError(f"layers: {len(self.layers)} layers, the config says num_layers={c.num_layers}")
        for i, layer in enumerate(self.layers):
            a = layer.attn
            if (a.d_model, a.num_heads, a.num_kv_heads, a.head_dim) != (
                c.d_model,
                c.num_heads,
                c.num_kv_heads,
                c.head_dim,
            ):
                raise ShapeError(
                    f"layers[{i}].attn: d_model={a.d_model}, heads={a.num_heads}, kv heads={a.num_kv_heads}, "
                    f"head_dim={a.head_dim}; the config says {c.d_model}, {c.num_heads}, {c.num_kv_heads}, "
                    f"{c.head_dim}"
                )
            for name, shape in (
                ("w_gate", (c.d_model, c.d_ff)),
                ("w_up", (c.d_model, c.d_ff)),
                ("w_down", (c.d_ff, c.d_model)),
                ("attn_norm", (c.d_model,)),
                ("mlp_norm", (c.d_model,)),
            ):
                got = tuple(np.shape(getattr(layer, name)))
                if got != shape:
                    raise ShapeError(f"layers[{i}].{name}: shape {got}, expected {shape}")

    def astype(self, dtype: Any) -> LlamaModel:
        """A copy with every weight in ``dtype`` (float64 gives a reference to check float32 against)."""
        import dataclasses

        def cast(a: np.ndarray) -> np.ndarray:
            b = np.asarray(a, dtype=dtype).copy()
            b.setflags(write=False)
            return b

        layers = tuple(
            dataclasses.replace(
                layer,
                attn_norm=cast(layer.attn_norm),
                attn=MultiHeadWeights(
                    *(cast(getattr(layer.attn, n)) for n in ("w_q", "w_k", "w_v", "w_o")),
                    num_heads=layer.attn.num_heads,
                    num_kv_heads=layer.attn.num_kv_heads,
                    head_dim=layer.attn.head_dim,
                ),
                mlp_norm=cast(layer.mlp_norm),
                w_gate=cast(layer.w_gate),
                w_up=cast(layer.w_up),
                w_down=cast(layer.w_down),
            )
            for layer in self.layers
        )
        embed = cast(self.embed)
        tied = np.shares_memory(self.lm_head, self.embed)
        return dataclasses.replace(
            self,
            embed=embed,
            layers=layers,
            final_norm=cast(self.final_norm),
            lm_head=embed.T if tied else cast(self.lm_head),
        )

    @property
    def dtype(self) -> np.dtype:
        """The weights' dtype (float32 as loaded)."""
        return self.embed.dtype

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (needs the tokenizer the model was loaded with)."""
        return self._tok().encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids (needs the tokenizer)."""
        return self._tok().decode(ids)

    def _tok(self) -> Any:
        if self.tokenizer is None:
            raise DTypeError("model: has no tokenizer (built from arrays); pass token ids instead of text")
        return self.tokenizer


@dataclass(frozen=True)
class LlamaCapture:
    """What every layer computed, kept by :func:`llama_forward` with ``capture=True`` (for the lab's views).

    Shapes (``L`` layers, ``n_k`` = cached + new tokens):
        * ``embeddings [B, n, d_model]``: the token embeddings, the residual stream before layer 0;
        * ``q``: per layer ``[B, h, n, head_dim]``, the queries **after RoPE** (what the scores are made of);
        * ``k``: per layer ``[B, h_kv, n_k, head_dim]``, the keys after RoPE (query head ``j`` reads kv head
          ``j // (h / h_kv)``: grouped-query attention);
        * ``logits``: per layer ``[B, h, n, n_k]``, ``q·k / √head_dim`` as the softmax got it (``-inf`` where
          masked);
        * ``attn_out``, ``mlp_out``: per layer ``[B, n, d_model]``, what the attention (after ``W_O``) and the MLP
          added to the residual stream;
        * ``residual``: per layer ``[B, n, d_model]``, the residual stream after the layer;
        * ``scale``: the scale the scores were multiplied by (``1 / √head_dim``).
    """

    embeddings: np.ndarray
    q: tuple[np.ndarray, ...]
    k: tuple[np.ndarray, ...]
    logits: tuple[np.ndarray, ...]
    attn_out: tuple[np.ndarray, ...]
    mlp_out: tuple[np.ndarray, ...]
    residual: tuple[np.ndarray, ...]
    scale: float


@dataclass(frozen=True)
class LlamaOutput:
    """What :func:`llama_forward` returns.

    Shapes:
        * ``logits [B, n, vocab]`` float32 (``[B, 1, vocab]`` with ``last_only=True``);
        * ``attentions``: one ``[B, h, n, n_k]`` per layer (softmax weights, ``n_k`` = cached + new tokens), or
          ``None`` unless ``return_attention=True``;
        * ``hidden [B, n, d_model]``: the final hidden state after the last RMSNorm;
        * ``positions [B, n]``: the positions the tokens were given (RoPE angles);
        * ``trace``: a :class:`LlamaCapture` (every layer's q, k, scores and residual stream) with ``capture=True``,
          else ``None``.
    """

    logits: np.ndarray
    attentions: tuple[np.ndarray, ...] | None
    hidden: np.ndarray
    positions: np.ndarray
    trace: LlamaCapture | None = None


# --------------------------------------------------------------------------------------------------------------
# building blocks


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """``x / sqrt(mean(x²) + eps) · weight`` over the last axis.

    Shapes: ``x [..., d]``, ``weight [d]`` -> ``[..., d]``.

    >>> rms_norm(np.array([3.0, 4.0]), np.ones(2), 0.0).round(4).tolist()
    [0.8485, 1.1314]
    """
    x = np.asarray(x)
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return (x * (1.0 / np.sqrt(ms + np.asarray(eps, dtype=x.dtype)))) * weight


def silu(x: np.ndarray) -> np.ndarray:
    """``x · sigmoid(x)``, computed without overflow for any finite ``x``.

    >>> silu(np.array([-1000.0, 0.0, 1.0])).round(4).tolist()
    [-0.0, 0.0, 0.7311]
    """
    x = np.asarray(x)
    e = np.exp(-np.abs(x))  # in (0, 1]: never overflows
    return x * np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)


def swiglu_mlp(x: np.ndarray, layer: LlamaLayer) -> np.ndarray:
    """``W_down (silu(x W_gate) ⊙ x W_up)``.

    Shapes: ``x [..., d_model]`` -> ``[..., d_model]``.
    """
    return (silu(x @ layer.w_gate) * (x @ layer.w_up)) @ layer.w_down


def _check_model(model: Any) -> None:
    if not isinstance(model, LlamaModel):
        raise DTypeError(f"model: expected a LlamaModel (e.g. load_smollm2()), got {type(model).__name__}")


def make_cache(model: LlamaModel, batch: int = 1, *, capacity: int = 256) -> tuple[Any, ...]:
    """One empty :class:`attnlab.kernels.kv_cache.KVCache` per layer (the model's dtype, kv heads and head_dim).

    Caches grow as needed; ``capacity`` is only the first allocation.
    """
    from ..kernels.kv_cache import KVCache

    _check_model(model)
    batch = check_int("batch", batch, minimum=1)
    capacity = check_int("capacity", capacity, minimum=1)
    c = model.config
    return tuple(
        KVCache(batch, c.num_kv_heads, c.head_dim, capacity=capacity, dtype=model.dtype) for _ in range(c.num_layers)
    )


def _as_ids(model: LlamaModel, token_ids: Any) -> np.ndarray:
    _check_model(model)
    if isinstance(token_ids, str):
        raise DTypeError("token_ids: expected integer token ids, got a str; use model.encode(text) first")
    try:
        ids = np.asarray(token_ids)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ShapeError(f"token_ids: expected a rectangular [n] or [B, n] array of ints ({err})") from None
    if ids.ndim == 1:
        ids = ids[None, :]
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ShapeError(f"token_ids: expected a non-empty [n] or [B, n] array of token ids, got shape {ids.shape}")
    if ids.dtype.kind not in "iu":
        raise DTypeError(f"token_ids: expected integer token ids, got dtype {ids.dtype}")
    bad = (ids < 0) | (ids >= model.config.vocab_size)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ShapeError(
            f"token_ids: id {int(ids[at])} at index {at} is outside the vocabulary [0, {model.config.vocab_size})"
        )
    return ids


def _attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    n_rep: int,
    *,
    causal: bool | Align,
    attention: Attention,
    want_weights: bool,
) -> tuple[np.ndarray, Any]:
    """``q [B, h, n_q, d]``, ``k, v [B, h_kv, n_k, d]`` -> (heads ``[B, h, n_q, d]``, the AttentionTrace or None)."""
    if attention == "tiled" and not want_weights:
        from ..kernels.tiled import flash_attention

        return flash_attention(q, k, v, causal=causal).output, None
    t = attention_trace(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), causal=causal)
    return t.output, (t if want_weights else None)


def llama_forward(
    model: LlamaModel,
    token_ids: Any,
    *,
    attention: Attention = "dense",
    cache: Sequence[Any] | None = None,
    rope: bool = True,
    causal: bool = True,
    return_attention: bool = False,
    last_only: bool = False,
    positions: Any = None,
    blas_threads: int | None = None,
    capture: bool = False,
) -> LlamaOutput:
    """Run the model on token ids: embeddings, ``num_layers`` decoder layers, final RMSNorm, LM head.

    Args:
        model: a :class:`LlamaModel` (e.g. :func:`attnlab.models.load_smollm2`).
        token_ids: ``[n]`` or ``[B, n]`` integer ids (B sequences of the same length).
        attention: ``"dense"`` (:func:`attnlab.attention_trace`) or ``"tiled"``
            (:func:`attnlab.kernels.tiled.flash_attention`; dense is used where weights are requested).
        cache: per-layer KV caches (:func:`make_cache`) holding the tokens before these; they are appended to and
            the new tokens attend bottom-right-causally to everything cached (decoding).
        rope: apply rotary position embeddings (``False`` shows what attention is without positions, §16).
        causal: the causal mask; ``False`` lets every token see the future (a leak, for checkers and §16).
        return_attention: keep every layer's attention weights ``[B, h, n, n_k]``.
        last_only: compute logits for the last position only (generation).
        positions: ``[n]`` or ``[B, n]`` RoPE positions (default: cached length + ``0 .. n-1``).
        blas_threads: limit the BLAS library to this many threads during the call (needs ``threadpoolctl``,
            extra ``fast``; default: leave BLAS as it is). One thread is often faster for decode-sized products,
            and much faster when other processes keep the cores busy.
        capture: also keep a :class:`LlamaCapture` (every layer's q and k after RoPE, scores, attention and MLP
            outputs, residual stream; dense attention, as with ``return_attention``) in ``LlamaOutput.trace``.
            The same forward pass: nothing is computed twice, only kept.

    Returns:
        a :class:`LlamaOutput`.
    """
    _check_model(model)
    if blas_threads is not None:
        from ..kernels.threads import pinned_blas

        blas_threads = check_int("blas_threads", blas_threads, minimum=1)
        with pinned_blas(blas_threads):
            return llama_forward(
                model,
                token_ids,
                attention=attention,
                cache=cache,
                rope=rope,
                causal=causal,
                return_attention=return_attention,
                last_only=last_only,
                positions=positions,
                capture=capture,
            )
    check_choice("attention", attention, ("dense", "tiled"))
    for name, flag in (
        ("rope", rope),
        ("causal", causal),
        ("return_attention", return_attention),
        ("capture", capture),
    ):
        check_choice(name, flag, (True, False))
    check_choice("last_only", last_only, (True, False))
    c = model.config
    ids = _as_ids(model, token_ids)
    B, n = ids.shape
    past = 0
    if cache is not None:
        if len(cache) != c.num_layers:
            raise ShapeError(f"cache: expected {c.num_layers} per-layer caches (make_cache), got {len(cache)}")
        lengths = np.asarray(cache[0].lengths)
        if lengths.shape != (B,):
            raise ShapeError(f"cache: holds batch {lengths.shape[0]}, but token_ids has batch {B} (shape {ids.shape})")
        if np.any(lengths != lengths[0]):
            raise ShapeError(f"cache: sequences have different lengths {lengths.tolist()}; decode them separately")
        past = int(lengths[0])
    pos: np.ndarray | None
    if positions is None:
        pos = np.broadcast_to(np.arange(past, past + n), (B, n))
    else:
        try:
            pos = np.broadcast_to(np.asarray(positions), (B, n)) if np.ndim(positions) <= 2 else None
        except ValueError:
            pos = None
        if pos is None or pos.dtype.kind not in "iu":
            raise ShapeError(
                f"positions: expected integers of shape [n] or [B, n] with B={B}, n={n}, got shape "
                f"{np.shape(positions)} dtype {np.asarray(positions).dtype}"
            )
    tables: RopeTables | None = None
    if rope:
        tables = rope_tables(pos[0] if (pos == pos[0]).all() else pos, c.head_dim, base=c.rope_base, dtype=model.dtype)
    if causal and cache is not None:
        align: bool | Align = "bottom_right"
    elif causal:
        align = True
    else:
        align = False

    x = model.embed[ids]  # [B, n, d_model]
    maps: list[np.ndarray] = []
    kept: dict[str, list[np.ndarray]] = {f: [] for f in ("q", "k", "logits", "attn_out", "mlp_out", "residual")}
    want = return_attention or capture
    scale = float("nan")  # the attention's scale, read from its trace
    for i, layer in enumerate(model.layers):
        a = layer.attn
        h_in = rms_norm(x, layer.attn_norm, c.rms_eps)
        q = split_heads(h_in @ a.w_q, a.num_heads)  # [B, h, n, d]
        k = split_heads(h_in @ a.w_k, a.num_kv_heads)  # [B, h_kv, n, d]
        v = split_heads(h_in @ a.w_v, a.num_kv_heads)  # [B, h_kv, n, d]
        if tables is not None:
            q, k = apply_rope(q, tables), apply_rope(k, tables)
        if cache is not None:
            cache[i].append(k, v)
            if want or not causal or attention == "tiled":
                k = cache[i].keys  # [B, h_kv, past + n, d]
                out, tr = _attend(q, k, cache[i].values, a.n_rep, causal=align, attention=attention, want_weights=want)
            else:
                from ..kernels.kv_cache import cached_attention

                out, tr = cached_attention(q, cache[i]), None
        else:
            out, tr = _attend(q, k, v, a.n_rep, causal=align, attention=attention, want_weights=want)
        if tr is not None and return_attention:
            maps.append(tr.weights)
        attn_out = merge_heads(out) @ a.w_o  # [B, n, d_model]
        x = x + attn_out
        mlp_out = swiglu_mlp(rms_norm(x, layer.mlp_norm, c.rms_eps), layer)  # [B, n, d_model]
        x = x + mlp_out
        if capture:
            for f, val in (("q", q), ("k", k), ("logits", tr.logits), ("attn_out", attn_out), ("mlp_out", mlp_out)):
                kept[f].append(val)
            kept["residual"].append(x)
            scale = float(tr.scale)
    hidden = rms_norm(x[:, -1:] if last_only else x, model.final_norm, c.rms_eps)
    logits = hidden @ model.lm_head  # [B, n, vocab]
    trace = None
    if capture:
        trace = LlamaCapture(embeddings=model.embed[ids], scale=scale, **{f: tuple(v) for f, v in kept.items()})
    return LlamaOutput(
        logits=logits,
        attentions=tuple(maps) if return_attention else None,
        hidden=hidden,
        positions=np.array(pos),
        trace=trace,
    )


# --------------------------------------------------------------------------------------------------------------
# for checkers


def logits_fn(model: LlamaModel, *, break_causal: bool = False) -> Callable[[np.ndarray], np.ndarray]:
    """``token_ids [B, n] -> logits [B, n, vocab]`` for :func:`attnlab.checker.model.check_causal_lm`.

    ``break_causal=True`` is a deliberately broken model (every token sees the future): a checker must name the
    leak.
    """

    def fn(token_ids: np.ndarray) -> np.ndarray:
        return llama_forward(model, token_ids, causal=not break_causal).logits

    fn.__name__ = f"{model.config.name}{' (causal mask broken)' if break_causal else ''}"
    return fn


# --------------------------------------------------------------------------------------------------------------
# §16 on a real model


@dataclass(frozen=True)
class PositionCheck:
    """What :func:`position_check` measured on a real model (logits of every position, no causal mask).

    ``without_rope`` / ``with_rope``: ``max |f(P ids) - P f(ids)|`` over the logits, without and with RoPE.
    """

    perm: tuple[int, ...]
    tokens: tuple[str, ...]
    without_rope: float
    with_rope: float

    def text(self) -> str:
        """Plain lines for a terminal or notebook."""
        shown = " ".join(self.tokens[i] for i in self.perm)
        return (
            f"Tokens {' '.join(self.tokens)!s}  ->  permuted: {shown}\n"
            f"no RoPE, no causal mask: max |logits(P x) - P logits(x)| = {self.without_rope:.1e}  (float32 noise: "
            f"the model sees a bag of tokens, order is invisible, article 001 §16)\n"
            f"with RoPE:               max |logits(P x) - P logits(x)| = {self.with_rope:.1e}  (positions are "
            f"rotated into q and k, so order changes what the model computes)"
        )


def position_check(model: LlamaModel, token_ids: Any, *, perm: Any = None, seed: int = 0) -> PositionCheck:
    """Permute a prompt's tokens and compare the model's logits with the permuted logits, with and without RoPE.

    The causal mask is switched off for both runs (a causal mask is itself positional: token 0 sees only itself).

    Args:
        model: the model.
        token_ids: ``[n]`` ids (n >= 2), or text when the model has a tokenizer.
        perm: a permutation of ``range(n)`` (default: a seeded random one that moves some token).
        seed: seed of the default permutation.
    """
    _check_model(model)
    ids = _as_ids(model, model.encode(token_ids) if isinstance(token_ids, str) else token_ids)
    if ids.shape[0] != 1 or ids.shape[1] < 2:
        raise ShapeError(f"token_ids: expected one sequence of at least 2 tokens, got shape {ids.shape}")
    n = ids.shape[1]
    if perm is None:
        rng = np.random.default_rng(seed)
        p = rng.permutation(n)
        while np.array_equal(p, np.arange(n)):
            p = rng.permutation(n)
    else:
        p = np.asarray(perm)
        if p.shape != (n,) or not np.array_equal(np.sort(p), np.arange(n)):
            raise OptionError(f"perm: expected a permutation of range({n}), got {np.asarray(perm).tolist()}")
    diffs = []
    for rope in (False, True):
        base = llama_forward(model, ids, rope=rope, causal=False).logits[0]  # [n, vocab]
        moved = llama_forward(model, ids[:, p], rope=rope, causal=False).logits[0]
        diffs.append(float(np.max(np.abs(moved - base[p]))))
    labels = model.tokenizer.labels(ids[0]) if model.tokenizer is not None else [str(i) for i in ids[0]]
    return PositionCheck(perm=tuple(int(i) for i in p), tokens=tuple(labels), without_rope=diffs[0], with_rope=diffs[1])


# --------------------------------------------------------------------------------------------------------------
# generation


@dataclass(frozen=True)
class Generation:
    """A greedy continuation and how long it took.

    ``prompt_ids`` and ``new_ids`` are token ids; ``text`` is the decoded continuation ("" without a tokenizer).
    ``prefill_s`` is the time of the forward over the prompt, ``decode_s`` of the remaining steps;
    ``decode_tokens_per_s`` counts the tokens those steps produced.
    """

    prompt_ids: tuple[int, ...]
    new_ids: tuple[int, ...]
    text: str
    prefill_s: float
    decode_s: float
    step_s: tuple[float, ...]
    use_cache: bool
    attention: str

    @property
    def decode_tokens_per_s(self) -> float:
        """Decode speed: new tokens after the first per second of decoding (NaN with one new token)."""
        steps = len(self.new_ids) - 1
        return steps / self.decode_s if steps > 0 and self.decode_s > 0 else float("nan")

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prefill speed: prompt tokens per second of the prefill."""
        return len(self.prompt_ids) / self.prefill_s if self.prefill_s > 0 else float("nan")


def generate(
    model: LlamaModel,
    prompt: str | Sequence[int],
    *,
    max_new_tokens: int = 32,
    use_cache: bool = True,
    attention: Attention = "dense",
    stop_at_eos: bool = True,
    on_token: Callable[[int], None] | None = None,
    blas_threads: int | None = None,
) -> Generation:
    """Greedy decoding: repeatedly append the most likely next token.

    Args:
        model: the model.
        prompt: text (needs the model's tokenizer) or token ids ``[n]``.
        max_new_tokens: how many tokens to add at most (>= 1).
        use_cache: keep K and V of past tokens in a :class:`~attnlab.kernels.kv_cache.KVCache` so each step costs
            one token's forward (linear in the context); ``False`` recomputes the whole sequence each step.
        attention: ``"dense"`` or ``"tiled"`` for the prompt's forward.
        stop_at_eos: stop after the end-of-sequence token.
        on_token: called with each new token id as soon as it is chosen (streaming).
        blas_threads: as in :func:`llama_forward`.

    Returns:
        a :class:`Generation`.
    """
    _check_model(model)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=1)
    check_choice("attention", attention, ("dense", "tiled"))
    check_choice("use_cache", use_cache, (True, False))
    if on_token is not None and not callable(on_token):
        raise DTypeError(f"on_token: expected a function of one token id, or None, got {on_token!r}")
    ids = _as_ids(model, model.encode(prompt) if isinstance(prompt, str) else prompt)
    if ids.shape[0] != 1:
        raise ShapeError(f"prompt: expected one sequence (text or [n] ids), got shape {ids.shape}")
    prompt_ids = ids[0].astype(np.int64)
    eos = model.config.eos_id if stop_at_eos else None
    cache = make_cache(model, 1, capacity=len(prompt_ids) + max_new_tokens) if use_cache else None
    new: list[int] = []
    steps: list[float] = []

    t0 = time.perf_counter()
    kw: dict[str, Any] = {"blas_threads": blas_threads, "last_only": True}
    out = llama_forward(model, prompt_ids[None], attention=attention, cache=cache, **kw)
    nxt = int(np.argmax(out.logits[0, -1]))
    prefill = time.perf_counter() - t0
    new.append(nxt)
    if on_token is not None:
        on_token(nxt)
    seq = [*prompt_ids.tolist(), nxt]
    while len(new) < max_new_tokens and nxt != eos:
        t = time.perf_counter()
        if cache is not None:
            out = llama_forward(model, np.array([[nxt]]), cache=cache, **kw)
        else:
            out = llama_forward(model, np.array([seq]), attention=attention, **kw)
        nxt = int(np.argmax(out.logits[0, -1]))
        steps.append(time.perf_counter() - t)
        new.append(nxt)
        seq.append(nxt)
        if on_token is not None:
            on_token(nxt)
    text = model.tokenizer.decode(new) if model.tokenizer is not None else ""
    return Generation(
        prompt_ids=tuple(prompt_ids.tolist()),
        new_ids=tuple(new),
        text=text,
        prefill_s=prefill,
        decode_s=float(sum(steps)),
        step_s=tuple(steps),
        use_cache=use_cache,
        attention=attention,
    )
