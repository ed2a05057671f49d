"""The output store: one Zarr v3 store per job, written by many workers at once.

Safe by construction (docs/output-format.md): along the position/time axis every Zarr chunk is
exactly one work unit (`chunk_size` positions), with no sharding, so the worker that owns chunk
i of a record is the only process that ever writes any Zarr chunk i of that record's arrays.
Progress lives beside the outputs in `_linpipe/<key>/`: a `done` array with one Zarr chunk per
work unit, and one array per boundary state, each again written only by its owner. Root
metadata is written only by `create` and `finalize` (the driver).

Order inside `write_chunk`: data, then boundary state, then the completion marker, each flushed
to disk (fsync on local paths) before the next, so a chunk marked complete is durable and a
process killed at any moment leaves its chunk unmarked.

OSError (a full disk, a lost mount) passes through unchanged: the jobs layer reports it with
the file name and keeps the store resumable.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from linpipe import __version__
from linpipe.errors import StoreError
from linpipe.model.outputs import DNA
from linpipe.store.keys import make_keys
from linpipe.store.layout import (
    CREATING,
    DEFAULT_OUTPUTS,
    FORMAT,
    FORMAT_VERSION,
    HIDDEN_DTYPES,
    OUTPUT_KINDS,
    PROGRESS,
    PROGRESS_ABOUT,
    TIME,
    channel_array,
    done_array,
    progress_path,
    record_arrays,
    record_path,
    state_array,
    state_path,
)

_PARTIAL = re.compile(r"\.[0-9a-f]{32}\.partial$")  # zarr's LocalStore temp name before the rename
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    """Threads for fsyncs and small writes: the disk (or the object store) queues them together."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="linpipe-store")
    return _POOL


# ---------------------------------------------------------------------------------- locations
class _Location:
    """Where a store lives: a local folder or an fsspec URL (s3://, gs://, file://, memory://).

    Holds the zarr Store, and answers the few questions zarr has no synchronous public API
    for (is anything there, how many bytes) through the file system or fsspec.
    """

    def __init__(self, path, *, read_only: bool):
        from zarr.storage import FsspecStore, LocalStore

        self.where = os.fspath(path)
        self.url = self.where if "://" in self.where else None
        # fsspec's local file system does not create parent folders unless asked
        self.options = {"auto_mkdir": True} if self.where.startswith(("file://", "local://")) else None
        if self.url is None:
            self.root: Path | None = Path(self.where)
            self.store = LocalStore(self.root, read_only=read_only)
            return
        self.root = None
        try:
            self.store = FsspecStore.from_url(self.url, read_only=read_only, storage_options=self.options)
        except Exception as e:  # missing fsspec backend, bad URL
            raise StoreError(f"{self.where}: cannot open the output location ({e}); check the URL, "
                             "and install the fsspec backend for its scheme (e.g. s3fs, gcsfs)") from None

    def _fs(self):
        from fsspec.core import url_to_fs

        return url_to_fs(self.url, **(self.options or {}))

    def exists(self) -> bool:
        if self.root is not None:
            return self.root.exists()
        fs, p = self._fs()
        return fs.exists(p)

    def is_empty(self) -> bool:
        if self.root is not None:
            return not self.root.exists() or not any(self.root.iterdir())
        fs, p = self._fs()
        return not fs.exists(p) or not fs.find(p, withdirs=True, maxdepth=1)

    def files(self):
        """Paths of every file under a local store (nothing for a URL)."""
        if self.root is None:
            return
        for dirpath, _dirs, names in os.walk(self.root):
            for name in names:
                yield os.path.join(dirpath, name)

    def size(self) -> int:
        if self.root is None:
            fs, p = self._fs()
            return int(fs.du(p, total=True)) if fs.exists(p) else 0
        total = 0
        for f in self.files():
            try:
                total += os.path.getsize(f)
            except OSError:  # removed while we walked
                pass
        return total


def _jsonable(obj, where: str):
    try:
        return json.loads(json.dumps(obj))
    except (TypeError, ValueError) as e:
        raise StoreError(f"{where}: metadata is not JSON-serialisable ({e}); pass plain "
                         "str/int/float/bool/list/dict values") from None


def _fsync(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # an all-fill chunk is not stored: nothing to flush
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _records_only(store):
    """The store as consolidation sees it: the root lists the record groups but not `_linpipe/`
    (markers and boundary states, tens of thousands of nodes on a large genome), so the root
    document stays small. linpipe itself always reads with use_consolidated=False."""
    from zarr.storage import WrapperStore

    class RecordsOnly(WrapperStore):
        async def list_dir(self, prefix: str):
            async for name in super().list_dir(prefix):
                if prefix or name != PROGRESS:
                    yield name

    return RecordsOnly(store)


class _Templates:
    """Zarr metadata documents for every node of a record, made once per kind of record.

    zarr's per-node create calls cost tens of ms each, which is minutes for an assembly of
    thousands of contigs. So zarr lays out one record of each kind in memory, and each record
    gets those metadata objects with its own shape and attributes; zarr.create_hierarchy then
    writes them all concurrently.
    """

    def __init__(self, outputs, *, chunk_size, feature_dim, channels, hidden_dtype):
        import zarr
        from zarr.storage import MemoryStore

        self.layout = {"chunk_size": chunk_size, "feature_dim": feature_dim, "channels": channels,
                       "hidden_dtype": hidden_dtype}
        self.outputs = outputs
        self._mem = MemoryStore()
        self.group = zarr.create_group(store=self._mem, zarr_format=3).metadata
        self.done = self._array(done_array(1))
        self._arrays: dict[tuple, dict] = {}

    def _array(self, spec):
        import zarr

        return zarr.create_array(store=self._mem, name=spec.name, zarr_format=3, overwrite=True,
                                 **spec.create_kwargs()).metadata

    def record_nodes(self, key: str, info: dict) -> dict:
        """path -> metadata of the record's group, its arrays, its progress group and markers."""
        specs = record_arrays(info, self.outputs, **self.layout)
        kind = (info["modality"], info.get("time_dtype"))
        if kind not in self._arrays:
            self._arrays[kind] = {s.name: self._array(s) for s in specs}
        arrays = self._arrays[kind]
        nodes = {record_path(key): dataclasses.replace(self.group, attributes={"linpipe_record": info})}
        for s in specs:
            nodes[record_path(key, s.name)] = arrays[s.name].update_shape(s.shape)
        nodes[progress_path(key)] = dataclasses.replace(self.group, attributes={"id": info["id"]})
        nodes[progress_path(key, "done")] = self.done.update_shape((int(info["n_chunks"]),))
        return nodes


# ---------------------------------------------------------------------------------- the store
class OutputStore:
    """A linpipe output store opened for writing (driver and workers) or reading."""

    def __init__(self, location: _Location, group, *, mode: str):
        self._location = location
        self.path = location.where
        self._group = group
        self.mode = mode
        self._meta = dict(group.attrs["linpipe"])
        self._keys_by_id = {info["id"]: key for key, info in self._meta["records"].items()}
        self._arrays: dict[str, object] = {}

    # ------------------------------------------------------------------ create / open
    @classmethod
    def create(cls, path, *, meta: dict, records: list[dict], outputs=None, chunk_size: int,
               feature_dim: int | None = None, channels=None, overwrite: bool = False,
               hidden_dtype: str = "float16") -> "OutputStore":
        """Lay out a new store: root metadata, one group per record, every array empty."""
        import zarr

        where = os.fspath(path)
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise StoreError(f"{where}: chunk_size must be a positive integer, got {chunk_size!r}")
        if hidden_dtype not in HIDDEN_DTYPES:
            raise StoreError(f"{where}: hidden dtype must be float16 or float32, got {hidden_dtype!r}")
        if outputs is None:  # the default for the records' modality (hidden is large: opt in)
            outputs = DEFAULT_OUTPUTS[records[0].get("modality", DNA)] if records else []
        outputs = list(outputs)
        ids = [str(r["id"]) for r in records]
        seen: set[str] = set()
        for rid in ids:
            if rid in seen:
                raise StoreError(f"{where}: duplicate record id {rid!r}")
            seen.add(rid)
        if isinstance(channels, int):
            channels = [str(i) for i in range(channels)]
        channels = None if channels is None else [str(c) for c in channels]

        keys = make_keys(ids)
        rec_meta: dict[str, dict] = {}
        for r in records:
            modality = r.get("modality", DNA)
            if modality not in OUTPUT_KINDS:
                raise StoreError(f"{where}: record {r['id']!r}: unknown modality {modality!r}")
            for name in outputs:
                if name not in OUTPUT_KINDS[modality]:
                    raise StoreError(f"{where}: record {r['id']!r}: output {name!r} is not a "
                                     f"{modality} output (one of {', '.join(OUTPUT_KINDS[modality])})")
                kind = OUTPUT_KINDS[modality][name]
                if kind.trailing == "feature" and not feature_dim:
                    raise StoreError(f"{where}: output {name!r} needs feature_dim")
                if kind.trailing == "channel" and not channels:
                    raise StoreError(f"{where}: output {name!r} needs channels")
            length = int(r["length"])
            if length < 0:
                raise StoreError(f"{where}: record {r['id']!r}: negative length {length}")
            info = {"id": str(r["id"]), "description": str(r.get("description", "")),
                    "length": length, "modality": modality, "input": r.get("input"),
                    "n_chunks": math.ceil(length / chunk_size)}
            if r.get("time_dtype"):
                info["time_dtype"] = str(np.dtype(r["time_dtype"]))
            rec_meta[keys[info["id"]]] = info

        root_meta = _jsonable(dict(meta), where)
        root_meta.update({
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "linpipe_version": root_meta.get("version", __version__),
            "outputs": outputs, "chunk_size": chunk_size, "feature_dim": feature_dim,
            "channels": channels, "hidden_dtype": hidden_dtype, "records": rec_meta,
            "complete": False,
        })
        root_meta = _jsonable(root_meta, where)

        location = _Location(path, read_only=False)
        _check_overwrite(location, overwrite)
        # the `linpipe` attributes go in last: a store whose creation was interrupted is
        # recognisably half-made (CREATING), never taken for a valid empty store
        root = zarr.open_group(store=location.store, mode="w", zarr_format=3, attributes={CREATING: True})
        root.create_group(PROGRESS, attributes={"about": PROGRESS_ABOUT})
        templates = _Templates(outputs, chunk_size=chunk_size, feature_dim=feature_dim, channels=channels,
                               hidden_dtype=hidden_dtype)
        nodes = {}
        for key, info in rec_meta.items():
            nodes.update(templates.record_nodes(key, info))
        # overwrite=True: the location was just emptied, so zarr need not first read every path
        # to see whether a node is already there (it only clears paths that do not exist)
        with zarr.config.set({"async.concurrency": 64}):
            created = dict(zarr.create_hierarchy(store=location.store, nodes=nodes, overwrite=True))
        # the channel names are the one array that holds data from the start
        name = channel_array(channels or []).name
        coords = [created[record_path(k, name)] for k in rec_meta if record_path(k, name) in created]
        labels = np.array(channels or [])

        def fill(arr):
            arr[:] = labels

        list(_pool().map(fill, coords))
        root.attrs.put({"linpipe": root_meta})
        return cls(location, root, mode="r+")

    @classmethod
    def open(cls, path, mode: str = "r+") -> "OutputStore":
        """Open an existing store; refuses non-linpipe stores and newer format versions."""
        if mode not in ("r", "r+"):
            raise StoreError(f"{os.fspath(path)}: mode must be 'r' or 'r+', got {mode!r}")
        location = _Location(path, read_only=(mode == "r"))
        return cls(location, _open_root(location), mode=mode)

    # ------------------------------------------------------------------ metadata
    @property
    def meta(self) -> dict:
        """The root `linpipe` attributes (model, inputs, outputs, chunk length, job id ...)."""
        return self._meta

    @property
    def chunk_size(self) -> int:
        return int(self._meta["chunk_size"])

    @property
    def records(self) -> dict[str, dict]:
        """key -> {id, description, length, modality, input, n_chunks}."""
        return self._meta["records"]

    @property
    def zarr_store(self):
        """The zarr Store under this output store (for xarray.open_zarr and zarr.open_group)."""
        return self._location.store

    def record_key(self, record_id: str) -> str:
        try:
            return self._keys_by_id[str(record_id)]
        except KeyError:
            raise StoreError(f"{self.path}: no record {record_id!r} in this store") from None

    def key(self, key_or_id: str) -> str:
        """The group key, given a key or an original record id (keys win when both match)."""
        if key_or_id in self._meta["records"]:
            return key_or_id
        if str(key_or_id) in self._keys_by_id:
            return self._keys_by_id[str(key_or_id)]
        raise StoreError(f"{self.path}: no record {key_or_id!r} in this store")

    def n_chunks(self, key: str) -> int:
        return int(self.records[self.key(key)]["n_chunks"])

    def chunk_range(self, key: str, chunk_index: int) -> tuple[int, int]:
        """[start, end) positions of one work unit."""
        length = int(self.records[self.key(key)]["length"])
        return chunk_index * self.chunk_size, min(length, (chunk_index + 1) * self.chunk_size)

    def output_names(self, key: str) -> list[str]:
        """The arrays of a record that write_chunk takes: the outputs, and `time` if it has one."""
        names = list(self._meta["outputs"])
        if self.records[self.key(key)].get("time_dtype"):
            names.append(TIME)
        return names

    def array(self, key: str, name: str):
        """The zarr array of one output (or `time`/`channel`) of a record."""
        key = self.key(key)
        try:
            return self._array(record_path(key, name))
        except KeyError:
            raise StoreError(f"{self.path}: record {self.records[key]['id']!r} has no output "
                             f"{name!r} (it has {', '.join(self.output_names(key))})") from None

    def _array(self, path: str):
        arr = self._arrays.get(path)
        if arr is None:
            arr = self._arrays[path] = self._group[path]
        return arr

    # ------------------------------------------------------------------ writing
    def write_chunk(self, key: str, chunk_index: int, arrays: dict, state: dict | None = None):
        """Write one work unit: every output over the chunk's range, then its state, then done.

        arrays: name -> array over exactly [chunk_index*chunk_size, min(length, (i+1)*chunk_size))
        (and `time`, when the record was created with a time_dtype). state: the boundary state
        after this chunk, as plain numpy arrays (ModelState.to_arrays()).
        """
        key = self.key(key)
        if self.mode == "r":
            raise StoreError(f"{self.path}: opened read-only")
        info = self.records[key]
        n = int(info["n_chunks"])
        if not 0 <= chunk_index < n:
            raise StoreError(f"{self.path}: record {info['id']!r}: chunk {chunk_index} out of range "
                             f"(the record has {n} chunks)")
        start, end = self.chunk_range(key, chunk_index)
        expected = self.output_names(key)
        if set(arrays) != set(expected):
            raise StoreError(f"{self.path}: record {info['id']!r} chunk {chunk_index}: got outputs "
                             f"{sorted(arrays)}, the store holds {sorted(expected)}")
        prepared = {}
        for name in expected:
            arr = self._array(record_path(key, name))
            data = np.asarray(arrays[name])
            if name == TIME and np.issubdtype(data.dtype, np.datetime64):
                data = data.astype("datetime64[ns]").view("int64")
            want = (end - start,) + tuple(arr.shape[1:])
            if data.shape != want:
                raise StoreError(f"{self.path}: record {info['id']!r} chunk {chunk_index}: {name} has "
                                 f"shape {data.shape}, expected {want} for positions {start}-{end}")
            prepared[name] = (arr, data.astype(arr.dtype, copy=False))

        done = self._array(progress_path(key, "done"))
        if done[chunk_index]:  # rewriting a finished chunk: it is not finished while we do
            done[chunk_index] = 0
            self._sync([(done, (chunk_index,))])

        for arr, data in prepared.values():  # 1. data: whole Zarr chunks only
            arr[start:end] = data
        self._sync([(arr, (chunk_index,) + (0,) * (arr.ndim - 1)) for arr, _ in prepared.values()])

        if state is not None:  # 2. the boundary state after this chunk, in its own array
            self._write_state(key, chunk_index, state)
        else:  # no stale state from an earlier attempt may outlive this write
            del self._group[state_path(key, chunk_index)]

        done[chunk_index] = 1  # 3. the marker, last
        self._sync([(done, (chunk_index,))])

    def _write_state(self, key: str, chunk_index: int, state: dict):
        """One uint8 array per boundary holding the state as a safetensors blob (names, dtypes
        and shapes included): one metadata file and one chunk, whatever the model's layers."""
        import zarr
        from safetensors.numpy import save

        tensors = {str(k): np.ascontiguousarray(np.asarray(v)) for k, v in state.items()}
        blob = np.frombuffer(save(tensors), dtype=np.uint8)
        path = state_path(key, chunk_index)
        arr = zarr.create_array(store=self.zarr_store, name=path, overwrite=True, zarr_format=3,
                                **state_array(blob.size).create_kwargs())
        arr[:] = blob
        self._sync([(arr, (0,))], also=[f"{path}/zarr.json"])

    def _sync(self, chunks, also=()):
        """fsync the files just written (local stores), so 'done' never outruns the data."""
        root = self._location.root
        if root is None:
            return  # object stores make a PUT durable when it returns
        files = [root / a.path / a.metadata.encode_chunk_key(idx) for a, idx in chunks]
        files += [root / p for p in also]
        # the rename that made each file visible lives in its directory: flush those too
        targets = files + sorted({f.parent for f in files})
        list(_pool().map(_fsync, targets))

    # ------------------------------------------------------------------ progress
    def completed_chunks(self, key: str) -> set[int]:
        done = self._array(progress_path(self.key(key), "done"))
        return set(np.flatnonzero(done[:]).tolist())

    def missing_ranges(self, key: str) -> list[tuple[int, int]]:
        """Position ranges [start, end) not yet written, adjacent chunks merged."""
        key = self.key(key)
        done = self.completed_chunks(key)
        out: list[tuple[int, int]] = []
        for i in range(self.n_chunks(key)):
            if i in done:
                continue
            s, e = self.chunk_range(key, i)
            if out and out[-1][1] == s:
                out[-1] = (out[-1][0], e)
            else:
                out.append((s, e))
        return out

    def boundary_state(self, key: str, chunk_index: int) -> dict | None:
        """The state saved after `chunk_index`, or None when that chunk is not complete (or was
        written without a state)."""
        import zarr
        from safetensors.numpy import load

        key = self.key(key)
        if chunk_index not in self.completed_chunks(key):
            return None
        try:
            arr = zarr.open_array(store=self.zarr_store, path=state_path(key, chunk_index), mode="r",
                                  zarr_format=3)
        except (FileNotFoundError, KeyError, ValueError):
            return None
        return load(arr[:].tobytes())

    def is_complete(self) -> bool:
        return bool(self._group.attrs["linpipe"].get("complete", False))

    def record_complete(self, key: str) -> bool:
        """True when every chunk of the record is written (data, state and marker)."""
        key = self.key(key)
        return len(self.completed_chunks(key)) == self.n_chunks(key)

    def finalize(self) -> bool:
        """Mark the store complete when every chunk of every record is done; True if it is.

        Consolidates the record groups' metadata into the root document first (they never change
        again), so xarray opens a record without listing the store, and only then sets `complete`:
        a finalize killed in between leaves a store that is consolidated but not yet complete,
        which the next finalize finishes.
        """
        import zarr

        if self.mode == "r":
            raise StoreError(f"{self.path}: opened read-only")
        if not all(self.record_complete(key) for key in self.records):
            return False
        meta = {**self._group.attrs["linpipe"], "complete": True}
        self._remove_partial_files()
        with warnings.catch_warnings():  # zarr: consolidated metadata is not in the v3 spec yet
            warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
            root = zarr.consolidate_metadata(_records_only(self.zarr_store), zarr_format=3)
        root.update_attributes({"linpipe": meta})
        self._group = zarr.open_group(store=self.zarr_store, mode="r+", zarr_format=3, use_consolidated=False)
        self._arrays.clear()
        self._meta = meta
        return True

    def _remove_partial_files(self):
        """Delete temporary files that writers killed mid-write left behind (local stores)."""
        for f in self._location.files():
            if _PARTIAL.search(f):
                try:
                    os.unlink(f)
                except FileNotFoundError:
                    pass

    def size_on_disk(self) -> int:
        """Bytes stored under the store's root (files on disk, or objects in a bucket)."""
        return self._location.size()

    def close(self):
        self._arrays.clear()


def _check_overwrite(location: _Location, overwrite: bool):
    """Refuse to clobber an existing store unless asked, and never clobber anything that is not a
    linpipe store (creating empties the location: a mistyped --out must not cost a home
    directory or a bucket prefix)."""
    import zarr

    where = location.where
    if location.root is not None and location.root.exists() and not location.root.is_dir():
        raise StoreError(f"{where}: exists and is not a directory")
    if location.is_empty():
        return
    try:
        existing = zarr.open_group(store=location.store, mode="r", zarr_format=3, use_consolidated=False)
        is_ours = isinstance(existing.attrs.get("linpipe"), dict)
        if CREATING in existing.attrs and not is_ours:
            return  # linpipe's own half-made store: safe to lay out again
    except Exception:  # not a Zarr group at all
        is_ours = False
    if not is_ours:
        raise StoreError(f"{where}: exists and is not a linpipe output store; "
                         "refusing to overwrite it (choose another --out)")
    if not overwrite:
        raise StoreError(f"{where}: an output store already exists (use --overwrite to replace it)")


def _open_root(location: _Location):
    """The root group of a linpipe store, or a StoreError that says what is wrong."""
    import zarr

    where = location.where
    if location.root is not None and not location.root.exists():
        raise StoreError(f"{where}: no such output store")
    try:
        group = zarr.open_group(store=location.store, mode="r" if location.store.read_only else "r+",
                                zarr_format=3, use_consolidated=False)
    except Exception:
        raise StoreError(f"{where}: not a Zarr v3 store (no linpipe output here)") from None
    meta = group.attrs.get("linpipe")
    if meta is None and CREATING in group.attrs:
        raise StoreError(f"{where}: the creation of this output store was interrupted; "
                         "run the job again to create it anew")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise StoreError(f"{where}: a Zarr store, but not a linpipe output store "
                         "(no 'linpipe' root attributes)")
    version = meta.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise StoreError(f"{where}: written in linpipe output format {version}, newer than this "
                         f"linpipe ({__version__}) reads (up to {FORMAT_VERSION}); upgrade linpipe")
    return group

