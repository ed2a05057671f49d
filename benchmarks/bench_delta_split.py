"""The split's extra work for delta-rule models (issue 52): one process, one thread, the
streamed run vs the record's first segment and a later segment's calls (begin, then apply per
layer) over the same positions of a real genome, reps interleaved; prints each one's seconds
per position over the streamed run's (the later/first ratio is what segments.first_weight
stands for).

Usage: python benchmarks/bench_delta_split.py [--family gated_deltanet] [--positions 65536]
       [--reps 3] [--d-model 64] [--heads 4]
"""
from __future__ import annotations

import argparse
import gzip
import statistics
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="gated_deltanet")
    ap.add_argument("--positions", type=int, default=65_536)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)

    from linpipe.inputs.alphabet import tokenize
    from linpipe.model import ModelConfig, init_net, load_model, save_model
    from linpipe.model.segments import SegmentRunner

    g = args.family == "gated_deltanet"
    cfg = ModelConfig(modality="dna", d_model=args.d_model, n_layers=2, n_heads=args.heads,
                      mlp_hidden=2 * args.d_model, family=args.family, qk_head_dim=args.d_model // args.heads,
                      expand_v=2.0 if g else 1.0, use_gate=g)
    folder = Path(tempfile.mkdtemp()) / "m"
    save_model(init_net(cfg, seed=0), cfg, folder)
    model = load_model(str(folder), device="cpu")
    with gzip.open(REPO / "tests/data/genomes/korflab_hg19_chr1_first3Mb.fa.gz", "rt") as f:
        seq = "".join(line.strip() for line in f if not line.startswith(">"))
    T = args.positions
    x = tokenize(seq[20_000:20_000 + T])
    unit = 16_384
    c = model.config
    S0 = torch.zeros((c.n_heads, c.head_dim, c.head_v_dim))
    z0 = torch.zeros((c.n_heads, 0))
    halo = torch.zeros((c.conv_width - 1, 2 * c.n_heads * c.head_dim + c.n_heads * c.head_v_dim))
    first_state = model.init_state()
    initial = (first_state.S[0], first_state.z[0], first_state.conv[0])

    def streamed():
        st = model.init_state()
        for a in range(0, T, unit):
            _, st = model.forward(x[a:a + unit], st)

    def segment(exact):
        r = SegmentRunner(model, lambda a, b: x[a:b], 0, T, unit, exact=exact)
        r.begin(initial if exact else None)
        for layer in range(c.n_layers):
            r.apply(layer, S0, z0, halo)
        r.close()

    runs = {"streamed": streamed, "first": lambda: segment(True), "later": lambda: segment(False)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.reps):
        for name, fn in runs.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.family} D {c.d_model} H {c.n_heads} K {c.head_dim} V {c.head_v_dim}, {T} positions, "
          f"1 thread, median of {args.reps}")
    for name in runs:
        print(f"  {name:9s} {med[name]:.3f} s  {med[name] / med['streamed']:.2f}x streamed")
    print(f"  later / first: {med['later'] / med['first']:.2f}")


if __name__ == "__main__":
    main()
