"""The driver's side of a split run (linpipe.model.segments holds each segment's side): the
segments' first messages, then per layer the fold (the family's, families/<name>/split.py) and one
call that runs the layer on every segment; the group that
takes those calls is jobs/split.py's segment group of Ray actors, or `InProcess`. `forward_split`:
a whole record segment by segment in this process, the split's reference.
"""
from __future__ import annotations

import numpy as np

from linpipe.model.inference import Model
from linpipe.model.segments import SegmentRunner, new_runner, split_of
from linpipe.model.state import ModelState


def layer_weights(net) -> list:
    """What the fold needs of each layer: its family's (each with its fold)."""
    return split_of(net.config).weights(net)


def edge_state(folds: list[list[dict]], y, k: int) -> ModelState:
    """The fold's state entering segment k (folds[layer][k]: that layer's arrays; y: (D,))."""
    return ModelState.stack([{n: v[None] for n, v in f[k].items()} for f in folds], y.view(1, -1))


class InProcess:
    """Runs every segment's calls one after another in this process (tests, one-worker use)."""

    def __init__(self, runners: list[SegmentRunner]):
        self.runners = runners

    def call(self, method: str, args: list[tuple]) -> list:
        return [getattr(r, method)(*a) for r, a in zip(self.runners, args, strict=True)]


def run_layers(group, state0: ModelState, weights: list, n_segments: int,
               exact_first: bool = True, *, start: int = 0, folds=(), on_fold=None,
               replay: bool = False, base: int = 0) -> list[ModelState]:
    """The driver's side of a split run: the segments' first messages, then per layer the fold
    and one call that runs the layer (and the next one's first half). group.call(method,
    per-segment args) runs one method on every segment and returns the results in segment
    order. Returns the state entering every segment and after the last (n_segments + 1
    states), from state0 entering the first. start > 0: the segments resume at that layer
    from a checkpoint ("resume" in place of "begin"), folds[layer] being the stored fold of
    each layer before it (per segment, the layer's arrays); replay: no checkpoint holds the
    input of `start`, the segments run the layers before it from their tokens with those folds
    ("replay", no exchange), from the kept input of layer `base` (0: from the tokens; a list:
    per segment);
    on_fold(layer, states) sees every fold made here. A fold whose weights say `both_edges` (a
    bidirectional family's: the states at every segment edge, some read by the segment on its
    left) gives each segment the states at both its edges, (entering, leaving), in apply and replay."""
    pair = bool(weights) and getattr(weights[0], "both_edges", False)

    def at(states, k):
        return (states[k], states[k + 1]) if pair else states[k]

    first = {k: v[0].cpu() for k, v in state0.arrays.items()}
    firsts = [first if k == 0 and exact_first else None for k in range(n_segments)]
    if start and replay:
        bases = base if isinstance(base, (list, tuple)) else [base] * n_segments
        msgs = group.call("replay", [(start, [at(folds[j], k) for j in range(start)], f, bases[k])
                                     for k, f in enumerate(firsts)])
    elif start:
        msgs = group.call("resume", [(start, f) for f in firsts])
    else:
        msgs = group.call("begin", [(f,) for f in firsts])
    done = []
    for layer, w in enumerate(weights):
        if layer < start:
            states = folds[layer]
        else:
            states = w.fold({k: v[0, layer].cpu() for k, v in state0.arrays.items()}, msgs)
            if on_fold is not None:
                on_fold(layer, states)
            msgs = group.call("apply", [(layer, at(states, k)) for k in range(n_segments)])
        done.append(states)
    ys = [state0.y[0].cpu()] + [m.y for m in msgs]
    return [edge_state(done, ys[k], k) for k in range(n_segments + 1)]


def forward_split(model: Model, x, bounds: list[tuple[int, int]], unit_size: int, state0=None,
                  outputs=None, spill_dir=None):
    """One record's outputs computed segment by segment (in this process): the split method's
    reference. Returns (outputs of the whole [bounds[0][0], bounds[-1][1]) range, {unit
    index: ModelState after it}, final state)."""
    x = np.asarray(x)
    state0 = model.init_state() if state0 is None else state0
    runners = [new_runner(model, lambda a, b: x[a:b], s, e, unit_size, length=bounds[-1][1],
                          spill_dir=spill_dir, outputs=outputs, exact=k == 0)
               for k, (s, e) in enumerate(bounds)]
    try:
        states = run_layers(InProcess(runners), state0, layer_weights(model.net), len(runners))
        got: dict[str, list] = {}
        unit_states = {}
        for k, r in enumerate(runners):
            for idx, _a, b, out, st in r.units_out(states[k].y[0], states[k + 1]):
                for name, v in out.items():
                    got.setdefault(name, []).append(v)
                if b % unit_size == 0 or b == bounds[-1][1]:  # a unit's end (not a segment's cut)
                    unit_states[idx] = st
        return {k: np.concatenate(v) for k, v in got.items()}, unit_states, states[-1]
    finally:
        for r in runners:
            r.close()
