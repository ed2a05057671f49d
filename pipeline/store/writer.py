"""The output store: one Zarr v3 store per job, written by many workers at once.

Safe by construction (docs/output-format.md): every Zarr chunk is exactly one work unit, with no
sharding, so each chunk file has one writer. A long record (more than one unit) has its own
group, whose chunk i along the position/time axis belongs to the worker running unit i of it;
short records are packed into `_packed/`, whose chunk b belongs to the worker running batch b.
Progress lives beside the outputs in `_linpipe/`: one marker chunk per unit (`<key>/done[i]`,
`_packed/done[b]`) and one array per long record's boundary state, each again written only by
its owner. Root metadata, the record groups and the record table are written only by `create`
and `finalize` (the driver).

Order inside `write_chunk` and `write_batch`: data, then boundary state, then the completion
marker, each flushed to disk (fsync on local paths) before the next, so a unit marked complete
is durable and a process killed at any moment leaves its unit unmarked.

OSError (a full disk, a lost mount) passes through unchanged: the jobs layer reports it with
the file name and keeps the store resumable.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import re
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from linpipe.errors import StoreError
from linpipe.model.outputs import DNA
from linpipe.store.keys import make_keys
from linpipe.store.layout import (
    BATCH_ROW,
    CHANNEL_NAMES,
    CHECKSUM_SET,
    CREATING,
    DEFAULT_OUTPUTS,
    FORMAT,
    FORMAT_VERSION,
    HIDDEN_DTYPES,
    LOOKUP_HASH,
    LOOKUP_ROW,
    OUTPUT_KINDS,
    PACKED,
    PROGRESS,
    PROGRESS_ABOUT,
    RC_OUTPUTS,
    READABLE_VERSIONS,
    ROW_DESCRIPTION,
    ROW_ID,
    ROW_LENGTH,
    ROW_OFFSET,
    ROW_SOURCE,
    TABLE_CHUNK,
    TIME,
    base_output,
    channel_array,
    checksum_array,
    done_array,
    is_rc,
    packed_arrays,
    progress_name,
    progress_path,
    record_arrays,
    record_path,
    state_array,
    state_path,
    table_arrays,
)
from linpipe.store.table import PackedRecords, id_hashes
from linpipe.version import __version__

_PARTIAL = re.compile(r"\.[0-9a-f]{32}\.partial$")  # zarr's LocalStore temp name before the rename
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    """Threads for fsyncs and small writes: the disk (or the object store) queues them together."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="linpipe-store")
    return _POOL


# ---------------------------------------------------------------------------------- locations
# The driver's lease (linpipe.jobs.lease): one small JSON object beside the progress markers.
# It is not a zarr node; creating the store keeps it, and an otherwise empty location holding
# only a lease counts as empty.
LEASE_PATH = f"{PROGRESS}/lease.json"


def _is_lease(name: str) -> bool:
    return name == "lease.json" or name.startswith("lease.json.")


class _Location:
    """Where a store lives: a local folder or an fsspec URL (s3://, gs://, file://, memory://).

    Holds the zarr Store, and answers the few questions zarr has no synchronous public API
    for (is anything there, how many bytes) through the file system or fsspec.
    """

    def __init__(self, path, *, read_only: bool):
        from zarr.storage import FsspecStore, LocalStore

        from linpipe.store.retry import RetryingStore

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
            inner = FsspecStore.from_url(self.url, read_only=read_only, storage_options=self.options)
        except Exception as e:  # missing fsspec backend, bad URL
            raise StoreError(f"{self.where}: cannot open the output location ({e}); check the URL, "
                             "and install the fsspec backend for its scheme (e.g. s3fs, gcsfs)") from None
        # object stores throttle and drop connections: each request is retried (retry.py)
        self.store = RetryingStore(inner)

    def _fs(self):
        from fsspec.core import url_to_fs

        fs, p = url_to_fs(self.url, **(self.options or {}))
        # other processes (workers, another driver) write here: a cached listing from a while
        # ago would hide their objects, or make s3fs deny that a new one exists
        fs.invalidate_cache()  # all of it: s3fs forgets a path and its parents, not its children
        return fs, p

    def exists(self) -> bool:
        if self.root is not None:
            return self.root.exists()
        fs, p = self._fs()
        return fs.exists(p)

    def is_empty(self) -> bool:
        """Nothing stored here but, at most, a driver's lease (taken before the store is made)."""
        if self.root is not None:
            if not self.root.exists():
                return True
            top = [e.name for e in self.root.iterdir()]
            if top != [PROGRESS]:
                return not top
            return all(_is_lease(e.name) for e in (self.root / PROGRESS).iterdir())
        fs, p = self._fs()
        if not fs.exists(p):
            return True
        top = [n.rstrip("/").rsplit("/", 1)[-1] for n in fs.ls(p, detail=False)]
        if top != [PROGRESS]:
            return not top
        return all(_is_lease(n.rstrip("/").rsplit("/", 1)[-1])
                   for n in fs.ls(f"{p.rstrip('/')}/{PROGRESS}", detail=False))

    # Small bookkeeping objects outside zarr (the driver's lease): whole-object reads and
    # writes through the file system or fsspec, at a path relative to the store's root.
    def read_bytes(self, rel: str) -> bytes | None:
        """The object's bytes, or None when there is none."""
        if self.root is not None:
            try:
                return (self.root / rel).read_bytes()
            except (FileNotFoundError, NotADirectoryError):
                return None
        fs, p = self._fs()
        try:
            return fs.cat_file(f"{p.rstrip('/')}/{rel}")
        except FileNotFoundError:
            return None

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Replace the object whole (a local file is written aside and renamed: never half there)."""
        if self.root is not None:
            target = self.root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f"{target.name}.{uuid.uuid4().hex}.partial")
            tmp.write_bytes(data)
            os.replace(tmp, target)
            return
        fs, p = self._fs()
        fs.pipe_file(f"{p.rstrip('/')}/{rel}", data)

    def create_bytes(self, rel: str, data: bytes) -> bool:
        """Write the object only if there is none, in one step where the place allows it: a
        hard link of a finished file locally; on object stores a conditional PUT (If-None-Match:
        *, which AWS S3, MinIO and moto honour; where fsspec has no such write, a check then a
        write). True: written; False: one was there."""
        if self.root is not None:
            target = self.root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f"{target.name}.{uuid.uuid4().hex}.partial")
            tmp.write_bytes(data)
            try:
                os.link(tmp, target)
                return True
            except FileExistsError:
                return False
            finally:
                tmp.unlink()
        fs, p = self._fs()
        try:
            fs.pipe_file(f"{p.rstrip('/')}/{rel}", data, mode="create")
        except FileExistsError:
            return False
        except OSError as e:  # s3fs reports HTTP 412 (PreconditionFailed) as an OSError
            if "Precondition" in str(e) or "412" in str(e):
                return False
            raise
        return True

    def delete(self, rel: str) -> None:
        if self.root is not None:
            try:
                (self.root / rel).unlink()
            except FileNotFoundError:
                pass
            return
        fs, p = self._fs()
        try:
            fs.rm_file(f"{p.rstrip('/')}/{rel}")
        except FileNotFoundError:
            pass

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
            # one listing with sizes (du would ask for each object again)
            return sum(int(i.get("size") or 0) for i in fs.find(p, detail=True).values())
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


def _keep_lease(store):
    """The store, where clearing the root (zarr's mode="w") deletes everything but the lease."""
    from zarr.storage import WrapperStore

    class KeepLease(WrapperStore):
        async def delete_dir(self, prefix: str):
            if prefix.strip("/"):
                return await super().delete_dir(prefix)
            await self._clear("", keep=PROGRESS)
            await self._clear(f"{PROGRESS}/", keep=None)

        async def _clear(self, parent: str, keep):
            names = [n async for n in self.list_dir(parent)]
            for name in names:
                if name == keep or (keep is None and _is_lease(name)):
                    continue
                path = f"{parent}{name}"
                if await self.exists(path):
                    await self.delete(path)
                else:
                    await super().delete_dir(path)

    return KeepLease(store)


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
        self._sums: dict[int, object] = {}
        self._arrays: dict[tuple, dict] = {}

    def _array(self, spec):
        import zarr

        return zarr.create_array(store=self._mem, name=spec.name, zarr_format=3, overwrite=True,
                                 **spec.create_kwargs()).metadata

    def sums(self, n_units: int, n_arrays: int):
        if n_arrays not in self._sums:
            self._sums[n_arrays] = self._array(checksum_array(1, n_arrays))
        return self._sums[n_arrays].update_shape((n_units, n_arrays + 1))

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
        n = int(info["n_chunks"])
        written = [sp for sp in specs if sp.name != CHANNEL_NAMES]
        for strand in ("+", "-"):
            mine = [sp for sp in written if is_rc(sp.name) == (strand == "-")]
            if strand == "-" and not mine:
                continue  # one strand only: no reverse markers
            nodes[progress_path(key, progress_name("done", strand))] = self.done.update_shape((n,))
            nodes[progress_path(key, progress_name("sum", strand))] = self.sums(n, len(mine))
        return nodes

    def packed_nodes(self, modality: str, packed: PackedRecords, *, time_dtype: str | None,
                     fences: list[int]) -> dict:
        """path -> metadata of the packed group, its outputs and table, and its markers."""
        specs = packed_arrays(modality, self.outputs, n_batches=packed.n_batches, time_dtype=time_dtype,
                              **self.layout)
        specs += table_arrays(packed.n_records, packed.n_batches)
        nodes = {PACKED: dataclasses.replace(self.group, attributes={
            "about": "linpipe: short records, packed (docs/output-format.md)"})}
        for spec in specs:
            if spec.name == LOOKUP_HASH:  # the first hash of every chunk: one read finds the chunk
                spec = dataclasses.replace(spec, attributes={**spec.attributes, "fences": fences})
            nodes[f"{PACKED}/{spec.name}"] = self._array(spec)
        nodes[progress_path(PACKED)] = dataclasses.replace(self.group, attributes={"about": "batch markers"})
        nodes[progress_path(PACKED, "done")] = self._array(done_array(packed.n_batches))
        n_arrays = len(self.outputs) + (1 if time_dtype else 0)
        nodes[progress_path(PACKED, "sum")] = self.sums(packed.n_batches, n_arrays)
        return nodes


class _Packed:
    """The `_packed/` group of an open store: the record table, the id index and the batches.

    Everything is read lazily and by chunk, so finding one record among a million reads a few
    small chunks (no scan), and iterating the table streams it."""

    def __init__(self, group, info: dict, chunk_size: int):
        self.group = group
        self.n_records = int(info["records"])
        self.n_batches = int(info["batches"])
        self.positions = int(info["positions"])
        self.time_dtype = info.get("time_dtype")
        self.inputs = list(info.get("inputs") or [])
        self.chunk_size = chunk_size
        self._arrays: dict[str, object] = {}
        self._batch_row = None
        self._fences = None

    def array(self, name: str):
        arr = self._arrays.get(name)
        if arr is None:
            arr = self._arrays[name] = self.group[name]
        return arr

    @property
    def batch_row(self) -> np.ndarray:
        if self._batch_row is None:
            self._batch_row = np.asarray(self.array(BATCH_ROW)[:], dtype=np.int64)
        return self._batch_row

    def row_of(self, record_id: str) -> int | None:
        """The table row of a record id, or None: one chunk of the sorted hashes, then the id."""
        if self.n_records == 0:
            return None
        if self._fences is None:
            self._fences = np.asarray(self.array(LOOKUP_HASH).attrs["fences"], dtype=np.uint64)
        h = id_hashes([record_id])[0]
        c = max(int(np.searchsorted(self._fences, h, side="right")) - 1, 0)
        lo, hi = c * TABLE_CHUNK, min((c + 1) * TABLE_CHUNK, self.n_records)
        hashes = self.array(LOOKUP_HASH)[lo:hi]
        a, b = np.searchsorted(hashes, h, side="left"), np.searchsorted(hashes, h, side="right")
        if a == b:
            return None
        for row in self.array(LOOKUP_ROW)[lo + a:lo + b].tolist():  # hash collisions: check the ids
            if str(self.array(ROW_ID)[row]) == record_id:
                return int(row)
        return None

    def info(self, row: int) -> dict:
        length = int(self.array(ROW_LENGTH)[row])
        batch = int(np.searchsorted(self.batch_row, row, side="right")) - 1
        source = int(self.array(ROW_SOURCE)[row])
        return {"id": str(self.array(ROW_ID)[row]), "description": str(self.array(ROW_DESCRIPTION)[row]),
                "length": length, "n_chunks": 1 if length else 0, "packed": True, "row": row,
                "offset": int(self.array(ROW_OFFSET)[row]),
                "input": self.inputs[source] if source < len(self.inputs) else None,
                "batch": batch if batch < self.n_batches else None}

    def batch_ids(self, batch: int) -> list[str]:
        """The ids of one batch's records, in the order write_batch takes their values."""
        lo, hi = int(self.batch_row[batch]), int(self.batch_row[batch + 1])
        return [str(x) for x in self.array(ROW_ID)[lo:hi]]

    def columns(self, names=(ROW_ID, ROW_DESCRIPTION, ROW_LENGTH, ROW_OFFSET)):
        """Yield dicts of table columns, one Zarr chunk of rows at a time."""
        for lo in range(0, self.n_records, TABLE_CHUNK):
            hi = min(lo + TABLE_CHUNK, self.n_records)
            yield lo, {n: self.array(n)[lo:hi] for n in names}

    def lengths(self) -> np.ndarray:
        if not self.n_records:
            return np.zeros(0, np.int64)
        return np.asarray(self.array(ROW_LENGTH)[:], dtype=np.int64)

    def batch_done(self, progress_group) -> np.ndarray:
        if self.n_batches == 0:
            return np.zeros(0, dtype=bool)
        return np.asarray(progress_group[f"{PACKED}/done"][:], dtype=bool)


class RecordMap(collections.abc.Mapping):
    """record id -> info, for long records (own group) and packed ones alike.

    info: {id, description, length, modality, n_chunks, packed} plus `key` (the group) for a long
    record, or `offset` and `batch` for a packed one. Lookups of packed ids go through the store's
    id index; iteration streams the table (long records first, then packed order)."""

    def __init__(self, store: "OutputStore"):
        self._store = store

    def __getitem__(self, record_id):
        return self._store.record(record_id)

    def __iter__(self):
        yield from self._store._long_by_id
        p = self._store._packed
        if p is not None:
            for _lo, cols in p.columns((ROW_ID,)):
                yield from (str(x) for x in cols[ROW_ID])

    def __len__(self):
        p = self._store._packed
        return len(self._store._long_by_id) + (p.n_records if p is not None else 0)

    def __contains__(self, record_id):
        try:
            self._store.record(record_id)
            return True
        except StoreError:
            return False

    def items(self):
        """(id, info) pairs, streaming the packed table (no lookup per record)."""
        for rid in self._store._long_by_id:
            yield rid, self._store.record(rid)
        p = self._store._packed
        if p is None:
            return
        br = p.batch_row
        modality = self._store.modality
        for lo, cols in p.columns((ROW_ID, ROW_DESCRIPTION, ROW_LENGTH, ROW_OFFSET, ROW_SOURCE)):
            batches = np.searchsorted(br, np.arange(lo, lo + len(cols[ROW_ID])), side="right") - 1
            for j, rid in enumerate(cols[ROW_ID]):
                length = int(cols[ROW_LENGTH][j])
                b = int(batches[j])
                yield str(rid), {"id": str(rid), "description": str(cols[ROW_DESCRIPTION][j]),
                                 "length": length, "modality": modality, "n_chunks": 1 if length else 0,
                                 "packed": True, "row": lo + j, "offset": int(cols[ROW_OFFSET][j]),
                                 "input": (p.inputs[int(cols[ROW_SOURCE][j])]
                                           if int(cols[ROW_SOURCE][j]) < len(p.inputs) else None),
                                 "batch": b if b < p.n_batches else None}

    def values(self):
        return (info for _rid, info in self.items())


# ---------------------------------------------------------------------------------- the store
class OutputStore:
    """A linpipe output store opened for writing (driver and workers) or reading."""

    def __init__(self, location: _Location, group, *, mode: str):
        self._location = location
        self.path = location.where
        self._group = group
        self.mode = mode
        self._meta = dict(group.attrs["linpipe"])
        self.format_version = int(self._meta["format_version"])
        self._long_by_id = {info["id"]: key for key, info in self._meta["records"].items()}
        pinfo = self._meta.get("packed")
        self._packed = _Packed(group[PACKED], pinfo, self.chunk_size) if pinfo else None
        self._arrays: dict[str, object] = {}
        self._resolved: dict[str, dict] = {}

    # ------------------------------------------------------------------ create / open
    @classmethod
    def create(cls, path, *, meta: dict, records: list[dict], outputs=None, chunk_size: int,
               feature_dim: int | None = None, channels=None, overwrite: bool = False,
               hidden_dtype: str = "float16", packed: PackedRecords | None = None,
               modality: str | None = None, packed_time_dtype: str | None = None,
               packed_inputs=None) -> "OutputStore":
        """Lay out a new store: root metadata, one group per long record, the packed group with
        the short records' table, every output array empty.

        records: dicts {id, length, description?, modality?, input?, time_dtype?}. Without
        `packed`, records of at most chunk_size positions are packed here (batched as the plan
        does); with `packed` (the plan's table of short records), `records` holds only the
        long ones, and `modality`/`packed_time_dtype` describe the packed ones."""
        import zarr

        where = os.fspath(path)
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise StoreError(f"{where}: chunk_size must be a positive integer, got {chunk_size!r}")
        if hidden_dtype not in HIDDEN_DTYPES:
            raise StoreError(f"{where}: hidden dtype must be float16 or float32, got {hidden_dtype!r}")
        records = list(records)
        if modality is None:
            modality = records[0].get("modality", DNA) if records else DNA
        if outputs is None:  # the default for the records' modality (hidden is large: opt in)
            outputs = DEFAULT_OUTPUTS.get(modality, []) if (records or packed is not None) else []
        outputs = list(outputs)
        if isinstance(channels, int):
            channels = [str(i) for i in range(channels)]
        channels = None if channels is None else [str(c) for c in channels]

        rec_infos = []
        for r in records:
            rmod = r.get("modality", modality)
            if rmod not in OUTPUT_KINDS:
                raise StoreError(f"{where}: record {r['id']!r}: unknown modality {rmod!r}")
            if rmod != modality:
                raise StoreError(f"{where}: record {r['id']!r} is {rmod}, the others {modality}; "
                                 "one store holds one modality")
            length = int(r["length"])
            if length < 0:
                raise StoreError(f"{where}: record {r['id']!r}: negative length {length}")
            info = {"id": str(r["id"]), "description": str(r.get("description", "")),
                    "length": length, "modality": modality, "input": r.get("input"),
                    "n_chunks": math.ceil(length / chunk_size)}
            if r.get("time_dtype"):
                info["time_dtype"] = str(np.dtype(r["time_dtype"]))
            rec_infos.append(info)
        _check_outputs(where, modality, outputs, feature_dim, channels)

        if packed is None:
            short = [i for i in rec_infos if i["length"] <= chunk_size]
            rec_infos = [i for i in rec_infos if i["length"] > chunk_size]
            dtypes = {i.get("time_dtype") for i in short if i["length"]}
            if len(dtypes) > 1:
                raise StoreError(f"{where}: short records have different time types "
                                 f"({sorted(map(str, dtypes))})")
            packed_time_dtype = dtypes.pop() if dtypes else None
            packed_inputs = sorted({str(i["input"]) for i in short if i.get("input")})
            where_from = {p: n for n, p in enumerate(packed_inputs)}
            sources = [where_from.get(str(i.get("input")), len(packed_inputs)) for i in short]
            packed = PackedRecords.build([i["id"] for i in short], [i["description"] for i in short],
                                         [i["length"] for i in short], sources, chunk_size=chunk_size)
        else:
            for i in rec_infos:
                if i["length"] <= chunk_size:
                    raise StoreError(f"{where}: record {i['id']!r} ({i['length']} positions) belongs in "
                                     f"the packed table (at most {chunk_size} positions)")
        hashes = id_hashes(packed.ids)
        _check_unique(where, [i["id"] for i in rec_infos], packed, hashes)

        keys = make_keys([i["id"] for i in rec_infos])
        rec_meta = {keys[i["id"]]: i for i in rec_infos}
        packed_meta = {"records": packed.n_records, "batches": packed.n_batches,
                       "positions": packed.positions, "inputs": [str(p) for p in packed_inputs or []]}
        if packed_time_dtype:
            packed_meta["time_dtype"] = str(np.dtype(packed_time_dtype))

        root_meta = _jsonable(dict(meta), where)
        root_meta.update({
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "linpipe_version": root_meta.get("version", __version__), "modality": modality,
            "outputs": outputs, "chunk_size": chunk_size, "feature_dim": feature_dim,
            "channels": channels, "hidden_dtype": hidden_dtype, "records": rec_meta,
            "packed": packed_meta, "complete": False,
        })
        root_meta = _jsonable(root_meta, where)

        location = _Location(path, read_only=False)
        _check_overwrite(location, overwrite)
        # the `linpipe` attributes go in last: a store whose creation was interrupted is
        # recognisably half-made (CREATING), never taken for a valid empty store. Clearing the
        # location keeps the creating driver's lease (never absent while it holds it).
        root = zarr.open_group(store=_keep_lease(location.store), mode="w", zarr_format=3,
                               attributes={CREATING: True})
        root.create_group(PROGRESS, attributes={"about": PROGRESS_ABOUT})
        templates = _Templates(outputs, chunk_size=chunk_size, feature_dim=feature_dim, channels=channels,
                               hidden_dtype=hidden_dtype)
        nodes = {}
        for key, info in rec_meta.items():
            nodes.update(templates.record_nodes(key, info))
        order = np.argsort(hashes, kind="stable")
        fences = [int(h) for h in hashes[order][::TABLE_CHUNK]]
        nodes.update(templates.packed_nodes(modality, packed, time_dtype=packed_meta.get("time_dtype"),
                                            fences=fences))
        # overwrite=True: the location was just emptied, so zarr need not first read every path
        # to see whether a node is already there (it only clears paths that do not exist)
        with zarr.config.set({"async.concurrency": 64}):
            created = dict(zarr.create_hierarchy(store=location.store, nodes=nodes, overwrite=True))
        # the channel names are the one output-side array that holds data from the start
        name = channel_array(channels or []).name
        coords = [created[p] for p in [record_path(k, name) for k in rec_meta] + [f"{PACKED}/{name}"]
                  if p in created]
        labels = np.array(channels or [])

        def fill(arr):
            arr[:] = labels

        list(_pool().map(fill, coords))
        _write_table(created, packed, hashes, order)
        root.attrs.put({"linpipe": root_meta})
        return cls(location, root, mode="r+")

    @staticmethod
    def exists(path) -> bool:
        """True when anything is stored at path (a local folder or an object-store prefix)."""
        if "://" not in os.fspath(path):
            p = Path(os.fspath(path))
            if p.exists() and not p.is_dir():
                return True
        return not _Location(path, read_only=True).is_empty()

    @staticmethod
    def creation_interrupted(path) -> bool:
        """True when path holds a store whose create() never finished (its driver was killed
        while laying it out): it holds no work, and the job's next driver lays it out anew."""
        import zarr

        location = _Location(path, read_only=True)
        if location.is_empty():
            return False
        try:
            root = zarr.open_group(store=location.store, mode="r", zarr_format=3, use_consolidated=False)
            attrs = root.attrs
        except Exception:
            return False
        return CREATING in attrs and "linpipe" not in attrs

    @classmethod
    def open(cls, path, mode: str = "r+") -> "OutputStore":
        """Open an existing store; refuses non-linpipe stores and newer format versions."""
        if mode not in ("r", "r+"):
            raise StoreError(f"{os.fspath(path)}: mode must be 'r' or 'r+', got {mode!r}")
        location = _Location(path, read_only=(mode == "r"))
        store = cls(location, _open_root(location), mode=mode)
        if mode == "r+" and store.format_version != FORMAT_VERSION:
            raise StoreError(f"{store.path}: written by linpipe {store.meta.get('linpipe_version')} in "
                             f"output format {store.format_version}; it can be read (linpipe.open_output) "
                             "but not written to: use --overwrite to run the job anew, or choose another "
                             "--out")
        return store

    # ------------------------------------------------------------------ metadata
    @property
    def meta(self) -> dict:
        """The root `linpipe` attributes (model, inputs, outputs, chunk length, job id ...)."""
        return self._meta

    @property
    def chunk_size(self) -> int:
        return int(self._meta["chunk_size"])

    @property
    def modality(self) -> str:
        if "modality" in self._meta:
            return self._meta["modality"]
        first = next(iter(self._meta["records"].values()), None)  # format 1 has no root modality
        return first["modality"] if first else DNA

    @property
    def records(self) -> RecordMap:
        """record id -> info, for every record (a lazy mapping: packed records come from the
        table on demand)."""
        return RecordMap(self)

    @property
    def long_records(self) -> dict[str, dict]:
        """group key -> info of the records with a group of their own."""
        return self._meta["records"]

    @property
    def packed(self) -> _Packed | None:
        """The packed short records (None in a format-1 store)."""
        return self._packed

    @property
    def zarr_store(self):
        """The zarr Store under this output store (for xarray.open_zarr and zarr.open_group)."""
        return self._location.store

    def record(self, key_or_id: str, *, by_key: bool = True) -> dict:
        """A record's info, given its id (or the group key of a long record)."""
        rid = str(key_or_id)
        hit = self._resolved.get(rid)
        if hit is not None:
            return hit
        info = None
        if rid in self._long_by_id:
            key = self._long_by_id[rid]
            info = {**self._meta["records"][key], "key": key, "packed": False}
        elif self._packed is not None and (row := self._packed.row_of(rid)) is not None:
            info = {**self._packed.info(row), "modality": self.modality}
        elif by_key and rid in self._meta["records"]:
            info = {**self._meta["records"][rid], "key": rid, "packed": False}
        if info is None:
            raise StoreError(f"{self.path}: no record {rid!r} in this store")
        if len(self._resolved) > 4096:
            self._resolved.clear()
        self._resolved[rid] = info
        return info

    def record_key(self, record_id: str) -> str:
        """The group of a long record; a packed record's id (packed records have no group)."""
        info = self.record(record_id, by_key=False)
        return info["key"] if not info["packed"] else info["id"]

    def key(self, key_or_id: str) -> str:
        """The group key of a long record, or the id of a packed one, given a key or an id."""
        info = self.record(key_or_id)
        return info["key"] if not info["packed"] else info["id"]

    def n_chunks(self, key: str) -> int:
        return int(self.record(key)["n_chunks"])

    def chunk_range(self, key: str, chunk_index: int) -> tuple[int, int]:
        """[start, end) positions of one work unit (a packed record is one unit, whole)."""
        length = int(self.record(key)["length"])
        return chunk_index * self.chunk_size, min(length, (chunk_index + 1) * self.chunk_size)

    def output_names(self, key: str | None = None) -> list[str]:
        """The arrays of a record that write_chunk/write_batch take: the outputs, and `time` if
        it has one (key None: the packed records)."""
        names = list(self._meta["outputs"])
        if key is None or self.record(key)["packed"]:
            has_time = self._packed is not None and self._packed.time_dtype
        else:
            has_time = self.record(key).get("time_dtype")
        if has_time:
            names.append(TIME)
        return names

    def array(self, key: str, name: str):
        """The zarr array of one output (or `time`/`channel`) of a long record, or a view of a
        packed record's part of the packed array (slices like a zarr array)."""
        info = self.record(key)
        if name not in self.output_names(key) + [CHANNEL_NAMES]:
            raise StoreError(f"{self.path}: record {info['id']!r} has no output "
                             f"{name!r} (it has {', '.join(self.output_names(key))})")
        if info["packed"]:
            if name == CHANNEL_NAMES:
                return self._packed.array(name)
            return PackedSlice(self._packed.array(name), info["offset"], info["length"])
        try:
            return self._array(record_path(info["key"], name))
        except KeyError:
            raise StoreError(f"{self.path}: record {info['id']!r} has no output {name!r}") from None

    def _array(self, path: str):
        arr = self._arrays.get(path)
        if arr is None:
            arr = self._arrays[path] = self._group[path]
        return arr

    # ------------------------------------------------------------------ writing
    def _writable(self):
        if self.mode == "r":
            raise StoreError(f"{self.path}: opened read-only")

    def write_chunk(self, key: str, chunk_index: int, arrays: dict, state: dict | None = None,
                    strand: str = "+"):
        """Write one work unit of a long record: every output over the chunk's range, then its
        state, then done.

        arrays: name -> array over exactly [chunk_index*chunk_size, min(length, (i+1)*chunk_size))
        (and `time`, when the record was created with a time_dtype). state: the boundary state
        after this chunk, as plain numpy arrays (ModelState.to_arrays()). strand "-": the
        reverse strand's unit over the same range (its `_rc` outputs, and the state after
        reading the chunk backwards), with its own marker, checksums and state.
        """
        self._writable()
        info = self.record(key)
        if info["packed"]:
            raise StoreError(f"{self.path}: record {info['id']!r} is packed (at most one work unit): "
                             f"it is written whole, with its batch {info['batch']}, by write_batch")
        key = info["key"]
        n = int(info["n_chunks"])
        if not 0 <= chunk_index < n:
            raise StoreError(f"{self.path}: record {info['id']!r}: chunk {chunk_index} out of range "
                             f"(the record has {n} chunks)")
        start, end = self.chunk_range(key, chunk_index)
        what = f"record {info['id']!r} chunk {chunk_index}" + (" (reverse strand)" if strand == "-" else "")
        self._check_strand(strand)
        names = self.unit_names(key, strand)
        if arrays is None:  # a unit that stores no outputs (outside a job's --regions): state and marker
            prepared = {n: None for n in names}
        else:
            prepared = self._prepare(arrays, names, lambda name: record_path(key, name), end - start, what,
                                     f"for positions {start}-{end}")
        done = self._array(progress_path(key, progress_name("done", strand)))
        sums = self._array(progress_path(key, progress_name("sum", strand)))
        self._write_unit(prepared, start, end, done, sums, chunk_index,
                         lambda: self._write_state(key, chunk_index, state, strand) if state is not None
                         else self._drop_state(key, chunk_index, strand))

    @property
    def strands(self) -> tuple[str, ...]:
        """("+",) or ("+", "-") when the store holds the reverse strand's `_rc` outputs."""
        return ("+", "-") if any(is_rc(o) for o in self._meta["outputs"]) else ("+",)

    def _check_strand(self, strand: str):
        if strand not in self.strands:
            raise StoreError(f"{self.path}: no {strand!r} strand in this store (strands: "
                             f"{', '.join(self.strands)})")

    def unit_names(self, key: str, strand: str = "+") -> list[str]:
        """The arrays one strand's unit of a long record writes (output_names of that strand)."""
        names = self.output_names(key)
        return [n for n in names if n == TIME and strand == "+" or n != TIME and is_rc(n) == (strand == "-")]

    def write_batch(self, batch: int, arrays: dict):
        """Write one batch of packed records: each output's values of the batch's records back
        to back, in table order (as PackedRecords lists them), then the batch's marker."""
        self._writable()
        p = self._packed
        if p is None or not 0 <= batch < p.n_batches:
            n = p.n_batches if p is not None else 0
            raise StoreError(f"{self.path}: batch {batch} out of range (the store has {n} batches)")
        rows = p.batch_row[batch:batch + 2]
        used = int(p.array(ROW_LENGTH)[int(rows[0]):int(rows[1])].sum())
        prepared = self._prepare(arrays, self.output_names(None), lambda name: f"{PACKED}/{name}", used,
                                 f"batch {batch}", f"for its {int(rows[1] - rows[0])} records")
        start = batch * self.chunk_size
        padded = {}
        for name, (arr, data) in prepared.items():  # whole chunks: the tail keeps the fill value
            full = np.full((self.chunk_size,) + data.shape[1:], arr.fill_value, dtype=arr.dtype)
            full[:used] = data
            padded[name] = (arr, full)
        self._write_unit(padded, start, start + self.chunk_size, self._group[progress_path(PACKED, "done")],
                         self._group[progress_path(PACKED, "sum")], batch, lambda: None)

    def _prepare(self, arrays: dict, expected: list[str], path_of, n: int, what: str, where: str) -> dict:
        if set(arrays) != set(expected):
            raise StoreError(f"{self.path}: {what}: got outputs {sorted(arrays)}, the store holds "
                             f"{sorted(expected)}")
        prepared = {}
        for name in expected:
            arr = self._array(path_of(name))
            data = np.asarray(arrays[name])
            if name == TIME and np.issubdtype(data.dtype, np.datetime64):
                data = data.astype("datetime64[ns]").view("int64")
            want = (n,) + tuple(arr.shape[1:])
            if data.shape != want:
                raise StoreError(f"{self.path}: {what}: {name} has shape {data.shape}, "
                                 f"expected {want} {where}")
            prepared[name] = (arr, data.astype(arr.dtype, copy=False))
        return prepared

    def _write_unit(self, prepared: dict, start: int, end: int, done, sums, index: int, write_state):
        """Data, then the state, then the checksum and the marker, each durable before the next."""
        if done[index]:  # rewriting a finished unit: it is not finished while we do
            done[index] = 0
            self._sync([(done, (index,))])
        chunk = start // self.chunk_size
        written = [v for v in prepared.values() if v is not None]
        for arr, data in written:  # 1. data: whole Zarr chunks only
            arr[start:end] = data
        self._sync([(arr, (chunk,) + (0,) * (arr.ndim - 1)) for arr, _ in written])
        blob = write_state()  # 2. the boundary state after this unit (its bytes, or None)
        sums[index] = unit_checksums([None if v is None else v[1] for v in prepared.values()],
                                     blob)  # 3. checksums
        done[index] = 1  # 4. the marker, last
        self._sync([(sums, (index,)), (done, (index,))])

    def _drop_state(self, key: str, chunk_index: int, strand: str = "+"):
        """No stale state from an earlier attempt may outlive a write without one."""
        del self._group[state_path(key, chunk_index, strand)]
        return None

    def state_blob(self, key: str, chunk_index: int, strand: str = "+") -> bytes | None:
        """The stored bytes of a long record's boundary state after a chunk (None if absent)."""
        import zarr

        try:
            path = state_path(self.record(key)["key"], chunk_index, strand)
            arr = zarr.open_array(store=self.zarr_store, path=path, mode="r", zarr_format=3)
        except (FileNotFoundError, KeyError, ValueError):
            return None
        return arr[:].tobytes()

    def unit_sums(self, key: str | None, strand: str = "+") -> np.ndarray:
        """(units, arrays + 1) recorded checksums of a long record's units (key None: the packed
        batches), columns in unit_names order, then the state; 0 where none was recorded."""
        path = progress_path(PACKED, "sum") if key is None else \
            progress_path(self.record(key)["key"], progress_name("sum", strand))
        try:
            return np.asarray(self._group[path][:], dtype=np.uint64)
        except KeyError:  # format 1 records none
            n = self._packed.n_batches if key is None else self.n_chunks(key)
            return np.zeros((n, len(self.output_names(key)) + 1), dtype=np.uint64)

    def _write_state(self, key: str, chunk_index: int, state: dict, strand: str = "+"):
        """One uint8 array per boundary holding the state as a safetensors blob (names, dtypes
        and shapes included): one metadata file and one chunk, whatever the model's layers."""
        import zarr
        from safetensors.numpy import save

        tensors = {str(k): np.ascontiguousarray(np.asarray(v)) for k, v in state.items()}
        blob = np.frombuffer(save(tensors), dtype=np.uint8)
        path = state_path(key, chunk_index, strand)
        arr = zarr.create_array(store=self.zarr_store, name=path, overwrite=True, zarr_format=3,
                                **state_array(blob.size).create_kwargs())
        arr[:] = blob
        self._sync([(arr, (0,))], also=[f"{path}/zarr.json"])
        return blob.tobytes()

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
    def completed_chunks(self, key: str, strand: str | None = None) -> set[int]:
        """The chunks written; strand None: on every strand the store holds (what readers see)."""
        info = self.record(key)
        if info["packed"]:
            b = info["batch"]
            done = b is None or bool(self._group[f"{PROGRESS}/{PACKED}/done"][b])
            return {0} if done and info["length"] else set()
        out = None
        for s in self.strands if strand is None else (strand,):
            done = self._array(progress_path(info["key"], progress_name("done", s)))
            mine = set(np.flatnonzero(done[:]).tolist())
            out = mine if out is None else out & mine
        return out

    def batches_done(self) -> np.ndarray:
        """(n_batches,) bool: which batches of packed records are written."""
        if self._packed is None:
            return np.zeros(0, dtype=bool)
        return self._packed.batch_done(self._group[PROGRESS])

    def missing_ranges(self, key: str) -> list[tuple[int, int]]:
        """Position ranges [start, end) not yet written, adjacent chunks merged."""
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

    def boundary_state(self, key: str, chunk_index: int, strand: str = "+") -> dict | None:
        """The state saved after `chunk_index`, or None when that chunk is not complete (or was
        written without a state; packed records have none). strand "-": the reverse strand's
        state after reading chunk `chunk_index` (from the record's end down to its start)."""
        import zarr
        from safetensors.numpy import load

        info = self.record(key)
        if info["packed"] or chunk_index not in self.completed_chunks(key, strand):
            return None
        try:
            arr = zarr.open_array(store=self.zarr_store, path=state_path(info["key"], chunk_index, strand),
                                  mode="r", zarr_format=3)
        except (FileNotFoundError, KeyError, ValueError):
            return None
        return load(arr[:].tobytes())

    def is_complete(self) -> bool:
        return bool(self._group.attrs["linpipe"].get("complete", False))

    def record_complete(self, key: str) -> bool:
        """True when every chunk of the record is written (data, state and marker)."""
        return len(self.completed_chunks(key)) == self.n_chunks(key)

    def progress(self) -> dict:
        """Counts of records, positions and units, in all and done (without a per-record loop
        over packed records)."""
        records = records_done = positions = positions_done = units = units_done = 0
        for key, info in self._meta["records"].items():
            n, length = int(info["n_chunks"]), int(info["length"])
            done = self.completed_chunks(key)
            records += 1
            records_done += len(done) == n
            positions += length
            positions_done += sum(b - a for a, b in (self.chunk_range(key, i) for i in done))
            units += n
            units_done += len(done)
        p = self._packed
        if p is not None and p.n_records:
            lengths, br, ok = p.lengths(), p.batch_row, self.batches_done()
            per_batch = np.add.reduceat(lengths, br[:-1]) if p.n_batches else np.zeros(0, np.int64)
            rows_done = sum(int(br[b + 1] - br[b]) for b in np.flatnonzero(ok))
            records += p.n_records
            records_done += rows_done + (p.n_records - int(br[-1]))  # empty records need no work
            positions += int(lengths.sum())
            positions_done += int(per_batch[ok].sum())
            units += p.n_batches
            units_done += int(ok.sum())
        return {"records": records, "records_done": records_done, "positions": positions,
                "positions_done": positions_done, "units": units, "units_done": units_done,
                "complete": self.is_complete()}

    def finalize(self) -> bool:
        """Mark the store complete when every unit is done; True if it is.

        Consolidates the record groups' metadata into the root document first (they never change
        again), so xarray opens a record without listing the store, and only then sets `complete`:
        a finalize killed in between leaves a store that is consolidated but not yet complete,
        which the next finalize finishes.
        """
        import zarr

        self._writable()
        if not all(self.record_complete(key) for key in self._meta["records"]):
            return False
        if not self.batches_done().all():
            return False
        meta = {**self._group.attrs["linpipe"], "complete": True}
        self._remove_partial_files()
        with warnings.catch_warnings():  # zarr: consolidated metadata is not in the v3 spec yet
            warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
            root = zarr.consolidate_metadata(_records_only(self.zarr_store), zarr_format=3)
        root.update_attributes({"linpipe": meta})
        self._group = zarr.open_group(store=self.zarr_store, mode="r+", zarr_format=3, use_consolidated=False)
        self._arrays.clear()
        if self._packed is not None:
            self._packed = _Packed(self._group[PACKED], meta["packed"], self.chunk_size)
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
        self._resolved.clear()


def checksum(values) -> int:
    """CHECKSUM_SET | crc32 of an array's bytes as stored (its dtype, C order), or of bytes."""
    import zlib

    if isinstance(values, bytes):
        return CHECKSUM_SET | zlib.crc32(values)
    return CHECKSUM_SET | zlib.crc32(np.ascontiguousarray(values).view(np.uint8).reshape(-1))


def unit_checksums(values, state_blob: bytes | None = None) -> np.ndarray:
    """One checksum per array a unit wrote (0: an array it did not write), then its state's (0: no state)."""
    return np.array([0 if v is None else checksum(v) for v in values]
                    + [checksum(state_blob) if state_blob is not None else 0],
                    dtype=np.uint64)


class PackedSlice:
    """One packed record's part of a packed array: slices along the first axis like a zarr
    array over [0, length)."""

    def __init__(self, array, offset: int, length: int):
        self._array = array
        self.offset = offset
        self.shape = (length,) + tuple(array.shape[1:])
        self.dtype = array.dtype
        self.ndim = array.ndim
        self.attrs = array.attrs
        self.fill_value = array.fill_value

    @property
    def dims(self) -> tuple[str, ...]:
        return tuple(self._array.metadata.dimension_names)

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, sel):
        rest = ()
        if isinstance(sel, tuple):
            sel, rest = sel[0], sel[1:]
        if not isinstance(sel, slice) or sel.step not in (None, 1):
            raise TypeError("a packed record reads by contiguous slices, e.g. values[start:end]")
        s, e, _ = sel.indices(self.shape[0])
        e = max(e, s)
        return self._array[(slice(self.offset + s, self.offset + e),) + rest]


def _check_outputs(where, modality, outputs, feature_dim, channels):
    for name in outputs:
        if is_rc(name) and base_output(name) not in RC_OUTPUTS:
            raise StoreError(f"{where}: output {name!r}: only {', '.join(RC_OUTPUTS)} have a reverse strand")
        if is_rc(name) and modality != "dna":
            raise StoreError(f"{where}: output {name!r}: a {modality} store has no reverse strand")
        name = base_output(name)
        if name not in OUTPUT_KINDS[modality]:
            raise StoreError(f"{where}: output {name!r} is not a {modality} output "
                             f"(one of {', '.join(OUTPUT_KINDS[modality])})")
        kind = OUTPUT_KINDS[modality][name]
        if kind.trailing == "feature" and not feature_dim:
            raise StoreError(f"{where}: output {name!r} needs feature_dim")
        if kind.trailing == "channel" and not channels:
            raise StoreError(f"{where}: output {name!r} needs channels")


def _check_unique(where, long_ids, packed: PackedRecords, packed_hashes: np.ndarray):
    """Record ids are unique across long and packed records (the plan checks inputs earlier
    with file names; this guards the store's own contract). Only equal hashes are compared."""
    ids = np.concatenate([np.asarray(list(long_ids), dtype=object), packed.ids])
    if len(ids) < 2:
        return
    hashes = np.concatenate([id_hashes(list(long_ids)), packed_hashes])
    order = np.argsort(hashes, kind="stable")
    same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
    for j in same.tolist():
        a, b = ids[order[j]], ids[order[j + 1]]
        if a == b:
            raise StoreError(f"{where}: duplicate record id {a!r}")


def _write_table(created: dict, packed: PackedRecords, hashes: np.ndarray, order: np.ndarray):
    """The record table, the batch edges and the id index (written once, by create)."""
    group = {p.split("/", 1)[1]: a for p, a in created.items() if p.startswith(f"{PACKED}/")}
    group[BATCH_ROW][:] = packed.batch_row
    if packed.n_records == 0:
        return
    columns = {ROW_ID: packed.ids, ROW_DESCRIPTION: packed.descriptions, ROW_SOURCE: packed.sources,
               ROW_LENGTH: packed.lengths, ROW_OFFSET: packed.offsets(),
               LOOKUP_HASH: hashes[order], LOOKUP_ROW: order.astype(np.int64)}

    def put(item):
        name, values = item
        group[name][:] = values

    list(_pool().map(put, columns.items()))


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
    if version not in READABLE_VERSIONS:
        raise StoreError(f"{where}: written in linpipe output format {version}, newer than this "
                         f"linpipe ({__version__}) reads (up to {FORMAT_VERSION}); upgrade linpipe")
    return group

