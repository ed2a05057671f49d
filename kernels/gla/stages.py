"""GLA's state algebra for callers that compose their own pass (the sequence-parallel split,
linpipe.model.families.delta_net.split), in the delta rule's terms (linpipe.kernels.delta_rule.stages):
over a run of positions the state after it is affine in the state entering it, S' = M S + dS,
where for a gate per key M = diag(exp(B)) and B (H, K) is the run's summed log-gate; and each
position's output is its output from a zero state plus q_state_i^T S, q_state_i = scale q_i
exp(B_i) with B_i the log-gate summed from the run's start to i. M is held as the (K, K)
diagonal matrix, so the delta rule's fold_summaries, advance and state_share apply unchanged.
"""
from __future__ import annotations

import torch

from ..delta_rule.stages import SpanParts, Summary
from ..linear_attn.stages import LOG_GATE_MIN
from .chunk import _chunk, check_inputs


def span_parts(q, k, v, log_gate, *, scale=None, before: Summary | None = None) -> SpanParts:
    """A span from a zero state: its outputs (o_local), the map of an entering state to them
    (q_state) and its summary (M, dS), in the compute dtype (float32; float64 for float64
    inputs). before: the summary of the positions before the span from the same zero state (a
    pass continued over several calls): outputs and summary then count from that earlier zero,
    and q_state maps the state entering those earlier positions."""
    check_inputs(q, k, v, log_gate)
    B, T, H, K = q.shape
    cd = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = K ** -0.5 if scale is None else scale
    o, dS = _chunk(q, k, v, log_gate, scale, None if before is None else before.dS, dtype=cd)
    # the summed log-gates in float64: a long span's sum keeps its small terms
    cum = log_gate.double().clamp(min=LOG_GATE_MIN).cumsum(1)  # (B, T, H, K)
    decay = cum.exp().to(cd)  # <= 1
    diag = torch.ones((B, H, K), dtype=cd, device=q.device) if before is None else before.M.diagonal(
        dim1=-2, dim2=-1).to(cd)  # (B, H, K)
    q_state = q.to(cd) * scale * decay * diag[:, None]
    total = (cum[:, -1].exp().to(cd) if T else torch.ones_like(diag)) * diag
    return SpanParts(o, q_state, Summary(torch.diag_embed(total), dS))
