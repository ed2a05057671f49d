"""flash-linear-attention's Triton kernels for the delta rule (CUDA), under linpipe's contract.

fla-core (the `gpu` extra) is imported on the first call (linpipe.kernels.fla). Its kernels take
the contract's layout as it is: q, k (B, T, H, K), v (B, T, H, V), beta and the log-gate g (B, T,
H), `scale` (K^-1/2 by default), the state (B, H, K, V) in via `initial_state` and out via
`output_final_state`, and q, k L2-normalised by the caller (`use_qk_l2norm_in_kernel` stays off).
Their state is float32 whatever the inputs.
"""
from __future__ import annotations

import torch

from ..fla import fla_kernel
from ..linear_attn.stages import LOG_GATE_MIN
from .stages import check_inputs


def fla_delta_rule(q, k, v, beta, *, log_gate=None, scale=None, initial_state=None,
                   output_final_state=False, form="chunk"):
    """The delta rule through fla's kernels. Returns (o (B, T, H, V) in q's dtype, final S (B,
    H, K, V) float32 or None), as chunk_delta_rule_torch.

    fla's chunked delta rule refuses float32 inputs; its gated kernel takes them, so a float32
    call without gates runs the gated kernel with gates of 0 (the same recurrence). Log-gates
    below LOG_GATE_MIN count as it, as in every linpipe form (a gate of -inf would give nan in
    a difference of cumulative sums)."""
    check_inputs(q, k, v, beta, log_gate)
    plain = fla_kernel("delta_rule", form, "the delta rule")
    gated = fla_kernel("gated_delta_rule", form, "the delta rule")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if log_gate is None and form == "chunk" and q.dtype == torch.float32:
        log_gate = q.new_zeros(q.shape[:3])
    state = None if initial_state is None else initial_state.float()
    beta = beta.to(q.dtype)
    if log_gate is None:
        o, S = plain(q, k, v, beta, scale=scale, initial_state=state, output_final_state=output_final_state)
    else:
        g = log_gate.float().clamp(min=LOG_GATE_MIN)
        o, S = gated(q, k, v, g=g, beta=beta, scale=scale, initial_state=state,
                     output_final_state=output_final_state)
    return o.to(q.dtype), (S.float() if output_final_state else None)
