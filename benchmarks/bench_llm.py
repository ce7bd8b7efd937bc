"""SmolLM2-135M on attnlab vs. Hugging Face transformers (eager and sdpa), same prompt, same process, same threads.

Measures, for each implementation:

* prefill: one forward over a 1,024-token prompt (seconds, tokens/s);
* decode: greedy tokens/s over ``--new`` tokens after that prompt (KV cache on both sides);
* attnlab only: the time of one cached decode step at several context lengths, with a least-squares line
  ``t(L) = a + b·L`` — the KV cache promises cost linear in the context (and not the quadratic of recomputing).

Run::

    python benchmarks/bench_llm.py                 # 1 BLAS/torch thread (fair on a busy 2-core machine)
    python benchmarks/bench_llm.py --threads 2 --new 64

Numbers are wall-clock medians on whatever else the machine is doing; both sides run interleaved in the same
process so they see the same conditions. The HF model is loaded from the same GGUF file, offline.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

TEXT = (
    "Attention lets every token of a sequence read from every earlier token. For each query the model scores all "
    "keys, turns the scores into weights with a softmax, and returns the weighted average of the values. A causal "
    "mask hides the future, so that a language model can be trained on whole sentences at once and still predict "
    "each next word from the words before it. Rotary position embeddings rotate queries and keys by an angle that "
    "grows with their position, which makes each score depend on the distance between two tokens. During "
    "generation the keys and values of past tokens never change, so they are kept in a cache and each new token "
    "costs one row of attention instead of a whole matrix. "
)


def prompt_ids(model, n: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < n:
        ids += model.encode(TEXT)
    return ids[:n]


def bench_attnlab(model, ids, new: int, threads: int, reps: int):
    from attnlab.models.llama import generate

    prefill, tps, gens = [], [], []
    for _ in range(reps):
        g = generate(model, ids, max_new_tokens=new + 1, stop_at_eos=False, blas_threads=threads)
        prefill.append(g.prefill_s)
        tps.append(g.decode_tokens_per_s)
        gens.append(g.new_ids)
    return statistics.median(prefill), statistics.median(tps), gens[0]


def bench_hf(hf, ids, new: int, reps: int):
    import torch

    prefill, tps, gens = [], [], []
    x = torch.tensor([ids])
    for _ in range(reps):
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = hf(x, use_cache=True)
            nxt = int(out.logits[0, -1].argmax())
            prefill.append(time.perf_counter() - t0)
            toks = [nxt]
            t0 = time.perf_counter()
            for _ in range(new):
                out = hf(torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
                nxt = int(out.logits[0, -1].argmax())
                toks.append(nxt)
            tps.append(new / (time.perf_counter() - t0))
        gens.append(tuple(toks))
    return statistics.median(prefill), statistics.median(tps), gens[0]


def decode_step_vs_context(model, lengths, threads: int, steps: int = 5):
    """Median time of one cached decode step with ``L`` tokens already cached (cache filled with random k/v)."""
    from attnlab.models.llama import llama_forward, make_cache

    c = model.config
    rng = np.random.default_rng(0)
    rows = []
    for L in lengths:
        cache = make_cache(model, 1, capacity=L + steps + 1)
        for layer_cache in cache:
            k = rng.standard_normal((1, c.num_kv_heads, L, c.head_dim)).astype(np.float32)
            layer_cache.append(k, k)
        times = []
        for i in range(steps):
            t0 = time.perf_counter()
            llama_forward(model, np.array([[42 + i]]), cache=cache, last_only=True, blas_threads=threads)
            times.append(time.perf_counter() - t0)
        rows.append((L, statistics.median(times)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens (1024)")
    ap.add_argument("--new", type=int, default=32, help="decoded tokens (32)")
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads for attnlab and torch threads for HF (1)")
    ap.add_argument("--reps", type=int, default=2, help="repetitions, median reported (2)")
    ap.add_argument("--contexts", default="256,1024,2048,4096", help="context lengths for the decode-step line")
    args = ap.parse_args(argv)

    import torch
    from transformers import LlamaForCausalLM

    from attnlab.kernels.threads import blas_report, pinned_blas
    from attnlab.models.gguf import load_smollm2, smollm2_gguf_path

    torch.set_num_threads(args.threads)
    with pinned_blas(args.threads):
        print(blas_report().line())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); cores available: {os.cpu_count()}")
    t0 = time.perf_counter()
    model = load_smollm2()
    print(f"attnlab: SmolLM2 loaded from GGUF in {time.perf_counter() - t0:.1f} s")
    p = smollm2_gguf_path()
    hfs = {}
    for impl in ("eager", "sdpa"):
        t0 = time.perf_counter()
        hfs[impl] = LlamaForCausalLM.from_pretrained(
            p.parent, gguf_file=p.name, attn_implementation=impl, dtype=torch.float32
        ).eval()
        print(f"HF {impl}: loaded in {time.perf_counter() - t0:.1f} s")
    ids = prompt_ids(model, args.prompt)

    results = {}
    for name in ("attnlab", "hf-eager", "hf-sdpa"):  # interleaved warm-up, then measured
        if name == "attnlab":
            bench_attnlab(model, ids[:64], 2, args.threads, 1)
            results[name] = bench_attnlab(model, ids, args.new, args.threads, args.reps)
        else:
            hf = hfs[name.split("-")[1]]
            bench_hf(hf, ids[:64], 2, 1)
            results[name] = bench_hf(hf, ids, args.new, args.reps)

    print(f"\nprompt {len(ids)} tokens, {args.new} decoded tokens (greedy, KV cache), {args.threads} thread(s)")
    print(f"{'implementation':<12} {'prefill s':>10} {'prefill tok/s':>14} {'decode tok/s':>13} {'vs HF eager':>12}")
    eager_tps = results["hf-eager"][1]
    for name, (pre, tps, _) in results.items():
        print(f"{name:<12} {pre:>10.3f} {len(ids) / pre:>14.0f} {tps:>13.1f} {tps / eager_tps:>11.2f}x")
    same = results["attnlab"][2][: args.new] == results["hf-eager"][2][: args.new]
    print(f"attnlab and HF eager generate the same {args.new} tokens: {same}")

    lengths = [int(x) for x in args.contexts.split(",")]
    rows = decode_step_vs_context(model, lengths, args.threads)
    L = np.array([r[0] for r in rows], dtype=np.float64)
    t = np.array([r[1] for r in rows])
    b, a = np.polyfit(L, t, 1)
    fit = a + b * L
    r2 = 1 - np.sum((t - fit) ** 2) / max(np.sum((t - t.mean()) ** 2), 1e-30)
    print("\nattnlab decode step vs. context (KV cache holding L tokens):")
    for (n, s), f in zip(rows, fit, strict=True):
        print(f"  L={n:>5}: {s * 1e3:8.2f} ms/token  (line: {f * 1e3:8.2f} ms)")
    verdict = (
        "linear in L, as the cache promises"
        if r2 >= 0.9
        else "the times are too noisy for a line: other processes share the cores; rerun, or use --threads 1"
    )
    print(f"  t(L) = {a * 1e3:.2f} ms + {b * 1e6:.3f} µs · L   (R² = {r2:.3f}; {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
