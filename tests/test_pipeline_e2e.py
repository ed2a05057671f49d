"""`linpipe submit` as a user runs it, on real data: a time series with an id and a time column,
a driver killed with SIGKILL and resumed, actor resources from a job spec, and a full disk.

The jobs run in this process join the test process's shared Ray (conftest's shared_ray); the
SIGKILLed driver is a subprocess with an embedded Ray of its own, as a user's submit has.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from _pipeline_data import (
    assert_same_bytes,
    make_tiny_model,
    polled_store,
    store_arrays,
    submit_running,
    write_fasta_slice,
    write_in_process,
)
from click.testing import CliRunner

from linpipe.cli import cli

TS_UNIT = 512
pytestmark = pytest.mark.slow  # whole jobs through the CLI, Ray and subprocesses


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


def test_timeseries_submit_matches_the_bare_model_and_opens_in_xarray(elec_two_sites, tmp_path, shared_ray):
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
                                   "site", "--time-column", "ds", "--unit-size", str(TS_UNIT),
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
        for s in range(0, n, TS_UNIT):
            o, state = model.forward(demand[rows][s:s + TS_UNIT], state,
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


# ----------------------------------------------------------------------------- killed driver
KILL_UNIT = 2_048
DNA_OUTPUTS = "logprob,entropy,softmask"


@pytest.fixture(scope="module")
def tiny_dna(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("dna_model") / "tiny")


@pytest.fixture(scope="module")
def ce_slice(genomes, tmp_path_factory):
    """7 real C. elegans records: one of 60 kb and six of 5 kb, 51 chunks of 2,048."""
    path = tmp_path_factory.mktemp("ce") / "ce_slice.fa"
    write_fasta_slice(genomes / "htslib_ce.fa", path, 60_000)
    return path


def _submit_cmd(fasta, model, out, *extra):
    return [sys.executable, "-c", "from linpipe.cli import cli; cli()", "submit", str(fasta),
            "--model", str(model), "--unit-size", str(KILL_UNIT), "--outputs", DNA_OUTPUTS,
            "--workers", "1", "--out", str(out), *extra]


def _units_done(out) -> int:
    store = polled_store(out)  # opened once: a poll reads only the done flags
    try:
        return 0 if store is None else sum(len(store.completed_units(key)) for key in store.meta["records"])
    except Exception:  # not created yet, or metadata being written: poll again
        return 0


def _reference_store(fasta, model, out):
    """The uninterrupted job, run in this process (the bytes a worker writes)."""
    write_in_process(fasta, model, out, unit_size=KILL_UNIT, outputs=DNA_OUTPUTS.split(","))
    return store_arrays(out)


def test_sigkilled_driver_resumes_to_the_bytes_of_an_uninterrupted_run(ce_slice, tiny_dna, tmp_path):
    out = tmp_path / "killed.zarr"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # stopped the moment 3 units are seen, then killed: with its workers at full speed the 44-unit
    # job could otherwise finish between the store's poll and the kill (a CI run's resume said
    # "Nothing to do")
    with submit_running(_submit_cmd(ce_slice, tiny_dna, out), out, 3, wait_s=120, done=_units_done,
                        stop=True) as proc:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        done = _units_done(out)
        assert 3 <= done < 51  # killed mid-job
        # The same submit, run again, starts a fresh embedded Ray and resumes (the killed one's
        # processes end with it: tests/test_ray_leftovers.py).
        # Its own temporary folder (short: Ray's socket paths): an embedded Ray's session folder
        # goes with it when the job ends (the killed run's cannot).
        tmpdir = tempfile.mkdtemp(prefix="lpt", dir="/tmp")
        resume = subprocess.Popen(_submit_cmd(ce_slice, tiny_dna, out), env={**env, "TMPDIR": tmpdir},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # the uninterrupted run's bytes, made here while the resume starts its Ray
            reference = _reference_store(ce_slice, tiny_dna, tmp_path / "reference.zarr")
            # a guard against a hang, not a speed check: on CI's busy 2-core runner this resume
            # ran at 666 positions/s and reached 100% just before an earlier guard of 180 s
            stdout, stderr = resume.communicate(timeout=480)
        finally:
            if resume.poll() is None:
                resume.kill()
                resume.wait()
        res = subprocess.CompletedProcess(resume.args, resume.returncode, stdout, stderr)
        assert res.returncode == 0, res.stderr
        assert os.listdir(tmpdir) == []
        os.rmdir(tmpdir)
    assert "Done: job lp-" in res.stdout and f"{90_000:,} positions" in res.stdout
    # the units of the killed run were kept, not redone: the summary says both parts
    said = re.search(r"positions \(([\d.]+)(k?) run, ([\d.]+)(k?) from before\)", res.stdout).groups()
    ran, before = (float(n) * (1000 if k else 1) for n, k in (said[:2], said[2:]))
    assert before >= 3 * KILL_UNIT and ran + before == pytest.approx(90_000, abs=20)
    assert_same_bytes(reference, store_arrays(out))


# ----------------------------------------------------------------------------- actor resources
def test_spec_resources_size_the_actors(ce_slice, tiny_dna, tmp_path, shared_ray):
    """A spec asking 2 CPUs per actor of a local Ray of 3 gets one actor (two threads), and the
    same job again with custom resources the cluster lacks is refused in one line."""
    spec = tmp_path / "job.yaml"
    spec.write_text(f"inputs: [{ce_slice}]\nmodel: {tiny_dna}\nunit_size: 16384\n"
                    f"outputs: [logprob]\nworkers: 2\nout: {tmp_path / 'r.zarr'}\n"
                    "resources: {num_cpus: 2, memory: 256MiB}\n")
    res = CliRunner().invoke(cli, ["submit", "--spec", str(spec)])
    assert res.exit_code == 0, res.output
    assert "on 1 worker;" in res.output and "Warning" not in res.output
    assert "90,000 positions" in res.output
    res = CliRunner().invoke(cli, ["submit", "--spec", str(spec), "--overwrite",
                                   "--actor-resources", "num_cpus=1,tpu_pod=1"])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit)
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].startswith("Error: each actor asks for") and "tpu_pod" in errors[0]


# ----------------------------------------------------------------------------- full disk
@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs of our own (needs root, as in the project's CI container)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_full_disk_is_one_error_line_and_the_job_resumes_once_space_is_freed(
        ce_slice, tiny_dna, small_disk, shared_ray):
    ballast = small_disk / "ballast"
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    # 1 MiB: the store (~180 KiB) starts and its first units are written (IN_FLIGHT calls per
    # worker write side by side), then it fills
    ballast.write_bytes(b"\0" * (free - 1024 * 1024))
    out = small_disk / "full.zarr"
    args = ["submit", str(ce_slice), "--model", tiny_dna, "--unit-size", str(KILL_UNIT),
            "--outputs", DNA_OUTPUTS, "--workers", "2", "--out", str(out)]
    res = CliRunner().invoke(cli, args)
    # exit status 1 through sys.exit, not an exception that escaped the CLI
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), repr(res.exception)
    lines = [ln for ln in res.output.splitlines() if ln.startswith("Error")]
    assert len(lines) == 1
    assert "No space left on device" in lines[0] and "resumable" in lines[0]
    assert 0 < _units_done(out) < 51
    ballast.unlink()
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "Done: job lp-" in res.output and "90,000 positions" in res.output
    reference = _reference_store(ce_slice, tiny_dna, small_disk / "reference.zarr")
    assert_same_bytes(reference, store_arrays(out))

