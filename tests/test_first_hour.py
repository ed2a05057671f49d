"""Issue 21: a new user's first hour. No silent overwrite, no hang, errors before work starts,
examples that run from a clone, clear messages. Each test failed before its fix."""
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
from _pipeline_data import write_in_process
from click.testing import CliRunner

from linpipe.cli import cli

TINY_TRAIN = ["--d-model", "12", "--n-layers", "1", "--n-heads", "1", "--steps", "2", "--batch", "1",
              "--window", "16", "--quiet"]


def run(*args, **kw):
    return CliRunner().invoke(cli, [str(a) for a in args], **kw)


def one_line_error(r, *facts):
    assert r.exit_code != 0, r.output
    assert r.output.startswith("Error: ") and isinstance(r.exception, SystemExit), r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    for f in facts:
        assert f in r.output, (f, r.output)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------- 1: train --out
def test_train_refuses_an_existing_model_without_force(tmp_path, genomes):
    out = tmp_path / "m"
    assert run("train", genomes / "minimap2_MT-human.fa", "--out", out, *TINY_TRAIN).exit_code == 0
    weights = sha(out / "model.safetensors")
    r = run("train", genomes / "minimap2_MT-orang.fa", "--out", out, *TINY_TRAIN)
    one_line_error(r, str(out), "--force", "--resume")
    assert sha(out / "model.safetensors") == weights  # the trained model is untouched
    # --resume continues the same model (the folder is not empty, and that is fine)
    longer = [("4" if a == "2" and TINY_TRAIN[i - 1] == "--steps" else a) for i, a in enumerate(TINY_TRAIN)]
    r = run("train", genomes / "minimap2_MT-human.fa", "--out", out, *longer, "--resume")
    assert r.exit_code == 0, r.output
    assert json.loads((out / "checkpoint" / "trainer.json").read_text())["step"] == 4
    # --force replaces it
    r = run("train", genomes / "minimap2_MT-orang.fa", "--out", out, *TINY_TRAIN, "--force")
    assert r.exit_code == 0, r.output
    assert "MT-orang" in json.loads((out / "training.json").read_text())["inputs"][0]["path"]


def test_train_refuses_a_folder_with_other_files(tmp_path, genomes):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.json").write_text('{"hand": "written"}\n')
    (out / "notes.txt").write_text("keep me\n")
    r = run("train", genomes / "minimap2_MT-human.fa", "--out", out, *TINY_TRAIN)
    one_line_error(r, str(out), "--force")
    assert (out / "config.json").read_text() == '{"hand": "written"}\n'
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "notes.txt"]
    # an empty folder is fine
    (tmp_path / "empty").mkdir()
    assert run("train", genomes / "minimap2_MT-human.fa", "--out", tmp_path / "empty",
               *TINY_TRAIN).exit_code == 0


# ---------------------------------------------------------------------- 2: an address that is not Ray's GCS
@pytest.fixture
def http_server():
    """A real HTTP server on 127.0.0.1 (what the dashboard port is to a GCS client)."""
    import http.server
    import threading

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def silent_listener():
    """A plain TCP listener that accepts and never answers."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s.getsockname()[1]
    s.close()


def submit_subprocess(*args, cwd, timeout=60):
    """`linpipe submit` as a real process; a hang fails the test through the timeout."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "linpipe.cli", "submit", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


# silent: two submits that each wait out the connect timeout (about 13 s together)
@pytest.mark.parametrize("kind", ["http", pytest.param("silent", marks=pytest.mark.slow)])
def test_submit_to_a_port_that_is_not_the_gcs_ends_in_seconds(kind, http_server, silent_listener, genomes,
                                                             tmp_path):
    port = http_server if kind == "http" else silent_listener
    out = tmp_path / "mt.zarr"
    for extra in (["--dry-run"], []):
        r = submit_subprocess(genomes / "minimap2_MT-human.fa", "--out", out, "--address",
                              f"127.0.0.1:{port}", *extra, cwd=tmp_path)
        assert r.returncode == 1, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: --address 127.0.0.1:"), r.stderr
        assert "6379" in lines[0] and "http://127.0.0.1:" in lines[0]  # both ways out, named
        assert "Traceback" not in r.stderr + r.stdout
        assert not out.exists()  # a refused address leaves no store behind


# ------------------------------------------------------------ 3: checks before any store is created
@pytest.fixture(scope="module")
def one_channel_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("models") / "ts1"
    r = run("model", "init", d, "--modality", "timeseries", "--channels", "1", "--d-model", "8",
            "--n-layers", "1", "--n-heads", "1")
    assert r.exit_code == 0, r.output
    return d


@pytest.mark.parametrize("dry", [True, False])
def test_channel_count_mismatch_is_refused_before_any_store(dry, one_channel_model, timeseries, tmp_path):
    csv = timeseries / "heartpy_data2_ppg.csv"  # columns timer, hr: 2 channels by default
    out = tmp_path / "ppg.zarr"
    r = run("submit", csv, "--model", one_channel_model, "--out", out, *(["--dry-run"] if dry else []))
    one_line_error(r, str(csv), "timer", "hr", "--columns", "--time-column timer")
    assert not out.exists()
    # the fix the message names works, and the store appears only now
    r = run("submit", csv, "--model", one_channel_model, "--out", out, "--time-column", "timer", "--dry-run")
    assert r.exit_code == 0, r.output
    parquet = timeseries / "mitdb_100_ecg.parquet"  # 3 numeric columns against 1 channel
    one_line_error(run("submit", parquet, "--model", one_channel_model, "--out", out, "--dry-run"),
                   str(parquet), "sample, MLII_mV, V5_mV", "--time-column sample")


def test_model_channel_names_pick_the_columns_by_name(tmp_path, timeseries):
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    ecg = timeseries / "mitdb_100_ecg.parquet"
    model = tmp_path / "ecg"
    # trained on the two leads in the reverse of the file's order
    r = run("train", ecg, "--out", model, "--time-column", "sample", "--columns", "V5_mV,MLII_mV",
            *TINY_TRAIN)
    assert r.exit_code == 0, r.output
    r = run("submit", ecg, "--model", model, "--out", tmp_path / "ecg.zarr", "--dry-run")
    assert r.exit_code == 0, r.output
    plan = plan_job(JobRequest(inputs=(str(ecg),), model=str(model)))
    assert plan.input_options["columns"] == ["V5_mV", "MLII_mV"] and plan.channels == ("V5_mV", "MLII_mV")


def test_a_plan_opens_a_series_file_once_when_its_default_columns_are_the_models(tmp_path, timeseries,
                                                                              monkeypatch):
    """Opening a time series reads its index (a pass over the file, seconds for a large one,
    when none is kept): the plan reuses the input it opened to match the model's channel names,
    unless the names change the columns."""
    import pyarrow.parquet as pq

    from linpipe.inputs import timeseries as ts
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    ecg = timeseries / "mitdb_100_ecg.parquet"
    built = []  # the index read or built: once per open
    real = ts.load_or_build
    monkeypatch.setattr(ts, "load_or_build", lambda *a, **k: built.append(a[1]) or real(*a, **k))
    for order, opens in (("MLII_mV,V5_mV", 1), ("V5_mV,MLII_mV", 2)):
        model = tmp_path / order.replace(",", "-")
        r = run("train", ecg, "--out", model, "--time-column", "sample", "--columns", order, *TINY_TRAIN)
        assert r.exit_code == 0, r.output
        built.clear()
        plan = plan_job(JobRequest(inputs=(str(ecg),), model=str(model),
                                   time_column="sample"))
        assert plan.channels == tuple(order.split(","))
        assert plan.total_positions == pq.ParquetFile(ecg).metadata.num_rows
        assert built == [ecg] * opens, order


def test_a_store_that_never_received_a_unit_is_replaced_without_overwrite(tmp_path, genomes):
    from linpipe.jobs.driver import open_or_create_store
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest
    from linpipe.store import open_output

    mt, out = genomes / "minimap2_MT-human.fa", tmp_path / "mt.zarr"
    # what a submit that failed after creating its store left: a store of another job, no unit
    first = plan_job(JobRequest(inputs=(str(mt),), unit_size=5000))
    open_or_create_store(first, str(out))
    # the corrected job's driver (open_or_create_store, in this process: no Ray) takes it
    second = write_in_process(mt, "default", out, unit_size=8192, outputs=None)
    done = open_output(out)
    assert done.complete and done.meta["job_id"] == second.job_id != first.job_id
    # a store that did receive work is still protected: submit refuses it before any worker starts
    r = run("submit", mt, "--out", out, "--unit-size", "5000", "--workers", "1")
    one_line_error(r, "holds the outputs of another job", "--overwrite")


# ------------------------------------------------------------ 5 and 9: bigWig without pyBigWig, = bedGraph
@pytest.fixture(scope="module")
def mt_store(tmp_path_factory, genomes):
    """What `submit MT-human.fa --unit-size 5000` writes (run in this process: no Ray)."""
    out = tmp_path_factory.mktemp("mt") / "mt.zarr"
    write_in_process(genomes / "minimap2_MT-human.fa", "default", out, unit_size=5000, outputs=None)
    return out


def bedgraph_intervals(path):
    lines = Path(path).read_text().splitlines()[1:]
    return [(c, int(s), int(e), float(v)) for c, s, e, v in (line.split("\t") for line in lines)]


def test_bigwig_export_needs_no_pybigwig(mt_store, tmp_path):
    import subprocess
    import sys

    bw = tmp_path / "logprob.bw"
    # as after a plain `pip install linpipe`: pyBigWig cannot be imported
    code = ("import sys; sys.modules['pyBigWig'] = None; from linpipe.cli import main; "
            f"sys.argv = ['linpipe', 'export', {str(mt_store)!r}, '--format', 'bigwig', "
            f"'--output', 'logprob', '-o', {str(bw)!r}]; main()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    import pyBigWig  # an independent reader (test dependency) reads it back

    f = pyBigWig.open(str(bw))
    assert f.chroms() == {"MT_human": 16569} and f.header()["nLevels"] > 0


@pytest.mark.parametrize("output", ["logprob", "softmask"])
def test_bigwig_and_bedgraph_hold_the_same_intervals(output, mt_store, tmp_path):
    import pyBigWig

    from linpipe.store import open_output

    bw, bg = tmp_path / "t.bw", tmp_path / "t.bedGraph"
    r1 = run("export", mt_store, "--format", "bigwig", "--output", output, "-o", bw)
    r2 = run("export", mt_store, "--format", "bedgraph", "--output", output, "-o", bg)
    assert r1.exit_code == 0 and r2.exit_code == 0, r1.output + r2.output
    count = [int(o.split()[1].replace(",", "")) for o in (r1.output, r2.output)]
    want = bedgraph_intervals(bg)
    assert count[0] == count[1] == len(want)
    f = pyBigWig.open(str(bw))
    got = [("MT_human", s, e, v) for s, e, v in f.intervals("MT_human")]
    assert [g[:3] for g in got] == [w[:3] for w in want]
    np.testing.assert_allclose([g[3] for g in got], [w[3] for w in want], rtol=1e-6)
    # the zoom levels summarise the same values (a browser's zoomed-out view)
    values = open_output(mt_store).dataset("MT_human")[output].values.astype(np.float64)
    assert f.stats("MT_human", 0, 16569, type="max", exact=False)[0] == pytest.approx(np.nanmax(values))
    assert f.stats("MT_human", 0, 16569, type="mean", exact=False)[0] == pytest.approx(np.nanmean(values),
                                                                                       rel=1e-4)


@pytest.mark.slow
def test_bigwig_of_many_records_reads_back(tmp_path):
    """70,000 records: a chromosome B+ tree of three leaves under a root, and an R-tree of three
    tiers (one data block per record), as a draft assembly of many contigs gives; the records
    come in store order (contig0, contig1, ...), which is not the byte order of their names."""
    import pyBigWig

    from linpipe.outputs.bigwig import write_bigwig

    n = 70_000
    chroms = [(f"contig{i}", 50 + i % 7) for i in range(n)]

    def runs():  # in input order, not the name order the file's chromosome tree uses
        for i in range(n):
            yield f"contig{i}", np.array([0, 10]), np.array([5, 30]), np.array([i, -i], float)

    assert write_bigwig(tmp_path / "many.bw", chroms, runs()) == 2 * n
    f = pyBigWig.open(str(tmp_path / "many.bw"))
    assert f.chroms() == dict(chroms)
    for i in (0, 5, 32_767, 32_768, n - 1):
        assert f.intervals(f"contig{i}") == ((0, 5, float(i)), (10, 30, float(-i)))


# ---------------------------------------------------------------------------------- 6: time series
def test_index_says_when_the_first_column_looks_like_a_sample_index(timeseries):
    for name, col in (("statsmodels_sunspots_yearly.csv", "YEAR"), ("mitdb_100_ecg.parquet", "sample")):
        r = run("index", timeseries / name)
        assert r.exit_code == 0, r.output
        assert f"--time-column {col}" in r.output
        assert json.loads(run("index", timeseries / name, "--json").output)["index_column"] == col
        # once it is the time column, nothing to say
        r = run("index", timeseries / name, "--time-column", col, "--json")
        assert json.loads(r.output)["index_column"] is None
    # a column of measurements is not mistaken for one
    assert json.loads(run("index", timeseries / "statsmodels_co2_weekly.csv", "--json").output)[
        "index_column"] is None


def reformat_dates(src: Path, dest: Path, how) -> Path:
    """The real hourly demand series with its ISO dates ('2012-01-01 00:00:00') rewritten."""
    lines = src.read_text().splitlines()
    out = [lines[0]]
    for line in lines[1:]:
        stamp, value = line.split(",")
        out.append(f"{how(stamp[:4], stamp[5:7], stamp[8:10], stamp[11:16])},{value}")
    dest.write_text("\n".join(out) + "\n")
    return dest


def test_common_date_formats_and_time_format(timeseries, tmp_path, one_channel_model):
    import pandas as pd

    from linpipe.store import open_output

    src = timeseries / "statsmodels_mstl_elec_vic.csv"
    want = pd.to_datetime(pd.read_csv(src)["ds"]).to_numpy()
    slash = reformat_dates(src, tmp_path / "slash.csv", lambda y, m, d, hm: f"{y}/{m}/{d} {hm}")
    out = tmp_path / "slash.zarr"
    write_in_process(slash, one_channel_model, out, outputs=None, time_column="ds")  # no Ray
    ds = open_output(out).dataset("slash")
    np.testing.assert_array_equal(ds["time"].values.astype("datetime64[ns]"), want)
    # day-first dates are ambiguous: refused with the flag that reads them, which then works
    dots = reformat_dates(src, tmp_path / "dots.csv", lambda y, m, d, hm: f"{d}.{m}.{y} {hm}")
    one_line_error(run("index", dots, "--time-column", "ds"), str(dots), "'ds'", "--time-format")
    r = run("index", dots, "--time-column", "ds", "--time-format", "%d.%m.%Y %H:%M", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["records"][0]["length"] == len(want)
    one_line_error(run("index", slash, "--time-column", "ds", "--time-format", "%d.%m.%Y %H:%M"),
                   str(slash), "'ds'", "2012/01/01 00:00", "%d.%m.%Y %H:%M")


def test_dna_model_on_a_series_says_how_to_get_a_time_series_model(timeseries, tmp_path):
    from linpipe.model import SHIPPED_MODELS

    csv = timeseries / "statsmodels_co2_weekly.csv"
    dna_model = SHIPPED_MODELS / "default"  # named as a directory: no choice by modality
    r = run("submit", csv, "--model", dna_model, "--out", tmp_path / "co2.zarr", "--dry-run")
    one_line_error(r, str(csv), "dna model", "--model default-timeseries", "linpipe train",
                   "--model MODEL_DIR")
    r = run("eval", dna_model, csv)
    one_line_error(r, str(csv), "default-timeseries", "linpipe train")


# ---------------------------------------------------------------------------------- 7: silent surprises
@pytest.mark.slow  # two embedded Ray start-ups in real processes
def test_one_record_on_two_workers_says_why_and_counts_in_words(genomes, tmp_path):
    out = tmp_path / "mt.zarr"
    r = submit_subprocess(genomes / "minimap2_MT-human.fa", "--out", out, "--workers", "2",
                          cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    start = next(line for line in r.stderr.splitlines() if line.startswith("job "))
    assert "1 record," in start and "1 work item," in start and "on 1 worker (2 possible" in start
    assert "1 work items" not in r.stderr and "1 records" not in r.stdout + r.stderr
    # Ray's start-up is announced before the seconds it takes
    assert r.stderr.index("starting a local Ray") < r.stderr.index(start)
    # the second run: "Nothing to do" once, on stdout
    r = submit_subprocess(genomes / "minimap2_MT-human.fa", "--out", out, cwd=tmp_path, timeout=300)
    assert r.returncode == 0 and r.stdout.count("Nothing to do") == 1, r.stdout
    assert "nothing to do" not in r.stderr.lower(), r.stderr


@pytest.mark.slow
def test_submit_quiet_prints_only_the_summary(genomes, tmp_path):
    r = submit_subprocess(genomes / "minimap2_MT-human.fa", "--out", tmp_path / "q.zarr", "--quiet",
                          cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Done: job ") and r.stderr.strip() == ""


def test_a_fasta_of_headers_only_has_no_sequence(tmp_path):
    fa = tmp_path / "empty.fa"
    fa.write_text(">chr1 nothing here\n")
    out = tmp_path / "empty.zarr"
    for extra in ([], ["--dry-run"]):
        one_line_error(run("submit", fa, "--out", out, *extra), str(fa), "no sequence")
    assert not out.exists()


# ---------------------------------------------------------------------------------- 8: ids vs keys
def test_inspect_shows_the_key_of_an_id_that_is_not_a_safe_name(genomes, tmp_path):
    import xarray as xr

    from linpipe.store import open_output

    seq = "".join(genomes.joinpath("minimap2_MT-human.fa").read_text().splitlines()[1:])
    fa = tmp_path / "region.fa"
    fa.write_text(">chr13:75549820-75551819 a region\n" + seq[:2000] + "\n>plain\n" + seq[2000:3000] + "\n")
    out = tmp_path / "region.zarr"
    # records longer than a unit get a group (and a key); shorter ones are packed, with no group
    write_in_process(fa, "default", out, unit_size=500, outputs=None)  # what submit writes; no Ray
    key = open_output(out).key("chr13:75549820-75551819")
    assert key != "chr13:75549820-75551819"
    r = run("inspect", out)
    assert r.exit_code == 0, r.output
    assert f"chr13:75549820-75551819 -> {key}" in r.output and "plain ->" not in r.output
    assert ".dataset(ID)" in r.output
    assert json.loads(run("inspect", out, "--json").output)["records"][0]["key"] == key
    # the ways the message names work
    assert xr.open_zarr(out, group=key).sizes["position"] == 2000
    assert open_output(out).dataset("chr13:75549820-75551819").sizes["position"] == 2000


# ---------------------------------------------------------------------------------- 9: small defects
def test_index_files_follow_the_umask(genomes, timeseries, tmp_path):
    import os
    import shutil
    import stat

    fa = shutil.copy(genomes / "abricate_Sepidermidis_ST14_assembly.fa.bgz", tmp_path / "a.fa.bgz")
    csv = shutil.copy(timeseries / "statsmodels_sunspots_yearly.csv", tmp_path / "s.csv")
    old = os.umask(0o022)
    try:
        assert run("index", fa).exit_code == 0
        r = run("index", csv, "--json", env={"LINPIPE_CACHE": str(tmp_path / "cache")})
        assert r.exit_code == 0, r.output
    finally:
        os.umask(old)
    written = [p for p in tmp_path.iterdir() if p.suffix in (".fai", ".gzi", ".lpi")]
    written.append(Path(json.loads(r.output)["index"]))  # the CSV's converted table
    assert len(written) >= 3
    for p in written:
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p


def all_commands():
    import click

    def walk(cmd, path):
        yield path, cmd
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                yield from walk(sub, path + [name])

    return list(walk(cli, []))


@pytest.mark.parametrize("path", [p for p, _ in all_commands()], ids=lambda p: " ".join(p) or "linpipe")
def test_every_help_has_an_example_and_every_option_says_what_it_does(path):
    import click

    cmd = dict((tuple(p), c) for p, c in all_commands())[tuple(path)]
    r = run(*path, "--help")
    assert r.exit_code == 0, r.output
    assert re.search(r"Examples:\n\s+linpipe ", r.output), r.output
    assert "%%" not in r.output and " TEXT" not in r.output, r.output
    for p in cmd.params:
        if isinstance(p, click.Option):
            assert p.help, (path, p.opts)
    # each example parses: its options exist and take the values given
    import shlex

    for line in r.output.split("Examples:\n", 1)[1].strip().splitlines():
        argv = shlex.split(line)[1:]
        target, rest = cli, list(argv)
        while isinstance(target, click.Group) and rest and rest[0] in target.commands:
            target = target.commands[rest.pop(0)]
        target.make_context(target.name, rest)


@pytest.fixture(scope="module")
def ecg_store(tmp_path_factory):
    """The shipped ECG example run through the shipped ECG model (in this process: no Ray)."""
    examples = Path(__file__).resolve().parents[1] / "examples"
    out = tmp_path_factory.mktemp("ecg") / "ecg.zarr"
    write_in_process(examples / "ecg-mitdb100.parquet", examples / "models" / "ecg", out, outputs=None,
                     time_column="sample")
    return out


@pytest.mark.parametrize("output", [pytest.param("forecast", marks=pytest.mark.slow), "residual"])
def test_plot_draws_the_input_beside_forecast_and_residual(output, ecg_store, tmp_path):
    from linpipe.outputs.plot import plot_region

    png = tmp_path / f"{output}.png"
    r = run("plot", ecg_store, "--record", "ecg-mitdb100", "--output", output, "--region", "0-3000",
            "-o", png)
    assert r.exit_code == 0 and "with the input signal" in r.output, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    info = plot_region(ecg_store, "ecg-mitdb100", output, tmp_path / "again.png", region="0-3000")
    assert info["input_drawn"] and info["input_note"] is None
