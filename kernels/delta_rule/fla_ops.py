"""flash-linear-attention's Triton kernels for the delta rule (CUDA), under linpipe's contract.

fla-core (the `gpu` extra) is imported on the first call, never at import time: CPU-only
installs lack Triton. Its kernels take the contract's layout as it is: q, k (B, T, H, K), v
(B, T, H, V), beta and the log-gate g (B, T, H), `scale` (K^-1/2 by default), the state (B, H,
K, V) in via `initial_state` and out via `output_final_state`, and q, k L2-normalised by the
caller (`use_qk_l2norm_in_kernel` stays off). Their state is float32 whatever the inputs.
"""
from __future__ import annotations

import torch

from ..linear_attn.stages import LOG_GATE_MIN
from .stages import check_inputs

# fla's forms: "chunk" (the chunked kernels, with their backward; CUDA) and "fused_recurrent"
# (token by token; the one that runs under Triton's interpreter in a reasonable time, for tests).
FORMS = ("chunk", "fused_recurrent")


def _ops(form):
    """(the delta rule's fla function, the gated delta rule's) of a form."""
    if form not in FORMS:
        raise ValueError(f"unknown fla form {form!r}; expected one of {', '.join(FORMS)}")
    try:
        from fla.ops import delta_rule, gated_delta_rule
    except ImportError as e:
        raise RuntimeError(
            f"the delta rule on a CUDA tensor needs flash-linear-attention's kernels, which could not be "
            f"imported ({e}); install them: pip install 'linpipe[gpu]' (or pip install fla-core)") from e
    return (getattr(delta_rule, f"{form}_delta_rule"), getattr(gated_delta_rule, f"{form}_gated_delta_rule"))


def fla_delta_rule(q, k, v, beta, *, log_gate=None, scale=None, initial_state=None,
                   output_final_state=False, form="chunk"):
    """The delta rule through fla's kernels. Returns (o (B, T, H, V) in q's dtype, final S (B,
    H, K, V) float32 or None), as chunk_delta_rule_torch.

    fla's chunked delta rule refuses float32 inputs; its gated kernel takes them, so a float32
    call without gates runs the gated kernel with gates of 0 (the same recurrence). Log-gates
    below LOG_GATE_MIN count as it, as in every linpipe form (a gate of -inf would give nan in
    a difference of cumulative sums)."""
    check_inputs(q, k, v, beta, log_gate)
    plain, gated = _ops(form)
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
