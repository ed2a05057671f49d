"""Many short records (issue 13): speed, files and memory of packed stores. Figures go to BENCHMARKS.md.

    python benchmarks/bench_many_records.py compare              # 100k records of 80-600 bp vs one
                                                                   record of a tenth of their size
    python benchmarks/bench_many_records.py million [--model tiny]   # 1,000,000 records (~340 Mb)
    python benchmarks/bench_many_records.py overhead [--model tiny] [--plot F] [--counts 1000,...]
    python benchmarks/bench_many_records.py create               # OutputStore.create, 1M records

Each job runs `run_job` with --workers 2 in a fresh Python process (so the driver's peak memory is
its own), with the shipped default model, or `--model tiny` (D=16, one layer: the model's cost
small beside the pipeline's, to measure what a record costs the pipeline itself). Inputs are
random pieces of the real genomes in ../shared/data (LINPIPE_SHARED_DATA), written to
bench-out/. Ratios are within one run.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("LINPIPE_SHARED_DATA", REPO.parent / "shared" / "data")) / "genomes"
OUT = REPO / "bench-out" / "many"
SOURCES = ("htslib_ce.fa", "korflab_hg19_chr1_first3Mb.fa.gz", "korflab_Athaliana_TAIR_1pct.fa")


def genome_text() -> str:
    """The shared genomes' bases, concatenated (pieces are cut from here)."""
    parts = []
    for name in SOURCES:
        opener = gzip.open if name.endswith(".gz") else open
        with opener(DATA / name, "rt") as f:
            parts.extend(line.strip() for line in f if not line.startswith(">"))
    return "".join(parts)


def write_records(path: Path, n: int, lo: int = 80, hi: int = 600, seed: int = 0) -> int:
    """n random pieces of real genomes, lo..hi bp; returns the total positions."""
    if path.exists():
        return int(path.with_suffix(".positions").read_text())
    rng = np.random.default_rng(seed)
    text = genome_text()
    lengths = rng.integers(lo, hi + 1, size=n)
    starts = rng.integers(0, len(text) - hi, size=n)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for i in range(n):
            seq = text[starts[i]:starts[i] + lengths[i]]
            f.write(f">contig_{i} len={lengths[i]}\n{seq}\n")
    tmp.rename(path)
    path.with_suffix(".positions").write_text(str(int(lengths.sum())))
    return int(lengths.sum())


def write_long(path: Path, positions: int) -> None:
    if path.exists():
        return
    text = genome_text()
    reps = -(-positions // len(text))
    seq = (text * reps)[:positions]
    with open(path, "w") as f:
        f.write(">long\n")
        for i in range(0, len(seq), 80):
            f.write(seq[i:i + 80] + "\n")


JOB = r"""
import json, sys, time, os
t0 = time.perf_counter()
from linpipe.jobs.driver import run_job
from linpipe.jobs.request import JobRequest
fasta, out, model = sys.argv[1], sys.argv[2], sys.argv[3]
s = run_job(JobRequest(inputs=(fasta,), out=out, workers=2, overwrite=True, model=model))
wall = time.perf_counter() - t0
files = sum(len(f) for _, _, f in os.walk(out))
import linpipe
t1 = time.perf_counter()
r = linpipe.open_output(out)
rid = next((i.id for i in r.store.long_records.values()), None) or "contig_%d" % (s.records // 2)
ds = r.dataset(rid)
ds.logprob.values
t_open = time.perf_counter() - t1
print(json.dumps({"wall_s": wall, "records": s.records, "positions": s.positions, "seconds": s.seconds,
                  "startup_s": s.startup_s, "files": files, "store_bytes": s.output_bytes,
                  "driver_peak_rss": s.driver_peak_rss, "worker_peak_rss": s.worker_peak_rss,
                  "read_s": s.read_s, "model_s": s.model_s, "write_s": s.write_s, "open_one_s": t_open}))
"""


MODEL = ["default"]


def tiny_model() -> str:
    path = OUT / "tiny-model"
    if not path.exists():
        from linpipe.model import ModelConfig, init_net, save_model

        cfg = ModelConfig(modality="dna", d_model=16, n_layers=1, n_heads=2, mlp_hidden=32)
        save_model(init_net(cfg, seed=0), cfg, path)
    return str(path)


def run(fasta: Path, out: Path) -> dict:
    res = subprocess.run([sys.executable, "-c", JOB, str(fasta), str(out), MODEL[0]], capture_output=True,
                         text=True)
    if res.returncode != 0:
        raise SystemExit(res.stderr[-3000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def show(name: str, r: dict) -> None:
    rate = r["positions"] / r["wall_s"]
    print(f"{name}: {r['records']:,} records, {r['positions']:,} positions, wall {r['wall_s']:.1f} s "
          f"(start-up {r['startup_s']:.1f} s) = {rate:,.0f} positions/s; {r['files']:,} files, "
          f"{r['store_bytes'] / 2**20:.1f} MiB; driver peak {r['driver_peak_rss'] / 2**20:.0f} MiB, "
          f"worker peak {r['worker_peak_rss'] / 2**20:.0f} MiB; worker time read {r['read_s']:.1f} s / "
          f"model {r['model_s']:.1f} s / write {r['write_s']:.1f} s; "
          f"open one record {r['open_one_s'] * 1e3:.0f} ms",
          flush=True)


def compare() -> None:
    many = OUT / "records_100k.fa"
    total = write_records(many, 100_000)
    long = OUT / "long_tenth.fa"
    write_long(long, total // 10)
    r_long = run(long, OUT / "long.zarr")
    show("one long record (a tenth)", r_long)
    r_many = run(many, OUT / "many.zarr")
    show("100k short records", r_many)
    ratio = (r_many["positions"] / r_many["wall_s"]) / (r_long["positions"] / r_long["wall_s"])
    print(f"positions/s, 100k records vs one long record of a tenth the size (wall incl. start-up): "
          f"{ratio:.2f}x (target >= 0.8x); files {r_many['files']:,} (target <= 5,000); driver peak "
          f"{r_many['driver_peak_rss'] / 2**30:.2f} GiB (target < 1)")


def million() -> None:
    fasta = OUT / "records_1M.fa"
    write_records(fasta, 1_000_000, seed=1)
    show("1M short records", run(fasta, OUT / "million.zarr"))


def create(n: int = 1_000_000) -> None:
    """Laying out a store for n short records (the plan's table given), in this process."""
    from linpipe.store import OutputStore
    from linpipe.store.table import PackedRecords

    rng = np.random.default_rng(1)
    lengths = rng.integers(80, 601, size=n)
    ids = [f"contig_{i}" for i in range(n)]
    t0 = time.perf_counter()
    packed = PackedRecords.build(ids, [""] * n, lengths, np.zeros(n), unit_size=262_144)
    t1 = time.perf_counter()
    OutputStore.create(OUT / "create.zarr", meta={}, records=[], packed=packed, modality="dna",
                       unit_size=262_144, overwrite=True)
    t2 = time.perf_counter()
    files = sum(len(f) for _, _, f in os.walk(OUT / "create.zarr"))
    print(f"{n:,} records: batching {t1 - t0:.1f} s, OutputStore.create {t2 - t1:.1f} s, {files} files")


def overhead(counts: list[int], plot: str | None) -> None:
    """Per-record overhead: the wall time of a job of N short records that is neither Ray's
    start-up, nor the fixed cost of any job (imports, a store's metadata: measured on two long
    records), nor the model (its summed worker time over the two workers), per record: what
    reading, planning, batching, writing and tracking a record costs the pipeline."""
    ref_fasta = OUT / "long_ref2.fa"
    if not ref_fasta.exists():
        one = OUT / "long_ref_half.fa"
        write_long(one, 1_500_000)
        text = one.read_text()
        ref_fasta.write_text(text + text.replace(">long", ">long2"))
    ref = run(ref_fasta, OUT / "ref.zarr")
    fixed = ref["wall_s"] - ref["startup_s"] - ref["seconds"]
    show("reference: two long records", ref)
    print(f"  fixed cost of a job outside Ray's start-up: {fixed:.1f} s", flush=True)
    points = []
    for n in counts:
        fasta = OUT / ("records_1M.fa" if n == 1_000_000 else f"records_{n}.fa")
        write_records(fasta, n, seed=1 if n == 1_000_000 else 2)
        r = run(fasta, OUT / f"n{n}.zarr")
        show(f"{n:,} records", r)
        extra = r["wall_s"] - r["startup_s"] - fixed - r["model_s"] / 2
        points.append((n, 1e6 * extra / n))
        print(f"  overhead per record: {points[-1][1]:.0f} us", flush=True)
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-")
        ax.set_xscale("log")
        ax.set_xlabel("records in the job (80-600 bp each)")
        ax.set_ylabel("non-model wall time per record (us)")
        ax.set_title("linpipe: what a record costs the pipeline (tiny model, 2 workers)")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(plot)
        print(f"plot: {plot}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["compare", "million", "overhead", "create"])
    ap.add_argument("--counts", default="1000,10000,100000")
    ap.add_argument("--plot", default=None)
    ap.add_argument("--model", default="default", help="a model directory or name, or 'tiny'")
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    MODEL[0] = tiny_model() if a.model == "tiny" else a.model
    print(f"model: {MODEL[0]}", flush=True)
    t = time.time()
    if a.what == "compare":
        compare()
    elif a.what == "million":
        million()
    elif a.what == "create":
        create()
    else:
        overhead([int(x) for x in a.counts.split(",")], a.plot)
    print(f"({time.time() - t:.0f} s)")


if __name__ == "__main__":
    main()
