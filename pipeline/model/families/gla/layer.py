"""The gla layer (family `gla`): the token mixer of flash-linear-attention 0.6's GatedLinearAttention
(GLA) with its tensor names and shapes (docs/model-format.md), run through
`linpipe.kernels.gla`; its MLP is fla's GatedMLP (blocks.SwiGLU).

Per layer, from the normalised input a (B, T, D):

    q, k, v = conv(q_proj a), conv(k_proj a), conv(v_proj a)   # causal, depthwise, then silu
                                                                # (use_short_conv; else as they are)
    q, k    = phi(q), phi(k)                                    # feature_map: identity, relu, ...
    g       = max(logsigmoid(gk_proj a) / gate_normalizer, clamp_min)  # (H, K): a gate per key
    o       = gla(q, k, v, g)                                   # S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T
    o       = RMSNorm(o) * silu(g_proj a)    (use_gate, fla's use_output_gate; RMSNorm alone without)

gk_proj is low rank: D -> gate_rank -> HK, the second with a bias (fla's nn.Sequential, its
tensors `gk_proj.0.weight`, `gk_proj.1.weight`, `gk_proj.1.bias`). The carried state per
layer is the GLA state S (H, K, V) and, with the convolutions, the window of their last W-1
inputs (q, k, v concatenated: (W-1, 2HK + HV)), as the delta-rule kinds carry them.

With grouped key/value heads (n_kv_heads, fla's num_kv_heads) k, v, their convolutions and
gk_proj's output have H_kv heads (the window (W-1, HK + H_kv (K + V))); after the convolution
and the gate's logsigmoid each is repeated to H heads in fla's order (query head j reads kv
head j // (H / H_kv)) and the kernel runs with H heads, so the state stays (H, K, V).

Shapes: B batch, T positions, D = d_model, H heads, K = head_dim, V = K * expand_v, r = gate_rank.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from linpipe.kernels.gla import gla
from linpipe.kernels.gla import span_parts as gla_span_parts
from linpipe.model.blocks import GatedRMSNorm, Layer, ShortConv, SwiGLU, causal_conv, init_swiglu
from linpipe.model.families.delta_net.layer import DeltaAttention
from linpipe.model.families.fla_keys import has_conv, key_dim, value_dim
from linpipe.model.rows import linear, map_rows, row_tile

# q and k's feature maps, by the names config "feature_map" takes (families/gla: FEATURE_MAPS)
FEATURE_MAPS = {"identity": lambda x: x, "relu": F.relu, "sigmoid": torch.sigmoid, "silu": F.silu}


class GLAAttention(nn.Module):
    """The token mixer of a gla layer; o_proj is applied by Layer.finish. Its state: {"S" (B, H, K,
    V), "conv" (B, W-1, HK + H_kv (K + V)) with the short convolutions}; its split is the delta
    rule's (families/delta_net/split.py) through the same methods, with GLA's span_parts."""

    def __init__(self, c, tile: int):
        super().__init__()
        o = c.layer
        D, H, KV, K, V = c.d_model, c.n_heads, o.n_kv_heads or c.n_heads, key_dim(c), value_dim(c)
        self.v_heads, self.kv_heads, self.head_dim, self.head_v_dim = H, KV, K, V
        self.tile = tile  # rows of the position-wise ops' tiles in CPU inference
        self.q_proj = nn.Linear(D, H * K, bias=False)
        self.k_proj = nn.Linear(D, KV * K, bias=False)
        self.v_proj = nn.Linear(D, KV * V, bias=False)
        self.g_proj = nn.Linear(D, H * V, bias=False) if o.use_gate else None
        self.use_short_conv = o.use_short_conv
        self.carries_window = has_conv(c)  # W > 1: the window is part of the state
        if o.use_short_conv:
            self.q_conv1d = ShortConv(H * K, c.conv_width)
            self.k_conv1d = ShortConv(KV * K, c.conv_width)
            self.v_conv1d = ShortConv(KV * V, c.conv_width)
        self.gk_proj = nn.Sequential(nn.Linear(D, o.gate_rank, bias=False), nn.Linear(o.gate_rank, KV * K))
        self.gate_normalizer, self.clamp_min = o.gate_normalizer, o.clamp_min
        self.phi = FEATURE_MAPS[o.feature_map]
        self.g_norm = GatedRMSNorm(V, c.norm_eps)
        self.o_proj = nn.Linear(H * V, D, bias=False)

    def base_decay(self) -> list[float]:
        """Per head: the geometric mean over its keys of the decay where gk_proj's first
        projection gives 0 (the bias alone), exp(max(logsigmoid(bias) / normalizer, clamp_min));
        a query head has its kv head's."""
        with torch.no_grad():
            g = F.logsigmoid(self.gk_proj[1].bias.double()) / self.gate_normalizer
            if self.clamp_min is not None:
                g = g.clamp(min=self.clamp_min)
            decay = torch.exp(g.view(self.kv_heads, -1).mean(-1))
            return decay.repeat_interleave(self.v_heads // self.kv_heads).tolist()

    def _activate(self, x, side):
        """Rows of the projections x (N, HK + H_kv (K + V)) after the conv and of project's side
        rows -> q, k (N, H, K), v (N, H, V), the log-gates (N, H, K): k, v and the gates repeated
        per group of query heads."""
        N, H, KV, K = x.shape[0], self.v_heads, self.kv_heads, self.head_dim
        if self.use_short_conv:
            x = F.silu(x)
        q = self.phi(x[:, :H * K]).reshape(N, H, K)
        k = self.phi(x[:, H * K:(H + KV) * K]).reshape(N, KV, K)
        v = x[:, (H + KV) * K:].reshape(N, KV, self.head_v_dim)
        g = F.logsigmoid(side[:, :KV * K]) / self.gate_normalizer
        if self.clamp_min is not None:
            g = g.clamp(min=self.clamp_min)
        g = g.reshape(N, KV, K)
        if KV != H:  # fla's (h g) order: query head j reads kv head j // G
            k, v, g = (t.repeat_interleave(H // KV, dim=1) for t in (k, v, g))
        return q, k, v, g

    def _normed(self, o, g):
        """Rows of the kernel's output o (N, H, V) and the output gate's values (N, HV) or None ->
        g_norm's (N, HV)."""
        N = o.shape[0]
        g = None if g is None else g.reshape(N, self.v_heads, self.head_v_dim)
        return self.g_norm(o, g).reshape(N, -1)

    def project(self, a):
        """Normalised inputs a (B, T, D) -> (x (B, T, HK + H_kv (K + V)): the q, k, v projections
        before the conv; side (B*T, H_kv K [+ HV]): gk_proj's logits and g_proj's rows). The
        delta rule's interface, which the split (families/delta_net/split.py) runs."""
        B, T, D = a.shape
        tile = row_tile(a, self.tile)
        rows = a.reshape(B * T, D)
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])  # (HK + H_kv (K + V), D)
        x = linear(rows, w, tile=tile).view(B, T, -1)
        low = linear(rows, self.gk_proj[0].weight, tile=tile)  # (B*T, r)
        side = linear(low, self.gk_proj[1].weight, tile=tile, bias=self.gk_proj[1].bias)  # (B*T, H_kv K)
        if self.g_proj is not None:
            side = torch.cat([side, linear(rows, self.g_proj.weight, tile=tile)], dim=1)
        return x, side

    def rule_inputs(self, x, side, window):
        """project's (x, side) after the conv window (B, W-1, HK + H_kv (K + V)) -> ((q, k, v, None,
        log_gate), each (B, T, H, ...), the new window): the delta rule's tuple, without its beta."""
        B, T = x.shape[:2]
        if self.use_short_conv:
            taps = torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight])[:, 0]
            x, window = causal_conv(x, window, taps)
        got = map_rows(self._activate, row_tile(x, self.tile), x.reshape(B * T, -1), side)
        q, k, v, g = (t.view(B, T, *t.shape[1:]) for t in got)
        return (q, k, v, None, g), window

    def gate_rows(self, side):
        """The output gate's pre-activations (B*T, HV) in project's side rows, None without use_gate."""
        return side[:, self.kv_heads * self.head_dim:] if self.g_proj is not None else None

    # the kernel's output o (B, T, H, V) and gate_rows -> (B, T, HV) after g_norm (_normed) and the gate
    output = DeltaAttention.output

    def span_parts(self, q, k, v, beta, log_gate, before=None):
        """GLA's summary of a span (a diagonal M, no beta; linpipe.kernels.gla.stages), for the split."""
        return gla_span_parts(q, k, v, log_gate, before=before)

    def empty_window(self, a):
        """The window of a layer whose convolution carries none: (B, 0, HK + H_kv (K + V))."""
        K, V = self.head_dim, self.head_v_dim
        return a.new_zeros((a.shape[0], 0, self.v_heads * K + self.kv_heads * (K + V)))

    def forward(self, a, state: dict, scratch=None):
        """Normalised inputs a (B, T, D) after the state -> (o (B, T, HV) before o_proj, the state
        after)."""
        x, side = self.project(a)
        window = state["conv"] if self.carries_window else self.empty_window(a)
        (q, k, v, _, g), window = self.rule_inputs(x, side, window)
        o, S = gla(q, k, v, g, initial_state=state["S"], output_final_state=True)
        after = {"S": S, **({"conv": window} if self.carries_window else {})}
        return self.output(o, self.gate_rows(side)), after


def make_block(c, tile: int) -> Layer:
    return Layer(c.d_model, c.norm_eps, GLAAttention(c, tile), SwiGLU(c.d_model, c.mlp_hidden, tile))


def init_block(layer, c, normal, gen: torch.Generator, decay=None) -> None:
    """Random weights of one gla layer (in no_grad): projections at 1/sqrt(fan-in), the residual
    branches' outputs scaled down by depth, near-identity convolutions, and gates that start
    around decays of 1 - 1/16 to 1 - 1/256 per key."""
    a, D, L = layer.attn, c.d_model, c.n_layers
    for lin in (a.q_proj, a.k_proj, a.v_proj, a.g_proj, a.gk_proj[0]):
        if lin is not None:
            normal(lin.weight, 1.0 / math.sqrt(lin.weight.shape[1]))
    normal(a.gk_proj[1].weight, 1.0 / math.sqrt(c.layer.gate_rank))
    decay = 1 - 2.0 ** -(4 + 4 * torch.rand(a.gk_proj[1].bias.shape, generator=gen, dtype=torch.float64))
    a.gk_proj[1].bias.copy_(torch.logit(decay ** c.layer.gate_normalizer).float())
    normal(a.o_proj.weight, 1.0 / math.sqrt(a.o_proj.weight.shape[1] * 2 * L))
    if a.use_short_conv:  # mostly the current position, a little history
        for conv in (a.q_conv1d, a.k_conv1d, a.v_conv1d):
            normal(conv.weight, 0.3 / math.sqrt(c.conv_width))
            conv.weight[:, 0, -1] += 1.0
    init_swiglu(layer.mlp, D, L, normal)
