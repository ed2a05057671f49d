"""The output store: one Zarr v3 store per job, written by many workers at once.

Safe by construction (docs/output-format.md): every work unit is exactly one Zarr chunk, with no
sharding, so each chunk file has one writer. A long record (more than one unit) has its own
group, whose chunk i along the position/time axis belongs to the worker running unit i of it;
short records are packed into `_packed/`, whose chunk b belongs to the worker running batch b.
Progress lives beside the outputs in `_linpipe/`: one marker (a Zarr chunk) per unit (`<key>/done[i]`,
`_packed/done[b]`) and one array per long record's boundary state, each again written only by
its owner. Root metadata, the record groups and the record table are written only by `create`
and `finalize` (the driver).

Order inside `write_unit` and `write_batch`: data, boundary state and checksums, flushed to disk
together (fsync on local paths), then the completion marker, flushed in turn; so a unit marked
complete is durable and a process killed at any moment leaves its unit unmarked. The marker,
checksums and state go through `RawChunks` (plain files by the Zarr v3 spec) on local disks.

OSError (a full disk, a lost mount) passes through unchanged: the jobs layer reports it with
the file name and keeps the store resumable.

The store's other parts: location.py (where it lives), create.py (laying it out), records.py
and packed.py (its records), checksums.py (what each unit records and how it is checked).
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

from linpipe.errors import StoreError, option
from linpipe.output_specs import DNA, on_strands
from linpipe.store.checksums import kind_of, unit_checksums
from linpipe.store.layout import (
    CHANNEL_NAMES,
    CREATING,
    FORMAT,
    FORMAT_VERSION,
    PACKED,
    PROGRESS,
    READABLE_VERSIONS,
    TIME,
    WRITABLE_VERSIONS,
    progress_name,
    progress_path,
    record_path,
    state_array,
    state_path,
    stored_strands,
)
from linpipe.store.location import Location, records_only
from linpipe.store.packed import PackedGroup, PackedSlice
from linpipe.store.rawchunks import RawChunks
from linpipe.store.records import RecordMap, StoredRecord
from linpipe.store.table import PackedRecords
from linpipe.store.zarr_spec import ZARR_JSON
from linpipe.strands import FORWARD, REVERSE, Strand
from linpipe.version import __version__


class OutputStore:
    """A linpipe output store opened for writing (driver and workers) or reading."""

    def __init__(self, location: Location, group, *, mode: str):
        self._location = location
        self.path = location.where
        self._group = group
        self.mode = mode
        self._meta = dict(group.attrs["linpipe"])
        self.format_version = int(self._meta["format_version"])
        self._long = {key: StoredRecord.from_stored(key, stored)
                      for key, stored in self._meta["records"].items()}
        self._long_by_id = {info.id: key for key, info in self._long.items()}
        pinfo = self._meta.get("packed")
        self._packed = PackedGroup(group[PACKED], pinfo, self.unit_size) if pinfo else None
        self._strands = stored_strands(self._meta, self.modality, self.path)
        self._arrays: dict[str, object] = {}
        self._resolved: dict[str, StoredRecord] = {}
        self._raw = RawChunks(location)
        self._state_documents: dict[int, bytes] = {}  # state blob size -> its array's zarr.json

    # ------------------------------------------------------------------ create / open
    @classmethod
    def create(cls, path, *, meta: dict, records: list[dict], outputs=None, unit_size: int,
               feature_dim: int | None = None, channels=None, overwrite: bool = False,
               hidden_dtype: str = "float16", packed: PackedRecords | None = None,
               modality: str | None = None, packed_time_dtype: str | None = None,
               packed_inputs=None) -> "OutputStore":
        """Lay out a new store: root metadata, one group per long record, the packed group with
        the short records' table, every output array empty.

        records: dicts {id, length, description?, modality?, input?, time_dtype?}. Without
        `packed`, records of at most unit_size positions are packed here (batched as the plan
        does); with `packed` (the plan's table of short records), `records` holds only the
        long ones, and `modality`/`packed_time_dtype` describe the packed ones."""
        from linpipe.store.create import lay_out

        location, root = lay_out(path, meta=meta, records=records, outputs=outputs, unit_size=unit_size,
                                 feature_dim=feature_dim, channels=channels, overwrite=overwrite,
                                 hidden_dtype=hidden_dtype, packed=packed, modality=modality,
                                 packed_time_dtype=packed_time_dtype, packed_inputs=packed_inputs)
        return cls(location, root, mode="r+")

    @staticmethod
    def exists(path) -> bool:
        """True when anything is stored at path (a local folder or an object-store prefix)."""
        if "://" not in os.fspath(path):
            p = Path(os.fspath(path))
            if p.exists() and not p.is_dir():
                return True
        return not Location(path, read_only=True).is_empty()

    @staticmethod
    def creation_interrupted(path) -> bool:
        """True when path holds a store whose create() never finished (its driver was killed
        while laying it out): it holds no work, and the job's next driver lays it out anew."""
        import zarr

        location = Location(path, read_only=True)
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
        location = Location(path, read_only=(mode == "r"))
        store = cls(location, _open_root(location), mode=mode)
        if mode == "r+" and store.format_version not in WRITABLE_VERSIONS:
            raise StoreError(f"{store.path}: written by linpipe {store.meta.get('linpipe_version')} in "
                             f"output format {store.format_version}; it can be read (linpipe.open_output) "
                             f"but not written to: use {option('overwrite')} to run the job anew, or "
                             f"choose another {option('out')}")
        return store

    # ------------------------------------------------------------------ metadata
    @property
    def meta(self) -> dict:
        """The root `linpipe` attributes (model, inputs, outputs, unit size, job id ...)."""
        return self._meta

    @property
    def unit_size(self) -> int:
        """Positions per work unit (the root attribute `chunk_size`: the stored name stays)."""
        return int(self._meta["chunk_size"])

    @property
    def modality(self) -> str:
        if "modality" in self._meta:
            return self._meta["modality"]
        first = next(iter(self._long.values()), None)  # format 1 has no root modality
        return first.modality if first else DNA

    @property
    def records(self) -> RecordMap:
        """record id -> StoredRecord, for every record (a lazy mapping: packed records come from
        the table on demand)."""
        return RecordMap(self)

    @property
    def long_records(self) -> dict[str, StoredRecord]:
        """group key -> the records with a group of their own."""
        return self._long

    @property
    def packed(self) -> PackedGroup | None:
        """The packed short records (None in a format-1 store)."""
        return self._packed

    @property
    def zarr_store(self):
        """The zarr Store under this output store (for xarray.open_zarr and zarr.open_group)."""
        return self._location.store

    def record(self, key_or_id: str, *, by_key: bool = True) -> StoredRecord:
        """A record, given its id (or the group key of a long record)."""
        rid = str(key_or_id)
        if rid in self._long_by_id:
            return self._long[self._long_by_id[rid]]
        hit = self._resolved.get(rid)
        if hit is not None:
            return hit
        info = None
        if self._packed is not None and (row := self._packed.row_of(rid)) is not None:
            info = self._packed.record(row, self.modality)
        elif by_key and rid in self._long:
            return self._long[rid]
        if info is None:
            raise StoreError(f"{self.path}: no record {rid!r} in this store")
        if len(self._resolved) > 4096:
            self._resolved.clear()
        self._resolved[rid] = info
        return info

    def record_key(self, record_id: str) -> str:
        """The group of a long record; a packed record's id (packed records have no group)."""
        info = self.record(record_id, by_key=False)
        return info.id if info.packed else info.key

    def key(self, key_or_id: str) -> str:
        """The group key of a long record, or the id of a packed one, given a key or an id."""
        info = self.record(key_or_id)
        return info.id if info.packed else info.key

    def n_units(self, key: str) -> int:
        return self.record(key).n_units

    def unit_range(self, key: str, unit: int) -> tuple[int, int]:
        """[start, end) positions of one work unit (a packed record is one unit, whole)."""
        length = self.record(key).length
        return unit * self.unit_size, min(length, (unit + 1) * self.unit_size)

    def output_names(self, key: str | None = None) -> list[str]:
        """The arrays of a record that write_unit/write_batch take: the outputs, and `time` if
        it has one (key None: the packed records)."""
        names = list(self._meta["outputs"])
        if key is None or self.record(key).packed:
            has_time = self._packed is not None and self._packed.time_dtype
        else:
            has_time = self.record(key).time_dtype
        if has_time:
            names.append(TIME)
        return names

    def array(self, key: str, name: str):
        """The zarr array of one output (or `time`/`channel`) of a long record, or a view of a
        packed record's part of the packed array (slices like a zarr array)."""
        info = self.record(key)
        if name not in self.output_names(key) + [CHANNEL_NAMES]:
            raise StoreError(f"{self.path}: record {info.id!r} has no output "
                             f"{name!r} (it has {', '.join(self.output_names(key))})")
        if info.packed:
            if name == CHANNEL_NAMES:
                return self._packed.array(name)
            return PackedSlice(self._packed.array(name), info.offset, info.length)
        try:
            return self._array(record_path(info.key, name))
        except KeyError:
            raise StoreError(f"{self.path}: record {info.id!r} has no output {name!r}") from None

    def dims(self, key: str, name: str) -> tuple[str, ...]:
        """The named dimensions of one output of a record, as stored (its zarr.json): a packed
        record's are those of the packed array."""
        self.array(key, name)  # the same checks and errors
        info = self.record(key)
        path = f"{PACKED}/{name}" if info.packed else record_path(info.key, name)
        return tuple(self._location.document(path).get("dimension_names") or ())

    def _array(self, path: str):
        arr = self._arrays.get(path)
        if arr is None:
            # every unit writes its whole chunk: checking it against the fill value first (to skip
            # an empty one) costs a third of a float16 `hidden` unit's write
            arr = self._arrays[path] = self._group[path].with_config({"write_empty_chunks": True})
        return arr

    # ------------------------------------------------------------------ writing
    def _writable(self):
        if self.mode == "r":
            raise StoreError(f"{self.path}: opened read-only")

    def write_unit(self, key: str, unit: int, arrays: dict, state: dict | None = None,
                    strand: Strand = FORWARD, guard=None):
        """Write one work unit of a long record: every output over the unit's range, then its
        state, then done.

        arrays: name -> array over exactly [unit*unit_size, min(length, (i+1)*unit_size))
        (and `time`, when the record was created with a time_dtype). state: the boundary state
        after this unit, as plain numpy arrays (ModelState.to_arrays()). strand REVERSE: the
        reverse strand's unit over the same range (its reverse outputs, and the state after
        reading the unit backwards), with its own marker, checksums and state. guard: called
        before the unit's first write and again before its marker; what it raises stops the
        write there, the unit not marked done (a worker whose job no longer holds the store).
        """
        self._writable()
        if guard is not None:  # first: a store laid out anew may not even have this unit's arrays
            guard()
        info = self.record(key)
        if info.packed:
            raise StoreError(f"{self.path}: record {info.id!r} is packed (at most one work unit): "
                             f"it is written whole, with its batch {info.batch}, by write_batch")
        key = info.key
        n = info.n_units
        if not 0 <= unit < n:
            raise StoreError(f"{self.path}: record {info.id!r}: unit {unit} out of range "
                             f"(the record has {n} units)")
        start, end = self.unit_range(key, unit)
        what = f"record {info.id!r} unit {unit}" + (" (reverse strand)" if strand == REVERSE else "")
        self._check_strand(strand)
        names = self.unit_names(key, strand)
        if arrays is None:  # a unit that stores no outputs (outside a job's --regions): state and marker
            prepared = {n: None for n in names}
        else:
            prepared = self._prepare(arrays, names, lambda name: record_path(key, name), end - start, what,
                                     f"for positions {start}-{end}")
        done = self._array(progress_path(key, progress_name("done", strand)))
        sums = self._array(progress_path(key, progress_name("sum", strand)))
        self._write_durably(prepared, start, end, done, sums, unit,
                            lambda: self._write_state(key, unit, state, strand) if state is not None
                            else self._drop_state(key, unit, strand), guard)

    @property
    def strands(self) -> tuple[Strand, ...]:
        """(FORWARD,) or (FORWARD, REVERSE) when the store holds the reverse strand's outputs."""
        return self._strands

    def _check_strand(self, strand: Strand):
        if strand not in self.strands:
            raise StoreError(f"{self.path}: no {str(strand)!r} strand in this store (strands: "
                             f"{', '.join(self.strands)})")

    def unit_names(self, key: str, strand: Strand = FORWARD) -> list[str]:
        """The arrays one strand's unit of a long record writes (output_names of that strand;
        `time` goes with the forward strand's)."""
        return on_strands(self.modality, self.output_names(key), (strand,))

    def write_batch(self, batch: int, arrays: dict, guard=None):
        """Write one batch of packed records: each output's values of the batch's records back
        to back, in table order (as PackedRecords lists them), then the batch's marker. guard:
        as write_unit's."""
        self._writable()
        if guard is not None:
            guard()
        p = self._packed
        if p is None or not 0 <= batch < p.n_batches:
            n = p.n_batches if p is not None else 0
            raise StoreError(f"{self.path}: batch {batch} out of range (the store has {n} batches)")
        rows = p.batch_row[batch:batch + 2]
        used = p.batch_positions(batch)
        prepared = self._prepare(arrays, self.output_names(None), lambda name: f"{PACKED}/{name}", used,
                                 f"batch {batch}", f"for its {int(rows[1] - rows[0])} records")
        start = batch * self.unit_size
        padded = {}
        for name, (arr, data) in prepared.items():  # the whole unit: the tail keeps the fill value
            full = np.full((self.unit_size,) + data.shape[1:], arr.fill_value, dtype=arr.dtype)
            full[:used] = data
            padded[name] = (arr, full)
        self._write_durably(padded, start, start + self.unit_size, self._array(progress_path(PACKED, "done")),
                            self._array(progress_path(PACKED, "sum")), batch, lambda: (None, []), guard)

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

    def _write_durably(self, prepared: dict, start: int, end: int, done, sums, index: int, write_state,
                       guard=None):
        """Data, boundary state and checksums durable together, then the marker, durable last
        (guard: called again before it)."""
        raw = self._raw
        if raw.read(done, (index,))[0]:  # rewriting a finished unit: it is not finished while we do
            self._sync([], [raw.write(done, (index,), [0])])
        index_along = start // self.unit_size  # the Zarr chunk's index along positions
        written = [v for v in prepared.values() if v is not None]
        # data: one whole Zarr chunk each (or the part of the array's last one inside it)
        chunks = [(arr, (index_along,) + (0,) * (arr.ndim - 1)) for arr, _ in written]
        files = [raw.write(arr, idx, data) for (arr, data), (_, idx) in zip(written, chunks, strict=True)]
        by_zarr = [c for c, f in zip(chunks, files, strict=True) if f is None]
        blob, state_files = write_state()  # the boundary state after this unit (its bytes, or None)
        checks = unit_checksums([None if v is None else v[1] for v in prepared.values()], blob,
                                kind_of(self))
        files += state_files + [raw.write(sums, (index, 0), checks[None])]
        self._sync(by_zarr, files)
        if guard is not None:
            guard()
        self._sync([], [raw.write(done, (index,), [1])])  # the marker, last

    def _sync(self, chunks, files):
        """fsync zarr-written chunks and the files written directly (None: zarr wrote that one,
        on an object store, where a write is durable when it returns)."""
        self._location.sync(chunks, also=[f for f in files if f is not None])

    def _drop_state(self, key: str, unit: int, strand: Strand = FORWARD):
        """No stale state from an earlier attempt may outlive a write without one: (no blob, no files)."""
        del self._group[state_path(key, unit, strand)]
        return None, []

    def state_blob(self, key: str, unit: int, strand: Strand = FORWARD) -> bytes | None:
        """The stored bytes of a long record's boundary state after a unit (None if absent)."""
        import zarr

        try:
            path = state_path(self.record(key).key, unit, strand)
            arr = zarr.open_array(store=self.zarr_store, path=path, mode="r", zarr_format=3)
        except (FileNotFoundError, KeyError, ValueError):
            return None
        return arr[:].tobytes()

    def unit_sums(self, key: str | None, strand: Strand = FORWARD, unit: int | None = None) -> np.ndarray:
        """(units, arrays + 1) recorded checksums of a long record's units (key None: the packed
        batches), columns in unit_names order, then the state; 0 where none was recorded. unit:
        that unit's row alone, (arrays + 1,): one small file, where the table is one per unit."""
        path = progress_path(PACKED, "sum") if key is None else \
            progress_path(self.record(key).key, progress_name("sum", strand))
        try:
            return np.asarray(self._group[path][slice(None) if unit is None else unit], dtype=np.uint64)
        except KeyError:  # format 1 records none
            n = self._packed.n_batches if key is None else self.n_units(key)
            zeros = np.zeros((n, len(self.output_names(key)) + 1), dtype=np.uint64)
            return zeros if unit is None else zeros[unit]

    def _write_state(self, key: str, unit: int, state: dict, strand: Strand = FORWARD):
        """One uint8 array per boundary holding the state as a safetensors blob (names, dtypes
        and shapes included): one metadata file and one Zarr chunk, whatever the model's layers.
        Returns (the blob's bytes, the files written)."""
        import zarr
        from safetensors.numpy import save

        tensors = {str(k): np.ascontiguousarray(np.asarray(v)) for k, v in state.items()}
        blob = save(tensors)
        path = state_path(key, unit, strand)
        document = self._state_documents.get(len(blob))
        if document is not None:  # a local store: the document zarr wrote for this size, then the bytes
            return blob, [self._location.write_document(path, document),
                          self._raw.put_chunk(path, (0,), blob)]
        arr = zarr.create_array(store=self.zarr_store, name=path, overwrite=True, zarr_format=3,
                                **state_array(len(blob)).create_kwargs())
        files = [f"{path}/{ZARR_JSON}", self._raw.write(arr, (0,), np.frombuffer(blob, dtype=np.uint8))]
        if files[1] is not None:
            self._state_documents[len(blob)] = self._location.read_bytes(files[0])
        return blob, files

    # ------------------------------------------------------------------ progress
    def completed_units(self, key: str, strand: Strand | None = None) -> set[int]:
        """The units written; strand None: on every strand the store holds (what readers see)."""
        info = self.record(key)
        if info.packed:
            b = info.batch
            done = b is None or bool(self._group[f"{PROGRESS}/{PACKED}/done"][b])
            return {0} if done and info.length else set()
        out = None
        for s in self.strands if strand is None else (strand,):
            done = self._array(progress_path(info.key, progress_name("done", s)))
            mine = set(np.flatnonzero(done[:]).tolist())
            out = mine if out is None else out & mine
        return out

    def batches_done(self) -> np.ndarray:
        """(n_batches,) bool: which batches of packed records are written."""
        if self._packed is None:
            return np.zeros(0, dtype=bool)
        return self._packed.batch_done(self._group[PROGRESS])

    def missing_ranges(self, key: str) -> list[tuple[int, int]]:
        """Position ranges [start, end) not yet written, adjacent units merged."""
        done = self.completed_units(key)
        out: list[tuple[int, int]] = []
        for i in range(self.n_units(key)):
            if i in done:
                continue
            s, e = self.unit_range(key, i)
            if out and out[-1][1] == s:
                out[-1] = (out[-1][0], e)
            else:
                out.append((s, e))
        return out

    def boundary_state(self, key: str, unit: int, strand: Strand = FORWARD) -> dict | None:
        """The state saved after `unit`, or None when that unit is not complete (or was
        written without a state; packed records have none). strand REVERSE: the reverse strand's
        state after reading unit `unit` (from the record's end down to its start)."""
        from safetensors.numpy import load

        if self.record(key).packed or unit not in self.completed_units(key, strand):
            return None
        blob = self.state_blob(key, unit, strand)
        return None if blob is None else load(blob)

    def is_complete(self) -> bool:
        return bool(self._group.attrs["linpipe"].get("complete", False))

    def record_complete(self, key: str) -> bool:
        """True when every unit of the record is written (data, state and marker)."""
        return len(self.completed_units(key)) == self.n_units(key)

    def progress(self) -> dict:
        """Counts of records, positions and units, in all and done (without a per-record loop
        over packed records). On both strands a long record's units count once per strand."""
        records = records_done = positions = positions_done = units = units_done = 0
        for key, info in self._long.items():
            n, length = info.n_units, info.length
            records += 1
            records_done += len(self.completed_units(key)) == n
            positions += length
            # each strand's units count apart (on both strands a unit is two units of work, and
            # a position is half done when one strand has run it)
            strand_positions = 0
            for strand in self.strands:
                done = self.completed_units(key, strand)
                strand_positions += sum(b - a for a, b in (self.unit_range(key, i) for i in done))
                units += n
                units_done += len(done)
            positions_done += strand_positions // len(self.strands)
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
        if not all(self.record_complete(key) for key in self._long):
            return False
        if not self.batches_done().all():
            return False
        meta = {**self._group.attrs["linpipe"], "complete": True}
        self._location.remove_leftovers()
        with warnings.catch_warnings():  # zarr: consolidated metadata is not in the v3 spec yet
            warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
            root = zarr.consolidate_metadata(records_only(self.zarr_store), zarr_format=3)
        root.update_attributes({"linpipe": meta})
        self._group = zarr.open_group(store=self.zarr_store, mode="r+", zarr_format=3, use_consolidated=False)
        self._arrays.clear()
        if self._packed is not None:
            self._packed = PackedGroup(self._group[PACKED], meta["packed"], self.unit_size)
        self._meta = meta
        return True

    def split_records(self, key: str, bounds):
        """What a split run of the long record `key` in segments `bounds` keeps here while it
        runs (store/splits.py)."""
        from linpipe.store.splits import SplitRecords

        return SplitRecords(self._location, self.record(key).key, bounds)

    def size_on_disk(self) -> int:
        """Bytes stored under the store's root (files on disk, or objects in a bucket)."""
        return self._location.size()

    def close(self):
        self._arrays.clear()
        self._resolved.clear()


def _open_root(location: Location):
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

