"""A time-series file's index: which rows each series owns, and whether its times rise.

One pass over the id and time columns (linpipe.inputs.timeseries builds it at every open) finds
the runs of consecutive rows with one id. A file grouped by series has one run per series; a
file whose series interleave has several. The work per record batch is a few numpy calls over
the batch, not a step per series: a file of 100,000 short series has as many runs.
"""

from __future__ import annotations

import numpy as np

from linpipe.errors import InputError


class SeriesRuns:
    """Every series' runs of rows, flat: series s owns `lens[k]` rows from row `starts[k]` for
    k in offsets[s] .. offsets[s + 1] - 1, in file order."""

    def __init__(self, starts: np.ndarray, lens: np.ndarray, offsets: np.ndarray):
        self.starts, self.lens, self.offsets = starts, lens, offsets
        self.lengths = np.add.reduceat(lens, offsets[:-1]) if len(lens) else np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """Series s's runs: their first rows, and the series' position at each run's start
        (one more entry: the series' length last)."""
        a, b = self.offsets[s], self.offsets[s + 1]
        return self.starts[a:b], np.concatenate([[0], np.cumsum(self.lens[a:b])])

    def single_start(self, s: int) -> "int | None":
        """The first row of series s when it is one run of rows, else None."""
        a = self.offsets[s]
        return int(self.starts[a]) if self.offsets[s + 1] - a == 1 else None


class _TimeOrder:
    """The first row, in file order, whose time is below the time before it in its own series;
    fed one record batch at a time (each series' last time carried between batches)."""

    def __init__(self):
        self.last = None  # series -> its last time so far (the times' dtype)
        self.seen = np.zeros(0, bool)  # series -> whether it has a last time
        self.problem = None  # (series, row, time before, time at row)

    def feed(self, g0: int, times: np.ndarray, bounds: np.ndarray, series: np.ndarray) -> None:
        """times: the batch's (first row g0); its runs are bounds[k]..bounds[k+1] of series[k]."""
        n_series = int(series.max()) + 1
        if self.last is None:
            self.last = np.empty(0, times.dtype)
        if n_series > len(self.seen):  # room for the new series (doubling: batches add a few each)
            grow = max(n_series, 2 * len(self.seen)) - len(self.seen)
            self.last = np.concatenate([self.last, np.empty(grow, self.last.dtype)])
            self.seen = np.concatenate([self.seen, np.zeros(grow, bool)])
        firsts, lasts = times[bounds[:-1]], times[bounds[1:] - 1]
        by = np.lexsort((np.arange(len(series)), series))  # the runs grouped by series, in order
        s_by = series[by]
        same = np.concatenate([[False], s_by[1:] == s_by[:-1]])  # a run of the series before it
        if self.problem is None:
            found = []
            # inside a run: a row whose time is below the row before it, both of the run
            down = np.flatnonzero(times[1:] < times[:-1]) + 1
            if down.size:
                down = down[~np.isin(down, bounds[1:-1])]
            if down.size:
                i = int(down[0])
                k = int(np.searchsorted(bounds, i, side="right")) - 1
                found.append((g0 + i, int(series[k]), times[i - 1], times[i]))
            # a run's first time against the time before it in its series (the end of an earlier
            # run of this batch, or of an earlier batch)
            prev = np.where(same, lasts[np.roll(by, 1)], self.last[s_by])
            bad = np.flatnonzero((same | self.seen[s_by]) & (firsts[by] < prev))
            if bad.size:
                j = bad[np.argmin(by[bad])]  # the earliest such run in the file
                k = int(by[j])
                found.append((g0 + int(bounds[k]), int(series[k]), prev[j], firsts[k]))
            if found:
                row, s, before, after = min(found, key=lambda f: f[0])
                self.problem = (s, row, before, after)
        ends = np.concatenate([~same[1:], [True]])  # each series' last run in this batch
        self.last[s_by[ends]] = lasts[by[ends]]
        self.seen[series] = True


def build_index(table, path, id_column: "str | None", time_column: "str | None", name: str):
    """(series names in order of first appearance, SeriesRuns, the first time-order problem as
    (series, row, time before, time at row) or None) of an open linpipe.inputs.tables.Table."""
    import pyarrow.compute as pc

    if not id_column:
        runs = SeriesRuns(np.zeros(1, np.int64), np.array([table.num_rows], np.int64), np.array([0, 1]))
        names = [name]
    order: dict[str, int] = {}
    starts, lens, owners = [], [], []
    check = _TimeOrder() if time_column else None
    cols = [c for c in (id_column, time_column) if c]
    for g0, batch in table.iter_units(cols) if cols else ():
        n = batch.num_rows
        if n == 0:
            continue
        if id_column:
            ids = batch.column(id_column)
            if ids.null_count:
                row = g0 + int(np.argmax(ids.is_null().to_numpy(zero_copy_only=False)))
                raise InputError(f"{path}: id column {id_column!r}: empty id at row {row}")
            ids = ids.cast("string") if not ids.type == "string" else ids
            change = np.flatnonzero(
                pc.not_equal(ids.slice(1), ids.slice(0, n - 1)).to_numpy(zero_copy_only=False)) + 1
            bounds = np.concatenate([[0], change, [n]])
            series = np.fromiter((order.setdefault(r, len(order)) for r in ids.take(bounds[:-1]).to_pylist()),
                                 np.int64, len(bounds) - 1)
            starts.append(g0 + bounds[:-1])
            lens.append(np.diff(bounds))
            owners.append(series)
        else:
            bounds, series = np.array([0, n]), np.zeros(1, np.int64)
        if check is not None:
            col = batch.column(time_column)
            if col.null_count:
                row = g0 + int(np.argmax(col.is_null().to_numpy(zero_copy_only=False)))
                raise InputError(f"{path}: time column {time_column!r}: empty time at row {row}")
            times = col.to_numpy(zero_copy_only=False)
            if times.dtype.kind == "f" and np.isnan(times).any():
                row = g0 + int(np.argmax(np.isnan(times)))
                raise InputError(f"{path}: time column {time_column!r}: NaN time at row {row}")
            check.feed(g0, times, bounds, series)
    if id_column:
        runs = _grouped(np.concatenate(starts), np.concatenate(lens), np.concatenate(owners), len(order))
        names = list(order)
    return names, runs, (check.problem if check is not None else None)


def _grouped(starts: np.ndarray, lens: np.ndarray, series: np.ndarray, n_series: int) -> SeriesRuns:
    """The runs of every batch (in file order) as SeriesRuns: a run that goes on across a batch
    boundary is joined into one first (the rows on both sides of the boundary share an id)."""
    first = np.concatenate([[True], series[1:] != series[:-1]])
    at = np.flatnonzero(first)
    starts, lens, series = starts[at], np.add.reduceat(lens, at), series[at]
    by = np.argsort(series, kind="stable")
    offsets = np.concatenate([[0], np.cumsum(np.bincount(series, minlength=n_series))])
    return SeriesRuns(starts[by].astype(np.int64), lens[by].astype(np.int64), offsets.astype(np.int64))
