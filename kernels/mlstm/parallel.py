"""The mLSTM in blocks of positions, each block in its parallel (quadratic) form, differentiable:
the form training runs (the chunked form, chunk.py, writes into reused buffers and has no
backward). Same contract as naive.py.

Per block of c positions entering with (C, n, m), G_t the summed log forget gates from the
block's start through row t, every weight of the block is exp of a log weight:

    the entering state at row t:   G_t + m
    position j <= t at row t:      G_t - G_j + i_j

and the recurrence's stabiliser at row t is their maximum, m_t (the recurrence unrolled). So

    num_t = sum_j exp(G_t - G_j + i_j - m_t) (scale q_t . k_j) v_j + exp(G_t + m - m_t) scale q_t^T C
    den_t = the same with 1 for v_j and n for C
    h_t   = num_t / (max(|den_t|, exp(-m_t)) + eps)

and the state after the block is the same sums at its last row, stabilised by its m: every weight
is at most 1. Autograd runs through plain torch ops; one step per block is in order.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# Positions per block: the quadratic part costs c per position, the block's state products K V /
# c per position; the loop over blocks is what autograd records step by step.
BLOCK_SIZE = 64


def parallel_mlstm(q, k, v, igate, fgate, *, scale=None, eps=1e-6, initial_state=None,
                   output_final_state=False, block_size: int = BLOCK_SIZE):
    """naive_recurrent_mlstm's contract, in q's dtype (float32 for training), differentiable:
    q, k (B, T, H, K), v (B, T, H, V), igate and fgate (B, T, H) preactivations, the state (C (B,
    H, K, V), n (B, H, K), m (B, H)). Returns (h (B, T, H, V), final state or None)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    dt = q.dtype
    scale = K ** -0.5 if scale is None else scale
    if initial_state is None:
        C, n, m = q.new_zeros((B, H, K, V)), q.new_zeros((B, H, K)), q.new_zeros((B, H))
    else:
        C, n, m = (x.to(dt) for x in initial_state)
        m = m.reshape(B, H)
    log_f = F.logsigmoid(fgate.to(dt))  # (B, T, H)
    c = max(1, int(block_size))
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    outs = []
    for s in range(0, T, c):
        e = min(T, s + c)
        w = e - s
        qb = q[:, s:e].transpose(1, 2) * scale  # (B, H, w, K)
        kb, vb = k[:, s:e].transpose(1, 2), v[:, s:e].transpose(1, 2)  # (B, H, w, K), (B, H, w, V)
        ib = igate[:, s:e].to(dt).transpose(1, 2)  # (B, H, w)
        G = log_f[:, s:e].transpose(1, 2).cumsum(-1)  # (B, H, w)
        log_d = G.unsqueeze(-1) - G.unsqueeze(-2) + ib.unsqueeze(-2)  # (B, H, w, w): row t, position j
        log_d = log_d.masked_fill(~causal[:w, :w], float("-inf"))
        log_in = G + m.unsqueeze(-1)  # (B, H, w)
        mt = torch.maximum(log_in, log_d.amax(-1))  # (B, H, w): the stabiliser of every row
        scores = (qb @ kb.transpose(-1, -2)) * torch.exp(log_d - mt.unsqueeze(-1))  # (B, H, w, w)
        w_in = torch.exp(log_in - mt)  # (B, H, w)
        num = scores @ vb + w_in.unsqueeze(-1) * (qb @ C)  # (B, H, w, V)
        den = scores.sum(-1) + w_in * (qb @ n.unsqueeze(-1)).squeeze(-1)  # (B, H, w)
        h = num / (torch.maximum(den.abs(), torch.exp(-mt)) + eps).unsqueeze(-1)
        outs.append(h.transpose(1, 2))
        m_new = mt[..., -1]  # (B, H)
        w_state = torch.exp(G[..., -1] + m - m_new)  # (B, H)
        w_pos = torch.exp(G[..., -1:] - G + ib - m_new.unsqueeze(-1)).unsqueeze(-1)  # (B, H, w, 1)
        C = w_state[..., None, None] * C + (kb * w_pos).transpose(-1, -2) @ vb
        n = w_state.unsqueeze(-1) * n + (kb * w_pos).sum(-2)
        m = m_new
    h = torch.cat(outs, 1) if outs else v.new_zeros((B, 0, H, V))
    return h, ((C, n, m) if output_final_state else None)
