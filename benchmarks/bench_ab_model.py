"""Whole-model CPU speed, old code vs this checkout, in one run (issue 12's acceptance).

The old code is an installed copy of an earlier linpipe (`pip install --no-deps --target DIR
OLD_CHECKOUT`); each round runs one child process per side, old and new alternated, so that
a noisy neighbour hits both alike. Each child streams real bases through Model.forward at one
thread and reports positions/s of its best pass. Models (--models): bench_model.py's (D=128,
L=4, M=512, W=4), the shipped default, a tiny D=8 one-layer one. With --split, another row:
the shipped default model's later segment of a split record (linpipe.model.segments: pass 1
from a zero state, pass 2 correcting it, the outputs), the split's own path, over the same
positions.

Usage: python benchmarks/bench_ab_model.py OLD_SITE_DIR [--rounds 5] [--positions 65536] [--split]
       [--models bench,default,tiny]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np
import torch
torch.set_num_threads(1)
from linpipe.model import Model, ModelConfig, init_net, load_model
which, positions, chunk, passes, genome = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
if which == "bench":
    c = ModelConfig(modality="dna", d_model=128, n_layers=4, n_heads=4, mlp_hidden=512, conv_width=4)
    model = Model(init_net(c, seed=0))
elif which == "tiny":  # linpipe model init --d-model 8 --n-heads 1 --n-layers 1 --mlp-hidden 8 --conv-width 1
    c = ModelConfig(modality="dna", d_model=8, n_layers=1, n_heads=1, mlp_hidden=8, conv_width=1)
    model = Model(init_net(c, seed=0))
else:
    model = load_model("default")
with open(genome) as f:
    seq = "".join(line.strip() for line in f if not line.startswith(">"))
lut = np.full(256, 4, np.uint8)
for i, b in enumerate("ACGT"):
    lut[ord(b)] = lut[ord(b.lower())] = i
x = np.resize(lut[np.frombuffer(seq.encode(), np.uint8)], positions)
state = model.init_state()


def split_later():  # a later segment of a split record, over the same positions
    from linpipe.model.segments import SegmentRunner
    r = SegmentRunner(model, lambda a, b: x[a:b], 0, positions, chunk, exact=False)
    r.begin(None)
    for layer in range(model.config.n_layers):
        r.apply(layer, state.S[0, layer], state.z[0, layer], state.conv[0, layer])
    list(r.units_out(state.y[0], state))
    r.close()


def stream():
    global state
    for a in range(0, positions, chunk):
        _, state = model.forward(x[a:a + chunk], state)


if which == "split":
    run = split_later
    run()  # warm-up
else:
    run = stream
    model.forward(x[:chunk], state)  # warm-up
best = float("inf")
for _ in range(passes):
    t = time.perf_counter()
    run()
    best = min(best, time.perf_counter() - t)
print(json.dumps({"positions_per_s": positions / best, "file": __import__("linpipe").__file__}))
"""


def run_child(site, which, args, genome):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    if site:
        env["PYTHONPATH"] = site
    cmd = [sys.executable, "-c", CHILD, which, str(args.positions), str(args.chunk), str(args.passes), genome]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old_site", help="a --target directory holding the old linpipe")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--positions", type=int, default=65536)
    ap.add_argument("--chunk", type=int, default=65536)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--split", action="store_true", help="also a later segment of a split record")
    ap.add_argument("--models", default="bench,default",
                    help="comma-separated: bench (D=128, L=4), default (shipped), tiny (D=8, one layer)")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.environ.get("LINPIPE_SHARED_DATA", os.path.join(here, "..", "..", "shared", "data"))
    genome = os.path.join(root, "genomes", "htslib_ce.fa")
    report = {"load_before": os.getloadavg()}
    for which in tuple(args.models.split(",")) + (("split",) if args.split else ()):
        rates = {"old": [], "new": []}
        files = {}
        for _ in range(args.rounds):
            for side, site in (("old", os.path.abspath(args.old_site)), ("new", None)):
                r = run_child(site, which, args, genome)
                rates[side].append(r["positions_per_s"])
                files[side] = r["file"]
        res = {}
        for side in ("old", "new"):
            res[side] = {"best": max(rates[side]), "median": statistics.median(rates[side]),
                         "rounds": rates[side], "linpipe": files[side]}
        res["ratio_best"] = res["new"]["best"] / res["old"]["best"]
        res["ratio_median"] = res["new"]["median"] / res["old"]["median"]
        # per-round ratios: old and new of one round ran back to back
        res["ratio_per_round"] = [n / o for o, n in zip(rates["old"], rates["new"], strict=False)]
        report[which] = res
        print(which, json.dumps(res, indent=1), flush=True)
    report["load_after"] = os.getloadavg()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
