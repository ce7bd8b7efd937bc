"""Any callable, checked as it is: partial, bound methods, instances, classes, nn.Modules, lambdas through other
libraries, jax.jit; framework detection says why, and falls back to the other framework before blaming."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from zoo import numpy_zoo as npz

from attnlab.checker import check
from attnlab.checker.callables import detect_framework

F = torch.nn.functional

FAST = {"probes": ("reference", "causal", "padding", "masked-rows"), "dtypes": ("float64", "float32")}


def sdpa_like(q, k, v, attn_mask=None, *, scale=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)


class Callable:
    def __call__(self, q, k, v, attn_mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)

    def attend(self, q, k, v, attn_mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


class Attend(torch.nn.Module):
    """A layer taking q, k, v (as x-transformers' Attend): called as it is."""

    def forward(self, q, k, v, mask=None):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, -torch.finfo(s.dtype).max)
        return s.softmax(-1) @ v


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda: functools.partial(sdpa_like, scale=None), "a functools.partial of sdpa_like"),
        (lambda: Callable(), "an instance of Callable with __call__"),
        (lambda: Callable().attend, "a bound method Callable.attend"),
        (lambda: Callable, "a class (Callable), instantiated with no arguments"),
        (lambda: Attend(), "a torch.nn.Module (Attend)"),
        (
            lambda: lambda q, k, v, attn_mask=None: F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask),
            "a lambda",
        ),
    ],
)
def test_callables_are_checked_as_they_are(make, kind):
    r = check(make(), **FAST)
    assert r.ok, r.to_text()
    assert r.framework == "torch" and r.kind == kind
    assert r.as_dict()["detected"] == r.detected and r.detected.startswith("torch: ")


def test_detection_says_why():
    assert detect_framework(Attend()).reason == "a torch.nn.Module (Attend)"
    assert detect_framework(sdpa_like).reason == "its code uses F (module torch.nn.functional)"
    assert detect_framework(npz.correct).framework == "numpy"
    # a partial over a tensor argument, a method of an object holding a tensor
    bias = torch.zeros(1)
    assert detect_framework(functools.partial(npz.correct, mask=bias)).reason.startswith("partial mask= is a torch")


def test_code_that_reaches_torch_through_another_library():
    from transformers.models.llama.modeling_llama import repeat_kv

    def through_transformers(q, k, v):  # no torch name in its own code: repeat_kv's module imports torch
        return repeat_kv(k, q.shape[1] // k.shape[1])

    d = detect_framework(through_transformers)
    assert d.framework == "torch", d
    assert d.reason == ("its code uses repeat_kv from transformers.models.llama.modeling_llama, which imports torch"), d


def test_falls_back_to_the_other_framework_before_blaming():
    def duck(q, k, v, mask=None):  # only tensors have .softmax and .masked_fill: NumPy makes every call fail
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, -math.inf)
        return s.softmax(-1).nan_to_num(0.0) @ v

    r = check(duck, **FAST)
    assert r.framework == "torch" and r.codes == (), r.to_text()
    assert "every call failed in numpy" in r.detected
    assert "framework torch: detected numpy" in r.to_text()
    # declared, no fallback: the function is blamed for what it was asked to do
    r = check(duck, framework="numpy", probes=("reference",))
    assert r.codes == ("crash",)


def test_jax_jit_function():
    import jax

    jitted = jax.jit(jax.nn.dot_product_attention)
    d = detect_framework(jitted)
    assert d.framework == "jax", d


def test_a_class_that_needs_arguments_is_a_usage_error():
    from attnlab.checker import UsageError

    class Needs:
        def __init__(self, dim):
            self.dim = dim

        def __call__(self, q, k, v):
            return q

    with pytest.raises(UsageError, match="cannot be instantiated without arguments"):
        check(Needs)


def test_check_causal_lm_gives_a_torch_callable_torch_token_ids():
    from attnlab.checker.model import check_causal_lm

    emb = torch.nn.Embedding(50, 8)

    def logits(ids):  # indexing an Embedding with NumPy raises TypeError
        e = emb(ids)
        return torch.cumsum(e, 1) / torch.arange(1, ids.shape[1] + 1)[None, :, None]

    r = check_causal_lm(lambda ids: logits(ids), vocab_size=50)
    assert r.ok and r.codes == (), r.to_text()

    def numpy_lm(ids):
        assert isinstance(ids, np.ndarray)
        return np.cumsum(np.eye(50)[ids], axis=1)

    assert check_causal_lm(numpy_lm, vocab_size=50).ok
