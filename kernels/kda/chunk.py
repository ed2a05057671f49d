"""The chunked form of Kimi Delta Attention in PyTorch (the CPU, and autograd anywhere).

Same contract as naive.py. The sequence streams through in spans of SPAN positions carrying the
state; in a span, every block of c positions gets its WY factors at once (stages.block_wy: the
per-channel scores as two matmuls a block, one triangular solve), then the delta rule's pass
carries the blocks in order (linpipe.kernels.delta_rule.stages: u = U - W S and the state after,
two small products a block) and every output follows at once. No Python loop over positions;
plain autograd gives the backward.
"""
from __future__ import annotations

import torch

from ..delta_rule.stages import spans_outputs
from .stages import BLOCK_SIZE, SPAN, block_wy, check_inputs, value_heads


def chunk_kda_torch(q, k, v, beta, *, log_gate, scale=None, initial_state=None, output_final_state=False,
                    block_size: int = BLOCK_SIZE, dtype: torch.dtype | None = None):
    """The contract of naive_recurrent_kda: q, k (B, T, H, K) L2-normalised, v (B, T, HV, V), beta
    (B, T, HV), log_gate (B, T, HV, K), S (B, HV, K, V). Returns (o (B, T, HV, V) in q's dtype,
    final S (B, HV, K, V) float32 or None).

    Computes in float32 (float64 for float64 inputs, or `dtype` when given); the gates'
    cumulative sums are float64 whatever the dtype. Differentiable."""
    check_inputs(q, k, v, beta, log_gate)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    cd = dtype or (torch.float64 if q.dtype == torch.float64 else torch.float32)
    scale = K ** -0.5 if scale is None else scale
    qc, kc = value_heads(q.to(cd), HV), value_heads(k.to(cd), HV)  # (B, T, HV, K)
    vc, bc = v.to(cd), beta.to(cd)
    S = qc.new_zeros((B, HV, K, V)) if initial_state is None else initial_state.to(cd)
    c = max(1, int(block_size))
    span = max(c, (SPAN // c) * c)
    o, S = spans_outputs(lambda a, b: block_wy(qc[:, a:b], kc[:, a:b], vc[:, a:b], bc[:, a:b],
                                               log_gate[:, a:b], scale, c),
                         T, span, S, vc)
    return o.to(q.dtype), (S.float().contiguous() if output_final_state else None)
