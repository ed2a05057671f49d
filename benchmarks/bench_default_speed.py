"""Inference speed of the shipped default model: Model.forward over real bases (C. elegans from
../shared/data, as in bench_model.py), all three outputs, one torch thread, best of 3 passes.

    python benchmarks/bench_default_speed.py [--positions 1048576] [--chunk 65536]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_model import genome_tokens  # noqa: E402

import linpipe  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--positions", type=int, default=1 << 20)
    ap.add_argument("--chunk", type=int, default=65536)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = linpipe.load_model("default")
    x = genome_tokens(args.positions)
    model.forward(x[:args.chunk], model.init_state())  # warm-up
    best = float("inf")
    for _ in range(3):
        state = model.init_state()
        t = time.perf_counter()
        for a in range(0, len(x), args.chunk):
            _, state = model.forward(x[a:a + args.chunk], state)
        best = min(best, time.perf_counter() - t)
    print(f"default model: {len(x) / best:,.0f} positions/s (1 thread, best of 3 passes over "
          f"{len(x):,} positions, chunks of {args.chunk:,}; load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
