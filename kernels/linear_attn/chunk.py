"""The chunked parallel form of causal linear attention in PyTorch: the CPU fast path.

Same contract as naive.py. The sequence is cut into blocks of `chunk_size` positions; inside a
block the output is a masked (decayed) matmul, and the state entering each block comes from a
prefix over the blocks' summed contributions. All the work is batched matmuls over every block
at once; there is no Python loop over positions or blocks (the prefix is grouped matmuls too).
The sequence streams through this in segments of SEGMENT positions, carrying the state.

Two paths, one algebra: inference (_stream_nograd) carries z apart from S and works in reused
scratch memory; autograd (training) uses plain out-of-place ops, with the normaliser riding
along as an extra value column (v' = [v, 1] makes S' = [S, z], so numerator and denominator
come from the same matmuls).
"""
from __future__ import annotations

import functools

import torch

from .naive import feature_map_fn
from .scratch import hugepages, workspace

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
SEGMENT = 2048
_LOG2E = 1.4426950408889634  # log2(e)
_LN2 = 0.6931471805599453  # ln(2) = 1 / log2(e)


def _features(x, phi_name, cd, inplace):
    """phi(x) for x (B, T, H, K) -> (B, H, T, K) contiguous in cd, in one copy plus in-place
    passes when autograd is not recording."""
    if not inplace:
        return _phi(phi_name)(x.to(cd)).transpose(1, 2)
    y = x.transpose(1, 2).to(cd, memory_format=torch.contiguous_format, copy=True)  # (B, H, T, K)
    if phi_name == "elu1":
        # elu(y) + 1 = 2^(min(y, 0) log2 e) + max(y, 0), as in _features_into
        r = y.relu()
        y.mul_(_LOG2E).clamp_max_(0.0).exp2_().add_(r)
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
    log_g = None
    if decay is not None:
        d = decay.to(device=q.device, dtype=cd)
        log_g = None if bool((d == 1).all()) else torch.log(d)
    c = max(1, int(chunk_size))
    seg = max(c, (SEGMENT // c) * c)
    if initial_state is None:
        S = q.new_zeros((B, H, K, V), dtype=cd)
        z = q.new_zeros((B, H, K), dtype=cd)
    else:
        S, z = initial_state[0].to(cd), initial_state[1].to(cd)
    if not grad and q.dtype == cd:  # inference: the allocation-free path
        o, S, z = _stream_nograd(q, k, v, log_g, feature_map, normalize, eps, S, z, c, seg,
                                 output_final_state)
        return o, ((S.float().contiguous(), z.float().contiguous()) if output_final_state else None)
    # Autograd (or a dtype change): plain out-of-place ops, the normaliser as a ones column.
    V1 = V + 1 if normalize else V
    if normalize:
        S = torch.cat([S, z.unsqueeze(-1)], dim=-1)
    outs = []
    for a in range(0, T, seg):
        b = min(T, a + seg)
        qf = _features(q[:, a:b], feature_map, cd, not grad)  # (B, H, Ts, K)
        kf = _features(k[:, a:b], feature_map, cd, not grad)
        Ts = b - a
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
        if normalize:
            o = o[..., :V] / (o[..., V:] + eps)
        outs.append(o.transpose(1, 2).to(q.dtype))  # (B, Ts, H, V)
        if output_final_state and not normalize:
            # Without the normaliser z is not needed for o but is still part of the state.
            z = _decayed_sum(kf, z, log_g)
    if outs:
        o = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]
    else:
        o = q.new_zeros((B, 0, H, V))
    final = None
    if output_final_state:
        if normalize:
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


# ---------------------------------------------------------------------------------------------
# Inference fast path (no autograd, input already in the compute dtype): the same block
# algebra as _blocks (z carried apart from S, so every matmul is V wide, not V + 1), but every per-segment temporary is a view of one per-thread scratch
# buffer reused from call to call (scratch.workspace), written with out= / in-place ops, and
# the decay powers, masks and prefix matrices are cached by decay value (_block_consts)
# instead of being rebuilt for every segment. On the development VM a first touch of fresh
# memory costs ~0.5 ms per MB (page faults), which made the allocating form spend more time
# faulting than multiplying.


class _BlockConsts:
    """Decay weights of the block algebra for n blocks of c positions and H heads (any batch):
    read-only, shared by every call with the same decays and shapes."""

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
            self.pw = torch.exp(torch.arange(n, device=device, dtype=dtype) * step.view(H, 1)).view(1, H, n, 1)
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

    def prefix(self, d, s0, out):
        """out[:, :, i] = state entering block i = g^i s0 + sum_{m<i} g^(i-1-m) d[:, :, m], for
        d (B, H, n, X) contiguous, s0 (B, H, X); out like d. Returns the state after the last
        block. The per-head matrices are expanded over the batch per call (a view when B = 1)."""
        B, H, n, X = d.shape
        if not self.decay:  # gamma = 1: an exclusive cumulative sum
            out[:, :, 0].copy_(s0)
            if n > 1:
                torch.cumsum(d[:, :, :-1], dim=2, out=out[:, :, 1:])
                out[:, :, 1:].add_(s0.unsqueeze(2))
            return out[:, :, -1] + d[:, :, -1]
        if not self.two_level:
            lm = self.lm.expand(B, H, n, n).reshape(B * H, n, n)
            torch.bmm(lm, d.view(B * H, n, X), out=out.view(B * H, n, X))
            out.addcmul_(self.pw, s0.unsqueeze(2))
        else:
            ng, G = self.ng, self.G
            dg = d.view(-1, G, X)  # (B*H*ng, G, X)
            lm = self.lm_group.expand(B, H, ng, G, G).reshape(-1, G, G)
            torch.bmm(lm, dg, out=out.view(-1, G, X))  # each group's prefix from zero
            w = self.w.expand(B, H, ng, 1, G).reshape(-1, 1, G)
            totals = torch.bmm(w, dg).view(B, H, ng, X)  # each group's change from zero
            carry = torch.matmul(self.lc, totals).addcmul_(self.pc, s0.unsqueeze(2))  # (B, H, ng, X)
            out.view(B, H, ng, G, X).addcmul_(self.pw, carry.unsqueeze(3))
        return torch.addcmul(d[:, :, -1], out[:, :, -1], self.g_block)


@functools.lru_cache(maxsize=32)
def _block_consts(lg_key, H, n, c, dtype, device):
    """_BlockConsts by value of the log decays (a tuple): the model makes the same few calls
    block after block, and building them costs ~0.4 ms."""
    with torch.inference_mode(False), torch.no_grad():  # usable in and out of inference mode
        log_g = None if lg_key is None else torch.tensor(lg_key, dtype=torch.float64, device=device)
        return _BlockConsts(log_g, H, n, c, dtype, device)


def _strict_lower_powers(n, lg):
    """(1, H, n, n) matrix of g^(i-1-m) for m < i, 0 elsewhere; lg (H,) = log g."""
    i = torch.arange(n, device=lg.device, dtype=lg.dtype)
    k = i[:, None] - 1 - i[None, :]
    return (torch.exp(k.clamp(min=0) * lg.view(-1, 1, 1)) * (k >= 0)).unsqueeze(0)


def _features_into(dst, src, phi_name, tmp):
    """dst (contiguous) = phi(src) for a strided src view of the same shape; tmp is scratch
    like dst."""
    if phi_name == "elu1":
        # elu(x) + 1 = 2^(min(x, 0) log2 e) + max(x, 0): torch's vectorised exp2 is about twice
        # as fast as its exp here (0.14 vs 0.26 ms per 262k floats, 1 thread), and elu's expm1
        # is slower still; the result differs from exp's by float round-off.
        # src is read once (it is cold: a strided slice of the caller's tensor), the rest runs
        # in cache: max(x, 0) = max(x log2 e, 0) ln 2 rides in the final add.
        torch.mul(src, _LOG2E, out=dst)
        torch.clamp_min(dst, 0.0, out=tmp)
        dst.clamp_max_(0.0).exp2_().add_(tmp, alpha=_LN2)
    elif phi_name == "relu":
        torch.clamp_min(src, 0.0, out=dst)
    else:
        dst.copy_(src)


def _stream_nograd(q, k, v, log_g, phi_name, normalize, eps, S, z, c, seg, need_z):
    """o (B, T, H, V), S, z after T positions; S (B, H, K, V) and z (B, H, K) entering.

    Same block algebra as _blocks; see it for the derivation. Full segments
    run as n blocks of c; the ragged end (T mod c positions) runs as one shorter block."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    BH = B * H
    o = q.new_empty((B, T, H, V))
    hugepages(o)

    def sizes(cb):  # floats per (batch, head, block) of each temporary, for blocks of cb
        return ([cb * K] * 3 + [cb * V] * 2 + [K * V] * 2 + [cb * cb]
                + ([cb * K] * 2 if log_g is not None else []) + ([cb, K, K] if normalize else []))

    nmax, tail = min(seg, T) // c, T % c
    ws = workspace(BH * max(nmax * sum(sizes(c)), sum(sizes(tail))), q)
    lg_key = None if log_g is None else tuple(log_g.tolist())

    @functools.lru_cache(maxsize=3)  # full segments share one block count; then the last two
    def views(n, cb):
        """The scratch carved for n blocks of cb positions (views reused segment after segment)."""
        m = BH * n
        regions, off = [], 0
        for size in sizes(cb):
            regions.append(ws[off:off + m * size])
            off += m * size
        qf, kf, tmp, vf, num, dS, starts, A = regions[:8]
        qin, kout = regions[8:10] if log_g is not None else (qf, kf)
        den, dz, zst = regions[-3:] if normalize else (None, None, None)
        blocks = lambda buf, w: buf.view(B, H, n, cb, w)  # noqa: E731
        return (_block_consts(lg_key, H, n, cb, q.dtype, q.device), m,
                blocks(qf, K), blocks(kf, K), blocks(tmp, K), blocks(vf, V),
                blocks(qin[:m * cb * K], K), blocks(kout[:m * cb * K], K), dS.view(m, K, V),
                starts.view(B, H, n, K * V), A.view(m, cb, cb), num.view(m, cb, V),
                None if den is None else den.view(m, cb),
                None if dz is None else dz.view(B, H, n, K),
                None if zst is None else zst.view(B, H, n, K))

    def run(a, n, cb, S, z):
        """Positions a .. a + n*cb as n blocks of cb; returns S and z after them."""
        cs, m, qb, kb, t, vb, qin_n, kout_n, dS_n, st, A_n, num_n, den_n, dz_n, zs = views(n, cb)
        b = a + n * cb
        _features_into(qb, q[:, a:b].transpose(1, 2).view(B, H, n, cb, K), phi_name, t)
        _features_into(kb, k[:, a:b].transpose(1, 2).view(B, H, n, cb, K), phi_name, t)
        vb.copy_(v[:, a:b].transpose(1, 2).view(B, H, n, cb, V))
        if cs.decay:
            qi = torch.mul(qb, cs.q_scale, out=qin_n)
            ko = torch.mul(kb, cs.k_scale, out=kout_n)
        else:
            qi, ko = qb, kb
        dSv = torch.bmm(ko.view(m, cb, K).transpose(1, 2), vb.view(m, cb, V), out=dS_n)
        S = cs.prefix(dSv.view(B, H, n, K * V), S.reshape(B, H, K * V), st).view(B, H, K, V)
        Ab = torch.bmm(qb.view(m, cb, K), kb.view(m, cb, K).transpose(1, 2), out=A_n)
        Ab.view(B, H, n, cb, cb).mul_(cs.mask)
        nb = torch.bmm(Ab, vb.view(m, cb, V), out=num_n)
        nb.baddbmm_(qi.view(m, cb, K), st.view(m, K, V))
        dst = o[:, a:b].transpose(1, 2).view(B, H, n, cb, V)
        if normalize:
            dzv = torch.sum(ko, dim=3, out=dz_n)
            z = cs.prefix(dzv, z, zs)
            # q.z per position: the masked scores' row sums plus q_in . z entering the block
            db = torch.sum(Ab, dim=-1, out=den_n).view(B, H, n, cb)
            torch.mul(qi, zs.unsqueeze(3), out=t)
            db.add_(t.sum(dim=-1)).add_(eps).reciprocal_()
            torch.mul(nb.view(B, H, n, cb, V), db.unsqueeze(-1), out=dst)
        else:
            dst.copy_(nb.view(B, H, n, cb, V))
            if need_z:
                z = _decayed_sum(kb.view(B, H, n * cb, K), z, log_g)
        return S, z

    for a in range(0, T - tail, seg):
        S, z = run(a, min(seg, T - tail - a) // c, c, S, z)
    if tail:  # the ragged end, as one shorter block
        S, z = run(T - tail, 1, tail, S, z)
    return o, S, z
