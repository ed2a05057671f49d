"""Exports, plots and the outputs CLI (issue 5): bigWig, bedGraph, Parquet, PNG, inspect."""
from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pandas as pd
import pyBigWig
import pytest
from _store_data import HUMAN_BASES, UNIT, build_dna_store, build_ts_store
from click.testing import CliRunner

from linpipe.cli import cli
from linpipe.outputs.export import export_parquet, export_track, value_runs
from linpipe.outputs.plot import envelope
from linpipe.store import OutputStore


@pytest.fixture(scope="module")
def dna(tmp_path_factory, genomes):
    path = tmp_path_factory.mktemp("exp") / "out.zarr"
    _, full = build_dna_store(path, genomes)
    return path, full


@pytest.fixture(scope="module")
def partial(tmp_path_factory, genomes):
    path = tmp_path_factory.mktemp("part") / "part.zarr"
    _, full = build_dna_store(path, genomes, skip={("chr1", 2)}, finalize=False)
    return path, full


@pytest.fixture(scope="module")
def ts(tmp_path_factory, timeseries):
    path = tmp_path_factory.mktemp("tsx") / "ts.zarr"
    _, data = build_ts_store(path, timeseries)
    return path, data


def _bedgraph_to_arrays(path, lengths):
    out = {c: np.full(n, np.nan) for c, n in lengths.items()}
    prev = None
    with open(path) as f:
        assert f.readline().startswith("track type=bedGraph")
        for line in f:
            c, s, e, v = line.split("\t")
            s, e = int(s), int(e)
            out[c][s:e] = float(v)
            if prev and prev[0] == c:  # in order, not overlapping, equal neighbours merged
                assert s >= prev[2] and not (s == prev[2] and float(v) == prev[3])
            prev = (c, s, e, float(v))
    return out


def test_bigwig_values_equal_the_store(dna, tmp_path):
    path, full = dna
    bw_path = tmp_path / "logprob.bw"
    n = export_track(path, "logprob", bw_path, fmt="bigwig")
    assert n > 0
    bw = pyBigWig.open(str(bw_path))
    assert bw.chroms() == {rid: len(a["logprob"]) for rid, a in full.items()}  # sizes from records
    rng = np.random.default_rng(0)
    for rid, arrays in full.items():
        want = arrays["logprob"]
        pos = np.sort(rng.choice(want.size, 500, replace=False))
        got = np.array([bw.values(rid, int(p), int(p) + 1)[0] for p in pos])
        np.testing.assert_array_equal(got, want[pos])  # float32 exactly; NaN where N bases
    # the N run 177,417-227,417 of the real chr1 is skipped, not written as NaN or zero
    assert bw.intervals("chr1", 177_417, 227_417) in (None, ())
    assert bw.intervals("chr1", 177_400, 177_417)[-1][1] == 177_417
    whole = np.array(bw.values("chr1", 0, HUMAN_BASES), dtype=np.float32)
    np.testing.assert_array_equal(whole, full["chr1"]["logprob"])
    bw.close()


def test_bedgraph_and_softmask_runs(dna, tmp_path):
    path, full = dna
    lengths = {rid: len(a["logprob"]) for rid, a in full.items()}
    bg = tmp_path / "entropy.bedGraph"
    export_track(path, "entropy", bg, fmt="bedgraph", records=["chr1", "CHROMOSOME_II"])
    got = _bedgraph_to_arrays(bg, lengths)
    np.testing.assert_array_equal(got["chr1"].astype(np.float32), full["chr1"]["entropy"])
    assert np.isnan(got["CHROMOSOME_MtDNA"]).all()  # not selected
    # the 0/1 soft-mask collapses into runs, merged across chunk boundaries
    sm = tmp_path / "softmask.bedGraph"
    n = export_track(path, "softmask", sm, fmt="bedgraph", records=["chr1"])
    s, e, v = value_runs(full["chr1"]["softmask"])
    assert n == s.size < HUMAN_BASES / 50
    np.testing.assert_array_equal(_bedgraph_to_arrays(sm, lengths)["chr1"], full["chr1"]["softmask"])


def test_track_of_incomplete_store_skips_missing_chunk(partial, tmp_path):
    path, full = partial
    bw_path = tmp_path / "p.bw"
    export_track(path, "softmask", bw_path, fmt="bigwig", records=["chr1"])
    bw = pyBigWig.open(str(bw_path))
    vals = np.array(bw.values("chr1", 0, HUMAN_BASES))
    assert np.isnan(vals[2 * UNIT:3 * UNIT]).all()  # never written: absent, not 0
    np.testing.assert_array_equal(vals[:2 * UNIT], full["chr1"]["softmask"][:2 * UNIT])
    bw.close()


def test_value_runs_edges():
    s, e, v = value_runs(np.array([1, 1, np.nan, np.nan, 2, 2, 2, np.nan, 1], dtype=np.float32), start=10)
    runs = list(zip(s.tolist(), e.tolist(), v.tolist(), strict=True))
    assert runs == [(10, 12, 1.0), (14, 17, 2.0), (18, 19, 1.0)]


def test_parquet_export_of_timeseries(ts, tmp_path):
    path, data = ts
    dest = tmp_path / "ts.parquet"
    rows = export_parquet(path, ["forecast", "residual"], dest)
    df = pd.read_parquet(dest)
    assert rows == len(df) == len(data["time"])
    assert list(df.columns) == ["record", "time", "forecast_MLII_mV", "forecast_V5_mV",
                                "residual_MLII_mV", "residual_V5_mV"]
    assert (df["record"] == "mitdb/100").all()
    np.testing.assert_array_equal(df["time"].to_numpy(), data["time"])
    np.testing.assert_array_equal(df["residual_V5_mV"].to_numpy(), data["residual"][:, 1])


def _png_size(path):
    head = open(path, "rb").read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_plot_png_and_envelope(dna, tmp_path):
    from linpipe.outputs.plot import plot_region

    path, full = dna
    png = tmp_path / "lp.png"
    info = plot_region(path, "chr1", "logprob", png, region="0-300000", width_px=800)
    assert info["downsampled"] and _png_size(png) == (800, 400)
    info = plot_region(path, "chr1", "logprob", tmp_path / "small.png", region="1,000-1,500", width_px=800)
    assert not info["downsampled"] and (info["start"], info["end"]) == (1000, 1500)
    # the envelope keeps a one-position spike that averaging would hide
    lp = full["chr1"]["logprob"][150_000:250_000].copy()  # holds the N run 177,417-227,417
    lp[1_234] = -40.0
    x, lo, hi, mean = envelope(lp, 500)
    assert np.nanmin(lo) == -40.0 and np.nanmin(mean) > -10
    ok = ~np.isnan(mean)
    assert np.all(lo[ok] <= mean[ok]) and np.all(mean[ok] <= hi[ok])
    assert np.isnan(mean[np.searchsorted(x, 200_000 - 150_000)])  # an all-N bin stays empty

# ------------------------------------------------------------------------------------- CLI
def test_cli_inspect(dna, partial, tmp_path):
    path, full = dna
    r = CliRunner().invoke(cli, ["inspect", str(path)])
    assert r.exit_code == 0, r.output
    assert "complete" in r.output and "INCOMPLETE" not in r.output
    for rid in full:
        assert rid in r.output
    r = CliRunner().invoke(cli, ["inspect", str(path), "--json"])
    assert r.exit_code == 0
    s = json.loads(r.output)
    assert s["complete"] and s["n_records"] == 3
    assert s["positions"] == sum(len(a["logprob"]) for a in full.values())
    assert s["compression_ratio"] > 1 and s["size_on_disk"] >= s["output_bytes_stored"] > 0
    assert s["job_id"] == "job-test-1" and s["model_sha256"] == "0" * 64

    ppath, _ = partial
    r = CliRunner().invoke(cli, ["inspect", str(ppath)])
    assert r.exit_code == 0
    assert "INCOMPLETE" in r.output and f"missing {2 * UNIT:,}-{3 * UNIT:,}" in r.output
    assert "Warning:" in r.output

    r = CliRunner().invoke(cli, ["inspect", str(tmp_path)])
    assert r.exit_code == 1 and r.output.startswith("Error: ") and isinstance(r.exception, SystemExit)


def test_cli_export_and_plot(dna, ts, tmp_path):
    path, _ = dna
    bw = tmp_path / "t.bw"
    r = CliRunner().invoke(cli, ["export", str(path), "--format", "bigwig", "--output", "logprob",
                                 "--record", "chr1", "-o", str(bw)])
    assert r.exit_code == 0, r.output
    assert pyBigWig.open(str(bw)).chroms() == {"chr1": HUMAN_BASES}
    r = CliRunner().invoke(cli, ["export", str(path), "--format", "bigwig", "--output", "hidden",
                                 "-o", str(bw)])
    assert r.exit_code == 1 and "feature axis" in r.output
    r = CliRunner().invoke(cli, ["export", str(path), "--format", "bigwig", "--output", "logprob",
                                 "--record", "chrZ", "-o", str(bw)])
    assert r.exit_code == 1 and "no record 'chrZ'" in r.output
    tpath, _ = ts
    r = CliRunner().invoke(cli, ["export", str(tpath), "--format", "parquet", "--output", "forecast",
                                 "-o", str(tmp_path / "f.parquet")])
    assert r.exit_code == 0 and "Wrote 20,000 rows" in r.output
    r = CliRunner().invoke(cli, ["export", str(tpath), "--format", "bedgraph", "--output", "forecast",
                                 "-o", str(tmp_path / "f.bg")])
    assert r.exit_code == 1 and "time series" in r.output

    png = tmp_path / "p.png"
    r = CliRunner().invoke(cli, ["plot", str(path), "--record", "chr1", "--output", "entropy",
                                 "--region", "100000-200000", "-o", str(png)])
    assert r.exit_code == 0 and "min/max envelope" in r.output
    assert _png_size(png)[0] == 1600
    r = CliRunner().invoke(cli, ["plot", str(tpath), "--record", "mitdb/100", "--output", "residual",
                                 "--region", "0-1000", "-o", str(tmp_path / "ts.png")])
    assert r.exit_code == 0 and _png_size(tmp_path / "ts.png")[1] == 800  # one panel per channel
    r = CliRunner().invoke(cli, ["plot", str(path), "--record", "chr1", "--output", "logprob",
                                 "--region", "500-100", "-o", str(png)])
    assert r.exit_code == 1 and "region '500-100'" in r.output


@pytest.mark.parametrize("fmt", ["bigwig", "bedgraph", "parquet"])
def test_a_failed_export_leaves_no_file_that_looks_complete(dna, tmp_path, fmt):
    """A unit that cannot be read half way through (its logprob chunk truncated): the export
    fails with one line, and the destination keeps what it held before (here an older export);
    no temporary file is left beside it."""
    path, _ = dna
    damaged = tmp_path / "damaged.zarr"
    shutil.copytree(path, damaged)
    key = OutputStore.open(str(damaged), mode="r").record("chr1").key
    chunk = damaged / key / "logprob" / "c" / "2"
    chunk.write_bytes(chunk.read_bytes()[:10])
    dest = tmp_path / "out" / f"logprob.{fmt}"
    dest.parent.mkdir()
    dest.write_text("an older export\n")
    r = CliRunner().invoke(cli, ["export", str(damaged), "--format", fmt, "--output", "logprob",
                                 "--record", "chr1", "-o", str(dest)])
    assert r.exit_code == 1 and r.output.startswith("Error: ") and len(r.output.splitlines()) == 1
    assert "logprob unreadable" in r.output, r.output
    assert dest.read_text() == "an older export\n"
    assert sorted(p.name for p in dest.parent.iterdir()) == [dest.name]
    # the same export of the undamaged store replaces the old file whole
    r = CliRunner().invoke(cli, ["export", str(path), "--format", fmt, "--output", "logprob",
                                 "--record", "chr1", "-o", str(dest)])
    assert r.exit_code == 0, r.output
    assert dest.read_bytes() != b"an older export\n"
    assert sorted(p.name for p in dest.parent.iterdir()) == [dest.name]
