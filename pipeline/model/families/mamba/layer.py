"""The mamba layer (family `mamba`): Mamba v1's block (fla 0.6's and transformers' MambaBlock: a
pre-norm, the Mamba mixer, the residual; no MLP) with their tensor names and shapes
(docs/model-format.md), its selective scan run through linpipe.kernels.mamba.

Per block, from the block's input h, with a = RMSNorm(h):

    x, z   = in_proj(a)                                  # (I), (I)
    u      = silu(conv1d(x) + bias)                      # causal, depthwise, width W
    r, B, C = x_proj(u)                                  # (R), (N), (N); falcon_mamba: each RMS-normed
    dt     = softplus(dt_proj(r) + dt_proj.bias)         # (I): a time step per channel
    h_t    = exp(dt_t A) h_{t-1} + dt_t u_t B_t^T        # per channel and state: h (I, N), A = -exp(A_log)
    y_t    = h_t C_t + D u_t
    h     += out_proj(y * silu(z))

The carried state per block is h (I, N) and the conv window of the last W-1 rows of x (W-1, I).
The mixer runs on its own (`MambaMixer.forward(a, state) -> (y * silu(z), state)`; out_proj is
`MambaMixer.out`), so a bidirectional family can run it twice.

Shapes: B batch, T positions, D = d_model, I = intermediate_size, N = state_size, R = dt_rank,
W = conv_width. In CPU inference the position-wise ops run on fixed row tiles (linpipe.model.rows),
so a position's result does not depend on what shares its call.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from linpipe.kernels.mamba import selective_scan
from linpipe.model.blocks import MixerBlock, causal_conv
from linpipe.model.rows import linear, map_rows, row_tile

# Mamba's initialisation of the time steps: dt log-uniform in [DT_MIN, DT_MAX], floored; dt_proj's
# weight uniform in +-R^-0.5
DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 0.1, 1e-4


class Conv1d(nn.Module):
    """The depthwise conv's taps (I, 1, W) and bias (I,) as torch's Conv1d holds them;
    [:, 0, W-1] hits the current position."""

    def __init__(self, channels: int, width: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(channels, 1, width))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None


def _rms(x, eps):
    """A weightless RMS norm over the last axis (falcon_mamba's on dt's input, B and C)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class MambaMixer(nn.Module):
    """Mamba v1's mixer (the block's `mixer`). Its state: {"h" (B, I, N), "conv" (B, W-1, I)
    when W > 1}."""

    def __init__(self, c, tile: int):
        super().__init__()
        o = c.layer
        D, Ci, N, R = c.d_model, o.intermediate_size, o.state_size, o.dt_rank
        self.inner, self.state_size, self.dt_rank, self.width = Ci, N, R, c.conv_width
        self.rms_eps = o.mixer_rms_eps  # falcon_mamba's norms on r, B and C (None: none)
        self.tile = tile  # rows of the position-wise ops' tiles in CPU inference
        self.in_proj = nn.Linear(D, 2 * Ci, bias=o.use_bias)
        self.conv1d = Conv1d(Ci, c.conv_width, o.use_conv_bias)
        self.x_proj = nn.Linear(Ci, R + 2 * N, bias=False)
        self.dt_proj = nn.Linear(R, Ci, bias=True)
        self.A_log = nn.Parameter(torch.zeros(Ci, N))
        self.D = nn.Parameter(torch.ones(Ci))
        self.out_proj = nn.Linear(Ci, D, bias=o.use_bias)

    def A(self):
        """A = -exp(A_log) (I, N)."""
        return -torch.exp(self.A_log.float())

    def base_decay(self) -> list[float]:
        """Per channel: the decay of its slowest state where dt_proj's input is 0,
        exp(-min_n exp(A_log) softplus(dt_proj.bias))."""
        with torch.no_grad():
            dt = F.softplus(self.dt_proj.bias.double())
            return torch.exp(-self.A_log.double().exp().min(-1).values * dt).tolist()

    def project(self, a):
        """Normalised inputs a (B, T, D) -> (x (B, T, I) before the conv, the gate's z (B*T, I))."""
        Bn, T, Dm = a.shape
        xz = linear(a.reshape(Bn * T, Dm), self.in_proj.weight, tile=row_tile(a, self.tile),
                    bias=self.in_proj.bias)
        return xz[:, :self.inner].reshape(Bn, T, self.inner), xz[:, self.inner:]

    def _scan_rows(self, x):
        """Rows of the conv's output x (n, I) -> u = silu(x) (n, I), delta = dt_proj(r) before its
        bias (n, I), B and C (n, N)."""
        u = F.silu(x)
        R, N = self.dt_rank, self.state_size
        dbc = F.linear(u, self.x_proj.weight)  # (n, R + 2N)
        r, B, C = dbc[:, :R], dbc[:, R:R + N], dbc[:, R + N:]
        if self.rms_eps is not None:
            r, B, C = _rms(r, self.rms_eps), _rms(B, self.rms_eps), _rms(C, self.rms_eps)
        return u, F.linear(r, self.dt_proj.weight), B, C

    def scan_inputs(self, x, window):
        """project's x after the conv window (B, W-1, I) -> ((u, delta (B, T, I), B, C (B, T, N)),
        the new window)."""
        Bn, T = x.shape[:2]
        if self.width > 1:
            x, window = causal_conv(x, window, self.conv1d.weight[:, 0])
        else:
            x = x * self.conv1d.weight[:, 0, 0]
        if self.conv1d.bias is not None:
            x = x + self.conv1d.bias
        got = map_rows(self._scan_rows, row_tile(x, self.tile), x.reshape(Bn * T, -1))
        return tuple(t.view(Bn, T, -1) for t in got), window

    def kernel(self, u, delta, B, C, h, z=None):
        """The selective scan from h (B, I, N): (y (B, T, I) = (h_t C_t + D u_t), times silu(z)
        where z is given; h after)."""
        return selective_scan(u, delta, self.A(), B, C, D=self.D, z=z, delta_bias=self.dt_proj.bias,
                              delta_softplus=True, initial_state=h, output_final_state=True)

    def gate(self, y, z):
        """y (B, T, I) and the gate's z rows (B*T, I) -> y * silu(z) (B, T, I)."""
        Bn, T = y.shape[:2]
        got = map_rows(lambda a, b: a * F.silu(b), row_tile(y, self.tile), y.reshape(Bn * T, -1), z)
        return got.view(Bn, T, -1)

    def out(self, o, residual=None):
        """out_proj of o (B, T, I) -> (B, T, D), plus residual (B, T, D) where given."""
        Bn, T = o.shape[:2]
        res = None if residual is None else residual.reshape(Bn * T, -1)
        return linear(o.reshape(Bn * T, -1), self.out_proj.weight, tile=row_tile(o, self.tile),
                      bias=self.out_proj.bias, residual=res).view(Bn, T, -1)

    def forward(self, a, state: dict, scratch=None):
        """Normalised inputs a (B, T, D) after the state -> (y * silu(z) (B, T, I), before out_proj;
        the state after)."""
        x, z = self.project(a)
        window = state.get("conv", x.new_zeros((a.shape[0], 0, self.inner)))  # none when W = 1
        (u, delta, B, C), window = self.scan_inputs(x, window)
        y, h = self.kernel(u, delta, B, C, state["h"])
        return self.gate(y, z), {"h": h, **({"conv": window} if "conv" in state else {})}


class MambaBlock(MixerBlock):
    """Mamba v1's block: h + out_proj(mixer(norm(h))), no MLP."""

    MIXER = MambaMixer

    def finish(self, h, o, scratch=None):
        """The block after its mixer's o (B, T, I): h + out_proj(o)."""
        return self.mixer.out(o, residual=h)


def make_block(c, tile: int) -> MambaBlock:
    return MambaBlock(c, tile)


def init_block(block: MambaBlock, c, normal, gen: torch.Generator, decay=None) -> None:
    """Random weights of one mamba block (in no_grad), as Mamba initialises them: projections at
    1/sqrt(fan-in) (out_proj scaled down by depth), near-identity convolutions, dt_proj's bias the
    inverse softplus of time steps log-uniform in [DT_MIN, DT_MAX], A_log = log(1..N) per channel
    (S4D-real), D = 1."""
    m = block.mixer
    Ci, N, R = m.inner, m.state_size, m.dt_rank
    normal(m.in_proj.weight, 1.0 / math.sqrt(c.d_model))
    normal(m.x_proj.weight, 1.0 / math.sqrt(Ci))
    normal(m.out_proj.weight, 1.0 / math.sqrt(Ci * c.n_layers))
    for lin in (m.in_proj, m.out_proj):
        if lin.bias is not None:
            lin.bias.zero_()
    normal(m.conv1d.weight, 0.3 / math.sqrt(c.conv_width))
    m.conv1d.weight[:, 0, -1] += 1.0
    if m.conv1d.bias is not None:
        m.conv1d.bias.zero_()
    m.dt_proj.weight.copy_((torch.rand(Ci, R, generator=gen) * 2 - 1) * R ** -0.5)
    a, b = math.log(DT_MIN), math.log(DT_MAX)
    dt = torch.exp(torch.rand(Ci, generator=gen) * (b - a) + a).clamp_min(DT_FLOOR)
    m.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus(bias) = dt
    m.A_log.copy_(torch.log(torch.arange(1, N + 1, dtype=torch.float32)).expand(Ci, N))
    m.D.fill_(1.0)
