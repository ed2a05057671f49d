"""A packed batch's read (issue 32): FASTA records read one by one (`read`) against together
(`read_many`, what a worker's run_batch calls), µs per record and ns per position, best of 5.

    python benchmarks/bench_packed_read.py [--input bench-out/packed_20k.fa] [--records 5000]
        [--batch 250]

The records are drawn at random from the whole file (seed 0) and read --batch at a time, as a
packed batch holds records of similar length from anywhere in the input.

Default input: bench-out/packed_20k.fa (benchmarks/bench_pipeline.py makes it from the real
genomes in ../shared/data: 20,000 records of 80-600 bp).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import linpipe

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", type=Path, default=REPO / "bench-out" / "packed_20k.fa")
    ap.add_argument("--records", type=int, default=5000)
    ap.add_argument("--batch", type=int, default=250, help="records per read_many call")
    args = ap.parse_args()
    with linpipe.open_input(args.input, descriptions=False) as inp:
        picked = np.random.default_rng(0).permutation(len(inp.records))[:args.records]
        requests = [(inp.records[i].id, 0, inp.records[i].length) for i in picked.tolist()]
        batches = [requests[i:i + args.batch] for i in range(0, len(requests), args.batch)]
        positions = sum(b - a for _, a, b in requests)
        one = [inp.read(*q) for q in requests]
        many = [r for b in batches for r in inp.read_many(b)]
        assert all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1])
                   for x, y in zip(one, many, strict=True))
        for name, run in (("read, one by one", lambda: [inp.read(*q) for q in requests]),
                          ("read_many", lambda: [inp.read_many(b) for b in batches])):
            times = []
            for _ in range(5):
                t = time.perf_counter()
                run()
                times.append(time.perf_counter() - t)
            s = min(times)
            print(f"{name:>17}: {s / len(requests) * 1e6:.2f} µs/record, {s / positions * 1e9:.1f} "
                  f"ns/position ({len(requests):,} records, {positions:,} positions)")


if __name__ == "__main__":
    main()
