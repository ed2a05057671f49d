"""The chunked form of Kimi Delta Attention in PyTorch (the CPU, and autograd anywhere).

Same contract as naive.py. The sequence streams through in spans of SPAN positions carrying the
state; in a span, every block of c positions gets its WY factors at once (stages.block_wy: the
per-channel scores [P; L] as one matmul, a small triangular inverse, [U | W] as one matmul),
then the delta rule's pass carries the blocks in order (linpipe.kernels.delta_rule.stages.
carry_blocks: u = U - W S and the state after, and the entering state's share of the outputs)
and P u follows for every block at once. No Python loop over positions; plain autograd gives the
backward.

In inference every temporary lives in per-thread buffers reused from span to span and call to
call (linpipe.kernels.linear_attn.scratch): on the VMs linpipe runs on, first-touching fresh
memory costs more than the arithmetic done on it. Blocks of BLOCK_SIZE = 32: at T = 16,384, H =
4, K = V = 64 on one thread, 32 took 167 ms against 179 (16) and 201 (64) (BENCHMARKS.md).
"""
from __future__ import annotations

import torch

from ..delta_rule.stages import carry_blocks
from ..linear_attn.scratch import Scratch, hugepages
from .stages import BLOCK_SIZE, SPAN, block_wy, check_inputs, floor_gates


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
    qc, kc, vc, bc = q.to(cd), k.to(cd), v.to(cd), beta.to(cd)
    log_gate = floor_gates(log_gate)
    S = qc.new_zeros((B, HV, K, V)) if initial_state is None else initial_state.to(cd)
    grad = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, k, v, beta, log_gate, initial_state))
    scratch = Scratch(qc, reuse=not grad)
    c = max(1, int(block_size))
    span = max(c, (SPAN // c) * c)
    out = qc.new_empty((B, T, HV, V)) if scratch.reuse else None
    if out is not None:
        hugepages(out)
    outs = []
    for a in range(0, T, span):
        t = min(span, T - a)
        wy = block_wy(qc[:, a:a + t], kc[:, a:a + t], vc[:, a:a + t], bc[:, a:a + t], log_gate[:, a:a + t],
                      scale, c, scratch)
        o, S = carry_blocks(wy, S, scratch)  # o (B, HV, n, c, V)
        rows = o.permute(0, 2, 3, 1, 4)  # (B, n, c, HV, V)
        if out is None:
            outs.append(rows.reshape(B, -1, HV, V)[:, :t])
            continue
        whole = t // c * c  # the full blocks, then the rows of a last partial one
        out[:, a:a + whole].view(B, whole // c, c, HV, V).copy_(rows[:, :whole // c])
        if whole < t:
            out[:, a + whole:a + t].copy_(rows[:, -1, :t - whole])
    if out is None:
        out = torch.cat(outs, 1) if outs else qc.new_zeros((B, 0, HV, V))
    return out.to(q.dtype), (S.float().contiguous() if output_final_state else None)
