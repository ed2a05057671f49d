"""The mlstm block (family `mlstm`): transformers' xLSTMBlock (models/xlstm/modeling_xlstm.py,
weight_mode "single") with its tensor names, its mLSTM cell through linpipe.kernels.mlstm.

Per block, from the block's input h:

    a          = norm_mlstm(h)                           # RMSNorm (+ bias with use_bias)
    q, k, v, o = q a, k a, v a, ogate_preact a           # (B, T, H, K), (.., K), (.., V), (B, T, HV)
    i, f       = cap tanh(igate_preact a / cap), same f  # (B, T, H), cap = gate_soft_cap
    m_t        = max(logsigmoid(f_t) + m_{t-1}, i_t)     # per head: the stabiliser
    C_t        = exp(logsigmoid(f_t) + m_{t-1} - m_t) C_{t-1} + exp(i_t - m_t) k_t v_t^T,  n alike
    y_t        = K^-1/2 C_t^T q_t / (max(|K^-1/2 n_t . q_t|, exp(-m_t)) + eps)
    h         += out_proj(sigmoid(o) * multihead_norm(y))  # a layer norm per head, then weight (+ bias)
    h         += proj_down(silu(proj_up_gate b) * proj_up b),  b = norm_ffn(h)

The carried state per block: C (H, K, V), n (H, K) and m (H,) (float64, as the chunked form
carries it), from zeros (m = 0, transformers' zero state). K = int(d_model * qk_dim_factor) / H
and V = int(d_model * v_dim_factor) / H may differ. In CPU inference the position-wise ops run
on fixed row tiles (linpipe.model.rows); with autograd the mLSTM runs its differentiable form
(linpipe.kernels.mlstm.mlstm dispatches).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from linpipe.kernels.mlstm import mlstm
from linpipe.model.blocks import RMSNorm, scratch_of
from linpipe.model.families.mlstm import head_dims
from linpipe.model.rows import linear, map_rows, row_tile

# linpipe's initial gates: input gates around exp(-2) with weights of 0.1 / sqrt(D), so that an
# untrained model's state matters (transformers starts them at exp(-10) with zero weights, the
# multi-head norm rescaling the small outputs), forget gates' biases spread over the heads as
# transformers' (memories of about 20 to 400 positions)
IGATE_BIAS, FGATE_BIAS = -2.0, (3.0, 6.0)


def soft_cap(x, cap):
    """cap tanh(x / cap) (transformers' soft_cap; cap None: x)."""
    return x if cap is None else torch.tanh(x / cap) * cap


class Norm(RMSNorm):
    """transformers' xLSTMRMSNorm: RMSNorm with its weight and, with use_bias, a bias."""

    def __init__(self, dim: int, eps: float, bias: bool):
        super().__init__(dim, eps)
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x, out=None):  # x (..., D)
        y = super().forward(x, out=out)
        return y if self.bias is None else y.add_(self.bias)


class MultiHeadNorm(nn.Module):
    """transformers' xLSTMMultiHeadLayerNorm: a layer norm over each head's values (no affine),
    then one weight (and bias) over the heads' values side by side."""

    def __init__(self, heads: int, head_dim: int, eps: float, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(heads * head_dim))
        self.bias = nn.Parameter(torch.zeros(heads * head_dim)) if bias else None
        self.eps = eps

    def forward(self, y):  # y (N, H, V) -> (N, H V)
        mean = y.mean(-1, keepdim=True)
        y = (y - mean) * torch.rsqrt(y.var(-1, keepdim=True, unbiased=False) + self.eps)
        y = y.reshape(y.shape[0], -1) * self.weight
        return y if self.bias is None else y + self.bias


class MlstmLayer(nn.Module):
    """transformers' xLSTMLayer (the block's `mlstm_layer`) up to out_proj's input. Its state:
    {"C" (B, H, K, V), "n" (B, H, K), "m" (B, H)}."""

    def __init__(self, c, tile: int):
        super().__init__()
        o, D, H = c.layer, c.d_model, c.n_heads
        K, V = head_dims(c)
        self.n_heads, self.head_dim, self.head_v_dim = H, K, V
        self.gate_cap, self.eps = o.gate_soft_cap, o.eps
        self.tile = tile  # rows of the position-wise ops' tiles in CPU inference
        self.q = nn.Linear(D, H * K, bias=o.use_bias)
        self.k = nn.Linear(D, H * K, bias=o.use_bias)
        self.v = nn.Linear(D, H * V, bias=o.use_bias)
        self.ogate_preact = nn.Linear(D, H * V, bias=o.use_bias)
        self.igate_preact = nn.Linear(D, H)  # the gates always have a bias
        self.fgate_preact = nn.Linear(D, H)
        self.multihead_norm = MultiHeadNorm(H, V, c.norm_eps, o.use_bias)
        self.out_proj = nn.Linear(H * V, D, bias=o.use_bias)

    @property
    def parts(self) -> tuple:
        return self.q, self.k, self.v, self.ogate_preact, self.igate_preact, self.fgate_preact

    def base_decay(self) -> list[float]:
        """Per head: the forget gate where fgate_preact's weights give 0, sigmoid(capped bias)."""
        with torch.no_grad():
            return torch.sigmoid(soft_cap(self.fgate_preact.bias.double(), self.gate_cap)).tolist()

    def _gates(self, rows):
        """Projected rows (n, 2HK + 2HV + 2H) -> the capped gate preactivations (n, 2H)."""
        return soft_cap(rows[:, -2 * self.n_heads:], self.gate_cap)

    def project(self, a):
        """Normalised inputs a (B, T, D) -> q, k (B, T, H, K), v (B, T, H, V), the output gate's
        preactivations o (B*T, HV), the capped input and forget gates' (B, T, H) each."""
        B, T, D = a.shape
        H, K, V = self.n_heads, self.head_dim, self.head_v_dim
        w = torch.cat([p.weight for p in self.parts])
        bias = torch.cat([p.bias if p.bias is not None else p.weight.new_zeros(p.weight.shape[0])
                          for p in self.parts])  # the gates always have one
        tile = row_tile(a, self.tile)
        rows = linear(a.reshape(B * T, D), w, tile=tile, bias=bias)  # (B*T, 2HK + 2HV + 2H)
        gates = map_rows(self._gates, tile, rows).view(B, T, 2, H)
        qk, hv = H * K, H * V
        q = rows[:, :qk].view(B, T, H, K)
        k = rows[:, qk:2 * qk].view(B, T, H, K)
        v = rows[:, 2 * qk:2 * qk + hv].view(B, T, H, V)
        return q, k, v, rows[:, 2 * qk + hv:2 * qk + 2 * hv], gates[:, :, 0], gates[:, :, 1]

    def _out_rows(self, y, o):
        """Rows of the cell's output y (n, H, V) and the output gate's preactivations o (n, HV) ->
        (n, HV): sigmoid(o) times the multi-head norm of y."""
        return torch.sigmoid(o) * self.multihead_norm(y)

    def output(self, y, o):
        """The cell's y (B, T, H, V) and o rows (B*T, HV) -> (B, T, HV), out_proj's input."""
        B, T = y.shape[:2]
        rows = y.reshape(B * T, self.n_heads, -1)
        return map_rows(self._out_rows, row_tile(y, self.tile), rows, o).view(B, T, -1)

    def forward(self, a, state: dict, scratch=None):
        """Normalised inputs a (B, T, D) after the state -> (out_proj's input (B, T, HV), the state
        after)."""
        q, k, v, o, i, f = self.project(a)
        y, (C, n, m) = mlstm(q, k, v, i, f, eps=self.eps, initial_state=(state["C"], state["n"], state["m"]),
                             output_final_state=True)
        return self.output(y, o), {"C": C, "n": n, "m": m.double()}


class FeedForward(nn.Module):
    """transformers' xLSTMFeedForward: proj_down(silu(proj_up_gate b) * proj_up b)."""

    def __init__(self, d_model: int, hidden: int, bias: bool, tile: int):
        super().__init__()
        self.proj_up_gate = nn.Linear(d_model, hidden, bias=bias)
        self.proj_up = nn.Linear(d_model, hidden, bias=bias)
        self.proj_down = nn.Linear(hidden, d_model, bias=bias)
        self.tile = tile

    def forward(self, b, residual):
        """residual + the FFN of b; b, residual (B, T, D)."""
        B, T, D = b.shape
        M = self.proj_up.weight.shape[0]
        tile = row_tile(b, self.tile)
        bias = None if self.proj_up.bias is None else torch.cat([self.proj_up_gate.bias, self.proj_up.bias])
        w = torch.cat([self.proj_up_gate.weight, self.proj_up.weight])
        gu = linear(b.reshape(B * T, D), w, tile=tile, bias=bias)  # (B*T, 2M)
        x = map_rows(lambda r: F.silu(r[:, :M]) * r[:, M:], tile, gu)  # (B*T, M)
        return linear(x, self.proj_down.weight, tile=tile, bias=self.proj_down.bias,
                      residual=residual.reshape(B * T, D)).view(B, T, D)


class MlstmBlock(nn.Module):
    """transformers' xLSTMBlock: h + mlstm_layer(norm_mlstm h), then + ffn(norm_ffn h)."""

    def __init__(self, c, tile: int):
        super().__init__()
        o, D = c.layer, c.d_model
        self.norm_mlstm = Norm(D, c.norm_eps, o.use_bias)
        self.mlstm_layer = MlstmLayer(c, tile)
        self.norm_ffn = Norm(D, c.norm_eps, o.use_bias)
        self.ffn = FeedForward(D, c.mlp_hidden, o.use_bias, tile)

    @property
    def attn(self) -> MlstmLayer:
        """The token mixer under the name blocks.Layer gives it (the split, model info's decays)."""
        return self.mlstm_layer

    @property
    def attn_norm(self) -> Norm:
        """The pre-norm under blocks.Layer's name (the split runs it)."""
        return self.norm_mlstm

    def forward(self, h, state: dict):
        """h (B, T, D) after the block's state -> (h after, the state after)."""
        B, T, D = h.shape
        scratch = scratch_of(h)
        o, state = self.mlstm_layer(self.norm_mlstm(h, out=scratch("attn_in", B, T, D)), state, scratch)
        return self.finish(h, o, scratch), state

    def finish(self, h, o, scratch=None):
        """The block after its cell's gated output o (B, T, HV): h + out_proj(o), then + FFN."""
        B, T, D = h.shape
        scratch = scratch or scratch_of(h)
        out = self.mlstm_layer.out_proj
        h = linear(o.reshape(B * T, -1), out.weight, tile=row_tile(h, self.mlstm_layer.tile), bias=out.bias,
                   residual=h.reshape(B * T, D)).view(B, T, D)
        return self.ffn(self.norm_ffn(h, out=scratch("mlp_in", B, T, D)), residual=h)


def make_block(c, tile: int) -> MlstmBlock:
    return MlstmBlock(c, tile)


def init_block(block: MlstmBlock, c, normal, gen: torch.Generator, decay=None) -> None:
    """Random weights of one block (in no_grad): projections at 1/sqrt(fan-in), the residual
    branches scaled down by depth, biases 0, norms 1, the gates as IGATE_BIAS and FGATE_BIAS say."""
    m, f, D, L = block.mlstm_layer, block.ffn, c.d_model, c.n_layers
    for lin in (m.q, m.k, m.v, m.ogate_preact, f.proj_up_gate, f.proj_up):
        normal(lin.weight, 1.0 / math.sqrt(D))
    normal(m.out_proj.weight, 1.0 / math.sqrt(m.out_proj.weight.shape[1] * 2 * L))
    normal(f.proj_down.weight, 1.0 / math.sqrt(f.proj_down.weight.shape[1] * 2 * L))
    for lin in (m.igate_preact, m.fgate_preact):
        normal(lin.weight, 0.1 / math.sqrt(D))
    m.igate_preact.bias.fill_(IGATE_BIAS)
    m.fgate_preact.bias.copy_(torch.linspace(*FGATE_BIAS, m.n_heads))
    for lin in (m.q, m.k, m.v, m.ogate_preact, m.out_proj, f.proj_up_gate, f.proj_up, f.proj_down):
        if lin.bias is not None:
            lin.bias.zero_()
    for norm in (block.norm_mlstm, block.norm_ffn, m.multihead_norm):
        norm.weight.fill_(1.0)
        if norm.bias is not None:
            norm.bias.zero_()
