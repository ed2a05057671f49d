"""The span stages of the mLSTM, for callers that compose their own pass (the sequence-parallel
split): a span's outputs from the empty state, their share of an entering state, and the span's
summary; summaries fold in order.

In the absolute frame (a state C* = exp(m) C, n* = exp(m) n, with the stabiliser m of the
recurrence) a span's state after it is affine in the state entering it with one scalar decay
per head, exactly as for linear attention with a log-gate per position (linpipe.kernels.
linear_attn.stages, `advance`):

    C*' = exp(G) C*_in + C*_span,      G = the span's summed log forget gates,

and the recurrence's stabiliser after it is m' = max(G + m_in, m_span) (m_span that of the span
from the empty state, m = -inf). Stabilised, with every weight exp of a difference <= 0:

    C' = exp(G + m_in - m') C_in + exp(m_span - m') C_span     (n alike)

which is `fold`: nothing overflows however long the span or strong its gates, and two spans'
summaries fold by the same rule (the first one's state entering the second). A summary is the
span's G and its state from the empty state (C, n, m).

Each position t of a span gets its parts from the empty state, num_t and den_t stabilised by its
own m_t (chunk.chunk_mlstm_parts), and an entering state (C, n, m) adds its share once m is known:
with G_t the summed log forget gates from the span's start through t,

    M_t = max(G_t + m, m_t)
    num = exp(m_t - M_t) num_t + exp(G_t + m - M_t) (scale q_t)^T C,   den alike with n
    h_t = num / (max(|den|, exp(-M_t)) + eps)                                    (`outputs`)
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..linear_attn.stages import advance as scalar_advance
from ..linear_attn.stages import state_outputs
from .chunk import BLOCK_SIZE, check_inputs, chunk_mlstm_parts, log_forget


class Summary(NamedTuple):
    """A span as a map of the state entering it (fold)."""

    log_f: torch.Tensor  # (B, H) float64: the span's summed log forget gates
    C: torch.Tensor  # (B, H, K, V): its state from the empty state, stabilised by m
    n: torch.Tensor  # (B, H, K)
    m: torch.Tensor  # (B, H) float64; -inf where the span wrote nothing (no positions)


class SpanParts(NamedTuple):
    """A span run from the empty state: `outputs(parts, state)` gives its h for an entering
    state, `fold(state, summary)` the state after it."""

    num: torch.Tensor  # (B, T, H, V)
    den: torch.Tensor  # (B, T, H)
    m: torch.Tensor  # (B, T, H) float64: the stabiliser of num and den
    log_f: torch.Tensor  # (B, T, H) float64: summed log forget gates from the span's start through t
    q_state: torch.Tensor  # (B, T, H, K): scale q, the entering state's map
    summary: Summary


def empty_state(B, H, K, V, dtype=torch.float64, device=None):
    """The empty state: nothing written, m = -inf (a record's zero state is m = 0, naive.py)."""
    return (torch.zeros((B, H, K, V), dtype=dtype, device=device),
            torch.zeros((B, H, K), dtype=dtype, device=device),
            torch.full((B, H), float("-inf"), dtype=torch.float64, device=device))


def _log_weights(log_f, m_in, m_span):
    """(m', G + m_in - m', m_span - m') in float64: the stabiliser after a span and the log
    weights (<= 0) of the entering state and of the span's own; -inf (a weight of 0, not NaN)
    where a term is empty (m = -inf), both where both are."""
    carried = log_f + m_in
    m = torch.maximum(carried, m_span)
    finite = torch.isfinite(m)
    none = torch.full_like(m, float("-inf"))
    return m, torch.where(finite, carried - m, none), torch.where(finite, m_span - m, none)


def fold(state, summary: Summary):
    """The state (C, n, m) after a span from the state entering it: m' = max(G + m, m_span),
    C' = exp(G + m - m') C + exp(m_span - m') C_span, n alike. C, n in the summary's dtype."""
    C, n, m = state
    m_out, log_in, log_span = _log_weights(summary.log_f, m.to(torch.float64), summary.m)
    dt = summary.C.dtype
    ws = torch.exp(log_span).to(dt)
    # linear attention's scalar-gate step, S' = exp(log_total) S + dS, one record at a time
    Cs, ns = [], []
    for b in range(C.shape[0]):
        Cb, nb = scalar_advance(C[b].to(dt), n[b].to(dt), ws[b, :, None, None] * summary.C[b],
                                ws[b, :, None] * summary.n[b], log_total=log_in[b])
        Cs.append(Cb)
        ns.append(nb)
    return torch.stack(Cs), torch.stack(ns), m_out


def fold_summaries(summaries) -> Summary:
    """The summary of consecutive spans, given in order: the first one's state entering the
    next, and their log forget gates summed."""
    s = summaries[0]
    for nxt in summaries[1:]:
        C, n, m = fold((s.C, s.n, s.m), nxt)
        s = Summary(s.log_f + nxt.log_f, C, n, m)
    return s


def span_parts(q, k, v, igate, fgate, *, scale=None, block_size=BLOCK_SIZE,
               before: Summary | None = None) -> SpanParts:
    """A span from the empty state: every position's parts, the entering state's map and the
    span's summary, in the compute dtype (float32; float64 for float64 inputs) but the float64
    gate sums and stabilisers. before: the summary of the positions before the span from the same
    empty state (a pass continued over several calls): parts and summary then count from that
    earlier start."""
    check_inputs(q, k, v, igate, fgate)
    B, T, H, K = q.shape
    V = v.shape[-1]
    cd = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = K ** -0.5 if scale is None else scale
    start = empty_state(B, H, K, V, cd, q.device) if before is None else (before.C, before.n, before.m)
    G0 = torch.zeros((B, H), dtype=torch.float64, device=q.device) if before is None else before.log_f
    num, den, m, (C, n, m_end) = chunk_mlstm_parts(q, k, v, igate, fgate, scale=scale, initial_state=start,
                                                   block_size=block_size, dtype=cd)
    log_f = log_forget(fgate).cumsum(1) + G0[:, None]  # (B, T, H)
    total = log_f[:, -1] if T else G0
    return SpanParts(num, den, m, log_f, q.to(cd) * scale, Summary(total, C, n, m_end))


def outputs(parts: SpanParts, state, eps: float = 1e-6):
    """The span's h (B, T, H, V) for the state (C, n, m) entering it (at the start its parts
    count from): the local parts rescaled to the recurrence's stabiliser, the entering state's
    share added (linear attention's `state_outputs`, weights exp(G_t + m - M_t)), then divided."""
    C, n, m = state
    M, log_in, log_loc = _log_weights(parts.log_f, m.to(torch.float64)[:, None], parts.m)  # (B, T, H)
    dt = parts.num.dtype
    w_loc = torch.exp(log_loc).to(dt)
    num = parts.num * w_loc.unsqueeze(-1)
    den = parts.den * w_loc
    for b in range(num.shape[0]):
        share, share_den = state_outputs(parts.q_state[b], C[b].to(dt), n[b].to(dt), log_cum=log_in[b])
        num[b] += share
        den[b] += share_den
    floor = torch.exp(-M).to(dt)
    return num / (torch.maximum(den.abs(), floor) + eps).unsqueeze(-1)
