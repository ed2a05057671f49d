"""The stages Mamba's selective scan is composed from, in PyTorch: the chunked form (chunk.py)
runs them over the blocks of a span; the sequence-parallel split runs them over segments.

Per channel d and state n, with dt_t = softplus(delta_t + delta_bias) (each optional) and
A (D, N) < 0 (Mamba's A = -exp(A_log)),

    h_t[d, n] = exp(dt_t[d] A[d, n]) h_{t-1}[d, n] + dt_t[d] u_t[d] B_t[n]
    y_t[d]    = sum_n C_t[n] h_t[d, n] + D[d] u_t[d]            (then y_t * silu(z_t))

The decay is diagonal: over a run of positions the state after it is affine in the state
entering it, h' = exp(A dt_sum) * h + dh, with dt_sum (D,) the run's summed time steps (A is
constant over time, so the summed log-decay of (d, n) is A[d, n] dt_sum[d]); and each position's
share of the entering state is sum_n C_t[n] exp(A[d, n] dt_cum_t[d]) h[d, n], dt_cum_t the time
steps summed from the entry through t. So a run's summary is (dt_sum (B, D), dh (B, D, N)), and
one rule carries a state over a run, whether the run is a block (`run_span`'s fold over its
blocks) or a span (`advance`, `fold_summaries`): `carry(decay, dh, h) = decay * h + dh`.

No weight is ever a growing exponential: every factor is exp of dt A <= 0 (for A < 0, dt >= 0),
so nothing overflows however strong the decay (a decay that empties the state underflows to 0).

Inside a span the positions are cut into n blocks of c rows, laid out (B, n, c, N, D) (the
channels innermost: every elementwise op runs over contiguous D-vectors). Every block's local
scan from a zero state runs for all blocks at once, one row at a time (c steps, each an op over
the n blocks' rows), together with its cumulative decay P_i = prod_{j<=i} a_j; the blocks are then
carried in order (one multiply-add of (N, D) per block); the entering state's share is added as
P_i * h_in, and y_t is one batched (1 x N) @ (N x D) product per position. No loop over positions.
The state is (B, D, N) outside (selective_scan_ref's and transformers' cache layout) and (B, N, D)
inside.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..linear_attn.scratch import workspace

# Rows per block of the chunked form, and elements (B span N D) of each of a span's two big
# temporaries, chosen by measurement (one thread, T = 16,384, D = 256, N = 16; blocks of 16 and
# 32, spans of 64 to 1,024 positions): a block costs 2 ops per row and the fold one op per block;
# spans of 128 positions (2 MB temporaries) ran ~20% faster than spans of 512 (8 MB), whose
# temporaries fall out of the cache between the passes; at D = 1,536 (Mamba-130m's width) spans
# of 16 to 32 positions (one or two blocks, 1.5 to 3 MB) beat 64 to 256.
BLOCK_SIZE = 16
SPAN_ELEMENTS = 1 << 19
# Positions of the entering state's share (`state_share`) computed at once: a (piece, N, D)
# temporary.
SHARE_PIECE = 512
_LOG2E = 1.4426950408889634  # log2(e): the decays are powers of 2 (exp2 is the faster)


class Summary(NamedTuple):
    """A run of positions as an affine map of the state entering it: h' = exp(A dt_sum) * h + dh."""

    dt_sum: torch.Tensor  # (B, D) float64: the run's time steps summed
    dh: torch.Tensor  # (B, D, N): the state after the run from a zero entering state


class SpanParts(NamedTuple):
    """A span run from a zero state: each position's output before the gate is o_local +
    state_share(dt_cum, C, A, h0) for the state h0 that enters the span, and the state after it
    is advance(summary, h0, A)."""

    o_local: torch.Tensor  # (B, T, D): sum_n C_t h_t + D u_t, from a zero entering state
    dt_cum: torch.Tensor  # (B, T, D): time steps summed from the entry through t
    summary: Summary


def check_inputs(u, delta, A, B, C, D=None, z=None, delta_bias=None, initial_state=None) -> None:
    """selective_scan_ref's shapes in linpipe's position-major layout: u, delta (and z) (B, T, D);
    A (D, N); B, C (B, T, N); D and delta_bias (D,); the state (B, D, N)."""
    if u.dim() != 3 or tuple(delta.shape) != tuple(u.shape):
        raise ValueError(f"u and delta must be (B, T, D) alike; got {tuple(u.shape)}, {tuple(delta.shape)}")
    batch, T, Dn = u.shape
    if A.dim() != 2 or A.shape[0] != Dn:
        raise ValueError(f"A must be (D, N) with D = {Dn}; got {tuple(A.shape)}")
    N = A.shape[1]
    for name, x in (("B", B), ("C", C)):
        if tuple(x.shape) != (batch, T, N):
            raise ValueError(f"{name} must be (B, T, N) = {(batch, T, N)}; got {tuple(x.shape)}")
    for name, x, shape in (("D", D, (Dn,)), ("delta_bias", delta_bias, (Dn,)), ("z", z, tuple(u.shape)),
                           ("initial_state", initial_state, (batch, Dn, N))):
        if x is not None and tuple(x.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}; got {tuple(x.shape)}")


def compute_dtype(u, dtype=None) -> torch.dtype:
    """float32, float64 for float64 inputs, or `dtype` when given."""
    return dtype or (torch.float64 if u.dtype == torch.float64 else torch.float32)


def time_steps(delta, delta_bias=None, delta_softplus=False, dtype=torch.float32):
    """dt = softplus(delta + delta_bias), each step optional, in `dtype` (selective_scan_ref's,
    whose softplus is torch's: x itself above 20)."""
    dt = delta.to(dtype)
    if delta_bias is not None:
        dt = dt + delta_bias.to(dtype)
    return F.softplus(dt) if delta_softplus else dt


def carry(decay, dh, h):
    """The state after a run from the state h entering it: decay * h + dh (all (..., N, D) or
    (..., D, N) alike). The one fold: over blocks, over spans, over summaries."""
    return torch.addcmul(dh, decay, h)


def _rows(x, n, c):
    """(B, t, X) -> (B, n, c, X) with rows past t zero (a view where t = n c)."""
    batch, t, X = x.shape
    if t < n * c:
        x = F.pad(x, (0, 0, 0, n * c - t))
    return x.reshape(batch, n, c, X)


def _buffer(shape, like, slot, inplace):
    """A temporary of `shape`: the calling thread's reused scratch in inference (no autograd),
    else None (a fresh tensor)."""
    if not inplace:
        return None
    numel = 1
    for s in shape:
        numel *= s
    return workspace(numel, like, slot=f"mamba_{slot}").view(shape)


def run_span(dt, u, A2t, B, C, h, c, inplace):
    """The scan over one span of t positions entering with h (B, N, D), in blocks of c rows (the
    last padded with dt = 0 and u = 0 rows, which leave the state as it is).

    dt, u (B, t, D), B, C (B, t, N) in the compute dtype; A2t (N, D) = A^T log2(e). inplace: write
    into reused buffers (inference); otherwise every op is out of place (autograd).
    Returns (y (B, t, D) = sum_n C_t h_t, h after the span (B, N, D))."""
    batch, t, Dn = u.shape
    N = A2t.shape[0]
    n = -(-t // c)
    dtb = _rows(dt, n, c)  # (B, n, c, D)
    v = _rows(dt * u, n, c).unsqueeze(3)  # (B, n, c, 1, D)
    Bb = _rows(B, n, c).unsqueeze(-1)  # (B, n, c, N, 1)
    shape = (batch, n, c, N, Dn)
    # a_i = exp(dt_i A), becoming the cumulative decay P_i = a_0 ... a_i; x_i the local state
    a = torch.mul(dtb.unsqueeze(3), A2t, out=_buffer(shape, u, "a", inplace))
    a = a.exp2_() if inplace else a.exp2()
    x = torch.mul(v, Bb, out=_buffer(shape, u, "x", inplace))  # (B, n, c, N, D): dt_i u_i B_i
    xr, ar = x.unbind(2), a.unbind(2)  # each row of every block: (B, n, N, D) views
    if inplace:
        for i in range(1, c):
            xr[i].addcmul_(ar[i], xr[i - 1])
            ar[i].mul_(ar[i - 1])
    else:
        xs, ps = [xr[0]], [ar[0]]
        for i in range(1, c):
            xs.append(torch.addcmul(xr[i], ar[i], xs[-1]))
            ps.append(ar[i] * ps[-1])
        x, a = torch.stack(xs, 2), torch.stack(ps, 2)
    starts = []
    for m in range(n):  # the fold over blocks: the state entering each
        starts.append(h)
        h = carry(a[:, m, -1], x[:, m, -1], h)
    h_in = torch.stack(starts, 1).unsqueeze(2)  # (B, n, 1, N, D)
    x = x.addcmul_(a, h_in) if inplace else torch.addcmul(x, a, h_in)  # every row's state
    y = torch.bmm(_rows(C, n, c).reshape(batch * n * c, 1, N), x.view(batch * n * c, N, Dn))
    return y.view(batch, n * c, Dn)[:, :t], h


def span_positions(batch, Dn, N, c, span=None) -> int:
    """Positions per span: `span`, or as many as keep a span's temporaries at SPAN_ELEMENTS,
    rounded down to whole blocks (one at least)."""
    if span is None:
        span = SPAN_ELEMENTS // max(1, batch * Dn * N)
    return max(c, span // c * c)


def scan(u, delta, A, B, C, *, D=None, delta_bias=None, delta_softplus=False, h=None,
         block_size=BLOCK_SIZE, span=None, dtype=None):
    """The chunked scan over all positions, spans in order carrying the state: (o (B, T, D) =
    sum_n C_t h_t + D u_t, before any gate, in the compute dtype; the state after (B, D, N) in the
    compute dtype; the time steps dt (B, T, D)). h: the entering state (B, D, N) or None; span:
    positions per span (default: span_positions())."""
    batch, T, Dn = u.shape
    N = A.shape[1]
    cd = compute_dtype(u, dtype)
    uc, Bc, Cc = u.to(cd), B.to(cd), C.to(cd)
    dt = time_steps(delta, delta_bias, delta_softplus, cd)
    A2t = (A.to(cd) * _LOG2E).t().contiguous()  # (N, D)
    hs = uc.new_zeros((batch, N, Dn)) if h is None else h.to(cd).transpose(1, 2)
    inplace = not (torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (u, delta, A, B, C, D, delta_bias, h)))
    c = max(1, int(block_size))
    step = span_positions(batch, Dn, N, c, span)
    outs = []
    for s in range(0, T, step):
        sl = slice(s, s + step)
        y, hs = run_span(dt[:, sl], uc[:, sl], A2t, Bc[:, sl], Cc[:, sl], hs, c, inplace)
        outs.append(y)
    o = torch.cat(outs, 1) if len(outs) > 1 else (outs[0] if outs else uc.new_zeros((batch, 0, Dn)))
    if D is not None:
        o = torch.addcmul(o, uc, D.to(cd))
    return o, hs.transpose(1, 2), dt


def span_parts(u, delta, A, B, C, *, D=None, delta_bias=None, delta_softplus=False,
               before: Summary | None = None, block_size=BLOCK_SIZE, span=None) -> SpanParts:
    """A span from a zero state, in one pass: its outputs before the gate (o_local), the summed
    time steps that map an entering state to them (dt_cum) and its summary (dt_sum, dh), in the
    compute dtype (float32; float64 for float64 inputs).

    before: the summary of the positions before the span, from the same zero state (a pass
    continued over several calls): outputs and summary then count from that earlier zero, and
    dt_cum maps the state entering those earlier positions."""
    check_inputs(u, delta, A, B, C, D, None, delta_bias)
    o, h, dt = scan(u, delta, A, B, C, D=D, delta_bias=delta_bias, delta_softplus=delta_softplus,
                    h=None if before is None else before.dh, block_size=block_size, span=span)
    cum = dt.to(torch.float64).cumsum(1)  # (B, T, D): float64 sums, long spans keep their small steps
    start = torch.zeros(u.shape[0], u.shape[2], dtype=torch.float64, device=u.device) if before is None \
        else before.dt_sum.to(torch.float64)
    total = (cum[:, -1] if u.shape[1] else torch.zeros_like(start)) + start
    return SpanParts(o, (cum + start[:, None]).to(o.dtype), Summary(total, h))


def span_summary(u, delta, A, B, C, *, delta_bias=None, delta_softplus=False, block_size=BLOCK_SIZE,
                 span=None) -> Summary:
    """A span's summary (dt_sum, dh) alone (its outputs are discarded)."""
    return span_parts(u, delta, A, B, C, delta_bias=delta_bias, delta_softplus=delta_softplus,
                      block_size=block_size, span=span).summary


def fold_summaries(summaries, A) -> Summary:
    """The summary of consecutive runs, given in order: (s2, dh2) after (s1, dh1) is
    (s1 + s2, exp(A s2) * dh1 + dh2)."""
    dt_sum, dh = summaries[0]
    for s2, dh2 in summaries[1:]:
        dh = carry(_decay(A, s2, dh2.dtype), dh2, dh.to(dh2.dtype))
        dt_sum = dt_sum.to(torch.float64) + s2.to(torch.float64)
    return Summary(dt_sum, dh)


def advance(summary: Summary, h0, A):
    """The state after a run (B, D, N) from the state h0 (B, D, N) entering it:
    exp(A dt_sum) * h0 + dh."""
    dh = summary.dh
    return carry(_decay(A, summary.dt_sum, dh.dtype), dh, h0.to(dh.dtype))


def _decay(A, dt_sum, dtype):
    """exp(A dt_sum) (B, D, N) from A (D, N) and dt_sum (B, D), the product taken in float64."""
    return torch.exp(dt_sum.to(torch.float64).unsqueeze(-1) * A.to(torch.float64)).to(dtype)


def state_share(dt_cum, C, A, h0, piece=SHARE_PIECE):
    """An entering state's share of a span's outputs, before the gate: dt_cum (B, T, D), C (B, T,
    N), A (D, N), h0 (B, D, N) -> (B, T, D), sum_n C_t[n] exp(A[d, n] dt_cum_t[d]) h0[d, n], in
    dt_cum's dtype; SHARE_PIECE positions at a time."""
    batch, T, Dn = dt_cum.shape
    N = A.shape[1]
    cd = dt_cum.dtype
    A2t = (A.to(cd) * _LOG2E).t().contiguous()  # (N, D)
    h0t = h0.to(cd).transpose(1, 2).unsqueeze(1)  # (B, 1, N, D)
    out = dt_cum.new_empty((batch, T, Dn))
    for s in range(0, T, piece):
        sl = slice(s, s + piece)
        m = dt_cum[:, sl].shape[1]
        w = torch.mul(dt_cum[:, sl].unsqueeze(2), A2t).exp2_().mul_(h0t)  # (B, m, N, D)
        share = torch.bmm(C[:, sl].to(cd).reshape(batch * m, 1, N), w.view(batch * m, N, Dn))
        out[:, sl] = share.view(batch, m, Dn)
    return out
