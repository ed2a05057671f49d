"""The mLSTM (xLSTM's matrix memory with a normaliser and a stabiliser), with carried state.

Every form shares one contract (see naive.py): q, k (B, T, H, K), v (B, T, H, V) (K may differ
from V: xLSTM-7B's query/key heads are half its value heads), the input- and forget-gate
preactivations igate, fgate (B, T, H), `scale` (K^-1/2 by default), `eps` (1e-6), the state
(C (B, H, K, V), n (B, H, K), m (B, H)) in via `initial_state` (default: zeros with m = 0)
and out via `output_final_state` (C, n float32; m float64 out of the chunked form: a call cut
at a block's edge and continued from its state is then the same bits as one call). Forms:
naive.py (the float64 recurrence, ground truth), chunk.py (the chunked form in PyTorch, the
CPU's; no backward), parallel.py (blocks in their parallel form, differentiable: training's),
and stages.py's span stages for the split.
flash-linear-attention has no mLSTM kernel: on CUDA the same PyTorch chunked form runs (its
products are batched matmuls, its one loop is over blocks).
"""
from __future__ import annotations

import torch

from .chunk import BLOCK_SIZE, chunk_mlstm_parts, chunk_mlstm_torch
from .naive import naive_recurrent_mlstm
from .parallel import parallel_mlstm
from .stages import SpanParts, Summary, empty_state, fold, fold_summaries, outputs, span_parts


def mlstm(q, k, v, igate, fgate, *, scale=None, eps=1e-6, initial_state=None, output_final_state=False):
    """The mLSTM, dispatched: the chunked form on every device (fla has no mLSTM kernel; the
    xlstm package's Triton kernels are not a dependency); where autograd records (an input or
    the state requires grad), the blocks' parallel form (parallel_mlstm), differentiable.

    Returns (h (B, T, H, V) in q's dtype, final state (C, n, m) or None: C, n float32 and m
    float64 from the chunked form, q's dtype and autograd's from the parallel one)."""
    grads = (q, k, v, igate, fgate, *(initial_state or ()))
    if torch.is_grad_enabled() and any(t.requires_grad for t in grads):
        return parallel_mlstm(q, k, v, igate, fgate, scale=scale, eps=eps, initial_state=initial_state,
                              output_final_state=output_final_state)
    return chunk_mlstm_torch(q, k, v, igate, fgate, scale=scale, eps=eps, initial_state=initial_state,
                             output_final_state=output_final_state)


__all__ = ["BLOCK_SIZE", "SpanParts", "Summary", "chunk_mlstm_parts", "chunk_mlstm_torch", "empty_state",
           "fold", "fold_summaries", "mlstm", "naive_recurrent_mlstm", "outputs", "parallel_mlstm",
           "span_parts"]
