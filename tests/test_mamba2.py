"""The mamba2 family (pipeline/model/mamba2.py, mamba2_split.py, mamba2_import.py) beyond the
shared fla parity of tests/test_fla_import.py: the block against a token-by-token float64 SSD
written here from fla's formulas, on options the fla fixture does not use, with the state carried
across units cut at odd places; the split's states at unit edges against the streamed run's,
segments shorter than the conv's halo included; the import's refusals and transformers' spellings
of its keys."""
from __future__ import annotations

import copy
import json
import math
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _fla_data import FLA, GIVEN, assert_refused, checkpoint, run
from _pipeline_data import read_fasta
from _split_harness import rel, serial

from linpipe.inputs.alphabet import tokenize
from linpipe.model import Model, ModelConfig, init_net, load_model
from linpipe.model.families.mamba2 import mamba2_pairs
from linpipe.model.segments_run import forward_split

pytestmark = pytest.mark.usefixtures("one_torch_thread")



@pytest.fixture(scope="module")
def record():
    """mt_human of the fla fixtures' records: 320 positions of a real genome, a lowercase base."""
    return tokenize(read_fasta(FLA / "records.fa")["mt_human"])


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = tmp_path_factory.mktemp("m2") / "mamba2"
    r = run("model", "import", FLA / "mamba2", out, *GIVEN)
    assert r.exit_code == 0, r.output
    return load_model(str(out), device="cpu")


def reference_hidden(net, x) -> np.ndarray:
    """y (T, D) of tokens x from BOS, token by token in float64: fla's Mamba2 decoding step per
    block (head h reading group h // (H / G)), written from its formulas, not from linpipe's."""
    from linpipe.inputs.alphabet import BOS

    net = net.double()
    c = net.config
    o, H, W = c.layer, c.n_heads, c.conv_width
    P, N, G, inner = o.head_dim, o.state_size, o.n_groups, c.n_heads * o.head_dim
    lo, hi = o.dt_limit
    channels = inner + 2 * G * N

    def rms(t, w, eps):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w

    f64 = dict(dtype=torch.float64)
    blocks = [(b, torch.zeros(H, P, N, **f64), torch.zeros(W, channels, **f64)) for b in net.layers]
    ys = []
    with torch.no_grad():
        for tok in [BOS, *x.tolist()]:
            h = net.embed.weight[tok]
            for i, (b, S, win) in enumerate(blocks):
                m = b.mixer
                proj = F.linear(rms(h, b.norm.weight, c.norm_eps), m.in_proj.weight, m.in_proj.bias)
                z, xbc, dt = proj.split([inner, channels, H])
                win = torch.cat([win[1:], xbc[None]])
                xbc = (win * m.conv1d.weight[:, 0].t()).sum(0)
                xbc = F.silu(xbc + (0 if m.conv1d.bias is None else m.conv1d.bias))
                xs, B, C = xbc.split([inner, G * N, G * N])
                dt = F.softplus(dt + m.dt_bias).clamp(lo, math.inf if hi is None else hi)
                xs, B, C = xs.view(H, P), B.view(G, N), C.view(G, N)
                y = torch.empty(H, P, **f64)
                for hd in range(H):
                    g = hd // (H // G)
                    decay = torch.exp(dt[hd] * -m.A_log[hd].exp())
                    S[hd] = decay * S[hd] + dt[hd] * torch.outer(xs[hd], B[g])
                    y[hd] = S[hd] @ C[g] + m.D.view(H, -1)[hd] * xs[hd]
                y = y.reshape(-1)
                if not o.rmsnorm:
                    y = y * F.silu(z)
                elif o.norm_before_gate:
                    y = rms(y.view(G, -1), 1.0, c.norm_eps).reshape(-1) * m.norm.weight * F.silu(z)
                else:
                    y = rms((y * F.silu(z)).view(G, -1), 1.0, c.norm_eps).reshape(-1) * m.norm.weight
                h = h + F.linear(y, m.out_proj.weight, m.out_proj.bias)
                blocks[i] = (b, S, win)
            ys.append(rms(h, net.norm.weight, c.norm_eps))
    return torch.stack(ys[1:]).numpy()


# awkward shapes and the options the fla fixture leaves at fla's defaults: 6 heads of P 5 in 3
# groups (or 1), N 3, a conv of 2 or 3 taps, D per channel, the norm before the gate or no norm,
# no biases, a dt_limit with a floor
OPTIONS = [
    dict(n_groups=3, state_size=3, D_has_hdim=True, norm_before_gate=True, use_bias=False,
         use_conv_bias=False, dt_limit=(0.02, None)),
    dict(n_groups=1, state_size=3, rmsnorm=False, use_bias=True, dt_limit=(0.0, 0.05)),
]


@pytest.mark.parametrize("keys, width", [(OPTIONS[0], 3), (OPTIONS[1], 2)])
def test_block_matches_a_token_by_token_ssd_across_odd_units(record, keys, width):
    config = ModelConfig(modality="dna", d_model=12, n_layers=2, n_heads=6, mlp_hidden=0, conv_width=width,
                         family="mamba2", head_dim=5, **dict(mamba2_pairs(keys, "test")))
    net = init_net(config, seed=3)
    with torch.no_grad():  # biases and D away from fla's zeros and ones, so that they count
        for name, p in net.named_parameters():
            if name.endswith(("bias", ".D")) and "dt_bias" not in name:
                p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    x = record[:150]
    want = reference_hidden(copy.deepcopy(net), x)
    model = Model(net, config, device="cpu")
    state, got = model.init_state(), []
    for a, b in [(0, 1), (1, 8), (8, 45), (45, 46), (46, 150)]:  # a unit of 1 and odd cuts
        out, state = model.forward(x[a:b], state, ["hidden"])
        got.append(out["hidden"])
    assert rel(np.concatenate(got), want) < 1e-5


@pytest.mark.parametrize("bounds, unit", [
    ([(0, 111), (111, 222), (222, 320)], 37),  # unit edges, three segments
    ([(0, 100), (100, 101), (101, 103), (103, 320)], 50),  # segments shorter than the halo (W-1 = 3)
])
def test_split_states_equal_the_streamed_runs(imported, record, bounds, unit):
    """The split's outputs and the state after every unit (S, the conv window, y) within 1e-5
    relative of the streamed run's: the fold carries the SSD state and the window exactly."""
    want, want_states = serial(imported, record, unit)
    got, got_states, final = forward_split(imported, record, bounds, unit)
    for k in want:
        assert np.array_equal(np.isnan(got[k]), np.isnan(want[k])), k
        assert rel(got[k], want[k]) < 1e-5, k
    assert got_states.keys() == want_states.keys()
    for i, st in want_states.items():
        g = got_states[i].to_arrays()
        assert g.keys() == st.to_arrays().keys() == {"S", "conv", "y"}
        for name, v in st.to_arrays().items():
            assert rel(g[name], v) < 1e-5, (i, name)
    last = want_states[max(want_states)].to_arrays()
    assert all(rel(v, last[k]) < 1e-5 for k, v in final.to_arrays().items())


@pytest.mark.parametrize("changes, message", [
    (dict(num_heads=3), "'num_heads' is 3; expand x hidden_size / head_dim gives 4"),
    (dict(n_groups=3), "'n_groups' is 3: 4 heads cannot share B and C in 3 groups"),
    (dict(head_dim=24), "'expand' is 2: expand x hidden_size must be a whole number of heads of head_dim 24"),
    (dict(hidden_act="gelu"), "'hidden_act' is 'gelu'"),
    (dict(dt_limit=[0.5, 0.1]), "'dt_limit' is [0.5, 0.1]"),
    (dict(use_bias="yes"), "'use_bias' must be true or false"),
    (dict(use_conv_bias=False), "tensor 'backbone.layers.0.mixer.conv1d.bias' has no place"),
])
def test_refusals_are_one_line_and_write_nothing(tmp_path, changes, message):
    assert_refused(tmp_path, "mamba2", changes, message)


def test_transformers_spellings_give_the_same_model(tmp_path):
    """transformers' Mamba2Config names three of the keys otherwise (rms_norm, time_step_limit,
    layer_norm_epsilon): the same checkpoint imports to the same bytes; an unbounded limit
    (Infinity in config.json) is stored as null and loads."""
    one = tmp_path / "one"
    assert run("model", "import", FLA / "mamba2", one, *GIVEN).exit_code == 0
    fla_cfg = json.loads((FLA / "mamba2" / "config.json").read_text())
    src = checkpoint(tmp_path, "mamba2", rmsnorm=None, dt_limit=None, norm_eps=None,
                      rms_norm=fla_cfg["rmsnorm"], time_step_limit=fla_cfg["dt_limit"],
                      layer_norm_epsilon=fla_cfg["norm_eps"])
    hf = tmp_path / "hf"
    r = run("model", "import", src, hf, *GIVEN)
    assert r.exit_code == 0, r.output
    assert (one / "model.safetensors").read_bytes() == (hf / "model.safetensors").read_bytes()
    assert json.loads((one / "config.json").read_text()) == json.loads((hf / "config.json").read_text())
    shutil.rmtree(src)
    src = checkpoint(tmp_path, "mamba2", dt_limit=[0.0, math.inf])
    assert run("model", "import", src, tmp_path / "inf", *GIVEN).exit_code == 0
    assert json.loads((tmp_path / "inf" / "config.json").read_text())["dt_limit"] == [0.0, None]
    assert load_model(str(tmp_path / "inf")).config.layer.dt_limit == (0.0, None)


# Before a merge: the split's mamba2 code (mamba2_split.py) is test_split_states_equal_the_streamed_runs'
# and test_fla_import's; what Ray adds (actors, the driver's exchange, the stored states) is the
# same code for every family: test_split_ray.py's and test_delta_split_ray.py's in the suite
@pytest.mark.slow  # a job on Ray
@pytest.mark.premerge
def test_split_on_ray_equals_streamed(genomes, tmp_path, shared_ray):
    """`--split 2` with the imported mamba2 checkpoint on a local Ray (jobs/split.py):
    20 kb of C. elegans chromosome I over two actors equals the streamed run within 1e-5
    relative, outputs and stored unit-edge states, each unit written once."""
    from _pipeline_data import record_outputs, write_fasta_slice, write_in_process

    from linpipe.jobs.driver import run_job
    from linpipe.jobs.request import JobRequest
    from linpipe.store import OutputStore

    model = tmp_path / "m2"
    assert run("model", "import", FLA / "mamba2", model, *GIVEN).exit_code == 0
    fasta = tmp_path / "ce_I.fa"
    want_len = {"CHROMOSOME_I": 20_000}
    assert write_fasta_slice(genomes / "htslib_ce.fa", fasta, want_len) == want_len
    out, streamed = tmp_path / "split.zarr", tmp_path / "streamed.zarr"
    summary = run_job(JobRequest(inputs=(str(fasta),), model=str(model), out=str(out), unit_size=4096,
                                 outputs=("logprob", "entropy"), workers=2, split=2))
    assert summary.positions_run == 20_000 and summary.worker_deaths == 0
    write_in_process(fasta, str(model), streamed, unit_size=4096, outputs=("logprob", "entropy"))
    got, want = record_outputs(out), record_outputs(streamed)
    assert got.keys() == want.keys()
    for k in want:
        assert rel(got[k], want[k]) < 1e-5, k
    stores = [OutputStore.open(str(p), mode="r") for p in (out, streamed)]
    key = stores[0].record_key("CHROMOSOME_I")
    for i in range(5):
        g, w = (s.boundary_state(key, i) for s in stores)
        assert g.keys() == w.keys() and all(rel(g[n], w[n]) < 1e-5 for n in w), i
