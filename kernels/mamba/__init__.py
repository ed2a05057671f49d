"""Mamba's (v1) selective scan, with carried state.

Every form shares one contract (see naive.py; mamba_ssm's `selective_scan_ref` in a position-major
layout): u, delta (B, T, D); A (D, N); B, C (B, T, N); optional D and delta_bias (D,), z (B, T, D)
and the softplus of the time steps; the float32 state (B, D, N) in via `initial_state` and out
via `output_final_state`. Forms: naive.py (the float64 recurrence, ground truth), chunk.py (the
chunked form in PyTorch), fla_ops.py (flash-linear-attention's GLA kernels with each channel a
head, CUDA); stages.py's span_parts, fold_summaries, advance and state_share for the split.
"""
from __future__ import annotations

import torch

from .chunk import chunk_selective_scan_torch
from .fla_ops import fla_selective_scan
from .naive import naive_selective_scan
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


def selective_scan(u, delta, A, B, C, *, D=None, z=None, delta_bias=None, delta_softplus=False,
                   initial_state=None, output_final_state=False):
    """The selective scan, dispatched: fla's chunked GLA kernel for CUDA tensors, the PyTorch
    chunked form otherwise (and whenever autograd needs a backward).

    Returns (y (B, T, D) in u's dtype, final state (B, D, N) float32 or None)."""
    kwargs = dict(D=D, z=z, delta_bias=delta_bias, delta_softplus=delta_softplus, initial_state=initial_state,
                  output_final_state=output_final_state)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (u, delta, A, B, C, D, z, delta_bias, initial_state))
    if u.is_cuda and not needs_grad:
        return fla_selective_scan(u, delta, A, B, C, **kwargs)
    return chunk_selective_scan_torch(u, delta, A, B, C, **kwargs)


__all__ = ["BLOCK_SIZE", "SpanParts", "Summary", "advance", "chunk_selective_scan_torch",
           "fla_selective_scan", "fold_summaries", "naive_selective_scan", "selective_scan", "span_parts",
           "span_summary", "state_share"]
