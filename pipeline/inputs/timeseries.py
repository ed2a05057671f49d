"""Time series from Parquet, Arrow IPC (feather v2) and CSV, read by record batches/row groups.

A file holds one series or many (id_column groups rows into series, in order of first
appearance); time_column is kept as the coordinate; the channels are the chosen columns (default:
every numeric column but id and time). Rows of each series must be in time order: linpipe
checks it and either says where it breaks or, with sort=True, sorts a cached copy; it never
reorders silently. Nulls and NaN come out as NaN.

At open, one pass over just the id and time columns builds the index: for each series, the runs
of consecutive rows it owns (one run when the file is grouped by series, as it should be for
speed), kept in the cache for the next open of the unchanged file (linpipe.inputs.series_index).
read() then touches only the batches/row groups that hold the slice.

CSV (and Arrow stream files) cannot be read at a row offset, so they are converted once, batch
by batch, into an Arrow IPC file in the cache directory; the channels are parsed as float64 so a
column that mixes numbers and text is caught with its line. sort=True loads the whole table in
memory once to sort it (the only case that does).

A packed batch's series (read_many) are gathered with one take per table batch they touch, from
an Arrow IPC file: the input's own, its converted or sorted copy, or for Parquet a copy of the
channel and time columns made once in the cache (prepare_many, which a worker calls beside its
model's load: a batch's series, longest first, lie all over the file, and from Parquet each
would decode another row group).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from linpipe.errors import InputError, option
from linpipe.inputs.base import Input, RecordInfo, stem
from linpipe.inputs.cache import cache_root, file_mode, made_once
from linpipe.inputs.csvfile import CsvFile, first_line
from linpipe.inputs.series_index import load_or_build
from linpipe.inputs.tables import BATCH_ROWS, Table

# Rows per batch of read_many's Arrow copy of a Parquet file: a packed batch takes rows once from
# each batch it touches (about 15 us each), and the copy holds one batch in memory as it is made.
GATHER_BATCH_ROWS = 1 << 22


def _is_numeric(t) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _is_time(t) -> bool:
    import pyarrow as pa

    return (
        _is_numeric(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_date(t)
        or pa.types.is_time(t)
        or pa.types.is_duration(t)
    )


class TimeSeriesInput(Input):
    """A time-series file. read(record_id, start, end) -> (values float32 (n, C), time (n,) or None)."""

    modality = "timeseries"

    def __init__(
        self,
        path: "str | os.PathLike",
        *,
        fmt: str = "parquet",
        id_column: "str | None" = None,
        time_column: "str | None" = None,
        columns: "Sequence[str] | None" = None,
        time_format: "str | None" = None,
        sort: bool = False,
        cache_dir=None,
    ):
        super().__init__(Path(path))
        self.fmt = fmt
        self.time_format = time_format
        if time_format and fmt != "csv":
            raise InputError(f"{self.path}: {option('time_format')} applies to CSV files "
                             f"({fmt} stores its types)")
        self.id_column, self.time_column = id_column, time_column
        self.sort, self.cache_dir = sort, cache_dir
        self._columns_opt = list(columns) if columns else None
        self._table = None
        self._gather = None  # read_many's Arrow IPC table (_gather_table)
        try:
            self._open(columns)
        except InputError:
            raise
        except Exception as e:  # pyarrow's own errors on a corrupt or unreadable file
            raise InputError(f"{self.path}: cannot read as {fmt}: {first_line(e)}") from None

    def _open(self, columns) -> None:
        self.table_path, self._kind = self._table_file(columns)
        table = Table(self.table_path, self._kind)
        self.column_names = list(table.schema.names)  # every column of the file, in order
        self.channel_names = self._resolve_columns(table.schema, columns)
        # columns left out of the default channels (text, dates): each front end says so
        reserved = {self.id_column, self.time_column, *self.channel_names}
        self.skipped_columns = [] if columns else [(f.name, str(f.type)) for f in table.schema
                                                   if f.name not in reserved]
        if table.num_rows == 0:
            raise InputError(f"{self.path}: no rows: a zero-length series")
        self._table = table
        self.index_column = self._index_like_first_column()
        order_error = self._build_index()
        if order_error is not None:
            if not self.sort:
                raise InputError(
                    order_error + f"; sort the file by time, or pass {option('sort')} to sort a cached copy"
                )
            self.table_path = self._sorted_copy()
            self._table = Table(self.table_path, "arrow")
            self._kind = "arrow"
            order_error = self._build_index()
            assert order_error is None, order_error

    # -- the table file linpipe reads rows from
    def _cache_file(self, tag: str, columns) -> Path:
        # keyed by content: an edited file never reads an older conversion, whatever its mtime
        key = (
            f"{self.file_state().sha256}\0{tag}\0"
            f"{self.id_column}\0{self.time_column}\0{columns}"
            + (f"\0{self.time_format}" if self.time_format else "")
        )
        digest = hashlib.sha256(key.encode()).hexdigest()[:24]
        return cache_root(self.cache_dir) / "tables" / f"{stem(self.path)}-{digest}.arrow"

    def _table_file(self, columns) -> tuple[Path, str]:
        if self.fmt == "parquet":
            return self.path, "parquet"
        if self.fmt == "arrow":
            return self.path, "arrow"
        target = self._cache_file(self.fmt, columns)
        if not target.exists():
            if self.fmt == "csv":
                self._convert_csv(target, columns)
            else:
                self._convert_stream(target)
        return target, "arrow"

    def _write_atomic(self, target: Path, schema, batches) -> None:
        import pyarrow as pa

        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".arrow")
        os.fchmod(fd, file_mode())
        os.close(fd)
        try:
            with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
                for b in batches:
                    writer.write_batch(b)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _convert_stream(self, target: Path) -> None:
        import pyarrow as pa

        with pa.memory_map(str(self.path), "r") as src:
            reader = pa.ipc.open_stream(src)
            self._write_atomic(target, reader.schema, reader)

    def _convert_csv(self, target: Path, columns) -> None:
        import pyarrow as pa

        csv = CsvFile(self.path, self.time_format)
        schema = csv.schema()
        # channels parse as float64 whatever the first CSV block looked like: numbers that turn
        # into text later (mixed dtypes) then fail with the column named
        chosen = self._resolve_columns(schema, columns, check_types=False)
        types = {c: pa.float64() for c in chosen if _is_numeric(schema.field(c).type)}
        if self.id_column:
            types[self.id_column] = pa.string()
        if self.time_format and self.time_column:  # the user's format, or an error naming the line
            types[self.time_column] = pa.timestamp("s")
        mixed_check = [  # text columns left out of the default channels
            f.name
            for f in schema
            if f.type == pa.string() and f.name not in types and f.name != self.time_column
            and (columns is None or f.name in columns)
        ]
        csv.convert(types, mixed_check, lambda schema, batches: self._write_atomic(target, schema, batches))

    def _sorted_copy(self) -> Path:
        import pyarrow as pa

        target = self._cache_file(f"sorted:{self.fmt}", self.channel_names)
        if not target.exists():
            table = (
                pa.concat_tables(
                    [
                        pa.Table.from_batches([b])
                        for b in self._table.rows(0, self._table.num_rows, self._table.schema.names)
                    ]
                )
                if self._table.num_rows
                else None
            )
            keys = []
            if self.id_column:
                table = table.append_column("__order", pa.array(self._order_of_ids(table)))
                keys.append(("__order", "ascending"))
            keys.append((self.time_column, "ascending"))
            idx = _stable_sort_indices(table, keys)
            table = table.take(idx)
            if self.id_column:
                table = table.drop_columns(["__order"])
            self._write_atomic(target, table.schema, table.to_batches(max_chunksize=BATCH_ROWS))
        return target

    def _order_of_ids(self, table) -> np.ndarray:
        order = {r.id: i for i, r in enumerate(self.records)}
        ids = table.column(self.id_column).cast("string").to_pylist()
        return np.array([order[i] for i in ids], dtype=np.int64)

    # -- columns
    def _resolve_columns(self, schema, columns, check_types: bool = True) -> list[str]:
        import pyarrow as pa

        names = schema.names
        for what, col in ((option("id_column"), self.id_column), (option("time_column"), self.time_column)):
            if col is not None and col not in names:
                raise InputError(f"{self.path}: {what} {col!r}: no such column (columns: {', '.join(names)})")
        if self.time_column is not None and check_types:
            t = schema.field(self.time_column).type
            if not _is_time(t):
                hint = ""
                if self.fmt == "csv":
                    hint = (f"; give their format with {option('time_format')}, e.g. {option('time_format')} "
                            "'%d/%m/%Y %H:%M' (strptime codes)")
                raise InputError(
                    f"{self.path}: time column {self.time_column!r} holds {t}, "
                    f"not numbers, dates or timestamps linpipe reads{hint}"
                )
        reserved = {self.id_column, self.time_column}
        if columns:
            for c in columns:
                if c not in names:
                    raise InputError(
                        f"{self.path}: column {c!r} ({option('columns')}): no such column "
                        f"(columns: {', '.join(names)})"
                    )
                if c in reserved:
                    raise InputError(
                        f"{self.path}: column {c!r} is the id or time column; it cannot also be a channel"
                    )
            if check_types:
                for c in columns:
                    t = schema.field(c).type
                    if pa.types.is_union(t):
                        raise InputError(
                            f"{self.path}: column {c!r} mixes dtypes ({t}); channels must be numeric"
                        )
                    if not _is_numeric(t):
                        raise InputError(
                            f"{self.path}: column {c!r} is {t}, not numeric; channels must be numeric"
                        )
            return list(columns)
        chosen = [f.name for f in schema if f.name not in reserved and _is_numeric(f.type)]
        if check_types:
            for f in schema:
                if f.name not in reserved and pa.types.is_union(f.type):
                    raise InputError(
                        f"{self.path}: column {f.name!r} mixes dtypes ({f.type}); "
                        f"choose channels with {option('columns')}"
                    )
        if not chosen:
            if self.fmt == "csv":  # a column of numbers with some text in it: name where
                CsvFile(self.path, self.time_format).raise_text_among_numbers(
                    [f.name for f in schema if f.name not in reserved and f.type == pa.string()])
            other = ", ".join(f"{f.name} ({f.type})" for f in schema if f.name not in reserved) or "none"
            raise InputError(f"{self.path}: no numeric column to use as a channel (other columns: {other})")
        return chosen

    def _index_like_first_column(self) -> "str | None":
        """The file's first column when it is read as a channel but looks like a sample index
        (whole numbers rising by exactly 1 over the first rows): likely meant as --time-column."""
        if self.time_column or not self.channel_names or self.channel_names[0] != self.column_names[0]:
            return None
        col = self.column_names[0]
        n = min(self._table.num_rows, 4096)
        if n < 3:
            return None
        v = np.concatenate([b.column(0).to_numpy(zero_copy_only=False).astype(np.float64)
                            for b in self._table.rows(0, n, [col])])
        if np.isfinite(v).all() and (v == np.round(v)).all() and (np.diff(v) == 1).all():
            return col
        return None

    # -- index: runs of rows per series, and the time-order check (linpipe.inputs.series_index)
    def _build_index(self) -> "str | None":
        """Fill records and runs; return a message if some series is out of time order."""
        names, self._runs, problem = load_or_build(self._table, self.path, self.id_column, self.time_column,
                                                   stem(self.path), self.cache_dir,
                                                   written_once=self.table_path != self.path)
        self._set_records([RecordInfo(str(n), "", length)
                           for n, length in zip(names, self._runs.lengths.tolist(), strict=True)])
        if problem is not None:
            s, row, before, after = problem
            return (
                f"{self.path}: series {names[s]!r}: row {row} has time {after} after {before}: "
                f"rows are not in time order (column {self.time_column!r})"
            )
        return None

    # -- reading
    def _read_columns(self) -> list[str]:
        """The columns a read takes: the channels, then the time column if any."""
        return list(self.channel_names) + ([self.time_column] if self.time_column else [])

    def read(self, record_id: str, start: int = 0, end: "int | None" = None):
        """Channels as float32 (n, C) (nulls -> NaN) and the time coordinate (n,) or None."""

        rec, start, end = self._check_range(record_id, start, end)
        n = end - start
        values = np.empty((n, len(self.channel_names)), dtype=np.float32)
        times = [] if self.time_column else None
        if n == 0:
            return values, (np.zeros(0) if times is not None else None)
        try:
            return self._read(record_id, start, end, n, values, times)
        except InputError:
            raise
        except Exception as e:  # pyarrow's errors on a file damaged since it was opened
            raise InputError(
                f"{self.path}: series {record_id!r}, rows {start}-{end}: cannot read: {first_line(e)}"
            ) from None

    def _read(self, record_id, start, end, n, values, times):
        import pyarrow as pa
        import pyarrow.compute as pc

        run_starts, run_pos = self._runs[self._by_id[record_id]]
        table = self._tab()
        cols = self._read_columns()
        r0 = int(np.searchsorted(run_pos, start, side="right")) - 1
        r1 = int(np.searchsorted(run_pos, end, side="left"))  # runs r0..r1-1 overlap the slice
        lo = np.maximum(run_pos[r0:r1], start) - run_pos[r0:r1]
        hi = np.minimum(run_pos[r0 + 1 : r1 + 1], end) - run_pos[r0:r1]
        g_lo = run_starts[r0:r1] + lo
        if r1 - r0 == 1:  # the series is contiguous here: plain row slices
            batches = table.rows(int(g_lo[0]), int(g_lo[0] + hi[0] - lo[0]), cols)
        else:  # interleaved series: read the span once and pick this series' rows
            lens = hi - lo
            rows = np.repeat(g_lo - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens) + np.arange(n)
            span = pa.Table.from_batches(table.rows(int(rows[0]), int(rows[-1]) + 1, cols))
            batches = span.take(pa.array(rows - rows[0])).to_batches()
        filled = 0
        for batch in batches:
            m = batch.num_rows
            for j, c in enumerate(self.channel_names):
                col = pc.cast(batch.column(c), pa.float32(), safe=False)
                values[filled : filled + m, j] = col.to_numpy(zero_copy_only=False)
            if times is not None:
                times.append(batch.column(self.time_column).to_numpy(zero_copy_only=False))
            filled += m
        return values, (np.concatenate(times) if times is not None else None)

    def read_many(self, requests) -> list[tuple]:
        """read() of each (record_id, start, end) (a packed batch's series), in the order given,
        with the same values bit for bit. Series on one run of rows are gathered: one take per
        table batch they touch, then one cast per channel. Interleaved series (several runs) go
        through read(); so does the whole batch when the gather fails, for read()'s error."""
        import pyarrow as pa

        requests = list(requests)
        got: list = [None] * len(requests)
        gather, starts, sizes = [], [], []
        for i, (rid, start, end) in enumerate(requests):
            _, start, end = self._check_range(rid, start, end)
            first = self._runs.single_start(self._by_id[rid])
            if first is not None and end > start:
                gather.append(i)
                starts.append(first + start)
                sizes.append(end - start)
            else:  # interleaved, or empty: as read() gives it
                got[i] = self.read(rid, start, end)
        if len(gather) < 2:
            for i in gather:
                got[i] = self.read(*requests[i])
            return got
        try:
            values, times = self._gathered(np.asarray(starts, np.int64), np.asarray(sizes, np.int64))
        except (pa.ArrowException, OSError):  # damaged since it was opened: read() names the series
            return super().read_many(requests)
        ends = np.cumsum(sizes).tolist()
        for i, a, b in zip(gather, [0, *ends[:-1]], ends, strict=True):
            got[i] = (values[a:b], None if times is None else times[a:b])
        return got

    def prepare_many(self) -> None:
        """The table read_many takes rows from, made now (a Parquet file's copy: seconds for a
        large file). If that fails, read_many reads one by one and read() names the problem."""
        import pyarrow as pa

        try:
            self._gather_table()
        except (pa.ArrowException, OSError):
            pass

    def _gathered(self, starts: np.ndarray, sizes: np.ndarray) -> tuple:
        """Rows starts[k]..starts[k]+sizes[k]-1 of every k, back to back: channels as float32
        (n, C), and the time column (n,) or None."""
        import pyarrow as pa
        import pyarrow.compute as pc

        table = self._gather_table()
        n = int(sizes.sum())
        rows = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes) + np.arange(n)  # (n,) global rows
        order = np.argsort(rows, kind="stable")  # file order: each table batch once
        unit = np.searchsorted(table.unit_starts, rows[order], side="right") - 1
        cuts = np.flatnonzero(np.diff(unit)) + 1
        cols = self._read_columns()
        values = np.empty((n, len(self.channel_names)), dtype=np.float32)
        time_parts = []
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), n], strict=True):
            u, at = int(unit[a]), order[a:b]
            taken = table.batch(u, cols).take(pa.array(rows[at] - table.unit_starts[u]))
            for j, c in enumerate(self.channel_names):  # the cast read() makes, on the rows taken
                col = pc.cast(taken.column(c), pa.float32(), safe=False)
                values[at, j] = col.to_numpy(zero_copy_only=False)
            if self.time_column:
                time_parts.append(taken.column(self.time_column).to_numpy(zero_copy_only=False))
        if not time_parts:
            return values, None
        in_file_order = np.concatenate(time_parts)
        times = np.empty_like(in_file_order)
        times[order] = in_file_order
        return values, times

    def _gather_table(self) -> Table:
        """The Arrow IPC table read_many takes rows from: the one read() uses, or for Parquet an
        Arrow copy of the channel and time columns (every row, in order), made once in the cache
        (keyed by the file's content) and memory-mapped."""
        if self._gather is None:
            table = self._tab()
            if self._kind == "parquet":
                cols = self._read_columns()
                target = self._cache_file("rows", cols)
                if not target.exists():
                    with made_once(target):  # a machine's other workers wait for it, then read it
                        if not target.exists():
                            rows = table.pf.iter_batches(batch_size=GATHER_BATCH_ROWS, columns=cols)
                            self._write_atomic(target, _columns_schema(table.schema, cols), rows)
                table = Table(target, "arrow")
            self._gather = table
        return self._gather

    def _tab(self) -> Table:
        if self._table is None:
            if not self.table_path.exists():  # unpickled on a node without our cached copy
                fresh = TimeSeriesInput(
                    self.path,
                    fmt=self.fmt,
                    id_column=self.id_column,
                    time_column=self.time_column,
                    columns=self._columns_opt,
                    time_format=self.time_format,
                    sort=self.sort,
                    cache_dir=self.cache_dir,
                )
                if fresh.records != self.records:
                    raise InputError(f"{self.path}: the file changed since it was opened (its series differ)")
                self.table_path = fresh.table_path
                fresh.close()
            self._table = Table(self.table_path, self._kind)
        return self._table

    def _index_text(self) -> str:
        opts = (
            f"id={self.id_column}\ttime={self.time_column}\t"
            f"channels={','.join(self.channel_names)}\tsort={self.sort}"
        )
        return opts + "\n" + super()._index_text()

    def close(self) -> None:
        for name in ("_table", "_gather"):
            if getattr(self, name, None) is not None:
                getattr(self, name).close()
                setattr(self, name, None)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_table"] = state["_gather"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)


def _columns_schema(schema, columns: list[str]):
    """The schema of `columns` of schema, in that order."""
    import pyarrow as pa

    return pa.schema([schema.field(c) for c in columns])


def _stable_sort_indices(table, keys) -> np.ndarray:
    import pyarrow.compute as pc

    # pyarrow's sort_indices is stable
    return pc.sort_indices(table, sort_keys=keys).to_numpy()
