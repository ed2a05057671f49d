"""The delta-rule layers (families delta_net and gated_deltanet): the attention and the SwiGLU MLP
of flash-linear-attention 0.6's DeltaNet and GatedDeltaNet blocks, with their tensor names and
shapes (docs/model-format.md), run through `linpipe.kernels.delta_rule`.

Per layer, from the normalised input a (B, T, D):

    q, k, v = silu(conv(q_proj a)), silu(conv(k_proj a)), silu(conv(v_proj a))  # causal, depthwise
    q, k    = q / |q|, k / |k|                                                 # per head
    beta    = sigmoid(b_proj a)            (x 2 with allow_neg_eigval)
    g       = -exp(A_log) * softplus(a_proj a + dt_bias)   (gated_deltanet; none for delta_net)
    o       = delta_rule(q, k, v, beta, g)  then  RMSNorm(o) * silu(g_proj a)  (the gate: use_gate)

With grouped value heads (gated_deltanet's n_v_heads, fla's num_v_heads) v, beta, the gate, the
output and its norm have HV > H heads, each query/key head serving G = HV / H of them: q and k
are repeated per group in fla's order (value head j reads query/key head j // G), and the rule
runs with HV heads, so its state algebra (and the split's) is the one of HV plain heads.

The carried state per layer is the rule's S (HV, K, V) and the window of the last W-1 inputs of
the three convolutions, concatenated (q, k, v) into one (W-1, 2HK + HV V) array.

Shapes: B batch, T positions, D = d_model, H query/key heads, HV value heads (H without grouped
value heads), K = head_dim, V = K * expand_v, M = mlp_hidden.
In CPU inference the position-wise ops run on fixed row tiles (linpipe.model.rows), as in the
linear-attention layers, so a position's result does not depend on what shares its call.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from linpipe.kernels.delta_rule import delta_rule, span_parts
from linpipe.model.blocks import GatedRMSNorm, Layer, ShortConv, SwiGLU, causal_conv, init_swiglu, l2norm
from linpipe.model.families.fla_keys import has_conv, key_dim, value_dim
from linpipe.model.rows import linear, map_rows, row_tile

# fla's initialisation of the gate's time steps: dt log-uniform in [DT_MIN, DT_MAX], floored
DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 0.1, 1e-4
A_MAX = 16.0  # A = exp(A_log) starts uniform in (0, A_MAX)


class DeltaAttention(nn.Module):
    """The token mixer of a delta-rule layer; o_proj is applied by Layer.finish. Its state:
    {"S" (B, HV, K, V), "conv" (B, W-1, 2HK + HV V) with the short convolutions}."""

    # the kernel of the rule and of its span summaries (KDA's layer sets its own)
    rule = staticmethod(delta_rule)
    stage_parts = staticmethod(span_parts)

    def __init__(self, c, tile: int):
        super().__init__()
        o = c.layer
        D, H, HV, K, V = c.d_model, c.n_heads, c.spec.v_heads(c), key_dim(c), value_dim(c)
        # v_heads: the rule's and the state's heads; qk_heads: q and k's
        self.v_heads, self.qk_heads, self.head_dim, self.head_v_dim = HV, H, K, V
        self.key_dim, self.value_dim = H * K, HV * V
        self.gated = c.spec.gated
        self.allow_neg_eigval = o.allow_neg_eigval
        self.tile = tile  # rows of the position-wise ops' tiles in CPU inference
        self.q_proj = nn.Linear(D, H * K, bias=False)
        self.k_proj = nn.Linear(D, H * K, bias=False)
        self.v_proj = nn.Linear(D, HV * V, bias=False)
        if self.gated:
            self.a_proj = nn.Linear(D, HV, bias=False)
            self.A_log = nn.Parameter(torch.zeros(HV))
            self.dt_bias = nn.Parameter(torch.zeros(HV))
        self.b_proj = nn.Linear(D, HV, bias=False)
        if o.use_short_conv:
            self.q_conv1d = ShortConv(H * K, c.conv_width)
            self.k_conv1d = ShortConv(H * K, c.conv_width)
            self.v_conv1d = ShortConv(HV * V, c.conv_width)
        self.use_short_conv = o.use_short_conv
        self.carries_window = has_conv(c)  # W > 1: the window is part of the state
        self.g_proj = nn.Linear(D, HV * V, bias=False) if o.use_gate else None
        self.o_norm = GatedRMSNorm(V, c.norm_eps)
        self.o_proj = nn.Linear(HV * V, D, bias=False)

    def base_decay(self) -> list[float]:
        """Per (value) head: the decay where a_proj gives 0, exp(-exp(A_log) softplus(dt_bias)); 1 for
        delta_net (no decay)."""
        with torch.no_grad():
            if not self.gated:
                return [1.0] * self.v_heads
            return torch.exp(-self.A_log.double().exp() * F.softplus(self.dt_bias.double())).tolist()

    def _side_weight(self):
        """b_proj, a_proj (gated) and g_proj (use_gate) stacked for one matmul: (HV [+ HV] [+ HV V],
        D)."""
        parts = [self.b_proj.weight]
        if self.gated:
            parts.append(self.a_proj.weight)
        if self.g_proj is not None:
            parts.append(self.g_proj.weight)
        return torch.cat(parts)

    def _activate(self, x, side):
        """Rows of the conv's output x (N, 2HK + HV V) and the side projections (N, ...) -> q, k
        (N, HV, K) L2-normalised (repeated per value-head group), v (N, HV, V), beta (N, HV),
        then the log-gates (N, HV) if gated."""
        N, H, HV, K, V = x.shape[0], self.qk_heads, self.v_heads, self.head_dim, self.head_v_dim
        x = F.silu(x)
        q = l2norm(x[:, :H * K].reshape(N, H, K))
        k = l2norm(x[:, H * K:2 * H * K].reshape(N, H, K))
        if HV != H:  # fla's (h g) order: value head j reads query/key head j // G
            q, k = q.repeat_interleave(HV // H, dim=1), k.repeat_interleave(HV // H, dim=1)
        v = x[:, 2 * H * K:].reshape(N, HV, V)
        beta = torch.sigmoid(side[:, :HV])
        if self.allow_neg_eigval:
            beta = beta * 2.0
        if not self.gated:
            return q, k, v, beta
        g = -self.A_log.float().exp() * F.softplus(side[:, HV:2 * HV] + self.dt_bias)
        return q, k, v, beta, g

    def _normed(self, o, g):
        """Rows of the rule's output o (N, HV, V) and the output gate's values (N, HV V) or None ->
        o_norm's (N, HV V)."""
        N = o.shape[0]
        g = None if g is None else g.reshape(N, self.v_heads, self.head_v_dim)
        return self.o_norm(o, g).reshape(N, -1)

    def project(self, a):
        """Normalised inputs a (B, T, D) -> (x (B, T, 2HK + HV V): the q, k, v projections before
        the conv; side (B*T, HV [+ HV] [+ HV V]): the b_proj, a_proj and g_proj rows)."""
        B, T, D = a.shape
        tile = row_tile(a, self.tile)
        rows = a.reshape(B * T, D)
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])  # (2HK + HV V, D)
        x = linear(rows, w, tile=tile).view(B, T, -1)  # (B, T, 2HK + HV V)
        return x, linear(rows, self._side_weight(), tile=tile)

    def rule_inputs(self, x, side, window):
        """project's (x, side) after the conv window (B, W-1, 2HK + HV V) -> ((q, k, v, beta,
        log_gate or None), each (B, T, HV, ...), the new window)."""
        B, T = x.shape[:2]
        if self.use_short_conv:
            taps = torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight])[:, 0]
            x, window = causal_conv(x, window, taps)
        got = map_rows(self._activate, row_tile(x, self.tile), x.reshape(B * T, -1), side)
        q, k, v, beta = (t.view(B, T, *t.shape[1:]) for t in got[:4])
        return (q, k, v, beta, got[4].view(B, T, -1) if self.gated else None), window

    def gate_rows(self, side):
        """The output gate's pre-activations (B*T, HV V) in project's side rows, None without use_gate."""
        return side[:, self.v_heads * (2 if self.gated else 1):] if self.g_proj is not None else None

    def output(self, o, g_rows):
        """The rule's output o (B, T, HV, V) and gate_rows -> (B, T, HV V) after o_norm and the gate."""
        B, T = o.shape[:2]
        rows = o.reshape(B * T, self.v_heads, self.head_v_dim)
        return map_rows(self._normed, row_tile(o, self.tile), rows, g_rows).view(B, T, -1)

    def span_parts(self, q, k, v, beta, log_gate, before=None):
        """The stages' summary of a span (the kernel's stages), for the split."""
        return self.stage_parts(q, k, v, beta, log_gate=log_gate, before=before)

    def empty_window(self, a):
        """The window of a layer whose convolution carries none: (B, 0, 2HK + HV V)."""
        return a.new_zeros((a.shape[0], 0, 2 * self.key_dim + self.value_dim))

    def forward(self, a, state: dict, scratch=None):
        """Normalised inputs a (B, T, D) after the state -> (o (B, T, HV V) before o_proj, the
        state after)."""
        x, side = self.project(a)
        window = state["conv"] if self.carries_window else self.empty_window(a)
        (q, k, v, beta, log_gate), window = self.rule_inputs(x, side, window)
        o, S = self.rule(q, k, v, beta, log_gate=log_gate, initial_state=state["S"], output_final_state=True)
        after = {"S": S, **({"conv": window} if self.carries_window else {})}
        return self.output(o, self.gate_rows(side)), after


def make_block(c, tile: int) -> Layer:
    return Layer(c.d_model, c.norm_eps, DeltaAttention(c, tile), SwiGLU(c.d_model, c.mlp_hidden, tile))


def init_block(layer, c, normal, gen: torch.Generator, decay=None) -> None:
    """Random weights of one delta-rule layer (in no_grad): projections at 1/sqrt(fan-in), the
    residual branches' outputs scaled down by depth, near-identity convolutions, and fla's
    initial A_log and dt_bias."""
    a, D, L = layer.attn, c.d_model, c.n_layers
    for lin in (a.q_proj, a.k_proj, a.v_proj, a.b_proj, a.g_proj, getattr(a, "a_proj", None)):
        if lin is not None:
            normal(lin.weight, 1.0 / math.sqrt(D))
    normal(a.o_proj.weight, 1.0 / math.sqrt(a.value_dim * 2 * L))
    if a.use_short_conv:  # mostly the current position, a little history
        for conv in (a.q_conv1d, a.k_conv1d, a.v_conv1d):
            normal(conv.weight, 0.3 / math.sqrt(c.conv_width))
            conv.weight[:, 0, -1] += 1.0
    if a.gated:
        H = a.v_heads
        a.A_log.copy_(torch.log(torch.rand(H, generator=gen).clamp_min(1e-3) * A_MAX))
        lo, hi = math.log(DT_MIN), math.log(DT_MAX)
        dt = torch.exp(torch.rand(H, generator=gen) * (hi - lo) + lo).clamp_min(DT_FLOOR)
        a.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
    init_swiglu(layer.mlp, D, L, normal)
