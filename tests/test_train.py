"""`linpipe train` on a real genome: the loss falls, resuming continues exactly, the model
directory holds a loadable model, a report and no pickles; bad inputs give one-line errors."""
import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from linpipe.cli import cli
from linpipe.errors import LinpipeError
from linpipe.model import load_model
from linpipe.training.data import LaneWalker
from linpipe.training.loop import TrainConfig, train

TINY = dict(d_model=16, n_layers=1, n_heads=2, mlp_hidden=32, conv_width=4)
CFG = TrainConfig(steps=200, batch=4, window=64, lr=1e-2, warmup=10, checkpoint_every=100)


@pytest.fixture(scope="module")
def mt(genomes):
    return genomes / "minimap2_MT-human.fa"


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, mt):
    out = tmp_path_factory.mktemp("full")
    steps = []
    res = train([mt], out, TINY, CFG, progress=steps.append)
    res.progress = steps
    return res


@pytest.mark.slow  # 200 steps of training (full_run)
def test_loss_falls_over_200_steps(full_run):
    losses = np.asarray(full_run.losses)
    assert len(losses) == 200 and np.isfinite(losses).all()
    first, last = losses[:20].mean(), losses[-20:].mean()
    # from a random model (> 2 bits) to below the 2 bits of guessing uniformly
    assert first > 2.0 and last < 1.99 and first - last > 0.1, (first, last)


def test_progress_reports_every_step_with_the_running_loss(full_run):
    steps = full_run.progress
    assert [s.step for s in steps] == list(range(1, 201))
    assert {(s.start, s.total) for s in steps} == {(0, 200)}
    # the time since the first step began: the steps' rate, from the first step on
    seconds = [s.seconds for s in steps]
    assert 0 < seconds[0] and all(a < b for a, b in zip(seconds, seconds[1:], strict=False))
    # the running loss is the mean of the last 50 steps' losses
    assert steps[-1].loss == pytest.approx(np.mean(full_run.losses[-50:]), rel=1e-6)
    assert steps[9].loss == pytest.approx(np.mean(full_run.losses[:10]), rel=1e-6)


@pytest.mark.slow  # 200 steps of training (full_run)
def test_resume_continues_from_the_same_loss(tmp_path, mt, full_run):
    assert train([mt], tmp_path, TINY, CFG, stop_at=120) is None
    saved = json.loads((tmp_path / "checkpoint" / "trainer.json").read_text())
    assert saved["step"] == 120
    res = train([mt], tmp_path, TINY, CFG, resume=True)
    # the resumed run reproduces the uninterrupted one step for step (same lanes, state, Adam)
    np.testing.assert_allclose(res.losses, full_run.losses, rtol=1e-4, atol=1e-5)
    assert res.sha256 == load_model(tmp_path).sha256


def test_model_dir_contents(full_run):
    out = full_run.out
    assert (out / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "training_report.md").read_text()
    assert "bits per base" in report and "markov-" in report
    rec = json.loads((out / "training.json").read_text())
    assert rec["sha256"] == load_model(out).sha256 == full_run.sha256
    val = rec["validation"]["bits_per_base"]
    assert set(val) >= {"model", "markov-0", "markov-2"} and all(0 < v < 3 for v in val.values())
    # the last 5% of the 16,569 bp record is validation
    assert rec["validation"]["positions"] == round(16569 * 0.05)
    assert not [p for p in out.rglob("*") if p.suffix in (".pt", ".pth", ".pkl", ".bin", ".ckpt")]


def test_lanes_walk_records_in_order_and_reset_at_starts():
    parts = [np.arange(10), np.arange(100, 107)]
    w = LaneWalker(parts, batch=2, window=4)
    seen = [[], []]
    resets = []
    for _ in range(5):
        x, m, r = w.next_batch()
        resets.append(r.tolist())
        for b in range(2):
            seen[b] += x[b][m[b]].tolist()
    # lane 0 holds positions 0..7 of the first part; lane 1 the rest of it, then the second part
    assert seen[0][:8] == list(range(8)) and seen[0][8:12] == [0, 1, 2, 3]
    assert seen[1][:9] == [8, 9] + list(range(100, 107))
    assert resets[0] == [True, True] and resets[1] == [False, True]  # lane 1 enters part 2


def _rate(line: str) -> float:
    """The steps per second a progress line says ("12/12 steps (100.0%), 9.94/s, ...")."""
    import re

    number, unit = re.search(r", ([\d.]+)([kMG]?)/s", line).groups()
    return float(number) * {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}[unit]


def test_cli_train_and_progress(tmp_path, mt, monkeypatch):
    import shlex
    import sys

    out = tmp_path / "m"
    args = ["train", str(mt), "--out", str(out), "--d-model", "16", "--n-layers", "1",
            "--n-heads", "2", "--steps", "12", "--batch", "2", "--window", "32"]
    monkeypatch.setattr(sys, "argv", ["/usr/bin/linpipe", *args])  # what a user's shell gives
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert "validation bits per base: model" in r.output and "markov-2" in r.output
    # the progress bar (log lines off a terminal, as in a log file: no carriage return) ends at the
    # last step with the running loss
    assert "\r" not in r.output
    lines = [line for line in r.output.splitlines() if line.startswith("progress: ")]
    first, last = lines[0], lines[-1]
    assert last.startswith("progress: 12/12 steps (100.0%)") and ", loss " in last
    # the first line (step 1, logged at once) says the rate of that step, not of the moment
    # between the step's end and the bar's start (thousands of steps a second)
    assert first.startswith("progress: 1/12 steps (8.3%)")
    assert 0 < _rate(first) < 10 * _rate(last), (first, last)
    quiet = CliRunner().invoke(cli, ["train", str(mt), "--out", str(tmp_path / "q"), "--d-model", "16",
                                     "--n-layers", "1", "--n-heads", "2", "--steps", "2", "--batch", "2",
                                     "--window", "32", "--quiet"])
    assert quiet.exit_code == 0 and "progress: " not in quiet.output
    rec = json.loads((out / "training.json").read_text())
    assert rec["command"] == "linpipe " + shlex.join(args)  # recorded as typed, to be run again
    assert load_model(out).config.d_model == 16


@pytest.mark.parametrize("case", ["missing", "mixed", "badchar", "resume-none", "resume-other", "val-records",
                                  "device"])
def test_cli_train_bad_inputs(tmp_path, mt, genomes, timeseries, case):
    out = tmp_path / "m"
    args = ["train", str(mt), "--out", str(out), "--d-model", "12", "--n-layers", "1", "--n-heads", "1",
            "--steps", "2", "--batch", "1", "--window", "16", "--quiet"]
    if case == "missing":
        args[1] = str(tmp_path / "nope.fa")
        expect = "nope.fa: no such file"
    elif case == "mixed":
        args.insert(2, str(timeseries / "statsmodels_sunspots_yearly.csv"))
        expect = "mix dna and timeseries"
    elif case == "badchar":
        bad = tmp_path / "bad.fa"
        bad.write_text(">r1\nACGT\n>r2\nACGJT\n")
        args[1] = str(bad)
        expect = "record 'r2'"
    elif case == "resume-none":
        args.append("--resume")
        expect = "no checkpoint to resume from"
    elif case == "resume-other":
        assert CliRunner().invoke(cli, args).exit_code == 0
        args[1] = str(genomes / "minimap2_MT-orang.fa")
        args[args.index("--steps") + 1] = "4"
        args.append("--resume")
        expect = "different inputs"
    elif case == "val-records":
        args += ["--val-records", "chrZ"]
        expect = "--val-records chrZ: no such record"
    else:
        args += ["--device", "nosuchdevice"]
        expect = "--device nosuchdevice: not usable here"
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 1, r.output
    assert r.output.startswith("Error: ") and expect in r.output and isinstance(r.exception, SystemExit)
    assert len(r.output.strip().splitlines()) == 1


def test_windows_of_only_n_score_nothing(tmp_path, mt):
    seq = "".join(line.strip() for line in mt.read_text().splitlines()[1:])
    fa = tmp_path / "gap.fa"
    fa.write_text(">gapped\n" + seq[:2000] + "N" * 1000 + seq[2000:4000] + "\n")
    res = train([fa], tmp_path / "m", TINY, TrainConfig(steps=40, batch=1, window=100, checkpoint_every=40))
    losses = np.asarray(res.losses)
    # windows 20..29 hold only N: nothing to score, recorded as NaN; the rest are finite
    assert np.isnan(losses[20:30]).all() and np.isfinite(np.delete(losses, range(20, 30))).all()
    assert np.isfinite(res.val["bits_per_base"]["model"])


@pytest.mark.parametrize("context", [0, 1024])
def test_training_carries_the_state_exactly(tmp_path, mt, context):
    """The lanes' state after 10 windows is the state of one forward over the positions the
    lane read since its last reset: the whole walk, or (context 1024) the last two windows."""
    import torch
    from safetensors.torch import load_file

    from linpipe.training.data import read_dna_records

    # lr so small that Adam's steps (about lr each) leave every weight as it was
    cfg = TrainConfig(steps=100, batch=2, window=256, lr=1e-30, warmup=1, context=context)
    assert train([mt], tmp_path, TINY, cfg, stop_at=10) is None
    model = load_model(tmp_path / "checkpoint")
    lanes = load_file(str(tmp_path / "checkpoint" / "lanes.safetensors"))
    (_, tokens), = read_dna_records(mt)
    stretch = (len(tokens) - round(len(tokens) * 0.05)) // 2  # the training part over two lanes
    for lane, start in enumerate((0, stretch)):
        read_from = start + (2048 if context else 0)  # 10 windows, reset before the 5th and 9th
        _, state = model.forward(tokens[read_from:start + 2560], model.init_state())
        for key, t in state.tensors().items():
            torch.testing.assert_close(lanes[key][lane], t[0], rtol=1e-4, atol=1e-5)
    rec = json.loads((tmp_path / "checkpoint" / "trainer.json").read_text())
    carried = 512 if context else 2560
    assert rec["cursor"] == [[0, 2560, carried], [0, stretch + 2560, carried]]


@pytest.mark.slow  # 120 steps over a 2.5 Mb genome
def test_long_context_training_on_a_genome(tmp_path, genomes):
    """On the S. epidermidis contigs, lanes carry their state over tens of kb: the report says
    how much context a scored position saw, and the loss falls; --context bounds it."""
    fa = genomes / "abricate_Sepidermidis_ST14_assembly.fa"
    cfg = TrainConfig(steps=120, batch=1, window=256, lr=1e-2, warmup=10, checkpoint_every=120)
    res = train([fa], tmp_path / "long", TINY, cfg)
    losses = np.asarray(res.losses)
    assert losses[:15].mean() - losses[-15:].mean() > 0.05 and losses[-15:].mean() < 1.99
    rec = json.loads((tmp_path / "long" / "training.json").read_text())
    # the lane walks the 190 kb training part of the first contig: 120 windows of 256, no reset
    assert rec["context_mean"] == pytest.approx(119 * 256 / 2 + 255 / 2)
    assert "positions of context on average" in (tmp_path / "long" / "training_report.md").read_text()
    train([fa], tmp_path / "bounded", TINY, replace(cfg, steps=8, context=512))
    ctx = json.loads((tmp_path / "bounded" / "training.json").read_text())["context_mean"]
    assert ctx == pytest.approx(256 / 2 + 255 / 2)  # windows start with 0, 256, 0, 256, ... carried


def test_resume_keeps_the_context_count(tmp_path, mt):
    cfg = TrainConfig(steps=30, batch=2, window=64, lr=1e-2, warmup=5, checkpoint_every=30, context=256)
    whole = train([mt], tmp_path / "whole", TINY, cfg)
    assert train([mt], tmp_path / "cut", TINY, cfg, stop_at=13) is None  # mid-way between resets
    res = train([mt], tmp_path / "cut", TINY, cfg, resume=True)
    np.testing.assert_allclose(res.losses, whole.losses, rtol=1e-4, atol=1e-5)
    with pytest.raises(LinpipeError, match="context"):
        train([mt], tmp_path / "cut", TINY, replace(cfg, steps=40, context=0), resume=True)
