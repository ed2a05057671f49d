"""The cost model of `--split` (issue 15), fitted to bench_split.py's measurements.

    makespan(P) = t_start + N L c (1 + f) / P + L (a + b P + P s / B)    (P > 1; P = 1: t_start + N L c)

N positions, L layers; c: seconds per position per layer on one worker (measured, whole job:
read, model, heads, write); f: the split's extra work per position in a segment after the
first (pass 1's q, numerators and denominators written and read back, the correction, the
residual stream's spill), measured in the 2-worker run; the first segment is weighted to take
(1 + f) times the others' positions, so every segment takes about the same time. a + b P: one
driver barrier with P segments (measured on trivial actors); one barrier per layer; s: bytes
one segment moves through the driver per layer (S, z up in float64 with the first and last
W-1 normalised inputs; S, z and the conv halo down in float32); B: the driver's bandwidth for
them (measured with the big model's payloads in the barrier stage).

Scaling to other models and to GPUs uses FLOPs per position per layer (see flops()). The GPU
rate is an assumption, not a measurement (no GPU was lent): an H100's fp32 matmul rate at a
stated efficiency, or its memory bandwidth for the activations, whichever is slower.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CHR1 = 248_956_422  # GRCh38 chr1
UNIT = 262_144
MODELS = {"default (D=64, L=2)": dict(D=64, L=2, H=4, M=128, W=4),
          "D=512, L=12": dict(D=512, L=12, H=8, M=2048, W=4)}
GPU_FLOPS = 67e12 * 0.25  # H100 SXM fp32 peak (non tensor core) at 25% efficiency: assumption
GPU_BYTES = 3.35e12 * 0.5  # H100 HBM3 at 50%: assumption
GPU_START_S = 20.0  # actor start + model load + CUDA context: assumption
# The figure for the default model on one idle CPU worker (200k positions/s), per
# position per layer (this VM's 1-worker run measures c itself: ~130-145k positions/s).
C_UNLOADED = 1 / 200_000 / 2


def flops(D, L, H, M, W, block=32):
    """Multiply-adds x2 per position per layer: q,k,v,o projections, MLP, conv, the chunked
    attention (intra-block scores and values, state read and update)."""
    K = D // H
    return 2 * (4 * D * D + 2 * D * M + W * D) + 4 * D * block + 4 * D * K


def state_bytes(D, H, W, **_):
    K = D // H
    up = (H * K * K + H * K) * 8 + 2 * (W - 1) * D * 4  # partial sums in float64, head and tail
    down = (H * K * K + H * K) * 4 + (W - 1) * D * 4  # incoming S, z and the halo in float32
    return up + down


def makespan(N, m, c, f, a, b, bw, P, t_start):
    if P == 1:  # the ordinary stream: no second pass, no exchange
        return t_start + N * m["L"] * c
    return t_start + N * m["L"] * c * (1 + f) / P + m["L"] * (a + b * P + P * state_bytes(**m) / bw)


def fit_and_plot(out: Path, docs: Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = json.loads((out / "results.json").read_text())
    emb = r["embedded"]
    N = emb["length"]
    dm = MODELS["default (D=64, L=2)"]
    w1, w2 = emb["w1"], emb["w2"]
    c = w1["seconds"] / (N * dm["L"])  # s per position per layer, one worker
    # barrier: two barriers (down + up) per P, default payloads; least squares a + b P
    bar = r["barrier"]["per_P"]
    Ps = np.array(sorted(int(p) for p in bar))
    t2 = np.array([bar[str(p)]["two_barriers_median_s"] for p in Ps]) / 2
    b, a = np.polyfit(Ps, t2, 1)
    b = max(b, 1e-6)
    big = r["barrier"].get("big_payload", {})
    bw = big.get("bytes_per_s", 1e9)
    # f: the split's extra work per position, from the 2-worker run itself (its work seconds
    # less the exchange, against half the 1-worker run's): every overhead of the real path, and
    # the two workers slowing each other on this 2-core VM (so an upper bound for P workers on
    # P cores). The one-process profile stage moved from -0.1 to 0.5 between repetitions.
    exch = sum(t["exchange_s"] for t in w2["layers"])
    f = (w2["seconds"] - exch) / (N * dm["L"] * c / 2) - 1
    f_profile = r.get("profile", {}).get("f")
    t_start = w1["startup_s"]
    fit = {"c_s_per_pos_layer": c, "f": f, "f_profile_one_process": f_profile, "a_s": a,
           "b_s_per_P": b, "driver_bytes_per_s": bw, "t_start_s": t_start, "N_measured": N,
           "c_unloaded_issue": C_UNLOADED}
    pred = {}
    f0 = flops(**dm)
    Pgrid = np.unique(np.round(np.logspace(0, np.log10(CHR1 // UNIT), 60)).astype(int))
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, m in MODELS.items():
        for dev in ("CPU (c measured here)", "CPU (idle: 200k pos/s default)", "GPU"):
            if dev.startswith("CPU"):
                cm = (c if "measured" in dev else C_UNLOADED) * flops(**m) / f0
                ts = t_start
            else:  # compute- or bandwidth-bound, whichever is slower; ~20 floats of activations in and out
                cm = max(flops(**m) / GPU_FLOPS, 20 * m["D"] * 4 / GPU_BYTES)
                ts = GPU_START_S
            T = np.array([makespan(CHR1, m, cm, f, a, b, bw, P, ts) for P in Pgrid])
            best = int(Pgrid[int(np.argmin(T))])
            Pstar = float(np.sqrt(CHR1 * cm * (1 + f) / (b + state_bytes(**m) / bw)))
            pred[f"{name} {dev}"] = {
                "c_s_per_pos_layer": cm,
                "makespan_s": {P: makespan(CHR1, m, cm, f, a, b, bw, P, ts) for P in (1, 16, 64, 256)},
                "best_P_on_grid": best, "P_star_unbounded": Pstar,
                "exchange_bytes_per_layer_P256": 256 * state_bytes(**m)}
            ax.loglog(Pgrid, T, label=f"{name}, {dev}")
    ax.axvline(CHR1 // UNIT, color="grey", ls=":", lw=1)
    ax.text(CHR1 // UNIT, ax.get_ylim()[1] * 0.5, " one chunk\n per worker", fontsize=8)
    ax.set_xlabel("workers P (one segment each)")
    ax.set_ylabel("predicted makespan of human chr1 (s)")
    ax.set_title("--split cost model (fitted on a 2-core VM; GPU rate assumed)")
    ax.grid(True, which="both", lw=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(docs / "sequence-parallel-model.png", dpi=110)
    res = {"fit": fit, "predictions": pred}
    (out / "model.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return res
