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


# --- linpipe plot ------------------------------------------------------------------------------
def _png_size(path):
    import struct

    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


@pytest.fixture(scope="module")
def goog_store(timeseries, tmp_path_factory):
    from _pipeline_data import write_in_process

    out = tmp_path_factory.mktemp("goog") / "goog.zarr"
    write_in_process(timeseries / GOOG, "default", out, outputs=None, time_column="date")
    return out


def test_plot_channel_selects_panels_grouped_by_channel(goog_store, tmp_path):
    from click.testing import CliRunner

    from linpipe.cli import cli
    from linpipe.outputs.plot import MIN_PANEL_PX, plot_region

    png = tmp_path / "close.png"
    args = ["plot", str(goog_store), "--record", "matplotlib_goog_daily", "--output", "forecast,anomaly"]
    r = CliRunner().invoke(cli, args + ["--channel", "close", "--channel", "volume", "-o", str(png)])
    assert r.exit_code == 0, r.output
    assert "channels close, volume" in r.output and "x axis: time" in r.output
    info = plot_region(goog_store, "matplotlib_goog_daily", ["forecast", "anomaly"], tmp_path / "b.png",
                       channels=["close", "volume"])
    assert info["panels"] == ["forecast close", "anomaly close", "forecast volume", "anomaly volume"]
    assert _png_size(png) == (1600, info["height_px"]) == (1600, 4 * 400)
    # all six channels and three outputs: 18 panels, each channel's together, shorter panels
    every = plot_region(goog_store, "matplotlib_goog_daily", ["forecast", "residual", "anomaly"],
                        tmp_path / "all.png")
    assert every["channels"] == ["open", "high", "low", "close", "volume", "adj_close"] == (
        every["channels"][:every["channels_in_store"]])
    assert len(every["panels"]) == 18 and every["panels"][3:6] == ["forecast high", "residual high",
                                                                   "anomaly high"]
    assert _png_size(tmp_path / "all.png")[1] == 18 * MIN_PANEL_PX < 18 * 400
    bad = CliRunner().invoke(cli, args + ["--channel", "OpenInt", "-o", str(tmp_path / "x.png")])
    assert bad.exit_code == 1 and len(bad.output.strip().splitlines()) == 1, bad.output
    assert "no channel 'OpenInt'" in bad.output and "matplotlib_goog_daily" in bad.output
    assert "open, high, low, close, volume, adj_close" in bad.output


def test_genome_place_from_a_region_id():
    from linpipe.outputs.plot import genome_place

    assert genome_place("chr1:122835700-122907400", 71_700) == ("chr1", 122_835_700)  # bedtools, 0-based
    assert genome_place("chr1:122835700-122907400", 71_701) == ("chr1", 122_835_699)  # samtools, 1-based
    assert genome_place("chr1:122,835,700-122,907,400", 71_700) == ("chr1", 122_835_700)
    assert genome_place("chr1:122835700-122907400", 5_000) is None  # not the record's own span
    assert genome_place("MT_human", 16_569) is None


def test_plot_dna_in_genome_coordinates_with_a_rolling_mean(genomes, tmp_path):
    """A record cut as `bedtools getfasta` names it is drawn on the genome's axis, its per-base
    log-probabilities under a 50-base rolling mean (the default; --smooth 0 turns it off)."""
    import gzip

    import pandas as pd
    from _pipeline_data import write_in_process
    from click.testing import CliRunner

    from linpipe.cli import cli
    from linpipe.outputs.plot import rolling_mean
    from linpipe.store.reader import open_output

    with gzip.open(genomes / "korflab_hg19_chr1_first3Mb.fa.gz", "rt") as f:
        seq = "".join(line.strip() for line in f if not line.startswith(">"))
    fa = tmp_path / "region.fa"
    fa.write_text(">chr1:1000000-1005000\n" + seq[1_000_000:1_005_000] + "\n")
    out = tmp_path / "region.zarr"
    write_in_process(fa, "default", out)
    png = tmp_path / "lp.png"
    r = CliRunner().invoke(cli, ["plot", str(out), "--record", "chr1:1000000-1005000", "--output", "logprob",
                                 "--region", "1000-3000", "-o", str(png)])
    assert r.exit_code == 0, r.output
    assert "chr1:1,001,000-1,003,000" in r.output and "mean over 50" in r.output
    assert "genome coordinates, 0-based" in r.output
    r = CliRunner().invoke(cli, ["plot", str(out), "--record", "chr1:1000000-1005000", "--output", "logprob",
                                 "--smooth", "0", "-o", str(png)])
    assert r.exit_code == 0 and "mean over" not in r.output, r.output
    lp = np.asarray(open_output(out).dataset("chr1:1000000-1005000")["logprob"].values, dtype=np.float64)
    lp[10:20] = np.nan  # a window with gaps averages what it has
    want = pd.Series(lp).rolling(50, center=True, min_periods=1).mean().to_numpy()
    np.testing.assert_allclose(rolling_mean(lp, 50), want, rtol=1e-9)
    assert rolling_mean(lp, 50).std() < 0.5 * np.nanstd(lp)  # what the smoothing is for


def test_a_series_job_id_holds_what_the_code_computes_beyond_the_weights(timeseries, monkeypatch):
    """A store whose anomaly was computed otherwise (an earlier linpipe) is another job: never
    resumed or repaired by this code, only replaced with --overwrite."""
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest
    from linpipe.model import series

    req = JobRequest(inputs=(str(timeseries / "statsmodels_sunspots_yearly.csv"),), time_column="YEAR")
    now = plan_job(req).job_id
    assert plan_job(req).job_id == now
    monkeypatch.setattr(series, "VERSION", series.VERSION - 1)
    assert plan_job(req).job_id != now
