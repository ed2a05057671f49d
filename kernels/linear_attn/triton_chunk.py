"""Triton kernels for causal linear attention with carried float32 state.

Same contract as naive.py (raw q, k, v; phi and the normaliser applied inside; float32 state
in and out) plus `cu_seqlens` for packs of many records. See docs/kernels.md for the design:

1. `_span_state_kernel`: every span (up to `span_len` positions of one record) but
   the last of its record sums its own state contribution, decayed to the span end, in
   parallel over (spans, V tiles, heads). A single long record therefore still fills the GPU.
2. `_span_scan_kernel`: a sequential prefix over each record's spans, starting from the
   record's initial state; it leaves the state *entering* every span.
3. `_span_output_kernel`: every span starts from its entering state and walks its
   blocks of `block_size` positions: intra-block masked matmul plus inter-block state, with the
   normaliser q.z from the float32 z in the same loop; a record's last span writes the
   record's final state.

This module imports triton at import time; `linpipe.kernels` imports it only lazily.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .naive import FEATURE_MAPS
from .stages import LOG_GATE_MIN, check_log_gate

# Kernel ids of the feature maps: their index in naive.FEATURE_MAPS (the one list of names).
_FEATURE_MAP_IDS = {name: i for i, name in enumerate(FEATURE_MAPS)}
# _phi branches on these ids as literals (a jit function reads no Python globals).
assert _FEATURE_MAP_IDS["elu1"] == 0 and _FEATURE_MAP_IDS["relu"] == 1
_SUPPORTED = (torch.float32, torch.bfloat16, torch.float16)
# Positions per block (the matmul tile along positions) when the autotuner does not choose.
BLOCK_SIZE = 64
# log2 units, as the kernels weigh by exp2: the lowest log-gate (stages.LOG_GATE_MIN) and log2(e)
_GATE_MIN2 = tl.constexpr(LOG_GATE_MIN * 1.4426950408889634)
_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _phi(x, FEATURE_MAP: tl.constexpr):
    # x is float32; the feature map runs on registers, never as a separate pass over memory.
    if FEATURE_MAP == 0:
        return tl.where(x > 0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))
    elif FEATURE_MAP == 1:
        return tl.maximum(x, 0.0)
    else:
        return x


@triton.jit
def _row_base(pos, row_stride):
    # Element offset of position `pos` in a (positions, row_stride) buffer, always in int64:
    # B*T*H*K passes 2**31 on long genomes and int32 products would wrap silently.
    return pos.to(tl.int64) * row_stride


@triton.jit
def _mm(x, like, INTERPRETED: tl.constexpr):
    # A matmul operand in the input dtype (tensor cores for bf16/fp16; accumulation is fp32).
    # The interpreter multiplies bf16 bit patterns as integers, so there it is rounded to the
    # input dtype and multiplied in fp32: the same numbers as the compiled kernel.
    if INTERPRETED:
        return x.to(like.dtype).to(tl.float32)
    else:
        return x.to(like.dtype)


@triton.jit
def _block_gates(g_base, t0, n, o_t, H: tl.constexpr):
    # The block's cumulative log2-gates from its start, b_i = g_0 + ... + g_i, summed in fp64 and
    # kept as an fp32 pair (hi + lo): hi_i - hi_j is exact when b_i, b_j are within a factor 2
    # (Sterbenz), so the difference of two nearby sums keeps fp32 precision however strong the
    # gates before them. Masked rows have gate 0: b stays flat after the last valid row, and the
    # last row's pair is the block's total.
    g = tl.load(g_base + _row_base(t0, H) + o_t * H, mask=o_t < n, other=0.0).to(tl.float32)
    b = tl.cumsum((tl.maximum(g * _LOG2E, _GATE_MIN2)).to(tl.float64), axis=0)
    hi = b.to(tl.float32)
    lo = (b - hi.to(tl.float64)).to(tl.float32)
    last = o_t == o_t.shape[0] - 1
    return hi, lo, tl.sum(tl.where(last, hi, 0.0), axis=0), tl.sum(tl.where(last, lo, 0.0), axis=0)


@triton.jit
def _state_step(b_s, b_z, b_k, b_v, o_t, n, lg, gh, gl, g_hi, g_lo, HAS_DECAY: tl.constexpr,
                HAS_GATE: tl.constexpr, DOT_PRECISION: tl.constexpr, INTERPRETED: tl.constexpr):
    # Adds one block (n valid rows of phi(k), masked rows zero) to the running state.
    if HAS_GATE:
        # each row weighted to the block end, 2^(b_last - b_j); the block's total carries the
        # state entering it over
        w = tl.where(o_t < n, tl.exp2(tl.minimum((g_hi - gh) + (g_lo - gl), 0.0)), 0.0)
        b_k = b_k * w[:, None]
        g_n = tl.exp2(g_hi + g_lo)
        b_s = b_s * g_n
        b_z = b_z * g_n
    if HAS_DECAY:
        # decay each row to the block end; gamma^n carries the earlier blocks over. The where
        # keeps masked rows at 0 (gamma^negative would overflow to inf, and inf * 0 = nan).
        w = tl.where(o_t < n, tl.exp2((n - 1 - o_t).to(tl.float32) * lg), 0.0)
        b_k = b_k * w[:, None]
        g_n = tl.exp2(n.to(tl.float32) * lg)
        b_s = b_s * g_n
        b_z = b_z * g_n
    b_s += tl.dot(tl.trans(_mm(b_k, b_v, INTERPRETED)), _mm(b_v, b_v, INTERPRETED),
                  input_precision=DOT_PRECISION)  # (BK, BV)
    b_z += tl.sum(b_k, axis=0)
    return b_s, b_z


@triton.jit
def _state_block(b_s, b_z, g_sum, k_base, v_base, g_base, t0, n_pos, o_t, o_k, o_v, m_k, m_v, lg,
                 H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 FEATURE_MAP: tl.constexpr, HAS_DECAY: tl.constexpr, HAS_GATE: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, INTERPRETED: tl.constexpr):
    # (S, z, the span's log2-gate so far) after one more block. The block's first row in
    # int64 (a span may be long), offsets within the block in int32
    k_blk = k_base + _row_base(t0, H * K)
    v_blk = v_base + _row_base(t0, H * V)
    n = tl.minimum(n_pos - t0, o_t.shape[0])
    m_tk = (o_t < n)[:, None] & m_k[None, :]
    m_tv = (o_t < n)[:, None] & m_v[None, :]
    b_k = tl.load(k_blk + o_t[:, None] * (H * K) + o_k[None, :], mask=m_tk, other=0.0)
    b_v = tl.load(v_blk + o_t[:, None] * (H * V) + o_v[None, :], mask=m_tv, other=0.0)
    b_k = tl.where(m_tk, _phi(b_k.to(tl.float32), FEATURE_MAP), 0.0)  # phi(0) may be 1: mask after
    if HAS_GATE:
        gh, gl, g_hi, g_lo = _block_gates(g_base, t0, n, o_t, H)
        g_sum += g_hi + g_lo
    else:
        gh, gl, g_hi, g_lo = lg, lg, lg, lg
    b_s, b_z = _state_step(b_s, b_z, b_k, b_v, o_t, n, lg, gh, gl, g_hi, g_lo, HAS_DECAY, HAS_GATE,
                           DOT_PRECISION, INTERPRETED)
    return b_s, b_z, g_sum


@triton.jit
def _span_state_kernel(
    k_ptr, v_ptr,  # (T_all, H, K), (T_all, H, V) packed positions
    span_ptr,  # (NS, 4) int64: record, start, end, is-last-of-record
    inner_ptr,  # (NI,) int64: the spans that are not the last of their record
    log2g_ptr,  # (H,) float32 log2(decay)
    g_ptr,  # (T_all, H) float32 log-gates of the positions (HAS_GATE)
    ds_ptr, dz_ptr,  # (NS, H, K, V), (NS, H, K) float32 out
    dg_ptr,  # (NS, H) float32 out: each span's summed log2-gate (HAS_GATE)
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    FEATURE_MAP: tl.constexpr, HAS_DECAY: tl.constexpr, HAS_GATE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, INTERPRETED: tl.constexpr,
):
    # V tiles of one span are neighbours in launch order, so they run together and the
    # second read of the span's q/k rows hits L2
    pid = tl.program_id(0).to(tl.int64)
    i_s = tl.load(inner_ptr + pid // tl.cdiv(V, BV))  # last spans need no contribution
    i_v = (pid % tl.cdiv(V, BV)).to(tl.int32)
    i_h = tl.program_id(1)
    start = tl.load(span_ptr + i_s * 4 + 1)
    end = tl.load(span_ptr + i_s * 4 + 2)
    n_pos = (end - start).to(tl.int32)

    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    k_base = k_ptr + _row_base(start, H * K) + i_h * K
    v_base = v_ptr + _row_base(start, H * V) + i_h * V
    g_base = g_ptr + _row_base(start, H) + i_h
    lg = tl.load(log2g_ptr + i_h)  # 0 without decay

    b_s = tl.zeros((BK, BV), dtype=tl.float32)
    b_z = tl.zeros((BK,), dtype=tl.float32)
    g_sum = tl.sum(b_z, axis=0)  # a float32 scalar tensor: 0
    if INTERPRETED:
        t0 = n_pos * 0  # a tensor, like the `for` loop's index
        while t0 < n_pos:
            b_s, b_z, g_sum = _state_block(b_s, b_z, g_sum, k_base, v_base, g_base, t0, n_pos, o_t, o_k, o_v,
                                           m_k, m_v, lg, H, K, V, FEATURE_MAP, HAS_DECAY, HAS_GATE,
                                           DOT_PRECISION, INTERPRETED)
            t0 += BT
    else:
        for t0 in range(0, n_pos, BT):
            b_s, b_z, g_sum = _state_block(b_s, b_z, g_sum, k_base, v_base, g_base, t0, n_pos, o_t, o_k, o_v,
                                           m_k, m_v, lg, H, K, V, FEATURE_MAP, HAS_DECAY, HAS_GATE,
                                           DOT_PRECISION, INTERPRETED)

    s_base = ds_ptr + (i_s * H + i_h) * (K * V)
    tl.store(s_base + o_k[:, None] * V + o_v[None, :], b_s, mask=m_k[:, None] & m_v[None, :])
    tl.store(dz_ptr + (i_s * H + i_h) * K + o_k, b_z, mask=(m_k & (i_v == 0)) != 0)  # one V tile owns z
    if HAS_GATE:
        tl.store(dg_ptr + i_s * H + i_h, g_sum, mask=i_v == 0)


@triton.jit
def _scan_step(b_s, b_z, i_s, span_ptr, ds_ptr, dz_ptr, dg_ptr, i_h, o_k, o_kv, m_k, m_kv, own_z, lg,
               H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, HAS_DECAY: tl.constexpr,
               HAS_GATE: tl.constexpr):
    # Leaves the entering state of span i_s in its slot and returns the state after it.
    s_ptrs = ds_ptr + (i_s * H + i_h) * (K * V) + o_kv
    z_ptrs = dz_ptr + (i_s * H + i_h) * K + o_k
    d_s = tl.load(s_ptrs, mask=m_kv, other=0.0)
    d_z = tl.load(z_ptrs, mask=m_k, other=0.0)
    tl.store(s_ptrs, b_s, mask=m_kv)
    tl.store(z_ptrs, b_z, mask=(m_k & own_z) != 0)
    if HAS_DECAY:
        n = tl.load(span_ptr + i_s * 4 + 2) - tl.load(span_ptr + i_s * 4 + 1)
        g_n = tl.exp2(n.to(tl.float32) * lg)
        b_s = b_s * g_n
        b_z = b_z * g_n
    if HAS_GATE:
        g_n = tl.exp2(tl.load(dg_ptr + i_s * H + i_h))
        b_s = b_s * g_n
        b_z = b_z * g_n
    return b_s + d_s, b_z + d_z


@triton.jit
def _span_scan_kernel(
    span_first_ptr,  # (N+1,) int64: first span of each record
    span_ptr,  # (NS, 4) int64
    log2g_ptr,
    s0_ptr, z0_ptr,  # (N, H, K, V), (N, H, K) float32 initial states
    ds_ptr, dz_ptr,  # (NS, H, K, V), (NS, H, K): contributions in, entering states out
    dg_ptr,  # (NS, H) each span's summed log2-gate (HAS_GATE)
    sf_ptr, zf_ptr,  # (N, H, K, V), (N, H, K) float32 final states of records without spans
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    HAS_INITIAL: tl.constexpr, HAS_DECAY: tl.constexpr, HAS_GATE: tl.constexpr, INTERPRETED: tl.constexpr,
):
    i_nh = tl.program_id(0).to(tl.int64)
    i_k = tl.program_id(1)
    i_v = tl.program_id(2)
    i_n = i_nh // H
    i_h = (i_nh % H).to(tl.int32)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]
    own_z = i_v == 0  # one V tile owns z
    lg = tl.load(log2g_ptr + i_h)

    if HAS_INITIAL:
        b_s = tl.load(s0_ptr + i_nh * (K * V) + o_kv, mask=m_kv, other=0.0)
        b_z = tl.load(z0_ptr + i_nh * K + o_k, mask=m_k, other=0.0)
    else:
        b_s = tl.zeros((BK, BV), dtype=tl.float32)
        b_z = tl.zeros((BK,), dtype=tl.float32)
    first = tl.load(span_first_ptr + i_n)
    last = tl.load(span_first_ptr + i_n + 1)
    # every span but the last: entering state in its slot, then add its contribution
    if INTERPRETED:
        i_s = first
        while i_s < last - 1:
            b_s, b_z = _scan_step(b_s, b_z, i_s, span_ptr, ds_ptr, dz_ptr, dg_ptr, i_h, o_k, o_kv, m_k, m_kv,
                                  own_z, lg, H, K, V, HAS_DECAY, HAS_GATE)
            i_s += 1
    else:
        for i_s in range(first, last - 1):
            b_s, b_z = _scan_step(b_s, b_z, i_s, span_ptr, ds_ptr, dz_ptr, dg_ptr, i_h, o_k, o_kv, m_k, m_kv,
                                  own_z, lg, H, K, V, HAS_DECAY, HAS_GATE)
    # the last span only needs its entering state: the output pass ends with the final state
    has_span = last > first
    i_last = last - 1
    tl.store(ds_ptr + (i_last * H + i_h) * (K * V) + o_kv, b_s, mask=(m_kv & has_span) != 0)
    tl.store(dz_ptr + (i_last * H + i_h) * K + o_k, b_z, mask=(m_k & own_z & has_span) != 0)
    # a record without positions keeps its initial state
    tl.store(sf_ptr + i_nh * (K * V) + o_kv, b_s, mask=(m_kv & (last == first)) != 0)
    tl.store(zf_ptr + i_nh * K + o_k, b_z, mask=(m_k & own_z & (last == first)) != 0)


@triton.jit
def _output_block(b_s, b_z, q_base, k_base, v_base, o_base, g_base, t0, n_pos, o_t, o_k, o_v, m_k, m_v, lg,
                  eps, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  FEATURE_MAP: tl.constexpr, NORMALIZE: tl.constexpr, HAS_DECAY: tl.constexpr,
                  HAS_GATE: tl.constexpr, DOT_PRECISION: tl.constexpr, INTERPRETED: tl.constexpr):
    # Ordered so that few (BT, BK) tiles are live at once: the fp32 phi(k), phi(q) are reduced
    # (z, q.z) and cast to matmul operands right away.
    q_blk = q_base + _row_base(t0, H * K)
    k_blk = k_base + _row_base(t0, H * K)
    v_blk = v_base + _row_base(t0, H * V)
    o_blk = o_base + _row_base(t0, H * V)
    n = tl.minimum(n_pos - t0, o_t.shape[0])
    m_tk = (o_t < n)[:, None] & m_k[None, :]
    m_tv = (o_t < n)[:, None] & m_v[None, :]
    b_v = tl.load(v_blk + o_t[:, None] * (H * V) + o_v[None, :], mask=m_tv, other=0.0)
    b_kf = tl.load(k_blk + o_t[:, None] * (H * K) + o_k[None, :], mask=m_tk, other=0.0)
    b_kf = tl.where(m_tk, _phi(b_kf.to(tl.float32), FEATURE_MAP), 0.0)  # (BT, BK) fp32
    b_k = _mm(b_kf, b_v, INTERPRETED)
    if HAS_GATE:
        gh, gl, g_hi, g_lo = _block_gates(g_base, t0, n, o_t, H)
        # row j weighted to the block end, 2^(b_last - b_j); masked rows get 0
        b_kf = b_kf * tl.where(o_t < n, tl.exp2(tl.minimum((g_hi - gh) + (g_lo - gl), 0.0)), 0.0)[:, None]
    if HAS_DECAY:
        # row j reaches the block end after n-1-j more steps; masked rows get 0 (see _state_step)
        b_kf = b_kf * tl.where(o_t < n, tl.exp2((n - 1 - o_t).to(tl.float32) * lg), 0.0)[:, None]
    d_z = tl.sum(b_kf, axis=0)  # (BK,) fp32
    b_kw = _mm(b_kf, b_v, INTERPRETED)

    b_qf = tl.load(q_blk + o_t[:, None] * (H * K) + o_k[None, :], mask=m_tk, other=0.0)
    b_qf = tl.where(m_tk, _phi(b_qf.to(tl.float32), FEATURE_MAP), 0.0)
    if NORMALIZE:
        qz = tl.sum(b_qf * b_z[None, :], axis=1)  # (BT,) q.z from the fp32 z, never a bf16 copy
    b_q = _mm(b_qf, b_v, INTERPRETED)

    b_a = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION)  # (BT, BT) fp32
    b_inter = tl.dot(b_q, _mm(b_s, b_v, INTERPRETED), input_precision=DOT_PRECISION)  # (BT, BV)
    causal = o_t[:, None] >= o_t[None, :]
    if HAS_GATE:
        # 2^(b_i - b_j) on and below the diagonal (exponents <= 0: nothing overflows); the
        # entering state is weighted 2^(b_i) at row i
        d = (gh[:, None] - gh[None, :]) + (gl[:, None] - gl[None, :])
        b_a = tl.where(causal, b_a * tl.exp2(tl.minimum(d, 0.0)), 0.0)
        g_i = tl.exp2(gh + gl)  # (BT,)
        b_inter = b_inter * g_i[:, None]
        if NORMALIZE:
            qz = qz * g_i
    elif HAS_DECAY:
        # gamma^(i-j) on and below the diagonal (exponents >= 0: nothing overflows); the
        # entering state is i+1 steps old at row i
        b_a = tl.where(causal, b_a * tl.exp2((o_t[:, None] - o_t[None, :]).to(tl.float32) * lg), 0.0)
        g_i = tl.exp2((o_t + 1).to(tl.float32) * lg)  # (BT,)
        b_inter = b_inter * g_i[:, None]
        if NORMALIZE:
            qz = qz * g_i
    else:
        b_a = tl.where(causal, b_a, 0.0)
    b_o = b_inter + tl.dot(_mm(b_a, b_v, INTERPRETED), _mm(b_v, b_v, INTERPRETED),
                           input_precision=DOT_PRECISION)
    if NORMALIZE:
        b_o = b_o / (tl.sum(b_a, axis=1) + qz + eps)[:, None]
    tl.store(o_blk + o_t[:, None] * (H * V) + o_v[None, :], b_o.to(o_blk.dtype.element_ty), mask=m_tv)

    if HAS_DECAY:
        g_n = tl.exp2(n.to(tl.float32) * lg)
        b_s = b_s * g_n
        b_z = b_z * g_n
    if HAS_GATE:
        g_n = tl.exp2(g_hi + g_lo)
        b_s = b_s * g_n
        b_z = b_z * g_n
    b_s += tl.dot(tl.trans(b_kw), _mm(b_v, b_v, INTERPRETED), input_precision=DOT_PRECISION)
    return b_s, b_z + d_z


@triton.jit
def _span_output_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr,  # (T_all, H, K) x2, (T_all, H, V) x2
    span_ptr,  # (NS, 4) int64
    log2g_ptr,
    g_ptr,  # (T_all, H) float32 log-gates (HAS_GATE)
    hs_ptr, hz_ptr,  # (NS, H, K, V), (NS, H, K) float32 entering states
    sf_ptr, zf_ptr,  # (N, H, K, V), (N, H, K) float32 final states, from each record's last span
    eps,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    FEATURE_MAP: tl.constexpr, NORMALIZE: tl.constexpr, HAS_DECAY: tl.constexpr,
    HAS_GATE: tl.constexpr, DOT_PRECISION: tl.constexpr, INTERPRETED: tl.constexpr,
):
    # V tiles of one span are neighbours in launch order, so they run together and the
    # second read of the span's q/k rows hits L2
    pid = tl.program_id(0).to(tl.int64)
    i_s = pid // tl.cdiv(V, BV)
    i_v = (pid % tl.cdiv(V, BV)).to(tl.int32)
    i_h = tl.program_id(1)
    start = tl.load(span_ptr + i_s * 4 + 1)
    end = tl.load(span_ptr + i_s * 4 + 2)
    n_pos = (end - start).to(tl.int32)

    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    q_base = q_ptr + _row_base(start, H * K) + i_h * K
    k_base = k_ptr + _row_base(start, H * K) + i_h * K
    v_base = v_ptr + _row_base(start, H * V) + i_h * V
    o_base = o_ptr + _row_base(start, H * V) + i_h * V
    g_base = g_ptr + _row_base(start, H) + i_h
    lg = tl.load(log2g_ptr + i_h)

    b_s = tl.load(hs_ptr + (i_s * H + i_h) * (K * V) + o_k[:, None] * V + o_v[None, :],
                  mask=m_k[:, None] & m_v[None, :], other=0.0)  # (BK, BV) fp32
    b_z = tl.load(hz_ptr + (i_s * H + i_h) * K + o_k, mask=m_k, other=0.0)  # (BK,) fp32
    if INTERPRETED:
        t0 = n_pos * 0  # a tensor, like the `for` loop's index
        while t0 < n_pos:
            b_s, b_z = _output_block(b_s, b_z, q_base, k_base, v_base, o_base, g_base, t0, n_pos, o_t, o_k,
                                     o_v, m_k, m_v, lg, eps, H, K, V, FEATURE_MAP, NORMALIZE, HAS_DECAY,
                                     HAS_GATE, DOT_PRECISION, INTERPRETED)
            t0 += BT
    else:
        for t0 in range(0, n_pos, BT):
            b_s, b_z = _output_block(b_s, b_z, q_base, k_base, v_base, o_base, g_base, t0, n_pos, o_t, o_k,
                                     o_v, m_k, m_v, lg, eps, H, K, V, FEATURE_MAP, NORMALIZE, HAS_DECAY,
                                     HAS_GATE, DOT_PRECISION, INTERPRETED)
    # the last span of a record ends with the record's final state
    is_last = tl.load(span_ptr + i_s * 4 + 3) != 0
    i_n = tl.load(span_ptr + i_s * 4)
    tl.store(sf_ptr + (i_n * H + i_h) * (K * V) + o_k[:, None] * V + o_v[None, :], b_s,
             mask=(m_k[:, None] & m_v[None, :] & is_last) != 0)
    tl.store(zf_ptr + (i_n * H + i_h) * K + o_k, b_z, mask=(m_k & (i_v == 0) & is_last) != 0)


_tuned: dict = {}


def _tuned_kernels(fp32: bool):
    """Autotuned wrappers of the two parallel kernels, built on the first GPU call."""
    if fp32 not in _tuned:
        # Ahead-of-time sm_90 builds (K = V = 128) spill registers in the output pass at
        # block_size = 64 for bf16 and far more for fp32 (no tensor cores with ieee dots): smaller
        # tiles are offered there, and the GPU picks by measurement.
        bts, bvs = ((16, 32), (32, 64)) if fp32 else ((32, 64), (64, 128))
        configs = [triton.Config({"BT": bt, "BV": bv}, num_warps=w, num_stages=st)
                   for bt in bts for bv in bvs for w in (4, 8) for st in (2, 3)]
        key = ["H", "K", "V", "FEATURE_MAP", "HAS_DECAY", "HAS_GATE", "DOT_PRECISION"]
        _tuned[fp32] = (triton.autotune(configs=configs, key=key)(_span_state_kernel),
                        triton.autotune(configs=configs, key=key + ["NORMALIZE"])(_span_output_kernel))
    return _tuned[fp32]


def _spans(cu: torch.Tensor, span_len: int):
    """Cut records into spans of at most span_len positions.

    Returns spans (NS, 4) int64 (record, start, end, 1 if last of its record) and span_first
    (N+1,) int64, on cu's device.
    One device-to-host copy (the number of spans) sizes the launch grid.
    """
    lengths = cu[1:] - cu[:-1]  # (N,)
    counts = (lengths + span_len - 1) // span_len  # zero-length records own no span
    span_first = torch.zeros(len(counts) + 1, dtype=torch.int64, device=cu.device)
    torch.cumsum(counts, 0, out=span_first[1:])
    ns = int(span_first[-1].item())
    rec = torch.repeat_interleave(torch.arange(len(counts), device=cu.device), counts, output_size=ns)
    local = torch.arange(ns, device=cu.device) - span_first[rec]
    start = cu[rec] + local * span_len
    end = torch.minimum(start + span_len, cu[rec + 1])
    last = (end == cu[rec + 1]).to(torch.int64)
    return torch.stack([rec, start, end, last], 1).contiguous(), span_first


def _interpreted() -> bool:
    # Triton 3.6's interpreter cannot take a `range` bound from a runtime scalar under NumPy >= 2.4
    # (its scalars are 1-element arrays), so interpreted runs walk the same bodies with `while`.
    # Compiled runs keep `for`, which Triton software-pipelines.
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _pow2(x: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(x))


def _default_span_len(total: int, n_records: int, heads: int, v_tiles: int, block_size: int) -> int:
    # Enough (span, head, V tile) programs to fill every SM a few times over, but spans
    # long enough that the per-span state traffic stays small next to q, k, v and o.
    target_programs = 2048
    per_span = heads * v_tiles
    want_spans = max(1, target_programs // per_span)
    span = total // want_spans if total > 0 else block_size
    span = max(block_size, min(8192, span))
    span = block_size * max(1, span // block_size)
    return span


def chunk_linear_attn_triton(
    q: torch.Tensor,  # (B, T, H, K) raw projections
    k: torch.Tensor,  # (B, T, H, K)
    v: torch.Tensor,  # (B, T, H, V)
    *,
    decay: torch.Tensor | None = None,  # (H,) in (0, 1]
    feature_map: str = "elu1",
    normalize: bool = True,
    eps: float = 1e-6,
    initial_state: tuple[torch.Tensor, torch.Tensor] | None = None,  # (N|B, H, K, V), (N|B, H, K)
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,  # (N+1,) int64, with B == 1
    block_size: int | None = None,
    span_len: int | None = None,
    v_tile: int | None = None,
    log_gate: torch.Tensor | None = None,  # (B, T, H) log-gates g_t <= 0 of the positions
):
    """Fused chunked linear attention in Triton; returns (o in q's dtype, (S, z) float32 or None).

    `block_size` (positions per matmul block), `span_len` (positions per parallel span, a
    multiple of block_size) and `v_tile` (the tile along V) are tuning knobs; the defaults suit a GPU.
    """
    if feature_map not in _FEATURE_MAP_IDS:
        raise ValueError(f"unknown feature map {feature_map!r}; expected one of {', '.join(FEATURE_MAPS)}")
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"q, k must be (B, T, H, K) and v (B, T, H, V); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    B, T, H, K = q.shape
    V = v.shape[-1]
    out_dtype = q.dtype
    dtype = q.dtype if q.dtype in _SUPPORTED else torch.float32  # float64 callers compute in fp32
    q, k, v = (x.to(dtype).contiguous() for x in (q, k, v))
    device = q.device

    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"cu_seqlens needs B == 1 (records packed along T); got B = {B}")
        cu = cu_seqlens.to(device=device, dtype=torch.int64)
        if cu.dim() != 1 or cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != T:
            raise ValueError(f"cu_seqlens must run from 0 to T = {T}; got {cu_seqlens.tolist()[:8]}...")
        if bool((cu[1:] < cu[:-1]).any()):
            raise ValueError("cu_seqlens must be non-decreasing")
    else:
        cu = torch.arange(B + 1, device=device, dtype=torch.int64) * T  # each batch row is a record
    N = cu.numel() - 1

    BK = _pow2(K)
    BV = v_tile or min(_pow2(V), 64)
    BT = block_size or BLOCK_SIZE
    v_tiles = triton.cdiv(V, BV)
    L = span_len or _default_span_len(B * T, N, H, v_tiles, BT)
    if L % BT:
        raise ValueError(f"span_len {L} must be a multiple of block_size {BT}")
    if decay is not None and (decay.shape != (H,) or not bool(((decay > 0) & (decay <= 1)).all())):
        raise ValueError(f"decay must have shape ({H},) and values in (0, 1]; got {decay.tolist()}")
    if log_gate is not None:
        check_log_gate(log_gate, (B, T, H))
        # per position, a decay's log added: one gate per position and head in the kernels
        log_gate = log_gate.to(device=device, dtype=torch.float32)
        if decay is not None:
            log_gate = log_gate + torch.log(decay.to(device=device, dtype=torch.float32))
            decay = None
        log_gate = log_gate.contiguous()
    spans, span_first = _spans(cu, L)
    NS = spans.shape[0]
    inner = torch.nonzero(spans[:, 3] == 0).flatten()  # spans followed by one of the same record
    NI = inner.numel()

    if decay is not None:
        log2g = torch.log2(decay.to(device=device, dtype=torch.float32)).contiguous()
    else:
        log2g = torch.zeros(H, device=device, dtype=torch.float32)
    has_decay = decay is not None
    has_gate = log_gate is not None
    gates = log_gate if has_gate else log2g  # a placeholder without gates
    gate_sums = torch.empty((NS, H) if has_gate else (1,), device=device, dtype=torch.float32)
    prec = "ieee" if dtype == torch.float32 else "tf32"
    fm = _FEATURE_MAP_IDS[feature_map]
    interp = _interpreted()

    if initial_state is not None:
        s0 = initial_state[0].to(device=device, dtype=torch.float32).contiguous()
        z0 = initial_state[1].to(device=device, dtype=torch.float32).contiguous()
        if s0.shape != (N, H, K, V) or z0.shape != (N, H, K):
            raise ValueError(f"initial_state must be S ({N}, {H}, {K}, {V}) and z ({N}, {H}, {K}); "
                             f"got {tuple(s0.shape)}, {tuple(z0.shape)}")
    else:
        s0 = z0 = log2g  # unused placeholders

    hs = torch.empty((NS, H, K, V), device=device, dtype=torch.float32)
    hz = torch.empty((NS, H, K), device=device, dtype=torch.float32)
    sf = torch.empty((N, H, K, V), device=device, dtype=torch.float32)
    zf = torch.empty((N, H, K), device=device, dtype=torch.float32)
    o = torch.empty((B, T, H, V), device=device, dtype=dtype)

    state_args = (k, v, spans, inner, log2g, gates, hs, hz, gate_sums)
    state_meta = dict(H=H, K=K, V=V, BK=BK, FEATURE_MAP=fm, HAS_DECAY=has_decay, HAS_GATE=has_gate,
                      DOT_PRECISION=prec, INTERPRETED=interp)
    out_args = (q, k, v, o, spans, log2g, gates, hs, hz, sf, zf, float(eps))
    out_meta = dict(state_meta, NORMALIZE=bool(normalize))
    tuned = not interp and v_tile is None and block_size is None
    if tuned:  # block, V tile, warps and stages are autotuned per (H, K, V, variant) on the GPU
        state_kernel, out_kernel = _tuned_kernels(dtype == torch.float32)
    else:
        state_kernel, out_kernel = _span_state_kernel, _span_output_kernel
        state_meta.update(BT=BT, BV=BV)
        out_meta.update(BT=BT, BV=BV)

    def grid(n_span):  # axis 0: span-major, V tile fastest (2**31 - 1 allowed, unlike axis 1)
        return lambda meta: (n_span * triton.cdiv(V, meta["BV"]), H)

    if NI > 0:
        state_kernel[grid(NI)](*state_args, **state_meta)
    if N > 0:
        scan_bk = min(BK, 32)
        scan_bv = min(_pow2(V), 32)
        _span_scan_kernel[(N * H, triton.cdiv(K, scan_bk), triton.cdiv(V, scan_bv))](
            span_first, spans, log2g, s0, z0, hs, hz, gate_sums, sf, zf,
            H=H, K=K, V=V, BK=scan_bk, BV=scan_bv, HAS_INITIAL=initial_state is not None,
            HAS_DECAY=has_decay, HAS_GATE=has_gate, INTERPRETED=interp,
        )
    if NS > 0:
        out_kernel[grid(NS)](*out_args, **out_meta)
    final = (sf, zf) if output_final_state else None
    return o.to(out_dtype), final
