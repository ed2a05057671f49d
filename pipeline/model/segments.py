"""Exact sequence parallelism for inference: one record split into P contiguous segments.

Per layer, the state a segment leaves is a function of the state entering it that each family
writes down as a summary (linear attention: affine, S_out = g S_in + S_loc; the delta rule: M S_in
+ dS), so every segment runs each layer in two passes around one exchange:

1. Pass 1 (right behind pass 2 of the layer before, on the same span while it is in cache; for
   layer 0 behind the embedding): the layer from a zero state, what pass 2 needs per position to
   the spill, the summary kept at every unit edge; its message goes to the driver. The first
   rows whose convolution reads the previous segment (the halo) wait for the fold.
2. The fold (the driver): every segment's exact incoming state, in float64, in a fixed order.
3. Pass 2: the head rows from that state, every later position corrected by the entering
   state's share; then the rest of the layer (o_proj, MLP), the layer's own code.

The record's first segment knows its incoming state: its pass 1 is the layer's mixer itself and
its pass 2 the rest, the serial run's ops on the serial run's spans (P = 1 gives the serial
bytes), and its message is its exact final state. Each family's passes and fold are its
split.py (families/<name>/split.py; docs/architecture.md, "Adding a family"): `halo`,
`row_width`, `weights` (per layer, with its `fold`), `Local` (pass 1), `Correct` (pass 2);
linear attention's is described in families/linear_attn/split.py.

Memory: a segment's residual stream (T, D) and pass 1's rows (T, row_width) live in float32
spills, updated in place layer by layer, span by span; resident memory is a few spans whatever
the segment's length when the spills are files (jobs/split.py puts them in /dev/shm within a
budget, else on local disk; plain reads and writes, not mapped).

Spans are cut at the segment start, at every unit edge and every `Model.span` positions
after a unit edge: exactly the serial run's spans when segment edges are unit edges. The
state at every unit edge inside a segment is recorded on the way (the family's state arrays,
`record_edge`), so the full ModelState of every unit edge can be stored as the streaming path
stores it. The state stored at a segment's last edge is the fold's value (the next segment's
incoming state), so a run restarted from that stored state folds the same numbers in the same
order: bit-identical to an uninterrupted split run with the same segment boundaries.

This module is a segment's side (SegmentRunner); the driver's side, which folds the messages and
calls every segment per layer (run_layers, forward_split), is linpipe.model.segments_run.
"""
from __future__ import annotations

import numpy as np
import torch

from linpipe.model.blocks import scratch_of
from linpipe.model.exchange import Message
from linpipe.model.families import split_module
from linpipe.model.inference import Model
from linpipe.model.spill import Spill
from linpipe.model.state import ModelState

# The record's first segment runs the layer's own attention; every later one also keeps the
# normaliser's parts, spills wider rows and corrects them: 1.0-1.5x the first one's time per
# position in one process (noisy), and with 1.25 two workers reached 1.47-1.69x one worker's
# rate (BENCHMARKS.md, "One record over many workers"). So the first segment gets that much
# more of the record. A delta-rule model's later segment took 0.83-1.36x its first one's time on
# a loaded machine (docs/sequence-parallel.md, "The split of a delta-rule model"): the same weight.
FIRST_WEIGHT = 1.25


def split_of(config):
    """The module of the family's passes and fold (families/<name>/split.py)."""
    return split_module(config.spec)


def first_weight(config) -> float:
    """The first segment's share of a record against each later segment's 1 (segment_bounds):
    FIRST_WEIGHT, or the family's own."""
    own = getattr(split_of(config), "first_weight", None) if config.spec.split else None
    return FIRST_WEIGHT if own is None else own(config)


def segment_bounds(length: int, unit_size: int, n_segments: int,
                   first: float = FIRST_WEIGHT) -> list[tuple[int, int]]:
    """Unit-aligned segments of a record: its units dealt out in order over at most `n_segments`
    segments, the first weighted `first` (first_weight of the model) and the others 1, so every
    unit (its Zarr chunk) belongs to exactly one segment (one writer). A function of its
    arguments alone: a restarted group cuts the record where the lost one did."""
    n = -(-length // unit_size)
    n_segments = max(1, min(n_segments, n))
    total = first + n_segments - 1
    cuts = [0]
    for k in range(1, n_segments):  # at least one unit each
        c = int(n * (first + k - 1) / total + 0.5)
        cuts.append(min(max(c, cuts[-1] + 1), n - (n_segments - k)))
    edges = [min(length, c * unit_size) for c in cuts] + [length]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def unit_bounds(start: int, end: int, unit_size: int) -> list[tuple[int, int]]:
    """(a, b): record positions of each unit's part inside the segment [start, end)."""
    bounds, a = [], start
    while a < end:
        b = min(end, (a // unit_size + 1) * unit_size)
        bounds.append((a, b))
        a = b
    return bounds


def new_runner(model: Model, read, start: int, end: int, unit_size: int, *, length: int | None = None,
               **kw):
    """A segment's runner: SegmentRunner, or the family's own (its split module's `Runner`, e.g.
    a bidirectional family's, which also needs the record's `length`: its last segment's
    right-to-left sweep knows its entering state)."""
    own = getattr(split_of(model.config), "Runner", None)
    if own is None:
        return SegmentRunner(model, read, start, end, unit_size, **kw)
    return own(model, read, start, end, unit_size, length=end if length is None else length, **kw)


def spill_bytes(config, positions: int, exact: bool = False) -> int:
    """Bytes a segment of `positions` keeps outside its spans: its residual stream, and what
    pass 1 leaves for pass 2 (the family's row_width)."""
    return positions * (config.d_model + split_of(config).row_width(config, exact)) * 4


class _Attend:
    """The record's first segment, pass 1 of one layer: its mixer from the state it knows (the
    layer's own code up to o, on the serial run's spans, so its bytes are the serial run's), o to
    the spill, the state at unit edges recorded; the state after the segment is its message. Its
    pass 2 (`_Project`) is the rest of the layer. So it runs in the same two phases around each
    exchange as the other segments, with as much work in each. Any family's: a layer's
    attn_norm, attn and finish."""

    def __init__(self, runner: "SegmentRunner", layer: int, state: dict):
        self.r, self.layer, self.block = runner, layer, runner.net.layers[layer]
        self.state = state  # the layer's arrays, (1, ...) each, carried

    def span(self, s: int, e: int, h: torch.Tensor) -> None:
        r = self.r
        n, D = e - s, r.D
        scratch = scratch_of(h)
        a = self.block.attn_norm(h, out=scratch("attn_in", 1, n, D))
        o, self.state = self.block.attn(a, self.state, scratch)
        r.num.put(s - r.start, o[0].reshape(n, -1).to("cpu").numpy())
        if r.is_edge(e):
            r.record_edge(e, self.layer, {k: v[0] for k, v in self.state.items()})

    def message(self) -> Message:
        return Message(self.r.end - self.r.start, absolute=True,
                       state={k: v[0].cpu().clone() for k, v in self.state.items()})


class _Project:
    """The record's first segment, pass 2 of one layer: o from the spill, then the rest of the
    layer (o_proj, MLP)."""

    def __init__(self, runner: "SegmentRunner", layer: int):
        self.r, self.block = runner, runner.net.layers[layer]

    def span(self, s: int, e: int, h: torch.Tensor) -> torch.Tensor:
        r = self.r
        o = torch.from_numpy(r.num.get(s - r.start, e - r.start)).to(h.device)[None]  # (1, n, X)
        return self.block.finish(h, o, scratch_of(h))


class SegmentRunner:
    """One segment [start, end) of one record on one worker. `read(a, b)` returns the model
    input (numpy) of record positions [a, b). Methods run in this order: begin, then apply per
    layer, then units_out (the outputs).

    Every segment runs each layer in two passes around the exchange: pass 1 (in begin for layer
    0, else right behind pass 2 of the layer before) and pass 2 (in apply). The record's first
    segment (`exact`) knows the state entering it: its pass 1 is the layer's attention
    (`_Attend`), its pass 2 the rest (`_Project`), and its messages carry its final state. The
    others' pass 1 runs from a zero state (the family's `Local`), their pass 2 corrects it once
    the state entering them is known (its `Correct`)."""

    # the last layer's apply can hand each unit on as its rows are done (unit_done): a runner
    # whose outputs need the whole segment's last layer first says False
    streams_units = True

    def __init__(self, model: Model, read, start: int, end: int, unit_size: int, *, spill_dir=None,
                 outputs=None, exact: bool = False):
        if end <= start:
            raise ValueError(f"empty segment [{start}, {end})")
        self.model, self.net, self.read = model, model.net, read
        self.start, self.end, self.unit_size, self.exact = start, end, unit_size, exact
        self.outputs = model.select_outputs(outputs)
        c = model.config
        self.L, self.D = c.n_layers, c.d_model
        self.kind = split_of(c)  # the family's passes and fold
        self.W = self.kind.halo(c) + 1  # the convolution's width, 1 where none is carried
        self.base = min(end, start + self.W - 1)  # positions before it read the halo
        step = model.span or unit_size
        # units: (a, b) record positions of one unit inside this segment; spans: Model.span or less
        self.units = unit_bounds(start, end, unit_size)
        self.spans = [(s, min(s + step, b)) for a, b in self.units for s in range(a, b, step)]
        T = end - start
        self.h = Spill(T, self.D, spill_dir)  # the residual stream
        # what pass 1 leaves for pass 2, rewritten layer after layer: the first segment's o; the
        # others' what their family's pass 2 reads
        self.row_width = self.kind.row_width(c, exact)
        self.num = Spill(T, self.row_width, spill_dir)
        self.edge_states: dict[int, list] = {}  # unit index -> per layer its state arrays (a dict)
        self.pass1 = None  # the layer whose pass 1 ran last
        self.initial = None  # exact: per layer its state arrays entering the segment, each (1, ...)

    def close(self):
        self.h.close()
        self.num.close()

    def __del__(self):
        self.close()

    def is_edge(self, e: int) -> bool:
        """Whether e is a unit edge inside the segment (its state is stored)."""
        return e % self.unit_size == 0 and e < self.end

    def record_edge(self, e: int, layer: int, state: dict) -> None:
        """The state arrays of `layer` at unit edge e (each without the batch axis)."""
        states = self.edge_states.setdefault(e // self.unit_size - 1, [None] * self.L)
        states[layer] = {k: v.cpu().clone() for k, v in state.items()}

    def _h(self, a: int, b: int) -> torch.Tensor:
        """(1, b-a, D) float32 copy of the residual stream at record positions [a, b)."""
        return torch.from_numpy(self.h.get(a - self.start, b - self.start)).to(self.model.device)[None]

    def _put(self, a: int, h: torch.Tensor) -> None:
        self.h.put(a - self.start, h[0].to("cpu").numpy())

    def _pass1(self, layer: int):
        if self.exact:
            return _Attend(self, layer, self.initial[layer])
        return self.kind.Local(self, layer)

    def _message(self, layer: int) -> Message:
        """The message for `layer` (past the last layer: y of the last position)."""
        if layer < self.L:
            return self.pass1.message()
        last = self._h(self.end - 1, self.end)
        return Message(self.end - self.start, y=self.net.norm(last)[0, -1].cpu())

    @torch.inference_mode()
    def begin(self, initial=None) -> Message:
        """Embeds the segment's inputs into the spill and runs layer 0's pass 1 (exact: from
        `initial`, the state entering the segment as the family's arrays, {name: (L, ...)}).
        Returns layer 0's message."""
        if self.exact:
            self._set_initial(initial)
        first = self.pass1 = self._pass1(0)
        for a, b in self.units:
            x = self.model.to_tensor(self.read(a, b))
            for s, e in self.spans:
                if a <= s < b:
                    h = self.net.embed_inputs(x[:, s - a:e - a])
                    first.span(s, e, h)
                    self._put(s, h)
        return self._message(0)

    def _set_initial(self, initial) -> None:
        if initial is None:
            raise ValueError("the first segment needs the state entering it")
        dev = self.model.device
        self.initial = [{k: v[i].to(dev)[None] for k, v in initial.items()} for i in range(self.L)]

    @torch.inference_mode()
    def resume(self, layer: int, h_of, initial=None) -> Message:
        """In place of begin and the apply calls before `layer`, from a checkpoint: h_of(a, b)
        gives the layer input (b-a, D) float32 of each unit's positions [a, b); the states at
        unit edges of the earlier layers are put back with record_edge. Runs pass 1 of `layer`
        on that input, as apply did (none past the last layer), and returns its message."""
        if self.exact:
            self._set_initial(initial)
        for a, b in self.units:
            self.h.put(a - self.start, np.asarray(h_of(a, b), dtype=np.float32))
        self.pass1 = self._pass1(layer) if layer < self.L else None
        if self.pass1 is not None:
            for s, e in self.spans:
                self.pass1.span(s, e, self._h(s, e))
        return self._message(layer)

    def replay(self, layer: int, folds, initial=None, base: int = 0, h_of=None) -> Message:
        """In place of begin and the apply calls before `layer` where no kept h is that deep:
        the layers from `base` (0: from the tokens, else from the kept input of `base`, h_of as
        in resume) are recomputed, folds[j] being the stored state (a dict) entering the segment
        at layer j < `layer`, so the same passes run on the same numbers as in the run that
        stored them (the same bytes), with no exchange between them. Returns the message of
        `layer`."""
        msg = self.resume(base, h_of, initial) if base else self.begin(initial)
        for j in range(base, layer):
            msg = self.apply(j, folds[j])
        return msg

    def rows(self, a: int, b: int) -> np.ndarray:
        """(b-a, D) float32: the residual stream at record positions [a, b) (a checkpoint's h)."""
        return self.h.get(a - self.start, b - self.start)

    @torch.inference_mode()
    def apply(self, layer: int, state_in: dict, unit_done=None) -> Message:
        """Pass 2 of `layer` from the exact state entering the segment (the fold's: the layer's
        arrays; the first segment knows it already), and pass 1 of the next layer right behind it,
        span by span. The residual stream is updated in place in the spill, the state
        at unit edges inside the segment recorded. unit_done(a, b): called as each unit's
        positions [a, b) are done (the last layer's: its rows are the writes' input, so its
        outputs can be made and written while the later units run). Returns the next layer's
        message (after the last layer: y of the last position)."""
        nxt = layer + 1
        if self.exact:
            fix = _Project(self, layer)
        else:
            fix = self.kind.Correct(self, layer, state_in, self.pass1)
        local = self.pass1 = self._pass1(nxt) if nxt < self.L else None
        ends = {b: a for a, b in self.units}
        for s, e in self.spans:
            h = fix.span(s, e, self._h(s, e))
            if local is not None:
                local.span(s, e, h)
            self._put(s, h)
            if unit_done is not None and e in ends:
                unit_done(ends[e], e)
        return self._message(nxt)

    @torch.inference_mode()
    def units_out(self, y_prev: torch.Tensor, final: ModelState, skip=()):
        """Yields (unit index, start, end, outputs dict of numpy, ModelState after the unit)
        for every unit (its part inside the segment) not in `skip`. y_prev (D,): y before the segment;
        final: the state after the segment (the fold's, so a restart reproduces it)."""
        prev_y = y_prev.to(self.model.device).view(1, -1)  # (1, D): y before the next position
        for a, b in self.units:
            idx = a // self.unit_size
            if idx in skip:  # its last span's y still feeds the next unit's outputs (same op)
                prev_y = self.last_y(a, b)
                continue
            out, prev_y = self.unit_outputs(a, b, self.read(a, b), prev_y)
            yield idx, a, b, out, self.unit_state(idx, b, prev_y, final)

    @torch.inference_mode()
    def last_y(self, a: int, b: int) -> torch.Tensor:
        """(1, D): y of the last position of unit [a, b), as unit_outputs leaves it (the same op on
        the same span), for the unit after it."""
        s, e = [sp for sp in self.spans if a <= sp[0] < b][-1]
        return self.net.norm(self._h(s, e))[:, -1]

    @torch.inference_mode()
    def unit_outputs(self, a: int, b: int, x, prev_y: torch.Tensor) -> tuple[dict, torch.Tensor]:
        """The outputs (numpy) of unit [a, b) from the residual stream after the last layer, x its
        model input and prev_y (1, D) y before it; and y of its last position (the next unit's
        prev_y)."""
        xt = self.model.to_tensor(x)
        prev_y = prev_y.to(self.model.device).view(1, -1)
        got: dict[str, list] = {o: [] for o in self.outputs}
        for s, e in self.spans:
            if not a <= s < b:
                continue
            y = self.net.norm(self._h(s, e))
            for k, v in self.model.heads(xt[:, s - a:e - a], y, prev_y, self.outputs).items():
                got[k].append(v[0].to("cpu", torch.float32).numpy())
            prev_y = y[:, -1]
        return {k: v[0] if len(v) == 1 else np.concatenate(v) for k, v in got.items()}, prev_y

    def unit_state(self, idx: int, b: int, y_last: torch.Tensor, final: ModelState) -> ModelState:
        """The state after unit `idx` (ending at b; y_last (1, D) y of its last position): the
        recorded edge states, or `final` at the segment's end."""
        if b == self.end:
            return final
        layers = [{k: v[None] for k, v in d.items()} for d in self.edge_states[idx]]
        return ModelState.stack(layers, y_last.cpu())
