"""The same cases under NumPy, PyTorch (CPU) and array-api-strict: the core is written once, for all of them."""

import array_api_strict
import numpy as np
import pytest
import torch

import attnlab
from attnlab import masks
from attnlab._arrays import to_numpy


def _np(x):
    return np.asarray(x)


def _torch(x):
    return torch.from_numpy(np.ascontiguousarray(x))


def _strict(x):
    return array_api_strict.asarray(np.asarray(x))


LIBS = {"numpy": _np, "torch": _torch, "array_api_strict": _strict}

rng = np.random.default_rng(7)
CASES = {
    "2x2-causal": dict(
        q=np.eye(2),
        k=np.eye(2),
        v=np.array([[10.0, 0], [0, 20]]),
        kw=dict(causal=True),
    ),
    "cross-dv": dict(q=rng.normal(size=(2, 3, 4)), k=rng.normal(size=(2, 6, 4)), v=rng.normal(size=(2, 6, 5)), kw={}),
    "bottom-right": dict(
        q=rng.normal(size=(3, 4)), k=rng.normal(size=(5, 4)), v=rng.normal(size=(5, 2)), kw=dict(causal="bottom_right")
    ),
    "mask-bias-temp": dict(
        q=rng.normal(size=(2, 1, 4, 3)),
        k=rng.normal(size=(2, 2, 4, 3)),
        v=rng.normal(size=(1, 2, 4, 3)),
        kw=dict(temperature=2.0, scale=0.5),
        mask=masks.key_padding([4, 2], 4),
        bias=rng.normal(size=(2, 4, 4)),
    ),
    "masked-rows-zero": dict(
        q=rng.normal(size=(3, 2)),
        k=rng.normal(size=(3, 2)),
        v=rng.normal(size=(3, 2)),
        kw=dict(masked_rows="zero"),
        mask=np.array([[True, False, False], [False, False, False], [True, True, True]]),
    ),
}


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("case", CASES)
def test_same_result_in_every_library(lib, case):
    c = CASES[case]
    conv = LIBS[lib]
    extra = {}
    if "mask" in c:
        extra["mask"] = conv(c["mask"])
    if "bias" in c:
        extra["bias"] = conv(c["bias"])
    t = attnlab.attention_trace(conv(c["q"]), conv(c["k"]), conv(c["v"]), **extra, **c["kw"])
    ref = attnlab.attention_trace(c["q"], c["k"], c["v"], mask=c.get("mask"), bias=c.get("bias"), **c["kw"])
    assert type(t.output) is type(conv(c["q"]))
    for field in ("output", "weights", "logits", "lse", "allowed"):
        np.testing.assert_allclose(to_numpy(getattr(t, field)), getattr(ref, field), rtol=1e-12, atol=1e-14)
    assert t.masked_rows == ref.masked_rows


@pytest.mark.parametrize("lib", LIBS)
def test_converters_keep_the_library(lib):
    conv = LIBS[lib]
    additive = conv(np.array([[0.0, -np.inf], [-1e9, 0.0]]))
    m = masks.from_additive(additive)
    assert type(m) is type(additive)
    np.testing.assert_array_equal(to_numpy(m), [[True, False], [False, True]])
    np.testing.assert_array_equal(to_numpy(masks.from_blocked(m)), [[False, True], [True, False]])
    back = masks.to_additive(m)
    np.testing.assert_array_equal(to_numpy(back)[0], [0.0, np.finfo(np.float32).min])
