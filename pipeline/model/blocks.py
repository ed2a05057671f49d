"""The blocks the families share: RMSNorm, the causal depthwise convolution whose window is
carried in the state (and fla's short convolution's taps), fla's gated RMSNorm, the two MLPs
(linpipe's GELU one, fla's SwiGLU) and the pre-norm layer around a token mixer (`Layer`).

In CPU inference the position-wise ops run on fixed row tiles (linpipe.model.rows), so a
position's result does not depend on what shares its call; each layer writes its temporaries as
`out=` of a `Scratch` (fresh tensors under autograd; in CPU inference per-thread buffers reused
span after span).

Shapes: B batch, T positions, D = d_model, M = mlp_hidden, W = conv_width.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from linpipe.kernels.linear_attn.scratch import Scratch
from linpipe.model.rows import linear, map_rows, row_tile

# Most positions (batch x length) per call that CPU inference keeps in reused buffers;
# bigger calls (many short records batched) allocate, so that their temporaries are freed.
INFER_BUFFERED = 16384
L2_EPS = 1e-6  # inside flash-linear-attention's l2norm of q and k: x / sqrt(sum(x^2) + eps)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x, out=None):  # x (..., D)
        r = torch.linalg.vector_norm(x, dim=-1, keepdim=True)  # (..., 1): no (..., D) square
        r = (r * x.shape[-1] ** -0.5).pow(2).add(self.eps).rsqrt()
        return torch.mul(x, r, out=out).mul_(self.weight)  # in place on a fresh product: autograd-safe


class CausalConv(nn.Module):
    """Depthwise causal convolution of width W; its window is part of the carried state."""

    def __init__(self, dim: int, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim, width))  # (D, W); [:, W-1] hits the current position

    def forward(self, a, window, out=None):  # a (B, T, D), window (B, W-1, D): the inputs before a
        return causal_conv(a, window, self.weight, out)


def causal_conv(a, window, weight, out=None):
    """a (B, T, D) after window (B, W-1, D), weight (D, W) -> (conv (B, T, D), the last W-1
    inputs). Also used without the module by the split's fold (linpipe.model.segments)."""
    T = a.shape[1]
    W = weight.shape[1]
    # Shifted multiply-adds in the (B, T, D) layout: no transposes, no concatenated copy.
    # Measured ~0.5 ms less per (2048, 128) span at 1 thread than a depthwise conv1d, whose
    # transposed output also slowed the next matmul. In-place adds into a fresh product
    # are autograd-safe (addcmul's backward does not read its output).
    # The taps as contiguous rows: a strided tap vector (weight[:, j]) kept torch's broadcast
    # multiply-add from vectorising, at 3x the time.
    taps = weight.t().contiguous()  # (W, D)
    c = torch.mul(a, taps[W - 1], out=out)  # (B, T, D)
    for j in range(W - 1):  # tap j reads the input s = W-1-j positions back
        s = W - 1 - j
        c[:, s:].addcmul_(a[:, :max(T - s, 0)], taps[j])
        c[:, :s].addcmul_(window[:, j:j + min(s, T)], taps[j])
    new_window = torch.cat([window, a[:, -(W - 1):]], dim=1)[:, -(W - 1):]  # the last W-1 inputs
    return c, new_window


class ShortConv(nn.Module):
    """A causal depthwise convolution's taps, held as torch's Conv1d holds them (C, 1, W), the
    shape of fla's ShortConvolution weight; [:, 0, W-1] hits the current position."""

    def __init__(self, channels: int, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(channels, 1, width))


class GatedRMSNorm(nn.Module):
    """fla's o_norm: RMSNorm over each head's V values, times silu of the output gate's value
    (FusedRMSNormGated with the swish activation); without a gate, RMSNorm alone."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, o, g=None):  # o (..., V), g (..., V) or None
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return o if g is None else o * F.silu(g)


def l2norm(x):
    """x (..., K) / sqrt(sum(x^2) + L2_EPS) (fla's l2norm)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)


class MLP(nn.Module):
    """linpipe's MLP: fc2(gelu(fc1 m)), the exact (erf) GELU."""

    def __init__(self, d_model: int, hidden: int, tile: int):
        super().__init__()
        self.fc1 = nn.Linear(d_model, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, d_model, bias=False)
        self.tile = tile

    def forward(self, m, residual):
        """residual + fc2(gelu(fc1(m))); m, residual (B, T, D)."""
        B, T, D = m.shape
        tile = row_tile(m, self.tile)
        g = linear(m.reshape(B * T, D), self.fc1.weight, tile=tile, gelu=True)  # (B*T, M)
        return linear(g, self.fc2.weight, tile=tile, residual=residual.reshape(B * T, D)).view(B, T, D)


class SwiGLU(nn.Module):
    """fla's GatedMLP: down_proj(silu(gate_proj m) * up_proj m)."""

    def __init__(self, d_model: int, hidden: int, tile: int):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)
        self.tile = tile

    def forward(self, m, residual):
        """residual + the MLP of m; m, residual (B, T, D)."""
        B, T, D = m.shape
        M = self.gate_proj.weight.shape[0]
        tile = row_tile(m, self.tile)
        gu = linear(m.reshape(B * T, D), torch.cat([self.gate_proj.weight, self.up_proj.weight]), tile=tile)
        h = map_rows(lambda r: F.silu(r[:, :M]) * r[:, M:], tile, gu)  # (B*T, M)
        return linear(h, self.down_proj.weight, tile=tile, residual=residual.reshape(B * T, D)).view(B, T, D)


def scratch_of(h) -> Scratch:
    """Temporaries for a call on h (B, T, D): reused per-thread buffers in CPU inference."""
    B, T, _ = h.shape
    return Scratch(h, not torch.is_grad_enabled() and h.device.type == "cpu" and B * T <= INFER_BUFFERED)


class Layer(nn.Module):
    """A pre-norm layer: h + attn(attn_norm h) through o_proj, then + mlp(mlp_norm h). `attn` is a
    family's token mixer: attn(a, state, scratch) -> (o (B, T, X), state after), with its
    o_proj; the layer's state is the family's per-layer arrays (a dict of (B, ...) tensors)."""

    def __init__(self, d_model: int, norm_eps: float, attn: nn.Module, mlp: nn.Module):
        super().__init__()
        self.attn_norm = RMSNorm(d_model, norm_eps)
        self.attn = attn
        self.mlp_norm = RMSNorm(d_model, norm_eps)
        self.mlp = mlp

    def forward(self, h, state: dict):
        """h (B, T, D) after `state` -> (h after the layer, its state after)."""
        B, T, D = h.shape
        scratch = scratch_of(h)
        o, state = self.attn(self.attn_norm(h, out=scratch("attn_in", B, T, D)), state, scratch)
        return self.finish(h, o.reshape(B, T, -1), scratch), state

    def finish(self, h, o, scratch):
        """The layer after its attention o (B, T, HV): h + o_proj(o), then + MLP."""
        B, T, D = h.shape
        h = linear(o.reshape(B * T, -1), self.attn.o_proj.weight, tile=row_tile(h, self.attn.tile),
                   residual=h.reshape(B * T, D)).view(B, T, D)
        return self.mlp(self.mlp_norm(h, out=scratch("mlp_in", B, T, D)), residual=h)

    scratch = staticmethod(scratch_of)


class MixerBlock(nn.Module):
    """A pre-norm block without an MLP (Mamba's): h + out_proj(mixer(norm h)). A family's block
    names its mixer class (MIXER: mixer(a, state) -> (o (B, T, I), state after)) and its finish;
    `attn` and `attn_norm` are the names blocks.Layer gives the same parts (the split, model info)."""

    MIXER: type

    def __init__(self, c, tile: int):
        super().__init__()
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        self.mixer = self.MIXER(c, tile)

    @property
    def attn(self) -> nn.Module:
        return self.mixer

    @property
    def attn_norm(self) -> RMSNorm:
        return self.norm

    def forward(self, h, state: dict):
        """h (B, T, D) after the block's state -> (h after, the state after)."""
        o, state = self.mixer(self.norm(h), state)
        return self.finish(h, o, None), state

    def finish(self, h, o, scratch=None):
        """The block after its mixer's o (B, T, I)."""
        raise NotImplementedError


def init_swiglu(mlp: SwiGLU, d_model: int, n_layers: int, normal) -> None:
    """fla's MLP at 1/sqrt(fan-in), its output scaled down by depth (in no_grad)."""
    normal(mlp.gate_proj.weight, 1.0 / math.sqrt(d_model))
    normal(mlp.up_proj.weight, 1.0 / math.sqrt(d_model))
    normal(mlp.down_proj.weight, 1.0 / math.sqrt(mlp.down_proj.weight.shape[1] * 2 * n_layers))
