"""The output store (issue 5): layout, round trip, safety under concurrency and kills, errors.

Stores are built from real data with stand-in models (an order-3 Markov model of the genome
itself, a last-value forecast of a real ECG), so the tests do not depend on linpipe's model or
input readers, but the arrays have the structure real outputs have (N runs, soft-masking).
"""
from __future__ import annotations

import json
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr
from _store_data import (
    DNA_META,
    FEATURES,
    HUMAN_BASES,
    KILLED_OPEN,
    KILLED_WRITE,
    UNIT,
    build_dna_store,
    build_ts_store,
    dna_records,
    kill_at_hook,
    markov_outputs,
    read_fasta,
    state_after,
    tree_bytes,
    write_records,
)

from linpipe.errors import StoreError
from linpipe.store import FORMAT_VERSION, OutputStore
from linpipe.store.keys import make_keys
from linpipe.store.reader import IncompleteStoreWarning, open_output

FORMAT_V1 = Path(__file__).parent / "data" / "store_v1"  # metadata written by the format-1 writer
@pytest.fixture(scope="module")
def dna_store(tmp_path_factory, genomes):
    path = tmp_path_factory.mktemp("dna") / "out.zarr"
    store, full = build_dna_store(path, genomes)
    return path, full


@pytest.fixture(scope="module")
def ts_store(tmp_path_factory, timeseries):
    path = tmp_path_factory.mktemp("ts") / "ts.zarr"
    store, data = build_ts_store(path, timeseries)
    return path, data


# ------------------------------------------------------------------------------------- round trip
def test_round_trip_every_array_and_attribute(dna_store):
    path, full = dna_store
    store = OutputStore.open(path, mode="r")
    assert store.is_complete()
    meta = store.meta
    assert meta["format"] == "linpipe-output" and meta["format_version"] == FORMAT_VERSION
    for k, v in DNA_META.items():
        assert meta[k] == v
    assert meta["chunk_size"] == UNIT and meta["outputs"] == ["logprob", "entropy", "softmask", "hidden"]
    # the long record has its own group; the two short ones (at most one unit) are packed
    assert {info["id"] for info in meta["records"].values()} == {"chr1"}
    assert meta["packed"] == {"records": 2, "batches": 1, "inputs": ["genome.fa"],
                              "positions": sum(len(full[r]["logprob"]) for r in full if r != "chr1")}
    assert set(store.records) == set(full) and len(store.records) == 3
    root = zarr.open_group(path, mode="r")
    for rid, arrays in full.items():
        info = store.record(rid)
        assert (info.length, info.modality, info.description, info.input) == \
            (len(arrays["logprob"]), "dna", f"{rid} test", "genome.fa")
        assert info.packed == (rid != "chr1")
        for name, want in arrays.items():
            got = store.array(rid, name)[:]
            assert got.dtype == {"hidden": np.float16, "softmask": np.uint8}.get(name, np.float32)
            np.testing.assert_array_equal(got, want.astype(got.dtype))
        assert store.completed_units(rid) == set(range(store.n_units(rid)))
        assert store.missing_ranges(rid) == []
        if info.packed:
            assert store.boundary_state(rid, 0) is None  # a whole record needs no resume point
            continue
        key = info.key
        assert root[key].attrs["linpipe_record"]["id"] == rid
        for name in arrays:
            arr = root[f"{key}/{name}"]
            assert arr.chunks[0] == UNIT
            want_dims = ["position", "feature"] if name == "hidden" else ["position"]
            assert list(arr.metadata.dimension_names) == want_dims
        for i in range(store.n_units(key)):
            _, e = store.unit_range(key, i)
            st = store.boundary_state(key, i)
            want = state_after(arrays, e)
            assert st.keys() == want.keys()
            for n in want:
                np.testing.assert_array_equal(st[n], want[n])
                assert st[n].dtype == want[n].dtype
    # the packed arrays: one Zarr chunk per batch, dims named apart from a record's own
    packed = root["_packed/hidden"]
    assert packed.chunks == (UNIT, FEATURES) and packed.shape == (UNIT, FEATURES)
    assert list(packed.metadata.dimension_names) == ["packed_position", "feature"]
    # the real genome's N runs stay NaN (model output undefined there), and soft-masking is kept
    lp = root[f"{store.record_key('chr1')}/logprob"]
    assert np.isnan(lp[177_417:227_417]).all() and not np.isnan(lp[150_000:177_417]).any()
    assert 0 < full["chr1"]["softmask"].mean() < 1


def test_timeseries_round_trip_and_xarray(ts_store):
    path, data = ts_store
    out = open_output(path)
    ds = out.dataset("mitdb/100")
    assert ds["forecast"].dims == ("time", "channel")
    assert list(ds["channel"].values) == ["MLII_mV", "V5_mV"]
    np.testing.assert_array_equal(ds["time"].values, data["time"])
    np.testing.assert_array_equal(ds["residual"].values, data["residual"])
    np.testing.assert_array_equal(ds["forecast"].sel(channel="V5_mV").values, data["forecast"][:, 1])
    assert ds["hidden"].dims == ("time", "feature") and ds["hidden"].dtype == np.float32
    np.testing.assert_array_equal(ds["hidden"].values, data["hidden"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a finished store opens without the consolidation warning
        direct = xr.open_zarr(path, group=out.key("mitdb/100"))
    assert direct["time"].dtype == np.dtype("datetime64[ns]")
    np.testing.assert_array_equal(direct["forecast"].values, data["forecast"])
    key = out.key("mitdb/100")
    assert out.store.boundary_state(key, 0)["y"].tolist() == data["forecast"][4095].tolist()


def test_xarray_both_ways(dna_store):
    path, full = dna_store
    out = open_output(path)
    ds = out.dataset("chr1")
    assert ds.sizes == {"position": HUMAN_BASES, "feature": FEATURES}
    assert ds["position"].values[0] == 0 and ds["position"].values[-1] == HUMAN_BASES - 1
    assert ds.attrs["record_id"] == "chr1"
    np.testing.assert_array_equal(ds["entropy"].sel(position=slice(1000, 1999)).values,
                                  full["chr1"]["entropy"][1000:2000])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        direct = xr.open_zarr(path, group=out.key("chr1"))
    assert set(direct.data_vars) == {"logprob", "entropy", "softmask", "hidden"}
    assert direct["hidden"].dims == ("position", "feature")
    np.testing.assert_array_equal(direct["logprob"].values, full["chr1"]["logprob"])
    assert direct["softmask"].dtype == np.uint8  # the 0 fill value is not turned into NaN
    assert direct["logprob"].attrs["units"] == "nats"

    # a packed record: the same dataset through linpipe, and by hand from the packed group
    ds = out.dataset("CHROMOSOME_II")
    assert ds.attrs["packed"] and ds["hidden"].dims == ("position", "feature")
    assert ds.sizes == {"position": len(full["CHROMOSOME_II"]["logprob"]), "feature": FEATURES}
    np.testing.assert_array_equal(ds["logprob"].values, full["CHROMOSOME_II"]["logprob"])
    assert ds["logprob"].attrs["units"] == "nats" and ds["softmask"].dtype == np.uint8
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        packed = xr.open_zarr(path, group="_packed")
    row = list(packed["record_id"].values).index("CHROMOSOME_II")
    off, n = int(packed["offset"][row]), int(packed["length"][row])
    np.testing.assert_array_equal(packed["logprob"][off:off + n].values, full["CHROMOSOME_II"]["logprob"])
    # the whole-store views
    table = out.record_table()
    assert sorted(table["id"]) == sorted(full) and table.set_index("id")["packed"].to_dict() == {
        "chr1": False, "CHROMOSOME_II": True, "CHROMOSOME_MtDNA": True}
    assert out.packed_dataset()["logprob"].dims == ("packed_position",)


# ------------------------------------------------------------------------------------- format
def test_format_1_stores_still_read(tmp_path):
    """Stores written by linpipe 0.1 (tests/data/store_v1: every record in its own group, no
    _packed/) open for reading with every value, and refuse writing with one clear line."""
    build = runpy.run_path(str(FORMAT_V1 / "build.py"))
    values = build["_values"]
    out = open_output(FORMAT_V1 / "dna")
    assert out.meta["format_version"] == 1 and out.complete
    assert list(out.records) == ["chr1/alt", "empty"] and out.record_table()["packed"].tolist() == [False] * 2
    ds = out.dataset("chr1/alt")
    np.testing.assert_array_equal(ds["logprob"].values, values(25))
    np.testing.assert_array_equal(ds["hidden"].values, values(25, 4, np.float16))
    assert out.dataset("empty").sizes["position"] == 0
    ts = open_output(FORMAT_V1 / "ts")
    assert ts.dataset("mitdb/100")["time"].dtype == np.dtype("datetime64[ns]")
    np.testing.assert_array_equal(ts.dataset("s2")["forecast"].values, values(6, 2))
    with pytest.warns(IncompleteStoreWarning, match=r"chr1/alt:10-20"):
        partial = open_output(FORMAT_V1 / "partial")
    assert partial.missing_ranges["chr1/alt"] == [(10, 20)]
    with pytest.raises(StoreError, match="output format 1; it can be read"):
        OutputStore.open(FORMAT_V1 / "dna", mode="r+")


def test_format_2_layout_files_grow_with_batches_not_records(tmp_path):
    """2,000 short records and one long one: the files are the long record's chunks and the
    batches' chunks, a constant number besides, whatever the number of records."""
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 300, size=2000)
    records = [{"id": f"contig_{i}", "length": int(n)} for i, n in enumerate(lengths)]
    records.append({"id": "chrL", "length": 25_000})
    store = OutputStore.create(tmp_path / "many.zarr", meta={}, records=records,
                               outputs=["logprob", "softmask"], unit_size=10_000)
    p = store.packed
    assert p.n_records == 2000 and p.positions == lengths.sum()
    per_batch = [sum(int(lengths[int(i.split("_")[1])]) for i in p.batch_ids(b)) for b in range(p.n_batches)]
    sizes = [len(p.batch_ids(b)) for b in range(p.n_batches)]
    assert max(per_batch) <= 10_000 and max(sizes) <= 256
    # every batch but the last is full: of positions (the next record would overflow) or of records
    assert all(n > 10_000 - 300 or k == 256 for n, k in zip(per_batch[:-1], sizes[:-1], strict=True))
    assert p.n_batches == len(per_batch) < 40
    for b in range(p.n_batches):
        n = sum(int(lengths[int(i.split("_")[1])]) for i in p.batch_ids(b))
        store.write_batch(b, {"logprob": np.full(n, b, np.float32), "softmask": np.ones(n, np.uint8)})
    for i in range(3):
        s, e = store.unit_range("chrL", i)
        store.write_unit("chrL", i, {"logprob": np.zeros(e - s, np.float32),
                                      "softmask": np.ones(e - s, np.uint8)})
    assert store.finalize()
    files = [f for f in (tmp_path / "many.zarr").rglob("*") if f.is_file()]
    # long record: 2 outputs x 3 chunks + 3 markers + 3 checksums; packed: 2 outputs, a marker
    # and a checksum per batch; the table: at most 7 single-chunk arrays (id, description,
    # length, offset, batch edges, the id index's two); metadata documents: a fixed number,
    # whatever the number of records
    data = [f for f in files if f.name != "zarr.json"]
    assert 12 + 4 * p.n_batches <= len(data) <= 12 + 4 * p.n_batches + 7
    assert len(files) - len(data) < 30
    out = open_output(tmp_path / "many.zarr")
    for i in (0, 777, 1999):
        rid = f"contig_{i}"
        assert out.dataset(rid).sizes["position"] == lengths[i]
        assert (out.dataset(rid)["logprob"].values == out.record(rid).batch).all()


# ------------------------------------------------------------------------------------- keys
def test_record_keys_are_safe_and_unique(tmp_path):
    ids = ["../../etc/passwd", "chr1/alt", "chr1_alt", "chr1", "CHR1", ".hidden", "..", "a\x00b\nc",
           "zarr.json", "_linpipe", "__x", "ok-id.1", "x" * 300]
    keys = make_keys(ids)
    assert keys == make_keys(ids)  # deterministic: driver and workers agree
    assert keys["chr1"] == "chr1" and keys["ok-id.1"] == "ok-id.1"
    assert len({k.lower() for k in keys.values()}) == len(ids)
    for k in keys.values():
        assert "/" not in k and ".." not in k and not k.startswith((".", "__")) and k.isprintable()
        assert k.lower() not in ("zarr.json", "_linpipe") and len(k) <= 100
    base = tmp_path / "inside"
    base.mkdir()
    store = OutputStore.create(base / "out.zarr", meta={},
                               records=[{"id": i, "length": 10, "modality": "dna"} for i in ids],
                               outputs=["logprob"], unit_size=4)
    for rid in ids:
        key = store.record_key(rid)
        for c in range(3):
            s, e = store.unit_range(key, c)
            store.write_unit(key, c, {"logprob": np.full(e - s, len(rid), np.float32)})
    assert all(store.completed_units(rid) == {0, 1, 2} for rid in ids)  # ids work as well as keys
    assert store.finalize()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inside"]
    assert sorted(p.name for p in base.iterdir()) == ["out.zarr"]
    root = (base / "out.zarr").resolve()
    for p in root.rglob("*"):
        assert p.resolve().is_relative_to(root)
    out = open_output(base / "out.zarr")
    for rid in ids:  # every id reads back its own values, by its original id
        ds = out.dataset(rid)
        assert ds.attrs["linpipe_record"]["id"] == rid
        assert (ds["logprob"].values == len(rid)).all()


# ------------------------------------------------------------------------------------- concurrency
WORKER = r"""
import sys, numpy as np
from linpipe.store import OutputStore
path, data, me, nproc = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
full = np.load(data)
store = OutputStore.open(path)
OUTS = ("logprob", "entropy", "softmask", "hidden")
ids = sorted(r.id for r in store.records.values() if not r.packed)
units = [(rid, i) for rid in ids for i in range(store.n_units(rid))]
units += [("batch", b) for b in range(store.packed.n_batches)]
rng = np.random.default_rng(me)
mine = [u for j, u in enumerate(units) if j % nproc == me]   # interleaved records and ranges
for rid, i in [mine[j] for j in rng.permutation(len(mine))]:
    if rid == "batch":
        rids = store.packed.batch_ids(i)
        store.write_batch(i, {o: np.concatenate([full[f"{r}.{o}"] for r in rids]) for o in OUTS})
        continue
    s, e = store.unit_range(rid, i)
    arrays = {o: full[f"{rid}.{o}"][s:e] for o in OUTS}
    store.write_unit(rid, i, arrays, state={"S": full[f"{rid}.hidden"][e - 1]})
"""


@pytest.mark.slow
def test_four_concurrent_writers_lose_nothing(tmp_path, genomes):
    path = tmp_path / "conc.zarr"
    chunk = 7_919  # odd, so ranges never line up with anything but the store's own chunks
    seqs = dna_records(genomes)
    full = {rid: markov_outputs(s) for rid, s in seqs.items()}
    np.savez(tmp_path / "full.npz", **{f"{rid}.{o}": a for rid, d in full.items() for o, a in d.items()})
    records = [{"id": rid, "length": len(s), "modality": "dna"} for rid, s in seqs.items()]
    OutputStore.create(path, meta={"job_id": "conc"}, records=records,
                       outputs=["logprob", "entropy", "softmask", "hidden"], unit_size=chunk,
                       feature_dim=FEATURES)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(path), str(tmp_path / "full.npz"), str(w),
                               "4"]) for w in range(4)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0, 0]
    store = OutputStore.open(path)
    assert store.finalize()
    assert store.packed.n_batches >= 1 and len(store.long_records) >= 1  # both kinds of unit ran
    for rid, arrays in full.items():
        for name, want in arrays.items():
            got = store.array(rid, name)[:]
            np.testing.assert_array_equal(got, want.astype(got.dtype))
        if store.record(rid).packed:
            continue
        for i in range(store.n_units(rid)):
            _, e = store.unit_range(rid, i)
            np.testing.assert_array_equal(store.boundary_state(rid, i)["S"], arrays["hidden"][e - 1])


# ------------------------------------------------------------------------------------- kills
KILLED = KILLED_OPEN + r"""
real_write_state = store._write_state
def write_state_then_hang(*a, **k):   # the data are on disk now; the marker is next
    real_write_state(*a, **k)
    flag.write_text("data written")
    time.sleep(120)
store._write_state = write_state_then_hang
""" + KILLED_WRITE


@pytest.mark.slow
def test_killed_writer_leaves_chunk_incomplete(tmp_path, genomes):
    path = tmp_path / "killed.zarr"
    store, full = build_dna_store(path, genomes, skip={("chr1", 1)}, finalize=False)
    assert not store.finalize()  # a chunk is missing: the store never claims completion
    kill_at_hook(KILLED, path, tmp_path / "flag")

    store = OutputStore.open(path)
    key = store.record_key("chr1")
    # the data of chunk 1 reached the disk, but the chunk is not marked complete
    assert (zarr.open_group(path, mode="r")[f"{key}/logprob"][UNIT:2 * UNIT] == -1.5).all()
    assert 1 not in store.completed_units(key)
    assert store.boundary_state(key, 1) is None
    assert store.missing_ranges(key) == [(UNIT, 2 * UNIT)]
    assert not store.finalize() and not store.is_complete()
    with pytest.warns(IncompleteStoreWarning, match=r"chr1:40000-80000"):
        out = open_output(path)
    assert out.missing_ranges[key] == [(UNIT, 2 * UNIT)] and not out.complete
    np.testing.assert_array_equal(out.dataset("chr1")["entropy"].values[:UNIT],
                                  full["chr1"]["entropy"][:UNIT])

    # resuming rewrites the chunk, and only then is the store complete
    s, e = store.unit_range(key, 1)
    store.write_unit(key, 1, {o: a[s:e] for o, a in full["chr1"].items()},
                      state=state_after(full["chr1"], e))
    assert store.finalize() and OutputStore.open(path, mode="r").is_complete()
    np.testing.assert_array_equal(zarr.open_group(path, mode="r")[f"{key}/logprob"][:],
                                  full["chr1"]["logprob"])
    # and the interrupted-then-resumed store holds exactly the bytes of an uninterrupted one
    clean = tmp_path / "clean.zarr"
    build_dna_store(clean, genomes)
    assert tree_bytes(path) == tree_bytes(clean)




# ------------------------------------------------------------------------------------- errors
def test_opening_errors(tmp_path, dna_store):
    with pytest.raises(StoreError, match="no such output store"):
        OutputStore.open(tmp_path / "nope.zarr")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="not a Zarr v3 store"):
        open_output(plain)
    with pytest.raises(StoreError, match="refusing to overwrite"):
        OutputStore.create(plain, meta={}, records=[], outputs=["logprob"], unit_size=10, overwrite=True)
    assert (plain / "notes.txt").read_text() == "mine"
    other = tmp_path / "other.zarr"
    zarr.open_group(other, mode="w", zarr_format=3).create_array("x", shape=(3,), dtype="i4")
    with pytest.raises(StoreError, match="not a linpipe output store"):
        open_output(other)

    half = tmp_path / "half.zarr"  # what create() leaves if killed before its last step
    zarr.open_group(half, mode="w", zarr_format=3, attributes={"linpipe_creating": True})
    with pytest.raises(StoreError, match="creation of this output store was interrupted"):
        OutputStore.open(half)
    OutputStore.create(half, meta={}, records=[{"id": "r", "length": 5}], unit_size=5)  # no --overwrite
    assert OutputStore.open(half).n_units("r") == 1

    newer = tmp_path / "newer.zarr"
    OutputStore.create(newer, meta={}, records=[{"id": "r", "length": 5}], outputs=["logprob"], unit_size=5)
    g = zarr.open_group(newer, mode="r+")
    g.attrs["linpipe"] = {**g.attrs["linpipe"], "format_version": FORMAT_VERSION + 1}
    with pytest.raises(StoreError, match=rf"format {FORMAT_VERSION + 1}, newer than this linpipe"):
        open_output(newer)

    path, _ = dna_store
    with pytest.raises(StoreError, match="already exists"):
        OutputStore.create(path, meta={}, records=[], outputs=["logprob"], unit_size=10)
    again = OutputStore.create(newer, meta={}, records=[{"id": "r", "length": 5}], unit_size=5,
                               overwrite=True)
    assert again.meta["outputs"] == ["logprob", "entropy", "softmask"]  # the dna default
    assert again.completed_units("r") == set() and not again.is_complete()
    ro = OutputStore.open(path, mode="r")
    with pytest.raises(StoreError, match="read-only"):
        ro.write_unit(ro.record_key("chr1"), 0, {})
    with pytest.raises(StoreError, match="no record 'chrZ'"):
        open_output(path).dataset("chrZ")


def test_write_chunk_validates(tmp_path):
    store = OutputStore.create(tmp_path / "v.zarr", meta={},
                               records=[{"id": "r", "length": 25, "modality": "dna"}],
                               outputs=["logprob", "entropy"], unit_size=10)
    key = store.record_key("r")
    assert store.n_units(key) == 3 and store.unit_range(key, 2) == (20, 25)
    with pytest.raises(StoreError, match="got outputs"):
        store.write_unit(key, 0, {"logprob": np.zeros(10)})
    with pytest.raises(StoreError, match=r"positions 20-25"):
        store.write_unit(key, 2, {"logprob": np.zeros(10), "entropy": np.zeros(10)})
    with pytest.raises(StoreError, match="out of range"):
        store.write_unit(key, 3, {"logprob": np.zeros(5), "entropy": np.zeros(5)})
    with pytest.raises(StoreError, match="not a dna output"):
        OutputStore.create(tmp_path / "w.zarr", meta={}, records=[{"id": "r", "length": 5}],
                           outputs=["forecast"], unit_size=10)
    with pytest.raises(StoreError, match="duplicate record id 'r'"):
        OutputStore.create(tmp_path / "d.zarr", meta={}, records=[{"id": "r", "length": 5}] * 2,
                           outputs=["logprob"], unit_size=10)
    assert 1 not in store.completed_units(key) and not store.finalize()
    # a chunk rewritten without a state loses the state of the earlier attempt
    store.write_unit(key, 0, {"logprob": np.zeros(10), "entropy": np.zeros(10)}, state={"S": np.ones(2)})
    assert store.boundary_state(key, 0)["S"].tolist() == [1, 1]
    store.write_unit(key, 0, {"logprob": np.ones(10), "entropy": np.ones(10)})
    assert store.completed_units(key) == {0} and store.boundary_state(key, 0) is None


def test_fsspec_url(tmp_path):
    url = f"file://{tmp_path / 'url.zarr'}"
    store = OutputStore.create(url, meta={"job_id": "u"},
                               records=[{"id": "r", "length": 15, "modality": "dna"}],
                               outputs=["logprob"], unit_size=10)
    key = store.record_key("r")
    store.write_unit(key, 1, {"logprob": np.arange(5, dtype=np.float32)}, state={"S": np.ones(2)})
    store.write_unit(key, 0, {"logprob": np.arange(10, dtype=np.float32)})
    assert store.finalize()
    out = open_output(url)
    np.testing.assert_array_equal(out.dataset("r")["logprob"].values, np.r_[np.arange(10), np.arange(5)])
    assert out.summary()["size_on_disk"] > 0
    # the same bytes as a local path
    assert OutputStore.open(tmp_path / "url.zarr", mode="r").boundary_state(key, 1)["S"].tolist() == [1, 1]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("data")
    with pytest.raises(StoreError, match="refusing to overwrite"):  # a URL prefix holding other data
        OutputStore.create(f"file://{tmp_path / 'other'}", meta={}, records=[], unit_size=5, overwrite=True)
    assert (tmp_path / "other" / "keep.txt").read_text() == "data"
    assert json.loads((tmp_path / "url.zarr" / "zarr.json").read_text())["attributes"]["linpipe"]["complete"]


@pytest.mark.parametrize("place", ["local", "file-url", pytest.param("s3", marks=pytest.mark.slow)])
def test_an_exclusive_write_refuses_an_object_that_is_there(place, tmp_path, request):
    """create_bytes (the driver's lease) writes an object only where none is, on every kind of
    place: a hard link locally, fsspec's exclusive write at a file:// URL and a conditional PUT
    on the S3 server; the object keeps the first writer's bytes."""
    from linpipe.store.location import Location

    where = {"local": lambda: str(tmp_path / "x.zarr"), "file-url": lambda: f"file://{tmp_path / 'x.zarr'}",
             "s3": lambda: f"{request.getfixturevalue('s3_server').new_bucket()}/x.zarr"}[place]()
    loc = Location(where, read_only=False)
    assert loc.read_bytes("_linpipe/lease.json") is None
    assert loc.create_bytes("_linpipe/lease.json", b"first") is True
    assert loc.create_bytes("_linpipe/lease.json", b"second") is False
    assert loc.read_bytes("_linpipe/lease.json") == b"first" and loc.is_empty()  # a lease alone
    loc.write_bytes("_linpipe/lease.json", b"third")  # replacing is another call
    assert loc.read_bytes("_linpipe/lease.json") == b"third"
    loc.delete("_linpipe/lease.json")
    assert loc.create_bytes("_linpipe/lease.json", b"fourth") is True


def test_a_refused_conditional_put_is_told_from_other_errors():
    """s3fs turns an S3 412 into FileExistsError only when the answer names its condition; one
    that does not arrives as OSError, and so does a permission error: only the 412 means that
    the object is there."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    from linpipe.store.s3fs_internals import create_refused

    def answer(code, status, **error):
        response = {"Error": {"Code": code, "Message": code, **error},
                    "ResponseMetadata": {"HTTPStatusCode": status}}
        return translate_boto_error(ClientError(response, "PutObject"))

    named = answer("PreconditionFailed", 412, Condition="If-None-Match")
    unnamed = answer("PreconditionFailed", 412)
    assert isinstance(named, FileExistsError) and create_refused(named)
    assert isinstance(unnamed, OSError) and not isinstance(unnamed, FileExistsError)
    assert create_refused(unnamed)
    assert not create_refused(answer("AccessDenied", 403)) and not create_refused(answer("SlowDown", 503))
    assert not create_refused(OSError(5, "Input/output error"))


def test_assembly_of_many_contigs(tmp_path, genomes):
    """42 real contigs, long ones in their own groups and short ones packed, read back one by one."""
    seqs = read_fasta(genomes / "abricate_Sepidermidis_ST14_assembly.fa")
    assert len(seqs) == 42
    records = [{"id": rid, "length": len(s), "modality": "dna"} for rid, s in seqs.items()]
    store = OutputStore.create(tmp_path / "asm.zarr", meta={}, records=records, unit_size=65_536)
    outs = ("logprob", "entropy", "softmask")
    full = {rid: {o: a for o, a in markov_outputs(seq).items() if o in outs} for rid, seq in seqs.items()}
    write_records(store, full, outs)
    assert store.finalize()
    assert 0 < len(store.long_records) < 42 and store.packed.n_records == 42 - len(store.long_records)
    out = open_output(tmp_path / "asm.zarr")
    for rid, seq in list(seqs.items())[::7]:
        ds = out.dataset(rid)
        assert ds.sizes["position"] == len(seq)
        np.testing.assert_array_equal(ds["softmask"].values, markov_outputs(seq)["softmask"])
        assert ds["softmask"].values.all()  # this assembly is entirely lowercase


def _compressors(path: Path, array: str) -> list[dict]:
    """The codecs after `bytes` in an array's zarr.json (the Zarr v3 document, read as JSON)."""
    doc = json.loads((path / array / "zarr.json").read_text())
    return [c for c in doc["codecs"] if c["name"] != "bytes"]


def test_a_store_keeps_the_codecs_it_was_created_with(tmp_path, genomes, monkeypatch):
    """New stores get CODEC_CHOICE; a store created with other codecs (an older linpipe's) is
    resumed with its own, and every unit verifies and reads back exactly."""
    from linpipe.store import CODEC_CHOICE
    from linpipe.store.verify import verify_store

    older = "blosc-zstd-5-shuffle"
    assert CODEC_CHOICE["logprob"] != older
    with monkeypatch.context() as m:
        for name in ("logprob", "entropy", "hidden"):
            m.setitem(CODEC_CHOICE, name, older)
        path = tmp_path / "older.zarr"
        skip = {("chr1", 1), ("chr1", 5)}
        store, full = build_dna_store(path, genomes, finalize=False, skip=skip)
        store.close()
    store = OutputStore.open(path)  # today's codec choice is back in force
    for rid, unit in sorted(skip):
        s, e = store.unit_range(rid, unit)
        store.write_unit(rid, unit, {o: full[rid][o][s:e] for o in full[rid]},
                         state=state_after(full[rid], e))
    assert store.finalize()
    key = store.record_key("chr1")
    for name in ("logprob", "entropy", "hidden"):
        assert _compressors(path, f"{key}/{name}") == \
            [{"name": "blosc", "configuration": {"typesize": 2 if name == "hidden" else 4, "cname": "zstd",
                                                  "clevel": 5, "shuffle": "shuffle", "blocksize": 0}}]
        np.testing.assert_array_equal(store.array("chr1", name)[:], full["chr1"][name].astype(
            store.array("chr1", name).dtype))
    report = verify_store(path, inputs=False)
    assert report.ok, [p.describe() for p in report.problems]

    fresh, _ = build_dna_store(tmp_path / "new.zarr", genomes)  # a new store: today's choice
    assert _compressors(tmp_path / "new.zarr", f"{fresh.record_key('chr1')}/logprob")[0]["configuration"][
        "cname"] == CODEC_CHOICE["logprob"].split("-")[1]
