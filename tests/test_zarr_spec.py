"""What linpipe takes from the Zarr v3 specification rather than from zarr-python's internals
(linpipe/store/zarr_spec.py): the node documents create writes from templates, the chunk keys
that name the files a unit fsyncs, and which files of a store are leftovers of killed writers.
Stores are real (real genomes, the format-2 fixture); zarr itself is the reference.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from _store_data import (
    KILLED_OPEN,
    KILLED_WRITE,
    build_dna_store,
    build_ts_store,
    kill_at_hook,
    state_after,
    tree_bytes,
)

from linpipe.errors import StoreError
from linpipe.store import OutputStore
from linpipe.store.layout import CODEC_CHOICE, checksum_array, done_array, record_arrays
from linpipe.store.zarr_spec import ZARR_JSON, array_chunk_key, chunk_key, leftovers

FORMAT_V2 = Path(__file__).parent / "data" / "store_v2" / "dna"


def _arrays(root: Path):
    """(path, zarr array) of every array under a store, through zarr's public API."""
    group = zarr.open_group(root, mode="r", zarr_format=3, use_consolidated=False)
    return [(path, node) for path, node in group.members(max_depth=None) if isinstance(node, zarr.Array)]


def _chunk_bytes(folder: Path) -> dict[str, bytes]:
    """The files of an array's folder but its document: chunk key -> bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and p.name != ZARR_JSON}


def _folders(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir()}


# ------------------------------------------------------------------------------ node documents
def test_documents_are_the_ones_zarr_writes(tmp_path, genomes, timeseries):
    """Every array document create writes from a template is byte for byte what zarr's own
    create_array writes for that array's spec at its real shape (both strands, hidden, an output
    over the bases with its labels, markers, a time coordinate and channels), and so are the
    channel names' chunks."""
    outputs = ["logprob", "logprob_rc", "entropy", "softmask", "logprob_acgt_rc", "hidden", "hidden_rc"]
    build_dna_store(tmp_path / "dna.zarr", genomes, write=False, outputs=outputs)
    build_ts_store(tmp_path / "ts.zarr", timeseries)
    reference = tmp_path / "reference"
    for name in ("dna.zarr", "ts.zarr"):
        store = OutputStore.open(tmp_path / name, mode="r")
        outputs = store.meta["outputs"]
        layout = {"unit_size": store.unit_size, "feature_dim": store.meta["feature_dim"],
                  "channels": store.meta["channels"], "hidden_dtype": store.meta["hidden_dtype"]}
        n_rc = len([o for o in outputs if o.endswith("_rc")])
        specs = {}
        for key in store.long_records:
            info = store.record(key)
            arrays = record_arrays(info.modality, info.length, info.time_dtype, outputs, **layout)
            specs.update({f"{key}/{s.name}": s for s in arrays})
            for strand, n in (("", len(outputs) - n_rc + bool(info.time_dtype)), ("_rc", n_rc)):
                if n:
                    specs[f"_linpipe/{key}/done{strand}"] = done_array(info.n_units)
                    specs[f"_linpipe/{key}/sum{strand}"] = checksum_array(info.n_units, n)
        for path, spec in specs.items():
            arr = zarr.create_array(store=reference / name, name=path, zarr_format=3, **spec.create_kwargs())
            if path.endswith("/channel"):  # the one array create fills: its chunks are zarr's too
                arr[:] = np.array(store.meta["channels"])
                assert _chunk_bytes(reference / name / path) == _chunk_bytes(tmp_path / name / path) != {}
            ours = (tmp_path / name / path / ZARR_JSON).read_bytes()
            assert ours == (reference / name / path / ZARR_JSON).read_bytes(), path
            assert json.loads(ours)["chunk_key_encoding"] == {"name": "default",
                                                              "configuration": {"separator": "/"}}
        # every array of the long records and their markers was compared (states: zarr's own)
        made = {p for p, _ in _arrays(tmp_path / name) if not p.startswith("_packed") and "/state" not in p
                and not p.startswith("_linpipe/_packed")}
        assert made == set(specs) and len(made) >= 7


# ----------------------------------------------------------------------------------- chunk keys
def test_chunk_keys_by_the_spec():
    assert chunk_key({"name": "default", "configuration": {"separator": "/"}}, (3, 0)) == "c/3/0"
    assert chunk_key({"name": "default", "configuration": {"separator": "."}}, (3, 0)) == "c.3.0"
    assert chunk_key({"name": "default"}, ()) == "c"
    assert chunk_key({"name": "v2", "configuration": {"separator": "."}}, (3, 0)) == "3.0"
    assert chunk_key({"name": "v2"}, ()) == "0"
    with pytest.raises(StoreError, match=r"chunk key encoding .*\"hashed\".* is not one linpipe reads"):
        chunk_key({"name": "hashed"}, (0,))
    with pytest.raises(StoreError, match="is not one linpipe reads"):
        chunk_key({"name": "default", "configuration": {"separator": "-"}}, (0,))


@pytest.mark.parametrize("encoding", [{"name": name, "separator": sep} for name in ("default", "v2")
                                      for sep in ("/", ".")])
def test_chunk_keys_name_the_files_zarr_writes(tmp_path, encoding):
    arr = zarr.create_array(store=tmp_path / "a.zarr", shape=(5, 4), chunks=(2, 3), dtype="int32",
                            chunk_key_encoding=encoding, zarr_format=3)
    arr[:] = np.arange(20).reshape(5, 4) + 1
    doc = json.loads((tmp_path / "a.zarr" / ZARR_JSON).read_text())
    keys = {array_chunk_key(doc, "", idx) for idx in np.ndindex(arr.cdata_shape)}
    assert len(keys) == 6 and keys == set(_chunk_bytes(tmp_path / "a.zarr"))


def test_chunk_keys_of_old_and_new_stores_are_their_files(tmp_path, genomes):
    """Stores made before the encoding was explicit (the format-2 fixture) and now: every stored
    chunk is the key of an index in its array's grid (what a unit's fsync names)."""
    path = tmp_path / "dna.zarr"
    build_dna_store(path, genomes)
    for root in (FORMAT_V2, path):
        n = 0
        for name, arr in _arrays(root):
            stored = set(_chunk_bytes(root / name))
            doc = json.loads((root / name / ZARR_JSON).read_text())
            assert stored <= {array_chunk_key(doc, name, idx) for idx in np.ndindex(arr.cdata_shape)}, name
            n += len(stored)
        assert n > 20


# ------------------------------------------------------------------------------------ leftovers
def test_planted_strays_are_removed_and_every_chunk_stays(tmp_path, genomes):
    path = tmp_path / "out.zarr"
    store, _ = build_dna_store(path, genomes, finalize=False)
    clean = tmp_path / "clean.zarr"
    shutil.copytree(path, clean)
    key = store.record_key("chr1")
    strays = [f"{key}/logprob/c/1.{'ab' * 16}.partial",  # a chunk zarr had not renamed yet
              f"{key}/logprob/zarr.{'cd' * 16}.partial",  # a document likewise
              f"_linpipe/{key}/done/c/notes.txt", f"_linpipe/{key}/sum/c/0/x", f"{key}/logprob/c/99/0",
              f"_linpipe/lease.json.{'ef' * 16}.partial", "stray.txt", f"{key}/extra/0"]
    for rel in strays:
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(b"junk")
    (path / "_linpipe" / "lease.json").write_text("{}")  # a driver's lease: kept
    found = leftovers(path, keep={"_linpipe/lease.json"})
    assert sorted(os.path.relpath(f, path) for f in found) == sorted(strays)

    assert store.finalize()
    assert (path / "_linpipe" / "lease.json").read_text() == "{}"
    (path / "_linpipe" / "lease.json").unlink()
    assert OutputStore.open(clean).finalize()
    assert tree_bytes(path) == tree_bytes(clean)  # every chunk and document, nothing else
    assert _folders(path) == _folders(clean)  # and no folder the strays made
    assert list(leftovers(FORMAT_V2)) == []  # an older store holds nothing to remove


def test_an_unreadable_array_document_is_never_judged(tmp_path):
    arr = zarr.create_array(store=tmp_path / "a.zarr", name="x", shape=(4,), chunks=(2,), dtype="int8",
                            zarr_format=3)
    arr[:] = 1
    doc = tmp_path / "a.zarr" / "x" / ZARR_JSON
    doc.write_text(doc.read_text().replace('"name": "default"', '"name": "someday"'))
    assert list(leftovers(tmp_path / "a.zarr")) == []  # an encoding not known: its chunks stay
    doc.write_text("{")
    assert list(leftovers(tmp_path / "a.zarr")) == []


KILLED_MID_CHUNK = KILLED_OPEN + r"""
replace = os.replace
def hang_before_rename(src, dst, *a, **k):   # the chunk's bytes are in zarr's temporary file
    if "/logprob/c/" in os.fspath(src):
        flag.write_text(os.fspath(src))
        time.sleep(120)
    return replace(src, dst, *a, **k)
os.replace = hang_before_rename
""" + KILLED_WRITE


@pytest.mark.slow
def test_a_writer_killed_mid_chunk_leaves_nothing_after_the_resume(tmp_path, genomes):
    """A writer SIGKILLed while zarr wrote a chunk leaves its temporary file in the store; the
    resumed store ends with exactly the files and bytes of an uninterrupted one."""
    path = tmp_path / "killed.zarr"
    store, full = build_dna_store(path, genomes, skip={("chr1", 1)}, finalize=False)
    flag = tmp_path / "flag"
    kill_at_hook(KILLED_MID_CHUNK, path, flag)
    leftover = Path(flag.read_text())
    assert leftover.is_file() and [Path(f) for f in leftovers(path)] == [leftover]

    store = OutputStore.open(path)
    key = store.record_key("chr1")
    s, e = store.unit_range(key, 1)
    store.write_unit(key, 1, {o: a[s:e] for o, a in full["chr1"].items()}, state=state_after(full["chr1"], e))
    assert store.finalize() and not leftover.exists()
    clean = tmp_path / "clean.zarr"
    build_dna_store(clean, genomes)
    assert tree_bytes(path) == tree_bytes(clean)


KILLED_LAYING_OUT = r"""
import sys, time
from pathlib import Path
from linpipe.store import OutputStore
from linpipe.store.location import Location
path, flag = sys.argv[1], Path(sys.argv[2])
write_objects = Location.write_objects
def half_then_hang(self, objects):   # half the node documents are on disk
    items = sorted(objects.items())
    write_objects(self, dict(items[:len(items) // 2]))
    flag.write_text("half")
    time.sleep(120)
Location.write_objects = half_then_hang
OutputStore.create(path, meta={}, records=[{"id": f"contig_{i}", "length": 5000 + i} for i in range(50)],
                   unit_size=1000)
"""


@pytest.mark.slow
def test_a_driver_killed_while_laying_out_leaves_a_store_marked_as_being_created(tmp_path):
    """The documents go in before the root's `linpipe` attributes: a store whose layout was
    SIGKILLed halfway is refused as interrupted, and laid out anew without --overwrite."""
    path = tmp_path / "half.zarr"
    kill_at_hook(KILLED_LAYING_OUT, path, tmp_path / "flag")
    assert OutputStore.exists(path) and OutputStore.creation_interrupted(path)
    with pytest.raises(StoreError, match="creation of this output store was interrupted"):
        OutputStore.open(path)
    records = [{"id": f"contig_{i}", "length": 5000 + i} for i in range(50)]
    OutputStore.create(path, meta={}, records=records, unit_size=1000)  # no overwrite needed
    OutputStore.create(tmp_path / "clean.zarr", meta={}, records=records, unit_size=1000)
    assert tree_bytes(path) == tree_bytes(tmp_path / "clean.zarr")
    assert OutputStore.open(path).n_units("contig_49") == 6


# ------------------------------------------------------------------------------ chunk bytes
CODEC_SPECS = sorted(set(CODEC_CHOICE.values()) | {"none", "zstd-3", "blosc-zstd-5-shuffle",
                                                   "blosc-lz4-5-noshuffle+crc32c"})


@pytest.mark.parametrize("spec", CODEC_SPECS)
@pytest.mark.parametrize("dtype,width", [("float32", None), ("float16", 6), ("uint8", None), ("int64", None)])
def test_chunks_written_directly_are_the_bytes_zarr_writes(tmp_path, genomes, spec, dtype, width):
    """A whole chunk and the array's last, partial one, written by rawchunks (the spec's codecs
    through numcodecs and google-crc32c, no zarr call) are byte for byte the files zarr writes
    for the same values, and zarr reads them back as those values. The values are a real
    genome's bases, so compressors see real runs."""
    from linpipe.store.layout import codecs_for
    from linpipe.store.location import Location
    from linpipe.store.rawchunks import RawChunks

    tokens = linpipe_tokens(genomes / "htslib_ce.fa", 2500 * (width or 1))
    values = tokens.astype(dtype) if dtype != "float16" else (tokens / 7).astype(dtype)
    values = values.reshape((2500,) + ((width,) if width else ()))
    shape, chunks = values.shape, (1024,) + ((width,) if width else ())
    kw = dict(shape=shape, chunks=chunks, dtype=dtype, compressors=codecs_for(spec),
              fill_value=np.nan if dtype.startswith("float") else 0)
    by_zarr = zarr.open_group(tmp_path / "zarr", mode="w").create_array("a", **kw)
    by_zarr[:] = values
    direct = zarr.open_group(tmp_path / "direct", mode="w").create_array("a", **kw)
    raw = RawChunks(Location(tmp_path / "direct", read_only=False))
    files = [raw.write(direct, (i,) + (0,) * (len(shape) - 1), values[i * 1024:(i + 1) * 1024])
             for i in range(3)]
    assert all(f is not None for f in files)  # none of them went through zarr
    written = _chunk_bytes(tmp_path / "direct" / "a")
    assert sorted(written) == (["c/0", "c/1", "c/2"] if width is None else ["c/0/0", "c/1/0", "c/2/0"])
    assert written == _chunk_bytes(tmp_path / "zarr" / "a")
    np.testing.assert_array_equal(zarr.open_group(tmp_path / "direct", mode="r")["a"][:], values)


def linpipe_tokens(path, n: int) -> np.ndarray:
    """The first n bases of a real genome as linpipe's tokens."""
    import linpipe

    with linpipe.open_input(path) as inp:
        rid = max(inp.records, key=lambda r: r.length).id
        return inp.read(rid, 0, n)[0]
