"""Causal linear attention with carried state: naive reference, PyTorch chunked form, Triton kernel.

Every form shares one contract (see naive.py): raw q, k, v of shape (B, T, H, K|V), optional
per-head decay and per-position log-gates (B, T, H), the feature map applied inside, optional
normaliser, float32 state (S (B, H, K, V), z (B, H, K)) in via `initial_state` and out via
`output_final_state`. The state algebra's stages (stages.py: local state, fold, output pass) are
public too, for callers that compose their own pass (the sequence-parallel split).
"""
from __future__ import annotations

import torch

from .chunk import BLOCK_SIZE, EXACT_CUT, chunk_linear_attn_parts, chunk_linear_attn_torch, features
from .naive import FEATURE_MAPS, feature_map_fn, naive_recurrent_linear_attn
from .stages import LOG_GATE_MIN, advance, log_decay, log_gate_sums, span_state, state_outputs

_triton_fn = None  # the Triton form, once imported


def _triton():
    """The Triton form, imported on first use (never at import time: CPU-only installs lack it).
    A CUDA tensor must not silently fall back to the CPU form, so a failed import is an error."""
    global _triton_fn
    if _triton_fn is None:
        try:
            from .triton_chunk import chunk_linear_attn_triton
        except ImportError as e:
            raise RuntimeError(
                f"linear attention on a CUDA tensor needs Triton, which could not be imported ({e}); "
                "install it: pip install 'linpipe[gpu]' (or pip install triton)") from e
        _triton_fn = chunk_linear_attn_triton
    return _triton_fn


def uses_triton(q, needs_grad: bool) -> bool:
    """Whether a call goes to the Triton form: CUDA tensors without a backward to compute (the
    Triton form does not promise one)."""
    return q.is_cuda and not needs_grad


def chunk_linear_attn(q, k, v, *, decay=None, feature_map="elu1", normalize=True, eps=1e-6,
                      initial_state=None, output_final_state=False, cu_seqlens=None, log_gate=None):
    """Causal linear attention, dispatched: Triton for CUDA tensors, the PyTorch chunked form
    otherwise (and whenever autograd needs a backward, which the Triton form does not promise).

    q, k: (B, T, H, K); v: (B, T, H, V); log_gate: (B, T, H), each g_t <= 0 (the state is
    multiplied by exp(g_t) before position t adds to it, after the decay). Returns (o (B, T, H,
    V), (S, z) float32 or None). A decay of 1 for every head is no decay (both forms then skip
    the gates).
    """
    if decay is not None and log_decay(decay) is None:
        decay = None
    kwargs = dict(decay=decay, feature_map=feature_map, normalize=normalize, eps=eps,
                  initial_state=initial_state, output_final_state=output_final_state,
                  cu_seqlens=cu_seqlens, log_gate=log_gate)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, log_gate))
    if uses_triton(q, needs_grad):
        return _triton()(q, k, v, **kwargs)
    return chunk_linear_attn_torch(q, k, v, **kwargs)


__all__ = ["BLOCK_SIZE", "EXACT_CUT", "FEATURE_MAPS", "LOG_GATE_MIN", "advance", "chunk_linear_attn",
           "chunk_linear_attn_parts", "chunk_linear_attn_torch", "feature_map_fn", "features", "log_decay",
           "log_gate_sums",
           "naive_recurrent_linear_attn", "span_state", "state_outputs"]
