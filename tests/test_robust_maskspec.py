"""Every kernel reads every field of :class:`~attnlab.masks.MaskSpec` as the dense core does.

A generated spec (causal with either alignment or a per-sequence ``q_offset``, a window with either side open,
key lengths, query lengths, segments, a dense part) goes through the dense core, the tiled forward at random block
sizes and its backward, the ring at one rank and the KV cache (the fields each of those takes). The reference mask is
built here from the fields, by this file's own loops (not through ``MaskSpec``), and the reference attention is a
float64 softmax with torch autograd for the gradients. Under ``masked_rows="zero"`` a row with no allowed key is 0
(gradients 0); under the default ``"raise"`` every kernel raises :class:`~attnlab.errors.MaskedRowError` exactly when
such a row exists.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlab
from attnlab.errors import MaskedRowError
from attnlab.kernels import KVCache, cached_attention, flash_attention, flash_attention_backward
from attnlab.kernels.config import override
from attnlab.masks import MaskSpec

SETTINGS = settings(max_examples=int(os.environ.get("ATTNLAB_ROBUST_EXAMPLES", "40")), deadline=None)
HUGE = 2**63 - 1  # the largest int64: a window side this wide once wrapped around in MaskSpec.empty_rows


def _allowed(fields: dict, B: int, n_q: int, n_k: int) -> np.ndarray:
    """``[B, n_q, n_k]`` True = may attend, from the spec's fields by plain loops (the reference)."""
    out = np.zeros((B, n_q, n_k), dtype=bool)
    causal = fields.get("causal", False)
    offsets = fields.get("q_offset")
    for b in range(B):
        if offsets is not None:
            shift = offsets[b]
        else:
            shift = n_k - n_q if causal == "bottom_right" else 0
        for i in range(n_q):
            p = shift + i  # the query's key position
            for j in range(n_k):
                ok = True
                if causal and j > p:
                    ok = False
                if "window" in fields:
                    left, right = fields["window"]
                    if left is not None and j < p - left:
                        ok = False
                    if right is not None and j > p + right:
                        ok = False
                if "key_lengths" in fields and j >= fields["key_lengths"][b]:
                    ok = False
                if "query_lengths" in fields and i >= fields["query_lengths"][b]:
                    ok = False
                if "segments" in fields:
                    qs, ks = fields["segments"]
                    if qs[b, i] != ks[b, j]:
                        ok = False
                if "dense" in fields and not fields["dense"][b, 0, i, j]:
                    ok = False
                out[b, i, j] = ok
    return out


@st.composite
def specs(draw, *, parts=("causal", "window", "key_lengths", "query_lengths", "segments", "dense")):
    """``(fields, B, n_q, n_k)``: the keywords of a MaskSpec over those parts, and the sizes it fits."""
    B = draw(st.integers(1, 3), label="B")
    n_q, n_k = draw(st.integers(1, 9), label="n_q"), draw(st.integers(1, 9), label="n_k")
    fields: dict = {}
    if "causal" in parts:
        kind = draw(st.sampled_from(["none", "top_left", "bottom_right", "q_offset"] + ([True] if n_q == n_k else [])))
        if kind == "q_offset":
            fields["causal"] = True
            fields["q_offset"] = draw(st.lists(st.integers(0, 6), min_size=B, max_size=B), label="q_offset")
        elif kind != "none":
            fields["causal"] = kind
    side = st.one_of(st.none(), st.integers(0, 5), st.just(HUGE))
    if "window" in parts and draw(st.booleans(), label="window?"):
        fields["window"] = (draw(side, label="left"), draw(side, label="right"))
        if "causal" not in fields and n_q != n_k:
            fields["causal"] = "top_left"  # a window over n_q != n_k must be placed
    for name, n in (("key_lengths", n_k), ("query_lengths", n_q)):
        if name in parts and draw(st.booleans(), label=f"{name}?"):
            fields[name] = draw(st.lists(st.integers(0, n), min_size=B, max_size=B), label=name)
    rng = np.random.default_rng(draw(st.integers(0, 2**16), label="seed"))
    if "segments" in parts and draw(st.booleans(), label="segments?"):
        fields["segments"] = (np.sort(rng.integers(0, 3, (B, n_q))), np.sort(rng.integers(0, 3, (B, n_k))))
    if "dense" in parts and draw(st.booleans(), label="dense?"):
        fields["dense"] = rng.random((B, 1, n_q, n_k)) < 0.75
    return fields, B, n_q, n_k


def _inputs(B, n_q, n_k, seed, h=2, d=3, d_v=2):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((B, h, n_q, d)),
        rng.standard_normal((B, h, n_k, d)),
        rng.standard_normal((B, h, n_k, d_v)),
    )


def _reference(q, k, v, allowed, d_out):
    """Float64 attention over ``allowed [B, n_q, n_k]`` (empty rows 0), and its gradients by torch autograd."""
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    s = tq @ tk.transpose(-1, -2) / np.sqrt(q.shape[-1])
    s = s.masked_fill(~torch.tensor(allowed)[:, None], -torch.inf)
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row of -inf: NaN, which is the empty row's 0 here
    out = w @ tv
    out.backward(torch.tensor(d_out))
    return out.detach().numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()


@SETTINGS
@given(case=specs(), blocks=st.tuples(st.integers(1, 10), st.integers(1, 10)), seed=st.integers(0, 2**16))
def test_core_and_tiled_kernel_read_every_maskspec_field(case, blocks, seed):
    fields, B, n_q, n_k = case
    spec = MaskSpec(**fields)
    allowed = _allowed(fields, B, n_q, n_k)
    empty = ~allowed.any(axis=-1)  # [B, n_q]
    q, k, v = _inputs(B, n_q, n_k, seed)
    d_out = np.random.default_rng(seed + 1).standard_normal((B, 2, n_q, 2))
    ref, dq, dk, dv = _reference(q, k, v, allowed, d_out)
    core = attnlab.scaled_dot_product_attention(q, k, v, mask=spec, masked_rows="zero")
    flash = flash_attention(q, k, v, mask=spec, masked_rows="zero", block_q=blocks[0], block_k=blocks[1])
    np.testing.assert_allclose(core, ref, atol=1e-12)
    np.testing.assert_allclose(flash.output, ref, atol=1e-12)
    assert not flash.output[np.broadcast_to(empty[:, None], flash.output.shape[:-1])].any()  # exactly 0
    assert np.array_equal(np.isneginf(flash.lse), np.broadcast_to(empty[:, None], flash.lse.shape))
    grads = flash_attention_backward(flash, d_out)
    for got, want in ((grads.dq, dq), (grads.dk, dk), (grads.dv, dv)):
        np.testing.assert_allclose(got, want, atol=1e-11)
    if empty.any():  # the default policy: both refuse, naming the rows
        for call in (
            lambda: attnlab.scaled_dot_product_attention(q, k, v, mask=spec),
            lambda: flash_attention(q, k, v, mask=spec, block_q=blocks[0], block_k=blocks[1]),
        ):
            with pytest.raises(MaskedRowError) as err:
                call()
            b, i = (int(x) for x in np.argwhere(empty)[0])
            assert err.value.rows[0] == (b, 0, i)
    else:
        np.testing.assert_allclose(attnlab.scaled_dot_product_attention(q, k, v, mask=spec), ref, atol=1e-12)
        np.testing.assert_allclose(flash_attention(q, k, v, mask=spec).output, ref, atol=1e-12)


def test_flash_attention_zeroes_padded_query_rows():
    """The fuzzing report's case: query_lengths=[3] over six queries (rows 3.. were real outputs)."""
    x = np.random.default_rng(0).standard_normal((6, 4))
    spec = MaskSpec(query_lengths=[3])
    out = flash_attention(x, x, x, mask=spec, masked_rows="zero").output
    assert not out[3:].any()
    np.testing.assert_allclose(out, attnlab.scaled_dot_product_attention(x, x, x, mask=spec, masked_rows="zero"))
    with pytest.raises(MaskedRowError):
        flash_attention(x, x, x, mask=spec)


@SETTINGS
@given(case=specs(parts=("causal", "window", "key_lengths", "query_lengths", "segments")))
def test_empty_rows_and_structure_agree_for_any_window(case):
    """``MaskSpec.empty_rows`` (what the ring reads) is the rows with no allowed key, windows of 2**63 - 1 included."""
    fields, B, n_q, n_k = case
    spec = MaskSpec(**fields).sized(n_q, n_k, B)
    allowed = _allowed(fields, B, n_q, n_k)
    assert np.array_equal(np.broadcast_to(spec.empty_rows(), (B, n_q)), ~allowed.any(axis=-1))
    assert np.array_equal(spec.to_array((B, n_q, n_k)), allowed)


def test_a_window_of_the_largest_int64_hides_nothing():
    spec = MaskSpec(window=(HUGE, HUGE)).sized(4, 4)
    assert not spec.empty_rows().any()
    assert spec.structure().all()
    x = np.eye(4)
    everything = attnlab.scaled_dot_product_attention(x, x, x, causal=True)  # window=HUGE: (HUGE, 0), causal
    np.testing.assert_allclose(flash_attention(x, x, x, window=HUGE).output, everything, atol=1e-15)
    both = MaskSpec(window=(HUGE, HUGE))
    np.testing.assert_allclose(
        flash_attention(x, x, x, mask=both).output, attnlab.scaled_dot_product_attention(x, x, x)
    )


@SETTINGS
@given(
    case=specs(parts=("causal", "key_lengths", "query_lengths")), blocks=st.tuples(st.integers(1, 6), st.integers(1, 6))
)
def test_ring_at_one_rank_reads_its_maskspec_fields(case, blocks):
    from attnlab.distributed import ring_attention_forward

    fields, B, n_q, _ = case
    n_k = n_q  # the ring shards one sequence: n_q == n_k (a q_offset is not one of its options: plain causal)
    fields = {name: value for name, value in fields.items() if name != "q_offset"}
    if "key_lengths" in fields:
        fields["key_lengths"] = [min(x, n_k) for x in fields["key_lengths"]]
    allowed = _allowed(fields, B, n_q, n_k)
    empty = ~allowed.any(axis=-1)
    q, k, v = _inputs(B, n_q, n_k, B * 100 + n_q)
    ref, *_ = _reference(q, k, v, allowed, np.zeros((B, 2, n_q, 2)))
    tq, tk, tv = (torch.tensor(x) for x in (q, k, v))
    kw = {name: fields[name] for name in ("causal", "key_lengths", "query_lengths") if name in fields}
    r = ring_attention_forward(tq, tk, tv, **kw, masked_rows="zero", block_q=blocks[0], block_k=blocks[1])
    np.testing.assert_allclose(r.output.numpy(), ref, atol=1e-12)
    if empty.any():
        with pytest.raises(MaskedRowError):
            ring_attention_forward(tq, tk, tv, **kw)


@SETTINGS
@given(
    lengths=st.lists(st.integers(0, 7), min_size=1, max_size=3),
    t=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    tiled=st.booleans(),
)
def test_kv_cache_equals_the_core_with_the_spec_it_builds(lengths, t, seed, tiled):
    """A step's attention is the core's over ``MaskSpec(causal=True, q_offset=, key_lengths=, query_lengths=)`` with
    padded queries 0, on the dense path and on the tiled one (``dense_limit=0``)."""
    B = len(lengths)
    rng = np.random.default_rng(seed)
    cache = KVCache(B, 1, 3, dtype=np.float64)
    before = rng.integers(0, 5, B)  # tokens already cached
    n0 = int(before.max())
    if n0:
        cache.append(rng.standard_normal((B, 1, n0, 3)), rng.standard_normal((B, 1, n0, 3)), lengths=before)
    new = np.minimum(np.array(lengths), t)  # tokens this step appends, of t
    cache.append(rng.standard_normal((B, 1, t, 3)), rng.standard_normal((B, 1, t, 3)), lengths=new)
    q = rng.standard_normal((B, 2, t, 3))
    if not cache.lengths.any():  # nothing cached: this step appended no token, so every query is padding: 0
        with override(dense_limit=0 if tiled else 1 << 22):
            np.testing.assert_array_equal(cached_attention(q, cache, masked_rows="zero"), np.zeros((B, 2, t, 3)))
        return
    L = int(cache.lengths.max())
    keys, values = cache.keys[:, :, :L].astype(np.float64), cache.values[:, :, :L].astype(np.float64)
    fields = {"causal": True, "q_offset": list(before), "key_lengths": list(cache.lengths), "query_lengths": list(new)}
    allowed = _allowed(fields, B, t, L)
    ref, *_ = _reference(q, np.repeat(keys, 2, axis=1), np.repeat(values, 2, axis=1), allowed, np.zeros((B, 2, t, 3)))
    with override(dense_limit=0 if tiled else 1 << 22):
        got = cached_attention(q, cache, masked_rows="zero")
    np.testing.assert_allclose(got, ref, atol=1e-12)
