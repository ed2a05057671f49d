"""An imported flash-linear-attention fixture (tests/data/fla/NAME) over a real genome on a device:
positions/s of Model.forward (units of --unit positions, the state carried), and its logprob
against the CPU form's on the first --check positions (the GPU checklist's line per family).

    python benchmarks/bench_fla_import.py retnet --device cuda --positions 1000000

Prints one JSON line: fixture, family, device, positions, seconds, positions_per_s, max_abs_diff.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
GENOME = REPO / "tests" / "data" / "genomes" / "htslib_ce.fa"  # C. elegans, about 1 Mb, real
TOKENS = "A=3,C=4,G=5,T=6,N=7"  # the fixtures' ids (tests/fla_fixtures/make_fla_fixtures.py)


def genome_tokens(n: int) -> np.ndarray:
    """The first n positions of the genome's records joined, as linpipe's tokens."""
    from linpipe.inputs import open_input

    parts, got = [], 0
    with open_input(str(GENOME)) as inp:
        for r in inp.records:
            x, _mask = inp.read(r.id, 0, min(r.length, n - got))
            parts.append(np.asarray(x))
            got += len(parts[-1])
            if got >= n:
                break
    return np.concatenate(parts)[:n]


def run(model, x: np.ndarray, unit: int) -> tuple[np.ndarray, float]:
    state, out = model.init_state(), []
    t0 = time.perf_counter()
    for a in range(0, len(x), unit):
        o, state = model.forward(x[a:a + unit], state, ["logprob"])
        out.append(o["logprob"])
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return np.concatenate(out), time.perf_counter() - t0


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("fixture")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--positions", type=int, default=1_000_000)
    p.add_argument("--unit", type=int, default=262_144)
    p.add_argument("--check", type=int, default=20_000)
    a = p.parse_args(argv)
    from linpipe.model import load_model
    from linpipe.model.imports import import_checkpoint, parse_tokens

    with tempfile.TemporaryDirectory() as tmp:
        config, _sha = import_checkpoint(REPO / "tests" / "data" / "fla" / a.fixture, Path(tmp) / "m",
                                         tokens=parse_tokens(TOKENS))
        model = load_model(str(Path(tmp) / "m"), device=a.device)
        cpu = load_model(str(Path(tmp) / "m"), device="cpu")
    x = genome_tokens(a.positions)
    run(model, x[:4096], a.unit)  # warm-up (kernels compiled, buffers made)
    got, secs = run(model, x, a.unit)
    want, _ = run(cpu, x[:a.check], a.unit)
    ok = np.isfinite(want)
    print(json.dumps({"fixture": a.fixture, "family": config.family, "device": a.device, "positions": len(x),
                      "seconds": round(secs, 3), "positions_per_s": round(len(x) / secs),
                      "max_abs_diff": float(np.abs(got[:a.check][ok] - want[ok]).max())}))


if __name__ == "__main__":
    sys.exit(main())
