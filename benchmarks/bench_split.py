"""Sequence parallelism (issue 15): one long record over several workers (`--split`).

Stages (each appends to a JSON file, so they run apart on a busy machine):
  build     an 8,000,000 bp single-record FASTA from /work/shared/data/genomes: hg19 chr1 first
            3 Mb, S. epidermidis ST14 (42 contigs), A. thaliana 1%, C. elegans pieces and the two
            mitochondria, concatenated in that order, then hg19's start again up to 8 Mb
  embedded  `submit` on an embedded local Ray: --workers 1 --split never, then --workers 2
            --split auto (--reps pairs); positions/s, per-layer exchange latency and bytes;
            outputs compared
  cluster   the same on a loopback cluster (tests/ray_local_cluster.py): head + 2 worker nodes of
            1 CPU; 1 worker vs 2 workers
  barrier   the driver's barrier latency with P = 1..16 trivial actors (the exchange's floor)
  profile   one process, one thread: serial vs one segment's calls on 500 kb (the extra work f)
  accuracy  identity features with the normaliser: the split's and the serial run's distance
            from the float64 run
  model     a cost model fitted to the above; chr1 (249 Mb) makespan predictions, the plot

Usage: python benchmarks/bench_split.py STAGE [--out /tmp/bench15] [--length 8000000]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

DATA = Path("/work/shared/data/genomes")
REPO = Path(__file__).resolve().parents[1]


def load(out: Path) -> dict:
    f = out / "results.json"
    return json.loads(f.read_text()) if f.exists() else {}


def save(out: Path, key: str, value) -> None:
    d = load(out)
    d[key] = value
    (out / "results.json").write_text(json.dumps(d, indent=1))


def _seqs(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    out, cur = [], []
    with opener(path, "rt") as f:
        for line in f:
            if line.startswith(">"):
                if cur:
                    out.append("".join(cur))
                cur = []
            else:
                cur.append(line.strip())
    if cur:
        out.append("".join(cur))
    return out


def build(out: Path, length: int) -> Path:
    fa = out / f"concat{length // 1_000_000}M.fa"
    if fa.exists():
        return fa
    parts = []
    for name in ("korflab_hg19_chr1_first3Mb.fa.gz", "abricate_Sepidermidis_ST14_assembly.fa",
                 "korflab_Athaliana_TAIR_1pct.fa", "htslib_ce.fa", "minimap2_MT-human.fa",
                 "minimap2_MT-orang.fa"):
        parts += _seqs(DATA / name)
    seq = "".join(parts)
    while len(seq) < length:
        seq += seq[:length - len(seq)]
    seq = seq[:length]
    with open(fa, "w") as f:
        f.write(f">concat{length} hg19 chr1 3Mb + S.epidermidis + A.thaliana 1pct + C.elegans + MT\n")
        for i in range(0, len(seq), 80):
            f.write(seq[i:i + 80] + "\n")
    return fa


class Layers:
    """Collects split_layer timings (and the load average) from run_job."""

    def __init__(self):
        from linpipe.jobs.driver import JobEvents

        class E(JobEvents):
            def __init__(s):
                s.timings = []

            def split_layer(s, record_id, layer, nodes, timing):
                s.timings.append({"layer": layer, "segments": len(nodes), **timing})

        self.events = E()


def run(fa: Path, store: Path, workers: int, split: str, address=None, chunk=262_144) -> dict:
    from linpipe.jobs.driver import run_job
    from linpipe.jobs.request import JobRequest

    ev = Layers().events
    load0 = os.getloadavg()
    t = time.perf_counter()
    s = run_job(JobRequest(inputs=(str(fa),), out=str(store), workers=workers, split=split, chunk_size=chunk,
                           overwrite=True, outputs=("logprob", "entropy")), address=address, events=ev)
    wall = time.perf_counter() - t
    return {"workers": workers, "split": split, "positions": s.positions_run, "seconds": s.seconds,
            "wall_s": wall, "startup_s": s.startup_s, "positions_per_s": s.positions_per_s,
            "model_s": s.model_s, "write_s": s.write_s, "read_s": s.read_s, "nodes": list(s.nodes),
            "worker_peak_rss": s.worker_peak_rss, "layers": ev.timings,
            "loadavg_before": load0, "loadavg_after": os.getloadavg()}


def compare(a: Path, b: Path) -> dict:
    import linpipe

    ra, rb = linpipe.open_output(str(a)), linpipe.open_output(str(b))
    worst = {}
    for rid in ra.records:
        for name in ra.meta["outputs"]:
            x = np.nan_to_num(ra.read(rid, name).astype(np.float64))
            y = np.nan_to_num(rb.read(rid, name).astype(np.float64))
            worst[name] = float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-30))
    return worst


def stage_embedded(out: Path, length: int, reps: int = 1) -> None:
    """`reps` pairs, one after the other: 1 worker streamed, then 2 workers split; the ratio
    of each pair (the machine's state drifts between pairs), and their median."""
    fa = build(out, length)
    pairs = []
    for _ in range(reps):
        r1 = run(fa, out / "w1.zarr", 1, "never")
        print(json.dumps({k: v for k, v in r1.items() if k != "layers"}), flush=True)
        r2 = run(fa, out / "w2.zarr", 2, "auto")
        print(json.dumps(r2), flush=True)
        rel = compare(out / "w2.zarr", out / "w1.zarr")
        pairs.append({"w1": r1, "w2": r2, "rel_diff": rel,
                      "speedup_positions_per_s": r2["positions_per_s"] / r1["positions_per_s"],
                      "speedup_wall": r1["wall_s"] / r2["wall_s"]})
        p = pairs[-1]
        print("speedup", p["speedup_positions_per_s"], "wall", p["speedup_wall"], rel, flush=True)
    med = sorted(pairs, key=lambda p: p["speedup_positions_per_s"])[len(pairs) // 2]
    save(out, "embedded", {"record": fa.name, "length": length, **med, "pairs": pairs,
                           "speedups_positions_per_s": [p["speedup_positions_per_s"] for p in pairs]})


def stage_cluster(out: Path, length: int) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    import ray_local_cluster as rlc

    fa = build(out, length)
    res = {}
    with rlc.LocalCluster(num_workers=2, cpus_per_node=1) as c:  # nodes start one by one
        for workers, split in ((1, "never"), (2, "2"), (3, "3")):
            r = run(fa, out / f"c{workers}.zarr", workers, split, address=c.gcs_address)
            print(json.dumps({k: v for k, v in r.items() if k != "layers"}), flush=True)
            res[f"w{workers}"] = r
    res["rel_diff_w2"] = compare(out / "c2.zarr", out / "c1.zarr")
    res["record"], res["length"] = fa.name, length
    save(out, "cluster", res)


def stage_barrier(out: Path) -> None:
    """A driver barrier (P calls out, P results back) with the payloads of one default-model
    layer, on actors that do nothing: the exchange cost without compute."""
    import pickle

    import ray
    import torch

    ray.init(address="local", num_cpus=16, include_dashboard=False, logging_level="WARNING",
             log_to_driver=False)

    @ray.remote(num_cpus=1)
    class Echo:
        def f(self, *a):
            return a

    def payloads(H, K, D, W=4):
        """One layer's states: up (float64 S, z) and down (layer, S, z, halo)."""
        up = (torch.zeros(H, K, K, dtype=torch.float64), torch.zeros(H, K, dtype=torch.float64))
        return up, (0, torch.zeros(H, K, K), torch.zeros(H, K), torch.zeros(W - 1, D))

    def barriers(P, up, down, reps):
        """Times of `reps` rounds of two barriers (down, then up) over P fresh actors, and the
        bytes one round pickles."""
        actors = [Echo.remote() for _ in range(P)]
        ray.get([a.f.remote() for a in actors])
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            ray.get([a.f.remote(*down) for a in actors])
            ray.get([a.f.remote(*up) for a in actors])
            times.append(time.perf_counter() - t)
        for a in actors:
            ray.kill(a)
        return times, P * (len(pickle.dumps(down)) + len(pickle.dumps(up))) * 2

    res = {}
    up, down = payloads(4, 16, 64)  # the default model
    for P in (1, 2, 4, 8, 16):
        times, nbytes = barriers(P, up, down, 30)
        res[P] = {"two_barriers_median_s": float(np.median(times)), "min_s": float(np.min(times)),
                  "bytes": nbytes}
        print(P, res[P], flush=True)
    # the D=512 model's payloads (H=8, K=64): the driver's bandwidth for states
    P = 8
    times, nbytes = barriers(P, *payloads(8, 64, 512), 10)
    med = float(np.median(times))
    big = {"P": P, "bytes": nbytes, "median_s": med,
           "bytes_per_s": nbytes / max(med - 2 * res[8]["two_barriers_median_s"] / 2, 1e-6)}
    print("big", big, flush=True)
    ray.shutdown()
    save(out, "barrier", {"per_P": res, "big_payload": big, "loadavg": os.getloadavg()})


def stage_profile(out: Path, length: int = 500_000) -> None:
    """In one process, one thread: the serial run vs one segment's calls over the same
    positions, for the record's first segment (it runs the layers itself) and for a later one
    (pass 1 from a zero state, pass 2 correcting it): the split's extra work f per kind."""
    import torch

    from linpipe.inputs import open_input
    from linpipe.model import load_model
    from linpipe.model.segments import SegmentRunner

    torch.set_num_threads(1)
    m = load_model("default", device="cpu")
    inp = open_input(str(build(out, 8_000_000)))
    x = inp.read(inp.records[0].id, 0, length)[0]
    chunk = 262_144
    reps = []
    for _ in range(3):
        t = time.perf_counter()
        st = m.init_state()
        for a in range(0, length, chunk):
            _o, st = m.forward(x[a:a + chunk], st, outputs=["logprob", "entropy"])
        rep = {"serial_s": time.perf_counter() - t}
        st0 = m.init_state()
        for kind, exact in (("first", True), ("later", False)):
            r = SegmentRunner(m, lambda a, b: x[a:b], 0, length, chunk, spill_dir=str(out),
                              outputs=["logprob", "entropy"], exact=exact)
            t = time.perf_counter()
            r.begin((st0.S[0], st0.z[0], st0.conv[0]) if exact else None)
            for layer in range(m.config.n_layers):
                r.apply(layer, st0.S[0, layer], st0.z[0, layer], st0.conv[0, layer])
            list(r.pieces_out(st0.y[0], st0))
            rep[f"{kind}_s"] = time.perf_counter() - t
            r.close()
        rep["loadavg"] = os.getloadavg()[0]
        reps.append(rep)
        print(rep, flush=True)
    f = {kind: float(np.median([(r[f"{kind}_s"] - r["serial_s"]) / r["serial_s"] for r in reps]))
         for kind in ("first", "later")}
    save(out, "profile", {"positions": length, "reps": reps, "f": f})
    print("f", f)


def stage_accuracy(out: Path) -> None:
    """Distance from the exact (float64) run of the serial float32 run and of the split, for
    identity features with the normaliser (where phi(q).z crosses zero), on hg19 chr1
    [9,000, 11,600) (the N run's end and real sequence): tests/test_split.py's small models and
    segment layouts, the worst position of `hidden` (max abs difference over the largest value)."""
    import copy

    import torch

    from linpipe.inputs.alphabet import tokenize
    from linpipe.model import Model, ModelConfig, init_net
    from linpipe.model.segments import forward_split, segment_bounds

    torch.set_num_threads(1)
    x = tokenize(_seqs(DATA / "korflab_hg19_chr1_first3Mb.fa.gz")[0][9_000:11_600])
    chunk = 500

    def serial(model):
        state, parts = model.init_state(), []
        for a in range(0, len(x), chunk):
            o, state = model.forward(x[a:a + chunk], state, outputs=["hidden"])
            parts.append(o["hidden"])
        return np.concatenate(parts).astype(np.float64)

    res = []
    for decay in (True, False):
        for width in (1, 4):
            cfg = ModelConfig(modality="dna", d_model=16, n_layers=2, n_heads=2, mlp_hidden=32,
                              feature_map="identity", normalize=True, conv_width=width)
            model = Model(init_net(cfg, seed=3, decay=None if decay else 1.0), cfg, device="cpu")
            exact = serial(Model(copy.deepcopy(model.net).double(), cfg, device="cpu"))
            scale = np.abs(exact).max()
            d_serial = float(np.abs(serial(model) - exact).max() / scale)
            for parts in (2, 3, 5):
                bounds = segment_bounds(len(x), chunk, parts)
                got = forward_split(model, x, bounds, chunk, outputs=["hidden"])[0]
                d = float(np.abs(got["hidden"].astype(np.float64) - exact).max() / scale)
                res.append({"decay": decay, "conv_width": width, "P": parts, "serial": d_serial, "split": d,
                            "ratio": d / d_serial})
                print(res[-1], flush=True)
    save(out, "accuracy", res)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=["build", "embedded", "cluster", "barrier", "profile", "accuracy",
                                      "model"])
    ap.add_argument("--out", default="/tmp/bench15")
    ap.add_argument("--length", type=int, default=8_000_000)
    ap.add_argument("--reps", type=int, default=1, help="embedded: pairs of runs (the median is kept)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.stage == "build":
        print(build(out, a.length))
    elif a.stage == "embedded":
        stage_embedded(out, a.length, a.reps)
    elif a.stage == "cluster":
        stage_cluster(out, a.length)
    elif a.stage == "barrier":
        stage_barrier(out)
    elif a.stage == "profile":
        stage_profile(out)
    elif a.stage == "accuracy":
        stage_accuracy(out)
    else:
        from bench_split_model import fit_and_plot  # noqa: E402  (the model stage, beside this file)

        fit_and_plot(out, REPO / "docs")


if __name__ == "__main__":
    main()
