"""The kda layer (family `kda`): the token mixer of flash-linear-attention 0.6's KimiDeltaAttention
with its tensor names and shapes (docs/model-format.md), run through `linpipe.kernels.kda`; its
MLP is fla's GatedMLP (blocks.SwiGLU), its block fla's KDABlock (pre-norm attention, pre-norm MLP).

Per layer, from the normalised input a (B, T, D):

    q, k, v = silu(conv(q_proj a)), silu(conv(k_proj a)), silu(conv(v_proj a))  # causal, depthwise
    q, k    = q / |q|, k / |k|                                                 # per head
    f       = f_proj(a) + dt_bias                          # low rank D -> V -> HV K: a gate per key
    g       = -exp(A_log) softplus(f)       or   lower_bound sigmoid(exp(A_log) f)   # (HV, K), <= 0
    beta    = sigmoid(b_proj a)            (x 2 with allow_neg_eigval)
    o       = kda(q, k, v, beta, g)        # S_t = (I - beta k k^T) Diag(exp g_t) S_{t-1} + beta k v^T
    o       = RMSNorm(o) * sigmoid(g_proj a)   # per value head; g_proj low rank D -> V -> HV V, a bias

softplus is torch's (log1p(exp(x)), x itself past 20): fla's CPU form computes log(1 + exp(x))
in float32, which loses relative precision where exp(x) is small; the difference stays far
below the import's 1e-4 (docs/models.md).

With grouped value heads (n_v_heads) v, beta, the gates, the output and its norm have HV > H
heads, each query/key head serving G = HV / H of them (value head j reads query/key head j // G,
fla's order); the kernel takes q and k with their H heads and the state is (HV, K, V).

The carried state per layer is the rule's S (HV, K, V) and, with the short convolutions, the
window of their last W-1 inputs (q, k, v concatenated: (W-1, 2HK + HV V)). The split runs the
delta rule's passes (families/delta_net/split.py) through this layer's project / rule_inputs /
gate_rows / output / span_parts, with KDA's summaries (a full (K, K) M per value head).

Shapes: B batch, T positions, D = d_model, H query/key heads, HV value heads, K = head_dim,
V = K * expand_v. In CPU inference the position-wise ops run on fixed row tiles
(linpipe.model.rows), so a position's result does not depend on what shares its call.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from linpipe.kernels.kda import kda
from linpipe.kernels.kda import span_parts as kda_span_parts
from linpipe.model.blocks import Layer, ShortConv, SwiGLU, causal_conv, init_swiglu, l2norm
from linpipe.model.families.delta_net.layer import A_MAX, DT_FLOOR, DT_MAX, DT_MIN, DeltaAttention
from linpipe.model.families.fla_keys import has_conv, key_dim, value_dim
from linpipe.model.rows import linear, map_rows, row_tile


class SigmoidGatedRMSNorm(nn.Module):
    """KDA's o_norm: RMSNorm over each value head's V values (one weight (V,) for every head),
    times sigmoid of the output gate (fla's FusedRMSNormGated with activation "sigmoid")."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, o, g):  # o (..., V), g (..., V)
        return o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight * torch.sigmoid(g)


class KdaAttention(nn.Module):
    """The token mixer of a kda layer; o_proj is applied by Layer.finish. Its state: {"S" (B, HV,
    K, V), "conv" (B, W-1, 2HK + HV V) with the short convolutions}."""

    def __init__(self, c, tile: int):
        super().__init__()
        o = c.layer
        D, H, HV, K, V = c.d_model, c.n_heads, c.spec.v_heads(c), key_dim(c), value_dim(c)
        # v_heads: the rule's and the state's heads; qk_heads: q and k's
        self.v_heads, self.qk_heads, self.head_dim, self.head_v_dim = HV, H, K, V
        self.key_dim, self.value_dim = H * K, HV * V
        self.allow_neg_eigval, self.lower_bound = o.allow_neg_eigval, o.lower_bound
        self.tile = tile  # rows of the position-wise ops' tiles in CPU inference
        self.q_proj = nn.Linear(D, H * K, bias=False)
        self.k_proj = nn.Linear(D, H * K, bias=False)
        self.v_proj = nn.Linear(D, HV * V, bias=False)
        self.use_short_conv = o.use_short_conv
        self.carries_window = has_conv(c)  # W > 1: the window is part of the state
        if o.use_short_conv:
            self.q_conv1d = ShortConv(H * K, c.conv_width)
            self.k_conv1d = ShortConv(H * K, c.conv_width)
            self.v_conv1d = ShortConv(HV * V, c.conv_width)
        # fla's low ranks are the value width V, for both gates
        self.f_proj = nn.Sequential(nn.Linear(D, V, bias=False), nn.Linear(V, HV * K, bias=False))
        self.A_log = nn.Parameter(torch.zeros(HV))
        self.dt_bias = nn.Parameter(torch.zeros(HV * K))
        self.b_proj = nn.Linear(D, HV, bias=False)
        self.g_proj = nn.Sequential(nn.Linear(D, V, bias=False), nn.Linear(V, HV * V, bias=True))
        self.o_norm = SigmoidGatedRMSNorm(V, c.norm_eps)
        self.o_proj = nn.Linear(HV * V, D, bias=False)

    def log_gate(self, f):
        """f (..., HV, K), f_proj's output plus dt_bias -> the log-decays (..., HV, K), each <= 0."""
        A = self.A_log.float().exp()[:, None]  # (HV, 1)
        if self.lower_bound is None:
            return -A * F.softplus(f)
        return self.lower_bound * torch.sigmoid(A * f)

    def base_decay(self) -> list[float]:
        """Per value head: the geometric mean over its keys of the decay where f_proj gives 0
        (dt_bias alone)."""
        with torch.no_grad():
            f = self.dt_bias.double().view(self.v_heads, self.head_dim)
            A = self.A_log.double().exp()[:, None]
            g = -A * F.softplus(f) if self.lower_bound is None else self.lower_bound * torch.sigmoid(A * f)
            return torch.exp(g.mean(-1)).tolist()

    def _activate(self, x, side):
        """Rows of the conv's output x (N, 2HK + HV V) and of project's side rows -> q, k (N, H, K)
        L2-normalised, v (N, HV, V), beta (N, HV), the log-gates (N, HV, K)."""
        N, H, HV, K, V = x.shape[0], self.qk_heads, self.v_heads, self.head_dim, self.head_v_dim
        x = F.silu(x)
        q = l2norm(x[:, :H * K].reshape(N, H, K))
        k = l2norm(x[:, H * K:2 * H * K].reshape(N, H, K))
        v = x[:, 2 * H * K:].reshape(N, HV, V)
        beta = torch.sigmoid(side[:, :HV])
        if self.allow_neg_eigval:
            beta = beta * 2.0
        f = side[:, HV:HV + HV * K].reshape(N, HV, K) + self.dt_bias.view(HV, K)
        return q, k, v, beta, self.log_gate(f)

    def _normed(self, o, g):
        """Rows of the rule's output o (N, HV, V) and the output gate's values (N, HV V) -> o_norm's
        (N, HV V)."""
        N = o.shape[0]
        return self.o_norm(o, g.reshape(N, self.v_heads, self.head_v_dim)).reshape(N, -1)

    def project(self, a):
        """Normalised inputs a (B, T, D) -> (x (B, T, 2HK + HV V): the q, k, v projections before
        the conv; side (B*T, HV + HV K + HV V): b_proj's, then f_proj's and g_proj's rows (the
        gates' pre-activations, before dt_bias and the bias of g_proj's second factor added)."""
        B, T, D = a.shape
        HV, V = self.v_heads, self.head_v_dim
        tile = row_tile(a, self.tile)
        rows = a.reshape(B * T, D)
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])  # (2HK + HV V, D)
        x = linear(rows, w, tile=tile).view(B, T, -1)  # (B, T, 2HK + HV V)
        low = torch.cat([self.b_proj.weight, self.f_proj[0].weight, self.g_proj[0].weight])  # (HV + 2V, D)
        low = linear(rows, low, tile=tile)  # (B*T, HV + 2V)
        f = linear(low[:, HV:HV + V], self.f_proj[1].weight, tile=tile)  # (B*T, HV K)
        g = linear(low[:, HV + V:], self.g_proj[1].weight, tile=tile, bias=self.g_proj[1].bias)  # (B*T, HV V)
        return x, torch.cat([low[:, :HV], f, g], dim=1)

    def rule_inputs(self, x, side, window):
        """project's (x, side) after the conv window (B, W-1, 2HK + HV V) -> ((q, k, v, beta,
        log_gate), each (B, T, heads, ...), the new window)."""
        B, T = x.shape[:2]
        if self.use_short_conv:
            taps = torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight])[:, 0]
            x, window = causal_conv(x, window, taps)
        got = map_rows(self._activate, row_tile(x, self.tile), x.reshape(B * T, -1), side)
        return tuple(t.view(B, T, *t.shape[1:]) for t in got), window

    def gate_rows(self, side):
        """The output gate's pre-activations (B*T, HV V) in project's side rows."""
        return side[:, self.v_heads * (1 + self.head_dim):]

    # the rule's kernel and its span summaries; the rest of the forward is the delta rule's
    # layer's: the output after o_norm and the gate, the split's span summaries, the forward
    rule = staticmethod(kda)
    stage_parts = staticmethod(kda_span_parts)
    output = DeltaAttention.output
    span_parts = DeltaAttention.span_parts
    empty_window = DeltaAttention.empty_window
    forward = DeltaAttention.forward


def make_block(c, tile: int) -> Layer:
    return Layer(c.d_model, c.norm_eps, KdaAttention(c, tile), SwiGLU(c.d_model, c.mlp_hidden, tile))


def init_block(layer, c, normal, gen: torch.Generator, decay=None) -> None:
    """Random weights of one kda layer (in no_grad): projections at 1/sqrt(fan-in), the residual
    branch's output scaled down by depth, near-identity convolutions, and fla's initial gate:
    A_log = log(uniform(0, A_MAX)) per value head (0 for the bounded gate, as fla's safe gate),
    dt_bias per key channel with softplus(dt_bias) log-uniform in [DT_MIN, DT_MAX]."""
    a, D, L = layer.attn, c.d_model, c.n_layers
    for lin in (a.q_proj, a.k_proj, a.v_proj, a.b_proj, a.f_proj[0], a.g_proj[0]):
        normal(lin.weight, 1.0 / math.sqrt(D))
    for lin in (a.f_proj[1], a.g_proj[1]):
        normal(lin.weight, 1.0 / math.sqrt(lin.weight.shape[1]))
    a.g_proj[1].bias.zero_()
    normal(a.o_proj.weight, 1.0 / math.sqrt(a.value_dim * 2 * L))
    if a.use_short_conv:  # mostly the current position, a little history
        for conv in (a.q_conv1d, a.k_conv1d, a.v_conv1d):
            normal(conv.weight, 0.3 / math.sqrt(c.conv_width))
            conv.weight[:, 0, -1] += 1.0
    HV = a.v_heads
    if a.lower_bound is None:
        a.A_log.copy_(torch.log(torch.rand(HV, generator=gen).clamp_min(1e-3) * A_MAX))
    else:
        a.A_log.zero_()
    lo, hi = math.log(DT_MIN), math.log(DT_MAX)
    dt = torch.exp(torch.rand(a.dt_bias.shape, generator=gen) * (hi - lo) + lo).clamp_min(DT_FLOOR)
    a.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
    init_swiglu(layer.mlp, D, L, normal)
