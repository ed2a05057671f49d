"""The linpipe model, format v1 (docs/model-format.md): config, layers, state, load/save.

One causal linear-attention network serves inference (`Model.forward`, numpy in and out,
chunk by chunk with a carried `ModelState`) and training (`LinpipeNet`, differentiable torch,
batched). Both run the same layers; there is no second implementation.

Position bookkeeping: the network reads u = [BOS, x_0, ..., x_{N-1}]; y_j is its final
representation after u_j. The prediction of x_i comes from y of the position before it, so
the carried state ends with `y` of the last position read, and hidden[i] = y after x_i.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from linpipe.errors import ModelError
from linpipe.inputs.alphabet import BOS, VOCAB_SIZE
from linpipe.inputs.alphabet import N as TOKEN_N
from linpipe.kernels.linear_attn.naive import FEATURE_MAPS
from linpipe.kernels.linear_attn.scratch import workspace
from linpipe.model.outputs import MODALITIES, output_names, output_spec

FORMAT_NAME = "linpipe-model"
FORMAT_VERSION = 1
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
# Files that hold pickled objects: loading them can run arbitrary code, so linpipe never does.
PICKLE_NAMES = ("pytorch_model.bin", "model.bin")
PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".bin")
SHIPPED_MODELS = Path(__file__).resolve().parent / "shipped"
# Positions per forward pass inside Model.forward: bounds peak memory for any chunk length, and
# keeps the temporaries (e.g. the (T, M) MLP hidden) small enough to stay in cache: 16,384 was
# measured ~25% slower than 2,048 at 1 thread on the CPU.
FORWARD_BLOCK = 2048
# Most positions (batch x length) per block call that CPU inference runs in reused buffers
# (Block._infer); bigger calls (many short records batched) take the allocating path, so that
# their temporaries are freed, not kept.
INFER_BUFFERED = 4 * FORWARD_BLOCK


# --------------------------------------------------------------------------------------------
# config
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelConfig:
    modality: str
    d_model: int
    n_layers: int
    n_heads: int
    mlp_hidden: int
    feature_map: str = "elu1"
    normalize: bool = True
    conv_width: int = 4
    attn_eps: float = 1e-6
    norm_eps: float = 1e-5
    channels: int = 0  # timeseries only
    channel_names: tuple = ()
    mean: tuple = ()
    std: tuple = ()

    def __post_init__(self):
        err = _config_problem(self)
        if err:
            raise ModelError(f"invalid model config: {err}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def vocab_out(self) -> int:
        """Width of the head: 4 classes (A, C, G, T) for dna, C channels for timeseries."""
        return 4 if self.modality == "dna" else self.channels

    @property
    def output_names(self) -> tuple:
        """The outputs the model computes, in order (docs/model-format.md)."""
        return output_names(self.modality, from_model=True)

    @property
    def output_dims(self) -> dict:
        """Per output: None for one value per position, else the width of its last axis."""
        return {n: output_spec(self.modality, n).width(self.d_model, self.channels) for n in self.output_names}

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        d = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "modality": self.modality,
             "d_model": self.d_model, "n_layers": self.n_layers, "n_heads": self.n_heads,
             "mlp_hidden": self.mlp_hidden, "feature_map": self.feature_map,
             "normalize": self.normalize, "attn_eps": self.attn_eps, "norm_eps": self.norm_eps,
             "conv_width": self.conv_width}
        if self.modality == "timeseries":
            d.update(channels=self.channels, channel_names=list(self.channel_names),
                     mean=list(self.mean), std=list(self.std))
        return d

    @classmethod
    def from_json(cls, d: dict, where: str = "config.json") -> "ModelConfig":
        """Validates a parsed config.json; every problem is a ModelError naming `where` and the key."""
        if not isinstance(d, dict):
            raise ModelError(f"{where}: expected a JSON object, got {type(d).__name__}")
        if d.get("format") != FORMAT_NAME:
            raise ModelError(f"{where}: 'format' is {d.get('format')!r}, expected {FORMAT_NAME!r}")
        ver = d.get("version")
        if ver != FORMAT_VERSION:
            hint = " (written by a newer linpipe; upgrade linpipe)" if isinstance(ver, int) and ver > 1 else ""
            raise ModelError(f"{where}: unsupported model format version {ver!r}{hint}; "
                             f"this linpipe reads version {FORMAT_VERSION}")
        required = ["modality", "d_model", "n_layers", "n_heads", "mlp_hidden", "feature_map",
                    "normalize", "conv_width"]
        if d.get("modality") == "timeseries":
            required += ["channels", "channel_names", "mean", "std"]
        for key in required:
            if key not in d:
                raise ModelError(f"{where}: missing key {key!r}")

        def integer(key):
            v = d[key]
            if isinstance(v, bool) or not isinstance(v, int):
                raise ModelError(f"{where}: {key!r} must be an integer, got {v!r}")
            return v

        def number(key, default):
            v = d.get(key, default)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ModelError(f"{where}: {key!r} must be a number, got {v!r}")
            return float(v)

        def number_list(key):
            v = d[key]
            if not isinstance(v, list) or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
                raise ModelError(f"{where}: {key!r} must be a list of numbers")
            return tuple(float(x) for x in v)

        if not isinstance(d["normalize"], bool):
            raise ModelError(f"{where}: 'normalize' must be true or false, got {d['normalize']!r}")
        kw = dict(modality=d["modality"], d_model=integer("d_model"), n_layers=integer("n_layers"),
                  n_heads=integer("n_heads"), mlp_hidden=integer("mlp_hidden"),
                  feature_map=d["feature_map"], normalize=d["normalize"],
                  conv_width=integer("conv_width"), attn_eps=number("attn_eps", 1e-6),
                  norm_eps=number("norm_eps", 1e-5))
        if d["modality"] == "timeseries":
            names = d["channel_names"]
            if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
                raise ModelError(f"{where}: 'channel_names' must be a list of strings")
            kw.update(channels=integer("channels"), channel_names=tuple(names),
                      mean=number_list("mean"), std=number_list("std"))
        try:
            return cls(**kw)
        except ModelError as e:
            raise ModelError(f"{where}: {str(e).removeprefix('invalid model config: ')}") from None


def _config_problem(c: ModelConfig) -> str | None:
    """The first thing wrong with a config, or None."""
    if c.modality not in MODALITIES:
        return f"unknown modality {c.modality!r} (expected one of {', '.join(MODALITIES)})"
    if c.feature_map not in FEATURE_MAPS:
        return f"unknown feature_map {c.feature_map!r} (expected one of {', '.join(FEATURE_MAPS)})"
    for key in ("d_model", "n_layers", "n_heads", "mlp_hidden", "conv_width"):
        v = getattr(c, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            return f"{key!r} must be a positive integer, got {v!r}"
    if c.d_model % c.n_heads:
        return f"d_model {c.d_model} is not divisible by n_heads {c.n_heads}"
    for key in ("attn_eps", "norm_eps"):
        v = getattr(c, key)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            return f"{key!r} must be a positive number, got {v!r}"
    if c.modality == "timeseries":
        if isinstance(c.channels, bool) or not isinstance(c.channels, int) or c.channels < 1:
            return f"'channels' must be a positive integer for timeseries, got {c.channels!r}"
        for key in ("channel_names", "mean", "std"):
            if len(getattr(c, key)) != c.channels:
                return f"{key!r} has {len(getattr(c, key))} entries, expected channels = {c.channels}"
        if not all(math.isfinite(x) for x in c.mean):
            return "'mean' must be finite"
        if not all(math.isfinite(x) and x > 0 for x in c.std):
            return "'std' entries must be finite and > 0"
    elif c.channels or c.channel_names or c.mean or c.std:
        return "channels/channel_names/mean/std are for timeseries models only"
    return None


def expected_shapes(c: ModelConfig) -> dict[str, tuple]:
    """Every tensor of format v1 and its shape, for this config."""
    D, M, W, H = c.d_model, c.mlp_hidden, c.conv_width, c.n_heads
    if c.modality == "dna":
        shapes = {"embed.weight": (VOCAB_SIZE, D)}
    else:
        shapes = {"embed.weight": (D, c.channels), "embed.bias": (D,), "bos": (D,)}
    for i in range(c.n_layers):
        p = f"layers.{i}."
        shapes[p + "attn_norm.weight"] = (D,)
        if W > 1:
            shapes[p + "attn.conv.weight"] = (D, W)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[p + f"attn.{name}.weight"] = (D, D)
        shapes[p + "attn.decay"] = (H,)
        shapes[p + "mlp_norm.weight"] = (D,)
        shapes[p + "mlp.fc1.weight"] = (M, D)
        shapes[p + "mlp.fc2.weight"] = (D, M)
    shapes["norm.weight"] = (D,)
    shapes["head.weight"] = (c.vocab_out, D)
    shapes["head.bias"] = (c.vocab_out,)
    return shapes


# --------------------------------------------------------------------------------------------
# state
# --------------------------------------------------------------------------------------------
@dataclass
class ModelState:
    """The whole memory of the past: per layer S, z and the conv window, plus y of the last
    position read. Batched (B leading) torch tensors; inference uses B = 1."""

    S: torch.Tensor  # (B, L, H, K, K) float32
    z: torch.Tensor  # (B, L, H, K) float32
    conv: torch.Tensor  # (B, L, W-1, D): the last W-1 normalised inputs of each conv
    y: torch.Tensor  # (B, D): final representation of the last position read

    def detach(self) -> "ModelState":
        return ModelState(self.S.detach(), self.z.detach(), self.conv.detach(), self.y.detach())

    def to(self, device) -> "ModelState":
        return ModelState(self.S.to(device), self.z.to(device), self.conv.to(device), self.y.to(device))

    @property
    def batch_size(self) -> int:
        return self.S.shape[0]

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Plain float32 arrays of a single-sequence state (conv only when W > 1)."""
        if self.batch_size != 1:
            raise ValueError(f"to_arrays needs a single-sequence state, got batch {self.batch_size}")
        d = {"S": self.S[0], "z": self.z[0], "y": self.y[0]}
        if self.conv.shape[2] > 0:
            d["conv"] = self.conv[0]
        return {k: v.detach().to("cpu", torch.float32).numpy().copy() for k, v in d.items()}

    @classmethod
    def from_arrays(cls, d: dict, device=None) -> "ModelState":
        """Inverse of to_arrays (shapes are checked against the model in Model.forward)."""
        try:
            S = torch.as_tensor(np.asarray(d["S"], dtype=np.float32), device=device)
            z = torch.as_tensor(np.asarray(d["z"], dtype=np.float32), device=device)
            y = torch.as_tensor(np.asarray(d["y"], dtype=np.float32), device=device)
        except KeyError as e:
            raise ModelError(f"model state arrays lack {e.args[0]!r}") from None
        if S.ndim != 4 or z.ndim != 3 or y.ndim != 1:
            raise ModelError(f"model state arrays have wrong ranks: S {tuple(S.shape)}, "
                             f"z {tuple(z.shape)}, y {tuple(y.shape)}")
        if "conv" in d:
            conv = torch.as_tensor(np.asarray(d["conv"], dtype=np.float32), device=device)
        else:
            conv = torch.zeros((S.shape[0], 0, y.shape[0]), device=device)
        return cls(S[None], z[None], conv[None], y[None])


# --------------------------------------------------------------------------------------------
# layers
# --------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        if hasattr(F, "rms_norm"):  # fused since torch 2.4
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def into(self, out, x):
        """forward(x) written into out (no autograd): for the inference path's reused buffers."""
        ms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)  # (..., 1)
        ms.mul_(x.shape[-1] ** -0.5).pow_(2).add_(self.eps).rsqrt_()
        return torch.mul(x, ms, out=out).mul_(self.weight)


class CausalConv(nn.Module):
    """Depthwise causal convolution of width W; its window is part of the carried state."""

    def __init__(self, dim: int, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim, width))  # (D, W); [:, W-1] hits the current position

    def forward(self, a, window):  # a (B, T, D), window (B, W-1, D)
        T = a.shape[1]
        W = self.weight.shape[1]
        ext = torch.cat([window, a], dim=1)  # (B, T+W-1, D)
        # W shifted multiply-adds in the (B, T, D) layout: no transposes. Measured ~0.5 ms less
        # per (2048, 128) block at 1 thread than a depthwise conv1d, whose transposed output
        # also slowed the next matmul (in-place adds on a fresh product are autograd-safe:
        # neither op's backward reads its output).
        c = ext[:, W - 1:] * self.weight[:, W - 1]
        for j in range(W - 1):
            c.addcmul_(ext[:, j:j + T], self.weight[:, j])
        return c, ext[:, T:]  # (B, T, D); new window: the last W-1 inputs


class Attention(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        D = c.d_model
        self.n_heads, self.head_dim = c.n_heads, c.head_dim
        self.feature_map, self.normalize, self.eps = c.feature_map, c.normalize, c.attn_eps
        self.conv = CausalConv(D, c.conv_width) if c.conv_width > 1 else None
        self.q_proj = nn.Linear(D, D, bias=False)
        self.k_proj = nn.Linear(D, D, bias=False)
        self.v_proj = nn.Linear(D, D, bias=False)
        self.o_proj = nn.Linear(D, D, bias=False)
        # Fixed per-head decay in (0, 1]; not trained by default (training may opt in).
        self.decay = nn.Parameter(torch.ones(c.n_heads), requires_grad=False)

    def forward(self, a, S, z, window, residual=None):  # a (B, T, D); S (B, H, K, K); z (B, H, K); window (B, W-1, D)
        """o_proj(attention), or residual + that when residual (B, T, D) is given."""
        B, T, D = a.shape
        H, K = self.n_heads, self.head_dim
        if self.conv is not None:
            a, window = self.conv(a, window)
        # One matmul for q, k, v (weights concatenated), (B, T, 3, H, K), handed to the kernel
        # as (B, T, H, K) views: no split pass. Position-major rows make the kernel's one
        # transpose into (B, H, T, K) read contiguous K-runs (measured faster on the CPU than a
        # position-last projection once the kernel streams in cache-sized segments).
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])  # (3D, D)
        qkv = torch.matmul(a, w.t()).view(B, T, 3, H, K)
        o, S, z = self.attend(qkv, S, z)
        if residual is None:
            return self.o_proj(o.reshape(B, T, D)), S, z, window
        return _add_linear(residual, o.reshape(B, T, D), self.o_proj.weight), S, z, window

    def attend(self, qkv, S, z):
        """The linear attention over (B, T, 3, H, K) projections -> o (B, T, H, K), S, z."""
        from linpipe.kernels import chunk_linear_attn

        decay = None if bool((self.decay == 1).all()) else self.decay
        o, (S, z) = chunk_linear_attn(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], decay=decay,
                                      feature_map=self.feature_map, normalize=self.normalize,
                                      eps=self.eps, initial_state=(S, z), output_final_state=True)
        return o, S, z


class MLP(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.fc1 = nn.Linear(c.d_model, c.mlp_hidden, bias=False)
        self.fc2 = nn.Linear(c.mlp_hidden, c.d_model, bias=False)

    def forward(self, m, residual=None):
        """fc2(gelu(fc1(m))), or residual + that when residual (B, T, D) is given."""
        g = F.gelu(self.fc1(m))  # exact (erf) GELU
        if residual is None:
            return self.fc2(g)
        return _add_linear(residual, g, self.fc2.weight)


def _add_linear(r, x, w):
    """r + x @ w.T for r (B, T, N), x (B, T, M), w (N, M): one addmm, so the residual add rides
    in the matmul instead of a separate pass over (B, T, N) (differentiable)."""
    B, T, M = x.shape
    N = w.shape[0]
    return torch.addmm(r.reshape(B * T, N), x.reshape(B * T, M), w.t()).view(B, T, N)


class Block(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(c.d_model, c.norm_eps)
        self.attn = Attention(c)
        self.mlp_norm = RMSNorm(c.d_model, c.norm_eps)
        self.mlp = MLP(c)

    def forward(self, h, S, z, window):
        buffered = h.device.type == "cpu" and h.shape[0] * h.shape[1] <= INFER_BUFFERED
        if buffered and not torch.is_grad_enabled():
            return self._infer(h, S, z, window)
        h, S, z, window = self.attn(self.attn_norm(h), S, z, window, residual=h)  # h + attention
        h = self.mlp(self.mlp_norm(h), residual=h)  # h + MLP
        return h, S, z, window

    def _infer(self, h, S, z, window):
        """forward for CPU inference: the same arithmetic, with the residual stream h (B, T, D)
        updated in place (the caller owns it) and every temporary in a per-thread buffer reused
        block after block (workspace). Fresh 1-4 MB activations per block made the
        normalisations, the convolution and the residual adds cost several times their
        arithmetic; this path measured 4-10% faster over the whole forward (1 thread)."""
        B, T, D = h.shape
        attn, conv = self.attn, self.attn.conv
        W = 1 if conv is None else conv.weight.shape[1]
        # The convolution's input: the carried window, then the normalised block, in one buffer.
        ext = workspace(B * (T + W - 1) * D, h, "conv_in").view(B, T + W - 1, D)
        ext[:, :W - 1].copy_(window)
        a = self.attn_norm.into(ext[:, W - 1:], h)  # (B, T, D)
        if conv is not None:
            cw = conv.weight  # (D, W)
            c = torch.mul(a, cw[:, W - 1], out=workspace(B * T * D, h, "conv_out").view(B, T, D))
            for j in range(W - 1):
                c.addcmul_(ext[:, j:j + T], cw[:, j])
            window = ext[:, T:].clone()  # the buffer is reused: the new window is copied out
        else:
            c = a
        w = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])  # (3D, D)
        qkv = workspace(B * T * 3 * D, h, "qkv").view(B * T, 3 * D)
        torch.mm(c.reshape(B * T, D), w.t(), out=qkv)
        o, S, z = attn.attend(qkv.view(B, T, 3, attn.n_heads, attn.head_dim), S, z)
        hf = h.view(B * T, D)
        hf.addmm_(o.reshape(B * T, D), attn.o_proj.weight.t())  # h += o_proj(o)
        m = self.mlp_norm.into(workspace(B * T * D, h, "mlp_in").view(B, T, D), h)
        fc1, fc2 = self.mlp.fc1.weight, self.mlp.fc2.weight
        g = workspace(B * T * fc1.shape[0], h, "mlp").view(B * T, fc1.shape[0])
        torch.mm(m.view(B * T, D), fc1.t(), out=g)
        torch.ops.aten.gelu_(g)  # exact (erf) GELU, in place
        hf.addmm_(g, fc2.t())  # h += fc2(gelu(fc1(m)))
        return h, S, z, window


class LinpipeNet(nn.Module):
    """The network of format v1; parameter names are exactly the tensor names of the format."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = self.config = config
        D = c.d_model
        if c.modality == "dna":
            self.embed = nn.Embedding(VOCAB_SIZE, D)
        else:
            self.embed = nn.Linear(c.channels, D)
            self.bos = nn.Parameter(torch.zeros(D))
            self.register_buffer("mean", torch.tensor(c.mean, dtype=torch.float32), persistent=False)
            self.register_buffer("std", torch.tensor(c.std, dtype=torch.float32), persistent=False)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(D, c.norm_eps)
        self.head = nn.Linear(D, c.vocab_out)

    # -- inputs ---------------------------------------------------------------------------
    def normalize_inputs(self, x):
        """Timeseries (B, T, C) raw values -> normalised, NaN -> 0 (after normalising)."""
        xn = (x.to(self.std.dtype) - self.mean) / self.std
        return torch.nan_to_num(xn, nan=0.0)

    def _embed(self, x):
        if self.config.modality == "dna":
            return self.embed(x.long())  # (B, T, D)
        return self.embed(self.normalize_inputs(x))

    # -- state ----------------------------------------------------------------------------
    def zero_state(self, batch_size: int) -> ModelState:
        c = self.config
        p = self.head.weight
        L, H, K, D = c.n_layers, c.n_heads, c.head_dim, c.d_model
        return ModelState(p.new_zeros((batch_size, L, H, K, K), dtype=torch.float32),
                          p.new_zeros((batch_size, L, H, K), dtype=torch.float32),
                          p.new_zeros((batch_size, L, c.conv_width - 1, D)),
                          p.new_zeros((batch_size, D)))

    def initial_state(self, batch_size: int = 1) -> ModelState:
        """The state after reading BOS (differentiable)."""
        if self.config.modality == "dna":
            h = self.embed.weight[BOS].expand(batch_size, 1, -1)
        else:
            h = self.bos.expand(batch_size, 1, -1)
        _, state = self._run(h, self.zero_state(batch_size))
        return state

    # -- forward --------------------------------------------------------------------------
    def _run(self, h, state: ModelState):
        if not torch.is_grad_enabled():
            # CPU inference updates the residual stream in place (Block._infer)
            h = h.clone(memory_format=torch.contiguous_format)
        Ss, zs, ws = [], [], []
        for i, layer in enumerate(self.layers):
            h, S, z, w = layer(h, state.S[:, i], state.z[:, i], state.conv[:, i])
            Ss.append(S)
            zs.append(z)
            ws.append(w)
        y = self.norm(h)  # (B, T, D)
        new = ModelState(torch.stack(Ss, 1), torch.stack(zs, 1), torch.stack(ws, 1),
                         y[:, -1] if y.shape[1] else state.y)
        return y, new

    def forward(self, x, state: ModelState):
        """x (B, T) tokens or (B, T, C) raw values -> (y (B, T, D), new state)."""
        return self._run(self._embed(x), state)

    def predict(self, x, state: ModelState):
        """(pred (B, T, 4|C), y, new_state): pred[:, i] is the head's output before reading x_i."""
        y, new = self.forward(x, state)
        prev = torch.cat([state.y.unsqueeze(1), y[:, :-1]], dim=1)[:, :y.shape[1]]  # (B, T, D)
        return self.head(prev), y, new


# --------------------------------------------------------------------------------------------
# init / save / load
# --------------------------------------------------------------------------------------------
def default_decay(n_heads: int) -> list[float]:
    """Heads spread from short (1 - 1/16) to long (1 - 1/65536) memory, geometric in 1 - gamma."""
    if n_heads == 1:
        return [1 - 2.0 ** -8]
    return [1 - 2.0 ** -(4 + 12 * h / (n_heads - 1)) for h in range(n_heads)]


def init_net(config: ModelConfig, *, seed: int = 0, decay=None) -> LinpipeNet:
    """A randomly initialised network with scales that keep outputs finite and varied."""
    c = config
    if decay is None:
        decay = default_decay(c.n_heads)
    elif isinstance(decay, (int, float)):
        decay = [float(decay)] * c.n_heads
    decay = [float(g) for g in decay]
    if len(decay) != c.n_heads:
        raise ModelError(f"--decay: got {len(decay)} values for {c.n_heads} heads (give 1 or {c.n_heads})")
    if not all(0 < g <= 1 for g in decay):
        raise ModelError(f"--decay: every value must be in (0, 1], got {decay}")
    gen = torch.Generator().manual_seed(seed)
    net = LinpipeNet(c)
    D, M, L = c.d_model, c.mlp_hidden, c.n_layers

    def normal(t, std):
        with torch.no_grad():
            t.copy_(torch.randn(t.shape, generator=gen) * std)

    with torch.no_grad():
        normal(net.embed.weight, 1.0 if c.modality == "dna" else 1.0 / math.sqrt(c.channels))
        if c.modality == "timeseries":
            net.embed.bias.zero_()
            normal(net.bos, 1.0)
        for layer in net.layers:
            a = layer.attn
            if a.conv is not None:  # near-identity: mostly the current position, a little history
                normal(a.conv.weight, 0.3 / math.sqrt(c.conv_width))
                a.conv.weight[:, -1] += 1.0
            for lin in (a.q_proj, a.k_proj, a.v_proj):
                normal(lin.weight, 1.0 / math.sqrt(D))
            normal(a.o_proj.weight, 1.0 / math.sqrt(D * 2 * L))  # residual branches scaled by depth
            a.decay.copy_(torch.tensor(decay))
            normal(layer.mlp.fc1.weight, 1.0 / math.sqrt(D))
            normal(layer.mlp.fc2.weight, 1.0 / math.sqrt(M * 2 * L))
        normal(net.head.weight, 1.0 / math.sqrt(D))
        net.head.bias.zero_()
    return net


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_model(net: LinpipeNet, config: ModelConfig, directory) -> str:
    """Writes format v1 (config.json, model.safetensors) into directory; returns the sha256."""
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in net.state_dict().items()}
    _check_tensors(config, tensors, str(d / WEIGHTS_FILE))
    tmp = d / (WEIGHTS_FILE + ".tmp")
    # One metadata key only: safetensors writes a map in random order, and the sha256 must be stable.
    save_file(tensors, str(tmp), metadata={"format": f"{FORMAT_NAME}-v{FORMAT_VERSION}"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # safetensors writes 0600; a shipped model must be readable
    os.replace(tmp, d / WEIGHTS_FILE)
    (d / CONFIG_FILE).write_text(json.dumps(config.to_json(), indent=2) + "\n")
    return _sha256(d / WEIGHTS_FILE)


def _check_tensors(config: ModelConfig, tensors: dict, where: str):
    """Every tensor present with its shape, nothing extra, finite values, decay in (0, 1]."""
    shapes = expected_shapes(config)
    for name, shape in shapes.items():
        if name not in tensors:
            raise ModelError(f"{where}: missing tensor {name!r} (expected shape {list(shape)})")
        got = tuple(tensors[name].shape)
        if got != shape:
            raise ModelError(f"{where}: tensor {name!r} has shape {list(got)}, expected {list(shape)} "
                             f"from config.json")
    extra = sorted(set(tensors) - set(shapes))
    if extra:
        raise ModelError(f"{where}: unexpected tensor {extra[0]!r} for this config.json"
                         + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    for name, t in tensors.items():
        if not t.is_floating_point():
            raise ModelError(f"{where}: tensor {name!r} has dtype {t.dtype}, expected floating point")
        if not bool(torch.isfinite(t).all()):
            raise ModelError(f"{where}: tensor {name!r} has non-finite values")
        if name.endswith(".attn.decay") and not bool(((t > 0) & (t <= 1)).all()):
            raise ModelError(f"{where}: tensor {name!r} has values outside (0, 1]: {t.tolist()}")


def resolve_model_path(path_or_name) -> Path:
    """A directory as given, or a shipped model by name (pipeline/model/shipped/NAME)."""
    p = Path(path_or_name)
    if p.is_dir():
        return p
    name = str(path_or_name)
    if re.fullmatch(r"[A-Za-z0-9_.-]+", name) and (SHIPPED_MODELS / name).is_dir() and name not in (".", ".."):
        return SHIPPED_MODELS / name
    if p.exists():
        raise ModelError(f"{p}: a model must be a directory holding {CONFIG_FILE} and {WEIGHTS_FILE}")
    shipped = sorted(x.name for x in SHIPPED_MODELS.iterdir() if x.is_dir()) if SHIPPED_MODELS.is_dir() else []
    raise ModelError(f"{name}: no such model directory, and no shipped model of that name "
                     f"(shipped: {', '.join(shipped) or 'none'})")


def read_config(directory: Path) -> ModelConfig:
    cfg = directory / CONFIG_FILE
    if not cfg.is_file():
        raise ModelError(f"{directory}: missing {CONFIG_FILE} (not a linpipe model directory)")
    try:
        d = json.loads(cfg.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelError(f"{cfg}: not valid JSON ({e})") from None
    return ModelConfig.from_json(d, str(cfg))


def read_tensors(directory: Path, config: ModelConfig) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = directory / WEIGHTS_FILE
    if not path.is_file():
        pickles = sorted(f.name for f in directory.iterdir()
                         if f.name in PICKLE_NAMES or f.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise ModelError(f"{directory}: found {pickles[0]} but no {WEIGHTS_FILE}; linpipe loads "
                             f"safetensors only and never unpickles files (convert the weights)")
        raise ModelError(f"{directory}: missing {WEIGHTS_FILE}")
    with open(path, "rb") as f:
        head = f.read(9)
    # safetensors: an 8-byte header length, then the JSON header. Only a file that is not that
    # and starts like a pickle stream or a torch.save zip is called a pickle (the first byte of a
    # valid file is the header length's low byte, which can be 0x80).
    is_safetensors = head[8:9] == b"{"
    if not is_safetensors and (head[:1] == b"\x80" or head[:2] == b"PK"):
        raise ModelError(f"{path}: this is a pickle/torch.save file, not safetensors; "
                         f"linpipe never unpickles files")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelError(f"{path}: not a readable safetensors file ({msg})") from None
    _check_tensors(config, tensors, str(path))
    return tensors


def load_model(path_or_name="default", device=None) -> "Model":
    """Loads and validates a format v1 model directory (or a shipped model by name)."""
    directory = resolve_model_path(path_or_name)
    config = read_config(directory)
    tensors = read_tensors(directory, config)
    net = LinpipeNet(config)
    net.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    return Model(net, config, sha256=_sha256(directory / WEIGHTS_FILE), path=directory, device=device)


def count_parameters(config: ModelConfig) -> int:
    return sum(math.prod(s) for s in expected_shapes(config).values())


# --------------------------------------------------------------------------------------------
# inference
# --------------------------------------------------------------------------------------------
class Model:
    """Inference over numpy chunks with a carried state (see module docstring)."""

    def __init__(self, net: LinpipeNet, config: ModelConfig | None = None, *, sha256: str | None = None,
                 path: Path | None = None, device=None):
        self.config = config or net.config
        self.device = torch.device(device) if device is not None else next(net.parameters()).device
        self.net = net.to(self.device).eval()
        self.sha256 = sha256
        self.path = path

    @property
    def modality(self) -> str:
        return self.config.modality

    @property
    def output_names(self) -> tuple:
        return self.config.output_names

    def __repr__(self):
        c = self.config
        return (f"Model({self.path or '<in memory>'}, {c.modality}, D={c.d_model}, L={c.n_layers}, "
                f"H={c.n_heads}, M={c.mlp_hidden}, W={c.conv_width})")

    def init_state(self) -> ModelState:
        with torch.inference_mode():
            return self.net.initial_state(1)

    def _outputs(self, outputs) -> tuple:
        if outputs is None:
            return self.output_names
        outputs = tuple(outputs)
        bad = [o for o in outputs if o not in self.output_names]
        if bad:
            raise ModelError(f"unknown output {bad[0]!r} for a {self.modality} model "
                             f"(expected some of {', '.join(self.output_names)})")
        return outputs

    def _inputs(self, x) -> torch.Tensor:
        """numpy chunk -> (B=1, T[, C]) tensor on the device, validated."""
        c = self.config
        x = np.asarray(x)
        if c.modality == "dna":
            if x.ndim != 1:
                raise ModelError(f"dna input must be a 1-d token array, got shape {x.shape}")
            if x.size and (int(x.max()) > TOKEN_N or int(x.min()) < 0):
                raise ModelError(f"dna tokens must be 0..{TOKEN_N} (A C G T N), got {int(x.max())}")
            return torch.from_numpy(x.astype(np.int64, copy=False)).to(self.device)[None]
        if x.ndim != 2 or x.shape[1] != c.channels:
            raise ModelError(f"timeseries input must have shape (T, {c.channels}), got {x.shape}")
        return torch.from_numpy(x.astype(np.float32, copy=False)).to(self.device)[None]

    def _check_state(self, state: ModelState):
        c = self.config
        L, H, K, D, W = c.n_layers, c.n_heads, c.head_dim, c.d_model, c.conv_width
        want = {"S": (L, H, K, K), "z": (L, H, K), "conv": (L, W - 1, D), "y": (D,)}
        for k, shape in want.items():
            got = tuple(getattr(state, k).shape[1:])
            if got != shape:
                raise ModelError(f"model state {k!r} has shape {list(got)}, this model needs {list(shape)}")

    def _heads(self, x, prev, y, outs) -> dict:
        """Per-position outputs from y before each position (prev) and y after it."""
        res = {}
        if "hidden" in outs:
            res["hidden"] = y
        if self.modality == "dna":
            if "logprob" in outs or "entropy" in outs:
                logp = torch.log_softmax(self.net.head(prev), dim=-1)  # (B, T, 4)
                if "logprob" in outs:
                    lp = logp.gather(-1, x.clamp(max=3).unsqueeze(-1)).squeeze(-1)
                    res["logprob"] = torch.where(x == TOKEN_N, float("nan"), lp)
                if "entropy" in outs:
                    res["entropy"] = -(logp.exp() * logp).sum(-1)
        else:
            if "forecast" in outs or "residual" in outs:
                fc = self.net.head(prev) * self.net.std + self.net.mean  # (B, T, C)
                if "forecast" in outs:
                    res["forecast"] = fc
                if "residual" in outs:
                    res["residual"] = x - fc  # NaN where x is NaN
        return res

    def forward(self, x, state: ModelState, outputs=None):
        """One chunk of one record -> (dict of float32 numpy arrays, state after the chunk)."""
        outs = self._outputs(outputs)
        self._check_state(state)
        xt = self._inputs(x)
        T = xt.shape[1]
        parts = {o: [] for o in outs}
        state = state.to(self.device)
        with torch.inference_mode():
            for a in range(0, T, FORWARD_BLOCK):  # bounded memory whatever the chunk length
                xb = xt[:, a:a + FORWARD_BLOCK]
                y, new = self.net(xb, state)
                prev = torch.cat([state.y.unsqueeze(1), y[:, :-1]], dim=1)
                for k, v in self._heads(xb, prev, y, outs).items():
                    parts[k].append(v[0].to("cpu", torch.float32).numpy())
                state = new
        res = {}
        for k in outs:
            if parts[k]:
                res[k] = parts[k][0] if len(parts[k]) == 1 else np.concatenate(parts[k])
            else:
                dim = self.config.output_dims[k]
                res[k] = np.zeros((0,) if dim is None else (0, dim), np.float32)
        return res, state

    def forward_records(self, xs, outputs=None, max_batch_positions: int = 1 << 18) -> list[dict]:
        """Whole short records from a fresh state, batched with end padding (causal: padding
        after a record cannot change it). Records of similar length share a batch."""
        outs = self._outputs(outputs)
        xs = [np.asarray(x) for x in xs]
        results = [None] * len(xs)
        order = sorted(range(len(xs)), key=lambda i: len(xs[i]))
        i = 0
        while i < len(order):
            # grow the batch while the padded size stays within max_batch_positions
            j = i + 1
            while j < len(order) and len(xs[order[j]]) * (j - i + 1) <= max_batch_positions:
                j += 1
            idx = order[i:j]
            longest = max(len(xs[k]) for k in idx)
            results_batch = self._batch(xs, idx, longest, outs)
            for k, r in zip(idx, results_batch):
                results[k] = r
            i = j
        return results

    def _batch(self, xs, idx, longest, outs) -> list[dict]:
        c = self.config
        B = len(idx)
        if c.modality == "dna":
            pad = np.full((B, longest), TOKEN_N, np.int64)
        else:
            pad = np.zeros((B, longest, c.channels), np.float32)
        for r, k in enumerate(idx):
            self._inputs(xs[k])  # validate each record
            pad[r, :len(xs[k])] = xs[k]
        xt = torch.from_numpy(pad).to(self.device)
        with torch.inference_mode():
            state = self.net.initial_state(B)
            y, _ = self.net(xt, state)
            prev = torch.cat([state.y.unsqueeze(1), y[:, :-1]], dim=1)[:, :longest]
            res = {k: v.to("cpu", torch.float32).numpy() for k, v in self._heads(xt, prev, y, outs).items()}
        return [{o: res[o][r, :len(xs[k])].copy() for o in outs} for r, k in enumerate(idx)]
