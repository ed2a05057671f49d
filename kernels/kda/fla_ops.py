"""flash-linear-attention's Triton kernels for Kimi Delta Attention (CUDA), under linpipe's
contract.

fla-core (the `gpu` extra) is imported on the first call (linpipe.kernels.fla). Its kernels take
the contract's layout as it is: q, k (B, T, H, K), v (B, T, HV, V), the log-gate g (B, T, HV, K)
already activated (`use_gate_in_kernel` off), beta (B, T, HV) after its sigmoid
(`use_beta_sigmoid_in_kernel` off), q and k L2-normalised by the caller
(`use_qk_l2norm_in_kernel` off), `scale` (K^-1/2 by default), and the state (B, HV, K, V)
(fla's default layout, `state_v_first` off) in via `initial_state` and out via
`output_final_state`. Their state is float32 whatever the inputs.
"""
from __future__ import annotations

from ..fla import fla_kernel
from ..linear_attn.stages import LOG_GATE_MIN
from .stages import check_inputs


def fla_kda(q, k, v, beta, *, log_gate, scale=None, initial_state=None, output_final_state=False,
            form="chunk"):
    """KDA through fla's kernels (chunk_kda, or fused_recurrent_kda: the form the tests run under
    Triton's interpreter). Returns (o (B, T, HV, V) in q's dtype, final S (B, HV, K, V) float32
    or None), as chunk_kda_torch. Log-gates below LOG_GATE_MIN count as it, as in every linpipe
    form."""
    check_inputs(q, k, v, beta, log_gate)
    kernel = fla_kernel("kda", form, "Kimi Delta Attention")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    g = log_gate.float().clamp(min=LOG_GATE_MIN)
    state = None if initial_state is None else initial_state.float()
    o, S = kernel(q, k, v, g=g, beta=beta.to(q.dtype), scale=scale, initial_state=state,
                  output_final_state=output_final_state)
    return o.to(q.dtype), (S.float() if output_final_state else None)
