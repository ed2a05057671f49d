"""--split N with a delta-rule model on an embedded local Ray (jobs/split.py): a real record over
two actors equals the streamed run within 1e-5 relative, one writer per unit."""
from __future__ import annotations

import numpy as np
import pytest
from _pipeline_data import make_tiny_model, record_outputs, write_fasta_slice, write_in_process

from linpipe.jobs.driver import JobEvents, run_job
from linpipe.jobs.request import JobRequest
from linpipe.store import OutputStore

pytestmark = pytest.mark.slow

UNIT = 4_096
LONG = "CHROMOSOME_I"  # C. elegans chromosome I, its first 20 kb: 5 units


class Watch(JobEvents):
    def __init__(self):
        self.writers: dict[tuple[str, int], list[str]] = {}
        self.layers: list[int] = []

    def unit_done(self, result, units_done):
        self.writers.setdefault((result.key, result.unit), []).append(result.node)

    def split_layer(self, record_id, layer, nodes, timing):
        self.layers.append(layer)


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


def test_gated_deltanet_split_on_ray_equals_streamed(local_ray, genomes, tmp_path):
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
