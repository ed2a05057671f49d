"""The mamba2 layer (family `mamba2`): flash-linear-attention 0.6's Mamba2Block (a
pre-norm, the Mamba2 mixer, the residual; no MLP) with its tensor names and shapes
(docs/model-format.md), its SSD run through linear attention's kernel (linpipe.kernels).

Per block, from the block's input h, with a = RMSNorm(h):

    z, xBC, dt = in_proj(a)                              # (I), (I + 2GN), (H); I = H P
    x, B, C    = silu(conv1d(xBC) + bias)                # causal, depthwise, width W
    dt         = clamp(softplus(dt + dt_bias), dt_limit) # per head
    S_t        = exp(dt_t A) S_{t-1} + B_t (dt_t x_t)^T  # per head: S (N, P), A = -exp(A_log)
    y_t        = S_t^T C_t + D x_t
    h         += out_proj(gated_norm(y, z))              # RMSNorm per group of I/G with silu(z)

A head h reads group h // (H/G) of B and C, as the mamba_ssm kernels that fla runs on CUDA and
fla's own one-token decoding path do (fla 0.6's PyTorch prefill tiles the groups instead, h % G:
the same model only for G = 1; docs/models.md).

The SSD is linear attention's scalar-gate case: q = C, k = B, v = dt x, log-gate dt A, the
identity feature map and no normaliser, so the kernel's chunked form (or its Triton form on
CUDA) and its stages carry the state exactly across units. The carried state per block is S
(H, N, P) and the conv window of the last W-1 xBC rows (W-1, I + 2GN).

Shapes: B batch, T positions, D = d_model, H heads of P = head_dim, N = state_size, G = n_groups.
In CPU inference the position-wise ops run on fixed row tiles (linpipe.model.rows), so a
position's result does not depend on what shares its call.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from linpipe.kernels import chunk_linear_attn
from linpipe.model.blocks import MixerBlock, RMSNorm, causal_conv
from linpipe.model.families.mamba2 import conv_channels
from linpipe.model.rows import linear, map_rows, row_tile

# fla's initialisation of the time steps: dt log-uniform in [DT_MIN, DT_MAX], floored
DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 0.1, 1e-4
A_RANGE = (1.0, 16.0)  # A = exp(A_log) starts uniform in it


class Conv1d(nn.Module):
    """The depthwise conv's taps (C, 1, W) and bias (C,) as torch's Conv1d holds them (fla's
    conv1d); [:, 0, W-1] hits the current position."""

    def __init__(self, channels: int, width: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(channels, 1, width))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None


class Mamba2Mixer(nn.Module):
    """fla's Mamba2 layer (the block's `mixer`). Its state: {"S" (B, H, N, P), "conv" (B, W-1,
    I + 2GN) when W > 1}."""

    def __init__(self, c, tile: int):
        super().__init__()
        o = c.layer
        D, H, P, N, G = c.d_model, c.n_heads, o.head_dim, o.state_size, o.n_groups
        self.n_heads, self.head_dim, self.state_size, self.n_groups = H, P, N, G
        self.inner = H * P
        self.conv_dim = conv_channels(c)  # I + 2GN
        self.dt_limit = o.dt_limit
        self.rmsnorm, self.norm_before_gate, self.eps = o.rmsnorm, o.norm_before_gate, c.norm_eps
        self.tile = tile  # rows of the position-wise ops' tiles in CPU inference
        self.in_proj = nn.Linear(D, self.inner + self.conv_dim + H, bias=o.use_bias)
        self.conv1d = Conv1d(self.conv_dim, c.conv_width, o.use_conv_bias)
        self.dt_bias = nn.Parameter(torch.zeros(H))
        self.A_log = nn.Parameter(torch.zeros(H))
        self.D = nn.Parameter(torch.ones(self.inner if o.D_has_hdim else H))
        if self.rmsnorm:
            self.norm = RMSNorm(self.inner, c.norm_eps)  # its weight; the grouped norm is _normed
        self.out_proj = nn.Linear(self.inner, D, bias=o.use_bias)

    def base_decay(self) -> list[float]:
        """Per head: the decay where in_proj's dt is 0, exp(-exp(A_log) softplus(dt_bias))
        (within dt_limit)."""
        with torch.no_grad():
            lo, hi = self.dt_limit
            dt = F.softplus(self.dt_bias.double()).clamp(lo, hi)
            return torch.exp(-self.A_log.double().exp() * dt).tolist()

    def group_rows(self, t):
        """B or C rows (n, G N) -> (n, H, N): head h reads group h // (H / G)."""
        n, H, N, G = t.shape[0], self.n_heads, self.state_size, self.n_groups
        return t.reshape(n, G, 1, N).expand(n, G, H // G, N).reshape(n, H, N)

    def _ssd_rows(self, xbc, dt):
        """Rows of the conv's output xbc (n, I + 2GN) and dt's pre-activations (n, H) -> q = C,
        k = B (n, H, N), v = dt x (n, H, P), the log-gates dt A (n, H) and the skip D x (n, H, P)."""
        n, H, P, G, N = xbc.shape[0], self.n_heads, self.head_dim, self.n_groups, self.state_size
        xbc = F.silu(xbc)
        x = xbc[:, :self.inner].reshape(n, H, P)
        B = self.group_rows(xbc[:, self.inner:self.inner + G * N])
        C = self.group_rows(xbc[:, self.inner + G * N:])
        lo, hi = self.dt_limit
        dt = F.softplus(dt + self.dt_bias).clamp(lo, hi)  # (n, H)
        log_gate = dt * -self.A_log.float().exp()
        return C, B, x * dt.unsqueeze(-1), log_gate, x * self.D.view(H, -1)

    def _normed(self, y, z):
        """Rows of y + D x (n, H, P) and the gate's z (n, I) -> (n, I): fla's gated RMSNorm (per
        group of I/G values), or y * silu(z) without it."""
        n = y.shape[0]
        y = y.reshape(n, self.inner)
        if not self.rmsnorm:
            return y * F.silu(z)
        if not self.norm_before_gate:
            y = y * F.silu(z)
        g = y.view(n, self.n_groups, -1)
        y = (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)).view(n, -1) * self.norm.weight
        return y * F.silu(z) if self.norm_before_gate else y

    def project(self, a):
        """Normalised inputs a (B, T, D) -> (xbc (B, T, I + 2GN): x, B and C before the conv; the
        gate's z (B*T, I); dt's pre-activations (B*T, H))."""
        Bn, T, Dm = a.shape
        proj = linear(a.reshape(Bn * T, Dm), self.in_proj.weight, tile=row_tile(a, self.tile),
                      bias=self.in_proj.bias)
        xbc = proj[:, self.inner:self.inner + self.conv_dim].reshape(Bn, T, -1)
        return xbc, proj[:, :self.inner], proj[:, self.inner + self.conv_dim:]

    def ssd_inputs(self, xbc, dt, window):
        """project's xbc and dt after the conv window (B, W-1, I + 2GN) -> ((q, k, v, log_gate,
        skip), each (B, T, H, ...), as _ssd_rows gives them; the new window)."""
        Bn, T = xbc.shape[:2]
        xbc, window = causal_conv(xbc, window, self.conv1d.weight[:, 0])
        if self.conv1d.bias is not None:
            xbc = xbc + self.conv1d.bias
        got = map_rows(self._ssd_rows, row_tile(xbc, self.tile), xbc.reshape(Bn * T, -1), dt)
        return tuple(t.view(Bn, T, *t.shape[1:]) for t in got), window

    @staticmethod
    def kernel(q, k, v, log_gate, S):
        """The SSD of (B, T, H, ...) q, k, v and log-gates from S (B, H, N, P): (y, S after)."""
        zeros = S.new_zeros(S.shape[:3])  # the kernel's normaliser state, unused without it
        y, (S, _) = chunk_linear_attn(q, k, v, feature_map="identity", normalize=False,
                                      initial_state=(S, zeros), output_final_state=True, log_gate=log_gate)
        return y, S

    def output(self, y, z):
        """y + D x (B, T, H, P) and the gate's z rows (B*T, I) -> (B, T, I), before out_proj."""
        Bn, T = y.shape[:2]
        rows = y.reshape(Bn * T, self.n_heads, -1)
        return map_rows(self._normed, row_tile(y, self.tile), rows, z).view(Bn, T, -1)

    def forward(self, a, state: dict, scratch=None):
        """Normalised inputs a (B, T, D) after the state -> (the gated norm's output (B, T, I), before
        out_proj; the state after)."""
        xbc, gate, dt = self.project(a)
        window = state.get("conv", xbc.new_zeros((a.shape[0], 0, self.conv_dim)))  # none when W = 1
        (q, k, v, log_gate, skip), window = self.ssd_inputs(xbc, dt, window)
        y, S = self.kernel(q, k, v, log_gate, state["S"])
        return self.output(y + skip, gate), {"S": S, **({"conv": window} if "conv" in state else {})}


class Mamba2Block(MixerBlock):
    """fla's Mamba2Block: h + mixer(norm(h)) (out_proj included), no MLP."""

    MIXER = Mamba2Mixer

    def finish(self, h, o, scratch=None):
        """The block after its mixer's o (B, T, I): h + out_proj(o)."""
        B, T, D = h.shape
        out = self.mixer.out_proj
        return linear(o.reshape(B * T, -1), out.weight, tile=row_tile(h, self.mixer.tile), bias=out.bias,
                      residual=h.reshape(B * T, D)).view(B, T, D)


def make_block(c, tile: int) -> Mamba2Block:
    return Mamba2Block(c, tile)


def init_block(block: Mamba2Block, c, normal, gen: torch.Generator, decay=None) -> None:
    """Random weights of one mamba2 block (in no_grad): projections at 1/sqrt(fan-in), out_proj
    scaled down by depth, near-identity convolutions, and fla's initial A_log, dt_bias and D."""
    m = block.mixer
    normal(m.in_proj.weight, 1.0 / math.sqrt(c.d_model))
    normal(m.out_proj.weight, 1.0 / math.sqrt(m.inner * c.n_layers))
    for lin in (m.in_proj, m.out_proj):
        if lin.bias is not None:
            lin.bias.zero_()
    normal(m.conv1d.weight, 0.3 / math.sqrt(c.conv_width))
    m.conv1d.weight[:, 0, -1] += 1.0
    if m.conv1d.bias is not None:
        m.conv1d.bias.zero_()
    H = c.n_heads
    lo, hi = A_RANGE
    m.A_log.copy_(torch.log(torch.rand(H, generator=gen) * (hi - lo) + lo))
    a, b = math.log(DT_MIN), math.log(DT_MAX)
    dt = torch.exp(torch.rand(H, generator=gen) * (b - a) + a).clamp_min(DT_FLOOR)
    m.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
    m.D.fill_(1.0)
