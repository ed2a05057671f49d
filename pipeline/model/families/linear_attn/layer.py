"""linpipe's linear attention layer (families/linear_attn): the token mixer and its init.

Per layer, from the normalised input a (B, T, D):

    a       = conv(a)                          # causal, depthwise, width W (W = 1: none)
    q, k, v = q_proj a, k_proj a, v_proj a     # one matmul, (B, T, H, K) views
    o       = linear_attn(phi(q), phi(k), v)   # the normaliser z, a fixed decay or the gate
    h      += o_proj o, then the GELU MLP      # blocks.Layer

The carried state per layer: S (H, K, K), z (H, K) and the conv window (W-1, D); K = D / H.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from linpipe.errors import ModelError, option
from linpipe.kernels import chunk_linear_attn, chunk_linear_attn_parts
from linpipe.model.blocks import MLP, CausalConv, Layer
from linpipe.model.rows import linear, map_rows, row_tile


class Attention(nn.Module):
    """The token mixer of linpipe's linear attention; its state {"S", "z", "conv" (W > 1)}."""

    def __init__(self, c, tile: int):
        super().__init__()
        D, o = c.d_model, c.layer
        self.n_heads, self.head_dim = c.n_heads, D // c.n_heads
        self.feature_map, self.normalize, self.eps = o.feature_map, o.normalize, o.attn_eps
        self.conv = CausalConv(D, c.conv_width) if c.conv_width > 1 else None
        self.tile = tile  # rows of the position-wise ops' tiles in CPU inference
        self.q_proj = nn.Linear(D, D, bias=False)
        self.k_proj = nn.Linear(D, D, bias=False)
        self.v_proj = nn.Linear(D, D, bias=False)
        self.o_proj = nn.Linear(D, D, bias=False)
        self.gate_normalizer = o.gate_normalizer
        if o.gated:  # a log-gate per head and position from the normalised input: no fixed decay
            self.gk_proj = nn.Linear(D, c.n_heads)
            self.register_parameter("decay", None)
        else:
            self.gk_proj = None
            # Fixed per-head decay in (0, 1]; not trained by default (training may opt in).
            self.decay = nn.Parameter(torch.ones(c.n_heads), requires_grad=False)

    def qkv(self, a, window, scratch):
        """Normalised inputs a (B, T, D) through the conv and one matmul -> (qkv (B, T, 3, H, K),
        the new conv window). The split (split.py) runs it with its own kernel call."""
        B, T, D = a.shape
        if self.conv is not None:
            a, window = self.conv(a, window, out=scratch("conv", B, T, D))
        # One matmul for q, k, v (weights concatenated), handed to the kernel as (B, T, H, K)
        # views: no split pass. Position-major rows make the kernel's one transpose into
        # (B, H, T, K) read contiguous K-runs.
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])  # (3D, D)
        qkv = linear(a.reshape(B * T, D), w, tile=row_tile(a, self.tile))  # (B*T, 3D)
        return qkv.view(B, T, 3, self.n_heads, self.head_dim), window

    def base_decay(self) -> list[float]:
        """Per head: the fixed decay, or a gated layer's decay where gk_proj's weights give 0
        (from its bias)."""
        with torch.no_grad():
            if self.gk_proj is None:
                return [float(g) for g in self.decay]
            return torch.exp(F.logsigmoid(self.gk_proj.bias.double()) / self.gate_normalizer).tolist()

    def log_gate(self, a):
        """The log-gates of normalised inputs a (B, T, D): logsigmoid(gk_proj(a)) / normalizer,
        (B, T, H) and <= 0 (flash-linear-attention's simple-GLA gate); None without a gate."""
        if self.gk_proj is None:
            return None
        B, T, D = a.shape
        gates = map_rows(lambda r: F.logsigmoid(linear(r, self.gk_proj.weight, bias=self.gk_proj.bias))
                         / self.gate_normalizer,
                         row_tile(a, self.tile), a.reshape(B * T, D))
        return gates.view(B, T, -1)

    def kernel(self, q, k, v, S, z, log_gate=None):
        """The linear attention of (B, T, H, K) q, k, v from (S, z), with the positions'
        log-gates (B, T, H) of a gated layer: (o, (S, z) after)."""
        return chunk_linear_attn(q, k, v, decay=self.decay, feature_map=self.feature_map,
                                 normalize=self.normalize, eps=self.eps, initial_state=(S, z),
                                 output_final_state=True, log_gate=log_gate)

    def kernel_parts(self, q, k, v, S, z, dtype=None, log_gate=None):
        """The kernel's numerator and denominator apart, in `dtype` (default float32), with the
        state after in that dtype too: (num (B, T, H, V), den (B, T, H), (S, z)). The split
        (split.py) adds an entering state's share to them before dividing."""
        return chunk_linear_attn_parts(q, k, v, decay=self.decay, feature_map=self.feature_map,
                                       initial_state=(S, z), dtype=dtype, log_gate=log_gate)

    def divide(self, num, den):
        """o from the kernel's parts, as the kernel divides: num / (den + eps) with the
        normaliser, else num."""
        return num * (den + self.eps).reciprocal_().unsqueeze(-1) if self.normalize else num

    def forward(self, a, state: dict, scratch):
        """The attention of normalised inputs a (B, T, D) after the state S (B, H, K, K), z (B, H, K)
        and the conv window (B, W-1, D) -> (o (B, T, H, V), the state after); o_proj is the layer's."""
        qkv, window = self.qkv(a, state.get("conv"), scratch)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        o, (S, z) = self.kernel(q, k, v, state["S"], state["z"], self.log_gate(a))
        return o, {"S": S, "z": z, **({"conv": window} if self.conv is not None else {})}


def make_block(c, tile: int) -> Layer:
    return Layer(c.d_model, c.norm_eps, Attention(c, tile), MLP(c.d_model, c.mlp_hidden, tile))


def default_decay(n_heads: int) -> list[float]:
    """Heads spread from short (1 - 1/16) to long (1 - 1/65536) memory, geometric in 1 - gamma."""
    if n_heads == 1:
        return [1 - 2.0 ** -8]
    return [1 - 2.0 ** -(4 + 12 * h / (n_heads - 1)) for h in range(n_heads)]


def gate_bias(decay, normalizer: float) -> torch.Tensor:
    """The gk_proj bias whose gate decays a state by `decay` (per head, in (0, 1)) where
    gk_proj's weights contribute 0: exp(logsigmoid(bias) / normalizer) = decay."""
    return torch.logit(torch.tensor(decay, dtype=torch.float64) ** normalizer).float()


def decays(c, decay) -> list[float]:
    """init_net's `decay` as one value per head, checked: None spreads the heads' decays between
    1-1/16 and 1-1/65536, a float sets every head, a list gives one per head."""
    H, o = c.n_heads, c.layer
    if decay is None:
        decay = default_decay(H)
    elif isinstance(decay, (int, float)):
        decay = [float(decay)] * H
    decay = [float(g) for g in decay]
    if len(decay) != H:
        raise ModelError(f"{option('decay')}: got {len(decay)} values for {H} heads (give 1 or {H})")
    if not all(0 < g <= 1 for g in decay):
        raise ModelError(f"{option('decay')}: every value must be in (0, 1], got {decay}")
    if o.gated and not all(g < 1 for g in decay):
        raise ModelError(f"{option('decay')}: a gated model's initial decays must be below 1 (the gate keeps "
                         f"exp(logsigmoid(x) / {o.gate_normalizer:g}) < 1), got {decay}")
    return decay


def init_block(layer: Layer, c, normal, gen: torch.Generator, decay) -> None:
    """Random weights of one layer (in no_grad): near-identity convolutions, projections at
    1/sqrt(fan-in), the residual branches scaled by depth; `decay` (init_net's) sets the fixed
    decays, or for a gated model the decays its gates start around (through gk_proj's bias)."""
    decay = decays(c, decay)
    a, D, M, L = layer.attn, c.d_model, c.mlp_hidden, c.n_layers
    if a.conv is not None:  # near-identity: mostly the current position, a little history
        normal(a.conv.weight, 0.3 / math.sqrt(c.conv_width))
        a.conv.weight[:, -1] += 1.0
    for lin in (a.q_proj, a.k_proj, a.v_proj):
        normal(lin.weight, 1.0 / math.sqrt(D))
    normal(a.o_proj.weight, 1.0 / math.sqrt(D * 2 * L))  # residual branches scaled by depth
    if c.layer.gated:  # gates vary with the input around the decays
        normal(a.gk_proj.weight, 1.0 / math.sqrt(D))
        a.gk_proj.bias.copy_(gate_bias(decay, c.layer.gate_normalizer))
    else:
        a.decay.copy_(torch.tensor(decay))
    normal(layer.mlp.fc1.weight, 1.0 / math.sqrt(D))
    normal(layer.mlp.fc2.weight, 1.0 / math.sqrt(M * 2 * L))
