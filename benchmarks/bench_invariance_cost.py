"""What batch invariance costs on the CPU: the position-wise ops on fixed row tiles (as shipped)
against the same ops as one call over all of a call's rows (rows.by_tiles replaced), in one
process at one thread, alternating rounds, medians. Two workloads per model: one record
streamed through Model.forward, and many short records packed by Model.forward_records (where
the last tile of every call is padded). The kernel's own padding (full blocks) is in both.

Usage: python benchmarks/bench_invariance_cost.py [--rounds 7] [--models tiny,default]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch

import linpipe.model.rows as rows
from linpipe.model import Model, ModelConfig, init_net, load_model

TILED = rows.by_tiles


def one_call(fn, tile, *xs):
    return fn(*xs)


def bases(n: int) -> np.ndarray:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.environ.get("LINPIPE_SHARED_DATA", os.path.join(here, "..", "..", "shared", "data"))
    with open(os.path.join(root, "genomes", "htslib_ce.fa")) as f:
        seq = "".join(line.strip() for line in f if not line.startswith(">"))
    lut = np.full(256, 4, np.uint8)
    for i, b in enumerate("ACGT"):
        lut[ord(b)] = lut[ord(b.lower())] = i
    return np.resize(lut[np.frombuffer(seq.encode(), np.uint8)], n)


def model_of(name: str) -> Model:
    if name == "tiny":
        return Model(init_net(ModelConfig(modality="dna", d_model=8, n_layers=1, n_heads=1, mlp_hidden=8,
                                          conv_width=1), seed=0))
    return load_model(name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--models", default="tiny,default")
    ap.add_argument("--positions", type=int, default=262_144)
    args = ap.parse_args()
    torch.set_num_threads(1)
    x = bases(args.positions)
    rng = np.random.default_rng(0)
    cuts = np.cumsum(rng.integers(50, 1_500, 400))
    short = [x[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True) if b <= len(x)]
    report = {"load_before": os.getloadavg(), "short_records": len(short),
              "short_positions": int(sum(len(s) for s in short))}
    for name in args.models.split(","):
        m = model_of(name)
        work = {"stream": (lambda m=m: m.forward(x, m.init_state()), len(x)),
                "packed": (lambda m=m: m.forward_records(short), report["short_positions"])}
        for wname, (run, n) in work.items():
            rates = {"tiled": [], "one_call": []}
            run()  # warm-up
            for _ in range(args.rounds):
                for side, fn in (("tiled", TILED), ("one_call", one_call)):
                    rows.by_tiles = fn
                    t = time.perf_counter()
                    run()
                    rates[side].append(n / (time.perf_counter() - t))
            rows.by_tiles = TILED
            med = {k: statistics.median(v) for k, v in rates.items()}
            res = {"tiled_median": med["tiled"], "one_call_median": med["one_call"],
                   "cost": 1 - med["tiled"] / med["one_call"], "rounds": rates}
            report[f"{name}/{wname}"] = res
            print(name, wname, json.dumps({k: v for k, v in res.items() if k != "rounds"}), flush=True)
    report["load_after"] = os.getloadavg()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
