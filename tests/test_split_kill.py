"""A split job's driver SIGKILLed and the job resumed (jobs/split.py, store/splits.py): within a
layer's pass, at an exchange and during the final writes, on a local and an S3 store. The
resumed store holds the bytes of an uninterrupted split run, and a resumed job runs only the
layers after its last checkpoint.

Each killed run is a `run_job` in a subprocess of its own (its embedded Ray goes with its
session); the uninterrupted reference and the resumes that finish run here, on the test
process's shared Ray. The tests' model is so small that the cost model would neither split nor
checkpoint: each driver makes the CPU look slow and the store fast enough to split and
checkpoint every layer (the cost model is the driver's).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest
from _pipeline_data import assert_same_bytes, kill_session, store_arrays, write_fasta_slice
from _ray import SHARED_RAY

from linpipe.jobs.driver import JobEvents, run_job
from linpipe.jobs.request import JobRequest

pytestmark = pytest.mark.slow

UNIT = 8_192
LONG = "CHROMOSOME_I"  # its first 60 kb: 8 units, 3 segments on 3 workers
OUTPUTS = ("logprob", "entropy", "hidden")

# argv: fasta, model, out, kill ("pass", "exchange" or "writes")
DRIVER = r'''
import json, os, signal, sys, threading, time
from linpipe.model import checkpoints
checkpoints.STORE_BYTES_PER_S = 1e15  # checkpoint after every layer, for this tiny model,
checkpoints.FLOPS_PER_S = 1e6  # and split it (auto) on 3 workers
from linpipe.jobs.driver import JobEvents, run_job
from linpipe.jobs.request import JobRequest
from linpipe.store import OutputStore

fasta, model, out, kill = sys.argv[1:5]


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def die_once_a_unit_is_written():
    store = OutputStore.open(out, mode="r")
    key = store.record_key("CHROMOSOME_I")
    while not store.completed_units(key):
        time.sleep(0.002)
    die()


class Events(JobEvents):
    def split_layer(self, record_id, layer, nodes, timing):
        print(json.dumps({"layer": layer}), flush=True)
        if kill == "exchange" and layer == 0:
            die()  # the exchange of layer 1 was not folded yet
        if kill == "pass" and layer == 0:
            threading.Timer(0.01, die).start()  # layer 1's pass is running on the actors
        if kill == "writes" and layer == 1:
            threading.Thread(target=die_once_a_unit_is_written, daemon=True).start()


s = run_job(JobRequest(inputs=(fasta,), model=model, out=out, unit_size=8192,
                       outputs=("logprob", "entropy", "hidden"), workers=3, split="auto"), events=Events())
print(json.dumps({"positions_run": s.positions_run, "positions_resumed": s.positions_resumed}), flush=True)
'''


def drive(fasta, model, out, kill: str) -> tuple[int, list[dict]]:
    """One driver run killed where `kill` says, in a process of its own: (its exit status, the
    JSON lines it printed)."""
    tmpdir = tempfile.mkdtemp(prefix="lpk", dir="/tmp")  # short: Ray's socket paths
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(fasta), str(model), str(out), kill],
                            env={**os.environ, "TMPDIR": tmpdir, "PYTHONUNBUFFERED": "1"},
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        kill_session(proc.pid)  # what our killed driver's Ray left behind, and nothing else
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert proc.returncode in (0, -9), stderr[-3000:]
    return proc.returncode, lines


class Layers(JobEvents):
    def __init__(self):
        self.lines: list[dict] = []

    def split_layer(self, record_id, layer, nodes, timing):
        self.lines.append({"layer": layer})


def finish(fasta, model, out) -> list[dict]:
    """The driver run to its end in this process, on the shared Ray (the cost model as DRIVER's):
    the lines DRIVER would print."""
    from linpipe.model import checkpoints

    events = Layers()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoints, "STORE_BYTES_PER_S", 1e15)
        mp.setattr(checkpoints, "FLOPS_PER_S", 1e6)
        s = run_job(JobRequest(inputs=(str(fasta),), model=str(model), out=str(out), unit_size=UNIT,
                               outputs=OUTPUTS, workers=3, split="auto"), events=events)
    return events.lines + [{"positions_run": s.positions_run}]


def layers_run(lines) -> list[int]:
    return [x["layer"] for x in lines if "layer" in x]


def units_done(out) -> int:
    from linpipe.store import OutputStore

    store = OutputStore.open(str(out), mode="r")
    return len(store.completed_units(store.record_key(LONG)))


def positions_left(out) -> int:
    """The positions of the record's units not written yet."""
    from linpipe.store import OutputStore

    store = OutputStore.open(str(out), mode="r")
    key = store.record_key(LONG)
    done = store.completed_units(key)
    return sum(min(60_000, (i + 1) * UNIT) - i * UNIT for i in range(-(-60_000 // UNIT)) if i not in done)


@pytest.fixture(scope="module")
def job(genomes, tmp_path_factory):
    """The genome slice, the two-layer model and the uninterrupted split run's store."""
    from linpipe.model import ModelConfig, init_net, save_model

    d = tmp_path_factory.mktemp("splitkill")
    fasta = d / "ce_I.fa"
    assert write_fasta_slice(genomes / "htslib_ce.fa", fasta, {LONG: 60_000}) == {LONG: 60_000}
    cfg = ModelConfig(modality="dna", d_model=16, n_layers=2, n_heads=2, mlp_hidden=32)
    model = d / "tiny2"
    save_model(init_net(cfg, seed=1), cfg, model)
    ref = d / "reference.zarr"
    SHARED_RAY.up()
    assert layers_run(finish(fasta, model, ref)) == [0, 1]
    return fasta, model, ref


def split_objects(out) -> list[str]:
    from linpipe.store import OutputStore

    store = OutputStore.open(str(out), mode="r")
    return store.split_records(store.record_key(LONG), [(0, 60_000)]).all_names()


def test_killed_in_a_pass_then_in_the_writes_resumes_to_the_same_bytes(job, tmp_path, shared_ray):
    fasta, model, ref = job
    out = tmp_path / "killed.zarr"
    rc, lines = drive(fasta, model, out, "pass")
    assert rc == -9 and layers_run(lines) == [0]
    assert units_done(out) == 0
    # the checkpoint of layer 1 (taken before layer 0's exchange ended) is there: only
    # layer 1, the one in flight, runs again (none when its own checkpoint was complete)
    rc, lines = drive(fasta, model, out, "writes")
    assert rc == -9 and layers_run(lines) in ([1], [])
    assert 1 <= units_done(out) < 8, "the driver was to be killed between two units' writes"
    left = positions_left(out)
    lines = finish(fasta, model, out)
    assert layers_run(lines) == []  # from the checkpoint after the last layer
    # of the record's work (its 2 layers and its writes, a third each), this run did the
    # writes of the units not written before the kill; the rest it took from before
    summary = lines[-1]
    assert summary["positions_run"] == pytest.approx(left / 3)
    assert summary["positions_resumed"] == pytest.approx(60_000 - left / 3)
    assert_same_bytes(store_arrays(out), store_arrays(ref))
    assert split_objects(out) == []  # nothing of the split is left in the store


def test_killed_at_an_exchange_on_s3_resumes_to_the_same_bytes(job, s3_server, shared_ray):
    fasta, model, ref = job
    out = f"{s3_server.new_bucket()}/killed.zarr"
    rc, lines = drive(fasta, model, out, "exchange")
    assert rc == -9 and layers_run(lines) == [0]
    lines = finish(fasta, model, out)
    assert layers_run(lines) == [1]  # layer 0 was not run again
    # layer 1 and the writes were run, layer 0 taken from before
    assert lines[-1]["positions_run"] == pytest.approx(40_000)
    assert lines[-1]["positions_resumed"] == pytest.approx(20_000)
    assert_same_bytes(store_arrays(out), store_arrays(ref))
    assert split_objects(out) == []
