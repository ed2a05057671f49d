"""What a split run's checkpoint costs against the layer it saves (docs/sequence-parallel.md,
"Surviving a kill"; linpipe/model/checkpoints.py's cost model).

One process, one torch thread: a later segment (the kind that corrects) of N positions of hg19
chr1 (from /work/shared/data/genomes, else tests/data) runs begin and apply(0) of a model of width D
(the default model's shape scaled: H = D/16, M = 2 D, 2 layers); then its layer input h is written
to a local store folder as a checkpoint (store/splits.py: safetensors + CRC-32C, fsynced) and
read back. Reps interleaved; medians. Prints seconds per million positions and the ratio
checkpoint write / layer pass, which checkpoints.checkpoint_every's rates predict as
(4 D / STORE_BYTES_PER_S) / (layer_flops / FLOPS_PER_S).

Usage: python benchmarks/bench_split_checkpoint.py [--positions 524288] [--widths 64 256] [--reps 3]
"""
from __future__ import annotations

import argparse
import gzip
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARED = Path("/work/shared/data/genomes/korflab_hg19_chr1_first3Mb.fa.gz")
LOCAL = REPO / "tests" / "data" / "genomes" / "korflab_hg19_chr1_first3Mb.fa.gz"


def tokens(n: int) -> np.ndarray:
    from linpipe.inputs.alphabet import tokenize

    path = SHARED if SHARED.exists() else LOCAL
    with gzip.open(path, "rt") as f:
        seq = "".join(line.strip() for line in f if not line.startswith(">"))
    return tokenize(seq[10_000:10_000 + n])  # past the N run at the start


def one(model, x, unit, folder):
    import torch

    from linpipe.model.checkpoints import layer_flops
    from linpipe.model.segments import SegmentRunner
    from linpipe.store.location import Location
    from linpipe.store.splits import SplitRecords

    r = SegmentRunner(model, lambda a, b: x[a:b], 0, len(x), unit, exact=False)  # corrects, as a later one
    t0 = time.perf_counter()
    msg = r.begin()
    t1 = time.perf_counter()
    c = model.config
    S = torch.zeros(c.n_heads, c.head_dim, c.head_dim)
    z = torch.zeros(c.n_heads, c.head_dim)
    halo = torch.zeros(max(0, c.conv_width - 1), c.d_model)
    t2 = time.perf_counter()
    r.apply(0, S, z, halo)
    t3 = time.perf_counter()
    sp = SplitRecords(Location(folder, read_only=False), "rec", [(0, len(x))])
    for a, b in r.units:
        sp.put(f"h/0/{a // unit}", {"h": r.rows(a, b)})
    t4 = time.perf_counter()
    for a, _b in r.units:
        sp.get(f"h/0/{a // unit}")
    t5 = time.perf_counter()
    r.close()
    sp.clear()
    assert msg.S is not None
    return {"begin_s": t1 - t0, "layer_s": t3 - t2, "write_s": t4 - t3, "read_s": t5 - t4,
            "flops": layer_flops(c)}


def main():
    import torch

    from linpipe.model import Model, ModelConfig, init_net

    p = argparse.ArgumentParser()
    p.add_argument("--positions", type=int, default=524_288)
    p.add_argument("--widths", type=int, nargs="+", default=[64, 256])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--unit", type=int, default=65_536)
    p.add_argument("--dir", default=None, help="where the store folder goes (default: the temp dir)")
    args = p.parse_args()
    torch.set_num_threads(1)
    x = tokens(args.positions)
    models = {}
    for D in args.widths:
        cfg = ModelConfig(modality="dna", d_model=D, n_layers=2, n_heads=max(1, D // 16), mlp_hidden=2 * D)
        models[D] = Model(init_net(cfg, seed=0), cfg, device="cpu")
    got = {D: [] for D in args.widths}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for _ in range(args.reps):
            for D, m in models.items():
                got[D].append(one(m, x, args.unit, tmp))
    per_m = 1e6 / args.positions
    print("| D | layer pass s/Mpos | checkpoint write s/Mpos | read s/Mpos | write / layer |")
    print("|---|---|---|---|---|")
    for D, runs in got.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("layer_s", "write_s", "read_s")}
        print(f"| {D} | {med['layer_s'] * per_m:.2f} | {med['write_s'] * per_m:.2f} | "
              f"{med['read_s'] * per_m:.2f} | {med['write_s'] / med['layer_s']:.2f} |")


if __name__ == "__main__":
    main()
