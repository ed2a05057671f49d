"""Inputs: one random-access reader per file format (FASTA, time series), chosen by `open_input`."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from linpipe.errors import InputError, option
from linpipe.inputs.base import FileState, Input, RecordInfo, file_state, sniff_format, stem

__all__ = ["FileState", "Input", "RecordInfo", "file_state", "open_input", "stem"]


def open_input(
    path: "str | os.PathLike",
    *,
    id_column: "str | None" = None,
    time_column: "str | None" = None,
    columns: "Sequence[str] | str | None" = None,
    time_format: "str | None" = None,
    sort: bool = False,
    cache_dir: "str | os.PathLike | None" = None,
    index_in_cache: "bool | None" = None,
    descriptions: bool = True,
) -> Input:
    """Open a genome (FASTA, optionally gzip/bgzip) or a time series (Parquet, Arrow IPC, CSV).

    FASTA builds (or reuses) its .fai index: beside the file, or in the cache folder when its
    folder is read-only or with index_in_cache ($LINPIPE_INDEX_IN_CACHE=1). The time-series
    options group rows into series (id_column), keep a time coordinate (time_column), choose
    channels (columns, default: every numeric column but those two) and sort rows by time (sort).
    descriptions=False leaves FASTA records' descriptions empty instead of reading each header
    back (a read per record: seconds for a million contigs), for a reader that needs only the
    sequence, such as a job's workers. Errors raise InputError naming file, record and place.
    """
    path = Path(path)
    fmt = sniff_format(path)
    if isinstance(columns, str):
        columns = [c.strip() for c in columns.split(",") if c.strip()]
    if fmt.startswith("fasta"):
        if id_column or time_column or columns or sort or time_format:
            given = "/".join(map(option, ("id_column", "time_column", "columns", "time_format", "sort")))
            raise InputError(f"{path}: {given} apply to time series, not FASTA")
        from linpipe.inputs.fasta import FastaInput

        return FastaInput(path, fmt=fmt, cache_dir=cache_dir, index_in_cache=index_in_cache,
                          descriptions=descriptions)
    from linpipe.inputs.timeseries import TimeSeriesInput

    return TimeSeriesInput(
        path,
        fmt=fmt,
        id_column=id_column,
        time_column=time_column,
        columns=list(columns) if columns else None,
        time_format=time_format,
        sort=sort,
        cache_dir=cache_dir,
    )
