"""Time series that tell the truth (issue 55): the anomaly score's documented rate holds on real
series, eval never lets one constant channel's NaN hide the others and scores against
seasonal-naive (MASE), and plots select channels, say their coordinates and smooth DNA."""
import numpy as np
import pytest

import linpipe
from linpipe.training.data import read_records

GOOG = "matplotlib_goog_daily.csv"  # daily prices and volume, 6 channels (tests/data/README.md)


@pytest.fixture(scope="module")
def model():
    return linpipe.load_model("default-timeseries")


def _anomaly(model, path, time_column, rows=None):
    _, recs, names = read_records(path, time_column=time_column)
    out, _ = model.forward(recs[0][1][:rows], model.init_state(), outputs=["anomaly"])
    return {n: out["anomaly"][:, c][np.isfinite(out["anomaly"][:, c])] for c, n in enumerate(names)}


@pytest.mark.slow
def test_anomaly_above_3_is_as_rare_as_three_sigma_on_real_series(model, timeseries):
    """|anomaly| > 3 at a normal's 3-sigma rate (0.27%): the score was residual / (sqrt(pi/2)
    mean |residual|), which real tails pass on 1.1-4.8% of steps (prices most: 4.5%)."""
    series = {**_anomaly(model, timeseries / GOOG, "date"),
              **_anomaly(model, timeseries / "mitdb_100_ecg.parquet", "sample", rows=20_000),
              **_anomaly(model, timeseries / "heartpy_data2_ppg.csv", "timer"),
              **_anomaly(model, timeseries / "statsmodels_mstl_elec_vic.csv", "ds"),
              **_anomaly(model, timeseries / "statsmodels_co2_weekly.csv", "date")}
    assert len(series) == 11
    rates = {n: float(np.mean(np.abs(a) > 3)) for n, a in series.items()}
    assert all(len(a) > 1000 for a in series.values())
    assert 0 < min(rates.values()) and max(rates.values()) < 0.0075, rates  # each its own tails
    pooled = np.mean(np.abs(np.concatenate(list(series.values()))) > 3)
    assert 0.001 < pooled < 0.005, pooled


def test_anomaly_carried_state_resumes_exactly_and_old_states_are_refused(model, timeseries):
    from linpipe.errors import ModelError
    from linpipe.model import ModelState

    _, recs, _ = read_records(timeseries / GOOG, time_column="date")
    x = recs[0][1]
    whole, _ = model.forward(x, model.init_state(), outputs=["anomaly"])
    first, state = model.forward(x[:517], model.init_state(), outputs=["anomaly"])
    arrays = state.to_arrays()
    rest, _ = model.forward(x[517:], ModelState.from_arrays(arrays), outputs=["anomaly"])
    np.testing.assert_allclose(np.concatenate([first["anomaly"], rest["anomaly"]]), whole["anomaly"],
                               rtol=1e-5, atol=1e-5)
    arrays["norm"] = arrays["norm"][:, :17]  # a state an earlier linpipe saved
    with pytest.raises(ModelError, match="'norm' has 17 values"):
        model.forward(x[517:], ModelState.from_arrays(arrays))


def test_eval_names_a_constant_channel_and_scores_the_others_with_mase(timeseries, tmp_path):
    """A stock file's OpenInt is 0 on every day: its MAE ratios are 0/0, which made every
    headline NaN; it is named instead, and the headline holds the other channels'."""
    import json

    from click.testing import CliRunner

    from linpipe.cli import cli

    lines = (timeseries / GOOG).read_text().splitlines()
    stock = tmp_path / "goog_openint.csv"  # the real prices with the stock files' constant column
    stock.write_text("\n".join([lines[0] + ",openint"] + [ln + ",0" for ln in lines[1:]]) + "\n")
    args = ["eval", "default", str(stock), "--time-column", "date", "--season", "5"]
    r = CliRunner().invoke(cli, args + ["--json"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.output)["inputs"][0]
    assert [s["channel"] for s in row["skipped"]] == ["openint"] and "constant" in row["skipped"][0]["why"]
    kept = [ch for ch in row["channels"] if ch["channel"] != "openint"]
    assert row["headline_channels"] == [ch["channel"] for ch in kept] and len(kept) == 6
    for k, v in row["mean_ratio"].items():
        assert np.isfinite(v) and v == pytest.approx(np.mean([ch["scores"][k]["ratio"] for ch in kept]))
        assert row["mean_mase"][k] == pytest.approx(np.mean([ch["scores"][k]["mase"] for ch in kept]))
    for ch in kept:  # MASE: the same positions' MAE over seasonal-naive's
        s = ch["scores"]
        assert s["model"]["mase"] == pytest.approx(s["model"]["mae"] / s["seasonal-naive"]["mae"])
        assert s["seasonal-naive"]["mase"] == pytest.approx(1.0)
    assert row["mean_mase"]["last-value"] < 1  # on prices a week back is worse than yesterday
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0 and "nan" not in text.output.split("openint (")[0], text.output
    assert "not in the means: openint: constant" in text.output and "mean over 6 channels" in text.output
    assert "MASE" in text.output
