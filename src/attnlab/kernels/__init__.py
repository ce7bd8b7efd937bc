"""Kernels built on the core: tiled online-softmax attention and the KV cache."""
