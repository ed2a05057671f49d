"""The delta rule (DeltaNet) and its gated form (Gated DeltaNet), with carried state.

Every form shares one contract (see naive.py): q, k L2-normalised by the caller, of shape
(B, T, H, K); v (B, T, H, V); beta (B, T, H); an optional log-gate (B, T, H) of g_t <= 0; the
float32 state S (B, H, K, V) in via `initial_state` and out via `output_final_state`. Forms:
naive.py (the float64 recurrence, ground truth), chunk.py (the chunked WY form in PyTorch),
fla_ops.py (flash-linear-attention's Triton kernels, CUDA), composed from the stages of
stages.py, which the sequence-parallel split uses too (span_parts, fold_summaries, advance,
state_share).
"""
from __future__ import annotations

import torch

from .chunk import chunk_delta_rule_torch
from .fla_ops import fla_delta_rule
from .naive import naive_recurrent_delta_rule
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


def uses_fla(q, needs_grad: bool) -> bool:
    """Whether a call goes to fla's kernels: CUDA tensors without a backward to compute (a
    backward runs through the PyTorch form's plain autograd)."""
    return q.is_cuda and not needs_grad


def delta_rule(q, k, v, beta, *, log_gate=None, scale=None, initial_state=None,
               output_final_state=False):
    """The delta rule, dispatched: fla's chunked kernels for CUDA tensors, the PyTorch chunked
    form otherwise (and whenever autograd needs a backward).

    Returns (o (B, T, H, V) in q's dtype, final S (B, H, K, V) float32 or None).
    """
    kwargs = dict(log_gate=log_gate, scale=scale, initial_state=initial_state,
                  output_final_state=output_final_state)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, beta, log_gate, initial_state))
    if uses_fla(q, needs_grad):
        return fla_delta_rule(q, k, v, beta, **kwargs)
    return chunk_delta_rule_torch(q, k, v, beta, **kwargs)


__all__ = ["BLOCK_SIZE", "SpanParts", "Summary", "advance", "chunk_delta_rule_torch", "delta_rule",
           "fla_delta_rule", "fold_summaries", "naive_recurrent_delta_rule", "span_parts", "span_summary",
           "state_share", "uses_fla"]
