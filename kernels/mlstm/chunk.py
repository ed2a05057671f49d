"""The chunked form of the mLSTM in PyTorch (every device; inference only). Same contract as
naive.py.

**The frames.** A block of c positions enters with the state U (C and n side by side, [C | n])
stabilised by m_b. With G_t the block's summed log forget gates through row t (from the block's
start) and a_t = i_t - G_t, the recurrence's stabiliser at row t is m_t = G_t + phi_t with

    phi_t = max(m_b, max_{j<=t} a_j)          (one cummax per block)

and every weight is exp of a difference <= 0 taken in float64: exp(a_j - phi_t) for position j
at row t, exp(m_b - phi_t) for the entering state. With K_j = exp(a_j - m_b) k_j and Q_t = scale
exp(m_b - phi_t) q_t (both in the frame of m_b, known before the block), row t's parts stabilised
by its m_t are

    [num_t | den_t] = sum_{j<=t} (Q_t . K_j) [v_j | 1] + Q_t^T U

one product [A | Q] @ [[v | 1]; U] per block with A = tril(Q K^T): the intra-block scores and the
entering state's share fused, the normaliser a column of ones beside v. Then h_t = num_t /
(max(|den_t|, exp(-m_t)) + eps). A row reads nothing of the rows after it (no frame is taken
from a block's end): its bits do not depend on what follows it in its call. Where a row's frame
phi_t rises more than WIDE above m_b (its input gate outweighs the state by e^WIDE: the state is
all but wiped out there), K_j would overflow: those rows get their scores from explicit weights
exp(a_j - phi_t) instead (`_wide_scores`), and only those.

The stabiliser after block b is m_{b+1} = G_c + phi_c (its last row's), in float64: one small
step per block in order, every quantity of a block a function of its rows, U_b and m_b alone. So
a call cut at a block's edge, its state carried (C and n in the compute dtype, m in float64),
continues with the same bits as one call (linpipe's units and score-variants' replays rely on
it). The state after the block, stabilised by it, is

    U' = exp(m_b - e) U + K_e^T [v | 1],    K_e = exp(a_j - e) k_j,  e = m_{b+1} - G_c

every weight at most 1: one batched product for all blocks, then one
multiply-add per block in order (the only loop over blocks besides m's).

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


def frames(igate, fgate, m0, c):
    """The span's gates per block as float64 (n, B, H, c) tensors of a span whose length is a
    multiple of c: G (the summed log forget gates from each block's start), a = i - G, phi (each
    row's frame) and the stabiliser m entering each block and after the last, (n + 1, B, H): m0
    (B, H) float64 (-inf: empty), then each block's last-row G + phi, block after block."""
    B, T, H = igate.shape
    n = T // c

    def blocks(x):  # (B, n*c, H) -> (n, B, H, c)
        return x.view(B, n, c, H).permute(1, 0, 3, 2)

    G = blocks(log_forget(fgate)).cumsum(-1)
    a = blocks(igate.to(torch.float64)) - G
    top = a.cummax(-1).values  # (n, B, H, c)
    ms = torch.empty((n + 1, B, H), dtype=torch.float64, device=igate.device)
    ms[0] = m0
    G_end, top_end = G[..., -1], top[..., -1]
    for b in range(n):  # in order: a block's m from the one entering it alone, whatever came before
        torch.maximum(ms[b], top_end[b], out=ms[b + 1]).add_(G_end[b])
    phi = torch.maximum(top, ms[:-1].unsqueeze(-1))
    return G, a, phi, ms


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
    G, a, phi, ms = frames(igate, fgate, m0, c)  # (n, B, H, c) float64; ms (n + 1, B, H)
    ab, phib = a.unsqueeze(-1), phi.unsqueeze(-1)  # (n, B, H, c, 1)
    enter = ms[:-1, ..., None, None]  # (n, B, H, 1, 1): the stabiliser entering each block
    frame = (ms[1:] - G[..., -1])[..., None, None]  # the state after each block's: m_{b+1} - G_c
    m = n * B * H
    qb, kb = _blocks(q, n, c), _blocks(k, n, c)
    # contiguous operands (a strided one takes torch's slow batched-matmul path)
    # the scores' two factors carry exponents up to WIDE apart: exp in float64, then rounded;
    # k in the entering frame (clamped: a row past WIDE is explicit), stored transposed
    Ks = scratch("ml_K", n, B, H, K, c)
    torch.mul(kb, torch.exp((ab - enter).clamp_(max=wide_max)).to(cd), out=Ks.transpose(-1, -2))
    Vb = scratch("ml_V", n, B, H, c, N)  # [v | 1 | 0]
    Vb[..., :V].copy_(_blocks(v, n, c))
    Vb[..., V] = 1.0
    Vb[..., V + 1:] = 0.0
    # each block's state from zero, stabilised by the m after it (k weighted to the block's end)
    Ke = scratch("ml_Ke", n, B, H, K, c)
    torch.mul(kb, torch.exp(ab - frame).to(cd), out=Ke.transpose(-1, -2))
    D = torch.bmm(Ke.view(m, K, c), Vb.view(m, c, N), out=scratch("ml_D", m, K, N))
    D = D.view(n, B, H, K, N)
    # Y = [[v | 1 | 0]; [U_b]] (n, B, H, c + K, N): U_b the state entering block b
    Y = scratch("ml_Y", n, B, H, c + K, N)
    Y[..., :c, :].copy_(Vb)
    decay = _exp(enter - frame, cd)  # (n, B, H, 1, 1): the entering state's weight after the block
    U = Y[..., c:, :]
    U[0] = state
    for b in range(n - 1):  # the only step in order: one multiply-add per block
        torch.addcmul(D[b], U[b], decay[b], out=U[b + 1])
    state = torch.addcmul(D[-1], U[-1], decay[-1])  # (B, H, K, N)
    # X = [A | Q] (n, B, H, c, c + K): the causal scores and the entering state's weights, Q =
    # scale exp(m_b - phi_t) q_t (the entering frame's share of each row, <= scale)
    X = scratch("ml_X", n, B, H, c, c + K)
    torch.mul(qb, (torch.exp(enter - phib) * scale).to(cd), out=X[..., c:])
    A = torch.bmm(X.view(m, c, c + K)[..., c:], Ks.view(m, K, c), out=scratch("ml_A", m, c, c))
    torch.mul(A.view(n, B, H, c, c), _causal(c, cd, q.device), out=X[..., :c])
    wide = (phi - enter[..., 0]) > wide_max  # (n, B, H, c): rows whose scores are explicit
    if bool(wide.any()):
        idx = wide.any(-1).nonzero(as_tuple=True)
        rows = wide[idx].unsqueeze(-1)  # (w, c, 1)
        X[..., :c][idx] = torch.where(rows, _wide_scores(qb, kb, a, phi, scale, idx).to(cd), X[..., :c][idx])
    out = torch.bmm(X.view(m, c, c + K), Y.view(m, c + K, N), out=scratch("ml_out", m, c, N))
    mt = (G + phi).permute(1, 2, 0, 3).reshape(B, H, n * c)  # the stabiliser of every row
    return out.view(n, B, H, c, N), mt, state, ms[-1]


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
    in q's dtype, final state or None: C, n float32, m float64, the stabiliser as the blocks carry
    it, so that a call continued from the state is the same bits as one call when cut at a
    block's edge), in blocks of block_size.

    Computes in float32 (float64 for float64 inputs, or `dtype` when given); the gates' sums and
    the stabiliser are float64 whatever the dtype. Inference only (no backward)."""
    h, _, _, (C, nrm, m) = _chunk(q, k, v, igate, fgate, scale, eps, initial_state, block_size, dtype)
    final = (C.float().contiguous(), nrm.float().contiguous(), m.clone()) if output_final_state else None
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
