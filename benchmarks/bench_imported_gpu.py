"""An imported fla checkpoint on a GPU (benchmarks/gpu_checklist.sh, item 6): `linpipe model
import` of a fixture checkpoint, then its forward over real genome (the shared genomes, or the
repository's hg19 slice) on CUDA, unit by unit with the state carried (the family's Triton
kernel: linpipe's for the scalar gate of linear_attn/mamba2, fla-core's for the delta rule),
against the CPU form on the first positions. Prints positions/s on the device and the largest
logprob difference from the CPU form.

    python benchmarks/bench_imported_gpu.py --checkpoint tests/data/fla/mamba2 \\
        --tokens A=3,C=4,G=5,T=6,N=7 [--mb 8] [--unit 1048576] [--cpu-positions 65536]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from bench_host_path import _sequence  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, required=True, help="an fla checkpoint directory")
    ap.add_argument("--tokens", default=None, help="--tokens of model import (A=ID,C=ID,G=ID,T=ID,N=ID)")
    ap.add_argument("--mb", type=float, default=8.0, help="Mb of real genome on the device")
    ap.add_argument("--unit", type=int, default=1 << 20, help="positions per call (a unit)")
    ap.add_argument("--cpu-positions", type=int, default=65536, help="positions compared with the CPU form")
    ap.add_argument("--device", default=None, help="cuda when there is one, else cpu")
    args = ap.parse_args()

    import torch

    from linpipe.inputs.alphabet import tokenize
    from linpipe.model import load_model
    from linpipe.model.imports import import_checkpoint, parse_tokens

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        tokens = parse_tokens(args.tokens) if args.tokens else None
        config, _sha = import_checkpoint(args.checkpoint, Path(tmp) / "model", tokens=tokens)
        dev, cpu = (load_model(str(Path(tmp) / "model"), device=d) for d in (device, "cpu"))
    x = tokenize(_sequence()[:int(args.mb * 1e6)])
    n = min(args.cpu_positions, len(x))
    want = cpu.forward(x[:n], cpu.init_state(), ["logprob"])[0]["logprob"]

    def run(upto):
        state, lps = dev.init_state(), []
        for a in range(0, upto, args.unit):
            out, state = dev.forward(x[a:min(a + args.unit, upto)], state, ["logprob"])
            lps.append(out["logprob"])
        return np.concatenate(lps)

    got = run(n)  # warm-up (Triton compiles) and the parity slice
    finite = np.isfinite(want)
    diff = float(np.abs(got[finite] - want[finite]).max()) if finite.any() else 0.0
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    run(len(x))
    if device == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(f"{config.family} ({args.checkpoint}) on {device}: {len(x):,} positions in {dt:.2f} s, "
          f"{len(x) / dt:,.0f} positions/s; logprob max |device - cpu| {diff:.2e} over {n:,} positions")


if __name__ == "__main__":
    main()
