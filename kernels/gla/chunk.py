"""The chunked form of gated linear attention with a gate per key (GLA), in PyTorch (the CPU,
and autograd anywhere). Same contract as naive.py.

The sequence streams through in spans of SPAN positions, carrying S; a span is cut into n
blocks of c positions. With b_i the cumulative log-gate (per key) from a block's start to row
i, and the block's total b_{c-1}:

    o_i = scale q_i^T [ sum_{j<=i} diag(exp(b_i - b_j)) k_j v_j^T  +  diag(exp(b_i)) S ]
    S'  = diag(exp(b_{c-1})) S + sum_j diag(exp(b_{c-1} - b_j)) k_j v_j^T

Every weight but one is at most 1: q_i exp(b_i) (the entering state's share), k_j exp(b_{c-1} -
b_j) (the local state) and exp(b_{c-1}) (the fold) cannot overflow. The intra-block scores
take exp(b_i - b_j) apart as (q_i exp(b_i)) . (k_j exp(-b_j)), one matmul a block, and
exp(-b_j) grows: a key whose gates in a block sum to less than -FACTOR_MAX (a state emptied
within the block) would overflow it, so those keys' scores are computed with their weights
explicit (`_strong_scores`), and only theirs (a trained model's gates rarely reach it).

The fold across blocks is a loop over blocks (an (H, K, V) multiply-add each), not over
positions.
"""
from __future__ import annotations

import torch

from ..linear_attn.stages import LOG_GATE_MIN

# Positions per block: the intra-block scores cost c (K + V) per position, the fold K V per
# block; 32 was the faster of 16, 32 and 64 at K = V = 64 on one thread.
BLOCK_SIZE = 32
# Positions per span: a span's temporaries (a few of SPAN * H * K floats) stay in cache.
SPAN = 2048
# Largest exponent of k's intra-block weight exp(-b_j): exp(60) * exp(60) stays far below
# float32's maximum (3.4e38) in a score's products, and a key past it is computed explicitly.
FACTOR_MAX = 60.0


def check_inputs(q, k, v, log_gate) -> None:
    """q, k (B, T, H, K), v (B, T, H, V), log_gate (B, T, H, K) <= 0."""
    if q.dim() != 4 or k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"q, k must be (B, T, H, K) and v (B, T, H, V); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if tuple(log_gate.shape) != tuple(q.shape):
        raise ValueError(f"log_gate must have shape (B, T, H, K) = {tuple(q.shape)}; "
                         f"got {tuple(log_gate.shape)}")
    if bool((log_gate > 0).any()):
        raise ValueError(f"log_gate must be <= 0 everywhere; got a maximum of {float(log_gate.max()):g}")


def _blocks(x, n, c):
    """Positions (B, t, H, X), t <= n*c -> blocks (B, H, n, c, X), rows past t zero."""
    B, t, H, X = x.shape
    rows = x.transpose(1, 2)  # (B, H, t, X)
    if t < n * c:
        rows = torch.nn.functional.pad(rows, (0, 0, 0, n * c - t))
    return rows.reshape(B, H, n, c, X)


def _strong_scores(q, k, b, strong):
    """The intra-block scores' share of the strong keys, weights explicit: for the blocks with
    one, (index of those blocks, scores (m, c, c)) where scores[i, j] = sum over strong keys of
    q_i k_j exp(b_i - b_j), i >= j (0 above the diagonal). q, k, b (B, H, n, c, K); strong (B,
    H, n, K)."""
    idx = strong.any(-1).nonzero(as_tuple=True)  # the blocks (B, H, n) with a strong key
    qs, ks, bs = q[idx], k[idx], b[idx]  # (m, c, K)
    c = qs.shape[1]
    above = torch.ones(c, c, dtype=torch.bool, device=q.device).triu(1)[None, :, :, None]
    diff = (bs[:, :, None, :] - bs[:, None, :, :]).masked_fill(above, float("-inf"))  # (m, c, c, K)
    w = diff.exp() * strong[idx][:, None, None, :]  # only the strong keys
    return idx, torch.einsum("mik,mjk,mijk->mij", qs, ks, w)


def _run_blocks(q, k, v, g, S, scale, n, c):
    """Positions of q, k, g (B, t, H, K) and v (B, t, H, V), t <= n*c, as n blocks of c (the
    last padded with zero rows and gates of 0, which leave the state as it is), entering with S
    (B, H, K, V) -> (o (B, H, n, c, V), S after)."""
    qb, kb, vb, gb = (_blocks(x, n, c) for x in (q * scale, k, v, g))
    b = gb.cumsum(3)  # (B, H, n, c, K): the log-gate from the block's start to each row
    total = b[:, :, :, -1]  # (B, H, n, K)
    q_in = qb * b.exp()  # the entering state's weight at row i: exp(b_i) <= 1
    k_end = kb * (total.unsqueeze(3) - b).exp()  # row j's weight at the block's end <= 1
    strong = total < -FACTOR_MAX
    k_start = kb * (-b).clamp(max=FACTOR_MAX).exp()  # exp(-b_j) >= 1, exact where not strong
    any_strong = bool(strong.any())
    if any_strong:
        k_start = k_start.masked_fill(strong.unsqueeze(3), 0.0)
    scores = q_in @ k_start.transpose(-1, -2)  # (B, H, n, c, c)
    if any_strong:
        idx, extra = _strong_scores(qb, kb, b, strong)
        scores = scores.index_put(idx, extra, accumulate=True)
    scores = scores.tril()  # j <= i
    dS = k_end.transpose(-1, -2) @ vb  # (B, H, n, K, V): each block's local state
    decay = total.exp().unsqueeze(-1)  # (B, H, n, K, 1): each block's decay of the entering state
    starts = []
    for m in range(n):  # the fold: the state entering each block
        starts.append(S)
        S = torch.addcmul(dS[:, :, m], decay[:, :, m], S)
    o = scores @ vb + q_in @ torch.stack(starts, dim=2)  # (B, H, n, c, V)
    return o, S


def chunk_gla_torch(q, k, v, log_gate, *, scale=None, initial_state=None, output_final_state=False,
                    block_size: int = BLOCK_SIZE, dtype: torch.dtype | None = None):
    """naive_recurrent_gla's contract: (o (B, T, H, V) in q's dtype, final S (B, H, K, V) float32
    or None), in blocks of block_size.

    Computes in float32 (float64 for float64 inputs, or `dtype` when given). Log-gates below
    LOG_GATE_MIN count as it (a gate of -inf empties the state without a NaN). Differentiable.
    """
    check_inputs(q, k, v, log_gate)
    o, S = _chunk(q, k, v, log_gate, scale, initial_state, block_size, dtype)
    return o.to(q.dtype if dtype is None else o.dtype), (S.float() if output_final_state else None)


def _chunk(q, k, v, log_gate, scale, initial_state, block_size=BLOCK_SIZE, dtype=None):
    """chunk_gla_torch's work: (o (B, T, H, V), S after) both in the compute dtype."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    cd = dtype or (torch.float64 if q.dtype == torch.float64 else torch.float32)
    scale = K ** -0.5 if scale is None else scale
    q, k, v = q.to(cd), k.to(cd), v.to(cd)
    g = log_gate.to(cd).clamp(min=LOG_GATE_MIN)
    S = q.new_zeros((B, H, K, V)) if initial_state is None else initial_state.to(cd)
    c = max(1, int(block_size))
    span = max(c, SPAN // c * c)
    outs = []
    for a in range(0, T, span):
        t = min(span, T - a)
        n = -(-t // c)
        o, S = _run_blocks(q[:, a:a + t], k[:, a:a + t], v[:, a:a + t], g[:, a:a + t], S, scale, n, c)
        outs.append(o.reshape(B, H, n * c, V)[:, :, :t].transpose(1, 2))  # (B, t, H, V)
    return (torch.cat(outs, dim=1) if outs else q.new_zeros((B, 0, H, V))), S
