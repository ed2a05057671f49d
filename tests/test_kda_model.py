"""The kda family (Kimi Delta Attention): `model init --family kda` writes fla 0.6's KDA tensors
(the names and shapes `model import` reads), its config.json keys and their one-line refusals,
`model info`'s state, training through the chunked form's autograd, and submit on Ray SIGKILLed
and resumed. (Parity with fla's own class, cut units, packed records and the split over 2 and 3
segments: tests/test_fla_import.py's kda fixtures; strands, score-variants and verify: the
tiny-model grids, _pipeline_data.MODEL_KINDS.)"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from _fla_data import FLA
from _model_edits import DROP, edit_config
from _pipeline_data import (
    CONTIG_UNIT,
    assert_same_bytes,
    make_tiny_kda,
    record_outputs,
    store_arrays,
    submit_and_sigkill,
    write_contigs,
    write_in_process,
)
from click.testing import CliRunner
from safetensors.torch import load_file

from linpipe.cli import cli
from linpipe.errors import ModelError
from linpipe.model import ModelConfig, init_net, load_model
from linpipe.training.loop import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _init(path, *args):
    return CliRunner().invoke(cli, ["model", "init", str(path), "--family", "kda", "--d-model", "32",
                                    "--n-heads", "2", "--head-dim", "16", "--mlp-hidden", "64", *args])


def test_init_writes_flas_kda_tensors_and_info_shows_the_state(tmp_path):
    """model init --family kda at the kda fixture's sizes writes every layer tensor fla's
    KDAForCausalLM has, named and shaped as fla's (so an init'd model and an imported one are
    one layout); --lower-bound gives the bounded gate with fla's safe-gate init (A_log 0)."""
    d = tmp_path / "kda"
    res = _init(d)
    assert res.exit_code == 0, res.output
    cfg = json.loads((d / "config.json").read_text())
    assert (cfg["family"], cfg["head_dim"], cfg["expand_v"], cfg["use_short_conv"]) == ("kda", 16, 1.0, True)
    assert "lower_bound" not in cfg and "n_v_heads" not in cfg and "use_gate" not in cfg
    ours = {k: tuple(v.shape) for k, v in load_file(str(d / "model.safetensors")).items()
            if k.startswith("layers.")}
    fla = {k.removeprefix("model."): tuple(v.shape) for k, v in
           load_file(str(FLA / "kda" / "model.safetensors")).items() if k.startswith("model.layers.")}
    assert ours == fla
    info = json.loads(CliRunner().invoke(cli, ["model", "info", str(d), "--json"]).output)
    # per layer S (HV, K, V) = 2*16*16 and the q, k, v windows 3 x (16*2 + 16*2 + 16*2), then y (D)
    assert info["family"] == "kda" and info["state_bytes_per_record"] == 4 * (2 * (2 * 256 + 3 * 96) + 32)
    text = CliRunner().invoke(cli, ["model", "info", str(d)]).output
    assert "decay layer 1 (dt_bias alone, geometric mean over the keys): " in text

    bounded = tmp_path / "bounded"
    assert _init(bounded, "--lower-bound", "-5", "--conv-width", "1").exit_code == 0
    c = load_model(bounded).config
    assert (c.layer.lower_bound, c.layer.use_short_conv) == (-5.0, False)
    assert c.state_shapes() == {"S": (2, 2, 16, 16), "y": (32,)}  # no window without the convolutions
    t = load_file(str(bounded / "model.safetensors"))
    assert not t["layers.0.attn.A_log"].any() and not [k for k in t if "conv1d" in k]


@pytest.mark.parametrize("change, message", [
    ({"lower_bound": 0.5}, "'lower_bound' must be a number < 0 (the gate's floor, a log-decay), got 0.5"),
    ({"lower_bound": "low"}, "'lower_bound' must be a number, got 'low'"),
    ({"n_v_heads": 3}, "'n_v_heads' must be a positive multiple of n_heads 2, got 3"),
    ({"expand_v": 0.3}, "'expand_v' 0.3 times head_dim 16 is not a positive integer"),
    ({"allow_neg_eigval": DROP}, "missing key 'allow_neg_eigval'"),
    ({"use_gate": True}, "'use_gate' is for families 'delta_net', 'gated_deltanet', 'gla', 'retnet', "
                         "'fla_linear_attn', not 'kda'"),
])
def test_bad_config_is_one_line(tmp_path, change, message):
    d = tmp_path / "m"
    make_tiny_kda(d)
    edit_config(**change)(d)
    with pytest.raises(ModelError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_model(d)
    res = CliRunner().invoke(cli, ["model", "info", str(d)])
    assert res.exit_code == 1 and res.output.startswith("Error: ") and "config.json" in res.output
    assert message in res.output and res.output.count("\n") == 1


def test_init_options_of_the_wrong_family_are_refused(tmp_path):
    for args, hint in ((["--family", "kda", "--output-gate"], "--output-gate is for families"),
                       (["--family", "gated_deltanet", "--lower-bound", "-5"], "--lower-bound is for"),
                       (["--family", "kda", "--decay", "0.9"], "--decay"),
                       (["--family", "kda", "--lower-bound", "2"], "'lower_bound' must be a number < 0")):
        res = CliRunner().invoke(cli, ["model", "init", str(tmp_path / "m"), *args])
        assert res.exit_code != 0 and hint in res.output and not (tmp_path / "m").exists(), res.output
        assert "Traceback" not in res.output


def test_cli_train_kda(genomes, tmp_path):
    """train --family kda: the chunked form's autograd (a few steps, the bounded gate)."""
    out = tmp_path / "m"
    r = CliRunner().invoke(cli, ["train", str(genomes / "minimap2_MT-human.fa"), "--out", str(out),
                                 "--family", "kda", "--d-model", "16", "--n-layers", "1", "--n-heads", "2",
                                 "--lower-bound", "-5", "--steps", "3", "--batch", "2", "--window", "32",
                                 "--quiet"])
    assert r.exit_code == 0, r.output
    c = load_model(out).config
    assert c.family == "kda" and c.layer.lower_bound == -5.0 and c.layer.head_dim == 8


TINY = dict(d_model=16, n_layers=1, n_heads=2, mlp_hidden=32, conv_width=4, family="kda", head_dim=8,
            n_v_heads=4)


@pytest.mark.slow
def test_train_kda_loss_falls_and_resumes_exactly(genomes, tmp_path):
    """A tiny KDA model on human mitochondrial DNA: the loss falls, every gate parameter (A_log,
    dt_bias, f_proj's, g_proj's) is trained; stopped at a checkpoint (the lanes' S and windows)
    and resumed, the losses of the uninterrupted run."""
    mt = genomes / "minimap2_MT-human.fa"
    cfg = TrainConfig(steps=30, batch=4, window=32, lr=1e-2, warmup=5, checkpoint_every=15)
    full = train([mt], tmp_path / "m", TINY, cfg)
    losses = np.asarray(full.losses)
    assert np.isfinite(losses).all() and losses[:8].mean() - losses[-8:].mean() > 0.05
    trained, start = load_model(tmp_path / "m"), init_net(ModelConfig(modality="dna", **TINY), seed=0)
    after, before = trained.net.state_dict(), start.state_dict()
    for name in ("A_log", "dt_bias", "f_proj.0.weight", "f_proj.1.weight", "g_proj.1.bias", "b_proj.weight",
                 "q_conv1d.weight", "o_norm.weight"):
        moved = float((after[f"layers.0.attn.{name}"] - before[f"layers.0.attn.{name}"]).abs().max())
        assert moved > 1e-4 and math.isfinite(moved), name
    assert train([mt], tmp_path / "resumed", TINY, cfg, stop_at=15) is None
    res = train([mt], tmp_path / "resumed", TINY, cfg, resume=True)
    np.testing.assert_allclose(res.losses, full.losses, rtol=1e-6, atol=0)


def test_bounded_gate_at_its_floor_through_the_layer(tmp_path, genomes):
    """The bounded gate driven to its floor (lower_bound -8 in every channel: each block of 32
    sums past the stages' factored range, their explicit path) on a real genome: cut into
    units, the outputs of one call."""
    d = tmp_path / "floor"
    make_tiny_kda(d, lower_bound=-8.0)
    m = load_model(d)
    with torch.no_grad():
        for layer in m.net.layers:
            layer.attn.dt_bias.fill_(40.0)  # sigmoid(f + 40) = 1: g = -8 per position and channel
    from linpipe.inputs.alphabet import tokenize

    x = tokenize("".join(line.strip() for line in open(genomes / "minimap2_MT-human.fa")
                         if not line.startswith(">"))[:300])
    whole, _ = m.forward(x, m.init_state(), ["logprob"])
    state, parts = m.init_state(), []
    for a in range(0, len(x), 37):
        out, state = m.forward(x[a:a + 37], state, ["logprob"])
        parts.append(out["logprob"])
    assert np.isfinite(whole["logprob"]).all()
    np.testing.assert_allclose(np.concatenate(parts), whole["logprob"], rtol=0, atol=1e-5)


def _submit(fasta, model, out, *extra):
    return [sys.executable, "-c", "from linpipe.cli import cli; cli()", "submit", str(fasta), "--model",
            str(model), "--unit-size", str(CONTIG_UNIT), "--outputs", "logprob,entropy",
            "--out", str(out), *extra]


# Ray on loopback, a killed driver: before a merge (the store's resume is the fixed model's and
# the gated delta rule's in the suite, a family's state arrays being named arrays like theirs)
@pytest.mark.slow
@pytest.mark.premerge
def test_sigkilled_submit_resumes_bit_identical(genomes, tmp_path):
    """submit on Ray (a long record streamed with its S and windows, short ones packed) killed
    with SIGKILL after a few units, then submitted again: the same bytes as one uninterrupted run."""
    model = make_tiny_kda(tmp_path / "kda")
    fasta = tmp_path / "many.fa"
    write_contigs(genomes, fasta, 16, seed=5, long=1)
    out, clean = tmp_path / "killed.zarr", tmp_path / "clean.zarr"
    progress = submit_and_sigkill(_submit(fasta, model, out, "--workers", "1"), out, 2, wait_s=240)
    assert 2 <= progress["units_done"] < progress["units"]
    res = subprocess.run(_submit(fasta, model, out, "--workers", "1"), capture_output=True, text=True,
                         timeout=400)
    assert res.returncode == 0, res.stderr
    plan = write_in_process(fasta, model, clean, unit_size=CONTIG_UNIT, outputs=("logprob", "entropy"))
    assert plan.records and plan.packed.n_batches > 1  # streamed and packed records both ran
    assert_same_bytes(store_arrays(clean), store_arrays(out))
    assert_same_bytes(record_outputs(clean), record_outputs(out))
