"""The chunked parallel form of causal linear attention in PyTorch (CPU, and autograd anywhere).

Same contract as naive.py. The sequence streams through in spans of SPAN positions,
carrying the state; a span is cut into n blocks of c positions and runs the three stages of
stages.py over them (`_run_blocks`): every block's local state, their fold (the state entering
each block, as grouped matmuls: no Python loop over positions or blocks), and the output pass
(a masked, gated matmul inside each block plus the entering state's share). The normaliser's z
is carried apart from S, so every matmul is V wide.

Every temporary is an `out=` of a `Scratch`: under
autograd each op allocates; in inference it writes into per-thread buffers reused span
after span (on the development VM a first touch of fresh memory costs ~0.5 ms per MB, more
than the arithmetic on it), and the decay constants are cached by decay value.
"""
from __future__ import annotations

import torch

from .naive import feature_map_fn
from .scratch import Scratch, hugepages
from .stages import PREFIX_GROUP, block_gates, block_outputs, check_log_gate, local_states, log_decay

# Positions per block: chosen by measurement (1 thread, K=32): 32 beat 64 and 128 once spans are
# cache-sized; smaller blocks mean less intra-block work per position (2c(K+V) FLOPs).
BLOCK_SIZE = 32
# Positions after which a call can be cut and resumed from its final state to the same bytes as
# one call: whole groups of blocks (Gates.fold). Cuts elsewhere round differently (within 1e-6).
EXACT_CUT = BLOCK_SIZE * PREFIX_GROUP
# Positions per span: every temporary (about a dozen of SPAN * H * K floats) stays in
# cache. One pass over T at once was slower on the CPU: every elementwise pass went to DRAM.
SPAN = 2048
_LOG2E = 1.4426950408889634  # log2(e)
_LN2 = 0.6931471805599453  # ln(2) = 1 / log2(e)


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


def _blocks(x, n, c, out=None, phi_name=None, tmp=None):
    """Positions x (B, t, H, X), t <= n*c -> blocks (B, H, n, c, X), phi(x) with phi_name, rows
    past t zero: into out when given (inference; tmp: scratch like out), else fresh (a view of
    x where nothing is padded or mapped). phi runs over the whole contiguous block buffer, so a
    position meets the same vectorised code (exp2's vector and scalar forms round differently)
    however many positions the call has."""
    B, t, H, X = x.shape
    rows = x.transpose(1, 2)  # (B, H, t, X)
    if out is None:  # autograd
        if phi_name is not None:
            rows = features(rows, phi_name)
        if t < n * c:
            rows = torch.nn.functional.pad(rows, (0, 0, 0, n * c - t))
        return rows.reshape(B, H, n, c, X)
    flat = out.view(B, H, n * c, X)
    if t == n * c:
        return out.copy_(rows.reshape(B, H, n, c, X)) if phi_name is None else features(
            rows.reshape(B, H, n, c, X), phi_name, out, tmp)
    flat[:, :, :t].copy_(rows)
    flat[:, :, t:].zero_()
    if phi_name is not None:
        features(out, phi_name, out, tmp)
        flat[:, :, t:].zero_()  # phi(0) need not be 0
    return out


def _run_blocks(q, k, v, S, z, log_g, phi_name, need_z, need_den, n, c, scratch):
    """Positions of q, k, v (B, t, H, K|V), t <= n*c, as n blocks of c (a last block of fewer
    rows padded with zero rows), entering with S (B, H, K, V) and z (B, H, K) -> (num (B, H, n,
    c, V), den (B, H, n, c) or None, S, z after the t positions; z is carried only when need_z;
    log_g: None, the log decays (H,) or the positions' log-gates (B, t, H), padded with gates of
    0 that leave the state as it is). The three stages of stages.py, in order. Every block has
    all c rows and a fixed decay's fold runs by whole groups of blocks (Gates.fold), so a
    position's outputs are the same bytes whatever follows it in the call, and a call cut after
    whole groups resumes to the bytes of one."""
    B, t, H, K = q.shape
    V = v.shape[-1]
    positional = log_g is not None and log_g.dim() == 3
    if positional and t < n * c:
        log_g = torch.nn.functional.pad(log_g, (0, 0, 0, n * c - t))
    gates = block_gates(log_g, H, n, c, q.dtype, q.device, scratch)
    tmp = scratch("la_tmp", B, H, n, c, K)
    qf = _blocks(q, n, c, scratch("la_q", B, H, n, c, K), phi_name, tmp)  # (B, H, n, c, K)
    kf = _blocks(k, n, c, scratch("la_k", B, H, n, c, K), phi_name, tmp)
    vb = _blocks(v, n, c, scratch("la_v", B, H, n, c, V))  # contiguous, for the matmuls
    q_in = gates.scale_queries(qf, scratch("la_qin", B, H, n, c, K))
    k_end = gates.scale_keys(kf, scratch("la_kout", B, H, n, c, K))
    dS, dz = local_states(k_end, vb, scratch("la_dS", B * H * n, K, V), scratch("la_dz", B, H, n, K), need_z)
    S_starts, S = gates.fold(dS.view(B, H, n, K * V), S.reshape(B, H, K * V), scratch, "la_S")
    z_starts = None
    if need_z:
        z_starts, z = gates.fold(dz, z, scratch, "la_z")
    num, den = block_outputs(qf, kf, q_in, vb, S_starts, z_starts if need_den else None, gates, scratch, tmp)
    r = t - (n - 1) * c  # rows of the last block
    if r < c and not positional:  # the state after its last row, not after its padding (a
        # padded row's gate of 0 keeps the state as it is)
        S, z_end = gates.partial_state(kf[:, :, -1], vb[:, :, -1], S_starts[:, :, -1],
                                       None if z_starts is None else z_starts[:, :, -1], r)
        z = z if z_end is None else z_end
    return num, den, S.view(B, H, K, V), z


def _single(q, k, v, decay, feature_map, normalize, eps, initial_state, need_state, block_size, dtype,
            parts=False, log_gate=None):
    """One batch of independent sequences (no cu_seqlens) -> (o, den or None, S, z): o is the
    normalised output (or the numerator: without the normaliser, or with parts, when den is
    the denominator beside it); S, z after the sequence stay in the compute dtype."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    cd = dtype or (torch.float64 if q.dtype == torch.float64 else torch.float32)
    feature_map_fn(feature_map)  # unknown names fail here, even for T == 0
    tensors = [q, k, v, decay, log_gate] + ([] if initial_state is None else list(initial_state))
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    q, k, v = q.to(cd), k.to(cd), v.to(cd)
    log_g = None if decay is None else log_decay(decay.to(device=q.device, dtype=cd))
    if log_gate is not None:  # per position (B, T, H), a decay's log added
        log_g = log_gate.to(q.device) if log_g is None else log_gate.to(q.device) + log_g
    if initial_state is None:
        S = q.new_zeros((B, H, K, V))
        z = q.new_zeros((B, H, K))
    else:
        S, z = initial_state[0].to(cd), initial_state[1].to(cd)
    need_den = normalize or parts
    need_z = need_den or need_state
    c = max(1, int(block_size))
    group = c * PREFIX_GROUP  # spans are whole groups: their edges change no byte (Gates.fold)
    span_len = max(group, (SPAN // group) * group)
    scratch = Scratch(q, reuse=not grad)
    o = den = None
    if scratch.reuse:
        o = q.new_empty((B, T, H, V))
        hugepages(o)
        den = q.new_empty((B, T, H)) if parts else None
    outs, dens = [], []
    for a in range(0, T, span_len):
        t = min(span_len, T - a)
        n = -(-t // c)
        lg = log_g[:, a:a + t] if log_gate is not None else log_g
        num, d, S, z = _run_blocks(q[:, a:a + t], k[:, a:a + t], v[:, a:a + t], S, z, lg, feature_map,
                                   need_z, need_den, n, c, scratch)
        num = num.view(B, H, n * c, V)[:, :, :t]  # the real rows
        d = None if d is None else d.view(B, H, n * c)[:, :, :t]
        if normalize and not parts:  # as one pass: num / (den + eps)
            num = torch.mul(num, d.add_(eps).reciprocal_().unsqueeze(-1),
                            out=None if o is None else o[:, a:a + t].transpose(1, 2))
        elif o is not None:
            o[:, a:a + t].transpose(1, 2).copy_(num)
        if o is None:
            outs.append(num.transpose(1, 2))  # (B, t, H, V)
            if parts:
                dens.append(d.transpose(1, 2))  # (B, t, H)
        elif parts:
            den[:, a:a + t].transpose(1, 2).copy_(d)
    if o is None:
        o = torch.cat(outs, dim=1) if outs else q.new_zeros((B, 0, H, V))
        if parts:
            den = torch.cat(dens, dim=1) if dens else q.new_zeros((B, 0, H))
    return o, den, S, z


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
    block_size: int = BLOCK_SIZE,
    dtype: torch.dtype | None = None,
    log_gate: torch.Tensor | None = None,  # (B, T, H) log-gates g_t <= 0 of the positions
):
    """Returns (o (B, T, H, V) in q's dtype, final_state (S, z) float32 or None).

    Computes in float32 (float64 for float64 inputs, or `dtype` when given). Differentiable.
    """
    if log_gate is not None:
        check_log_gate(log_gate, q.shape[:3])

    def one(q, k, v, init, need_state, lg=log_gate):
        o, _, S, z = _single(q, k, v, decay, feature_map, normalize, eps, init, need_state, block_size, dtype,
                             log_gate=lg)
        return o.to(q.dtype), (S.float().contiguous(), z.float().contiguous())

    if cu_seqlens is None:
        o, final = one(q, k, v, initial_state, output_final_state)
        return o, final if output_final_state else None
    if q.shape[0] != 1:
        raise ValueError(f"cu_seqlens needs batch size 1, got {q.shape[0]}")
    offs = [int(x) for x in cu_seqlens.tolist()]
    outs, Ss, zs = [], [], []
    for i in range(len(offs) - 1):  # one record at a time: simple and exact
        a, b = offs[i], offs[i + 1]
        init = None if initial_state is None else (initial_state[0][i:i + 1], initial_state[1][i:i + 1])
        lg = None if log_gate is None else log_gate[:, a:b]
        o, fin = one(q[:, a:b], k[:, a:b], v[:, a:b], init, True, lg)
        outs.append(o)
        Ss.append(fin[0])
        zs.append(fin[1])
    o = torch.cat(outs, dim=1) if outs else q.new_zeros(v.shape)
    final = (torch.cat(Ss), torch.cat(zs)) if output_final_state and outs else None
    return o, final


def chunk_linear_attn_parts(q, k, v, *, decay=None, feature_map="elu1", initial_state=None,
                            block_size: int = BLOCK_SIZE, dtype: torch.dtype | None = None,
                            log_gate=None):
    """The normaliser's two parts apart, for callers that add to them before dividing (the
    sequence-parallel split): (num (B, T, H, V), den (B, T, H), (S, z)), where num / (den + eps)
    is chunk_linear_attn_torch's normalised o and num alone its o without the normaliser. All
    three are in the compute dtype (float32; float64 for float64 inputs, or `dtype`), the final
    state included, so that a float64 caller carries its state exactly. Same inputs as
    chunk_linear_attn_torch (no cu_seqlens); runs on any device (the Triton form has no parts)."""
    if log_gate is not None:
        check_log_gate(log_gate, q.shape[:3])
    num, den, S, z = _single(q, k, v, decay, feature_map, False, 0.0, initial_state, True, block_size, dtype,
                             parts=True, log_gate=log_gate)
    return num, den, (S, z)
