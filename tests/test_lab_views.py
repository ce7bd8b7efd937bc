"""The numbers of the live model's views (attnlab.lab.views) against SmolLM2's own forward pass and float64.

* the trace (``llama_forward(..., capture=True)``) is the same forward pass: the logits do not change, and the
  queries after RoPE are what RMSNorm, W_Q and RoPE make of the embeddings;
* the neuron view's products sum to the score the model's softmax got, and its softmax is the model's weight;
* the block view's probabilities are softmax(logits / T) in float64 and sum to 1;
* the head view's line widths are the weights.
"""

from __future__ import annotations

import base64
import re
import struct

import numpy as np
import pytest

from attnlab.core.multihead import split_heads
from attnlab.core.rope import apply_rope, rope_tables
from attnlab.errors import OptionError, ShapeError
from attnlab.lab import views
from attnlab.models.llama import llama_forward, rms_norm
from attnlab.models.tokens import merge_bytes

pytestmark = pytest.mark.xdist_group("test_lab_views")

SENTENCE = "我喜欢猫, the cat sat"


@pytest.fixture(scope="module")
def run(smollm2):
    ids = smollm2.encode(SENTENCE)
    out = llama_forward(smollm2, ids, return_attention=True, capture=True)
    return smollm2, ids, out


def test_token_bytes_are_the_texts_bytes(run):
    m, ids, _ = run
    pieces = m.tokenizer.token_bytes(ids)
    assert b"".join(pieces) == SENTENCE.encode("utf-8") and len(pieces) == len(ids)
    assert m.tokenizer.token_bytes(m.encode("<|im_start|>")) == [b"<|im_start|>"]  # a special token: its text


def test_capture_keeps_the_forward_pass_and_its_queries_are_after_rope(run):
    m, ids, out = run
    plain = llama_forward(m, ids)
    np.testing.assert_array_equal(plain.logits, out.logits)  # the same code path, only more is kept
    tr = out.trace
    c = m.config
    L, n = c.num_layers, len(ids)
    assert len(tr.q) == len(tr.k) == len(tr.logits) == len(tr.residual) == L
    assert tr.q[0].shape == (1, c.num_heads, n, c.head_dim) and tr.k[0].shape == (1, c.num_kv_heads, n, c.head_dim)
    assert tr.scale == pytest.approx(1 / np.sqrt(c.head_dim))
    # layer 0's queries from the embeddings, in float64
    a = m.layers[0].attn
    x = m.embed[np.array(ids)].astype(np.float64)[None]
    q = split_heads(rms_norm(x, m.layers[0].attn_norm.astype(np.float64), c.rms_eps) @ a.w_q.astype(np.float64), 9)
    q = apply_rope(q, rope_tables(np.arange(n), c.head_dim, base=c.rope_base, dtype=np.float64))
    np.testing.assert_allclose(tr.q[0], q, rtol=0, atol=2e-4 * np.abs(q).max())
    # the residual stream adds up: x_L = x_0 + Σ (attention + MLP)
    total = tr.embeddings.astype(np.float64) + sum(
        np.asarray(a, np.float64) + np.asarray(b, np.float64) for a, b in zip(tr.attn_out, tr.mlp_out, strict=True)
    )
    np.testing.assert_allclose(tr.residual[-1], total, rtol=0, atol=1e-3 * np.abs(total).max())


@pytest.mark.parametrize(("layer", "head", "query", "key"), [(0, 0, -1, 0), (7, 5, 9, 3), (29, 8, 4, 4), (3, 1, 2, 6)])
def test_neuron_products_sum_to_the_models_score(run, layer, head, query, key):
    _, _, out = run
    p = views.neuron_pair(out.trace, layer, head, query, key)
    assert p.kv_head == p.head // 3  # SmolLM2: 9 query heads read 3 kv heads
    np.testing.assert_allclose(p.products, p.q * p.k)
    assert p.dot == pytest.approx(float(np.sum(p.q * p.k)), rel=1e-12)
    if p.key > p.query:  # the causal mask hides the future
        assert p.masked and p.model_score == -np.inf
        return
    assert p.score == pytest.approx(p.model_score, rel=1e-5, abs=1e-5)
    # the softmax of the model's scores is the model's weight
    row = np.asarray(out.trace.logits[p.layer][0, p.head, p.query], np.float64)
    ref = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
    np.testing.assert_allclose(out.attentions[p.layer][0, p.head, p.query], ref, rtol=0, atol=1e-6)
    assert p.weight == pytest.approx(ref[p.key], abs=1e-6)


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.7])
def test_block_probabilities_are_softmax_of_logits_over_t(run, temperature):
    m, _, out = run
    z = out.logits[0, -1]
    b = views.block_numbers(out.trace, z, temperature=temperature, top_k=7)
    zz = np.asarray(z, np.float64) / temperature
    ref = np.exp(zz - zz.max() - np.log(np.exp(zz - zz.max()).sum()))  # float64 log-sum-exp
    np.testing.assert_allclose(b.probs, ref, rtol=1e-12, atol=0)
    assert b.probs.sum() == pytest.approx(1.0, abs=1e-12)
    assert list(b.top_ids) == list(np.argsort(-zz)[:7]) and np.all(np.diff(b.top_probs) <= 0)
    assert b.residual_norms[-1] == pytest.approx(float(np.linalg.norm(out.trace.residual[-1][0, -1])), rel=1e-6)
    svg = views.block_svg(
        b,
        token_labels=[m.tokenizer.labels([i])[0] for i in b.top_ids],
        layer=3,
        words=dict.fromkeys(
            ("title", "embedding", "attention", "mlp", "residual", "head", "layer", "norms", "top", "attention_all"),
            "x",
        )
        | {"mlp_all": "y"},
    )
    shown = [float(x) for x in re.findall(r'data-p="([^"]+)"', svg)]
    np.testing.assert_array_equal(shown, b.top_probs)
    with pytest.raises(OptionError, match="temperature: expected a number > 0"):
        views.block_numbers(out.trace, z, temperature=0)


def test_head_view_line_widths_are_the_weights(run):
    m, ids, out = run
    w = np.stack([a[0] for a in out.attentions])  # [L, h, n, n]
    merged = merge_bytes(m.tokenizer.token_bytes(ids), w, np.tril(np.ones((len(ids),) * 2, dtype=bool)))
    assert merged.labels[:4] == ("我", "喜", "欢", "猫")
    svg = views.head_view_svg(merged.weights[5], merged.allowed, merged.labels, heads=[0, 4], title="t")
    lines = re.findall(r'<line [^>]*stroke-width="([^"]+)"[^>]*data-head="(\d)" data-q="(\d+)" data-k="(\d+)"', svg)
    assert lines and {h for _, h, _, _ in lines} == {"0", "4"}
    for width, h, q, k in lines:
        wt = merged.weights[5, int(h), int(q), int(k)]
        assert float(width) == pytest.approx(wt * views.MAX_LINE, abs=1e-4)
        assert wt >= views.MIN_SHOWN and merged.allowed[int(q), int(k)]
    drawn = {(int(h), int(q), int(k)) for _, h, q, k in lines}
    big = {(h, q, k) for h in (0, 4) for q, k in zip(*np.nonzero(merged.weights[5, h] >= views.MIN_SHOWN), strict=True)}
    assert drawn == big  # every weight of at least MIN_SHOWN has its line


def test_thumbnails_and_model_view_table():
    rng = np.random.default_rng(1)
    w = rng.random((2, 3, 4, 4))
    sheet = views.head_sheet(w, np.tril(np.ones((4, 4), dtype=bool)))
    assert (sheet.layers, sheet.heads, sheet.tile) == (2, 3, 28)  # 7 px per cell of a 4x4 map
    png = base64.b64decode(sheet.uri.removeprefix("data:image/png;base64,"))
    assert png.startswith(b"\x89PNG") and struct.unpack(">II", png[16:24]) == (3 * 28, 2 * 28)  # width, height
    tile = sheet.tile_html(1, 2, px=20)
    assert "background-position:-40px -20px;background-size:60px 40px" in tile and 'aria-label="L1 h2"' in tile
    assert 'class="al-heads"' in tile and f".al-heads{{background-image:url({sheet.uri});" in sheet.style_html()
    with pytest.raises(ShapeError, match=r"layer, head: expected 0 <= layer < 2 and 0 <= head < 3, got \(2, 0\)"):
        sheet.tile_html(2, 0)
    cells = views.model_view_cells(sheet, selected=(1, 2))
    assert len(cells) == 2 and len(cells[0]) == 3
    assert cells[1][2].startswith("<span data-layer='1' data-head='2' data-selected='1'")
    assert sum("data-selected" in c for r in cells for c in r) == 1 and "-40px -20px" in cells[1][2]
    page = views.model_view_html("<table>T</table>", sheet, title="t")
    assert page.count(sheet.uri) == 1 and sheet.style_html() in page
    assert 'data-layers="2" data-heads="3"' in page and "<table>T</table>" in page


def test_the_model_views_table_click_names_a_head():
    from types import SimpleNamespace as Cell

    from attnlab.lab.live import picked_head

    assert picked_head([Cell(row="6", column="h2", value=None)], 9) == (5, 2)  # row 0 names the heads
    assert picked_head([Cell(row="0", column="h2", value="h2")], 9) is None  # a head's name, not a head
    assert picked_head([Cell(row="6", column="", value="layer 5")], 9) is None  # the row's name, not a head
    assert picked_head([Cell(row="5", column="h9", value=None)], 9) is None
    assert picked_head([], 9) is None and picked_head(None, 9) is None
