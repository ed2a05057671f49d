"""The chunked parallel form of causal linear attention in PyTorch: the CPU fast path.

Same contract as naive.py. The sequence is cut into blocks of `chunk_size` positions; inside a
block the output is a masked (decayed) matmul, and the state entering each block comes from a
prefix over the blocks' summed contributions. All the work is batched matmuls over every block
at once; there is no Python loop over positions or blocks (the prefix is grouped matmuls too).

The normaliser rides along as an extra value column: v' = [v, 1] makes S' = [S, z], so
numerator and denominator come from the same matmuls.
"""
from __future__ import annotations

import torch

from .naive import feature_map_fn

# Block length: chosen by measurement (1 thread, K=32): 32 beat 64 and 128 once segments are
# cache-sized; smaller blocks mean less intra-block work per position (2c(K+V) FLOPs).
DEFAULT_CHUNK_SIZE = 32


def _block_weights(qb, kb, log_g, c):
    """Causal (decayed) score mask and the decay-weighted q and k of every block.

    qb, kb: (B, H, n, c, K). Returns mask ((c, c), or (H, 1, c, c) with decay), q_in (q scaled
    by gamma^(i+1), which decays the state entering the block) and k_out (k scaled by
    gamma^(c-1-j), its weight at the block end)."""
    H = qb.shape[1]
    pos = torch.arange(c, device=qb.device, dtype=qb.dtype)
    causal = pos[:, None] >= pos[None, :]  # (c, c)
    if log_g is None:
        return causal.to(qb.dtype), qb, kb
    lg = log_g.to(qb.dtype).view(H, 1, 1)
    # gamma^(i-j) for i >= j; computed directly (never as a ratio) so it cannot overflow.
    mask = (torch.exp((pos[:, None] - pos[None, :]).clamp(min=0) * lg) * causal).unsqueeze(1)
    q_in = qb * torch.exp((pos + 1) * lg).view(H, 1, c, 1)
    k_out = kb * torch.exp((c - 1 - pos) * lg).view(H, 1, c, 1)
    return mask, q_in, k_out


def _blocks(
    qf: torch.Tensor,  # (B, H, T, K) feature-mapped
    kf: torch.Tensor,  # (B, H, T, K)
    vf: torch.Tensor,  # (B, H, T, V1) with the ones column when normalising
    S: torch.Tensor,  # (B, H, K, V1) state entering, compute dtype
    log_g: torch.Tensor | None,  # (H,) log decay, or None for gamma = 1
    c: int,  # block length; T % c == 0
):
    """Outputs (B, H, T, V1) and the state after the last block, for T a multiple of c."""
    B, H, T, K = qf.shape
    V1 = vf.shape[-1]
    n = T // c
    qb = qf.reshape(B, H, n, c, K)
    kb = kf.reshape(B, H, n, c, K)
    vb = vf.reshape(B, H, n, c, V1)
    mask, q_in, k_out = _block_weights(qb, kb, log_g, c)
    g_block = None if log_g is None else torch.exp(c * log_g.to(qf.dtype)).view(1, H, 1, 1)
    # Contribution of each block to the state at its end.
    dS = k_out.transpose(-1, -2) @ vb  # (B, H, n, K, V1)
    # State entering each block: a prefix over the n blocks' contributions (matmuls, no loop).
    starts = _prefix(dS.reshape(B, H, n, K * V1), S.reshape(B, H, K * V1),
                     None if log_g is None else c * log_g.to(qf.dtype))
    starts = starts.reshape(B, H, n, K, V1)
    final = (starts[:, :, -1] * g_block if g_block is not None else starts[:, :, -1]) + dS[:, :, -1]
    # In-place where autograd allows it (neither product's backward needs its own output):
    # fewer passes over memory on the CPU.
    A = (qb @ kb.transpose(-1, -2)).mul_(mask)  # (B, H, n, c, c) decayed causal scores
    o = (A @ vb).add_(q_in @ starts)  # intra-block + everything before the block, (B, H, n, c, V1)
    return o.reshape(B, H, T, V1), final


def _blocks_norm(
    qf: torch.Tensor,  # (B, H, T, K) feature-mapped
    kf: torch.Tensor,  # (B, H, T, K)
    vf: torch.Tensor,  # (B, H, T, V)
    S: torch.Tensor,  # (B, H, K, V) state entering
    z: torch.Tensor,  # (B, H, K) normaliser state entering
    log_g: torch.Tensor | None,  # (H,) log decay, or None for gamma = 1
    c: int,  # block length; T % c == 0
):
    """_blocks for the normalised inference path with z carried apart from S: every matmul is
    V wide (32, aligned) instead of V + 1 (measured ~1.4x faster per batched matmul at K = 32),
    and the denominator comes from row sums. Not for autograd (in-place updates).

    Returns numerator (B, H, T, V), denominator (B, H, T), S and z after the last block."""
    B, H, T, K = qf.shape
    V = vf.shape[-1]
    n = T // c
    qb = qf.reshape(B, H, n, c, K)
    kb = kf.reshape(B, H, n, c, K)
    vb = vf.reshape(B, H, n, c, V)
    mask, q_in, k_out = _block_weights(qb, kb, log_g, c)
    lgc = None if log_g is None else c * log_g.to(qf.dtype)
    g_block = None if lgc is None else torch.exp(lgc)  # (H,)
    dS = k_out.transpose(-1, -2) @ vb  # (B, H, n, K, V)
    dz = k_out.sum(dim=-2)  # (B, H, n, K)
    starts = _prefix(dS.reshape(B, H, n, K * V), S.reshape(B, H, K * V), lgc).reshape(B, H, n, K, V)
    zstarts = _prefix(dz, z, lgc)  # (B, H, n, K)
    if g_block is None:
        S_fin = starts[:, :, -1] + dS[:, :, -1]
        z_fin = zstarts[:, :, -1] + dz[:, :, -1]
    else:
        S_fin = torch.addcmul(dS[:, :, -1], starts[:, :, -1], g_block.view(1, H, 1, 1))
        z_fin = torch.addcmul(dz[:, :, -1], zstarts[:, :, -1], g_block.view(1, H, 1))
    A = (qb @ kb.transpose(-1, -2)).mul_(mask)  # (B, H, n, c, c)
    num = A @ vb
    num = num.view(-1, c, V).baddbmm_(q_in.reshape(-1, c, K), starts.reshape(-1, K, V))
    den = A.sum(dim=-1)  # (B, H, n, c)
    den.unsqueeze_(-1)
    den = den.view(-1, c, 1).baddbmm_(q_in.reshape(-1, c, K), zstarts.reshape(-1, K, 1))
    return num.view(B, H, T, V), den.view(B, H, T), S_fin, z_fin


PREFIX_GROUP = 16


def _phi(name):
    """feature_map_fn, with elu1 in one pass less (elu's backward reads its input, not its
    output, so adding 1 in place is safe under autograd)."""
    if name == "elu1":
        return lambda x: torch.nn.functional.elu(x).add_(1.0)
    return feature_map_fn(name)


def _prefix(d: torch.Tensor, s0: torch.Tensor, lg: torch.Tensor | None) -> torch.Tensor:
    """starts[i] = g^i s0 + sum_{m<i} g^(i-1-m) d[m], the value entering step i of the
    recurrence s <- g s + d[m]; d (B, H, n, X), s0 (B, H, X) or None (zero), lg (H,) = log g
    or None (g = 1).

    Two levels at a time: groups of PREFIX_GROUP steps are resolved by one small matmul each,
    the groups' carries by the same function one level up. Powers of g are formed directly
    (exp(k log g), k >= 0), so nothing overflows.
    """
    B, H, n, X = d.shape
    if lg is None:
        if s0 is None:
            s0 = d.new_zeros((B, H, X))
        return torch.cumsum(torch.cat([s0.unsqueeze(2), d[:, :, :-1]], dim=2), dim=2)
    G = PREFIX_GROUP
    if n <= G:
        i = torch.arange(n, device=d.device, dtype=d.dtype)
        k = (i[:, None] - 1 - i[None, :])  # exponent for d[m] at step i
        lm = torch.exp(k.clamp(min=0) * lg.view(H, 1, 1)) * (k >= 0)  # (H, n, n), strictly lower
        pw = torch.exp(i * lg.view(H, 1)).view(1, H, n, 1)  # g^i
        out = lm @ d  # a fresh tensor: updating it in place is autograd-safe
        return out if s0 is None else out.addcmul_(pw, s0.unsqueeze(2))
    ng = -(-n // G)
    if ng * G != n:  # zero steps at the end change no start before them
        d = torch.cat([d, d.new_zeros((B, H, ng * G - n, X))], dim=2)
    dg = d.view(B, H, ng, G, X)
    local = _prefix(dg.reshape(B, H * ng, G, X), None,
                    lg.repeat_interleave(ng))  # each group from zero, (B, H*ng, G, X)
    local = local.view(B, H, ng, G, X)
    i = torch.arange(G, device=d.device, dtype=d.dtype)
    w = torch.exp((G - 1 - i) * lg.view(H, 1))  # (H, G): g^(G-1-m) to the group's end
    totals = torch.einsum("bhjgx,hg->bhjx", dg, w)  # each group's change from zero
    carry = _prefix(totals, s0, G * lg)  # (B, H, ng, X): state entering each group
    pw = torch.exp(i * lg.view(H, 1)).view(1, H, 1, G, 1)
    # one in-place pass over the local prefixes (fresh from a matmul, so autograd-safe)
    return local.addcmul_(pw, carry.unsqueeze(3)).reshape(B, H, ng * G, X)[:, :, :n]


# Positions per segment: the sequence is streamed through the block computation in segments so
# that every temporary (about a dozen tensors of SEGMENT * H * K floats) stays in cache and in
# memory malloc reuses. One pass over T at once was slower on the CPU: each fresh 32 MB
# temporary costs page faults, and every elementwise pass went out to DRAM.
SEGMENT = 4096


def _features(x, phi_name, cd, inplace):
    """phi(x) for x (B, T, H, K) -> (B, H, T, K) contiguous in cd, in one copy plus in-place
    passes when autograd is not recording."""
    if not inplace:
        return _phi(phi_name)(x.to(cd)).transpose(1, 2)
    y = x.transpose(1, 2).to(cd, memory_format=torch.contiguous_format, copy=True)  # (B, H, T, K)
    if phi_name == "elu1":
        # elu(y) + 1 = exp(min(y, 0)) + max(y, 0): exp is vectorised, elu's expm1 is not
        # (measured 0.9 vs 1.5 ms per (4, 4096, 32) block at 1 thread); same value to fp32
        # round-off (the exp form is the more accurate one for y << 0).
        r = y.relu()
        y.clamp_max_(0.0).exp_().add_(r)
    elif phi_name == "relu":
        y.relu_()
    else:
        feature_map_fn(phi_name)  # validates the name
    return y


def _single(q, k, v, decay, feature_map, normalize, eps, initial_state, output_final_state,
            chunk_size, dtype):
    """One batch of independent sequences (no cu_seqlens)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    cd = dtype or (torch.float64 if q.dtype == torch.float64 else torch.float32)
    feature_map_fn(feature_map)  # unknown names fail here, even for T == 0
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)) or (
        torch.is_grad_enabled() and initial_state is not None
        and any(t.requires_grad for t in initial_state))
    direct = not grad and q.dtype == cd  # write each segment's output straight into o
    sep = direct and normalize  # z carried apart from S (_blocks_norm)
    V1 = V + 1 if normalize and not sep else V
    if initial_state is None:
        S = q.new_zeros((B, H, K, V1), dtype=cd)
        z = q.new_zeros((B, H, K), dtype=cd)
    else:
        S0, z0 = initial_state
        S = S0.to(cd)
        z = z0.to(cd)
        if normalize and not sep:
            S = torch.cat([S, z.unsqueeze(-1)], dim=-1)
    log_g = None
    if decay is not None:
        d = decay.to(device=q.device, dtype=cd)
        log_g = None if bool((d == 1).all()) else torch.log(d)
    c = max(1, int(chunk_size))
    seg = max(c, (SEGMENT // c) * c)
    o_all = q.new_empty((B, T, H, V)) if direct else None
    outs = []
    for a in range(0, T, seg):
        b = min(T, a + seg)
        qf = _features(q[:, a:b], feature_map, cd, not grad)  # (B, H, Ts, K)
        kf = _features(k[:, a:b], feature_map, cd, not grad)
        Ts = b - a
        if sep:
            vf = v[:, a:b].transpose(1, 2).to(cd, memory_format=torch.contiguous_format, copy=True)
            full = (Ts // c) * c
            dst = o_all[:, a:b].transpose(1, 2)  # (B, H, Ts, V) view of the result
            for lo, hi in ((0, full), (full, Ts)):
                if hi > lo:  # the full blocks, then the ragged tail as one shorter block
                    num, den, S, z = _blocks_norm(qf[:, :, lo:hi], kf[:, :, lo:hi], vf[:, :, lo:hi],
                                                  S, z, log_g, c if hi == full else hi - lo)
                    torch.mul(num, den.add_(eps).reciprocal_().unsqueeze_(-1), out=dst[:, :, lo:hi])
            continue
        if normalize:
            vf = qf.new_empty((B, H, Ts, V1))  # v' = [v, 1], filled in place: no cat
            vf[..., :V].copy_(v[:, a:b].transpose(1, 2))
            vf[..., V].fill_(1.0)
        else:
            vf = v[:, a:b].to(cd).transpose(1, 2)  # (B, H, Ts, V)
        full = (Ts // c) * c
        parts = []
        if full:
            o, S = _blocks(qf[:, :, :full], kf[:, :, :full], vf[:, :, :full], S, log_g, c)
            parts.append(o)
        if Ts > full:  # the ragged tail, as one shorter block
            o, S = _blocks(qf[:, :, full:], kf[:, :, full:], vf[:, :, full:], S, log_g, Ts - full)
            parts.append(o)
        o = torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]  # (B, H, Ts, V1)
        if normalize and direct:
            # 1/den over (B, H, Ts, 1) is cheap; the full-size pass is then a multiply
            torch.mul(o[..., :V], o[..., V:].add_(eps).reciprocal_(), out=o_all[:, a:b].transpose(1, 2))
        elif direct:
            o_all[:, a:b].copy_(o.transpose(1, 2))
        else:
            if normalize:
                o = o[..., :V] / (o[..., V:] + eps)
            outs.append(o.transpose(1, 2).to(q.dtype))  # (B, Ts, H, V)
        if output_final_state and not normalize:
            # Without the normaliser z is not needed for o but is still part of the state.
            z = _decayed_sum(kf, z, log_g)
    if direct:
        o = o_all
    elif outs:
        o = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]
    else:
        o = q.new_zeros((B, 0, H, V))
    final = None
    if output_final_state:
        if sep:
            final = (S.float().contiguous(), z.float().contiguous())
        elif normalize:
            final = (S[..., :V].float().contiguous(), S[..., V].float().contiguous())
        else:
            final = (S.float().contiguous(), z.float())
    return o, final


def _decayed_sum(kf, z, log_g):
    """z after the sequence: gamma^T z + sum_j gamma^(T-1-j) k_j, for (B, H, T, K) keys."""
    T = kf.shape[2]
    if log_g is None:
        return z + kf.sum(dim=2)
    pos = torch.arange(T, device=kf.device, dtype=kf.dtype)
    w = torch.exp((T - 1 - pos) * log_g.view(-1, 1))  # (H, T)
    return z * torch.exp(T * log_g).view(1, -1, 1) + torch.einsum("bhtk,ht->bhk", kf, w)


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
