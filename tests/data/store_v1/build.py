"""Write three tiny stores with linpipe's OutputStore: `python build.py DEST`.

The metadata fixture beside this script (format version 1, written by the linpipe before the
store was split into layout/writer/reader) was made by running it with that linpipe on the
path; tests/test_store.py runs it with the current one and compares. It uses only
OutputStore.create / write_unit / finalize (write_chunk, n_chunks, chunk_range and chunk_size=
in that linpipe: the same calls under their older names).
"""
import sys
from pathlib import Path

import numpy as np

from linpipe.store import OutputStore

META = {"version": "0.1.0", "job_id": "fixture", "model": {"config": {"d_model": 4}, "sha256": "0" * 64}}


def _values(n, width=None, dtype=np.float32, seed=0):
    shape = (n,) if width is None else (n, width)
    return (np.arange(np.prod(shape), dtype=np.float64).reshape(shape) * 0.25 + seed).astype(dtype)


def _write_all(store, key, outputs, skip=(), with_state=True):
    for i in range(store.n_units(key)):
        if i in skip:
            continue
        s, e = store.unit_range(key, i)
        arrays = {name: outputs[name][s:e] for name in store.output_names(key)}
        state = {"S": np.full(2, e, np.float32)} if with_state and i % 2 else None
        store.write_unit(key, i, arrays, state=state)


def build(dest: Path):
    dest = Path(dest)
    # dna: a hashed key, an empty record, a 2-D output, written in full and finalized
    dna = [{"id": "chr1/alt", "description": "chr1 alt", "length": 25, "modality": "dna", "input": "g.fa"},
           {"id": "empty", "length": 0, "modality": "dna", "input": "g.fa"}]
    store = OutputStore.create(dest / "dna.zarr", meta=META, records=dna, unit_size=10, feature_dim=4,
                               outputs=["logprob", "softmask", "hidden"])
    for r in dna:
        n = r["length"]
        out = {"logprob": _values(n), "softmask": (np.arange(n) % 2).astype(np.uint8),
               "hidden": _values(n, 4, np.float16)}
        _write_all(store, store.record_key(r["id"]), out)
    assert store.finalize()

    # series: time stamps (datetime and integer), channels, float32 hidden, finalized
    ts = [{"id": "mitdb/100", "length": 12, "modality": "timeseries", "input": "e.parquet",
           "time_dtype": "datetime64[ns]"},
          {"id": "s2", "length": 6, "modality": "timeseries", "input": "e.parquet", "time_dtype": "int64"}]
    store = OutputStore.create(dest / "ts.zarr", meta=META, records=ts, unit_size=5, feature_dim=3,
                               channels=["MLII_mV", "V5_mV"], outputs=["forecast", "hidden"],
                               hidden_dtype="float32")
    for r in ts:
        n = r["length"]
        t = np.arange(n, dtype=np.int64) * 1000
        out = {"forecast": _values(n, 2), "hidden": _values(n, 3),
               "time": t.astype("datetime64[ns]") if r["time_dtype"].startswith("datetime") else t}
        _write_all(store, store.record_key(r["id"]), out)
    assert store.finalize()

    # an unfinished store: one unit missing, no consolidated metadata
    store = OutputStore.create(dest / "partial.zarr", meta=META, records=dna[:1], unit_size=10,
                               outputs=["entropy"])
    _write_all(store, store.record_key("chr1/alt"), {"entropy": _values(25)}, skip={1})
    assert not store.finalize()


if __name__ == "__main__":
    build(Path(sys.argv[1]))
