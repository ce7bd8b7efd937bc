"""Names a user can find, and what they do with bad input: init_multi_head, attnlab.dropout, weights_io's exporters and
importers, and the public API of attnlab.models (MiniLM, SmolLM2), property-based where the input space is large.

Every bad input must raise a named attnlab error (OptionError, ShapeError, DTypeError, MaskError), never a bare
traceback from inside; every good one must round-trip exactly.
"""

from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnlab
import attnlab.models
from attnlab import weights_io
from attnlab.errors import AttnlabError, DTypeError, MaskError, OptionError, RangeError, ShapeError

DOCS = Path(__file__).resolve().parents[1] / "docs" / "models.md"
FEW = settings(max_examples=15, deadline=None)
FIXTURE = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def layouts(draw, *, cross=True):
    """(d_model, num_heads, num_kv_heads, head_dim, d_kv) of any layout MultiHeadWeights holds."""
    h_kv = draw(st.integers(1, 3))
    h = h_kv * draw(st.integers(1, 3))
    d = draw(st.integers(1, 5))
    d_model = draw(st.integers(1, 12))
    d_kv = draw(st.one_of(st.none(), st.integers(1, 9))) if cross else None
    return d_model, h, h_kv, d, d_kv


def _weights(layout, seed, *, bias_std=0.5, bias=True, dtype=np.float64):
    d_model, h, h_kv, d, d_kv = layout
    return attnlab.init_multi_head(
        d_model,
        h,
        num_kv_heads=h_kv,
        head_dim=d,
        d_kv=d_kv,
        bias=bias,
        bias_std=bias_std if bias else 0.0,
        rng=np.random.default_rng(seed),
        dtype=dtype,
    )


def _equal(a, b):
    assert (a.num_heads, a.num_kv_heads, a.head_dim) == (b.num_heads, b.num_kv_heads, b.head_dim)
    assert set(a.arrays()) == set(b.arrays())
    for name, x in a.arrays().items():
        np.testing.assert_array_equal(getattr(b, name), x, err_msg=name)


# ---------------------------------------------------------------------------------------------------------------
# init_multi_head


@FEW
@given(
    layout=layouts(),
    seed=st.integers(0, 2**16),
    bias_std=st.floats(0.0, 2.0),
    dtype=st.sampled_from(["f2", "f4", "f8"]),
)
def test_init_multi_head_shapes_dtype_and_seeded_biases(layout, seed, bias_std, dtype):
    d_model, h, h_kv, d, d_kv = layout
    w = _weights(layout, seed, bias_std=bias_std, dtype=np.dtype(dtype))
    d_kv = d_model if d_kv is None else d_kv
    assert w.w_q.shape == (d_model, h * d) and w.w_k.shape == (d_kv, h_kv * d) and w.w_o.shape == (h * d, d_model)
    assert w.b_q.shape == (h * d,) and w.b_k.shape == (h_kv * d,) and w.b_o.shape == (d_model,)
    assert all(a.dtype == np.dtype(dtype) for a in w.arrays().values())
    plain = _weights(layout, seed, bias_std=0.0, dtype=np.dtype(dtype))
    for name in ("w_q", "w_k", "w_v", "w_o"):  # the biases are drawn after the weights: same seed, same weights
        np.testing.assert_array_equal(getattr(w, name), getattr(plain, name))
    assert all((getattr(plain, b) == 0).all() for b in ("b_q", "b_k", "b_v", "b_o"))
    biases = np.concatenate([w.b_q, w.b_k, w.b_v, w.b_o]).astype(np.float64)
    assert np.isfinite(biases).all()
    if bias_std > 0.01:
        assert (biases != 0).any()
        assert np.abs(biases).max() <= 10 * bias_std  # N(0, bias_std²): 10 sigma is never reached here


def test_init_multi_head_biases_are_normal_with_bias_std():
    w = attnlab.init_multi_head(256, 8, bias_std=0.2, rng=np.random.default_rng(0))
    b = np.concatenate([w.b_q, w.b_k, w.b_v, w.b_o])  # 1024 draws: the std within 10 %
    assert abs(b.std() - 0.2) < 0.02 and abs(b.mean()) < 0.02
    x = np.random.default_rng(1).standard_normal((1, 3, 256))
    zero = attnlab.init_multi_head(256, 8, rng=np.random.default_rng(0))
    diff = attnlab.multi_head_attention(x, None, w).output - attnlab.multi_head_attention(x, None, zero).output
    assert np.abs(diff).max() > 0.1  # the biases take part in the layer


@pytest.mark.parametrize("dtype", [np.int64, "int32", np.uint8, bool, np.complex128, np.longdouble, "U4", object])
def test_init_multi_head_refuses_non_float_dtypes(dtype):
    with pytest.raises(DTypeError, match=r"^dtype: expected a floating dtype: np\.float16, np\.float32"):
        attnlab.init_multi_head(8, 2, rng=np.random.default_rng(0), dtype=dtype)


def test_init_multi_head_refuses_integers_by_name_and_takes_bfloat16():
    with pytest.raises(DTypeError, match=r"got int64 \(integer or boolean weights would round every Xavier value"):
        attnlab.init_multi_head(8, 2, rng=np.random.default_rng(0), dtype=np.int64)
    with pytest.raises(DTypeError, match=r"dtype: .*got torch\.float32"):
        attnlab.init_multi_head(8, 2, rng=np.random.default_rng(0), dtype=torch.float32)
    w = attnlab.init_multi_head(8, 2, bias_std=0.1, rng=np.random.default_rng(0), dtype="bfloat16")
    assert str(w.w_q.dtype) == "bfloat16" and str(w.b_o.dtype) == "bfloat16"
    out = attnlab.multi_head_attention(np.ones((1, 2, 8), dtype=w.w_q.dtype), None, w).output
    assert str(out.dtype) == "bfloat16"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"d_model": 0}, OptionError, r"d_model: expected an int >= 1, got 0"),
        ({"d_model": 8.0}, OptionError, r"d_model: expected an int >= 1, got 8\.0"),
        ({"num_heads": True}, OptionError, r"num_heads: expected an int >= 1, got True"),
        ({"num_kv_heads": -1}, OptionError, r"num_kv_heads: expected an int >= 1, got -1"),
        ({"head_dim": "4"}, OptionError, r"head_dim: expected an int >= 1, got '4'"),
        ({"d_kv": 0}, OptionError, r"d_kv: expected an int >= 1, got 0"),
        ({"bias": "yes"}, OptionError, r"bias: expected one of True, False, got 'yes'"),
        ({"bias_std": -0.1}, OptionError, r"bias_std: expected a finite number >= 0\.0, got -0\.1"),
        ({"bias_std": float("nan")}, OptionError, r"bias_std: expected a finite number"),
        ({"bias_std": 0.1, "bias": False}, OptionError, r"bias_std=0\.1 draws biases, but bias=False"),
        ({"bias_std": 1e6, "dtype": np.float16}, RangeError, r"bias_std=1000000\.0: b_q draws reach .* float16"),
        ({"num_kv_heads": 3}, ShapeError, r"num_kv_heads=3 must divide num_heads=2"),
        ({"rng": 0}, DTypeError, r"rng: expected a numpy\.random\.Generator"),
    ],
)
def test_init_multi_head_errors_name_the_argument(kwargs, error, message):
    args = {"d_model": 8, "num_heads": 2, "rng": np.random.default_rng(0)} | kwargs
    with pytest.raises(error, match=message):
        attnlab.init_multi_head(**args)


# ---------------------------------------------------------------------------------------------------------------
# attnlab.dropout


@FEW
@given(
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple),
    p=st.floats(0.0, 0.95),
    seed=st.integers(0, 2**16),
)
def test_dropout_zeroes_or_scales_and_reproduces(shape, p, seed):
    w = np.random.default_rng(seed + 1).random(shape)
    d = attnlab.dropout(w, p, rng=seed)
    if p == 0.0:
        assert d.dropout is None and d.output is w
        return
    keep = d.dropout.keep
    assert keep.shape == shape and d.dropout.p == p
    assert (d.output[~keep] == 0).all()
    np.testing.assert_allclose(d.output[keep], w[keep] / (1 - p), rtol=1e-14)
    np.testing.assert_array_equal(attnlab.dropout(w, p, rng=seed).output, d.output)  # same seed, same mask
    np.testing.assert_array_equal(attnlab.dropout(w, p, keep=keep).output, d.output)  # the mask reproduces it


@FEW
@given(
    p=st.one_of(
        st.floats(allow_nan=True).filter(lambda x: not 0 <= x < 1),
        st.integers().filter(lambda x: not 0 <= x < 1),
        st.text(max_size=3),
        st.booleans(),
        st.none(),
    )
)
def test_dropout_refuses_every_p_outside_0_1(p):
    with pytest.raises(OptionError, match=r"^p: expected a number with 0 <= p < 1, got"):
        attnlab.dropout(np.ones((2, 2)), p, rng=0)


def test_dropout_p_1_is_refused_with_the_reason():
    with pytest.raises(OptionError, match=r"p = 1 would drop every weight and divide by 1 - p = 0"):
        attnlab.dropout(np.ones((2, 2)), 1.0, rng=0)


# ---------------------------------------------------------------------------------------------------------------
# weights_io: good layouts round-trip exactly, bad state dicts are named


@FEW
@given(layout=layouts(), seed=st.integers(0, 2**16), bias=st.booleans())
def test_torch_attention_round_trip_and_output(layout, seed, bias):
    w = _weights(layout, seed, bias=bias)
    m = weights_io.to_torch_attention(w)
    _equal(w, weights_io.from_torch_attention(m))
    _equal(w, weights_io.from_torch_attention(m.state_dict(), num_heads=w.num_heads))  # widths infer the rest
    rng = np.random.default_rng(seed)
    x_q = rng.standard_normal((2, 3, w.d_model))
    x_kv = None if layout[4] is None else rng.standard_normal((2, 4, w.d_kv))
    with torch.no_grad():
        theirs = m(torch.from_numpy(x_q), None if x_kv is None else torch.from_numpy(x_kv)).numpy()
    np.testing.assert_allclose(theirs, attnlab.multi_head_attention(x_q, x_kv, w).output, atol=1e-12, rtol=0)


@FEW
@given(layout=layouts(cross=False), seed=st.integers(0, 2**16), bias=st.booleans(), layer=st.integers(0, 40))
def test_llama_and_bert_names_round_trip(layout, seed, bias, layer):
    w = _weights(layout, seed, bias=bias)
    sd = weights_io.to_llama(w, layer)
    _equal(w, weights_io.from_llama(sd, layer, num_heads=w.num_heads, num_kv_heads=w.num_kv_heads, head_dim=w.head_dim))
    if w.num_kv_heads == w.num_heads and w.num_heads * w.head_dim == w.d_model:
        _equal(w, weights_io.from_bert(weights_io.to_bert(w, layer, prefix="bert."), layer, num_heads=w.num_heads))
        if bias:
            _equal(w, weights_io.from_torch_mha(weights_io.to_torch_mha(w), num_heads=w.num_heads))
    else:
        with pytest.raises(ShapeError, match=r"which a BERT layer cannot hold"):
            weights_io.to_bert(w, layer)


@FEW
@given(seed=st.integers(0, 2**16), which=st.sampled_from(["q_proj", "k_proj", "v_proj", "o_proj"]), data=st.data())
def test_bad_state_dicts_are_named(seed, which, data):
    w = _weights((8, 4, 2, 2, None), seed)
    sd = dict(weights_io.to_torch_attention(w).state_dict())
    key = f"{which}.weight"
    fault = data.draw(st.sampled_from(["shape", "ndim", "int", "str", "missing", "heads"]), label="fault")
    if fault == "shape":
        sd[key] = torch.zeros(sd[key].shape[0] + 1, sd[key].shape[1], dtype=torch.float64)
        error, message = ShapeError, r"^state_dict: w_[qkvo]: .* \(w_q = q_proj\.weight transposed"
    elif fault == "ndim":
        sd[key] = torch.zeros(3, dtype=torch.float64)
        error, message = ShapeError, rf"{key}: expected a 2-D \[d_out, d_in\] matrix, got shape \(3,\)"
    elif fault == "int":
        sd[key] = torch.zeros(sd[key].shape, dtype=torch.int64)
        error, message = DTypeError, rf"{key}: expected floating weights, got dtype int64"
    elif fault == "str":
        sd[key] = "weights"
        error, message = DTypeError, rf"{key}: expected floating weights, got dtype <U7"
    elif fault == "missing":
        del sd[key]
        error, message = ShapeError, rf"state_dict: no entry '{key}'"
    else:
        error, message = ShapeError, r"^state_dict: num_kv_heads=3 must divide num_heads=4"
    kw = {"num_kv_heads": 3} if fault == "heads" else {}
    with pytest.raises(error, match=message):
        weights_io.from_torch_attention(sd, num_heads=4, **kw)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda w: weights_io.to_torch_mha("w"), DTypeError, r"MultiHeadWeights \(see init_multi_head\), got str"),
        (lambda w: weights_io.to_torch_attention(None), DTypeError, r"weights: expected a MultiHeadWeights"),
        (lambda w: weights_io.to_torch_mha(w, dtype="float32"), DTypeError, r"dtype: expected None or a torch dtype"),
        (lambda w: weights_io.to_torch_mha(w, expand_kv=1), OptionError, r"expand_kv: expected one of True, False"),
        (lambda w: weights_io.to_torch_mha(w, prefix=3), OptionError, r"prefix: expected a str"),
        (lambda w: weights_io.to_llama(w, -1), OptionError, r"layer: expected an int >= 0, got -1"),
        (lambda w: weights_io.to_bert(w, "0"), OptionError, r"layer: expected an int >= 0, got '0'"),
        (lambda w: weights_io.from_llama({}, 0, num_heads=0), OptionError, r"num_heads: expected an int >= 1, got 0"),
        (lambda w: weights_io.from_bert([], 0, num_heads=2), DTypeError, r"state_dict: expected a mapping"),
        (lambda w: weights_io.from_torch_mha({}, num_heads=2.5), OptionError, r"num_heads: expected an int >= 1"),
        (
            lambda w: weights_io.from_torch_attention({}, num_heads=2),
            ShapeError,
            r"state_dict: no entry 'q_proj\.weight'",
        ),
    ],
)
def test_weights_io_option_errors(call, error, message):
    with pytest.raises(error, match=message):
        call(_weights((8, 2, 2, 4, None), 0))


# ---------------------------------------------------------------------------------------------------------------
# attnlab.models: names, docs, import cost


def test_every_public_model_name_is_importable_documented_and_in_the_docs():
    doc = DOCS.read_text(encoding="utf-8")
    assert attnlab.models.__all__ == sorted(attnlab.models.__all__)
    for name in attnlab.models.__all__:
        obj = getattr(attnlab.models, name)
        assert (obj.__doc__ or "").strip(), f"{name} has no docstring"
        assert f"`{name}" in doc, f"docs/models.md does not document {name}"
    from attnlab.models import MiniLM, load_minilm, smollm2_gguf_path  # the report's names

    assert MiniLM.__module__ == "attnlab.models.minilm" and callable(load_minilm) and callable(smollm2_gguf_path)
    for method in ("load", "tokenize", "encode", "encode_sentences"):
        assert f"`MiniLM.{method}(" in doc
        assert "Args:" in getattr(MiniLM, method).__doc__ or method == "load"
    assert set(attnlab.models.__all__) <= set(dir(attnlab.models))


def test_an_unknown_model_name_suggests_the_real_ones():
    with pytest.raises(AttributeError, match=r"no attribute 'SmolLM2'; did you mean load_smollm2"):
        attnlab.models.SmolLM2  # noqa: B018
    with pytest.raises(AttributeError, match=r"no attribute 'Llama'; did you mean LlamaModel"):
        attnlab.models.Llama  # noqa: B018


def test_docs_models_examples_run():
    result = doctest.testfile(str(DOCS), module_relative=False, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 10 and result.failed == 0


def test_model_names_import_without_torch_or_transformers():
    code = (
        "import sys; from attnlab.models import MiniLM, load_minilm, load_smollm2, smollm2_gguf_path, LlamaModel, "
        "generate, llama_forward, intervene, InterventionResult; import attnlab.weights_io; "
        "print(sorted({'torch', 'transformers', 'matplotlib', 'tokenizers', 'gguf'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------------------------------------------------------
# MiniLM: cheap argument validation (the model is loaded once per process)


@pytest.fixture(scope="module")
def minilm():
    from attnlab.models import load_minilm

    return load_minilm()


def test_minilm_load_is_cached_and_read_only(minilm):
    from attnlab.models import MiniLM, load_minilm

    assert load_minilm() is minilm and isinstance(minilm, MiniLM)
    a = minilm.params["embeddings.word_embeddings.weight"]
    assert a.shape == (30522, 384) and not a.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        a[0, 0] = 1.0


@FIXTURE
@given(
    ids=st.one_of(
        st.lists(st.lists(st.integers(-5, 40000), min_size=1, max_size=4), min_size=1, max_size=2).filter(
            lambda r: len({len(x) for x in r}) == 1 and any(not 0 <= i < 30522 for x in r for i in x)
        ),
        st.lists(st.integers(0, 100), min_size=1, max_size=4),  # [n] instead of [B, n]
        st.just([[1.5, 2.0]]),
        st.just([[True, False]]),
        st.just([[1, 2], [3]]),  # ragged
        st.just([[]]),
        st.just(np.zeros((1, 513), np.int64)),
        st.just("101 102"),
    )
)
def test_minilm_encode_names_bad_token_ids(minilm, ids):
    with pytest.raises((ShapeError, DTypeError), match=r"^input_ids: "):
        minilm.encode(ids)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"attention_mask": [[1, 1]]}, ShapeError, r"attention_mask: shape \(1, 2\), expected input_ids' \(1, 3\)"),
        ({"attention_mask": [[1, 2, 0]]}, MaskError, r"attention_mask: expected 1 = real token, 0 = padding"),
        ({"attention_mask": [[0.5, 1, 1]]}, MaskError, r"attention_mask: expected 1 = real token"),
        ({"attention_mask": [[0, 0, 0]]}, MaskError, r"attention_mask: sentence\(s\) \[0\] have no real token"),
        ({"token_type_ids": [[0, 2, 0]]}, ShapeError, r"token_type_ids: expected \[B, n\] = \(1, 3\) ids in \[0, 2\)"),
        ({"token_type_ids": [[0.0, 0, 0]]}, DTypeError, r"token_type_ids: expected integer ids"),
    ],
)
def test_minilm_encode_names_bad_masks(minilm, kwargs, error, message):
    with pytest.raises(error, match=message):
        minilm.encode([[101, 7592, 102]], **kwargs)


@FIXTURE
@given(
    bad=st.one_of(
        st.text(max_size=5),
        st.just([]),
        st.just(()),
        st.lists(st.one_of(st.integers(), st.none(), st.binary(max_size=3)), min_size=1, max_size=3),
        st.integers(),
        st.none(),
    )
)
def test_minilm_tokenize_names_bad_sentences(minilm, bad):
    with pytest.raises(DTypeError, match=r"^sentences(\[\d+\])?: expected"):
        minilm.encode_sentences(bad)


def test_minilm_empty_strings_and_max_length(minilm):
    ids, mask = minilm.tokenize(["", "Hello!"])
    assert ids.tolist() == [[101, 102, 0, 0], [101, 7592, 999, 102]] and mask.tolist()[0] == [1, 1, 0, 0]
    out = minilm.encode_sentences([""])  # an empty sentence is [CLS] [SEP]: a valid, unit-length embedding
    np.testing.assert_allclose(np.linalg.norm(out.sentence_embedding), 1.0, rtol=1e-5)
    short, _ = minilm.tokenize(["A cat sat on the mat."], max_length=4)
    assert short.tolist() == [[101, 1037, 4937, 102]]  # truncated, [SEP] kept
    for bad, message in ((1, r"max_length: expected an int in \[2, 512\], got 1"), (513, r"got 513"), ("8", "'8'")):
        with pytest.raises(OptionError, match=message):
            minilm.tokenize(["x"], max_length=bad)
    with pytest.raises(DTypeError, match=r"sentences: expected a list of str, got one str 'Hello'; pass \[text\]"):
        minilm.tokenize("Hello")
    with pytest.raises(OptionError, match=r"layer: expected an int in \[0, 5\], got -1"):
        minilm.attention(-1)


# ---------------------------------------------------------------------------------------------------------------
# SmolLM2 (the session fixture): cheap argument validation, no long forwards


@FIXTURE
@given(
    ids=st.one_of(
        st.lists(st.integers(-3, 60000), min_size=1, max_size=5).filter(lambda x: any(not 0 <= i < 49152 for i in x)),
        st.just([]),
        st.just([[1, 2], [3]]),
        st.just([1.0, 2.0]),
        st.just([[True]]),
        st.just("the cat"),
        st.just(np.zeros((1, 1, 2), np.int64)),
    )
)
def test_smollm2_names_bad_token_ids(smollm2, ids):
    from attnlab.models import llama_forward

    with pytest.raises((ShapeError, DTypeError), match=r"^token_ids: "):
        llama_forward(smollm2, ids)


def test_smollm2_names_bad_options_and_empty_prompts(smollm2, one_blas_thread):
    from attnlab.models import generate, llama_forward, make_cache, position_check

    cases = [
        (lambda: generate(smollm2, ""), ShapeError, r"token_ids: expected a non-empty"),
        (lambda: generate(smollm2, [1], max_new_tokens=1.5), OptionError, r"max_new_tokens: expected an int >= 1"),
        (lambda: generate(smollm2, [1], on_token=3), DTypeError, r"on_token: expected a function"),
        (lambda: generate(smollm2, [[1], [2]]), ShapeError, r"prompt: expected one sequence"),
        (lambda: generate(smollm2, [1], use_cache="no"), OptionError, r"use_cache: expected one of True, False"),
        (lambda: llama_forward(smollm2, [1], blas_threads=0), OptionError, r"blas_threads: expected an int >= 1"),
        (lambda: llama_forward(smollm2, [1], rope="yes"), OptionError, r"rope: expected one of True, False"),
        (lambda: llama_forward("smollm2", [1]), DTypeError, r"model: expected a LlamaModel"),
        (lambda: generate("smollm2", "Hi"), DTypeError, r"LlamaModel \(e\.g\. load_smollm2\(\)\), got str"),
        (lambda: make_cache(smollm2, 0), OptionError, r"batch: expected an int >= 1, got 0"),
        (lambda: smollm2.encode(5), DTypeError, r"text: expected a str, got int"),
        (lambda: position_check(smollm2, ""), ShapeError, r"token_ids: expected a non-empty"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    assert smollm2.encode("") == []
    out = llama_forward(smollm2, np.array([1, 2], np.int32), last_only=True)  # a good call still runs
    assert out.logits.shape == (1, 1, 49152)


def test_every_error_above_is_an_attnlab_error():
    for cls in (OptionError, ShapeError, DTypeError, MaskError, RangeError):
        assert issubclass(cls, AttnlabError)


# --- check_backward: hostile backward passes end in a report with a named finding, or a usage error -------------


def _golden_bwd(q, k, v, d_out, mask=None, scale=None):
    trace = attnlab.attention_trace(q, k, v, mask, scale=scale, masked_rows="zero")
    g = attnlab.attention_backward(trace, d_out)  # computed in float32 below float32: cast back
    return g.dq.astype(q.dtype), g.dk.astype(k.dtype), g.dv.astype(v.dtype)


def _raises(q, k, v, d_out, mask=None, scale=None):
    raise IndexError("tuple index out of range")


def _returns_none(q, k, v, d_out, mask=None, scale=None):
    return None


def _nan_grads(q, k, v, d_out, mask=None, scale=None):
    dq, dk, dv = _golden_bwd(q, k, v, d_out, mask, scale)
    return dq * np.nan, dk, dv


def _writes_d_out(q, k, v, d_out, mask=None, scale=None):
    out = _golden_bwd(q, k, v, d_out, mask, scale)
    d_out *= 2  # the caller's upstream gradient
    return out


@pytest.mark.parametrize(
    ("bwd", "codes"),
    [
        (_golden_bwd, set()),
        (_raises, {"crash"}),
        (_returns_none, {"crash", "output-type"}),
        (_nan_grads, {"grad-mismatch", "grad-masked-row"}),
        (_writes_d_out, {"mutates-input"}),
    ],
    ids=["correct", "raises", "returns-none", "nan", "writes-d_out"],
)
def test_check_backward_names_what_a_hostile_backward_does(bwd, codes):
    r = attnlab.check_backward(bwd)
    if not codes:
        assert r.ok, r.to_text()
    else:
        assert not r.ok and set(r.codes) & codes, r.to_text()
        assert all(f.message and f.evidence and f.fix for f in r.findings)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((42,), {}, r"^bwd: expected a callable backward or a target string, got int"),
        ((_golden_bwd,), {"lse_units": "bits"}, r"^lse_units: expected 'nats' or 'log2', got 'bits'"),
        ((_golden_bwd,), {"layout": "nhbd"}, r"layout"),
    ],
)
def test_check_backward_option_errors_name_the_argument(args, kwargs, message):
    from attnlab.checker import UsageError

    with pytest.raises(UsageError, match=message):
        attnlab.check_backward(*args, **kwargs)
