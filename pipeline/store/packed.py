"""The short records of a store: the `_packed/` group, its record table and id index.

Everything is read lazily and by Zarr chunk, so finding one record among a million reads a few
small chunks (no scan), and iterating the table streams it.
"""
from __future__ import annotations

import numpy as np

from linpipe.store.layout import (
    BATCH_ROW,
    LOOKUP_HASH,
    LOOKUP_ROW,
    PACKED,
    ROW_DESCRIPTION,
    ROW_ID,
    ROW_LENGTH,
    ROW_OFFSET,
    ROW_SOURCE,
    TABLE_CHUNK,
)
from linpipe.store.location import pool
from linpipe.store.records import StoredRecord
from linpipe.store.table import PackedRecords, id_hashes

RECORD_COLUMNS = (ROW_ID, ROW_DESCRIPTION, ROW_LENGTH, ROW_OFFSET, ROW_SOURCE)


class PackedGroup:
    """The `_packed/` group of an open store (`store.packed`)."""

    def __init__(self, group, info: dict, unit_size: int):
        self.group = group
        self.n_records = int(info["records"])
        self.n_batches = int(info["batches"])
        self.positions = int(info["positions"])
        self.time_dtype = info.get("time_dtype")
        self.inputs = list(info.get("inputs") or [])
        self.unit_size = unit_size
        self._arrays: dict[str, object] = {}
        self._batch_row = None
        self._batch_positions = None
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
        """The table row of a record id, or None: one Zarr chunk of the sorted hashes, then the id."""
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

    def _records(self, lo: int, cols: dict, modality: str):
        """StoredRecords of consecutive table rows from lo, given their columns."""
        batches = np.searchsorted(self.batch_row, np.arange(lo, lo + len(cols[ROW_ID])), side="right") - 1
        for j, rid in enumerate(cols[ROW_ID]):
            source, b = int(cols[ROW_SOURCE][j]), int(batches[j])
            yield StoredRecord.from_row(
                id=rid, description=cols[ROW_DESCRIPTION][j], length=cols[ROW_LENGTH][j], modality=modality,
                input=self.inputs[source] if source < len(self.inputs) else None, row=lo + j,
                offset=cols[ROW_OFFSET][j], batch=b if b < self.n_batches else None)

    def record(self, row: int, modality: str) -> StoredRecord:
        """The record at one table row."""
        return next(self._records(row, {n: self.array(n)[row:row + 1] for n in RECORD_COLUMNS}, modality))

    def records(self, modality: str):
        """Every packed record, in table order, one Zarr chunk of rows at a time."""
        for lo, cols in self.columns(RECORD_COLUMNS):
            yield from self._records(lo, cols, modality)

    def ids(self):
        for _lo, cols in self.columns((ROW_ID,)):
            yield from (str(x) for x in cols[ROW_ID])

    def batch_ids(self, batch: int) -> list[str]:
        """The ids of one batch's records, in the order write_batch takes their values."""
        lo, hi = int(self.batch_row[batch]), int(self.batch_row[batch + 1])
        return [str(x) for x in self.array(ROW_ID)[lo:hi]]

    def batch_positions(self, batch: int) -> int:
        """Positions the batch's records hold (the rest of its unit keeps the fill value)."""
        if self._batch_positions is None:  # read once: a worker asks for every batch it writes
            ends = np.concatenate(([0], np.cumsum(self.lengths())))
            self._batch_positions = np.diff(ends[self.batch_row])
        return int(self._batch_positions[batch])

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


def write_table(group: dict, packed: PackedRecords, hashes: np.ndarray, order: np.ndarray):
    """The record table, the batch edges and the id index (written once, by create), into the
    new `_packed/` arrays (name -> zarr array); order: the rows by id hash."""
    group[BATCH_ROW][:] = packed.batch_row
    if packed.n_records == 0:
        return
    columns = {ROW_ID: packed.ids, ROW_DESCRIPTION: packed.descriptions, ROW_SOURCE: packed.sources,
               ROW_LENGTH: packed.lengths, ROW_OFFSET: packed.offsets(),
               LOOKUP_HASH: hashes[order], LOOKUP_ROW: order.astype(np.int64)}

    def put(item):
        name, values = item
        group[name][:] = values

    list(pool().map(put, columns.items()))


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
