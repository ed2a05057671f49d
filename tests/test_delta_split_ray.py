"""--split N with a delta-rule model on an embedded local Ray (jobs/split.py): a real record over
two actors equals the streamed run within 1e-5 relative, one writer per unit; with an actor
SIGKILLed at a layer's barrier the group resumes from the store's checkpoint (the delta rule's
states in it) to the uninterrupted split run's bytes."""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from _pipeline_data import (
    assert_same_bytes,
    make_tiny_model,
    record_outputs,
    store_arrays,
    write_fasta_slice,
    write_in_process,
)

from linpipe.jobs.driver import JobEvents, run_job
from linpipe.jobs.request import JobRequest
from linpipe.store import OutputStore

pytestmark = pytest.mark.slow

UNIT = 4_096
LONG = "CHROMOSOME_I"  # C. elegans chromosome I, its first 20 kb: 5 units


class Watch(JobEvents):
    """Who wrote each unit, the split's layer barriers; kill_at (layer, segment): SIGKILL that
    segment's actor at that layer's barrier."""

    def __init__(self, kill_at=None):
        self.writers: dict[tuple[str, int], list[str]] = {}
        self.layers: list[int] = []
        self.kill_at = kill_at

    def unit_done(self, result, units_done):
        self.writers.setdefault((result.key, result.unit), []).append(result.node)

    def split_layer(self, record_id, layer, nodes, timing):
        self.layers.append(layer)
        if self.kill_at and self.kill_at[0] == layer:
            os.kill(int(nodes[self.kill_at[1]].rsplit(":", 1)[1]), signal.SIGKILL)  # this test's own Ray
            self.kill_at = None


@pytest.fixture(scope="module")
def local_ray():
    import shutil
    import tempfile

    import ray

    tmp = tempfile.mkdtemp(prefix="lpd-")
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tmp, logging_level="WARNING", log_to_driver=False)
    yield
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


def test_gated_deltanet_split_on_ray_equals_streamed_and_resumes(local_ray, genomes, tmp_path, monkeypatch):
    monkeypatch.setenv("LINPIPE_SPLIT_RATES", "assumed")  # which keep every layer input of a tiny model
    model = make_tiny_model(tmp_path / "gdn", family="gated_deltanet")
    fasta = tmp_path / "ce_I.fa"
    assert write_fasta_slice(genomes / "htslib_ce.fa", fasta, {LONG: 20_000}) == {LONG: 20_000}
    out, streamed = tmp_path / "split.zarr", tmp_path / "streamed.zarr"
    events = Watch()
    summary = run_job(JobRequest(inputs=(str(fasta),), model=model, out=str(out), unit_size=UNIT,
                                 outputs=("logprob", "entropy"), workers=2, split=2), events=events)
    assert summary.positions_run == 20_000 and summary.worker_deaths == 0
    assert events.layers == [0, 1]  # one exchange per layer
    write_in_process(fasta, model, streamed, unit_size=UNIT, outputs=("logprob", "entropy"))
    got, want = record_outputs(out), record_outputs(streamed)
    assert got.keys() == want.keys()
    for k in want:
        a, b = np.nan_to_num(got[k].astype(np.float64)), np.nan_to_num(want[k].astype(np.float64))
        assert np.abs(a - b).max() <= 1e-5 * max(np.abs(b).max(), 1e-30), k
    key = OutputStore.open(str(out), mode="r").record_key(LONG)
    writes = {i: w for (k, i), w in events.writers.items() if k == key}
    assert sorted(writes) == list(range(5)) and all(len(w) == 1 for w in writes.values())
    assert len({w[0] for w in writes.values()}) == 2  # two segments, two writers
    got_s = [OutputStore.open(str(out), mode="r").boundary_state(key, i) for i in range(5)]
    want_s = [OutputStore.open(str(streamed), mode="r").boundary_state(key, i) for i in range(5)]
    for g, w in zip(got_s, want_s, strict=True):
        assert g.keys() == w.keys()
        for name in w:
            assert np.abs(g[name] - w[name]).max() <= 1e-5 * max(np.abs(w[name]).max(), 1e-30), name

    # segment 1's actor killed at layer 0's barrier: the new group resumes at layer 1 from the
    # store's checkpoint (no second layer-0 barrier), to the same bytes
    again, events = tmp_path / "again.zarr", Watch(kill_at=(0, 1))
    summary = run_job(JobRequest(inputs=(str(fasta),), model=model, out=str(again), unit_size=UNIT,
                                 outputs=("logprob", "entropy"), workers=2, split=2), events=events)
    assert summary.worker_deaths == 1 and events.layers == [0, 1]
    assert_same_bytes(store_arrays(again), store_arrays(out))
    assert_same_bytes(record_outputs(again), record_outputs(out))
