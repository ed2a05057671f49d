"""The split for delta-rule models (pipeline/model/families/delta_net/split.py): a record in P segments, each
layer's (M, dS) summaries folded across segments, equals the streamed run within the documented
tolerance (docs/sequence-parallel.md: 1e-5 relative), on real genome slices; a resumed split run
gives the uninterrupted one's bytes."""

import numpy as np
import pytest
from _pipeline_data import make_tiny_model
from _quick import cells
from _split_harness import LO, N_END, assert_resumed_bytes, hg19_slice, rel, serial, stopped_and_resumed

from linpipe.model import load_model
from linpipe.model.families.fla_keys import key_dim, value_dim
from linpipe.model.segments import SegmentRunner, segment_bounds, spill_bytes
from linpipe.model.segments_run import forward_split, layer_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# each family, and gated_deltanet with grouped value heads (2 query/key heads, 4 value heads)
MODELS = {"delta_net": {}, "gated_deltanet": {}, "gated_deltanet_gva": dict(n_v_heads=4)}


@pytest.fixture(scope="module")
def hg19(genomes):
    return hg19_slice(genomes)


@pytest.fixture(scope="module")
def ce(genomes):
    from linpipe.inputs import open_input

    inp = open_input(str(genomes / "htslib_ce.fa"))
    x, _mask = inp.read(inp.records[0].id, 0, 1_500)
    inp.close()
    return np.asarray(x)


@pytest.fixture(scope="module", params=MODELS)
def model(request, tmp_path_factory):
    d = make_tiny_model(tmp_path_factory.mktemp(request.param), family=request.param.removesuffix("_gva"),
                        **MODELS[request.param])
    return load_model(d, device="cpu")


def check(model, x, bounds, unit_size):
    """Outputs and the states after every unit within 1e-5 relative of the streamed run's."""
    want, want_states = serial(model, x, unit_size)
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


# the quick suite: each family, each P
@pytest.mark.parametrize("model,parts", cells([(f, p) for f in MODELS for p in (2, 3)],
                                              quick=[("delta_net", 2), ("gated_deltanet", 3)]),
                         indirect=["model"], scope="module")
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
    HV, K, V = c.spec.v_heads(c), key_dim(c), value_dim(c)  # the rule's heads: q_state holds q per value head
    gate = HV * V if c.layer.use_gate else 0
    want = 1000 * (c.d_model + HV * (V + K) + gate) * 4  # h, then the rows
    assert spill_bytes(c, 1000) == want


# at 2: after the last layer (a kill during the writes); the quick suite: each family, each `at`
@pytest.mark.parametrize("model,at", cells([(f, at) for f in MODELS for at in (1, 2)],
                                           quick=[("delta_net", 1), ("gated_deltanet", 2)]),
                         indirect=["model"], scope="module")
def test_delta_resume_from_a_checkpoint_gives_the_uninterrupted_bytes(model, ce, at):
    unit = 256
    bounds = segment_bounds(len(ce), unit, 3)
    assert_resumed_bytes(stopped_and_resumed(model, ce, bounds, unit, at, layer_weights(model.net)),
                         forward_split(model, ce, bounds, unit))


def test_delta_split_without_short_convs(ce):
    """use_short_conv false: no halo, no head rows (the state's conv window is empty)."""
    from linpipe.model import Model, ModelConfig, init_net

    cfg = ModelConfig(modality="dna", d_model=32, n_layers=2, n_heads=2, mlp_hidden=64, family="delta_net",
                      head_dim=16, use_short_conv=False)
    model = Model(init_net(cfg, seed=2), cfg, device="cpu")
    check(model, ce, [(0, 300), (300, 302), (302, 1500)], 300)
