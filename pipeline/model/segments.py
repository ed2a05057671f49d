"""Exact sequence parallelism for inference: one record split into P contiguous segments.

Per layer and head the attention is affine in the state entering a segment (the kernel's
stages, linpipe.kernels.linear_attn.stages):

    S_t = g^(t+1) S_in + S_loc_t,   S_loc_t = sum_{j<=t} g^(t-j) phi(k_j) v_j^T   (z alike)
    o_t = phi(q_t)^T S_t / (phi(q_t) . z_t + eps)

(with a gate per position, g^(t-j) is exp(b_t - b_j) of the cumulative log-gates b from the
segment's start, and g^(t+1) exp(b_t): the gates come from the layer's normalised input, known
in pass 1 for every position, the head rows too; a segment's total is the sum of its gates)

so every segment runs each layer in two passes around one exchange:

1. Pass 1 (right behind pass 2 of the layer before, on the same span while it is in
   cache; for layer 0 behind the embedding): the layer's attention from a zero state, the
   kernel's numerator phi(q)^T S_loc and denominator phi(q).z_loc kept apart
   (`Attention.kernel_parts`); q and both (and a gated layer's log-gates) go to the spill. The
   first W-1 positions are left out (their conv reads the halo, the previous segment's last
   inputs, not known yet). The segment's message: S_loc, z_loc at its end and its first and
   last W-1 normalised inputs (gated: the head rows' log-gates and the others' sum).
2. The fold (linpipe.model.exchange, the driver): the halos from the tails, the first W-1
   positions' local state (a (W-1)-row conv and matmul with the layer's weights), then every
   segment's exact incoming state, an exclusive fold in float64 in a fixed order.
3. Pass 2: the first W-1 positions run the attention from that state; every later position's
   numerator and denominator get the share of (S_h, z_h), the state after those first
   positions (`state_outputs`); then the output projection and the MLP, the layer's own code.

So per position no projection runs twice: the split's extra work is pass 1's rows written and
read back and one (K, V) matmul and a matrix-vector product per head. The record's first
segment knows its incoming state: its pass 1 is the layer's attention itself and its pass 2 the
rest, the serial run's ops on the serial run's spans (P = 1 gives the serial bytes), and
its message is its exact final state.

Memory: a segment's residual stream (T, D) and pass 1's rows (T, D + H (V+1); the first
segment's o, (T, D)) live in float32 spills, updated in place layer by layer, span by
span; resident memory is a few spans whatever the segment's length when the spills
are files (jobs/split.py puts them in /dev/shm within a budget, else on local disk; plain
reads and writes, not mapped).

Spans are cut at the segment start, at every unit edge and every `Model.span` positions
after a unit edge: exactly the serial run's spans when segment edges are unit edges. The
state at every unit edge inside a segment is recorded on the way, so the full ModelState of
every unit edge can be stored as the streaming path stores it. The state stored at a
segment's last edge is the fold's value (the next segment's incoming state), so a run
restarted from that stored state folds the same numbers in the same order: bit-identical to an
uninterrupted split run with the same segment boundaries.

A delta-rule, gla, mamba2, retention or fla linear-attention model's layers run the same way
with their own state algebra: passes and fold of linpipe.model.delta_split, mamba2_split,
retention_split or fla_linear_split, picked by the layer kind (split_kinds.split_kind);
everything else (spans, spills, edges, messages, checkpoints) is shared.

This module is a segment's side (SegmentRunner); the driver's side, which folds the messages and
calls every segment per layer (run_layers, forward_split), is linpipe.model.segments_run.
"""
from __future__ import annotations

import numpy as np
import torch

from linpipe.kernels.linear_attn import advance, features, log_decay, log_gate_sums, state_outputs
from linpipe.model.exchange import Message, tail_rows
from linpipe.model.inference import Model
from linpipe.model.network import Layer, ModelState
from linpipe.model.spill import Spill
from linpipe.model.split_kinds import split_kind

# The record's first segment runs the layer's own attention; every later one also keeps the
# normaliser's parts, spills wider rows and corrects them: 1.0-1.5x the first one's time per
# position in one process (noisy), and with 1.25 two workers reached 1.47-1.69x one worker's
# rate (BENCHMARKS.md, "One record over many workers"). So the first segment gets that much
# more of the record. A delta-rule model's later segment took 0.83-1.36x its first one's time on
# a loaded machine (docs/sequence-parallel.md, "The split of a delta-rule model"): the same weight.
FIRST_WEIGHT = 1.25
# Where a later segment's passes run in float64 (passes_in_float64), they take 1.9-2.4x the
# first segment's time per position (bench_split.py wide, default-size model; 1.15-1.48x in
# float32 in the same run): with 1.25, two workers would be no faster than one.
FIRST_WEIGHT_FLOAT64 = 2.2


def passes_in_float64(attn) -> bool:
    """Whether a later segment's two passes run in float64, for a model config or Attention:
    with identity features and the normaliser phi(q).z can near zero, and float32 partial sums
    there lost up to 5.4x the serial run's distance from exact (BENCHMARKS.md, "One record over
    many workers"). Never for the delta rule, which has no normaliser."""
    return not attn.delta and bool(attn.normalize) and attn.feature_map == "identity"


def first_weight(config) -> float:
    """The first segment's share of a record against each later segment's 1 (segment_bounds)."""
    return FIRST_WEIGHT_FLOAT64 if passes_in_float64(config) else FIRST_WEIGHT


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


def spill_bytes(config, positions: int, exact: bool = False) -> int:
    """Bytes a segment of `positions` keeps outside its spans: its residual stream, and
    what pass 1 leaves for pass 2 (the first segment: o; the others: q, the numerators and
    the denominators, and a gated model's log-gates; the delta rule: delta_split.row_width)."""
    if split_kind(config):
        return positions * (config.d_model + split_kind(config).row_width(config, exact)) * 4
    if exact:
        return positions * 2 * config.d_model * 4
    parts = 2 if passes_in_float64(config) else 1  # float64 numerators in two float32 parts
    per_head = (config.head_dim + 1) * parts + config.gated
    return positions * (2 * config.d_model + config.n_heads * per_head) * 4


def _buf(scratch, slot: str, like: torch.Tensor, *shape: int) -> torch.Tensor:
    """A scratch buffer when the call reuses them (CPU inference), else a fresh tensor."""
    out = scratch(slot, *shape)
    return like.new_empty(shape) if out is None else out


class _LayerW:
    """One layer's modules, and what the runner derives from them once."""

    def __init__(self, layer: Layer):
        a = self.attn = layer.attn
        self.layer = layer
        self.H, self.K = a.n_heads, a.head_dim
        decay = getattr(a, "decay", None)  # none in a delta-rule layer
        self.gated = getattr(a, "gk_proj", None) is not None  # its log-gates are spilled after the parts
        self.lg = None if decay is None else log_decay(decay.detach().double())
        self.wide = passes_in_float64(a)  # pass 1's numerators spilled as two float32 parts
        self.dtype = torch.float64 if self.wide else torch.float32  # of a later segment's passes

    def put_parts(self, row, num, den) -> None:
        """Pass 1's numerators (m, H, V) and denominators (m, H) into its spill rows (m, width)
        after q: [q | num | den], then in float64 a second float32 part of each (a gated
        layer's log-gates, (m, H), are the last H columns: `gates`)."""
        D, H, K = self.H * self.K, self.H, self.K
        parts = [(num.reshape(-1, H * K), den)]
        if self.wide:
            parts.append((num.reshape(-1, H * K) - num.float().double().reshape(-1, H * K),
                          den - den.float().double()))
        for i, (n, d) in enumerate(parts):
            at = D + i * H * (K + 1)
            row[:, at:at + H * K] = n
            row[:, at + H * K:at + H * (K + 1)] = d

    def get_parts(self, row):
        """The numerators (m, H, V) and denominators (m, H) put_parts left in rows (m, width)."""
        D, H, K = self.H * self.K, self.H, self.K
        num = row[:, D:D + H * K].view(-1, H, K).to(self.dtype)
        den = row[:, D + H * K:D + H * (K + 1)].to(self.dtype)
        if self.wide:
            at = D + H * (K + 1)
            num = num + row[:, at:at + H * K].view(-1, H, K).double()
            den = den + row[:, at + H * K:at + H * (K + 1)].double()
        return num, den

    def gates(self, row):
        """A gated layer's log-gates (m, H) in its spill rows (m, width)."""
        return row[:, row.shape[1] - self.H:]


class _Attend:
    """The record's first segment, pass 1 of one layer: its attention from the state it knows
    (the layer's own code up to o, on the serial run's spans, so its bytes are the serial
    run's), o to the spill, the state at unit edges recorded; the state after the segment is
    its message. Its pass 2 (`_Project`) is the rest of the layer. So it runs in the same two
    phases around each exchange as the other segments, with as much work in each."""

    def __init__(self, runner: "SegmentRunner", layer: int, S, z, window):
        self.r, self.layer, self.w = runner, layer, runner.lw[layer]
        self.S, self.z, self.window = S, z, window  # (1, ...) carried

    def span(self, s: int, e: int, h: torch.Tensor) -> None:
        r, w = self.r, self.w
        n, D = e - s, r.D
        scratch = Layer.scratch(h)
        a = w.layer.attn_norm(h, out=scratch("attn_in", 1, n, D))
        o, self.S, self.z, self.window = w.attn(a, self.S, self.z, self.window, scratch)
        r.num.put(s - r.start, o[0].reshape(n, -1).to("cpu").numpy())
        if r.is_edge(e):
            r.record_edge(e, self.layer, self.S[0], self.z[0], self.window[0])

    def message(self) -> Message:
        return Message(self.r.end - self.r.start, self.S[0].double().cpu(), self.z[0].double().cpu(),
                       tail=self.window[0].cpu().clone(), absolute=True)


class _Project:
    """The record's first segment, pass 2 of one layer: o from the spill, then o_proj and MLP."""

    def __init__(self, runner: "SegmentRunner", layer: int):
        self.r, self.w = runner, runner.lw[layer]

    def span(self, s: int, e: int, h: torch.Tensor) -> torch.Tensor:
        r = self.r
        o = torch.from_numpy(r.num.get(s - r.start, e - r.start)).to(h.device)[None]  # (1, n, D)
        return self.w.layer.finish(h, o, Layer.scratch(h))


class _Local:
    """Pass 1 of one layer over a segment that is not first: the attention from a zero state
    (from the first position after the first W-1, whose conv reads the halo, not known yet).
    Per position q and the kernel's numerator phi(q)^T S_loc and denominator phi(q).z_loc go
    to the runner's spill; the local state (S, z) and the conv window are kept at every unit
    edge, the state at the end, with the first and last W-1 normalised inputs: the segment's
    message. In float64 where passes_in_float64 (the state carried between spans too)."""

    def __init__(self, runner: "SegmentRunner", layer: int):
        r = self.r = runner
        w = self.w = r.lw[layer]
        dev = r.model.device
        self.window = torch.zeros((1, r.W - 1, r.D), device=dev)  # stands in for the unknown halo
        self.S = torch.zeros((1, w.H, w.K, w.K), device=dev, dtype=w.dtype)  # (1, H, K, V)
        self.z = torch.zeros((1, w.H, w.K), device=dev, dtype=w.dtype)
        self.head = self.tail = torch.zeros((0, r.D), device=dev)
        self.edges: dict[int, tuple] = {}  # unit edge position -> (S, z, window)
        # a gated layer: the head rows' log-gates, and the sum of the later positions' (float64)
        self.head_gate = torch.zeros((0, w.H), device=dev) if w.gated else None
        self.gate_sum = torch.zeros(w.H, dtype=torch.float64) if w.gated else None

    def span(self, s: int, e: int, h: torch.Tensor) -> None:
        """h (1, n, D): the layer's input at record positions [s, e) (exact)."""
        r, w = self.r, self.w
        n, D = e - s, r.D
        scratch = Layer.scratch(h)
        a = w.layer.attn_norm(h, out=scratch("attn_in", 1, n, D))  # (1, n, D)
        keep = r.W - 1
        if self.head.shape[0] < keep:
            self.head = torch.cat([self.head, a[0, :keep - self.head.shape[0]]])
        if keep:
            self.tail = tail_rows(torch.cat([self.tail, a[0, -keep:]]), keep)
        qkv, self.window = w.attn.qkv(a, self.window, scratch)  # (1, n, 3, H, K)
        gate = w.attn.log_gate(a)  # (1, n, H) or None
        row = _buf(scratch, "seg_row", h, n, r.row_width)  # what pass 2 reads: q, then num, den
        row[:, :D] = qkv[0, :, 0].reshape(n, D)
        skip = min(n, max(0, r.base - s))  # positions whose conv read the unknown halo
        if gate is not None:
            w.gates(row)[:] = gate[0]
            self.head_gate = torch.cat([self.head_gate, gate[0, :skip]])
        if skip < n:
            q, k, v = (qkv[:, skip:, i].to(w.dtype) for i in range(3))
            lg = None if gate is None else gate[:, skip:]
            num, den, (self.S, self.z) = w.attn.kernel_parts(q, k, v, self.S, self.z, dtype=w.dtype,
                                                             log_gate=lg)
            w.put_parts(row[skip:], num[0], den[0])
            if gate is not None:
                self.gate_sum = log_gate_sums(gate[0, skip:].cpu(), self.gate_sum)[-1]
        r.num.put(s - r.start, row.to("cpu").numpy())
        if r.is_edge(e):
            self.edges[e] = (self.S[0].clone(), self.z[0].clone(), self.window[0].clone())

    def message(self) -> Message:
        r = self.r
        head_gate = None if self.head_gate is None else self.head_gate.cpu().clone()
        return Message(r.end - r.start, self.S[0].double().cpu(), self.z[0].double().cpu(),
                       self.head.cpu().clone(), self.tail.cpu().clone(), head_gate=head_gate,
                       gate_sum=self.gate_sum)


class _Correct:
    """Pass 2 of one layer over a segment that is not first, from its exact incoming state and
    halo: the first W-1 positions run the layer's attention from that state; every later
    position's numerator and denominator from pass 1 get the share of (S_h, z_h), the state
    after those first positions (kernel stage 3's state term); then the output projection and
    the MLP, as the layer's own code."""

    def __init__(self, runner: "SegmentRunner", layer: int, S_in, z_in, halo, local: _Local):
        r = self.r = runner
        self.layer, self.w, self.local = layer, r.lw[layer], local
        dev = r.model.device
        self.S, self.z = S_in.to(dev)[None], z_in.to(dev)[None]
        self.halo = self.window = halo.to(dev)[None]  # (1, W-1, D), the window carried through the head rows
        self.Sh = self._after_head() if r.base == r.start else None  # float64 (S_h, z_h)
        # a gated layer: the cumulative log-gate from the head rows' end (float64, per head)
        self.cum = torch.zeros(self.w.H, dtype=torch.float64, device=dev) if self.w.gated else None

    def _after_head(self):
        return self.S[0].double(), self.z[0].double()

    def span(self, s: int, e: int, h: torch.Tensor) -> torch.Tensor:
        r, w = self.r, self.w
        n, D, H, K = e - s, r.D, w.H, w.K
        scratch = Layer.scratch(h)
        row = torch.from_numpy(r.num.get(s - r.start, e - r.start)).to(h.device)  # (n, width)
        o = _buf(scratch, "seg_o", h, n, H, K)  # (n, H, V)
        nh = min(n, max(0, r.base - s))  # head rows in this span
        if nh:  # the layer's attention from the incoming state, on the true conv window
            a = self.local.head[s - r.start:s - r.start + nh][None]  # (1, nh, D) normalised inputs
            oh, self.S, self.z, self.window = w.attn(a, self.S, self.z, self.window, scratch)
            o[:nh] = oh[0]
            if s + nh == r.base:
                self.Sh = self._after_head()
        if nh < n:
            qf = features(row[nh:, :D].view(n - nh, H, K), w.attn.feature_map).to(w.dtype)
            if w.gated:
                cum = log_gate_sums(w.gates(row[nh:]), self.cum)  # (n - nh, H)
                num, den = state_outputs(qf, *self.Sh, log_cum=cum)
                self.cum = cum[-1]
            else:
                num, den = state_outputs(qf, *self.Sh, w.lg, s + nh - r.base)
            got_num, got_den = w.get_parts(row[nh:])
            o[nh:] = w.attn.divide(num.add_(got_num), den.add_(got_den))
        h = w.layer.finish(h, o.view(1, n, D), scratch)
        if r.is_edge(e):
            if e <= r.base:
                S, z, win = self.S[0], self.z[0], self.window[0]
            else:
                S_loc, z_loc, win = self.local.edges[e]
                S, z = advance(*self.Sh, S_loc.double(), z_loc.double(), w.lg, e - r.base, log_total=self.cum)
                S, z = S.float(), z.float()
                if e - r.start < r.W - 1:  # the window still reaches into the halo
                    win = tail_rows(torch.cat([self.halo[0], self.local.head[:e - r.start]]), r.W - 1)
            r.record_edge(e, self.layer, S, z, win)
        return h


class SegmentRunner:
    """One segment [start, end) of one record on one worker. `read(a, b)` returns the model
    input (numpy) of record positions [a, b). Methods run in this order: begin, then apply per
    layer, then units_out (the outputs).

    Every segment runs each layer in two passes around the exchange: pass 1 (in begin for layer
    0, else right behind pass 2 of the layer before) and pass 2 (in apply). The record's first
    segment (`exact`) knows the state entering it: its pass 1 is the layer's attention
    (`_Attend`), its pass 2 the rest (`_Project`), and its messages carry its final state. The
    others' pass 1 runs from a zero state (`_Local`), their pass 2 corrects it once the state
    entering them is known (`_Correct`)."""

    def __init__(self, model: Model, read, start: int, end: int, unit_size: int, *, spill_dir=None,
                 outputs=None, exact: bool = False):
        if end <= start:
            raise ValueError(f"empty segment [{start}, {end})")
        self.model, self.net, self.read = model, model.net, read
        self.start, self.end, self.unit_size, self.exact = start, end, unit_size, exact
        self.outputs = model.select_outputs(outputs)
        c = model.config
        self.L, self.D = c.n_layers, c.d_model
        self.W = c.conv_width if c.has_conv else 1  # a delta-rule model may have no short conv
        self.lw = [_LayerW(layer) for layer in self.net.layers]
        self.base = min(end, start + self.W - 1)  # positions before it read the halo
        step = model.span or unit_size
        # units: (a, b) record positions of one unit inside this segment; spans: Model.span or less
        self.units = []
        a = start
        while a < end:
            b = min(end, (a // unit_size + 1) * unit_size)
            self.units.append((a, b))
            a = b
        self.spans = [(s, min(s + step, b)) for a, b in self.units for s in range(a, b, step)]
        T = end - start
        self.h = Spill(T, self.D, spill_dir)  # the residual stream
        # what pass 1 leaves for pass 2, rewritten layer after layer: the first segment's o
        # (T, D); the others' q, numerators and denominators (T, D + H (V+1))
        wide = self.lw[0].wide  # the same feature map and normaliser in every layer
        self.kind = split_kind(c)
        if self.kind:
            self.row_width = self.kind.row_width(c, exact)
        else:
            self.row_width = self.D + c.n_heads * ((c.head_dim + 1) * (2 if wide else 1) + c.gated)
        self.num = Spill(T, self.D if exact and not self.kind else self.row_width, spill_dir)
        self.edge_states: dict[int, list] = {}  # unit index -> per layer (S, z, window)
        self.pass1 = None  # the layer whose pass 1 ran last
        self.initial = None  # exact: per layer (S, z, window) entering the segment, each (1, ...)

    def close(self):
        self.h.close()
        self.num.close()

    def __del__(self):
        self.close()

    def is_edge(self, e: int) -> bool:
        """Whether e is a unit edge inside the segment (its state is stored)."""
        return e % self.unit_size == 0 and e < self.end

    def record_edge(self, e: int, layer: int, S, z, window) -> None:
        states = self.edge_states.setdefault(e // self.unit_size - 1, [None] * self.L)
        states[layer] = (S.cpu().clone(), z.cpu().clone(), window.cpu().clone())

    def _h(self, a: int, b: int) -> torch.Tensor:
        """(1, b-a, D) float32 copy of the residual stream at record positions [a, b)."""
        return torch.from_numpy(self.h.get(a - self.start, b - self.start)).to(self.model.device)[None]

    def _put(self, a: int, h: torch.Tensor) -> None:
        self.h.put(a - self.start, h[0].to("cpu").numpy())

    def _pass1(self, layer: int):
        if self.exact:
            return _Attend(self, layer, *self.initial[layer])
        return self.kind.Local(self, layer) if self.kind else _Local(self, layer)

    def _message(self, layer: int) -> Message:
        """The message for `layer` (past the last layer: y of the last position)."""
        if layer < self.L:
            return self.pass1.message()
        last = self._h(self.end - 1, self.end)
        return Message(self.end - self.start, y=self.net.norm(last)[0, -1].cpu())

    @torch.inference_mode()
    def begin(self, initial=None) -> Message:
        """Embeds the segment's inputs into the spill and runs layer 0's pass 1 (exact: from
        `initial`, the state entering the segment as (S (L, H, K, V), z (L, H, K), conv (L, W-1,
        D))). Returns layer 0's message."""
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
        self.initial = [(S.to(dev)[None], z.to(dev)[None], w.to(dev)[None])
                        for S, z, w in zip(*initial, strict=True)]

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

    def replay(self, layer: int, folds, initial=None) -> Message:
        """In place of begin and the apply calls before `layer` where no checkpoint holds h:
        folds[j] is the stored (S, z, halo) entering the segment at layer j < `layer`, so the
        same passes run on the same numbers as in the run that stored them (the same bytes),
        with no exchange between them. Returns the message of `layer`."""
        msg = self.begin(initial)
        for j in range(layer):
            msg = self.apply(j, *folds[j])
        return msg

    def rows(self, a: int, b: int) -> np.ndarray:
        """(b-a, D) float32: the residual stream at record positions [a, b) (a checkpoint's h)."""
        return self.h.get(a - self.start, b - self.start)

    @torch.inference_mode()
    def apply(self, layer: int, S_in: torch.Tensor, z_in: torch.Tensor, halo: torch.Tensor) -> Message:
        """Pass 2 of `layer` from the exact state (S_in, z_in, halo) entering the segment (the
        first segment knows it already), and pass 1 of the next layer right behind it,
        span by span. The residual stream is updated in place in the spill, the state
        at unit edges inside the segment recorded. Returns the next layer's message (after the
        last layer: y of the last position)."""
        nxt = layer + 1
        if self.exact:
            fix = _Project(self, layer)
        else:
            correct = self.kind.Correct if self.kind else _Correct
            fix = correct(self, layer, S_in, z_in, halo, self.pass1)
        local = self.pass1 = self._pass1(nxt) if nxt < self.L else None
        for s, e in self.spans:
            h = fix.span(s, e, self._h(s, e))
            if local is not None:
                local.span(s, e, h)
            self._put(s, h)
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
                s, e = [sp for sp in self.spans if a <= sp[0] < b][-1]
                prev_y = self.net.norm(self._h(s, e))[:, -1]
                continue
            xt = self.model.to_tensor(self.read(a, b))
            got: dict[str, list] = {o: [] for o in self.outputs}
            for s, e in self.spans:
                if not a <= s < b:
                    continue
                y = self.net.norm(self._h(s, e))
                for k, v in self.model.heads(xt[:, s - a:e - a], y, prev_y, self.outputs).items():
                    got[k].append(v[0].to("cpu", torch.float32).numpy())
                prev_y = y[:, -1]
            out = {k: v[0] if len(v) == 1 else np.concatenate(v) for k, v in got.items()}
            if b == self.end:
                state = final
            else:
                per_layer = self.edge_states[idx]
                state = ModelState(torch.stack([p[0] for p in per_layer])[None],
                                   torch.stack([p[1] for p in per_layer])[None],
                                   torch.stack([p[2] for p in per_layer])[None], prev_y.cpu())
            yield idx, a, b, out, state
