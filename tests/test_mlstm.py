"""The mlstm family (transformers' xLSTM block; pipeline/model/families/mlstm): its config and
import refusals, weight_mode "fused", `model init` and `model info`, the split's unit-edge states
and the record's state against the streamed run, training through the differentiable form, and
submit SIGKILLed and resumed. Parity with transformers' predictions on the three fixtures (one
unit, cut units, packed records, --split 2 and 3) is test_fla_import.py's grid; the fixtures
re-derived with transformers' own class: test_fixtures_are_transformers_word here."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _fla_data import FLA, GIVEN, assert_refused, checkpoint, run
from _pipeline_data import make_tiny_mlstm, read_fasta

from linpipe.model import ModelConfig, load_model

SCRIPT = Path(__file__).parent / "fla_fixtures" / "make_xlstm_fixtures.py"
FIXTURES = ("xlstm", "xlstm_qk_half", "xlstm_bias")


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


@pytest.mark.parametrize("changes, message", [
    (dict(weight_mode="packed"), "'weight_mode' is 'packed': expected 'single' or 'fused'"),
    (dict(qk_dim_factor=0.3), "'qk_dim_factor' is 0.3: int(32 x 0.3) = 9 channels, not a positive multiple "
                              "of 2 heads"),
    (dict(v_dim_factor=0), "'v_dim_factor' must be a positive number, got 0"),
    (dict(gate_soft_cap=-1), "'gate_soft_cap' must be a positive number or null, got -1"),
    (dict(s_lstm_at=[0, 1]), "'s_lstm_at' is [0, 1]: sLSTM blocks (a non-linear recurrence"),
    (dict(bidirectional=True), "'bidirectional' is true: a bidirectional (masked-language) model"),
    (dict(m_num_heads=4), "'m_num_heads' is a key of ml-jku's DNA-xLSTM"),
    (dict(num_heads=None), "'num_heads' must be a positive integer, got None"),
])
def test_refusals_are_one_line_and_write_nothing(tmp_path, changes, message):
    assert_refused(tmp_path, "xlstm", changes, message)


def test_fused_weight_mode_imports_the_same_model(tmp_path):
    """weight_mode "fused" (q, k, v and the output gate in one projection, the two gates in one,
    the FFN's gate and up in one: what transformers 5.24 cannot itself build) imports to the same
    model bytes as the single tensors it fuses."""
    from safetensors.torch import load_file, save_file

    single = tmp_path / "single"
    assert run("model", "import", FLA / "xlstm_bias", single, *GIVEN).exit_code == 0
    src = checkpoint(tmp_path, "xlstm_bias", weight_mode="fused")
    t = load_file(str(src / "model.safetensors"))
    fused = {}
    groups = {"mlstm_layer.qkv_opreact": ["mlstm_layer." + n for n in ("q", "k", "v", "ogate_preact")],
              "mlstm_layer.ifgate_preact": ["mlstm_layer.igate_preact", "mlstm_layer.fgate_preact"],
              "ffn.proj_up_gate_z": ["ffn.proj_up_gate", "ffn.proj_up"]}
    taken = set()
    for i in range(2):
        p = f"backbone.blocks.{i}."
        for into, parts in groups.items():
            for kind in ("weight", "bias"):
                names = [f"{p}{n}.{kind}" for n in parts]
                fused[f"{p}{into}.{kind}"] = torch.cat([t[n] for n in names])
                taken.update(names)
    fused.update({k: v for k, v in t.items() if k not in taken})
    save_file(fused, str(src / "model.safetensors"))
    out = tmp_path / "fused"
    r = run("model", "import", src, out, *GIVEN)
    assert r.exit_code == 0, r.output
    assert (out / "model.safetensors").read_bytes() == (single / "model.safetensors").read_bytes()


def test_config_round_trips_and_refuses_what_the_block_lacks():
    base = dict(modality="dna", d_model=32, n_layers=2, n_heads=2, mlp_hidden=64, family="mlstm")
    cfg = ModelConfig(**base, conv_width=1, qk_dim_factor=0.5, gate_soft_cap=None, use_bias=True)
    d = cfg.to_json()
    assert [k for k in d if k in ("family", "qk_dim_factor", "gate_soft_cap", "use_bias")] == \
        ["family", "qk_dim_factor", "gate_soft_cap", "use_bias"]
    assert d["gate_soft_cap"] is None and d["output_logit_soft_cap"] == 30.0
    assert ModelConfig.from_json(json.loads(json.dumps(d))) == cfg
    assert cfg.state_shapes() == {"C": (2, 2, 8, 16), "n": (2, 2, 8), "m": (2, 2), "y": (32,)}
    with pytest.raises(Exception, match="'conv_width' must be 1 for family 'mlstm'"):
        ModelConfig(**base, conv_width=4)
    with pytest.raises(Exception, match="'v_dim_factor' is 0.3: int"):
        ModelConfig(**base, conv_width=1, v_dim_factor=0.3)
    with pytest.raises(Exception, match="'expand_v' is for"):
        ModelConfig(**base, conv_width=1, expand_v=2.0)


def test_model_init_writes_an_mlstm_model_and_info_shows_its_state(tmp_path):
    """`model init --family mlstm`: no convolution, K from --qk-dim-factor; model info's state is
    C (L, H, K, V), n (L, H, K) and m (L, H); the forget gates' decays from their biases."""
    out = tmp_path / "m"
    r = run("model", "init", out, "--family", "mlstm", "--d-model", "32", "--n-layers", "3", "--n-heads", "4",
            "--qk-dim-factor", "0.25")
    assert r.exit_code == 0, r.output
    d = json.loads((out / "config.json").read_text())
    assert (d["family"], d["conv_width"], d["qk_dim_factor"], d["v_dim_factor"]) == ("mlstm", 1, 0.25, 1.0)
    info = json.loads(run("model", "info", out, "--json").output)
    L, H, K, V = 3, 4, 2, 8
    assert info["state_bytes_per_record"] == 4 * (L * H * (K * V + K) + 32) + 8 * L * H  # m in float64
    decays = info["decay"]["layer 0"]
    assert len(decays) == H and all(0.9 < g < 1 for g in decays) and decays == sorted(decays)
    text = run("model", "info", out).output
    assert f"C [{L}, {H}, {K}, {V}], n [{L}, {H}, {K}], m [{L}, {H}], y [32]" in text
    r = run("model", "init", tmp_path / "c", "--family", "mlstm", "--conv-width", "3")
    assert r.exit_code != 0 and "--conv-width is for families with a convolution" in r.output
    r = run("model", "init", tmp_path / "d", "--family", "mlstm", "--decay", "0.9")
    assert r.exit_code != 0 and "--decay is not for the mlstm family" in r.output


@pytest.fixture(scope="module")
def mt_tokens():
    from linpipe.inputs import open_input

    with open_input(str(FLA / "records.fa")) as inp:
        return np.asarray(inp.read("mt_human", 0, inp.record("mt_human").length)[0])


@pytest.mark.parametrize("parts", [2, 4])
def test_split_states_equal_the_streamed_run(tmp_path, mt_tokens, parts, one_torch_thread):
    """A tiny mlstm model (biases, K != V) over the record in `parts` segments (units of 61, so
    units cut spans): every unit's outputs and stored state (C, n, m, y) equal the streamed run's
    within 1e-5 relative, and the final state too."""
    from linpipe.model.segments import segment_bounds
    from linpipe.model.segments_run import forward_split

    model = load_model(make_tiny_mlstm(tmp_path / "m"), device="cpu")
    x = mt_tokens[:1500]
    got, states, final = forward_split(model, x, segment_bounds(len(x), 61, parts), 61)
    state, outs = model.init_state(), []
    for i, a in enumerate(range(0, len(x), 61)):
        out, state = model.forward(x[a:a + 61], state, ["logprob", "entropy"])
        outs.append(out)
        if a + 61 < len(x):
            want, have = state.to_arrays(), states[i].to_arrays()
            assert want.keys() == have.keys() == {"C", "n", "m", "y"}
            for k in want:
                assert rel(have[k], want[k]) < 1e-5, (i, k)
    for k in ("logprob", "entropy"):
        assert rel(got[k], np.concatenate([o[k] for o in outs])) < 1e-5, k
    for k, v in state.to_arrays().items():
        assert rel(final.to_arrays()[k], v) < 1e-5, k


def test_training_carries_the_state_exactly(tmp_path, genomes):
    """`train` of an mlstm model (autograd through the blocks' parallel form, lanes of 2): the
    lanes' C, n and m after 4 windows are those of one inference forward (the chunked form) over
    the positions each lane read."""
    from safetensors.torch import load_file

    from linpipe.training.data import read_dna_records
    from linpipe.training.loop import TrainConfig, train

    mt = genomes / "minimap2_MT-human.fa"
    keys = dict(d_model=16, n_layers=2, n_heads=2, mlp_hidden=32, conv_width=1, family="mlstm",
                qk_dim_factor=0.5)
    # lr so small that Adam's steps (about lr each) leave every weight as it was
    cfg = TrainConfig(steps=100, batch=2, window=64, lr=1e-30, warmup=1)
    assert train([mt], tmp_path, keys, cfg, stop_at=4) is None
    model = load_model(tmp_path / "checkpoint")
    assert model.config.family == "mlstm"
    lanes = load_file(str(tmp_path / "checkpoint" / "lanes.safetensors"))
    (_, tokens), = read_dna_records(mt)
    stretch = (len(tokens) - round(len(tokens) * 0.05)) // 2  # the training part over two lanes
    for lane, start in enumerate((0, stretch)):
        _, state = model.forward(tokens[start:start + 4 * 64], model.init_state())
        assert {k.split(".")[0] for k in state.tensors()} >= {"C", "n", "m"}
        for key, t in state.tensors().items():
            torch.testing.assert_close(lanes[key][lane], t[0], rtol=1e-4, atol=1e-5)


def test_gradients_of_the_network_are_the_float64_recurrences(tmp_path):
    """The network's loss under autograd (the parallel form) has the gradients of the same
    network run through the float64 token-by-token recurrence, and the same loss as inference."""
    import linpipe.model.families.mlstm.layer as layer_mod
    from linpipe.kernels.mlstm import naive_recurrent_mlstm

    model = load_model(make_tiny_mlstm(tmp_path / "m"), device="cpu")
    net = model.net.train()
    x = torch.from_numpy(np.random.default_rng(3).integers(0, 5, (2, 150))).long()

    def loss():
        pred, _, _ = net.predict(x, net.initial_state(2))
        return torch.nn.functional.cross_entropy(pred.reshape(-1, pred.shape[-1]), x.clamp(max=3).reshape(-1))

    got = loss()
    got.backward()
    grads = {k: p.grad.clone() for k, p in net.named_parameters()}
    net.zero_grad()

    def naive(q, k, v, i, f, *, eps, initial_state, output_final_state):
        return naive_recurrent_mlstm(q, k, v, i, f, eps=eps, initial_state=initial_state,
                                     output_final_state=True)  # in float64 inside

    real = layer_mod.mlstm
    layer_mod.mlstm = naive
    try:
        want = loss()
        want.backward()
    finally:
        layer_mod.mlstm = real
    assert abs(float(got) - float(want)) < 1e-5
    with torch.inference_mode():
        pred, _, _ = model.net.predict(x, model.net.initial_state(2))
        inferred = torch.nn.functional.cross_entropy(pred.reshape(-1, pred.shape[-1]),
                                                     x.clamp(max=3).reshape(-1))
    assert abs(float(inferred) - float(want)) < 1e-5
    for k, p in net.named_parameters():
        scale = max(1e-3, float(p.grad.abs().max()))
        assert float((grads[k] - p.grad).abs().max()) < 2e-4 * scale, k


# Ray on loopback, a killed driver: before a merge (the store's resume is the fixed model's and
# the gated delta rule's in the suite, a family's state arrays being named arrays like theirs)
@pytest.mark.slow
@pytest.mark.premerge
def test_sigkilled_submit_resumes_bit_identical(genomes, tmp_path):
    """submit on Ray with an mlstm model (a long record streamed with its C, n and m, short ones
    packed) killed with SIGKILL after a few units, then submitted again: the same bytes as one
    uninterrupted run."""
    from _pipeline_data import (
        CONTIG_UNIT,
        assert_same_bytes,
        record_outputs,
        store_arrays,
        submit_and_sigkill,
        write_contigs,
        write_in_process,
    )

    model = make_tiny_mlstm(tmp_path / "mlstm")
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


# transformers' xLSTM class on a CPU: before a merge (pytest -m premerge)
@pytest.mark.slow
@pytest.mark.premerge
def test_fixtures_are_transformers_word(tmp_path):
    """transformers' xLSTMForCausalLM, live, makes the fixtures' weights and their predictions on
    the short record again (run from outside the checkout's root: transformers probes a package
    named `kernels`)."""
    pytest.importorskip("transformers")
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), *FIXTURES], capture_output=True,
                       text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    from safetensors.torch import load_file

    seqs = read_fasta(FLA / "records.fa")
    for name in FIXTURES:
        live, kept = (load_file(str(d / name / "model.safetensors")) for d in (tmp_path, FLA))
        assert live.keys() == kept.keys()
        for k in live:
            assert np.array_equal(live[k].numpy(), kept[k].numpy()), (name, k)
        fresh, stored = np.load(tmp_path / name / "expected.npz"), np.load(FLA / name / "expected.npz")
        for rid in seqs:
            for k in (f"{rid}/logprob", f"{rid}/entropy"):
                np.testing.assert_allclose(fresh[k], stored[k], rtol=0, atol=1e-6, err_msg=f"{name} {k}")
