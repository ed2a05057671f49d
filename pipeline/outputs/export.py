"""Exports of a store's outputs: bigWig / bedGraph tracks for genome browsers, Parquet tables.

Everything streams one work-unit chunk at a time, so memory stays flat on whole genomes.
Chunks the job never completed are skipped (not exported as zeros or NaN).
"""
from __future__ import annotations

import os

import numpy as np

from linpipe.errors import StoreError
from linpipe.model.outputs import DNA
from linpipe.store.layout import DIM_CHANNEL, POSITION_DIM
from linpipe.store.reader import OutputReader, as_reader

TRACK_FORMATS = ("bigwig", "bedgraph")


def _select(reader: OutputReader, records) -> list[str]:
    if not records:
        return list(reader.records)
    return [reader.key(r) for r in records]


def _completed_blocks(reader: OutputReader, key: str, output: str):
    """Yield (start, values) for each completed chunk of one output, in position order."""
    arr = reader.array(key, output)
    for s, e in reader.completed_ranges(key):
        yield s, arr[s:e]


def value_runs(values: np.ndarray, start: int = 0):
    """Runs of equal, non-NaN values: (starts, ends, values) arrays, positions offset by start."""
    v = np.asarray(values, dtype=np.float64)  # exact for float32 and uint8 values
    n = v.size
    if n == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0)
    nan = np.isnan(v)
    # a run starts where the value changes or NaN-ness changes
    change = np.ones(n, dtype=bool)
    change[1:] = (v[1:] != v[:-1]) & ~(nan[1:] & nan[:-1])
    starts = np.flatnonzero(change)
    ends = np.append(starts[1:], n)
    keep = ~nan[starts]
    return starts[keep] + start, ends[keep] + start, v[starts[keep]]


def _merge_blocks(blocks):
    """Join runs that continue across chunk boundaries (equal value, adjacent positions)."""
    carry = None
    for s, e, v in blocks:
        if carry is not None and s.size and carry[1] == s[0] and carry[2] == v[0]:
            s = s.copy()
            s[0] = carry[0]
            carry = None
        if carry is not None:
            yield np.array([carry[0]]), np.array([carry[1]]), np.array([carry[2]])
            carry = None
        if s.size:
            carry = (int(s[-1]), int(e[-1]), float(v[-1]))
            yield s[:-1], e[:-1], v[:-1]
    if carry is not None:
        yield np.array([carry[0]]), np.array([carry[1]]), np.array([carry[2]])


def _check_track(reader: OutputReader, keys: list[str], output: str):
    for key in keys:
        info = reader.records[key]
        if info["modality"] != DNA:
            raise StoreError(f"{reader.path}: record {info['id']!r} is a time series; genome tracks "
                             "need dna outputs (use --format parquet)")
        dims = reader.dims(key, output)
        if len(dims) != 1:
            raise StoreError(f"{reader.path}: output {output!r} has a {dims[1]} "
                             "axis; tracks take one value per base (logprob, entropy, softmask)")


def _track_runs(reader, key, output):
    blocks = (value_runs(vals, s) for s, vals in _completed_blocks(reader, key, output))
    return _merge_blocks(blocks)


def export_track(store, output: str, dest, *, fmt: str = "bigwig", records=None) -> int:
    """Write one per-base output as a bigWig or bedGraph track; returns the number of intervals.

    Chromosome names are the original record ids and their sizes the record lengths; positions
    with NaN (e.g. logprob at N bases) and chunks never completed are left out of the track.
    Both formats hold the same intervals: runs of equal adjacent values merged into one (also
    across chunk boundaries). bigWig needs no extra package (linpipe.outputs.bigwig).
    """
    if fmt not in TRACK_FORMATS:
        raise StoreError(f"unknown track format {fmt!r} (one of {', '.join(TRACK_FORMATS)})")
    reader = as_reader(store)
    keys = _select(reader, records)
    _check_track(reader, keys, output)
    keys = [k for k in keys if reader.records[k]["length"] > 0]
    dest = os.fspath(dest)
    n = 0
    if fmt == "bedgraph":
        with open(dest, "w") as f:
            f.write(f'track type=bedGraph name="{output}"\n')
            for key in keys:
                chrom = reader.records[key]["id"]
                for s, e, v in _track_runs(reader, key, output):
                    lines = [f"{chrom}\t{a}\t{b}\t{c:.9g}\n"
                             for a, b, c in zip(s.tolist(), e.tolist(), v.tolist(), strict=True)]
                    f.writelines(lines)
                    n += len(lines)
        return n

    from linpipe.outputs.bigwig import write_bigwig

    by_id = {reader.records[k]["id"]: k for k in keys}
    chroms = [(reader.records[k]["id"], int(reader.records[k]["length"])) for k in keys]
    try:
        return write_bigwig(dest, chroms, lambda chrom: _track_runs(reader, by_id[chrom], output))
    except OSError as e:
        raise StoreError(f"{dest}: cannot write the bigWig file: {e.strerror or e}") from None
    except ValueError as e:
        raise StoreError(f"{dest}: {e}") from None


def export_parquet(store, output, dest, *, records=None) -> int:
    """Write outputs as a long table: record, position/time, one column per channel/feature.

    `output` is one name or a list. Returns the number of rows written.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    reader = as_reader(store)
    keys = _select(reader, records)
    names = [output] if isinstance(output, str) else list(output)
    writer = None
    rows = 0
    try:
        for key in keys:
            info = reader.records[key]
            arrays = {name: reader.array(key, name) for name in names}
            channels = reader.meta.get("channels") or []
            for s, e in reader.completed_ranges(key):
                cols = {"record": pa.array([info["id"]] * (e - s), pa.string())}
                t = reader.time(key, s, e)
                # the record's own time stamps when it has them, else the position/time index
                cols[POSITION_DIM[info["modality"]] if t is None else "time"] = \
                    pa.array(np.arange(s, e) if t is None else t)
                for name, arr in arrays.items():
                    block = arr[s:e]
                    if block.ndim == 1:
                        cols[name] = pa.array(block)
                    else:
                        labels = (channels if reader.dims(key, name)[1] == DIM_CHANNEL
                                  else [str(j) for j in range(block.shape[1])])
                        for j, lab in enumerate(labels):
                            cols[f"{name}_{lab}"] = pa.array(np.ascontiguousarray(block[:, j]))
                table = pa.table(cols)
                if writer is None:
                    writer = pq.ParquetWriter(os.fspath(dest), table.schema, compression="zstd")
                elif table.schema != writer.schema:
                    table = table.cast(writer.schema)
                writer.write_table(table)
                rows += table.num_rows
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        raise StoreError(f"{reader.path}: nothing to export (no completed chunks in the chosen records)")
    return rows
