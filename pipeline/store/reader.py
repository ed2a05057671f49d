"""Reading a linpipe output store: `linpipe.open_output(path)` for analysts and for the CLI."""
from __future__ import annotations

import os
import warnings

from linpipe.errors import StoreError
from linpipe.store.layout import POSITION_DIM, TIME
from linpipe.store.writer import OutputStore


class IncompleteStoreWarning(UserWarning):
    """The store is readable, but some chunks were never written (their values read as NaN)."""


class OutputReader:
    """A read-only view of one job's outputs.

    .meta      the root `linpipe` attributes (model, inputs, outputs, chunk length, job id ...)
    .records   key -> {id, description, length, modality, input, n_chunks}
    .dataset(record_id_or_key) -> xarray.Dataset with named dims and coordinates
    .missing_ranges   key -> [(start, end), ...] positions not written yet (empty when complete)
    .array(record, output), .dims(record, output), .time(record, start, end), .completed_ranges(record)
        for streaming reads without xarray
    """

    def __init__(self, path):
        self._out = OutputStore.open(path, mode="r")
        self.path = self._out.path
        self.meta = self._out.meta
        self.records = self._out.records
        self.complete = self._out.is_complete()
        # a complete store has no gaps by construction: skip reading thousands of markers
        self.missing_ranges = {k: [] if self.complete else self._out.missing_ranges(k) for k in self.records}

    @property
    def store(self) -> OutputStore:
        return self._out

    def key(self, record_id_or_key: str) -> str:
        if record_id_or_key in self.records:
            return record_id_or_key
        try:
            return self._out.record_key(record_id_or_key)
        except StoreError:
            ids = ", ".join(info["id"] for info in list(self.records.values())[:5])
            raise StoreError(f"{self.path}: no record {record_id_or_key!r} (records: {ids}"
                             f"{', ...' if len(self.records) > 5 else ''})") from None

    def dataset(self, record_id_or_key: str):
        """One record's outputs, lazily (dask-free: values load when you index them)."""
        import pandas as pd
        import xarray as xr

        key = self.key(record_id_or_key)
        info = self.records[key]
        try:
            ds = xr.open_zarr(self._out.zarr_store, group=key, consolidated=None if self.complete else False,
                              zarr_format=3, chunks=None)
        except (FileNotFoundError, KeyError) as e:  # a record group deleted or damaged after the job
            raise StoreError(f"{self.path}: record {info['id']!r} cannot be read ({type(e).__name__}: {e}); "
                             "the store is damaged: run the job again with --overwrite") from None
        dim = POSITION_DIM[info["modality"]]
        if dim not in ds.coords:  # positions from 0, as a lazy range (no big int array in memory)
            ds = ds.assign_coords(xr.Coordinates({dim: pd.RangeIndex(info["length"], name=dim)}))
        ds.attrs.update({"record_id": info["id"], "description": info["description"],
                         "record_key": key, "missing_ranges": [list(r) for r in self.missing_ranges[key]]})
        return ds

    def array(self, record_id_or_key: str, output: str):
        """The raw zarr array of one output (for streaming reads without xarray)."""
        return self._out.array(self.key(record_id_or_key), output)

    def dims(self, record_id_or_key: str, output: str) -> tuple[str, ...]:
        """The named dimensions of one output, e.g. ('position',) or ('time', 'channel')."""
        return tuple(self.array(record_id_or_key, output).metadata.dimension_names)

    def completed_ranges(self, record_id_or_key: str) -> list[tuple[int, int]]:
        """[start, end) of every completed work unit, in position order."""
        key = self.key(record_id_or_key)
        done = self._out.completed_chunks(key)
        return [self._out.chunk_range(key, i) for i in range(self._out.n_chunks(key)) if i in done]

    def time(self, record_id_or_key: str, start: int, end: int):
        """The record's time stamps over [start, end) (datetime64 when the input had dates), or
        None when the record has none (its positions are plain indices)."""
        key = self.key(record_id_or_key)
        if TIME not in self._out.output_names(key):
            return None
        arr = self.array(key, TIME)
        t = arr[start:end]
        return t.astype("datetime64[ns]") if "units" in arr.attrs else t

    def summary(self) -> dict:
        """What `linpipe inspect` shows: records, completion, sizes and compression ratio."""
        raw = stored = 0
        records = []
        for key, info in self.records.items():
            n = int(info["n_chunks"])
            done = n if self.complete else len(self._out.completed_chunks(key))
            frac = done / n if n else 1.0
            for name in self._out.output_names(key):
                a = self._out.array(key, name)
                raw += int(a.nbytes * frac)
                stored += a.nbytes_stored()
            records.append({"key": key, "id": info["id"], "length": info["length"],
                            "modality": info["modality"], "chunks_done": done, "chunks": n,
                            "missing_ranges": [list(r) for r in self.missing_ranges[key]]})
        m = self.meta
        model = m.get("model") or {}
        model_sha256 = m.get("model_sha256") or (model.get("sha256") if isinstance(model, dict) else None)
        return {
            "path": self.path, "format_version": m.get("format_version"),
            "linpipe_version": m.get("linpipe_version"), "job_id": m.get("job_id"),
            "complete": self.complete, "outputs": m.get("outputs"), "chunk_size": m.get("chunk_size"),
            "model_sha256": model_sha256,
            "model": model, "inputs": m.get("inputs", []),
            "n_records": len(records), "positions": sum(r["length"] for r in records),
            "size_on_disk": self._out.size_on_disk(), "output_bytes_raw": raw,
            "output_bytes_stored": stored,
            "compression_ratio": (raw / stored) if stored else None,
            "records": records,
        }


def as_reader(store) -> OutputReader:
    """An OutputReader, given one or a store's path or URL."""
    return store if isinstance(store, OutputReader) else OutputReader(store)


def open_output(path) -> OutputReader:
    """Open an output store for reading; warns (IncompleteStoreWarning) when chunks are missing."""
    reader = OutputReader(path)
    if not reader.complete:
        missing = {k: r for k, r in reader.missing_ranges.items() if r}
        if missing:
            parts = [f"{reader.records[k]['id']}:{s}-{e}" for k, rs in missing.items() for s, e in rs[:3]]
            more = sum(len(r) for r in missing.values()) - len(parts)
            warnings.warn(f"{os.fspath(path)}: incomplete store (the job did not finish); missing "
                          f"{', '.join(parts)}{f' and {more} more ranges' if more > 0 else ''}",
                          IncompleteStoreWarning, stacklevel=3)
    return reader


__all__ = ["open_output", "as_reader", "OutputReader", "IncompleteStoreWarning"]
