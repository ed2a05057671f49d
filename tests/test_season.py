"""The season a series_norm model carries (linpipe.model.season, issue 56): on hourly
temperatures it was never trained on, the shipped default-timeseries beats seasonal-naive,
where the same weights without the season (default-timeseries-v1) lose to it 2-5x; the
season is found in the carried state; the config key and the job id follow it."""
import json

import numpy as np
import pytest

import linpipe
from linpipe.errors import ModelError
from linpipe.model import ModelConfig, ModelState, season, series
from linpipe.training.data import read_records
from linpipe.training.evaluate import evaluate_timeseries

TEMPS = ("vega_seattle_temps_2010.csv.gz", "vega_sf_temps_2010.csv.gz")  # held out: never trained on


@pytest.fixture(scope="module")
def models():
    return linpipe.load_model("default-timeseries"), linpipe.load_model("default-timeseries-v1")


@pytest.mark.parametrize("name", TEMPS)
def test_beats_seasonal_naive_on_held_out_hourly_temperatures(models, timeseries, name):
    new, old = models
    assert new.sha256 == old.sha256  # the same weights: the season is what changed
    _, recs, _ = read_records(timeseries / name, time_column="date")
    assert len(recs[0][1]) == 8759  # 2010 hour by hour in local time (no 2010-03-14 03:00)
    got = {}
    for key, m in (("new", new), ("old", old)):
        ch = evaluate_timeseries(m, recs)["channels"][0]
        assert ch["season"] == 24  # seasonal-naive's own season: the day
        got[key] = ch["scores"]["model"]
    assert got["new"]["mase"] < 1 < got["old"]["mase"], got
    assert got["new"]["ratio"] < 0.5 * got["old"]["ratio"]  # and far below last-value


def test_the_carried_state_finds_the_day(models, timeseries):
    new, _ = models
    _, recs, _ = read_records(timeseries / TEMPS[0], time_column="date")
    _, state = new.forward(recs[0][1][:3000], new.init_state(), outputs=["forecast"])
    lags = new.config.season_lags
    _, ns, ds = season._slots(lags)
    mean = (state.norm[0, ns] / state.norm[0, ds]).numpy()  # each lag's running error, in units of s
    assert int(np.argmin(mean)) + 1 in (24, 48)  # the lag of least error is a whole day (or two)
    assert float(state.norm[0, season.MIX_P]) > 0  # the mix has found evidence for it


def test_season_lags_in_config_and_states_and_job_ids(models, timeseries, tmp_path):
    new, old = models
    d = new.config.to_json()
    assert d["season_lags"] == 400 and "season_lags" not in old.config.to_json()
    assert ModelConfig.from_json(json.loads(json.dumps(d))).season_lags == 400
    with pytest.raises(ModelError, match="season_lags"):
        old.config.replace(season_lags=-1)
    with pytest.raises(ModelError, match="season_lags"):
        ModelConfig(modality="dna", d_model=8, n_layers=1, n_heads=1, mlp_hidden=8, season_lags=24)
    assert new.init_state().norm.shape[-1] == series.norm_size(400) > old.init_state().norm.shape[-1]
    # a state carried without the season is refused by name, not misread
    x = np.linspace(0, 20, 300)[:, None]
    _, state = old.forward(x, old.init_state())
    with pytest.raises(ModelError, match=f"'norm' has {series.NORM_SIZE} values"):
        new.forward(x, ModelState.from_arrays(state.to_arrays()))
    # the same weights with and without the season are two jobs: neither resumes the other's store
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    ids = {plan_job(JobRequest(inputs=(str(timeseries / TEMPS[1]),), time_column="date", model=m)).job_id
           for m in ("default-timeseries", "default-timeseries-v1")}
    assert len(ids) == 2


def test_train_takes_season_lags_from_the_command_line(timeseries, tmp_path):
    """`linpipe train --series-norm --season-lags N` writes a model that carries the season; the
    option without --series-norm is one line naming the key."""
    from click.testing import CliRunner

    from linpipe.cli import cli

    src = timeseries / "statsmodels_sunspots_yearly.csv"
    common = [str(src), "--time-column", "YEAR", "--d-model", "8", "--n-layers", "1", "--n-heads", "2",
              "--steps", "2", "--batch", "2", "--window", "32", "--quiet"]
    out = tmp_path / "m"
    res = CliRunner().invoke(cli, ["train", *common, "--out", str(out), "--series-norm",
                                   "--season-lags", "12"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "config.json").read_text())["season_lags"] == 12
    assert linpipe.load_model(str(out)).config.season_lags == 12
    res = CliRunner().invoke(cli, ["train", *common, "--out", str(tmp_path / "n"), "--season-lags", "12"])
    assert res.exit_code != 0 and "season_lags" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1
