"""Model.forward from Python, as a user calls it: on torch's default threads (what a forward
ran on before linpipe.model.threads) against the count the library picks now, in one run.

Each round runs one child process per side, alternated, so that a noisy neighbour hits both
alike; each child streams real bases (the first 3 Mb of hg19 chr1 in tests/data) through
Model.forward of the shipped default model and reports positions/s of its best pass, and the
thread count the forward ran on.

Usage: python benchmarks/bench_forward_threads.py [--rounds 3] [--positions 131072]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

GENOME = Path(__file__).resolve().parents[1] / "tests/data/genomes/korflab_hg19_chr1_first3Mb.fa.gz"

CHILD = r"""
import gzip, json, sys, time
import torch
side, positions, genome = sys.argv[1], int(sys.argv[2]), sys.argv[3]
from linpipe.inputs.alphabet import tokenize
from linpipe.model import load_model
from linpipe.model import threads as th
seq = []
with gzip.open(genome, "rt") as f:
    for line in f:
        if not line.startswith(">"):
            seq.append(line.strip().upper())
        if sum(map(len, seq)) > 2_000_000 + positions:
            break
x = tokenize("".join(seq)[2_000_000:2_000_000 + positions])  # past the leading Ns
m = load_model("default", threads=torch.get_num_threads() if side == "torch" else None)
ran = []
best = float("inf")
for _ in range(2):
    t = time.perf_counter()
    with th.forward_threads(m.device, m.threads):
        ran.append(torch.get_num_threads())
    m.forward(x, m.init_state())
    best = min(best, time.perf_counter() - t)
print(json.dumps({"side": side, "pos_per_s": positions / best, "threads": ran[-1]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--positions", type=int, default=131_072)
    args = ap.parse_args()
    got: dict[str, list] = {"torch": [], "picked": []}
    for _ in range(args.rounds):
        for side in got:
            out = subprocess.run([sys.executable, "-c", CHILD, side, str(args.positions), str(GENOME)],
                                 capture_output=True, text=True, check=True)
            got[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(got[side][-1]), flush=True)
    for side, runs in got.items():
        rate = statistics.median(r["pos_per_s"] for r in runs)
        threads = [r["threads"] for r in runs]
        print(f"{side:>6}: {rate:,.0f} positions/s (median of {len(runs)}), threads {threads}")
    ratio = statistics.median(r["pos_per_s"] for r in got["picked"]) / \
        statistics.median(r["pos_per_s"] for r in got["torch"])
    print(f"picked / torch's default: {ratio:.2f}x")


if __name__ == "__main__":
    main()
