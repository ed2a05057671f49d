"""Reading a linpipe output store: `linpipe.open_output(path)` for analysts and for the CLI."""
from __future__ import annotations

import collections.abc
import os
import warnings

import numpy as np

from linpipe.errors import StoreError, option
from linpipe.output_specs import BASES
from linpipe.store.checked import CheckedArray, lazy
from linpipe.store.checksums import STATE, UnitCheck
from linpipe.store.layout import (
    CHANNEL_NAMES,
    DIM_BASE,
    DIM_CHANNEL,
    PACKED,
    POSITION_DIM,
    ROW_DESCRIPTION,
    ROW_ID,
    ROW_LENGTH,
    ROW_OFFSET,
    TIME,
    packed_dim,
)
from linpipe.store.records import StoredRecord
from linpipe.store.writer import OutputStore

SHOWN = 20  # packed records listed by summary() (the record table has them all)


class IncompleteStoreWarning(UserWarning):
    """The store is readable, but some units were never written (their values read as NaN)."""


class CorruptUnitWarning(UserWarning):
    """A unit read back does not match the checksums written with it (`linpipe verify --repair`)."""


class _MissingRanges(collections.abc.Mapping):
    """record id -> [(start, end), ...] not written yet, computed on access (a store can hold a
    million records)."""

    def __init__(self, reader: "OutputReader"):
        self._reader = reader

    def __getitem__(self, record):
        if self._reader.complete:
            self._reader.store.record(record)  # unknown ids still fail
            return []
        return self._reader.store.missing_ranges(record)

    def __iter__(self):
        return iter(self._reader.records)

    def __len__(self):
        return len(self._reader.records)


class OutputReader:
    """A read-only view of one job's outputs.

    .meta      the root `linpipe` attributes (model, inputs, outputs, unit size, job id ...)
    .records   record id -> StoredRecord(id, description, length, modality, n_units, packed, key | offset)
    .dataset(record_id) -> xarray.Dataset with named dims and coordinates (long and packed alike)
    .record_table() -> pandas.DataFrame of every record; .packed_dataset() -> the packed arrays
    .missing_ranges   record id -> [(start, end), ...] positions not written yet
    .array(record, output), .read(record, output, start, end), .dims(record, output),
    .time(record, start, end), .completed_ranges(record), .units(output) for streaming reads
    """

    def __init__(self, path):
        self._out = OutputStore.open(path, mode="r")
        self.path = self._out.path
        self.meta = self._out.meta
        self.records = self._out.records
        self.complete = self._out.is_complete()
        self.missing_ranges = _MissingRanges(self)
        self._batches_checked: set[int] = set()  # dataset() checks a packed batch once per reader
        self._check = UnitCheck(self._out)

    @property
    def store(self) -> OutputStore:
        return self._out

    def record(self, record_id_or_key: str) -> StoredRecord:
        """One record, given its id (or a long record's group key)."""
        try:
            return self._out.record(record_id_or_key)
        except StoreError:
            ids = [rid for rid, _ in zip(self.records, range(5), strict=False)]
            raise StoreError(f"{self.path}: no record {record_id_or_key!r} (records: {', '.join(ids)}"
                             f"{', ...' if len(self.records) > 5 else ''})") from None

    def key(self, record_id_or_key: str) -> str:
        """A long record's group key, or a packed record's id."""
        self.record(record_id_or_key)
        return self._out.key(record_id_or_key)

    def dataset(self, record_id_or_key: str, check: bool = False):
        """One record's outputs with named dims: lazily for a long record (values load when you
        index them), read at once for a packed one (it is at most one work unit, and its batch
        is held to its checksums: a CorruptUnitWarning when it fails). check=True reads a long
        record whole, now, and holds every completed unit to its checksums the same way
        (`linpipe verify` does this for a whole store)."""
        import pandas as pd
        import xarray as xr

        info = self.record(record_id_or_key)
        dim = POSITION_DIM[info.modality]
        if info.packed:
            self._check_batch(info)
            ds = self._packed_record(info)
        else:
            try:
                ds = xr.open_zarr(self._out.zarr_store, group=info.key,
                                  consolidated=None if self.complete else False, zarr_format=3, chunks=None)
            except (FileNotFoundError, KeyError) as e:  # a record group deleted or damaged after the job
                raise StoreError(f"{self.path}: record {info.id!r} cannot be read ({type(e).__name__}: "
                                 f"{e}); the store is damaged: run the job again with "
                                 f"{option('overwrite')}") from None
            except (OSError, StoreError):
                raise
            except Exception:  # noqa: BLE001  a coordinate (time) read at once, a chunk undecodable
                for name in self._out.output_names(info.key):
                    self.array(info.id, name)[:]  # the unit that fails, named
                raise
            ds = self._checked(ds, info.id)
            if check:
                for s, _e in self.completed_ranges(info.id):
                    self._unit(info, s // self._out.unit_size, None)
                ds = ds.load()
        if dim not in ds.coords:  # positions from 0, as a lazy range (no big int array in memory)
            ds = ds.assign_coords(xr.Coordinates({dim: pd.RangeIndex(info.length, name=dim)}))
        if DIM_BASE in ds.dims and DIM_BASE not in ds.coords:  # ds.logprob_acgt.sel(base="G")
            ds = ds.assign_coords({DIM_BASE: np.asarray(BASES, dtype=object)})
        ds.attrs.update({"record_id": info.id, "description": info.description,
                         "record_key": info.key, "packed": info.packed,
                         "missing_ranges": [list(r) for r in self.missing_ranges[info.id]]})
        return ds

    def _checked(self, ds, record_id: str | None):
        """The dataset with each output read unit by unit through CheckedArray, lazily (a
        record's, or with record_id None the packed arrays along the packed axis)."""
        for name in list(ds.data_vars):
            if record_id is not None:
                arr = self.array(record_id, name)
            elif ds[name].dims[:1] == (packed_dim(self._out.modality),):
                arr = CheckedArray(self._out.packed.array(name), store=self.path, name=name,
                                   unit_size=self._out.unit_size, where=lambda b: f"packed batch {b}")
            else:
                continue  # the record table
            ds[name] = ds[name].copy(data=lazy(arr))
        return ds

    def _check_batch(self, info: StoredRecord) -> None:
        b = info.batch
        if b is None or not info.length or b in self._batches_checked:
            return
        self._batches_checked.add(b)
        # this batch's own flag and checksums: a few small files, where every batch's would be a
        # file per batch (seconds for a store of a million records)
        if self._out.completed_units(info.id):
            self._unit(info, b, None, alone=True)

    def _packed_record(self, info: StoredRecord):
        """A packed record as an xarray.Dataset with the dims of a long record."""
        import xarray as xr

        dim = POSITION_DIM[info.modality]
        data_vars, coords = {}, {}
        for name in self._out.output_names(info.id):
            view = self._out.array(info.id, name)
            values = view[:]
            attrs = dict(view.attrs)
            dims = (dim,) + self._out.dims(info.id, name)[1:]
            if name == TIME:
                if "units" in attrs:
                    values = values.astype("datetime64[ns]")
                    attrs = {}
                coords[TIME] = xr.Variable((dim,), values, attrs)
            else:
                data_vars[name] = xr.Variable(dims, values, attrs)
        channels = self.meta.get("channels")
        if info.modality == "timeseries" and channels:
            coords[CHANNEL_NAMES] = xr.Variable((DIM_CHANNEL,), np.asarray(channels, dtype=object))
        return xr.Dataset(data_vars, coords)

    def array(self, record_id_or_key: str, output: str):
        """One output of a record, sliceable like a zarr array (for streaming reads without
        xarray), over the record's own positions (a packed record's part of the packed array);
        a unit that cannot be decoded is a StoreError naming it (linpipe.store.checked)."""
        info = self.record(record_id_or_key)
        arr = self._out.array(info.id if info.packed else info.key, output)
        if output == CHANNEL_NAMES:
            return arr
        if info.packed:
            return CheckedArray(arr, store=self.path, name=output, unit_size=self._out.unit_size,
                                where=lambda b: f"packed batch {b}", origin=info.offset)
        return CheckedArray(arr, store=self.path, name=output, unit_size=self._out.unit_size,
                            where=lambda u: f"record {info.id!r} unit {u}")

    def read(self, record_id_or_key: str, output: str, start: int = 0, end: int | None = None):
        """The values of one output over [start, end) of a record (numpy)."""
        return self.array(record_id_or_key, output)[start:end]

    def dims(self, record_id_or_key: str, output: str) -> tuple[str, ...]:
        """The named dimensions of one output, e.g. ('position',) or ('time', 'channel')."""
        info = self.record(record_id_or_key)
        dims = self._out.dims(info.id if info.packed else info.key, output)
        if info.packed:  # the packed array's axis, as the record's own
            return tuple(POSITION_DIM[info.modality] if d == packed_dim(info.modality) else d for d in dims)
        return dims

    def completed_ranges(self, record_id_or_key: str) -> list[tuple[int, int]]:
        """[start, end) of every completed work unit, in position order."""
        rid = self.record(record_id_or_key).id
        done = self._out.completed_units(rid)
        return [self._out.unit_range(rid, i) for i in range(self._out.n_units(rid)) if i in done]

    def time(self, record_id_or_key: str, start: int, end: int):
        """The record's time stamps over [start, end) (datetime64 when the input had dates), or
        None when the record has none (its positions are plain indices)."""
        rid = self.record(record_id_or_key).id
        if TIME not in self._out.output_names(rid):
            return None
        arr = self.array(rid, TIME)
        return self.decode_time(arr[start:end])

    def decode_time(self, values):
        """Stored time values as the input had them (datetime64 when it had dates)."""
        p = self._out.packed
        arr = p.array(TIME) if p is not None and p.time_dtype else None
        if arr is None:
            long = next((k for k, i in self._out.long_records.items() if i.time_dtype), None)
            arr = self._out.array(long, TIME) if long else None
        return values.astype("datetime64[ns]") if arr is not None and "units" in arr.attrs else values

    def _unit(self, info: StoredRecord, unit: int, names, alone: bool = False) -> dict:
        """One unit read whole (a long record's unit, or a packed batch), held to its
        checksums by the rule `linpipe verify` applies (checksums.UnitCheck): a StoreError when
        an array asked for cannot be decoded (there are no values to give), else a
        CorruptUnitWarning per array or state that is bad. Returns its values of `names` (None:
        all). alone: a packed batch's checksums read alone (UnitCheck.batch)."""
        where = f"packed batch {unit}" if info.packed else f"record {info.id!r} unit {unit}"
        if info.packed:
            values, faults = self._check.batch(unit, names, alone=alone)
        else:
            values, faults = self._check.long_unit(info.key, unit, names)
        unreadable = [str(f) for f in faults if f.error and f.name != STATE]
        if unreadable:
            raise StoreError(f"{self.path}: {where}: {'; '.join(unreadable)}; run "
                             f"linpipe verify {self.path} with {option('repair')}")
        for f in faults:
            warnings.warn(f"{self.path}: {where}: {f}; run linpipe verify {self.path} with repair",
                          CorruptUnitWarning, stacklevel=4)
        return values

    def units(self, output, records=None):
        """Yield (record, start, values) for every completed unit of one output, each held to
        its checksums as it is read: long records unit by unit, packed records batch by batch
        (each packed batch is read once, whatever the number of records in it). `output` a
        list: values is a dict name -> values. `records`: ids to restrict to (in this order)."""
        names = [output] if isinstance(output, str) else list(output)

        def pick(d):
            return d[names[0]] if isinstance(output, str) else d

        size = self._out.unit_size
        ok = self._out.batches_done()
        batch = [None, {}]  # the packed batch read last, and its values

        def of(info):
            if not info.packed:
                for s, _e in self.completed_ranges(info.id):
                    yield info, s, pick(self._unit(info, s // size, names))
                return
            b = info.batch
            if b is None or not info.length or not ok[b]:
                return
            if batch[0] != b:
                batch[:] = b, self._unit(info, b, names)
            lo = info.offset - b * size
            yield info, 0, pick({n: v[lo:lo + info.length] for n, v in batch[1].items()})

        if records is not None:
            for rid in records:
                yield from of(self.record(rid))
            return
        for info in self._out.long_records.values():
            yield from of(info)
        p = self._out.packed
        if p is not None and p.n_batches:
            for info in p.records(self._out.modality):
                yield from of(info)

    blocks = units  # the name analysts' code may still use

    def record_table(self):
        """Every record as one row of a pandas.DataFrame: id, description, length, packed, and the
        group key (long records) or the offset on the packed axis (packed ones)."""
        import pandas as pd

        parts = []
        long = list(self._out.long_records.items())
        if long:
            parts.append(pd.DataFrame({
                "id": [i.id for _, i in long], "description": [i.description for _, i in long],
                "length": np.array([i.length for _, i in long], dtype=np.int64),
                "packed": False, "key": [k for k, _ in long], "offset": -1}))
        p = self._out.packed
        if p is not None and p.n_records:
            for _lo, cols in p.columns():
                parts.append(pd.DataFrame({
                    "id": cols[ROW_ID].astype(object), "description": cols[ROW_DESCRIPTION].astype(object),
                    "length": cols[ROW_LENGTH].astype(np.int64), "packed": True, "key": None,
                    "offset": cols[ROW_OFFSET].astype(np.int64)}))
        if not parts:
            return pd.DataFrame(columns=["id", "description", "length", "packed", "key", "offset"])
        return pd.concat(parts, ignore_index=True)

    def packed_dataset(self):
        """The packed records' arrays as one xarray.Dataset (lazy): outputs along the packed
        axis, the record table along `record` (use `offset` and `length` to slice a record)."""
        import xarray as xr

        if self._out.packed is None:
            raise StoreError(f"{self.path}: a format-1 store has no packed records")
        ds = xr.open_zarr(self._out.zarr_store, group=PACKED, consolidated=None if self.complete else False,
                          zarr_format=3, chunks=None)
        return self._checked(ds, None)

    def summary(self) -> dict:
        """What `linpipe inspect` shows: records, completion, sizes and compression ratio.
        Long records are listed one by one; packed ones are summed up (there can be millions)."""
        raw = stored = 0
        records = []
        # with --regions a unit outside them writes no chunk: count what was written, not the
        # record's every position (which made a ratio of hundreds)
        regions = self.meta.get("regions")
        for key, info in self._out.long_records.items():
            n = info.n_units
            done = n if self.complete else len(self._out.completed_units(key))
            frac = done / n if n else 1.0
            for name in self._out.output_names(key):
                a = self._out.array(key, name)
                if regions:
                    raw += min(a.nbytes, a.nchunks_initialized * int(np.prod(a.chunks)) * a.dtype.itemsize)
                else:
                    raw += int(a.nbytes * frac)
                stored += a.nbytes_stored()
            records.append({"key": key, "id": info.id, "length": info.length,
                            "modality": info.modality, "chunks_done": done, "chunks": n,
                            "missing_ranges": [list(r) for r in self.missing_ranges[info.id]]})
            if len(self._out.strands) > 1:  # each strand's own progress (done above: on both)
                records[-1]["chunks_done_per_strand"] = {
                    s: n if self.complete else len(self._out.completed_units(key, s))
                    for s in self._out.strands}
        progress = self._out.progress()
        packed = None
        p = self._out.packed
        if p is not None:
            ok = self._out.batches_done()
            for name in self._out.output_names(None):
                a = p.array(name)
                per_position = a.nbytes // max(a.shape[0], 1)
                raw += int(per_position * p.positions * (ok.mean() if ok.size else 1.0))
                stored += a.nbytes_stored()
            first = []  # a glimpse of the packed records (there can be millions)
            for _lo, cols in p.columns((ROW_ID, ROW_LENGTH)):
                ids, lengths = cols[ROW_ID][:SHOWN], cols[ROW_LENGTH][:SHOWN]
                first = [{"id": str(i), "length": int(n)} for i, n in zip(ids, lengths, strict=True)]
                break
            packed = {"records": p.n_records, "positions": p.positions, "batches": p.n_batches,
                      "batches_done": int(ok.sum()), "first": first}
        m = self.meta
        model = m.get("model") or {}
        model_sha256 = m.get("model_sha256") or (model.get("sha256") if isinstance(model, dict) else None)
        return {
            "path": self.path, "format_version": m.get("format_version"),
            "linpipe_version": m.get("linpipe_version"), "job_id": m.get("job_id"),
            "complete": self.complete, "outputs": m.get("outputs"), "chunk_size": m.get("chunk_size"),
            "model_sha256": model_sha256,
            "model": model, "inputs": m.get("inputs", []),
            "n_records": progress["records"], "positions": progress["positions"],
            "positions_done": progress["positions_done"],
            "units": progress["units"], "units_done": progress["units_done"],
            "size_on_disk": self._out.size_on_disk(), "output_bytes_raw": raw,
            "output_bytes_stored": stored,
            "compression_ratio": (raw / stored) if stored else None,
            "records": records, "packed": packed,
            "strands": list(self._out.strands), "regions": regions,
        }


def as_reader(store) -> OutputReader:
    """An OutputReader, given one or a store's path or URL."""
    return store if isinstance(store, OutputReader) else OutputReader(store)


def open_output(path) -> OutputReader:
    """Open an output store for reading; warns (IncompleteStoreWarning) when units are missing."""
    reader = OutputReader(path)
    if not reader.complete:
        parts = []
        for key, info in reader.store.long_records.items():
            for s, e in reader.store.missing_ranges(key):
                parts.append(f"{info.id}:{s}-{e}")
        shown = ", ".join(parts[:3]) + (f" and {len(parts) - 3} more ranges" if len(parts) > 3 else "")
        ok = reader.store.batches_done()
        if ok.size and not ok.all():
            shown += (", " if shown else "") + f"{int((~ok).sum())} of {ok.size} batches of short records"
        if shown:
            warnings.warn(f"{os.fspath(path)}: incomplete store (its job has not finished); missing {shown}",
                          IncompleteStoreWarning, stacklevel=2)
    return reader


__all__ = ["open_output", "as_reader", "OutputReader", "IncompleteStoreWarning", "CorruptUnitWarning"]
