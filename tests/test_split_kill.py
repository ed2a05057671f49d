"""A split job's driver SIGKILLed and the job resumed (jobs/split.py, store/splits.py): within a
layer's pass, at an exchange and during the final writes, on a local and an S3 store, under each
choice per layer input (kept, or recomputed on resume: checkpoints.choose_keeps). The resumed
store holds the bytes of an uninterrupted split run, a resumed job runs only the layers after
its deepest kept input, and what the run keeps on disk stays within its --split-budget.

Each run is a `run_job` in a subprocess of its own (its embedded Ray goes with its session); a
kill waits for what the store holds, never for a time. The tests' model is so small that the
planner would not split it: the driver script makes the CPU look slow to the planner; the
actors choose from the assumed rates ($LINPIPE_SPLIT_RATES=assumed) with one run in four assumed
resumed ($LINPIPE_SPLIT_KILL_RATE=0.25), which keep every layer input of a D 16 model, not from a
measurement that a loaded machine would vary.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import pytest
from _pipeline_data import assert_same_bytes, kill_session, store_arrays, write_fasta_slice

pytestmark = pytest.mark.slow

UNIT = 8_192
LONG = "CHROMOSOME_I"  # its first 60 kb: 8 units, 3 segments on 3 workers
OUTPUTS = ("logprob", "entropy", "hidden")

# argv: fasta, model, out, kill ("pass", "exchange", "writes", "unit" or "none"), budget ("" for the
# default)
DRIVER = r'''
import json, os, signal, sys, threading, time
from linpipe.model import checkpoints
checkpoints.FLOPS_PER_S = 1e6  # split this tiny model (auto) on 3 workers
from linpipe.jobs.driver import JobEvents, run_job
from linpipe.jobs.request import JobRequest
from linpipe.store import OutputStore

fasta, model, out, kill, budget = sys.argv[1:6]


def split_bytes():
    """Bytes of the split's objects on disk now (a local store's); None on an object store."""
    if "://" in out:
        return None
    total = 0
    for top, _dirs, files in os.walk(os.path.join(out, "_linpipe")):
        if "/split" in top:
            total += sum(os.path.getsize(os.path.join(top, f)) for f in files)
    return total


def die_once_stored(name):
    """Dies once the store holds an object of the split named so (the driver's thread)."""
    store = OutputStore.open(out, mode="r")
    split = store.split_records(store.record_key("CHROMOSOME_I"), [(0, 1)])
    while not any(n.split("/", 1)[1].startswith(name) for n in split.all_names()):
        time.sleep(0.002)
    die()


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def die_once_a_unit_is_written():
    store = OutputStore.open(out, mode="r")
    key = store.record_key("CHROMOSOME_I")
    while not store.completed_units(key):
        time.sleep(0.002)
    die()


class Events(JobEvents):
    def split_keeps(self, record_id, keeps, rates):  # every run, resumed ones too, says it first
        print(json.dumps({"keeps": list(keeps.layers)}), flush=True)
        if kill == "unit":  # a run with no layer to exchange writes its units after the replay
            threading.Thread(target=die_once_a_unit_is_written, daemon=True).start()

    def split_layer(self, record_id, layer, nodes, timing):
        # every layer input a segment keeps is on disk before its call returns to this barrier
        print(json.dumps({"layer": layer, "split_bytes": split_bytes()}), flush=True)
        if kill == "writes" and layer == 1:  # the last layer wrote its units; the writes' call is next
            die()
        if kill == "exchange" and layer == 0:
            die()  # the exchange of layer 1 was not folded yet
        if kill == "pass" and layer == 0:  # layer 1's pass is running once its fold is stored
            threading.Thread(target=die_once_stored, args=("fold/1/",), daemon=True).start()


more = {"split_budget": int(budget)} if budget else {}
s = run_job(JobRequest(inputs=(fasta,), model=model, out=out, unit_size=8192,
                       outputs=("logprob", "entropy", "hidden"), workers=3, split="auto", **more),
            events=Events())
print(json.dumps({"positions_run": s.positions_run, "positions_resumed": s.positions_resumed}), flush=True)
'''


def drive(fasta, model, out, kill: str, budget: int | None = None) -> tuple[int, list[dict]]:
    """One driver run: (its exit status, the JSON lines it printed)."""
    tmpdir = tempfile.mkdtemp(prefix="lpk", dir="/tmp")  # short: Ray's socket paths
    argv = [sys.executable, "-c", DRIVER, str(fasta), str(model), str(out), kill,
            "" if budget is None else str(budget)]
    proc = subprocess.Popen(argv, env={**os.environ, "TMPDIR": tmpdir, "PYTHONUNBUFFERED": "1",
                                       "LINPIPE_SPLIT_RATES": "assumed", "LINPIPE_SPLIT_KILL_RATE": "0.25"},
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        kill_session(proc.pid)  # what our killed driver's Ray left behind, and nothing else
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert proc.returncode in (0, -9), stderr[-3000:]
    return proc.returncode, lines


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
    rc, lines = drive(fasta, model, ref, "none", budget=0)  # keeps nothing; the bytes are the same
    assert rc == 0 and layers_run(lines) == [0, 1] and kept(lines) == []
    return fasta, model, ref


def kept(lines) -> list[int]:
    """The layer inputs the run chose to keep."""
    return next(x["keeps"] for x in lines if "keeps" in x)


def peak_split_bytes(lines) -> int:
    """The most the split's objects held on disk at a layer's end (when kept inputs are whole)."""
    return max(x["split_bytes"] for x in lines if "layer" in x)


def split_objects(out) -> list[str]:
    from linpipe.store import OutputStore

    store = OutputStore.open(str(out), mode="r")
    return store.split_records(store.record_key(LONG), [(0, 60_000)]).all_names()


def test_killed_in_a_pass_then_in_the_writes_resumes_to_the_same_bytes(job, tmp_path):
    fasta, model, ref = job
    out = tmp_path / "killed.zarr"
    rc, lines = drive(fasta, model, out, "pass")
    assert rc == -9 and layers_run(lines) == [0] and kept(lines) == [1, 2]
    assert units_done(out) == 0
    # layer 1's input was kept (before layer 0's exchange ended) and layer 1's fold stored:
    # only layer 1, the one in flight, runs again, from that input, with no exchange; killed
    # once a unit is written
    rc, lines = drive(fasta, model, out, "unit")
    assert rc == -9 and layers_run(lines) == []
    assert 1 <= units_done(out) < 8, "the driver was to be killed between two units' writes"
    left = positions_left(out)
    rc, lines = drive(fasta, model, out, "none")
    assert rc == 0 and layers_run(lines) == []  # from the checkpoint after the last layer
    # of the record's work (its 2 layers and its writes, a third each), this run did the
    # writes of the units not written before the kill; the rest it took from before
    summary = lines[-1]
    assert summary["positions_run"] == pytest.approx(left / 3)
    assert summary["positions_resumed"] == pytest.approx(60_000 - left / 3)
    assert_same_bytes(store_arrays(out), store_arrays(ref))
    assert split_objects(out) == []  # nothing of the split is left in the store


# before a merge: the recompute's replay runs in the suite in test_split_ray's resume
# (--split-budget 0)
@pytest.mark.premerge
def test_recomputing_every_layer_input_keeps_a_few_bytes_and_resumes_to_the_same_bytes(job, tmp_path):
    """--split-budget 0: no layer input is kept; a kill in the writes resumes by recomputing both
    layers in each segment from its tokens and the stored folds (no exchange)."""
    fasta, model, ref = job
    out = tmp_path / "recomputed.zarr"
    rc, lines = drive(fasta, model, out, "writes", budget=0)
    assert rc == -9 and layers_run(lines) == [0, 1] and kept(lines) == []
    assert 0 < peak_split_bytes(lines) < 0.5 * 60_000  # the folds and unit edges' states alone
    # the last layer wrote its units as it made them (durable at its barrier), all but each later
    # segment's first (3 and 6), whose y before them the segment before makes
    assert units_done(out) == 6
    rc, lines = drive(fasta, model, out, "none", budget=0)
    assert rc == 0 and layers_run(lines) == []  # both layers recomputed, neither exchanged again
    assert_same_bytes(store_arrays(out), store_arrays(ref))
    assert split_objects(out) == []


@pytest.mark.premerge  # before a merge: a kept input's CRC check and the budget's bound
def test_the_budget_bounds_what_is_kept_on_disk_and_a_torn_input_is_recomputed(job, tmp_path):
    """A budget of one slot and a half keeps one layer input (the writes'), and the split's
    objects on disk never pass it; a kept object torn after the kill (a machine's crash) reads
    as absent, and its segment recomputes it: the same bytes."""
    fasta, model, ref = job
    out = tmp_path / "budget.zarr"
    one_slot = 4 * 16 * 60_000  # float32 h of the D 16 model
    budget = one_slot * 3 // 2
    rc, lines = drive(fasta, model, out, "writes", budget=budget)
    assert rc == -9 and kept(lines) == [2]
    assert one_slot < peak_split_bytes(lines) <= budget
    torn = sorted(p for p in out.rglob("*") if p.is_file() and "/split/" in str(p) and "/h/" in str(p))
    assert torn, "no layer input was kept"
    data = bytearray(torn[-1].read_bytes())
    data[len(data) // 2] ^= 0xFF
    torn[-1].write_bytes(bytes(data))
    rc, lines = drive(fasta, model, out, "none", budget=budget)
    assert rc == 0
    assert_same_bytes(store_arrays(out), store_arrays(ref))
    assert split_objects(out) == []


# before a merge: the S3 store's part is test_object_store's, the exchange's resume
# test_delta_split_ray's
@pytest.mark.premerge
def test_killed_at_an_exchange_on_s3_resumes_to_the_same_bytes(job, s3_server):
    fasta, model, ref = job
    out = f"{s3_server.new_bucket()}/killed.zarr"
    rc, lines = drive(fasta, model, out, "exchange")
    assert rc == -9 and layers_run(lines) == [0]
    t = time.monotonic()
    rc, lines = drive(fasta, model, out, "none")
    assert rc == 0 and layers_run(lines) == [1], time.monotonic() - t  # layer 0 was not run again
    # layer 1 and the writes were run, layer 0 taken from before
    assert lines[-1]["positions_run"] == pytest.approx(40_000)
    assert lines[-1]["positions_resumed"] == pytest.approx(20_000)
    assert_same_bytes(store_arrays(out), store_arrays(ref))
    assert split_objects(out) == []
