"""A fresh worker's start (issue 32): seconds of PipelineWorker.__init__ (model load, the
writing process started, packed inputs opened) and of its first packed batch, with that
batch's write share. Each round is a fresh process, as an actor is; medians are printed.
With --relay, each round starts the worker as a Ray actor does (WorkerRelay: the worker in a
child process of its own), without Ray; the two kinds alternate, round by round.

    python benchmarks/bench_worker_start.py --input bench-out/packed_20k.fa --model DIR [--rounds 5] [--relay]

The figures go to BENCHMARKS.md ("A worker's start").
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

SETUP = r"""
import pickle, sys
sys.path.insert(0, sys.argv[3])
from bench_host_path import job_store
plan, lease_token = job_store(sys.argv[1], sys.argv[2], sys.argv[4] + "/o.zarr")
with open(sys.argv[4] + "/plan.pickle", "wb") as f:  # the benchmark's own files, read back below
    pickle.dump(plan, f)
with open(sys.argv[4] + "/worker.pickle", "wb") as f:  # plain values, as the actor's arguments are
    pickle.dump((plan.model_ref, list(plan.outputs), dict(plan.input_options), lease_token), f)
"""

# a fresh process that has imported what Ray imports before an actor's __init__ (the class's
# module), not torch: the worker's start includes torch's import, as an actor's does, and the
# imports the relay makes while its child starts
ONE = r"""
import json, pickle, sys, time
d, kind = sys.argv[1], sys.argv[2]
if kind == "relay":
    from linpipe.jobs.worker_process import WorkerRelay as Worker
else:
    from linpipe.jobs.actor import PipelineWorker as Worker
with open(d + "/worker.pickle", "rb") as f:
    model_ref, outputs, input_options, lease_token = pickle.load(f)
assert "torch" not in sys.modules
t0 = time.perf_counter()
w = Worker(model_ref, d + "/o.zarr", outputs, device="cpu", threads=1, input_options=input_options,
           lease_token=lease_token)
t1 = time.perf_counter()
with open(d + "/plan.pickle", "rb") as f:  # the first call's Units, decoded after the start, as on Ray
    plan = pickle.load(f)
r = w.run_batch(0, plan.batch_units(0))
t2 = time.perf_counter()
w.close()
print(json.dumps({"init": t1 - t0, "first_batch": t2 - t1, "write": r.write_s, "model": r.model_s}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", required=True, help="a FASTA with packed (short) records")
    ap.add_argument("--model", default="default")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--relay", action="store_true",
                    help="also start each worker as a Ray actor does (in a child process), alternated")
    args = ap.parse_args()
    # absolute: each round runs from "/" (the installed linpipe); a model is a folder or a name
    model = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model
    kinds = ["in-process", "relay"] if args.relay else ["in-process"]
    runs: dict[str, list] = {k: [] for k in kinds}
    for i in range(args.rounds):  # from a folder of its own: the installed linpipe, not a clone's
        for kind in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:
            with tempfile.TemporaryDirectory() as d:
                fasta = str(Path(args.input).resolve())
                subprocess.run([sys.executable, "-c", SETUP, fasta, model, str(HERE), d], check=True, cwd="/")
                out = subprocess.run([sys.executable, "-c", ONE, d, kind], capture_output=True, text=True,
                                     check=True, cwd="/").stdout
            runs[kind].append(json.loads(out.strip().splitlines()[-1]))
    for kind, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) * 1e3 for k in rs[0]}
        print(f"{kind}: worker start {med['init']:.0f} ms; first packed batch {med['first_batch']:.0f} ms "
              f"(model {med['model']:.0f} ms, write {med['write']:.0f} ms); medians of {len(rs)}")


if __name__ == "__main__":
    main()
