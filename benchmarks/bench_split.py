"""Sequence parallelism (issue 15): one long record over several workers (`--split`).

Stages (each appends to a JSON file, so they run apart on a busy machine):
  build     an 8,000,000 bp single-record FASTA from /work/shared/data/genomes: hg19 chr1 first
            3 Mb, S. epidermidis ST14 (42 contigs), A. thaliana 1%, C. elegans pieces and the two
            mitochondria, concatenated in that order, then hg19's start again up to 8 Mb
  embedded  `submit` on an embedded local Ray: --workers 1 --split never, then --workers 2
            --split auto (--reps pairs); positions/s, per-layer exchange latency and bytes;
            outputs compared
  weights   the default model's config with identity features (later segments in float64):
            1 worker vs 2 workers with the first segment weighted 1.25, 2.2 and 3.0
  cluster   the same on a loopback cluster (tests/ray_local_cluster.py): head + 2 worker nodes of
            1 CPU; 1 worker vs 2 workers
  barrier   the driver's barrier latency with P = 1..16 trivial actors (the exchange's floor)
  profile   one process, one thread: serial vs one segment's calls on 500 kb (the extra work f)
  accuracy  identity features with the normaliser: the split's and the serial run's distance
            from the float64 run
  wide      the cost of that configuration's float64 passes: the first and a later segment's
            calls over the serial run's, for identity features with the normaliser (float64) and
            for elu1 (float32), models of the default model's size, one thread, interleaved reps
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


def run(fa: Path, store: Path, workers: int, split: str, address=None, chunk=262_144, model=None) -> dict:
    from linpipe.jobs.driver import run_job
    from linpipe.jobs.request import JobRequest

    ev = Layers().events
    load0 = os.getloadavg()
    t = time.perf_counter()
    s = run_job(JobRequest(inputs=(str(fa),), out=str(store), workers=workers, split=split, unit_size=chunk,
                           overwrite=True, outputs=("logprob", "entropy"), model=model or "default"),
                address=address, events=ev)
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


def float64_model(out: Path) -> str:
    """The default model's config with identity features (and its normaliser), random weights:
    a model whose later segments run their passes in float64."""
    import dataclasses

    from linpipe.model import init_net, load_model, save_model

    path = out / "identity-model"
    if not (path / "config.json").exists():
        cfg = dataclasses.replace(load_model("default", device="cpu").config, feature_map="identity")
        save_model(init_net(cfg, seed=3), cfg, path)
    return str(path)


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


def stage_weights(out: Path, length: int, weights=(1.25, 2.2, 3.0, 1.25, 2.2)) -> None:
    """float64_model on the embedded Ray: 1 worker, then 2 workers split with the first
    segment weighted each of `weights` in turn (FIRST_WEIGHT_FLOAT64 set in this process,
    where the driver cuts the record), then 1 worker again; every run's positions/s. Then the
    stream's and the last split's distance from the float64 run (phi(q).z crosses zero)."""
    import linpipe.model.segments as segments

    fa, model = build(out, length), float64_model(out)
    default = segments.FIRST_WEIGHT_FLOAT64
    runs = [run(fa, out / "f1.zarr", 1, "never", model=model)]
    try:
        for w in weights:
            segments.FIRST_WEIGHT_FLOAT64 = w
            runs.append({"first_weight": w, **run(fa, out / "f2.zarr", 2, "auto", model=model)})
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "layers"}), flush=True)
    finally:
        segments.FIRST_WEIGHT_FLOAT64 = default
    runs.append(run(fa, out / "f1.zarr", 1, "never", model=model))
    one = float(np.mean([runs[0]["positions_per_s"], runs[-1]["positions_per_s"]]))
    ratios = [(r["first_weight"], r["positions_per_s"] / one) for r in runs[1:-1]]
    print("2 workers over 1, by first weight:", ratios)
    dist = distance_from_float64(model, fa, {"stream": out / "f1.zarr", "split": out / "f2.zarr"})
    print(dist)
    save(out, "weights", {"record": fa.name, "length": length, "model": model, "runs": runs,
                          "one_worker_positions_per_s": one, "ratios": ratios, "from_float64": dist})


def distance_from_float64(model: str, fa: Path, stores: dict, chunk: int = 262_144) -> dict:
    """Each store's max distance from the float64 run of the model (relative to that run's
    largest value), and at how many positions it is over 1e-3 of it; logprob and entropy."""
    import copy

    import torch

    import linpipe
    from linpipe.inputs import open_input
    from linpipe.model import Model, load_model

    m = load_model(model, device="cpu")
    m64 = Model(copy.deepcopy(m.net).double(), m.config, device="cpu")
    inp = open_input(str(fa))
    rid, n = inp.records[0].id, inp.records[0].length
    torch.set_num_threads(2)
    st, parts = m64.init_state(), {"logprob": [], "entropy": []}
    for a in range(0, n, chunk):
        o, st = m64.forward(inp.read(rid, a, min(n, a + chunk))[0], st, outputs=list(parts))
        for k in parts:
            parts[k].append(o[k])
    res = {}
    for name, path in stores.items():
        got = linpipe.open_output(str(path))
        for k, p in parts.items():
            e = np.nan_to_num(np.concatenate(p).astype(np.float64))
            d = np.abs(np.nan_to_num(got.read(rid, k).astype(np.float64)) - e)
            top = np.abs(e).max()
            res[f"{name}/{k}"] = {"max": float(d.max() / top), "over_1e-3": int((d > 1e-3 * top).sum())}
    return res


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
            list(r.units_out(st0.y[0], st0))
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
    from linpipe.model.segments import segment_bounds
    from linpipe.model.segments_run import forward_split

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


def stage_wide(out: Path, length: int = 300_000, reps: int = 5) -> None:
    """What the float64 passes cost: per rep, the first and a later segment's calls over the
    serial run on the same positions, for a float64 configuration (identity features with the
    normaliser) and a float32 one (elu1), both of the default model's size, random weights;
    the medians, and a later segment's time over the first's (the first segment's weight)."""
    import dataclasses

    import torch

    from linpipe.inputs import open_input
    from linpipe.model import Model, init_net, load_model
    from linpipe.model.segments import SegmentRunner

    torch.set_num_threads(1)
    base = load_model("default", device="cpu").config
    models = {}
    for fm in ("elu1", "identity"):
        cfg = dataclasses.replace(base, feature_map=fm, normalize=True)
        models[fm] = Model(init_net(cfg, seed=3), cfg, device="cpu")
    inp = open_input(str(build(out, 8_000_000)))
    x = inp.read(inp.records[0].id, 0, length)[0]
    chunk = 65_536
    rows = []
    for _ in range(reps):
        row = {"loadavg": os.getloadavg()[0]}
        for fm, m in models.items():
            t = time.perf_counter()
            st = m.init_state()
            for a in range(0, length, chunk):
                _o, st = m.forward(x[a:a + chunk], st, outputs=["logprob", "entropy"])
            serial = time.perf_counter() - t
            st0 = m.init_state()
            row[fm] = {"serial_s": serial}
            for kind, exact in (("first", True), ("later", False)):
                r = SegmentRunner(m, lambda a, b: x[a:b], 0, length, chunk, spill_dir=str(out),
                                  outputs=["logprob", "entropy"], exact=exact)
                t = time.perf_counter()
                r.begin((st0.S[0], st0.z[0], st0.conv[0]) if exact else None)
                for layer in range(m.config.n_layers):
                    r.apply(layer, st0.S[0, layer], st0.z[0, layer], st0.conv[0, layer])
                list(r.units_out(st0.y[0], st0))
                row[fm][f"{kind}_s"] = time.perf_counter() - t
                r.close()
        rows.append(row)
        print(row, flush=True)
    med = {fm: {kind: float(np.median([r[fm][f"{kind}_s"] / r[fm]["serial_s"] for r in rows]))
                for kind in ("first", "later")} for fm in models}
    # the first segment's share that evens the work: a later segment's time over the first's
    weight = {fm: float(np.median([r[fm]["later_s"] / r[fm]["first_s"] for r in rows])) for fm in models}
    save(out, "wide", {"positions": length, "chunk": chunk, "reps": rows, "over_serial": med,
                       "later_over_first": weight})
    print("over serial", med, "later / first", weight)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=["build", "embedded", "weights", "cluster", "barrier",
                                      "profile", "accuracy", "wide", "model"])
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
    elif a.stage == "weights":
        stage_weights(out, a.length)
    elif a.stage == "cluster":
        stage_cluster(out, a.length)
    elif a.stage == "barrier":
        stage_barrier(out)
    elif a.stage == "profile":
        stage_profile(out)
    elif a.stage == "accuracy":
        stage_accuracy(out)
    elif a.stage == "wide":
        stage_wide(out)
    else:
        from bench_split_model import fit_and_plot  # noqa: E402  (the model stage, beside this file)

        fit_and_plot(out, REPO / "docs")


if __name__ == "__main__":
    main()
