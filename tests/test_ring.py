"""Ring attention on 2 and 4 real processes (gloo on 127.0.0.1) against single-process attention.

One spawn per world size runs every case (the processes cost seconds to start); each rank returns its shards,
stats and errors, and the assertions run here, against attnlab's core in float64 (outputs) and PyTorch autograd
through it (gradients), under FlashAttention's rule: error vs float64 <= 2x (outputs) / 3x (gradients) the error
of naive attention in the same precision, plus a small floor.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.distributed import RingLayout, ring_attention, ring_attention_backward, ring_attention_forward
from attnlab.distributed.launch import spawn

# name -> case; n_k defaults to n
CASES: dict[str, dict] = {
    "full-gqa-uneven": dict(n=13, B=2, h=4, h_kv=2, d_k=6, d_v=3, causal=False, layout="contiguous", block=4),
    "causal-zigzag-mqa": dict(n=29, B=1, h=4, h_kv=1, d_k=5, d_v=7, causal=True, layout="zigzag", block=3),
    "causal-contiguous": dict(n=21, B=2, h=2, h_kv=2, d_k=4, d_v=4, causal=True, layout="contiguous", block=4),
    "padding-zero": dict(
        n=18, B=3, h=2, h_kv=1, d_k=4, d_v=3, causal=True, layout="zigzag", block=4,
        lengths=[18, 11, 5], query_lengths=[18, 11, 5], masked_rows="zero",
    ),
    "padding-keys-only": dict(
        n=19, B=2, h=2, h_kv=2, d_k=3, d_v=5, causal=False, layout="contiguous", block=5, lengths=[7, 19],
    ),
    "padding-nan-float64": dict(
        n=16, B=2, h=2, h_kv=2, d_k=4, d_v=4, causal=False, layout="zigzag", block=4,
        lengths=[16, 0], masked_rows="nan", dtype="float64",
    ),
    "cross-bottom-right": dict(
        n=10, n_k=23, B=1, h=2, h_kv=1, d_k=4, d_v=6, causal="bottom_right", layout="contiguous", block=4,
    ),
    "cross-bottom-right-empty-rows": dict(
        n=23, n_k=10, B=1, h=2, h_kv=2, d_k=4, d_v=2, causal="bottom_right", layout="contiguous", block=4,
        masked_rows="zero",
    ),
    "causal-zigzag-float64": dict(
        n=40, B=1, h=2, h_kv=2, d_k=8, d_v=8, causal=True, layout="zigzag", block=8, dtype="float64",
    ),
    "functional-api": dict(
        n=17, B=1, h=2, h_kv=1, d_k=4, d_v=3, causal=True, layout="zigzag", block=4, api="functional",
    ),
    "bfloat16-causal-zigzag": dict(
        n=26, B=1, h=4, h_kv=2, d_k=8, d_v=4, causal=True, layout="zigzag", block=4, dtype="bfloat16",
    ),
    "raise": dict(
        n=12, B=2, h=2, h_kv=2, d_k=4, d_v=4, causal=True, layout="contiguous", block=4, query_lengths=[12, 9],
        lengths=[12, 0],
    ),
}  # fmt: skip

BALANCE = dict(n=64, B=1, h=1, h_kv=1, d_k=4, d_v=4, causal=True, block=4, block_k=4)


def _full(case: dict) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(zlib.crc32(repr(sorted(case.items())).encode()))
    n, n_k = case["n"], case.get("n_k", case["n"])
    shapes = {
        "q": (case["B"], case["h"], n, case["d_k"]),
        "k": (case["B"], case["h_kv"], n_k, case["d_k"]),
        "v": (case["B"], case["h_kv"], n_k, case["d_v"]),
        "dO": (case["B"], case["h"], n, case["d_v"]),
    }
    return {name: torch.randn(s, generator=gen, dtype=torch.float64) for name, s in shapes.items()}


def _opts(case: dict) -> dict:
    return dict(
        causal=case["causal"],
        layout=case["layout"],
        key_lengths=case.get("lengths"),
        query_lengths=case.get("query_lengths"),
        masked_rows=case.get("masked_rows", "raise"),
        block_q=case["block"],
        block_k=case.get("block_k", case["block"] + 1),  # different tile sizes on purpose
    )


def _run_case(rank: int, world: int, case: dict) -> dict:
    dtype = getattr(torch, case.get("dtype", "float32"))
    full = _full(case)
    lay_q = RingLayout(case["n"], world, case["layout"])
    lay_k = RingLayout(case.get("n_k", case["n"]), world, case["layout"])
    q = lay_q.shard(full["q"], rank).to(dtype)
    k = lay_k.shard(full["k"], rank).to(dtype)
    v = lay_k.shard(full["v"], rank).to(dtype)
    dO = lay_q.shard(full["dO"], rank).to(dtype)
    before = [x.clone() for x in (q, k, v)]
    try:
        if case.get("api") == "functional":
            fwd = ring_attention_forward(q, k, v, **_opts(case))
            grads = ring_attention_backward(fwd, dO)
            out, dq, dk, dv = fwd.output, grads.dq, grads.dk, grads.dv
            stats = (fwd.stats, grads.stats)
        else:
            leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
            out = ring_attention(*leaves, **_opts(case))
            out.backward(dO)
            dq, dk, dv = (x.grad for x in leaves)
            fwd = ring_attention_forward(q, k, v, **_opts(case))
            stats = (fwd.stats,)
    except attnlab.AttnlabError as err:
        return {"error": (type(err).__name__, str(err), getattr(err, "rows", None))}
    unchanged = all(torch.equal(a, b) for a, b in zip(before, (q, k, v), strict=True))
    return {
        "out": out.detach(),
        "lse": fwd.lse,
        "dq": dq,
        "dk": dk,
        "dv": dv,
        "rows": fwd.masked_rows,
        "stats": stats,
        "unchanged": unchanged,
    }


def _bad_inputs(rank: int, world: int) -> dict:
    """Bad input on one rank only: every rank must raise instead of waiting for the others."""
    res = {}
    lay = RingLayout(16, world, "zigzag")
    full = torch.randn(1, 2, 16, 4)
    q = lay.shard(full, rank)
    q_nan = q.clone()
    if rank == 1:
        q_nan[0, 1, 2, 3] = math.nan
    uneven = torch.randn(1, 2, 16 // world + (1 if rank == 0 else 0) - (1 if rank == world - 1 else 0), 4)
    d_bad = torch.randn(1, 2, q.shape[-2], 5 if rank == world - 1 else 4)
    for name, args, kw in (
        ("nan-on-rank-1", (q_nan, q, q), dict(layout="zigzag")),
        ("d_k-on-last-rank", (d_bad, d_bad, d_bad), dict(layout="zigzag")),
        ("layout-disagree", (q, q, q), dict(layout="zigzag" if rank == 0 else "contiguous")),
        ("lengths-disagree", (q, q, q), dict(layout="zigzag", key_lengths=[16 if rank == 0 else 15])),
        ("uneven-sizes", (uneven, uneven, uneven), dict(layout="contiguous")),
    ):
        try:
            ring_attention_forward(*args, **kw)
            res[name] = None
        except attnlab.AttnlabError as err:
            res[name] = (type(err).__name__, str(err))
    # the group still works after all those refusals
    res["after"] = ring_attention_forward(q, q, q, layout="zigzag", causal=True).output
    return res


def _worker(rank: int, world: int) -> dict:
    results = {name: _run_case(rank, world, case) for name, case in CASES.items()}
    for layout in ("contiguous", "zigzag"):
        results[f"balance-{layout}"] = _run_case(rank, world, {**BALANCE, "layout": layout})
    results["bad"] = _bad_inputs(rank, world)
    return results


@pytest.fixture(scope="module", params=[2, 4], ids=lambda p: f"P{p}")
def ring(request) -> tuple[int, list[dict]]:
    world = request.param
    return world, spawn(_worker, world, timeout=240, op_timeout=60, threads=1)


# --------------------------------------------------------------------------------------------------------------
# references


def _reference(case: dict, dtype: torch.dtype, policy: str) -> dict[str, torch.Tensor]:
    full = _full(case)
    g = case["h"] // case["h_kv"]
    n, n_k = case["n"], case.get("n_k", case["n"])
    mask = np.ones((case["B"], 1, n, n_k), dtype=bool)
    if case.get("lengths") is not None:
        mask = mask & masks.key_padding(case["lengths"], n_k)
    if case.get("query_lengths") is not None:
        mask = mask & masks.query_padding(case["query_lengths"], n)
    leaves = [full[x].to(dtype).requires_grad_(True) for x in ("q", "k", "v")]
    q, k, v = leaves
    out = attnlab.scaled_dot_product_attention(
        q,
        k.repeat_interleave(g, dim=-3),
        v.repeat_interleave(g, dim=-3),
        torch.from_numpy(mask),
        causal=case["causal"],
        masked_rows=policy,
    )
    out.backward(torch.nan_to_num(full["dO"].to(dtype)))
    res = {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    return {name: x.to(torch.float64) for name, x in res.items()}


def _gathered(case: dict, world: int, results: list[dict], name: str) -> dict[str, torch.Tensor]:
    lay_q = RingLayout(case["n"], world, case["layout"])
    lay_k = RingLayout(case.get("n_k", case["n"]), world, case["layout"])
    per = [r[name] for r in results]
    return {
        "out": lay_q.unshard([p["out"] for p in per]).to(torch.float64),
        "lse": lay_q.unshard([p["lse"][..., None] for p in per])[..., 0].to(torch.float64),
        "dq": lay_q.unshard([p["dq"] for p in per]).to(torch.float64),
        "dk": lay_k.unshard([p["dk"] for p in per]).to(torch.float64),
        "dv": lay_k.unshard([p["dv"] for p in per]).to(torch.float64),
    }


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    both_nan = torch.isnan(a) & torch.isnan(b)
    assert torch.equal(torch.isnan(a), torch.isnan(b)), "NaN in different places"
    return float((a - b).masked_fill(both_nan, 0).abs().max())


EXACT = [n for n in CASES if n != "raise"]


@pytest.mark.parametrize("name", EXACT)
def test_outputs_and_grads_match_single_process(ring, name):
    world, results = ring
    case = CASES[name]
    dtype = getattr(torch, case.get("dtype", "float32"))
    policy = case.get("masked_rows", "raise")
    got = _gathered(case, world, results, name)
    grad_policy = "zero" if policy == "nan" else policy  # documented: fully masked rows get zero gradient
    ref = {**_reference(case, torch.float64, grad_policy), "out": _reference(case, torch.float64, policy)["out"]}
    floor = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-2}[dtype]
    naive = _reference(case, dtype, grad_policy) if dtype != torch.float64 else dict(ref)
    for key, factor in (("out", 2), ("dq", 3), ("dk", 3), ("dv", 3)):
        err, base = _err(got[key], ref[key]), _err(naive[key], ref[key])
        assert err <= factor * base + floor, f"{name} {key}: error {err:.3g} vs naive {dtype} {base:.3g} (P={world})"
    assert all(r[name]["unchanged"] for r in results), "inputs were modified"


@pytest.mark.parametrize("name", EXACT)
def test_lse_matches_core(ring, name):
    world, results = ring
    case = CASES[name]
    full = _full(case)
    g = case["h"] // case["h_kv"]
    n, n_k = case["n"], case.get("n_k", case["n"])
    mask = np.ones((case["B"], 1, n, n_k), dtype=bool)
    if case.get("lengths") is not None:
        mask = mask & masks.key_padding(case["lengths"], n_k)
    if case.get("query_lengths") is not None:
        mask = mask & masks.query_padding(case["query_lengths"], n)
    dtype = getattr(torch, case.get("dtype", "float32"))
    q, k, v = (full[x].to(dtype).double() for x in ("q", "k", "v"))  # the values the ranks actually hold
    t = attnlab.attention_trace(
        q.numpy(),
        k.repeat_interleave(g, dim=-3).numpy(),
        v.repeat_interleave(g, dim=-3).numpy(),
        mask,
        causal=case["causal"],
        masked_rows="zero",
    )
    got = _gathered(case, world, results, name)["lse"].numpy()
    tol = 1e-12 if case.get("dtype") == "float64" else 1e-5
    assert np.array_equal(np.isneginf(got), np.isneginf(t.lse))
    fin = np.isfinite(t.lse)
    np.testing.assert_allclose(got[fin], t.lse[fin], rtol=0, atol=tol)
    assert sorted(results[0][name]["rows"]) == sorted(t.masked_rows)


def test_fully_masked_rows_follow_the_policy(ring):
    world, results = ring
    zero = _gathered(CASES["padding-zero"], world, results, "padding-zero")
    assert torch.all(zero["out"][1, :, 11:] == 0) and torch.all(zero["out"][2, :, 5:] == 0)
    assert torch.all(zero["dq"][1, :, 11:] == 0)
    nan = _gathered(CASES["padding-nan-float64"], world, results, "padding-nan-float64")
    assert torch.isnan(nan["out"][1]).all() and not torch.isnan(nan["out"][0]).any()
    assert torch.all(nan["dq"][1] == 0) and torch.all(nan["dk"][1] == 0)  # no NaN leaks into gradients


def test_masked_rows_raise_on_every_rank_with_the_core_rows(ring):
    _, results = ring
    case = CASES["raise"]
    with pytest.raises(attnlab.MaskedRowError) as core:
        attnlab.scaled_dot_product_attention(
            np.zeros((2, 2, 12, 4)),
            np.zeros((2, 2, 12, 4)),
            np.zeros((2, 2, 12, 4)),
            masks.key_padding([12, 0], 12) & masks.query_padding([12, 9], 12),
            causal=True,
        )
    for r in results:
        kind, message, rows = r["raise"]["error"]
        assert kind == "MaskedRowError"
        assert "may attend to no key at all" in message and "masked_rows='zero'" in message
        assert sorted(rows) == sorted(core.value.rows)
    assert len({r["raise"]["error"][1] for r in results}) == 1, "ranks disagree"
    assert case["n"] == 12


def test_bad_input_on_one_rank_raises_on_every_rank(ring):
    world, results = ring
    for r, res in enumerate(results):
        kind, message = res["bad"]["nan-on-rank-1"]
        assert kind == "NonFiniteError"
        assert "q: holds nan at index (0, 1, 2, 3)" in message
        if r != 1:
            assert message.startswith(f"rank 1 of {world} rejected its inputs")
        kind, message = res["bad"]["d_k-on-last-rank"]
        assert kind == "ShapeError" and "ranks disagree" in message and f"rank {world - 1} has" in message
        kind, message = res["bad"]["uneven-sizes"]
        assert kind == "ShapeError" and "RingLayout(16, " in message and "'contiguous'" in message
        kind, message = res["bad"]["layout-disagree"]
        assert kind == "ShapeError" and "ranks disagree" in message and "'zigzag'" in message
        kind, message = res["bad"]["lengths-disagree"]
        assert kind == "ShapeError" and "ranks disagree" in message and "[15]" in message
        assert res["bad"]["after"].shape[-2] == RingLayout(16, world, "zigzag").size(r)


def test_zigzag_balances_causal_work(ring):
    world, results = ring
    flops = {layout: [r[f"balance-{layout}"]["stats"][0].flops for r in results] for layout in ("contiguous", "zigzag")}
    assert max(flops["zigzag"]) == min(flops["zigzag"]), flops
    # contiguous: rank r sees r full blocks and its diagonal one, so the work grows with the rank
    assert flops["contiguous"] == sorted(flops["contiguous"]) and max(flops["contiguous"]) > world * min(
        flops["contiguous"]
    )
    # and the balanced split does not do more work in total than the causal triangle needs
    assert sum(flops["zigzag"]) == sum(flops["contiguous"])


def test_bytes_sent_follow_the_cost_model(ring):
    world, results = ring
    case = CASES["functional-api"]  # float32, forward and backward through the functional API
    lay_k = RingLayout(case["n"], world, case["layout"])
    per_pos = case["B"] * case["h_kv"] * (case["d_k"] + case["d_v"]) * 4  # k and v of one position, float32
    for r, res in enumerate(results):
        fwd, bwd = res["functional-api"]["stats"]
        # forward: every block except that of rank r+1 leaves rank r (P - 1 hops)
        others = [lay_k.size((r - s) % world) for s in range(world - 1)]
        assert fwd.bytes_sent == sum(others) * per_pos
        # backward: the same k, v hops, plus dk, dv (float32) for every block, one hop more
        assert bwd.bytes_sent == sum(others) * per_pos + sum(lay_k.sizes()) * per_pos
        assert fwd.steps == world
    total_fwd = sum(res["functional-api"]["stats"][0].bytes_sent for res in results)
    assert total_fwd == (world - 1) * case["n"] * per_pos
