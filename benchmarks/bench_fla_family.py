"""An imported flash-linear-attention model over a real genome: positions/s on a device, and its
logprob against the CPU form's on a prefix (the GPU checklist's line per imported family).

The fixture checkpoint (tests/data/fla/NAME, fla's own classes) is imported into a temporary
folder, then the first record of a real genome runs through `Model.forward` in units of
--unit positions, the state carried from unit to unit: timed on --device (after one warm-up
unit), and its first --check positions again on the CPU, whose logprob it must equal to --tol.

Usage: python benchmarks/bench_fla_family.py NAME [--device cuda] [--genome FASTA]
       [--positions 2000000] [--unit 262144] [--check 65536] [--tol 1e-3]
Prints one JSON line: family, device, positions, positions/s, the largest |logprob| difference.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TOKENS = {"A": 3, "C": 4, "G": 5, "T": 6, "N": 7}  # make_fla_fixtures.LETTER_IDS


def run(model, x, unit):
    """logprob of x in units, the state carried; and the seconds the units after the first took."""
    state, out, t0 = model.init_state(), [], None
    for a in range(0, len(x), unit):
        if a == unit:
            t0 = time.perf_counter()
        got, state = model.forward(x[a:a + unit], state, outputs=["logprob"])
        out.append(got["logprob"])
    seconds = time.perf_counter() - t0 if t0 is not None else float("nan")
    return np.concatenate(out), seconds


def main():
    from linpipe.inputs import open_input
    from linpipe.model import load_model
    from linpipe.model.imports import import_checkpoint

    ap = argparse.ArgumentParser()
    ap.add_argument("name", help="a fixture under tests/data/fla (gla, delta_net, ...)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--genome", default=str(REPO / "tests/data/genomes/htslib_ce.fa"))
    ap.add_argument("--positions", type=int, default=2_000_000)
    ap.add_argument("--unit", type=int, default=262_144)
    ap.add_argument("--check", type=int, default=65_536)
    ap.add_argument("--tol", type=float, default=1e-3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config, _ = import_checkpoint(REPO / "tests/data/fla" / args.name, Path(tmp) / "m", tokens=TOKENS)
        with open_input(args.genome) as inp:
            rec = inp.records[0]
            x = np.asarray(inp.read(rec.id, 0, min(rec.length, args.positions))[0])
        dev = load_model(str(Path(tmp) / "m"), device=args.device)
        lp, seconds = run(dev, x, args.unit)
        cpu = load_model(str(Path(tmp) / "m"), device="cpu")
        n = min(args.check, len(x))
        ref, _ = run(cpu, x[:n], args.unit)
    ok = np.isfinite(ref)
    diff = float(np.abs(lp[:n][ok] - ref[ok]).max())
    timed = len(x) - min(args.unit, len(x))
    print(json.dumps({"family": config.family, "fixture": args.name, "device": args.device,
                      "record": rec.id, "positions": len(x), "positions_per_s": round(timed / seconds),
                      "max_abs_logprob_diff_vs_cpu": diff, "checked": n}))
    return 0 if diff <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
