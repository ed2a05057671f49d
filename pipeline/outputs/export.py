"""Exports of a store's outputs: bigWig / bedGraph tracks for genome browsers, Parquet tables.

Everything streams one work unit at a time, so memory stays flat on whole genomes.
Units the job never completed are skipped (not exported as zeros or NaN).
"""
from __future__ import annotations

import contextlib
import itertools
import os
import uuid
from pathlib import Path

import numpy as np

from linpipe.errors import StoreError, option
from linpipe.output_specs import BASES, DNA
from linpipe.places import check_apart
from linpipe.store.layout import DIM_BASE, DIM_CHANNEL, POSITION_DIM, TIME
from linpipe.store.reader import OutputReader, as_reader

TRACK_FORMATS = ("bigwig", "bedgraph")


@contextlib.contextmanager
def replaced_when_done(dest):
    """A path beside `dest` to write to; it becomes `dest` only if the block ends without error.

    An export that fails half way (a damaged unit, a full disk) leaves no file that looks
    complete, and an older file at `dest` as it was."""
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.partial")
    try:
        yield os.fspath(tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _select(reader: OutputReader, records) -> list[str] | None:
    """Record ids to export, in the order asked (None: every record, in store order)."""
    if not records:
        return None
    return [reader.record(r).id for r in records]


def _infos(reader: OutputReader, ids):
    return (reader.record(r) for r in ids) if ids is not None else reader.records.values()


def _by_record(units):
    """Group (info, start, values) of units into (info, [(start, values), ...]) per record."""
    for _rid, group in itertools.groupby(units, key=lambda b: b[0].id):
        group = list(group)
        yield group[0][0], [(s, v) for _i, s, v in group]


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


def _merge_runs(runs):
    """Join runs that continue across unit boundaries (equal value, adjacent positions)."""
    carry = None
    for s, e, v in runs:
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


def _check_track(reader: OutputReader, ids, output: str, base: str | None):
    """Tracks take dna outputs of one value per base, or one base's channel of an output over
    the bases (the modality and dims are store-wide). Returns that channel's index, or None."""
    if base is not None and base not in BASES:
        raise StoreError(f"{option('base')} {base!r}: one of {', '.join(BASES)}")
    first = next((i for i in _infos(reader, ids)), None)
    if first is None:
        return None
    if first.modality != DNA:
        raise StoreError(f"{reader.path}: record {first.id!r} is a time series; genome tracks "
                         f"need dna outputs (use {option('format')} parquet)")
    dims = reader.dims(first.id, output)
    if dims[1:] == (DIM_BASE,) and base is not None:
        return BASES.index(base)
    if len(dims) != 1:
        bases = f"{', '.join(BASES[:-1])} or {BASES[-1]}"
        fix = f"{option('base')} {bases} for one base's track, or " if dims[1] == DIM_BASE else ""
        raise StoreError(f"{reader.path}: output {output!r} has a {dims[1]} axis; tracks take one value "
                         f"per base (logprob, entropy, softmask): name {fix}{option('format')} parquet "
                         f"(a column per {dims[1]})")
    if base is not None:
        raise StoreError(f"{option('base')} {base}: output {output!r} has one value per position, no base "
                         "axis to choose from (leave it out)")
    return None


def export_track(store, output: str, dest, *, fmt: str = "bigwig", records=None,
                 base: str | None = None) -> int:
    """Write one per-base output as a bigWig or bedGraph track; returns the number of intervals.
    `base` (A, C, G or T): an output over the bases (logprob_acgt) as that base's channel.

    Chromosome names are the original record ids and their sizes the record lengths; positions
    with NaN (e.g. logprob at N bases) and units never completed are left out of the track.
    Both formats hold the same intervals: runs of equal adjacent values merged into one (also
    across unit boundaries). bigWig needs no extra package (linpipe.outputs.bigwig).
    """
    if fmt not in TRACK_FORMATS:
        raise StoreError(f"unknown track format {fmt!r} (one of {', '.join(TRACK_FORMATS)})")
    reader = as_reader(store)
    check_apart(dest, [("store", reader.path)])
    ids = _select(reader, records)
    channel = _check_track(reader, ids, output, base)
    dest = os.fspath(dest)
    n = 0
    units = ((i, s, v if channel is None else v[:, channel]) for i, s, v in reader.units(output, ids)
             if i.length > 0)
    if fmt == "bedgraph":
        with replaced_when_done(dest) as tmp, open(tmp, "w") as f:
            f.write(f'track type=bedGraph name="{output if base is None else f"{output}_{base}"}"\n')
            for info, got in _by_record(units):
                chrom = info.id
                for s, e, v in _merge_runs(value_runs(vals, start) for start, vals in got):
                    lines = [f"{chrom}\t{a}\t{b}\t{c:.9g}\n"
                             for a, b, c in zip(s.tolist(), e.tolist(), v.tolist(), strict=True)]
                    f.writelines(lines)
                    n += len(lines)
        return n

    from linpipe.outputs.bigwig import write_bigwig

    chroms = [(i.id, i.length) for i in _infos(reader, ids) if i.length > 0]

    def runs():  # every record's merged runs, in store order (each packed batch read once)
        for info, got in _by_record(units):
            for s, e, v in _merge_runs(value_runs(vals, start) for start, vals in got):
                yield info.id, s, e, v

    try:
        with replaced_when_done(dest) as tmp:
            return write_bigwig(tmp, chroms, runs())
    except OSError as e:
        raise StoreError(f"{dest}: cannot write the bigWig file: {e.strerror or e}") from None
    except ValueError as e:
        raise StoreError(f"{dest}: {e}") from None


def export_parquet(store, output, dest, *, records=None) -> int:
    """Write outputs as a long table: record, position/time, one column per channel/feature.

    `output` is one name or a list. Returns the number of rows written.
    """
    reader = as_reader(store)
    check_apart(dest, [("store", reader.path)])
    ids = _select(reader, records)
    names = [output] if isinstance(output, str) else list(output)
    channels = reader.meta.get("channels") or []
    first = next((i for i in _infos(reader, ids)), None)
    labels = {}
    if first is not None:
        for name in names:
            dims = reader.dims(first.id, name)
            labels[name] = dims[1] if len(dims) > 1 else None
    has_time = first is not None and reader.time(first.id, 0, 0) is not None
    with replaced_when_done(dest) as tmp:
        return _write_parquet(reader, ids, names, labels, channels, has_time, tmp)


def _write_parquet(reader, ids, names, labels, channels, has_time, dest) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    rows = 0
    try:
        for info, s, values in reader.units(names + ([TIME] if has_time else []), ids):
            e = s + len(values[names[0]])
            if e == s:
                continue
            cols = {"record": pa.array([info.id] * (e - s), pa.string())}
            # the record's own time stamps when it has them, else the position/time index
            if has_time:
                cols["time"] = pa.array(reader.decode_time(values[TIME]))
            else:
                cols[POSITION_DIM[info.modality]] = pa.array(np.arange(s, e))
            for name in names:
                v = values[name]
                if v.ndim == 1:
                    cols[name] = pa.array(v)
                else:
                    lab = (channels if labels[name] == DIM_CHANNEL else BASES if labels[name] == DIM_BASE
                           else [str(j) for j in range(v.shape[1])])
                    for j, c in enumerate(lab):
                        cols[f"{name}_{c}"] = pa.array(np.ascontiguousarray(v[:, j]))
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
        raise StoreError(f"{reader.path}: nothing to export (no completed units in the chosen records)")
    return rows
