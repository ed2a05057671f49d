"""Inference: `Model` runs numpy chunks of one record through the network with a carried
`ModelState` (or many short records batched); `load_model` reads a model directory.

Position bookkeeping: the network reads u = [BOS, x_0, ..., x_{N-1}]; y_j is its final
representation after u_j. The prediction of x_i comes from y of the position before it, so
the carried state ends with `y` of the last position read, and hidden[i] = y after x_i.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from linpipe.errors import ModelError
from linpipe.inputs.alphabet import N as TOKEN_N
from linpipe.model import series
from linpipe.model.config import WEIGHTS_FILE, ModelConfig, expected_shapes
from linpipe.model.files import file_sha256, read_config, read_tensors, resolve_model_path
from linpipe.model.network import LinpipeNet, ModelState

# Positions per network call on the CPU: bounds peak memory for any chunk length, and keeps the
# temporaries (e.g. the (T, M) MLP hidden) small enough to stay in cache: 16,384 was measured
# ~25% slower than 2,048 at 1 thread. A GPU call takes a whole chunk.
FORWARD_BLOCK = 2048


def load_model(path_or_name="default", device=None) -> "Model":
    """Loads and validates a format v1 model directory (or a shipped model by name)."""
    directory = resolve_model_path(path_or_name)
    config = read_config(directory)
    tensors = read_tensors(directory, config)
    net = LinpipeNet(config)
    net.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    return Model(net, config, sha256=file_sha256(directory / WEIGHTS_FILE), path=directory, device=device)


def count_parameters(config: ModelConfig) -> int:
    return sum(math.prod(s) for s in expected_shapes(config).values())


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
        if c.series_norm:  # any number of channels, each its own lane: (C, T, 1), float64 kept
            if x.ndim != 2 or x.shape[1] < 1:
                raise ModelError(f"timeseries input must have shape (T, channels), got {x.shape}")
            return torch.from_numpy(np.ascontiguousarray(x.T, dtype=np.float64)).to(self.device)[..., None]
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

    def _series_heads(self, x, before, prev, y, new, outs) -> dict:
        """series_norm: outputs per lane (C, T[, D]); fills the residual scale into new.norm."""
        nz = self.net.series_inputs(x, before)
        p = self.net.head(prev)[..., 0].to(torch.float64)  # the change, in units of the running scale
        w, new.norm = series.calibrate(p, nz["target"], before.norm, new.norm)
        fc = nz["base"] + nz["scale"] * (w * p)  # NaN: nothing observed yet
        r = x[..., 0] - fc
        res = {}
        if "hidden" in outs:
            if x.shape[0] != 1:
                raise ModelError(f"output 'hidden' of a per-channel (series_norm) model needs a "
                                 f"one-channel input, got {x.shape[0]} channels")
            res["hidden"] = y
        if "forecast" in outs:
            res["forecast"] = fc
        if "residual" in outs:
            res["residual"] = r
        score, new.norm = series.anomaly(r, before.norm, new.norm)
        if "anomaly" in outs:
            res["anomaly"] = score
        return res

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
        lanes = self.config.series_norm
        if lanes and outputs is None and xt.shape[0] > 1:  # hidden is per channel: asked for only
            outs = tuple(o for o in outs if o != "hidden")
            parts = {o: [] for o in outs}
        if lanes and state.batch_size != xt.shape[0]:
            if state.batch_size != 1 or bool(state.norm.any()):
                raise ModelError(f"model state has {state.batch_size} channel lanes, the input "
                                 f"{xt.shape[0]} channels")
            state = state._map(lambda t: t.expand(xt.shape[0], *t.shape[1:]).clone())  # a fresh state
        # CPU: blocks of FORWARD_BLOCK positions; a GPU takes the whole chunk in one call.
        step = FORWARD_BLOCK if self.device.type == "cpu" else max(T, 1)
        with torch.inference_mode():
            for a in range(0, T, step):
                xb = xt[:, a:a + step]
                y, new = self.net(xb, state)
                prev = torch.cat([state.y.unsqueeze(1), y[:, :-1]], dim=1)
                if lanes:
                    for k, v in self._series_heads(xb, state, prev, y, new, outs).items():
                        v = v.to("cpu", torch.float32).numpy()
                        parts[k].append(v[0] if k == "hidden" else v.T)
                else:
                    for k, v in self._heads(xb, prev, y, outs).items():
                        parts[k].append(v[0].to("cpu", torch.float32).numpy())
                state = new
        res = {}
        for k in outs:
            if parts[k]:
                res[k] = parts[k][0] if len(parts[k]) == 1 else np.concatenate(parts[k])
            else:
                dim = self.config.output_dims[k]
                if lanes and k != "hidden":
                    dim = xt.shape[0]
                res[k] = np.zeros((0,) if dim is None else (0, dim), np.float32)
        return res, state

    def forward_records(self, xs, outputs=None, max_batch_positions: int = 1 << 18) -> list[dict]:
        """Whole short records from a fresh state, batched with end padding (causal: padding
        after a record cannot change it). Records of similar length share a batch."""
        outs = self._outputs(outputs)
        xs = [np.asarray(x) for x in xs]
        if self.config.series_norm and outputs is None and any(x.ndim == 2 and x.shape[1] > 1 for x in xs):
            outs = tuple(o for o in outs if o != "hidden")
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
            for k, r in zip(idx, results_batch, strict=False):
                results[k] = r
            i = j
        return results

    def _batch(self, xs, idx, longest, outs) -> list[dict]:
        c = self.config
        B = len(idx)
        if c.series_norm:
            return self._series_batch(xs, idx, longest, outs)
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


    def forward_batch(self, xs, states: list[ModelState], outputs=None) -> list[dict]:
        """Many chunks, each continuing its own carried state, in one batched (end-padded) call:
        xs[i] is read after states[i] (B = 1 states, e.g. from `forward` or a boundary state).
        Returns per-position outputs only (no final states): variant scoring runs every
        alternative allele from the reference's state at the variant in one call."""
        outs = self._outputs(outputs)
        if len(xs) != len(states):
            raise ModelError(f"forward_batch got {len(xs)} inputs and {len(states)} states")
        if not xs:
            return []
        xs = [np.asarray(x) for x in xs]
        c = self.config
        longest = max(len(x) for x in xs)
        B = len(xs)
        if c.modality == "dna":
            pad = np.full((B, longest), TOKEN_N, np.int64)
        else:
            pad = np.zeros((B, longest, c.channels), np.float32)
        for r, x in enumerate(xs):
            self._inputs(x)  # validate each chunk
            pad[r, :len(x)] = x
        for s in states:
            self._check_state(s)
        st = [s.to(self.device) for s in states]
        state = ModelState(torch.cat([s.S for s in st]), torch.cat([s.z for s in st]),
                           torch.cat([s.conv for s in st]), torch.cat([s.y for s in st]))
        xt = torch.from_numpy(pad).to(self.device)
        with torch.inference_mode():
            y, _ = self.net(xt, state)
            prev = torch.cat([state.y.unsqueeze(1), y[:, :-1]], dim=1)[:, :longest]
            res = {k: v.to("cpu", torch.float32).numpy() for k, v in self._heads(xt, prev, y, outs).items()}
        return [{o: res[o][r, :len(x)].copy() for o in outs} for r, x in enumerate(xs)]

    def _series_batch(self, xs, idx, longest, outs) -> list[dict]:
        """series_norm: every channel of every record is a lane (end padding is causal)."""
        B = len(idx)
        C = max(np.asarray(xs[k]).shape[1] if np.asarray(xs[k]).ndim == 2 else 1 for k in idx)
        pad = np.zeros((B, C, longest), np.float64)
        for r, k in enumerate(idx):
            x = np.asarray(xs[k])
            self._inputs(x)
            if x.shape[1] != C:
                raise ModelError(f"records batched together have {x.shape[1]} and {C} channels")
            pad[r, :, :len(x)] = x.T
        xt = torch.from_numpy(pad.reshape(B * C, longest, 1)).to(self.device)
        with torch.inference_mode():
            state = self.net.initial_state(B * C)
            y, new = self.net(xt, state)
            prev = torch.cat([state.y.unsqueeze(1), y[:, :-1]], dim=1)[:, :longest]
            got = self._series_heads(xt, state, prev, y, new, [o for o in outs if o != "hidden"])
        if "hidden" in outs:
            if C != 1:
                raise ModelError("output 'hidden' of a per-channel (series_norm) model needs one channel")
            got["hidden"] = y
        res = {}
        for k, v in got.items():
            v = v.to("cpu", torch.float32).numpy()
            res[k] = v if k == "hidden" else v.reshape(B, C, longest).transpose(0, 2, 1)
        return [{o: res[o][r, :len(xs[k])].copy() for o in outs} for r, k in enumerate(idx)]

