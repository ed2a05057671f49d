"""Random access to the rows of an Arrow IPC file (memory-mapped) or a Parquet file: what a
time-series input reads its series from (linpipe.inputs.timeseries)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

BATCH_ROWS = 1 << 16  # rows per batch in converted files and Parquet reads
# A Parquet row group up to this many rows is decoded whole once and kept (the columns read):
# short series read in a batch's order (longest first), not the file's, would otherwise decode
# the row group again from its start for every series behind the last one read.
WHOLE_ROW_GROUP_ROWS = 1 << 21
# Bytes of Arrow record batches kept by Table.batch (memory-mapped ones cost only address space;
# a compressed file's are decompressed copies).
KEEP_BYTES = 256 << 20


class Table:
    """One file's rows by their number in the file (0 .. num_rows - 1), over its row groups or
    record batches (`unit_starts`: the first row of each)."""

    def __init__(self, path: Path, kind: str):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path, self.kind = path, kind
        if kind == "parquet":
            self.pf = pq.ParquetFile(path)
            self.schema = self.pf.schema_arrow
            sizes = [self.pf.metadata.row_group(i).num_rows for i in range(self.pf.num_row_groups)]
        else:
            self.reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
            self.schema = self.reader.schema
            sizes = [self.reader.get_batch(i).num_rows for i in range(self.reader.num_record_batches)]
        self.unit_starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self.num_rows = int(self.unit_starts[-1])
        self._cursor = None  # parquet: (row group, columns, iterator, batch, batch start row)
        self._whole = None  # parquet: (row group, columns, its table) of a row group read whole
        self._batches: dict = {}  # arrow: (batch, columns) -> the batch (batch())
        self._kept = 0  # their bytes

    def iter_units(self, columns: list[str]):
        """(first global row, record batch) over the whole file, columns subset."""
        if self.kind == "parquet":
            row = 0
            for batch in self.pf.iter_batches(batch_size=BATCH_ROWS, columns=columns):
                yield row, batch
                row += batch.num_rows
        else:
            for i in range(self.reader.num_record_batches):
                yield int(self.unit_starts[i]), self.reader.get_batch(i).select(columns)

    def rows(self, g0: int, g1: int, columns: list[str]) -> list:
        """Record batches (slices) holding global rows g0..g1-1, in order."""
        out = []
        u = int(np.searchsorted(self.unit_starts, g0, side="right")) - 1
        while g0 < g1:
            u0, u1 = int(self.unit_starts[u]), int(self.unit_starts[u + 1])
            lo, hi = g0 - u0, min(g1, u1) - u0
            if self.kind == "parquet":
                out.extend(self._parquet_rows(u, lo, hi, columns))
            else:
                out.append(self.reader.get_batch(u).select(columns).slice(lo, hi - lo))
            g0 = u0 + hi
            u += 1
        return out

    def _parquet_rows(self, rg: int, lo: int, hi: int, columns: list[str]):
        if self.unit_starts[rg + 1] - self.unit_starts[rg] <= WHOLE_ROW_GROUP_ROWS:
            if self._whole is None or self._whole[:2] != (rg, columns):
                self._whole = (rg, columns, self.pf.read_row_group(rg, columns=columns))
            return self._whole[2].slice(lo, hi - lo).to_batches()
        # a larger row group: streamed in batches, continuing from the last read when it is behind us
        cur = self._cursor
        if cur is None or cur[0] != rg or cur[1] != columns or cur[4] > lo:
            it = self.pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[rg], columns=columns)
            cur = [rg, columns, it, None, 0]
            cur[3] = next(it)
        out = []
        while True:
            batch, b0 = cur[3], cur[4]
            b1 = b0 + batch.num_rows
            if b1 > lo and b0 < hi:
                s = max(lo, b0)
                out.append(batch.slice(s - b0, min(hi, b1) - s))
            if b1 >= hi:
                break
            cur[3], cur[4] = next(cur[2]), b1
        self._cursor = cur
        return out

    def batch(self, u: int, columns: list[str]):
        """Record batch u of an Arrow IPC file, columns subset. Kept while the kept ones hold at
        most KEEP_BYTES: reading a batch's metadata costs about 0.1 ms, and a compressed file's
        batch is decompressed each time it is read. (Past that bound none is dropped for another:
        a packed batch takes its rows in file order, which would drop each before its next use.)"""
        key = (u, tuple(columns))
        got = self._batches.get(key)
        if got is None:
            got = self.reader.get_batch(u).select(columns)
            if self._kept + got.nbytes <= KEEP_BYTES:
                self._batches[key] = got
                self._kept += got.nbytes
        return got

    def close(self):
        self._cursor = self._whole = None
        self._batches, self._kept = {}, 0
        if self.kind != "parquet":
            self.reader = None
