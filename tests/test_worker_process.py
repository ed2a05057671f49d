"""A worker actor's own process (jobs/worker_process.py): the relay that Ray runs starts a child
that builds the PipelineWorker and runs its calls. On real genome pieces, in this process (the
relay as Ray runs it, without Ray): the store its calls write, side by side and numbered as the
driver sends them, is the bytes of the worker run here, written by the relay's own process (no
writing process is started); a call's error comes back with its own type and message, and the
calls after it go on; a worker that cannot start raises its own error from the relay's start;
close() ends the child and the relay's writes. (On Ray, the actor and
its child killed mid-record: tests/test_pipeline_cluster.py.)
"""
from __future__ import annotations

import os

import pytest
from _pipeline_data import CONTIG_UNIT as UNIT
from _pipeline_data import (
    assert_same_bytes,
    child_processes,
    process_gone,
    store_arrays,
    write_in_process,
)
from _worker_calls import job_calls, run_overlapped

from linpipe.errors import StoreError
from linpipe.jobs.worker_process import WorkerRelay

OUTPUTS = ("logprob", "entropy", "softmask")


def _relay(fasta, model, out):
    from linpipe.jobs.driver import open_or_create_store
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    plan = plan_job(JobRequest(inputs=(str(fasta),), model=str(model), unit_size=UNIT, outputs=OUTPUTS))
    store = open_or_create_store(plan, str(out))
    relay = WorkerRelay(plan.model_ref, str(out), list(plan.outputs), device="cpu", threads=1,
                        input_options=plan.input_options)
    return plan, store, relay


@pytest.mark.slow  # a worker in a child process (test_child.py: quick)
def test_a_relays_calls_write_the_bytes_of_the_worker_run_here_with_no_writing_process(
        worker_job, tmp_path, one_torch_thread):
    """The worker in a plain process writes through a writing process of its own; under the
    relay it starts none (the child is the relay's only process, and has none of its own): the
    relay serves the writes on a thread, and the store is the same bytes."""
    import threading

    tiny, fasta, _ = worker_job
    write_in_process(fasta, tiny, tmp_path / "here.zarr", unit_size=UNIT, outputs=OUTPUTS)
    before = child_processes(os.getpid())
    plan, store, relay = _relay(fasta, tiny, tmp_path / "relayed.zarr")
    (child,) = set(child_processes(os.getpid())) - set(before)
    assert child_processes(os.getpid(), b"linpipe.jobs.worker_process") == [child]
    assert child_processes(child) == []
    assert relay.writer in threading.enumerate()
    try:
        calls = job_calls(plan)
        assert relay.ready() == relay.node and relay.node.endswith(f":{os.getpid()}")
        results = []
        for first in range(0, len(calls), 3):  # three calls in flight, started out of order
            group = calls[first:first + 3]
            results += run_overlapped(relay, group, list(reversed(range(len(group)))), first)
        assert [r.positions for r in results] == [c[1][0].positions if c[0] == "run_unit"
                                                 else sum(u.positions for u in c[1][1]) for c in calls]
        # named after this process; its memory counts the child's and this one's (the writes')
        assert {r.node for r in results} == {relay.node}
        assert relay.peak_rss() >= max(r.peak_rss for r in results) > 200 * 2**20
        assert child_processes(child) == []  # still no writing process, every unit written
    finally:
        relay.close()
    assert process_gone(child, timeout=10) and not relay.writer.is_alive()
    assert store.finalize()
    assert_same_bytes(store_arrays(tmp_path / "here.zarr"), store_arrays(tmp_path / "relayed.zarr"))


@pytest.mark.slow  # a worker in a child process (test_child.py: quick)
def test_a_calls_error_comes_back_with_its_type_and_the_relay_goes_on(worker_job, tmp_path, one_torch_thread):
    tiny, fasta, _ = worker_job
    plan, store, relay = _relay(fasta, tiny, tmp_path / "o.zarr")
    try:
        rec = plan.streams[0]
        with pytest.raises(StoreError) as e:  # unit 2's state comes from unit 1, not written
            relay.run_unit(rec.unit(2))
        msg = str(e.value)
        assert f"record {rec.id!r}, unit 2" in msg and "not in the store" in msg and "\n" not in msg
        relay.run_unit(rec.unit(0))
        assert store.completed_units(rec.key) == {0}
    finally:
        relay.close()


@pytest.mark.slow  # a worker in a child process (test_child.py: quick)
def test_a_worker_that_cannot_start_raises_its_own_error_from_the_relays_start(worker_job, tmp_path):
    """The model folder is gone: the relay's start raises the error PipelineWorker raises here,
    and leaves no process behind."""
    from linpipe.jobs.actor import PipelineWorker

    tiny, fasta, _ = worker_job
    _relay(fasta, tiny, tmp_path / "o.zarr")[2].close()  # a store laid out, the model then gone
    gone = str(tmp_path / "no_model")
    out = str(tmp_path / "o.zarr")
    with pytest.raises(Exception) as here:
        PipelineWorker(gone, out, None, device="cpu", threads=1)
    with pytest.raises(type(here.value)) as there:
        WorkerRelay(gone, out, None, device="cpu", threads=1)
    assert str(there.value) == str(here.value) and gone in str(there.value)
    assert not child_processes(os.getpid(), b"linpipe.jobs.worker_process")


@pytest.mark.parametrize("end, how", [("sys.exit(3)", "exited with code 3"),
                                      ("os.kill(os.getpid(), 9)", "was killed by signal 9")])
def test_a_child_that_ends_before_its_worker_starts_is_the_workers_start_error(
        monkeypatch, tmp_path, end, how):
    """The child ends before it answers (as one killed for memory while loading the model): the
    actor's first call raises a WorkerStartError saying how the child ended, and this process
    (the actor's, on Ray) goes on."""
    import sys

    from linpipe.jobs.errors import WorkerStartError
    from linpipe.jobs.worker_process import worker_actor

    monkeypatch.setattr(WorkerRelay, "command", (sys.executable, "-c", f"import os, sys; {end}"))
    actor = worker_actor()(str(tmp_path / "model"), str(tmp_path / "o.zarr"), None, device="cpu", threads=1)
    with pytest.raises(WorkerStartError) as e:
        actor.ready()
    msg = str(e.value)
    assert "a worker could not start" in msg and how in msg and "before its worker started" in msg
    assert "\n" not in msg


def test_the_relays_module_imports_none_of_the_workers_modules():
    """Ray imports the actor's module before its __init__: the relay's module imports neither
    torch nor the worker's modules, which the relay then imports while its child starts."""
    import subprocess
    import sys

    heavy = ("torch", "numpy", "zarr", "linpipe.jobs.actor", "linpipe.jobs.plan", "linpipe.store")
    code = f"import sys, linpipe.jobs.worker_process; print(*[m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.split() == []
