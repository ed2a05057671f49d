"""--split on a local Ray: a real record over a group of actors (jobs/split.py).

run_job joins the test process's shared local Ray (3 CPUs, conftest's shared_ray).
"""
from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
from _pipeline_data import (
    assert_same_bytes,
    record_outputs,
    store_arrays,
    write_fasta_slice,
    write_in_process,
)
from _ray import SHARED_RAY
from _split_harness import assert_close

from linpipe.jobs.driver import JobEvents, run_job
from linpipe.jobs.request import JobRequest
from linpipe.jobs.split import SHM
from linpipe.store import OutputStore
from linpipe.store.layout import progress_path

pytestmark = pytest.mark.slow

UNIT = 8_192
OUTPUTS = ("logprob", "entropy", "softmask", "hidden")
LONG = "CHROMOSOME_I"  # C. elegans chromosome I, its first 60 kb: 8 chunks


@pytest.fixture(scope="module")
def model2(tmp_path_factory):
    """A tiny two-layer DNA model, so a worker can be lost between layers."""
    from linpipe.model import ModelConfig, init_net, save_model

    cfg = ModelConfig(modality="dna", d_model=16, n_layers=2, n_heads=2, mlp_hidden=32)
    path = tmp_path_factory.mktemp("model") / "tiny2"
    save_model(init_net(cfg, seed=1), cfg, path)
    return str(path)


@pytest.fixture(scope="module")
def one_record(genomes, tmp_path_factory):
    """The long record alone (no packed batches, so no other actors start)."""
    path = tmp_path_factory.mktemp("genome") / "ce_I.fa"
    assert write_fasta_slice(genomes / "htslib_ce.fa", path, {LONG: 60_000}) == {LONG: 60_000}
    return path


@pytest.fixture(scope="module", autouse=True)
def slow_cpu():
    """auto splits only where the cost model predicts a gain, which a 60 kb record on a tiny
    model never is: here the model sees a CPU slow enough for it to pay."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("linpipe.model.checkpoints.FLOPS_PER_S", 1e6)
        yield


class Watch(JobEvents):
    """Records who wrote each chunk and the split layers; kill_at: (layer, segment): SIGKILL
    that segment's actor at that layer's barrier (in the driver's hook, before the next
    layer's calls go out: the actor is gone before it can run any of that layer)."""

    def __init__(self, kill_at=None, out=None):
        self.writers: dict[tuple[str, int], list[str]] = {}
        self.out, self.done_at = out, {}  # out: the store; done_at: layer -> units durable at its barrier
        self.layers: list[tuple[str, int, list[str]]] = []
        self.kill_at = kill_at
        self.bar: list[tuple[str, float]] = []  # the progress bar's moves: ("layer" | "unit", positions)

    def unit_done(self, result, units_done):
        self.writers.setdefault((result.key, result.unit), []).append(result.node)
        self.bar.append(("unit", result.positions * result.share))

    def split_progress(self, record_id, positions):
        self.bar.append(("layer", positions))

    def split_layer(self, record_id, layer, nodes, timing):
        self.layers.append((record_id, layer, list(nodes)))
        if self.out is not None:
            store = OutputStore.open(str(self.out), mode="r")
            self.done_at[layer] = sorted(store.completed_units(store.record_key(record_id)))
        assert timing["bytes"] > 0 and timing["wall_s"] >= timing["compute_s"] > 0
        # each segment's own compute (how evenly the record was shared); each barrier waits for the
        # slowest of its call, so no segment's sum exceeds the layer's
        assert len(timing["segments_s"]) == len(nodes)
        assert 0 < max(timing["segments_s"]) <= timing["compute_s"] + 1e-9
        if self.kill_at and self.kill_at[0] == layer:
            pid = int(nodes[self.kill_at[1]].rsplit(":", 1)[1])
            os.kill(pid, signal.SIGKILL)  # an actor of this test's job
            self.kill_at = None


def states(path, key, n):
    store = OutputStore.open(str(path), mode="r")
    return [store.boundary_state(key, i) for i in range(n)]


def units_by_writer(out, events) -> list[list[int]]:
    """The long record's chunks grouped by the actor that wrote them, after checking that every
    chunk was written once, by one actor."""
    key = OutputStore.open(str(out), mode="r").record_key(LONG)
    long_writes = {i: w for (k, i), w in events.writers.items() if k == key}
    assert sorted(long_writes) == list(range(8)) and all(len(w) == 1 for w in long_writes.values())
    by_writer = {}
    for i, (w,) in long_writes.items():
        by_writer.setdefault(w, []).append(i)
    return sorted(map(sorted, by_writer.values()))


@pytest.fixture(scope="module")
def split_one(one_record, model2, tmp_path_factory):
    """The record split by --split auto over 3 workers, uninterrupted (the restarts' reference)."""
    SHARED_RAY.up()
    out = tmp_path_factory.mktemp("split1") / "split.zarr"
    events = Watch(out=out)
    summary = run_job(JobRequest(inputs=(str(one_record),), model=model2, out=str(out), unit_size=UNIT,
                                 outputs=OUTPUTS, workers=3, split="auto"), events=events)
    return out, events, summary


def test_auto_split_equals_serial_one_writer_per_chunk(split_one, one_record, model2, tmp_path):
    out, events, summary = split_one
    assert summary.positions_run == 60_000 and summary.worker_deaths == 0
    # auto: one record, 3 workers: 3 segments, one exchange per layer (2 layers)
    assert [(r, layer) for r, layer, _ in events.layers] == [(LONG, 0), (LONG, 1)]
    assert len(set(events.layers[0][2])) == 3
    # the last layer's call wrote its units as it made them: at its barrier every unit is
    # durable but each later segment's first (units 3 and 6: the y before them is the segment
    # before's last, known only there), none at the first layer's
    assert events.done_at == {0: [], 1: [0, 1, 2, 4, 5, 7]}
    # the progress bar moved with the layers, a third of the record at each of the 2 layers
    # and the writes, and reached the record's positions once
    moves = [(kind, round(n, 6)) for kind, n in events.bar if n]
    assert moves == [("layer", 20_000.0)] * 3
    serial = tmp_path / "serial.zarr"
    write_in_process(one_record, model2, serial, unit_size=UNIT, outputs=OUTPUTS)
    assert_close(out, serial)
    # the first segment weighs FIRST_WEIGHT (1.25): 8 chunks as 3, 3, 2
    assert units_by_writer(out, events) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    store = OutputStore.open(str(out), mode="r")
    key = store.record_key(LONG)
    # boundary states stored at every chunk edge, close to the serial run's
    want_states = states(serial, key, 8)
    for got_s, want_s in zip(states(out, key, 8), want_states, strict=True):
        assert got_s.keys() == want_s.keys()
        for name in want_s:
            d = np.abs(got_s[name] - want_s[name]).max()
            assert d <= 1e-5 * max(np.abs(want_s[name]).max(), 1e-30), name


def test_a_float64_model_gives_the_first_segment_a_larger_share(shared_ray, one_record, tmp_path):
    """Identity features with the normaliser: a later segment's passes run in float64 (about
    twice the time), so the first segment takes 2.2 shares: 8 chunks as 4, 2, 2. phi(q).z
    crosses zero there and the serial float32 run is itself off the exact (float64) answer,
    so the split must be as close to that as the serial run is (test_split.py's rule)."""
    import copy

    from linpipe.inputs import open_input
    from linpipe.model import Model, ModelConfig, init_net, load_model, save_model

    cfg = ModelConfig(modality="dna", d_model=16, n_layers=2, n_heads=2, mlp_hidden=32,
                      feature_map="identity", normalize=True)
    model = tmp_path / "identity"
    save_model(init_net(cfg, seed=1), cfg, model)
    out, events = tmp_path / "split.zarr", Watch()
    summary = run_job(JobRequest(inputs=(str(one_record),), model=str(model), out=str(out),
                                 unit_size=UNIT, outputs=OUTPUTS, workers=3, split="auto"),
                      events=events)
    assert summary.positions_run == 60_000 and len(set(events.layers[0][2])) == 3
    assert units_by_writer(out, events) == [[0, 1, 2, 3], [4, 5], [6, 7]]
    serial = tmp_path / "serial.zarr"
    write_in_process(one_record, str(model), serial, unit_size=UNIT, outputs=OUTPUTS)
    m = load_model(str(model), device="cpu")
    exact64 = Model(copy.deepcopy(m.net).double(), m.config, device="cpu")
    x = open_input(str(one_record)).read(LONG, 0, 60_000)[0]
    state, exact = exact64.init_state(), {"logprob": [], "entropy": []}
    for a in range(0, len(x), UNIT):
        o, state = exact64.forward(x[a:a + UNIT], state, outputs=list(exact))
        for k in exact:
            exact[k].append(o[k])
    got, want = record_outputs(out), record_outputs(serial)
    assert np.array_equal(got[f"{LONG}/softmask"], want[f"{LONG}/softmask"])
    for k, parts in exact.items():
        e = np.concatenate(parts).astype(np.float64)

        def dist(a, e=e):
            return np.abs(np.nan_to_num(a.astype(np.float64)) - np.nan_to_num(e)).max() / np.abs(e).max()
        a, b = got[f"{LONG}/{k}"], want[f"{LONG}/{k}"]
        assert dist(a) <= 3 * dist(b) + 1e-5, (k, dist(a), dist(b))


def test_resume_and_worker_killed_mid_run_bit_identical(split_one, one_record, model2, tmp_path,
                                                        monkeypatch, shared_ray):
    """A store whose segments 1 and 2 were lost after chunk 3 (done markers cleared from there,
    outputs zeroed) resumes from the state stored at segment 1's start (after chunk 2), the fold's
    value; then segment 2's actor is SIGKILLed at layer 0's barrier, so that layer 1's call
    finds it dead, and the group of two restarts from the store again, replaying both layers
    from the stored folds (no h checkpoint). The store's bytes
    equal the uninterrupted run's (which kept the layer inputs it chose; this one, with
    --split-budget 0, none: test_split_kill.py resumes from kept inputs)."""
    import zarr


    ref = split_one[0]
    out = tmp_path / "resume.zarr"
    shutil.copytree(ref, out)
    root = zarr.open_group(str(out), mode="r+", use_consolidated=False)
    key = OutputStore.open(str(out), mode="r").record_key(LONG)
    root.attrs["linpipe"] = {**root.attrs["linpipe"], "complete": False}
    done = root[progress_path(key, "done")]
    assert done[:].all()
    done[4:] = 0
    for name in OUTPUTS:
        root[f"{key}/{name}"][4 * UNIT:] = 0
    events = Watch(kill_at=(0, 1))
    summary = run_job(JobRequest(inputs=(str(one_record),), model=model2, out=str(out), unit_size=UNIT,
                                 outputs=OUTPUTS, workers=3, split="3", split_budget=0), events=events)
    assert summary.worker_deaths == 1
    assert summary.positions_run == 60_000 - 4 * UNIT  # chunk 3 recomputed, not rewritten
    # layer 1 of the first group never completed, but the folds of layers 0 and 1 were stored:
    # the second group reran both layers from them, with no exchange (no layer barrier)
    assert [(layer, len(nodes)) for _, layer, nodes in events.layers] == [(0, 2)]
    assert_same_bytes(store_arrays(out), store_arrays(ref))
    for a, b in zip(states(out, key, 8), states(ref, key, 8), strict=True):
        assert_same_bytes(a, b)
    # the killed actor's spill (RAM-backed /dev/shm) went with it: nothing left behind
    assert not list(Path(SHM).glob("linpipe-seg-*"))
