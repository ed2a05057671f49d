"""`linpipe submit` as a user runs it, on real data: a time series with an id and a time column,
a driver killed with SIGKILL and resumed, actor resources from a job spec, and a full disk.

Each test starts its own embedded Ray (through the CLI or a subprocess), as a user's submit does.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner

from _pipeline_data import assert_same_bytes, make_tiny_model, store_arrays, write_fasta_slice
from linpipe.cli import cli

TS_CHUNK = 512


# ----------------------------------------------------------------------------- time series
@pytest.fixture(scope="module")
def elec_two_sites(timeseries, tmp_path_factory):
    """The first 3,000 hours of the real Victorian electricity demand, split into two series
    (1,800 and 1,200 rows) under an id column, so --id-column and --time-column both apply."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    table = pcsv.read_csv(timeseries / "statsmodels_mstl_elec_vic.csv").slice(0, 3000)
    table = table.add_column(0, "site", pa.array(["vic_a"] * 1800 + ["vic_b"] * 1200))
    path = tmp_path_factory.mktemp("ts") / "elec.csv"
    pcsv.write_csv(table, path)
    return path, table


def test_timeseries_submit_matches_the_bare_model_and_opens_in_xarray(elec_two_sites, tmp_path):
    import xarray as xr

    import linpipe

    path, table = elec_two_sites
    model_dir = tmp_path / "ts_model"
    res = CliRunner().invoke(cli, ["model", "init", str(model_dir), "--modality", "timeseries",
                                   "--channels", "1", "--d-model", "16", "--n-layers", "1",
                                   "--n-heads", "2", "--mlp-hidden", "32"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "elec.zarr"
    res = CliRunner().invoke(cli, ["submit", str(path), "--model", str(model_dir), "--id-column",
                                   "site", "--time-column", "ds", "--chunk-size", str(TS_CHUNK),
                                   "--workers", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "2 records, 3,000 positions" in res.output

    model = linpipe.load_model(str(model_dir))
    sites = table.column("site").to_numpy(zero_copy_only=False)
    times = table.column("ds").to_numpy(zero_copy_only=False).astype("datetime64[ns]")
    demand = table.column("y").to_numpy().astype(np.float32)[:, None]  # (T, 1)
    for site, n in (("vic_a", 1800), ("vic_b", 1200)):
        rows = sites == site
        assert rows.sum() == n
        # The bare model over the same series, chunk by chunk, state carried across.
        state = model.init_state()
        parts = {"forecast": [], "residual": []}
        for s in range(0, n, TS_CHUNK):
            o, state = model.forward(demand[rows][s:s + TS_CHUNK], state,
                                     outputs=["forecast", "residual"])
            for k in parts:
                parts[k].append(o[k])
        ds = xr.open_zarr(str(out), group=site)
        assert ds.sizes == {"time": n, "channel": 1} and list(ds["channel"].values) == ["y"]
        np.testing.assert_array_equal(ds["time"].values, times[rows])
        for k in parts:
            expect = np.concatenate(parts[k])
            assert ds[k].shape == expect.shape == (n, 1)
            np.testing.assert_allclose(ds[k].values, expect, rtol=1e-5, atol=1e-4, err_msg=k)
        assert np.isfinite(ds["residual"].values).all()
