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

The per-channel weights of L and P: e^(b_i - b_j) = e^(b_i - rho) e^(rho - b_j) around rho =
b_0, the block's first row, so that [P; L] is one matmul per block, [Q e^(b - rho); diag(beta)
K e^(b - rho)] (K e^(rho - b))^T, with both factors within e^(+-FACTOR_MAX) for every row that
has fallen less than FACTOR_MAX below b_0 (and near 1 where the gates are mild: the backward's
products stay in range too). A row fallen
further in some channel (its state emptied within the block) has its scores computed
explicitly instead (`_strong_blocks`), and only that row. Every choice a row's outputs depend
on reads that row and the ones before it (b_0 and b_i), never a later one: a position's
outputs are the same bits whatever follows it in its block (the rows past a short record's end
in a padded batch; tests/test_kda_kernels.py). Gates are read as the delta rule's: log-gates
below LOG_GATE_MIN count as it (`floor_gates`), and the other weights (q_in's and W's e^(b_i),
K_end's e^(b_c - b_j), the block's total e^(b_c)) are at most 1.
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
from ..linear_attn.scratch import Scratch
from ..linear_attn.stages import LOG_GATE_MIN

# Positions per block of the chunked form (and of span_parts); see chunk.py.
BLOCK_SIZE = 32
# Positions per span: the temporaries stay in cache, as in the delta rule's chunked form.
SPAN = 2048
# Largest exponent (natural log units) of a factor of the scores' weights, e^(b_i - b_0) or
# e^(b_0 - b_j): e^80 (5.5e34) and e^-80 stay inside float32's normal range (e^+-87), and the
# products that matter are at most 1. A row whose gates in some channel sum past FACTOR_MAX
# from the block's start (past an average of -2.5 a position over a block of 32; fla's
# `lower_bound` gate near its floor of -5) has its scores computed with explicit weights.
FACTOR_MAX = 80.0
_LOG2E = 1.4426950408889634  # log2(e): the weights are powers of 2 (exp2 is the faster)

__all__ = ["BLOCK_SIZE", "FACTOR_MAX", "SPAN", "SpanParts", "Summary", "advance", "block_wy", "check_inputs",
           "floor_gates", "fold_summaries", "span_parts", "span_summary", "state_share"]


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
    top = float(log_gate.detach().max()) if log_gate.numel() else 0.0  # a reduction: no (B, T, HV, K) mask
    if not top <= 0:
        raise ValueError(f"log_gate must be <= 0 everywhere; got a maximum of {top:g}")


def _pad_rows(x, rows):
    """(B, t, ...) -> (B, rows, ...), the rows past t zero (x itself when t == rows)."""
    t = x.shape[1]
    if t == rows:
        return x
    return torch.nn.functional.pad(x, [0, 0] * (x.dim() - 2) + [0, rows - t])


def _blocked(x, n, c):
    """(B, n c, H, ...) -> the block-major (n, B, H, c, ...) view of its blocks (no copy)."""
    B, _, H = x.shape[:3]
    return x.view(B, n, c, H, *x.shape[3:]).transpose(2, 3).transpose(0, 1)


def _per_value_head(weight, x, G, out):
    """weight (n, B, HV, c, K) times the blocks of x (B, n c, H, K),
    each of x's heads serving G value heads: (n, B, HV, c, K) in the weight's layout (the
    product is the copy into blocks)."""
    n, B, HV, c, K = weight.shape
    xb = _blocked(x, n, c)  # (n, B, H, c, K), a view
    if G > 1:
        H = HV // G
        weight, xb = weight.view(n, B, H, G, c, K), xb.unsqueeze(3)
        out = None if out is None else out.view(n, B, H, G, c, K)
    r = torch.mul(weight, xb, out=out)
    return r.view(n, B, HV, c, K)


def _mm(a, b, out, alpha=1.0):
    """alpha a @ b over the leading dims of (..., m, p) @ (..., p, q): into out when given."""
    if out is None:
        r = torch.matmul(a, b)
        return r if alpha == 1.0 else r * alpha
    lead = a.shape[:-2]
    o3 = out.view(-1, a.shape[-2], b.shape[-1])
    o3.baddbmm_(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]), beta=0.0, alpha=alpha)
    return out.view(*lead, a.shape[-2], b.shape[-1])


def _strong_blocks(q, k, b, scale, idx, G):
    """Every weight of the blocks idx (index tensors into (n, B, HV)) explicit, for blocks whose
    gates are too strong for the factored scores: (P (m, c, c) scaled, j <= i; L (m, c, c)
    without beta, j < i; K_end (m, c, K)). b (n, B, HV, c, K) in log2 units, float64; q, k (B,
    n c, H, K). The caller takes P's and L's rows where the factored ones are out of range."""
    n, B, HV, c, K = b.shape
    qb, kb = (_blocked(x, n, c).repeat_interleave(G, dim=2)[idx] for x in (q, k))  # (m, c, K)
    bs = b[idx]  # (m, c, K)
    above = torch.ones(c, c, dtype=torch.bool, device=b.device).triu(1)[None, :, :, None]
    w = torch.exp2((bs[:, :, None, :] - bs[:, None, :, :]).masked_fill(above, float("-inf")).to(qb.dtype))
    P = torch.einsum("mik,mjk,mijk->mij", qb, kb, w) * scale  # (m, c, c): j <= i
    L = torch.einsum("mik,mjk,mijk->mij", kb, kb, w).tril(-1)  # j < i, beta apart
    k_end = kb * torch.exp2((bs[:, -1:] - bs).to(qb.dtype))
    return P, L, k_end


def block_wy(q, k, v, beta, log_gate, scale, c, scratch: Scratch | None = None) -> WY:
    """The WY factors of every block of c positions at once (no loop over blocks or positions),
    in the delta rule's form (linpipe.kernels.delta_rule.stages.WY), the block's decay a (K, 1)
    column.

    q, k (B, t, H, K), v (B, t, HV, V), beta (B, t, HV) in the compute dtype, log_gate (B, t,
    HV, K) >= LOG_GATE_MIN (floor_gates; its cumulative sums are float64). Rows past
    t are padded with beta = 0 and gates of 0: they keep the state as it is. scratch: a reusing
    Scratch (inference) puts every temporary in its buffers, reused from call to call; the
    fields are then views (B, HV, n, ...) of block-major (n, B, HV, ...) tensors, the layout
    carry_blocks reads without a copy.

    Products that share an operand run as one matmul: [P; L] = [Q e^(b - rho); diag(beta) K
    e^(b - rho)] (K e^(rho - b))^T, and [U | W] = (I + L)^-1 [diag(beta) V | diag(beta) K e^b]
    after one small triangular inverse per block (c right-hand sides: several times faster on
    the CPU than LAPACK's solve with K + V of them)."""
    B, t, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    n = -(-t // c)
    cd, dev = q.dtype, q.device
    s = scratch if scratch is not None else Scratch(q, reuse=False)
    s64 = Scratch(torch.empty(0, dtype=torch.float64, device=dev), s.reuse)
    q, k, v, beta, log_gate = (_pad_rows(x, n * c) for x in (q, k, v, beta, log_gate))
    shape = (n, B, HV, c, K)
    # cumulative log-gates in log2 units, float64 from each block's start
    b = s64("kda_b", *shape)
    b = _blocked(log_gate, n, c).double() if b is None else b.copy_(_blocked(log_gate, n, c))
    b = torch.cumsum(torch.mul(b, _LOG2E, out=s64.same(b)), 3, out=s64.same(b))
    # each channel's weights factored around rho = b_0, the block's first row: e^(b_i - b_j) =
    # e^(b_i - rho) e^(rho - b_j), both factors within e^(+-FACTOR_MAX) for every pair j <= i
    # whose row i has fallen less than FACTOR_MAX below b_0. Nothing a row
    # computes reads a later row (a factor centred on the block's range would read its last), so
    # a position's outputs are the same bits whatever follows it in its block: the rows past a
    # short record's end in a batch, or a unit's rows after it
    first, last = b[:, :, :, :1], b[:, :, :, -1:]  # (n, B, HV, 1, K)
    limit = FACTOR_MAX * _LOG2E
    rho = first
    strong = (first - last)[:, :, :, 0] > limit  # (n, B, HV, K): a block with deep rows
    any_strong = bool(strong.any())
    rise = s("kda_rise", *shape)
    rise = torch.sub(b, rho, out=rise) if rise is not None else (b - rho).to(cd)  # b_i - rho, in float64
    if any_strong:  # the deep rows' scores are replaced below
        rise = torch.clamp(rise, -limit, limit, out=s.same(rise))
    # e^(rho - b_j) as a power of its own, not 1 / e^(b_j - rho): a quotient's gradient divides
    # by the square of e^(b_j - rho), which underflows float32 past 44 nats (training's NaNs)
    fall = torch.neg(rise, out=s("kda_fall", *shape))
    fall = torch.exp2(fall, out=s.same(fall))  # e^(rho - b_j)
    rise = torch.exp2(rise, out=s.same(rise))  # e^(b_i - rho)
    bt = _blocked(beta, n, c).unsqueeze(-1)  # (n, B, HV, c, 1)
    # [q_rise; k_rise beta]: the left operands of P and L, stacked per block
    qk = s("kda_qk", n, B, HV, 2 * c, K)
    q_rise = _per_value_head(rise, q, G, None if qk is None else qk[..., :c, :])
    k_rise = _per_value_head(rise, k, G, None if qk is None else qk[..., c:, :])
    k_rise = torch.mul(k_rise, bt, out=s.same(k_rise))
    if qk is None:
        qk = torch.cat([q_rise, k_rise], -2)
    k_fall = _per_value_head(fall, k, G, s("kda_kf", *shape))  # K e^(rho - b)
    R = _mm(qk, k_fall.transpose(-1, -2), s("kda_R", n, B, HV, 2 * c, c))  # [P; L] (unscaled P)
    P = torch.tril(R[..., :c, :], out=s("kda_P", n, B, HV, c, c))
    P = torch.mul(P, scale, out=s.same(P))  # P_ij = scale q_i . k_j e^(b_i - b_j), j <= i
    L = R[..., c:, :]  # beta_i k_i . k_j e^(b_i - b_j), read below the diagonal only
    # e^(b_i) <= 1 of each row itself (q's share of the entering state, W's right-hand side), and
    # e^(b_c - b_j) = e^(b_c - rho) e^(rho - b_j) <= 1 (the state after the block only)
    gam = s("kda_gam", *shape)
    gam = torch.exp2(b.to(cd) if gam is None else gam.copy_(b), out=gam)  # e^(b_i)
    q_in = _per_value_head(gam, q, G, s("kda_qin", *shape))
    q_in = torch.mul(q_in, scale, out=s.same(q_in))
    k_end = torch.mul(k_fall, torch.exp2((last - rho).to(cd)), out=s("kda_kend", *shape))
    # [diag(beta) V | diag(beta) K e^b]: the right-hand sides, side by side
    vw = s("kda_vw", n, B, HV, c, V + K)
    bv = torch.mul(_blocked(v, n, c), bt, out=None if vw is None else vw[..., :V])
    bw = _per_value_head(gam, k, G, None if vw is None else vw[..., V:])
    bw = torch.mul(bw, bt, out=s.same(bw) if vw is None else bw)
    if any_strong:  # explicit weights for the rows fallen past FACTOR_MAX below b_0, and their state
        idx = strong.any(-1).nonzero(as_tuple=True)
        P_s, L_s, k_end_s = _strong_blocks(q, k, b, scale, idx, G)
        deep = (b[idx] < first[idx] - limit).any(-1)[..., None]  # (m, c, 1): rows, from b_0 and b_i
        P[idx] = torch.where(deep, P_s, P[idx])
        L = L.clone() if not s.reuse else L
        L[idx] = torch.where(deep, L_s * bt[idx], L[idx])
        k_end[idx] = k_end_s
    if vw is None:
        vw = torch.cat([bv, bw], -1)
    eye = torch.eye(c, dtype=cd, device=dev).expand_as(L)
    # (I + L)^-1, a fresh tensor: LAPACK's column-major result copied into an out= is slower
    X = torch.linalg.solve_triangular(L, eye, upper=False, unitriangular=True, left=False)
    UW = _mm(X, vw, s("kda_UW", n, B, HV, c, V + K))  # [U | W]
    total = torch.exp2(last.to(cd)).transpose(-1, -2)  # (n, B, HV, K, 1)
    return WY(*(x.movedim(0, 2) for x in (UW[..., :V], UW[..., V:], P, q_in, k_end.transpose(-1, -2), total)))


def floor_gates(log_gate):
    """log_gate with values below LOG_GATE_MIN raised to it (a gate of -inf empties a channel
    without a NaN in the differences of cumulative sums): log_gate itself when none is, found by
    one reduction."""
    if log_gate.numel() and float(log_gate.detach().min()) < LOG_GATE_MIN:
        return log_gate.clamp(min=LOG_GATE_MIN)
    return log_gate


def _prepare(q, k, v, beta, log_gate, scale):
    """The inputs in the compute dtype (float32; float64 for float64 inputs), and the scale."""
    check_inputs(q, k, v, beta, log_gate)
    cd = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return q.to(cd), k.to(cd), v.to(cd), beta.to(cd), scale


def span_parts(q, k, v, beta, *, log_gate, scale=None, block_size=BLOCK_SIZE, span=SPAN,
               before: Summary | None = None) -> SpanParts:
    """A span from a zero state, in one pass: its outputs from zero (o_local (B, T, HV, V)), the
    map of an entering state to the outputs (q_state (B, T, HV, K)) and the span's summary (M
    (B, HV, K, K), dS (B, HV, K, V)). Same inputs as the chunked form, in its compute dtype.

    before: the summary of the positions before the span, from the same zero state (a pass
    continued over several calls): outputs and summary then count from that earlier zero, and
    q_state maps the state entering those earlier positions."""
    q, k, v, beta, scale = _prepare(q, k, v, beta, log_gate, scale)
    log_gate = floor_gates(log_gate)
    B, T, _, K = q.shape
    shape = (B, v.shape[2], K, v.shape[-1])
    return spans_parts(lambda a, b: block_wy(q[:, a:b], k[:, a:b], v[:, a:b], beta[:, a:b], log_gate[:, a:b],
                                             scale, block_size),
                       T, span, shape, q, before)


def span_summary(k, v, beta, *, log_gate, block_size=BLOCK_SIZE, span=SPAN) -> Summary:
    """A span's summary (M, dS) alone (q is not needed: its outputs are discarded)."""
    return span_parts(k, k, v, beta, log_gate=log_gate, block_size=block_size, span=span).summary
