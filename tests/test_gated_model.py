"""A gated model (config key "gate"): its tensors and their validation, `model init --gate` and
`model info`, the contract of every cut on real DNA, and `linpipe train --gate`."""
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from linpipe.cli import cli
from linpipe.errors import ModelError
from linpipe.inputs.alphabet import tokenize
from linpipe.model import Model, ModelConfig, init_net, load_model
from linpipe.training.loop import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def gated_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("g") / "gated"
    res = CliRunner().invoke(cli, ["model", "init", str(d), "--d-model", "16", "--n-layers", "2",
                                   "--n-heads", "2", "--mlp-hidden", "32", "--gate", "--gate-normalizer", "8",
                                   "--decay", "0.5,0.99"])
    assert res.exit_code == 0, res.output
    return d


def test_init_writes_the_gate_and_info_shows_it(gated_dir):
    cfg = json.loads((gated_dir / "config.json").read_text())
    assert cfg["gate"] == {"normalizer": 8.0}
    tensors = load_file(str(gated_dir / "model.safetensors"))
    assert tensors["layers.1.attn.gk_proj.weight"].shape == (2, 16)
    assert tensors["layers.1.attn.gk_proj.bias"].shape == (2,)
    assert not [k for k in tensors if k.endswith("attn.decay")]  # the gate replaces the fixed decay
    info = json.loads(CliRunner().invoke(cli, ["model", "info", str(gated_dir), "--json"]).output)
    assert info["config"]["gate"] == {"normalizer": 8.0}
    # where gk_proj's weights give 0 the gates decay by --decay
    assert info["decay"]["layer 0"] == pytest.approx([0.5, 0.99], rel=1e-6)
    text = CliRunner().invoke(cli, ["model", "info", str(gated_dir)]).output
    assert 'gate        {"normalizer": 8.0}' in text
    assert "decay layer 1 (gk_proj's bias alone): 0.5, 0.99" in text


def test_a_fixed_decay_model_has_no_gate(tmp_path):
    res = CliRunner().invoke(cli, ["model", "init", str(tmp_path / "m"), "--d-model", "16", "--n-heads", "2"])
    assert res.exit_code == 0
    assert "gate" not in json.loads((tmp_path / "m" / "config.json").read_text())
    assert not load_model(tmp_path / "m").config.layer.gated


@pytest.mark.parametrize("case", ["decay in a gated model", "gate tensors without the key", "infinite bias"])
def test_mismatched_gate_tensors_are_one_clear_error(gated_dir, tmp_path, case):
    import shutil

    d = tmp_path / "m"
    shutil.copytree(gated_dir, d)
    t = load_file(str(d / "model.safetensors"))
    if case == "decay in a gated model":
        t["layers.0.attn.decay"] = torch.ones(2)
        message = "unexpected tensor 'layers.0.attn.decay'"
    elif case == "gate tensors without the key":
        cfg = json.loads((d / "config.json").read_text())
        cfg.pop("gate")
        (d / "config.json").write_text(json.dumps(cfg))
        message = "missing tensor 'layers.0.attn.decay'"
    else:
        t["layers.0.attn.gk_proj.bias"][0] = float("inf")
        message = "tensor 'layers.0.attn.gk_proj.bias' has non-finite values"
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(ModelError, match=message):
        load_model(d)
    res = CliRunner().invoke(cli, ["model", "info", str(d)])
    assert res.exit_code == 1 and res.output.startswith("Error: ") and message in res.output
    assert res.output.count("\n") == 1


def test_gated_init_needs_decays_below_one(tmp_path):
    res = CliRunner().invoke(cli, ["model", "init", str(tmp_path / "m"), "--gate", "--decay", "1"])
    assert res.exit_code == 1 and "below 1" in res.output and res.output.count("\n") == 1


def test_any_cut_and_batches_on_real_dna(gated_dir, genomes):
    """Any cut of a real record gives the same outputs and final state (float32 round-off); the
    batched entry points (records, runs of positions from states) give the single calls' outputs; the
    gates vary with the data and are <= 0."""
    model = load_model(gated_dir)
    seq = "".join(line.strip() for line in open(genomes / "minimap2_MT-human.fa") if not line.startswith(">"))
    x = tokenize(seq)
    whole, end = model.forward(x, model.init_state())
    for step in (1000, 777, 4096):
        state, parts = model.init_state(), []
        for a in range(0, len(x), step):
            o, state = model.forward(x[a:a + step], state)
            parts.append(o)
        for k, want in whole.items():
            got = np.concatenate([p[k] for p in parts])
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=k)
        for k, v in state.to_arrays().items():
            want = end.to_arrays()[k]
            np.testing.assert_allclose(v, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=k)
    recs = model.forward_records([x[:300], x[:1000]], outputs=["logprob"])
    for r, n in zip(recs, (300, 1000), strict=True):
        np.testing.assert_allclose(r["logprob"], whole["logprob"][:n], rtol=1e-5, atol=1e-5)
    _, st = model.forward(x[:500], model.init_state())
    alts = [x[500:540], x[600:610]]
    for a, got in zip(alts, model.forward_batch(alts, [st, st], outputs=["logprob"]), strict=True):
        np.testing.assert_allclose(got["logprob"], model.forward(a, st, outputs=["logprob"])[0]["logprob"],
                                   rtol=1e-5, atol=1e-5)
    layer = model.net.layers[0]
    with torch.no_grad():
        g = layer.attn.log_gate(layer.attn_norm(model.net.embed_inputs(torch.from_numpy(x[None, :2000]))))
    assert g.shape == (1, 2000, 2) and bool((g <= 0).all()) and float(g.std(1).min()) > 1e-3


TINY = dict(d_model=16, n_layers=1, n_heads=2, mlp_hidden=32, conv_width=4, gate_normalizer=16.0)
CFG = TrainConfig(steps=60, batch=4, window=64, lr=1e-2, warmup=10, checkpoint_every=30)


def test_train_gated_learns_its_gates_and_resumes_exactly(genomes, tmp_path):
    mt = genomes / "minimap2_MT-human.fa"
    full = train([mt], tmp_path / "full", TINY, CFG)
    losses = np.asarray(full.losses)
    assert np.isfinite(losses).all() and losses[:10].mean() - losses[-10:].mean() > 0.05
    trained, start = load_model(tmp_path / "full"), init_net(ModelConfig(modality="dna", **TINY), seed=0)
    moved = trained.net.layers[0].attn.gk_proj.weight - start.layers[0].attn.gk_proj.weight
    assert trained.config.layer.gated and float(moved.abs().max()) > 1e-3  # the gates were trained
    assert train([mt], tmp_path / "resumed", TINY, CFG, stop_at=30) is None
    res = train([mt], tmp_path / "resumed", TINY, CFG, resume=True)
    np.testing.assert_allclose(res.losses, full.losses, rtol=1e-4, atol=1e-5)


def test_cli_train_gate(genomes, tmp_path):
    out = tmp_path / "m"
    r = CliRunner().invoke(cli, ["train", str(genomes / "minimap2_MT-human.fa"), "--out", str(out),
                                 "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--gate",
                                 "--steps", "3", "--batch", "2", "--window", "32", "--quiet"])
    assert r.exit_code == 0, r.output
    assert load_model(out).config.layer.gate_normalizer == 16.0
    assert isinstance(load_model(out), Model)
