"""The checker's options, declared once: :class:`Spec`'s fields are :func:`attnlab.check`'s keywords and
``attnlab check``'s flags.

Each field is declared with :func:`option`: its default, its one-paragraph documentation, its kind (which says how
it is validated and how the command line spells it) and its group (``"function"``: what the function under test is
and supports, recorded in the report's ``spec``; ``"run"``: how the check runs). :class:`Spec` validates every
field when it is built (a bad value is a :class:`UsageError` naming the option), ``check()``'s signature and the
``Args`` of its docstring are generated from the fields, and :mod:`attnlab.commands.check` adds one flag per field
(``mask_form`` -> ``--mask-form``). Adding an option is one declaration here.

>>> spec = Spec(mask_convention="block", gqa="tile")
>>> spec.mask_convention, spec.gqa, spec.gqa_mapping
('block', True, 'tile')
>>> Spec(layout="nhd")
Traceback (most recent call last):
...
attnlab.checker.spec.UsageError: layout: expected one of 'auto', 'bhnd', 'bnhd', got 'nhd'
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import AttnlabError, OptionError
from ..validate import check_choice, check_int
from .report import PROBES

__all__ = [
    "CAPABILITIES",
    "CLAIMS",
    "COMPILE_TIMEOUT",
    "DTYPES",
    "MASKED_ROWS",
    "MASK_FORMS",
    "MAX_TIMEOUT",
    "PARENT_ONLY",
    "Option",
    "Spec",
    "UsageError",
    "listed",
    "option",
    "options",
]


class UsageError(AttnlabError, ValueError):
    """The checker was told something inconsistent about the function (an option value, a missing library)."""


FRAMEWORKS = ("auto", "numpy", "torch", "jax")
SIGNATURES = ("auto", "plain", "sdpa", "jax", "qkv")
CONVENTIONS = ("allow", "block", "additive", "keep")
LAYOUTS = ("auto", "bhnd", "bnhd")
RETURNS = ("auto", "output", "output+weights", "output+lse")
ALIGNS = (None, "top_left", "bottom_right")
#: The input dtypes a function can declare it supports, from the most precise.
DTYPES = ("float64", "float32", "float16", "bfloat16")
GQA_MAPPINGS = ("interleave", "tile")
#: The mask interfaces (one strategy each in :mod:`attnlab.checker.interfaces`): ``full`` ``[B, h, n_q, n_k]``;
#: ``batch`` ``[B, 1, n_q, n_k]`` (broadcast over heads, as Hugging Face's 4-D masks); ``key_padding`` ``[B, n_k]``
#: (in ``mask_convention``: ``allow`` True = real key, ``block`` True = padding, as ``nn.MultiheadAttention``'s
#: ``key_padding_mask``); ``valid_lens`` ``[B]`` int valid key lengths (d2l's ``masked_softmax``); ``kv_cache``
#: ``[B]`` int cache lengths of a decode kernel (the n_q new queries are the last positions of each sequence; causal
#: is bottom-right per sequence, as ``flash_attn_with_kvcache``'s ``cache_seqlens``); ``varlen``: packed
#: variable-length batches, ``q [total_q, h, d]`` with ``cu_seqlens_q/k`` and ``max_seqlen_q/k`` (flash-attn's
#: varlen functions; causal bottom-right per sequence); ``flex``: PyTorch's ``flex_attention`` (the mask, its causal
#: part included, as a ``block_mask`` from ``create_block_mask``, or as a ``score_mod`` with ``mask_arg="score_mod"``).
MASK_FORMS = ("full", "batch", "key_padding", "valid_lens", "kv_cache", "varlen", "flex")
#: Fully-masked-row policies a function may promise: ``any`` documented one (an error, zeros, the uniform average;
#: NaN is a bug), or exactly one of them (``nan`` makes NaN the promise, as ``nn.MultiheadAttention``'s).
MASKED_ROWS = ("any", "raise", "zeros", "uniform", "nan")
#: The rules a declared ``mask_mod`` / ``score_mod`` may claim by name (``claims=``): causal, top-left (as
#: ``q_idx >= kv_idx``, PyTorch's ``is_causal``) unless the alignment is named; any other rule is a callable.
CLAIMS = ("causal", "causal:top_left", "causal:bottom_right")
#: Options only the checking process reads (the ``mods`` probe evaluates them there): a worker process is sent the
#: spec without them (a lambda does not pickle).
PARENT_ONLY = ("mask_mod", "score_mod", "claims")
#: ``timeout`` and ``import_timeout`` at most, in seconds (a day).
MAX_TIMEOUT = 86400.0
#: The default allowance of a compiling function's first call of each shape, in seconds (``compile_timeout``).
COMPILE_TIMEOUT = 120.0

#: Capabilities a probe may need; each can be declared unsupported (``unsupported=`` / ``--unsupported``).
CAPABILITIES = (
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "mask",
    "causal",
    "scale",
    "cross",
    "dv",
    "rank",
    "gqa",
    "causal-cross",
)
#: Capabilities only the gradient side needs (a backward's dropout keep mask and bias), declared the same way.
GRAD_CAPABILITIES = ("dropout", "bias")


# ----------------------------------------------------------------------------------------------------------------
# how an option is declared


@dataclass(frozen=True)
class Option:
    """How one :class:`Spec` field is documented, validated and spelled on the command line.

    ``kind`` is one of ``"choice"`` (one of ``choices``), ``"flag"`` (a bool, ``--flag``), ``"names"`` (several of
    ``choices``: an iterable, or one comma-separated string as the command line passes it), ``"text"`` (a string
    or None), ``"seconds"``, ``"count"`` (an int >= 0) or ``"custom"`` (``validate`` does it all). ``validate``
    replaces the kind's check: ``validate(name, value) -> value`` raising :class:`~attnlab.errors.OptionError`.
    ``cli`` is True (a flag generated from the kind), False (no flag), or the ``argparse.add_argument`` keywords
    to use instead; ``metavar`` names the flag's value in ``--help``.
    """

    doc: str
    kind: str
    choices: tuple = ()
    group: str = "function"
    validate: Callable[[str, Any], Any] | None = None
    cli: bool | dict = True
    metavar: str | None = None

    def check(self, name: str, value: Any) -> Any:
        """``value`` validated and normalised (a tuple for ``names``), or an :class:`OptionError`."""
        if self.validate is not None:
            return self.validate(name, value)
        if self.kind == "choice":
            return check_choice(name, value, self.choices)
        if self.kind == "flag":
            return _flag(name, value)
        if self.kind == "names":
            return _names(name, value, self.choices)
        if self.kind == "text":
            return _text(name, value)
        if self.kind == "seconds":
            return _seconds(name, value)
        if self.kind == "count":
            return check_int(name, value, minimum=0)
        return value


def option(default: Any, doc: str, kind: str, **kw: Any) -> Any:
    """A :class:`Spec` field: its ``default`` and its :class:`Option` (``doc``, ``kind`` and the rest)."""
    return field(default=default, metadata={"option": Option(" ".join(doc.split()), kind, **kw)})


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise OptionError(f"{name}: expected True or False, got {value!r}")


def _text(name: str, value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise OptionError(f"{name}: expected a string or None, got {value!r}")


def listed(value: Any) -> Any:
    """The items of a list option: ``value`` itself, or the items of one comma-separated string
    (``"float64,float32"``), as the command line and the docs write them."""
    return [x.strip() for x in value.split(",") if x.strip()] if isinstance(value, str) else value


def _names(name: str, value: Any, choices: tuple) -> tuple:
    value = listed(value)
    try:
        items = tuple(value)
    except TypeError:
        raise OptionError(f"{name}: expected some of {', '.join(map(repr, choices))}, got {value!r}") from None
    return tuple(check_choice(name, x, choices) for x in items)


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise OptionError(f"{name}: expected a positive number of seconds, got {value!r}")
    seconds = float(value)
    if not seconds > 0:
        raise OptionError(f"{name}: expected a positive number of seconds, got {value!r}")
    if not seconds <= MAX_TIMEOUT:
        raise OptionError(f"{name}: expected a number of seconds at most {MAX_TIMEOUT:g} (a day), got {value!r}")
    return seconds


def _gqa(name: str, value: Any) -> bool | str:
    return check_choice(name, value, (False, True, *GQA_MAPPINGS))


def _ranks(name: str, value: Any) -> tuple[int, ...]:
    items = value.split(",") if isinstance(value, str) else value
    try:
        items = [int(x) if isinstance(x, str) and x.strip().isdigit() else x for x in items]
    except TypeError:
        raise OptionError(f"{name}: expected some of 3, 4, got {value!r}") from None
    ranks = tuple(sorted(set(check_choice(name, r if isinstance(r, bool) else _plain_int(r), (3, 4)) for r in items)))
    if 4 not in ranks:
        raise OptionError(f"{name}: the checker calls with 4-D inputs [B, h, n, d]; got ranks={ranks!r}")
    return ranks


def _plain_int(x: Any) -> Any:
    return int(x) if isinstance(x, np.integer) else x


def _device(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) and isinstance(getattr(value, "type", None), str):
        value = str(value)  # a torch.device
    if isinstance(value, str) and value.strip():
        return value.strip()
    want = "a device such as 'cuda', 'cuda:1', 'mps', 'cpu' or a torch.device"
    raise OptionError(f"{name}: expected {want}, got {value!r}")


def _isolate(name: str, value: Any) -> bool | None:
    return check_choice(name, value, (None, True, False))


def _backward(name: str, value: Any) -> Any:
    if value is None or value is False or value is True or callable(value) or (isinstance(value, str) and value):
        return None if value is False else value
    raise OptionError(f"{name}: expected True, a backward callable or a target string 'file.py:NAME', got {value!r}")


def _callable(name: str, value: Any) -> Any:
    if value is None or callable(value) or (isinstance(value, str) and value.strip()):
        return value
    raise OptionError(f"{name}: expected a callable, a target string 'file.py:NAME' or None, got {value!r}")


def _claims(name: str, value: Any) -> Any:
    if isinstance(value, str) and value.startswith("causal") and value not in CLAIMS:
        raise OptionError(
            f"{name}: expected one of {', '.join(map(repr, CLAIMS))}, a callable rule(n_q, n_k) or a "
            f"target string, got {value!r}"
        )
    return _callable(name, value)


def _probes(name: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = list(listed(value))
    for p in items:
        if p not in PROBES:
            raise OptionError(f"{name}: unknown probe {p!r}; expected some of {', '.join(PROBES)}")
    return tuple(items)


# ----------------------------------------------------------------------------------------------------------------
# the options


@dataclass(frozen=True)
class Spec:
    """What the function under test is and supports, and how the check runs (attributes below, generated from
    the field declarations). Every field has a safe default ("auto" detects)."""

    framework: str = option(
        "auto",
        "the array library: ``numpy``, ``torch``, ``jax`` or ``auto`` (detected from what the function is, its "
        "parameters, its bound values, the names its code uses and its module's imports).",
        "choice",
        choices=FRAMEWORKS,
    )
    signature: str = option(
        "auto",
        "how it is called: ``plain`` ``fn(q, k, v, mask=None)``; ``sdpa`` ``fn(q, k, v, attn_mask=, is_causal=, "
        "scale=)``; ``jax`` ``fn(q, k, v, mask=, is_causal=, scale=)``; ``qkv`` ``fn(q, k, v)`` only; ``auto`` reads "
        "the parameter names.",
        "choice",
        choices=SIGNATURES,
    )
    mask_convention: str = option(
        "allow",
        "``allow`` (bool, True = may attend), ``block`` (bool, True = blocked), ``additive`` (float, 0 or "
        "``finfo(dtype).min``), ``keep`` (int 1 = keep, 0 = masked).",
        "choice",
        choices=CONVENTIONS,
    )
    layout: str = option(
        "auto",
        "``bhnd`` (``[B, h, n, d]``, heads first; any leading dims), ``bnhd`` (``[B, n, h, d]``), or ``auto``: the "
        "layout the function's library documents (``bnhd`` for ``jax.nn.dot_product_attention``, whose inputs are "
        "``[B, T, N, H]``), else ``bhnd``; the report's ``spec`` records the layout used.",
        "choice",
        choices=LAYOUTS,
    )
    returns: str = option(
        "auto",
        "``output``, ``output+weights`` (a pair ``(out, weights)``), ``output+lse`` (a pair ``(out, lse)``, as a "
        "FlashAttention forward's; the lse is not compared) or ``auto`` (a pair is ``(out, weights)``, or "
        "``(out, lse)`` when its second array has one axis fewer than ``out``).",
        "choice",
        choices=RETURNS,
    )
    causal_only: bool = option(False, "the function always applies a causal mask (it takes no causal flag).", "flag")
    causal_align: str | None = option(
        None,
        "the causal alignment you rely on when ``n_q != n_k``: ``top_left``, ``bottom_right``, or None (either is "
        "accepted; the report says which one the function uses).",
        "choice",
        choices=ALIGNS,
    )
    causal_value: str = option(
        "bool",
        "what the causal argument receives: ``bool`` (True) or ``align`` (the alignment string, ``top_left`` / "
        "``bottom_right``, as attnlab's own functions take).",
        "choice",
        choices=("bool", "align"),
    )
    gqa: bool = option(
        False,
        "K and V may have fewer heads than Q (grouped-query attention): False, True, or the mapping "
        "(``interleave`` / ``tile``, which sets ``gqa_mapping``).",
        "custom",
        validate=_gqa,
        cli={"action": "store_true", "help": "K and V may have fewer heads than Q (the mapping: --gqa-mapping)"},
    )
    dtypes: tuple[str, ...] = option(
        DTYPES,
        "the dtypes to try (unsupported ones are reported as such, not as bugs).",
        "names",
        choices=DTYPES,
        metavar="DTYPE,...",
    )
    unsupported: frozenset[str] = option(
        frozenset(),
        f"capabilities declared unsupported, not tested (some of {', '.join((*CAPABILITIES, *GRAD_CAPABILITIES))}).",
        "names",
        choices=(*CAPABILITIES, *GRAD_CAPABILITIES),
        metavar="CAPABILITY,...",
    )
    mask_arg: str | None = option(None, "the mask parameter's name, when ``signature=auto`` guesses wrong.", "text")
    causal_arg: str | None = option(None, "the causal flag parameter's name.", "text")
    scale_arg: str | None = option(None, "the scale parameter's name.", "text")
    dropout_arg: str | None = option(
        None,
        "the gradient side's dropout keep-mask parameter's name (default: ``dropout_mask`` or ``keep_mask``); it is "
        "passed with ``dropout_p=``.",
        "text",
    )
    gqa_mapping: str = option(
        "interleave",
        "with ``gqa``: which K/V head query head i uses: ``interleave`` ``i // (h / h_kv)`` (repeat_interleave, "
        "Hugging Face's repeat_kv, PyTorch's enable_gqa) or ``tile`` ``i % h_kv``.",
        "choice",
        choices=GQA_MAPPINGS,
    )
    compute_dtype: str = option(
        "auto",
        "``auto`` (a float64 function that computes in float32, e.g. a softmax upcast and cast back, is compared "
        "under float32's rule with a ``lower-precision`` note), ``input`` (every dtype under its own rule), or a "
        "dtype the function documents computing in (its rule applies to more precise inputs).",
        "choice",
        choices=("auto", "input", *DTYPES),
    )
    masked_rows: str = option(
        "any",
        "the fully-masked-row policy the function promises: ``any`` (an error, zeros or the uniform average; NaN "
        "is a bug), ``raise``, ``zeros``, ``uniform`` or ``nan``; another behaviour is a ``masked-row-policy`` "
        "finding.",
        "choice",
        choices=MASKED_ROWS,
    )
    causal_when_no_mask: bool = option(
        False,
        "the function applies a causal mask (top-left) whenever it is given no mask (as Hugging Face's sdpa path "
        "does); cases without a mask are then checked as causal.",
        "flag",
    )
    ranks: tuple[int, ...] = option(
        (3, 4),
        "the input ranks the function takes: ``(3, 4)`` (3-D ``[h, n, d]`` is tried, and a clean refusal is "
        "'not tested') or ``(4,)`` (never called with 3-D inputs).",
        "custom",
        validate=_ranks,
        metavar="3,4",
    )
    mask_form: str = option(
        "full",
        "the mask interface: ``full`` ``[B, h, n_q, n_k]``, ``batch`` ``[B, 1, n_q, n_k]``, ``key_padding`` "
        "``[B, n_k]``, ``valid_lens`` ``[B]`` lengths, ``kv_cache`` ``[B]`` cache lengths of a decode kernel, "
        "``varlen`` packed ``cu_seqlens``, ``flex`` a flex_attention ``block_mask`` (or ``score_mod`` with "
        "``mask_arg='score_mod'``; selected by a ``block_mask`` parameter) (see ``MASK_FORMS``); the probes draw "
        "masks the form can express.",
        "choice",
        choices=MASK_FORMS,
    )
    mask_mod: object = option(  # a callable, a target string or None
        None,
        "a flex_attention ``mask_mod(b, h, q_idx, kv_idx) -> bool`` of yours (True = may attend), or a target "
        "string ``file.py:NAME`` (command line: ``--mask-mod NAME``, a function in the target's file): the ``mods`` "
        "probe evaluates it as flex does over the case space and compares it with the dense rule it ``claims`` "
        "(a difference is ``mod-mismatch``, naming its kind: swapped arguments, the other alignment, one diagonal "
        "off).",
        "custom",
        validate=_callable,
        metavar="NAME",
    )
    score_mod: object = option(  # a callable, a target string or None
        None,
        "a flex_attention ``score_mod(score, b, h, q_idx, kv_idx)`` of yours that masks (-inf where blocked), "
        "checked like ``mask_mod``; the scores it keeps must come back unchanged (flex applies ``scale`` itself).",
        "custom",
        validate=_callable,
        metavar="NAME",
    )
    claims: object = option(  # a rule name, a callable, a target string or None
        None,
        "the dense rule the declared ``mask_mod`` / ``score_mod`` implements: ``causal`` (top-left, "
        "``q_idx >= kv_idx``), ``causal:top_left``, ``causal:bottom_right``, or a callable ``rule(n_q, n_k)`` "
        "returning a bool mask ``[n_q, n_k]`` (True = may attend; e.g. ``functools.partial(attnlab.masks.window, "
        "left=3)``), or a target string.",
        "custom",
        validate=_claims,
        metavar="RULE",
    )
    device: str | None = option(
        None,
        "torch (and JAX): the device every input is created on (``cuda``, ``cuda:1``, ``mps``, ``cpu`` or a "
        "``torch.device``; default: the library's default device); outputs are copied to the CPU and compared with "
        "the float64 NumPy golden there. A NumPy function takes no device.",
        "custom",
        validate=_device,
        metavar="DEV",
    )
    timeout: float = option(
        10.0,
        f"seconds one call may take (at most {MAX_TIMEOUT:g}); after a timeout nothing more is called (in-process, "
        "the hung thread cannot be killed and keeps running until the process exits; a worker process is killed).",
        "seconds",
        group="run",
    )
    import_timeout: float = option(
        60.0, "seconds the worker may take to import a target string's module.", "seconds", group="run"
    )
    compile_timeout: float | None = option(
        None,
        "seconds the first call of each shape may take on top of ``timeout`` (compilation: ``jax.jit``, "
        "``torch.compile``, ``flex_attention``), so that a correct compiled function is never a timeout. Default: "
        f"{COMPILE_TIMEOUT:g} for a function that compiles (JAX, a ``torch.compile`` d function, flex attention), "
        "0 for the others.",
        "seconds",
        validate=lambda name, value: None if value is None else _seconds(name, value),
        group="run",
    )
    isolate: bool | None = option(
        None,
        "run the function in its own worker process (POSIX). Default: yes for a target string, no for a callable "
        "(a lambda or closure cannot be imported by another process); True with a callable needs one importable "
        "by ``module:qualname``.",
        "custom",
        validate=_isolate,
        group="run",
        cli=False,
    )
    probes: tuple[str, ...] | None = option(
        None,
        "the probes to run (default all, see ``PROBES``); the preflight always runs. Leaving out a core probe "
        "(``CORE_PROBES``) makes the verdict incomplete at best.",
        "custom",
        validate=_probes,
        group="run",
        metavar="PROBE,...",
    )
    seed: int = option(0, "seed of the random inputs, >= 0 (the report is reproducible).", "count", group="run")
    name: str | None = option(
        None,
        "how the report names the function (default ``module:qualname``, or the target string).",
        "text",
        group="run",
        cli=False,
    )
    backward: object = option(  # True, a callable, a target string or None
        None,
        "also run the gradient battery (``attnlab.checker.gradient_oracle``): True differentiates the function itself "
        "(PyTorch autograd, ``jax.vjp``; a NumPy function has none: UsageError); a callable or target string is "
        "a hand-written backward ``bwd(q, k, v, d_out, ...)`` or ``bwd(q, k, v, out, lse, d_out, ...)`` checked "
        "with the function as its forward (see ``check_backward``). On the command line ``--backward`` alone, or "
        "``--backward NAME`` (a function in the target's file, or ``file.py:NAME``).",
        "custom",
        validate=_backward,
        group="run",
        cli={"nargs": "?", "const": True, "default": None, "metavar": "NAME"},
    )
    lse_units: str = option(
        "nats",
        "the units of the lse a flash backward takes: ``nats`` or ``log2``.",
        "choice",
        choices=("nats", "log2"),
        group="run",
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            try:
                value = f.metadata["option"].check(f.name, getattr(self, f.name))
            except OptionError as err:
                raise UsageError(str(err)) from None
            if f.name == "unsupported":
                value = frozenset(value)
            object.__setattr__(self, f.name, value)
        if isinstance(self.gqa, str):
            object.__setattr__(self, "gqa_mapping", self.gqa)
            object.__setattr__(self, "gqa", True)
        if self.mask_form in ("valid_lens", "kv_cache", "varlen") and self.mask_convention != "allow":
            raise UsageError("mask_convention: valid lengths have no convention; leave it 'allow'")
        if self.mask_form == "flex" and self.mask_convention != "allow":
            raise UsageError(
                "mask_convention: a flex block_mask / score_mod is built from a mask_mod (True = may attend); leave "
                "it 'allow'"
            )
        if (self.mask_mod is not None or self.score_mod is not None) != (self.claims is not None):
            raise UsageError(
                "claims: a mask_mod= or score_mod= is checked against the dense rule it claims; give both (e.g. "
                "mask_mod=my_mod, claims='causal')"
            )

    def as_dict(self) -> dict[str, Any]:
        """The ``function`` options (what the function is and supports), as the report's ``spec`` records them."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.metadata["option"].group != "function":
                continue
            value = getattr(self, f.name)
            if isinstance(value, frozenset):
                value = sorted(value)
            elif isinstance(value, tuple):
                value = list(value)
            elif callable(value):  # a declared mod or rule: by its name
                value = f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', type(value).__name__)}"
            out[f.name] = value
        return out


def options() -> list[tuple[str, Any, Option]]:
    """``(name, default, Option)`` of every :class:`Spec` field, in declaration order."""
    return [(f.name, f.default, f.metadata["option"]) for f in dataclasses.fields(Spec)]


def keyword_signature(
    first: list[inspect.Parameter], returns: Any, last: tuple[inspect.Parameter, ...] = ()
) -> inspect.Signature:
    """A signature ``first..., *, <every option>=default, last...`` (``check()``'s, for ``help()`` and IDEs)."""
    kw = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d) for n, d, _ in options()]
    return inspect.Signature([*first, *kw, *last], return_annotation=returns)


def args_doc(indent: int = 8) -> str:
    """The options as the ``Args:`` entries of a Google-style docstring (``check()``'s)."""
    lines = []
    for name, _, opt in options():
        lines += textwrap.wrap(
            f"{name}: {opt.doc}", 112, initial_indent=" " * indent, subsequent_indent=" " * (indent + 4)
        )
    return "\n".join(lines).lstrip()


def _spec_doc() -> str:
    head = inspect.cleandoc(Spec.__doc__ or "")
    groups = {"function": "What the function is and supports (the report's ``spec``):", "run": "How it runs:"}
    lines = [head, "", "Attributes:"]
    for group, title in groups.items():
        lines.append(f"    {title}")
        for name, _, opt in options():
            if opt.group == group:
                lines += textwrap.wrap(f"{name}: {opt.doc}", 112, initial_indent=" " * 8, subsequent_indent=" " * 12)
    return "\n".join(lines)


Spec.__doc__ = _spec_doc()
