"""One caduceus record split over several workers (families/caduceus/split.py; issue 67): per
layer both directions' pass 1 from zero states, the mamba split's fold left to right and right to
left, pass 2 from the exact states, the combine and the residual. On the real records of
tests/data/caduceus (human MT, A. thaliana Chr2 pieces, C. elegans pieces of 45 and 3 positions)
with the ph (bidirectional) and ps (RCPS) fixtures: in process against the whole-record forward
(record.py), its resumes from stored folds and kept layers, and through `submit` on Ray.

Tolerance: every stored output and unit-edge state within SPLIT_TOL of the one-worker whole-record
run (float32 folds; measured at most 3.8e-6 on logprob_acgt, 3.7e-6 on hidden, 2.4e-6 on the
states, over P = 2, 3, 20 and 45 segments); one segment: the same bytes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _fla_data import run
from _pipeline_data import read_fasta
from _quick import cells

from linpipe.inputs.alphabet import tokenize
from linpipe.model import load_model
from linpipe.model.families.caduceus.record import load
from linpipe.model.segments import new_runner, segment_bounds
from linpipe.model.segments_run import InProcess, forward_split, layer_weights, run_layers

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CAD = Path(__file__).parent / "data" / "caduceus"
SPLIT_TOL = 1e-5
OUTPUTS = ("logprob", "entropy", "hidden", "logprob_acgt")


@pytest.fixture(scope="module")
def records():
    return read_fasta(CAD / "records.fa")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """ph and ps imported: (directory, the linpipe Model the split runs, the whole-record forward)."""
    out = {}
    for name in ("ph", "ps"):
        d = tmp_path_factory.mktemp("caduceus") / name
        assert run("model", "import", CAD / name, d).exit_code == 0
        out[name] = (d, load_model(d, device="cpu"), load(d))
    return out


def whole(rec, x, unit):
    """The one-worker run's outputs (numpy) and per unit its states (units of `unit`)."""
    T = len(x)
    bounds = tuple(range(0, T, unit)) + (T,)
    edges = []
    got = rec.outputs(rec.from_tokens(x), unit=bounds, edges=edges)
    return {k: v.numpy() for k, v in got.items()}, rec.unit_states(edges, len(bounds) - 1)


def assert_close(got: dict, want: dict, tol: float) -> float:
    worst = 0.0
    for k, w in want.items():
        g = np.asarray(got[k])
        assert g.shape == w.shape and (np.isnan(g) == np.isnan(w)).all(), k
        ok = ~np.isnan(w)
        d = float(np.abs(g[ok] - w[ok]).max(initial=0))
        assert d <= tol, (k, d)
        worst = max(worst, d)
    return worst


# quick: ph on a 2,000-position record in units of 63 over 3 segments (awkward edges), ps (RCPS)
# on the 3-position one in units of 1 over 3 (every segment shorter than the conv's halo of 3),
# one segment (the one-worker bytes). Before a merge: ps in units of 65 over 2, segments of 2
# and 1 positions (ph, ps) on the 45-position record, the 10,000-position one over 2 and 3.
GRID = [("ph", "chr2_nrun", 63, 3), ("ps", "ce_short", 1, 3), ("ps", "chr2_nrun", 300, 1),
        ("ps", "chr2_nrun", 65, 2), ("ph", "ce_mt", 2, 20), ("ps", "ce_mt", 1, 45),
        ("ph", "chr2_iupac", 300, 2), ("ps", "chr2_iupac", 63, 3)]


@pytest.mark.parametrize("name, rid, unit, P", cells(GRID, quick=GRID[:3], suite=[]))
def test_split_equals_the_whole_record(models, records, name, rid, unit, P):
    """Every output and every unit edge's state of the record split into P segments of whole
    units within SPLIT_TOL of the one-worker whole-record run; P = 1 the same bytes."""
    _d, model, rec = models[name]
    x = tokenize(records[rid])
    bounds = segment_bounds(len(x), unit, P, 1.0)
    assert len(bounds) == P
    got, states, _final = forward_split(model, x, bounds, unit, outputs=OUTPUTS)
    want, want_states = whole(rec, x, unit)
    assert sorted(states) == list(range(len(want_states)))
    if P == 1:
        assert all(np.array_equal(got[k], want[k], equal_nan=True) for k in OUTPUTS)
        for u, w in enumerate(want_states):
            assert all(np.array_equal(states[u].to_arrays()[n], w[n]) for n in w), u
        return
    assert_close(got, {k: want[k] for k in OUTPUTS}, SPLIT_TOL)
    for u, w in enumerate(want_states):
        assert_close(states[u].to_arrays(), w, SPLIT_TOL)


class Kept(InProcess):
    """Segments in this process that keep, as jobs/split.py's actors do, each layer's input
    (h, per unit) and its unit edges' states after every apply; replay reads them back."""

    def __init__(self, runners, kept=None, base=0):
        super().__init__(runners)
        self.kept, self.base = {} if kept is None else kept, base

    def call(self, method, args):
        if method == "replay" and self.base:
            out = []
            for r, (layer, folds, initial, _base) in zip(self.runners, args, strict=True):
                h, edges = self.kept[(r.start, self.base)]
                for u, per_layer in edges.items():
                    for j in range(self.base):
                        r.record_edge((u + 1) * r.unit_size, j, per_layer[j])
                out.append(r.replay(layer, folds, initial, base=self.base, h_of=lambda a, b, h=h: h[a]))
            return out
        got = super().call(method, args)
        if method == "apply":
            layer = args[0][0]
            for r in self.runners:
                self.kept[(r.start, layer + 1)] = ({a: r.rows(a, b) for a, b in r.units},
                                                   {u: list(s) for u, s in r.edge_states.items()})
        return got


def split_run(model, x, bounds, unit, *, k0=0, state0=None, group=Kept, **kw):
    """Segments k0.. of `bounds` run by run_layers (kw: its resume arguments): (their outputs and
    states per unit, the folds made, the group)."""
    state0 = model.init_state() if state0 is None else state0
    runners = [new_runner(model, lambda a, b: x[a:b], s, e, unit, length=len(x), outputs=OUTPUTS,
                          exact=k == 0) for k, (s, e) in enumerate(bounds) if k >= k0]
    folds = {}
    g = group(runners, **kw.pop("kept", {}))
    states = run_layers(g, state0, layer_weights(model.net), len(runners), exact_first=k0 == 0,
                        on_fold=lambda layer, st: folds.setdefault(layer, st), **kw)
    units = {}
    for k, r in enumerate(runners):
        for idx, _a, _b, out, st in r.units_out(states[k].y[0], states[k + 1]):
            units[idx] = (out, st.to_arrays())
        r.close()
    return units, [folds[j] for j in sorted(folds)], g


def assert_same_units(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for u in a:
        for x, y in zip(a[u], b[u], strict=True):
            assert x.keys() == y.keys()
            assert all(np.array_equal(x[n], y[n], equal_nan=True) for n in x), u


def test_a_resumed_split_gives_the_same_bytes(models, records):
    """The split's resumes in process (jobs/split.py's, without Ray): from the stored folds of
    both layers replayed from the tokens, from the kept input of layer 1 and its unit edges'
    states, and a group restarted at segment 1 from the state stored with segment 0's last unit
    (the fold's value, exchanges made again): the same bytes as the uninterrupted split run (ps,
    RCPS: four lanes a layer; 2,000 positions in units of 250 over 3 segments)."""
    _d, model, _rec = models["ps"]
    x, unit = tokenize(records["chr2_nrun"]), 250
    bounds = segment_bounds(len(x), unit, 3, 1.0)
    ref, folds, g = split_run(model, x, bounds, unit)
    assert len(folds) == model.config.n_layers == 2
    got, _, _ = split_run(model, x, bounds, unit, start=2, folds=folds[:2], replay=True)
    assert_same_units(got, ref)
    got, _, _ = split_run(model, x, bounds, unit, start=2, folds=folds[:2], replay=True, base=1,
                          kept={"kept": g.kept, "base": 1})
    assert_same_units(got, ref)
    from linpipe.model import ModelState

    first = bounds[1][0] // unit
    state0 = ModelState.from_arrays(ref[first - 1][1])
    got, _, _ = split_run(model, x, bounds, unit, k0=1, state0=state0)
    assert_same_units(got, {u: v for u, v in ref.items() if u >= first})
