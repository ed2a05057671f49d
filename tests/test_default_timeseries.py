"""The shipped default-timeseries model (issue 17): found by name and by the input's modality,
causal, unit-size invariant, per-channel (any scale), NaN runs, and better than last-value
on a held-out real PPG; its eval figures are computed from the model's own forecasts."""
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import linpipe
from linpipe.cli import cli
from linpipe.model import SHIPPED_MODELS
from linpipe.training.data import read_records
from linpipe.training.evaluate import evaluate_timeseries, last_observed

SHIPPED = SHIPPED_MODELS / "default-timeseries"
DOC = Path(__file__).resolve().parents[1] / "docs" / "default-model.md"
HELD_OUT = "heartpy_data2_ppg.csv"  # a PPG recording (another device and rate) never trained on


@pytest.fixture(scope="module")
def model():
    return linpipe.load_model("default-timeseries")


@pytest.fixture(scope="module")
def ecg(timeseries):
    _, recs, names = read_records(timeseries / "mitdb_100_ecg.parquet", time_column="sample")
    assert names == ["MLII_mV", "V5_mV"]
    return recs[0][1][:3000].astype(np.float64)


def test_shipped_files_small_sha256_recorded_and_held_out_unseen(model):
    record = json.loads((SHIPPED / "training.json").read_text())
    digest = hashlib.sha256((SHIPPED / "model.safetensors").read_bytes()).hexdigest()
    assert model.sha256 == digest == record["sha256"]
    assert digest in DOC.read_text()  # the docs describe these exact weights
    sizes = {f.name: f.stat().st_size for f in SHIPPED.iterdir()}
    assert "checkpoint" not in sizes and max(sizes.values()) < 2 << 20 and sum(sizes.values()) < 4 << 20
    assert model.modality == "timeseries" and model.config.series_norm
    assert record["command"].startswith("linpipe train ") and "--series-norm" in record["command"]
    assert HELD_OUT not in {Path(i["path"]).name for i in record["inputs"]}


def test_default_model_follows_the_input_modality(timeseries, genomes):
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    series = plan_job(JobRequest(inputs=(str(timeseries / HELD_OUT),), time_column="timer"))
    assert Path(series.model_ref).name == "default-timeseries"
    assert "anomaly" in series.outputs and series.channels == ("hr",)
    dna = plan_job(JobRequest(inputs=(str(genomes / "minimap2_MT-human.fa"),)))
    assert dna.model_ref == "default" and dna.modality == "dna"
    # `linpipe eval default SERIES` scores the time-series model
    r = CliRunner().invoke(cli, ["eval", "default", str(timeseries / "statsmodels_sunspots_yearly.csv"),
                                 "--time-column", "YEAR", "--json"])
    assert r.exit_code == 0, r.output
    assert Path(json.loads(r.output)["model"]).name == "default-timeseries"


def test_outputs_at_step_i_ignore_every_later_value(model, ecg):
    i = 1500
    out, _ = model.forward(ecg, model.init_state())
    changed = ecg.copy()
    changed[i + 1:] = changed[i + 1:][::-1] * 50 + 7  # a different future, other scale and level
    changed[i + 200:i + 300, 0] = np.nan
    out2, _ = model.forward(changed, model.init_state())
    np.testing.assert_array_equal(out2["forecast"][:i + 2], out["forecast"][:i + 2])  # x_{i+1} from x_<=i
    for k in ("residual", "anomaly"):
        np.testing.assert_array_equal(out2[k][:i + 1], out[k][:i + 1])
    assert not np.allclose(out2["forecast"][i + 2:i + 50], out["forecast"][i + 2:i + 50])


def test_unit_size_never_changes_outputs(model, ecg):
    # pieces of 1-2 rows, cuts on and off the EMA sub-blocks (128) and the forward blocks (2048)
    cuts = [1, 2, 3, 127, 129, 700, 2048, 2049, 2999]
    x = ecg.copy()
    x[1000:1300, 1] = np.nan
    whole, final = model.forward(x, model.init_state())
    state, parts = model.init_state(), []
    for a, b in zip([0] + cuts, cuts + [len(x)], strict=True):
        o, state = model.forward(x[a:b], state)
        parts.append(o)
    # float32 outputs: the forecast to its rounding, residual and anomaly (differences of nearly
    # equal numbers) to the same absolute error in their own units
    atol = {"forecast": 1e-6, "residual": 1e-5 * np.nanmax(np.abs(x)), "anomaly": 1e-4}
    for k in whole:
        np.testing.assert_allclose(np.concatenate([p[k] for p in parts]), whole[k], rtol=1e-5, atol=atol[k])
    for k, v in final.to_arrays().items():  # sums over thousands of steps: to their magnitude
        np.testing.assert_allclose(state.to_arrays()[k], v, rtol=1e-5, atol=1e-5 * np.abs(v).max())
    # the state survives its stored form (safetensors arrays) and the packed path agrees
    from linpipe.model import ModelState

    o, _ = model.forward(x[2222:], ModelState.from_arrays(
        model.forward(x[:2222], model.init_state())[1].to_arrays()))
    np.testing.assert_allclose(o["forecast"], whole["forecast"][2222:], rtol=1e-5, atol=1e-6)
    packed = model.forward_records([x[:2500]])[0]
    np.testing.assert_allclose(packed["anomaly"], whole["anomaly"][:2500], rtol=1e-5, atol=1e-4)


def test_nan_runs_forecast_continues_residual_nan(model, ecg):
    x = ecg.copy()
    gaps = [(500, 501), (1000, 1400), (2990, 3000)]  # one row, a long run, the end
    for a, b in gaps:
        x[a:b, 0] = np.nan
    out, _ = model.forward(x, model.init_state())
    gap = np.isnan(x[:, 0])
    assert np.isfinite(out["forecast"][1:, 0]).all()  # through every gap and after it
    assert np.isnan(out["forecast"][0]).all()  # nothing observed before the first row
    assert np.array_equal(np.isnan(out["residual"][1:, 0]), gap[1:])
    assert np.isnan(out["anomaly"][gap, 0]).all()
    assert np.isfinite(out["anomaly"][100:, 0][~gap[100:]]).all()
    # the channel without gaps is untouched by the other's (channels are independent lanes)
    clean, _ = model.forward(ecg, model.init_state())
    np.testing.assert_array_equal(out["forecast"][:, 1], clean["forecast"][:, 1])
    # after the long gap the forecast is back to tracking the signal within a few beats
    after = slice(1400 + 300, 2900)
    mae_after = np.nanmean(np.abs(out["residual"][after, 0]))
    assert mae_after < 1.2 * np.nanmean(np.abs(clean["residual"][after, 0]))


def test_channels_of_any_scale_are_independent_lanes(model, ecg, timeseries):
    _, recs, _ = read_records(timeseries / HELD_OUT, time_column="timer")
    ppg = recs[0][1][:3000, 0].astype(np.float64)
    x = np.stack([ecg[:, 0], ppg[:len(ecg)] * 1e6], 1)  # mV next to a raw ADC count scaled up
    both, _ = model.forward(x, model.init_state())
    for c in range(2):
        alone, _ = model.forward(x[:, c:c + 1], model.init_state())
        np.testing.assert_allclose(both["forecast"][:, c], alone["forecast"][:, 0], rtol=1e-6)
    # scale equivariance: the same series in other units gives the same forecast in those units
    small, _ = model.forward(x[:, 1:] * 1e-9, model.init_state())
    np.testing.assert_allclose(small["forecast"][1:, 0] * 1e9, both["forecast"][1:, 1], rtol=1e-4)
    np.testing.assert_allclose(small["anomaly"][:, 0], both["anomaly"][:, 1], rtol=1e-3, atol=1e-4)


@pytest.mark.slow  # the shipped model over the whole held-out file, and its baselines
def test_beats_last_value_on_held_out_ppg_and_figures_come_from_forecasts(model, timeseries):
    _, recs, _ = read_records(timeseries / HELD_OUT, time_column="timer")  # the whole held-out file
    scores = evaluate_timeseries(model, recs, season=100)["channels"][0]["scores"]
    v = recs[0][1].astype(np.float64)
    fc, _ = model.forward(recs[0][1], model.init_state(), outputs=["forecast"])
    ok = (np.arange(len(v))[:, None] >= 100) & ~np.isnan(fc["forecast"]) & ~np.isnan(last_observed(v))
    model_mae = np.abs(fc["forecast"].astype(np.float64) - v)[ok].mean()
    last_mae = np.abs(last_observed(v) - v)[ok].mean()
    assert scores["model"]["mae"] == pytest.approx(model_mae, rel=1e-6)
    assert scores["last-value"]["mae"] == pytest.approx(last_mae, rel=1e-9)
    assert scores["model"]["ratio"] == pytest.approx(model_mae / last_mae, rel=1e-6)
    assert scores["model"]["ratio"] <= 0.95  # the target, on a series never trained on
    # long context pays on this unseen recording: the state carried from row 0 beats the state
    # reset every 1,000 rows, and beats resetting only the network's memory
    full = evaluate_timeseries(model, recs, season=100, reset_every=1000)["channels"][0]["scores"]
    mae = {k: full[k]["mae"] for k in ("model", "model-reset-1000-network-only", "model-reset-1000")}
    assert len({full[k]["n"] for k in mae}) == 1
    assert mae["model"] < mae["model-reset-1000-network-only"] < mae["model-reset-1000"]
    # the reset is real: a state started at row 7,000 forecasts as the reset run does there
    reset, _ = model.forward(recs[0][1][7000:8500], model.init_state(), outputs=["forecast"])
    from linpipe.training.evaluate import model_forecast

    resets = model_forecast(model, recs[0][1], reset_every=1000)
    np.testing.assert_allclose(resets[7000:8000], reset["forecast"][:1000], rtol=1e-6)
    assert not np.allclose(reset["forecast"][1:50], fc["forecast"][7001:7050])


def test_calibration_falls_to_last_value_where_the_network_is_noise():
    """The online calibration w of the network's change: near 0 where its changes are noise
    next to what came (a random walk), near 1 where they foretell it."""
    import torch

    from linpipe.model import series

    rng = np.random.default_rng(3)
    a = torch.from_numpy(rng.standard_t(4, size=(1, 20000)))  # the changes that came
    noise = torch.from_numpy(rng.normal(scale=0.3, size=(1, 20000)))
    norm = series.zero_norm(1)
    w_noise, _ = series.calibrate(noise, a, norm, norm)
    w_good, _ = series.calibrate(a + noise, a, norm, norm)
    assert w_noise[0, 0] == w_good[0, 0] == 0  # nothing seen yet: the prior, last-value
    assert w_noise[0, 5000:].mean() < 0.1 and w_good[0, 5000:].min() > 0.8


def test_at_least_matches_last_value_on_random_walks(model):
    # seeded walks of the shapes a price takes; none is in the training data (seed 0 is)
    rng = np.random.default_rng(7)
    steps = {"gauss": rng.normal(size=20000), "t3": rng.standard_t(3, size=20000)}
    for name, d in steps.items():
        v = np.cumsum(d).astype(np.float32)[:, None]  # float32, as the readers hand values over
        fc, _ = model.forward(v, model.init_state(), outputs=["forecast"])
        f, v, lv = fc["forecast"].astype(np.float64), v.astype(np.float64), last_observed(v)
        ok = ~np.isnan(f) & ~np.isnan(lv)
        ratio = np.abs(f - v)[ok].mean() / np.abs(lv - v)[ok].mean()
        # the calibration finds no evidence for the network's changes: last-value, all but exactly
        assert (f[ok] == lv[ok]).mean() > 0.99 and ratio <= 1 + 1e-5, (name, ratio)


def test_csv_with_a_text_value_names_column_and_row(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("t,value\n" + "".join(f"{i},{'n/a?' if i == 150 else i * 0.5}\n" for i in range(300)))
    r = CliRunner().invoke(cli, ["submit", str(bad), "--time-column", "t", "--dry-run"])
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and isinstance(r.exception, SystemExit)
    assert "'value'" in lines[0] and "row 151" in lines[0] and "'n/a?'" in lines[0]


def test_job_without_model_then_parquet_with_time_and_a_forecast_anomaly_plot(timeseries, tmp_path):
    """The job `linpipe submit elec.csv --time-column ds` plans, run here by the worker class
    itself (no Ray start-up: the Ray path is tested elsewhere), then export and plot."""
    import pyarrow.parquet as pq
    from _pipeline_data import write_in_process

    from linpipe.outputs.plot import plot_region

    csv = timeseries / "statsmodels_mstl_elec_vic.csv"  # columns ds (datetime), y
    out = tmp_path / "elec.zarr"
    plan = write_in_process(csv, "default", out, unit_size=1000, outputs=None, time_column="ds")
    assert Path(plan.model_ref).name == "default-timeseries"
    assert plan.outputs == ("forecast", "residual", "anomaly")
    assert [r.n_units for r in plan.streams] == [4]  # the state carried between 4 chunks
    table = tmp_path / "elec.parquet"
    r = CliRunner().invoke(cli, ["export", str(out), "--format", "parquet", "--output",
                                 "forecast,residual,anomaly", "-o", str(table)])
    assert r.exit_code == 0, r.output
    t = pq.read_table(table).to_pandas()
    src = read_records(csv, time_column="ds")[1][0][1][:, 0]
    assert list(t.columns) == ["record", "time", "forecast_y", "residual_y", "anomaly_y"]
    import pandas as pd

    np.testing.assert_array_equal(t["time"].to_numpy(), pd.to_datetime(pd.read_csv(csv)["ds"]).to_numpy())
    # the stored outputs equal one pass of the model
    m = linpipe.load_model("default-timeseries")
    whole, _ = m.forward(src[:, None], m.init_state())
    np.testing.assert_allclose(t["forecast_y"], whole["forecast"][:, 0], rtol=1e-5)
    np.testing.assert_allclose(t["anomaly_y"], whole["anomaly"][:, 0], rtol=1e-5, atol=1e-4)
    png = tmp_path / "elec.png"
    r = CliRunner().invoke(cli, ["plot", str(out), "--record", "statsmodels_mstl_elec_vic", "--output",
                                 "forecast,anomaly", "--region", "0-800", "-o", str(png)])
    assert r.exit_code == 0, r.output
    info = plot_region(out, "statsmodels_mstl_elec_vic", ["forecast", "anomaly"], tmp_path / "b.png",
                       region="0-800")
    assert info["input_drawn"] and info["panels"] == ["forecast y", "anomaly y"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_train_series_norm_on_files_of_different_columns_resumes_exactly(timeseries, tmp_path):
    from linpipe.training.loop import TrainConfig, train

    inputs = [timeseries / "statsmodels_sunspots_yearly.csv", timeseries / "statsmodels_co2_weekly.csv"]
    kw = dict(d_model=8, n_layers=1, n_heads=2, mlp_hidden=16, series_norm=True)
    cfg = TrainConfig(steps=12, batch=2, window=64, warmup=2, checkpoint_every=100)
    opts = {"time_column": "YEAR,date"}  # each file its own time column
    full = train(inputs, tmp_path / "full", kw, cfg, ts_options=opts)
    assert train(inputs, tmp_path / "part", kw, cfg, ts_options=opts, stop_at=5) is None
    resumed = train(inputs, tmp_path / "part", kw, cfg, ts_options=opts, resume=True)
    assert resumed.sha256 == full.sha256  # lanes' running normalisation restored with the rest
    config = linpipe.load_model(full.out).config
    assert config.series_norm and config.channels == 1
    ratios = full.val["mae_ratio_per_record"]
    assert set(ratios) == {"statsmodels_sunspots_yearly.csv:statsmodels_sunspots_yearly:SUNACTIVITY",
                           "statsmodels_co2_weekly.csv:statsmodels_co2_weekly:co2"}
    assert all(np.isfinite(v) and v > 0 for v in ratios.values())
