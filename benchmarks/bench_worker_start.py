"""A fresh worker's start (issue 32): seconds of PipelineWorker.__init__ (model load, the
writing process started, packed inputs opened) and of its first packed batch, with that
batch's write share. Each round is a fresh process, as an actor is; medians are printed.

    python benchmarks/bench_worker_start.py --input bench-out/packed_20k.fa --model DIR [--rounds 5]

The figures go to BENCHMARKS.md ("A worker's start").
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

ONE = r"""
import json, sys, tempfile, time
import torch
torch.set_num_threads(1)  # what each CPU actor uses
from linpipe.jobs.actor import PipelineWorker
fasta, model = sys.argv[1], sys.argv[2]
sys.path.insert(0, sys.argv[3])
from bench_host_path import job_store
with tempfile.TemporaryDirectory() as d:
    plan, lease_token = job_store(fasta, model, d + "/o.zarr")
    t0 = time.perf_counter()
    w = PipelineWorker(plan.model_ref, d + "/o.zarr", list(plan.outputs), device="cpu", threads=1,
                       input_options=plan.input_options, lease_token=lease_token)
    t1 = time.perf_counter()
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
    args = ap.parse_args()
    # absolute: each round runs from "/" (the installed linpipe); a model is a folder or a name
    model = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model
    runs = []
    for _ in range(args.rounds):  # from a folder of its own: the installed linpipe, not a clone's
        out = subprocess.run([sys.executable, "-c", ONE, str(Path(args.input).resolve()), model, str(HERE)],
                             capture_output=True, text=True, check=True, cwd="/").stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    med = {k: statistics.median(r[k] for r in runs) * 1e3 for k in runs[0]}
    print(f"worker start {med['init']:.0f} ms; first packed batch {med['first_batch']:.0f} ms "
          f"(model {med['model']:.0f} ms, write {med['write']:.0f} ms); medians of {len(runs)}")


if __name__ == "__main__":
    main()
