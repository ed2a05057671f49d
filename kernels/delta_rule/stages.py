"""The stages the delta rule is composed from, in PyTorch: the chunked form (chunk.py) runs them
over the blocks of a span; the sequence-parallel split runs them over segments.

Per head, with a_t = exp(g_t) and the recurrence of naive.py,

    S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,      o_t = scale S_t^T q_t,

the state after a run of positions is affine in the state entering it: S' = M S0 + dS, with
M = prod_t a_t (I - beta_t k_t k_t^T) a (K, K) matrix (not a scalar, as in linear attention) and
dS the state the run adds from zero. Inside a block of c positions, with b_i the cumulative
log-gate from the block's start, the WY (UT) representation writes the values actually stored,
u_i = beta_i (v_i - k_i^T a_i S_{i-1}), as u = U - W S0, where

    (I + L) [U | W] = [diag(beta) V | diag(beta exp(b)) K],   L_ij = beta_i (k_i . k_j) e^(b_i - b_j), j < i

is one unit-lower-triangular solve per block. From U, W (c x V, c x K) every stage is matmuls:

    o     = scale (P U) + scale (diag(exp(b)) Q - P W) S0       P_ij = (q_i . k_j) e^(b_i - b_j), j <= i
    M     = exp(b_{c-1}) I - K_end^T W                          K_end_j = e^(b_{c-1} - b_j) k_j
    dS    = K_end^T U

so a block's outputs are a local part plus `q_state @ S0`, with q_state = scale (diag(exp(b)) Q -
P W) (c x K): the entering state's share costs one (c x K) @ (K x V) product, no second pass.
Over a span of blocks, q_state of block m times the product of the M's before it is the span's
q_state, and the M's and dS's fold as summaries: (M2, dS2) after (M1, dS1) is (M2 M1, M2 dS1 + dS2).

Two passes use the WY factors (`block_wy`): the chunked form carries the state through a span's
blocks in order without building M (`carry_blocks`: u = U - W S, S' = exp(b_{c-1}) S + K_end^T u,
then o = P u + scale exp(b) Q S for every block at once), the fewer multiply-adds; the split's
`span_parts` builds each block's affine map (`block_factors`) and folds it (`fold_blocks`).

Gates are read as in linear attention (linpipe.kernels.linear_attn.stages): log-gates below
LOG_GATE_MIN count as it, cumulative sums are float64, and every weight is exp of a difference
<= 0, so nothing overflows.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..linear_attn.stages import LOG_GATE_MIN

# Positions per block of the chunked form (and of span_parts): chosen by measurement (one
# thread, K = V = 64, T = 16,384, gated; benchmarks/bench_delta_rule.py): 32 beat 16, 24, 48
# and 64; the solve and the c x c products grow with c, the per-block steps in order shrink.
BLOCK_SIZE = 32
# Positions per span: the temporaries (a dozen (c, K) tiles per block, and a (K, K) M) stay in
# cache, as in the linear-attention chunked form.
SPAN = 2048
_LOG2E = 1.4426950408889634  # log2(e): the gate weights are powers of 2 (exp2 is the faster)


class Summary(NamedTuple):
    """A run of positions as an affine map of the state entering it: S' = M S0 + dS."""

    M: torch.Tensor  # (B, H, K, K)
    dS: torch.Tensor  # (B, H, K, V)


class SpanParts(NamedTuple):
    """A span run from a zero state: each position's output is o_local + state_share(q_state, S0)
    for the state S0 that enters the span, and the state after it is advance(summary, S0)."""

    o_local: torch.Tensor  # (B, T, H, V)
    q_state: torch.Tensor  # (B, T, H, K)
    summary: Summary


def check_inputs(q, k, v, beta, log_gate) -> None:
    """The contract's shapes: q, k (B, T, H, K), v (B, T, H, V), beta and log_gate (B, T, H),
    log-gates <= 0."""
    if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"q, k must be (B, T, H, K) and v (B, T, H, V) alike; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    for name, x in (("beta", beta), ("log_gate", log_gate)):
        if x is not None and tuple(x.shape) != tuple(q.shape[:3]):
            raise ValueError(f"{name} must have shape (B, T, H) = {tuple(q.shape[:3])}; got {tuple(x.shape)}")
    if log_gate is not None and bool((log_gate > 0).any()):
        raise ValueError(f"log_gate must be <= 0 everywhere; got a maximum of {float(log_gate.max()):g}")


def _pad_rows(x, n, c):
    """(B, t, H, ...) -> a (B, H, n, c, ...) view (or padded copy) of the rows, past t zero."""
    B, t, H = x.shape[:3]
    rows = x.transpose(1, 2)
    if t < n * c:
        rows = torch.nn.functional.pad(rows, [0, 0] * (x.dim() - 3) + [0, n * c - t])
    return rows.reshape(B, H, n, c, *x.shape[3:])


def _blocks(x, n, c):
    """(B, t, H, ...) -> (B, H, n, c, ...), contiguous (one copy, for the batched matmuls), with
    rows past t zero."""
    return _pad_rows(x, n, c).contiguous()


def _blocks_t(x, n, c):
    """(B, t, H, X) -> (B, H, n, X, c), contiguous, rows past t zero: each block's rows as
    columns, the layout of the solve's right-hand sides."""
    return _pad_rows(x, n, c).transpose(-1, -2).contiguous()


def _positions(x, t):
    """(B, H, n, c, X) -> (B, t, H, X): the first t rows back in the contract's layout."""
    B, H, n, c, X = x.shape
    return x.reshape(B, H, n * c, X)[:, :, :t].transpose(1, 2)


class WY(NamedTuple):
    """Every block's WY representation (all (B, H, n, ...)): the values a block writes are
    u = U - W S for the state S entering it."""

    U: torch.Tensor  # (B, H, n, c, V)
    W: torch.Tensor  # (B, H, n, c, K)
    P: torch.Tensor  # (B, H, n, c, c): the causal scores scale q_i . k_j e^(b_i - b_j), j <= i
    q_in: torch.Tensor  # (B, H, n, c, K): scale e^(b_i) q_i, the entering state's direct share
    k_end_t: torch.Tensor  # (B, H, n, K, c): the keys weighted to the block's end, transposed
    total: torch.Tensor | None  # (B, H, n, 1, 1): e^(b_c), the block's decay; None: no gates


class BlockFactors(NamedTuple):
    """Each block on its own: outputs and state from a zero entering state, and the maps of the
    state entering it (all (B, H, n, ...))."""

    o: torch.Tensor  # (B, H, n, c, V): outputs from a zero entering state
    q_state: torch.Tensor  # (B, H, n, c, K): o += q_state @ S_entering
    M: torch.Tensor  # (B, H, n, K, K)
    dS: torch.Tensor  # (B, H, n, K, V)


def _bmm(a, b, add=None, alpha=1.0):
    """a @ b (+ add) over the leading dims of (..., m, p) @ (..., p, n), as one batched call."""
    lead = a.shape[:-2]
    a3, b3 = a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])
    if add is None:
        return torch.bmm(a3, b3).view(*lead, a.shape[-2], b.shape[-1])
    return torch.baddbmm(add.reshape(-1, *add.shape[-2:]), a3, b3, alpha=alpha).view(*lead, a.shape[-2],
                                                                                       b.shape[-1])


def block_wy(q, k, v, beta, log_gate, scale, c) -> WY:
    """The WY factors of every block of c positions at once (no loop over blocks or positions).

    q, k (B, t, H, K), v (B, t, H, V), beta and log_gate (B, t, H) (log_gate may be None), in the
    compute dtype but log_gate, read in float64. Rows past t are padded with beta = 0 and a gate
    of 0: they keep the state as it is.

    The solve runs transposed, U^T (I + L)^T = (diag(beta) V)^T, on row-major (x, c) tiles: the
    layout LAPACK's batched solve takes without copying (measured 2-5x faster on the CPU than the
    (c, x) layout)."""
    B, t, H, K = q.shape
    n = -(-t // c)
    qb, kb = _blocks(q * scale, n, c), _blocks(k, n, c)  # (B, H, n, c, K)
    kt = kb.transpose(-1, -2).contiguous()  # (B, H, n, K, c)
    vt = _blocks_t(v, n, c)  # (B, H, n, V, c)
    bt = _blocks(beta, n, c).unsqueeze(-2)  # (B, H, n, 1, c)
    kbeta_t = kt * bt
    LT = _bmm(kb, kbeta_t)  # (B, H, n, c, c): L^T, L_ij = beta_i k_i . k_j; the solve reads j < i only
    P = _bmm(qb, kt)  # P_ij = scale q_i . k_j
    if log_gate is None:
        P = P.tril()
        k_end_t, w_rhs, q_in, total = kt, kbeta_t, qb, None
    else:
        # cumulative log-gates in log2 units, float64 from each block's start; each weight is
        # 2^(a difference <= 0), the difference taken in float64 before it is rounded
        g = log_gate.to(torch.float64).clamp(min=LOG_GATE_MIN) * _LOG2E
        b = _blocks(g, n, c).cumsum(-1)  # (B, H, n, c)
        last = b[..., -1:]
        above = torch.full((c, c), float("-inf"), dtype=q.dtype, device=q.device).triu(1)
        decay = torch.exp2((b.unsqueeze(-1) - b.unsqueeze(-2)).to(q.dtype) + above)  # (B, H, n, c, c)
        LT = (LT * decay.transpose(-1, -2)).contiguous()
        P = P * decay
        gam = torch.exp2(b).to(q.dtype).unsqueeze(-2)  # (B, H, n, 1, c)
        k_end_t = kt * torch.exp2(last - b).to(q.dtype).unsqueeze(-2)
        w_rhs, q_in = kbeta_t * gam, qb * gam.transpose(-1, -2)
        total = torch.exp2(last).to(q.dtype).unsqueeze(-1)  # (B, H, n, 1, 1)
    V = v.shape[-1]
    Xt = torch.linalg.solve_triangular(LT, torch.cat([vt * bt, w_rhs], -2), upper=True, unitriangular=True,
                                       left=False)  # (B, H, n, V + K, c): [U | W]^T
    return WY(Xt[..., :V, :].transpose(-1, -2), Xt[..., V:, :].transpose(-1, -2), P, q_in, k_end_t, total)


def block_factors(wy: WY) -> BlockFactors:
    """Each block as an affine map of the state entering it, from its WY factors: outputs from
    zero P U, the entering state's map q_in - P W, M = e^(b_c) I - K_end^T W, dS = K_end^T U."""
    K = wy.W.shape[-1]
    eye = torch.eye(K, dtype=wy.W.dtype, device=wy.W.device)
    total = eye if wy.total is None else eye * wy.total  # (B, H, n, K, K) or (K, K)
    o = _bmm(wy.P, wy.U)
    q_state = _bmm(wy.P, wy.W, wy.q_in, alpha=-1.0)  # q_in - P W
    dS = _bmm(wy.k_end_t, wy.U)
    M = _bmm(wy.k_end_t, wy.W, total.expand(*wy.k_end_t.shape[:3], K, K), alpha=-1.0)  # total I - K_end^T W
    return BlockFactors(o, q_state, M, dS)


def carry_blocks(wy: WY, S0, scratch=None):
    """The chunked form's pass over a span's blocks in order, from S0 (B, H, K, V): each block's
    written values u = U - W S and the state after it, total S + K_end^T u; then every output at
    once, o = P u + q_in S. Fewer multiply-adds than the affine maps (no K x K M per block),
    which only the split needs. Returns (o (B, H, n, c, V), S after the last block).

    scratch (a reusing linpipe.kernels.linear_attn.scratch.Scratch, inference only): the
    per-block values, states and outputs go to its buffers, laid out block-major (n, B, H, ...),
    the layout `wy`'s fields are read in without a copy when they are views of block-major
    tensors (linpipe.kernels.kda); the same products, so the same numbers."""
    if scratch is not None and scratch.reuse:
        return _carry_into(wy, S0, scratch)
    B, H, n, c, V = wy.U.shape
    K = wy.W.shape[-1]
    S = S0.reshape(B * H, K, V)
    U, W = wy.U.reshape(B * H, n, c, V), wy.W.reshape(B * H, n, c, K)  # views: (B, H) merge
    k_end_t = wy.k_end_t.reshape(B * H, n, K, c)
    # the block's decay: a scalar (B, H, n, 1, 1), or one per key (B, H, n, K, 1) (linpipe.kernels.kda)
    total = None if wy.total is None else wy.total.reshape(B * H, n, *wy.total.shape[-2:])
    starts, us = [], []
    for m in range(n):
        starts.append(S)
        u = torch.baddbmm(U[:, m], W[:, m], S, alpha=-1.0)
        us.append(u)
        if total is not None:
            S = S * total[:, m]
        S = torch.baddbmm(S, k_end_t[:, m], u)
    u = torch.stack(us, 1).view(B, H, n, c, V)
    starts = torch.stack(starts, 1).view(B, H, n, K, V)
    return _bmm(wy.q_in, starts, _bmm(wy.P, u)), S.view(B, H, K, V)


def _block_major(x):
    """(B, H, n, ...) -> (n, B H, ...) of the same elements: a view of block-major storage,
    else a copy."""
    return x.movedim(2, 0).reshape(x.shape[2], x.shape[0] * x.shape[1], *x.shape[3:])


def _carry_into(wy: WY, S0, scratch):
    """carry_blocks into scratch buffers, one (B H) batch per block (contiguous in block-major
    storage): each block's written values and its entering state's share of the outputs, q_in S,
    computed while S is in cache (the states are not kept: writing and re-reading one K x V state
    per block cost more than the extra product call); then P u for every block at once."""
    B, H, n, c, V = wy.U.shape
    K = wy.W.shape[-1]
    u = scratch("dr_u", n, B * H, c, V)
    o = scratch("dr_o", n, B * H, c, V)
    # per-block views made once: indexing in the loop costs as much as a block's arithmetic
    U, W, k_end_t, q_in = (_block_major(x).unbind(0) for x in (wy.U, wy.W, wy.k_end_t, wy.q_in))
    total = None if wy.total is None else _block_major(wy.total).unbind(0)
    us, os_ = u.unbind(0), o.unbind(0)
    S = S0.reshape(B * H, K, V)
    for m in range(n):
        torch.bmm(q_in[m], S, out=os_[m])
        torch.baddbmm(U[m], W[m], S, alpha=-1.0, out=us[m])
        S = torch.baddbmm(S if total is None else S * total[m], k_end_t[m], us[m])
    o.view(-1, c, V).baddbmm_(_block_major(wy.P).reshape(-1, c, c), u.view(-1, c, V))
    return o.view(n, B, H, c, V).movedim(0, 2), S.view(B, H, K, V)


def fold_blocks(M, dS, S0, P0=None):
    """The state entering each block, from S0 (B, H, K, V): (starts (B, H, n, K, V), S after the
    last block); with P0 (B, H, K, K), also the product of the M's before each block times P0
    (prefixes (B, H, n, K, K)) and after the last. One (K x K) @ (K x V) product per block, in
    order: the only step that is sequential over blocks."""
    B, H, n, K, V = dS.shape
    S = S0.reshape(B * H, K, V)
    Mf, dSf = M.reshape(B * H, n, K, K), dS.reshape(B * H, n, K, V)
    P = None if P0 is None else P0.reshape(B * H, K, K)
    starts, prefixes = [], []
    for m in range(n):
        starts.append(S)
        S = torch.baddbmm(dSf[:, m], Mf[:, m], S)
        if P is not None:
            prefixes.append(P)
            P = torch.bmm(Mf[:, m], P)
    starts = torch.stack(starts, 1).view(B, H, n, K, V)
    if P is None:
        return starts, S.view(B, H, K, V), None, None
    return starts, S.view(B, H, K, V), torch.stack(prefixes, 1).view(B, H, n, K, K), P.view(B, H, K, K)


def run_wy(wy: WY, t, S0, P0=None):
    """One span's blocks from their WY factors, entering with S0 (B, H, K, V): (o (B, t, H, V)
    with S0's share, S after, and with P0 (B, H, K, K) the span's q_state (B, t, H, K) times P0
    and the M's product times P0 after it, else None). t: the span's positions (the blocks' rows
    past t are padding)."""
    if P0 is None:
        o, S = carry_blocks(wy, S0)
        return _positions(o, t), S, None, None
    f = block_factors(wy)
    starts, S, prefixes, P = fold_blocks(f.M, f.dS, S0, P0)
    o = _positions(_bmm(f.q_state, starts, f.o), t)
    q_state = _positions(_bmm(f.q_state, prefixes), t)
    return o, S, q_state, P


def spans_outputs(wy_of, T, span, S, like):
    """The chunked form's pass: spans of `span` positions in order from the state S (B, H, K,
    V), wy_of(a, b) the WY factors of positions a:b. like: a (B, T, H, V) tensor of the outputs'
    shape, dtype and device. Returns (o (B, T, H, V), S after)."""
    outs = []
    for a in range(0, T, span):
        b = min(a + span, T)
        o, S, _, _ = run_wy(wy_of(a, b), b - a, S)
        outs.append(o)
    B, _, H, V = like.shape
    return (torch.cat(outs, 1) if outs else like.new_zeros((B, 0, H, V))), S


def spans_parts(wy_of, T, span, shape, like, before: Summary | None = None) -> SpanParts:
    """span_parts' pass over spans of `span` positions: wy_of(a, b) the WY factors of positions
    a:b, shape (B, H, K, V), like a tensor of the compute dtype and device; before as in
    span_parts."""
    B, H, K, V = shape
    if before is None:
        S = like.new_zeros((B, H, K, V))
        P = torch.eye(K, dtype=like.dtype, device=like.device).expand(B, H, K, K)
    else:
        S, P = before.dS.to(like.dtype), before.M.to(like.dtype)
    outs, qs = [], []
    for a in range(0, T, span):
        b = min(a + span, T)
        o, S, q_state, P = run_wy(wy_of(a, b), b - a, S, P)
        outs.append(o)
        qs.append(q_state)
    if not outs:
        return SpanParts(like.new_zeros((B, 0, H, V)), like.new_zeros((B, 0, H, K)), Summary(P.clone(), S))
    return SpanParts(torch.cat(outs, 1), torch.cat(qs, 1), Summary(P, S))


def span_parts(q, k, v, beta, *, log_gate=None, scale=None, block_size=BLOCK_SIZE,
               span=SPAN, before: Summary | None = None) -> SpanParts:
    """A span from a zero state, in one pass: its outputs from zero, the map of an entering
    state to the outputs (q_state) and the span's summary (M, dS). Same inputs as the chunked
    form, in its compute dtype (float32; float64 for float64 inputs).

    before: the summary of the positions before the span, from the same zero state (a pass
    continued over several calls): outputs and summary then count from that earlier zero, and
    q_state maps the state entering those earlier positions."""
    check_inputs(q, k, v, beta, log_gate)
    B, T, H, K = q.shape
    V = v.shape[-1]
    cd = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = K ** -0.5 if scale is None else scale
    q, k, v, beta = q.to(cd), k.to(cd), v.to(cd), beta.to(cd)
    return spans_parts(lambda a, b: block_wy(q[:, a:b], k[:, a:b], v[:, a:b], beta[:, a:b],
                                             None if log_gate is None else log_gate[:, a:b], scale,
                                             block_size),
                       T, span, (B, H, K, V), q, before)


def span_summary(k, v, beta, *, log_gate=None, block_size=BLOCK_SIZE, span=SPAN) -> Summary:
    """A span's summary (M, dS) alone (q is not needed: its outputs are discarded)."""
    return span_parts(k, k, v, beta, log_gate=log_gate, block_size=block_size, span=span).summary


def fold_summaries(summaries) -> Summary:
    """The summary of consecutive spans, given in order: (M2, dS2) after (M1, dS1) is
    (M2 M1, M2 dS1 + dS2)."""
    M, dS = summaries[0]
    for M2, dS2 in summaries[1:]:
        M, dS = M2 @ M, M2 @ dS + dS2
    return Summary(M, dS)


def advance(summary: Summary, S0):
    """The state after a span (B, H, K, V) from the state entering it: M S0 + dS."""
    return summary.M @ S0.to(summary.M.dtype) + summary.dS


def state_share(q_state, S0):
    """An entering state's share of a span's outputs: q_state (B, T, H, K), S0 (B, H, K, V) ->
    (B, T, H, V), added to o_local. The same cost as linear attention's (a K-by-V product per
    position)."""
    return torch.einsum("bthk,bhkv->bthv", q_state, S0.to(q_state.dtype))
