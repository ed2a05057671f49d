"""Pipeline benchmarks (issue 6): overhead, scaling, memory. Figures go to BENCHMARKS.md.

    python benchmarks/bench_pipeline.py overhead   # submit vs bare model forward, >= 4 Mb real genome
        BENCH_MODEL=default|DIR (default: a small random model), BENCH_INPUT=4mb|8mb-record|20k-packed,
        BENCH_ROUNDS (overhead's alternations, default 3)
    python benchmarks/bench_pipeline.py scaling    # 1 vs 2 worker nodes (1 CPU each); one record = half
    python benchmarks/bench_pipeline.py memory     # peak RSS of driver and workers, 10 Mb vs 100 Mb

Inputs are built in bench-out/ from the real genomes in ../shared/data (LINPIPE_SHARED_DATA).
Every ratio is measured within one run of this script, on the same machine and load.
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("LINPIPE_SHARED_DATA", REPO.parent / "shared" / "data")) / "genomes"
OUT = REPO / "bench-out"


def read_fasta(path: Path) -> list[tuple[str, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    recs, name, parts = [], None, []
    with opener(path, "rt") as f:
        for line in f:
            if line.startswith(">"):
                if name is not None:
                    recs.append((name, "".join(parts)))
                name, parts = line[1:].split()[0], []
            else:
                parts.append(line.strip())
    if name is not None:
        recs.append((name, "".join(parts)))
    return recs


def write_fasta(path: Path, recs) -> int:
    total = 0
    with open(path, "w") as f:
        for name, seq in recs:
            f.write(f">{name}\n")
            for i in range(0, len(seq), 60):
                f.write(seq[i:i + 60] + "\n")
            total += len(seq)
    return total


def real_genome_4mb() -> Path:
    """S. epidermidis (42 contigs) + C. elegans slice + A. thaliana slice: 4.7 Mb, 56 records."""
    path = OUT / "real_4mb.fa"
    if not path.exists():
        recs = []
        for f in ("abricate_Sepidermidis_ST14_assembly.fa", "htslib_ce.fa", "korflab_Athaliana_TAIR_1pct.fa"):
            recs += read_fasta(DATA / f)
        write_fasta(path, recs)
    return path


def one_record_8mb() -> Path:
    """The four real genomes joined into one record of 7.8 Mb."""
    path = OUT / "one_record_8mb.fa"
    if not path.exists():
        files = ("korflab_hg19_chr1_first3Mb.fa.gz", "abricate_Sepidermidis_ST14_assembly.fa",
                 "korflab_Athaliana_TAIR_1pct.fa", "htslib_ce.fa")
        seq = "".join(s for f in files for _, s in read_fasta(DATA / f))
        write_fasta(path, [("joined", seq)])
    return path


def packed_20k() -> Path:
    """20,000 records of 80-600 bp cut at random from the joined genomes (seed 0)."""
    import numpy as np

    path = OUT / "packed_20k.fa"
    if not path.exists():
        seq = read_fasta(one_record_8mb())[0][1]
        rng = np.random.default_rng(0)
        recs = []
        for i in range(20_000):
            n = int(rng.integers(80, 601))
            s = int(rng.integers(0, len(seq) - n))
            recs.append((f"read{i}", seq[s:s + n]))
        write_fasta(path, recs)
    return path


INPUTS = {"4mb": real_genome_4mb, "8mb-record": one_record_8mb, "20k-packed": packed_20k}


def synthetic(total_mb: int) -> Path:
    """Real sequence (human chr1 slice, S. epidermidis, C. elegans, A. thaliana) tiled into
    records of 1-3 Mb with distinct names until `total_mb` megabases."""
    path = OUT / f"synthetic_{total_mb}mb.fa"
    if path.exists():
        return path
    pool = []
    for f in ("korflab_hg19_chr1_first3Mb.fa.gz", "abricate_Sepidermidis_ST14_assembly.fa",
              "htslib_ce.fa", "korflab_Athaliana_TAIR_1pct.fa"):
        pool.append("".join(s for _, s in read_fasta(DATA / f)))
    target, recs, i = total_mb * 1_000_000, [], 0
    written = 0
    while written < target:
        seq = pool[i % len(pool)][: min(target - written, 3_000_000)]
        recs.append((f"synth{i}", seq))
        written += len(seq)
        i += 1
    write_fasta(path, recs)
    return path


def bare_forward(genome: Path, unit_size: int, model: str = "default") -> tuple[float, int]:
    """Seconds of the model alone over every record, in this process: long records unit by
    unit (Model.forward), short ones in the job's own batches (Model.forward_records)."""
    import torch

    import linpipe
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    torch.set_num_threads(1)  # what each CPU actor uses
    m = linpipe.load_model(model)
    inp = linpipe.open_input(str(genome))
    plan = plan_job(JobRequest(inputs=(str(genome),), model=model, unit_size=unit_size))
    total_s, positions = 0.0, 0
    for rec in plan.streams:
        state = m.init_state()
        for s in range(0, rec.length, unit_size):
            tokens, _ = inp.read(rec.id, s, min(s + unit_size, rec.length))
            t0 = time.perf_counter()
            _, state = m.forward(tokens, state, outputs=["logprob", "entropy"])
            total_s += time.perf_counter() - t0
            positions += len(tokens)
    for b in range(plan.packed.n_batches if plan.packed else 0):
        xs = [inp.read(u.record_id, u.start, u.end)[0] for u in plan.batch_units(b)]
        t0 = time.perf_counter()
        m.forward_records(xs, outputs=["logprob", "entropy"])
        total_s += time.perf_counter() - t0
        positions += sum(len(x) for x in xs)
    return total_s, positions


def submit(genome: Path, out: Path, *, address: str | None = None, outputs=None, **kw):
    from linpipe.jobs.driver import run_job
    from linpipe.jobs.request import JobRequest

    req = JobRequest(inputs=(str(genome),), out=str(out), overwrite=True,
                     outputs=tuple(outputs) if outputs else None, **kw)
    return run_job(req, address=address)


def tiny_model() -> str:
    """A small random DNA model: the pipeline's own costs weigh most against a fast model."""
    model_dir = OUT / "tiny_model"
    if not model_dir.exists():
        from linpipe.model import ModelConfig, init_net, save_model

        cfg = ModelConfig(modality="dna", d_model=16, n_layers=1, n_heads=2, mlp_hidden=32)
        save_model(init_net(cfg, seed=0), cfg, model_dir)
    return str(model_dir)


def overhead(unit_size: int):
    """Bare forward and submit alternate BENCH_ROUNDS times, so that load changes on a shared
    machine hit both arms alike; the ratio is of the summed times, and per round."""
    rounds = int(os.environ.get("BENCH_ROUNDS", 3))
    genome = INPUTS[os.environ.get("BENCH_INPUT", "4mb")]()
    model = os.environ.get("BENCH_MODEL") or tiny_model()
    bare, runs = [], []
    for _ in range(rounds):
        b, n = bare_forward(genome, unit_size, model)
        bare.append(b)
        runs.append(submit(genome, OUT / "overhead.zarr", unit_size=unit_size, workers=1,
                           model=model, outputs=["logprob", "entropy"]))
    sub = [s.seconds for s in runs]
    s = runs[-1]
    busy = s.read_s + s.model_s + s.write_s
    print(json.dumps({
        "bench": "overhead", "genome": genome.name, "model": Path(model).name, "positions": n,
        "unit_size": unit_size, "bare_forward_s": [round(x, 2) for x in bare],
        "submit_s_excl_startup": [round(x, 2) for x in sub],
        "ratio": round(sum(sub) / sum(bare), 3),
        "ratio_per_round": [round(a / b, 3) for a, b in zip(sub, bare, strict=True)],
        "ray_startup_s": [round(r.startup_s, 2) for r in runs],
        "submit_positions_per_s": [round(r.positions_per_s) for r in runs],
        # the ratio split: the worker's model time against the bare forward (the same model in
        # another process), and the rest of the job's time, the pipeline's own, against it
        "worker_model_over_bare": [round(r.model_s / b, 3) for r, b in zip(runs, bare, strict=True)],
        "pipeline_over_bare": [round((r.seconds - r.model_s) / b, 4)
                               for r, b in zip(runs, bare, strict=True)],
        "worker_s": {k: round(getattr(s, f"{k}_s"), 2) for k in ("read", "model", "write", "wait")},
        "worker_split": {k: round(v / busy, 3) for k, v in
                         (("read", s.read_s), ("model", s.model_s), ("write", s.write_s))},
    }), flush=True)


def _cluster_run(genome: Path, n_nodes: int, unit_size: int, tag: str) -> float:
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(n_nodes):
        c.add_node(num_cpus=1)
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level="WARNING", log_to_driver=False)
    try:
        s = submit(genome, OUT / f"scaling_{tag}_{n_nodes}.zarr", unit_size=unit_size,
                   address=c.address, outputs=["logprob", "entropy"], model=tiny_model())
        return s.seconds
    finally:
        ray.shutdown()
        c.shutdown()


def scaling(unit_size: int):
    balanced = OUT / "sepi.fa"
    recs = read_fasta(DATA / "abricate_Sepidermidis_ST14_assembly.fa")
    if not balanced.exists():
        write_fasta(balanced, recs)
    half = OUT / "sepi_half.fa"
    if not half.exists():  # the same bases, but the first half of the genome is one record
        seq = "".join(s for _, s in recs)
        h = len(seq) // 2
        rest, acc = [], 0
        for name, s in recs:  # the other half keeps the assembly's contigs, cut at h
            if acc + len(s) > h:
                rest.append((name, s[max(0, h - acc):]))
            acc += len(s)
        write_fasta(half, [("half", seq[:h])] + rest)
    one = _cluster_run(balanced, 1, unit_size, "bal")
    two = _cluster_run(balanced, 2, unit_size, "bal")
    two_half = _cluster_run(half, 2, unit_size, "half")
    print(json.dumps({
        "bench": "scaling", "genome": balanced.name, "unit_size": unit_size,
        "makespan_1_node_s": round(one, 2), "makespan_2_nodes_s": round(two, 2),
        "speedup": round(one / two, 3), "makespan_2_nodes_half_record_s": round(two_half, 2),
        "half_record_vs_balanced": round(two_half / two, 3),
    }), flush=True)


def memory(unit_size: int, sizes=(10, 100)):
    """Each size in a fresh driver process; a tiny model keeps the 100 Mb run short."""
    model_dir = tiny_model()
    rows = []
    for mb in sizes:
        genome = synthetic(mb)
        code = ("import json,sys; from linpipe.jobs.driver import run_job; "
                "from linpipe.jobs.request import JobRequest; "
                f"s=run_job(JobRequest(inputs=({str(genome)!r},), out={str(OUT / f'mem_{mb}.zarr')!r}, "
                f"overwrite=True, model={model_dir!r}, unit_size={unit_size}, workers=2, "
                "outputs=('logprob','entropy'))); "
                "print(json.dumps({'positions': s.positions, 'seconds': s.seconds, "
                "'driver_peak_rss': s.driver_peak_rss, 'worker_peak_rss': s.worker_peak_rss}))")
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        r = json.loads(res.stdout.strip().splitlines()[-1])
        r["mb"] = mb
        rows.append(r)
        print(json.dumps({"bench": "memory", **r}), flush=True)
    a, b = rows[0], rows[-1]
    print(json.dumps({"bench": "memory-ratio",
                      "driver_100_vs_10": round(b["driver_peak_rss"] / a["driver_peak_rss"], 3),
                      "worker_100_vs_10": round(b["worker_peak_rss"] / a["worker_peak_rss"], 3)}))


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    what = sys.argv[1] if len(sys.argv) > 1 else "overhead"
    from linpipe.jobs.options import DEFAULT_UNIT_SIZE

    chunk = int(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_UNIT_SIZE
    {"overhead": overhead, "scaling": scaling, "memory": memory}[what](chunk)
