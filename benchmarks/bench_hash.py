"""Whole-content input hashes: candidate hashes' speed, and what hashing costs beside a
default-model run on the same input.

    python benchmarks/bench_hash.py [--genomes ../shared/data/genomes] [--big-mb 300] [--rounds 5]

On the largest genome in --genomes, and on a file of about --big-mb MB made by concatenating all
of them (in $TMPDIR, removed after), times hashlib's sha256 and blake2b, xxhash's xxh3_128 when
it is installed, and linpipe's own path (`file_state(..., cached=False)`: sha256 read with a
reused 1 MiB buffer), in alternating rounds, median; the file is read once before so every
round reads from the page cache (a cold read is bounded by the disk instead). Then runs the
default model (Model.forward, one torch thread, chunks of 65,536) over the largest genome's
records and says what fraction of that run the hash is, on this CPU and on a GPU taken as 100x
faster than one CPU thread.
"""
import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import linpipe
from linpipe.inputs import file_state
from linpipe.inputs.base import HASH_BUFFER

GENOME_SUFFIXES = (".fa", ".fasta", ".fa.gz", ".fa.bgz", ".fna")


def read_hash(factory):
    def run(path: Path) -> str:
        h = factory()
        buf = bytearray(HASH_BUFFER)
        view = memoryview(buf)
        with open(path, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                h.update(view[:n])
        return h.hexdigest()
    return run


def candidates() -> dict:
    found = {"sha256": read_hash(hashlib.sha256), "blake2b": read_hash(hashlib.blake2b)}
    try:
        import xxhash
        found["xxh3_128"] = read_hash(xxhash.xxh3_128)
    except ImportError:
        print("(xxhash not installed: xxh3_128 not measured)")
    found["linpipe file_state"] = lambda p: file_state(p, cached=False).sha256
    return found


def throughputs(path: Path, rounds: int) -> dict[str, float]:
    """GB/s of each candidate on path: alternating rounds, median."""
    size = path.stat().st_size
    fns = candidates()
    path.read_bytes()  # into the page cache
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn(path)
            times[name].append(time.perf_counter() - t)
    return {name: size / statistics.median(ts) / 1e9 for name, ts in times.items()}


def model_seconds(path: Path) -> tuple[float, int]:
    """One default-model pass over every record of path (one thread): seconds, positions."""
    torch.set_num_threads(1)
    model = linpipe.load_model("default")
    positions = 0
    t = time.perf_counter()
    with linpipe.open_input(path) as inp:
        for rec in inp.records:
            state = model.init_state()
            for _start, _end, (tokens, _soft) in inp.iter_units(rec.id, 65_536):
                _, state = model.forward(tokens, state)
            positions += rec.length
    return time.perf_counter() - t, positions


def main():
    ap = argparse.ArgumentParser()
    shared = Path(__file__).resolve().parents[2] / "shared/data"
    ap.add_argument("--genomes", type=Path, default=shared / "genomes")
    ap.add_argument("--big-mb", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    genomes = sorted(p for p in args.genomes.iterdir() if p.name.endswith(GENOME_SUFFIXES))
    largest = max(genomes, key=lambda p: p.stat().st_size)
    print(f"{os.uname().machine}, load average {os.getloadavg()[0]:.1f}, python {sys.version.split()[0]}")

    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "concatenated.bin"
        with open(big, "wb") as out:
            while out.tell() < args.big_mb * 1_000_000:
                for g in genomes:
                    out.write(g.read_bytes())
        results = {}
        for path, label in ((largest, largest.name), (big, f"{len(genomes)} genomes concatenated")):
            results[path] = throughputs(path, args.rounds)
            print(f"\n{label}: {path.stat().st_size / 1e6:,.1f} MB, median of {args.rounds} rounds (GB/s)")
            for name, gbs in results[path].items():
                print(f"  {name:20s} {gbs:6.2f}")
        big_gbs = results[big]["linpipe file_state"]

    size = largest.stat().st_size
    seconds, positions = model_seconds(largest)
    hash_s = size / (big_gbs * 1e9)
    print(f"\ndefault model over {largest.name}: {positions:,} positions in {seconds:.1f} s "
          f"({positions / seconds:,.0f} positions/s, one thread)")
    print(f"linpipe's hash of it at {big_gbs:.2f} GB/s: {hash_s * 1e3:.2f} ms = "
          f"{100 * hash_s / seconds:.3f}% of that run; on a GPU 100x faster, "
          f"{100 * hash_s / (seconds / 100):.2f}%")


if __name__ == "__main__":
    main()
