"""A time-series file's index: which rows each series owns, and whether its times rise.

One pass over the id and time columns finds the runs of consecutive rows with one id. A file
grouped by series has one run per series; a file whose series interleave has several. The work
per record batch is a few numpy calls over the batch, not a step per series: a file of 100,000
short series has as many runs.

The pass reads every row's id (about 1 s per 34M rows), and a job opens its inputs in the driver
and in every worker, so an index is kept in the cache folder (`tables/NAME-KEY.index.npz`, plain
arrays, read without pickle) keyed by the file read's path and its size, mtime, ctime, inode and
device, as the hash cache keys a file's sha256 (linpipe.inputs.cache): any write to the file
changes its ctime. An index of a file changed within RACY_NS of its build is not kept (but for
linpipe's own conversions, written once), nor one that found rows out of time order (that error
is raised by a pass, each time).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from linpipe.errors import InputError
from linpipe.inputs.cache import RACY_NS, cache_root, file_mode, stat_key

INDEX_VERSION = 1  # of the kept index's arrays


class SeriesRuns:
    """Every series' runs of rows, flat: series s owns `lens[k]` rows from row `starts[k]` for
    k in offsets[s] .. offsets[s + 1] - 1, in file order."""

    def __init__(self, starts: np.ndarray, lens: np.ndarray, offsets: np.ndarray):
        self.starts, self.lens, self.offsets = starts, lens, offsets
        self.lengths = np.add.reduceat(lens, offsets[:-1]) if len(lens) else np.zeros(0, np.int64)

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

    order: dict[str, int] = {}  # id -> series number, in order of first appearance
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
    else:  # one series: every row
        runs = SeriesRuns(np.zeros(1, np.int64), np.array([table.num_rows], np.int64), np.array([0, 1]))
        names = [name]
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


def load_or_build(table, path, id_column: "str | None", time_column: "str | None", name: str,
                  cache_dir=None, written_once: bool = False):
    """build_index's result, from the kept index of table's file when there is one for the
    file as it is now (else built, and kept where the cache folder is writable).
    written_once: table's file is linpipe's own (a conversion or sorted copy, renamed into
    place whole and never written again), so its index is kept even when it is new."""
    if not (id_column or time_column):  # one series, no time to check: nothing to read
        return build_index(table, path, id_column, time_column, name)
    st = os.stat(table.path)
    target = _kept_path(Path(table.path), st, id_column, time_column, cache_dir)
    kept = _load(target, table.num_rows)
    if kept is not None:
        names, runs = kept
        return (names if id_column else [name]), runs, None  # one series: named by its input
    started = time.time_ns()
    names, runs, problem = build_index(table, path, id_column, time_column, name)
    settled = written_once or max(st.st_ctime_ns, st.st_mtime_ns) < started - RACY_NS
    if problem is None and settled and stat_key(os.stat(table.path)) == stat_key(st):
        try:
            _save(target, names, runs)
        except OSError:
            pass  # a read-only cache: the next open builds it again
    return names, runs, problem


def _kept_path(file: Path, st, id_column, time_column, cache_dir) -> Path:
    file = file.resolve()  # a link to the file reads the file's index
    key = json.dumps([INDEX_VERSION, str(file), stat_key(st), id_column, time_column])
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return cache_root(cache_dir) / "tables" / f"{file.name}-{digest}.index.npz"


def _save(target: Path, names: list[str], runs: SeriesRuns) -> None:
    encoded = [n.encode() for n in names]
    name_ends = np.cumsum([len(b) for b in encoded], dtype=np.int64)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".npz")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            np.savez(f, starts=runs.starts, lens=runs.lens, offsets=runs.offsets, name_ends=name_ends,
                     name_bytes=np.frombuffer(b"".join(encoded), np.uint8))
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load(target: Path, num_rows: int) -> "tuple[list[str], SeriesRuns] | None":
    """The kept index at target, or None when there is none or it does not fit the file."""
    try:
        with np.load(target, allow_pickle=False) as z:
            starts, lens, offsets = z["starts"], z["lens"], z["offsets"]
            name_ends, blob = z["name_ends"], z["name_bytes"].tobytes()
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # none, or not whole
        return None
    n = len(offsets) - 1
    if not (n >= 1 and len(name_ends) == n and offsets[0] == 0 and offsets[-1] == len(starts) == len(lens)
            and (np.diff(offsets) >= 1).all() and int(lens.sum()) == num_rows and name_ends[-1] == len(blob)):
        return None
    bounds = [0, *name_ends.tolist()]
    try:
        names = [blob[a:b].decode() for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    except UnicodeDecodeError:
        return None
    return names, SeriesRuns(starts, lens, offsets)
