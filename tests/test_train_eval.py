"""`linpipe eval`: model scores next to baselines on the same positions, for dna and time
series; time-series training stores the channel statistics; bad inputs give one-line errors."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from linpipe.cli import cli
from linpipe.model import load_model
from linpipe.training.data import read_dna_records, read_records
from linpipe.training.evaluate import evaluate_dna, markov_baselines
from linpipe.training.loop import TrainConfig, train
from linpipe.training.markov import MarkovModel


@pytest.fixture(scope="module")
def random_dna_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("rand") / "m"
    r = CliRunner().invoke(cli, ["model", "init", str(d), "--d-model", "16", "--n-layers", "1",
                                 "--n-heads", "2"])
    assert r.exit_code == 0, r.output
    return d


@pytest.fixture(scope="module")
def ts_model(tmp_path_factory, timeseries):
    out = tmp_path_factory.mktemp("ts")
    cfg = TrainConfig(steps=60, batch=4, window=64, lr=1e-2, warmup=5, checkpoint_every=60)
    res = train([timeseries / "statsmodels_mstl_elec_vic.csv"], out,
                dict(d_model=16, n_layers=1, n_heads=2, mlp_hidden=32), cfg,
                ts_options={"time_column": "ds"})
    return res


def test_eval_cli_dna_reports_baselines_on_same_positions(genomes, random_dna_model):
    mt, ce = genomes / "minimap2_MT-orang.fa", genomes / "htslib_ce.fa"
    args = ["eval", str(random_dna_model), str(mt), "--baseline-train", str(ce)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    for name in ("model", "markov-0", "markov-2"):
        assert f"  {name} " in r.output
    assert "16,499 positions" in r.output and "Markov order k chosen on training data" in r.output
    rep = json.loads(CliRunner().invoke(cli, args + ["--json"]).output)
    k = rep["markov_best_k"]
    scores = rep["inputs"][0]["scores"]
    assert set(scores) == {"model", "markov-0", "markov-2", f"markov-{k}"}
    # the baselines equal the Markov model scored directly on the file's positions
    recs = [t for _, t in read_dna_records(ce)]
    m = MarkovModel.fit([t[: len(t) - round(len(t) * 0.05)] for t in recs])
    tokens = [t for _, t in read_dna_records(mt)]
    for order in (0, 2, k):
        assert scores[f"markov-{order}"] == pytest.approx(m.bits_per_base(tokens, order), rel=1e-9)
    # an untrained model is no better than guessing: about 2 bits or worse
    assert scores["model"] > 1.95


def test_evaluate_dna_matches_model_logprob(genomes, random_dna_model):
    model = load_model(random_dna_model)
    rid, tokens = read_dna_records(genomes / "minimap2_MT-human.fa")[0]
    tokens = tokens[:3000]
    markov = markov_baselines(random_dna_model, [(rid, tokens)])
    score = evaluate_dna(model, [(rid, tokens)], markov)
    out, _ = model.forward(tokens, model.init_state(), outputs=["logprob"])
    ok = ~np.isnan(out["logprob"])
    assert score.n == ok.sum()
    assert score.bits()["model"] == pytest.approx(-out["logprob"][ok].mean() / np.log(2), rel=1e-5)


def test_timeseries_training_stores_channel_stats(ts_model, timeseries):
    cfg = load_model(ts_model.out).config
    _, recs, names = read_records(timeseries / "statsmodels_mstl_elec_vic.csv", time_column="ds")
    v = recs[0][1]
    train_part = v[: len(v) - round(len(v) * 0.05)]
    assert cfg.channel_names == tuple(names) == ("y",)
    assert cfg.mean[0] == pytest.approx(float(np.nanmean(train_part)), rel=1e-5)
    assert cfg.std[0] == pytest.approx(float(np.nanstd(train_part)), rel=1e-5)
    losses = np.asarray(ts_model.losses)
    assert losses[-10:].mean() < 0.5 * losses[:10].mean()  # MSE in normalised units falls
    assert 0 < ts_model.val["mse_normalised"] < 1.0  # better than predicting the mean


def test_eval_cli_timeseries_baselines(ts_model, timeseries):
    f = timeseries / "statsmodels_mstl_elec_vic.csv"
    r = CliRunner().invoke(cli, ["eval", str(ts_model.out), str(f), "--time-column", "ds", "--season", "24",
                                 "--json"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.output)["inputs"][0]
    (channel,) = row["channels"]
    scores = channel["scores"]
    assert channel["channel"] == "y" and channel["season"] == 24
    assert set(scores) == {"model", "last-value", "seasonal-naive", "exp-smoothing"}
    v = read_records(f, time_column="ds")[1][0][1][:, 0].astype(np.float64)
    t = np.arange(24, len(v))
    assert scores["last-value"]["mae"] == pytest.approx(np.abs(v[t] - v[t - 1]).mean(), rel=1e-9)
    seasonal_rmse = np.sqrt(((v[t] - v[t - 24]) ** 2).mean())
    assert scores["seasonal-naive"]["rmse"] == pytest.approx(seasonal_rmse, rel=1e-9)
    assert scores["model"]["n"] == channel["positions"] == len(t) and row["positions"] == len(v)
    assert scores["seasonal-naive"]["ratio"] == pytest.approx(
        np.abs(v[t] - v[t - 24]).mean() / np.abs(v[t] - v[t - 1]).mean(), rel=1e-9)
    assert row["mean_ratio"] == {k: s["ratio"] for k, s in scores.items()}  # one channel: its own
    text = CliRunner().invoke(cli, ["eval", str(ts_model.out), str(f), "--time-column", "ds"])
    assert text.exit_code == 0 and "last-value" in text.output and "seasonal-naive season" in text.output


@pytest.mark.parametrize("case", ["no-markov", "wrong-modality", "missing-file", "no-model"])
def test_eval_cli_errors(tmp_path, genomes, timeseries, random_dna_model, ts_model, case):
    mt = str(genomes / "minimap2_MT-human.fa")
    if case == "no-markov":
        args, expect = ["eval", str(random_dna_model), mt], "no markov.safetensors"
    elif case == "wrong-modality":
        args, expect = ["eval", str(ts_model.out), mt], "a dna input, but model"
    elif case == "missing-file":
        args, expect = ["eval", str(random_dna_model), str(tmp_path / "x.fa")], "x.fa: no such file"
    else:
        args, expect = ["eval", str(tmp_path / "none"), mt], "no such model directory"
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 1, r.output
    assert r.output.startswith("Error: ") and expect in r.output and isinstance(r.exception, SystemExit)
