"""Kimi Delta Attention (KDA, Kimi Linear): the gated delta rule with a decay per key channel,
with carried state.

Every form shares one contract (see naive.py): q, k L2-normalised by the caller, of shape (B, T,
H, K); v (B, T, HV, V), HV a multiple of H (grouped value heads); beta (B, T, HV); a log-gate
(B, T, HV, K) of g_t <= 0 per key channel; `scale` (K^-1/2 by default); the float32 state S (B,
HV, K, V) in via `initial_state` and out via `output_final_state`. Forms: naive.py (the float64
recurrence, ground truth), chunk.py (the chunked WY form in PyTorch), fla_ops.py
(flash-linear-attention's Triton kernels, CUDA), composed from the stages of stages.py, which
the sequence-parallel split uses too (span_parts, fold_summaries, advance, state_share).
"""
from __future__ import annotations

import torch

from .chunk import chunk_kda_torch
from .fla_ops import fla_kda
from .naive import naive_recurrent_kda
from .stages import (
    BLOCK_SIZE,
    SpanParts,
    Summary,
    advance,
    fold_summaries,
    span_parts,
    span_summary,
    state_share,
)


def kda(q, k, v, beta, *, log_gate, scale=None, initial_state=None, output_final_state=False):
    """KDA, dispatched: fla's chunked kernel for CUDA tensors without a backward to compute, the
    PyTorch chunked form otherwise. Returns (o (B, T, HV, V) in q's dtype, final S (B, HV, K,
    V) float32 or None)."""
    kwargs = dict(log_gate=log_gate, scale=scale, initial_state=initial_state,
                  output_final_state=output_final_state)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, beta, log_gate, initial_state))
    if q.is_cuda and not needs_grad:
        return fla_kda(q, k, v, beta, **kwargs)
    return chunk_kda_torch(q, k, v, beta, **kwargs)


__all__ = ["BLOCK_SIZE", "SpanParts", "Summary", "advance", "chunk_kda_torch", "fla_kda", "fold_summaries",
           "kda", "naive_recurrent_kda", "span_parts", "span_summary", "state_share"]
