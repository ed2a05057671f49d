"""The mamba family (pipeline/model/families/mamba/) beyond the shared parity of
tests/test_fla_import.py (fla's, transformers' and Falcon Mamba's fixtures): the block against a
token-by-token float64 scan written here from Mamba's formulas, on options the fixtures do not
use, with the state carried across units cut at odd places; the split's states at unit edges
against the streamed run's, segments shorter than the conv's halo included; the import's refusals
and the two libraries' spellings; model init, its config.json and model info's state."""
from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _fla_data import FLA, GIVEN, assert_refused, checkpoint, run
from _pipeline_data import read_fasta
from _split_harness import rel, serial

from linpipe.inputs.alphabet import tokenize
from linpipe.model import Model, ModelConfig, init_net, load_model
from linpipe.model.segments_run import forward_split

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def record():
    """mt_human of the fla fixtures' records: 320 positions of a real genome, a lowercase base."""
    return tokenize(read_fasta(FLA / "records.fa")["mt_human"])


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = tmp_path_factory.mktemp("mamba") / "mamba_hf"
    r = run("model", "import", FLA / "mamba_hf", out, *GIVEN)
    assert r.exit_code == 0, r.output
    return load_model(str(out), device="cpu")


def reference_hidden(net, x) -> np.ndarray:
    """y (T, D) of tokens x from BOS, token by token in float64: Mamba's decoding step per block,
    written from its formulas (mamba_ssm's selective_state_update), not from linpipe's."""
    from linpipe.inputs.alphabet import BOS

    net = net.double()
    c = net.config
    o, W = c.layer, c.conv_width
    Ci, N, R = o.intermediate_size, o.state_size, o.dt_rank

    def rms(t, w, eps):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w

    f64 = dict(dtype=torch.float64)
    state = [(torch.zeros(Ci, N, **f64), torch.zeros(W, Ci, **f64)) for _ in net.layers]
    ys = []
    with torch.no_grad():
        for tok in [BOS, *x.tolist()]:
            h = net.embed.weight[tok]
            for i, b in enumerate(net.layers):
                m, (S, win) = b.mixer, state[i]
                a = rms(h, b.norm.weight, c.norm_eps)
                xs, z = F.linear(a, m.in_proj.weight, m.in_proj.bias).split([Ci, Ci])
                win = torch.cat([win[1:], xs[None]])
                u = (win * m.conv1d.weight[:, 0].t()).sum(0)
                u = F.silu(u + (0 if m.conv1d.bias is None else m.conv1d.bias))
                r, B, C = F.linear(u, m.x_proj.weight).split([R, N, N])
                if o.mixer_rms_eps is not None:
                    r, B, C = (rms(t, 1.0, o.mixer_rms_eps) for t in (r, B, C))
                dt = F.softplus(F.linear(r, m.dt_proj.weight, m.dt_proj.bias))  # (I,)
                S = torch.exp(dt[:, None] * -m.A_log.exp()) * S + (dt * u)[:, None] * B[None]
                y = (S @ C + m.D * u) * F.silu(z)
                h = h + F.linear(y, m.out_proj.weight, m.out_proj.bias)
                state[i] = (S, win)
            ys.append(rms(h, net.norm.weight, c.norm_eps))
    return torch.stack(ys[1:]).numpy()


# awkward shapes and the options the fixtures leave at their defaults: I 24, N 3, R 2, a conv of 1
# or 2 taps, no conv bias, biases on the projections, falcon_mamba's norms on r, B and C
OPTIONS = [
    dict(conv_width=2, state_size=3, intermediate_size=24, dt_rank=2, use_bias=True, use_conv_bias=False,
         mixer_rms_eps=1e-3),
    dict(conv_width=1, state_size=5, intermediate_size=20, dt_rank=3, use_bias=False, use_conv_bias=True),
]


@pytest.mark.parametrize("keys", OPTIONS)
def test_block_matches_a_token_by_token_scan_across_odd_units(record, keys):
    config = ModelConfig(modality="dna", d_model=12, n_layers=2, n_heads=1, mlp_hidden=0, family="mamba",
                         **keys)
    net = init_net(config, seed=3)
    with torch.no_grad():  # biases, D and A_log away from their initial values, so that they count
        for name, p in net.named_parameters():
            if name.endswith(("bias", ".D", ".A_log")):
                p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    x = record[:150]
    want = reference_hidden(copy.deepcopy(net), x)
    model = Model(net, config, device="cpu")
    state, got = model.init_state(), []
    for a, b in [(0, 1), (1, 8), (8, 45), (45, 46), (46, 150)]:  # a unit of 1 and odd cuts
        out, state = model.forward(x[a:b], state, ["hidden"])
        got.append(out["hidden"])
    assert rel(np.concatenate(got), want) < 1e-5


# three segments: in the quick suite through test_fla_import's split cells (mamba_hf, 3)
@pytest.mark.parametrize("bounds, unit", [
    pytest.param([(0, 111), (111, 222), (222, 320)], 37, marks=pytest.mark.slow),  # unit edges
    ([(0, 100), (100, 101), (101, 103), (103, 320)], 50),  # segments shorter than the halo (W-1 = 2)
])
def test_split_states_equal_the_streamed_runs(imported, record, bounds, unit):
    """The split's outputs and the state after every unit (h, the conv window, y) within 1e-5
    relative of the streamed run's: the fold carries the scan's state and the window exactly."""
    want, want_states = serial(imported, record, unit)
    got, got_states, final = forward_split(imported, record, bounds, unit)
    for k in want:
        assert np.array_equal(np.isnan(got[k]), np.isnan(want[k])), k
        assert rel(got[k], want[k]) < 1e-5, k
    assert got_states.keys() == want_states.keys()
    for i, st in want_states.items():
        g = got_states[i].to_arrays()
        assert g.keys() == st.to_arrays().keys() == {"h", "conv", "y"}
        for name, v in st.to_arrays().items():
            assert rel(g[name], v) < 1e-5, (i, name)
    last = want_states[max(want_states)].to_arrays()
    assert all(rel(v, last[k]) < 1e-5 for k, v in final.to_arrays().items())


@pytest.mark.parametrize("changes, message", [
    (dict(hidden_act="gelu"), "'hidden_act' is 'gelu'"),
    (dict(time_step_rank=0), "'time_step_rank' must be a positive integer, got 0"),
    (dict(intermediate_size=None, expand=1.5, hidden_size=33), "'expand' is 1.5"),
    (dict(use_bias="yes"), "'use_bias' must be true or false"),
    (dict(use_conv_bias=False), "tensor 'backbone.layers.0.mixer.conv1d.bias' has no place"),
    (dict(state_size=4), "tensor 'backbone.layers.0.mixer.A_log' has shape [64, 8], expected [64, 4]"),
])
def test_refusals_are_one_line_and_write_nothing(tmp_path, changes, message):
    assert_refused(tmp_path, "mamba_hf", changes, message)


def test_either_librarys_spelling_gives_the_same_model(tmp_path):
    """fla names two keys otherwise than transformers (norm_eps, dt_rank): the same checkpoint
    imports to the same bytes under either spelling, and dt_rank "auto" is ceil(hidden / 16)."""
    one = tmp_path / "one"
    assert run("model", "import", FLA / "mamba_hf", one, *GIVEN).exit_code == 0
    hf = json.loads((FLA / "mamba_hf" / "config.json").read_text())
    src = checkpoint(tmp_path, "mamba_hf", layer_norm_epsilon=None, time_step_rank=None,
                     norm_eps=hf["layer_norm_epsilon"], dt_rank=hf["time_step_rank"])
    fla = tmp_path / "fla"
    r = run("model", "import", src, fla, *GIVEN)
    assert r.exit_code == 0, r.output
    assert (one / "model.safetensors").read_bytes() == (fla / "model.safetensors").read_bytes()
    assert json.loads((one / "config.json").read_text()) == json.loads((fla / "config.json").read_text())
    cfg = json.loads((FLA / "mamba" / "config.json").read_text())
    assert cfg["dt_rank"] == math.ceil(cfg["hidden_size"] / 16)
    auto = checkpoint(tmp_path / "auto", "mamba", dt_rank="auto")
    assert run("model", "import", auto, tmp_path / "a", *GIVEN).exit_code == 0
    assert json.loads((tmp_path / "a" / "config.json").read_text())["dt_rank"] == cfg["dt_rank"]


def test_an_integer_expand_gives_the_inner_width(tmp_path):
    """fla's and transformers' configs hold expand as an int (2): without intermediate_size the
    inner width is int(expand * hidden_size), the same model as the stated width."""
    hf = json.loads((FLA / "mamba_hf" / "config.json").read_text())
    assert hf["intermediate_size"] % hf["hidden_size"] == 0
    src = checkpoint(tmp_path, "mamba_hf", intermediate_size=None,
                     expand=hf["intermediate_size"] // hf["hidden_size"])
    r = run("model", "import", src, tmp_path / "m", *GIVEN)
    assert r.exit_code == 0, r.output
    got = json.loads((tmp_path / "m" / "config.json").read_text())
    assert got["intermediate_size"] == hf["intermediate_size"]


def test_model_init_writes_a_mamba_model_and_info_shows_its_state(tmp_path):
    """`model init --family mamba`: I 2D and R ceil(D / 16) by default, no heads, no MLP; its
    config.json round-trips; model info's state is h (L, I, N) and the window (L, W-1, I); another
    family's key in its config.json is refused by name."""
    out = tmp_path / "m"
    r = run("model", "init", str(out), "--family", "mamba", "--d-model", "24", "--n-layers", "3",
            "--state-size", "4")
    assert r.exit_code == 0, r.output
    d = json.loads((out / "config.json").read_text())
    assert (d["family"], d["n_heads"], d["mlp_hidden"], d["intermediate_size"], d["dt_rank"],
            d["state_size"]) == ("mamba", 1, 0, 48, 2, 4)
    assert "mixer_rms_eps" not in d
    info = json.loads(run("model", "info", str(out), "--json").output)
    L, Ci, N, W = 3, 48, 4, d["conv_width"]
    assert info["state_bytes_per_record"] == 4 * (L * Ci * N + L * (W - 1) * Ci + 24)
    assert len(info["decay"]["layer 0"]) == Ci and all(0 < g < 1 for g in info["decay"]["layer 0"])
    text = run("model", "info", str(out)).output
    assert f"h [{L}, {Ci}, {N}], conv [{L}, {W - 1}, {Ci}], y [24]" in text
    d["head_dim"] = 8
    (out / "config.json").write_text(json.dumps(d))
    r = run("model", "info", str(out))
    assert r.exit_code != 0 and "'head_dim' is for families" in r.output and "not 'mamba'" in r.output
    r = run("model", "init", str(tmp_path / "g"), "--family", "mamba", "--gate")
    assert r.exit_code != 0 and "--gate is for the linear_attn family" in r.output
    r = run("model", "init", str(tmp_path / "d"), "--family", "mamba", "--decay", "0.9")
    assert r.exit_code != 0 and "--decay is for the linear-attention family, not mamba" in r.output


def test_a_config_with_heads_is_refused():
    with pytest.raises(Exception, match="'n_heads' must be 1 for family 'mamba'"):
        ModelConfig(modality="dna", d_model=8, n_layers=1, n_heads=2, mlp_hidden=0, family="mamba",
                    intermediate_size=16, dt_rank=1)


# Ray on loopback, a killed driver: before a merge (the store's resume is the fixed model's and
# the gated delta rule's in the suite, a family's state arrays being named arrays like theirs)
@pytest.mark.slow
@pytest.mark.premerge
def test_sigkilled_submit_resumes_bit_identical(genomes, tmp_path):
    """submit on Ray with a mamba model (a long record streamed with its h and window, short ones
    packed) killed with SIGKILL after a few units, then submitted again: the same bytes as one
    uninterrupted run."""
    import subprocess
    import sys

    from _pipeline_data import (
        CONTIG_UNIT,
        assert_same_bytes,
        make_tiny_mamba,
        record_outputs,
        store_arrays,
        submit_and_sigkill,
        write_contigs,
        write_in_process,
    )

    model = make_tiny_mamba(tmp_path / "mamba")
    fasta = tmp_path / "many.fa"
    write_contigs(genomes, fasta, 16, seed=5, long=1)
    out, clean = tmp_path / "killed.zarr", tmp_path / "clean.zarr"
    cmd = [sys.executable, "-c", "from linpipe.cli import cli; cli()", "submit", str(fasta), "--model", model,
           "--unit-size", str(CONTIG_UNIT), "--outputs", "logprob,entropy", "--out", str(out),
           "--workers", "1"]
    progress = submit_and_sigkill(cmd, out, 2, wait_s=240)
    assert 2 <= progress["units_done"] < progress["units"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr
    plan = write_in_process(fasta, model, clean, unit_size=CONTIG_UNIT, outputs=("logprob", "entropy"))
    assert plan.records and plan.packed.n_batches > 1  # streamed and packed records both ran
    assert_same_bytes(store_arrays(clean), store_arrays(out))
    assert_same_bytes(record_outputs(clean), record_outputs(out))


# a Ray cluster on loopback: before a merge (Mamba's split runs in process in test_fla_import's
# split cells, the split on Ray in test_split_ray's)
@pytest.mark.slow
@pytest.mark.premerge
def test_split_on_ray_equals_streamed(genomes, tmp_path, shared_ray):
    """`--split 3` with the imported Falcon Mamba checkpoint on the test process's local Ray
    (jobs/split.py): 20 kb of C. elegans chromosome I over three actors equals the streamed run
    within 1e-5 relative, outputs and stored unit-edge states."""
    from _pipeline_data import record_outputs, write_fasta_slice, write_in_process

    from linpipe.jobs.driver import run_job
    from linpipe.jobs.request import JobRequest
    from linpipe.store import OutputStore

    model = tmp_path / "fm"
    assert run("model", "import", FLA / "falcon_mamba", model, *GIVEN).exit_code == 0
    fasta = tmp_path / "ce_I.fa"
    want_len = {"CHROMOSOME_I": 20_000}
    assert write_fasta_slice(genomes / "htslib_ce.fa", fasta, want_len) == want_len
    out, streamed = tmp_path / "split.zarr", tmp_path / "streamed.zarr"
    summary = run_job(JobRequest(inputs=(str(fasta),), model=str(model), out=str(out), unit_size=4096,
                                 outputs=("logprob", "entropy"), workers=3, split=3))
    assert summary.positions_run == 20_000 and summary.worker_deaths == 0
    write_in_process(fasta, str(model), streamed, unit_size=4096, outputs=("logprob", "entropy"))
    got, want = record_outputs(out), record_outputs(streamed)
    assert got.keys() == want.keys()
    for k in want:
        assert rel(got[k], want[k]) < 1e-5, k
    stores = [OutputStore.open(str(p), mode="r") for p in (out, streamed)]
    key = stores[0].record_key("CHROMOSOME_I")
    for i in range(4):
        g, w = (s.boundary_state(key, i) for s in stores)
        assert g.keys() == w.keys() == {"h", "conv", "y"} and all(rel(g[n], w[n]) < 1e-5 for n in w), i


def test_training_carries_the_state_exactly(tmp_path, genomes):
    """`train` of a mamba model (autograd through the chunked scan, lanes of 2): the lanes' h and
    window after 4 windows are those of one inference forward over the positions each lane read."""
    import torch
    from safetensors.torch import load_file

    from linpipe.training.data import read_dna_records
    from linpipe.training.loop import TrainConfig, train

    mt = genomes / "minimap2_MT-human.fa"
    keys = dict(d_model=16, n_layers=2, n_heads=1, mlp_hidden=0, conv_width=4, family="mamba", state_size=4,
                intermediate_size=32, dt_rank=1)
    # lr so small that Adam's steps (about lr each) leave every weight as it was
    cfg = TrainConfig(steps=100, batch=2, window=64, lr=1e-30, warmup=1)
    assert train([mt], tmp_path, keys, cfg, stop_at=4) is None
    model = load_model(tmp_path / "checkpoint")
    assert model.config.family == "mamba"
    lanes = load_file(str(tmp_path / "checkpoint" / "lanes.safetensors"))
    (_, tokens), = read_dna_records(mt)
    stretch = (len(tokens) - round(len(tokens) * 0.05)) // 2  # the training part over two lanes
    for lane, start in enumerate((0, stretch)):
        _, state = model.forward(tokens[start:start + 4 * 64], model.init_state())
        assert {k.split(".")[0] for k in state.tensors()} >= {"h", "conv"}
        for key, t in state.tensors().items():
            torch.testing.assert_close(lanes[key][lane], t[0], rtol=1e-4, atol=1e-5)
