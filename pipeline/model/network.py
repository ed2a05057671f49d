"""The network of format v1 in one file: layers, carried state, initialisation.

One definition serves training (differentiable, batched) and inference (no autograd, a run of
positions at a time with a carried `ModelState`). Each layer writes its temporaries as `out=` of a `Scratch`:
fresh tensors under autograd; in CPU inference, per-thread buffers reused span after span,
with the residual stream updated in place (fresh 1-4 MB activations per span made the norms,
the convolution and the residual adds cost several times their arithmetic).

Shapes: B batch, T positions, D = d_model, H heads of K = D / H, M = mlp_hidden, W = conv_width.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from linpipe.errors import ModelError, option
from linpipe.inputs.alphabet import BOS, VOCAB_SIZE
from linpipe.kernels import chunk_linear_attn, chunk_linear_attn_parts
from linpipe.kernels.linear_attn.scratch import Scratch
from linpipe.model import series
from linpipe.model.config import FLA_LINEAR_ATTN, GLA, MAMBA2, RETNET, ModelConfig
from linpipe.model.delta import DeltaAttention, SwiGLU, init_delta_layer
from linpipe.model.fla_linear import FlaLinearAttention, init_fla_linear_layer
from linpipe.model.gla import GLAAttention, init_gla_layer
from linpipe.model.mamba2 import Mamba2Block, init_mamba2_block
from linpipe.model.ops import CausalConv, RMSNorm
from linpipe.model.retention import Retention, init_retention_layer
from linpipe.model.rows import ROW_ALIGN, linear, map_rows, row_tile

# Most positions (batch x length) per call that CPU inference keeps in reused buffers;
# bigger calls (many short records batched) allocate, so that their temporaries are freed.
INFER_BUFFERED = 16384
# Positions per network call on the CPU (a span), and the rows of every position-wise op's tile
# (linpipe.model.rows): the most, between 2,048 and 16,384, whose widest temporary (the (T, 3D)
# projections or the (T, M) MLP hidden) holds at most SPAN_FLOATS floats. Small models need the
# long spans: their cost per call is torch's per-op overhead, not arithmetic (a D=8 model ran
# 2.4M positions/s in spans of 2,048, 3.6M in spans of 16,384); for wide ones a long span
# spills the temporaries from cache (D=128, M=512: 16,384 was ~25% slower than 2,048).
SPAN_FLOATS = 2048 * 192
MIN_SPAN, MAX_SPAN = 2048, 16384


def forward_span(config: ModelConfig) -> int:
    """Positions per network call on the CPU for this model (see SPAN_FLOATS): a power of two,
    so a whole number of the kernel's fold groups and of ROW_ALIGN."""
    width = max(3 * config.d_model, config.mlp_hidden, 2 * config.conv_channels if config.ssd else 0)
    span = MIN_SPAN
    while span * 2 <= MAX_SPAN and span * 2 * width <= SPAN_FLOATS:
        span *= 2
    assert span % ROW_ALIGN == 0
    return span


@dataclass
class ModelState:
    """The whole memory of the past: per layer S, z and the conv window, plus y of the last
    position read, whatever the layer kind (ModelConfig.state_shapes). Batched (B leading)
    torch tensors; inference uses B = 1, or one lane per channel for series_norm models, which
    also carry `norm` (linpipe.model.series)."""

    S: torch.Tensor  # (B, L, H, K, V) float32 (V = K for linear attention)
    z: torch.Tensor  # (B, L, H, K) float32; (B, L, H, 0) for the delta rule and mamba2: no z
    # (B, L, W-1, C): the last W-1 inputs of each layer's conv, C = D (linear attention), the
    # delta rule's q, k, v projections concatenated (2HK + HV) or mamba2's x, B, C (HV + 2GK)
    conv: torch.Tensor
    y: torch.Tensor  # (B, D): final representation of the last position read
    norm: torch.Tensor | None = None  # (B, NORM_SIZE) float64: series_norm models only

    def _map(self, f) -> "ModelState":
        return ModelState(f(self.S), f(self.z), f(self.conv), f(self.y),
                          None if self.norm is None else f(self.norm))

    def detach(self) -> "ModelState":
        return self._map(lambda t: t.detach())

    def to(self, device) -> "ModelState":
        return self._map(lambda t: t.to(device))

    @property
    def batch_size(self) -> int:
        return self.S.shape[0]

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Plain arrays (float32; norm float64) of a single-sequence state (conv only when
        W > 1, z only when it holds values). A series_norm state keeps its lane axis (one lane
        per channel)."""
        lanes = self.norm is not None
        if not lanes and self.batch_size != 1:
            raise ValueError(f"to_arrays needs a single-sequence state, got batch {self.batch_size}")
        pick = (lambda t: t) if lanes else (lambda t: t[0])
        d = {"S": pick(self.S), "y": pick(self.y)}
        if self.z.shape[-1] > 0:
            d["z"] = pick(self.z)
        if self.conv.shape[2] > 0:
            d["conv"] = pick(self.conv)
        out = {k: v.detach().to("cpu", torch.float32).numpy().copy() for k, v in d.items()}
        if lanes:
            out["norm"] = self.norm.detach().to("cpu", torch.float64).numpy().copy()
        return out

    @classmethod
    def from_arrays(cls, d: dict, device=None) -> "ModelState":
        """Inverse of to_arrays (shapes are checked against the model in Model.forward)."""
        lanes = "norm" in d
        try:
            S = torch.as_tensor(np.asarray(d["S"], dtype=np.float32), device=device)
            y = torch.as_tensor(np.asarray(d["y"], dtype=np.float32), device=device)
        except KeyError as e:
            raise ModelError(f"model state arrays lack {e.args[0]!r}") from None
        if "z" in d:
            z = torch.as_tensor(np.asarray(d["z"], dtype=np.float32), device=device)
        else:  # the delta rule's state has no z
            z = torch.zeros((*S.shape[:-2], 0), device=device)  # (L, H, 0), or with lanes
        if not lanes:
            S, z, y = S[None], z[None], y[None]
        if S.ndim != 5 or z.ndim != 4 or y.ndim != 2:
            raise ModelError(f"model state arrays have wrong ranks: S {tuple(S.shape)}, "
                             f"z {tuple(z.shape)}, y {tuple(y.shape)}")
        if "conv" in d:
            conv = torch.as_tensor(np.asarray(d["conv"], dtype=np.float32), device=device)
            conv = conv if lanes else conv[None]
        else:
            conv = torch.zeros((S.shape[0], S.shape[1], 0, y.shape[1]), device=device)
        norm = torch.as_tensor(np.asarray(d["norm"], dtype=np.float64), device=device) if lanes else None
        return cls(S, z, conv, y, norm)


class Attention(nn.Module):
    delta = False  # the layer kind, as ModelConfig.delta (the split reads it)

    def __init__(self, c: ModelConfig):
        super().__init__()
        D = c.d_model
        self.n_heads, self.head_dim = c.n_heads, c.head_dim
        self.feature_map, self.normalize, self.eps = c.feature_map, c.normalize, c.attn_eps
        self.conv = CausalConv(D, c.conv_width) if c.conv_width > 1 else None
        self.tile = forward_span(c)  # rows of the position-wise ops' tiles in CPU inference
        self.q_proj = nn.Linear(D, D, bias=False)
        self.k_proj = nn.Linear(D, D, bias=False)
        self.v_proj = nn.Linear(D, D, bias=False)
        self.o_proj = nn.Linear(D, D, bias=False)
        self.gate_normalizer = c.gate_normalizer
        if c.gated:  # a log-gate per head and position from the normalised input: no fixed decay
            self.gk_proj = nn.Linear(D, c.n_heads)
            self.register_parameter("decay", None)
        else:
            self.gk_proj = None
            # Fixed per-head decay in (0, 1]; not trained by default (training may opt in).
            self.decay = nn.Parameter(torch.ones(c.n_heads), requires_grad=False)

    def qkv(self, a, window, scratch):
        """Normalised inputs a (B, T, D) through the conv and one matmul -> (qkv (B, T, 3, H, K),
        the new conv window). The split (linpipe.model.segments) runs it with its own kernel
        call."""
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
        (linpipe.model.segments) adds an entering state's share to them before dividing."""
        return chunk_linear_attn_parts(q, k, v, decay=self.decay, feature_map=self.feature_map,
                                       initial_state=(S, z), dtype=dtype, log_gate=log_gate)

    def divide(self, num, den):
        """o from the kernel's parts, as the kernel divides: num / (den + eps) with the
        normaliser, else num."""
        return num * (den + self.eps).reciprocal_().unsqueeze(-1) if self.normalize else num

    def forward(self, a, S, z, window, scratch):
        """The attention of normalised inputs a (B, T, D) from S (B, H, K, K), z (B, H, K) and the
        conv window (B, W-1, D): (o (B, T, H, V), the new S, z, window); o_proj is Layer.finish's."""
        qkv, window = self.qkv(a, window, scratch)
        o, (S, z) = self.kernel(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], S, z, self.log_gate(a))
        return o, S, z, window


class MLP(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.fc1 = nn.Linear(c.d_model, c.mlp_hidden, bias=False)
        self.fc2 = nn.Linear(c.mlp_hidden, c.d_model, bias=False)
        self.tile = forward_span(c)

    def forward(self, m, residual):
        """residual + fc2(gelu(fc1(m))) (the exact, erf GELU); m, residual (B, T, D)."""
        B, T, D = m.shape
        tile = row_tile(m, self.tile)
        g = linear(m.reshape(B * T, D), self.fc1.weight, tile=tile, gelu=True)  # (B*T, M)
        return linear(g, self.fc2.weight, tile=tile, residual=residual.reshape(B * T, D)).view(B, T, D)


class Layer(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(c.d_model, c.norm_eps)
        self.attn = (GLAAttention(c, forward_span(c)) if c.family == GLA else
                     Retention(c, forward_span(c)) if c.family == RETNET else
                     FlaLinearAttention(c, forward_span(c)) if c.family == FLA_LINEAR_ATTN else
                     DeltaAttention(c, forward_span(c)) if c.delta else Attention(c))
        self.mlp_norm = RMSNorm(c.d_model, c.norm_eps)
        self.mlp = SwiGLU(c, forward_span(c)) if c.fla else MLP(c)

    def forward(self, h, S, z, window):
        """h (B, T, D) -> h + attention, then + MLP."""
        B, T, D = h.shape
        scratch = self.scratch(h)
        o, S, z, window = self.attn(self.attn_norm(h, out=scratch("attn_in", B, T, D)), S, z, window, scratch)
        return self.finish(h, o.reshape(B, T, -1), scratch), S, z, window

    def finish(self, h, o, scratch):
        """The layer after its attention o (B, T, HV): h + o_proj(o), then + MLP."""
        B, T, D = h.shape
        h = linear(o.reshape(B * T, -1), self.attn.o_proj.weight, tile=row_tile(h, self.attn.tile),
                   residual=h.reshape(B * T, D)).view(B, T, D)
        return self.mlp(self.mlp_norm(h, out=scratch("mlp_in", B, T, D)), residual=h)

    @staticmethod
    def scratch(h) -> Scratch:
        """Temporaries for a call on h (B, T, D): reused per-thread buffers in CPU inference."""
        B, T, _ = h.shape
        return Scratch(h, not torch.is_grad_enabled() and h.device.type == "cpu" and B * T <= INFER_BUFFERED)


class LinpipeNet(nn.Module):
    """The network of format v1; parameter names are exactly the tensor names of the format."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = self.config = config
        D = c.d_model
        if c.modality == "dna":
            self.embed = nn.Embedding(VOCAB_SIZE, D)
        else:
            self.embed = nn.Linear(series.N_FEATURES if c.series_norm else c.channels, D)
            self.bos = nn.Parameter(torch.zeros(D))
            self.register_buffer("mean", torch.tensor(c.mean, dtype=torch.float32), persistent=False)
            self.register_buffer("std", torch.tensor(c.std, dtype=torch.float32), persistent=False)
        self.layers = nn.ModuleList(Mamba2Block(c, forward_span(c)) if c.family == MAMBA2 else Layer(c)
                                    for _ in range(c.n_layers))
        self.norm = RMSNorm(D, c.norm_eps)
        self.head = nn.Linear(D, c.vocab_out)
        self.span = forward_span(c)

    # -- inputs ---------------------------------------------------------------------------
    def normalize_inputs(self, x):
        """Timeseries (B, T, C) raw values -> normalised, NaN -> 0 (after normalising)."""
        xn = (x.to(self.std.dtype) - self.mean) / self.std
        return torch.nan_to_num(xn, nan=0.0)

    def embed_inputs(self, x):
        """x (B, T) tokens or (B, T, C) raw values -> (B, T, D) embeddings (series_norm models
        embed `series_inputs`' features instead)."""
        if self.config.modality == "dna":
            return self.embed(x.long())  # (B, T, D)
        return self.embed(self.normalize_inputs(x))

    # -- state ----------------------------------------------------------------------------
    def zero_state(self, batch_size: int) -> ModelState:
        c = self.config
        p = self.head.weight
        shapes = c.state_shapes()
        return ModelState(p.new_zeros((batch_size, *shapes["S"]), dtype=torch.float32),
                          p.new_zeros((batch_size, *shapes["z"]), dtype=torch.float32),
                          p.new_zeros((batch_size, *shapes["conv"])),
                          p.new_zeros((batch_size, *shapes["y"])),
                          series.zero_norm(batch_size, p.device, c.season_lags) if c.series_norm else None)

    def initial_state(self, batch_size: int = 1) -> ModelState:
        """The state after reading BOS (differentiable): computed once and repeated for every
        batch row, so that it is the same bytes in a batch of any size."""
        h = (self.embed.weight[BOS] if self.config.modality == "dna" else self.bos).view(1, 1, -1)
        _, state = self._run(h, self.zero_state(1))
        if batch_size == 1:
            return state
        return state._map(lambda t: t.expand(batch_size, *t.shape[1:]).clone())

    # -- forward --------------------------------------------------------------------------
    def _run(self, h, state: ModelState):
        Ss, zs, ws = [], [], []
        for i, layer in enumerate(self.layers):
            h, S, z, w = layer(h, state.S[:, i], state.z[:, i], state.conv[:, i])
            Ss.append(S)
            zs.append(z)
            ws.append(w)
        y = self.norm(h)  # (B, T, D)
        new = ModelState(torch.stack(Ss, 1), torch.stack(zs, 1), torch.stack(ws, 1),
                         y[:, -1] if y.shape[1] else state.y, state.norm)
        return y, new

    def series_inputs(self, x, state: ModelState) -> dict:
        """series_norm: (B, T, 1) raw values -> linpipe.model.series.normalise's dict."""
        with torch.no_grad():
            return series.normalise(x[..., 0], state.norm)

    def forward(self, x, state: ModelState):
        """x (B, T) tokens or (B, T, C) raw values -> (y (B, T, D), new state)."""
        if self.config.series_norm:
            nz = self.series_inputs(x, state)
            y, new = self._run(self.embed(nz["features"]), state)
            new.norm = nz["norm"]
            return y, new
        return self._run(self.embed_inputs(x), state)

    def predict(self, x, state: ModelState):
        """(pred (B, T, 4|C), y, new_state): pred[:, i] is the head's output before reading x_i."""
        y, new = self.forward(x, state)
        return self.head(y_before(y, state.y)), y, new


def y_before(y, y0):
    """y (B, T, D) of positions 0..T-1 and y0 (B, D) of the position before them -> (B, T, D): y
    of the position before each (the head's input: the prediction of x_i comes from y before it)."""
    return torch.cat([y0.unsqueeze(1), y[:, :-1]], dim=1)[:, :y.shape[1]]


def default_decay(n_heads: int) -> list[float]:
    """Heads spread from short (1 - 1/16) to long (1 - 1/65536) memory, geometric in 1 - gamma."""
    if n_heads == 1:
        return [1 - 2.0 ** -8]
    return [1 - 2.0 ** -(4 + 12 * h / (n_heads - 1)) for h in range(n_heads)]


def gate_bias(decay, normalizer: float) -> torch.Tensor:
    """The gk_proj bias whose gate decays a state by `decay` (per head, in (0, 1)) where
    gk_proj's weights contribute 0: exp(logsigmoid(bias) / normalizer) = decay."""
    return torch.logit(torch.tensor(decay, dtype=torch.float64) ** normalizer).float()


def init_net(config: ModelConfig, *, seed: int = 0, decay=None) -> LinpipeNet:
    """A randomly initialised network with scales that keep outputs finite and varied. `decay`
    sets the fixed decays, or for a gated model the decays its gates start around (through
    gk_proj's bias)."""
    c = config
    if (c.fla or c.family == MAMBA2) and decay is not None:
        raise ModelError(f"{option('decay')} is for the linear-attention family, not {c.family} (its "
                         "decays start from A_log and dt_bias as flash-linear-attention's do)")
    if decay is None:
        decay = default_decay(c.n_heads)
    elif isinstance(decay, (int, float)):
        decay = [float(decay)] * c.n_heads
    decay = [float(g) for g in decay]
    if len(decay) != c.n_heads:
        raise ModelError(f"{option('decay')}: got {len(decay)} values for {c.n_heads} heads "
                         f"(give 1 or {c.n_heads})")
    if not all(0 < g <= 1 for g in decay):
        raise ModelError(f"{option('decay')}: every value must be in (0, 1], got {decay}")
    if c.gated and not all(g < 1 for g in decay):
        raise ModelError(f"{option('decay')}: a gated model's initial decays must be below 1 (the gate keeps "
                         f"exp(logsigmoid(x) / {c.gate_normalizer:g}) < 1), got {decay}")
    gen = torch.Generator().manual_seed(seed)
    net = LinpipeNet(c)
    D, M, L = c.d_model, c.mlp_hidden, c.n_layers

    def normal(t, std):
        with torch.no_grad():
            t.copy_(torch.randn(t.shape, generator=gen) * std)

    with torch.no_grad():
        width = series.N_FEATURES if c.series_norm else c.channels
        normal(net.embed.weight, 1.0 if c.modality == "dna" else 1.0 / math.sqrt(width))
        if c.modality == "timeseries":
            net.embed.bias.zero_()
            normal(net.bos, 1.0)
        for layer in net.layers:
            if c.family == RETNET:
                init_retention_layer(layer, c, normal)
                continue
            if c.family == FLA_LINEAR_ATTN:
                init_fla_linear_layer(layer, c, normal)
                continue
            if c.delta:
                (init_gla_layer if c.family == GLA else init_delta_layer)(layer, c, normal, gen)
                continue
            if c.family == MAMBA2:
                init_mamba2_block(layer, c, normal, gen)
                continue
            a = layer.attn
            if a.conv is not None:  # near-identity: mostly the current position, a little history
                normal(a.conv.weight, 0.3 / math.sqrt(c.conv_width))
                a.conv.weight[:, -1] += 1.0
            for lin in (a.q_proj, a.k_proj, a.v_proj):
                normal(lin.weight, 1.0 / math.sqrt(D))
            normal(a.o_proj.weight, 1.0 / math.sqrt(D * 2 * L))  # residual branches scaled by depth
            if c.gated:  # gates vary with the input around the decays
                normal(a.gk_proj.weight, 1.0 / math.sqrt(D))
                a.gk_proj.bias.copy_(gate_bias(decay, c.gate_normalizer))
            else:
                a.decay.copy_(torch.tensor(decay))
            normal(layer.mlp.fc1.weight, 1.0 / math.sqrt(D))
            normal(layer.mlp.fc2.weight, 1.0 / math.sqrt(M * 2 * L))
        normal(net.head.weight, 1.0 / math.sqrt(D))
        if c.series_norm:  # a zero head predicts no change: the untrained model is last-value
            net.head.weight.zero_()
        net.head.bias.zero_()
    return net
