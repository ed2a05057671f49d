"""The sequence-parallel split (linpipe.model.segments) of a caduceus record: one record over
several workers, each a segment of whole units, with the same exchange, kept layer inputs and
resume as a causal split (jobs/split.py), and each direction's state algebra the mamba family's
(families/mamba/split.py: MambaLocal's summary, MambaWeights.fold), written once.

A layer's Mambas are lanes (sweeps.py: direction, Mamba, half). Per layer and segment:

1. Pass 1: every left-to-right lane runs MambaLocal over the segment from a zero state (its
   summary, head rows and tail: the message), every right-to-left lane MambaLocal over the
   segment flipped (the lane sees its rows in its own order: a segment's rows [S, E) read
   backwards, position p at lane row S + E - 1 - p). A lane whose entering state is known runs
   the Mamba itself, keeps its outputs and sends that state (`_Exact`): the left-to-right lanes
   of the record's first segment, the right-to-left lanes of its last.
2. The fold (`BiWeights.fold`, the driver): each left-to-right lane's MambaWeights.fold over the
   segments in order from the state entering the record; each right-to-left lane's over the
   segments last to first from zero (the record's right end): float64, a fixed order. The state
   at segment edge b_k holds both: the left-to-right lanes' after [0, b_k), the right-to-left
   lanes' after [b_k, T) (as the unit edges' states of sweeps.py: left to right at a unit's end,
   right to left at its start). Segment k needs the first at b_k and the second at b_(k+1):
   the weights' `both_edges` makes run_layers hand it both (entering, leaving).
3. Pass 2: every other lane runs its Mamba again from the fold's state and conv window (left to
   right over the segment's units in order, its outputs to a spill; right to left over them last
   to first), then per unit the combine and the residual, sweeps.py's ops on the same rows: the
   next layer's input. (The mamba split's correction, MambaCorrect, adds the entering state's
   share to pass 1's outputs instead; on the CPU it cost about what the Mamba's scan does here,
   and pass 1 would spill 3 I + N floats per position and lane for it.)

With one segment every lane is exact and every op is sweeps.py's on the same unit rows: the
bytes of the one-worker run. The states stored at a segment's edges are the fold's values, so a
group restarted from them folds the same numbers (the same bytes as an uninterrupted split run).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

from linpipe.model.exchange import Message
from linpipe.model.families.caduceus.sweeps import _lane_input, lanes
from linpipe.model.families.mamba.split import MambaLocal, MambaWeights
from linpipe.model.families.mamba.split import row_width as mamba_row
from linpipe.model.segments import unit_bounds
from linpipe.model.spill import Spill
from linpipe.model.state import ModelState

DIRECTIONS = ("fwd", "rev")
# what a split record's layer runs (submit --dry-run's split line)
passes = "per layer two folds around one exchange (left to right, right to left)"


def _record(net):
    from linpipe.model.families.caduceus.record import _LOADED, CaduceusRecord

    rec = _LOADED.get(id(net))
    if rec is None or rec.net is not net:
        rec = _LOADED[id(net)] = CaduceusRecord(net)
    return rec


def halo(config) -> int:
    return config.conv_width - 1


def first_weight(config) -> float:
    """Every segment runs one direction twice at least (the first segment's right-to-left lanes,
    the last's left-to-right ones; the others both): the same share each."""
    return 1.0


def row_width(config, exact: bool) -> int:
    """Columns a segment spills per position beyond its residual stream's d_model (spill_bytes):
    the rest of the residual stream (RCPS), the left-to-right outputs, and the exact lanes'
    outputs (at most one direction's: d_model per half)."""
    C = config.spec.hidden_width(config)
    return (C - config.d_model) + 2 * C


@dataclass
class BiMessage:
    """One segment's message for one layer: per lane (sweeps.lanes' order within each
    direction) the mamba split's Message; after the last layer y alone."""

    length: int
    fwd: list
    rev: list
    y: torch.Tensor | None = None


def _lane_state(state: dict, d: str, j: int) -> dict:
    """Lane j of direction d's state dict {h (I, N), conv (W-1, I)} from the layer's arrays."""
    out = {"h": state[f"h_{d}"][j]}
    if f"conv_{d}" in state:
        out["conv"] = state[f"conv_{d}"][j]
    return out


def _arrays(per_dir: dict) -> dict:
    """{d: [lane state dicts]} -> the layer's arrays {h_fwd (m, I, N), conv_fwd, h_rev, conv_rev}."""
    out = {}
    for d, states in per_dir.items():
        if not states:
            continue
        out[f"h_{d}"] = torch.stack([s["h"].float() for s in states])
        if "conv" in states[0]:
            out[f"conv_{d}"] = torch.stack([s["conv"].float() for s in states])
    return out


@dataclass
class BiWeights:
    """What the fold needs of one caduceus layer: each lane's MambaWeights (a CPU copy of its
    Mamba). both_edges: the fold makes a state that segments on the left read (run_layers gives
    every segment the states at both of its edges)."""

    fwd: list
    rev: list
    both_edges = True

    def fold(self, state0: dict, msgs: list) -> list[dict]:
        """The layer's states at every segment edge b_0..b_P (P + 1 dicts): the left-to-right
        lanes' from state0's, the right-to-left lanes' from zeros at the record's end."""
        P = len(msgs)
        got = [{d: [] for d in DIRECTIONS} for _ in range(P + 1)]
        for j, w in enumerate(self.fwd):
            for k, st in enumerate(w.fold(_lane_state(state0, "fwd", j), [m.fwd[j] for m in msgs])):
                got[k]["fwd"].append(st)
        for j, w in enumerate(self.rev):
            zero = {n: torch.zeros_like(t) for n, t in _lane_state(state0, "rev", j).items()}
            states = w.fold(zero, [m.rev[j] for m in reversed(msgs)])[::-1]
            for k, st in enumerate(states):
                got[k]["rev"].append(st)
        return [_arrays(g) for g in got]


def weights(net) -> list[BiWeights]:
    rec = _record(net)

    def cpu(m):
        c = copy.deepcopy(m).float().cpu().eval().requires_grad_(False)
        for name in ("in_proj", "out_proj"):  # a tied right-to-left Mamba holds them unregistered
            if name not in c._modules:
                object.__setattr__(c, name, getattr(c, name).float().cpu().requires_grad_(False))
        return MambaWeights(c)

    out = []
    for block in net.layers:
        ls = lanes(rec, block)
        out.append(BiWeights([cpu(m) for d, m, _ in ls if d == "fwd"],
                             [cpu(m) for d, m, _ in ls if d == "rev"]))
    return out


class _Block:
    """What MambaLocal reads of a block, for one lane: its Mamba, and the lane's rows as they are
    (the caller normalises)."""

    def __init__(self, m):
        self.mixer = m

    @staticmethod
    def norm(h):
        return h


class _Lane:
    """One lane of one segment for one layer in the lane's own order: what the mamba split's
    MambaLocal reads of its runner (start, end, base, W, the spill), with the
    unit edges inside the segment in the lane's coordinates."""

    def __init__(self, seg: "BiSegment", m, d: str, half: int, exact: bool):
        self.seg, self.m, self.d, self.half, self.exact = seg, m, d, half, exact
        self.reverse = d == "rev"
        self.net = SimpleNamespace(layers=[_Block(m)])
        self.model = SimpleNamespace(device=seg.device)
        self.start, self.end, self.D = seg.start, seg.end, seg.rec.D
        self.W = m.width
        self.base = min(self.end, self.start + self.W - 1)
        self.row_width = seg.rec.D if exact else mamba_row(seg.config, False)
        # an exact lane's outputs wait in a spill for pass 2; pass 1 of another lane keeps only
        # its message (its Mamba runs again in pass 2)
        self.num = seg.lane_spill(self, self.row_width) if exact else _Dropped()
        self.got: dict[int, dict] = {}  # unit index -> the lane's state at its edge (pass 2)
        self.local = None

    def position(self, e: int) -> int:
        """A lane edge -> the record position it stands for."""
        return self.start + self.end - e if self.reverse else e

    def unit_of(self, e: int) -> int:
        """The unit whose state this lane edge is: left to right the unit ending there, right
        to left the unit starting there."""
        q, u = self.position(e), self.seg.unit_size
        return q // u if self.reverse else q // u - 1

    def is_edge(self, e: int) -> bool:
        q = self.position(e)
        return self.start < q < self.end and q % self.seg.unit_size == 0

    def record_edge(self, e: int, _layer: int, state: dict) -> None:
        self.got[self.unit_of(e)] = {k: v.cpu().clone() for k, v in state.items()}

    def rows(self, s: int, e: int, x: torch.Tensor):
        """Record positions [s, e) and the lane's rows x (n, D) there -> (lane start, lane end,
        the rows in lane order (1, n, D))."""
        if not self.reverse:
            return s, e, x[None]
        return self.start + self.end - e, self.start + self.end - s, x.flip(0)[None]

    def out(self, s: int, y: torch.Tensor) -> torch.Tensor:
        """A lane's outputs (1, n, D) in lane order at lane start s -> record order (n, D)."""
        return y[0].flip(0) if self.reverse else y[0]


class _Dropped:
    """Where MambaLocal puts its per-position rows when pass 2 does not read them."""

    num = None

    @staticmethod
    def put(i, x) -> None:
        pass


class _Exact:
    """A lane's Mamba from a known state (sweeps.py's step on the same rows), its state at the
    unit edges recorded: pass 1 of a lane whose entering state is known (its outputs to the
    spill), pass 2 of the others (from the fold's state)."""

    def __init__(self, lane: _Lane, state: dict):
        self.lane, self.state = lane, {k: v[None] for k, v in state.items()}

    def span(self, s: int, e: int, x: torch.Tensor) -> torch.Tensor:
        """The lane's rows x (1, n, D) at lane positions [s, e) -> its outputs (1, n, D), kept in
        the lane's spill where it has one (pass 1 of an exact lane)."""
        ln = self.lane
        o, self.state = ln.m(x, self.state)
        y = ln.m.out(o)
        if not isinstance(ln.num, _Dropped):
            ln.num.put(s - ln.start, y[0].to("cpu").numpy())
        if ln.is_edge(e):
            ln.record_edge(e, 0, {k: v[0] for k, v in self.state.items()})
        return y

    def message(self) -> Message:
        ln = self.lane
        return Message(ln.end - ln.start, absolute=True,
                       state={k: v[0].cpu().clone() for k, v in self.state.items()})


class BiSegment:
    """One segment [start, end) of a caduceus record of `length` positions on one worker
    (SegmentRunner's calls: begin, apply per layer with the states at both edges, units_out;
    resume, replay and rows for the split's kept layers). `exact`: the record's first segment
    (its left-to-right lanes run from the state entering the record); the record's last segment's
    right-to-left lanes always run exact (from zeros)."""

    # its outputs need the last layer's both sweeps over the segment: its units are made by
    # units_out after the last apply (jobs/split.py: `write`), not as apply goes
    streams_units = False

    def __init__(self, model, read, start: int, end: int, unit_size: int, *, length: int, spill_dir=None,
                 outputs=None, exact: bool = False):
        if end <= start:
            raise ValueError(f"empty segment [{start}, {end})")
        self.model, self.net, self.read = model, model.net, read
        self.config = model.config
        self.rec = _record(model.net)
        self.device = self.rec.E.device
        self.start, self.end, self.unit_size, self.length = start, end, unit_size, length
        self.exact = {"fwd": exact, "rev": end == length}
        self.outputs = model.select_outputs(outputs)
        self.L, self.D = self.config.n_layers, self.rec.C  # D: the residual stream's width (kept h)
        self.units = unit_bounds(start, end, unit_size)
        self.spill_dir = spill_dir
        T = end - start
        self.h = Spill(T, self.D, spill_dir)  # the residual stream
        self.f = Spill(T, self.D, spill_dir)  # the left-to-right lanes' outputs of a layer
        self._spills: dict = {}  # (lane key, width) -> Spill, reused layer after layer
        self.edge_states: dict[int, list] = {}  # unit index -> per layer its arrays (a dict)
        self.lanes = None  # the layer whose pass 1 ran last: its lanes
        self.initial = None

    def lane_spill(self, lane: _Lane, width: int) -> Spill:
        key = (lane.d, lane.half, width)
        if key not in self._spills:
            self._spills[key] = Spill(self.end - self.start, width, self.spill_dir)
        return self._spills[key]

    def close(self):
        for s in (self.h, self.f, *self._spills.values()):
            s.close()
        self._spills = {}

    def __del__(self):
        self.close()

    def record_edge(self, e: int, layer: int, state: dict) -> None:
        """Arrays of `layer` of the unit ending at e (SegmentRunner's; merged with those there)."""
        states = self.edge_states.setdefault(e // self.unit_size - 1, [None] * self.L)
        states[layer] = {**(states[layer] or {}), **{k: v.cpu().clone() for k, v in state.items()}}

    def _h(self, a: int, b: int) -> torch.Tensor:
        return torch.from_numpy(self.h.get(a - self.start, b - self.start)).to(self.device)

    def rows(self, a: int, b: int) -> np.ndarray:
        return self.h.get(a - self.start, b - self.start)

    def _set_initial(self, initial) -> None:
        if initial is None:
            raise ValueError("the first segment needs the state entering it")
        self.initial = [{k: v[i] for k, v in initial.items()} for i in range(self.L)]

    # -- pass 1 -------------------------------------------------------------------------------
    @torch.no_grad()
    def _pass1(self, layer: int) -> BiMessage:
        """Pass 1 of `layer` over the segment's input in h: both directions' lanes."""
        rec, block = self.rec, self.net.layers[layer]
        w = block.norm.weight
        self.lanes = []
        for d, m, half in lanes(rec, block):
            ln = _Lane(self, m, d, half, self.exact[d])
            if ln.exact:
                enter = _lane_state(self.initial[layer], d, sum(x.d == d for x in self.lanes)) \
                    if d == "fwd" else {k: torch.zeros_like(v) for k, v in self._zero(m).items()}
                ln.local = _Exact(ln, {k: v.to(self.device) for k, v in enter.items()})
            else:
                ln.local = MambaLocal(ln, 0)
            self.lanes.append(ln)
        for d in DIRECTIONS:
            mine = [ln for ln in self.lanes if ln.d == d]
            if not mine:
                continue
            for a, b in (self.units if d == "fwd" else reversed(self.units)):
                x = rec.norm(self._h(a, b), w)
                for ln in mine:
                    s, e, rows = ln.rows(a, b, _lane_input(rec, x, ln.half))
                    ln.local.span(s, e, rows)
        return BiMessage(self.end - self.start, [ln.local.message() for ln in self.lanes if ln.d == "fwd"],
                         [ln.local.message() for ln in self.lanes if ln.d == "rev"])

    def _zero(self, m) -> dict:
        z = {"h": torch.zeros((m.inner, m.state_size))}
        if m.width > 1:
            z["conv"] = torch.zeros((m.width - 1, m.inner))
        return z

    def _final(self) -> BiMessage:
        """Past the last layer: y of the segment's last position (record.run's unit y)."""
        last = self.rec.norm(self._h(self.end - 1, self.end), self.net.norm.weight)
        return BiMessage(self.end - self.start, [], [], y=last[0, :self.rec.D].cpu())

    def _message(self, layer: int) -> BiMessage:
        return self._pass1(layer) if layer < self.L else self._final()

    @torch.no_grad()
    def begin(self, initial=None) -> BiMessage:
        """Embeds the segment's tokens into h and runs layer 0's pass 1 (initial: the state
        entering the record, {name: (L, ...)}, for the record's first segment)."""
        if self.exact["fwd"]:
            self._set_initial(initial)
        for a, b in self.units:
            ids = self.rec.from_tokens(np.asarray(self.read(a, b))).to(self.device)
            self.h.put(a - self.start, self.rec.layer_input(0, self.rec.embed(ids), None).cpu().numpy())
        return self._message(0)

    @torch.no_grad()
    def resume(self, layer: int, h_of, initial=None) -> BiMessage:
        """From a kept input of `layer` (h_of(a, b) per unit; the edges of the layers before put
        back with record_edge): its pass 1, as apply ran it."""
        if self.exact["fwd"]:
            self._set_initial(initial)
        for a, b in self.units:
            self.h.put(a - self.start, np.asarray(h_of(a, b), dtype=np.float32))
        return self._message(layer)

    def replay(self, layer: int, folds, initial=None, base: int = 0, h_of=None) -> BiMessage:
        """SegmentRunner.replay: the layers from `base` recomputed with the stored folds
        (folds[j]: the states at the segment's two edges)."""
        msg = self.resume(base, h_of, initial) if base else self.begin(initial)
        for j in range(base, layer):
            msg = self.apply(j, folds[j])
        return msg

    # -- pass 2 -------------------------------------------------------------------------------
    @torch.no_grad()
    def apply(self, layer: int, states) -> BiMessage:
        """Pass 2 of `layer` from the fold's states at the segment's edges (entering, leaving:
        the left-to-right lanes read the first, the right-to-left ones the second), the combine
        and the residual into h, then the next layer's pass 1. Returns its message."""
        enter, leave = states if isinstance(states, (tuple, list)) else (states, states)
        rec, block = self.rec, self.net.layers[layer]
        w, D, C = block.norm.weight, rec.D, rec.C
        last = layer == self.L - 1
        fixes, idx = [], {"fwd": 0, "rev": 0}
        for ln in self.lanes:
            j = idx[ln.d]
            idx[ln.d] += 1
            if ln.exact:
                fixes.append(None)
            else:  # the Mamba again from the fold's state and conv window (module docstring)
                src = enter if ln.d == "fwd" else leave
                fixes.append(_Exact(ln, {k: v.to(self.device) for k, v in _lane_state(src, ln.d, j).items()}))
        both = [(ln, fx) for ln, fx in zip(self.lanes, fixes, strict=True)]
        ltr = [(ln, fx) for ln, fx in both if ln.d == "fwd"]
        rtl = [(ln, fx) for ln, fx in both if ln.d == "rev"]
        for a, b in self.units:  # left to right: each half's left-to-right lane into f
            if not ltr:
                break
            x = rec.norm(self._h(a, b), w)
            f = torch.empty((b - a, C))
            for ln, fx in ltr:
                f[:, ln.half * D:(ln.half + 1) * D] = self._lane_out(ln, fx, a, b, x)
            self.f.put(a - self.start, f.numpy())
        ltr_halves = {ln.half for ln, _ in ltr}
        for a, b in reversed(self.units):  # right to left, the combine, the residual
            s = self._h(a, b)
            x = rec.norm(s, w)
            got = {ln.half: self._lane_out(ln, fx, a, b, x) for ln, fx in rtl}
            f = torch.from_numpy(self.f.get(a - self.start, b - self.start)).to(self.device) if ltr else None
            halves = []
            for half in range(2 if rec.rcps else 1):
                lt = f[:, half * D:(half + 1) * D] if half in ltr_halves else None
                parts = [p for p in (lt, got.get(half)) if p is not None]
                out = parts[0] if len(parts) == 1 else block.mixer.combine(parts[0], parts[1])
                halves.append(out if half == 0 else out.flip(-1))
            x_out = torch.cat(halves, -1) if rec.rcps else halves[0]
            nxt = x_out + s if last else rec.layer_input(layer + 1, x_out, s)
            self.h.put(a - self.start, nxt.cpu().numpy())
        self._edges(layer, enter, leave)
        return self._message(layer + 1)

    def _lane_out(self, ln: _Lane, fx, a: int, b: int, x) -> torch.Tensor:
        """A lane's output (n, D) at record positions [a, b) (record order)."""
        s, e, rows = ln.rows(a, b, _lane_input(self.rec, x, ln.half))
        if fx is None:
            y = torch.from_numpy(ln.num.get(s - ln.start, e - ln.start)).to(self.device)[None]
        else:
            y = fx.span(s, e, rows)
        return ln.out(s, y)

    def _edges(self, layer: int, enter: dict, leave: dict) -> None:
        """The layer's states at the segment's unit edges: inside it the lanes' own, at its ends
        the fold's (left to right at the last unit's end, right to left at the first's start)."""
        first, last = self.units[0][0] // self.unit_size, (self.units[-1][1] - 1) // self.unit_size
        for k in range(first, last + 1):
            per = {d: [] for d in DIRECTIONS}
            for ln in self.lanes:
                j = len(per[ln.d])
                if ln.d == "fwd" and k == last:
                    per[ln.d].append(_lane_state(leave, "fwd", j))
                elif ln.d == "rev" and k == first:
                    per[ln.d].append(_lane_state(enter, "rev", j))
                else:
                    per[ln.d].append(ln.got[k])
            states = self.edge_states.setdefault(k, [None] * self.L)
            states[layer] = {n: t.cpu().clone() for n, t in _arrays(per).items()}

    # -- the outputs --------------------------------------------------------------------------
    @torch.no_grad()
    def units_out(self, y_prev, final: ModelState, skip=frozenset()):
        """Per unit not in skip: (index, start, end, outputs, the state at its edges with y of
        its last position). After the last apply."""
        rec = self.rec
        for a, b in self.units:
            idx = a // self.unit_size
            if idx in skip:
                continue
            fin = self._h(a, b)
            hidden = rec.norm(fin, self.net.norm.weight)
            ids = rec.from_tokens(np.asarray(self.read(a, b))).to(self.device)
            got = rec.heads(hidden, torch.log_softmax(rec.logits(hidden), -1), ids)
            out = {name: got[name].cpu().numpy() for name in self.outputs}
            layers = [{k: v[None] for k, v in d.items()} for d in self.edge_states[idx]]
            state = ModelState.stack(layers, hidden[-1:, :rec.D].cpu())
            yield idx, a, b, out, state


Runner = BiSegment
