"""The worker's overlap (jobs/overlap.py): calls run side by side in threads, as Ray runs an
actor's IN_FLIGHT calls, read and model in the driver's order, writes beside them. On real
genome pieces: the store they write is the bytes of the units run one by one, whatever order
the threads start in; a call that fails lets the later ones go on; a worker killed while its
writes are in flight leaves only durable units marked done, and a resume gives the same bytes.
"""
from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from _pipeline_data import CONTIG_UNIT as UNIT
from _pipeline_data import (
    assert_same_bytes,
    process_gone,
    store_arrays,
    write_in_process,
)
from _store_data import kill_at_hook
from _worker_calls import job_calls, run_overlapped, worker_of

from linpipe.jobs.overlap import HostCopies, ModelThread, Turns, cast
from linpipe.strands import FORWARD, REVERSE


def test_turns_go_in_the_callers_numbers_whatever_order_they_arrive():
    turns, ran = Turns(), []
    threads = [threading.Thread(target=lambda i=i: _take(turns, i, ran)) for i in (4, 2, 0, 3, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert ran == [0, 1, 2, 3, 4]
    with turns.turn(None):  # a caller of its own goes when the turn is free
        ran.append("own")
    with turns.turn(5):  # a call whose read failed: its turn ends, and the next goes
        pass
    with turns.turn(6):
        ran.append(6)
    assert ran[-2:] == ["own", 6]


def test_the_model_thread_runs_calls_on_one_thread_in_their_numbers_order():
    """Calls submitted out of order run in order, all on the one model thread; a number that is
    skipped (its read failed) or whose step raises lets the later ones go on; unnumbered calls
    run in the order they came."""
    mt, ran = ModelThread(), []
    gate = threading.Event()

    def step(i):
        gate.wait(10)  # everything is queued before the first step runs
        ran.append((i, threading.current_thread().name))
        if i == 3:
            raise ValueError("step 3 failed")
        return i * 10

    try:
        futures = {i: mt.submit(i, step, i) for i in (4, 2, 0, 3)}
        mt.skip(1)
        futures["own"] = mt.submit(None, step, "own")
        gate.set()
        assert futures[0].result(10)[0] == 0
        assert futures[4].result(10)[0] == 40
        with pytest.raises(ValueError, match="step 3 failed"):
            futures[3].result(10)
        assert futures["own"].result(10)[0] == "own" * 10
        got, start, end = futures[2].result(10)
        assert got == 20 and start <= end
        order = [i for i, _ in ran if i != "own"]
        assert order == [0, 2, 3, 4]
        assert {name for _, name in ran} == {"linpipe-model"}
    finally:
        mt.close()
    with pytest.raises(RuntimeError, match="closed"):
        mt.submit(5, step, 5)


def _take(turns, i, ran):
    with turns.turn(i):
        ran.append(i)


@pytest.mark.parametrize("strand", ["forward", pytest.param("both", marks=pytest.mark.slow)])
def test_overlapped_calls_write_the_bytes_of_calls_run_one_by_one(
        worker_job, tmp_path, strand, one_torch_thread, monkeypatch):
    """Started last first, the calls still meet the model one at a time in the driver's order,
    on the model's one thread, and write what a serial run writes."""
    tiny, fasta, _ = worker_job
    write_in_process(fasta, tiny, tmp_path / "serial.zarr", unit_size=UNIT, strand=strand)
    plan, store, w = worker_of(fasta, tiny, tmp_path / "overlapped.zarr", strand=strand)
    calls = job_calls(plan)
    assert len(plan.streams) >= 4 and plan.packed.n_batches >= 4
    model_ran, submit = [], ModelThread.submit

    def submit_noted(self, seq, fn, arg):
        def noted(a):
            model_ran.append((seq, threading.current_thread().name))
            return fn(a)
        return submit(self, seq, noted, arg)

    monkeypatch.setattr(ModelThread, "submit", submit_noted)
    order = list(range(len(calls)))[::-1]  # the last first: each waits for its turn
    results = run_overlapped(w, calls, order)
    assert model_ran == [(i, "linpipe-model") for i in range(len(calls))]
    assert sum(r.positions for r in results) == sum(r.length for r in plan.streams) + sum(
        plan.packed.batch_positions(b) for b in range(plan.packed.n_batches))
    assert store.finalize()
    assert_same_bytes(store_arrays(tmp_path / "serial.zarr"), store_arrays(tmp_path / "overlapped.zarr"))


def test_a_call_that_fails_lets_the_later_calls_go_on(worker_job, tmp_path, one_torch_thread):
    """A unit whose input vanished fails alone: the later calls (another record's units, the
    packed batches) still take their turns and are written; the failed record's are not."""
    import shutil

    from linpipe.errors import InputError

    tiny, fasta, _ = worker_job
    plan, store, w = worker_of(fasta, tiny, tmp_path / "o.zarr")
    calls = job_calls(plan)
    first = plan.streams[0]
    gone = first.unit(0).input_path
    moved = tmp_path / "moved.fa"
    shutil.move(gone, moved)  # the first call reads a vanished input
    w._inputs.clear()
    try:
        with ThreadPoolExecutor(len(calls)) as pool:
            head = pool.submit(w.run_unit, first.unit(0), seq=0)
            with pytest.raises(InputError, match="vanished"):
                head.result(timeout=60)
    finally:
        shutil.move(moved, gone)
    rest = run_overlapped(w, calls, range(len(calls)), first=1)  # the calls after the failed one
    assert len(rest) == len(calls)
    assert all(len(store.completed_units(r.key)) == r.n_units for r in plan.streams)


def test_packed_inputs_open_while_the_model_loads_and_are_checked_when_read(
        worker_job, tmp_path, one_torch_thread):
    """The packed records' input is opened beside the model's load (its index read then, not in
    the first batch's read); it is still checked at every read: changed since it was opened,
    the batch fails with the one-line error, and a worker started after the change runs it."""
    import shutil

    from linpipe.errors import InputError

    tiny, fasta, _ = worker_job
    copy = tmp_path / "contigs.fa"
    shutil.copy(fasta, copy)
    plan, store, w = worker_of(copy, tiny, tmp_path / "o.zarr")
    units = plan.batch_units(0)
    assert set(w._opening) == {units[0].input_path}  # the very path the batches read
    w._opening[units[0].input_path].result(timeout=60)  # opened
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(InputError, match=r"contigs\.fa: the input changed mid-job"):
        w.run_batch(0, units)
    w.close()
    _, _, fresh = worker_of(copy, tiny, tmp_path / "o.zarr")
    r = fresh.run_batch(0, units)
    assert r.positions == plan.packed.batch_positions(0) and store.batches_done()[0]
    fresh.close()


def test_host_copies_on_the_cpu_are_the_models_outputs(worker_job):
    from linpipe.inputs import open_input
    from linpipe.model import load_model

    tiny, fasta, lengths = worker_job
    model = load_model(tiny, device="cpu")
    host = HostCopies(model)
    assert not host.enabled  # no device to copy from: Model.forward's arrays as they are
    rid = max(lengths, key=lengths.get)
    x, _ = open_input(str(fasta)).read(rid, 0, 3000)
    outputs = ["logprob", "entropy", "hidden"]
    out, state = host.forward(x, model.init_state(), outputs, {"hidden": "float16"})
    want, want_state = model.forward(x, model.init_state(), outputs=outputs)
    got = out.arrays()
    assert got["hidden"].dtype == np.float16  # cast here, as the store keeps it
    assert got["hidden"].tobytes() == want["hidden"].astype(np.float16).tobytes()
    for k in ("logprob", "entropy"):
        np.testing.assert_array_equal(got[k], want[k])
    for k, v in want_state.to_arrays().items():
        np.testing.assert_array_equal(out.state_arrays()[k], v)
    out.release()
    import torch

    buf = host.take((10, 3), torch.float32)
    host.give([buf])
    assert host.take((7, 3), buf.dtype) is buf  # a free buffer of enough rows is reused
    assert not buf.is_pinned()


def test_the_hosts_cast_to_float16_is_numpys_bit_for_bit():
    """`cast` (torch's vectorised cast) must store what numpy's astype stores: a resumed job
    mixes units written by either. Ties to even, float16's subnormals and its overflow to inf,
    signed zeros, inf, NaN, and a million float32 values over float16's whole range and beyond."""
    half_ulp = np.float32(1 + 2.0 ** -11)  # halfway between 1 and float16's next value: to 1
    edges = np.array([0.0, -0.0, 1.0, half_ulp, np.nextafter(half_ulp, np.float32(2)), 65504, 65519.99,
                      65520, -65520, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -14 - 2.0 ** -25,
                      np.inf, -np.inf, np.nan, 1e-30, 1e30], np.float32)
    rng = np.random.default_rng(0)
    spread = (rng.standard_normal(1_000_000) * 2.0 ** rng.integers(-30, 20, 1_000_000)).astype(np.float32)
    values = np.concatenate([edges, spread]).reshape(-1, 2)  # a (T, F) array, as hidden is
    logprob = np.arange(5, dtype=np.float32)
    with np.errstate(over="ignore"):
        want = values.astype(np.float16)
    got = cast({"hidden": values, "logprob": logprob}, {"hidden": "float16"})
    assert got["hidden"].dtype == np.float16 and got["hidden"].shape == values.shape
    nan = np.isnan(values)
    assert np.isnan(got["hidden"][nan]).all()
    assert got["hidden"].view(np.uint16)[~nan].tobytes() == want.view(np.uint16)[~nan].tobytes()
    assert got["logprob"] is logprob  # arrays with no dtype asked for go as they are
    assert cast({"hidden": want}, {"hidden": "float16"})["hidden"] is want  # already the store's


# --------------------------------------------------------------------- killed with writes in flight
_OVERLAPPED_RUN = """
import sys
sys.path.insert(0, {tests!r})
from _worker_calls import job_calls, run_overlapped, worker_of
from linpipe.jobs.write_process import WriteProcess
WriteProcess.command = (sys.executable, {writer!r})  # the writing process, with the hook below
plan, store, w = worker_of({fasta!r}, {model!r}, {out!r})
calls = job_calls(plan)
for i in range(0, len(calls), 3):  # IN_FLIGHT calls at a time, as the driver keeps them
    run_overlapped(w, calls[i:i + 3], range(min(3, len(calls) - i)), first=i)
"""

# The worker's writing process, hooked: it stops in the data round of a record's unit after one
# of that record's units is marked (its data, state and checksums on disk, its marker not), and
# writes its pid to the flag file; the calls beside it go on until the test's kill.
_HOOKED_WRITER = """
import os, pathlib, socket, sys, time
from linpipe.jobs.write_process import serve
from linpipe.store import OutputStore
flag, marked, sync = pathlib.Path(FLAG), set(), OutputStore._sync
def hooked(self, chunks, files):
    keys = set(self.meta["records"])
    paths = ["/" + str(f) for f in files if f]
    marker = [k for k in keys for p in paths if f"/{k}/done/" in p]
    if not marker and any(f"/{k}/logprob/" in p for k in marked for p in paths):
        flag.write_text(str(os.getpid()))
        time.sleep(120)
    sync(self, chunks, files)
    marked.update(marker)
OutputStore._sync = hooked
serve(socket.socket(fileno=int(sys.argv[1])), sys.argv[2])
"""


def _in_flight(out) -> bool:
    """A unit's data on disk without its marker, beside a marked unit of the same record."""
    from linpipe.store import OutputStore

    store = OutputStore.open(out, mode="r")
    for key in store.meta["records"]:
        done = store.completed_units(key)
        have = {int(p.name.split(".")[0]) for p in (out / key / "logprob" / "c").glob("*")}
        if have - done and done:
            return True
    return False


@pytest.mark.slow
def test_killed_with_writes_in_flight_keeps_only_durable_units_and_resumes_bit_identical(
        worker_job, tmp_path):
    from linpipe.store.verify import verify_store

    tiny, fasta, _ = worker_job
    out = tmp_path / "killed.zarr"
    writer = tmp_path / "writer.py"
    writer.write_text(_HOOKED_WRITER.replace("FLAG", repr(str(tmp_path / "flag"))))
    code = _OVERLAPPED_RUN.format(tests=os.path.dirname(__file__), fasta=str(fasta), model=tiny, out=str(out),
                                  writer=str(writer))
    # SIGKILL the worker, then its writing process, once a unit is caught between data and marker
    kill_at_hook(code, out, tmp_path / "flag")
    writer_pid = int((tmp_path / "flag").read_text())
    os.kill(writer_pid, signal.SIGKILL)
    assert process_gone(writer_pid)
    assert _in_flight(out)
    report = verify_store(out)  # every unit marked done is whole (the rest: missing, not corrupt)
    assert report.units >= 1 and not [p for p in report.problems if p.kind != "missing"]
    from linpipe.jobs.driver import Batch, work_left

    plan, store, w = worker_of(fasta, tiny, out)
    todo, _ = work_left(plan, store)
    assert todo  # the killed run left work; the resume runs only that
    for item in todo:
        if isinstance(item, Batch):
            w.run_batch(item.index, plan.batch_units(item.index))
        else:
            r = item.record
            for i in range(item.next, r.n_units):
                w.run_unit(r.unit(i), last=i == r.n_units - 1)
    assert store.finalize()
    write_in_process(fasta, tiny, tmp_path / "reference.zarr", unit_size=UNIT)
    assert_same_bytes(store_arrays(tmp_path / "reference.zarr"), store_arrays(out))


@pytest.mark.parametrize("strand", [FORWARD, REVERSE], ids=["forward", "reverse"])
def test_a_unit_whose_previous_state_is_missing_is_a_one_line_error(
        worker_job, tmp_path, strand, one_torch_thread):
    """A unit handed to a worker that holds no state for it, whose previous unit is not in the
    store: a StoreError naming the store, the record and both units; nothing is marked done,
    and once the previous unit is written the same call runs."""
    from linpipe.errors import StoreError

    tiny, fasta, _ = worker_job
    plan, store, w = worker_of(fasta, tiny, tmp_path / "o.zarr", strand="both")
    rec = next(r for r in plan.streams if r.strand == strand)
    units = rec.units()  # in reading order: the reverse strand's from the record's end
    with pytest.raises(StoreError) as err:
        w.run_unit(units[1])
    msg = str(err.value)
    assert "\n" not in msg and str(tmp_path / "o.zarr") in msg and repr(rec.id) in msg
    assert f"unit {units[1].index}" in msg and f"state after unit {units[0].index} is not in the store" in msg
    assert not store.completed_units(rec.key, rec.strand)
    w.run_unit(units[0])
    w._streams.clear()  # the state is taken from the store now
    w.run_unit(units[1])
    assert store.completed_units(rec.key, rec.strand) == {units[0].index, units[1].index}
