"""Gated linear attention with a gate per key dimension (flash-linear-attention's GLA), with
carried state.

Every form shares one contract (see naive.py): q, k (B, T, H, K); v (B, T, H, V); a log-gate
(B, T, H, K) of g_t <= 0 per key; `scale` (K^-1/2 by default); the float32 state S (B, H, K, V)
in via `initial_state` and out via `output_final_state`. Forms: naive.py (the float64
recurrence, ground truth), chunk.py (the chunked form in PyTorch), fla_ops.py
(flash-linear-attention's Triton kernels, CUDA); stages.py's span_parts for the split.
"""
from __future__ import annotations

import torch

from .chunk import BLOCK_SIZE, chunk_gla_torch
from .fla_ops import fla_gla
from .naive import naive_recurrent_gla
from .stages import span_parts


def gla(q, k, v, log_gate, *, scale=None, initial_state=None, output_final_state=False):
    """GLA, dispatched: fla's chunked kernel for CUDA tensors, the PyTorch chunked form otherwise
    (and whenever autograd needs a backward). Returns (o (B, T, H, V) in q's dtype, final S (B,
    H, K, V) float32 or None)."""
    kwargs = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, log_gate, initial_state))
    if q.is_cuda and not needs_grad:
        return fla_gla(q, k, v, log_gate, **kwargs)
    return chunk_gla_torch(q, k, v, log_gate, **kwargs)


__all__ = ["BLOCK_SIZE", "chunk_gla_torch", "fla_gla", "gla", "naive_recurrent_gla", "span_parts"]
