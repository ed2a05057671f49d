"""The stages Kimi Delta Attention is composed from, in PyTorch: the chunked form (chunk.py)
runs them over the blocks of a span; the sequence-parallel split runs them over segments.

Per value head, with D_t = Diag(exp(g_t)) (a decay per key channel) and the recurrence of naive.py,

    S_t = (I - beta_t k_t k_t^T) D_t S_{t-1} + beta_t k_t v_t^T,      o_t = scale S_t^T q_t,

this is the delta rule of linpipe.kernels.delta_rule with its scalar gate made diagonal, and its
algebra carries over with every scalar weight exp(b_i - b_j) made a per-channel one. In a block
of c positions, with b_i (K,) the cumulative log-gate from the block's start to row i, the values
the head writes, u_i = beta_i (v_i - k_i^T D_i S_{i-1}), are u = U - W S0 for the state S0
entering the block, where

    (I + L) [U | W] = [diag(beta) V | diag(beta) (K * exp(b))],
    L_ij = beta_i sum_d k_id k_jd e^(b_id - b_jd)   (j < i)

and, with P_ij = scale sum_d q_id k_jd e^(b_id - b_jd) (j <= i), every stage is the delta rule's:

    o   = P u + q_in S0              q_in = scale Q * exp(b)          (delta_rule.stages.carry_blocks)
    S'  = Diag(exp(b_c)) S0 + K_end^T u,   K_end = K * exp(b_c - b)
    M   = Diag(exp(b_c)) - K_end^T W,      dS = K_end^T U              (block_factors, fold_blocks)

so a block's WY factors (`block_wy`) are delta_rule.stages.WY with the block's decay `total` a
(K, 1) column instead of a scalar, and the delta rule's carry, affine maps, fold and summaries
serve unchanged.

The per-channel weights of L and P: e^(b_i - b_j) = e^(b_i - b_r) e^(b_r - b_j) around the
block's middle row r, so that L and P are each one matmul per block, (K e^(b - b_r)) times
(K e^(b_r - b))^T. The two factors grow as the gates between row r and the block's ends
strengthen; a block where a channel's gates sum past FACTOR_MAX on either side of r (its state
emptied within half a block) has its L and P computed with every weight explicit instead
(`_strong_scores`), and only that block. Gates are read as the delta rule's: log-gates below
LOG_GATE_MIN count as it, and the other weights (q_in's e^(b_i), K_end's e^(b_c - b_j), the
block's total e^(b_c)) are at most 1.
"""
from __future__ import annotations

import torch

from ..delta_rule.stages import (
    WY,
    SpanParts,
    Summary,
    advance,
    fold_summaries,
    spans_parts,
    state_share,
)
from ..linear_attn.stages import LOG_GATE_MIN

# Positions per block of the chunked form (and of span_parts); see chunk.py.
BLOCK_SIZE = 32
# Positions per span: the temporaries stay in cache, as in the delta rule's chunked form.
SPAN = 2048
# Largest exponent (natural log units) of a factor of the scores' weights, e^(b_i - b_r) or
# e^(b_r - b_j): e^60 times a unit-norm dot product stays far below float32's maximum, and a
# block past it is computed with explicit weights.
FACTOR_MAX = 60.0
_LOG2E = 1.4426950408889634  # log2(e): the weights are powers of 2 (exp2 is the faster)

__all__ = ["BLOCK_SIZE", "FACTOR_MAX", "SPAN", "SpanParts", "Summary", "advance", "block_wy", "check_inputs",
           "fold_summaries", "span_parts", "span_summary", "state_share"]


def check_inputs(q, k, v, beta, log_gate) -> None:
    """The contract's shapes: q, k (B, T, H, K), v (B, T, HV, V) with HV a multiple of H, beta
    (B, T, HV), log_gate (B, T, HV, K) <= 0."""
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"q, k must be (B, T, H, K) and v (B, T, HV, V); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    B, T, H, K = q.shape
    HV = v.shape[2]
    if HV % H:
        raise ValueError(f"v's heads ({HV}) must be a multiple of q and k's ({H})")
    if tuple(beta.shape) != (B, T, HV):
        raise ValueError(f"beta must have shape (B, T, HV) = {(B, T, HV)}; got {tuple(beta.shape)}")
    if tuple(log_gate.shape) != (B, T, HV, K):
        raise ValueError(f"log_gate must have shape (B, T, HV, K) = {(B, T, HV, K)}; "
                         f"got {tuple(log_gate.shape)}")
    if bool((log_gate > 0).any()):
        raise ValueError(f"log_gate must be <= 0 everywhere; got a maximum of {float(log_gate.max()):g}")


def value_heads(x, HV):
    """(B, t, H, K) -> (B, t, HV, K): query/key head h serves value heads h G .. h G + G - 1
    (fla's repeat_interleave); a view when HV == H."""
    B, t, H, K = x.shape
    if HV == H:
        return x
    return x.unsqueeze(3).expand(B, t, H, HV // H, K).reshape(B, t, HV, K)


def _blocks(x, n, c):
    """(B, t, H, ...) -> (B, H, n, c, ...), contiguous, rows past t zero."""
    B, t, H = x.shape[:3]
    rows = x.transpose(1, 2)
    if t < n * c:
        rows = torch.nn.functional.pad(rows, [0, 0] * (x.dim() - 3) + [0, n * c - t])
    return rows.reshape(B, H, n, c, *x.shape[3:]).contiguous()


def _strong_scores(qb, kb, bt, b, idx):
    """The scores of the blocks idx (a tuple of index tensors into (B, H, n)) with every weight
    explicit: (P (m, c, c), L^T (m, c, c)), P_ij = sum_d q_id k_jd 2^(b_id - b_jd) for j <= i (q
    scaled), L^T_ji = beta_i sum_d k_id k_jd 2^(b_id - b_jd) for j < i, 0 elsewhere. b in log2
    units, float64."""
    qs, ks, bs, betas = qb[idx], kb[idx], b[idx], bt[idx]  # (m, c, K), (m, c, K), (m, c, K), (m, 1, c)
    c = qs.shape[1]
    above = torch.ones(c, c, dtype=torch.bool, device=qs.device).triu(1)[None, :, :, None]
    w = torch.exp2((bs[:, :, None, :] - bs[:, None, :, :]).masked_fill(above, float("-inf"))).to(qs.dtype)
    P = torch.einsum("mik,mjk,mijk->mij", qs, ks, w)  # (m, c, c), j <= i
    L = torch.einsum("mik,mjk,mijk->mij", ks, ks, w).tril(-1) * betas.transpose(-1, -2)  # beta_i, j < i
    return P, L.transpose(-1, -2)


def block_wy(q, k, v, beta, log_gate, scale, c) -> WY:
    """The WY factors of every block of c positions at once (no loop over blocks or positions).

    q, k (B, t, HV, K) (already one per value head), v (B, t, HV, V), beta (B, t, HV), log_gate
    (B, t, HV, K), in the compute dtype but log_gate, read in float64. Rows past t are padded
    with beta = 0 and gates of 0: they keep the state as it is."""
    B, t, HV, K = q.shape
    V = v.shape[-1]
    n = -(-t // c)
    cd = q.dtype
    qb, kb = _blocks(q * scale, n, c), _blocks(k, n, c)  # (B, HV, n, c, K)
    vt = _blocks(v, n, c).transpose(-1, -2)  # (B, HV, n, V, c)
    bt = _blocks(beta, n, c).unsqueeze(-2)  # (B, HV, n, 1, c)
    # cumulative log-gates in log2 units, float64 from each block's start
    g = log_gate.to(torch.float64).clamp(min=LOG_GATE_MIN) * _LOG2E
    b = _blocks(g, n, c).cumsum(3)  # (B, HV, n, c, K)
    r = c // 2
    up = b - b[:, :, :, r:r + 1]  # b_i - b_r: >= 0 above row r, <= 0 below
    limit = FACTOR_MAX * _LOG2E
    strong = (up[:, :, :, 0] > limit) | (up[:, :, :, -1] < -limit)  # (B, HV, n, K)
    any_strong = bool(strong.any())
    if any_strong:
        up = up.clamp(-limit, limit)  # those blocks' scores are replaced below
    rise = torch.exp2(up.to(cd))  # e^(b_i - b_r)
    fall = torch.exp2((-up).to(cd))  # e^(b_r - b_j)
    k_fall = kb * fall
    P = (qb * rise) @ k_fall.transpose(-1, -2)  # (B, HV, n, c, c): P_ij for j <= i
    LT = k_fall @ (kb * rise).transpose(-1, -2) * bt  # L^T_ji = beta_i k_i . k_j e^(b_i - b_j): j < i
    if any_strong:
        idx = strong.any(-1).nonzero(as_tuple=True)
        P_s, LT_s = _strong_scores(qb, kb, bt, b, idx)
        P[idx], LT[idx] = P_s, LT_s
    P = P.tril()
    last = b[:, :, :, -1:]  # (B, HV, n, 1, K)
    gam = torch.exp2(b.to(cd))  # e^(b_i) <= 1
    q_in = qb * gam
    k_end_t = (kb * torch.exp2((last - b).to(cd))).transpose(-1, -2)  # (B, HV, n, K, c)
    w_rhs = (kb * gam).transpose(-1, -2) * bt  # (B, HV, n, K, c)
    total = torch.exp2(last.to(cd)).transpose(-1, -2)  # (B, HV, n, K, 1)
    Xt = torch.linalg.solve_triangular(LT, torch.cat([vt * bt, w_rhs], -2), upper=True, unitriangular=True,
                                       left=False)  # (B, HV, n, V + K, c): [U | W]^T
    return WY(Xt[..., :V, :].transpose(-1, -2), Xt[..., V:, :].transpose(-1, -2), P, q_in, k_end_t, total)


def _prepare(q, k, v, beta, log_gate, scale):
    """The inputs in the compute dtype (float32; float64 for float64 inputs), q and k one per
    value head, and the scale."""
    check_inputs(q, k, v, beta, log_gate)
    HV = v.shape[2]
    cd = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return value_heads(q.to(cd), HV), value_heads(k.to(cd), HV), v.to(cd), beta.to(cd), scale


def span_parts(q, k, v, beta, *, log_gate, scale=None, block_size=BLOCK_SIZE, span=SPAN,
               before: Summary | None = None) -> SpanParts:
    """A span from a zero state, in one pass: its outputs from zero (o_local (B, T, HV, V)), the
    map of an entering state to the outputs (q_state (B, T, HV, K)) and the span's summary (M
    (B, HV, K, K), dS (B, HV, K, V)). Same inputs as the chunked form, in its compute dtype.

    before: the summary of the positions before the span, from the same zero state (a pass
    continued over several calls): outputs and summary then count from that earlier zero, and
    q_state maps the state entering those earlier positions."""
    q, k, v, beta, scale = _prepare(q, k, v, beta, log_gate, scale)
    B, T, HV, K = q.shape
    shape = (B, HV, K, v.shape[-1])
    return spans_parts(lambda a, b: block_wy(q[:, a:b], k[:, a:b], v[:, a:b], beta[:, a:b], log_gate[:, a:b],
                                             scale, block_size),
                       T, span, shape, q, before)


def span_summary(k, v, beta, *, log_gate, block_size=BLOCK_SIZE, span=SPAN) -> Summary:
    """A span's summary (M, dS) alone (q is not needed: its outputs are discarded)."""
    return span_parts(k, k, v, beta, log_gate=log_gate, block_size=block_size, span=span).summary
