"""The cost model against the articles' figures and hand counts; the ``attnlab cost`` command."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from attnlab.errors import DTypeError, OptionError, ShapeError


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
    with pytest.raises(OptionError, match="n_q: expected an int >= 1, got 0"):
        attention_cost(0)
    with pytest.raises(OptionError, match="n_k: expected an int >= 1, got True"):
        causal_pairs(3, True)
    with pytest.raises(DTypeError, match="dtype: 'U' is <U0, not a numeric dtype"):
        bytes_per_element("U")
    with pytest.raises(OptionError, match="causal: expected one of False, True, got 'yes'"):
        attention_cost(4, causal="yes")


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
    assert capsys.readouterr().err == (
        "attnlab cost: error: --heads: 7 heads do not divide --d-model=512 (d_head = d_model / heads must be an int)\n"
    )


def _pairs_by_mask(n_q, n_k):  # the independent count: the mask itself, one row at a time
    return sum(int(row.sum()) for row in masks.causal(n_q, n_k, align="bottom_right"))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 70), st.integers(1, 70))
def test_causal_pairs_formula_equals_counting_the_mask(n_q, n_k):
    assert causal_pairs(n_q, n_k) == _pairs_by_mask(n_q, n_k)
    c = attention_cost(n_q, n_k, causal=True, d_model=16, heads=2)
    assert c.pairs == _pairs_by_mask(n_q, n_k) and c.score_flops == 2 * 2 * c.pairs * 8


def test_causal_counts_are_exact_for_huge_n():
    # closed forms: no array of n (10^18 would need 8 EB), exact Python ints (no float rounding)
    n = 10**18
    assert causal_pairs(n) == n * (n + 1) // 2 == 500000000000000000500000000000000000
    assert causal_pairs(n, 3 * 10**9) == 3 * 10**9 * (3 * 10**9 + 1) // 2  # n_q > n_k: only the last n_k rows
    assert causal_pairs(3 * 10**9, n) == 3 * 10**9 * n - (3 * 10**9) * (3 * 10**9 - 1) // 2
    c = attention_cost(10**12, causal=True)
    assert c.pairs == 10**12 * (10**12 + 1) // 2 and type(c.pairs) is int
    assert c.score_flops == 2 * 8 * c.pairs * 64 == 512 * 10**12 * (10**12 + 1) == 512000000000512000000000000
    assert c.score_elements == 8 * 10**24 and c.kv_cache_bytes == 10**12 * 8 * 64 * 2 * 2
    assert crossover_length(10**18, heads=8, kv_heads=2) == 10**18 + 2 * 10**18 // 8  # exact, no float


def test_sizes_given_as_numpy_ints_do_not_overflow():
    c = attention_cost(np.int64(2**20), d_model=np.int64(2**20), heads=np.int64(8))
    # Q, O: 2·n·d²·2 = 2^62; K, V: 2·n·d·h_kv·d_head·2 = 2^62; together 2^63, one past int64's range
    assert c.projection_flops == 2 * 2**20 * 2**40 * 2 + 2 * 2**20 * 2**20 * 8 * 2**17 * 2 == 2**63
    assert type(c.projection_flops) is int


def test_cost_command_with_huge_causal_n(capsys):
    assert main(["cost", "1000000000000", "--causal"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(", causal")
    assert lines[2].split()[:3] == ["n_q", "n_k", "causal"]
    assert lines[3].split()[:3] == ["1000000000000", "1000000000000", "500,000,000,000,500,000,000,000"]
    assert main(["cost", "1e18", "3000000000", "--causal"]) == 0
    out = capsys.readouterr().out
    assert "500,000,000,000,000,000,500,000,000,000,000,000" in out and "4,500,000,001,500,000,000" in out
    assert "×3e-09 tokens" in out


def test_cost_command_passes_on_every_attention_cost_keyword():
    """`attnlab cost` reads attention_cost's keywords from its signature: each has an option of the same name."""
    import argparse
    import inspect

    from attnlab.commands import cost as command

    params = inspect.signature(attention_cost).parameters
    assert command.cost_options() == tuple(params)[1:] == ("n_k", "batch", "d_model", "heads", "kv_heads", "layers",
                                                            "dtype", "causal")  # fmt: skip
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = vars(parser.parse_args(["16"]))
    assert {name: args[name] for name in command.cost_options()} == {name: params[name].default for name in params
                                                                      if name != "n_q"}  # fmt: skip
    text = command.cost_text([16, 32], heads=4, kv_heads=2, dtype="float32", causal=True)
    assert text.splitlines()[0] == (
        "attention cost: B=1, d_model=512, h=4 (d_head=128), h_kv=2 (GQA), layers=1, float32 (4 B/element), causal"
    )
    assert text == command.cost_text([16, 32], n_k=None, batch=1, heads=4, kv_heads=2, dtype="float32", causal=True)
    with pytest.raises(TypeError):
        command.cost_text([16], head=4)
