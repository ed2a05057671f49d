"""`linpipe status`'s progress: records and positions done, read from a real output store."""
import numpy as np

from linpipe.jobs.submission import store_is_complete, store_progress
from linpipe.store import OutputStore


def test_progress_counts_completed_chunks(tmp_path):
    out = tmp_path / "job.zarr"
    records = [{"id": "chrA", "length": 2500}, {"id": "chrB", "length": 700}]
    store = OutputStore.create(out, meta={"job_id": "lp-test"}, records=records,
                               outputs=["logprob", "softmask"], unit_size=1000)
    assert store_progress(str(out)) == {"records": 2, "records_done": 0, "positions": 3200,
                                        "positions_done": 0, "complete": False}

    def write(rid, i):
        key = store.record_key(rid)
        a, b = store.unit_range(key, i)
        store.write_unit(key, i, {"logprob": np.full(b - a, -1.3, np.float32),
                                   "softmask": np.zeros(b - a, np.uint8)})

    write("chrA", 2)  # the short last chunk: 500 positions
    assert store.record("chrB").packed  # one unit: written with its batch
    store.write_batch(0, {"logprob": np.full(700, -1.1, np.float32), "softmask": np.zeros(700, np.uint8)})
    p = store_progress(str(out))
    assert (p["records_done"], p["positions_done"], p["complete"]) == (1, 1200, False)
    write("chrA", 0)
    write("chrA", 1)
    store.finalize()
    assert store_progress(str(out)) == {"records": 2, "records_done": 2, "positions": 3200,
                                        "positions_done": 3200, "complete": True}
    assert store_is_complete(str(out))


def test_progress_of_a_missing_or_foreign_store_is_none(tmp_path):
    assert store_progress(str(tmp_path / "absent.zarr")) is None
    (tmp_path / "notastore").mkdir()
    assert store_progress(str(tmp_path / "notastore")) is None
    assert store_progress(None) is None
