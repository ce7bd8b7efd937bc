"""The cost model against the articles' figures and hand counts; the ``attnlab cost`` command."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab import masks
from attnlab.cli import main
from attnlab.cost import (
    attention_cost,
    bytes_per_element,
    causal_pairs,
    crossover_length,
    head_dim,
    kv_cache_bytes,
    score_elements,
)
from attnlab.errors import DTypeError, ShapeError


def test_articles_figures():
    assert score_elements(4096) / score_elements(1024) == 16  # 1,024 -> 4,096 tokens: 16x score elements
    assert head_dim(512, 8) == 64  # d_model 512 with 8 heads
    a, b = attention_cost(1024), attention_cost(4096)
    assert b.score_elements == 16 * a.score_elements and b.attention_flops == 16 * a.attention_flops
    assert b.projection_flops == 4 * a.projection_flops  # projections grow linearly


def test_projection_vs_n_squared_crossover():
    x = crossover_length(512)
    assert x == 1024  # MHA: n = 2 d_model
    assert attention_cost(512).projection_flops > attention_cost(512).attention_flops
    assert attention_cost(1024).projection_flops == attention_cost(1024).attention_flops
    assert attention_cost(2048).projection_flops < attention_cost(2048).attention_flops
    # GQA projects fewer K/V columns, so the n² term wins earlier
    g = crossover_length(512, heads=8, kv_heads=2)
    assert g == 640
    assert attention_cost(640, kv_heads=2).projection_flops == attention_cost(640, kv_heads=2).attention_flops


def test_flop_counts_by_hand():
    c = attention_cost(10, 7, batch=3, d_model=16, heads=4, kv_heads=2, layers=2)
    d_h = 4
    assert c.d_head == d_h and c.kind == "GQA"
    assert c.score_flops == 2 * (2 * 3 * 4 * 10 * 7 * d_h)
    assert c.projection_flops == 2 * (2 * 2 * 3 * 10 * 16 * 16 + 2 * 2 * 3 * 7 * 16 * 2 * d_h)
    assert c.score_elements == 3 * 4 * 10 * 7 and c.score_bytes == c.score_elements * 2


def test_causal_pairs_match_the_masks():
    for n_q, n_k in ((1, 1), (4, 4), (3, 9), (9, 3), (100, 100)):
        assert causal_pairs(n_q, n_k) == int(masks.causal(n_q, n_k, align="bottom_right").sum())
    c = attention_cost(1024, causal=True)
    assert c.pairs == 1024 * 1025 // 2 and c.score_flops == 2 * 8 * c.pairs * 64


@pytest.mark.parametrize(("kv_heads", "kind"), [(32, "MHA"), (8, "GQA"), (1, "MQA")])
def test_kv_cache_bytes_mha_gqa_mqa(kv_heads, kind):
    B, L, layers, d_head = 2, 4096, 32, 128
    c = attention_cost(1, L, batch=B, d_model=4096, heads=32, kv_heads=kv_heads, layers=layers, dtype="bfloat16")
    want = B * L * layers * kv_heads * d_head * 2 * 2
    assert c.kind == kind
    assert c.kv_cache_bytes == want
    assert (
        kv_cache_bytes(batch=B, seq_len=L, layers=layers, kv_heads=kv_heads, head_dim=d_head, dtype="bfloat16") == want
    )
    if kind == "MHA":
        assert want == 4 * 2**30  # Llama-2-7B-like, 2 x 4k tokens: 4 GiB


def test_bytes_and_errors():
    assert [bytes_per_element(x) for x in ("float16", "bfloat16", np.float32, "float64", "int8", 3)] == [
        2,
        2,
        4,
        8,
        1,
        3,
    ]
    with pytest.raises(DTypeError, match="dtype: 'float17' is not a dtype"):
        bytes_per_element("float17")
    with pytest.raises(ShapeError, match="heads: 7 heads do not divide d_model=512"):
        head_dim(512, 7)
    with pytest.raises(ShapeError, match="kv_heads: 3 does not divide heads=8"):
        attention_cost(10, kv_heads=3)
    with pytest.raises(ShapeError, match="n_q: expected a positive int, got 0"):
        attention_cost(0)


def test_cost_command(capsys):
    assert main(["cost", "1024", "4096"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert (
        lines[0] == "attention cost: B=1, d_model=512, h=8 (d_head=64), h_kv=8 (MHA), layers=1, float16 (2 B/element)"
    )
    assert lines[3].split() == [
        "1024",
        "1024",
        "2.147",
        "GFLOP",
        "2.147",
        "GFLOP",
        "1",
        "8,388,608",
        "16",
        "MiB",
        "2",
        "MiB",
    ]
    assert lines[4].split()[-4:] == ["256", "MiB", "8", "MiB"]
    assert "n_q 1024 -> 4096: ×4 tokens, ×16 score elements, ×16 QKᵀ + AV FLOPs" in out
    assert "QKᵀ + AV exceed the projections beyond n = 1024 tokens" in out
    assert main(["cost", "1", "--n-k", "4096", "--d-model", "4096", "--heads", "32", "--kv-heads", "8",
                 "--layers", "32", "--dtype", "bfloat16"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "h_kv=8 (GQA)" in out and out.splitlines()[3].split()[-2:] == ["512", "MiB"]
    assert main(["cost", "10", "--heads", "7"]) == 2
    assert "heads: 7 heads do not divide d_model=512" in capsys.readouterr().err
