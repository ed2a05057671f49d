"""float32 x @ w.T on one CPU thread: torch's public op (MKL's sgemm) against oneDNN's
(linpipe.model.onednn.onednn_linear), the two products the CPU forward's row tiles choose from
(`cpu_matmul`: what this machine takes is printed first), at the model's shapes, alternating
rounds, medians in GFLOP/s.

Usage: python benchmarks/bench_matmul_backends.py [--rounds 7]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from linpipe.model.onednn import cpu_matmul, onednn_linear

# (rows, in, out): the default model's qkv, MLP and o_proj tiles (D=64, M=128, 2,048 rows), the
# bench model's (D=128, M=512) and the tiny model's (D=8, 16,384 rows)
SHAPES = [(2048, 64, 192), (2048, 64, 128), (2048, 128, 64), (2048, 128, 384), (2048, 128, 512),
          (2048, 512, 128), (16384, 8, 24), (16384, 8, 8)]


def rate(fn, flops, reps):
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return flops * reps / (time.perf_counter() - t) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    report = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "forward_takes": cpu_matmul()}
    print(json.dumps(report), flush=True)
    for m, k, n in SHAPES:
        x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
        flops = 2 * m * k * n
        reps = max(3, int(2e9 / flops))
        res = {"mkl": [], "onednn": []}
        for _ in range(args.rounds):
            res["mkl"].append(rate(lambda x=x, w=w: F.linear(x, w), flops, reps))
            res["onednn"].append(rate(lambda x=x, w=w: onednn_linear(x, w), flops, reps))
        med = {k2: round(statistics.median(v), 1) for k2, v in res.items()}
        report[f"{m}x{k}->{n}"] = med
        print(f"{m}x{k}->{n}", json.dumps(med), flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
