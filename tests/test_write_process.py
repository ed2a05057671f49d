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
from test_overlap import _worker

from linpipe.errors import StoreError


def test_a_write_that_fails_in_the_writing_process_raises_the_stores_own_error(
        worker_job, tmp_path, one_torch_thread):
    tiny, fasta, _ = worker_job
    plan, store, w = _worker(fasta, tiny, tmp_path / "o.zarr")
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


def test_a_killed_writing_process_fails_the_call_in_one_line_and_the_job_resumes_bit_identical(
        worker_job, tmp_path, one_torch_thread):
    from linpipe.jobs.driver import Batch, work_left

    tiny, fasta, _ = worker_job
    out = tmp_path / "killed.zarr"
    plan, store, w = _worker(fasta, tiny, out)
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

    plan, store, w = _worker(fasta, tiny, out)  # the resume
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


def test_the_writing_process_ends_with_its_worker(worker_job, tmp_path, one_torch_thread):
    tiny, fasta, _ = worker_job
    _, _, w = _worker(fasta, tiny, tmp_path / "closed.zarr")
    pid = w.writes.pid
    w.close()
    assert process_gone(pid, timeout=0)  # close() waits for it
    with pytest.raises(StoreError, match="the worker is closed"):
        w.writes.write_batch(0, {})

    plan, _, w = _worker(fasta, tiny, tmp_path / "dropped.zarr")
    w.run_unit(plan.streams[0].unit(0))  # the model's thread has run a call of the worker's
    w.run_batch(0, plan.batch_units(0))
    pid = w.writes.pid
    del w
    gc.collect()
    assert process_gone(pid)  # a worker dropped without close()

    pid_file = tmp_path / "pid"
    script = (f"import sys, time; sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
              f"from test_overlap import _worker\n"
              f"_, _, w = _worker({str(fasta)!r}, {str(tiny)!r}, {str(tmp_path / 'killed.zarr')!r})\n"
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
    _worker(fasta, tiny, tmp_path / "o.zarr")[2].close()  # the store, laid out
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
    _worker(fasta, tiny, tmp_path / "o.zarr")[2].close()  # the store, laid out
    code = ("import sys; from linpipe.store import OutputStore; "
            f"OutputStore.open({str(tmp_path / 'o.zarr')!r}, mode='r+'); "
            "import linpipe.jobs.write_process; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "[]"


@pytest.mark.parametrize("shared", [True, False], ids=["shared-memory", "socket"])
def test_both_strands_written_through_either_path_are_the_bytes_of_a_reference_run(
        worker_job, tmp_path, monkeypatch, shared, one_torch_thread):
    """The arrays reach the writing process through shared memory (Linux) or, where there is
    none, through the socket: the store is the same bytes either way (reverse-strand arrays are
    views read backwards, the soft-mask uint8, the boundary states a dict of arrays)."""
    from test_overlap import _calls

    from linpipe.jobs.write_process import WriteProcess

    tiny, fasta, _ = worker_job
    write_in_process(fasta, tiny, tmp_path / "reference.zarr", unit_size=UNIT, strand="both")
    monkeypatch.setattr(WriteProcess, "shared", shared)
    out = tmp_path / "o.zarr"
    plan, store, w = _worker(fasta, tiny, out, strand="both")
    for name, args, kw in _calls(plan):
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
