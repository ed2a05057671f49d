"""The store's codecs and durability step, measured on real model outputs (BENCHMARKS.md, "The
store's write"). Figures: size (ratio = raw / stored), write and read time per position of one
work unit through zarr (no fsync), and the whole unit write (`OutputStore.write_unit`: data,
boundary state, checksums, marker) with each fsync choice.

    python benchmarks/store_compression.py [--rounds 5] [--unit 262144]

Arrays (LINPIPE_SHARED_DATA or ../shared/data): the shipped `default` model's logprob, entropy
and float16 hidden over the first 524,288 bases of hg19 chr1 (one torch thread); the real UCSC
soft-mask of 3 Mb of it; the shipped `default-timeseries` model's forecast, residual and anomaly
over the MIT-BIH 100 ECG's MLII lead, and its int64 time stamps. Every codec is lossless (read
back and compared). The codecs linpipe writes (CODEC_CHOICE) are marked '*'.
"""
from __future__ import annotations

import argparse
import gzip
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

from linpipe.store import CODEC_CHOICE, codecs_for

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("LINPIPE_SHARED_DATA", REPO.parent / "shared" / "data"))
FLOATS = ("none", "zstd-1", "zstd-3", "blosc-lz4-5-shuffle", "blosc-lz4-5-bitshuffle",
          "blosc-lz4-5-bitshuffle+crc32c", "blosc-lz4-1-bitshuffle+crc32c", "blosc-lz4-3-bitshuffle+crc32c",
          "blosc-lz4-9-bitshuffle+crc32c", "blosc-zstd-1-shuffle", "blosc-zstd-1-bitshuffle",
          "blosc-zstd-5-shuffle", "blosc-zstd-5-bitshuffle")
BYTES = ("none", "zstd-1", "zstd-3", "zstd-9", "blosc-lz4-5-noshuffle", "blosc-zstd-5-noshuffle")
SHARD_UNITS = 16  # units per shard in the sharded row


def chr1(n: int) -> bytes:
    seq, got = [], 0
    with gzip.open(SHARED / "genomes" / "korflab_hg19_chr1_first3Mb.fa.gz", "rb") as f:
        f.readline()
        for line in f:
            seq.append(line.strip())
            got += len(seq[-1])
            if got >= n:
                break
    return b"".join(seq)[:n]


def dna_outputs(n: int) -> dict[str, np.ndarray]:
    import torch

    import linpipe
    from linpipe.inputs.alphabet import SOFTMASK_LUT, tokenize

    torch.set_num_threads(1)
    raw = np.frombuffer(chr1(3_000_000), dtype=np.uint8)
    model = linpipe.load_model("default")
    out, _ = model.forward(tokenize(raw[:n].tobytes()), model.init_state(),
                           outputs=["logprob", "entropy", "hidden"])
    return {"logprob": out["logprob"].astype(np.float32), "entropy": out["entropy"].astype(np.float32),
            "hidden": out["hidden"].astype(np.float16),
            "softmask": SOFTMASK_LUT[raw]}


def series_outputs() -> dict[str, np.ndarray]:
    import pyarrow.parquet as pq

    import linpipe

    x = pq.read_table(SHARED / "timeseries" / "mitdb_100_ecg.parquet").column("MLII_mV").to_numpy()
    x = x.astype(np.float32)[:, None]
    model = linpipe.load_model("default-timeseries")
    out, _ = model.forward(x, model.init_state(), outputs=["forecast", "residual", "anomaly"])
    t = np.datetime64("2026-01-01", "ns") + (np.arange(len(x)) * 1e9 / 360).astype("timedelta64[ns]")
    return {k: v.astype(np.float32) for k, v in out.items()} | {"time": t.view("int64")}


def _unit_rows(arr: np.ndarray, unit: int) -> np.ndarray:
    """Whole units of the array (tiled when shorter than two units)."""
    n = max(2 * unit, arr.shape[0] // unit * unit)
    return np.resize(arr, (n,) + arr.shape[1:]) if arr.shape[0] < n else arr[:n]


def measure(arr: np.ndarray, spec: str, unit: int, tmp: Path, rounds: int, shard: bool = False):
    """(ratio, write ns/position, read ns/position): units written one at a time, as workers do."""
    path = tmp / "a.zarr"
    shutil.rmtree(path, ignore_errors=True)
    kw = {"shards": (unit * SHARD_UNITS,) + arr.shape[1:]} if shard else {}
    z = zarr.create_array(store=str(path), shape=arr.shape, dtype=arr.dtype, chunks=(unit,) + arr.shape[1:],
                          compressors=codecs_for(spec), fill_value=0, **kw)
    z[:unit] = arr[:unit]  # warm-up: the codec's first call
    writes, reads = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for s in range(0, arr.shape[0], unit):
            z[s:s + unit] = arr[s:s + unit]
        writes.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        back = z[:]
        reads.append(time.perf_counter() - t0)
    assert np.array_equal(back, arr, equal_nan=arr.dtype.kind == "f")
    n = arr.shape[0]
    ratio = arr.nbytes / z.nbytes_stored()
    return ratio, statistics.median(writes) / n * 1e9, statistics.median(reads) / n * 1e9


def codec_table(arrays: dict, unit: int, tmp: Path, rounds: int):
    print("| array | dtype, values/position | codec | ratio | write ns/pos | read ns/pos |")
    print("|---|---|---|---|---|---|")
    for name, arr in arrays.items():
        arr = _unit_rows(arr, unit)
        specs = BYTES if arr.dtype.itemsize == 1 else FLOATS + (("zstd-9",) if name == "time" else ())
        chosen = CODEC_CHOICE[name]
        per = int(np.prod(arr.shape[1:], dtype=np.int64))
        for spec in specs:
            ratio, w, r = measure(arr, spec, unit, tmp, rounds)
            print(f"| {name} | {arr.dtype}, {per} | {spec}{' *' if spec == chosen else ''} | {ratio:.2f} | "
                  f"{w:.1f} | {r:.1f} |", flush=True)
        if name == "logprob":  # sharding: units written one by one into shared shards
            ratio, w, r = measure(arr, chosen, unit, tmp, rounds, shard=True)
            print(f"| {name} | {arr.dtype}, {per} | {chosen}, {SHARD_UNITS} units per shard | {ratio:.2f} | "
                  f"{w:.1f} | {r:.1f} |", flush=True)


def unit_writes(arrays: dict, unit: int, tmp: Path, rounds: int, durable: bool) -> float:
    """ns/position of OutputStore.write_unit over 16 units (logprob, entropy, softmask and a
    4-layer boundary state of the default model's shape); durable False: the fsyncs skipped
    (the bound of any grouping of them, not a mode linpipe has)."""
    from linpipe.store import OutputStore
    from linpipe.store.location import Location

    n_units = 16
    n = unit * n_units
    data = {k: np.resize(arrays[k], n) for k in ("logprob", "entropy", "softmask")}
    state = {f"layers.{i}.{k}": np.ones(shape, np.float32) for i in range(4)
             for k, shape in (("S", (4, 16, 16)), ("z", (4, 16)), ("conv", (3, 64)))}
    sync = Location.sync
    if not durable:
        Location.sync = lambda self, chunks, also=(): None
    try:
        times = []
        for r in range(rounds):
            path = tmp / f"w{r}.zarr"
            store = OutputStore.create(path, meta={}, outputs=list(data), unit_size=unit,
                                       records=[{"id": "chr1", "length": n, "modality": "dna"}])
            key = store.record_key("chr1")
            t0 = time.perf_counter()
            for i in range(n_units):
                s, e = store.unit_range(key, i)
                store.write_unit(key, i, {k: v[s:e] for k, v in data.items()}, state=state)
            times.append(time.perf_counter() - t0)
            store.close()
            shutil.rmtree(path)
    finally:
        Location.sync = sync
    return statistics.median(times) / n * 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--unit", type=int, default=262_144)
    ap.add_argument("--positions", type=int, default=524_288, help="DNA positions run through the model")
    a = ap.parse_args()
    arrays = dna_outputs(a.positions) | series_outputs()
    with tempfile.TemporaryDirectory(dir=os.environ.get("LINPIPE_BENCH_DIR")) as d:
        codec_table(arrays, a.unit, Path(d), a.rounds)
        for durable in (True, False):
            ns = unit_writes(arrays, a.unit, Path(d), a.rounds, durable)
            fsync = "on" if durable else "skipped"
            print(f"\nwrite_unit (logprob, entropy, softmask, state), fsync {fsync}: "
                  f"{ns:.1f} ns/position, {1e3 / ns:.1f}M positions/s")


if __name__ == "__main__":
    main()
