"""The chunked parallel form of causal linear attention in PyTorch (CPU, and autograd anywhere).

Same contract as naive.py. The sequence streams through in segments of SEGMENT positions,
carrying the state; a segment is cut into n blocks of c positions. Inside a block the output is
a masked (decayed) matmul; the state entering each block comes from a prefix over the blocks'
contributions, done as grouped matmuls (no Python loop over positions or blocks). The
normaliser's z is carried apart from S, so every matmul is V wide.

The algebra is written once (`_run_blocks`). Every temporary is an `out=` of a `Scratch`: under
autograd each op allocates; in inference it writes into per-thread buffers reused segment
after segment (on the development VM a first touch of fresh memory costs ~0.5 ms per MB, more
than the arithmetic on it), and the decay constants are cached by decay value.
"""
from __future__ import annotations

import functools

import torch

from .naive import feature_map_fn
from .scratch import Scratch, hugepages

# Block length: chosen by measurement (1 thread, K=32): 32 beat 64 and 128 once segments are
# cache-sized; smaller blocks mean less intra-block work per position (2c(K+V) FLOPs).
DEFAULT_CHUNK_SIZE = 32
# Positions per segment: every temporary (about a dozen of SEGMENT * H * K floats) stays in
# cache. One pass over T at once was slower on the CPU: every elementwise pass went to DRAM.
SEGMENT = 2048
# Blocks per group of the two-level prefix over blocks.
PREFIX_GROUP = 16
_LOG2E = 1.4426950408889634  # log2(e)
_LN2 = 0.6931471805599453  # ln(2) = 1 / log2(e)


def _view(t, *shape):
    return None if t is None else t.view(shape)


class _BlockConsts:
    """Decay weights of the block algebra for n blocks of c positions and H heads (any batch)."""

    def __init__(self, log_g, H, n, c, dtype, device):
        pos = torch.arange(c, device=device, dtype=dtype)
        causal = pos[:, None] >= pos[None, :]  # (c, c)
        self.decay = log_g is not None
        if log_g is None:
            self.mask = causal.to(dtype)  # (c, c)
            return
        lg = log_g.to(dtype)  # (H,)
        # gamma^(i-j) for i >= j, formed directly (never as a ratio), so nothing overflows.
        self.mask = (torch.exp((pos[:, None] - pos[None, :]).clamp(min=0) * lg.view(H, 1, 1))
                     * causal).view(1, H, 1, c, c)
        self.q_scale = torch.exp((pos + 1) * lg.view(H, 1)).view(1, H, 1, c, 1)  # gamma^(i+1)
        self.k_scale = torch.exp((c - 1 - pos) * lg.view(H, 1)).view(1, H, 1, c, 1)  # gamma^(c-1-j)
        self.g_block = torch.exp(c * lg).view(1, H, 1)
        # Prefix over the n blocks' contributions, two levels: groups of G blocks, then groups.
        G = PREFIX_GROUP
        self.two_level = n > G and n % G == 0
        step = c * lg  # log decay per block
        if not self.two_level:
            self.lm = _strict_lower_powers(n, step)  # (1, H, n, n)
            steps = torch.arange(n, device=device, dtype=dtype)
            self.pw = torch.exp(steps * step.view(H, 1)).view(1, H, n, 1)
            return
        ng = n // G
        i = torch.arange(G, device=device, dtype=dtype)
        j = torch.arange(ng, device=device, dtype=dtype)
        self.ng, self.G = ng, G
        self.lm_group = _strict_lower_powers(G, step).view(1, H, 1, G, G)
        self.w = torch.exp((G - 1 - i) * step.view(H, 1)).view(1, H, 1, 1, G)  # to the group's end
        self.lc = _strict_lower_powers(ng, G * step)  # (1, H, ng, ng), over groups
        self.pc = torch.exp(j * (G * step).view(H, 1)).view(1, H, ng, 1)
        self.pw = torch.exp(i * step.view(H, 1)).view(1, H, 1, G, 1)  # gamma_block^i inside a group

    def prefix(self, d, s0, out=None):
        """(starts, final): starts[:, :, i] = state entering block i = g^i s0 + sum_{m<i}
        g^(i-1-m) d[:, :, m] for d (B, H, n, X), s0 (B, H, X); final = the state after the last
        block. starts is written into out (like d) when given."""
        B, H, n, X = d.shape
        if not self.decay:  # gamma = 1: an exclusive cumulative sum
            starts = torch.cat([s0.unsqueeze(2), d[:, :, :-1]], dim=2, out=out)
            starts = torch.cumsum(starts, dim=2, out=out)
            return starts, starts[:, :, -1] + d[:, :, -1]
        if not self.two_level:
            lm = self.lm.expand(B, H, n, n).reshape(B * H, n, n)
            starts = torch.bmm(lm, d.reshape(B * H, n, X), out=_view(out, B * H, n, X)).view(B, H, n, X)
            starts = torch.addcmul(starts, self.pw, s0.unsqueeze(2), out=out)
        else:
            ng, G = self.ng, self.G
            dg = d.reshape(-1, G, X)  # (B*H*ng, G, X)
            lm = self.lm_group.expand(B, H, ng, G, G).reshape(-1, G, G)
            local = torch.bmm(lm, dg, out=_view(out, -1, G, X))  # each group's prefix from zero
            w = self.w.expand(B, H, ng, 1, G).reshape(-1, 1, G)
            totals = torch.bmm(w, dg).view(B, H, ng, X)  # each group's change from zero
            carry = torch.matmul(self.lc, totals).addcmul_(self.pc, s0.unsqueeze(2))  # (B, H, ng, X)
            starts = torch.addcmul(local.view(B, H, ng, G, X), self.pw, carry.unsqueeze(3),
                                   out=_view(out, B, H, ng, G, X)).view(B, H, n, X)
        return starts, torch.addcmul(d[:, :, -1], starts[:, :, -1], self.g_block)


@functools.lru_cache(maxsize=32)
def _cached_consts(lg_key, H, n, c, dtype, device):
    """_BlockConsts by value of the log decays (a tuple): the model makes the same few calls
    block after block, and building them costs ~0.4 ms."""
    with torch.inference_mode(False), torch.no_grad():  # usable in and out of inference mode
        log_g = None if lg_key is None else torch.tensor(lg_key, dtype=torch.float64, device=device)
        return _BlockConsts(log_g, H, n, c, dtype, device)


def _block_consts(log_g, H, n, c, dtype, device):
    if log_g is not None and log_g.requires_grad:  # a trained decay: built in the graph
        return _BlockConsts(log_g, H, n, c, dtype, device)
    lg_key = None if log_g is None else tuple(log_g.tolist())
    return _cached_consts(lg_key, H, n, c, dtype, device)


def _strict_lower_powers(n, lg):
    """(1, H, n, n) matrix of g^(i-1-m) for m < i, 0 elsewhere; lg (H,) = log g."""
    i = torch.arange(n, device=lg.device, dtype=lg.dtype)
    k = i[:, None] - 1 - i[None, :]
    return (torch.exp(k.clamp(min=0) * lg.view(-1, 1, 1)) * (k >= 0)).unsqueeze(0)


def features(x, phi_name, out=None, tmp=None):
    """phi(x) for a strided view x, into out when given (tmp: scratch like out)."""
    if phi_name == "elu1":
        # elu(x) + 1 = 2^(min(x, 0) log2 e) + max(x, 0): torch's vectorised exp2 is about twice
        # as fast as its exp here (0.14 vs 0.26 ms per 262k floats, 1 thread), and elu's expm1
        # is slower still; the result differs from exp's by float round-off. x is read once;
        # max(x, 0) = max(x log2 e, 0) ln 2 rides in the final add.
        y = torch.mul(x, _LOG2E, out=out)
        r = torch.clamp_min(y, 0.0, out=tmp)
        e = torch.exp2(torch.clamp_max(y, 0.0, out=out), out=out)
        return torch.add(e, r, alpha=_LN2, out=out)
    if phi_name == "relu":
        return torch.clamp_min(x, 0.0, out=out)
    feature_map_fn(phi_name)  # validates the name: identity
    return x if out is None else out.copy_(x)


def _decayed_sum(kf, z, log_g):
    """z after the sequence: gamma^T z + sum_j gamma^(T-1-j) k_j, for (B, H, T, K) keys."""
    T = kf.shape[2]
    if log_g is None:
        return z + kf.sum(dim=2)
    pos = torch.arange(T, device=kf.device, dtype=kf.dtype)
    w = torch.exp((T - 1 - pos) * log_g.view(-1, 1))  # (H, T)
    return z * torch.exp(T * log_g).view(1, -1, 1) + torch.einsum("bhtk,ht->bhk", kf, w)


def _run_blocks(q, k, v, S, z, log_g, phi_name, normalize, eps, need_z, n, c, scratch, dst):
    """Positions of q, k, v (B, n*c, H, K|V), as n blocks of c, entering with S (B, H, K, V) and
    z (B, H, K) -> (o (B, H, n, c, V), S, z after them). o is written into dst when given."""
    B, _, H, K = q.shape
    V = v.shape[-1]
    m = B * H * n
    cs = _block_consts(log_g, H, n, c, q.dtype, q.device)
    blocks = lambda x: x.transpose(1, 2).reshape(B, H, n, c, x.shape[-1])  # noqa: E731 (a view for scratch)
    t = scratch("la_tmp", B, H, n, c, K)
    qf = features(blocks(q), phi_name, scratch("la_q", B, H, n, c, K), t)  # (B, H, n, c, K)
    kf = features(blocks(k), phi_name, scratch("la_k", B, H, n, c, K), t)
    vb = blocks(v)
    if scratch.reuse:  # contiguous, for the matmuls
        vb = scratch("la_v", B, H, n, c, V).copy_(vb)
    if cs.decay:
        q_in = torch.mul(qf, cs.q_scale, out=scratch("la_qin", B, H, n, c, K))  # decays the state entering
        k_out = torch.mul(kf, cs.k_scale, out=scratch("la_kout", B, H, n, c, K))  # weight at the block end
    else:
        q_in, k_out = qf, kf
    # Each block's contribution to the state at its end, then the state entering each block.
    dS = torch.bmm(k_out.reshape(m, c, K).transpose(1, 2), vb.reshape(m, c, V),
                   out=scratch("la_dS", m, K, V))  # (m, K, V)
    starts, S = cs.prefix(dS.view(B, H, n, K * V), S.reshape(B, H, K * V),
                          scratch("la_starts", B, H, n, K * V))
    S = S.view(B, H, K, V)
    A = torch.bmm(qf.reshape(m, c, K), kf.reshape(m, c, K).transpose(1, 2), out=scratch("la_A", m, c, c))
    A = A.view(B, H, n, c, c).mul_(cs.mask)  # decayed causal scores (in place: mul's backward needs not A)
    num = torch.bmm(A.view(m, c, c), vb.reshape(m, c, V), out=scratch("la_num", m, c, V))
    num = num.baddbmm_(q_in.reshape(m, c, K), starts.view(m, K, V)).view(B, H, n, c, V)  # + the past
    if normalize:
        dz = torch.sum(k_out, dim=3, out=scratch("la_dz", B, H, n, K))
        z_starts, z = cs.prefix(dz, z, scratch("la_zst", B, H, n, K))
        # q.z per position: the masked scores' row sums plus q_in . z entering the block
        den = torch.sum(A, dim=-1, out=scratch("la_den", B, H, n, c))
        qz = torch.mul(q_in, z_starts.unsqueeze(3), out=t)
        den = den.add_(qz.sum(dim=-1)).add_(eps).reciprocal_()
        return torch.mul(num, den.unsqueeze(-1), out=dst), S, z
    if need_z:  # z is not needed for o but is still part of the state
        z = _decayed_sum(kf.reshape(B, H, n * c, K), z, log_g)
    return (num if dst is None else dst.copy_(num)), S, z


def _single(q, k, v, decay, feature_map, normalize, eps, initial_state, output_final_state,
            chunk_size, dtype):
    """One batch of independent sequences (no cu_seqlens)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    out_dtype = q.dtype
    cd = dtype or (torch.float64 if q.dtype == torch.float64 else torch.float32)
    feature_map_fn(feature_map)  # unknown names fail here, even for T == 0
    tensors = [q, k, v, decay] + ([] if initial_state is None else list(initial_state))
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    q, k, v = q.to(cd), k.to(cd), v.to(cd)
    log_g = None
    if decay is not None:
        d = decay.to(device=q.device, dtype=cd)
        log_g = None if bool((d == 1).all()) else torch.log(d)
    if initial_state is None:
        S = q.new_zeros((B, H, K, V))
        z = q.new_zeros((B, H, K))
    else:
        S, z = initial_state[0].to(cd), initial_state[1].to(cd)
    c = max(1, int(chunk_size))
    seg = max(c, (SEGMENT // c) * c)
    scratch = Scratch(q, reuse=not grad)
    o = None
    if scratch.reuse:
        o = q.new_empty((B, T, H, V))
        hugepages(o)
    parts = []
    tail = T % c
    spans = [(a, min(seg, T - tail - a) // c, c) for a in range(0, T - tail, seg)]
    if tail:  # the ragged end, as one shorter block
        spans.append((T - tail, 1, tail))
    for a, n, cb in spans:
        b = a + n * cb
        dst = None if o is None else o[:, a:b].transpose(1, 2).view(B, H, n, cb, V)
        ob, S, z = _run_blocks(q[:, a:b], k[:, a:b], v[:, a:b], S, z, log_g, feature_map, normalize, eps,
                               output_final_state, n, cb, scratch, dst)
        if o is None:
            parts.append(ob.reshape(B, H, b - a, V).transpose(1, 2))  # (B, Ts, H, V)
    if o is None:
        o = torch.cat(parts, dim=1) if parts else q.new_zeros((B, 0, H, V))
    final = (S.float().contiguous(), z.float().contiguous()) if output_final_state else None
    return o.to(out_dtype), final


def chunk_linear_attn_torch(
    q: torch.Tensor,  # (B, T, H, K) raw projections; phi is applied here
    k: torch.Tensor,  # (B, T, H, K)
    v: torch.Tensor,  # (B, T, H, V)
    *,
    decay: torch.Tensor | None = None,  # (H,) in (0, 1]
    feature_map: str = "elu1",
    normalize: bool = True,
    eps: float = 1e-6,
    initial_state: tuple[torch.Tensor, torch.Tensor] | None = None,  # S (B|N, H, K, V), z (B|N, H, K)
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,  # (N+1,) int64 offsets of N records packed in T; B == 1
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    dtype: torch.dtype | None = None,
):
    """Returns (o (B, T, H, V) in q's dtype, final_state (S, z) float32 or None).

    Computes in float32 (float64 for float64 inputs, or `dtype` when given). Differentiable.
    """
    if cu_seqlens is None:
        return _single(q, k, v, decay, feature_map, normalize, eps, initial_state,
                       output_final_state, chunk_size, dtype)
    if q.shape[0] != 1:
        raise ValueError(f"cu_seqlens needs batch size 1, got {q.shape[0]}")
    offs = [int(x) for x in cu_seqlens.tolist()]
    outs, Ss, zs = [], [], []
    for i in range(len(offs) - 1):  # one record at a time: simple and exact
        a, b = offs[i], offs[i + 1]
        init = None if initial_state is None else (initial_state[0][i:i + 1], initial_state[1][i:i + 1])
        o, fin = _single(q[:, a:b], k[:, a:b], v[:, a:b], decay, feature_map, normalize, eps,
                         init, True, chunk_size, dtype)
        outs.append(o)
        Ss.append(fin[0])
        zs.append(fin[1])
    o = torch.cat(outs, dim=1) if outs else q.new_zeros(v.shape)
    final = (torch.cat(Ss), torch.cat(zs)) if output_final_state and outs else None
    return o, final
