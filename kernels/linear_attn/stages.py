"""The stages causal linear attention is composed from, in PyTorch: the chunked form (chunk.py)
runs them over blocks; the sequence-parallel split (linpipe.model.segments) runs them over
segments. The Triton kernel implements the same three stages as its three passes.

Per head, with a log-gate g_t per position (a fixed decay gamma is the constant gate
log(gamma), no decay the zero gate):

    S_t = exp(g_t) S_{t-1} + phi(k_t) v_t^T          z_t = exp(g_t) z_{t-1} + phi(k_t)
    num_t = phi(q_t)^T S_t      den_t = phi(q_t) . z_t      o_t = num_t / (den_t + eps)

(o_t = num_t without the normaliser). Over a span of positions 0..n-1 entering with (S, z),
b_i = g_0 + ... + g_i is the cumulative log-gate from the span's start, and:

1. the local state of the span (`local_states` per block, `span_state` for one span): what it
   adds from a zero state, weighted to its end, dS = sum_j exp(b_{n-1} - b_j) phi(k_j) v_j^T
   and dz alike;
2. the fold (`Gates.fold` over all blocks at once, `advance` for one span): the state after the
   span is affine in the state entering it, S' = exp(b_{n-1}) S + dS (z alike), so a span's
   summary is (exp(b_{n-1}), dS, dz) and states chain by folding summaries;
3. the output pass (`block_outputs`; the entering state's share alone: `state_outputs`):
   num_i = sum_{j<=i} exp(b_i - b_j) (phi(q_i) . phi(k_j)) v_j + exp(b_i) phi(q_i)^T S, and
   den_i the same with z for S and 1 for v_j.

The normaliser has one representation: z beside S and den beside num, apart; dividing is the
last step. Every stage reads the gates through `Gates`' weights (or the cumulative log-gate of a
span): a fixed decay gives the same weights in every block (`constant_gates`), per-position
log-gates (B, T, H) their own per block (`PositionGates`), from float64 cumulative sums.
"""
from __future__ import annotations

import functools

import torch

# Blocks per group of the two-level prefix over blocks.
PREFIX_GROUP = 16
# Log-gates below this are taken as it: exp(-110) ~ 1.7e-48 is 0 in float32 (and nothing next to
# float64's round-off), and every cumulative sum stays finite (a gate of -inf would give
# b_i - b_j = -inf - -inf = nan).
LOG_GATE_MIN = -110.0
_LOG2E = 1.4426950408889634  # log2(e): the gate weights are powers of 2 (exp2 is the faster)


def log_decay(decay: torch.Tensor | None) -> torch.Tensor | None:
    """log(decay) per head, or None where there is no decay to apply (None, or 1 for every head:
    the zero gate, whose weights are all 1 and are skipped)."""
    if decay is None or bool((decay == 1).all()):
        return None
    return torch.log(decay)


def _strict_lower_powers(n, lg):
    """(1, H, n, n) matrix of g^(i-1-m) for m < i, 0 elsewhere; lg (H,) = log g."""
    i = torch.arange(n, device=lg.device, dtype=lg.dtype)
    k = i[:, None] - 1 - i[None, :]
    return (torch.exp(k.clamp(min=0) * lg.view(-1, 1, 1)) * (k >= 0)).unsqueeze(0)


class Gates:
    """The gate weights of blocks of c positions for H heads, from the cumulative log-gate b_i of
    each block (from the block's start, i = 0..c-1):

        mask[i, j] = exp(b_i - b_j) for i >= j, else 0   the intra-block scores' weights
        q_scale[i] = exp(b_i)                            the entering state's weight at row i
        k_scale[j] = exp(b_{c-1} - b_j)                  row j's weight at the block's end
        total      = exp(b_{c-1})                        the block's decay of the state entering it

    and the fold's weights over a group of G = PREFIX_GROUP blocks (`fold`). A constant gate
    (b_i = (i+1) log gamma) gives the same weights in every block, computed as powers of gamma
    with exponents >= 0 (nothing overflows); the zero gate (no decay) gives the causal mask and
    no scales (`decayed` False), and fold weights of exactly 1."""

    def __init__(self, log_g, H, c, dtype, device):
        pos = torch.arange(c, device=device, dtype=dtype)
        causal = pos[:, None] >= pos[None, :]  # (c, c)
        self.decayed = log_g is not None
        self.c = c
        if log_g is None:
            self.mask = causal.to(dtype)  # (c, c)
            lg = torch.zeros(H, device=device, dtype=dtype)  # weights of exactly 1
        else:
            lg = log_g.to(dtype)  # (H,)
            self.mask = (torch.exp((pos[:, None] - pos[None, :]).clamp(min=0) * lg.view(H, 1, 1))
                         * causal).view(1, H, 1, c, c)
            self.q_scale = torch.exp((pos + 1) * lg.view(H, 1)).view(1, H, 1, c, 1)  # gamma^(i+1)
            self.k_scale = torch.exp((c - 1 - pos) * lg.view(H, 1)).view(1, H, 1, c, 1)  # gamma^(c-1-j)
        self.lg = lg
        self.total = torch.exp(c * lg).view(1, H, 1)
        G = PREFIX_GROUP
        step = c * lg  # log decay per block
        i = torch.arange(G, device=device, dtype=dtype)
        self.lm_group = _strict_lower_powers(G, step).view(1, H, 1, G, G)
        self.w = torch.exp((G - 1 - i) * step.view(H, 1)).view(1, H, 1, 1, G)  # to the group's end
        self.pw = torch.exp(i * step.view(H, 1)).view(1, H, 1, G, 1)  # gamma_block^i inside a group
        self.group_total = torch.exp(G * step).view(1, H, 1)

    def scale_queries(self, qf, out=None):
        """phi(q) (B, H, n, c, K) weighted for the entering state (itself without decay)."""
        return torch.mul(qf, self.q_scale, out=out) if self.decayed else qf

    def scale_keys(self, kf, out=None):
        """phi(k) (B, H, n, c, K) weighted to the block's end (itself without decay)."""
        return torch.mul(kf, self.k_scale, out=out) if self.decayed else kf

    def fold(self, d, s0, scratch, slot):
        """(starts, final): starts[:, :, i] = the state entering block i = total^i s0 + sum_{m<i}
        total^(i-1-m) d[:, :, m] for the blocks' local states d (B, H, n, X) and s0 (B, H, X);
        final = the state after the last block. Temporaries from `scratch` (slots named after
        `slot`).

        Within a group of G blocks, one G x G matmul from zero (a last group of fewer blocks is
        padded with empty ones); across groups, a recurrence carry' = group_total carry +
        the group's change, one step per group. So the states entering a group's blocks depend
        only on the blocks before them, and the state after whole groups is the carry itself:
        a sequence cut after any whole group and resumed from `final` folds the same numbers in
        the same order as one uncut, and positions after the last block change nothing before.
        No Python loop over blocks, and no cumulative sum (slow on the CPU along a middle axis)."""
        B, H, n, X = d.shape
        G = PREFIX_GROUP
        ng = -(-n // G)
        whole = n % G == 0
        dp = d
        if not whole:  # empty blocks to the group's end
            dp = scratch(slot + "_pad", B, H, ng * G, X)
            if dp is None:
                dp = torch.nn.functional.pad(d, (0, 0, 0, ng * G - n))
            else:
                dp[:, :, :n].copy_(d)
                dp[:, :, n:].zero_()
        dg = dp.reshape(-1, G, X)  # (B*H*ng, G, X)
        lm = self.lm_group.expand(B, H, ng, G, G).reshape(-1, G, G)
        local = torch.bmm(lm, dg, out=scratch(slot + "_starts", B * H * ng, G, X))  # each group from zero
        w = self.w.expand(B, H, ng, 1, G).reshape(-1, 1, G)
        totals = torch.bmm(w, dg).view(B, H, ng, X)  # each group's change from zero
        steps = ng if whole else ng - 1  # carries needed: entering every group, and after whole ones
        carry = scratch(slot + "_carry", B, H, ng + 1, X)
        if carry is None:
            carries = [s0]
            for g in range(steps):
                carries.append(torch.addcmul(totals[:, :, g], carries[-1], self.group_decay(g)))
            carry = torch.stack(carries, 2)  # (B, H, steps + 1, X)
        else:
            carry[:, :, 0].copy_(s0)
            for g in range(steps):
                torch.addcmul(totals[:, :, g], carry[:, :, g], self.group_decay(g), out=carry[:, :, g + 1])
        local = local.view(B, H, ng, G, X)
        starts = torch.addcmul(local, self.pw, carry[:, :, :ng].unsqueeze(3), out=scratch.same(local))
        starts = starts.view(B, H, ng * G, X)[:, :, :n]
        if whole:  # a copy: the carry may live in scratch, which the next call reuses
            return starts, carry[:, :, ng].clone()
        return starts, torch.addcmul(d[:, :, -1], starts[:, :, -1], self.total)

    def group_decay(self, g):
        """The decay (.., H, 1) of the state over group g of blocks (the same for every group)."""
        return self.group_total

    def partial_state(self, kf, v, S0, z0, r):
        """The state after the first r rows of a block (r < c), from the state entering it (S0
        (B, H, X), z0 (B, H, K) or None) and its phi(k) (B, H, c, K) and v (B, H, c, V), zero past
        row r: the block's local state weighted to row r - 1 instead of its end."""
        B, H, c, K = kf.shape
        j = torch.arange(c, device=kf.device, dtype=self.lg.dtype)
        w = torch.exp((r - 1 - j).clamp(min=0).view(1, c) * self.lg.view(H, 1)) * (j < r)  # (H, c)
        total = torch.exp(r * self.lg).view(1, H, 1)
        kw = kf * w.view(1, H, c, 1).to(kf.dtype)
        dS = torch.matmul(kw.transpose(2, 3), v).view(B, H, -1)  # (B, H, K*V)
        S = torch.addcmul(dS, S0, total)
        z = None if z0 is None else torch.addcmul(kw.sum(2), z0, total)
        return S, z


@functools.lru_cache(maxsize=32)
def _cached_gates(lg_key, H, c, dtype, device):
    """Gates by value of the log decays (a tuple): the model makes the same few calls block
    after block, and building them costs ~0.4 ms."""
    with torch.inference_mode(False), torch.no_grad():  # usable in and out of inference mode
        log_g = None if lg_key is None else torch.tensor(lg_key, dtype=torch.float64, device=device)
        return Gates(log_g, H, c, dtype, device)


def constant_gates(log_g, H, c, dtype, device) -> Gates:
    """The Gates of a fixed per-head decay (log_g (H,) or None), cached by value; a decay that
    requires grad (trained) is built in the graph instead."""
    if log_g is not None and log_g.requires_grad:
        return Gates(log_g, H, c, dtype, device)
    lg_key = None if log_g is None else tuple(log_g.tolist())
    return _cached_gates(lg_key, H, c, dtype, device)


def _strict_lower_pow2(before, cum):
    """(..., m, m) matrix of 2^(before_i - cum_j) for j < i, 0 elsewhere: before_i is the log2
    weight up to the start of item i, cum_j up to the end of item j (so the exponent is <= 0)."""
    return torch.exp2((before.unsqueeze(-1) - cum.unsqueeze(-2)).add_(_above(cum.shape[-1], 0, cum)))


@functools.lru_cache(maxsize=16)
def _above_cached(m, diagonal, dtype, device):
    with torch.inference_mode(False), torch.no_grad():
        return torch.full((m, m), float("-inf"), dtype=dtype, device=device).triu(diagonal)


def _above(m, diagonal, like):
    """(m, m): -inf above the diagonal + `diagonal`, 0 elsewhere; added to an exponent before
    exp2, it zeroes those entries (one add: a masked fill was 7x slower)."""
    return _above_cached(m, diagonal, like.dtype, like.device)


class PositionGates(Gates):
    """Gates' weights from per-position log-gates (B, n*c, H), different in every block: mask
    (B, H, n, c, c), q_scale and k_scale (B, H, n, c, 1), total (B, H, 1) of the last block, and
    the fold's matrices from every block's total. The cumulative log-gates, within each block
    from its start and over the blocks from the span's start, are float64 sums, so a difference
    of two is exact to float32 however strong the gates before them; every weight is 2^d of a
    difference d <= 0, so nothing overflows. The mask, the one weight of c*c per block, goes to
    the scratch's buffer when it reuses them."""

    def __init__(self, log_gate, n, c, dtype, scratch=None):
        B, _, H = log_gate.shape
        g = log_gate.to(torch.float64).clamp(min=LOG_GATE_MIN) * _LOG2E  # log2 units
        b = g.transpose(1, 2).reshape(B, H, n, c).cumsum(-1)  # (B, H, n, c) from each block's start
        last = b[..., -1:]  # (B, H, n, 1): each block's total
        self.decayed = True
        out = None if scratch is None else scratch("la_gate", B, H, n, c, c)
        d = torch.sub(b.unsqueeze(-1), b.unsqueeze(-2), out=out)  # (B, H, n, c, c): b_i - b_j
        d = d.to(dtype).add_(_above(c, 1, d))
        self.mask = torch.exp2(d, out=out)
        self.q_scale = torch.exp2(b).to(dtype).unsqueeze(-1)  # 2^(b_i)
        self.k_scale = torch.exp2(last - b).to(dtype).unsqueeze(-1)  # 2^(b_last - b_j)
        totals = last[..., 0]  # (B, H, n)
        self.total = torch.exp2(totals[..., -1:]).to(dtype)
        G = PREFIX_GROUP
        ng = -(-n // G)
        tg = torch.nn.functional.pad(totals, (0, ng * G - n)).view(B, H, ng, G)  # padded: empty blocks
        cum = tg.cumsum(-1)  # within each group
        self.lm_group = _strict_lower_pow2(cum - tg, cum).to(dtype)  # (B, H, ng, G, G)
        self.w = torch.exp2(cum[..., -1:] - cum).to(dtype).unsqueeze(-2)  # (B, H, ng, 1, G): to its end
        self.pw = torch.exp2(cum - tg).to(dtype).unsqueeze(-1)  # (B, H, ng, G, 1): inside a group
        self.group_total = torch.exp2(cum[..., -1:]).to(dtype)  # (B, H, ng, 1): each group's decay

    def group_decay(self, g):
        return self.group_total[:, :, g]


def block_gates(log_g, H, n, c, dtype, device, scratch=None) -> Gates:
    """The Gates of n blocks of c positions: log_g None (no decay) or (H,) (a fixed decay) gives
    the cached constant weights, per-position log-gates (B, n*c, H) their own."""
    if log_g is not None and log_g.dim() == 3:
        return PositionGates(log_g, n, c, dtype, scratch)
    return constant_gates(log_g, H, c, dtype, device)


def check_log_gate(log_gate, shape) -> None:
    """Per-position log-gates must be (B, T, H) as the positions and heads of q, and <= 0 (a
    gate keeps at most all of the state)."""
    if tuple(log_gate.shape) != tuple(shape):
        raise ValueError(f"log_gate must have shape (B, T, H) = {tuple(shape)}; got {tuple(log_gate.shape)}")
    if bool((log_gate > 0).any()):
        raise ValueError(f"log_gate must be <= 0 everywhere; got a maximum of {float(log_gate.max()):g}")


def local_states(k_end, v, out_S=None, out_z=None, need_z=True):
    """Stage 1 over blocks: phi(k) weighted to each block's end (Gates.scale_keys) (B, H, n, c, K)
    and v (B, H, n, c, V) -> each block's local state dS (B, H, n, K, V), dz (B, H, n, K) (None
    unless need_z)."""
    B, H, n, c, K = k_end.shape
    V = v.shape[-1]
    m = B * H * n
    dS = torch.bmm(k_end.reshape(m, c, K).transpose(1, 2), v.reshape(m, c, V), out=out_S)
    dz = torch.sum(k_end, dim=3, out=out_z) if need_z else None
    return dS.view(B, H, n, K, V), dz


def block_outputs(qf, kf, q_in, v, S_starts, z_starts, gates: Gates, scratch, tmp=None):
    """Stage 3 over blocks: phi(q), phi(k) (B, H, n, c, K), phi(q) weighted for the entering
    state (Gates.scale_queries), v (B, H, n, c, V) and the state entering each block (S_starts
    (B, H, n, K, V), z_starts (B, H, n, K) or None) -> num (B, H, n, c, V) and den (B, H, n, c)
    (None without z_starts). tmp: scratch like qf, free to overwrite."""
    B, H, n, c, K = qf.shape
    V = v.shape[-1]
    m = B * H * n
    A = torch.bmm(qf.reshape(m, c, K), kf.reshape(m, c, K).transpose(1, 2), out=scratch("la_A", m, c, c))
    # gated causal scores, in place (mul's backward needs not A) unless the mask is trained too
    A = A.view(B, H, n, c, c)
    A = A * gates.mask if gates.mask.requires_grad else A.mul_(gates.mask)
    num = torch.bmm(A.view(m, c, c), v.reshape(m, c, V), out=scratch("la_num", m, c, V))
    num = num.baddbmm_(q_in.reshape(m, c, K), S_starts.reshape(m, K, V)).view(B, H, n, c, V)  # + the past
    if z_starts is None:
        return num, None
    den = torch.sum(A, dim=-1, out=scratch("la_den", B, H, n, c))  # the scores' row sums ...
    qz = torch.mul(q_in, z_starts.unsqueeze(3), out=tmp)
    return num, den.add_(qz.sum(dim=-1))  # ... plus phi(q) . z entering the block


def log_gate_sums(log_gate, start=None):
    """Cumulative log-gates of a span's positions, (T, H) -> (T, H) float64: b_j = start + g_0 +
    ... + g_j (start (H,) the sum before them, default 0), with gates below LOG_GATE_MIN taken as
    it, as every form takes them."""
    b = log_gate.to(torch.float64).clamp(min=LOG_GATE_MIN).cumsum(0)
    return b if start is None else b + start.to(torch.float64)


def span_state(kf, v, log_g=None, end=None, log_gate=None):
    """Stage 1 over one span: phi(k) (T, H, K) and v (T, H, V) -> its local state weighted to
    position end - 1 (default T - 1): (S (H, K, V), z (H, K)), in kf's dtype. With per-position
    log-gates (T, H) instead of a fixed log decay, the weights are to the span's last position."""
    T = kf.shape[0]
    end = T if end is None else end
    if log_gate is not None:
        b = log_gate_sums(log_gate)  # (T, H)
        w = torch.exp(b[-1:] - b).to(kf.dtype) if T else b.to(kf.dtype)  # (T, H): to the last row
        kf = kf * w.unsqueeze(-1)
    elif log_g is not None:
        pos = torch.arange(T, dtype=log_g.dtype, device=kf.device)
        w = torch.exp((end - 1 - pos).view(-1, 1) * log_g.view(1, -1)).to(kf.dtype)  # (T, H)
        kf = kf * w.unsqueeze(-1)
    return torch.einsum("thk,thv->hkv", kf, v.to(kf.dtype)), kf.sum(0)


def advance(S, z, dS, dz, log_g=None, steps=0, log_total=None):
    """Stage 2 over one span: the state (S (..., H, K, V), z (..., H, K)) after `steps` positions
    whose local state is (dS, dz): gamma^steps S + dS, gamma^steps z + dz; with per-position
    gates, exp(log_total) for gamma^steps, log_total (H,) the sum of the span's log-gates."""
    if log_total is not None:
        g = torch.exp(log_total.to(torch.float64)).to(S.dtype)  # (H,)
        S = S * g.view(-1, 1, 1)
        z = z * g.view(-1, 1)
    elif log_g is not None and steps:
        g = torch.exp(steps * log_g).to(S.dtype)  # (H,)
        S = S * g.view(-1, 1, 1)
        z = z * g.view(-1, 1)
    return S + dS, z + dz


def state_outputs(qf, S, z, log_g=None, steps=0, log_cum=None):
    """Stage 3's share of an entering state alone: a state (S (H, K, V), z (H, K)) that entered
    `steps` positions before the first of m positions adds, to their numerators and denominators,
    num_j = gamma^(steps+j+1) phi(q_j)^T S and den_j = gamma^(steps+j+1) phi(q_j) . z, for
    phi(q) (m, H, K) -> num (m, H, V), den (m, H), in qf's dtype. With per-position gates,
    exp(log_cum_j) for gamma^(steps+j+1), log_cum (m, H) the cumulative log-gate from the state's
    entry through position j (log_gate_sums)."""
    m = qf.shape[0]
    qh = qf.transpose(0, 1)  # (H, m, K)
    num = torch.bmm(qh, S.to(qf.dtype))  # (H, m, V)
    den = torch.bmm(qh, z.to(qf.dtype).unsqueeze(-1))[..., 0]  # (H, m)
    w = None
    if log_cum is not None:
        w = torch.exp(log_cum.to(torch.float64)).t().to(qf.dtype)  # (H, m)
    elif log_g is not None:
        pos = torch.arange(steps + 1, steps + m + 1, dtype=log_g.dtype, device=qf.device)
        w = torch.exp(log_g.view(-1, 1) * pos).to(qf.dtype)  # (H, m)
    if w is not None:
        num.mul_(w.unsqueeze(-1))
        den.mul_(w)
    return num.transpose(0, 1), den.transpose(0, 1)
