"""The records of a store as typed objects: one `StoredRecord` per record, long or packed.

A long record's facts are stored twice, identically: in the root's `linpipe.records[key]` and in
its group's `linpipe_record` attribute (`StoredRecord.stored()` makes both). A packed record's
come from its row of the record table.
"""
from __future__ import annotations

import collections.abc
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StoredRecord:
    """One record of an output store (`store.record(id)`, `reader.records[id]`)."""

    id: str
    description: str
    length: int
    modality: str
    input: str | None  # the input file that holds it
    n_units: int  # work units: ceil(length / unit_size) for a long record, 1 (0 if empty) packed
    packed: bool
    key: str | None = None  # a long record's group
    time_dtype: str | None = None  # a long record's time coordinate, as its input has it
    row: int | None = None  # a packed record's row of the record table
    offset: int | None = None  # a packed record's start on the packed axis
    batch: int | None = None  # a packed record's batch (None: an empty record, in none)

    @property
    def n_chunks(self) -> int:
        """n_units under the name the stored attributes give it (kept for analysts' code)."""
        return self.n_units

    @classmethod
    def long(cls, *, id, description, length: int, modality: str, input, unit_size: int,
             time_dtype=None) -> "StoredRecord":
        """A record with a group of its own, before its key is known (OutputStore.create)."""
        return cls(str(id), str(description), int(length), modality, input,
                   math.ceil(int(length) / unit_size), False,
                   time_dtype=str(np.dtype(time_dtype)) if time_dtype else None)

    @classmethod
    def from_stored(cls, key: str, stored: dict) -> "StoredRecord":
        """A long record from its stored attributes (root `linpipe.records[key]`)."""
        return cls(stored["id"], stored["description"], int(stored["length"]), stored["modality"],
                   stored.get("input"), int(stored["n_chunks"]), False, key=key,  # n_units
                   time_dtype=stored.get("time_dtype"))

    @classmethod
    def from_row(cls, *, id, description, length, modality: str, input, row: int, offset, batch):
        """A packed record from its row of the record table."""
        length = int(length)
        return cls(str(id), str(description), length, modality, input, 1 if length else 0, True,
                   row=int(row), offset=int(offset), batch=batch)

    def stored(self) -> dict:
        """A long record's attributes as stored (root `linpipe.records[key]`, group `linpipe_record`)."""
        out = {"id": self.id, "description": self.description, "length": self.length,
               "modality": self.modality, "input": self.input, "n_chunks": self.n_units}
        if self.time_dtype:
            out["time_dtype"] = self.time_dtype
        return out


class RecordMap(collections.abc.Mapping):
    """record id -> StoredRecord, for long records (own group) and packed ones alike.

    Lookups of packed ids go through the store's id index; iteration streams the table (long
    records first, then packed order)."""

    def __init__(self, store):
        self._out = store

    def __getitem__(self, record_id) -> StoredRecord:
        return self._out.record(record_id)

    def __iter__(self):
        for info in self._out.long_records.values():
            yield info.id
        p = self._out.packed
        if p is not None:
            yield from p.ids()

    def __len__(self):
        p = self._out.packed
        return len(self._out.long_records) + (p.n_records if p is not None else 0)

    def __contains__(self, record_id):
        from linpipe.errors import StoreError

        try:
            self._out.record(record_id)
            return True
        except StoreError:
            return False

    def items(self):
        """(id, record) pairs, streaming the packed table (no lookup per record)."""
        for info in self.values():
            yield info.id, info

    def values(self):
        yield from self._out.long_records.values()
        p = self._out.packed
        if p is not None:
            yield from p.records(self._out.modality)
