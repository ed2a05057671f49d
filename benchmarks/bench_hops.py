"""The worker path's hops (docs/pipeline.md, "Why two processes per worker"): the shape a job
runs (the actor's relay serving the writes on a thread, and the worker's own process) against
the shape with one hop more, where the worker's process starts a writing process of its own and
sends each unit's arrays there (through shared memory, as to the relay).

    python benchmarks/bench_hops.py [--rounds 5] [--records 20000] [--d-model 8] [--ray]
        [--cases genome,packed]

Inputs: a short real genome (S. epidermidis ST14, 2.5 Mb, ../shared/data or
LINPIPE_SHARED_DATA) as one streamed job, and --records packed records of 80-600 bp cut from
the real genomes there (benchmarks/bench_host_path.py's). Each round runs both shapes, in
alternating order, through a WorkerRelay in this process (no Ray: what the relay does beside
the writes is only this script's calls) or, with --ray, as a Ray actor on a local Ray (its
threads beside the relay's writes, as in a job), with the calls made as the driver makes them
(IN_FLIGHT at a time, numbered); the seconds from the first call to the last unit durable are
printed, each shape's median and the relay-writes shape's ratio per round. The two stores of a
round are compared byte for byte.

Both shapes are jobs/worker_process.py's WorkerRelay: `writes_here` picks where the writes run.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_host_path import SHARED, _inputs, job_store, overlapped  # noqa: E402

GENOME = SHARED / "genomes" / "abricate_Sepidermidis_ST14_assembly.fa"

# ------------------------------------------------------------------ the shape with one hop more
def three_processes_class():
    from linpipe.jobs.worker_process import WorkerRelay

    class ThreeProcesses(WorkerRelay):
        """The relay, its worker's process, and that one's writing process."""

        writes_here = False

    return ThreeProcesses


# ------------------------------------------------------------------ the benchmark
def digest(folder: Path) -> str:
    """The store's bytes: every file's path and content, the lease object left out."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file() and "lease" not in p.name:
            h.update(str(p.relative_to(folder)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


class InRay:
    """A shape as the driver runs it: a Ray actor (the relay, named as a job names it) with
    IN_FLIGHT calls in its threads; its methods wait for the actor's answers."""

    def __init__(self, cls, *args, **kw):
        import ray

        from linpipe.jobs.actor import as_actor
        from linpipe.jobs.driver import IN_FLIGHT

        self.actor = ray.remote(as_actor(cls, name="PipelineWorker")).options(
            max_concurrency=IN_FLIGHT + 1, num_cpus=1).remote(*args, **kw)
        ray.get(self.actor.ready.remote())

    def __getattr__(self, name):
        import ray

        method = getattr(self.actor, name)
        return lambda *args, **kw: ray.get(method.remote(*args, **kw))


def run(shape, fasta: Path, model: str, out: Path, in_ray: bool) -> tuple[float, float]:
    """(seconds of the calls, seconds of the worker's start) of one shape over one job."""
    if in_ray:
        shape = functools.partial(InRay, shape)
    plan, token = job_store(fasta, model, out)
    calls = [("run_unit", (c,), {"last": i == r.n_units - 1}) for r in plan.streams
             for i, c in enumerate(r.units())]
    calls += [("run_batch", (b, plan.batch_units(b)), {}) for b in range(plan.packed.n_batches)]
    t0 = time.perf_counter()
    w = shape(plan.model_ref, str(out), list(plan.outputs), device="cpu", threads=1,
              input_options=plan.input_options, lease_token=token)
    t1 = time.perf_counter()
    overlapped(w, calls)
    w.close()
    return time.perf_counter() - t1, t1 - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--d-model", type=int, default=8)
    ap.add_argument("--ray", action="store_true", help="each shape as a Ray actor (a local Ray of 2 CPUs)")
    ap.add_argument("--cases", default="genome,packed")
    args = ap.parse_args()
    if args.ray:
        import ray

        os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
        ray.init(num_cpus=2, include_dashboard=False)
    from linpipe.jobs.worker_process import WorkerRelay
    from linpipe.model import init_net, save_model
    from linpipe.model.config import ModelConfig

    shapes = {"relay + worker + writer": three_processes_class(), "relay writes": WorkerRelay}
    with tempfile.TemporaryDirectory(prefix="bench-hops-") as tmp:
        d = Path(tmp)
        model = str(d / "model")
        config = ModelConfig(modality="dna", d_model=args.d_model, n_layers=2, n_heads=2,
                             mlp_hidden=4 * args.d_model)
        save_model(init_net(config, seed=0), config, model)
        cases = {"2.5 Mb genome": GENOME} if "genome" in args.cases else {}
        if "packed" in args.cases:
            cases |= {k: v for k, v in _inputs(d, args.records, 0.01).items() if "packed" in k}
        for label, fasta in cases.items():
            times = {s: [] for s in shapes}
            starts = {s: [] for s in shapes}
            for r in range(args.rounds):
                digests = {}
                order = list(shapes) if r % 2 == 0 else list(shapes)[::-1]
                for name in order:
                    out = d / f"{name.split()[0]}.zarr"
                    secs, start = run(shapes[name], fasta, model, out, args.ray)
                    times[name].append(secs)
                    starts[name].append(start)
                    digests[name] = digest(out)
                assert len(set(digests.values())) == 1, f"round {r}: the shapes stored different bytes"
                a, b = (times[s][-1] for s in shapes)
                print(f"{label}, round {r + 1}: {a:.2f} s, {b:.2f} s, ratio {b / a:.3f}", flush=True)
            ratios = [b / a for a, b in zip(*times.values(), strict=True)]
            print(f"{label}: " + "; ".join(f"{s} median {statistics.median(t):.2f} s (start "
                                          f"{statistics.median(starts[s]):.2f} s)" for s, t in times.items())
                  + f"; relay writes / three processes per round: median {statistics.median(ratios):.3f}, "
                  f"range {min(ratios):.3f}-{max(ratios):.3f}; stores identical", flush=True)


if __name__ == "__main__":
    main()
