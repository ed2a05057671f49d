"""The delta rule (DeltaNet) and its gated form (Gated DeltaNet), with carried state.

Every form shares one contract (see naive.py): q, k L2-normalised by the caller, of shape
(B, T, H, K); v (B, T, H, V); beta (B, T, H); an optional log-gate (B, T, H) of g_t <= 0; the
float32 state S (B, H, K, V) in via `initial_state` and out via `output_final_state`.
"""
from __future__ import annotations

import torch

from .naive import naive_recurrent_delta_rule


def delta_rule(q, k, v, beta, *, log_gate=None, scale=None, initial_state=None,
               output_final_state=False):
    """The delta rule, dispatched to the fastest form for the tensors' device (for now the
    recurrence in float32: the chunked CPU form and the CUDA path replace it).

    Returns (o (B, T, H, V) in q's dtype, final S (B, H, K, V) float32 or None).
    """
    o, S = naive_recurrent_delta_rule(q, k, v, beta, log_gate=log_gate, scale=scale,
                                      initial_state=initial_state, output_final_state=True,
                                      dtype=torch.float32)
    return o, (S if output_final_state else None)


__all__ = ["delta_rule", "naive_recurrent_delta_rule"]
