"""PyTorch attention implementations: correct ones (SDPA, nn.MultiheadAttention internals) and broken ones."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from attnlab import masks

from . import Entry


def _manual(q, k, v, allowed=None, scale=None):
    s = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    d = e.sum(dim=-1, keepdim=True)
    return torch.where(d > 0, e / d.clamp_min(torch.finfo(e.dtype).tiny), torch.zeros_like(e)) @ v


def correct(q, k, v, mask=None):
    """Correct manual PyTorch attention."""
    return _manual(q, k, v, mask)


class MHAWrapper:
    """Attention through nn.MultiheadAttention with identity projections: q, k, v [B, h, n, d] ->
    [B, n, h·d], the module splits heads itself. Masks are True = blocked ([B·h, n_q, n_k]); returns
    (out, per-head weights)."""

    __name__ = "mha_wrapper"

    def __call__(self, q, k, v, mask=None):
        if q.ndim != 4 or q.shape[-1] != v.shape[-1]:
            raise ValueError("mha_wrapper: expects [B, h, n, d] with d_v == d_k")
        b, h, n_q, d = q.shape
        e = h * d
        mha = torch.nn.MultiheadAttention(e, h, bias=False, batch_first=True, dtype=q.dtype)
        with torch.no_grad():
            mha.in_proj_weight.copy_(torch.eye(e, dtype=q.dtype).repeat(3, 1))
            mha.out_proj.weight.copy_(torch.eye(e, dtype=q.dtype))
        mha.eval()

        def merge(x):
            return x.transpose(1, 2).reshape(b, x.shape[2], e)  # [B, n, h·d]

        attn_mask = None if mask is None else mask.reshape(b * h, *mask.shape[-2:])
        with torch.no_grad():
            out, w = mha(
                merge(q), merge(k), merge(v), attn_mask=attn_mask, need_weights=True, average_attn_weights=False
            )
        return out.reshape(b, n_q, h, d).transpose(1, 2), w


def sdpa_math(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """PyTorch SDPA forced onto its math backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )


def sdpa_inverted(q, k, v, attn_mask=None, is_causal=False):
    """Passes a True = may attend mask to SDPA after 'converting' it as if it were True = blocked."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=None if attn_mask is None else ~attn_mask, is_causal=is_causal
    )


def view_not_transpose(q, k, v, mask=None):
    """Subtle: [B, n, h, d] -> [B, h, n, d] with .reshape instead of .transpose; right with one head."""
    b, _, h, _ = q.shape
    qq, kk, vv = (x.reshape(b, h, x.shape[1], x.shape[-1]) for x in (q, k, v))
    out = _manual(qq, kk, vv, mask)
    return out.transpose(1, 2)


def unstable(q, k, v, mask=None):
    """Subtle: torch.exp without subtracting the max."""
    e = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))
    if mask is not None:
        e = e * mask
    return e / e.sum(dim=-1, keepdim=True) @ v


def returns_float32(q, k, v, mask=None):
    """Subtle: computes half precision in float32 (good) but forgets to cast back for float16 / bfloat16 inputs."""
    if q.dtype in (torch.float16, torch.bfloat16):
        q, k, v = q.float(), k.float(), v.float()
    return _manual(q, k, v, mask)


def mul_in_place(q, k, v, mask=None):
    """Subtle: right output, but q.mul_(scale) writes into the caller's tensor."""
    q.mul_(1 / math.sqrt(q.shape[-1]))
    return _manual(q, k, v, mask, scale=1.0)


def triu_diagonal(q, k, v, mask=None, is_causal=False):
    """Causal mask built with triu(diagonal=2) instead of diagonal=1: one future token leaks."""
    allowed = mask
    if is_causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        future = torch.triu(torch.ones(n_q, n_k, dtype=torch.bool), diagonal=2)
        allowed = ~future if allowed is None else allowed & ~future
    return _manual(q, k, v, allowed)


def dropout_left_on(q, k, v, mask=None):
    """Dropout on the weights with training=True left on at inference."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=-1)
    w = torch.nan_to_num(w)
    return F.dropout(w, p=0.1, training=True) @ v


def returns_numpy(q, k, v, mask=None):
    """Subtle: right values, but hands back a NumPy array (.numpy()) where the caller expects a tensor."""
    return _manual(q, k, v, mask).numpy()


def softmax_nan(q, k, v, mask=None):
    """masked_fill(-inf) + torch.softmax: a fully masked row is NaN."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


# ------------------------------------------------------------------------------------ issue 13 §5: sharper names
def _scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def weights_half(q, k, v, mask=None):
    """``precision``: the weights are cast to half before ``@ V`` ("to save memory")."""
    s = _scores(q, k)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    attn = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return (attn.half() @ v.half()).to(q.dtype)


def scores_bfloat16(q, k, v, mask=None):
    """``precision``: the scores are computed in bfloat16 (an autocast left on by hand)."""
    s = (q.bfloat16() @ k.bfloat16().transpose(-2, -1)).to(q.dtype) / math.sqrt(q.shape[-1])
    return _manual_from_scores(s, v, mask)


def _manual_from_scores(s, v, mask):
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v


def hf_softmax_float32(q, k, v, mask=None):
    """Correct (a ``lower-precision`` note for float64): Hugging Face's eager softmax, upcast to float32 (the
    fill is one float32 can hold, so that a fully masked row stays finite after the cast)."""
    s = _scores(q, k)
    if mask is not None:
        s = s.masked_fill(~mask, max(torch.finfo(s.dtype).min, torch.finfo(torch.float32).min))
    return torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype) @ v


def einsum_scale_after(q, k, v, mask=None):
    """``scale-after-softmax``: einsum scores, softmax, then the weights multiplied by the scale."""
    sim = torch.einsum("bhid,bhjd->bhij", q, k)
    if mask is not None:
        sim = sim.masked_fill(~mask, float("-inf"))
    attn = sim.softmax(dim=-1).nan_to_num(0.0) * q.shape[-1] ** -0.5
    return torch.einsum("bhij,bhjd->bhid", attn, v)


def softmax_heads_and_keys(q, k, v, mask=None):
    """``softmax-axis``: einops rearrange puts heads and keys on one axis before the softmax."""
    from einops import rearrange

    s = _scores(q, k)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    h = s.shape[1]
    attn = rearrange(rearrange(s, "b h i j -> b i (h j)").softmax(dim=-1), "b i (h j) -> b h i j", h=h)
    return attn.nan_to_num(0.0) @ v


def masked_fill_after_softmax(q, k, v, mask=None):
    """``fill-after-softmax``: masked_fill(-inf) on the weights instead of the scores."""
    attn = _scores(q, k).softmax(dim=-1)
    if mask is not None:
        attn = attn.masked_fill(~mask, float("-inf"))
    return attn @ v


def masked_fill_1e4(q, k, v, mask=None):
    """Subtle ``finite-fill``: masked_fill(~mask, -1e4), right unless the scores are large."""
    s = _scores(q, k)
    if mask is not None:
        s = s.masked_fill(~mask, -1e4)
    return torch.softmax(s, dim=-1) @ v


def causal_only_fill_1e5(q, k, v):
    """``finite-fill``: an always-causal layer whose future scores are set to -1e5 with torch.where, right
    unless the scores are large."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    future = torch.ones(n_q, n_k, dtype=torch.bool).triu(1)
    s = torch.where(future, torch.tensor(-1e5, dtype=q.dtype), _scores(q, k))
    return torch.softmax(s, dim=-1) @ v


def causal_only_neg_1e9(q, k, v):
    """``finite-fill``: a registered lower-triangular buffer, masked_fill(bias == 0, -1e9)."""
    n = q.shape[-2]
    bias = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
    s = _scores(q, k).masked_fill(bias == 0, -1e9)
    return F.softmax(s, dim=-1) @ v


def masked_fill_wrong_arguments(q, k, v, mask=None):
    """``crash``: torch.masked_fill called with the value left out, a TypeError naming masked_fill (not a clean
    refusal of the mask, whatever its message says)."""
    s = _scores(q, k)
    if mask is not None:
        s = torch.masked_fill(s, ~mask)
    return torch.softmax(s, dim=-1) @ v


def sdpa_decode_is_causal(q, k, v, causal=False):
    """``causal-alignment`` with ``causal_align="bottom_right"``: a decode step through SDPA's is_causal, which is
    top-left, so the new queries miss the cached keys."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))


def bert_additive_10000(q, k, v, attention_mask=None):
    """Subtle ``finite-fill``: the older BERT extended mask, (1.0 - mask) * -10000.0 added to the scores."""
    s = _scores(q, k)
    if attention_mask is not None:
        s = s + (1.0 - attention_mask.to(s.dtype)) * -10000.0
    return torch.softmax(s, dim=-1) @ v


def hf_additive_finfo_min(q, k, v, attention_mask=None):
    """Correct: Hugging Face's additive mask, (1.0 - mask) * finfo(dtype).min (finfo(float16).min in float16)."""
    s = _scores(q, k)
    if attention_mask is not None:
        s = s + (1.0 - attention_mask.to(s.dtype)) * torch.finfo(s.dtype).min
    return torch.softmax(s, dim=-1) @ v


def finfo_min_fill(q, k, v, mask=None):
    """Correct: masked_fill(~mask, finfo(dtype).min); fully masked rows are a uniform average."""
    s = _scores(q, k)
    if mask is not None:
        s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
    return torch.softmax(s, dim=-1) @ v


def _flat_heads(q, k, v, mask, expand):
    b, h, n_q, _ = q.shape
    qf, kf, vf = (x.reshape(b * h, x.shape[-2], x.shape[-1]) for x in (q, k, v))
    m = None if mask is None else expand(mask, h).reshape(b * h, *mask.shape[-2:])
    return _manual(qf, kf, vf, m).reshape(b, h, n_q, v.shape[-1])


def batch_mask_repeat(q, k, v, mask=None):
    """``mask-wrong-heads``: a per-batch mask [B, 1, n_q, n_k] expanded to B·h with .repeat (tile) while the
    inputs are flattened batch-major ([B, h] -> [B·h])."""
    return _flat_heads(q, k, v, mask, lambda m, h: m.repeat(h, 1, 1, 1))


def batch_mask_repeat_interleave(q, k, v, mask=None):
    """Correct: the same with repeat_interleave."""
    return _flat_heads(q, k, v, mask, lambda m, h: m.repeat_interleave(h, dim=0))


def sdpa_causal_shortcut(q, k, v, attn_mask=None):
    """``causal-alignment``: a mask equal to tril(ones(n_q, n_k)) is 'recognised' as causal and replaced by the
    flash-attn convention (bottom-right), so a given top-left mask leaks the future when n_k > n_q."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    if attn_mask is not None and n_q != n_k:
        top_left = torch.ones(n_q, n_k, dtype=torch.bool).tril()
        if torch.equal(attn_mask, top_left.expand_as(attn_mask)):
            attn_mask = torch.ones(n_q, n_k, dtype=torch.bool).tril(diagonal=n_k - n_q)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


def kv_loop_v0(q, k, v, mask=None):
    """``batch-leak``: a per-sequence loop whose values are v[0] for every sequence (an index typo)."""
    outs = []
    for b in range(q.shape[0]):
        m = None if mask is None else mask.expand(*q.shape[:-1], k.shape[-2])[b]
        outs.append(_manual(q[b], k[b], v[0], m))
    return torch.stack(outs)


def head_loop_head0(q, k, v, mask=None):
    """``batch-leak``: a per-head loop that reads K/V head 0 for every head (a multi-query shortcut)."""
    outs = []
    for i in range(q.shape[1]):
        m = None if mask is None else mask.expand(*q.shape[:-1], k.shape[-2])[:, i]
        outs.append(_manual(q[:, i], k[:, 0], v[:, 0], m))
    return torch.stack(outs, dim=1)


def kv_loop(q, k, v, mask=None):
    """Correct: the per-sequence loop with k[b], v[b]."""
    outs = []
    for b in range(q.shape[0]):
        m = None if mask is None else mask.expand(*q.shape[:-1], k.shape[-2])[b]
        outs.append(_manual(q[b], k[b], v[b], m))
    return torch.stack(outs)


def gqa_einops_tile(q, k, v, mask=None):
    """``gqa-mapping``: einops repeat 'b h n d -> b (g h) n d' tiles the K/V heads (i % h_kv)."""
    from einops import repeat

    g = q.shape[1] // k.shape[1]
    k, v = (repeat(x, "b h n d -> b (g h) n d", g=g) for x in (k, v))
    return _manual(q, k, v, mask)


def gqa_einops_interleave(q, k, v, mask=None):
    """Correct GQA with einops: 'b h n d -> b (h g) n d' (i // group)."""
    from einops import repeat

    g = q.shape[1] // k.shape[1]
    k, v = (repeat(x, "b h n d -> b (h g) n d", g=g) for x in (k, v))
    return _manual(q, k, v, mask)


def two_bugs(q, k, v, mask=None):
    """Two bugs: the scores are divided by d_k (not sqrt(d_k)), and the mask is applied after the softmax."""
    attn = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1], dim=-1)
    if mask is not None:
        attn = attn * mask
    return attn @ v


def out_like_q(q, k, v, mask=None):
    """``crash``: the output buffer is allocated like q (torch.empty_like(q)): breaks when d_v != d_k."""
    out = torch.empty_like(q)
    out.copy_(_manual(q, k, v, mask))
    return out


def causal_mod_backwards(b, h, q_idx, kv_idx):
    """A flex mask_mod meant as causal that reads the rule the wrong way round (each query sees its future)."""
    return kv_idx >= q_idx


def window_mod_lt(b, h, q_idx, kv_idx):
    """A sliding-window mask_mod meant to reach 3 keys back (attnlab.masks.window(left=3)) with ``<`` for ``<=``."""
    return (kv_idx <= q_idx) & (q_idx - kv_idx < 3)


def window_3(n_q, n_k):
    """The dense rule the window mod claims: 3 keys back, causal, top-left."""
    return masks.window(n_q, n_k, left=3, align="top_left")


ENTRIES = [
    Entry("torch-correct", correct),
    Entry("torch-sdpa", F.scaled_dot_product_attention, options={"gqa": True}),
    Entry("torch-sdpa-math", sdpa_math, options={"gqa": True}),
    Entry("torch-mask-inverted", sdpa_inverted, ("mask-inverted",)),
    Entry(
        "torch-view-not-transpose",
        view_not_transpose,
        ("batch-leak",),
        options={"layout": "bnhd"},
        also=("causal-leak", "padding-leak"),
        subtle=True,
    ),
    Entry("torch-unstable", unstable, ("unstable-softmax",), also=("padding-leak", "masked-row-nan"), subtle=True),
    Entry("torch-returns-float32", returns_float32, ("dtype",), subtle=True),
    Entry("torch-mul-in-place", mul_in_place, ("mutates-input",), subtle=True),
    # also reference-mismatch: on the rectangular causal case triu(diagonal=2) matches neither alignment
    Entry("torch-triu-diagonal", triu_diagonal, ("causal-leak",), also=("reference-mismatch",), subtle=True),
    Entry("torch-returns-numpy", returns_numpy, ("output-type",), subtle=True),
    Entry("torch-dropout", dropout_left_on, ("nondeterministic",), also=("not-normalized",)),
    Entry("torch-softmax-nan", softmax_nan, ("masked-row-nan",)),
    # issue 13 §5
    Entry("torch-hf-softmax-float32", hf_softmax_float32),
    Entry("torch-hf-additive-finfo-min", hf_additive_finfo_min),
    Entry("torch-finfo-min-fill", finfo_min_fill),
    Entry("torch-batch-mask-repeat-interleave", batch_mask_repeat_interleave, options={"mask_form": "batch"}),
    Entry("torch-kv-loop", kv_loop),
    Entry("torch-gqa-einops-interleave", gqa_einops_interleave, options={"gqa": True}),
    Entry("torch-weights-half", weights_half, ("precision",)),
    Entry("torch-scores-bfloat16", scores_bfloat16, ("precision",)),
    Entry("torch-einsum-scale-after", einsum_scale_after, ("scale-after-softmax",)),
    Entry("torch-softmax-heads-and-keys", softmax_heads_and_keys, ("softmax-axis",)),
    Entry("torch-fill-after-softmax", masked_fill_after_softmax, ("fill-after-softmax",)),
    Entry("torch-masked-fill-1e4", masked_fill_1e4, ("finite-fill",), subtle=True),
    Entry("torch-bert-additive-10000", bert_additive_10000, ("finite-fill",), subtle=True),
    Entry(
        "torch-causal-only-fill-1e5",
        causal_only_fill_1e5,
        ("finite-fill",),
        options={"causal_only": True, "ranks": (4,)},
    ),
    Entry(
        "torch-causal-buffer-1e9",
        causal_only_neg_1e9,
        ("finite-fill",),
        options={"causal_only": True, "ranks": (4,)},
    ),
    Entry("torch-masked-fill-wrong-arguments", masked_fill_wrong_arguments, ("crash",)),
    Entry(
        "torch-sdpa-decode-is-causal",
        sdpa_decode_is_causal,
        ("causal-alignment",),
        options={"causal_align": "bottom_right", "causal_arg": "causal"},
        subtle=True,
    ),
    Entry(
        "torch-batch-mask-repeat", batch_mask_repeat, ("mask-wrong-heads",), options={"mask_form": "batch"}, subtle=True
    ),
    Entry("torch-sdpa-causal-shortcut", sdpa_causal_shortcut, ("causal-alignment",), subtle=True),
    Entry("torch-kv-loop-v0", kv_loop_v0, ("batch-leak",), subtle=True),
    Entry("torch-head-loop-head0", head_loop_head0, ("batch-leak",), options={"ranks": (4,)}),
    Entry("torch-gqa-einops-tile", gqa_einops_tile, ("gqa-mapping",), options={"gqa": True}, subtle=True),
    Entry("torch-two-bugs", two_bugs, ("scale-wrong", "mask-after-softmax")),
    Entry("torch-out-like-q", out_like_q, ("crash",), subtle=True),
    Entry(
        "torch-flex-mask-mod-backwards",
        flex_attention,
        ("mod-mismatch",),
        options={"mask_mod": causal_mod_backwards, "claims": "causal", "probes": ("mods",)},
    ),
    Entry(
        "torch-flex-window-off-by-one",
        flex_attention,
        ("mod-mismatch",),
        options={"mask_mod": window_mod_lt, "claims": window_3, "probes": ("mods",)},
        subtle=True,
    ),
]
