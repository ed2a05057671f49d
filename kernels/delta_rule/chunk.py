"""The chunked form of the delta rule in PyTorch (the CPU, and autograd anywhere).

Same contract as naive.py. The sequence streams through in spans of SPAN positions carrying the
state; in a span, every block of c positions gets its WY factors at once (one triangular solve
and a few matmuls per block, stages.block_wy), then the blocks are carried in order, two small
products a block (stages.carry_blocks: the values written, u = U - W S, and the state after),
and every output follows at once (o = P u + q_in S). No Python loop over positions; plain
autograd gives the backward.
"""
from __future__ import annotations

import torch

from .stages import BLOCK_SIZE, SPAN, block_wy, check_inputs, spans_outputs


def chunk_delta_rule_torch(q, k, v, beta, *, log_gate=None, scale=None, initial_state=None,
                           output_final_state=False, block_size: int = BLOCK_SIZE,
                           dtype: torch.dtype | None = None):
    """The contract of naive_recurrent_delta_rule: q, k (B, T, H, K) L2-normalised, v (B, T, H,
    V), beta and log_gate (B, T, H), S (B, H, K, V). Returns (o (B, T, H, V) in q's dtype, final
    S (B, H, K, V) float32 or None).

    Computes in float32 (float64 for float64 inputs, or `dtype` when given); the gates'
    cumulative sums are float64 whatever the dtype. Differentiable."""
    check_inputs(q, k, v, beta, log_gate)
    B, T, H, K = q.shape
    V = v.shape[-1]
    cd = dtype or (torch.float64 if q.dtype == torch.float64 else torch.float32)
    scale = K ** -0.5 if scale is None else scale
    qc, kc, vc, bc = q.to(cd), k.to(cd), v.to(cd), beta.to(cd)
    S = qc.new_zeros((B, H, K, V)) if initial_state is None else initial_state.to(cd)
    c = max(1, int(block_size))
    span = max(c, (SPAN // c) * c)
    o, S = spans_outputs(lambda a, b: block_wy(qc[:, a:b], kc[:, a:b], vc[:, a:b], bc[:, a:b],
                                               None if log_gate is None else log_gate[:, a:b], scale, c),
                         T, span, S, vc)
    return o.to(q.dtype), (S.float().contiguous() if output_final_state else None)
