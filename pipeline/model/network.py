"""The network of format v1, written once for every family: embedding, the family's layers (each
from its folder, linpipe.model.families), the final norm and the head; its initialisation.

One definition serves training (differentiable, batched) and inference (no autograd, a run of
positions at a time with a carried `ModelState`). Nothing here depends on the family: a layer
takes the residual stream and its own state arrays and gives both back (blocks.Layer).

Shapes: B batch, T positions, D = d_model, L = n_layers.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from linpipe.errors import ModelError, option
from linpipe.inputs.alphabet import BOS, VOCAB_SIZE
from linpipe.model import series
from linpipe.model.blocks import RMSNorm
from linpipe.model.config import ModelConfig
from linpipe.model.families import layer_module
from linpipe.model.rows import ROW_ALIGN
from linpipe.model.state import ModelState

# Positions per network call on the CPU (a span), and the rows of every position-wise op's tile
# (linpipe.model.rows): the most, between 2,048 and 16,384, whose widest temporary (the (T, 3D)
# projections or the (T, M) MLP hidden: Family.span_width) holds at most SPAN_FLOATS floats.
# Small models need the long spans: their cost per call is torch's per-op overhead, not
# arithmetic (a D=8 model ran 2.4M positions/s in spans of 2,048, 3.6M in spans of 16,384); for
# wide ones a long span spills the temporaries from cache (D=128, M=512: 16,384 was ~25% slower
# than 2,048).
SPAN_FLOATS = 2048 * 192
MIN_SPAN, MAX_SPAN = 2048, 16384


def forward_span(config: ModelConfig) -> int:
    """Positions per network call on the CPU for this model (see SPAN_FLOATS): a power of two,
    so a whole number of the kernel's fold groups and of ROW_ALIGN."""
    width = config.spec.span_width(config)
    span = MIN_SPAN
    while span * 2 <= MAX_SPAN and span * 2 * width <= SPAN_FLOATS:
        span *= 2
    assert span % ROW_ALIGN == 0
    return span


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
        self.span = forward_span(c)
        make = layer_module(c.spec).make_block
        self.layers = nn.ModuleList(make(c, self.span) for _ in range(c.n_layers))
        self.norm = RMSNorm(D, c.norm_eps)
        self.head = nn.Linear(D, c.vocab_out)
        self.logit_cap = c.spec.logit_cap(c)  # the family's soft cap of the logits (None: none)

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
        dtypes = {"float32": torch.float32, "float64": torch.float64}
        arrays = {a.name: p.new_zeros((batch_size, *a.shape), dtype=dtypes[a.dtype]) for a in c.state()}
        return ModelState(arrays, p.new_zeros((batch_size, c.d_model)),
                          series.zero_norm(batch_size, p.device, c.season_lags) if c.series_norm else None)

    def initial_state(self, batch_size: int = 1) -> ModelState:
        """The state after reading BOS (differentiable): computed once and repeated for every
        batch row, so that it is the same bytes in a batch of any size. A family whose layers read
        the whole record reads no BOS: its state entering a record is zeros (its split's)."""
        if self.config.spec.record:
            return self.zero_state(batch_size)
        h = (self.embed.weight[BOS] if self.config.modality == "dna" else self.bos).view(1, 1, -1)
        _, state = self._run(h, self.zero_state(1))
        if batch_size == 1:
            return state
        return state.map(lambda t: t.expand(batch_size, *t.shape[1:]).clone())

    # -- forward --------------------------------------------------------------------------
    def _run(self, h, state: ModelState):
        if self.config.spec.record:  # its layers read the whole record: there is no causal stream
            raise ModelError(f"a {self.config.family} model reads the whole record on both sides: run it "
                             f"with `linpipe submit`, or in process with {self.config.spec.record}")
        layers = []
        for i, layer in enumerate(self.layers):
            h, st = layer(h, state.layer(i))
            layers.append(st)
        y = self.norm(h)  # (B, T, D)
        return y, ModelState.stack(layers, y[:, -1] if y.shape[1] else state.y, state.norm)

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
        return self.capped(self.head(y_before(y, state.y))), y, new

    def capped(self, logits):
        """The head's logits soft-capped where the family caps them: c tanh(logits / c)."""
        c = self.logit_cap
        return logits if c is None else torch.tanh(logits / c) * c


def y_before(y, y0):
    """y (B, T, D) of positions 0..T-1 and y0 (B, D) of the position before them -> (B, T, D): y
    of the position before each (the head's input: the prediction of x_i comes from y before it)."""
    return torch.cat([y0.unsqueeze(1), y[:, :-1]], dim=1)[:, :y.shape[1]]


def init_net(config: ModelConfig, *, seed: int = 0, decay=None) -> LinpipeNet:
    """A randomly initialised network with scales that keep outputs finite and varied. `decay`
    sets the initial decays of the families that take them (linear attention's fixed decays, or
    for a gated model the decays its gates start around)."""
    c = config
    if decay is not None:
        problem = c.spec.decay_problem(c, decay)
        if problem:
            raise ModelError(f"{option('decay')} {problem}")
    gen = torch.Generator().manual_seed(seed)
    net = LinpipeNet(c)
    init_block = layer_module(c.spec).init_block

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
            init_block(layer, c, normal, gen, decay)
        normal(net.head.weight, 1.0 / math.sqrt(c.d_model))
        if c.series_norm:  # a zero head predicts no change: the untrained model is last-value
            net.head.weight.zero_()
        net.head.bias.zero_()
    return net
