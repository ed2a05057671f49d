"""Inference: `Model` runs a record's positions, a run at a time, through the network with a carried
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
from linpipe.kernels.linear_attn import EXACT_CUT
from linpipe.kernels.linear_attn.scratch import hugepages
from linpipe.model import season, series
from linpipe.model.config import WEIGHTS_FILE, ModelConfig
from linpipe.model.files import file_sha256, read_config, read_tensors, resolve_model_path
from linpipe.model.network import LinpipeNet, y_before
from linpipe.model.rows import linear, map_rows, row_tile
from linpipe.model.shapes import expected_shapes
from linpipe.model.state import ModelState
from linpipe.model.threads import forward_threads


def load_model(path_or_name="default", device=None, threads: int | None = None) -> "Model":
    """Loads and validates a format v1 model directory (or a shipped model by name). threads:
    torch threads of each CPU forward (None: the caller's, else the cores not busy now:
    linpipe.model.threads)."""
    directory = resolve_model_path(path_or_name)
    config = read_config(directory)
    tensors = read_tensors(directory, config)
    net = LinpipeNet(config)
    net.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    return Model(net, config, sha256=file_sha256(directory / WEIGHTS_FILE), path=directory, device=device,
                 threads=threads)


def count_parameters(config: ModelConfig) -> int:
    return sum(math.prod(s) for s in expected_shapes(config).values())


class Model:
    """Inference over a record's positions, a run at a time, with a carried state (see module docstring)."""

    def __init__(self, net: LinpipeNet, config: ModelConfig | None = None, *, sha256: str | None = None,
                 path: Path | None = None, device=None, threads: int | None = None):
        self.config = config or net.config
        self.threads = threads  # torch threads of a CPU forward; None: linpipe.model.threads picks
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

    # -- the public surface the entry points and the split (segments.py) share ---------------
    def select_outputs(self, outputs) -> tuple:
        """The validated output names of `outputs` (None: all of the modality's)."""
        if outputs is None:
            return self.output_names
        outputs = tuple(outputs)
        bad = [o for o in outputs if o not in self.output_names]
        if bad:
            raise ModelError(f"unknown output {bad[0]!r} for a {self.modality} model "
                             f"(expected some of {', '.join(self.output_names)})")
        return outputs

    def to_tensor(self, x) -> torch.Tensor:
        """Positions of one record (numpy), validated -> the network's input on the device: (1, T)
        tokens, (1, T, C) values, or for series_norm models one lane per channel (C, T, 1)."""
        c = self.config
        x = np.asarray(x)
        if c.modality == "dna":
            if x.ndim != 1:
                raise ModelError(f"dna input must be a 1-d token array, got shape {x.shape}")
            self._check_tokens(x)
            return torch.from_numpy(x.astype(np.int64, copy=False)).to(self.device)[None]
        if c.series_norm:  # any number of channels, each its own lane: (C, T, 1), float64 kept
            if x.ndim != 2 or x.shape[1] < 1:
                raise ModelError(f"timeseries input must have shape (T, channels), got {x.shape}")
            return torch.from_numpy(np.ascontiguousarray(x.T, dtype=np.float64)).to(self.device)[..., None]
        if x.ndim != 2 or x.shape[1] != c.channels:
            raise ModelError(f"timeseries input must have shape (T, {c.channels}), got {x.shape}")
        return torch.from_numpy(x.astype(np.float32, copy=False)).to(self.device)[None]

    @staticmethod
    def _check_tokens(x: np.ndarray) -> None:
        if x.size and (int(x.max()) > TOKEN_N or int(x.min()) < 0):
            raise ModelError(f"dna tokens must be 0..{TOKEN_N} (A C G T N), got {int(x.max())}")

    # Cut a run of positions after a multiple of this (from the state it starts from) and carry
    # the state across the cut: the same bytes as one call (CPU; docs/pipeline.md, "Guarantees").
    exact_cut = EXACT_CUT

    @property
    def span(self) -> int | None:
        """Positions per network call: the network's span on the CPU, None (a whole run of
        positions at once) on a GPU."""
        return self.net.span if self.device.type == "cpu" else None

    def _head(self, prev, tile):
        """The output head of the rows of y before each position (N, D) -> (N, vocab_out)."""
        logits = linear(prev, self.net.head.weight, bias=self.net.head.bias, tile=tile)
        return logits if self.net.logit_cap is None else map_rows(self.net.capped, tile, logits)

    def _dna_rows(self, prev, x, outs):
        """logprob, entropy and logprob_acgt (those in outs, in DNA_ROWS' order) of rows: y
        before each position (N, D) and its token (N,)."""
        logp = torch.log_softmax(self._head(prev, prev.shape[0] if row_tile(prev, 1) else None), dim=-1)
        got = []
        if "logprob" in outs:
            lp = logp.gather(-1, x.clamp(max=3).unsqueeze(-1)).squeeze(-1)
            got.append(torch.where(x == TOKEN_N, float("nan"), lp))
        if "entropy" in outs:
            got.append(-(logp.exp() * logp).sum(-1))
        if "logprob_acgt" in outs:  # the head's rows 0-3 are A C G T (ModelConfig.head_vocab)
            got.append(logp[:, :4].contiguous())
        return tuple(got)

    # the outputs _dna_rows computes, in its order
    DNA_ROWS = ("logprob", "entropy", "logprob_acgt")

    def heads(self, x, y, y0, outs) -> dict:
        """Per-position outputs {name: (B, T[, ...]) tensor} of inputs x (B, T[, C]) from y (B, T,
        D) after each position and y0 (B, D) of the position before the first (not for
        series_norm models, whose outputs also need the carried norm: `run`). In CPU inference
        the head and what follows it run by tiles of rows (linpipe.model.rows)."""
        B, T, D = y.shape
        prev = y_before(y, y0).reshape(B * T, D)
        tile = row_tile(y, self.net.span)
        res = {}
        if "hidden" in outs:
            res["hidden"] = y
        if self.modality == "dna":
            want = [o for o in self.DNA_ROWS if o in outs]
            if want:
                got = map_rows(lambda p, t: self._dna_rows(p, t, want), tile, prev, x.reshape(B * T))
                res.update({o: v.view(B, T, *v.shape[1:]) for o, v in zip(want, got, strict=True)})
        else:
            if "forecast" in outs or "residual" in outs:
                fc = self._head(prev, tile).view(B, T, -1) * self.net.std + self.net.mean  # (B, T, C)
                if "forecast" in outs:
                    res["forecast"] = fc
                if "residual" in outs:
                    res["residual"] = x - fc  # NaN where x is NaN
        return res

    def _lane_heads(self, x, y, before, new, outs) -> dict:
        """series_norm: outputs per lane (lanes, T[, D]); fills the residual scale into new.norm."""
        nz = self.net.series_inputs(x, before)
        B, T, D = y.shape
        prev = y_before(y, before.y).reshape(B * T, D)
        p = self._head(prev, row_tile(y, self.net.span)).view(B, T, -1)[..., 0]
        p = p.to(torch.float64)  # the change, in running scales
        w, new.norm = series.calibrate(p, nz["target"], before.norm, new.norm)
        fc = nz["base"] + nz["scale"] * (w * p)  # NaN: nothing observed yet
        if self.config.season_lags:
            fc, new.norm = season.mix(x[..., 0], nz["base"], nz["scale"], fc, before.norm, new.norm,
                                      self.config.season_lags)
        r = x[..., 0] - fc
        res = {"hidden": y} if "hidden" in outs else {}
        if "forecast" in outs:
            res["forecast"] = fc
        if "residual" in outs:
            res["residual"] = r
        score, new.norm = series.anomaly(r, before.norm, new.norm)
        if "anomaly" in outs:
            res["anomaly"] = score
        return res

    def run(self, xt: torch.Tensor, state: ModelState, outs: tuple, span: int | None = None):
        """The forward core every entry point calls: the network's inputs xt (B, T[, C]; lanes
        (B, T, 1) for series_norm models) read after `state` (B on the device) -> ({output:
        (B, T[, ...]) tensor}, state after). The network runs `span` positions a call (None:
        all at once), each call's outputs from y before and after its positions."""
        B, T = xt.shape[:2]
        step = span or max(T, 1)
        res = {}
        with torch.inference_mode(), forward_threads(self.device, self.threads):
            for a in range(0, T, step):
                xb = xt[:, a:a + step]
                y, new = self.net(xb, state)
                if self.config.series_norm:
                    got = self._lane_heads(xb, y, state, new, outs)
                else:
                    got = self.heads(xb, y, state.y, outs)
                for k, v in got.items():
                    if k not in res:  # the whole run's outputs, filled call by call
                        res[k] = v if v.shape[1] == T else v.new_empty((B, T, *v.shape[2:]))
                        hugepages(res[k])
                    if res[k] is not v:
                        res[k][:, a:a + v.shape[1]] = v
                state = new
        for k in outs:
            if k not in res:
                dim = None if self.config.series_norm and k != "hidden" else self.config.output_dims[k]
                res[k] = torch.zeros((B, 0) if dim is None else (B, 0, dim))
        return res, state

    def _check_state(self, state: ModelState):
        shapes = self.config.state_shapes()
        got = {**state.arrays, "y": state.y}
        for k in got.keys() - shapes.keys():
            raise ModelError(f"model state {k!r}: this model's state has no such array "
                             f"(it carries {', '.join(shapes)})")
        for k, shape in shapes.items():
            if k not in got:
                raise ModelError(f"model state lacks {k!r}, which this model carries (shape {list(shape)})")
            if tuple(got[k].shape[1:]) != shape:
                raise ModelError(f"model state {k!r} has shape {list(got[k].shape[1:])}, this model needs "
                                 f"{list(shape)}")
        size = series.norm_size(self.config.season_lags)
        if self.config.series_norm and state.norm is not None and state.norm.shape[-1] != size:
            raise ModelError(f"model state 'norm' has {state.norm.shape[-1]} values, this model "
                             f"carries {size} (a state saved by another model or linpipe version, "
                             f"whose anomaly score was computed otherwise)")

    def _lanes_outputs(self, outputs, outs, channels: int) -> tuple:
        """series_norm: `hidden` is per channel, so with several channels it is dropped when no
        outputs were named, and an error when it was."""
        if not self.config.series_norm or channels == 1 or "hidden" not in outs:
            return outs
        if outputs is None:
            return tuple(o for o in outs if o != "hidden")
        raise ModelError(f"output 'hidden' of a per-channel (series_norm) model needs a "
                         f"one-channel input, got {channels} channels")

    @staticmethod
    def _numpy(res: dict, lanes: int | None = None) -> dict:
        """The core's (B, T[, ...]) tensors as float32 numpy; with `lanes` channels per record,
        per-lane (B*lanes, T) outputs come back as (B, T, lanes)."""
        out = {}
        for k, v in res.items():
            v = v.to("cpu", torch.float32).numpy()
            if lanes is not None and k != "hidden":
                v = v.reshape(v.shape[0] // lanes, lanes, v.shape[1]).transpose(0, 2, 1)
            out[k] = v
        return out

    # -- entry points ---------------------------------------------------------------------
    def forward(self, x, state: ModelState, outputs=None):
        """Consecutive positions of one record (in the pipeline, a unit) after `state` -> (dict of
        float32 numpy arrays, state after them)."""
        outs = self.select_outputs(outputs)
        self._check_state(state)
        xt = self.to_tensor(x)
        state = state.to(self.device)
        lanes = xt.shape[0] if self.config.series_norm else None
        if lanes is not None:
            outs = self._lanes_outputs(outputs, outs, lanes)
            if state.batch_size != lanes:
                if state.batch_size != 1 or bool(state.norm.any()):
                    raise ModelError(f"model state has {state.batch_size} channel lanes, the input "
                                     f"{lanes} channels")
                state = state.map(lambda t: t.expand(lanes, *t.shape[1:]).clone())  # a fresh state
        res, state = self.run(xt, state, outs, self.span)
        return {k: v[0] for k, v in self._numpy(res, lanes).items()}, state

    def forward_records(self, xs, outputs=None, max_batch_positions: int = 1 << 18) -> list[dict]:
        """Whole short records from a fresh state, batched with end padding (causal: padding
        after a record cannot change it). Records of similar length share a batch."""
        outs = self.select_outputs(outputs)
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
            for k, r in zip(idx, self._padded([xs[k] for k in idx], None, outputs, outs), strict=True):
                results[k] = r
            i = j
        return results

    def forward_batch(self, xs, states: list[ModelState], outputs=None) -> list[dict]:
        """Many runs of positions, each continuing its own carried state, in one batched (end-padded) call:
        xs[i] is read after states[i] (B = 1 states, e.g. from `forward` or a boundary state).
        Returns per-position outputs only (no final states): variant scoring runs every
        alternative allele from the reference's state at the variant in one call."""
        outs = self.select_outputs(outputs)
        if len(xs) != len(states):
            raise ModelError(f"forward_batch got {len(xs)} inputs and {len(states)} states")
        if not xs:
            return []
        for s in states:
            self._check_state(s)
        return self._padded([np.asarray(x) for x in xs], states, outputs, outs)

    def _padded(self, xs, states, outputs, outs) -> list[dict]:
        """Records or runs of positions xs, end-padded into one batch, through the core from `states` (B = 1
        each; None: fresh) -> per-record outputs (outs, from the caller's `outputs`)."""
        c = self.config
        B, longest = len(xs), max(len(x) for x in xs)
        dna = c.modality == "dna"
        for x in xs:  # validate each record (dna tokens: on the padded batch, in one pass)
            if not dna or x.ndim != 1:
                self.to_tensor(x)
        lanes = None
        if c.series_norm:  # every channel of every record is a lane (end padding is causal)
            lanes = max(x.shape[1] if x.ndim == 2 else 1 for x in xs)
            pad = np.zeros((B, lanes, longest), np.float64)
            for r, x in enumerate(xs):
                if x.shape[1] != lanes:
                    raise ModelError(f"records batched together have {x.shape[1]} and {lanes} channels")
                pad[r, :, :len(x)] = x.T
            pad = pad.reshape(B * lanes, longest, 1)
            outs = self._lanes_outputs(outputs, outs, lanes)
        elif c.modality == "dna":
            pad = np.full((B, longest), TOKEN_N, np.int64)
        else:
            pad = np.zeros((B, longest, c.channels), np.float32)
        if lanes is None:
            for r, x in enumerate(xs):
                pad[r, :len(x)] = x
        if dna:
            self._check_tokens(pad)
        xt = torch.from_numpy(pad).to(self.device)
        if states is None:
            with torch.inference_mode():
                state = self.net.initial_state(xt.shape[0])
        else:
            state = ModelState.cat([s.to(self.device) for s in states])
        res = self._numpy(self.run(xt, state, outs, self.span)[0], lanes)
        return [{o: res[o][r, :len(x)].copy() for o in outs} for r, x in enumerate(xs)]
