"""What the split's tests share (test_split.py, test_split_resume.py, test_delta_split.py): the
streamed reference, the relative distance, and a split run stopped after a checkpoint (or only
its folds) and resumed from what it holds."""
from __future__ import annotations

import gzip

import numpy as np
import pytest
from _pipeline_data import record_outputs

from linpipe.inputs.alphabet import tokenize
from linpipe.model.checkpoints import edge_tensors, restore_edges
from linpipe.model.segments import SegmentRunner
from linpipe.model.segments_run import InProcess, run_layers

# hg19 chr1 starts with 10,000 N: [LO, HI) = [9,000, 11,600) holds the N run's end and real
# sequence; N_END is the N run's end in record positions
N_END, LO, HI = 10_000, 9_000, 11_600


def hg19_slice(genomes):
    """Tokens of hg19 chr1 [LO, HI) (tests/data): N, then ACGT from N_END - LO."""
    with gzip.open(genomes / "korflab_hg19_chr1_first3Mb.fa.gz", "rt") as f:
        seq = "".join(line.strip() for line in f if not line.startswith(">"))[:HI]
    x = tokenize(seq[LO:])
    assert (x[:N_END - LO] == 4).all() and (x[N_END - LO:] < 4).all()  # N run, then ACGT
    return x


def serial(model, x, unit_size):
    """The streamed run unit by unit: (outputs, {unit index: ModelState after it})."""
    state = model.init_state()
    parts, states = {}, {}
    for i, a in enumerate(range(0, len(x), unit_size)):
        out, state = model.forward(x[a:a + unit_size], state)
        for k, v in out.items():
            parts.setdefault(k, []).append(v)
        states[i] = state
    return {k: np.concatenate(v) for k, v in parts.items()}, states


def rel(a, b):
    """max |a - b| over b's largest magnitude (NaN as 0)."""
    a, b = np.nan_to_num(a, nan=0.0), np.nan_to_num(b, nan=0.0)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def runners_for(model, x, bounds, unit):
    return [SegmentRunner(model, lambda a, b: x[a:b], s, e, unit, exact=k == 0)
            for k, (s, e) in enumerate(bounds)]


def outputs_of(runners, states):
    """Every segment's outputs in order and the state arrays after each unit."""
    got, unit_states = {}, {}
    for k, r in enumerate(runners):
        for idx, _a, _b, out, st in r.units_out(states[k].y[0], states[k + 1]):
            for name, v in out.items():
                got.setdefault(name, []).append(v)
            unit_states[idx] = st.to_arrays()
    return {k: np.concatenate(v) for k, v in got.items()}, unit_states


class Stop(Exception):
    pass


def folds_until_stopped(group, state0, weights, at):
    """The folds a split run on `group` (InProcess) stored before it raised Stop (`at` of them);
    its runners are closed."""
    folds = []
    with pytest.raises(Stop):
        run_layers(group, state0, weights, len(group.runners),
                   on_fold=lambda layer, states: folds.append(states))
    for r in group.runners:
        r.close()
    assert len(folds) == at
    return folds


def closing(runners, states):
    """outputs_of the runners, which are closed after."""
    try:
        return outputs_of(runners, states)
    finally:
        for r in runners:
            r.close()


def stopped_and_resumed(model, x, bounds, unit, at, weights):
    """A split run stopped right after the checkpoint of layer `at` (the segments' layer input and
    unit edges' states, and the folds before it), then fresh runners resumed from what it holds:
    (outputs, unit states) of the resumed run."""
    state0 = model.init_state()
    first = runners_for(model, x, bounds, unit)
    taken = {}

    class Checkpointing(InProcess):
        def call(self, method, args):
            out = super().call(method, args)
            if method == "apply" and args[0][0] + 1 == at:
                for k, r in enumerate(self.runners):
                    taken[k] = ({a // unit: r.rows(a, b).copy() for a, b in r.units},
                                {j: edge_tensors(r.edge_states, j) for j in range(at)})
                raise Stop
            return out

    folds = folds_until_stopped(Checkpointing(first), state0, weights, at)

    again = runners_for(model, x, bounds, unit)
    for k, r in enumerate(again):
        for j, tensors in taken[k][1].items():
            restore_edges(r, j, tensors)

    class Resuming(InProcess):
        def call(self, method, args):
            if method != "resume":
                return super().call(method, args)
            return [r.resume(layer, lambda a, b, k=k: taken[k][0][a // unit], initial)
                    for k, (r, (layer, initial)) in enumerate(zip(self.runners, args, strict=True))]

    return closing(again, run_layers(Resuming(again), state0, weights, len(bounds), start=at, folds=folds))


def stopped_and_replayed(model, x, bounds, unit, at, weights):
    """A split run stopped right after the fold of layer `at` - 1 was stored (the kill came
    during that layer's pass, and no checkpoint holds h), then fresh runners replayed the
    layers before `at` from the stored folds: ((outputs, unit states) of the resumed run, the
    layers the resumed run folded, i.e. exchanged)."""
    state0 = model.init_state()
    first = runners_for(model, x, bounds, unit)

    class Stopping(InProcess):
        def call(self, method, args):
            if method == "apply" and args[0][0] == at - 1:
                raise Stop
            return super().call(method, args)

    folds = folds_until_stopped(Stopping(first), state0, weights, at)
    again, folded = runners_for(model, x, bounds, unit), []
    states = run_layers(InProcess(again), state0, weights, len(bounds), start=at, folds=folds, replay=True,
                        on_fold=lambda layer, states: folded.append(layer))
    return closing(again, states), folded


def assert_resumed_bytes(resumed, uninterrupted) -> None:
    """stopped_and_resumed's (outputs, unit states) equal forward_split's, bit for bit."""
    got, got_states = resumed
    want, want_states, _ = uninterrupted
    assert got.keys() == want.keys()
    for name in want:
        assert np.array_equal(got[name], want[name], equal_nan=True), name
    for idx, st in want_states.items():
        for name, v in st.to_arrays().items():
            assert np.array_equal(got_states[idx][name], v), (idx, name)


def assert_close(out, serial):
    """The split store's outputs equal the serial run's to rel 1e-5 (hidden: float16's step)."""
    got, want = record_outputs(out), record_outputs(serial)
    assert got.keys() == want.keys()
    for k in want:
        a, b = np.nan_to_num(got[k].astype(np.float64)), np.nan_to_num(want[k].astype(np.float64))
        assert np.array_equal(np.isnan(got[k].astype(float)), np.isnan(want[k].astype(float))), k
        if want[k].dtype == np.float16:  # hidden is stored as float16: one rounding step more
            step = np.spacing(np.maximum(np.abs(got[k]), np.abs(want[k]))).astype(np.float64)
            assert (np.abs(a - b) <= step + 1e-5 * np.abs(b).max()).all(), k
        else:
            assert np.abs(a - b).max() <= 1e-5 * max(np.abs(b).max(), 1e-30), k
