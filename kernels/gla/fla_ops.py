"""flash-linear-attention's Triton kernels for gated linear attention with a gate per key (CUDA),
under linpipe's contract.

fla-core (the `gpu` extra) is imported on the first call (linpipe.kernels.fla). Its kernels take
the contract's layout as it is: q, k and the log-gate (B, T, H, K), v (B, T, H, V), `scale`
(K^-1/2 by default), the state (B, H, K, V) (fla's default layout, `state_v_first` off) in via
`initial_state` and out via `output_final_state`. Their state is float32 whatever the inputs.
"""
from __future__ import annotations

from ..fla import fla_kernel
from ..linear_attn.stages import LOG_GATE_MIN
from .chunk import check_inputs


def fla_gla(q, k, v, log_gate, *, scale=None, initial_state=None, output_final_state=False, form="chunk"):
    """GLA through fla's kernels. Returns (o (B, T, H, V) in q's dtype, final S (B, H, K, V)
    float32 or None), as chunk_gla_torch. Log-gates below LOG_GATE_MIN count as it, as in every
    linpipe form."""
    check_inputs(q, k, v, log_gate)
    kernel = fla_kernel("gla", form, "gated linear attention")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    g = log_gate.float().clamp(min=LOG_GATE_MIN)
    state = None if initial_state is None else initial_state.float()
    gate = {"g": g} if form == "chunk" else {"gk": g}  # fused_recurrent_gla names it gk
    o, S = kernel(q, k, v, **gate, scale=scale, initial_state=state, output_final_state=output_final_state)
    return o.to(q.dtype), (S.float() if output_final_state else None)
