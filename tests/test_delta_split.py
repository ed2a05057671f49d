"""The split for delta-rule models (pipeline/model/delta_split.py): a record in P segments, each
layer's (M, dS) summaries folded across segments, equals the streamed run within the documented
tolerance (docs/sequence-parallel.md: 1e-5 relative), on real genome slices; a resumed split run
gives the uninterrupted one's bytes."""
import gzip

import numpy as np
import pytest
from _pipeline_data import make_tiny_model

from linpipe.inputs.alphabet import tokenize
from linpipe.model import load_model
from linpipe.model.checkpoints import edge_tensors, restore_edges
from linpipe.model.segments import (
    InProcess,
    SegmentRunner,
    forward_split,
    layer_weights,
    run_layers,
    segment_bounds,
    spill_bytes,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAMILIES = ["delta_net", "gated_deltanet"]
# hg19 chr1 starts with 10,000 N: [9,000, 11,600) holds the N run's end and real sequence
N_END, LO, HI = 10_000, 9_000, 11_600


@pytest.fixture(scope="module")
def hg19(genomes):
    with gzip.open(genomes / "korflab_hg19_chr1_first3Mb.fa.gz", "rt") as f:
        seq = "".join(line.strip() for line in f if not line.startswith(">"))[:HI]
    x = tokenize(seq[LO:])
    assert (x[:N_END - LO] == 4).all() and (x[N_END - LO:] < 4).all()  # N run, then ACGT
    return x


@pytest.fixture(scope="module")
def ce(genomes):
    from linpipe.inputs import open_input

    inp = open_input(str(genomes / "htslib_ce.fa"))
    x, _mask = inp.read(inp.records[0].id, 0, 1_500)
    inp.close()
    return np.asarray(x)


@pytest.fixture(scope="module", params=FAMILIES)
def model(request, tmp_path_factory):
    return load_model(make_tiny_model(tmp_path_factory.mktemp(request.param), family=request.param),
                      device="cpu")


def streamed(model, x, unit_size):
    state = model.init_state()
    parts, states = {}, {}
    for i, a in enumerate(range(0, len(x), unit_size)):
        out, state = model.forward(x[a:a + unit_size], state)
        for k, v in out.items():
            parts.setdefault(k, []).append(v)
        states[i] = state
    return {k: np.concatenate(v) for k, v in parts.items()}, states


def rel(a, b):
    a, b = np.nan_to_num(a, nan=0.0), np.nan_to_num(b, nan=0.0)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def check(model, x, bounds, unit_size):
    """Outputs and the states after every unit within 1e-5 relative of the streamed run's."""
    want, want_states = streamed(model, x, unit_size)
    got, got_states, final = forward_split(model, x, bounds, unit_size)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].shape == want[k].shape, k
        assert np.array_equal(np.isnan(got[k]), np.isnan(want[k])), k  # logprob NaN at N, both
        assert rel(got[k], want[k]) < 1e-5, (k, rel(got[k], want[k]))
    assert got_states.keys() == want_states.keys()
    for i, st in want_states.items():
        g = got_states[i].to_arrays()
        assert g.keys() == st.to_arrays().keys()
        for name, v in st.to_arrays().items():
            assert rel(g[name], v) < 1e-5, (i, name, rel(g[name], v))
    last = want_states[max(want_states)].to_arrays()
    for name, v in final.to_arrays().items():
        assert rel(v, last[name]) < 1e-5, name


@pytest.mark.parametrize("parts", [2, 3])
def test_delta_split_equals_streamed_on_unit_edges(model, hg19, parts):
    """P = 2, 3 on unit edges (the Ray path's layout), over the N run's end and real sequence."""
    bounds = segment_bounds(len(hg19), 256, parts)
    assert len(bounds) == parts
    check(model, hg19, bounds, 256)


def test_delta_split_short_segments(model, hg19, ce):
    """Segments shorter than the conv halo (1 and 2 positions: the halo reaches back over them),
    cuts inside the N run, on its last N, and off unit edges; a second genome."""
    e = N_END - LO
    for cuts in ([e - 1, e, e + 2], [700, 701, e, e + 1, 2300]):
        edges = [0] + sorted(cuts) + [len(hg19)]
        check(model, hg19, list(zip(edges[:-1], edges[1:], strict=True)), 512)
    check(model, ce, [(0, 600), (600, 602), (602, 1500)], 300)


def test_delta_spill_is_as_budgeted(model, ce):
    c = model.config
    for exact in (True, False):
        r = SegmentRunner(model, lambda a, b: ce[a:b], 0, 1000, 500, exact=exact)
        assert r.h.mem.nbytes + r.num.mem.nbytes == spill_bytes(c, 1000, exact)
        r.close()
    gate = c.n_heads * c.head_v_dim if c.use_gate else 0
    want = 1000 * (c.d_model + c.n_heads * (c.head_v_dim + c.head_dim) + gate) * 4  # h, then the rows
    assert spill_bytes(c, 1000) == want


class Stop(Exception):
    pass


def runners_for(model, x, bounds, unit):
    return [SegmentRunner(model, lambda a, b: x[a:b], s, e, unit, exact=k == 0)
            for k, (s, e) in enumerate(bounds)]


def outputs_of(runners, states):
    got, unit_states = {}, {}
    for k, r in enumerate(runners):
        for idx, _a, _b, out, st in r.units_out(states[k].y[0], states[k + 1]):
            for name, v in out.items():
                got.setdefault(name, []).append(v)
            unit_states[idx] = st.to_arrays()
    return {k: np.concatenate(v) for k, v in got.items()}, unit_states


@pytest.mark.parametrize("at", [1, 2])  # 2: after the last layer (a kill during the writes)
def test_delta_resume_from_a_checkpoint_gives_the_uninterrupted_bytes(model, ce, at):
    unit = 256
    bounds = segment_bounds(len(ce), unit, 3)
    want, want_states, _ = forward_split(model, ce, bounds, unit)
    weights, state0 = layer_weights(model.net), model.init_state()
    first = runners_for(model, ce, bounds, unit)
    taken, folds = {}, []

    class Checkpointing(InProcess):
        def call(self, method, args):
            out = super().call(method, args)
            if method == "apply" and args[0][0] + 1 == at:
                for k, r in enumerate(self.runners):
                    taken[k] = ({a // unit: r.rows(a, b).copy() for a, b in r.units},
                                {j: edge_tensors(r.edge_states, j) for j in range(at)})
                raise Stop
            return out

    with pytest.raises(Stop):
        run_layers(Checkpointing(first), state0, weights, len(bounds),
                   on_fold=lambda layer, S, z, h: folds.append((S, z, h)))
    for r in first:
        r.close()

    again = runners_for(model, ce, bounds, unit)
    for k, r in enumerate(again):
        for j, tensors in taken[k][1].items():
            restore_edges(r, j, tensors)

    class Resuming(InProcess):
        def call(self, method, args):
            if method != "resume":
                return super().call(method, args)
            return [r.resume(layer, lambda a, b, k=k: taken[k][0][a // unit], initial)
                    for k, (r, (layer, initial)) in enumerate(zip(self.runners, args, strict=True))]

    states = run_layers(Resuming(again), state0, weights, len(bounds), start=at, folds=folds)
    got, got_states = outputs_of(again, states)
    for r in again:
        r.close()
    for name in want:
        assert np.array_equal(got[name], want[name], equal_nan=True), name
    for idx, st in want_states.items():
        for name, v in st.to_arrays().items():
            assert np.array_equal(got_states[idx][name], v), (idx, name)
