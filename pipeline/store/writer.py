"""The output store: one Zarr v3 store per job, written by many workers at once.

Safe by construction (docs/output-format.md): along the position/time axis every Zarr chunk is
exactly one work unit (`chunk_size` positions), with no sharding, so the worker that owns chunk
i of a record is the only process that ever writes any Zarr chunk i of that record's arrays.
Progress lives beside the outputs in `_linpipe/<key>/`: a `done` array with one Zarr chunk per
work unit, and one group per boundary state, each again written only by its owner. Root
metadata is written only by `create` and `finalize` (the driver).

Order inside `write_chunk`: data, then boundary state, then the completion marker, each flushed
to disk (fsync on local paths) before the next, so a chunk marked complete is durable and a
process killed at any moment leaves its chunk unmarked.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import numpy as np

from linpipe import __version__
from linpipe.errors import StoreError
from linpipe.model.outputs import DNA, MODALITIES, OUTPUTS, TIMESERIES, output_names
from linpipe.store.keys import make_keys

FORMAT = "linpipe-output"
FORMAT_VERSION = 1
PROGRESS = "_linpipe"  # root group holding completion markers and boundary states
CREATING = "linpipe_creating"  # root attribute while create() lays the store out

# Per-output facts (dtype, trailing dim, units, compressor) live in linpipe.model.outputs.
POSITION_DIM = {DNA: "position", TIMESERIES: "time"}
TIME_UNITS = "nanoseconds since 1970-01-01"
TIME_CODEC = "blosc-zstd-5-bitshuffle"  # the time coordinate of a series (store_compression.py)
DEFAULT_OUTPUTS = {m: list(output_names(m, default=True)) for m in MODALITIES}
OUTPUT_KINDS = {m: {s.name: s for s in OUTPUTS[m]} for m in MODALITIES}
CODEC_CHOICE = {s.name: s.codec for m in MODALITIES for s in OUTPUTS[m]} | {"time": TIME_CODEC}


def codecs_for(spec: str):
    """Zarr v3 compressors for a spec like 'zstd-3' or 'blosc-zstd-5-shuffle'."""
    from zarr.codecs import BloscCodec, ZstdCodec

    if spec == "none":
        return None
    if spec.startswith("zstd-"):
        return [ZstdCodec(level=int(spec.split("-")[1]))]
    _, cname, level, shuffle = spec.split("-")
    return [BloscCodec(cname=cname, clevel=int(level), shuffle=shuffle)]


def _zarr_store(path, *, read_only: bool):
    """A zarr Store for a local path or an fsspec URL (s3://, gs://, file://, memory://...)."""
    from zarr.storage import FsspecStore, LocalStore

    p = os.fspath(path)
    if "://" in p:
        try:
            # fsspec's local file system does not create parent folders unless asked
            opts = {"auto_mkdir": True} if p.startswith(("file://", "local://")) else None
            return FsspecStore.from_url(p, read_only=read_only, storage_options=opts)
        except Exception as e:  # missing fsspec backend, bad URL
            raise StoreError(f"{p}: cannot open the output location ({e})") from None
    return LocalStore(Path(p), read_only=read_only)


def _jsonable(obj, where: str):
    try:
        return json.loads(json.dumps(obj))
    except (TypeError, ValueError) as e:
        raise StoreError(f"{where}: metadata is not JSON-serialisable ({e})") from None


_POOL = None
_PARTIAL = re.compile(r"\.[0-9a-f]{32}\.partial$")  # zarr's LocalStore temp name before the rename


def _fsync_pool():
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="linpipe-fsync")
    return _POOL


def _fsync(path: Path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # an all-fill chunk is not stored: nothing to flush
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class OutputStore:
    """A linpipe output store opened for writing (driver and workers) or reading."""

    def __init__(self, path, group, *, store, mode: str):
        self.path = os.fspath(path)
        self._group = group
        self._store = store
        self.mode = mode
        self._meta = dict(group.attrs["linpipe"])
        self._keys_by_id = {info["id"]: key for key, info in self._meta["records"].items()}
        self._arrays: dict[tuple[str, str], object] = {}

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
        if hidden_dtype not in ("float16", "float32"):
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

        store = _zarr_store(path, read_only=False)
        cls._check_overwrite(store, where, overwrite)
        # the `linpipe` attributes go in last: a store whose creation was interrupted is
        # recognisably half-made (CREATING), never taken for a valid empty store
        root = zarr.open_group(store=store, mode="w", zarr_format=3, attributes={CREATING: True})
        root.create_group(PROGRESS, attributes={"about": "linpipe completion markers and boundary states"})
        from zarr.core.sync import sync

        sync(_create_records(store, rec_meta, outputs, chunk_size, feature_dim, channels, hidden_dtype))
        root.attrs.put({"linpipe": root_meta})
        return cls(path, root, store=store, mode="r+")

    @staticmethod
    def _check_overwrite(store, where: str, overwrite: bool):
        """Refuse to clobber an existing store unless asked, and never clobber anything that is
        not a linpipe store (creating empties the location: a mistyped --out must not cost a
        home directory or a bucket prefix)."""
        import zarr
        from zarr.core.sync import sync

        if isinstance(store, zarr.storage.LocalStore):
            p = Path(store.root)
            if p.exists() and not p.is_dir():
                raise StoreError(f"{where}: exists and is not a directory")
            if not p.exists():
                return
        if sync(store.is_empty("")):
            return
        try:
            existing = zarr.open_group(store=store, mode="r", zarr_format=3, use_consolidated=False)
            is_ours = isinstance(existing.attrs.get("linpipe"), dict)
            if CREATING in existing.attrs and not is_ours:
                return  # linpipe's own half-made store: safe to lay out again
        except Exception:
            is_ours = False
        if not is_ours:
            raise StoreError(f"{where}: exists and is not a linpipe output store; "
                             "refusing to overwrite it (choose another --out)")
        if not overwrite:
            raise StoreError(f"{where}: an output store already exists (use --overwrite to replace it)")

    @classmethod
    def open(cls, path, mode: str = "r+") -> "OutputStore":
        """Open an existing store; refuses non-linpipe stores and newer format versions."""
        if mode not in ("r", "r+"):
            raise StoreError(f"{os.fspath(path)}: mode must be 'r' or 'r+', got {mode!r}")
        store = _zarr_store(path, read_only=(mode == "r"))
        group = open_root(path, store)
        return cls(path, group, store=store, mode=mode)

    # ------------------------------------------------------------------ metadata
    @property
    def meta(self) -> dict:
        return self._meta

    @property
    def chunk_size(self) -> int:
        return int(self._meta["chunk_size"])

    @property
    def records(self) -> dict[str, dict]:
        """key -> {id, description, length, modality, input, n_chunks}."""
        return self._meta["records"]

    def record_key(self, record_id: str) -> str:
        try:
            return self._keys_by_id[str(record_id)]
        except KeyError:
            raise StoreError(f"{self.path}: no record {record_id!r} in this store") from None

    def _record(self, key: str) -> dict:
        try:
            return self._meta["records"][key]
        except KeyError:
            raise StoreError(f"{self.path}: no record group {key!r} in this store") from None

    def key(self, key_or_id: str) -> str:
        """The group key, given a key or an original record id (keys win when both match)."""
        if key_or_id in self._meta["records"]:
            return key_or_id
        if str(key_or_id) in self._keys_by_id:
            return self._keys_by_id[str(key_or_id)]
        raise StoreError(f"{self.path}: no record {key_or_id!r} in this store")

    def n_chunks(self, key: str) -> int:
        key = self.key(key)
        return int(self._record(key)["n_chunks"])

    def chunk_range(self, key: str, chunk_index: int) -> tuple[int, int]:
        """[start, end) positions of one work unit."""
        key = self.key(key)
        length = int(self._record(key)["length"])
        return chunk_index * self.chunk_size, min(length, (chunk_index + 1) * self.chunk_size)

    def _array(self, path: str):
        arr = self._arrays.get(path)
        if arr is None:
            arr = self._group[path]
            self._arrays[path] = arr
        return arr

    def output_names(self, key: str) -> list[str]:
        key = self.key(key)
        names = list(self._meta["outputs"])
        if self._record(key).get("time_dtype"):
            names.append("time")
        return names

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
        info = self._record(key)
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
            arr = self._array(f"{key}/{name}")
            data = np.asarray(arrays[name])
            if name == "time" and np.issubdtype(data.dtype, np.datetime64):
                data = data.astype("datetime64[ns]").view("int64")
            if data.shape != (end - start,) + tuple(arr.shape[1:]):
                raise StoreError(f"{self.path}: record {info['id']!r} chunk {chunk_index}: {name} has "
                                 f"shape {data.shape}, expected {(end - start,) + tuple(arr.shape[1:])} "
                                 f"for positions {start}-{end}")
            prepared[name] = (arr, data.astype(arr.dtype, copy=False))

        done = self._array(f"{PROGRESS}/{key}/done")
        if done[chunk_index]:  # rewriting a finished chunk: it is not finished while we do
            done[chunk_index] = 0
            self._sync([(done, (chunk_index,))])

        for name, (arr, data) in prepared.items():  # 1. data: whole Zarr chunks only
            arr[start:end] = data
        self._sync([(arr, (chunk_index,) + (0,) * (arr.ndim - 1)) for arr, _ in prepared.values()])

        if state is not None:  # 2. the boundary state after this chunk, in its own array
            self._write_state(key, chunk_index, state)
        else:  # no stale state from an earlier attempt may outlive this write
            from zarr.core.sync import sync

            sync(self._store.delete_dir(f"{PROGRESS}/{key}/state/{chunk_index}"))

        done[chunk_index] = 1  # 3. the marker, last
        self._sync([(done, (chunk_index,))])

    def _write_state(self, key: str, chunk_index: int, state: dict):
        """One uint8 array per boundary holding the state as a safetensors blob (names, dtypes
        and shapes included): one metadata file and one chunk, whatever the model's layers."""
        import zarr
        from safetensors.numpy import save

        tensors = {str(k): np.ascontiguousarray(np.asarray(v)) for k, v in state.items()}
        blob = np.frombuffer(save(tensors), dtype=np.uint8)
        path = f"{PROGRESS}/{key}/state/{chunk_index}"
        arr = zarr.create_array(store=self._store, name=path, shape=blob.shape, chunks=blob.shape,
                                dtype="uint8", fill_value=0, compressors=None, overwrite=True,
                                dimension_names=["byte"], attributes={"encoding": "safetensors"},
                                zarr_format=3)
        arr[:] = blob
        self._sync([(arr, (0,))], also=[f"{path}/zarr.json"])

    def _sync(self, chunks, also=()):
        """fsync the files just written (local stores), so 'done' never outruns the data."""
        from zarr.storage import LocalStore

        if not isinstance(self._store, LocalStore):
            return  # object stores make a PUT durable when it returns
        root = Path(self._store.root)
        files = [root / a.path / a.metadata.encode_chunk_key(idx) for a, idx in chunks]
        files += [root / p for p in also]
        # the rename that made each file visible lives in its directory: flush those too
        targets = files + sorted({f.parent for f in files})
        list(_fsync_pool().map(_fsync, targets))  # in parallel: the disk queues them together

    # ------------------------------------------------------------------ progress
    def completed_chunks(self, key: str) -> set[int]:
        key = self.key(key)
        self._record(key)
        done = self._array(f"{PROGRESS}/{key}/done")
        return set(np.flatnonzero(done[:]).tolist())

    def missing_ranges(self, key: str) -> list[tuple[int, int]]:
        """Position ranges [start, end) not yet written, adjacent chunks merged."""
        key = self.key(key)
        info = self._record(key)
        done = self.completed_chunks(key)
        out: list[tuple[int, int]] = []
        for i in range(int(info["n_chunks"])):
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
        key = self.key(key)
        import zarr
        from safetensors.numpy import load

        if chunk_index not in self.completed_chunks(key):
            return None
        try:
            arr = zarr.open_array(store=self._store, path=f"{PROGRESS}/{key}/state/{chunk_index}",
                                  mode="r", zarr_format=3)
        except (FileNotFoundError, KeyError, ValueError):
            return None
        return load(arr[:].tobytes())

    def is_complete(self) -> bool:
        return bool(self._group.attrs["linpipe"].get("complete", False))

    def finalize(self) -> bool:
        """Mark the store complete when every chunk of every record is done; True if it is."""
        import zarr

        if self.mode == "r":
            raise StoreError(f"{self.path}: opened read-only")
        for key in self.records:
            if not self.record_complete(key):
                return False
        meta = dict(self._group.attrs["linpipe"])
        meta["complete"] = True
        self._remove_partial_files()
        # one write of the root document: completion plus consolidated metadata of the record
        # groups (they never change again), so xarray opens a record without listing the store
        from zarr.core.sync import sync

        sync(_write_root(self._store, meta, list(self.records)))
        self._group = zarr.open_group(store=self._store, mode="r+", zarr_format=3, use_consolidated=False)
        self._arrays.clear()
        self._meta = meta
        return True

    def _remove_partial_files(self):
        """Delete temporary files that writers killed mid-write left behind (local stores)."""
        from zarr.storage import LocalStore

        if not isinstance(self._store, LocalStore):
            return
        for dirpath, _dirs, files in os.walk(self._store.root):
            for f in files:
                if _PARTIAL.search(f):
                    try:
                        os.unlink(os.path.join(dirpath, f))
                    except FileNotFoundError:
                        pass

    def record_complete(self, key: str) -> bool:
        """True when every chunk of the record is written (data, state and marker)."""
        key = self.key(key)
        return len(self.completed_chunks(key)) == self.n_chunks(key)

    def size_on_disk(self) -> int:
        """Bytes stored under the store's root (files on disk, or objects in a bucket)."""
        from zarr.storage import LocalStore

        if isinstance(self._store, LocalStore):
            total = 0
            for dirpath, _dirs, files in os.walk(self._store.root):
                for f in files:
                    try:
                        total += os.path.getsize(os.path.join(dirpath, f))
                    except OSError:
                        pass
            return total
        from zarr.core.sync import sync

        async def total(store):
            n = 0
            async for k in store.list():
                n += await store.getsize(k)
            return n

        return int(sync(total(self._store)))

    def close(self):
        self._arrays.clear()


async def _write_root(store, meta: dict, keys: list[str]):
    """Rewrite the root zarr.json with new `linpipe` attributes and consolidated metadata.

    Consolidation covers the record groups and their arrays only: `_linpipe/` (markers and
    boundary states, tens of thousands of nodes on a large genome) stays out, so the root
    document stays small. linpipe itself always reads with use_consolidated=False.
    """
    import dataclasses

    from zarr.core.group import AsyncGroup, ConsolidatedMetadata, GroupMetadata

    root = await AsyncGroup.open(store, zarr_format=3, use_consolidated=False)
    flat = {}
    for key in keys:
        grp = await root.getitem(key)
        flat[key] = grp.metadata
        async for name, node in grp.members(max_depth=None, use_consolidated_for_children=False):
            flat[f"{key}/{name}"] = node.metadata
    for k, v in flat.items():
        if isinstance(v, GroupMetadata) and v.consolidated_metadata is None:
            flat[k] = dataclasses.replace(v, consolidated_metadata=ConsolidatedMetadata(metadata={}))
    ConsolidatedMetadata._flat_to_nested(flat)
    attrs = {**root.metadata.attributes, "linpipe": meta}
    md = dataclasses.replace(root.metadata, attributes=attrs,
                             consolidated_metadata=ConsolidatedMetadata(metadata=flat))
    await dataclasses.replace(root, metadata=md)._save_metadata()


async def _create_records(store, rec_meta: dict, outputs, chunk_size, feature_dim, channels,
                         hidden_dtype):
    """Write every record's group and array metadata.

    zarr's own create calls cost tens of ms each and grow with the number of siblings, which is
    minutes for an assembly of thousands of contigs. So zarr lays out one template record in
    memory per kind of record, and each record gets those documents with its own shape and
    attributes, written concurrently: the same bytes zarr would write, without the checks
    (the store was just emptied).
    """
    import asyncio

    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.group import AsyncGroup
    from zarr.storage import MemoryStore

    templates: dict[tuple, dict[str, bytes]] = {}
    writes = []
    for key, info in rec_meta.items():
        kind = (info["modality"], info.get("time_dtype"))
        if kind not in templates:
            mem = MemoryStore()
            root = await AsyncGroup.from_store(mem, zarr_format=3)
            progress = await root.create_group(PROGRESS)
            await _create_record(root, progress, "T", dict(info, length=1, n_chunks=1), outputs,
                                 chunk_size, feature_dim, channels, hidden_dtype)
            templates[kind] = {k: v.to_bytes() for k, v in mem._store_dict.items()
                               if k.startswith(("T/", f"{PROGRESS}/T/"))}
        for tkey, raw in templates[kind].items():
            if tkey.startswith("T/"):
                path = key + tkey[1:]
            else:
                path = f"{PROGRESS}/{key}" + tkey[len(PROGRESS) + 2:]
            if tkey.endswith("zarr.json"):
                doc = json.loads(raw)
                if tkey == "T/zarr.json":
                    doc["attributes"] = {"linpipe_record": info}
                elif tkey == f"{PROGRESS}/T/zarr.json":
                    doc["attributes"] = {"id": info["id"]}
                elif tkey == f"{PROGRESS}/T/done/zarr.json":
                    doc["shape"] = [info["n_chunks"]]
                elif doc["node_type"] == "array" and tkey != "T/channel/zarr.json":
                    doc["shape"][0] = info["length"]
                raw = json.dumps(doc, indent=2).encode()
            writes.append((path, raw))

    proto = default_buffer_prototype()
    limit = asyncio.Semaphore(64)

    async def put(path, raw):
        async with limit:
            await store.set(path, proto.buffer.from_bytes(raw))

    await asyncio.gather(*(put(p, r) for p, r in writes))


async def _create_record(root, progress, key, info, outputs, chunk_size, feature_dim, channels,
                         hidden_dtype):
    import asyncio

    modality = info["modality"]
    dim = POSITION_DIM[modality]
    length = info["length"]
    rec = await root.create_group(key, attributes={"linpipe_record": info})
    jobs = []
    for name in outputs:
        kind = OUTPUT_KINDS[modality][name]
        dtype = hidden_dtype if name == "hidden" else kind.dtype
        shape, chunks, dims = (length,), (chunk_size,), [dim]
        if kind.trailing == "feature":
            shape, chunks, dims = (length, feature_dim), (chunk_size, feature_dim), [dim, "feature"]
        elif kind.trailing == "channel":
            shape, chunks, dims = (length, len(channels)), (chunk_size, len(channels)), [dim, "channel"]
        attrs = {k: v for k, v in (("units", kind.units), ("long_name", kind.long_name)) if v}
        jobs.append(rec.create_array(name, shape=shape, chunks=chunks, dtype=dtype,
                                     dimension_names=dims, fill_value=0 if dtype == "uint8" else np.nan,
                                     compressors=codecs_for(CODEC_CHOICE[name]), attributes=attrs))
    if info.get("time_dtype"):
        tdt = np.dtype(info["time_dtype"])
        attrs = {}
        if np.issubdtype(tdt, np.datetime64):  # stored as int64 ns; xarray decodes it back
            tdt = np.dtype("int64")
            attrs = {"units": TIME_UNITS, "calendar": "proleptic_gregorian"}
        jobs.append(rec.create_array("time", shape=(length,), chunks=(chunk_size,), dtype=tdt,
                                     dimension_names=["time"], fill_value=0,
                                     compressors=codecs_for(CODEC_CHOICE["time"]), attributes=attrs))

    async def channel_names():
        ch = await rec.create_array("channel", shape=(len(channels),), dtype=str,
                                    dimension_names=["channel"])
        await ch.setitem(slice(None), np.array(channels))

    if modality == TIMESERIES and channels:
        jobs.append(channel_names())

    async def bookkeeping():
        prog = await progress.create_group(key, attributes={"id": info["id"]})
        await prog.create_array("done", shape=(info["n_chunks"],), chunks=(1,), dtype="uint8",
                                fill_value=0, dimension_names=["chunk"], compressors=None)

    jobs.append(bookkeeping())
    await asyncio.gather(*jobs)


def open_root(path, store):
    """The root group of a linpipe store, or a StoreError that says what is wrong."""
    import zarr

    where = os.fspath(path)
    if isinstance(store, zarr.storage.LocalStore) and not Path(store.root).exists():
        raise StoreError(f"{where}: no such output store")
    try:
        group = zarr.open_group(store=store, mode="r" if store.read_only else "r+", zarr_format=3,
                                use_consolidated=False)
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


def open_output(path):
    """Open a store for reading: `.meta`, `.records`, `.dataset(id_or_key)`, `.missing_ranges`."""
    from linpipe.store.reader import open_output as _open

    return _open(path)
