"""Output stores on a local path and on a real S3-protocol server (moto, on 127.0.0.1), alike:
create, resume, "Nothing to do", --overwrite, inspect, export, plot, open_output; one driver per
job (the lease); object-store requests retried on transient errors.

The quick tests fill stores in this process with the worker class itself (no Ray); the slow ones
run `linpipe submit` as a user does (Ray, subprocess drivers, SIGKILL).
"""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _object_store_job import UNIT, plan_here, run_units, submit_cli
from _pipeline_data import (
    assert_same_bytes,
    record_outputs,
    store_arrays,
)
from _s3 import ACCESS_KEY, SECRET_KEY, all_objects
from click.testing import CliRunner

from linpipe.cli import cli

TESTS = Path(__file__).resolve().parent.parent  # tests/: _faulty_writer.py, for a child process


@pytest.fixture(autouse=True)
def _quick_lease(quick_lease):
    """Every test here with leases in fractions of a second (conftest's quick_lease)."""


# ----------------------------------------------------------------------------- store operations
def test_resumed_store_is_bit_identical_and_reads_alike(store_place, mixed_fasta, tiny_dna, reference,
                                                        tmp_path):
    """A job stopped after 5 units and resumed ends with the bytes of the uninterrupted local run;
    submitting it again says "Nothing to do"; inspect, export, plot and open_output work on it."""
    import pyBigWig

    import linpipe
    from linpipe.store.reader import IncompleteStoreWarning

    out = store_place("mt.zarr")
    assert run_units(mixed_fasta, tiny_dna, out, stop_after=5) == 5
    with pytest.warns(IncompleteStoreWarning):
        linpipe.open_output(out)
    res = CliRunner().invoke(cli, ["inspect", out, "--json"])
    assert res.exit_code == 0, res.output
    partial = json.loads(res.stdout)
    run_units(mixed_fasta, tiny_dna, out)  # the resume: the rest of the units, from the store
    ref_arrays, ref_outputs = reference
    assert_same_bytes(ref_arrays, store_arrays(out))
    assert_same_bytes(ref_outputs, record_outputs(out))

    res = submit_cli(mixed_fasta, tiny_dna, out)
    assert res.exit_code == 0, res.output
    assert "Nothing to do" in res.output and out in res.output

    res = CliRunner().invoke(cli, ["inspect", out, "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    mt = next(r for r in partial["records"] if r["id"].startswith("MT"))
    assert partial["complete"] is False and mt["chunks_done"] == 5
    assert mt["missing_ranges"] == [[5 * UNIT, mt["length"]]]
    assert info["complete"] is True and info["packed"]["batches_done"] == info["packed"]["batches"] == 7
    assert [r["chunks_done"] for r in info["records"]] == [9] and info["size_on_disk"] > 0

    bg = tmp_path / "t.bedgraph"
    res = CliRunner().invoke(cli, ["export", out, "--format", "bedgraph", "--output", "logprob",
                                   "-o", str(bg)])
    assert res.exit_code == 0, res.output
    rows = [line.split("\t") for line in bg.read_text().splitlines() if not line.startswith("track")]
    mt_id = next(k.split("/")[0] for k in ref_outputs if k.startswith("MT"))
    mt_rows = [r for r in rows if r[0] == mt_id]
    assert mt_rows and int(mt_rows[-1][2]) == ref_outputs[f"{mt_id}/logprob"].size
    bw = tmp_path / "t.bw"
    res = CliRunner().invoke(cli, ["export", out, "--format", "bigwig", "--output", "logprob", "-o", str(bw)])
    assert res.exit_code == 0, res.output
    with pyBigWig.open(str(bw)) as f:
        assert f.chroms()[mt_id] == ref_outputs[f"{mt_id}/logprob"].size
        got = np.array(f.values(mt_id, 0, 100), dtype=np.float32)
        np.testing.assert_allclose(got, ref_outputs[f"{mt_id}/logprob"][:100], rtol=1e-6)
    pq = tmp_path / "t.parquet"
    res = CliRunner().invoke(cli, ["export", out, "--format", "parquet", "--output", "logprob",
                                   "--record", mt_id, "-o", str(pq)])
    assert res.exit_code == 0, res.output
    import pyarrow.parquet as papq

    table = papq.read_table(pq)
    np.testing.assert_array_equal(table.column("logprob").to_numpy(), ref_outputs[f"{mt_id}/logprob"])
    png = tmp_path / "t.png"
    res = CliRunner().invoke(cli, ["plot", out, "--record", mt_id, "--output", "logprob", "-o", str(png)])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    if out.startswith("s3://"):  # the credentials are nowhere in the store
        for name, data in all_objects(out).items():
            assert ACCESS_KEY.encode() not in data and SECRET_KEY.encode() not in data, name


def test_another_job_on_the_store_is_refused(finished_at, store_place, mixed_fasta, tiny_dna):
    out = finished_at(store_place("mt.zarr"))
    res = CliRunner().invoke(cli, ["submit", str(mixed_fasta), "--model", str(tiny_dna), "--unit-size",
                                   str(UNIT), "--outputs", "logprob", "--out", out])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit)
    assert res.output.startswith("Error: ") and "another job" in res.output and out in res.output


# ----------------------------------------------------------------------------- the lease
def _job_id(fasta, model):
    return plan_here(fasta, model).job_id


def test_a_live_lease_refuses_a_second_driver_and_overwrite(finished_at, store_place, mixed_fasta, tiny_dna):
    """While another driver holds the job's lease, submit (with or without --overwrite) says
    `already running` with the owner and exits non-zero, and the store is untouched."""
    from linpipe.jobs.lease import Lease

    out = finished_at(store_place("mt.zarr"))
    before = store_arrays(out)
    holder = Lease(out, _job_id(mixed_fasta, tiny_dna), host="node-7", pid=4242)
    holder.acquire()
    try:
        for extra in ((), ("--overwrite",)):
            res = submit_cli(mixed_fasta, tiny_dna, out, *extra)
            assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
            assert res.output.startswith("Error: ") and len(res.output.strip().splitlines()) == 1
            assert "already running" in res.output and "pid 4242" in res.output and "node-7" in res.output
        assert holder.lost is None  # nobody took it
    finally:
        holder.release()
    assert_same_bytes(before, store_arrays(out))
    assert holder.read() is None  # released: the object is gone


def test_force_takeover_takes_a_live_lease(finished_at, store_place, mixed_fasta, tiny_dna):
    from linpipe.jobs.lease import Lease, LeaseLost

    out = finished_at(store_place("mt.zarr"))
    holder = Lease(out, _job_id(mixed_fasta, tiny_dna), host="node-7", pid=4242)
    holder.acquire()
    try:
        res = submit_cli(mixed_fasta, tiny_dna, out, "--force-takeover")
        assert res.exit_code == 0, res.output
        assert "Nothing to do" in res.output
        # the taker released its lease when it ended: the old holder's next beat finds a lease
        # that is not its own (or none) and gives up, never writing its lease back
        deadline = time.monotonic() + 30
        while holder.lost is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        holder.stop_heartbeat()
    with pytest.raises(LeaseLost):
        holder.check()
    assert holder.read() is None


def test_wait_follows_the_running_driver(finished_at, store_place, mixed_fasta, tiny_dna, monkeypatch):
    """--wait: while another driver holds the lease, submit waits (and says so); once that
    driver releases it, the submit goes on and finds the job complete. The holder releases
    only once the submit has said it waits, so the wait always happens."""
    import threading

    from linpipe.jobs.lease import Lease

    out = finished_at(store_place("mt.zarr"))
    holder = Lease(out, _job_id(mixed_fasta, tiny_dna), host="node-3", pid=77)
    holder.acquire()
    waiting = threading.Event()
    acquire = Lease.acquire

    def acquire_telling_us(self, *, on_wait=None, **kw):
        def waits(owner):
            on_wait(owner)
            waiting.set()
        return acquire(self, on_wait=waits, **kw)

    monkeypatch.setattr(Lease, "acquire", acquire_telling_us)

    def holder_ends():
        if waiting.wait(timeout=120):
            holder.release()

    ends = threading.Thread(target=holder_ends)
    ends.start()
    try:
        res = submit_cli(mixed_fasta, tiny_dna, out, "--wait")
        waited = waiting.is_set()
    finally:
        waiting.set()  # a submit that never waited: let the holder end too
        ends.join()
    assert waited and res.exit_code == 0, res.output
    assert "already running (driver pid 77 on node-3)" in res.output and "waiting" in res.output
    assert "Nothing to do" in res.output


def test_a_stale_lease_is_taken_over_after_its_expiry(finished_at, store_place, mixed_fasta, tiny_dna,
                                                      monkeypatch):
    """A driver on another host that stopped renewing (it died): refused up to the last moment
    its lease is live, taken over by the next submit from its expiry on. The lease clock is
    stepped to those moments, not waited for."""
    import linpipe.jobs.lease as lease_mod
    from linpipe.jobs.lease import Lease

    out = finished_at(store_place("mt.zarr"))
    dead = Lease(out, _job_id(mixed_fasta, tiny_dna), host="node-9", pid=99)
    dead.acquire()
    dead.stop_heartbeat()  # its process is gone: no more renewals, no release
    doc = dead.read()
    now = [doc["expires"] - 0.001]
    monkeypatch.setattr(lease_mod, "clock", lambda: now[0])
    res = submit_cli(mixed_fasta, tiny_dna, out)
    assert res.exit_code == 1 and "already running" in res.output and "node-9" in res.output, res.output
    assert dead.read() == doc  # the refused driver left the lease as it was
    now[0] = doc["expires"]
    res = submit_cli(mixed_fasta, tiny_dna, out)
    assert res.exit_code == 0, res.output
    assert "Nothing to do" in res.output
    assert dead.read() is None  # the taker released its own lease


def test_a_store_whose_creation_was_interrupted_is_laid_out_anew(store_place, mixed_fasta, tiny_dna,
                                                                   reference):
    """A driver SIGKILLed while create() laid the store out leaves the root group marked as
    being created (found by the chaos run: every resubmit then refused the store); the next
    driver's open_or_create_store (what submit calls) lays it out anew."""
    import zarr

    from linpipe.store import OutputStore
    from linpipe.store.layout import CREATING

    out = store_place("half.zarr")
    root = zarr.open_group(out, mode="w", zarr_format=3)
    root.attrs[CREATING] = True
    root.create_group("chrM").create_array("logprob", shape=(10,), dtype="float32")
    assert OutputStore.creation_interrupted(out)
    r = CliRunner().invoke(cli, ["inspect", out])
    assert r.exit_code == 1 and "creation of this output store was interrupted" in r.output
    run_units(mixed_fasta, tiny_dna, out)  # the driver's open_or_create_store, then every unit
    assert not OutputStore.creation_interrupted(out)
    assert_same_bytes(reference[0], store_arrays(out))


def test_drivers_racing_for_a_new_store_leave_exactly_one_owner(store_place, monkeypatch):
    """Eight drivers (on "other hosts", so none is judged dead) take the lease of a store that
    has none, all at once, with no settle time to hide the race: the conditional create lets
    exactly one hold it; every other one is refused naming that one."""
    import threading

    import linpipe.jobs.lease as lease_mod
    from linpipe.jobs.lease import AlreadyRunning, Lease

    monkeypatch.setattr(lease_mod, "SETTLE_S", 0.0)
    out = store_place("race.zarr")
    leases = [Lease(out, "lp-race", host=f"node-{i}", pid=1000 + i) for i in range(8)]
    start, results = threading.Barrier(len(leases)), {}

    def take(lease):
        start.wait()
        try:
            lease.acquire()
            results[lease.holder.host] = "owner"
        except AlreadyRunning as e:
            results[lease.holder.host] = e.owner["host"]

    threads = [threading.Thread(target=take, args=(le,)) for le in leases]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    owners = [h for h, r in results.items() if r == "owner"]
    assert len(results) == 8 and len(owners) == 1, results
    assert {r for r in results.values() if r != "owner"} == set(owners)
    assert leases[0].read()["host"] == owners[0]
    for le in leases:
        le.release()
    assert leases[0].read() is None


def test_a_lease_waits_to_settle_only_where_taking_it_is_not_exclusive(store_place, monkeypatch):
    """A new local store's lease is a hard link, which only one driver can make: it is taken
    without the settling wait. An object store's conditional PUT may be ignored by its server,
    and an overwritten lease (its owner gone) is a plain write anywhere: both wait, then read
    the lease again."""
    import linpipe.jobs.lease as lease_mod
    from linpipe.jobs.lease import Lease

    settle = 0.0123
    monkeypatch.setattr(lease_mod, "SETTLE_S", settle)
    waits = []
    real_sleep = time.sleep
    monkeypatch.setattr(lease_mod.time, "sleep", lambda s: waits.append(s) or real_sleep(s))
    out = store_place("settle.zarr")
    local = "://" not in out
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    first = Lease(out, "lp-settle", pid=int(proc.stdout))  # a process of this host, since exited
    first.acquire()
    assert waits.count(settle) == (0 if local else 1)
    first.stop_heartbeat()
    waits.clear()
    second = Lease(out, "lp-settle")  # takes over the exited process's lease: a plain write
    second.acquire()
    assert waits.count(settle) == 1 and second.read()["token"] == second.token
    second.release()
    assert second.read() is None


def test_lease_of_a_dead_process_on_this_host_needs_no_expiry(finished_at, store_place, mixed_fasta,
                                                              tiny_dna):
    from linpipe.jobs.lease import Lease

    out = finished_at(store_place("mt.zarr"))
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    gone = Lease(out, _job_id(mixed_fasta, tiny_dna), pid=int(proc.stdout))  # this host, exited pid
    gone.acquire()
    gone.stop_heartbeat()
    assert gone.read()["expires"] > time.time() + 0.5
    res = submit_cli(mixed_fasta, tiny_dna, out)
    assert res.exit_code == 0, res.output
    assert "Nothing to do" in res.output


def test_a_lease_alone_is_not_a_store(store_place, mixed_fasta, tiny_dna):
    """The lease is taken before the store exists: a location holding only a lease counts as
    empty, and creating the store keeps the creator's lease."""
    from linpipe.jobs.lease import Lease
    from linpipe.store import OutputStore

    out = store_place("new.zarr")
    mine = Lease(out, _job_id(mixed_fasta, tiny_dna))
    mine.acquire()
    try:
        assert not OutputStore.exists(out)
        run_units(mixed_fasta, tiny_dna, out, stop_after=1)
        assert OutputStore.exists(out)
        assert mine.read()["token"] == mine.token
    finally:
        mine.release()
    assert mine.read() is None


# ----------------------------------------------------------------------------- retries
def _faulty_stores(monkeypatch, tmp_path, error: str, failures: int, **match):
    """Every URL store the worker's writing process opens fails its first `failures` writes of
    each key that `match` picks (contains=..., prefix=...) with the error named (tests/
    _faulty_writer.py): a fault below linpipe's retrying layer. Returns a function that counts
    the attempts per key so far."""
    import _faulty_writer

    from linpipe.jobs.write_process import WriteProcess

    attempts = tmp_path / "attempts"
    monkeypatch.setenv(_faulty_writer.FAULTS_ENV, json.dumps({"error": error, "failures": failures,
                                                              "attempts": str(attempts), **match}))
    monkeypatch.setattr(WriteProcess, "command", (
        sys.executable, "-c", f"import sys; sys.path[0] = {str(TESTS)!r}; "
                              "from _faulty_writer import main; main()"))

    def counts() -> dict[str, int]:
        keys = attempts.read_text().split() if attempts.exists() else []
        return {k: keys.count(k) for k in dict.fromkeys(keys)}
    return counts


@pytest.mark.slow
def test_throttled_writes_are_retried_and_the_store_is_bit_identical(s3_server, mixed_fasta, tiny_dna,
                                                                     reference, monkeypatch, tmp_path):
    import linpipe.store.retry as retry

    monkeypatch.setenv("LINPIPE_STORE_RETRY_BASE_S", "0.01")  # the writing process reads it at its start
    monkeypatch.setattr(retry, "BASE_DELAY_S", 0.01)
    out = f"{s3_server.new_bucket()}/throttled.zarr"
    # every chunk: outputs, table, boundary states, completion markers
    counts = _faulty_stores(monkeypatch, tmp_path, "slow_down", 2, contains="/c/")
    run_units(mixed_fasta, tiny_dna, out)
    attempts = counts()
    assert any(k.startswith("_linpipe/") and "/done/" in k for k in attempts)  # markers too
    assert attempts and all(n >= 3 for n in attempts.values())  # two SlowDowns, then the write
    monkeypatch.undo()
    assert_same_bytes(reference[0], store_arrays(out))


@pytest.mark.slow
def test_a_permanent_error_is_not_retried_and_leaves_the_unit_unmarked(s3_server, mixed_fasta, tiny_dna,
                                                                        monkeypatch, tmp_path):
    from linpipe.jobs.errors import worker_error
    from linpipe.store import OutputStore

    out = f"{s3_server.new_bucket()}/denied.zarr"
    run_units(mixed_fasta, tiny_dna, out, stop_after=0)  # the store, laid out
    store = OutputStore.open(out, mode="r")
    mt = next(k for k in store.long_records)

    counts = _faulty_stores(monkeypatch, tmp_path, "denied", 10**6, prefix=f"{mt}/logprob/c/")
    with pytest.raises(PermissionError) as caught:
        run_units(mixed_fasta, tiny_dna, out, stop_after=1)
    assert list(counts().values()) == [1]  # one attempt, no retry
    monkeypatch.undo()
    assert OutputStore.open(out, mode="r").completed_units(mt) == set()
    line = str(worker_error(caught.value, f"record {mt!r} positions 0-{UNIT}"))
    assert "\n" not in line and f"{mt}/logprob/c/0" in line and "Access Denied" in line


def test_transient_errors_are_told_from_permanent_ones():
    from _faulty_writer import slow_down_error

    from linpipe.store.retry import TransientStoreError, is_transient

    assert is_transient(slow_down_error("k"))
    assert is_transient(TimeoutError("read timed out"))
    assert is_transient(ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"))
    assert is_transient(TransientStoreError("injected"))
    assert not is_transient(PermissionError(errno.EACCES, "Access Denied"))
    assert not is_transient(FileNotFoundError(errno.ENOENT, "NoSuchBucket"))
    assert not is_transient(ValueError("bad request"))


@pytest.mark.slow  # the moto server's start
def test_s3fs_reads_the_endpoint_from_the_environment(s3_server):
    """AWS_ENDPOINT_URL (what the tests set) and fsspec's FSSPEC_S3_ENDPOINT_URL both point s3fs
    at a MinIO-like server, with no storage options in linpipe's calls."""
    import fsspec
    from _s3 import clear_fsspec_cache

    bucket = s3_server.new_bucket()
    clear_fsspec_cache()
    fs, path = fsspec.core.url_to_fs(f"{bucket}/probe")
    fs.pipe_file(path, b"x")
    assert fs.cat_file(path) == b"x"
    code = (f"import fsspec; fs, p = fsspec.core.url_to_fs('{bucket}/probe'); "
            "print(fs.cat_file(p).decode())")
    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"}
    env["FSSPEC_S3_ENDPOINT_URL"] = s3_server.endpoint
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "x", res.stderr


def test_a_forced_takeover_wins_over_a_renewal_that_straddles_its_write(store_place, quick_lease):
    """The live holder renews its lease across the taker's write (it reads its own lease just
    before, and writes it back just after): the taker's re-read finds the holder's lease, writes
    its own again and holds the lease; the holder's next renewal sees it and gives up."""
    import threading

    from linpipe.jobs.lease import Lease

    out = store_place("straddle.zarr")
    holder = Lease(out, "lp-straddle", host="node-7", pid=4242)
    holder.acquire()
    taker = Lease(out, "lp-straddle")
    holder_read, taker_wrote = threading.Event(), threading.Event()
    holder_write, taker_write = holder._write, taker._write

    def renewal_after_the_takers_write():  # the holder's next renewal: it has read its own lease
        holder._write = holder_write
        holder_read.set()
        taker_wrote.wait(10)
        holder_write()

    def takers_write():
        taker_write()
        taker_wrote.set()
        time.sleep(0.05)  # the holder's write lands before the taker's re-read

    holder._write = renewal_after_the_takers_write
    taker._write = takers_write
    try:
        assert holder_read.wait(10)
        taker.acquire(force=True)
        assert taker.read()["token"] == taker.token
        deadline = time.monotonic() + 10
        while holder.lost is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert holder.lost is not None and holder.lost["token"] == taker.token
        assert taker.read()["token"] == taker.token  # the holder never wrote its lease back
    finally:
        holder.stop_heartbeat()
        taker.release()
    assert taker.read() is None
