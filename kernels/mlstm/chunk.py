"""The chunked form of the mLSTM in PyTorch (every device; inference only). Same contract as
naive.py.

**The frame.** Over a span of positions entering with (C0, n0, m0), let G_t be the summed log
forget gates from the span's start through t and a_t = i_t - G_t. The unstabilised state is

    C*_t = exp(G_t) P_t,    P_t = exp(m0) C0 + sum_{j<=t} exp(a_j) k_j v_j^T

(n alike, with k_j for k_j v_j^T), and the recurrence's stabiliser is m_t = G_t + phi_t with

    phi_t = max(m0, max_{j<=t} a_j)          (a running maximum: one cummax per span)

so the stabilised state the recurrence carries is exp(-phi_t) P_t: phi_t is the log of the
largest weight in P_t. Every weight below is exp of a difference of a's and phi's taken in
float64 from float64 sums: no cumulative product is ever formed.

**Blocks.** A block of c positions has the frame e = phi of its last row; the state U entering
it is held in the frame p of the previous block's last row (m0 for the first block). With
K_j = exp(a_j - e) k_j (<= 1), Q_i = scale exp(e - phi_i) q_i and Q_in,i = scale exp(p - phi_i) q_i
(<= scale), row i's output parts stabilised by its m_i are

    [num_i | den_i] = sum_{j<=i} (Q_i . K_j) [v_j | 1] + Q_in,i^T U

one product [A | Q_in] @ [[v | 1]; U] per block with A = tril(Q K^T): the intra-block scores and
the entering state's share fused, the normaliser a column of ones beside v. Then h_i = num_i /
(max(|den_i|, exp(-m_i)) + eps). The state after the block, in its frame e, is

    U' = exp(p - e) U + K^T [v | 1]

every weight <= 1: one batched product for all blocks, then one multiply-add per block in order
(the only loop over blocks). Q_i . K_j = scale exp(a_j - phi_i) q_i . k_j is the recurrence's own
weight; Q_i alone reaches exp(e - phi_i), which overflows where a block's frame rises by more than
WIDE within it (a row whose input gate outweighs the state by e^WIDE: the state is all but wiped
out there). Those rare blocks get their scores from explicit weights exp(a_j - phi_i) instead
(`_wide_scores`), and only those.

Rows past the end of a call are padded with a forget gate of 1 (log 0) and an input gate of 0
(a log input gate of -1e30): they change neither the state nor the stabiliser, so the state
after the padding is the state after the last real row.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..linear_attn.scratch import Scratch, hugepages
from ..linear_attn.stages import LOG_GATE_MIN

# Positions per block: the scores and the fused product's scores part cost c (K + V) per
# position, the block's state and the entering state's share 4 K V, the multiply-add in order K V
# per block. 32 beat 16 (1.17x slower) and 64 (1.05-1.15x) at K = V = 64 on one thread.
BLOCK_SIZE = 32
# Positions per span: a span's temporaries (a few of SPAN * H * (c + K) floats) stay in cache.
SPAN = 2048
# Largest rise of the frame phi within a block whose scores are taken as (Q_i . K_j): K_j <=
# exp(WIDE) and Q_i >= exp(-WIDE) stay in float32's normal range with room for the products.
WIDE = {torch.float32: 50.0, torch.float64: 600.0}
# The columns of the products' right-hand sides, [v | 1 | 0...], are a multiple of this: MKL ran
# 65 columns slower than 72 (the zero columns cost less than its remainder kernel).
COLUMNS = 8
# The log input gate of a padded row: nothing is written (exp of it is 0 in float64).
_NO_WRITE = -1e30


def check_inputs(q, k, v, igate, fgate) -> None:
    """q, k (B, T, H, K), v (B, T, H, V), igate and fgate (B, T, H)."""
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"q, k must be (B, T, H, K) and v (B, T, H, V); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    for name, x in (("igate", igate), ("fgate", fgate)):
        if tuple(x.shape) != tuple(q.shape[:3]):
            raise ValueError(f"{name} must have shape (B, T, H) = {tuple(q.shape[:3])}; got {tuple(x.shape)}")


def log_forget(fgate):
    """logsigmoid of the forget-gate preactivations in float64, floored at LOG_GATE_MIN (a gate of
    exactly 0 keeps every sum finite)."""
    return F.logsigmoid(fgate.to(torch.float64)).clamp_(min=LOG_GATE_MIN)


def frames(igate, fgate, m0):
    """The span's gates as float64 (B, H, t) tensors: G (the summed log forget gates from the
    span's start), a = i - G, phi = max(m0, cummax(a)); m0 (B, H) float64 (-inf: empty)."""
    G = log_forget(fgate).transpose(1, 2).cumsum(-1)
    a = igate.to(torch.float64).transpose(1, 2) - G
    phi = torch.maximum(a.cummax(-1).values, m0.unsqueeze(-1)) if a.shape[-1] else a
    return G, a, phi


def _wide_scores(q, k, a, phi, scale, blocks):
    """Scores of the given blocks from explicit weights: q, k (n, B, H, c, K), a and phi (n, B, H,
    c) float64, blocks: indices of (n, B, H) -> (m, c, c) tril(scale exp(a_j - phi_i) q_i . k_j)."""
    qs, ks = q[blocks], k[blocks]  # (m, c, K)
    c = qs.shape[1]
    d = a[blocks].unsqueeze(-2) - phi[blocks].unsqueeze(-1)  # (m, c, c): a_j - phi_i
    above = torch.ones(c, c, dtype=torch.bool, device=q.device).triu(1)
    w = torch.exp(d.masked_fill(above, float("-inf")))
    return torch.matmul(qs, ks.transpose(-1, -2)) * w.to(qs.dtype) * scale


def _causal(c, dtype, device):
    return torch.ones(c, c, dtype=dtype, device=device).tril()


def _span(q, k, v, igate, fgate, state, m0, scale, c, scratch):
    """One span of t positions (B, t, H, .) entering with state [C | n | 0] (B, H, K, N) in the
    compute dtype and m0 (B, H) float64 -> (out (n, B, H, c, N): [num | den | 0] of every row
    stabilised by its m, in scratch memory; m (B, H, n*c) float64; the state and m after it)."""
    B, t, H, K = q.shape
    V, N = v.shape[-1], state.shape[-1]
    n = -(-t // c)
    pad = n * c - t
    cd = q.dtype
    wide_max = WIDE.get(cd, WIDE[torch.float32])
    if pad:  # padded rows: forget gate 1, input gate 0
        q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
        igate = F.pad(igate, (0, 0, 0, pad), value=_NO_WRITE)
        fgate = F.pad(fgate, (0, 0, 0, pad), value=float("inf"))
    G, a, phi = frames(igate, fgate, m0)  # (B, H, n*c) float64

    def gates(x):  # (B, H, n*c) -> (n, B, H, c, 1) view
        return x.view(B, H, n, c).permute(2, 0, 1, 3).unsqueeze(-1)

    ab, phib = gates(a), gates(phi)
    end = phib[..., -1:, :]  # (n, B, H, 1, 1): each block's frame, that of its last row
    prev = torch.cat([m0.unsqueeze(0), phib[:-1, :, :, -1, 0]], 0)[..., None, None]  # the entering state's
    wide = (end - phib[..., :1, :]).view(n, B, H) > wide_max
    m = n * B * H
    qb, kb = _blocks(q, n, c), _blocks(k, n, c)
    # contiguous operands (a strided one takes torch's slow batched-matmul path)
    # k weighted to each block's end (<= 1), stored transposed: both products read it as (K, c)
    Kt = scratch("ml_K", n, B, H, K, c)
    # the scores' two factors carry exponents up to WIDE apart: exp in float64, then rounded
    torch.mul(kb, torch.exp(ab - end).to(cd), out=Kt.transpose(-1, -2))
    Qe = torch.mul(qb, (torch.exp((end - phib).clamp_(max=wide_max)) * scale).to(cd),
                   out=scratch("ml_Q", n, B, H, c, K))
    Vb = scratch("ml_V", n, B, H, c, N)  # [v | 1 | 0]
    Vb[..., :V].copy_(_blocks(v, n, c))
    Vb[..., V] = 1.0
    Vb[..., V + 1:] = 0.0
    # each block's state from zero, in its frame
    D = torch.bmm(Kt.view(m, K, c), Vb.view(m, c, N), out=scratch("ml_D", m, K, N))
    D = D.view(n, B, H, K, N)
    # Y = [[v | 1 | 0]; [U_b]] (n, B, H, c + K, N): U_b the state entering block b in its frame
    Y = scratch("ml_Y", n, B, H, c + K, N)
    Y[..., :c, :].copy_(Vb)
    decay = _exp(prev - end, cd)  # (n, B, H, 1, 1): the entering state's weight at the block's end
    U = Y[..., c:, :]
    U[0] = state
    for b in range(n - 1):  # the only step in order: one multiply-add per block
        torch.addcmul(D[b], U[b], decay[b], out=U[b + 1])
    state = torch.addcmul(D[-1], U[-1], decay[-1])  # (B, H, K, N)
    # X = [A | Q_in] (n, B, H, c, c + K): the causal scores and the entering state's weights
    X = scratch("ml_X", n, B, H, c, c + K)
    A = torch.bmm(Qe.view(m, c, K), Kt.view(m, K, c), out=scratch("ml_A", m, c, c))
    torch.mul(A.view(n, B, H, c, c), _causal(c, cd, q.device), out=X[..., :c])
    if bool(wide.any()):
        idx = wide.nonzero(as_tuple=True)
        X[..., :c][idx] = _wide_scores(qb, kb, ab[..., 0], phib[..., 0], scale, idx).to(cd)
    torch.mul(qb, _exp(prev - phib, cd, scale), out=X[..., c:])
    out = torch.bmm(X.view(m, c, c + K), Y.view(m, c + K, N), out=scratch("ml_out", m, c, N))
    mt = G + phi  # (B, H, n*c): the stabiliser of every row
    return out.view(n, B, H, c, N), mt, state, mt[..., t - 1]


def _exp(x, dtype, scale=None):
    """scale * exp(x) in `dtype` for float64 exponents x <= 0 of a weight used alone: the exponent
    rounded first (the weight then carries an error of |x| e^x eps <= eps / e), the exp in `dtype`
    (float32's is the faster)."""
    w = x.to(dtype).exp_()
    return w if scale is None else w.mul_(scale)


def _blocks(x, n, c):
    """(B, n*c, H, X) -> (n, B, H, c, X), a view."""
    B, _, H, X = x.shape
    return x.view(B, n, c, H, X).permute(1, 0, 3, 2, 4)


def _rows(x, t):
    """(n, B, H, c, X) -> (B, t, H, X): the first t rows in the contract's layout (a copy)."""
    n, B, H, c, X = x.shape
    return x.permute(1, 0, 3, 2, 4).reshape(B, n * c, H, X)[:, :t]


def check_no_grad(*tensors) -> None:
    """The chunked form writes its products into reused buffers: it has no backward."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise NotImplementedError("the mLSTM's chunked form has no backward; run it under torch.no_grad() "
                                  "(naive_recurrent_mlstm is differentiable)")


def chunk_mlstm_torch(q, k, v, igate, fgate, *, scale=None, eps=1e-6, initial_state=None,
                      output_final_state=False, block_size: int = BLOCK_SIZE,
                      dtype: torch.dtype | None = None):
    """naive_recurrent_mlstm's contract: q, k (B, T, H, K), v (B, T, H, V), igate and fgate (B, T,
    H) preactivations, the state (C (B, H, K, V), n (B, H, K), m (B, H)). Returns (h (B, T, H, V)
    in q's dtype, final state float32 or None), in blocks of block_size.

    Computes in float32 (float64 for float64 inputs, or `dtype` when given); the gates' sums and
    the stabiliser are float64 whatever the dtype. Inference only (no backward)."""
    h, _, _, (C, nrm, m) = _chunk(q, k, v, igate, fgate, scale, eps, initial_state, block_size, dtype)
    final = (C.float().contiguous(), nrm.float().contiguous(), m.float()) if output_final_state else None
    return h.to(q.dtype if dtype is None else h.dtype), final


def chunk_mlstm_parts(q, k, v, igate, fgate, *, scale=None, initial_state=None, block_size: int = BLOCK_SIZE,
                      dtype: torch.dtype | None = None):
    """The outputs' parts before the normaliser divides, for callers that add to them (the
    sequence-parallel split, kernels/mlstm/stages.py): (num (B, T, H, V), den (B, T, H), m (B, T,
    H) float64: the stabiliser the parts are divided by, (C, n, m) after the last position), num
    and den in the compute dtype, the state too (C, n in it, m float64), so that a float64 caller
    carries it exactly. h = num / (max(|den|, exp(-m)) + eps)."""
    _, parts, _, state = _chunk(q, k, v, igate, fgate, scale, None, initial_state, block_size, dtype)
    return (*parts, state)


def _chunk(q, k, v, igate, fgate, scale, eps, initial_state, block_size=BLOCK_SIZE, dtype=None):
    """The work of both: with eps, (h, None, None, state); without, (None, (num, den, m), state)."""
    check_inputs(q, k, v, igate, fgate)
    check_no_grad(q, k, v, igate, fgate, *(initial_state or ()))
    B, T, H, K = q.shape
    V = v.shape[-1]
    cd = dtype or (torch.float64 if q.dtype == torch.float64 else torch.float32)
    scale = K ** -0.5 if scale is None else scale
    q, k, v = q.to(cd), k.to(cd), v.to(cd)
    state = q.new_zeros((B, H, K, -(-(V + 1) // COLUMNS) * COLUMNS))  # [C | n | 0]
    m = torch.zeros((B, H), dtype=torch.float64, device=q.device)
    if initial_state is not None:
        state[..., :V] = initial_state[0]
        state[..., V] = initial_state[1]
        m = initial_state[2].to(device=q.device, dtype=torch.float64).reshape(B, H)
    c = max(1, int(block_size))
    span = max(c, SPAN // c * c)
    scratch = Scratch(q, reuse=True)
    if eps is None:
        num, den = q.new_empty((B, T, H, V)), q.new_empty((B, T, H))
        ms = torch.empty((B, T, H), dtype=torch.float64, device=q.device)
    else:
        h = q.new_empty((B, T, H, V))
        hugepages(h)
    for s in range(0, T, span):
        sl = slice(s, s + span)
        t = min(span, T - s)
        out, mt, state, m = _span(q[:, sl], k[:, sl], v[:, sl], igate[:, sl], fgate[:, sl], state, m,
                                  scale, c, scratch)
        if eps is None:
            num[:, sl] = _rows(out[..., :V], t)
            den[:, sl] = _rows(out[..., V:V + 1], t)[..., 0]
            ms[:, sl] = mt[..., :t].transpose(1, 2)
            continue
        n = out.shape[0]
        floor = _exp(-mt.view(B, H, n, c).permute(2, 0, 1, 3).unsqueeze(-1), cd)  # (n, B, H, c, 1)
        inv = torch.maximum(out[..., V:V + 1].abs(), floor).add_(eps).reciprocal_()
        if t == n * c:
            torch.mul(out[..., :V], inv, out=_blocks(h[:, sl], n, c))
        else:
            h[:, sl] = _rows(out[..., :V] * inv, t)
    state = (state[..., :V], state[..., V], m)
    if eps is None:
        return None, (num, den, ms), None, state
    return h, None, None, state
