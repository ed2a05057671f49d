"""The worker's writing process (jobs/write_process.py): a worker's units are written by a child
process of its own. On real genome pieces: a write that fails there raises the store's own
one-line error in the call; a writing process killed mid-job fails the next call in one line,
marks nothing it did not finish, and the job resumes bit-identical; the child ends with its
worker, whether the worker is closed, dropped, or SIGKILLed.
"""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from _pipeline_data import CONTIG_UNIT as UNIT
from _pipeline_data import (
    assert_same_bytes,
    process_gone,
    store_arrays,
    write_in_process,
)
from _worker_calls import job_calls, worker_of

from linpipe.errors import StoreError


def test_a_write_that_fails_in_the_writing_process_raises_the_stores_own_error(
        worker_job, tmp_path, one_torch_thread):
    tiny, fasta, _ = worker_job
    plan, store, w = worker_of(fasta, tiny, tmp_path / "o.zarr")
    try:
        used = int(store.packed.batch_positions(0))
        wrong = {"logprob": np.zeros(used + 1, np.float32), "entropy": np.zeros(used, np.float32),
                 "softmask": np.zeros(used, np.uint8)}
        for batch, arrays in ((0, wrong), (plan.packed.n_batches, wrong)):
            with pytest.raises(StoreError) as here:
                store.write_batch(batch, arrays)  # what the store says in this process
            with pytest.raises(StoreError) as there:
                w.writes.write_batch(batch, arrays)
            assert str(there.value) == str(here.value) and "\n" not in str(there.value)
        assert not store.batches_done().any()
        w.run_batch(0, plan.batch_units(0))  # the writing process goes on after an error
        assert store.batches_done()[0]
        assert w.writes.child_rss > 20 * 2**20  # a Python process with numpy and zarr
    finally:
        w.close()


@pytest.mark.slow  # a writing process killed or left behind and waited for
def test_a_killed_writing_process_fails_the_call_in_one_line_and_the_job_resumes_bit_identical(
        worker_job, tmp_path, one_torch_thread):
    from linpipe.jobs.driver import Batch, work_left

    tiny, fasta, _ = worker_job
    out = tmp_path / "killed.zarr"
    plan, store, w = worker_of(fasta, tiny, out)
    rec = plan.streams[0]
    first = w.run_unit(rec.unit(0))
    assert first.peak_rss > w.writes.child_rss > 0  # the worker's memory counts its writing process's
    os.kill(w.writes.pid, signal.SIGKILL)
    assert process_gone(w.writes.pid)
    for _ in range(2):  # this call and every one after it
        with pytest.raises(StoreError) as err:
            w.run_unit(rec.unit(1))
        msg = str(err.value)
        assert "\n" not in msg and str(out) in msg and f"writing process (pid {w.writes.pid})" in msg
        assert f"killed by signal {int(signal.SIGKILL)}" in msg and "submit again to resume" in msg
    assert store.completed_units(rec.key) == {0}
    w.close()

    plan, store, w = worker_of(fasta, tiny, out)  # the resume
    todo, _ = work_left(plan, store)
    for item in todo:
        if isinstance(item, Batch):
            w.run_batch(item.index, plan.batch_units(item.index))
        else:
            r = item.record
            for i in range(item.next, r.n_units):
                w.run_unit(r.unit(i), last=i == r.n_units - 1)
    w.close()
    assert store.finalize()
    write_in_process(fasta, tiny, tmp_path / "reference.zarr", unit_size=plan.unit_size)
    assert_same_bytes(store_arrays(tmp_path / "reference.zarr"), store_arrays(out))


@pytest.mark.slow  # a writing process killed or left behind and waited for
def test_the_writing_process_ends_with_its_worker(worker_job, tmp_path, one_torch_thread):
    tiny, fasta, _ = worker_job
    _, _, w = worker_of(fasta, tiny, tmp_path / "closed.zarr")
    pid = w.writes.pid
    w.close()
    assert process_gone(pid, timeout=0)  # close() waits for it
    with pytest.raises(StoreError, match="the worker is closed"):
        w.writes.write_batch(0, {})

    plan, _, w = worker_of(fasta, tiny, tmp_path / "dropped.zarr")
    w.run_unit(plan.streams[0].unit(0))  # the model's thread has run a call of the worker's
    w.run_batch(0, plan.batch_units(0))
    pid = w.writes.pid
    del w
    gc.collect()
    assert process_gone(pid)  # a worker dropped without close()

    pid_file = tmp_path / "pid"
    script = (f"import sys, time; sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
              f"from _worker_calls import worker_of\n"
              f"_, _, w = worker_of({str(fasta)!r}, {str(tiny)!r}, {str(tmp_path / 'killed.zarr')!r})\n"
              f"open({str(pid_file)!r}, 'w').write(str(w.writes.pid))\n"
              f"time.sleep(120)\n")
    worker = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.time() + 120
    while not (pid_file.exists() and pid_file.read_text()):
        assert worker.poll() is None and time.time() < deadline
        time.sleep(0.05)
    worker.send_signal(signal.SIGKILL)  # the worker dies; its writing process is not left behind
    assert worker.wait(timeout=30) == -signal.SIGKILL
    assert process_gone(int(pid_file.read_text()))


def test_a_worker_whose_model_does_not_load_leaves_no_writing_process(worker_job, tmp_path, monkeypatch):
    """The writing process starts before the model loads (its imports run meanwhile); a model
    that fails to load raises its own error and the child is gone."""
    import shutil

    from linpipe.errors import ModelError
    from linpipe.jobs import actor

    tiny, fasta, _ = worker_job
    worker_of(fasta, tiny, tmp_path / "o.zarr")[2].close()  # the store, laid out
    broken = tmp_path / "broken"
    shutil.copytree(tiny, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    started = []

    class Recorded(actor.WriteProcess):
        def __init__(self, *args):
            super().__init__(*args)
            started.append(self.pid)

    monkeypatch.setattr(actor, "WriteProcess", Recorded)
    with pytest.raises(ModelError, match="model.safetensors"):
        actor.PipelineWorker(str(broken), str(tmp_path / "o.zarr"), ["logprob"], device="cpu", threads=1)
    assert len(started) == 1 and process_gone(started[0], timeout=0)


def test_the_writing_process_does_not_import_torch(worker_job, tmp_path):
    """It opens the store and writes, nothing more: started beside the model's load, it must not
    take seconds of CPU importing torch (`linpipe.model` imports its modules on first use)."""
    tiny, fasta, _ = worker_job
    worker_of(fasta, tiny, tmp_path / "o.zarr")[2].close()  # the store, laid out
    code = ("import sys; from linpipe.store import OutputStore; "
            f"OutputStore.open({str(tmp_path / 'o.zarr')!r}, mode='r+'); "
            "import linpipe.jobs.write_process; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "[]"


@pytest.mark.parametrize("shared", [True, pytest.param(False, marks=pytest.mark.slow)],
                         ids=["shared-memory", "socket"])  # the socket: macOS's path
def test_both_strands_written_through_either_path_are_the_bytes_of_a_reference_run(
        worker_job, tmp_path, monkeypatch, shared, one_torch_thread):
    """The arrays reach the writing process through shared memory (Linux) or, where there is
    none, through the socket: the store is the same bytes either way (reverse-strand arrays are
    views read backwards, the soft-mask uint8, the boundary states a dict of arrays)."""

    from linpipe.jobs.write_process import WriteProcess

    tiny, fasta, _ = worker_job
    write_in_process(fasta, tiny, tmp_path / "reference.zarr", unit_size=UNIT, strand="both")
    monkeypatch.setattr(WriteProcess, "shared", shared)
    out = tmp_path / "o.zarr"
    plan, store, w = worker_of(fasta, tiny, out, strand="both")
    for name, args, kw in job_calls(plan):
        getattr(w, name)(*args, **kw)
    w.close()
    assert store.finalize()
    assert_same_bytes(store_arrays(tmp_path / "reference.zarr"), store_arrays(out))


def test_shared_buffers_are_reused_and_a_small_one_makes_way_for_a_larger():
    from linpipe.jobs.write_process import _Buffers

    if not hasattr(os, "memfd_create"):
        pytest.skip("no memfd here: arrays go through the socket")
    pool = _Buffers()
    a, fd = pool.take(1000)
    assert fd is not None and a.size == _Buffers.STEP
    os.close(fd)
    pool.give(a)
    again, fd = pool.take(5000)
    assert again is a and fd is None  # reused: the child has it already
    pool.give(a)
    big, fd = pool.take(3 * _Buffers.STEP + 1)
    os.close(fd)
    assert big.size == 4 * _Buffers.STEP and pool.forget() == [a.id] and pool.forget() == []
    assert a.memory.closed
    pool.give(big)
    pool.close()
    assert big.memory.closed


# --------------------------------------------------------------------- a worker its driver left behind
def test_a_worker_left_by_a_killed_driver_writes_nothing_into_a_store_taken_over(
        worker_job, tmp_path, one_torch_thread):
    """A driver killed with SIGKILL leaves its workers running for a few seconds, and on the same
    host another driver takes the lease at once (its owner's pid is gone) and, with --overwrite,
    lays out a new store in the same place. The left-over worker's next unit and batch are
    refused in one line before any byte is written: the new store holds none of them."""
    from linpipe.jobs.actor import PipelineWorker
    from linpipe.jobs.driver import open_or_create_store
    from linpipe.jobs.lease import Lease, LeaseLost
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest
    from linpipe.store import OutputStore

    tiny, fasta, _ = worker_job
    out = str(tmp_path / "o.zarr")

    def planned(outputs):
        return plan_job(JobRequest(inputs=(str(fasta),), model=str(tiny), unit_size=UNIT, outputs=outputs))

    plan = planned(("logprob", "entropy", "softmask"))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # the first driver's pid: a process of this host that no longer exists
    first = Lease(out, plan.job_id, pid=gone.pid)
    first.acquire()
    first.stop_heartbeat()  # killed: it renews no more
    store = open_or_create_store(plan, out)
    w = PipelineWorker(plan.model_ref, out, list(plan.outputs), device="cpu", threads=1,
                       input_options=plan.input_options, lease_token=first.token)
    try:
        rec = plan.streams[0]
        w.run_unit(rec.unit(0))  # its job holds the lease: written
        assert store.completed_units(rec.key) == {0}

        other = planned(("logprob", "entropy"))  # another job on the same out, with --overwrite
        second = Lease(out, other.job_id)
        second.acquire()  # at once: the first driver's process is gone
        try:
            open_or_create_store(other, out, overwrite=True)
            for call in (lambda: w.run_unit(rec.unit(1)), lambda: w.run_batch(0, plan.batch_units(0))):
                with pytest.raises(LeaseLost) as e:
                    call()
                msg = str(e.value)
                assert "\n" not in msg and out in msg and other.job_id in msg and "not written" in msg
            new = OutputStore.open(out, mode="r")
            assert new.meta["job_id"] == other.job_id
            assert all(not new.completed_units(r.key) for r in other.streams) and not new.batches_done().any()
            # not a byte: no chunk of any output, a record's or the packed group's, in the new store
            root = tmp_path / "o.zarr"
            keys = [r.key for r in other.streams] + ["_packed"]
            assert not [c for key in keys for name in ("logprob", "entropy", "softmask")
                        for c in root.glob(f"{key}/{name}/c/*")]
        finally:
            second.release()
    finally:
        w.close()


def test_a_unit_whose_guard_fails_before_its_marker_is_not_marked_done(
        worker_job, tmp_path, one_torch_thread):
    """The store's guard runs before a unit's first write and again before its marker: a lease
    lost between the two leaves the unit's data unmarked, and a later write completes it."""
    from linpipe.inputs import open_input
    from linpipe.jobs.lease import LeaseLost

    tiny, fasta, _ = worker_job
    plan, store, w = worker_of(fasta, tiny, tmp_path / "o.zarr")
    w.close()
    rec = plan.streams[0]
    start, end = store.unit_range(rec.key, 0)
    x, soft = open_input(str(fasta)).read(rec.id, start, end)
    arrays = {"logprob": np.full(end - start, -1.0, np.float32), "entropy": np.ones(end - start, np.float32),
              "softmask": soft.astype(np.uint8)}
    calls = []

    def lost_on(n):
        def guard():
            calls.append(n)
            if len(calls) == n:
                raise LeaseLost("lease lost")
        return guard

    with pytest.raises(LeaseLost):
        store.write_unit(rec.key, 0, arrays, guard=lost_on(1))
    assert calls == [1] and not list((tmp_path / "o.zarr" / rec.key / "logprob" / "c").glob("*"))
    calls.clear()
    with pytest.raises(LeaseLost):
        store.write_unit(rec.key, 0, arrays, guard=lost_on(2))
    assert calls == [2, 2] and store.completed_units(rec.key) == set()
    assert list((tmp_path / "o.zarr" / rec.key / "logprob" / "c").glob("*"))  # its data, unmarked
    store.write_unit(rec.key, 0, arrays)
    assert store.completed_units(rec.key) == {0}
    np.testing.assert_array_equal(store.array(rec.key, "logprob")[start:end], arrays["logprob"])
