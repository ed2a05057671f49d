"""--split N with a delta-rule model on a local Ray (jobs/split.py): a real record over
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
from _ray import SHARED_RAY

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
            os.kill(int(nodes[self.kill_at[1]].rsplit(":", 1)[1]), signal.SIGKILL)  # the test's actor
            self.kill_at = None


@pytest.fixture(scope="module")
def local_ray():
    """A Ray of this module's own, 2 CPUs (the killed actor's group restarts on those two), its
    workers choosing by the assumed rates ($LINPIPE_SPLIT_RATES=assumed, which keep every layer
    input of a tiny model): the shared Ray is shut down first and starts again when asked."""
    import shutil
    import tempfile

    import ray

    SHARED_RAY.down()
    tmp = tempfile.mkdtemp(prefix="lpd-")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LINPIPE_SPLIT_RATES", "assumed")
        mp.setenv("LINPIPE_SPLIT_KILL_RATE", "0.25")  # one run in four resumed: keep
        ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tmp, logging_level="WARNING",
                 log_to_driver=False)
        yield
        ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


def test_gated_deltanet_split_on_ray_equals_streamed_and_resumes(local_ray, genomes, tmp_path):
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

    # segment 1's actor killed at layer 0's barrier, after the summaries that fold layer 1 came
    # back (the fold is stored) and before layer 1's corrections: the new group resumes from the
    # stored folds and kept layer inputs, exchanging no layer again, to the same bytes
    again, events = tmp_path / "again.zarr", Watch(kill_at=(0, 1))
    summary = run_job(JobRequest(inputs=(str(fasta),), model=model, out=str(again), unit_size=UNIT,
                                 outputs=("logprob", "entropy"), workers=2, split=2), events=events)
    assert summary.worker_deaths == 1 and events.layers == [0]
    assert_same_bytes(store_arrays(again), store_arrays(out))
    assert_same_bytes(record_outputs(again), record_outputs(out))


def test_delta_net_without_short_convs_splits_on_ray(local_ray, tmp_path):
    """fla's DeltaNet without short convolutions (tests/data/fla/delta_net_no_conv, imported) with
    --split 2 on Ray: no conv window to hand from segment to segment (the fold of the halos once
    crashed on it); each record (2 units and more of 37) over two actors stores the in-process
    split's bytes, the unsplit run's values (1e-5 relative) and fla's (1e-4)."""
    from _fla_data import FLA, GIVEN, assert_matches_fla, run

    from linpipe.inputs import open_input
    from linpipe.model import load_model
    from linpipe.model.segments import first_weight, segment_bounds
    from linpipe.model.segments_run import forward_split

    model, unit = str(tmp_path / "m"), 37
    assert run("model", "import", FLA / "delta_net_no_conv", model, *GIVEN).exit_code == 0
    fasta, out, streamed = FLA / "records.fa", tmp_path / "split.zarr", tmp_path / "streamed.zarr"
    events = Watch()
    summary = run_job(JobRequest(inputs=(str(fasta),), model=model, out=str(out), unit_size=unit,
                                 outputs=("logprob", "entropy"), workers=2, split=2), events=events)
    assert summary.worker_deaths == 0 and sorted(events.layers) == [0, 0, 0, 1, 1, 1]  # 3 records split
    write_in_process(fasta, model, streamed, unit_size=unit, outputs=("logprob", "entropy"))
    m = load_model(model, device="cpu")
    got, want = record_outputs(out), record_outputs(streamed)
    with open_input(str(fasta)) as inp:
        for rid in ("mt_human", "chr2_iupac", "ce_mt"):
            x = np.asarray(inp.read(rid, 0, inp.record(rid).length)[0])
            ref, _, _ = forward_split(m, x, segment_bounds(len(x), unit, 2, first_weight(m.config)), unit,
                                      outputs=["logprob", "entropy"])
            for k in ("logprob", "entropy"):
                assert got[f"{rid}/{k}"].tobytes() == ref[k].tobytes(), (rid, k)
    assert got.keys() == want.keys()
    for k in want:
        a, b = np.nan_to_num(got[k].astype(np.float64)), np.nan_to_num(want[k].astype(np.float64))
        assert np.abs(a - b).max() <= 1e-5 * max(np.abs(b).max(), 1e-30), k
    assert_matches_fla(out, FLA / "delta_net_no_conv" / "expected.npz", fasta)
