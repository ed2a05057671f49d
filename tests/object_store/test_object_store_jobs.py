"""Whole jobs on local and S3 stores as a user runs them (`linpipe submit`: Ray, subprocess
drivers, SIGKILL): a twin driver refused, a killed driver resumed bit-identical, --overwrite
(test_object_store.py has the in-process tests of the same stores).
"""
from __future__ import annotations

import os
import signal
import sys

import pytest
from _object_store_job import OUTPUTS, UNIT, plan_here, run_units, submit_cli
from _pipeline_data import (
    assert_same_bytes,
    kill_session,
    signal_session,
    store_arrays,
    submit_running,
    write_fasta_slice,
)
from click.testing import CliRunner

from linpipe.cli import cli


# ----------------------------------------------------------------------------- whole jobs (Ray)
def _submit_cmd(fasta, model, out, *extra):
    return [sys.executable, "-c", "from linpipe.cli import cli; cli()", "submit", str(fasta),
            "--model", str(model), "--unit-size", str(UNIT), "--outputs", OUTPUTS,
            "--workers", "1", "--out", out, *extra]


@pytest.fixture(scope="module")
def ce_fasta(genomes, tmp_path_factory):
    """7 real C. elegans records cut at 48 kb (one of 48 kb, six of 5 kb): 42 units of 2,048,
    so that a driver is mid-job when the test looks (it holds the driver still, SIGSTOP, as soon
    as 3 units are done)."""
    path = tmp_path_factory.mktemp("ce") / "ce_slice.fa"
    write_fasta_slice(genomes / "htslib_ce.fa", path, 48_000)
    return path


# On the object store before a merge: what differs there (the lease's requests, a refusal naming
# the live driver, a takeover from a dead one) is test_object_store.py's on both places, in this
# process; a SIGKILLed driver's resume on S3 is test_split_kill.py's
@pytest.mark.slow
@pytest.mark.parametrize("store_place", ["local", pytest.param("s3", marks=pytest.mark.premerge)],
                         indirect=True)
def test_twin_refused_then_sigkilled_driver_resumes_bit_identical(store_place, ce_fasta, tiny_dna,
                                                                   tmp_path, shared_ray):
    """A driver runs the job (a process with its embedded Ray): a second submit, asked while the
    driver is held still mid-job, is refused naming its pid and host; the driver is SIGKILLed;
    the same submit (here, on the test process's Ray) then takes over at once (its owner is gone
    from this host) and ends with the bytes of the uninterrupted local run."""
    import socket

    from linpipe.store import OutputStore

    out = store_place("killed.zarr")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LINPIPE_LEASE_HEARTBEAT_S": "1"}
    with submit_running(_submit_cmd(ce_fasta, tiny_dna, out), out, 3, env=env) as proc:
        # the driver and its Ray held still while the twin asks (a stalled driver): on a loaded
        # machine the job could otherwise end before the twin's plan is made
        signal_session(proc.pid, signal.SIGSTOP)
        twin = submit_cli(ce_fasta, tiny_dna, out)  # in this process: refused before any Ray starts
        assert proc.poll() is None, "the job finished while the twin asked"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        # and the rest of its session, as when its machine dies: its Ray workers would otherwise
        # finish their calls in flight (IN_FLIGHT per actor) and could complete the job first
        kill_session(proc.pid)
        assert twin.exit_code == 1, twin.output
        assert "already running" in twin.output and f"pid {proc.pid}" in twin.output
        assert socket.gethostname() in twin.output
        progress = OutputStore.open(out, mode="r").progress()
        assert 3 <= progress["units_done"] < progress["units"] == 42  # killed mid-job
        res = submit_cli(ce_fasta, tiny_dna, out, "--workers", "1")
        assert res.exit_code == 0, res.output
    assert "Done: job lp-" in res.output
    ref = str(tmp_path / "reference.zarr")
    run_units(ce_fasta, tiny_dna, ref)
    assert_same_bytes(store_arrays(ref), store_arrays(out))


@pytest.mark.slow
def test_overwrite_replaces_another_jobs_store(finished_at, store_place, mixed_fasta, tiny_dna,
                                               shared_ray):
    from linpipe.store import OutputStore

    out = finished_at(store_place("mt.zarr"))
    res = CliRunner().invoke(cli, ["submit", str(mixed_fasta), "--model", str(tiny_dna), "--unit-size",
                                   str(UNIT), "--outputs", "logprob", "--workers", "1", "--out", out,
                                   "--overwrite"])
    assert res.exit_code == 0, res.output
    store = OutputStore.open(out, mode="r")
    assert store.meta["outputs"] == ["logprob"] and store.is_complete()
    assert store.meta["job_id"] == plan_here(mixed_fasta, tiny_dna, "logprob").job_id
