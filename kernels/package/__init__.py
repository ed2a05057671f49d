"""linpipe.kernels: linear-attention ops, each a fast form paired with its naive reference.

Triton is imported lazily (only when a CUDA tensor reaches a Triton path), so this package
imports on CPU-only machines and macOS.

This folder (kernels/package/) holds linpipe.kernels' own modules; each op is a folder beside it
(kernels/linear_attn/, ...), mapped to linpipe.kernels.OP by pyproject.toml's package-dir. The
top-level kernels/ has no __init__.py, so Python started in the checkout's root does not take it
for a package named `kernels` (Hugging Face's kernel hub, which transformers imports by that name):
an installed `kernels` package outranks a folder without one (docs/architecture.md).
"""
from .linear_attn import (
                          FEATURE_MAPS,
                          chunk_linear_attn,
                          chunk_linear_attn_parts,
                          chunk_linear_attn_torch,
                          feature_map_fn,
                          naive_recurrent_linear_attn,
)

__all__ = ["FEATURE_MAPS", "chunk_linear_attn", "chunk_linear_attn_parts", "chunk_linear_attn_torch",
           "feature_map_fn", "naive_recurrent_linear_attn"]
