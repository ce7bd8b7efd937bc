"""Multi-head attention (MHA, GQA, MQA) over the core: projections, heads, the core attention, the output projection.

``MultiHead(X_q, X_kv) = Concat(head_1, ..., head_h) W_O + b_O`` with
``head_r = softmax(Q_r K_{r // n_rep}ᵀ / sqrt(head_dim) + M) V_{r // n_rep}`` and ``Q = X_q W_Q + b_Q``,
``K = X_kv W_K + b_K``, ``V = X_kv W_V + b_V`` (the articles' ``x @ W`` convention: every ``W`` is
``[d_in, d_out]``). With ``num_kv_heads < num_heads`` (GQA; 1 = MQA) query head ``i`` reads key/value head
``i // (num_heads // num_kv_heads)``, the ``repeat_interleave`` convention of PyTorch ``enable_gqa``,
FlashAttention and Hugging Face.

Shapes: ``x_q [B, n_q, d_model]``, ``x_kv [B, n_k, d_kv]``, per-head ``q [B, h, n_q, head_dim]``,
``k, v [B, h_kv, n_k, head_dim]``, ``weights [B, h, n_q, n_k]``, ``output [B, n_q, d_model]``.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from .._arrays import compute_dtypes, namespace, shape_of
from ..errors import DTypeError, OptionError, RangeError, ShapeError
from ..validate import check_choice, check_float, check_int
from .attention import DEFAULT_MAX_BYTES, AttentionTrace, attention_trace
from .dropout import Dropout, apply_dropout, check_p, make_dropout
from .gradients import attention_backward, upstream_gradient
from .inputs import Causal, MaskedRows, as_array, cast_checked, check_finite, max_abs

__all__ = [
    "MultiHeadGrads",
    "MultiHeadResult",
    "MultiHeadWeights",
    "init_multi_head",
    "merge_heads",
    "multi_head_attention",
    "multi_head_backward",
    "repeat_kv",
    "split_heads",
    "sum_kv_groups",
]


# --------------------------------------------------------------------------------------------------------------
# heads


def _heads_array(x: Any, ndim: int, layout: str) -> tuple[Any, Any, tuple[int, ...]]:
    """``(xp, x, shape)`` for ``x`` as an array with at least ``ndim`` dims, else a
    :class:`~attnlab.errors.ShapeError` that shows the expected ``layout`` (``"[..., h, n, d]"``)."""
    x = as_array(x, "x")
    xp = namespace(x=x)
    s = shape_of(x)
    if len(s) < ndim:
        raise ShapeError(f"x: expected {layout} with at least {ndim} dims, got shape {s}")
    return xp, x, s


def split_heads(x: Any, num_heads: int) -> Any:
    """Split the last axis into heads and move them before the sequence axis.

    Shapes: ``x [..., n, h * d] -> [..., h, n, d]`` (usually ``[B, n, h*d] -> [B, h, n, d]``).

    >>> split_heads(np.arange(8).reshape(1, 2, 4), 2)[0].tolist()  # head 0 holds columns 0-1, head 1 columns 2-3
    [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    """
    num_heads = check_int("num_heads", num_heads, minimum=1)
    xp, x, s = _heads_array(x, 2, "[..., n, h * d]")
    if s[-1] % num_heads:
        raise ShapeError(f"x: last dim {s[-1]} (shape {s}) is not divisible by num_heads={num_heads}")
    d = s[-1] // num_heads
    y = xp.reshape(x, (*s[:-1], num_heads, d))  # [..., n, h, d]
    nd = len(s) + 1
    return xp.permute_dims(y, (*range(nd - 3), nd - 2, nd - 3, nd - 1))  # [..., h, n, d]


def merge_heads(x: Any) -> Any:
    """Concatenate the heads along the feature axis: the inverse of :func:`split_heads`.

    Shapes: ``x [..., h, n, d] -> [..., n, h * d]``.

    >>> x = np.arange(24.0).reshape(2, 3, 4)
    >>> bool((merge_heads(split_heads(x, 2)) == x).all())
    True
    """
    xp, x, s = _heads_array(x, 3, "[..., h, n, d]")
    nd = len(s)
    y = xp.permute_dims(x, (*range(nd - 3), nd - 2, nd - 3, nd - 1))  # [..., n, h, d]
    return xp.reshape(y, (*s[:-3], s[-2], s[-3] * s[-1]))


def repeat_kv(x: Any, n_rep: int) -> Any:
    """Repeat each key/value head ``n_rep`` times, so query head ``i`` reads kv head ``i // n_rep``.

    The ``repeat_interleave`` convention (PyTorch ``enable_gqa``, FlashAttention, Hugging Face ``repeat_kv``):
    kv heads ``[a, b]`` with ``n_rep=2`` become ``[a, a, b, b]``, not ``[a, b, a, b]``.

    Shapes: ``x [..., h_kv, n, d] -> [..., h_kv * n_rep, n, d]``.

    >>> repeat_kv(np.array([[[[1]], [[2]]]]), 2)[0, :, 0, 0].tolist()
    [1, 1, 2, 2]
    """
    n_rep = check_int("n_rep", n_rep, minimum=1)
    xp, x, s = _heads_array(x, 3, "[..., h_kv, n, d]")
    if n_rep == 1:
        return x
    y = xp.broadcast_to(x[..., None, :, :], (*s[:-2], n_rep, s[-2], s[-1]))  # [..., h_kv, n_rep, n, d]
    return xp.reshape(y, (*s[:-3], s[-3] * n_rep, s[-2], s[-1]))


def sum_kv_groups(x: Any, num_kv_heads: int) -> Any:
    """The adjoint of :func:`repeat_kv`: sum the gradients of the ``n_rep`` query heads that share a kv head.

    Shapes: ``x [..., h, n, d] -> [..., h_kv, n, d]``.
    """
    num_kv_heads = check_int("num_kv_heads", num_kv_heads, minimum=1)
    x = as_array(x, "x")
    xp = namespace(x=x)
    s = shape_of(x)
    if len(s) < 3 or s[-3] % num_kv_heads:
        raise ShapeError(f"x: shape {s} is not [..., h, n, d] with h a multiple of num_kv_heads={num_kv_heads}")
    n_rep = s[-3] // num_kv_heads
    if n_rep == 1:
        return x
    return xp.sum(xp.reshape(x, (*s[:-3], num_kv_heads, n_rep, s[-2], s[-1])), axis=-3)


# --------------------------------------------------------------------------------------------------------------
# weights


@dataclass(frozen=True)
class MultiHeadWeights:
    """The parameters of one multi-head attention layer, in the ``x @ W`` convention (``W [d_in, d_out]``).

    Shapes:
        * ``w_q [d_model, num_heads * head_dim]``, ``b_q [num_heads * head_dim]``;
        * ``w_k, w_v [d_kv, num_kv_heads * head_dim]``, ``b_k, b_v [num_kv_heads * head_dim]``;
        * ``w_o [num_heads * head_dim, d_model]``, ``b_o [d_model]``.

    ``num_kv_heads`` defaults to ``num_heads`` and must divide it (1 = MQA); ``head_dim`` defaults to
    ``w_q``'s width / ``num_heads``. Biases are optional (``None``). Construction checks every shape.
    """

    w_q: Any
    w_k: Any
    w_v: Any
    w_o: Any
    b_q: Any = None
    b_k: Any = None
    b_v: Any = None
    b_o: Any = None
    _: KW_ONLY
    num_heads: int
    # None is accepted and means the default above; __post_init__ stores the int, so readers always see an int
    num_kv_heads: int = None  # type: ignore[assignment]  # a None default for a field that holds an int
    head_dim: int = None  # type: ignore[assignment]  # a None default for a field that holds an int

    def __post_init__(self) -> None:
        h = check_int("num_heads", self.num_heads, minimum=1)
        h_kv = h if self.num_kv_heads is None else check_int("num_kv_heads", self.num_kv_heads, minimum=1)
        if h % h_kv:
            raise ShapeError(f"num_kv_heads={h_kv} must divide num_heads={h} (GQA groups query heads evenly)")
        for name in ("w_q", "w_k", "w_v", "w_o"):
            w = getattr(self, name)
            if w is None or not hasattr(w, "shape") or len(shape_of(w)) != 2:
                shown = shape_of(w) if hasattr(w, "shape") else type(w).__name__
                raise ShapeError(f"{name}: expected a 2-D array [d_in, d_out], got {shown}")
        wq = shape_of(self.w_q)
        if self.head_dim is None:
            if wq[1] % h:
                raise ShapeError(f"w_q: width {wq[1]} (shape {wq}) is not divisible by num_heads={h}")
            d = wq[1] // h
        else:
            d = check_int("head_dim", self.head_dim, minimum=1)
        object.__setattr__(self, "num_heads", h)
        object.__setattr__(self, "num_kv_heads", h_kv)
        object.__setattr__(self, "head_dim", d)
        d_model = wq[0]
        expect = {
            "w_q": (d_model, h * d),
            "w_k": (self.d_kv, h_kv * d),
            "w_v": (self.d_kv, h_kv * d),
            "w_o": (h * d, d_model),
        }
        for name, want in expect.items():
            got = shape_of(getattr(self, name))
            if got != want:
                raise ShapeError(
                    f"{name}: shape {got}, expected {want} (d_model={d_model}, d_kv={self.d_kv}, num_heads={h}, "
                    f"num_kv_heads={h_kv}, head_dim={d}; weights are [d_in, d_out], Q = X W_Q)"
                )
        for name, width in (("b_q", h * d), ("b_k", h_kv * d), ("b_v", h_kv * d), ("b_o", d_model)):
            b = getattr(self, name)
            if b is not None and (not hasattr(b, "shape") or shape_of(b) != (width,)):
                shown = shape_of(b) if hasattr(b, "shape") else type(b).__name__
                raise ShapeError(f"{name}: expected shape ({width},), got {shown}")

    @property
    def d_model(self) -> int:
        """Width of the queries' input and of the output."""
        return shape_of(self.w_q)[0]

    @property
    def d_kv(self) -> int:
        """Width of the keys'/values' input (``d_model`` for self attention)."""
        return shape_of(self.w_k)[0]

    @property
    def n_rep(self) -> int:
        """Query heads per key/value head (``num_heads // num_kv_heads``)."""
        return self.num_heads // self.num_kv_heads

    def arrays(self) -> dict[str, Any]:
        """The parameters by name (``w_q ... b_o``), biases that are ``None`` left out."""
        names = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def astype(self, dtype: Any) -> MultiHeadWeights:
        """A copy with every array converted to ``dtype`` (NumPy dtypes, or the arrays' own library's)."""
        xp = namespace(*self.arrays().values())
        conv = {n: xp.astype(a, dtype) for n, a in self.arrays().items()}
        return MultiHeadWeights(
            **conv, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim
        )


def init_multi_head(
    d_model: int,
    num_heads: int,
    *,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    bias: bool = True,
    bias_std: float = 0.0,
    rng: np.random.Generator,
    d_kv: int | None = None,
    dtype: Any = np.float64,
) -> MultiHeadWeights:
    """Seeded Xavier/Glorot-uniform weights (``U(±sqrt(6 / (d_in + d_out)))`` per matrix), zero or normal biases.

    Shapes: ``w_q [d_model, h * head_dim]``, ``w_k, w_v [d_kv, h_kv * head_dim]``, ``w_o [h * head_dim, d_model]``,
    biases ``[h * head_dim]``, ``[h_kv * head_dim]`` (k and v), ``[d_model]`` (o).

    Args:
        d_model: width of the queries' input and of the output.
        num_heads: query heads ``h``.
        num_kv_heads: key/value heads (default ``h``; 1 = MQA); must divide ``h``.
        head_dim: width of one head (default ``d_model / h``, which must then be an integer).
        bias: whether the four projections have biases.
        bias_std: the biases' standard deviation: 0 (default) gives zero biases, as ``nn.MultiheadAttention``;
            ``> 0`` draws each bias from ``N(0, bias_std²)``, after the weights, so the weights of a seed do not
            depend on it. Needs ``bias=True``.
        rng: the ``numpy.random.Generator`` to draw from (required: same seed, same weights).
        d_kv: width of the keys'/values' input for cross attention (default ``d_model``).
        dtype: a floating dtype for the arrays: ``np.float16``, ``np.float32``, ``np.float64`` or bfloat16
            (``ml_dtypes.bfloat16``); the values are drawn in float64 and rounded to it.

    Raises:
        OptionError: a size that is not an int >= 1, a negative ``bias_std``, or ``bias_std`` without biases.
        ShapeError: ``num_kv_heads`` that does not divide ``num_heads``, or ``d_model`` not divisible by
            ``num_heads`` without ``head_dim``.
        DTypeError: ``rng`` that is not a Generator, or a ``dtype`` that is not floating (integer weights would
            round every Xavier value to 0).
        RangeError: biases that overflow ``dtype`` (``bias_std=1e5`` in float16).

    >>> w = init_multi_head(512, 8, rng=np.random.default_rng(0))  # the articles' d_model=512, 8 heads
    >>> w.head_dim, w.w_q.shape, w.w_o.shape
    (64, (512, 512), (512, 512))
    >>> init_multi_head(512, 8, num_kv_heads=2, rng=np.random.default_rng(0)).w_k.shape  # GQA
    (512, 128)
    >>> init_multi_head(4, 2, bias_std=0.1, rng=np.random.default_rng(0)).b_o.round(3)  # non-zero biases
    array([-0.066,  0.094,  0.005,  0.2  ])
    """
    d_model = check_int("d_model", d_model, minimum=1)
    h = check_int("num_heads", num_heads, minimum=1)
    h_kv = h if num_kv_heads is None else check_int("num_kv_heads", num_kv_heads, minimum=1)
    if not isinstance(rng, np.random.Generator):
        raise DTypeError(f"rng: expected a numpy.random.Generator (np.random.default_rng(seed)), got {rng!r}")
    if h % h_kv:
        raise ShapeError(f"num_kv_heads={h_kv} must divide num_heads={h} (GQA groups query heads evenly)")
    if head_dim is None:
        if d_model % h:
            raise ShapeError(
                f"head_dim: d_model={d_model} is not divisible by num_heads={h}; pass head_dim= explicitly "
                f"(then the heads' width h * head_dim need not equal d_model)"
            )
        head_dim = d_model // h
    d = check_int("head_dim", head_dim, minimum=1)
    d_kv = d_model if d_kv is None else check_int("d_kv", d_kv, minimum=1)
    check_choice("bias", bias, (True, False))
    bias_std = check_float("bias_std", bias_std, minimum=0.0)
    if bias_std > 0 and not bias:
        raise OptionError(f"bias_std={bias_std} draws biases, but bias=False asks for none; pass bias=True")
    dt = _float_dtype(dtype)

    def xavier(d_in: int, d_out: int) -> np.ndarray:
        limit = math.sqrt(6.0 / (d_in + d_out))
        return rng.uniform(-limit, limit, size=(d_in, d_out)).astype(dt)

    w_q, w_k, w_v = xavier(d_model, h * d), xavier(d_kv, h_kv * d), xavier(d_kv, h_kv * d)
    w_o = xavier(h * d, d_model)
    biases: list[np.ndarray | None] = [None] * 4
    if bias:
        widths = (h * d, h_kv * d, h_kv * d, d_model)
        if bias_std == 0:
            biases = [np.zeros(n, dtype=dt) for n in widths]
        else:
            drawn = [rng.normal(0.0, bias_std, size=n) for n in widths]
            with np.errstate(over="ignore"):  # an overflow is reported just below, by name
                narrowed = [b.astype(dt) for b in drawn]
            biases = [*narrowed]
            for name, b64, b in zip(("b_q", "b_k", "b_v", "b_o"), drawn, narrowed, strict=True):
                if not np.isfinite(b.astype(np.float64)).all():
                    raise RangeError(
                        f"bias_std={bias_std}: {name} draws reach {np.abs(b64).max():.3g}, beyond what {dt} can "
                        f"hold; use a smaller bias_std or a wider dtype"
                    )
    return MultiHeadWeights(w_q, w_k, w_v, w_o, *biases, num_heads=h, num_kv_heads=h_kv, head_dim=d)


_FLOAT_DTYPES = ("float16", "float32", "float64", "bfloat16")


def _float_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a NumPy floating dtype that weights may have, or a :class:`DTypeError` naming ``dtype``."""
    want = "a floating dtype: np.float16, np.float32, np.float64 or ml_dtypes.bfloat16"
    dt: np.dtype | None
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
        if str(dtype) == "bfloat16":
            try:
                import ml_dtypes

                dt = np.dtype(ml_dtypes.bfloat16)
            except ImportError:
                raise DTypeError("dtype: bfloat16 in NumPy needs ml_dtypes: pip install ml_dtypes") from None
    if dt is None:
        raise DTypeError(
            f"dtype: expected {want} (init_multi_head makes NumPy arrays; convert them for another library "
            f"afterwards, e.g. weights_io.to_torch_attention), got {dtype!r}"
        )
    if dt.name not in _FLOAT_DTYPES:
        raise DTypeError(
            f"dtype: expected {want}, got {dt}"
            + (" (integer or boolean weights would round every Xavier value to 0)" if dt.kind in "iub" else "")
        )
    return dt


# --------------------------------------------------------------------------------------------------------------
# forward


@dataclass(frozen=True)
class MultiHeadResult:
    """What :func:`multi_head_attention` returns, including everything :func:`multi_head_backward` needs.

    The attention weights are always there, read from the trace: :attr:`weights` per head, :meth:`mean_weights`
    averaged over the heads (no flag asks for them).

    Shapes:
        * ``output [B, n_q, d_model]`` in the input dtype;
        * ``trace``: the core :class:`~attnlab.core.AttentionTrace` of the heads (``q [B, h, n_q, head_dim]``,
          ``k, v [B, h, n_k, head_dim]`` after :func:`repeat_kv`, ``weights [B, h, n_q, n_k]``), in the compute
          dtype;
        * ``dropout``: the :class:`~attnlab.core.dropout.Dropout` applied (keep mask ``[B, h, n_q, n_k]``), or
          ``None`` when off (evaluation, or ``dropout_p=0``);
        * ``heads [B, n_q, h * head_dim]``: the concatenated head outputs (the input of ``W_O``), compute dtype;
        * ``x_q``, ``x_kv``: the inputs in the compute dtype (``x_kv`` is ``None`` for self attention).
    """

    output: Any
    trace: AttentionTrace = field(repr=False)
    dropout: Dropout | None = field(repr=False)
    heads: Any = field(repr=False)
    x_q: Any = field(repr=False)
    x_kv: Any | None = field(repr=False)
    params: MultiHeadWeights = field(repr=False)

    @cached_property
    def weights(self) -> Any:
        """``[B, h, n_q, n_k]``: every head's softmax weights *before* dropout (rows sum to 1), in the output's dtype
        (a copy of ``trace.weights``, which are in the compute dtype)."""
        return namespace(self.output).astype(self.trace.weights, self.output.dtype)

    def mean_weights(self) -> Any:
        """``[B, n_q, n_k]``: the weights averaged over the heads (``nn.MultiheadAttention``'s
        ``average_attn_weights=True``), in the output's dtype."""
        xp = namespace(self.output)
        return xp.astype(xp.mean(self.trace.weights, axis=1), self.output.dtype)


def _check_x(xp: Any, x: Any, name: str, width: int, wname: str) -> tuple[int, ...]:
    s = shape_of(x)
    if len(s) != 3:
        raise ShapeError(f"{name}: expected 3 dims [B, n, {wname}], got shape {s}")
    if 0 in s:
        raise ShapeError(f"{name}: shape {s} has a zero-length axis")
    if s[-1] != width:
        raise ShapeError(f"{name}: last dim {s[-1]} (shape {s}) does not match the weights' {wname}={width}")
    return s


def _project(x: Any, w: Any, b: Any) -> Any:
    y = x @ w
    return y if b is None else y + b


def multi_head_attention(
    x_q: Any,
    x_kv: Any | None,
    weights: MultiHeadWeights,
    mask: Any = None,
    *,
    causal: Causal = False,
    bias: Any = None,
    scale: float | None = None,
    masked_rows: MaskedRows = "raise",
    dropout_p: float = 0.0,
    rng: np.random.Generator | None = None,
    training: bool = False,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> MultiHeadResult:
    """Multi-head attention (MHA, GQA or MQA), self or cross, with every mask option of the core.

    Args:
        x_q: queries' input ``[B, n_q, d_model]`` (NumPy, PyTorch or any array-API array).
        x_kv: keys'/values' input ``[B, n_k, d_kv]`` for cross attention, or ``None`` for self attention.
        weights: the layer's :class:`MultiHeadWeights`.
        mask: boolean, True = may attend, broadcastable to ``[B, h, n_q, n_k]``: ``[n_q, n_k]``,
            ``[B, 1, 1, n_k]`` (``masks.key_padding``, ``masks.from_hf``), ``[B, h, n_q, n_k]``... A 3-D mask is
            refused as ambiguous (``[B, n_q, n_k]`` would broadcast against the heads axis): add the head axis.
        causal: as in :func:`~attnlab.scaled_dot_product_attention` (``True``, ``"top_left"``, ``"bottom_right"``).
        bias: additive scores (ALiBi, relative position) broadcastable to ``[B, h, n_q, n_k]`` (the keyword of
            :func:`~attnlab.scaled_dot_product_attention` and :func:`~attnlab.flash_attention` too).
        scale: multiplies ``Q_r K_rᵀ``; default ``1 / sqrt(head_dim)`` (never ``1 / sqrt(d_model)``).
        masked_rows: policy for query rows that may attend to no key: ``"raise"``, ``"zero"`` or ``"nan"``.
        dropout_p: probability of dropping each attention weight, active only with ``training=True``; kept
            weights are scaled by ``1 / (1 - dropout_p)`` (inverted dropout).
        rng: the ``numpy.random.Generator`` dropout draws from (required when dropout is active).
        training: dropout is applied only in training mode; evaluation is deterministic.
        max_bytes: the memory limit of the dense scores, as in :func:`~attnlab.scaled_dot_product_attention`.

    Returns:
        a :class:`MultiHeadResult`: ``.output [B, n_q, d_model]``, ``.weights [B, h, n_q, n_k]``,
        ``.mean_weights()`` ``[B, n_q, n_k]``, and the trace for the backward.

    >>> rng = np.random.default_rng(0)
    >>> w = init_multi_head(8, 4, num_kv_heads=2, rng=rng)
    >>> x = rng.standard_normal((2, 5, 8))
    >>> r = multi_head_attention(x, None, w, causal=True)
    >>> r.output.shape, r.weights.shape, r.mean_weights().shape
    ((2, 5, 8), (2, 4, 5, 5), (2, 5, 5))
    >>> bool(np.allclose(r.weights.sum(-1), 1.0)), float(r.weights[0, 0, 0, 1])
    (True, 0.0)
    """
    if not isinstance(weights, MultiHeadWeights):
        raise DTypeError(f"weights: expected a MultiHeadWeights (see init_multi_head), got {type(weights).__name__}")
    x_q = as_array(x_q, "x_q")
    x_kv = as_array(x_kv, "x_kv", optional=True)
    params = weights.arrays()
    xp = namespace(x_q=x_q, x_kv=x_kv, **params)
    sq = _check_x(xp, x_q, "x_q", weights.d_model, "d_model")
    if x_kv is not None:
        sk = _check_x(xp, x_kv, "x_kv", weights.d_kv, "d_kv")
        if sk[0] != sq[0]:
            raise ShapeError(f"x_kv: batch size {sk[0]} (shape {sk}) does not match x_q's {sq[0]} (shape {sq})")
    elif weights.d_kv != weights.d_model:
        raise ShapeError(
            f"x_kv: None (self attention) needs d_kv == d_model, but the weights have d_kv={weights.d_kv}, "
            f"d_model={weights.d_model}; pass the keys'/values' input"
        )
    if mask is not None and hasattr(mask, "shape") and len(shape_of(mask)) == 3:
        raise ShapeError(
            f"mask: 3-D shape {shape_of(mask)} is ambiguous for multi-head scores [B, h, n_q, n_k]; "
            f"give [n_q, n_k], or add the head axis: mask[:, None] -> [B, 1, n_q, n_k]"
        )
    check_choice("training", training, (False, True))
    dropout_p = check_p(dropout_p)

    cdt, out_dtype = compute_dtypes(xp, x_q=x_q, x_kv=x_kv, **params)
    for name, x in (("x_q", x_q), ("x_kv", x_kv), *params.items()):
        if x is not None:
            check_finite(xp, x, name)
    opts = {
        "mask": mask,
        "bias": bias,
        "causal": causal,
        "scale": scale,
        "masked_rows": masked_rows,
        "max_bytes": max_bytes,
    }
    drawn: dict[str, Dropout | None] = {}

    def draw(shape: tuple[int, ...]) -> Dropout | None:
        if "drop" not in drawn:  # once, even when a float32 pass is redone in float64
            drawn["drop"] = make_dropout(shape, dropout_p, rng) if training else None
        return drawn["drop"]

    with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked for stage by stage, and explained
        done = _mha_forward(xp, x_q, x_kv, weights, cdt, opts, draw)
        if done is None:  # float32 overflowed somewhere: the whole layer again in float64
            done = _mha_forward(xp, x_q, x_kv, weights, xp.float64, opts, draw)
        assert done is not None  # a float64 pass raises a RangeError rather than returning None
    trace, drop, heads, out, xq, xkv = done
    return MultiHeadResult(
        output=cast_checked(xp, out, out_dtype, "output"),
        trace=trace,
        dropout=drop,
        heads=heads,
        x_q=xq,
        x_kv=xkv,
        params=weights,
    )


def _overflowed(xp: Any, x: Any, cdt: Any, what: str, inputs: dict[str, Any]) -> bool:
    """False if ``x`` is finite; True (redo in float64) if not and ``cdt`` is float32; else a RangeError."""
    if bool(xp.all(xp.isfinite(x))):
        return False
    if cdt != xp.float64:
        return True
    shown = ", ".join(f"max |{n}| {max_abs(xp, a):.7g}" for n, a in inputs.items() if a is not None)
    raise RangeError(
        f"{what} overflows float64 (largest finite {np.finfo(np.float64).max:.7g}) from finite inputs ({shown}); "
        f"scale the inputs or the weights down"
    )


def _mha_forward(
    xp: Any, x_q: Any, x_kv: Any, weights: MultiHeadWeights, cdt: Any, opts: dict[str, Any], draw: Any
) -> tuple[Any, ...] | None:
    """One pass of the layer in ``cdt``: ``(trace, dropout, heads, output, x_q, x_kv)``, or ``None`` when a float32
    pass overflowed (the caller redoes it in float64); a float64 overflow is a RangeError naming the stage."""
    cast = {n: xp.astype(a, cdt) for n, a in weights.arrays().items()}
    xq = xp.astype(x_q, cdt)
    xkv = None if x_kv is None else xp.astype(x_kv, cdt)
    src = xq if xkv is None else xkv
    src_name = "x_q" if xkv is None else "x_kv"

    h, h_kv = weights.num_heads, weights.num_kv_heads
    projected = {}
    for part, x, name, heads_n in (("q", xq, "x_q", h), ("k", src, src_name, h_kv), ("v", src, src_name, h_kv)):
        y = _project(x, cast[f"w_{part}"], cast.get(f"b_{part}"))  # [B, n, heads * d]
        inputs = {name: x, f"w_{part}": cast[f"w_{part}"], f"b_{part}": cast.get(f"b_{part}")}
        if _overflowed(xp, y, cdt, f"{part}: the projection {name} @ w_{part} + b_{part}", inputs):
            return None
        projected[part] = split_heads(y, heads_n)  # [B, heads, n, d]
    q = projected["q"]
    k, v = repeat_kv(projected["k"], weights.n_rep), repeat_kv(projected["v"], weights.n_rep)  # [B, h, n_k, d]
    trace = attention_trace(
        q,
        k,
        v,
        opts["mask"],
        bias=opts["bias"],
        causal=opts["causal"],
        scale=opts["scale"],
        masked_rows=opts["masked_rows"],
        max_bytes=opts["max_bytes"],
    )
    if trace.weights.dtype != cdt:  # the core recomputed float32 logits in float64: so does the whole layer
        return None
    drop = draw(shape_of(trace.weights))
    a = trace.weights if drop is None else apply_dropout(trace.weights, drop)  # [B, h, n_q, n_k]
    o = a @ trace.v  # [B, h, n_q, d]
    live = o if trace.policy != "nan" or not trace.masked_rows else xp.where(xp.isnan(o), xp.zeros_like(o), o)
    if _overflowed(xp, live, cdt, "heads: (dropped) weights @ v", {"v": trace.v}):
        return None
    heads = merge_heads(o)  # [B, n_q, h * d]
    out = _project(heads, cast["w_o"], cast.get("b_o"))  # [B, n_q, d_model]
    live = out if trace.policy != "nan" or not trace.masked_rows else xp.where(xp.isnan(out), xp.zeros_like(out), out)
    if _overflowed(
        xp, live, cdt, "output: heads @ w_o + b_o", {"heads": heads, "w_o": cast["w_o"], "b_o": cast.get("b_o")}
    ):
        return None
    return trace, drop, heads, out, xq, xkv


# --------------------------------------------------------------------------------------------------------------
# backward


@dataclass(frozen=True)
class MultiHeadGrads:
    """Gradients of a scalar loss through one multi-head attention layer.

    Shapes:
        * ``dx_q [B, n_q, d_model]``; for self attention (``x_kv=None``) it holds the whole gradient of ``x``
          (through queries, keys and values);
        * ``dx_kv [B, n_k, d_kv]`` for cross attention, ``None`` for self attention;
        * ``weights``: a :class:`MultiHeadWeights` of gradients (``dW_Q`` in ``.w_q`` ..., ``dB_O`` in ``.b_o``;
          a bias gradient is ``None`` where the layer has no bias);
        * ``dbias``: as the forward's ``bias`` (``None`` without one);
        * ``heads``: the core's :class:`~attnlab.core.gradients.AttentionGrads` of the heads
          (``dq [B, h, n_q, d]``, ``dk, dv [B, h, n_k, d]`` before the kv groups are summed).
    """

    dx_q: Any
    dx_kv: Any | None
    weights: MultiHeadWeights
    dbias: Any | None = None
    heads: Any = field(default=None, repr=False)


def _flat(xp: Any, x: Any) -> Any:
    s = shape_of(x)
    return xp.reshape(x, (-1, s[-1]))  # [B * n, d]


def multi_head_backward(result: MultiHeadResult, d_out: Any) -> MultiHeadGrads:
    """Backward pass of :func:`multi_head_attention`: gradients for the inputs, every weight and bias.

    Uses the forward's trace and dropout mask: ``dW_O = Hᵀ dO``, ``dH = dO W_Oᵀ``, the core's
    :func:`~attnlab.core.gradients.attention_backward` per head, the kv-group sums of GQA, then
    ``dW_Q = X_qᵀ dQ``, ``dX_q = dQ W_Qᵀ`` (and likewise for K and V from ``X_kv``).

    Args:
        result: what :func:`multi_head_attention` returned for this forward pass.
        d_out: ``∂L/∂output``, ``[B, n_q, d_model]``.

    Returns:
        :class:`MultiHeadGrads` in the compute dtype (float64, or float32 for lower precisions). A float32
        backward that overflows is redone in float64 and converted back; a gradient float32 cannot hold (or an
        overflow in float64) is a :class:`~attnlab.errors.RangeError` naming it.

    >>> rng = np.random.default_rng(0)
    >>> w = init_multi_head(4, 2, rng=rng)
    >>> r = multi_head_attention(rng.standard_normal((1, 3, 4)), None, w, causal=True)
    >>> g = multi_head_backward(r, np.ones((1, 3, 4)))
    >>> g.dx_q.shape, g.weights.w_q.shape, g.dx_kv is None
    ((1, 3, 4), (4, 4), True)
    """
    if not isinstance(result, MultiHeadResult):
        raise DTypeError(f"result: expected the MultiHeadResult of multi_head_attention, got {type(result).__name__}")
    xp = namespace(result.heads)
    d_out = upstream_gradient(xp, d_out, shape_of(result.output), "[B, n_q, d_model]", result.heads)
    cdt = result.heads.dtype
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked for below, and explained
        try:
            grads = _mh_grads(result, d_out, cdt)
            bad = _first_non_finite(xp, grads)
        except RangeError:
            if cdt == xp.float64:
                raise
            bad = "heads"  # the core's gradient did not fit float32
        if bad is not None and cdt != xp.float64:
            wide = _mh_grads(result, d_out, xp.float64)
            bad = _first_non_finite(xp, wide)
            if bad is None:
                grads = _map_grads(wide, lambda name, g: cast_checked(xp, g, cdt, name))
    if bad is not None:
        note = f" (the {str(cdt).replace('torch.', '')} layer was recomputed in float64)" if cdt != xp.float64 else ""
        raise RangeError(
            f"{bad}: the multi-head gradient overflows float64 (largest finite {np.finfo(np.float64).max:.7g}){note} "
            f"from finite inputs: max |d_out| {max_abs(xp, d_out):.7g}, max |x_q| {max_abs(xp, result.x_q):.7g}; "
            f"scale d_out (the loss), the inputs or the weights down"
        )
    return grads


_MH_NAMES = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")


def _map_grads(g: MultiHeadGrads, f: Any) -> MultiHeadGrads:
    """``g`` with ``f(name, array)`` applied to every gradient array (``None`` entries kept)."""
    w = g.weights
    arrays = [None if getattr(w, n) is None else f(n, getattr(w, n)) for n in _MH_NAMES]
    return MultiHeadGrads(
        dx_q=f("dx_q", g.dx_q),
        dx_kv=None if g.dx_kv is None else f("dx_kv", g.dx_kv),
        weights=MultiHeadWeights(*arrays, num_heads=w.num_heads, num_kv_heads=w.num_kv_heads, head_dim=w.head_dim),
        dbias=None if g.dbias is None else f("dbias", g.dbias),
        heads=g.heads,
    )


def _first_non_finite(xp: Any, g: MultiHeadGrads) -> str | None:
    found: list[str] = []

    def look(name: str, a: Any) -> Any:
        if not found and not bool(xp.all(xp.isfinite(a))):
            found.append(name)
        return a

    _map_grads(g, look)
    return found[0] if found else None


def _mh_grads(result: MultiHeadResult, d_out: Any, cdt: Any) -> MultiHeadGrads:
    """The backward of one multi-head layer with every array converted to ``cdt``."""
    w = result.params
    xp = namespace(result.heads)
    d_o = xp.astype(d_out, cdt)  # [B, n_q, d_model]
    p = {n: xp.astype(a, cdt) for n, a in w.arrays().items()}
    trace = result.trace
    if trace.weights.dtype != cdt:
        trace = replace(trace, **{n: xp.astype(getattr(trace, n), cdt) for n in ("q", "k", "v", "weights")})
    heads = xp.astype(result.heads, cdt)

    dw_o = xp.matrix_transpose(_flat(xp, heads)) @ _flat(xp, d_o)  # [h*d, d_model]
    db_o = xp.sum(_flat(xp, d_o), axis=0) if w.b_o is not None else None
    d_heads = split_heads(d_o @ xp.matrix_transpose(p["w_o"]), w.num_heads)  # [B, h, n_q, d]
    try:
        g = attention_backward(trace, d_heads, dropout=result.dropout)
    except RangeError as err:
        raise RangeError(
            f"multi_head_backward: in the heads' attention backward, where d_out is the heads' gradient "
            f"d_out W_Oᵀ: {err}"
        ) from None
    d_q = merge_heads(g.dq)  # [B, n_q, h*d]
    d_k = merge_heads(sum_kv_groups(g.dk, w.num_kv_heads))  # [B, n_k, h_kv*d]
    d_v = merge_heads(sum_kv_groups(g.dv, w.num_kv_heads))  # [B, n_k, h_kv*d]

    x_q = xp.astype(result.x_q, cdt)
    x_kv = x_q if result.x_kv is None else xp.astype(result.x_kv, cdt)
    fq, fkv = _flat(xp, x_q), _flat(xp, x_kv)
    dw_q = xp.matrix_transpose(fq) @ _flat(xp, d_q)
    dw_k = xp.matrix_transpose(fkv) @ _flat(xp, d_k)
    dw_v = xp.matrix_transpose(fkv) @ _flat(xp, d_v)
    db = {
        name: (xp.sum(_flat(xp, d), axis=0) if getattr(w, name) is not None else None)
        for name, d in (("b_q", d_q), ("b_k", d_k), ("b_v", d_v))
    }
    dx_q = d_q @ xp.matrix_transpose(p["w_q"])  # [B, n_q, d_model]
    dx_kv = d_k @ xp.matrix_transpose(p["w_k"]) + d_v @ xp.matrix_transpose(p["w_v"])  # [B, n_k, d_kv]
    if result.x_kv is None:
        dx_q, dx_kv = dx_q + dx_kv, None
    grads = MultiHeadWeights(
        dw_q,
        dw_k,
        dw_v,
        dw_o,
        db["b_q"],
        db["b_k"],
        db["b_v"],
        db_o,
        num_heads=w.num_heads,
        num_kv_heads=w.num_kv_heads,
        head_dim=w.head_dim,
    )
    return MultiHeadGrads(dx_q=dx_q, dx_kv=dx_kv, weights=grads, dbias=g.dbias, heads=g)
