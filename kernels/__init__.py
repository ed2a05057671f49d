"""linpipe.kernels: linear-attention ops, each a fast form paired with its naive reference.

Triton is imported lazily (only when a CUDA tensor reaches a Triton path), so this package
imports on CPU-only machines and macOS.
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
