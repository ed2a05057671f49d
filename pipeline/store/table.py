"""The short records of a job as columns: the plan batches them, the store packs them.

A job over a draft assembly or a sensor fleet has hundreds of thousands of records of at most
one work unit each. Python objects per record would cost the driver gigabytes and a Zarr group
per record would cost the store millions of files, so short records live in one table of
arrays, in *packed order*: batch after batch, longest records first, each batch a run of
consecutive rows that together hold at most one work unit of positions.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# A batch of short records holds at most this many records and one work unit of positions.
MAX_BATCH_RECORDS = 256


_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


def id_hashes(ids) -> np.ndarray:
    """FNV-1a 64 of each id's UTF-8 bytes (the key of the store's id index; part of the format).

    Vectorised over ids, one pass per byte position, so a million ids hash in well under a second."""
    ids = np.asarray(ids, dtype=object)
    h = np.full(ids.size, _FNV_OFFSET, dtype=np.uint64)
    if ids.size == 0:
        return h
    raw = np.char.encode(ids.astype(str), "utf-8")  # (N,) fixed-width bytes, NUL-padded
    width = raw.dtype.itemsize
    lengths = np.char.str_len(raw)
    table = raw.view(np.uint8).reshape(ids.size, width)
    with np.errstate(over="ignore"):  # multiplication modulo 2**64 is the algorithm
        for j in range(width):
            live = lengths > j
            h[live] = (h[live] ^ table[live, j].astype(np.uint64)) * _FNV_PRIME
    return h


@dataclass(frozen=True, eq=False)
class PackedRecords:
    """Short records in packed order. Rows batch_row[b]:batch_row[b+1] are batch b; rows from
    batch_row[-1] on are empty records (no work, nothing stored but their table row)."""

    ids: np.ndarray  # (N,) object: str
    descriptions: np.ndarray  # (N,) object: str
    lengths: np.ndarray  # (N,) int64
    sources: np.ndarray  # (N,) int32: which of the job's inputs holds the record
    batch_row: np.ndarray  # (n_batches + 1,) int64
    unit_size: int

    @classmethod
    def build(cls, ids, descriptions, lengths, sources, *, unit_size: int,
              max_batch_records: int = MAX_BATCH_RECORDS) -> "PackedRecords":
        """Batch records of at most unit_size positions: longest first (ties in input order), a
        new batch when the next record would overflow the unit or the batch is full. A pure
        function of the index, so a resumed job re-runs exactly the batches of the first run."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.size and lengths.max() > unit_size:
            raise ValueError(f"a packed record is longer than one work unit ({lengths.max()} > {unit_size})")
        order = np.argsort(-lengths, kind="stable")
        ls = lengths[order]
        edges = [0]
        pos = 0
        n_nonempty = int(np.count_nonzero(ls))
        for i in range(n_nonempty):
            n = int(ls[i])
            if i > edges[-1] and (pos + n > unit_size or i - edges[-1] >= max_batch_records):
                edges.append(i)
                pos = 0
            pos += n
        if n_nonempty:
            edges.append(n_nonempty)
        ids = np.asarray(list(ids), dtype=object)
        descriptions = np.asarray(list(descriptions), dtype=object)
        return cls(ids[order], descriptions[order], ls, np.asarray(sources, dtype=np.int32)[order],
                   np.asarray(edges, dtype=np.int64), int(unit_size))

    @property
    def n_records(self) -> int:
        return int(self.lengths.size)

    @property
    def n_batches(self) -> int:
        return int(self.batch_row.size - 1)

    @property
    def positions(self) -> int:
        return int(self.lengths.sum())

    def rows(self, batch: int) -> range:
        return range(int(self.batch_row[batch]), int(self.batch_row[batch + 1]))

    def batch_positions(self, batch: int) -> int:
        return int(self.lengths[self.rows(batch).start:self.rows(batch).stop].sum())

    def offsets(self) -> np.ndarray:
        """Each record's start on the packed axis: its batch's start plus the records
        before it in the batch (empty records: 0)."""
        off = np.zeros(self.n_records, dtype=np.int64)
        for b in range(self.n_batches):
            r = self.rows(b)
            ls = self.lengths[r.start:r.stop]
            off[r.start:r.stop] = b * self.unit_size + np.concatenate(([0], np.cumsum(ls)[:-1]))
        return off
