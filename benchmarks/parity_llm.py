"""SmolLM2's float32 logits against float64: attnlab's error and Hugging Face's, on many short prompts.

    python benchmarks/parity_llm.py [--quick | --unusual]

For 26 texts, each cut to 1, 2 and 3 tokens and taken whole (104 prompts; ``--quick``: the first 6 texts), prints
attnlab's and HF's float32 max-abs error against attnlab's float64 model, their ratio, HF's float64 run against
that reference, and attnlab against HF directly; then the worst of each and the K that the parity rule of
``tests/test_llama.py`` (attnlab <= 3x HF + K float32 roundings of the largest logit) needs on these prompts.
One BLAS thread and one torch thread, as the tests. Takes ~3 minutes on a quiet 2-core machine (loading HF from the
GGUF file is ~25 s of it). The result depends on the CPU and the kernels each library picks there: the first line
names them (``attnlab bench`` prints the same).
"""

from __future__ import annotations

import argparse
import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

TEXTS = [
    "The capital of France is", "Hello world, how are", "def fibonacci(n):", "Water boils at 100",
    "<|im_start|>user\nWhat", "1 2 3 4", "Once upon a time", "import numpy as np", "A cat sat on", "In 1492 Columbus",
    "The quick brown fox", "Attention is all", "Paris is the", "What is the", "I think that", "x = 5", "# Title",
    "She said", "Why do", "print(", "My name is", "Today the weather", "Q: What", "The the the", "!!!", "Ünïcödé",
]  # fmt: skip


#: ``--unusual``: the prompts on which a fuzz run found the largest errors (issue 23): single tokens, one token many
#: times, and long prose (the texts above joined, repeated).
UNUSUAL_ONE = ["The", "!", "x", "Ü", "\n", "1", " the", "<|im_start|>"]
UNUSUAL_REPEATED = [("the " * 128, (8, 32, 128)), ("!" * 128, (8, 32, 128)), ("1 " * 128, (16, 64, 128))]
UNUSUAL_LONG = (" ".join(TEXTS) + " ") * 8


def _prompts(model, args):
    """``(text, cuts)`` pairs: the texts cut to 1, 2, 3 tokens and whole (cuts None), or ``--unusual``'s."""
    if not args.unusual:
        return [(t, None) for t in (TEXTS[:6] if args.quick else TEXTS)]
    n_long = len(model.encode(UNUSUAL_LONG))
    return (
        [(t, (1,)) for t in UNUSUAL_ONE]
        + UNUSUAL_REPEATED
        + [(UNUSUAL_LONG, tuple(n for n in (100, 200, 400) if n <= n_long))]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the first 6 texts only")
    parser.add_argument(
        "--unusual",
        action="store_true",
        help="unusual prompts instead: one token, one token repeated (8 to 128 times), and long (~100 to ~400 tokens)",
    )
    args = parser.parse_args()

    import torch
    import transformers.utils.logging as hf_logging
    from threadpoolctl import threadpool_limits
    from transformers import LlamaForCausalLM

    from attnlab.bench import cpu_report
    from attnlab.kernels.threads import blas_report
    from attnlab.models.gguf import load_smollm2, smollm2_gguf_path
    from attnlab.models.llama import llama_forward

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    print(cpu_report().line())
    print(blas_report().line() + f"; PyTorch {torch.__version__} {torch.backends.cpu.get_cpu_capability()}")
    model = load_smollm2()
    model64 = model.astype(np.float64)
    path = smollm2_gguf_path()
    hf = LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name, attn_implementation="eager",
                                          dtype=torch.float32).eval()  # fmt: skip
    hf64 = copy.deepcopy(hf).double()
    rows = []
    with threadpool_limits(1, user_api="blas"), torch.no_grad():
        for text, cuts in _prompts(model, args):
            full = model.encode(text)
            for n in cuts or (1, 2, 3, len(full)):
                ids = full[:n]
                exact = llama_forward(model64, ids).logits
                ours = llama_forward(model, ids).logits.astype(np.float64)
                theirs = hf(torch.tensor([ids])).logits.numpy().astype(np.float64)
                theirs64 = hf64(torch.tensor([ids])).logits.numpy()
                r = {
                    "ours": np.abs(ours - exact).max(),
                    "hf": np.abs(theirs - exact).max(),
                    "hf64": np.abs(theirs64 - exact).max(),
                    "direct": np.abs(ours - theirs).max(),
                    "big": np.abs(exact).max(),
                }
                rows.append(r)
                print(
                    f"{text[:18]!r:22} n={n:2}  attnlab {r['ours']:.2e}  HF {r['hf']:.2e}  ratio "
                    f"{r['ours'] / r['hf']:5.2f}  HF float64 {r['hf64']:.1e}  attnlab-HF {r['direct']:.2e}  "
                    f"max|logit| {r['big']:.1f}",
                    flush=True,
                )
    u = 2.0**-24
    k_needed = max((r["ours"] - 3 * r["hf"]) / (u * r["big"]) for r in rows)
    lo, hi = (lambda key: min(r[key] for r in rows)), (lambda key: max(r[key] for r in rows))
    print(
        f"\n{len(rows)} prompts: attnlab's error {lo('ours'):.2e} - {hi('ours'):.2e}, HF's {lo('hf'):.2e} - "
        f"{hi('hf'):.2e}, ratio up to {max(r['ours'] / r['hf'] for r in rows):.2f}; attnlab against HF up to "
        f"{hi('direct'):.2e}; HF float64 against attnlab float64 up to {hi('hf64'):.1e}"
    )
    print(
        f"the rule attnlab <= 3 x HF + K * 2^-24 * max|logit| needs K >= {max(k_needed, 0):.1f} here "
        f"(the tests use K = 50: worst use of the bound "
        f"{max(r['ours'] / (3 * r['hf'] + 50 * u * r['big']) for r in rows):.2f})"
    )


if __name__ == "__main__":
    main()
