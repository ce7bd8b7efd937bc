"""Attention received vs. effect of deleting/replacing tokens, on SmolLM2 and MiniLM, and the real-model hooks."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnlab.checker.model import check_causal_lm
from attnlab.core.softmax import log_softmax
from attnlab.errors import OptionError, ShapeError
from attnlab.models.interventions import (
    attention_maps,
    intervene,
    intervene_minilm,
    plot_intervention,
    spearman,
)
from attnlab.models.llama import llama_forward, logits_fn
from attnlab.models.minilm import MiniLM

PROMPT = "The capital of France is"


pytestmark = pytest.mark.usefixtures("one_blas_thread")


@pytest.fixture(scope="module")
def model(smollm2):
    return smollm2


@pytest.fixture(scope="module")
def minilm():
    return MiniLM.load()


@pytest.fixture(scope="module")
def deleted(model):
    return intervene(model, PROMPT, method="delete")


def test_delete_effects_are_the_models_own_numbers(model, deleted):
    """Recompute every effect independently: one forward per deleted token, float64 log-softmax and KL."""
    ids = model.encode(PROMPT)
    assert deleted.tokens == ("The", "·capital", "·of", "·France", "·is")
    assert deleted.sources == (0, 1, 2, 3) and deleted.target == 4
    assert "' Paris'" in deleted.target_label
    paris = model.encode(" Paris")[0]
    before = llama_forward(model, ids).logits[0, -1].astype(np.float64)
    p = np.exp(before - before.max())
    p /= p.sum()
    assert int(np.argmax(p)) == paris
    for i, j in enumerate(deleted.sources):
        after = llama_forward(model, ids[:j] + ids[j + 1 :]).logits[0, -1].astype(np.float64)
        q = np.exp(after - after.max())
        q /= q.sum()
        assert deleted.delta_logprob[i] == pytest.approx(np.log(q[paris]) - np.log(p[paris]), abs=1e-4)
        assert deleted.kl[i] == pytest.approx(float(np.sum(p * (np.log(p) - np.log(q)))), abs=1e-4)
    # deleting "France" or "capital" hurts " Paris" much more than deleting "of"
    assert deleted.delta_logprob[3] < deleted.delta_logprob[2] - 1 and deleted.delta_logprob[1] < -1


def test_attention_is_the_target_row_of_every_layer(model, deleted):
    ids = model.encode(PROMPT)
    maps = llama_forward(model, ids, return_attention=True).attentions
    assert deleted.attention.shape == (30, 9, 4)
    for layer in (0, 13, 29):
        np.testing.assert_array_equal(deleted.attention[layer], maps[layer][0, :, 4, :4])
    np.testing.assert_allclose(deleted.mean_attention(), deleted.attention.mean(axis=(0, 1)), rtol=1e-6)
    assert deleted.per_head().shape == (9, 4)


def test_table_and_reading(deleted):
    table = deleted.table().splitlines()
    assert table[0].split() == ["pos", "token", "attn", "max", "head", "rank", "Δlogp", "KL", "rank"]
    assert len(table) == 2 + 4 + 1
    assert table[2].split()[:2] == ["0", "The"]
    assert "deleting the token on log p(' Paris')" in table[-1]
    text = deleted.reading()
    assert "Spearman rank correlation" in text
    # the first token is the attention sink: most weight, not the largest effect
    assert "The most attended token is 'The' (position 0" in text
    assert "High weight, small effect: 'The'" in text and "attention sink" in text
    assert text.rstrip().endswith("(article 000).")


def test_replace_includes_the_target_and_names_the_replacement(model):
    r = intervene(model, PROMPT, method="replace", replacement=" Germany", layer=-1)
    assert r.sources == (0, 1, 2, 3, 4) and r.replacement == " Germany" and r.layer == 29
    assert r.attention.shape == (30, 9, 5) and r.per_head().shape == (9, 5)
    np.testing.assert_allclose(r.mean_attention(), r.attention[29].mean(axis=0), rtol=1e-6)
    # " France" -> " Germany" moves the answer away from " Paris"
    assert r.delta_logprob[3] < -2 and np.all(r.kl >= 0)
    assert "with ' Germany'" in r.table()


def test_target_token_and_target_position(model):
    r = intervene(model, PROMPT, target=3, target_token=" is")
    assert r.target == 3 and r.sources == (0, 1, 2) and "' is'" in r.target_label
    ids = model.encode(PROMPT)[:4]
    lp = log_softmax(llama_forward(model, ids).logits[0, -1].astype(np.float64))
    lq = log_softmax(llama_forward(model, ids[1:]).logits[0, -1].astype(np.float64))
    y = model.encode(" is")[0]
    assert r.delta_logprob[0] == pytest.approx(lq[y] - lp[y], abs=1e-4)


def test_intervention_errors(model):
    with pytest.raises(OptionError, match=r"^method: expected one of 'delete', 'replace', got 'swap'$"):
        intervene(model, PROMPT, method="swap")
    with pytest.raises(OptionError, match=r"target: position 9 is outside 1..4 \(prompt of 5 tokens\)"):
        intervene(model, PROMPT, target=9)
    with pytest.raises(OptionError, match=r"replacement: ' New York' is 2 tokens"):
        intervene(model, PROMPT, method="replace", replacement=" New York")
    with pytest.raises(OptionError, match=r"replacement: ' New York' is 2 tokens"):  # checked with delete too
        intervene(model, PROMPT, method="delete", replacement=" New York")
    with pytest.raises(OptionError, match=r"layer: expected an int in \[0, 30\), got 30"):
        intervene(model, PROMPT, layer=30)
    with pytest.raises(OptionError, match=r"^layer: expected an int, got True$"):  # a bool is not layer 1
        intervene(model, PROMPT, layer=True)
    with pytest.raises(OptionError, match=r"^target: expected an int, got 'x'$"):
        intervene(model, PROMPT, target="x")
    with pytest.raises(ShapeError, match=r"prompt: expected at least 2 tokens"):
        intervene(model, "Hi")


def test_minilm_effect_on_the_sentence_embedding(minilm):
    sentence = "A cat sat on the warm mat near the window."
    r = intervene_minilm(sentence, model=minilm)
    assert r.tokens[0] == "[CLS]" and r.tokens[-1] == "[SEP]"
    assert r.sources == tuple(range(1, len(r.tokens) - 1)) and r.target is None
    assert r.attention.shape == (6, 12, len(r.sources)) and r.effect_name == "1-cos"
    ids, am = minilm.tokenize([sentence])
    base = minilm.encode(ids, am)
    np.testing.assert_allclose(r.attention[2], base.attentions[2][0].mean(axis=1)[:, 1:-1], atol=1e-7)
    e = base.sentence_embedding[0].astype(np.float64)
    j = r.tokens.index("cat")
    row = ids[0].tolist()
    e2 = minilm.encode(np.array([row[:j] + row[j + 1 :]])).sentence_embedding[0].astype(np.float64)
    assert r.effect[j - 1] == pytest.approx(1 - e @ e2 / np.linalg.norm(e) / np.linalg.norm(e2), abs=1e-6)
    assert r.effect[j - 1] == r.effect.max()  # the content word matters most; "the" and "." barely
    assert r.effect[r.tokens.index("the") - 1] < 0.02
    assert r.delta_logprob is None and "1-cos" in r.table() and "Spearman" in r.reading()


def test_minilm_replace_with_mask_and_a_target_query(minilm):
    r = intervene_minilm("Paris is lovely in spring.", model=minilm, method="replace", target=0, layer=5)
    assert r.replacement == "[MASK]" and r.target == 0 and r.layer == 5
    assert np.all(r.effect >= 0) and np.all(r.effect < 1)


def test_plot_writes_png_and_svg(deleted, tmp_path):
    fig = plot_intervention(deleted, tmp_path / "iv.png")
    assert (tmp_path / "iv.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(fig.axes) == 3  # bars, heads map, colour bar
    plot_intervention(deleted, tmp_path / "iv.svg")
    assert (tmp_path / "iv.svg").read_text().lstrip().startswith("<?xml")
    with pytest.raises(OptionError, match=r"path: expected a .png, .svg or .pdf file"):
        plot_intervention(deleted, tmp_path / "iv.gif")


@given(st.lists(st.integers(-1000, 1000), min_size=3, max_size=20, unique=True), st.integers(0, 2**16))
def test_spearman_is_rank_based(xs, seed):
    x = np.array(xs, dtype=np.float64)
    assert spearman(x, np.sign(x) * np.sqrt(np.abs(x))) == pytest.approx(1.0)
    assert spearman(x, -x) == pytest.approx(-1.0)
    p = np.random.default_rng(seed).permutation(len(x))
    assert spearman(x[p], (2 * x + 1)[p]) == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------------------------
# maps for heatmaps, and the checker on a real model


def test_attention_maps_for_heatmaps(model, minilm):
    one = attention_maps("smollm2", PROMPT, layer=3, head=8, model_obj=model)
    assert one.weights.shape == (5, 5) and one.labels[0] == "The" and "layer 3 head 8" in one.title
    np.testing.assert_allclose(one.weights.sum(-1), 1.0, atol=1e-6)
    assert np.all(one.weights[~one.allowed] == 0)
    ref = llama_forward(model, model.encode(PROMPT), return_attention=True).attentions[3][0, 8]
    np.testing.assert_allclose(one.weights, ref)
    grid = attention_maps("minilm", "The cat sat.", layer=-1, model_obj=minilm)
    assert grid.weights.shape[0] == 12 and len(grid.head_names) == 12 and grid.allowed.all()
    with pytest.raises(OptionError, match=r"model: expected 'smollm2' or 'minilm', got 'gpt5'"):
        attention_maps("gpt5", "x")
    with pytest.raises(OptionError, match=r"head: expected an int in \[0, 9\) for SmolLM2-135M, got 9"):
        attention_maps("smollm2", PROMPT, head=9, model_obj=model)


def test_checker_passes_smollm2_and_names_the_leak_when_the_mask_is_broken(model):
    ok = check_causal_lm(logits_fn(model), vocab_size=model.config.vocab_size, seq_len=8, name="smollm2")
    assert ok.ok, ok.to_text()
    bad = check_causal_lm(logits_fn(model, break_causal=True), vocab_size=model.config.vocab_size, seq_len=8)
    assert not bad.ok
    assert "causal-leak" in bad.to_text()


def test_bad_target_token_and_replacement_are_refused_before_any_forward_pass(smollm2, monkeypatch):
    """Issue 12: `intervene --target-token/--replacement` were checked only after the first forward pass."""
    from attnlab.models import llama

    def no_forward(*args, **kwargs):
        raise AssertionError("a forward pass ran before the arguments were checked")

    monkeypatch.setattr(llama, "llama_forward", no_forward)
    with pytest.raises(OptionError, match=r"target_token: ' Paris is' is 2 tokens"):
        intervene(smollm2, "The capital of France is", target_token=" Paris is")
    with pytest.raises(OptionError, match=r"replacement: id -1 is outside the vocabulary"):
        intervene(smollm2, "The capital of France is", method="replace", replacement=-1)
